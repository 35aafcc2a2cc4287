"""TD3 learning (Fujimoto et al., 2018): clipped double Q-learning with twin critics stacked into
one network, target policy smoothing, and delayed policy and target updates; K updates fused per
jitted call.

One update: the critics regress on `r + discount * min_i Q'_i(s', clip(mu'(s') + eps))` with
clipped Gaussian smoothing noise `eps`; every `policy_delay`-th update the actor ascends
`Q_1(s, mu(s))` under the updated critics and the target actor and critics move by Polyak
averaging.
"""

from typing import Optional

import flax
import jax
import jax.numpy as jnp
import optax

from agents.td3.config import Config
from qrl import offpolicy
from qrl.networks.continuous import CriticEnsemble, DeterministicActor, compute_params
from qrl.quant import FP32, Precision, apply_tracking
from qrl.replay import Transition

NUM_CRITICS = 2


@flax.struct.dataclass
class TrainState:
    """Everything TD3 learning threads from one update to the next (params float32)."""

    actor_params: dict
    critic_params: dict  # stacked twin critics: every leaf `[2, ...]`.
    target_actor_params: dict
    target_critic_params: dict
    actor_opt_state: optax.OptState
    critic_opt_state: optax.OptState
    key: jax.Array
    updates: jax.Array  # int32 count of critic updates taken.
    quant_ranges: dict = flax.struct.field(default_factory=dict)  # QAT: the actor's input ranges.


training_precision = offpolicy.training_precision  # the config's matmul_dtype: fp32 or bf16.


def make_actor(config: Config, bounds, precision: Precision = FP32) -> DeterministicActor:
    """The actor at `precision`: observations -> actions in environment units (the policy)."""
    low, high = bounds
    return DeterministicActor(low, high, tuple(config.hidden_sizes), precision)


def make_critics(config: Config, bounds, precision: Precision = FP32, num_critics: int = NUM_CRITICS) -> CriticEnsemble:
    low, high = bounds
    return CriticEnsemble(low, high, tuple(config.hidden_sizes), precision, num_critics)


def init(key: jax.Array, config: Config, observation_size: int, bounds) -> TrainState:
    """A fresh train state; targets start as copies of the online networks."""
    actor, critics = make_actor(config, bounds), make_critics(config, bounds)
    observations = jnp.zeros((1, observation_size), jnp.float32)
    actions = jnp.zeros((1, len(bounds[0])), jnp.float32)
    optimizer = offpolicy.adam(config.learning_rate, config.flat_optimizer)

    @jax.jit
    def fresh_state(key):
        actor_key, critic_key, key = jax.random.split(key, 3)
        actor_params = actor.init(actor_key, observations)["params"]
        critic_params = critics.init(critic_key, observations, actions)["params"]
        return TrainState(
            actor_params=actor_params,
            critic_params=critic_params,
            target_actor_params=jax.tree.map(jnp.copy, actor_params),
            target_critic_params=jax.tree.map(jnp.copy, critic_params),
            actor_opt_state=optimizer.init(actor_params),
            critic_opt_state=optimizer.init(critic_params),
            key=key,
            updates=jnp.zeros((), jnp.int32),
            quant_ranges=offpolicy.init_quant_ranges(config, make_actor, bounds, actor_key, observations),
        )

    return fresh_state(key)


