"""Weights from the fp32 learner to actors: encode once per publish, decode and load per actor.

The learner calls `encode` on its fp32 policy params at the communication precision and
publishes the blob to a `Broadcaster`; each actor pulls newer blobs, `decode`s them and `load`s
the params tree its policy network, built at `actor_network_precision(...)`, consumes.

Blob layout: one header byte (`0` raw, `1` zlib level 1) followed by msgpack (through
flax.serialization, so nothing is unpickled) of
`{"format": 1, "precision": str, "params": tree, "input_ranges": tree or {}}`.
An int8 params tree is exactly `qrl.quant.quantize_params`' int8 layout: per layer `kernel`
int8 `[in, out]`, `kernel_scale` f32 `[out]`, `bias` f32 `[out]`, plus `input_scale` f32 `[]`
when calibrated input ranges (`qrl.quant.calibrate`'s tree) are given. The blob carries no
checksum: raw blobs with flipped bits inside array data decode to wrong values, not errors.

A receiver refuses (QrlInputError, one line) what it cannot trust: `decode` never inflates a
zlib payload past `max_bytes` (a 1 MiB zip bomb would otherwise allocate 1 GiB), and
`WeightSpec.check` compares a message with the tree the receiving policy expects — every key
there and no other, each leaf's shape and dtype at the message's precision, every value finite.
"""

import dataclasses
import zlib
from typing import Any, Mapping, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization

from qrl.errors import QrlInputError
from qrl.quant import ops
from qrl.quant.precision import Precision, parse_precision
from qrl.quant.ptq import INPUT_ABSMAX
from qrl.quant.serialization import params_from_bytes

COMM_PRECISIONS = ("fp32", "fp16", "bf16", "int8")
ACTOR_PRECISIONS = ("fp32", "bf16", "fp16", "int8")
FORMAT = 1
HEADER_RAW = 0
HEADER_ZLIB = 1
ZLIB_LEVEL = 1

_FLOAT_DTYPES = {"fp32": np.dtype(np.float32), "fp16": np.dtype(np.float16), "bf16": np.dtype(jnp.bfloat16)}
# The int8 actors' scheme: one symmetric per-tensor scale per layer input (static or dynamic).
INT8_STATIC, INT8_DYNAMIC = "int8-obst-sym", "int8-obst-sym-dyn"
_INT8 = parse_precision(INT8_DYNAMIC)  # weight quantization is the same at either activation mode.
# `decode`'s cap without a WeightSpec: far above any policy this project trains (a 256-256 MLP's
# fp32 blob is ≈0.3 MiB, Atari's Nature CNN's ≈7 MiB), far below what a zip bomb inflates to.
DEFAULT_MAX_MESSAGE_BYTES = 256 * 2**20
# A WeightSpec's cap: the fp32 blob (the largest precision) twice over, plus room for msgpack keys.
MESSAGE_BYTES_FACTOR, MESSAGE_BYTES_HEADROOM = 2, 2**20


def check_precision(name: str, choices: tuple[str, ...], what: str) -> str:
    """The canonical (lower-case) name if it is one of `choices`; else one QrlInputError line."""
    text = str(name).strip().lower()
    if text not in choices:
        raise QrlInputError(f"unknown {what} {name!r}; choose one of {', '.join(choices)}")
    return text


def actor_network_precision(actor_precision: str, static_scales: bool) -> Precision:
    """The precision an actor builds its policy network at: `int8` with static (calibrated) or
    dynamic activation scales; float precisions as named."""
    actor_precision = check_precision(actor_precision, ACTOR_PRECISIONS, "actor precision")
    if actor_precision == "int8":
        return parse_precision(INT8_STATIC if static_scales else INT8_DYNAMIC)
    return parse_precision(actor_precision)


@dataclasses.dataclass(frozen=True)
class WeightMessage:
    """A decoded blob: `params` at the communication `precision` (numpy leaves) and the
    calibrated input ranges (`{layer: {"input_absmax": []}}` nested like params) or None."""

    precision: str
    params: dict
    input_ranges: Optional[dict]

    @property
    def static_scales(self) -> bool:
        """Whether an int8 actor can run static activation scales (ranges were shipped)."""
        return self.input_ranges is not None


def _is_float_layer(node: Any) -> bool:
    return isinstance(node, Mapping) and "kernel" in node and not isinstance(node["kernel"], Mapping)


def _is_int8_layer(node: Any) -> bool:
    return _is_float_layer(node) and "kernel_scale" in node


