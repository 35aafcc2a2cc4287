"""A numpy/scipy runtime for exported policies, whose pruned matrix products run as CSR kernels.

    program = CsrProgram(onnx.load("pruned.onnx"))
    actions, outputs = program.run(["action", "outputs"], {"observation": observations})

ONNX Runtime densifies sparse initializers when it loads a model, so a 95%-sparse policy costs
it exactly what the dense one does. Measured at batch 1 (`bench/inference.py`, sparse rows)
against the other candidates — ONNX Runtime on the dense kernels, ONNX Runtime running each layer
as a gather of the kept inputs (an ELL layout: Gather, Mul, ReduceSum), and JAX's
`jax.experimental.sparse.BCSR` under `jit` — scipy's CSR product won wherever the kernels are
large enough for the arithmetic to matter: the gathered `[B, N, k]` tensor costs ONNX Runtime
more than the dense product it replaces, and XLA's sparse kernels on CPU are slower still. For
layers of a few hundred units the dense product in ONNX Runtime stays faster: a Python call per
node costs more than the multiply-adds pruning saves.

This runtime interprets the graph node by node in numpy: every matrix product whose constant
kernel keeps at most `max_density` of its entries runs as `scipy.sparse.csr_matrix` (the
kernel transposed, `[N, K] · xᵀ`); denser kernels run as numpy products. Integer products
(`MatMulInteger`) accumulate in int32 exactly; float ones in float32 (the sums' order differs
from a dense GEMM's, so results agree with ONNX Runtime to rounding). It runs the operations
qrl's exporter emits for MLP policies (`_OPS`); anything else (a convolution, say) is a one-line
`QrlInputError` naming the operation — run such a model with ONNX Runtime.
"""

from typing import Any, Callable, Mapping, Sequence

import numpy as np
import onnx
import scipy.sparse
import scipy.special
from onnx import helper

from qrl.deploy.initializers import initializer_values
from qrl.errors import QrlInputError

MAX_DENSITY = 0.3  # kept fraction at or below which a kernel runs as CSR (the batch-1 crossover measured here).


def _attributes(node) -> dict:
    return {attribute.name: helper.get_attribute_value(attribute) for attribute in node.attribute}


def _unary(fn: Callable) -> Callable:
    return lambda node, constants, program: lambda x: fn(x)


def _binary(fn: Callable) -> Callable:
    return lambda node, constants, program: lambda a, b: fn(a, b)


def _variadic(fn: Callable) -> Callable:
    def build(node, constants, program):
        def run(*values):
            result = values[0]
            for value in values[1:]:
                result = fn(result, value)
            return result
        return run
    return build


def _cast(node, constants, program):
    dtype = helper.tensor_dtype_to_np_dtype(_attributes(node)["to"])
    return lambda x: np.asarray(x).astype(dtype)


def _quantize_linear(node, constants, program):
    axis = _attributes(node).get("axis", 1)

    def run(x, scale, zero_point):
        if np.ndim(scale) == 1 and x.ndim > 1:  # per feature along `axis`.
            shape = [1] * x.ndim
            shape[axis] = -1
            scale, zero_point = scale.reshape(shape), zero_point.reshape(shape)
        info = np.iinfo(zero_point.dtype)
        quantized = np.round(x / scale) + zero_point.astype(np.float32)  # np.round: half to even, as ONNX.
        return np.clip(quantized, info.min, info.max).astype(zero_point.dtype)
    return run


def _dynamic_quantize_linear(node, constants, program):
    """ONNX's uint8 grid over `[min(x, 0), max(x, 0)]`, half to even; a zero range gets scale 1
    (as qrl's grids and ONNX Runtime do)."""
    def run(x):
        low, high = np.float32(min(float(x.min()), 0.0)), np.float32(max(float(x.max()), 0.0))
        scale = np.float32((high - low) / np.float32(255)) if high > low else np.float32(1)
        zero_point = np.uint8(np.clip(np.round(-low / scale), 0, 255))
        quantized = np.clip(np.round(x / scale) + np.float32(zero_point), 0, 255).astype(np.uint8)
        return quantized, np.asarray(scale), np.asarray(zero_point)
    return run


