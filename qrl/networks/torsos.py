"""Torsos and heads built from the precision-aware layer factory."""

from typing import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from qrl.networks.layers import Conv, Dense
from qrl.quant.precision import FP32, Precision


class MLP(nn.Module):
    """Multi-layer perceptron `[..., D] -> [..., hidden_sizes[-1]]`."""

    hidden_sizes: Sequence[int]
    precision: Precision = FP32
    activation: Callable[[jax.Array], jax.Array] = nn.relu
    activate_final: bool = True

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for index, size in enumerate(self.hidden_sizes):
            x = Dense(size, precision=self.precision, name=f"dense_{index}")(x)
            if index < len(self.hidden_sizes) - 1 or self.activate_final:
                x = self.activation(x)
        return x


class NatureCNN(nn.Module):
    """The DQN Nature torso (Mnih et al., 2015): `[B, 84, 84, C] uint8 or float -> [B, 512]`.

    Pixels in uint8 are scaled to [0, 1]; three VALID convolutions (32×8×8 stride 4, 64×4×4
    stride 2, 64×3×3 stride 1), then a 512-unit dense layer, all ReLU.
    """

    precision: Precision = FP32
    dense_size: int = 512

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        if jnp.issubdtype(x.dtype, jnp.integer):
            x = x.astype(jnp.float32) / 255.0
        for index, (features, kernel, stride) in enumerate(((32, 8, 4), (64, 4, 2), (64, 3, 1))):
            x = Conv(
                features,
                (kernel, kernel),
                (stride, stride),
                precision=self.precision,
                name=f"conv_{index}",
            )(x)
            x = nn.relu(x)
        x = x.reshape(x.shape[:-3] + (-1,))
        return nn.relu(Dense(self.dense_size, precision=self.precision, name="dense")(x))


def make_torso(kind: str, precision: Precision, hidden_sizes: Sequence[int] = (256, 256)) -> nn.Module:
    """`mlp` for vector observations, `cnn` (Nature CNN) for stacked frames."""
    if kind == "mlp":
        return MLP(tuple(hidden_sizes), precision=precision, name="torso")
    if kind == "cnn":
        return NatureCNN(precision=precision, name="torso")
    raise ValueError(f"unknown torso {kind!r}; known: mlp, cnn")


def torso_for_observation(observation_shape: Sequence[int]) -> str:
    """Picks the torso for an observation shape: images `[H, W, C]` get the CNN."""
    return "cnn" if len(observation_shape) == 3 else "mlp"
