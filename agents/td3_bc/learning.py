"""TD3+BC learning (Fujimoto & Gu, 2021): TD3's critic update with a behaviour-cloning term in the
actor loss; K updates fused per jitted call, optionally under fixed pruning masks.

One update: the twin critics (stacked in one `CriticEnsemble`) regress on
`r + gamma * discount * min_i Q'_i(s', clip(mu'(s') + eps, -1, 1))` with clipped Gaussian
smoothing noise `eps`; every `policy_delay`-th update the actor minimizes
`-lambda * mean Q_1(s, mu(s)) + mean (mu(s) - a)^2` under the updated critics, with
`lambda = alpha / mean|Q_1(s, mu(s))|` (no gradient), and the targets move by Polyak averaging.
Actions in the BC term and the smoothing noise are rescaled to `[-1, 1]` ("unit" actions).
"""

from typing import Any, Optional, Sequence

import chex
import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from agents.td3_bc.config import Config
from pruning import apply_mask, check_mask, masked, polyak_masked, synflow_layer_outputs, synflow_own_flow
from qrl import offpolicy
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

NETWORKS = ("actor", "critic")  # what can be pruned, each scored with its own training loss
NUM_CRITICS = 2


@flax.struct.dataclass
class TrainState:
    """What TD3+BC learning threads from one update to the next (params float32)."""

    actor_params: dict
    critic_params: dict  # stacked twin critics: every leaf `[2, ...]`.
    target_actor_params: dict
    target_critic_params: dict
    actor_opt_state: optax.OptState
    critic_opt_state: optax.OptState
    key: jax.Array  # draws the target smoothing noise.
    updates: jax.Array  # int32 count of critic updates taken.
    masks: Any = None  # `{"actor": mask, "critic": mask}` (None where unpruned); targets share them.


class UnitActor(nn.Module):
    """The actor in unit actions: observations `[B, D]` -> `tanh(head / temperature)` `[B, A]`.

    Its parameter tree (`torso/dense_i`, `head`) is `DeterministicActor`'s, which runs the policy
    (`scale(tanh(head))`) on the same params.
    """

    hidden_sizes: Sequence[int]
    action_size: int
    precision: Precision = FP32

    @nn.compact
    def __call__(self, observations: jax.Array, temperature=1.0) -> jax.Array:
        features = TrainingMLP(tuple(self.hidden_sizes), self.precision, name="torso")(observations)
        return jnp.tanh(dense(features, self.action_size, self.precision, "head", is_output=True) / temperature)


def make_unit_actor(config: Config, bounds, precision: Precision = FP32) -> UnitActor:
    return UnitActor(tuple(config.hidden_sizes), len(bounds[0]), precision)


def make_actor(config: Config, bounds, precision: Precision = FP32) -> DeterministicActor:
    """The deterministic policy at `precision`: observations -> actions in environment units."""
    low, high = bounds
    return DeterministicActor(low, high, tuple(config.hidden_sizes), precision)


def make_critics(config: Config, bounds, num_critics: int = NUM_CRITICS, precision: Precision = FP32) -> CriticEnsemble:
    low, high = bounds
    return CriticEnsemble(low, high, tuple(config.hidden_sizes), precision, num_critics)


def bc_weight(q: jax.Array, alpha: float) -> jax.Array:
    """`lambda = alpha / mean|q|` over `q [B]`, without gradient."""
    chex.assert_rank(q, 1)
    return alpha / jax.lax.stop_gradient(jnp.mean(jnp.abs(q)))


def actor_loss(q: jax.Array, policy_actions: jax.Array, data_actions: jax.Array, alpha: float):
    """`(loss, (lambda, bc_mse))`: `-lambda * mean(q) + mean((policy_actions - data_actions)^2)`
    with `q = Q_1(s, pi(s)) [B]`, unit actions `[B, A]` each, `lambda = bc_weight(q, alpha)`."""
    chex.assert_rank((q, policy_actions), (1, 2))
    chex.assert_equal_shape((policy_actions, data_actions))
    weight = bc_weight(q, alpha)
    bc_mse = jnp.mean(jnp.square(policy_actions - data_actions))
    return -weight * jnp.mean(q) + bc_mse, (weight, bc_mse)


