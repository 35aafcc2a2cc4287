"""PPO learning: the clipped-surrogate loss and one fused update per rollout.

`update(state, rollout [T, N])` computes GAE advantages with the rollout's critic, then runs
`num_epochs` passes of `num_minibatches` shuffled minibatches as two nested `lax.scan`s —
every gradient step of the iteration in one (jitted) call.
"""

from typing import Callable

import jax
import jax.numpy as jnp
import optax
from dm_env import specs

from agents.ppo.config import Config
from agents.ppo.networks import make_actor_critic
from qrl import losses, onpolicy
from qrl.onpolicy import ActorCritic, Rollout, TrainState
from qrl.quant import FP32, Precision


def make_optimizer(config: Config, num_iterations: int = 1) -> optax.GradientTransformation:
    """Adam with global-norm gradient clipping; a `linear` schedule decays the learning rate to
    0 over `num_iterations` rollouts (constant within a rollout's epochs). The state's
    structure does not depend on `num_iterations`."""
    learning_rate = config.learning_rate
    if config.learning_rate_schedule == "linear":
        learning_rate = onpolicy.linear_decay(
            config.learning_rate, num_iterations, config.num_epochs * config.num_minibatches
        )
    optimizer = optax.chain(
        optax.clip_by_global_norm(config.max_grad_norm),
        optax.adam(learning_rate, eps=config.adam_eps),
    )
    return optax.flatten(optimizer) if config.flat_optimizer else optimizer


def init(key: jax.Array, config: Config, observation_spec: specs.Array, action_spec: specs.Array) -> TrainState:
    """A fresh train state for these specs."""
    actor_critic = make_actor_critic(config, observation_spec, action_spec)
    qat_actor = onpolicy.make_qat_actor(make_actor_critic, config, observation_spec, action_spec)
    return onpolicy.init_state(key, actor_critic, make_optimizer(config), observation_spec, qat_actor)


def make_loss(actor_critic: ActorCritic, config: Config) -> Callable[..., tuple[jax.Array, tuple[dict, dict]]]:
    """`loss(params, quant_ranges, batch, clip_range) -> (loss, (metrics, quant_ranges))` on a
    minibatch `[B]` with fields observation, action, log_prob (acting policy), advantage,
    target (value targets) and value (the rollout critic's values, for value clipping).
    `quant_ranges`: the QAT actor's input ranges, returned moved towards the minibatch's
    (`{}` without QAT)."""

    def loss(params, quant_ranges, batch, clip_range):
        log_prob, entropy, quant_ranges = actor_critic.log_prob_entropy_and_ranges(
            params, quant_ranges, batch["observation"], batch["action"]
        )
        advantage = batch["advantage"]
        if config.normalize_advantage:
            advantage = (advantage - jnp.mean(advantage)) / (jnp.std(advantage) + 1e-8)
        policy_loss = jnp.mean(
            losses.batched_ppo_clipped_surrogate_loss(log_prob, batch["log_prob"], advantage, clip_range)
        )
        values = actor_critic.value(params, batch["observation"])
        if config.clip_range_vf > 0:
            value_loss = jnp.mean(
                losses.batched_clipped_value_loss(values, batch["value"], batch["target"], config.clip_range_vf)
            )
        else:
            value_loss = jnp.mean(losses.batched_value_loss(values, batch["target"]))
        entropy = jnp.mean(entropy)
        total = policy_loss + config.vf_coef * value_loss - config.ent_coef * entropy
        log_ratio = log_prob - batch["log_prob"]
        ratio = jnp.exp(log_ratio)
        metrics = {
            "loss": total,
            "policy_loss": policy_loss,
            "value_loss": value_loss,
            "entropy": entropy,
            "approx_kl": jnp.mean(ratio - 1.0 - log_ratio),  # Schulman's k3 estimator (SB3).
            "clip_fraction": jnp.mean((jnp.abs(ratio - 1.0) > clip_range).astype(jnp.float32)),
        }
        return total, (metrics, quant_ranges)

    return loss


def clip_range_at(config: Config, iteration: jax.Array, num_iterations: int) -> jax.Array:
    """The clip ε for this iteration: constant, or linearly decayed to 0 over the run."""
    if config.clip_range_schedule == "constant":
        return jnp.asarray(config.clip_range, jnp.float32)
    return onpolicy.linear_decay(config.clip_range, num_iterations)(iteration)


def make_update(
    config: Config,
    observation_spec: specs.Array,
    action_spec: specs.Array,
    num_iterations: int = 1,
    policy_precision: Precision = FP32,
) -> Callable[[TrainState, Rollout], tuple[TrainState, dict]]:
    """`update(state, rollout [T, N]) -> (state, metrics averaged over the iteration)`, pure.

    The actor runs at `policy_precision` (fp32, or a `qat_precision(bits)` for QAT, whose
    input ranges `state.quant_ranges` move with every minibatch); the critic at fp32.
    `num_iterations` (rollouts in the run) sets the linear schedules' length.
    """
    actor_critic = make_actor_critic(config, observation_spec, action_spec, policy_precision)
    optimizer = make_optimizer(config, num_iterations)
    grad_fn = jax.grad(make_loss(actor_critic, config), has_aux=True)
    num_minibatches, batch_size = config.num_minibatches, config.batch_size

    def update(state: TrainState, rollout: Rollout):
        advantages, targets, values = onpolicy.advantages_and_returns(
            actor_critic, state.params, rollout, config.gamma, config.gae_lambda
        )
        data = onpolicy.flatten_time({
            "observation": rollout.observation, "action": rollout.action, "log_prob": rollout.log_prob,
            "advantage": advantages, "target": targets, "value": values,
        })
        clip_range = clip_range_at(config, state.iterations, num_iterations)

        def minibatch_step(carry, indices):
            params, opt_state, quant_ranges = carry
            batch = jax.tree.map(lambda x: jnp.take(x, indices, axis=0), data)
            grads, (metrics, quant_ranges) = grad_fn(params, quant_ranges, batch, clip_range)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state, quant_ranges), metrics

        def epoch(carry, key):
            order = jax.random.permutation(key, config.rollout_size)[: num_minibatches * batch_size]
            return jax.lax.scan(minibatch_step, carry, order.reshape(num_minibatches, batch_size))

        key, epochs_key = jax.random.split(state.key)
        (params, opt_state, quant_ranges), metrics = jax.lax.scan(
            epoch, (state.params, state.opt_state, state.quant_ranges), jax.random.split(epochs_key, config.num_epochs)
        )
        state = TrainState(
            quant_ranges=quant_ranges,
            params=params,
            opt_state=opt_state,
            key=key,
            updates=state.updates + config.num_epochs * num_minibatches,
            iterations=state.iterations + 1,
        )
        metrics = jax.tree.map(jnp.mean, metrics)
        metrics["clip_range"] = clip_range
        return state, metrics

    return update
