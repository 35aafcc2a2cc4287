"""Torsos and heads built from the precision-aware layer factory."""

from typing import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from qrl.errors import QrlInputError
from qrl.networks.layers import Conv, Dense
from qrl.quant.precision import FP32, Precision

# Sonnet/Acme initializers (TF's VarianceScaling, which flax's matches, truncation included):
# QuaRL's ActorQ networks and Acme's LayerNormMLP draw hidden kernels uniformly with variance
# 0.333 / fan_out; Acme's NearZeroInitializedLinear heads draw a truncated normal of variance
# 1e-4 / fan_in, so a fresh policy outputs almost exactly zero.
ACME_UNIFORM_INIT = nn.initializers.variance_scaling(0.333, "fan_out", "uniform")
NEAR_ZERO_INIT = nn.initializers.variance_scaling(1e-4, "fan_in", "truncated_normal")


def orthogonal(scale: float = 1.0) -> nn.initializers.Initializer:
    """`flax.linen.initializers.orthogonal(scale)` with the same values, safe under `vmap`.

    Written here because jaxlib 0.10.2's CPU QR deadlocks when vmapped: a batched LAPACK call
    splits its batch over XLA's intra-op thread pool and blocks until the pieces finish, so as
    many concurrent batched QRs as the pool has threads (two on a 2-core machine: a vmapped
    network's layers initialize concurrently) wait forever for each other's threads. Under
    `vmap` this initializer runs one unbatched QR per key in a loop
    (`jax.custom_batching.sequential_vmap`); each key's matrix is the one flax computes.
    """
    flax_init = nn.initializers.orthogonal(scale)

    def init(key, shape, dtype=jnp.float32):
        return jax.custom_batching.sequential_vmap(lambda one_key: flax_init(one_key, shape, dtype))(key)

    return init


class MLP(nn.Module):
    """Multi-layer perceptron `[..., D] -> [..., hidden_sizes[-1]]`; its first layer reads the
    observation, and without `activate_final` its last layer is the network's output.

    With `layer_norm` every activated layer is dense -> LayerNorm -> activation, as OpenAI
    baselines' and stable-baselines' layer-normalized MLPs are. With `final_is_output=False` an
    unactivated last layer is a linear hidden layer that a head reads (QuaRL's ActorQ torso),
    not the network's output (the quantization schemes treat an output layer differently). The
    layer norms (`layer_norm_<i>`: `scale` and `bias` `[size]`) compute and keep their parameters
    in float32 at every precision: they are not quantized.
    """

    hidden_sizes: Sequence[int]
    precision: Precision = FP32
    activation: Callable[[jax.Array], jax.Array] = nn.relu
    activate_final: bool = True
    layer_norm: bool = False
    final_is_output: bool = True
    kernel_init: nn.initializers.Initializer = nn.initializers.lecun_normal()

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for index, size in enumerate(self.hidden_sizes):
            activated = index < len(self.hidden_sizes) - 1 or self.activate_final
            x = Dense(size, precision=self.precision, kernel_init=self.kernel_init, name=f"dense_{index}",
                      reads_observation=index == 0, is_output=not activated and self.final_is_output)(x)
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


def quarl_mlp(hidden_sizes: Sequence[int], precision: Precision = FP32, name: str = "torso") -> MLP:
    """QuaRL's ActorQ policy torso (harvard-edge/QuaRL actorQ/{d4pg,dqn}/utils.py make_networks):
    Sonnet's MLP with tanh between layers, the last layer linear (`activate_final=False`), kernels
    from `ACME_UNIFORM_INIT`. `[..., D] -> [..., hidden_sizes[-1]]`."""
    return MLP(tuple(hidden_sizes), precision=precision, activation=jnp.tanh, activate_final=False,
               final_is_output=False, kernel_init=ACME_UNIFORM_INIT, name=name)


TORSOS = ("mlp", "cnn", "minatar_cnn", "quarl_mlp")
SMALL_FRAME_SIZE = 36  # frames up to this size cannot pass the Nature CNN's strided convolutions.


def make_torso(
    kind: str, precision: Precision, hidden_sizes: Sequence[int] = (256, 256), layer_norm: bool = False,
    name: str = "torso",
) -> nn.Module:
    """`mlp` for vector observations (`quarl_mlp`: QuaRL's tanh torso, see `quarl_mlp`), `cnn`
    (Nature CNN) for stacked frames, `minatar_cnn` for small grids such as MinAtar's 10×10.
    `layer_norm` (the `mlp`'s) is an input error elsewhere."""
    if kind not in TORSOS:
        raise ValueError(f"unknown torso {kind!r}; known: {', '.join(TORSOS)}")
    if kind == "mlp":
        return MLP(tuple(hidden_sizes), precision=precision, layer_norm=layer_norm, name=name)
    if kind == "quarl_mlp" and not layer_norm:
        return quarl_mlp(hidden_sizes, precision, name)
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