def critic_loss(q: jax.Array, target: jax.Array) -> jax.Array:
    """`sum_i mean_b (q[i, b] - target[b])^2` for `q [C, B]`, `target [B]` (each critic's MSE)."""
    chex.assert_rank((q, target), (2, 1))
    chex.assert_equal(q.shape[1], target.shape[0])
    return jnp.sum(jnp.mean(jnp.square(q - target[None]), axis=-1))


def td_target(reward: jax.Array, discount: jax.Array, next_q: jax.Array, gamma: float) -> jax.Array:
    """`reward + gamma * discount * min_i next_q[i]` `[B]` (clipped double Q), without gradient."""
    chex.assert_rank((reward, discount, next_q), (1, 1, 2))
    return jax.lax.stop_gradient(reward + gamma * discount * jnp.min(next_q, axis=0))


def _networks(config: Config, bounds, precision: Precision = FP32):
    """The forward passes the update and the scoring losses share, on unit actions, with matmuls
    at `precision` (float32 params cast right before each apply; `qrl.networks.continuous`)."""
    unit_actor = make_unit_actor(config, bounds, precision)
    critics = make_critics(config, bounds, precision=precision)
    first_critic = make_critics(config, bounds, num_critics=1, precision=precision)
    low, high = bounds

    def policy_actions(actor_params, observations, temperature=1.0):
        return unit_actor.apply({"params": compute_params(actor_params, precision)}, observations, temperature)

    def q_values(critic_params, observations, unit_actions):
        """All critics' `[C, B]` at unit actions."""
        return critics.apply({"params": compute_params(critic_params, precision)}, observations,
                             scale_actions(unit_actions, low, high))

    def first_q(critic_params, observations, unit_actions):
        """`Q_1(s, a)` `[B]` at unit actions."""
        first = compute_params(jax.tree.map(lambda leaf: leaf[:1], critic_params), precision)
        return first_critic.apply({"params": first}, observations, scale_actions(unit_actions, low, high))[0]

    def targets(target_actor_params, target_critic_params, batch: Transition, noise: jax.Array):
        """TD targets `[B]` with unit smoothing `noise [B, A]` (already clipped)."""
        next_actions = jnp.clip(policy_actions(target_actor_params, batch.next_observation) + noise, -1.0, 1.0)
        next_q = q_values(target_critic_params, batch.next_observation, next_actions)
        return td_target(batch.reward, batch.discount, next_q, config.gamma)

    return policy_actions, q_values, first_q, targets


def scoring_losses(config: Config, bounds, state: TrainState) -> dict:
    """`{network: loss_fn(params, batch, temperature) -> scalar}` for the pruning scorers: each
    network's own training loss with the network's outputs divided by `temperature`, the other
    networks fixed at `state`'s (the initial state's) params.

    critic: `critic_loss(Q(s, a) / temperature, target)` with targets from `state`'s target actor
    and critics, without smoothing noise; actor: `actor_loss` of `tanh(head / temperature)` under
    `state`'s first critic.
    """
    policy_actions, q_values, first_q, targets = _networks(config, bounds)

    def critic_fn(critic_params, batch: Transition, temperature) -> jax.Array:
        noise = jnp.zeros_like(batch.action)
        target = targets(state.target_actor_params, state.target_critic_params, batch, noise)
        q = q_values(critic_params, batch.observation, unscale_actions(batch.action, *bounds)) / temperature
        return critic_loss(q, target)

    def actor_fn(actor_params, batch: Transition, temperature) -> jax.Array:
        actions = policy_actions(actor_params, batch.observation, temperature)
        q = first_q(state.critic_params, batch.observation, actions)
        return actor_loss(q, actions, unscale_actions(batch.action, *bounds), config.alpha)[0]

    return {"actor": actor_fn, "critic": critic_fn}


