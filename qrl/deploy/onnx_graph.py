"""A JAX function of observations, traced to a jaxpr, written as an ONNX graph.

qrl's networks are flax modules whose precision decides their arithmetic (`qrl.networks.layers`),
so one translation of the traced computation serves every agent and every scheme: the int8
layers' `dot_general` / `conv_general_dilated` on int8 operands with int32 accumulation become
ONNX's standard `MatMulInteger` / `ConvInteger`, their rounding `Round` (half to even, as
`jnp.round`), float layers `MatMul` / `Conv`. Parameters are closed over as constants, and
every operation whose inputs are all constants (dequantizing a kernel, folding scales) is
evaluated at export time, so the graph holds only what runs per observation.

Written on the `onnx` package directly rather than through a JAX-to-ONNX exporter: the one
maintained exporter pulls in a model hub client, a viewer and pinned orbax versions, and its
int8 handling is not a faithful integer kernel. Operations not listed in `_TRANSLATIONS` are an
input error naming the operation.

The batch axis stays symbolic (`jax.export.symbolic_shape`): the graph runs at any batch size.
"""

from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import onnx
from jax.extend import core as jax_core
from onnx import TensorProto, helper, numpy_helper

from qrl.errors import QrlInputError

OPSET = 21
BATCH = "batch"
DYNAMIC_INT8_DENSE = "dynamic_int8_dense"  # qrl.quant.ops' dynamic 8-bit dense layer, exported as one unit.

_ONNX_DTYPES = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float16): TensorProto.FLOAT16,
    np.dtype(ml_dtypes.bfloat16): TensorProto.BFLOAT16,
    np.dtype(np.float64): TensorProto.DOUBLE,
    np.dtype(np.int8): TensorProto.INT8,
    np.dtype(np.uint8): TensorProto.UINT8,
    np.dtype(np.int16): TensorProto.INT16,
    np.dtype(np.int32): TensorProto.INT32,
    np.dtype(np.int64): TensorProto.INT64,
    np.dtype(np.bool_): TensorProto.BOOL,
}
_INTEGER_KERNEL_DTYPES = (np.dtype(np.int8), np.dtype(np.uint8))


def onnx_dtype(dtype: Any) -> int:
    """The ONNX element type of a numpy/JAX dtype; an input error for one ONNX lacks."""
    dtype = np.dtype(dtype)
    if dtype not in _ONNX_DTYPES:
        raise QrlInputError(f"the policy computes in {dtype}, which the ONNX export does not support")
    return _ONNX_DTYPES[dtype]


class _Graph:
    """ONNX nodes and initializers under construction; values are tensor names."""

    def __init__(self, batch_input: str):
        self.nodes: list = []
        self.initializers: list = []
        self._names = 0
        self._batch_input = batch_input
        self._batch_size: Optional[str] = None
        self.input_shapes: dict[str, tuple] = {}  # graph inputs other than the observation: their shapes.

    def name(self, hint: str) -> str:
        self._names += 1
        return f"{hint}_{self._names}"

    def node(self, op: str, inputs: Sequence[str], hint: Optional[str] = None, **attributes) -> str:
        output = self.name(hint or op.lower())
        self.nodes.append(helper.make_node(op, list(inputs), [output], **attributes))
        return output

    def const(self, value: Any, hint: str = "const") -> str:
        name = self.name(hint)
        self.initializers.append(numpy_helper.from_array(np.asarray(value), name))  # bfloat16 (ml_dtypes) included.
        return name

    def initializer_named(self, name: str):
        """The initializer called `name`, or None."""
        return next((tensor for tensor in self.initializers if tensor.name == name), None)

    def batch_size(self) -> str:
        """`[1]` int64: the batch size of the graph's input, computed once."""
        if self._batch_size is None:
            shape = self.node("Shape", [self._batch_input], "input_shape")
            self._batch_size = self.node("Slice", [shape, self.const(np.array([0], np.int64)),
                                                   self.const(np.array([1], np.int64))], "batch_size")
        return self._batch_size

    def shape(self, dims: Sequence[Any], batch_symbol: Any) -> str:
        """A shape tensor `[rank]` int64 for `dims`, whose symbolic entries must be whole
        multiples of the batch (`k * batch`: k candidates per state, say)."""
        if all(isinstance(dim, (int, np.integer)) for dim in dims):
            return self.const(np.asarray(dims, np.int64), "shape")
        pieces = []
        for dim in dims:
            if isinstance(dim, (int, np.integer)):
                pieces.append(self.const(np.array([dim], np.int64), "dim"))
                continue
            multiple = dim // batch_symbol
            if not isinstance(multiple, (int, np.integer)) or dim != multiple * batch_symbol:
                raise QrlInputError(f"the policy's graph uses a shape {dims} the ONNX export cannot express")
            batch = self.batch_size()
            pieces.append(batch if multiple == 1 else self.node("Mul", [batch, self.const(np.array([multiple], np.int64))]))
        return self.node("Concat", pieces, "shape", axis=0)


def _is_concrete(shape: Sequence[Any]) -> bool:
    return all(isinstance(dim, (int, np.integer)) for dim in shape)


