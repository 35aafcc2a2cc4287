"""D4PG learning (Barth-Maron et al., 2018) as Acme's learner computes it: a deterministic actor,
a categorical critic over `num_atoms` atoms on [v_min, v_max], n-step targets projected onto the
support (Bellemare et al., 2017), and target networks; K updates fused per jitted call.

One update computes both losses from the same (pre-update) parameters, as Acme does:
- critic: cross-entropy between `Z(s, a)` and the projection of `r + discount * Z'(s', mu'(s'))`
  (`r` the n-step reward sum, `discount` gamma^n times the environment discounts);
- actor: the deterministic policy gradient through the critic's mean, `dQ/da` clipped to
  `[-dqda_clipping, dqda_clipping]` (rlax's `dpg_loss`).
Each network's gradient is clipped to a global norm of `max_grad_norm` when it is positive (Acme's
TF D4PG with `clipping=True`: 40). Every `target_update_period` updates the targets move by `tau` (1: a hard copy).
"""

from typing import Optional

import jax
import jax.numpy as jnp
import optax

from agents.d4pg.config import Config
from qrl import distributional, offpolicy
from qrl.networks.continuous import Critic, DeterministicActor, compute_params
from qrl.quant import FP32, Precision, apply_tracking
from qrl.replay import Transition


TrainState = offpolicy.DeterministicTrainState  # actor, critic, targets, optimizer states.


training_precision = offpolicy.training_precision  # the config's matmul_dtype: fp32 or bf16.


def make_actor(config: Config, bounds, precision: Precision = FP32) -> DeterministicActor:
    """The actor at `precision`: observations -> actions in environment units (the policy)."""
    low, high = bounds
    return DeterministicActor(low, high, tuple(config.actor_hidden_sizes), precision, config.architecture)


def make_critic(config: Config, bounds, precision: Precision = FP32) -> Critic:
    """The categorical critic: `(observations, actions) -> logits [B, num_atoms]`."""
    low, high = bounds
    return Critic(low, high, tuple(config.critic_hidden_sizes), precision, config.num_atoms, config.architecture)


def init(key: jax.Array, config: Config, observation_size: int, bounds) -> TrainState:
    """A fresh train state; targets start as copies of the online networks."""
    actor, critic = make_actor(config, bounds), make_critic(config, bounds)
    observations = jnp.zeros((1, observation_size), jnp.float32)
    actions = jnp.zeros((1, len(bounds[0])), jnp.float32)
    optimizer = offpolicy.adam(config.learning_rate, config.flat_optimizer, config.max_grad_norm)

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
            actor_opt_state=optimizer.init(actor_params),
            critic_opt_state=optimizer.init(critic_params),
            updates=jnp.zeros((), jnp.int32),
            quant_ranges=offpolicy.init_quant_ranges(config, make_actor, bounds, actor_key, observations),
        )

    return fresh_state(key)


def dpg_loss(actions: jax.Array, dqda: jax.Array, clipping: float) -> jax.Array:
    """rlax's `dpg_loss` per transition: `0.5 * sum((sg(a + clip(dq/da)) - a)^2)` over the action
    axis, whose gradient in `a` is `-clip(dq/da)`. `actions`, `dqda`: `[B, A]` -> `[B]`."""
    if clipping > 0:
        dqda = jnp.clip(dqda, -clipping, clipping)
    target = jax.lax.stop_gradient(actions + dqda)
    return 0.5 * jnp.sum(jnp.square(target - actions), axis=-1)


def make_weighted_one_update(config: Config, bounds, actor_precision: Optional[Precision] = None):
    """`one_update(state, batch [B, ...], weights [B] or None) -> (state, metrics, priorities [B])`:
    one update of both networks, each transition's critic loss scaled by its importance weight
    (prioritized replay); the priorities are the per-transition critic losses.

    The critic computes at the config's `matmul_dtype`; the actor at `actor_precision` (None:
    the same; the QAT precision during quantization-aware training). The target actor always
    runs at the training precision.
    """
    precision = training_precision(config)
    actor_precision = actor_precision or precision
    actor = make_actor(config, bounds, actor_precision)
    target_actor = make_actor(config, bounds, precision)
    critic = make_critic(config, bounds, precision)
    optimizer = offpolicy.adam(config.learning_rate, config.flat_optimizer, config.max_grad_norm)
    atoms = distributional.atoms(config.v_min, config.v_max, config.num_atoms)

    def logits(critic_params, observations, actions):
        return critic.apply({"params": compute_params(critic_params, precision)}, observations, actions)

    def critic_loss(critic_params, target_logits, batch: Transition, weights):
        logits_tm1 = logits(critic_params, batch.observation, batch.action)
        losses = distributional.batched_categorical_loss(logits_tm1, batch.reward, batch.discount, target_logits, atoms)
        weighted = losses if weights is None else weights * losses
        return jnp.mean(weighted), (jnp.mean(distributional.mean(logits_tm1, atoms)), losses)

    def actor_loss(actor_params, critic_params, observations, quant_ranges):
        params = compute_params(actor_params, actor_precision)
        actions, quant_ranges = apply_tracking(actor, params, quant_ranges, observations)
        q_sum = lambda a: jnp.sum(distributional.mean(logits(critic_params, observations, a), atoms))
        dqda = jax.grad(q_sum)(actions)  # rows are independent: the sum's gradient is per-row dQ/da.
        return jnp.mean(dpg_loss(actions, dqda, config.dqda_clipping)), quant_ranges

    def one_update(state: TrainState, batch: Transition, weights):
        next_actions = target_actor.apply(
            {"params": compute_params(state.target_actor_params, precision)}, batch.next_observation
        )
        target_logits = jax.lax.stop_gradient(logits(state.target_critic_params, batch.next_observation, next_actions))
        (critic_value, (q_mean, priorities)), critic_grads = jax.value_and_grad(critic_loss, has_aux=True)(
            state.critic_params, target_logits, batch, weights
        )
        (actor_value, quant_ranges), actor_grads = jax.value_and_grad(actor_loss, has_aux=True)(
            state.actor_params, state.critic_params, batch.observation, state.quant_ranges
        )
        critic_params, critic_opt_state = offpolicy.apply_gradients(
            optimizer, state.critic_params, critic_grads, state.critic_opt_state
        )
        actor_params, actor_opt_state = offpolicy.apply_gradients(
            optimizer, state.actor_params, actor_grads, state.actor_opt_state
        )
        count = state.updates + 1
        online, targets = (actor_params, critic_params), (state.target_actor_params, state.target_critic_params)
        target_actor_params, target_critic_params = optax.periodic_update(
            offpolicy.polyak(online, targets, config.tau), targets, count, config.target_update_period
        )
        new_state = TrainState(
            actor_params=actor_params,
            critic_params=critic_params,
            target_actor_params=target_actor_params,
            target_critic_params=target_critic_params,
            actor_opt_state=actor_opt_state,
            critic_opt_state=critic_opt_state,
            updates=count,
            quant_ranges=quant_ranges,
        )
        return new_state, {"critic_loss": critic_value, "actor_loss": actor_value, "q_mean": q_mean}, priorities

    return one_update


def make_update(config: Config, bounds, actor_precision: Optional[Precision] = None):
    """`update(state, batches [K, B, ...]) -> (state, metrics)` (pure; the loops jit it): K
    unweighted updates of `make_weighted_one_update` under one `lax.scan`."""
    one_update = make_weighted_one_update(config, bounds, actor_precision)
    return offpolicy.fuse(lambda state, batch: one_update(state, batch, None)[:2])
