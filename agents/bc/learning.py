"""Behaviour cloning learning: regress the dataset's actions with an MLP actor, K updates fused per
jitted call, optionally under a fixed pruning mask.

Both losses work on actions rescaled to `[-1, 1]` ("unit" actions). With `loss="mse"` the actor's
head `h [B, A]` gives `tanh(h)` and the loss is the mean squared error to the dataset's unit
action. With `loss="gaussian"` the head `[B, 2A]` gives a Gaussian over unit actions with mean
`tanh(h_mean)` and log-std `clip(h_log_std, -5, 2)`; the loss is the negative log-likelihood of
the dataset's unit action. In both cases the deterministic policy is `scale(tanh(h[..., :A]))`.
"""

import math
from typing import Any, Optional, Sequence

import chex
import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from agents.bc.config import LOG_STD_MAX, LOG_STD_MIN, Config
from pruning import apply_mask, check_mask, masked
from qrl import offpolicy
from qrl.networks.continuous import DeterministicActor, GaussianActor, TrainingMLP, dense, unscale_actions
from qrl.quant import FP32, Precision
from qrl.replay import Transition

HALF_LOG_TWO_PI = 0.5 * math.log(2.0 * math.pi)


@flax.struct.dataclass
class TrainState:
    """What BC learning threads from one update to the next (params float32)."""

    actor_params: dict
    opt_state: optax.OptState
    key: jax.Array  # split off the init key; BC's updates draw nothing from it.
    updates: jax.Array  # int32 count of gradient updates taken.
    mask: Any = None  # the actor's pruning mask (bool leaves, None where unpruned), or None.


class ActorOutputs(nn.Module):
    """The actor's raw head: observations `[B, D]` -> `[B, outputs]` before any tanh or clipping.

    Its parameter tree (`torso/dense_i`, `head`) is `DeterministicActor`'s (outputs A) and
    `GaussianActor`'s (outputs 2A), so those modules run the deterministic policy on the same params.
    """

    hidden_sizes: Sequence[int]
    outputs: int
    precision: Precision = FP32

    @nn.compact
    def __call__(self, observations: jax.Array) -> jax.Array:
        features = TrainingMLP(tuple(self.hidden_sizes), self.precision, name="torso")(observations)
        return dense(features, self.outputs, self.precision, "head", is_output=True)


def head_outputs(config: Config, bounds) -> int:
    """Width of the actor's head: A for MSE, 2A (means, then log-stds) for the Gaussian."""
    action_size = len(bounds[0])
    return action_size if config.loss == "mse" else 2 * action_size


def make_actor_outputs(config: Config, bounds, precision: Precision = FP32) -> ActorOutputs:
    return ActorOutputs(tuple(config.hidden_sizes), head_outputs(config, bounds), precision)


def make_actor(config: Config, bounds, precision: Precision = FP32) -> nn.Module:
    """The deterministic policy network at `precision`: observations -> actions in environment
    units (what evaluation and post-training quantization run)."""
    low, high = bounds
    if config.loss == "mse":
        return DeterministicActor(low, high, tuple(config.hidden_sizes), precision)
    return GaussianActor(low, high, tuple(config.hidden_sizes), precision, deterministic=True)


def mse_loss(outputs: jax.Array, unit_actions: jax.Array) -> jax.Array:
    """`mean((tanh(outputs) - unit_actions)^2)` over the batch and action dims; `[B, A]` each."""
    chex.assert_equal_shape((outputs, unit_actions))
    return jnp.mean(jnp.square(jnp.tanh(outputs) - unit_actions))