class _Deferred:
    """A value computed from parameter inputs (and constants) alone: left to the prepare program,
    which runs once per weight update, rather than to the graph, which runs once per call."""

    def __init__(self, ref: int, aval: Any):
        self.ref, self.aval = ref, aval


class _Translator:
    """Walks a jaxpr, folding constant operations, deferring parameter-only ones to the prepare
    program and emitting ONNX nodes for the rest.

    A jaxpr value is a constant (numpy array), a deferred parameter-only value (`_Deferred`) or
    an ONNX tensor name. A deferred value an emitted node reads becomes a graph input, fed what
    the prepare program computes (`materialized`)."""

    def __init__(self, graph: _Graph, batch_symbol: Any):
        self.graph = graph
        self.batch_symbol = batch_symbol
        self.constants: dict = {}  # var -> numpy array
        self.names: dict = {}  # var -> tensor name
        self.deferred: dict = {}  # var -> _Deferred
        self.prepare_steps: list = []  # (primitive, params, [("const", array) | ("ref", ref)], [ref])
        self.materialized: dict = {}  # ref -> graph input name, in the order the graph first reads them
        self.input_names: dict = {}  # ref -> the graph input name a parameter leaf gets
        self.graph_inputs: list = []
        self._refs = 0

    def new_deferred(self, aval: Any, name: Optional[str] = None) -> _Deferred:
        deferred = _Deferred(self._refs, aval)
        self._refs += 1
        if name is not None:
            self.input_names[deferred.ref] = name
        return deferred

    def source(self, atom) -> tuple[str, Any]:
        """("const", array), ("deferred", _Deferred) or ("name", tensor name) of a jaxpr atom."""
        if isinstance(atom, jax_core.Literal):
            return "const", np.asarray(atom.val, dtype=atom.aval.dtype)
        if atom in self.constants:
            return "const", self.constants[atom]
        if atom in self.deferred:
            return "deferred", self.deferred[atom]
        return "name", self.names[atom]

    def _bind(self, var, kind: str, value: Any) -> None:
        {"const": self.constants, "deferred": self.deferred, "name": self.names}[kind][var] = value

    def materialize(self, deferred: _Deferred) -> str:
        """The graph input carrying a deferred value (added on first use)."""
        if deferred.ref not in self.materialized:
            name = self.input_names.get(deferred.ref, f"derived/{deferred.ref}")
            if not _is_concrete(deferred.aval.shape):
                raise QrlInputError("the policy computes a batch-sized value from its parameters alone, which the "
                                    "ONNX export does not support")
            self.materialized[deferred.ref] = name
            self.graph_inputs.append(helper.make_tensor_value_info(name, onnx_dtype(deferred.aval.dtype),
                                                                   list(deferred.aval.shape)))
            self.graph.input_shapes[name] = tuple(deferred.aval.shape)
        return self.materialized[deferred.ref]

    def read(self, atom) -> tuple[bool, Any]:
        """(is_constant, numpy array or tensor name) of a jaxpr atom; a deferred value is read
        as the graph input that carries it."""
        kind, value = self.source(atom)
        if kind == "deferred":
            return False, self.materialize(value)
        return kind == "const", value

    def name_of(self, atom) -> str:
        constant, value = self.read(atom)
        return self.graph.const(value) if constant else value

    def run(self, jaxpr, consts: Sequence[Any], inputs: Sequence[tuple[str, Any]]) -> list:
        """Translates `jaxpr` with constvars bound to `consts` and invars to `inputs` (`source`
        pairs); returns the outputs as such pairs."""
        for var, value in zip(jaxpr.constvars, consts):
            self.constants[var] = np.asarray(value)
        for var, (kind, value) in zip(jaxpr.invars, inputs):
            self._bind(var, kind, value)
        for eqn in jaxpr.eqns:
            self._equation(eqn)
        return [self.source(var) for var in jaxpr.outvars]

    def _equation(self, eqn) -> None:
        name = eqn.primitive.name
        if name in ("pjit", "jit") and eqn.params.get("name") == DYNAMIC_INT8_DENSE and self.source(eqn.invars[0])[0] == "name":
            self.names[eqn.outvars[0]] = _dynamic_int8_dense(self, eqn)
            return
        inner = _inner_jaxpr(eqn)
        if inner is not None:
            closed_consts = inner.consts if hasattr(inner, "consts") else ()
            jaxpr = inner.jaxpr if hasattr(inner, "jaxpr") else inner
            outputs = self.run(jaxpr, closed_consts, [self.source(atom) for atom in eqn.invars])
            for var, (kind, value) in zip(eqn.outvars, outputs):
                self._bind(var, kind, value)
            return
        sources = [self.source(atom) for atom in eqn.invars]
        kinds = {kind for kind, _ in sources}
        concrete = all(_is_concrete(var.aval.shape) for var in eqn.outvars)
        if kinds <= {"const"} and concrete:
            results = eqn.primitive.bind(*[jnp.asarray(value) for _, value in sources], **eqn.params)
            results = results if eqn.primitive.multiple_results else [results]
            for var, result in zip(eqn.outvars, results):
                self.constants[var] = np.asarray(result)
            return
        if kinds <= {"const", "deferred"} and concrete:
            outputs = [self.new_deferred(var.aval) for var in eqn.outvars]
            self.prepare_steps.append((eqn.primitive, dict(eqn.params),
                                       [("const", value) if kind == "const" else ("ref", value.ref) for kind, value in sources],
                                       [output.ref for output in outputs]))
            for var, output in zip(eqn.outvars, outputs):
                self.deferred[var] = output
            return
        translate = _TRANSLATIONS.get(name)
        if translate is None:
            raise QrlInputError(f"the policy uses the JAX operation {name!r}, which the ONNX export does not support")
        outputs = translate(self, eqn)
        outputs = outputs if isinstance(outputs, list) else [outputs]
        for var, output in zip(eqn.outvars, outputs):
            self.names[var] = output

    def prepare_program(self, num_parameters: int) -> Callable[[list], list]:
        """`prepare(parameter leaves) -> [value of each materialized input]`, jitted: the
        deferred operations in the order they were met."""
        steps, wanted = list(self.prepare_steps), list(self.materialized)

        def prepare(leaves):
            values = dict(enumerate(leaves[:num_parameters]))
            for primitive, params, inputs, outputs in steps:
                results = primitive.bind(*[value if kind == "const" else values[value] for kind, value in inputs], **params)
                values.update(zip(outputs, results if primitive.multiple_results else [results]))
            return [values[ref] for ref in wanted]

        return jax.jit(prepare)


