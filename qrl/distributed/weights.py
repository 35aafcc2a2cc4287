"""Weights from the fp32 learner to actors: encode once per publish, decode and load per actor.

The learner calls `encode` on its fp32 policy params at the communication precision, for the
int8 actors' scheme (`ACTOR_INT8_SCHEMES`), and publishes the blob to a `Broadcaster`; each
actor pulls newer blobs, `decode`s them and `load`s the params tree its policy network, built
at `actor_network_precision(actor_precision, message.int8_scheme)`, consumes.

Blob layout: one header byte (`0` raw, `1` zlib level 1) followed by msgpack (through
flax.serialization, so nothing is unpickled) of `{"format": 2, "precision": str,
"int8_scheme": str, "params": tree, "input_ranges": tree or {}}`. An int8 params tree is
exactly `qrl.quant.quantize_params(params, parse_precision(int8_scheme), ranges)`: per layer
`kernel` int8 `[in, out]`, `kernel_scale` f32 `[out]`, `bias` f32 `[out]`, and on layers with
static input scales `input_scale` f32 (`[in]` for per-feature observation scales, else `[]`)
plus `input_zero_point` (same shape) on affine grids. A float blob for a calibrated scheme
carries the ranges that scheme reads (`scheme_ranges`): every layer's `role`, and `input_min` /
`input_max` (`[in]` per feature, `[]` per tensor) where the layer's input scale is static; an
int8 blob has them folded into its params. Without calibrated ranges (the first publish, before
any sample) a calibrated scheme falls back to its uncalibrated twin (`uncalibrated_scheme`).
The blob carries no checksum: raw blobs with flipped bits inside array data decode to wrong
values, not errors.

A receiver refuses (QrlInputError, one line) what it cannot trust: `decode` never inflates a
zlib payload past `max_bytes` (a 1 MiB zip bomb would otherwise allocate 1 GiB), and
`WeightSpec.check` compares a message with the tree the receiving policy expects at the
message's precision and scheme — every key there and no other, each leaf's shape and dtype,
every value finite, layer roles as the receiver's network has them, positive input scales and
`input_min <= input_max`.
"""

import dataclasses
import zlib
from typing import Any, Mapping, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization

from qrl.errors import QrlInputError
from qrl.networks.layers import Conv, Dense
from qrl.quant import ops
from qrl.quant.precision import FP32, Precision, parse_precision
from qrl.quant.ptq import INPUT_MAX, INPUT_MIN, ROLE, ROLE_OUTPUT, ROLE_READS_OBSERVATION, needs_calibration
from qrl.quant.serialization import params_from_bytes

COMM_PRECISIONS = ("fp32", "fp16", "bf16", "int8")
ACTOR_PRECISIONS = ("fp32", "bf16", "fp16", "int8")
# The int8 actors' schemes (`qrl.quant.precision`): qrl's W+A int8 (static, per-feature
# observation scales, affine grids) and its dynamic variant, QuaRL's dynamic-range int8, and the
# per-tensor symmetric scheme qrl's actors ran before (static and dynamic).
ACTOR_INT8_SCHEMES = ("int8", "int8-dyn", "quarl_dyn8", "int8-obst-sym", "int8-obst-sym-dyn")
DEFAULT_ACTOR_INT8_SCHEME = "quarl_dyn8"  # closest to fp32 in `launch.actorq_schemes` (README, "ActorQ").
# What a calibrated scheme runs before ranges exist: the same grid, scales computed per call.
_UNCALIBRATED = {"int8": "quarl_dyn8", "int8-dyn": "quarl_dyn8", "int8-obst-sym": "int8-obst-sym-dyn"}
FORMAT = 2
MESSAGE_KEYS = {"format", "precision", "int8_scheme", "params", "input_ranges"}
HEADER_RAW = 0
HEADER_ZLIB = 1
ZLIB_LEVEL = 1

_FLOAT_DTYPES = {"fp32": np.dtype(np.float32), "fp16": np.dtype(np.float16), "bf16": np.dtype(jnp.bfloat16)}
_INT8_WEIGHTS = parse_precision("int8")  # every actor scheme quantizes weights alike (8 bits, per channel).
_ROLE_DTYPE = np.dtype(np.int32)
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


def check_int8_scheme(name: str) -> str:
    """The canonical name of an int8 actor scheme; else one QrlInputError line naming the choices."""
    return check_precision(name, ACTOR_INT8_SCHEMES, "actor int8 scheme")


