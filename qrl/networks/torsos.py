"""Torsos and heads built from the precision-aware layer factory."""

from typing import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from qrl.networks.layers import Conv, Dense
from qrl.quant.precision import FP32, Precision


class MLP(nn.Module):
    """Multi-layer perceptron `[..., D] -> [..., hidden_sizes[-1]]`; its first layer reads the
    observation, and without `activate_final` its last layer is the network's output."""

    hidden_sizes: Sequence[int]
    precision: Precision = FP32
    activation: Callable[[jax.Array], jax.Array] = nn.relu
    activate_final: bool = True

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for index, size in enumerate(self.hidden_sizes):
            last = index == len(self.hidden_sizes) - 1
            x = Dense(size, precision=self.precision, name=f"dense_{index}", reads_observation=index == 0,
                      is_output=last and not self.activate_final)(x)
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
                reads_observation=index == 0,
            )(x)
            x = nn.relu(x)
        x = x.reshape(x.shape[:-3] + (-1,))
        return nn.relu(Dense(self.dense_size, precision=self.precision, name="dense")(x))


class MinAtarCNN(nn.Module):
    """The MinAtar torso (Young & Tian, 2019): `[B, 10, 10, C] -> [B, 128]`.

    One 16-channel 3×3 convolution (stride 1, VALID), then a 128-unit dense layer, both ReLU.
    Boolean or integer channel planes are cast to float32.
    """

    precision: Precision = FP32
    dense_size: int = 128

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.astype(jnp.float32)
        x = nn.relu(Conv(16, (3, 3), (1, 1), precision=self.precision, name="conv_0", reads_observation=True)(x))
        x = x.reshape(x.shape[:-3] + (-1,))
        return nn.relu(Dense(self.dense_size, precision=self.precision, name="dense")(x))


TORSOS = ("mlp", "cnn", "minatar_cnn")
SMALL_FRAME_SIZE = 36  # frames up to this size cannot pass the Nature CNN's strided convolutions.


def make_torso(kind: str, precision: Precision, hidden_sizes: Sequence[int] = (256, 256)) -> nn.Module:
    """`mlp` for vector observations, `cnn` (Nature CNN) for stacked frames, `minatar_cnn` for
    small grids such as MinAtar's 10×10."""
    if kind == "mlp":
        return MLP(tuple(hidden_sizes), precision=precision, name="torso")
    if kind == "cnn":
        return NatureCNN(precision=precision, name="torso")
    if kind == "minatar_cnn":
        return MinAtarCNN(precision=precision, name="torso")
    raise ValueError(f"unknown torso {kind!r}; known: {', '.join(TORSOS)}")


def torso_for_observation(observation_shape: Sequence[int]) -> str:
    """Picks the torso for an observation shape: images `[H, W, C]` get a CNN (the MinAtar one
    for frames smaller than 36×36), vectors the MLP."""
    if len(observation_shape) != 3:
        return "mlp"
    return "minatar_cnn" if min(observation_shape[:2]) < SMALL_FRAME_SIZE else "cnn"