def _matmul(node, constants, program):
    """x · w with a constant kernel as CSR when sparse enough, else a numpy product."""
    kernel = constants.get(node.input[1])
    if kernel is not None and kernel.ndim == 2 and np.count_nonzero(kernel) <= program.max_density * kernel.size:
        transposed = scipy.sparse.csr_matrix(kernel.T)
        program.sparse_kernels += 1

        def run(x, w):
            flat = x.reshape(-1, x.shape[-1])
            return np.asarray(transposed @ flat.T).T.reshape(*x.shape[:-1], -1)
        return run
    return lambda x, w: np.matmul(x, w)


def _matmul_integer(node, constants, program):
    """(a - a_zero) · (b - b_zero) in int32, the kernel as int32 CSR when sparse enough."""
    kernel = constants.get(node.input[1])
    kernel_zero = constants.get(node.input[3]) if len(node.input) > 3 and node.input[3] else None
    centered = None if kernel is None else kernel.astype(np.int32) - (0 if kernel_zero is None else kernel_zero.astype(np.int32))
    if centered is not None and centered.ndim == 2 and np.count_nonzero(centered) <= program.max_density * centered.size:
        transposed = scipy.sparse.csr_matrix(centered.T)
        program.sparse_kernels += 1

        def run(a, b, a_zero=None, b_zero=None):
            flat = a.reshape(-1, a.shape[-1]).astype(np.int32) - (0 if a_zero is None else np.int32(a_zero))
            return np.asarray(transposed @ flat.T).T.astype(np.int32).reshape(*a.shape[:-1], -1)
        return run

    def run_dense(a, b, a_zero=None, b_zero=None):
        a = a.astype(np.int32) - (0 if a_zero is None else np.int32(a_zero))
        b = b.astype(np.int32) - (0 if b_zero is None else b_zero.astype(np.int32))
        return np.matmul(a, b)
    return run_dense


def _reduce(fn: Callable) -> Callable:
    def build(node, constants, program):
        keepdims = bool(_attributes(node).get("keepdims", 1))

        def run(x, axes=None):
            axis = None if axes is None or np.size(axes) == 0 else tuple(int(a) for a in np.asarray(axes).reshape(-1))
            return np.asarray(fn(x, axis=axis, keepdims=keepdims), dtype=x.dtype)
        return run
    return build


def _arg_reduce(fn: Callable) -> Callable:
    def build(node, constants, program):
        attributes = _attributes(node)
        if attributes.get("select_last_index", 0):
            raise QrlInputError(f"the CSR runtime does not run {node.op_type} with select_last_index")
        axis, keepdims = int(attributes.get("axis", 0)), bool(attributes.get("keepdims", 1))
        return lambda x: np.asarray(fn(x, axis=axis, keepdims=keepdims), np.int64)
    return build


def _reshape(node, constants, program):
    def run(x, shape):
        shape = [x.shape[i] if d == 0 else int(d) for i, d in enumerate(np.asarray(shape))]
        return x.reshape(shape)
    return run


def _expand(node, constants, program):
    return lambda x, shape: np.broadcast_to(x, np.broadcast_shapes(x.shape, tuple(int(d) for d in shape))).copy()


def _slice(node, constants, program):
    def run(x, starts, ends, axes=None, steps=None):
        axes = range(len(starts)) if axes is None else [int(a) % x.ndim for a in axes]
        steps = [1] * len(starts) if steps is None else steps
        index = [slice(None)] * x.ndim
        for axis, start, end, step in zip(axes, starts, ends, steps):
            index[axis] = slice(int(max(min(start, 2**62), -2**62)), int(max(min(end, 2**62), -2**62)), int(step))
        return x[tuple(index)]
    return run


def _squeeze(node, constants, program):
    return lambda x, axes=None: np.squeeze(x, axis=None if axes is None else tuple(int(a) for a in axes))


def _unsqueeze(node, constants, program):
    return lambda x, axes: np.expand_dims(x, tuple(int(a) for a in axes))


def _concat(node, constants, program):
    axis = int(_attributes(node)["axis"])
    return lambda *values: np.concatenate(values, axis=axis)


def _transpose(node, constants, program):
    perm = _attributes(node).get("perm")
    return lambda x: np.transpose(x, perm)


def _split(node, constants, program):
    axis = int(_attributes(node).get("axis", 0))

    def run(x, sizes):
        return tuple(np.split(x, np.cumsum(np.asarray(sizes))[:-1], axis=axis))
    return run


