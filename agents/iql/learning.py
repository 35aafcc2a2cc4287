"""IQL learning (Kostrikov, Nair, Levine, ICLR 2022): expectile regression of a value network on
the target twin critics, TD regression of the critics on that value, and advantage-weighted
regression of a Gaussian actor; K updates fused per jitted call, each network optionally under a
fixed pruning mask.

One update, in the reference code's order (`learner.py`, `_update_jit`):
1. `q = min_i Q'_i(s, a)` from the target critics;
   value: `mean(|expectile - 1(u < 0)| * u^2)` with `u = q - V(s)`.
2. actor, with the updated value: weights `w = min(exp(beta * (q - V(s))), max_weight)`,
   loss `-mean(w * log N(a_unit; tanh(h(s)), exp(log_std)^2))` (log-prob summed over action dims).
3. critics, with the updated value: `sum_i mean((Q_i(s, a) - (reward_scale * r + gamma * d * V(s')))^2)`.
4. target critics move by Polyak averaging (masked: they share the critics' mask).

Actions enter the losses rescaled to `[-1, 1]` ("unit" actions). The actor's head `h [B, A]` gives
the mean `tanh(h)`; its log-std is a state-independent parameter `log_std [A]`, clipped to
[-5, 2]. The deterministic policy is the mean, `scale(tanh(h))`, on the params `{torso, head}`
(`DeterministicActor`'s tree).
"""

import math
from typing import Any, Optional, Sequence

import chex
import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from agents.iql.config import LOG_STD_MAX, LOG_STD_MIN, Config
from pruning import apply_mask, check_mask, masked, polyak_masked, synflow_own_flow
from qrl import offline, offpolicy
from qrl.datasets import Dataset
from qrl.errors import QrlInputError
from qrl.networks.continuous import (
    CriticEnsemble,
    DeterministicActor,
    TrainingMLP,
    compute_params,
    dense,
    scale_actions,
    unscale_actions,
)
from qrl.quant import FP32, Precision
from qrl.replay import Transition

HALF_LOG_TWO_PI = 0.5 * math.log(2.0 * math.pi)
NETWORKS = ("actor", "critic", "value")  # what can be pruned, each scored with its own training loss
NUM_CRITICS = 2
RETURN_RANGE_SCALE = 1000.0  # the reference's locomotion reward scale: 1000 / (max - min episode return)


@flax.struct.dataclass
class TrainState:
    """What IQL learning threads from one update to the next (params float32)."""

    actor_params: dict  # {torso, head, log_std [A]}
    critic_params: dict  # stacked twin critics: every leaf `[2, ...]`.
    value_params: dict
    target_critic_params: dict
    actor_opt_state: optax.OptState
    critic_opt_state: optax.OptState
    value_opt_state: optax.OptState
    key: jax.Array  # split off the init key; IQL's updates draw nothing from it (no dropout).
    updates: jax.Array  # int32 count of gradient updates taken.
    masks: Any = None  # {network: mask or None} for NETWORKS; the target critics use the critics' mask.


class GaussianActorOutputs(nn.Module):
    """IQL's actor: observations `[B, D]` -> `(h [B, A], log_std [A])`, before the tanh of the
    mean and the log-std clip. `torso/dense_i` and `head` are `DeterministicActor`'s tree."""

    hidden_sizes: Sequence[int]
    action_size: int
    precision: Precision = FP32

    @nn.compact
    def __call__(self, observations: jax.Array) -> tuple[jax.Array, jax.Array]:
        features = TrainingMLP(tuple(self.hidden_sizes), self.precision, name="torso")(observations)
        log_std = self.param("log_std", nn.initializers.zeros, (self.action_size,), jnp.float32)
        return dense(features, self.action_size, self.precision, "head", is_output=True), log_std