def _dynamic_int8_dense(t: _Translator, eqn) -> str:
    """`qrl.quant.ops.dynamic_int8_dense(x, kernel, kernel_scale, bias)` as DynamicQuantizeLinear
    → MatMulInteger → Cast → Mul → Add: ONNX's uint8 grid over `[min(x, 0), max(x, 0)]` is qrl's
    int8 grid plus 128 (same scale, `zero_point + 128`, `q + 128`), so `MatMulInteger(q + 128,
    kernel, zero_point + 128)` is qrl's zero-point-corrected int32 sum exactly; ONNX Runtime fuses
    the chain into one DynamicQuantizeMatMul."""
    x, kernel, kernel_scale, bias = (t.name_of(atom) for atom in eqn.invars)
    quantized, scale, zero_point = (t.graph.name(hint) for hint in ("quantized", "scale", "zero_point"))
    t.graph.nodes.append(helper.make_node("DynamicQuantizeLinear", [x], [quantized, scale, zero_point]))
    accumulated = t.graph.node("MatMulInteger", [quantized, kernel, zero_point])
    rescaled = t.graph.node("Mul", [t.graph.node("Cast", [accumulated], to=TensorProto.FLOAT),
                                    t.graph.node("Mul", [scale, kernel_scale])])
    return t.graph.node("Add", [rescaled, bias])


def _inner_jaxpr(eqn):
    """The sub-jaxpr a call-like equation (jit, custom_jvp/vjp, checkpoint) runs, else None."""
    if eqn.primitive.name in ("pjit", "jit", "closed_call", "core_call", "remat", "checkpoint"):
        return eqn.params.get("jaxpr") or eqn.params.get("call_jaxpr")
    if eqn.primitive.name in ("custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr"):
        return eqn.params.get("call_jaxpr") or eqn.params.get("fun_jaxpr")
    return None


def _elementwise(op: str) -> Callable:
    def translate(t: _Translator, eqn) -> str:
        return t.graph.node(op, [t.name_of(atom) for atom in eqn.invars])
    return translate


def _convert(t: _Translator, eqn) -> str:
    return t.graph.node("Cast", [t.name_of(eqn.invars[0])], to=onnx_dtype(eqn.params["new_dtype"]))


def _round(t: _Translator, eqn) -> str:
    x = t.name_of(eqn.invars[0])
    if int(eqn.params["rounding_method"]) == int(jax.lax.RoundingMethod.TO_NEAREST_EVEN):
        return t.graph.node("Round", [x])
    dtype = eqn.invars[0].aval.dtype  # away from zero: sign(x) * floor(|x| + 1/2).
    half = t.graph.const(np.asarray(0.5, dtype))
    magnitude = t.graph.node("Floor", [t.graph.node("Add", [t.graph.node("Abs", [x]), half])])
    return t.graph.node("Mul", [t.graph.node("Sign", [x]), magnitude])


def _clamp(t: _Translator, eqn) -> str:
    low, x, high = (t.name_of(atom) for atom in eqn.invars)
    return t.graph.node("Min", [t.graph.node("Max", [x, low]), high])


def _select_n(t: _Translator, eqn) -> str:
    if len(eqn.invars) != 3:
        raise QrlInputError("the policy uses a select_n with more than two cases, which the ONNX export does not support")
    predicate, if_false, if_true = (t.name_of(atom) for atom in eqn.invars)
    if eqn.invars[0].aval.dtype != np.bool_:
        predicate = t.graph.node("Cast", [predicate], to=TensorProto.BOOL)
    return t.graph.node("Where", [predicate, if_true, if_false])


def _integer_pow(t: _Translator, eqn) -> str:
    x = t.name_of(eqn.invars[0])
    exponent = int(eqn.params["y"])
    if exponent < 1:
        return t.graph.node("Pow", [x, t.graph.const(np.asarray(exponent, eqn.invars[0].aval.dtype))])
    result = x
    for _ in range(exponent - 1):
        result = t.graph.node("Mul", [result, x])
    return result


