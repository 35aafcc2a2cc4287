"""Post-training quantization: calibrate activation ranges, convert fp32 params to a precision.

Params are the `params` collection of a network built from `qrl.networks.layers`: a nested dict
whose layer dicts hold `kernel` and `bias`. The quantized result is the parameter pytree the
same network, built at the target precision, consumes directly.
"""

import functools
from typing import Any, Callable, Mapping, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization

from qrl.errors import QrlInputError
from qrl.quant import ops
from qrl.quant.ops import CALIBRATION
from qrl.quant.precision import Precision

Params = Mapping[str, Any]
INPUT_ABSMAX = "input_absmax"


def _is_layer(node: Any) -> bool:
    return isinstance(node, Mapping) and "kernel" in node and not isinstance(node["kernel"], Mapping)


@functools.lru_cache(maxsize=64)
def _jitted_ranges(apply_fn: Callable[..., Any]) -> Callable[[Params, jax.Array], Any]:
    """One jitted `(params, batch) -> calibration tree` per network (params are an argument, so
    calibrating new params of the same network, e.g. every weight publish, compiles nothing)."""

    def ranges(params, batch):
        _, state = apply_fn({"params": params}, batch, mutable=[CALIBRATION])
        return state[CALIBRATION]

    return jax.jit(ranges)


def calibrate(
    apply_fn: Callable[..., Any],
    params: Params,
    observations: np.ndarray,
    batch_size: int = 4096,
) -> dict:
    """Max |input| of every layer over `observations [N, ...]`, as a tree shaped like params.

    `apply_fn` is the fp32 network's `module.apply`; each layer records its input range in the
    `calibration` collection. Batches are reduced with max, so the result covers every
    observation — static scales then never saturate on the calibration data.
    """
    observations = np.asarray(observations)
    if observations.shape[0] == 0:
        raise QrlInputError("calibration needs at least one observation")
    ranges = _jitted_ranges(apply_fn)
    result = None
    for start in range(0, observations.shape[0], batch_size):
        batch_ranges = ranges(params, observations[start : start + batch_size])
        result = batch_ranges if result is None else jax.tree.map(jnp.maximum, result, batch_ranges)
    return jax.tree.map(np.asarray, serialization.to_state_dict(result))


def quantize_params(
    params: Params, precision: Precision, input_ranges: Optional[Mapping[str, Any]] = None
) -> dict:
    """fp32 params -> params for the same network built at `precision`.

    Float precisions cast every leaf. Integer precisions quantize each layer's kernel
    (`kernel` values + `kernel_scale`), keep the bias in float32 and, for static activation
    scales, set `input_scale = max|input| / qmax` from `input_ranges` (see `calibrate`).
    """
    params = serialization.to_state_dict(params)
    if precision.is_float:
        return jax.tree.map(lambda leaf: np.asarray(jnp.asarray(leaf, precision.dtype)), params)
    if precision.activations == "static" and input_ranges is None:
        raise QrlInputError(f"{precision.name} with static activation scales needs calibration data")
    ranges = serialization.to_state_dict(input_ranges) if input_ranges is not None else None
    return _quantize_tree(params, precision, ranges, path=())


def _quantize_tree(node: Mapping, precision: Precision, ranges: Optional[Mapping], path: tuple) -> dict:
    if _is_layer(node):
        return _quantize_layer(node, precision, ranges, path)
    quantized = {}
    for key, child in node.items():
        child_ranges = ranges.get(key) if isinstance(ranges, Mapping) else None
        if isinstance(child, Mapping):
            quantized[key] = _quantize_tree(child, precision, child_ranges, path + (key,))
        else:
            quantized[key] = np.asarray(child)
    return quantized


def _quantize_layer(layer: Mapping, precision: Precision, ranges: Optional[Mapping], path: tuple) -> dict:
    values, scale = ops.quantize_weights(layer["kernel"], precision)
    quantized = {
        "kernel": np.asarray(values),
        "kernel_scale": np.asarray(scale, np.float32),
        "bias": np.asarray(layer["bias"], np.float32),
    }
    if precision.activations == "static":
        if ranges is None or INPUT_ABSMAX not in ranges:
            raise QrlInputError(f"no calibrated input range for layer {'/'.join(path)}")
        absmax = np.asarray(ranges[INPUT_ABSMAX], np.float32)
        scale = absmax / precision.activation_qmax if absmax > 0 else np.float32(1.0)
        quantized["input_scale"] = np.asarray(scale, np.float32)
    return quantized


def fake_quantized_float_params(params: Params, precision: Precision) -> dict:
    """fp32 params whose kernels are replaced by their quantize-dequantize round trip.

    Useful to inspect what a precision does to the weights (histograms) in float32.
    """
    params = serialization.to_state_dict(params)

    def visit(node):
        if _is_layer(node):
            values, scale = ops.quantize_weights(node["kernel"], precision)
            return {**node, "kernel": np.asarray(ops.dequantize(values, scale))}
        return {key: visit(child) if isinstance(child, Mapping) else child for key, child in node.items()}

    return visit(params)
