"""DQN's Q-network: an MLP (vector observations) or Nature CNN (frames) and a linear head."""

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from qrl.networks import Dense, make_torso
from qrl.quant import FP32, Precision


class QNetwork(nn.Module):
    """Observations `[B, ...]` -> Q-values `[B, num_actions]` (float32 at every precision: the
    layer factory's layers all output float32).

    With `dueling` (Wang et al., 2016) the head splits into a state value `V [B, 1]` and
    advantages `A [B, num_actions]`, `Q = V + A - mean(A)`. Besides its learning benefits this
    keeps the action gaps in their own small-valued layer, which quantizes far better than a
    plain head where the gap is a tiny difference of two large Q-values. With
    `separate_value_stream`, `V` reads its own torso (`value_torso`, shaped like `torso`) instead
    of sharing the advantages' one, as OpenAI baselines' and stable-baselines' dueling MLPs do.
    `layer_norm` normalizes the MLP torsos' hidden layers (see `qrl.networks.MLP`); `head_init`
    initializes the head's kernel (QuaRL's ActorQ Q-network: `qrl.networks.NEAR_ZERO_INIT`).
    """

    num_actions: int
    torso: str = "mlp"
    hidden_sizes: Sequence[int] = (256, 256)
    precision: Precision = FP32
    dueling: bool = False
    separate_value_stream: bool = False
    layer_norm: bool = False
    head_init: nn.initializers.Initializer = nn.initializers.lecun_normal()

    @nn.compact
    def __call__(self, observations: jax.Array) -> jax.Array:
        features = self._torso("torso")(observations)
        if not self.dueling:
            return Dense(self.num_actions, precision=self.precision, kernel_init=self.head_init, name="head",
                         is_output=True)(features)
        value_features = self._torso("value_torso")(observations) if self.separate_value_stream else features
        value = Dense(1, precision=self.precision, name="value", is_output=True)(value_features)
        advantages = Dense(self.num_actions, precision=self.precision, name="advantage", is_output=True)(features)
        return value + advantages - jnp.mean(advantages, axis=-1, keepdims=True)

    def _torso(self, name: str) -> nn.Module:
        return make_torso(self.torso, self.precision, self.hidden_sizes, self.layer_norm, name=name)
