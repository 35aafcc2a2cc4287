"""Actors and critics for continuous control, built from the precision-aware layer factory.

Actions cross module boundaries in *environment* units: actors scale `tanh` outputs to the
action bounds, and critics map actions back to `[-1, 1]` before their first layer, so the
replay buffer, the environment and every network agree on one action convention.

Training at a reduced matmul precision (bf16): parameters stay float32 (optimizer, targets,
checkpoints); `compute_params` casts them to the precision's dtype right before `apply`, and the
layers multiply in bf16 with float32 accumulation. Autodiff of such a layer would run its two
backward matmuls in float32 (the output cotangent is float32, so each backward dot mixes a
float32 and a bf16 operand, which XLA:CPU computes in float32); `TrainingMLP` and the heads
therefore give each dense layer a custom VJP whose backward matmuls also take bf16 operands
with float32 accumulation. At float32 and at QAT precisions the layers are plain `Dense`
calls with ordinary autodiff. Parameter trees are the same at every precision (`torso/dense_i`,
`head`), equal to `qrl.networks.MLP`'s.
"""

import functools
from typing import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from qrl.networks.layers import Dense
from qrl.networks.torsos import ACME_UNIFORM_INIT, NEAR_ZERO_INIT
from qrl.quant.precision import FP32, Precision

LOG_STD_MIN = -20.0  # SB3 / sbx SAC.
LOG_STD_MAX = 2.0


def compute_params(params, precision: Precision):
    """`params` (float32) cast to the dtype a float `precision` computes in; unchanged otherwise."""
    if not precision.is_float or precision.dtype == jnp.float32:
        return params
    return jax.tree.map(lambda leaf: leaf.astype(precision.dtype), params)


def scale_actions(unit_actions: jax.Array, low: Sequence[float], high: Sequence[float]) -> jax.Array:
    """Actions in `[-1, 1]` `[..., A]` -> environment units `[low, high]`."""
    low, high = jnp.asarray(low, jnp.float32), jnp.asarray(high, jnp.float32)
    return low + (unit_actions + 1.0) * (0.5 * (high - low))


def unscale_actions(actions: jax.Array, low: Sequence[float], high: Sequence[float]) -> jax.Array:
    """Environment actions `[..., A]` -> `[-1, 1]` (the inverse of `scale_actions`)."""
    low, high = jnp.asarray(low, jnp.float32), jnp.asarray(high, jnp.float32)
    return (actions - low) * (2.0 / (high - low)) - 1.0


def _low_precision_float(precision: Precision) -> bool:
    return precision.is_float and precision.dtype != jnp.float32


def _dense_forward(layer: nn.Module, x: jax.Array):
    return layer(x), (x, layer.variables["params"]["kernel"], layer.variables["params"]["bias"])


