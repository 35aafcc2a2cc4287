"""SAC learning (Haarnoja et al., 2018b): twin soft Q critics stacked into one network, a
tanh-Gaussian actor, automatic temperature tuning, K updates fused per jitted call.

One update, in sbx's order: the critics regress on `r + discount * (min_i Q'_i(s', a') -
alpha * log pi(a'|s'))` with `a' ~ pi(.|s')`; the actor minimizes `alpha * log pi(a|s) -
min_i Q_i(s, a)` under the updated critics; the temperature minimizes
`-log(alpha) * (log pi(a|s) + target_entropy)`; the target critics move by Polyak averaging.
Every update uses the temperature from before that update.
"""

from typing import Optional

import flax
import jax
import jax.numpy as jnp
import optax

from agents.sac.config import Config
from qrl import distributions, offpolicy
from qrl.networks.continuous import CriticEnsemble, GaussianActor, compute_params
from qrl.quant import FP32, Precision, apply_frozen, apply_tracking
from qrl.replay import Transition

NUM_CRITICS = 2


@flax.struct.dataclass
class TrainState:
    """Everything SAC learning threads from one update to the next (params float32)."""

    actor_params: dict
    critic_params: dict  # stacked twin critics: every leaf `[2, ...]`.
    target_critic_params: dict
    log_alpha: jax.Array  # [] float32: log of the entropy temperature.
    actor_opt_state: optax.OptState
    critic_opt_state: optax.OptState
    alpha_opt_state: optax.OptState
    key: jax.Array
    updates: jax.Array  # int32 count of gradient updates taken.
    quant_ranges: dict = flax.struct.field(default_factory=dict)  # QAT: the actor's input ranges.


training_precision = offpolicy.training_precision  # the config's matmul_dtype: fp32 or bf16.


def make_actor(config: Config, bounds, precision: Precision = FP32, deterministic: bool = False) -> GaussianActor:
    """The actor at `precision`; `deterministic` gives the deployable `scale(tanh(mean))` policy."""
    low, high = bounds
    return GaussianActor(low, high, tuple(config.hidden_sizes), precision, deterministic)


def make_critics(config: Config, bounds, precision: Precision = FP32) -> CriticEnsemble:
    low, high = bounds
    return CriticEnsemble(low, high, tuple(config.hidden_sizes), precision, NUM_CRITICS)


def make_optimizers(config: Config) -> tuple[optax.GradientTransformation, optax.GradientTransformation]:
    """(network optimizer, temperature optimizer): Adam at the config's learning rate."""
    return offpolicy.adam(config.learning_rate, config.flat_optimizer), optax.adam(config.learning_rate)


def init(key: jax.Array, config: Config, observation_size: int, bounds) -> TrainState:
    """A fresh train state; target critics start as copies of the critics."""
    action_dim = len(bounds[0])
    actor, critics = make_actor(config, bounds), make_critics(config, bounds)
    observations = jnp.zeros((1, observation_size), jnp.float32)
    actions = jnp.zeros((1, action_dim), jnp.float32)
    optimizer, alpha_optimizer = make_optimizers(config)

    @jax.jit
    def fresh_state(key):
        actor_key, critic_key, key = jax.random.split(key, 3)
        actor_params = actor.init(actor_key, observations)["params"]
        critic_params = critics.init(critic_key, observations, actions)["params"]
        log_alpha = jnp.log(jnp.asarray(config.initial_alpha, jnp.float32))
        return TrainState(
            actor_params=actor_params,
            critic_params=critic_params,
            target_critic_params=jax.tree.map(jnp.copy, critic_params),
            log_alpha=log_alpha,
            actor_opt_state=optimizer.init(actor_params),
            critic_opt_state=optimizer.init(critic_params),
            alpha_opt_state=alpha_optimizer.init(log_alpha),
            key=key,
            updates=jnp.zeros((), jnp.int32),
            quant_ranges=offpolicy.init_quant_ranges(config, make_actor, bounds, actor_key, observations),
        )

    return fresh_state(key)


