"""AQT (`aqtp`) fake quantization: the `aqt` QAT backend.

The only module that imports AQT. `fake_quant_dense` is the matmul of a dense QAT layer built
with `qat_backend="aqt"` (`qrl.networks.layers`): AQT's `fully_quantized` config, N-bit
forward quantization of both operands in TRAIN mode (dynamic symmetric max-abs scales per row
of the input and per column of the kernel), float backward pass. `AqtDense` is a standalone
dense layer on `aqt_flax.AqtDotGeneral`, for comparison in `bench/qat_overhead.py`.

What AQT's forward pass rounds onto differs from the int<N> serving scheme (dynamic symmetric
per-row scales vs static affine ranges): the layers track the same moving-average input ranges
beside AQT's matmul so that both backends export through `qrl.quant.qat.export_params`.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
from aqt.jax.v2 import config as aqt_config
from aqt.jax.v2.flax import aqt_flax


@functools.lru_cache(maxsize=None)
def fake_quant_dot_config(bits: int):
    """AQT dot_general config: `bits`-bit forward quantization of both operands, float backward."""
    return aqt_config.fully_quantized(fwd_bits=bits, bwd_bits=None, use_stochastic_rounding=False)


class AqtDense(nn.Module):
    """Dense layer `[..., in] -> [..., features]`, float32 params, AQT fake-quantized matmul."""

    features: int
    bits: int = 8

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        kernel = self.param("kernel", nn.initializers.lecun_normal(), (x.shape[-1], self.features), jnp.float32)
        bias = self.param("bias", nn.initializers.zeros, (self.features,), jnp.float32)
        dot_general = aqt_flax.AqtDotGeneral(fake_quant_dot_config(self.bits), prng_name=None)
        return dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())), None) + bias


def fake_quant_dense(x: jax.Array, kernel: jax.Array, bits: int) -> jax.Array:
    """`x [..., in] @ kernel [in, out]` through AQT's `bits`-bit fake-quantized dot (TRAIN
    mode, straight-through float gradients); float32 `[..., out]`."""
    return fake_quant_dot_config(bits)(x, kernel, (((x.ndim - 1,), (0,)), ((), ())))