class ValueNetwork(nn.Module):
    """V(s): observations `[B, D]` -> `[B]`."""

    hidden_sizes: Sequence[int]
    precision: Precision = FP32

    @nn.compact
    def __call__(self, observations: jax.Array) -> jax.Array:
        features = TrainingMLP(tuple(self.hidden_sizes), self.precision, name="torso")(observations)
        return dense(features, 1, self.precision, "head", is_output=True)[..., 0]


def make_actor_outputs(config: Config, bounds, precision: Precision = FP32) -> GaussianActorOutputs:
    return GaussianActorOutputs(tuple(config.hidden_sizes), len(bounds[0]), precision)


def make_actor(config: Config, bounds, precision: Precision = FP32) -> DeterministicActor:
    """The deterministic policy network at `precision`: observations -> `scale(tanh(h))` in
    environment units (what evaluation and post-training quantization run, on `policy_params`)."""
    low, high = bounds
    return DeterministicActor(low, high, tuple(config.hidden_sizes), precision)


def make_critics(config: Config, bounds, precision: Precision = FP32) -> CriticEnsemble:
    low, high = bounds
    return CriticEnsemble(low, high, tuple(config.hidden_sizes), precision, NUM_CRITICS)


def make_value(config: Config, precision: Precision = FP32) -> ValueNetwork:
    return ValueNetwork(tuple(config.hidden_sizes), precision)


def actor_compute_params(actor_params: dict, precision: Precision) -> dict:
    """The actor's layers cast for `precision` (`compute_params`); `log_std` stays float32 (it
    enters no matmul)."""
    layers = {name: leaf for name, leaf in actor_params.items() if name != "log_std"}
    return {**compute_params(layers, precision), "log_std": actor_params["log_std"]}


# ----- losses -----------------------------------------------------------------------------------


def expectile_loss(diff: jax.Array, expectile: float) -> jax.Array:
    """`mean(|expectile - 1(diff < 0)| * diff^2)` over `diff = q - v` `[B]`."""
    chex.assert_rank(diff, 1)
    weight = jnp.where(diff < 0.0, 1.0 - expectile, expectile)
    return jnp.mean(weight * jnp.square(diff))


def advantage_weights(q: jax.Array, v: jax.Array, beta: float, max_weight: float) -> jax.Array:
    """`min(exp(beta * (q - v)), max_weight)` `[B]`, without gradient."""
    chex.assert_equal_shape((q, v))
    return jax.lax.stop_gradient(jnp.minimum(jnp.exp(beta * (q - v)), max_weight))


def gaussian_log_prob(h: jax.Array, log_std: jax.Array, unit_actions: jax.Array) -> jax.Array:
    """`log N(unit_actions; tanh(h), exp(clip(log_std, -5, 2))^2)` summed over action dims:
    `h [B, A]`, `log_std [A]`, `unit_actions [B, A]` -> `[B]`."""
    chex.assert_equal_shape((h, unit_actions))
    chex.assert_shape(log_std, (h.shape[-1],))
    log_std = jnp.clip(log_std, LOG_STD_MIN, LOG_STD_MAX)
    z = (unit_actions - jnp.tanh(h)) * jnp.exp(-log_std)
    return -jnp.sum(0.5 * jnp.square(z) + log_std + HALF_LOG_TWO_PI, axis=-1)


def awr_loss(h: jax.Array, log_std: jax.Array, unit_actions: jax.Array, weights: jax.Array) -> jax.Array:
    """`-mean(weights * log_prob)`: advantage-weighted regression; `weights [B]`."""
    log_prob = gaussian_log_prob(h, log_std, unit_actions)
    chex.assert_equal_shape((log_prob, weights))
    return -jnp.mean(weights * log_prob)


def critic_loss(q: jax.Array, target: jax.Array) -> jax.Array:
    """`sum_i mean((q_i - target)^2)`: `q [critics, B]`, `target [B]` (the reference's
    `mean((q1 - t)^2 + (q2 - t)^2)`)."""
    chex.assert_rank((q, target), (2, 1))
    return jnp.sum(jnp.mean(jnp.square(q - target[None]), axis=-1))