def _rsqrt(t: _Translator, eqn) -> str:
    return t.graph.node("Reciprocal", [t.graph.node("Sqrt", [t.name_of(eqn.invars[0])])])


def _ne(t: _Translator, eqn) -> str:
    return t.graph.node("Not", [t.graph.node("Equal", [t.name_of(atom) for atom in eqn.invars])])


def _square(t: _Translator, eqn) -> str:
    x = t.name_of(eqn.invars[0])
    return t.graph.node("Mul", [x, x])


def _identity(t: _Translator, eqn) -> str:
    return t.graph.node("Identity", [t.name_of(eqn.invars[0])])


def _reduce(op: str) -> Callable:
    def translate(t: _Translator, eqn) -> str:
        if not eqn.params["axes"]:  # reducing over no axis is the identity (ONNX's empty axes mean all).
            return t.graph.node("Identity", [t.name_of(eqn.invars[0])])
        axes = t.graph.const(np.asarray(eqn.params["axes"], np.int64), "axes")
        return t.graph.node(op, [t.name_of(eqn.invars[0]), axes], keepdims=0)
    return translate


def _arg_reduce(op: str) -> Callable:
    def translate(t: _Translator, eqn) -> str:
        (axis,) = eqn.params["axes"]
        index = t.graph.node(op, [t.name_of(eqn.invars[0])], axis=int(axis), keepdims=0, select_last_index=0)
        return t.graph.node("Cast", [index], to=onnx_dtype(eqn.params["index_dtype"]))
    return translate


def _reshape(t: _Translator, eqn) -> str:
    if eqn.params.get("dimensions"):
        raise QrlInputError("the policy uses a transposing reshape, which the ONNX export does not support")
    shape = t.graph.shape(eqn.outvars[0].aval.shape, t.batch_symbol)
    return t.graph.node("Reshape", [t.name_of(eqn.invars[0]), shape])


def _broadcast_in_dim(t: _Translator, eqn) -> str:
    operand = eqn.invars[0]
    target = eqn.outvars[0].aval.shape
    kept = eqn.params["broadcast_dimensions"]
    expanded_shape = [1] * len(target)
    for source_axis, target_axis in enumerate(kept):
        expanded_shape[target_axis] = operand.aval.shape[source_axis]
    x = t.name_of(operand)
    if tuple(expanded_shape) != tuple(operand.aval.shape):
        x = t.graph.node("Reshape", [x, t.graph.shape(expanded_shape, t.batch_symbol)])
    return t.graph.node("Expand", [x, t.graph.shape(target, t.batch_symbol)])


def _squeeze(t: _Translator, eqn) -> str:
    axes = t.graph.const(np.asarray(eqn.params["dimensions"], np.int64), "axes")
    return t.graph.node("Squeeze", [t.name_of(eqn.invars[0]), axes])


def _transpose(t: _Translator, eqn) -> str:
    return t.graph.node("Transpose", [t.name_of(eqn.invars[0])], perm=[int(p) for p in eqn.params["permutation"]])


def _concatenate(t: _Translator, eqn) -> str:
    return t.graph.node("Concat", [t.name_of(atom) for atom in eqn.invars], axis=int(eqn.params["dimension"]))


def _slice(t: _Translator, eqn) -> str:
    starts = np.asarray(eqn.params["start_indices"], np.int64)
    ends = np.asarray(eqn.params["limit_indices"], np.int64)
    strides = eqn.params.get("strides") or (1,) * len(starts)
    axes = np.arange(len(starts), dtype=np.int64)
    return t.graph.node("Slice", [t.name_of(eqn.invars[0]), t.graph.const(starts), t.graph.const(ends),
                                  t.graph.const(axes), t.graph.const(np.asarray(strides, np.int64))])


def _split(t: _Translator, eqn) -> list:
    sizes = t.graph.const(np.asarray(eqn.params["sizes"], np.int64), "split")
    outputs = [t.graph.name("split") for _ in eqn.outvars]
    t.graph.nodes.append(helper.make_node("Split", [t.name_of(eqn.invars[0]), sizes], outputs,
                                          axis=int(eqn.params["axis"])))
    return outputs


def _gather(t: _Translator, eqn) -> str:
    """A gather that is a static slice (what `x[..., a:b]` and `x[..., i]` trace to with a
    symbolic batch): constant start indices `[k]`, no batching dimensions; as ONNX Slice, then
    Squeeze of the indexed-away axes."""
    numbers = eqn.params["dimension_numbers"]
    operand, indices = eqn.invars
    constant, starts = t.read(indices)
    rank = operand.aval.ndim
    collapsed = tuple(int(axis) for axis in numbers.collapsed_slice_dims)
    static_slice = (constant and np.ndim(starts) == 1 and not numbers.operand_batching_dims
                    and tuple(numbers.offset_dims) == tuple(range(rank - len(collapsed))))
    if not static_slice:
        raise QrlInputError("the policy uses a gather other than a static slice, which the ONNX export does not support")
    axes = np.asarray(numbers.start_index_map, np.int64)
    begin = np.asarray(starts, np.int64)
    end = begin + np.asarray([eqn.params["slice_sizes"][axis] for axis in axes], np.int64)
    sliced = t.graph.node("Slice", [t.name_of(operand), t.graph.const(begin), t.graph.const(end), t.graph.const(axes)])
    if not collapsed:
        return sliced
    return t.graph.node("Squeeze", [sliced, t.graph.const(np.asarray(collapsed, np.int64), "axes")])


