"""DDPG learning (Lillicrap et al., 2016): a deterministic actor and one critic with Polyak
target networks; K updates fused per jitted call.

One update: the critic regresses on `r + discount * Q'(s', mu'(s'))` (plus the L2 penalty's
gradient, `critic_l2`); the actor ascends `Q(s, mu(s))` under the updated critic; both targets
move by Polyak averaging.
"""

from typing import Optional

import jax
import jax.numpy as jnp
import optax

from agents.ddpg.config import Config
from qrl import offpolicy
from qrl.networks.continuous import Critic, DeterministicActor, compute_params
from qrl.quant import FP32, Precision, apply_tracking
from qrl.replay import Transition


TrainState = offpolicy.DeterministicTrainState  # actor, critic, targets, optimizer states.


training_precision = offpolicy.training_precision  # the config's matmul_dtype: fp32 or bf16.


def make_actor(config: Config, bounds, precision: Precision = FP32) -> DeterministicActor:
    """The actor at `precision`: observations -> actions in environment units (the policy)."""
    low, high = bounds
    return DeterministicActor(low, high, tuple(config.hidden_sizes), precision)


def make_critic(config: Config, bounds, precision: Precision = FP32) -> Critic:
    low, high = bounds
    return Critic(low, high, tuple(config.hidden_sizes), precision)


def make_optimizers(config: Config) -> tuple[optax.GradientTransformation, optax.GradientTransformation]:
    """(actor optimizer, critic optimizer with the L2 penalty)."""
    return (
        offpolicy.adam(config.actor_learning_rate, config.flat_optimizer),
        offpolicy.adam(config.critic_learning_rate, config.flat_optimizer, l2=config.critic_l2),
    )


def init(key: jax.Array, config: Config, observation_size: int, bounds) -> TrainState:
    """A fresh train state; targets start as copies of the online networks."""
    actor, critic = make_actor(config, bounds), make_critic(config, bounds)
    observations = jnp.zeros((1, observation_size), jnp.float32)
    actions = jnp.zeros((1, len(bounds[0])), jnp.float32)
    actor_optimizer, critic_optimizer = make_optimizers(config)

    @jax.jit
    def fresh_state(key):
        actor_key, critic_key = jax.random.split(key)
        actor_params = actor.init(actor_key, observations)["params"]
        critic_params = critic.init(critic_key, observations, actions)["params"]
        return TrainState(
            actor_params=actor_params,
            critic_params=critic_params,
            target_actor_params=jax.tree.map(jnp.copy, actor_params),
            target_critic_params=jax.tree.map(jnp.copy, critic_params),
            actor_opt_state=actor_optimizer.init(actor_params),
            critic_opt_state=critic_optimizer.init(critic_params),
            updates=jnp.zeros((), jnp.int32),
            quant_ranges=offpolicy.init_quant_ranges(config, make_actor, bounds, actor_key, observations),
        )

    return fresh_state(key)


def make_update(config: Config, bounds, actor_precision: Optional[Precision] = None):
    """`update(state, batches [K, B, ...]) -> (state, metrics)` (pure; the loops jit it).

    The critic computes at the config's `matmul_dtype`; the actor at `actor_precision` (None:
    the same; the QAT precision during quantization-aware training). The target actor always
    runs at the training precision.
    """
    precision = training_precision(config)
    actor_precision = actor_precision or precision
    actor = make_actor(config, bounds, actor_precision)
    target_actor = make_actor(config, bounds, precision)
    critic = make_critic(config, bounds, precision)
    actor_optimizer, critic_optimizer = make_optimizers(config)

    def q_value(critic_params, observations, actions):
        return critic.apply({"params": compute_params(critic_params, precision)}, observations, actions)

    def critic_loss(critic_params, target, batch: Transition):
        q = q_value(critic_params, batch.observation, batch.action)
        return jnp.mean(jnp.square(q - target)), jnp.mean(q)

    def actor_loss(actor_params, critic_params, observations, quant_ranges):
        params = compute_params(actor_params, actor_precision)
        actions, quant_ranges = apply_tracking(actor, params, quant_ranges, observations)
        return -jnp.mean(q_value(critic_params, observations, actions)), quant_ranges

    def one_update(state: TrainState, batch: Transition):
        next_actions = target_actor.apply(
            {"params": compute_params(state.target_actor_params, precision)}, batch.next_observation
        )
        next_q = q_value(state.target_critic_params, batch.next_observation, next_actions)
        target = jax.lax.stop_gradient(batch.reward + batch.discount * next_q)
        (critic_value, q_mean), critic_grads = jax.value_and_grad(critic_loss, has_aux=True)(
            state.critic_params, target, batch
        )
        critic_params, critic_opt_state = offpolicy.apply_gradients(
            critic_optimizer, state.critic_params, critic_grads, state.critic_opt_state
        )
        (actor_value, quant_ranges), actor_grads = jax.value_and_grad(actor_loss, has_aux=True)(
            state.actor_params, critic_params, batch.observation, state.quant_ranges
        )
        actor_params, actor_opt_state = offpolicy.apply_gradients(
            actor_optimizer, state.actor_params, actor_grads, state.actor_opt_state
        )
        new_state = TrainState(
            actor_params=actor_params,
            critic_params=critic_params,
            target_actor_params=offpolicy.polyak(actor_params, state.target_actor_params, config.tau),
            target_critic_params=offpolicy.polyak(critic_params, state.target_critic_params, config.tau),
            actor_opt_state=actor_opt_state,
            critic_opt_state=critic_opt_state,
            updates=state.updates + 1,
            quant_ranges=quant_ranges,
        )
        return new_state, {"critic_loss": critic_value, "actor_loss": actor_value, "q_mean": q_mean}

    return offpolicy.fuse(one_update)