def make_update(config: Config, bounds, actor_precision: Optional[Precision] = None):
    """`update(state, batches [K, B, ...]) -> (state, metrics)` (pure; the loops jit it).

    Critics compute at the config's `matmul_dtype`; the actor at `actor_precision` (None: the
    same; the QAT precision during quantization-aware training).
    """
    precision = training_precision(config)
    actor_precision = actor_precision or precision
    actor = make_actor(config, bounds, actor_precision)
    critics = make_critics(config, bounds, precision)
    low, high = (jnp.asarray(bound, jnp.float32) for bound in bounds)
    optimizer, alpha_optimizer = make_optimizers(config)
    target_entropy = config.target_entropy_per_dim * len(bounds[0])

    def sample(actor_params, quant_ranges, observations, key, track: bool = False):
        """Actions `[B, A]` in environment units, their log-probabilities `[B]` and the QAT
        ranges (updated when `track`: the training-mode pass)."""
        params = compute_params(actor_params, actor_precision)
        if track:
            (mean, log_std), quant_ranges = apply_tracking(actor, params, quant_ranges, observations)
        else:
            mean, log_std = apply_frozen(actor, params, quant_ranges, observations)
        unit_actions, log_prob = distributions.tanh_gaussian_sample_and_log_prob(key, mean, log_std)
        return distributions.scale_to_bounds(unit_actions, low, high), log_prob, quant_ranges

    def q_values(critic_params, observations, actions):
        return critics.apply({"params": compute_params(critic_params, precision)}, observations, actions)

    def critic_loss(critic_params, target, batch: Transition):
        q = q_values(critic_params, batch.observation, batch.action)  # [2, B]
        loss = 0.5 * jnp.sum(jnp.mean(jnp.square(q - target[None]), axis=-1))
        return loss, jnp.mean(q)

    def actor_loss(actor_params, critic_params, alpha, observations, key, quant_ranges):
        actions, log_prob, quant_ranges = sample(actor_params, quant_ranges, observations, key, track=True)
        q = jnp.min(q_values(critic_params, observations, actions), axis=0)
        return jnp.mean(alpha * log_prob - q), (log_prob, quant_ranges)

    def one_update(state: TrainState, batch: Transition):
        key, next_key, actor_key = jax.random.split(state.key, 3)
        alpha = jnp.exp(state.log_alpha)
        next_actions, next_log_prob, _ = sample(state.actor_params, state.quant_ranges, batch.next_observation, next_key)
        next_q = jnp.min(q_values(state.target_critic_params, batch.next_observation, next_actions), axis=0)
        target = jax.lax.stop_gradient(batch.reward + batch.discount * (next_q - alpha * next_log_prob))
        (critic_value, q_mean), critic_grads = jax.value_and_grad(critic_loss, has_aux=True)(
            state.critic_params, target, batch
        )
        critic_params, critic_opt_state = offpolicy.apply_gradients(
            optimizer, state.critic_params, critic_grads, state.critic_opt_state
        )
        (actor_value, (log_prob, quant_ranges)), actor_grads = jax.value_and_grad(actor_loss, has_aux=True)(
            state.actor_params, critic_params, alpha, batch.observation, actor_key, state.quant_ranges
        )
        actor_params, actor_opt_state = offpolicy.apply_gradients(
            optimizer, state.actor_params, actor_grads, state.actor_opt_state
        )
        entropy_gap = jax.lax.stop_gradient(jnp.mean(log_prob) + target_entropy)
        alpha_grad = -entropy_gap  # d/d(log_alpha) of -log_alpha * (log_prob + target_entropy)
        log_alpha, alpha_opt_state = offpolicy.apply_gradients(
            alpha_optimizer, state.log_alpha, alpha_grad, state.alpha_opt_state
        )
        new_state = TrainState(
            actor_params=actor_params,
            critic_params=critic_params,
            target_critic_params=offpolicy.polyak(critic_params, state.target_critic_params, config.tau),
            log_alpha=log_alpha,
            actor_opt_state=actor_opt_state,
            critic_opt_state=critic_opt_state,
            alpha_opt_state=alpha_opt_state,
            key=key,
            updates=state.updates + 1,
            quant_ranges=quant_ranges,
        )
        metrics = {
            "critic_loss": critic_value,
            "actor_loss": actor_value,
            "alpha": alpha,
            "entropy": -jnp.mean(log_prob),
            "q_mean": q_mean,
        }
        return new_state, metrics

    return offpolicy.fuse(one_update)


def policy_network(config: Config, bounds, precision: Precision = FP32) -> GaussianActor:
    """The deployable policy: `scale(tanh(mean))` on the actor's params, at `precision`."""
    return make_actor(config, bounds, precision, deterministic=True)