def uncalibrated_scheme(int8_scheme: str) -> str:
    """The scheme int8 actors run when no calibrated ranges are shipped: `int8_scheme` itself
    if it needs none, else its twin with per-call scales (`int8`, `int8-dyn` -> `quarl_dyn8`,
    the same affine grid per tensor; `int8-obst-sym` -> `int8-obst-sym-dyn`)."""
    scheme = check_int8_scheme(int8_scheme)
    return _UNCALIBRATED.get(scheme, scheme)


def actor_network_precision(actor_precision: str, int8_scheme: str = DEFAULT_ACTOR_INT8_SCHEME) -> Precision:
    """The precision an actor builds its policy network at: `int8_scheme` for int8 actors,
    float precisions as named."""
    actor_precision = check_precision(actor_precision, ACTOR_PRECISIONS, "actor precision")
    if actor_precision == "int8":
        return parse_precision(check_int8_scheme(int8_scheme))
    return parse_precision(actor_precision)


@dataclasses.dataclass(frozen=True)
class WeightMessage:
    """A decoded blob: `params` at the communication `precision` (numpy leaves), the
    `int8_scheme` they are (int8) or will be quantized to (float) for int8 actors, and that
    scheme's calibrated input ranges (`scheme_ranges`' tree; None when it needs none)."""

    precision: str
    int8_scheme: str
    params: dict
    input_ranges: Optional[dict]


def _is_float_layer(node: Any) -> bool:
    return isinstance(node, Mapping) and "kernel" in node and not isinstance(node["kernel"], Mapping)


def _numpy_tree(tree: Mapping) -> dict:
    return jax.tree.map(np.asarray, serialization.to_state_dict(tree))


def _cast_tree(tree: Mapping, dtype: np.dtype) -> dict:
    """Every leaf cast to `dtype` with numpy (round to nearest even, as XLA casts)."""
    return jax.tree.map(lambda leaf: np.asarray(leaf).astype(dtype, copy=False), serialization.to_state_dict(tree))


@jax.jit
def _quantize_kernels(kernels: tuple) -> tuple:
    """One jitted call for every layer's kernel: `[(int8 values, f32 scale [out]), ...]`."""
    return tuple(ops.quantize_weights(kernel, _INT8_WEIGHTS) for kernel in kernels)


def _layer_precision(precision: Precision, role: int) -> Precision:
    return precision.for_layer(bool(role & ROLE_READS_OBSERVATION), bool(role & ROLE_OUTPUT))


def _range_leaf(ranges: Optional[Mapping], key: str, path: tuple) -> np.ndarray:
    if not isinstance(ranges, Mapping) or key not in ranges:
        raise QrlInputError(f"no calibrated input range ({key}) for layer {'/'.join(path)}")
    return np.asarray(ranges[key])


def _zero_point_correction(values: np.ndarray, zero_point: np.ndarray) -> np.ndarray:
    """`ops.zero_point_correction` of int8 `values [..., in, out]` in numpy, float64 `[out]`
    (exact integers, as `quantize_params` folds them into the bias)."""
    column_sums = values.astype(np.int64).sum(axis=tuple(range(values.ndim - 2)))  # [in, out]
    weighted = np.reshape(np.asarray(zero_point).astype(np.int64), (-1, 1)) * column_sums
    return weighted.sum(axis=0).astype(np.float64)


def int8_params(params: Mapping, int8_scheme: str, input_ranges: Optional[Mapping] = None) -> dict:
    """fp32 params -> the int8 tree `quantize_params(params, parse_precision(int8_scheme),
    input_ranges)` returns (`input_ranges`: `calibrate`'s tree or `scheme_ranges`' cut of it,
    needed iff the scheme is calibrated), with every kernel quantized in one jitted call (≈5×
    faster than layer by layer) and the scales and zero points computed in numpy."""
    precision = parse_precision(check_int8_scheme(int8_scheme))
    calibrated = needs_calibration(precision)
    if calibrated and input_ranges is None:
        raise QrlInputError(f"int8 scheme {precision.name} needs calibrated input ranges")
    params = serialization.to_state_dict(params)
    ranges = scheme_ranges(input_ranges, precision.name) if calibrated else None
    layers, kernels = [], []

    def visit(node: Mapping, node_ranges: Optional[Mapping], path: tuple) -> dict:
        if _is_float_layer(node):
            kernel = np.asarray(node["kernel"], np.float32)
            layer = {"bias": np.asarray(node["bias"], np.float32)}
            static = None
            if calibrated:
                role = int(_range_leaf(node_ranges, ROLE, path))
                reads_observation = bool(role & ROLE_READS_OBSERVATION)
                layer_precision = _layer_precision(precision, role)
                if layer_precision.activations == "static":
                    low, high = _range_leaf(node_ranges, INPUT_MIN, path), _range_leaf(node_ranges, INPUT_MAX, path)
                    per_feature = layer_precision.per_feature_input(reads_observation)
                    input_scale, zero_point = ops.grid_range(low, high, layer_precision)
                    if per_feature:
                        kernel = kernel * input_scale[:, None]
                    static = (np.asarray(input_scale, np.float32), np.asarray(zero_point, np.float32),
                              per_feature, layer_precision.grid == "affine")
            layers.append((layer, static))
            kernels.append(kernel)
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
    for (layer, static), (values, scale) in zip(layers, _quantize_kernels(tuple(kernels))):
        values, kernel_scale = np.asarray(values), np.asarray(scale, np.float32)
        layer["kernel"], layer["kernel_scale"] = values, kernel_scale
        if static is not None:
            input_scale, zero_point, per_feature, affine = static
            layer["input_scale"] = input_scale
            if affine:
                output_scale = kernel_scale if per_feature else input_scale * kernel_scale
                correction = _zero_point_correction(values, zero_point)
                layer["bias"] = (layer["bias"] - output_scale * correction).astype(np.float32)
                layer["input_zero_point"] = zero_point
    return tree


