"""An ONNX model's constant tensors as numpy arrays, its sparse initializers made dense.

qrl stores a pruned kernel as a `SparseTensorProto` (kept values and their int64 linearized
positions, `onnx_graph`); the runtimes and rewrites that read kernels back take them from here.
"""

import numpy as np
import onnx
from onnx import helper, numpy_helper


def dense_of_sparse(tensor: onnx.SparseTensorProto) -> np.ndarray:
    """The dense array `[*dims]` a sparse initializer (linearized 1-D positions) stands for."""
    dense = np.zeros(int(np.prod(tensor.dims)), helper.tensor_dtype_to_np_dtype(tensor.values.data_type))
    dense[numpy_helper.to_array(tensor.indices).astype(np.int64)] = numpy_helper.to_array(tensor.values)
    return dense.reshape(tuple(tensor.dims))


def initializer_values(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Every initializer of the main graph by name, dense and sparse ones alike."""
    values = {tensor.name: numpy_helper.to_array(tensor) for tensor in model.graph.initializer}
    values.update({tensor.values.name: dense_of_sparse(tensor) for tensor in model.graph.sparse_initializer})
    return values