def _operand(t: _Translator, atom, dtype) -> str:
    """An operand cast to `dtype` (constants cast at export time)."""
    constant, value = t.read(atom)
    if constant:
        return t.graph.const(np.asarray(value).astype(dtype))
    if np.dtype(atom.aval.dtype) == np.dtype(dtype):
        return value
    return t.graph.node("Cast", [value], to=onnx_dtype(dtype))


def _unsigned_activations(t: _Translator, atom) -> tuple[str, str]:
    """An int8 activation tensor as (uint8 `q + 128`, its zero point 128): ONNX Runtime's fast
    integer GEMMs take unsigned activations with signed weights; `(q + 128 - 128) · w` is exact."""
    if np.dtype(atom.aval.dtype) == np.uint8:
        return t.name_of(atom), t.graph.const(np.asarray(0, np.uint8), "zero_point")
    wide = t.graph.node("Cast", [t.name_of(atom)], to=TensorProto.INT16)
    shifted = t.graph.node("Add", [wide, t.graph.const(np.asarray(128, np.int16))])
    return t.graph.node("Cast", [shifted], to=TensorProto.UINT8), t.graph.const(np.asarray(128, np.uint8), "zero_point")


def _dot_general(t: _Translator, eqn) -> str:
    """`x [..., K] · w` contracting x's last axis with one axis of w, as MatMul (float operands,
    computed in the accumulation type, as XLA does for bf16/fp16 operands with a float32 result)
    or MatMulInteger (int8 operands, int32 accumulation). A kernel `[K, N]` is used as it is;
    `[N, K]` (x · wᵀ) or a stacked `[C, K, N]` (an ensemble's) is rearranged at export time into
    `[K, C·N]` and the product reshaped to `[..., C, N]`; `[C, M, K] · [C, K, N]` with the
    leading axes batched (a vmapped ensemble) is a batched MatMul."""
    (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = eqn.params["dimension_numbers"]
    lhs, rhs = eqn.invars
    result_dtype = np.dtype(eqn.outvars[0].aval.dtype)
    rhs_constant, rhs_value = t.read(rhs)
    leading = tuple(range(len(lhs_batch)))
    stacked = (bool(lhs_batch) and tuple(lhs_batch) == tuple(rhs_batch) == leading and lhs.aval.ndim == rhs.aval.ndim == len(leading) + 2
               and tuple(lhs_contract) == (lhs.aval.ndim - 1,) and tuple(rhs_contract) == (rhs.aval.ndim - 2,))
    supported = stacked or (not lhs_batch and not rhs_batch and tuple(lhs_contract) == (lhs.aval.ndim - 1,)
                            and len(rhs_contract) == 1 and (rhs.aval.ndim == 2 or rhs_constant))
    if not supported:
        raise QrlInputError(f"the policy uses a dot_general of {lhs.aval.str_short()} and {rhs.aval.str_short()} with "
                            f"dimension numbers {eqn.params['dimension_numbers']}, which the ONNX export does not support")
    operand_dtypes = {np.dtype(lhs.aval.dtype), np.dtype(rhs.aval.dtype)}
    integer = operand_dtypes <= set(_INTEGER_KERNEL_DTYPES)
    if integer and result_dtype != np.int32:
        raise QrlInputError(f"the policy multiplies int8 operands into {result_dtype}; the ONNX export needs int32")
    if not integer and not np.issubdtype(result_dtype, np.floating):
        raise QrlInputError(f"the policy uses an integer matrix product of {sorted(map(str, operand_dtypes))}, "
                            "which the ONNX export does not support")
    kernel_dtype = rhs.aval.dtype if integer else result_dtype
    (axis,) = rhs_contract
    if stacked:  # [C, M, K] · [C, K, N] -> [C, M, N]: ONNX's matrix products batch leading axes as numpy does.
        kernel = _operand(t, rhs, kernel_dtype)
    elif rhs_constant:
        value = np.moveaxis(np.asarray(rhs_value), axis, 0)
        kernel = t.graph.const(value.reshape(value.shape[0], -1).astype(kernel_dtype), "kernel")
    else:
        kernel = _operand(t, rhs, kernel_dtype)
        kernel = kernel if axis == 0 else t.graph.node("Transpose", [kernel], perm=[1, 0])
    if integer:
        unsigned, zero_point = _unsigned_activations(t, lhs)
        product = t.graph.node("MatMulInteger", [unsigned, kernel, zero_point])
    else:
        product = t.graph.node("MatMul", [_operand(t, lhs, result_dtype), kernel])
    if stacked or rhs.aval.ndim == 2:
        return product
    return t.graph.node("Reshape", [product, t.graph.shape(eqn.outvars[0].aval.shape, t.batch_symbol)])


def _conv(t: _Translator, eqn) -> str:
    """`conv_general_dilated` as ONNX Conv / ConvInteger: operands transposed to NCHW / OIHW
    (the kernel at export time), the result back to the jaxpr's layout."""
    params = eqn.params
    if params["batch_group_count"] != 1 or any(d != 1 for d in params["lhs_dilation"]):
        raise QrlInputError("the policy uses a transposed or batch-grouped convolution, which the ONNX export does not support")
    numbers = params["dimension_numbers"]
    lhs_spec, rhs_spec, out_spec = numbers.lhs_spec, numbers.rhs_spec, numbers.out_spec
    lhs, rhs = eqn.invars
    result_dtype = np.dtype(eqn.outvars[0].aval.dtype)
    integer = {np.dtype(lhs.aval.dtype), np.dtype(rhs.aval.dtype)} <= set(_INTEGER_KERNEL_DTYPES)
    compute = None if integer else result_dtype
    x = t.graph.node("Transpose", [_operand(t, lhs, compute or lhs.aval.dtype)], perm=list(lhs_spec))
    constant, kernel = t.read(rhs)
    if constant:
        kernel = t.graph.const(np.transpose(np.asarray(kernel).astype(compute or rhs.aval.dtype), rhs_spec), "kernel")
    else:
        kernel = t.graph.node("Transpose", [_operand(t, rhs, compute or rhs.aval.dtype)], perm=list(rhs_spec))
    pads = [int(low) for low, _ in params["padding"]] + [int(high) for _, high in params["padding"]]
    attributes = dict(strides=[int(s) for s in params["window_strides"]], pads=pads,
                      dilations=[int(d) for d in params["rhs_dilation"]], group=int(params["feature_group_count"]))
    if integer:
        if result_dtype != np.int32:
            raise QrlInputError(f"the policy convolves int8 operands into {result_dtype}; the ONNX export needs int32")
        y = t.graph.node("ConvInteger", [x, kernel], **attributes)
    else:
        y = t.graph.node("Conv", [x, kernel], **attributes)
    return t.graph.node("Transpose", [y], perm=[int(axis) for axis in np.argsort(out_spec)])


_TRANSLATIONS: dict[str, Callable] = {
    "add": _elementwise("Add"), "sub": _elementwise("Sub"), "mul": _elementwise("Mul"), "div": _elementwise("Div"),
    "max": _elementwise("Max"), "min": _elementwise("Min"), "neg": _elementwise("Neg"), "abs": _elementwise("Abs"),
    "exp": _elementwise("Exp"), "log": _elementwise("Log"), "tanh": _elementwise("Tanh"),
    "logistic": _elementwise("Sigmoid"), "sqrt": _elementwise("Sqrt"), "floor": _elementwise("Floor"),
    "ceil": _elementwise("Ceil"), "sign": _elementwise("Sign"), "erf": _elementwise("Erf"), "pow": _elementwise("Pow"),
    "gt": _elementwise("Greater"), "lt": _elementwise("Less"), "ge": _elementwise("GreaterOrEqual"),
    "le": _elementwise("LessOrEqual"), "eq": _elementwise("Equal"), "ne": _ne,
    "and": _elementwise("And"), "or": _elementwise("Or"), "not": _elementwise("Not"),
    "rsqrt": _rsqrt, "square": _square, "integer_pow": _integer_pow, "round": _round, "clamp": _clamp,
    "select_n": _select_n, "convert_element_type": _convert, "copy": _identity, "copy_p": _identity,
    "stop_gradient": _identity, "optimization_barrier": _identity,
    "reduce_max": _reduce("ReduceMax"), "reduce_min": _reduce("ReduceMin"), "reduce_sum": _reduce("ReduceSum"),
    "argmax": _arg_reduce("ArgMax"), "argmin": _arg_reduce("ArgMin"),
    "reshape": _reshape, "broadcast_in_dim": _broadcast_in_dim, "squeeze": _squeeze, "transpose": _transpose,
    "concatenate": _concatenate, "slice": _slice, "split": _split, "gather": _gather,
    "dot_general": _dot_general, "conv_general_dilated": _conv,
}


def _constant_value(graph: _Graph, name: str) -> Optional[np.ndarray]:
    """The value of initializer `name`, None for a computed tensor."""
    tensor = graph.initializer_named(name)
    return None if tensor is None else numpy_helper.to_array(tensor)


def _other_operand(graph: _Graph, node, value: float) -> Optional[str]:
    """For a binary node with one scalar constant operand equal to `value`: the other operand."""
    for index in (0, 1):
        constant = _constant_value(graph, node.input[index])
        if constant is not None and constant.size == 1 and float(constant) == value:
            return node.input[1 - index]
    return None


def _fuse_quantize_linear(graph: _Graph) -> None:
    """Rewrites each 8-bit activation quantization feeding an integer GEMM into one
    `QuantizeLinear` (what ONNX Runtime runs fast and fuses with `MatMulInteger`).

    The translated chain `Cast<uint8>(Cast<int16>(Cast<int8>(Min(Max(Round(x / s) + z, -128),
    127))) + 128)` is `q + 128` for qrl's grid integer `q`; `QuantizeLinear(x, s, z + 128)`
    computes `saturate(round_half_even(x / s) + z + 128)` into [0, 255]: the same values. Scales
    and zero points may be constants or computed (dynamic), `[]` or per feature (last axis).
    Chains of any other shape (narrower grids, a symmetric [-127, 127] clip) are left as they are."""
    producers = {output: node for node in graph.nodes for output in node.output}

    def producer(name, op):
        node = producers.get(name)
        return node if node is not None and node.op_type == op else None

    replacements = {}
    for node in graph.nodes:
        if node.op_type != "MatMulInteger":
            continue
        to_uint8 = producer(node.input[0], "Cast")
        shifted = to_uint8 and producer(to_uint8.input[0], "Add")
        widened = shifted and producer(_other_operand(graph, shifted, 128) or "", "Cast")
        to_int8 = widened and producer(widened.input[0], "Cast")
        upper = to_int8 and producer(to_int8.input[0], "Min")
        lower = upper and producer(_other_operand(graph, upper, 127) or "", "Max")
        shifted_zero = lower and producer(_other_operand(graph, lower, -128) or "", "Add")
        rounded = shifted_zero and (producer(shifted_zero.input[0], "Round") or producer(shifted_zero.input[1], "Round"))
        divided = rounded and producer(rounded.input[0], "Div")
        if not divided:
            continue
        zero_point = shifted_zero.input[1] if shifted_zero.input[0] == rounded.output[0] else shifted_zero.input[0]
        x, scale = divided.input
        scale_value, zero_value = _constant_value(graph, scale), _constant_value(graph, zero_point)
        if scale_value is not None and zero_value is not None:  # static: per tensor, or per feature (1-D).
            scale_value = scale_value.reshape(scale_value.shape[-1:]) if scale_value.size > 1 else scale_value.reshape(())
            zero_value = zero_value.reshape(zero_value.shape[-1:]) if zero_value.size > 1 else zero_value.reshape(())
            if np.broadcast_shapes(zero_value.shape, scale_value.shape) != scale_value.shape:
                continue
            scale = graph.const(scale_value, "scale")  # [1, in] broadcasts in the Div; QuantizeLinear takes [in].
            unsigned_zero = graph.const(np.broadcast_to(zero_value + 128.0, scale_value.shape).astype(np.uint8), "zero_point")
            per_feature = {"axis": -1} if scale_value.ndim == 1 else {}
        elif scale_value is None and zero_value is None and all(
                int(np.prod(graph.input_shapes.get(name, ()))) == 1 for name in (scale, zero_point)):
            # dynamic (one scale and zero point per call) or a parameter input holding one.
            unsigned_zero = graph.node("Cast", [graph.node("Add", [zero_point, graph.const(np.asarray(128.0, np.float32))])],
                                       "zero_point", to=TensorProto.UINT8)
            per_feature = {}
        else:
            continue
        replacements[node.input[0]] = graph.node("QuantizeLinear", [x, scale, unsigned_zero], "quantized", **per_feature)
    for node in graph.nodes:
        if node.op_type == "MatMulInteger" and node.input[0] in replacements:
            node.input[0] = replacements[node.input[0]]
    graph.nodes[:] = _topological(graph.nodes)  # the new nodes were appended after their consumers.


def _topological(nodes: list) -> list:
    """`nodes` in an order where every node follows the producers of its inputs."""
    produced_by = {output: node for node in nodes for output in node.output}
    ordered, placed = [], set()

    def place(node):
        if id(node) in placed:
            return
        placed.add(id(node))
        for name in node.input:
            if name in produced_by:
                place(produced_by[name])
        ordered.append(node)

    for node in nodes:
        place(node)
    return ordered


def _remove_dead_nodes(graph: _Graph, output_names: Sequence[str]) -> None:
    """Drops nodes and initializers no graph output depends on."""
    needed, kept = set(output_names), []
    for node in reversed(graph.nodes):
        if any(output in needed for output in node.output):
            kept.append(node)
            needed.update(node.input)
    graph.nodes[:] = kept[::-1]
    graph.initializers[:] = [tensor for tensor in graph.initializers if tensor.name in needed]


_SPARSE_INDEX_BYTES = 8  # ONNX sparse tensors index their values with int64 (linearized) positions.
_WEIGHT_CONSUMERS = {"MatMul": 1, "MatMulInteger": 1}


def _sparse_initializers(graph: _Graph) -> list:
    """Moves every matrix-product kernel that is smaller on disk as a sparse tensor (kept values
    plus int64 positions: at a density under 1/3 for float32, 1/9 for int8) out of the dense
    initializers; returns them as ONNX `SparseTensorProto`s. A pruned policy's file shrinks with
    its sparsity; a runtime reading it gets the same dense kernel back."""
    kernels = {node.input[index] for node in graph.nodes for op, index in _WEIGHT_CONSUMERS.items()
               if node.op_type == op and len(node.input) > index}
    sparse, dense = [], []
    for tensor in graph.initializers:
        value = numpy_helper.to_array(tensor) if tensor.name in kernels else None
        if value is None or value.ndim != 2:
            dense.append(tensor)
            continue
        positions = np.flatnonzero(value)
        if positions.size * (value.itemsize + _SPARSE_INDEX_BYTES) >= value.nbytes:
            dense.append(tensor)
            continue
        sparse.append(helper.make_sparse_tensor(numpy_helper.from_array(value.reshape(-1)[positions], tensor.name),
                                                numpy_helper.from_array(positions.astype(np.int64), f"{tensor.name}_positions"),
                                                list(value.shape)))
    graph.initializers[:] = dense
    return sparse


def to_onnx(
    fn: Callable[[jax.Array], Any],
    observation_shape: Sequence[int],
    output_names: Sequence[str],
    observation_dtype: Any = np.float32,
    input_name: str = "observation",
    doc: str = "",
) -> onnx.ModelProto:
    """The ONNX model of `fn(observations [B, *observation_shape]) -> output or tuple of outputs`
    (named `output_names`), the batch B symbolic. Closed-over arrays become initializers, after
    folding every operation on constants alone; mostly-zero (pruned) kernels become sparse
    initializers. The model is checked by `onnx.checker`."""
    model, _ = _export(fn, None, observation_shape, output_names, observation_dtype, input_name, doc)
    return model


def to_onnx_with_parameters(
    fn: Callable[[Any, jax.Array], Any],
    parameters: Any,
    observation_shape: Sequence[int],
    output_names: Sequence[str],
    observation_dtype: Any = np.float32,
    input_name: str = "observation",
    doc: str = "",
) -> tuple[onnx.ModelProto, Callable[[Any], dict]]:
    """`(model, prepare)` for `fn(parameters, observations)`: the model takes the observations
    and what `prepare(parameters) -> {input name: numpy array}` computes from a parameter tree of
    `parameters`' structure, shapes and dtypes. Everything computed from the parameters alone
    (dequantizing, products of scales, a kernel's column sums) runs in `prepare` (jitted JAX),
    once per weight update; the model keeps what depends on the observation. One model then
    serves every weight update: an actor pulling weights feeds the new arrays."""
    return _export(fn, parameters, observation_shape, output_names, observation_dtype, input_name, doc)


def _export(fn, parameters, observation_shape, output_names, observation_dtype, input_name, doc):
    (batch_symbol,) = jax.export.symbolic_shape(BATCH)
    spec = jax.ShapeDtypeStruct((batch_symbol, *observation_shape), observation_dtype)
    graph = _Graph(input_name)
    translator = _Translator(graph, batch_symbol)
    if parameters is None:
        closed = jax.make_jaxpr(fn)(spec)
        outputs = translator.run(closed.jaxpr, closed.consts, [("name", input_name)])
    else:
        flat, structure = jax.tree_util.tree_flatten_with_path(parameters)
        avals = [jax.ShapeDtypeStruct(np.shape(leaf), np.asarray(leaf).dtype) for _, leaf in flat]
        closed = jax.make_jaxpr(fn)(jax.tree.unflatten(structure, avals), spec)
        leaves = [translator.new_deferred(var.aval, "param/" + jax.tree_util.keystr(path, simple=True, separator="/"))
                  for var, (path, _) in zip(closed.jaxpr.invars, flat)]
        outputs = translator.run(closed.jaxpr, closed.consts,
                                 [("deferred", leaf) for leaf in leaves] + [("name", input_name)])
    if len(outputs) != len(output_names):
        raise ValueError(f"the function returns {len(outputs)} outputs; {len(output_names)} names given")
    graph_outputs = []
    for name, (kind, value), var in zip(output_names, outputs, closed.jaxpr.outvars):
        source = graph.const(value) if kind == "const" else translator.materialize(value) if kind == "deferred" else value
        graph.nodes.append(helper.make_node("Identity", [source], [name]))
        shape = [BATCH if not isinstance(dim, (int, np.integer)) else int(dim) for dim in var.aval.shape]
        graph_outputs.append(helper.make_tensor_value_info(name, onnx_dtype(var.aval.dtype), shape))
    graph_input = helper.make_tensor_value_info(input_name, onnx_dtype(observation_dtype),
                                                [BATCH, *map(int, observation_shape)])
    extra_inputs = translator.graph_inputs
    _fuse_quantize_linear(graph)
    _remove_dead_nodes(graph, output_names)

    def model_of(sparse_initializers):
        onnx_graph = helper.make_graph(graph.nodes, "qrl_policy", [graph_input, *extra_inputs], graph_outputs,
                                       graph.initializers, sparse_initializer=sparse_initializers)
        model = helper.make_model(onnx_graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  producer_name="qrl", doc_string=doc)
        model.ir_version = 10
        return model

    # Shape inference types sparse initializers as sparse tensors, which MatMul's inference
    # rejects: the graph is checked in full with dense kernels, then structurally with sparse ones.
    onnx.checker.check_model(model_of([]), full_check=True)
    sparse = _sparse_initializers(graph)
    model = model_of(sparse)
    if sparse:
        onnx.checker.check_model(model)
    if parameters is None:
        return model, None
    program = translator.prepare_program(len(jax.tree.leaves(parameters)))
    names = list(translator.materialized.values())

    def prepare(tree) -> dict:
        return {name: np.asarray(value) for name, value in zip(names, program(jax.tree.leaves(tree)))}

    return model, prepare