_OPS: dict[str, Callable] = {
    "Add": _binary(np.add), "Sub": _binary(np.subtract), "Mul": _binary(np.multiply), "Div": _binary(np.divide),
    "Pow": _binary(np.power), "Max": _variadic(np.maximum), "Min": _variadic(np.minimum),
    "Equal": _binary(np.equal), "Greater": _binary(np.greater), "Less": _binary(np.less),
    "GreaterOrEqual": _binary(np.greater_equal), "LessOrEqual": _binary(np.less_equal),
    "And": _binary(np.logical_and), "Or": _binary(np.logical_or), "Not": _unary(np.logical_not),
    "Tanh": _unary(np.tanh), "Exp": _unary(np.exp), "Log": _unary(np.log), "Sqrt": _unary(np.sqrt),
    "Abs": _unary(np.abs), "Neg": _unary(np.negative), "Floor": _unary(np.floor), "Ceil": _unary(np.ceil),
    "Sign": _unary(np.sign), "Round": _unary(np.round), "Erf": _unary(scipy.special.erf),
    "Sigmoid": _unary(scipy.special.expit), "Reciprocal": _unary(np.reciprocal),
    "Relu": _unary(lambda x: np.maximum(x, 0)), "Identity": _unary(lambda x: x), "Shape": _unary(lambda x: np.asarray(x.shape, np.int64)),
    "Where": lambda node, constants, program: np.where,
    "Cast": _cast, "QuantizeLinear": _quantize_linear, "DynamicQuantizeLinear": _dynamic_quantize_linear,
    "MatMul": _matmul, "MatMulInteger": _matmul_integer,
    "ReduceMax": _reduce(np.max), "ReduceMin": _reduce(np.min), "ReduceSum": _reduce(np.sum),
    "ArgMax": _arg_reduce(np.argmax), "ArgMin": _arg_reduce(np.argmin),
    "Reshape": _reshape, "Expand": _expand, "Slice": _slice, "Squeeze": _squeeze, "Unsqueeze": _unsqueeze,
    "Concat": _concat, "Transpose": _transpose, "Split": _split,
}


class CsrProgram:
    """An ONNX model as a list of numpy steps (see the module docstring). Nodes whose inputs are
    all constants (casting an fp16 kernel up, say) run once here, so the matrix products see
    their kernels as constants; `sparse_kernels` counts the products that run as CSR."""

    def __init__(self, model: onnx.ModelProto, max_density: float = MAX_DENSITY):
        self.max_density = max_density
        self.sparse_kernels = 0
        graph = model.graph
        constants = initializer_values(model)
        self.input_names = [value.name for value in graph.input if value.name not in constants]
        self.output_names = [value.name for value in graph.output]
        self._steps: list = []
        self._constant_outputs: dict = {}
        for node in graph.node:
            if node.domain not in ("", "ai.onnx"):
                raise QrlInputError(f"the CSR runtime does not run the {node.domain} operation {node.op_type!r}: use onnxruntime")
            build = _OPS.get(node.op_type)
            if build is None:
                raise QrlInputError(f"the CSR runtime does not run the ONNX operation {node.op_type!r}: use onnxruntime")
            fn = build(node, constants, self)
            if all(not name or name in constants for name in node.input):
                result = fn(*[constants[name] if name else None for name in node.input])
                constants.update(zip(node.output, [np.asarray(result)] if len(node.output) == 1 else result))
                continue
            arguments = tuple((False, constants[name]) if name in constants else (True, name or None)
                              for name in node.input)
            self._steps.append((fn, arguments, tuple(node.output)))
        self._constant_outputs = {name: constants[name] for name in self.output_names if name in constants}

    def run(self, output_names: Sequence[str], feeds: Mapping[str, Any]) -> list:
        """The named outputs (all, for an empty list) for `feeds` (`{input name: array}`)."""
        values = dict(feeds)
        values.update(self._constant_outputs)
        for fn, arguments, outputs in self._steps:
            result = fn(*[values[value] if computed and value else (None if computed else value)
                          for computed, value in arguments])
            if len(outputs) == 1:
                values[outputs[0]] = result
            else:
                values.update(zip(outputs, result))
        return [values[name] for name in (output_names or self.output_names)]
