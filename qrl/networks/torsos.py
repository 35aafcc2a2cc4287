"""Torsos and heads built from the precision-aware layer factory."""

from typing import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from qrl.errors import QrlInputError
from qrl.networks.layers import Conv, Dense
from qrl.quant.precision import FP32, Precision


class MLP(nn.Module):
    """Multi-layer perceptron `[..., D] -> [..., hidden_sizes[-1]]`; its first layer reads the
    observation, and without `activate_final` its last layer is the network's output.

    With `layer_norm` every activated layer is dense -> LayerNorm -> activation, as OpenAI
    baselines' and stable-baselines' layer-normalized MLPs are. The layer norms (`layer_norm_<i>`:
    `scale` and `bias` `[size]`) compute and keep their parameters in float32 at every precision:
    they are not quantized.
    """

    hidden_sizes: Sequence[int]
    precision: Precision = FP32
    activation: Callable[[jax.Array], jax.Array] = nn.relu
    activate_final: bool = True
    layer_norm: bool = False

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for index, size in enumerate(self.hidden_sizes):
            activated = index < len(self.hidden_sizes) - 1 or self.activate_final
            x = Dense(size, precision=self.precision, name=f"dense_{index}", reads_observation=index == 0,
                      is_output=not activated)(x)
            if activated and self.layer_norm:
                x = nn.LayerNorm(dtype=jnp.float32, param_dtype=jnp.float32, name=f"layer_norm_{index}")(x)
            if activated:
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


def make_torso(
    kind: str, precision: Precision, hidden_sizes: Sequence[int] = (256, 256), layer_norm: bool = False,
    name: str = "torso",
) -> nn.Module:
    """`mlp` for vector observations, `cnn` (Nature CNN) for stacked frames, `minatar_cnn` for
    small grids such as MinAtar's 10×10. `layer_norm` (the MLP's) is an input error elsewhere."""
    if kind not in TORSOS:
        raise ValueError(f"unknown torso {kind!r}; known: {', '.join(TORSOS)}")
    if kind == "mlp":
        return MLP(tuple(hidden_sizes), precision=precision, layer_norm=layer_norm, name=name)
    if layer_norm:
        raise QrlInputError(f"layer_norm applies to the MLP torso of vector observations, not the {kind} torso")
    if kind == "cnn":
        return NatureCNN(precision=precision, name=name)
    return MinAtarCNN(precision=precision, name=name)


def torso_for_observation(observation_shape: Sequence[int]) -> str:
    """Picks the torso for an observation shape: images `[H, W, C]` get a CNN (the MinAtar one
    for frames smaller than 36×36), vectors the MLP."""
    if len(observation_shape) != 3:
        return "mlp"
    return "minatar_cnn" if min(observation_shape[:2]) < SMALL_FRAME_SIZE else "cnn"
