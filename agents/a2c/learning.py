"""A2C learning: the advantage actor-critic loss, one gradient step per rollout.

`update(state, rollout [T, N])` computes advantages (GAE; λ = 1 gives the paper's n-step
returns bootstrapped from the last state) with the rollout's critic and takes one RMSProp
step on the whole `[T * N]` batch (Mnih et al. 2016, synchronous).
"""

from typing import Callable

import jax
import jax.numpy as jnp
import optax
from dm_env import specs

from agents.a2c.config import Config
from agents.a2c.networks import make_actor_critic
from qrl import losses, onpolicy
from qrl.onpolicy import ActorCritic, Rollout, TrainState
from qrl.quant import FP32, Precision


def make_optimizer(config: Config, num_iterations: int = 1) -> optax.GradientTransformation:
    """Global-norm clipping, then RMSProp as torch (and SB3) run it: v ← αv + (1−α)g²,
    Δ = −lr·g / (√v + eps), v₀ = 0. A `linear` schedule decays the rate to 0 over the run."""
    learning_rate = config.learning_rate
    if config.learning_rate_schedule == "linear":
        learning_rate = onpolicy.linear_decay(config.learning_rate, num_iterations)
    optimizer = optax.chain(
        optax.clip_by_global_norm(config.max_grad_norm),
        optax.rmsprop(learning_rate, decay=config.rmsprop_decay, eps=config.rmsprop_eps, eps_in_sqrt=False),
    )
    return optax.flatten(optimizer) if config.flat_optimizer else optimizer


def init(key: jax.Array, config: Config, observation_spec: specs.Array, action_spec: specs.Array) -> TrainState:
    """A fresh train state for these specs."""
    actor_critic = make_actor_critic(config, observation_spec, action_spec)
    qat_actor = onpolicy.make_qat_actor(make_actor_critic, config, observation_spec, action_spec)
    return onpolicy.init_state(key, actor_critic, make_optimizer(config), observation_spec, qat_actor)


def make_loss(actor_critic: ActorCritic, config: Config) -> Callable[..., tuple[jax.Array, tuple[dict, dict]]]:
    """`loss(params, quant_ranges, batch) -> (loss, (metrics, quant_ranges))` on a batch `[B]`
    with fields observation, action, advantage and target (value targets). `quant_ranges`: the
    QAT actor's input ranges, returned moved towards the batch's (`{}` without QAT)."""

    def loss(params, quant_ranges, batch):
        log_prob, entropy, quant_ranges = actor_critic.log_prob_entropy_and_ranges(
            params, quant_ranges, batch["observation"], batch["action"]
        )
        advantage = batch["advantage"]
        if config.normalize_advantage:
            advantage = (advantage - jnp.mean(advantage)) / (jnp.std(advantage) + 1e-8)
        policy_loss = jnp.mean(losses.batched_policy_gradient_loss(log_prob, advantage))
        values = actor_critic.value(params, batch["observation"])
        value_loss = jnp.mean(losses.batched_value_loss(values, batch["target"]))
        entropy = jnp.mean(entropy)
        total = policy_loss + config.vf_coef * value_loss - config.ent_coef * entropy
        metrics = {"loss": total, "policy_loss": policy_loss, "value_loss": value_loss, "entropy": entropy}
        return total, (metrics, quant_ranges)

    return loss


def make_update(
    config: Config,
    observation_spec: specs.Array,
    action_spec: specs.Array,
    num_iterations: int = 1,
    policy_precision: Precision = FP32,
) -> Callable[[TrainState, Rollout], tuple[TrainState, dict]]:
    """`update(state, rollout [T, N]) -> (state, metrics)`, pure: one gradient step.

    The actor runs at `policy_precision` (fp32, or a `qat_precision(bits)` for QAT, whose
    input ranges `state.quant_ranges` move with the step); the critic at fp32.
    `num_iterations` (rollouts in the run) sets the linear schedule's length.
    """
    actor_critic = make_actor_critic(config, observation_spec, action_spec, policy_precision)
    optimizer = make_optimizer(config, num_iterations)
    grad_fn = jax.grad(make_loss(actor_critic, config), has_aux=True)

    def update(state: TrainState, rollout: Rollout):
        advantages, targets, _ = onpolicy.advantages_and_returns(
            actor_critic, state.params, rollout, config.gamma, config.gae_lambda
        )
        batch = onpolicy.flatten_time({
            "observation": rollout.observation, "action": rollout.action, "advantage": advantages, "target": targets,
        })
        grads, (metrics, quant_ranges) = grad_fn(state.params, state.quant_ranges, batch)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        state = TrainState(
            quant_ranges=quant_ranges,
            params=optax.apply_updates(state.params, updates),
            opt_state=opt_state,
            key=state.key,
            updates=state.updates + 1,
            iterations=state.iterations + 1,
        )
        return state, metrics

    return update