def networks_at_init(state: TrainState) -> dict:
    """`{network: params}` that `scoring_losses` take (the state's current online params)."""
    return {"actor": state.actor_params, "critic": state.critic_params}



def synflow_inputs(config: Config, bounds, observation_size: int) -> dict:
    """`{network: (apply_fn(params, inputs), input_shape)}` for SynFlow's data-free scoring.

    actor: inputs `[1, D]` -> the head before its tanh `[1, A]` (a saturated tanh has no gradient);
    critic: inputs `[1, D + A]` split into observations and unit actions -> each critic's Q over
    its own value `[C, 1]` (`pruning.synflow_own_flow`).
    """
    unit_actor = make_unit_actor(config, bounds)
    _, q_values, _, _ = _networks(config, bounds)

    def actor_fn(actor_params, inputs):
        return synflow_layer_outputs(unit_actor, actor_params, ("head",), inputs)[0]

    def critic_fn(critic_params, inputs):
        return synflow_own_flow(q_values(critic_params, inputs[:, :observation_size], inputs[:, observation_size:]))

    return {"actor": (actor_fn, (1, observation_size)),
            "critic": (critic_fn, (1, observation_size + len(bounds[0])))}


def make_optimizer(learning_rate: float, mask: Any = None) -> optax.GradientTransformation:
    """Adam; restricted to the kept weights when there is a mask."""
    adam = offpolicy.adam(learning_rate)
    return adam if mask is None else masked(adam, mask)


def _polyak(online, target, tau: float, mask: Any):
    return offpolicy.polyak(online, target, tau) if mask is None else polyak_masked(online, target, tau, mask)


def _network_masks(masks: Optional[dict]) -> dict:
    return {name: (masks or {}).get(name) for name in NETWORKS}


def init(key: jax.Array, config: Config, observation_size: int, bounds, masks: Optional[dict] = None) -> TrainState:
    """A fresh train state; targets start as copies of the online networks. With `masks`
    (`{network: mask}`, each checked against its params) the params start masked."""
    masks = _network_masks(masks)
    unit_actor, critics = make_unit_actor(config, bounds), make_critics(config, bounds)
    observations = jnp.zeros((1, observation_size), jnp.float32)
    actor_key, critic_key, key = jax.random.split(key, 3)
    params = {
        "actor": unit_actor.init(actor_key, observations)["params"],
        "critic": critics.init(critic_key, observations, jnp.zeros((1, len(bounds[0])), jnp.float32))["params"],
    }
    for name, mask in masks.items():
        if mask is not None:
            check_mask(params[name], mask, f"{name} mask")
            params[name] = apply_mask(params[name], mask)
    actor_optimizer = make_optimizer(config.actor_learning_rate, masks["actor"])
    critic_optimizer = make_optimizer(config.critic_learning_rate, masks["critic"])
    return TrainState(
        actor_params=params["actor"],
        critic_params=params["critic"],
        target_actor_params=jax.tree.map(jnp.copy, params["actor"]),
        target_critic_params=jax.tree.map(jnp.copy, params["critic"]),
        actor_opt_state=actor_optimizer.init(params["actor"]),
        critic_opt_state=critic_optimizer.init(params["critic"]),
        key=key,
        updates=jnp.zeros((), jnp.int32),
        masks=jax.tree.map(jnp.copy, masks),  # the loop donates the state: the caller's masks must survive it.
    )


