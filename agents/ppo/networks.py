"""Separate actor and critic networks (SB3's MlpPolicy / PureJaxRL's ActorCritic layout).

Both are a torso — an MLP with orthogonal initialization (gain √2) for vector observations,
the Nature CNN for `[H, W, C]` frames (the MinAtar CNN for 10×10 grids) — and a linear head: the actor's outputs logits
(discrete actions) or the Gaussian mean (continuous; the state-independent log-std lives
beside the networks in the params, see `qrl.onpolicy.ActorCritic`), initialized with gain
0.01; the critic's outputs one value, gain 1 (Engstrom et al. 2020 / SB3 `ortho_init`).
Every layer comes from the precision-aware factory, so the actor trains at fp32 or QAT
precision and deploys at any PTQ precision with the same parameter tree.
"""

import math
from typing import Sequence

import flax.linen as nn
import jax
from dm_env import specs

from qrl import envs
from qrl.networks import Dense, MinAtarCNN, NatureCNN, orthogonal, torso_for_observation
from qrl.onpolicy import ActorCritic, PolicyHead
from qrl.quant import FP32, Precision

ACTIVATIONS = {"tanh": nn.tanh, "relu": nn.relu}


class Torso(nn.Module):
    """`mlp`: Dense layers of `hidden_sizes`, orthogonal(√2) init, `activation` after each;
    `cnn`: the Nature CNN (uint8 frames scaled to [0, 1]); `minatar_cnn`: the MinAtar torso
    (10×10 grids)."""

    kind: str = "mlp"
    hidden_sizes: Sequence[int] = (64, 64)
    activation: str = "tanh"
    precision: Precision = FP32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        if self.kind == "cnn":
            return NatureCNN(precision=self.precision, name="cnn")(x)
        if self.kind == "minatar_cnn":
            return MinAtarCNN(precision=self.precision, name="cnn")(x)
        for index, size in enumerate(self.hidden_sizes):
            x = Dense(size, precision=self.precision, kernel_init=orthogonal(math.sqrt(2.0)),
                      name=f"dense_{index}", reads_observation=index == 0)(x)
            x = ACTIVATIONS[self.activation](x)
        return x


class Actor(nn.Module):
    """Observations `[B, ...]` -> logits or Gaussian means `[B, num_outputs]` (float32)."""

    num_outputs: int
    torso: str = "mlp"
    hidden_sizes: Sequence[int] = (64, 64)
    activation: str = "tanh"
    precision: Precision = FP32

    @nn.compact
    def __call__(self, observations: jax.Array) -> jax.Array:
        features = Torso(self.torso, tuple(self.hidden_sizes), self.activation, self.precision, name="torso")(observations)
        return Dense(self.num_outputs, precision=self.precision, kernel_init=orthogonal(0.01),
                     name="head", is_output=True)(features)


class Critic(nn.Module):
    """Observations `[..., obs]` -> state values `[...]` (float32; always built at fp32)."""

    torso: str = "mlp"
    hidden_sizes: Sequence[int] = (64, 64)
    activation: str = "tanh"

    @nn.compact
    def __call__(self, observations: jax.Array) -> jax.Array:
        features = Torso(self.torso, tuple(self.hidden_sizes), self.activation, name="torso")(observations)
        return Dense(1, kernel_init=orthogonal(1.0), name="head", is_output=True)(features)[..., 0]


def make_actor(config, observation_spec: specs.Array, action_spec: specs.Array, precision: Precision = FP32) -> Actor:
    """The policy network (the one PTQ sweeps and QAT quantize) for these specs."""
    return Actor(
        num_outputs=envs.num_actions(action_spec),
        torso=torso_for_observation(observation_spec.shape),
        hidden_sizes=tuple(config.hidden_sizes),
        activation=config.activation,
        precision=precision,
    )


def make_actor_critic(
    config, observation_spec: specs.Array, action_spec: specs.Array, precision: Precision = FP32
) -> ActorCritic:
    """Actor at `precision`, fp32 critic, and the action head for `action_spec`."""
    critic = Critic(torso_for_observation(observation_spec.shape), tuple(config.hidden_sizes), config.activation)
    return ActorCritic(
        actor=make_actor(config, observation_spec, action_spec, precision),
        critic=critic,
        head=PolicyHead.from_spec(action_spec),
        log_std_init=config.log_std_init,
    )
