"""DQN's Q-network: an MLP (vector observations) or Nature CNN (frames) and a linear head."""

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from qrl.networks import Dense, make_torso
from qrl.quant import FP32, Precision


class QNetwork(nn.Module):
    """Observations `[B, ...]` -> Q-values `[B, num_actions]` (float32 at every precision)."""

    num_actions: int
    torso: str = "mlp"
    hidden_sizes: Sequence[int] = (256, 256)
    precision: Precision = FP32

    @nn.compact
    def __call__(self, observations: jax.Array) -> jax.Array:
        features = make_torso(self.torso, self.precision, self.hidden_sizes)(observations)
        q_values = Dense(self.num_actions, precision=self.precision, name="head")(features)
        return q_values.astype(jnp.float32)