def make_update(config: Config, bounds, masks: Optional[dict] = None):
    """`update(state, batches [K, B, ...]) -> (state, metrics)` (pure; the loop jits it).

    Every forward and backward matmul runs at the config's `matmul_dtype` (params, optimizer
    states and targets stay float32). Metrics, averaged over the K updates: `critic_loss`,
    `q_mean` (online critics at the data's actions); over the delayed updates among them (NaN if
    none): `actor_loss`, `bc_mse`, `lambda`.
    """
    masks = _network_masks(masks)
    policy_actions, q_values, first_q, targets = _networks(config, bounds, offpolicy.training_precision(config))
    actor_optimizer = make_optimizer(config.actor_learning_rate, masks["actor"])
    critic_optimizer = make_optimizer(config.critic_learning_rate, masks["critic"])

    def critic_loss_and_q(critic_params, target, batch: Transition):
        q = q_values(critic_params, batch.observation, unscale_actions(batch.action, *bounds))
        return critic_loss(q, target), jnp.mean(q)

    def actor_loss_and_metrics(actor_params, critic_params, batch: Transition):
        actions = policy_actions(actor_params, batch.observation)
        q = first_q(critic_params, batch.observation, actions)
        return actor_loss(q, actions, unscale_actions(batch.action, *bounds), config.alpha)

    def delayed_update(state: TrainState, critic_params, batch: Transition):
        (value, (weight, bc_mse)), grads = jax.value_and_grad(actor_loss_and_metrics, has_aux=True)(
            state.actor_params, critic_params, batch
        )
        actor_params, actor_opt_state = offpolicy.apply_gradients(
            actor_optimizer, state.actor_params, grads, state.actor_opt_state
        )
        target_params = (
            _polyak(actor_params, state.target_actor_params, config.tau, masks["actor"]),
            _polyak(critic_params, state.target_critic_params, config.tau, masks["critic"]),
        )
        return actor_params, actor_opt_state, target_params, {"actor_loss": value, "bc_mse": bc_mse, "lambda": weight}

    def skip_delayed_update(state: TrainState, critic_params, batch: Transition):
        del critic_params, batch
        nan = jnp.full((), jnp.nan, jnp.float32)
        target_params = (state.target_actor_params, state.target_critic_params)
        return state.actor_params, state.actor_opt_state, target_params, {"actor_loss": nan, "bc_mse": nan,
                                                                          "lambda": nan}

    def one_update(state: TrainState, batch: Transition):
        key, noise_key = jax.random.split(state.key)
        noise = jnp.clip(
            config.target_policy_noise * jax.random.normal(noise_key, batch.action.shape),
            -config.target_noise_clip, config.target_noise_clip,
        )
        target = targets(state.target_actor_params, state.target_critic_params, batch, noise)
        (critic_value, q_mean), critic_grads = jax.value_and_grad(critic_loss_and_q, has_aux=True)(
            state.critic_params, target, batch
        )
        critic_params, critic_opt_state = offpolicy.apply_gradients(
            critic_optimizer, state.critic_params, critic_grads, state.critic_opt_state
        )
        count = state.updates + 1
        actor_params, actor_opt_state, (target_actor_params, target_critic_params), actor_metrics = jax.lax.cond(
            count % config.policy_delay == 0, delayed_update, skip_delayed_update, state, critic_params, batch,
        )
        new_state = state.replace(
            actor_params=actor_params,
            critic_params=critic_params,
            target_actor_params=target_actor_params,
            target_critic_params=target_critic_params,
            actor_opt_state=actor_opt_state,
            critic_opt_state=critic_opt_state,
            key=key,
            updates=count,
        )
        return new_state, {"critic_loss": critic_value, "q_mean": q_mean, **actor_metrics}

    def update(state: TrainState, batches: Transition):
        state, metrics = jax.lax.scan(one_update, state, batches)
        delayed = ("actor_loss", "bc_mse", "lambda")  # these exist on delayed updates only.
        return state, {name: (jnp.nanmean if name in delayed else jnp.mean)(value) for name, value in metrics.items()}

    return update


def policy_params(state: TrainState) -> dict:
    """The actor's params: what the deterministic policy runs on."""
    return state.actor_params


def update_count(state: TrainState) -> jax.Array:
    return state.updates