def make_update(config: Config, bounds, actor_precision: Optional[Precision] = None):
    """`update(state, batches [K, B, ...]) -> (state, metrics)` (pure; the loops jit it).

    Critics compute at the config's `matmul_dtype`; the actor at `actor_precision` (None: the
    same; the QAT precision during quantization-aware training). The target actor always runs
    at the training precision.
    """
    precision = training_precision(config)
    actor_precision = actor_precision or precision
    actor = make_actor(config, bounds, actor_precision)
    target_actor = make_actor(config, bounds, precision)
    critics = make_critics(config, bounds, precision)
    first_critic = make_critics(config, bounds, precision, num_critics=1)
    low, high = (jnp.asarray(bound, jnp.float32) for bound in bounds)
    half_range = 0.5 * (high - low)
    optimizer = offpolicy.adam(config.learning_rate, config.flat_optimizer)

    def q_values(network, critic_params, observations, actions):
        return network.apply({"params": compute_params(critic_params, precision)}, observations, actions)

    def critic_loss(critic_params, target, batch: Transition):
        q = q_values(critics, critic_params, batch.observation, batch.action)  # [2, B]
        return jnp.sum(jnp.mean(jnp.square(q - target[None]), axis=-1)), jnp.mean(q)

    def actor_loss(actor_params, critic_params, observations, quant_ranges):
        params = compute_params(actor_params, actor_precision)
        actions, quant_ranges = apply_tracking(actor, params, quant_ranges, observations)
        first = jax.tree.map(lambda leaf: leaf[:1], critic_params)
        return -jnp.mean(q_values(first_critic, first, observations, actions)), quant_ranges

    def delayed_update(state: TrainState, critic_params, observations):
        (value, quant_ranges), grads = jax.value_and_grad(actor_loss, has_aux=True)(
            state.actor_params, critic_params, observations, state.quant_ranges
        )
        actor_params, actor_opt_state = offpolicy.apply_gradients(
            optimizer, state.actor_params, grads, state.actor_opt_state
        )
        targets = (
            offpolicy.polyak(actor_params, state.target_actor_params, config.tau),
            offpolicy.polyak(critic_params, state.target_critic_params, config.tau),
        )
        return actor_params, actor_opt_state, targets, value, quant_ranges

    def skip_delayed_update(state: TrainState, critic_params, observations):
        del critic_params, observations
        targets = (state.target_actor_params, state.target_critic_params)
        nan = jnp.full((), jnp.nan, jnp.float32)
        return state.actor_params, state.actor_opt_state, targets, nan, state.quant_ranges

    def one_update(state: TrainState, batch: Transition):
        key, noise_key = jax.random.split(state.key)
        next_actions = target_actor.apply(
            {"params": compute_params(state.target_actor_params, precision)}, batch.next_observation
        )
        noise = jnp.clip(
            config.target_policy_noise * jax.random.normal(noise_key, next_actions.shape),
            -config.target_noise_clip, config.target_noise_clip,
        )
        next_actions = jnp.clip(next_actions + noise * half_range, low, high)
        next_q = jnp.min(q_values(critics, state.target_critic_params, batch.next_observation, next_actions), axis=0)
        target = jax.lax.stop_gradient(batch.reward + batch.discount * next_q)
        (critic_value, q_mean), critic_grads = jax.value_and_grad(critic_loss, has_aux=True)(
            state.critic_params, target, batch
        )
        critic_params, critic_opt_state = offpolicy.apply_gradients(
            optimizer, state.critic_params, critic_grads, state.critic_opt_state
        )
        count = state.updates + 1
        actor_params, actor_opt_state, (target_actor_params, target_critic_params), actor_value, quant_ranges = jax.lax.cond(
            count % config.policy_delay == 0, delayed_update, skip_delayed_update,
            state, critic_params, batch.observation,
        )
        new_state = TrainState(
            actor_params=actor_params,
            critic_params=critic_params,
            target_actor_params=target_actor_params,
            target_critic_params=target_critic_params,
            actor_opt_state=actor_opt_state,
            critic_opt_state=critic_opt_state,
            key=key,
            updates=count,
            quant_ranges=quant_ranges,
        )
        return new_state, {"critic_loss": critic_value, "actor_loss": actor_value, "q_mean": q_mean}

    def update(state: TrainState, batches: Transition):
        state, metrics = jax.lax.scan(one_update, state, batches)
        # The actor loss exists on delayed updates only: average it over those.
        return state, {
            "critic_loss": jnp.mean(metrics["critic_loss"]),
            "q_mean": jnp.mean(metrics["q_mean"]),
            "actor_loss": jnp.nanmean(metrics["actor_loss"]),
        }

    return update