def _dequantized_params(params: Mapping, dtype: np.dtype) -> dict:
    """int8 tree -> float tree in `dtype` computing the same function in float: kernels
    dequantized (per-feature input scales unfolded), zero-point corrections taken back out of
    the bias, scales dropped."""

    def visit(node: Mapping) -> dict:
        if _is_float_layer(node):
            values = np.asarray(node["kernel"])
            kernel_scale = np.asarray(node["kernel_scale"], np.float32)
            kernel = np.asarray(ops.dequantize(values, kernel_scale), np.float32)
            bias = np.asarray(node["bias"], np.float32)
            if "input_scale" in node:
                input_scale = np.asarray(node["input_scale"], np.float32)
                per_feature = input_scale.ndim == 1
                if "input_zero_point" in node:
                    output_scale = kernel_scale if per_feature else input_scale * kernel_scale
                    correction = _zero_point_correction(values, node["input_zero_point"])
                    bias = (bias + output_scale * correction).astype(np.float32)
                if per_feature:
                    kernel = kernel / input_scale[:, None]
            return {"kernel": kernel.astype(dtype, copy=False), "bias": bias.astype(dtype, copy=False)}
        return {key: visit(child) if isinstance(child, Mapping) else np.asarray(child).astype(dtype, copy=False)
                for key, child in node.items()}

    return visit(params)


def scheme_ranges(input_ranges: Mapping, int8_scheme: str) -> dict:
    """`calibrate`'s tree cut to what `int8_scheme` reads: per layer `role` (int32 `[]`) and,
    where the layer's input scale is static, `input_min` / `input_max` float32 (`[in]` for
    per-feature observation scales, reduced to `[]` per tensor). Empty for uncalibrated schemes."""
    precision = parse_precision(check_int8_scheme(int8_scheme))
    if not needs_calibration(precision):
        return {}
    tree = serialization.to_state_dict(input_ranges)

    def visit(node: Mapping, path: tuple) -> dict:
        if ROLE in node:
            role = int(np.asarray(node[ROLE]))
            cut = {ROLE: np.asarray(role, _ROLE_DTYPE)}
            layer_precision = _layer_precision(precision, role)
            if layer_precision.activations == "static":
                low = _range_leaf(node, INPUT_MIN, path).astype(np.float32)
                high = _range_leaf(node, INPUT_MAX, path).astype(np.float32)
                if not layer_precision.per_feature_input(bool(role & ROLE_READS_OBSERVATION)):
                    low, high = low.min(), high.max()
                cut[INPUT_MIN], cut[INPUT_MAX] = np.asarray(low, np.float32), np.asarray(high, np.float32)
            return cut
        return {key: visit(child, path + (key,)) for key, child in node.items() if isinstance(child, Mapping)}

    return visit(tree, ())