def _numpy_tree(tree: Mapping) -> dict:
    return jax.tree.map(np.asarray, serialization.to_state_dict(tree))


def _cast_tree(tree: Mapping, dtype: np.dtype) -> dict:
    """Every leaf cast to `dtype` with numpy (round to nearest even, as XLA casts)."""
    return jax.tree.map(lambda leaf: np.asarray(leaf).astype(dtype, copy=False), serialization.to_state_dict(tree))


@jax.jit
def _quantize_kernels(kernels: tuple) -> tuple:
    """One jitted call for every layer's kernel: `[(int8 values, f32 scale [out]), ...]`."""
    return tuple(ops.quantize_weights(kernel, _INT8) for kernel in kernels)


def _input_scale(ranges: Optional[Mapping], path: tuple) -> np.ndarray:
    """`max|input| / 127` (1 for a zero range), as `qrl.quant.quantize_params` computes it."""
    if not isinstance(ranges, Mapping) or INPUT_ABSMAX not in ranges:
        raise QrlInputError(f"no calibrated input range for layer {'/'.join(path)}")
    absmax = np.asarray(ranges[INPUT_ABSMAX], np.float32)
    scale = absmax / _INT8.activation_qmax if absmax > 0 else np.float32(1.0)
    return np.asarray(scale, np.float32)


def int8_params(params: Mapping, input_ranges: Optional[Mapping] = None) -> dict:
    """fp32 params -> the int8 tree `quantize_params(params, parse_precision(INT8_<mode>),
    input_ranges)` returns (static mode when `input_ranges` is given, else dynamic), with every
    kernel quantized in one jitted call (≈5× faster than layer by layer)."""
    params = serialization.to_state_dict(params)
    ranges = serialization.to_state_dict(input_ranges) if input_ranges is not None else None
    layers, kernels = [], []

    def visit(node: Mapping, node_ranges: Optional[Mapping], path: tuple) -> dict:
        if _is_float_layer(node):
            layer = {"bias": np.asarray(node["bias"], np.float32)}
            if ranges is not None:
                layer["input_scale"] = _input_scale(node_ranges, path)
            layers.append(layer)
            kernels.append(node["kernel"])
            return layer
        out = {}
        for key, child in node.items():
            if isinstance(child, Mapping):
                child_ranges = node_ranges.get(key) if isinstance(node_ranges, Mapping) else None
                out[key] = visit(child, child_ranges, path + (key,))
            else:
                out[key] = np.asarray(child)
        return out

    tree = visit(params, ranges, ())
    for layer, (values, scale) in zip(layers, _quantize_kernels(tuple(kernels))):
        layer["kernel"] = np.asarray(values)
        layer["kernel_scale"] = np.asarray(scale, np.float32)
    return tree


def _dequantized_params(params: Mapping, dtype: np.dtype) -> dict:
    """int8 tree -> float tree in `dtype`: kernels dequantized, scales dropped."""

    def visit(node: Mapping) -> dict:
        if _is_int8_layer(node):
            kernel = ops.dequantize(np.asarray(node["kernel"]), np.asarray(node["kernel_scale"]))
            return {"kernel": np.asarray(kernel).astype(dtype, copy=False),
                    "bias": np.asarray(node["bias"]).astype(dtype, copy=False)}
        return {key: visit(child) if isinstance(child, Mapping) else np.asarray(child).astype(dtype, copy=False)
                for key, child in node.items()}

    return visit(params)


def _absmax_ranges(input_ranges: Mapping) -> dict:
    """`calibrate`'s tree cut to what int8 actors use: each layer's `input_absmax`."""
    tree = serialization.to_state_dict(input_ranges)

    def visit(node: Mapping) -> dict:
        if INPUT_ABSMAX in node:
            return {INPUT_ABSMAX: node[INPUT_ABSMAX]}
        return {key: visit(child) for key, child in node.items() if isinstance(child, Mapping)}

    return visit(tree)


def encode(params: Mapping, comm_precision: str, input_ranges: Optional[Mapping] = None,
           compress: bool = False) -> bytes:
    """fp32 policy params -> a blob at `comm_precision` (see the module docstring).

    int8: the `qrl.quant.quantize_params` int8 layout (with `input_scale` per layer iff
    `input_ranges` is given); fp16/bf16: every leaf cast; fp32: every leaf as float32.
    `input_ranges` travel along in every precision (a float blob lets int8 actors use them).
    """
    precision = check_precision(comm_precision, COMM_PRECISIONS, "comm precision")
    if precision == "int8":
        tree = int8_params(params, input_ranges)
    else:
        tree = _cast_tree(params, _FLOAT_DTYPES[precision])
    ranges = _cast_tree(_absmax_ranges(input_ranges), np.dtype(np.float32)) if input_ranges is not None else {}
    payload = serialization.msgpack_serialize(
        {"format": FORMAT, "precision": precision, "params": tree, "input_ranges": ranges}
    )
    if compress:
        return bytes((HEADER_ZLIB,)) + zlib.compress(payload, ZLIB_LEVEL)
    return bytes((HEADER_RAW,)) + payload


