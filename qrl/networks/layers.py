"""The layer factory: dense and conv layers that take a `Precision`.

Every network in qrl builds its dense and conv layers from these two modules, so one module
definition serves fp32 training, bf16/fp16 inference, n-bit fake quantization and real int8
serving. Parameters per layer:

- float precisions: `kernel` (`[in, out]` or HWIO `[H, W, in, out]`) and `bias` `[out]` in the
  precision's dtype — the same names and shapes as `flax.linen.Dense`/`Conv`. Inputs are cast
  to that dtype; products accumulate in float32 and layers output float32.
- QAT precisions (`qrl.quant.qat`): `kernel` and `bias` float32 as at fp32; the forward pass
  rounds the input onto the affine grid of its moving-average range (kept in the
  `quant_ranges` collection; per feature for the observation) and the kernel per output
  channel, with straight-through gradients — the numerics of the static `int<N>` scheme — so a
  QAT network trains on the fp32 network's parameter tree.
- integer precisions: `kernel` (integer values), `kernel_scale` (`[out]` or `[]`), `bias` `[out]`
  float32, and with static activation scales `input_scale` (`[]`, or `[in]` for per-feature
  observation scales) and, on affine grids, `input_zero_point` of the same shape (whose
  constant contribution `bias` then includes). Produce them from fp32 parameters with
  `qrl.quant.quantize_params`. A layer's place (`reads_observation`, `is_output`) can change its
  precision: see `Precision.for_layer`.

At float32, a layer records its input's range and its place in the `calibration` collection
when that collection is mutable (see `qrl.quant.calibrate`); otherwise the recording costs
nothing.
"""

from typing import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from qrl.quant import aqt_backend, ops
from qrl.quant.ops import CALIBRATION, QUANT_RANGES
from qrl.quant.precision import FP32, Precision

Initializer = Callable[..., jax.Array]


ROLE_READS_OBSERVATION = 1  # bit flags of the `role` a layer records in the calibration collection.
ROLE_OUTPUT = 2


def _dense_contract(x: jax.Array, kernel: jax.Array, accumulate) -> jax.Array:
    return lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())), preferred_element_type=accumulate)


