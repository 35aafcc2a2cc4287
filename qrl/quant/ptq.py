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
INPUT_MIN = "input_min"
INPUT_MAX = "input_max"
ROLE = "role"
ROLE_READS_OBSERVATION, ROLE_OUTPUT = 1, 2  # as qrl.networks.layers records them.


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


def _merge_ranges(total: Any, batch: Any) -> Any:
    """Combines two calibration trees: `input_min` by minimum, every other statistic by maximum."""
    return jax.tree_util.tree_map_with_path(
        lambda path, a, b: jnp.minimum(a, b) if getattr(path[-1], "key", None) == INPUT_MIN else jnp.maximum(a, b),
        total, batch,
    )


def calibrate(
    apply_fn: Callable[..., Any],
    params: Params,
    observations: np.ndarray,
    batch_size: int = 4096,
) -> dict:
    """Every layer's input statistics over `observations [N, ...]`, as a tree shaped like params.

    `apply_fn` is the fp32 network's `module.apply`; each layer records, in the `calibration`
    collection, `input_absmax` `[]`, per-feature `input_min` / `input_max` `[in]` and its `role`
    (bit flags: 1 reads the observation, 2 is an output layer). Batches are combined, so the
    ranges cover every observation — static scales then never saturate on the calibration data.
    """
    observations = np.asarray(observations)
    if observations.shape[0] == 0:
        raise QrlInputError("calibration needs at least one observation")
    ranges = _jitted_ranges(apply_fn)
    result = None
    for start in range(0, observations.shape[0], batch_size):
        batch_ranges = ranges(params, observations[start : start + batch_size])
        result = batch_ranges if result is None else _merge_ranges(result, batch_ranges)
    return jax.tree.map(np.asarray, serialization.to_state_dict(result))


def needs_calibration(precision: Precision) -> bool:
    """Whether `quantize_params` needs calibrated input ranges for `precision`: static scales,
    per-feature observation scales, or layer places (edge bits, a float observation)."""
    if precision.is_float or not precision.quantizes_activations:
        return False
    return precision.activations == "static" or precision.observation != "tensor" or precision.edge_bits is not None


def quantize_params(
    params: Params, precision: Precision, input_ranges: Optional[Mapping[str, Any]] = None
) -> dict:
    """fp32 params -> params for the same network built at `precision` (see
    `qrl.networks.layers` for the integer layout).

    Float precisions cast each layer's kernel and bias. Integer precisions quantize each layer's
    kernel (`kernel` values + `kernel_scale`) at the layer's precision (`Precision.for_layer`,
    from the `role` that `calibrate` recorded) and keep the bias in float32; static activation
    scales come from `input_ranges` (see `calibrate`): per-feature observation scales are folded
    into the kernel before it is quantized, and an affine grid's zero point into the bias.
    Parameters outside dense and conv layers (layer norms' scale and bias) stay float32 at every
    precision.
    """
    params = serialization.to_state_dict(params)
    if precision.is_float:
        return _cast_layers(params, precision.dtype)
    if needs_calibration(precision) and input_ranges is None:
        raise QrlInputError(f"{precision.name} needs calibration data (static or per-feature scales, or layer places)")
    ranges = serialization.to_state_dict(input_ranges) if input_ranges is not None else None
    return _quantize_tree(params, precision, ranges, path=())


def _cast_layers(node: Mapping, dtype) -> dict:
    """`node` with every layer's leaves cast to `dtype` and other leaves as they are."""
    if _is_layer(node):
        return {key: np.asarray(jnp.asarray(leaf, dtype)) for key, leaf in node.items()}
    return {key: _cast_layers(child, dtype) if isinstance(child, Mapping) else np.asarray(child)
            for key, child in node.items()}


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


def _layer_range(ranges: Optional[Mapping], key: str, path: tuple) -> np.ndarray:
    if not isinstance(ranges, Mapping) or key not in ranges:
        raise QrlInputError(f"no calibrated input range ({key}) for layer {'/'.join(path)}")
    return np.asarray(ranges[key], np.float32)


def _quantize_layer(layer: Mapping, precision: Precision, ranges: Optional[Mapping], path: tuple) -> dict:
    kernel = np.asarray(layer["kernel"], np.float32)
    bias = np.asarray(layer["bias"], np.float32)
    role = 0
    if needs_calibration(precision):
        role = int(_layer_range(ranges, ROLE, path))
    reads_observation, is_output = bool(role & ROLE_READS_OBSERVATION), bool(role & ROLE_OUTPUT)
    layer_precision = precision.for_layer(reads_observation, is_output)
    if layer_precision.activations != "static":
        values, scale = ops.quantize_weights(kernel, layer_precision)
        return {"kernel": np.asarray(values), "kernel_scale": np.asarray(scale, np.float32), "bias": bias}
    low, high = _layer_range(ranges, INPUT_MIN, path), _layer_range(ranges, INPUT_MAX, path)
    per_feature = layer_precision.per_feature_input(reads_observation)
    if not per_feature:
        low, high = low.min(), high.max()
    input_scale, zero_point = ops.grid_range(low, high, layer_precision)
    if per_feature:  # y = sum_i (q_i - z_i) * (s_i * W_i): the input scales fold into the kernel.
        values, kernel_scale = ops.quantize_weights(kernel * input_scale[:, None], layer_precision)
        output_scale = np.asarray(kernel_scale, np.float32)
    else:
        values, kernel_scale = ops.quantize_weights(kernel, layer_precision)
        output_scale = input_scale * np.asarray(kernel_scale, np.float32)
    values = np.asarray(values)
    quantized = {"kernel": values, "kernel_scale": np.asarray(kernel_scale, np.float32),
                 "input_scale": np.asarray(input_scale, np.float32)}
    if layer_precision.grid == "affine":
        correction = np.asarray(ops.zero_point_correction(jnp.asarray(values), jnp.asarray(zero_point)), np.float64)
        bias = (bias - output_scale * correction).astype(np.float32)
        quantized["input_zero_point"] = np.asarray(zero_point, np.float32)
    quantized["bias"] = bias
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
