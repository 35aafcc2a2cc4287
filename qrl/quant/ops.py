"""Quantization arithmetic: weight quantizers, activation grids, integer contractions.

Weights are `[..., out]` (dense `[in, out]`, conv `[H, W, in, out]`); per-output-channel scales
have shape `[out]`, per-tensor scales shape `[]`. Real = values * scale. Activations live on a
grid of integers `[qmin, qmax]` with a scale and a zero point: real = (q - zero_point) * scale.

The int8 kernels (`integer_contract`, used by `qrl.networks.layers`) are written on `lax.dot_general` / `lax.conv_general_dilated` with
`preferred_element_type=int32` rather than through AQT: AQT's SERVE path casts convolutions back
to float32, and one path for dense and conv keeps the quantized parameter pytree a plain
`{int values, float scales}` dict that serializes without AQT's freezer state.
"""

import functools
import jax
import jax.numpy as jnp
import numpy as np

from qrl.quant.precision import Precision

CALIBRATION = "calibration"  # flax collection where fp32 layers record their input ranges.
QUANT_RANGES = "quant_ranges"  # flax collection of QAT layers' moving-average input ranges.


def _safe_scale(scale: jax.Array) -> jax.Array:
    """A zero range (an all-zero tensor or channel) gets scale 1 so values stay 0, not NaN."""
    return jnp.where(scale > 0, scale, jnp.ones_like(scale))


def symmetric_weight_scale(weights: jax.Array, qmax: int) -> jax.Array:
    """Per-output-channel max-abs scale `[out]` mapping weights `[..., out]` onto [-qmax, qmax]."""
    reduce_axes = tuple(range(weights.ndim - 1))
    return _safe_scale(jnp.max(jnp.abs(weights), axis=reduce_axes) / qmax)


def quarl_weight_scale(weights: jax.Array, bits: int) -> jax.Array:
    """QuaRL's step `d = (|min| + |max|) / 2^bits`: per tensor (`[]`) for dense kernels
    (ndim 2), per output channel (`[out]`) for conv kernels (ndim 4)."""
    reduce_axes = tuple(range(weights.ndim)) if weights.ndim <= 2 else tuple(range(weights.ndim - 1))
    low = jnp.abs(jnp.min(weights, axis=reduce_axes))
    high = jnp.abs(jnp.max(weights, axis=reduce_axes))
    return _safe_scale((low + high) / 2**bits)


@functools.partial(jax.jit, static_argnums=1)
def quantize_weights(weights: jax.Array, precision: Precision) -> tuple[jax.Array, jax.Array]:
    """Float weights `[..., out]` -> (integer values in `precision.storage_dtype`, scale).

    Jitted per shape and precision: op by op, quantizing a CNN cost ≈50 small compilations.
    """
    weights = jnp.asarray(weights, jnp.float32)
    if precision.weight_rule == "quarl":
        scale = quarl_weight_scale(weights, precision.bits)
    else:
        scale = symmetric_weight_scale(weights, precision.weight_qmax)
    qmax = precision.weight_qmax
    values = jnp.clip(jnp.round(weights / scale), -qmax, qmax).astype(precision.storage_dtype)
    return values, scale.astype(jnp.float32)


def dequantize(values: jax.Array, scale: jax.Array) -> jax.Array:
    """Integer values `[..., out]` and their scale -> float32 weights."""
    return values.astype(jnp.float32) * scale


def activation_scale(x: jax.Array, qmax: int) -> jax.Array:
    """Dynamic per-tensor max-abs scale `[]` for activations `x`."""
    return _safe_scale(jnp.max(jnp.abs(x)).astype(jnp.float32) / qmax)


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def fake_quantize_ste(x: jax.Array, scale: jax.Array, qmax: int) -> jax.Array:
    """`scale * clip(round(x / scale), -qmax, qmax)` forward; identity gradient with respect to
    `x` (the straight-through estimator of Bengio et al. 2013, as QAT uses) and none to `scale`.

    A custom JVP rather than `x + stop_gradient(q - x)`: the forward value is exactly the
    quantized grid value, so an exported integer network reproduces it.
    """
    return jnp.clip(jnp.round(x / scale), -qmax, qmax) * scale


@fake_quantize_ste.defjvp
def _fake_quantize_ste_jvp(qmax, primals, tangents):
    x, scale = primals
    x_dot, _ = tangents
    return fake_quantize_ste(x, scale, qmax), x_dot


@functools.partial(jax.custom_jvp, nondiff_argnums=(3, 4))
def fake_quantize_grid_ste(x: jax.Array, scale: jax.Array, zero_point: jax.Array, qmin: int, qmax: int) -> jax.Array:
    """`clip(round(x / scale) + zero_point, qmin, qmax) - zero_point`: the grid integer of `x`
    relative to the zero point (float32, integer-valued), as `quantize_to_grid` rounds it; scale
    and zero point `[]` or per feature (last axis). Straight-through gradient `1 / scale` with
    respect to `x` (so `scale * result` passes gradients as the identity), none to scale or
    zero point."""
    q = jnp.clip(jnp.round(x / scale) + zero_point, qmin, qmax)
    return q - zero_point


@fake_quantize_grid_ste.defjvp
def _fake_quantize_grid_ste_jvp(qmin, qmax, primals, tangents):
    x, scale, zero_point = primals
    x_dot, _, _ = tangents
    return fake_quantize_grid_ste(x, scale, zero_point, qmin, qmax), x_dot / scale


