"""Exact int8 products in ONNX Runtime whatever the CPU: the u8·u8 rewrite of int8 kernels."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qrl.deploy import integer_kernels
from qrl.deploy.policy import session_from_bytes

K, N = 64, 8


def _kernel_and_activations():
    """Activations and weights at the grid's ends, where pairwise int16 sums overflow: 255·127·2."""
    rng = np.random.default_rng(0)
    kernel = rng.choice(np.array([-128, -127, 127], np.int8), size=(K, N))
    activations = rng.choice(np.array([0, 1, 254, 255], np.uint8), size=(5, K))
    return kernel, activations


def _matmul_model(kernel: np.ndarray, storage: str, kernel_zero: bool) -> onnx.ModelProto:
    """`MatMulInteger(a uint8 [B, K], kernel int8 [K, N], 128, 0?)` with the kernel stored as a
    dense initializer, a sparse initializer or fed as a graph input."""
    inputs = [helper.make_tensor_value_info("a", TensorProto.UINT8, [None, K])]
    initializers, sparse = [numpy_helper.from_array(np.asarray(128, np.uint8), "a_zero")], []
    if storage == "dense":
        initializers.append(numpy_helper.from_array(kernel, "w"))
    elif storage == "sparse":
        flat = kernel.reshape(-1)
        positions = np.flatnonzero(flat).astype(np.int64)
        sparse.append(helper.make_sparse_tensor(numpy_helper.from_array(flat[positions], "w"),
                                                numpy_helper.from_array(positions, "w_positions"), list(kernel.shape)))
    else:
        inputs.append(helper.make_tensor_value_info("w", TensorProto.INT8, list(kernel.shape)))
    node_inputs = ["a", "w", "a_zero"]
    if kernel_zero:
        initializers.append(numpy_helper.from_array(np.asarray(0, np.int8), "w_zero"))
        node_inputs.append("w_zero")
    graph = helper.make_graph([helper.make_node("MatMulInteger", node_inputs, ["y"])], "g", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.INT32, [None, N])], initializers,
                              sparse_initializer=sparse)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("flags,saturates", [
    ({"avx2", "fma"}, True), ({"avx2", "avx512bw"}, True), ({"avx512bw", "avx512_vnni"}, False),
    ({"avx2", "avx_vnni"}, False), ({"amx_int8", "amx_tile"}, False),
])
def test_u8s8_saturates_exactly_without_vnni_or_amx(flags, saturates):
    assert integer_kernels.u8s8_saturates(flags) is saturates


@pytest.mark.parametrize("storage", ["dense", "sparse", "input"])
@pytest.mark.parametrize("kernel_zero", [False, True])
def test_unsigned_kernels_compute_the_exact_int32_product(storage, kernel_zero):
    kernel, activations = _kernel_and_activations()
    if storage == "sparse":
        kernel = np.where(np.arange(K)[:, None] % 3 == 0, kernel, 0).astype(np.int8)
    exact = (activations.astype(np.int64) - 128) @ kernel.astype(np.int64)
    assert np.abs(exact).max() > 2 ** 15  # sums an int16 accumulator could not hold.
    model = _matmul_model(kernel, storage, kernel_zero)
    rewritten = integer_kernels.unsigned_kernels(model)
    onnx.checker.check_model(rewritten)
    types = integer_kernels._element_types(rewritten)
    (product,) = [node for node in rewritten.graph.node if node.op_type == "MatMulInteger"]
    assert types[product.input[1]] == types[product.input[3]] == TensorProto.UINT8
    feeds = {"a": activations, **({"w": kernel} if storage == "input" else {})}
    (y,) = session_from_bytes(model.SerializeToString(), unsigned_kernels=True).run(None, feeds)
    np.testing.assert_array_equal(y, exact)


def test_the_loader_is_exact_on_this_cpu_whatever_it_is():
    """The default session (the CPU decides) gives the exact int32 product where the plain u8·s8
    kernel would saturate."""
    kernel, activations = _kernel_and_activations()
    model = _matmul_model(kernel, "dense", kernel_zero=False)
    (y,) = session_from_bytes(model.SerializeToString()).run(None, {"a": activations})
    np.testing.assert_array_equal(y, (activations.astype(np.int64) - 128) @ kernel.astype(np.int64))


def test_conv_integer_kernels_are_rewritten_exactly():
    rng = np.random.default_rng(1)
    kernel = rng.choice(np.array([-128, 127], np.int8), size=(3, 16, 2, 2))  # OIHW
    activations = rng.choice(np.array([0, 255], np.uint8), size=(2, 16, 4, 4))
    graph = helper.make_graph(
        [helper.make_node("ConvInteger", ["x", "w", "x_zero"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, [None, 16, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [None, 3, 3, 3])],
        [numpy_helper.from_array(kernel, "w"), numpy_helper.from_array(np.asarray(128, np.uint8), "x_zero")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    (y,) = session_from_bytes(model.SerializeToString(), unsigned_kernels=True).run(None, {"x": activations})
    centered = activations.astype(np.int64) - 128
    windows = np.lib.stride_tricks.sliding_window_view(centered, (2, 2), axis=(2, 3))  # [B, C, 3, 3, 2, 2]
    exact = np.einsum("bcijhw,ochw->boij", windows, kernel.astype(np.int64))
    np.testing.assert_array_equal(y, exact)


def test_models_without_int8_kernels_are_unchanged():
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 2])],
                              [numpy_helper.from_array(np.eye(2, dtype=np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    assert integer_kernels.unsigned_kernels(model).SerializeToString() == model.SerializeToString()


def test_signed_activation_products_are_left_as_they_are():
    """s8·s8 products are exact in ONNX Runtime already; u8·u8 is not what they compute."""
    graph = helper.make_graph([helper.make_node("MatMulInteger", ["a", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("a", TensorProto.INT8, [None, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, [None, 2])],
                              [numpy_helper.from_array(np.asarray([[1, -2], [3, 4]], np.int8), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    assert integer_kernels.unsigned_kernels(model).SerializeToString() == model.SerializeToString()