def encode(params: Mapping, comm_precision: str, input_ranges: Optional[Mapping] = None,
           compress: bool = False, int8_scheme: str = DEFAULT_ACTOR_INT8_SCHEME) -> bytes:
    """fp32 policy params -> a blob at `comm_precision` for int8 actors running `int8_scheme`
    (see the module docstring); `input_ranges` is `calibrate`'s tree (None: the scheme's
    uncalibrated twin).

    int8: `int8_params` at the scheme; fp16/bf16: every leaf cast; fp32: every leaf as float32,
    float blobs with the scheme's `scheme_ranges` (int8 actors quantize them on arrival).
    """
    precision = check_precision(comm_precision, COMM_PRECISIONS, "comm precision")
    scheme = check_int8_scheme(int8_scheme) if input_ranges is not None else uncalibrated_scheme(int8_scheme)
    ranges = scheme_ranges(input_ranges, scheme) if input_ranges is not None else {}
    if precision == "int8":
        tree, ranges = int8_params(params, scheme, ranges or None), {}
    else:
        tree = _cast_tree(params, _FLOAT_DTYPES[precision])
    payload = serialization.msgpack_serialize(
        {"format": FORMAT, "precision": precision, "int8_scheme": scheme, "params": tree, "input_ranges": ranges}
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
    if message.get("format") != FORMAT or set(message) != MESSAGE_KEYS:
        raise QrlInputError(f"corrupt weight blob: not a format-{FORMAT} weight message")
    precision, scheme = message["precision"], message["int8_scheme"]
    params, ranges = message["params"], message["input_ranges"]
    if precision not in COMM_PRECISIONS or not isinstance(params, dict) or not isinstance(ranges, dict):
        raise QrlInputError("corrupt weight blob: bad precision or parameter tree")
    if scheme not in ACTOR_INT8_SCHEMES:
        raise QrlInputError(f"corrupt weight blob: unknown int8 scheme {str(scheme)[:40]!r}")
    return WeightMessage(precision=precision, int8_scheme=scheme, params=params, input_ranges=ranges or None)


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


def layer_roles(network: nn.Module, observation: jax.ShapeDtypeStruct) -> dict:
    """`{"layer/path": role}` of every qrl Dense/Conv in `network` (role bit flags: 1 reads the
    observation, 2 is an output layer), traced on `observation [N, ...]`, not run."""
    roles = {}

    def record(next_fun, args, kwargs, context):
        module = context.module
        if isinstance(module, (Conv, Dense)) and context.method_name == "__call__":
            roles["/".join(module.path)] = (ROLE_READS_OBSERVATION * bool(module.reads_observation)
                                            + ROLE_OUTPUT * bool(module.is_output))
        return next_fun(*args, **kwargs)

    with nn.intercept_methods(record):
        jax.eval_shape(network.init, jax.random.PRNGKey(0), observation)
    return roles


class WeightSpec:
    """What a receiver accepts: built from the shapes of its fp32 policy params (arrays or
    `jax.ShapeDtypeStruct`s, e.g. `jax.eval_shape` of the agent's init) and its layers' roles
    (`layer_roles`), it knows each precision's and int8 scheme's expected leaves and caps a
    message's size (`max_message_bytes`)."""

    def __init__(self, fp32_shapes: Mapping, roles: Mapping[str, int]):
        tree = serialization.to_state_dict(fp32_shapes)
        self._shapes = {path: tuple(leaf.shape) for path, leaf in _flat_leaves(tree)}
        self._layers = _float_layer_paths(tree)
        if set(roles) != set(self._layers):
            raise ValueError(f"roles name layers {sorted(roles)}, the params hold {sorted(self._layers)}")
        self._roles = {layer: int(roles[layer]) for layer in self._layers}
        fp32_bytes = sum(4 * int(np.prod(shape)) for shape in self._shapes.values())
        self.max_message_bytes = MESSAGE_BYTES_FACTOR * fp32_bytes + MESSAGE_BYTES_HEADROOM

    def _static_inputs(self, int8_scheme: str):
        """`(layer, input shape, affine)` of each layer whose input scale `int8_scheme` calibrates."""
        precision = parse_precision(int8_scheme)
        for layer in self._layers:
            role = self._roles[layer]
            layer_precision = _layer_precision(precision, role)
            if layer_precision.activations == "static":
                per_feature = layer_precision.per_feature_input(bool(role & ROLE_READS_OBSERVATION))
                shape = (self._shapes[f"{layer}/kernel"][-2],) if per_feature else ()
                yield layer, shape, layer_precision.grid == "affine"

    def expected_leaves(self, precision: str, int8_scheme: str) -> dict:
        """`{"layer/kernel": (shape, dtype), ...}` of a `precision` message's params for int8
        actors running `int8_scheme`."""
        if precision != "int8":
            return {path: (shape, _FLOAT_DTYPES[precision]) for path, shape in self._shapes.items()}
        f32 = np.dtype(np.float32)
        expected = {path: (shape, f32) for path, shape in self._shapes.items()}
        for layer in self._layers:
            kernel = self._shapes[f"{layer}/kernel"]
            expected[f"{layer}/kernel"] = (kernel, np.dtype(np.int8))
            expected[f"{layer}/kernel_scale"] = ((kernel[-1],), f32)
        for layer, shape, affine in self._static_inputs(int8_scheme):
            expected[f"{layer}/input_scale"] = (shape, f32)
            if affine:
                expected[f"{layer}/input_zero_point"] = (shape, f32)
        return expected

    def expected_ranges(self, precision: str, int8_scheme: str) -> dict:
        """`{"layer/input_min": (shape, dtype), ...}` of the ranges a `precision` message for
        `int8_scheme` carries (`scheme_ranges`; none in int8 messages, which fold them in)."""
        if precision == "int8" or not needs_calibration(parse_precision(int8_scheme)):
            return {}
        expected = {f"{layer}/{ROLE}": ((), _ROLE_DTYPE) for layer in self._layers}
        for layer, shape, _ in self._static_inputs(int8_scheme):
            expected[f"{layer}/{INPUT_MIN}"] = (shape, np.dtype(np.float32))
            expected[f"{layer}/{INPUT_MAX}"] = (shape, np.dtype(np.float32))
        return expected

    def check(self, message: WeightMessage) -> WeightMessage:
        """`message` if its params and input ranges are exactly what this receiver's policy takes
        at the message's precision and int8 scheme, with finite values, positive input scales,
        this network's layer roles and `input_min <= input_max`; else one QrlInputError line."""
        scheme = check_int8_scheme(message.int8_scheme)
        params = dict(_flat_leaves(message.params))
        _check_leaves(params, self.expected_leaves(message.precision, scheme), "weights")
        for path, leaf in params.items():
            if path.endswith("/input_scale") and not (np.asarray(leaf) > 0).all():
                raise QrlInputError(f"weights refused: {path} is not positive")
        ranges = dict(_flat_leaves(message.input_ranges or {}))
        _check_leaves(ranges, self.expected_ranges(message.precision, scheme), "input ranges")
        for layer in self._layers:
            role = ranges.get(f"{layer}/{ROLE}")
            if role is not None and int(role) != self._roles[layer]:
                raise QrlInputError(f"input ranges refused: {layer}/{ROLE} is {int(role)}, this network's is {self._roles[layer]}")
            low, high = ranges.get(f"{layer}/{INPUT_MIN}"), ranges.get(f"{layer}/{INPUT_MAX}")
            if low is not None and (np.asarray(low) > np.asarray(high)).any():
                raise QrlInputError(f"input ranges refused: {layer}/{INPUT_MIN} exceeds {INPUT_MAX}")
        return message


def policy_weight_spec(agent: Any, observation_spec: Any) -> WeightSpec:
    """The WeightSpec of a DistributedAgent's policy on observations of `observation_spec`
    (shape, dtype): shapes from its init and roles from its fp32 network, traced, not run."""
    shapes = jax.eval_shape(lambda: agent.policy_params(agent.init(jax.random.PRNGKey(0))))
    observation = jax.ShapeDtypeStruct((1, *observation_spec.shape), observation_spec.dtype)
    return WeightSpec(shapes, layer_roles(agent.policy_network(FP32), observation))


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


def _check_leaves(leaves: dict, expected: dict, what: str) -> None:
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


def load(message: WeightMessage, actor_precision: str) -> dict:
    """The numpy params tree the policy network built at
    `actor_network_precision(actor_precision, message.int8_scheme)` consumes.

    int8 -> int8: as shipped. int8 -> float: dequantized to the same function in float, cast.
    float -> float: cast. float -> int8: quantized here at the message's scheme and ranges.
    """
    actor = check_precision(actor_precision, ACTOR_PRECISIONS, "actor precision")
    if message.precision == "int8":
        if actor == "int8":
            return _numpy_tree(message.params)
        return _dequantized_params(message.params, _FLOAT_DTYPES[actor])
    if actor == "int8":
        return int8_params(_cast_tree(message.params, np.dtype(np.float32)), message.int8_scheme, message.input_ranges)
    return _cast_tree(message.params, _FLOAT_DTYPES[actor])


def fp32_bytes(params: Mapping, input_ranges: Optional[Mapping] = None,
               int8_scheme: str = DEFAULT_ACTOR_INT8_SCHEME) -> int:
    """Bytes of the uncompressed fp32 blob of `params`: the denominator of publish ratios."""
    return len(encode(params, "fp32", input_ranges, int8_scheme=int8_scheme))
