"""Quantization arithmetic: weight quantizers, activation (fake) quantization, int8 kernels.

Weights are `[..., out]` (dense `[in, out]`, conv `[H, W, in, out]`); per-output-channel scales
have shape `[out]`, per-tensor scales shape `[]`. Real = values * scale.

The int8 kernels are written on `lax.dot_general` / `lax.conv_general_dilated` with
`preferred_element_type=int32` rather than through AQT: AQT's SERVE path casts convolutions back
to float32, and one path for dense and conv keeps the quantized parameter pytree a plain
`{int values, float scales}` dict that serializes without AQT's freezer state.
"""

import functools
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
from jax import lax

from qrl.quant.precision import Precision

CALIBRATION = "calibration"  # flax collection where fp32 layers record max |input|.


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


def quantize_activations(x: jax.Array, scale: jax.Array, qmax: int, dtype) -> jax.Array:
    """Float activations -> integers in [-qmax, qmax] of `dtype` (values saturate)."""
    return jnp.clip(jnp.round(x.astype(jnp.float32) / scale), -qmax, qmax).astype(dtype)


def fake_quantize_activations(x: jax.Array, scale: jax.Array, qmax: int) -> jax.Array:
    """Rounds float activations onto the integer grid of `scale` and maps them back to float."""
    return quantize_activations(x, scale, qmax, jnp.float32) * scale


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


def int8_dense(
    x: jax.Array,
    kernel: jax.Array,
    kernel_scale: jax.Array,
    bias: jax.Array,
    input_scale: jax.Array,
) -> jax.Array:
    """int8 dense layer: `x [..., in]` float -> `[..., out]` float32.

    The input is quantized per tensor with `input_scale`, multiplied by the int8 kernel
    `[in, out]` with int32 accumulation, then rescaled by `input_scale * kernel_scale [out]`.
    """
    x_q = quantize_activations(x, input_scale, 127, jnp.int8)
    accumulated = lax.dot_general(
        x_q,
        kernel,
        (((x_q.ndim - 1,), (0,)), ((), ())),
        preferred_element_type=jnp.int32,
    )
    return accumulated.astype(jnp.float32) * (input_scale * kernel_scale) + bias


def int8_conv(
    x: jax.Array,
    kernel: jax.Array,
    kernel_scale: jax.Array,
    bias: jax.Array,
    input_scale: jax.Array,
    strides: Sequence[int],
    padding: str,
) -> jax.Array:
    """int8 2-D convolution, NHWC input `[B, H, W, C]` and HWIO kernel -> `[B, H', W', O]` f32."""
    x_q = quantize_activations(x, input_scale, 127, jnp.int8)
    accumulated = lax.conv_general_dilated(
        x_q,
        kernel,
        window_strides=tuple(strides),
        padding=padding,
        dimension_numbers=("NHWC", "HWIO", "NHWC"),
        preferred_element_type=jnp.int32,
    )
    return accumulated.astype(jnp.float32) * (input_scale * kernel_scale) + bias


def input_scale_for(
    x: jax.Array, precision: Precision, static_scale: Optional[jax.Array]
) -> jax.Array:
    """The activation scale a quantized layer uses: the calibrated one or a dynamic one."""
    if precision.activations == "static":
        return static_scale
    return activation_scale(x, precision.activation_qmax)
