"""Exact int8 products in ONNX Runtime on every x86 CPU.

qrl exports an int8 layer as `MatMulInteger(uint8 activations, int8 kernel)` (ConvInteger for a
convolution): unsigned activations with signed weights are what ONNX Runtime's fast integer GEMMs
take, and with AVX-512 VNNI, AVX-VNNI or AMX they accumulate exactly in int32. On x86 CPUs
without those units (AVX2 or AVX-512BW only) its u8·s8 kernel multiplies with `vpmaddubsw`,
which adds pairs of products into int16 and saturates: |255·127·2| > 32767. Measured on an
AMD EPYC with AVX2 only (ONNX Runtime 1.32, a 256×256 int8 kernel): results off by up to 85,593
in int32, 10–37% of a policy's greedy actions different from the JAX int8 policy's.

The file keeps signed kernels (a pruned kernel's zeros stay zeros, so sparse storage holds; fast
where the CPU has VNNI). `unsigned_kernels` rewrites a model for a CPU whose u8·s8 product
saturates into the equivalent u8·u8 form, `(a - za) · ((w + 128) - (zw + 128))`, which ONNX
Runtime computes exactly (16-bit products widened before they are added) at about the same
speed there; `session_from_bytes` in `qrl.deploy.policy` applies it when `u8s8_saturates()`.
A runtime other than qrl's loader on such a CPU needs the same rewrite (or VNNI).
"""

import platform
from typing import Optional

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from qrl.cpu import cpu_info
from qrl.deploy.initializers import initializer_values

INTEGER_PRODUCTS = ("MatMulInteger", "ConvInteger")  # kernel at input 1, its zero point at input 3.
EXACT_INT8_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")  # /proc/cpuinfo flags of exact u8·s8 units.


def u8s8_saturates(cpu_flags: Optional[set] = None) -> bool:
    """Whether ONNX Runtime's u8·s8 integer product may saturate on this CPU: an x86 CPU without
    VNNI or AMX int8 (`cpu_flags` as /proc/cpuinfo names them; read from there when None). An x86
    CPU whose flags cannot be read counts as saturating (the rewrite is exact everywhere)."""
    if cpu_flags is None:
        if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686", "x86"):
            return False
        _, cpu_flags = cpu_info()
        if cpu_flags is None:
            return True
    return not any(flag in cpu_flags for flag in EXACT_INT8_FLAGS)


def _element_types(model: onnx.ModelProto) -> dict[str, int]:
    """ONNX element type of every named tensor (initializers, inputs, inferred intermediates)."""
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {value.name: value.type.tensor_type.elem_type
             for value in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]}
    types.update({tensor.name: tensor.data_type for tensor in model.graph.initializer})
    types.update({sparse.values.name: sparse.values.data_type for sparse in model.graph.sparse_initializer})
    return types


def unsigned_kernels(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` whose int8 kernels of u8·s8 integer products are uint8 `w + 128` with zero
    point `zw + 128` (the same products, exactly; s8·s8 products, exact already, stay). Constant
    kernels are converted here (a sparse one is stored dense); kernels computed or fed at run time get Cast/Add/Cast nodes before the
    product. A model without int8 kernels comes back unchanged."""
    types, constants = None, initializer_values(model)
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    graph = rewritten.graph
    nodes, converted = [], {}

    def unsigned(name: str, default_zero: bool = False) -> str:
        if name in converted:
            return converted[name]
        value = constants.get(name) if name else np.zeros((), np.int8) if default_zero else None
        new_name = f"{name or 'kernel_zero_point'}_unsigned_{len(converted)}"
        if value is not None:
            graph.initializer.append(numpy_helper.from_array((value.astype(np.int16) + 128).astype(np.uint8), new_name))
        else:
            wide, shifted, offset = f"{new_name}_int32", f"{new_name}_shifted", f"{new_name}_offset"
            graph.initializer.append(numpy_helper.from_array(np.asarray(128, np.int32), offset))
            nodes.extend([helper.make_node("Cast", [name], [wide], to=TensorProto.INT32),
                          helper.make_node("Add", [wide, offset], [shifted]),
                          helper.make_node("Cast", [shifted], [new_name], to=TensorProto.UINT8)])
        converted[name] = new_name
        return new_name

    for node in graph.node:
        if node.op_type in INTEGER_PRODUCTS:
            types = types if types is not None else _element_types(model)
            if types.get(node.input[0]) == TensorProto.UINT8 and types.get(node.input[1]) == TensorProto.INT8:
                inputs = list(node.input) + [""] * (4 - len(node.input))
                inputs[1] = unsigned(inputs[1])
                inputs[3] = unsigned(inputs[3], default_zero=True)
                del node.input[:]
                node.input.extend(inputs)
        nodes.append(node)
    used = {name for node in nodes for name in node.input}
    kept_sparse = [sparse for sparse in graph.sparse_initializer if sparse.values.name in used]
    used |= {output.name for output in graph.output}
    kept_dense = [tensor for tensor in graph.initializer if tensor.name in used]
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.sparse_initializer[:]
    graph.sparse_initializer.extend(kept_sparse)
    del graph.initializer[:]
    graph.initializer.extend(kept_dense)
    return rewritten