def decode(blob: bytes, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> WeightMessage:
    """Inverse of `encode`; an unknown header, corrupt or truncated bytes, or a message over
    `max_bytes` (inflated or raw) raise QrlInputError."""
    if not isinstance(blob, (bytes, bytearray, memoryview)) or len(blob) < 2:
        raise QrlInputError("corrupt weight blob: too short")
    header, payload = blob[0], bytes(blob[1:])
    if header == HEADER_ZLIB:
        payload = _inflate(payload, max_bytes)
    elif header != HEADER_RAW:
        raise QrlInputError(f"corrupt weight blob: unknown header byte {header} (expected 0 raw or 1 zlib)")
    elif len(payload) > max_bytes:
        raise QrlInputError(f"weight blob refused: {len(payload)} bytes, more than the {max_bytes} expected at most")
    message = params_from_bytes(payload)
    if message.get("format") != FORMAT or set(message) != {"format", "precision", "params", "input_ranges"}:
        raise QrlInputError(f"corrupt weight blob: not a format-{FORMAT} weight message")
    precision, params, ranges = message["precision"], message["params"], message["input_ranges"]
    if precision not in COMM_PRECISIONS or not isinstance(params, dict) or not isinstance(ranges, dict):
        raise QrlInputError("corrupt weight blob: bad precision or parameter tree")
    return WeightMessage(precision=precision, params=params, input_ranges=ranges or None)


def _inflate(payload: bytes, max_bytes: int) -> bytes:
    """zlib-decompressed `payload`, refused once it would pass `max_bytes` (never allocated)."""
    inflater = zlib.decompressobj()
    try:
        inflated = inflater.decompress(payload, max_bytes + 1)
    except zlib.error as error:
        raise QrlInputError(f"corrupt weight blob: {error}") from None
    if len(inflated) > max_bytes or inflater.unconsumed_tail:
        raise QrlInputError(f"weight blob refused: it inflates past the {max_bytes} bytes expected at most")
    if not inflater.eof:
        raise QrlInputError("corrupt weight blob: the zlib stream is truncated")
    if inflater.unused_data:
        raise QrlInputError("corrupt weight blob: trailing bytes after the zlib stream")
    return inflated


class WeightSpec:
    """What a receiver accepts: built from the shapes of its fp32 policy params (arrays or
    `jax.ShapeDtypeStruct`s, e.g. `jax.eval_shape` of the agent's init), it knows each
    precision's expected leaves and caps a message's size (`max_message_bytes`)."""

    def __init__(self, fp32_shapes: Mapping):
        tree = serialization.to_state_dict(fp32_shapes)
        self._shapes = {path: tuple(leaf.shape) for path, leaf in _flat_leaves(tree)}
        self._layers = _float_layer_paths(tree)
        fp32_bytes = sum(4 * int(np.prod(shape)) for shape in self._shapes.values())
        self.max_message_bytes = MESSAGE_BYTES_FACTOR * fp32_bytes + MESSAGE_BYTES_HEADROOM

    def expected_leaves(self, precision: str, static_scales: bool) -> dict:
        """`{"layer/kernel": (shape, dtype), ...}` of a `precision` message's params."""
        if precision != "int8":
            return {path: (shape, _FLOAT_DTYPES[precision]) for path, shape in self._shapes.items()}
        expected = {path: (shape, np.dtype(np.float32)) for path, shape in self._shapes.items()}
        for layer in self._layers:
            kernel = self._shapes[f"{layer}/kernel"]
            expected[f"{layer}/kernel"] = (kernel, np.dtype(np.int8))
            expected[f"{layer}/kernel_scale"] = ((kernel[-1],), np.dtype(np.float32))
            if static_scales:
                expected[f"{layer}/input_scale"] = ((), np.dtype(np.float32))
        return expected

    def check(self, message: WeightMessage) -> WeightMessage:
        """`message` if its params (and input ranges) are exactly what this receiver's policy
        takes at the message's precision, with finite values; else one QrlInputError line."""
        expected = self.expected_leaves(message.precision, message.static_scales)
        _check_leaves(dict(_flat_leaves(message.params)), expected, "weights")
        if message.input_ranges is not None:
            ranges = {f"{layer}/{INPUT_ABSMAX}": ((), np.dtype(np.float32)) for layer in self._layers}
            _check_leaves(dict(_flat_leaves(message.input_ranges)), ranges, "input ranges", non_negative=True)
        return message


def policy_weight_spec(agent: Any) -> WeightSpec:
    """The WeightSpec of a DistributedAgent's policy: shapes from its init, traced, not run."""
    shapes = jax.eval_shape(lambda: agent.policy_params(agent.init(jax.random.PRNGKey(0))))
    return WeightSpec(shapes)


def _flat_leaves(tree: Mapping, prefix: str = ""):
    """`(slash path, leaf)` for every non-mapping leaf of a nested mapping."""
    for key, child in tree.items():
        path = f"{prefix}{key}"
        if isinstance(child, Mapping):
            yield from _flat_leaves(child, path + "/")
        else:
            yield path, child


def _float_layer_paths(tree: Mapping, prefix: str = "") -> list[str]:
    """Slash paths of the layers `int8_params` quantizes (mappings holding an array `kernel`)."""
    if _is_float_layer(tree):
        return [prefix.rstrip("/")]
    return [path for key, child in tree.items() if isinstance(child, Mapping)
            for path in _float_layer_paths(child, f"{prefix}{key}/")]


def _check_leaves(leaves: dict, expected: dict, what: str, non_negative: bool = False) -> None:
    missing, unexpected = sorted(set(expected) - set(leaves)), sorted(set(leaves) - set(expected))
    if missing or unexpected:
        details = "; ".join(part for part in (
            f"missing {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}" if missing else "",
            f"unexpected {', '.join(unexpected[:3])}{' ...' if len(unexpected) > 3 else ''}" if unexpected else "",
        ) if part)
        raise QrlInputError(f"{what} refused: not the receiver's policy tree ({details})")
    for path, (shape, dtype) in expected.items():
        leaf = np.asarray(leaves[path]) if isinstance(leaves[path], np.generic) else leaves[path]
        if not isinstance(leaf, np.ndarray) or leaf.dtype != dtype or leaf.shape != shape:
            got = f"{leaf.dtype} {list(leaf.shape)}" if isinstance(leaf, np.ndarray) else type(leaf).__name__
            raise QrlInputError(f"{what} refused: {path} is {got}, expected {np.dtype(dtype)} {list(shape)}")
        if leaf.dtype.kind == "f" or dtype == _FLOAT_DTYPES["bf16"]:
            # fp32/fp16 leaves are checked in place (a pull's hot path); bf16 has no numpy ufuncs.
            values = leaf if leaf.dtype.kind == "f" else leaf.astype(np.float32)
            if not np.isfinite(values).all():
                raise QrlInputError(f"{what} refused: {path} holds NaN or infinite values")
            if non_negative and (values < 0).any():
                raise QrlInputError(f"{what} refused: {path} is negative")


def load(message: WeightMessage, actor_precision: str) -> dict:
    """The numpy params tree the policy network built at
    `actor_network_precision(actor_precision, message.static_scales)` consumes.

    int8 -> int8: as shipped. int8 -> float: kernels dequantized, scales dropped, cast.
    float -> float: cast. float -> int8: quantized here (static scales iff ranges were shipped).
    """
    actor = check_precision(actor_precision, ACTOR_PRECISIONS, "actor precision")
    if message.precision == "int8":
        if actor == "int8":
            return _numpy_tree(message.params)
        return _dequantized_params(message.params, _FLOAT_DTYPES[actor])
    if actor == "int8":
        return int8_params(_cast_tree(message.params, np.dtype(np.float32)), message.input_ranges)
    return _cast_tree(message.params, _FLOAT_DTYPES[actor])


def has_static_scales(params: Mapping) -> bool:
    """Whether a loaded int8 params tree carries calibrated `input_scale`s (static activation scales)."""
    for key, child in params.items():
        if key == "input_scale" or (isinstance(child, Mapping) and has_static_scales(child)):
            return True
    return False


def fp32_bytes(params: Mapping, input_ranges: Optional[Mapping] = None) -> int:
    """Bytes of the uncompressed fp32 blob of `params`: the denominator of publish ratios."""
    return len(encode(params, "fp32", input_ranges))