# ----- state --------------------------------------------------------------------------------------


def network_masks(masks: Optional[dict]) -> dict:
    """`{network: mask or None}` over NETWORKS; another network name is an input error."""
    return offline.network_masks("iql", masks, NETWORKS)


def _with_mask(optimizer: optax.GradientTransformation, mask: Any) -> optax.GradientTransformation:
    return optimizer if mask is None else masked(optimizer, mask)


def actor_learning_rate(config: Config):
    """The actor's rate: constant, or the reference's cosine decay to 0 over `actor_lr_decay_steps`."""
    if config.actor_lr_schedule == "constant":
        return config.actor_learning_rate
    if config.actor_lr_decay_steps < 1:
        raise QrlInputError("IQL's cosine actor_lr_schedule needs actor_lr_decay_steps > 0 (train sets it to steps)")
    return optax.cosine_decay_schedule(config.actor_learning_rate, config.actor_lr_decay_steps)


def make_optimizers(config: Config, masks: Optional[dict] = None) -> dict:
    """`{network: Adam}`, each restricted to its mask's kept weights when it has one."""
    masks = network_masks(masks)
    rates = {"actor": actor_learning_rate(config), "critic": config.critic_learning_rate,
             "value": config.value_learning_rate}
    return {name: _with_mask(offpolicy.adam(rates[name]), masks[name]) for name in NETWORKS}


def init(key: jax.Array, config: Config, observation_size: int, bounds, masks: Optional[dict] = None) -> TrainState:
    """A fresh train state; each network with a mask (checked against its params) starts masked;
    the target critics start as copies of the (masked) critics."""
    masks = network_masks(masks)
    observations = jnp.zeros((1, observation_size), jnp.float32)
    actions = jnp.zeros((1, len(bounds[0])), jnp.float32)
    actor_key, critic_key, value_key, key = jax.random.split(key, 4)
    params = {
        "actor": make_actor_outputs(config, bounds).init(actor_key, observations)["params"],
        "critic": make_critics(config, bounds).init(critic_key, observations, actions)["params"],
        "value": make_value(config).init(value_key, observations)["params"],
    }
    for name, mask in masks.items():
        if mask is not None:
            check_mask(params[name], mask)
            params[name] = apply_mask(params[name], mask)
    optimizers = make_optimizers(config, masks)
    return TrainState(
        actor_params=params["actor"],
        critic_params=params["critic"],
        value_params=params["value"],
        target_critic_params=jax.tree.map(jnp.copy, params["critic"]),
        actor_opt_state=optimizers["actor"].init(params["actor"]),
        critic_opt_state=optimizers["critic"].init(params["critic"]),
        value_opt_state=optimizers["value"].init(params["value"]),
        key=key,
        updates=jnp.zeros((), jnp.int32),
        masks=jax.tree.map(jnp.copy, masks),  # the loop donates the state: the caller's masks must survive it.
    )


# ----- the update ---------------------------------------------------------------------------------