def ema_range(low: jax.Array, high: jax.Array, seen: jax.Array, batch_low: jax.Array, batch_high: jax.Array,
              decay: float) -> tuple[jax.Array, jax.Array]:
    """Moving averages of a range: `decay * old + (1 - decay) * batch` once `seen` (nonzero),
    the batch's own range on the first batch (no pull towards a zero start)."""
    first = jnp.asarray(seen) == 0
    low = jnp.where(first, batch_low, decay * low + (1.0 - decay) * batch_low)
    high = jnp.where(first, batch_high, decay * high + (1.0 - decay) * batch_high)
    return low.astype(jnp.float32), high.astype(jnp.float32)


def grid_range(low, high, precision: Precision):
    """Scale and zero point mapping `[low, high]` (widened to contain 0) onto the activation grid
    `[qmin, qmax]` of `precision`; numpy or jax arrays of any (matching) shape.

    affine: `scale = (high - low) / (2^bits - 1)`, `zero_point = round(qmin - low / scale)`, so
    0 is exactly representable and a non-negative input uses all 2^bits levels (unsigned grid).
    symmetric: `scale = max(|low|, |high|) / qmax`, zero point 0. A zero range gets scale 1.
    """
    xp = jnp if isinstance(low, jax.Array) or isinstance(high, jax.Array) else np
    low = xp.minimum(xp.asarray(low, xp.float32), 0.0)
    high = xp.maximum(xp.asarray(high, xp.float32), 0.0)
    qmin, qmax = precision.activation_qmin, precision.activation_qmax
    if precision.grid == "affine":
        scale = (high - low) / (qmax - qmin)
        scale = xp.where(scale > 0, scale, xp.ones_like(scale)).astype(xp.float32)
        zero_point = xp.clip(xp.round(qmin - low / scale), qmin, qmax).astype(xp.float32)
        return scale, zero_point
    scale = xp.maximum(-low, high) / qmax
    scale = xp.where(scale > 0, scale, xp.ones_like(scale)).astype(xp.float32)
    return scale, xp.zeros_like(scale)


def quantize_to_grid(x: jax.Array, scale: jax.Array, zero_point: jax.Array, precision: Precision, dtype) -> jax.Array:
    """`clip(round(x / scale) + zero_point, qmin, qmax)` in `dtype`; scale and zero point `[]` or
    per feature (`[in]`, the last axis of x)."""
    q = jnp.round(x.astype(jnp.float32) / scale) + zero_point
    return jnp.clip(q, precision.activation_qmin, precision.activation_qmax).astype(dtype)


def zero_point_correction(kernel: jax.Array, zero_point: jax.Array) -> jax.Array:
    """`sum_i zero_point[i] * kernel[..., i, out]` `[out]` (int32 for int8 kernels, float32
    otherwise): what a grid with zero point adds to every output of an integer dot/convolution
    (VALID convolutions only: every window covers the whole kernel)."""
    accumulate = jnp.int32 if kernel.dtype == jnp.int8 else jnp.float32  # wider kernels would overflow int32.
    column_sums = jnp.sum(kernel.astype(accumulate), axis=tuple(range(kernel.ndim - 2)))  # [in, out]
    zero_point = jnp.asarray(zero_point).astype(accumulate)
    if zero_point.ndim == 0:  # one zero point: z * (sum over in), a constant once exported, not an [in, out] pass per call.
        return zero_point * jnp.sum(column_sums, axis=0)
    return jnp.sum(jnp.reshape(zero_point, (-1, 1)) * column_sums, axis=0)


@functools.partial(jax.jit, static_argnames="precision")
def dynamic_int8_dense(x: jax.Array, kernel: jax.Array, kernel_scale: jax.Array, bias: jax.Array,
                       precision: Precision) -> jax.Array:
    """An 8-bit dynamic-range dense layer `x [..., in] -> [..., out]`: x's range `[min(x, 0),
    max(x, 0)]` this call onto the affine grid [-128, 127], int8×int8→int32 with the int8
    `kernel [in, out]`, the zero point's contribution subtracted, rescaled by `scale *
    kernel_scale [out]`, plus `bias [out]` — the same arithmetic as every dynamic integer layer.

    Jitted under its own name so an exporter can recognize the whole layer: it is ONNX's
    DynamicQuantizeLinear (uint8, `q + 128`) → MatMulInteger with that zero point → rescale, the
    form ONNX Runtime fuses into one kernel (`qrl.deploy.onnx_graph`)."""
    x = x.astype(jnp.float32)
    scale, zero_point = grid_range(jnp.min(x), jnp.max(x), precision)
    q = quantize_to_grid(x, scale, zero_point, precision, jnp.int8)
    accumulated = integer_contract(q, kernel, lambda a, b, accumulate: jax.lax.dot_general(
        a, b, (((a.ndim - 1,), (0,)), ((), ())), preferred_element_type=accumulate))
    accumulated = accumulated - zero_point_correction(kernel, zero_point)
    return accumulated.astype(jnp.float32) * (scale * kernel_scale) + bias


def integer_contract(x_q: jax.Array, kernel: jax.Array, contract) -> jax.Array:
    """`contract(x_q, kernel)` of grid integers: int8×int8→int32 when both are int8 (a real
    integer kernel), float32 arithmetic on the same integer values otherwise."""
    if x_q.dtype == jnp.int8 and kernel.dtype == jnp.int8:
        return contract(x_q, kernel, jnp.int32)
    return contract(x_q.astype(jnp.float32), kernel.astype(jnp.float32), jnp.float32)
