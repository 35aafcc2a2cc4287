"""AQT (`aqtp`) fake quantization, for comparison with qrl's own QAT layers.

The only module that imports AQT. `AqtDense` is a dense layer whose matmul runs through
`aqt_flax.AqtDotGeneral` in TRAIN mode with N-bit forward quantization of both operands
(AQT's `fully_quantized` config, unquantized backward pass): what a QAT layer built on AQT
looks like. qrl trains with `qrl.quant.qat` instead — its scales match the int8 serving
kernels (per-tensor activations, per-output-channel weights) and it is cheaper per update;
`bench/qat_overhead.py` measures both.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
from aqt.jax.v2 import config as aqt_config
from aqt.jax.v2.flax import aqt_flax


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