def make_update(config: Config, bounds, masks: Optional[dict] = None):
    """`update(state, batches [K, B, ...]) -> (state, metrics)` (pure; the loop jits it).

    Every forward and backward matmul runs at the config's `matmul_dtype` (params, optimizer
    states and target critics stay float32). Metrics, averaged over the K updates: `value_loss`,
    `actor_loss`, `critic_loss` (each before its step), `q_mean`, `v_mean`, `weight_mean`
    (advantage weights).
    """
    masks = network_masks(masks)
    precision = offpolicy.training_precision(config)
    actor = make_actor_outputs(config, bounds, precision)
    critics, value = make_critics(config, bounds, precision), make_value(config, precision)
    optimizers = make_optimizers(config, masks)

    def values(value_params, observations):
        return value.apply({"params": compute_params(value_params, precision)}, observations)

    def q_values(critic_params, batch: Transition):
        return critics.apply({"params": compute_params(critic_params, precision)}, batch.observation, batch.action)

    def value_loss_fn(value_params, observations, q):
        v = values(value_params, observations)
        return expectile_loss(q - v, config.expectile), v

    def actor_loss_fn(actor_params, observations, unit_actions, weights):
        h, log_std = actor.apply({"params": actor_compute_params(actor_params, precision)}, observations)
        return awr_loss(h, log_std, unit_actions, weights)

    def critic_loss_fn(critic_params, batch: Transition, target):
        q = q_values(critic_params, batch)
        return critic_loss(q, target), q

    def step(name, params, grads, opt_state):
        return offpolicy.apply_gradients(optimizers[name], params, grads, opt_state)

    def one_update(state: TrainState, batch: Transition):
        q = jnp.min(q_values(state.target_critic_params, batch), axis=0)
        (value_loss, v), grads = jax.value_and_grad(value_loss_fn, has_aux=True)(
            state.value_params, batch.observation, q
        )
        value_params, value_opt_state = step("value", state.value_params, grads, state.value_opt_state)

        weights = advantage_weights(q, values(value_params, batch.observation), config.beta, config.max_weight)
        unit_actions = unscale_actions(batch.action, *bounds)
        actor_loss, grads = jax.value_and_grad(actor_loss_fn)(state.actor_params, batch.observation, unit_actions,
                                                             weights)
        actor_params, actor_opt_state = step("actor", state.actor_params, grads, state.actor_opt_state)

        next_v = values(value_params, batch.next_observation)
        target = jax.lax.stop_gradient(config.reward_scale * batch.reward + config.gamma * batch.discount * next_v)
        (critic_value, q_online), grads = jax.value_and_grad(critic_loss_fn, has_aux=True)(
            state.critic_params, batch, target
        )
        critic_params, critic_opt_state = step("critic", state.critic_params, grads, state.critic_opt_state)
        if masks["critic"] is None:
            target_critic_params = offpolicy.polyak(critic_params, state.target_critic_params, config.tau)
        else:
            target_critic_params = polyak_masked(critic_params, state.target_critic_params, config.tau, masks["critic"])

        new_state = state.replace(
            actor_params=actor_params, critic_params=critic_params, value_params=value_params,
            target_critic_params=target_critic_params, actor_opt_state=actor_opt_state,
            critic_opt_state=critic_opt_state, value_opt_state=value_opt_state, updates=state.updates + 1,
        )
        metrics = {"value_loss": value_loss, "actor_loss": actor_loss, "critic_loss": critic_value,
                   "q_mean": jnp.mean(q_online), "v_mean": jnp.mean(v), "weight_mean": jnp.mean(weights)}
        return new_state, metrics

    return offpolicy.fuse(one_update)


# ----- pruning ------------------------------------------------------------------------------------


def networks_at_init(state: TrainState) -> dict:
    """`{network: params}` that `scoring_losses` take (the state's current params)."""
    return {"actor": state.actor_params, "critic": state.critic_params, "value": state.value_params}