def gaussian_nll(outputs: jax.Array, unit_actions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`(nll, log_std)`: the negative log-likelihood of `unit_actions [B, A]` under
    N(tanh(mean), exp(log_std)^2) with `outputs [B, 2A] = (mean, log_std)`, summed over action dims
    and averaged over the batch; log-std clipped to [-5, 2]."""
    chex.assert_rank((outputs, unit_actions), 2)
    action_size = unit_actions.shape[-1]
    chex.assert_shape(outputs, (unit_actions.shape[0], 2 * action_size))
    mean = jnp.tanh(outputs[:, :action_size])
    log_std = jnp.clip(outputs[:, action_size:], LOG_STD_MIN, LOG_STD_MAX)
    z = (unit_actions - mean) * jnp.exp(-log_std)
    nll = jnp.sum(0.5 * jnp.square(z) + log_std + HALF_LOG_TWO_PI, axis=-1)
    return jnp.mean(nll), log_std


def scoring_loss(config: Config, bounds):
    """`loss_fn(actor_params, batch, temperature) -> scalar`: the BC loss with the head's outputs
    divided by `temperature` first (what `pruning.snip_scores` / `grasp_scores` take)."""
    network = make_actor_outputs(config, bounds)

    def loss_fn(actor_params, batch: Transition, temperature) -> jax.Array:
        outputs = network.apply({"params": actor_params}, batch.observation) / temperature
        unit_actions = unscale_actions(batch.action, *bounds)
        if config.loss == "mse":
            return mse_loss(outputs, unit_actions)
        return gaussian_nll(outputs, unit_actions)[0]

    return loss_fn


NETWORKS = ("actor",)  # what can be pruned, each scored with its own training loss


def scoring_losses(config: Config, bounds, state: Optional[TrainState] = None) -> dict:
    """`{network: loss_fn(params, batch, temperature)}` for the pruning scorers (`state`, which
    agents with several networks score against, is not needed: BC has one)."""
    return {"actor": scoring_loss(config, bounds)}


def synflow_inputs(config: Config, bounds, observation_size: int) -> dict:
    """`{network: (apply_fn(params, inputs), input_shape)}` for SynFlow's data-free scoring."""
    network = make_actor_outputs(config, bounds)
    return {"actor": (lambda params, inputs: network.apply({"params": params}, inputs), (1, observation_size))}


def networks_at_init(state: TrainState) -> dict:
    """`{network: params}` that `scoring_losses` take (the state's current params)."""
    return {"actor": state.actor_params}


def make_optimizer(config: Config, mask: Any = None) -> optax.GradientTransformation:
    """Adam; restricted to the kept weights when there is a mask."""
    adam = offpolicy.adam(config.learning_rate)
    return adam if mask is None else masked(adam, mask)


def init(key: jax.Array, config: Config, observation_size: int, bounds, mask: Any = None) -> TrainState:
    """A fresh train state; with a `mask` (checked against the params) the params start masked."""
    network = make_actor_outputs(config, bounds)
    actor_key, key = jax.random.split(key)
    params = network.init(actor_key, jnp.zeros((1, observation_size), jnp.float32))["params"]
    if mask is not None:
        check_mask(params, mask)
        params = apply_mask(params, mask)
    optimizer = make_optimizer(config, mask)
    return TrainState(
        actor_params=params, opt_state=optimizer.init(params), key=key, updates=jnp.zeros((), jnp.int32),
        mask=jax.tree.map(jnp.copy, mask),  # the loop donates the state: the caller's mask must survive it.
    )


def make_update(config: Config, bounds, mask: Any = None):
    """`update(state, batches [K, B, ...]) -> (state, metrics)` (pure; the loop jits it).

    Metrics, averaged over the K updates: `loss`; for the Gaussian also `action_mse` (of the
    deterministic action, unit actions) and `log_std` (mean).
    """
    network = make_actor_outputs(config, bounds)
    optimizer = make_optimizer(config, mask)
    action_size = len(bounds[0])

    def loss_and_metrics(actor_params, batch: Transition):
        outputs = network.apply({"params": actor_params}, batch.observation)
        unit_actions = unscale_actions(batch.action, *bounds)
        if config.loss == "mse":
            loss = mse_loss(outputs, unit_actions)
            return loss, {"loss": loss}
        loss, log_std = gaussian_nll(outputs, unit_actions)
        action_mse = mse_loss(outputs[:, :action_size], unit_actions)
        return loss, {"loss": loss, "action_mse": action_mse, "log_std": jnp.mean(log_std)}

    def one_update(state: TrainState, batch: Transition):
        grads, metrics = jax.grad(loss_and_metrics, has_aux=True)(state.actor_params, batch)
        actor_params, opt_state = offpolicy.apply_gradients(optimizer, state.actor_params, grads, state.opt_state)
        return state.replace(actor_params=actor_params, opt_state=opt_state, updates=state.updates + 1), metrics

    return offpolicy.fuse(one_update)


def policy_params(state: TrainState) -> dict:
    """The actor's params: what the deterministic policy runs on."""
    return state.actor_params


def update_count(state: TrainState) -> jax.Array:
    return state.updates