class _QuantizableLayer(nn.Module):
    """Shared parameter handling of `Dense` and `Conv`.

    Subclasses set `reads_observation` (the layer whose input is the network's observation) and
    `is_output` (a layer whose output leaves the network): `Precision.for_layer` uses them for
    edge bit widths and the observation's scales.
    """

    def _record_input_range(self, x: jax.Array) -> None:
        """Calibration statistics of this layer's input: `input_absmax` `[]`, per-feature
        (last axis) `input_min` / `input_max` `[in]`, and the layer's `role` bit flags."""
        if not self.is_mutable_collection(CALIBRATION):
            return
        x = x.astype(jnp.float32)
        features = x.shape[-1]
        reduce_axes = tuple(range(x.ndim - 1))
        role = ROLE_READS_OBSERVATION * self.reads_observation + ROLE_OUTPUT * self.is_output
        for name, value, init, reduce_fn in (
            ("input_absmax", jnp.max(jnp.abs(x)), jnp.zeros((), jnp.float32), jnp.maximum),
            ("input_min", jnp.min(x, axis=reduce_axes), jnp.full((features,), jnp.inf), jnp.minimum),
            ("input_max", jnp.max(x, axis=reduce_axes), jnp.full((features,), -jnp.inf), jnp.maximum),
            ("role", jnp.int32(role), jnp.zeros((), jnp.int32), jnp.maximum),
        ):
            self.sow(CALIBRATION, name, value, init_fn=lambda init=init: init, reduce_fn=reduce_fn)

    def _float_params(self, kernel_shape, features, kernel_init, bias_init):
        dtype = self.precision.dtype
        kernel = self.param("kernel", kernel_init, kernel_shape, dtype)
        bias = self.param("bias", bias_init, (features,), dtype)
        compute = self.precision.arithmetic_dtype
        return kernel.astype(compute), bias.astype(compute)

    def _track_input_range(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        """This layer's moving-average input range in the `quant_ranges` collection: `input_min`
        / `input_max` per feature `[in]` for the layer reading the observation, per tensor `[]`
        otherwise, plus `seen` (int32, batches tracked) and `role` (bit flags, as `calibration`).
        Updated from `x` (first batch: its own range; then by `precision.range_decay`) only
        when the collection is mutable — training mode; read-only (frozen) otherwise."""
        per_feature = self.reads_observation
        shape = (x.shape[-1],) if per_feature else ()
        role = ROLE_READS_OBSERVATION * self.reads_observation + ROLE_OUTPUT * self.is_output
        low = self.variable(QUANT_RANGES, "input_min", jnp.zeros, shape, jnp.float32)
        high = self.variable(QUANT_RANGES, "input_max", jnp.zeros, shape, jnp.float32)
        seen = self.variable(QUANT_RANGES, "seen", lambda: jnp.zeros((), jnp.int32))
        self.variable(QUANT_RANGES, "role", lambda: jnp.asarray(role, jnp.int32))
        if self.is_mutable_collection(QUANT_RANGES) and not self.is_initializing():
            axes = tuple(range(x.ndim - 1)) if per_feature else None
            batch = lax.stop_gradient(x)
            low.value, high.value = ops.ema_range(
                low.value, high.value, seen.value, jnp.min(batch, axis=axes), jnp.max(batch, axis=axes),
                self.precision.range_decay,
            )
            seen.value = seen.value + 1
        return low.value, high.value

    def _qat_forward(self, x: jax.Array, kernel_shape, features: int, contract) -> jax.Array:
        """A QAT layer: float32 `kernel` / `bias`, the int<N> serving arithmetic simulated.

        The input goes onto the affine grid of its moving-average range (`x_q - z`, integer
        valued; per feature for the observation, whose scales fold into the kernel before it is
        quantized per output channel, as `qrl.quant.quantize_params` does), the kernel onto its
        symmetric per-output-channel grid, straight-through gradients for both. During the
        quantization delay (`fake_quant` False) the forward pass is float, ranges tracked.
        """
        precision = self.precision
        kernel = self.param("kernel", self.kernel_init, kernel_shape, jnp.float32)
        bias = self.param("bias", self.bias_init, (features,), jnp.float32)
        x = x.astype(jnp.float32)
        low, high = self._track_input_range(x)
        if not precision.fake_quant:
            return contract(x, kernel, jnp.float32) + bias
        if precision.backend == "aqt" and len(kernel_shape) == 2:
            return aqt_backend.fake_quant_dense(x, kernel, precision.bits) + bias
        scale, zero_point = ops.grid_range(low, high, precision)
        x_q = ops.fake_quantize_grid_ste(x, scale, zero_point, precision.activation_qmin, precision.activation_qmax)
        qmax = precision.weight_qmax
        if self.reads_observation:  # y = sum_i (q_i - z_i) * (s_i * W_i): the input scales fold into the kernel.
            folded = kernel * scale[:, None]
            folded = ops.fake_quantize_ste(folded, ops.symmetric_weight_scale(lax.stop_gradient(folded), qmax), qmax)
            return contract(x_q, folded, jnp.float32) + bias
        kernel = ops.fake_quantize_ste(kernel, ops.symmetric_weight_scale(lax.stop_gradient(kernel), qmax), qmax)
        return contract(x_q, kernel, jnp.float32) * scale + bias

    def _integer_forward(self, x: jax.Array, kernel_shape, features: int, contract) -> jax.Array:
        """An integer layer: params as `qrl.quant.quantize_params` writes them, `contract(x, kernel,
        accumulate_dtype)` the dot or convolution. Returns float32 `[..., features]`.

        Static activations: `q = clip(round(x / input_scale) + input_zero_point)` (scale and zero
        point `[]`, or `[in]` for per-feature observation scales, which the kernel has folded in),
        `y = (q · kernel) * output_scale + bias`; the zero point's constant contribution is folded
        into `bias`. Dynamic: scale and zero point from this call's range, the zero point's
        contribution subtracted per call.
        """
        precision = self.precision.for_layer(self.reads_observation, self.is_output)
        kernel = self.param("kernel", nn.initializers.zeros, kernel_shape, precision.storage_dtype)
        scale_shape = () if precision.weight_rule == "quarl" and len(kernel_shape) == 2 else (features,)
        kernel_scale = self.param("kernel_scale", nn.initializers.ones, scale_shape, jnp.float32)
        bias = self.param("bias", nn.initializers.zeros, (features,), jnp.float32)
        if not precision.quantizes_activations:
            return contract(x.astype(jnp.float32), ops.dequantize(kernel, kernel_scale), jnp.float32) + bias
        grid_dtype = jnp.int8 if precision.integer_kernel else jnp.float32
        if precision.activations == "static":
            per_feature = precision.per_feature_input(self.reads_observation)
            input_shape = (x.shape[-1],) if per_feature else ()
            input_scale = self.param("input_scale", nn.initializers.ones, input_shape, jnp.float32)
            zero_point = jnp.zeros((), jnp.float32)
            if precision.grid == "affine":
                zero_point = self.param("input_zero_point", nn.initializers.zeros, input_shape, jnp.float32)
            q = ops.quantize_to_grid(x, input_scale, zero_point, precision, grid_dtype)
            accumulated = ops.integer_contract(q, kernel, contract).astype(jnp.float32)
            return accumulated * (kernel_scale if per_feature else input_scale * kernel_scale) + bias
        dense_int8 = (contract is _dense_contract and precision.integer_kernel and precision.grid == "affine"
                      and (precision.activation_qmin, precision.activation_qmax) == (-128, 127))
        if dense_int8:  # the same arithmetic, under a name exporters recognize (ops.dynamic_int8_dense).
            return ops.dynamic_int8_dense(x, kernel, kernel_scale, bias, precision)
        x = x.astype(jnp.float32)
        scale, zero_point = ops.grid_range(jnp.min(x), jnp.max(x), precision)
        q = ops.quantize_to_grid(x, scale, zero_point, precision, grid_dtype)
        accumulated = ops.integer_contract(q, kernel, contract)
        if precision.grid == "affine":
            accumulated = accumulated - ops.zero_point_correction(kernel, zero_point)
        return accumulated.astype(jnp.float32) * (scale * kernel_scale) + bias


class Dense(_QuantizableLayer):
    """Dense layer `[..., in] -> [..., features]` at a given precision."""

    features: int
    precision: Precision = FP32
    kernel_init: Initializer = nn.initializers.lecun_normal()
    bias_init: Initializer = nn.initializers.zeros
    reads_observation: bool = False
    is_output: bool = False

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        kernel_shape = (x.shape[-1], self.features)
        precision = self.precision
        if precision.trainable:
            return self._qat_forward(x, kernel_shape, self.features, _dense_contract)
        if precision.is_float:
            self._record_input_range(x)
            kernel, bias = self._float_params(kernel_shape, self.features, self.kernel_init, self.bias_init)
            # Accumulate in float32 (bf16/fp16 operands): XLA:CPU then runs its fast bf16 kernels
            # (a 4096×256×256 bf16 matmul: 0.65 ms vs 4.1 ms with a bf16 result) and sums stay exact.
            return _dense_contract(x.astype(kernel.dtype), kernel, jnp.float32) + bias
        return self._integer_forward(x, kernel_shape, self.features, _dense_contract)


class Conv(_QuantizableLayer):
    """2-D convolution, NHWC `[B, H, W, C] -> [B, H', W', features]`, at a given precision.

    Integer precisions with a zero point (affine grids) need VALID padding: SAME padding would
    pad with the grid's zero point's real value, not 0.
    """

    features: int
    kernel_size: Sequence[int]
    strides: Sequence[int] = (1, 1)
    padding: str = "VALID"
    precision: Precision = FP32
    kernel_init: Initializer = nn.initializers.lecun_normal()
    bias_init: Initializer = nn.initializers.zeros
    reads_observation: bool = False
    is_output: bool = False

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        kernel_shape = (*self.kernel_size, x.shape[-1], self.features)
        precision = self.precision
        if precision.trainable:
            return self._qat_forward(x, kernel_shape, self.features, self._convolve)
        if precision.is_float:
            self._record_input_range(x)
            kernel, bias = self._float_params(kernel_shape, self.features, self.kernel_init, self.bias_init)
            return self._convolve(x.astype(kernel.dtype), kernel, jnp.float32) + bias
        if precision.grid == "affine" and precision.quantizes_activations and self.padding != "VALID":
            raise ValueError(f"{precision.name}: an affine activation grid needs VALID padding, got {self.padding}")
        return self._integer_forward(x, kernel_shape, self.features, self._convolve)

    def _convolve(self, x: jax.Array, kernel: jax.Array, accumulate) -> jax.Array:
        return lax.conv_general_dilated(
            x,
            kernel,
            window_strides=tuple(self.strides),
            padding=self.padding,
            dimension_numbers=("NHWC", "HWIO", "NHWC"),
            preferred_element_type=accumulate,
        )