def _dense_backward(dtype, residuals, y_cotangent: jax.Array):
    """Gradients of `y = x @ kernel + bias` with `dtype` operands and float32 accumulation:
    `dx = g @ kernel^T`, `dkernel = x^T g`, `dbias = sum(g)` (over all leading axes)."""
    x, kernel, bias = residuals
    g = y_cotangent.astype(dtype)
    x_cotangent = lax.dot_general(g, kernel.astype(dtype), (((g.ndim - 1,), (1,)), ((), ())),
                                  preferred_element_type=jnp.float32)
    rows_x = x.reshape(-1, x.shape[-1]).astype(dtype)
    rows_g = g.reshape(-1, g.shape[-1])
    # x^T as a row-major copy: XLA:CPU folds a plain transpose into the dot's dimension numbers,
    # and its bf16 kernels are slow (slower than float32) on a dot that contracts the lhs's
    # leading axis; the flatten behind an optimization barrier forces the physical transpose.
    columns_x = lax.optimization_barrier(rows_x.T.reshape(-1)).reshape(rows_x.shape[1], rows_x.shape[0])
    kernel_cotangent = lax.dot_general(columns_x, rows_g, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
    bias_cotangent = jnp.sum(y_cotangent.reshape(-1, y_cotangent.shape[-1]), axis=0)
    params_cotangent = {"kernel": kernel_cotangent.astype(kernel.dtype), "bias": bias_cotangent.astype(bias.dtype)}
    return {"params": params_cotangent}, x_cotangent.astype(x.dtype)


def dense(x: jax.Array, features: int, precision: Precision, name: str, reads_observation: bool = False,
          is_output: bool = False, kernel_init: nn.initializers.Initializer = nn.initializers.lecun_normal()) -> jax.Array:
    """`Dense(features, precision, name)(x)` inside a compact module; at bf16/fp16 its
    backward matmuls run at that dtype too (see the module docstring)."""
    layer = Dense(features, precision=precision, kernel_init=kernel_init, name=name,
                  reads_observation=reads_observation, is_output=is_output)
    if not _low_precision_float(precision):
        return layer(x)
    call = nn.custom_vjp(
        lambda module, inputs: module(inputs),
        forward_fn=_dense_forward,
        backward_fn=functools.partial(_dense_backward, precision.dtype),
    )
    return call(layer, x)


class TrainingMLP(nn.Module):
    """`qrl.networks.MLP` with `dense` layers: `[..., D] -> [..., hidden_sizes[-1]]`, the same
    parameter tree, bf16 backward matmuls when trained at bf16. Without `activate_final` the
    last layer is linear and a head reads it (QuaRL's ActorQ torso, `qrl.networks.quarl_mlp`)."""

    hidden_sizes: Sequence[int]
    precision: Precision = FP32
    activation: Callable[[jax.Array], jax.Array] = nn.relu
    activate_final: bool = True
    kernel_init: nn.initializers.Initializer = nn.initializers.lecun_normal()

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for index, size in enumerate(self.hidden_sizes):
            x = dense(x, size, self.precision, f"dense_{index}", reads_observation=index == 0,
                      kernel_init=self.kernel_init)
            if index < len(self.hidden_sizes) - 1 or self.activate_final:
                x = self.activation(x)
        return x


class LayerNormMLP(nn.Module):
    """Acme's `LayerNormMLP` (acme/tf/networks/continuous.py), the critic torso of Acme's D4PG and
    QuaRL's ActorQ: dense -> LayerNorm -> tanh, then dense -> elu for every further layer,
    kernels from `ACME_UNIFORM_INIT`. `[..., D] -> [..., hidden_sizes[-1]]`; the layer norm
    (`layer_norm_0`) computes in float32 at every precision."""

    hidden_sizes: Sequence[int]
    precision: Precision = FP32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = dense(x, self.hidden_sizes[0], self.precision, "dense_0", reads_observation=True,
                  kernel_init=ACME_UNIFORM_INIT)
        x = jnp.tanh(nn.LayerNorm(dtype=jnp.float32, param_dtype=jnp.float32, name="layer_norm_0")(x))
        for index, size in enumerate(self.hidden_sizes[1:], start=1):
            x = nn.elu(dense(x, size, self.precision, f"dense_{index}", kernel_init=ACME_UNIFORM_INIT))
        return x


# "default": ReLU MLPs; "quarl": QuaRL's ActorQ networks (actorQ/d4pg/utils.py make_networks):
# the actor a tanh MLP with a linear last hidden layer and a near-zero head, the critic Acme's
# LayerNormMLP.
ARCHITECTURES = ("default", "quarl")


class DeterministicActor(nn.Module):
    """DDPG/TD3/D4PG actor: observations `[B, D]` -> actions `[B, A]` in `[low, high]`,
    `scale(tanh(head(MLP(obs))))`."""

    action_low: tuple[float, ...]
    action_high: tuple[float, ...]
    hidden_sizes: Sequence[int] = (256, 256)
    precision: Precision = FP32
    architecture: str = "default"  # or "quarl" (ARCHITECTURES): QuaRL's torso and a near-zero head.

    @nn.compact
    def __call__(self, observations: jax.Array) -> jax.Array:
        if self.architecture == "quarl":
            torso = TrainingMLP(tuple(self.hidden_sizes), self.precision, jnp.tanh, activate_final=False,
                                kernel_init=ACME_UNIFORM_INIT, name="torso")
            head_init = NEAR_ZERO_INIT
        else:
            torso = TrainingMLP(tuple(self.hidden_sizes), self.precision, name="torso")
            head_init = nn.initializers.lecun_normal()
        pre_tanh = dense(torso(observations), len(self.action_low), self.precision, "head", is_output=True,
                         kernel_init=head_init)
        return scale_actions(jnp.tanh(pre_tanh), self.action_low, self.action_high)


class GaussianActor(nn.Module):
    """SAC actor: observations `[B, D]` -> `(mean [B, A], log_std [B, A])` of the Gaussian
    whose `tanh` is the action in `[-1, 1]` (Haarnoja et al., 2018, appendix C).

    One head emits both halves, so with `deterministic=True` the module is the deployable
    policy on the *same* parameters: `scale(tanh(mean))` `[B, A]` in environment units.
    `log_std` is clipped to `[LOG_STD_MIN, LOG_STD_MAX]`.
    """

    action_low: tuple[float, ...]
    action_high: tuple[float, ...]
    hidden_sizes: Sequence[int] = (256, 256)
    precision: Precision = FP32
    deterministic: bool = False

    @nn.compact
    def __call__(self, observations: jax.Array):
        action_dim = len(self.action_low)
        features = TrainingMLP(tuple(self.hidden_sizes), self.precision, name="torso")(observations)
        head = dense(features, 2 * action_dim, self.precision, "head", is_output=True)
        mean = head[..., :action_dim]
        if self.deterministic:
            return scale_actions(jnp.tanh(mean), self.action_low, self.action_high)
        log_std = jnp.clip(head[..., action_dim:], LOG_STD_MIN, LOG_STD_MAX)
        return mean, log_std


class Critic(nn.Module):
    """Q(s, a): observations `[B, D]` and environment actions `[B, A]` -> `[B]`, or
    `[B, num_outputs]` when `num_outputs > 1` (the logits of a distributional critic).

    Actions are rescaled to `[-1, 1]` and concatenated with the observations (Fujimoto et al.'s
    TD3 critic; SB3's ContinuousCritic)."""

    action_low: tuple[float, ...]
    action_high: tuple[float, ...]
    hidden_sizes: Sequence[int] = (256, 256)
    precision: Precision = FP32
    num_outputs: int = 1
    architecture: str = "default"  # or "quarl" (ARCHITECTURES): Acme's LayerNormMLP torso.

    @nn.compact
    def __call__(self, observations: jax.Array, actions: jax.Array) -> jax.Array:
        unit_actions = unscale_actions(actions, self.action_low, self.action_high)
        inputs = jnp.concatenate([observations.astype(jnp.float32), unit_actions], axis=-1)
        torso_type = LayerNormMLP if self.architecture == "quarl" else TrainingMLP
        features = torso_type(tuple(self.hidden_sizes), self.precision, name="torso")(inputs)
        outputs = dense(features, self.num_outputs, self.precision, "head", is_output=True)
        return outputs[..., 0] if self.num_outputs == 1 else outputs


class CriticEnsemble(nn.Module):
    """`num_critics` independent critics as one stacked network: every parameter gains a
    leading axis `[num_critics, ...]`, and one call runs all of them as batched matmuls
    (TD3's and SAC's twin critics in one call instead of two). Returns `[num_critics, B]`
    (or `[num_critics, B, num_outputs]`)."""

    action_low: tuple[float, ...]
    action_high: tuple[float, ...]
    hidden_sizes: Sequence[int] = (256, 256)
    precision: Precision = FP32
    num_critics: int = 2
    num_outputs: int = 1

    @nn.compact
    def __call__(self, observations: jax.Array, actions: jax.Array) -> jax.Array:
        stacked = nn.vmap(
            Critic,
            variable_axes={"params": 0},
            split_rngs={"params": True},
            in_axes=None,
            out_axes=0,
            axis_size=self.num_critics,
        )
        return stacked(
            self.action_low, self.action_high, tuple(self.hidden_sizes), self.precision, self.num_outputs,
            name="critics",
        )(observations, actions)


def bounds(action_spec) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """`(low, high)` of a continuous `dm_env` BoundedArray spec as flat tuples of floats
    (hashable module attributes)."""
    low = np.broadcast_to(np.asarray(action_spec.minimum, np.float64), action_spec.shape).reshape(-1)
    high = np.broadcast_to(np.asarray(action_spec.maximum, np.float64), action_spec.shape).reshape(-1)
    return tuple(float(v) for v in low), tuple(float(v) for v in high)