def scoring_losses(config: Config, bounds, state: TrainState) -> dict:
    """`{network: loss_fn(params, batch, temperature) -> scalar}` for the pruning scorers: each
    network's training loss as a function of its own params, the other networks fixed at
    `state`'s (the initial state's), with the scored network's outputs divided by `temperature`.

    value: the expectile loss against `state`'s target critics; actor: the AWR loss with weights
    from `state`'s target critics and value (head `h` and `log_std` both divided); critic: the TD
    loss with targets from `state`'s value network.
    """
    actor, critics, value = make_actor_outputs(config, bounds), make_critics(config, bounds), make_value(config)

    def target_q(batch: Transition) -> jax.Array:
        return jnp.min(critics.apply({"params": state.target_critic_params}, batch.observation, batch.action), axis=0)

    def value_loss(value_params, batch: Transition, temperature) -> jax.Array:
        v = value.apply({"params": value_params}, batch.observation) / temperature
        return expectile_loss(target_q(batch) - v, config.expectile)

    def actor_loss(actor_params, batch: Transition, temperature) -> jax.Array:
        v = value.apply({"params": state.value_params}, batch.observation)
        weights = advantage_weights(target_q(batch), v, config.beta, config.max_weight)
        h, log_std = actor.apply({"params": actor_params}, batch.observation)
        return awr_loss(h / temperature, log_std / temperature, unscale_actions(batch.action, *bounds), weights)

    def critic_td_loss(critic_params, batch: Transition, temperature) -> jax.Array:
        next_v = value.apply({"params": state.value_params}, batch.next_observation)
        target = config.reward_scale * batch.reward + config.gamma * batch.discount * next_v
        q = critics.apply({"params": critic_params}, batch.observation, batch.action) / temperature
        return critic_loss(q, target)

    return {"actor": actor_loss, "critic": critic_td_loss, "value": value_loss}



def synflow_inputs(config: Config, bounds, observation_size: int) -> dict:
    """`{network: (apply_fn(params, inputs), input_shape)}` for SynFlow's data-free scoring.

    actor: inputs `[1, D]` -> the head `h [1, A]` (before the mean's tanh; `log_std` is not a
    layer); value: `[1, D]` -> `[1]`; critic: `[1, D + A]` split into observations and unit
    actions -> each critic's Q over its own value `[C, 1]` (`pruning.synflow_own_flow`).
    """
    actor, critics, value = make_actor_outputs(config, bounds), make_critics(config, bounds), make_value(config)

    def critic_fn(critic_params, inputs):
        actions = scale_actions(inputs[:, observation_size:], *bounds)
        return synflow_own_flow(critics.apply({"params": critic_params}, inputs[:, :observation_size], actions))

    return {
        "actor": (lambda actor_params, inputs: actor.apply({"params": actor_params}, inputs)[0], (1, observation_size)),
        "critic": (critic_fn, (1, observation_size + len(bounds[0]))),
        "value": (lambda value_params, inputs: value.apply({"params": value_params}, inputs), (1, observation_size)),
    }


# ----- data and state accessors -----------------------------------------------------------------


def trajectory_returns(dataset: Dataset) -> np.ndarray:
    """Undiscounted returns `[episodes]` of the dataset's trajectories, split as the reference's
    `split_into_trajectories`: after a terminal, or where `next_observation[i] != observation[i + 1]`."""
    transitions = jax.device_get(dataset.transitions)
    observations = np.asarray(transitions.observation)
    next_observations = np.asarray(transitions.next_observation)
    gaps = np.linalg.norm((observations[1:] - next_observations[:-1]).reshape(len(observations) - 1, -1), axis=-1)
    ends = (gaps > 1e-6) | (np.asarray(transitions.discount)[:-1] == 0.0)
    boundaries = np.concatenate([[0], np.flatnonzero(ends) + 1, [len(observations)]])
    cumulative = np.concatenate([[0.0], np.cumsum(np.asarray(transitions.reward, np.float64))])
    return cumulative[boundaries[1:]] - cumulative[boundaries[:-1]]


def reward_scale(dataset: Dataset) -> float:
    """The reference's locomotion reward scale, `1000 / (max - min trajectory return)`."""
    returns = trajectory_returns(dataset)
    spread = float(np.max(returns) - np.min(returns))
    if spread <= 0.0:
        raise QrlInputError(
            "IQL reward normalization needs trajectories with different returns; set normalize_rewards=false"
        )
    return RETURN_RANGE_SCALE / spread


def policy_params(state: TrainState) -> dict:
    """The deterministic policy's params `{torso, head}` (`DeterministicActor`'s tree)."""
    return {"torso": state.actor_params["torso"], "head": state.actor_params["head"]}


def update_count(state: TrainState) -> jax.Array:
    return state.updates
