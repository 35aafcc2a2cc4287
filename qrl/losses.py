"""Per-transition losses with time-indexed names, vmapped over the batch (rlax style).

`q_tm1` are values at the previous time step, `a_tm1` the action taken, `r_t`/`discount_t`
the reward and bootstrap multiplier that followed, `q_t` values at the next time step.
"""

import chex
import jax
import jax.numpy as jnp


def huber(x: jax.Array, delta: float = 1.0) -> jax.Array:
    """Huber loss: quadratic within `delta`, linear outside (SB3's smooth L1 at delta 1)."""
    abs_x = jnp.abs(x)
    quadratic = jnp.minimum(abs_x, delta)
    return 0.5 * quadratic**2 + delta * (abs_x - quadratic)


def double_q_learning_td(
    q_tm1: jax.Array,
    a_tm1: jax.Array,
    r_t: jax.Array,
    discount_t: jax.Array,
    q_t_value: jax.Array,
    q_t_selector: jax.Array,
) -> jax.Array:
    """Double Q-learning TD error for one transition (van Hasselt et al., 2016).

    Shapes: `q_tm1, q_t_value, q_t_selector [A]`, scalars otherwise. The online network
    (`q_t_selector`) picks the next action, the target network (`q_t_value`) values it.
    """
    chex.assert_rank([q_tm1, a_tm1, r_t, discount_t, q_t_value, q_t_selector], [1, 0, 0, 0, 1, 1])
    target = r_t + discount_t * q_t_value[jnp.argmax(q_t_selector)]
    return jax.lax.stop_gradient(target) - q_tm1[a_tm1]


def q_learning_td(q_tm1: jax.Array, a_tm1: jax.Array, r_t: jax.Array, discount_t: jax.Array, q_t: jax.Array) -> jax.Array:
    """Q-learning TD error for one transition (Watkins; the DQN target with `q_t` from the
    target network). Shapes: `q_tm1, q_t [A]`, scalars otherwise."""
    chex.assert_rank([q_tm1, a_tm1, r_t, discount_t, q_t], [1, 0, 0, 0, 1])
    target = r_t + discount_t * jnp.max(q_t)
    return jax.lax.stop_gradient(target) - q_tm1[a_tm1]


batched_double_q_learning_td = jax.vmap(double_q_learning_td)
batched_q_learning_td = jax.vmap(q_learning_td)


def generalized_advantage_estimation(
    r_t: jax.Array,
    discount_t: jax.Array,
    done_t: jax.Array,
    v_tm1: jax.Array,
    v_t: jax.Array,
    lambda_: float,
) -> jax.Array:
    """Generalized advantage estimates (Schulman et al., 2016) of `[T, B]` rollouts.

    Row t is one step of B environments: the agent acted in a state valued `v_tm1[t]`, got
    `r_t[t]` and reached a state valued `v_t[t]` — on episode ends that is the *final*
    observation's value, before auto-reset. `discount_t` is γ times the environment's discount
    (0 on termination, so only truncated episodes bootstrap from `v_t`); `done_t` is 1 where an
    episode ended in that step (terminated or truncated), which stops the λ-trace there (the
    next row belongs to another episode). One reverse `lax.scan` over T, all B at once:

        δ_t = r_t + discount_t · v_t − v_tm1
        A_t = δ_t + discount_t · λ · (1 − done_t) · A_{t+1},   A_T = 0

    Returns advantages `[T, B]` (no gradient); value targets are `advantages + v_tm1`.
    """
    chex.assert_rank([r_t, discount_t, done_t, v_tm1, v_t], 2)
    chex.assert_equal_shape([r_t, discount_t, done_t, v_tm1, v_t])
    deltas = r_t + discount_t * v_t - v_tm1
    trace_t = discount_t * lambda_ * (1.0 - done_t.astype(deltas.dtype))

    def backward(next_advantage, step):
        delta, trace = step
        advantage = delta + trace * next_advantage
        return advantage, advantage

    _, advantages = jax.lax.scan(backward, jnp.zeros_like(deltas[0]), (deltas, trace_t), reverse=True)
    return jax.lax.stop_gradient(advantages)


def policy_gradient_loss(log_prob_t: jax.Array, adv_t: jax.Array) -> jax.Array:
    """−log π(a_t|s_t) · A_t for one transition (advantage actor-critic, Mnih et al., 2016);
    the advantage carries no gradient. Scalars."""
    chex.assert_rank([log_prob_t, adv_t], 0)
    return -log_prob_t * jax.lax.stop_gradient(adv_t)


def ppo_clipped_surrogate_loss(
    log_prob_t: jax.Array, behaviour_log_prob_t: jax.Array, adv_t: jax.Array, epsilon: float
) -> jax.Array:
    """PPO's clipped surrogate for one transition, as a loss (Schulman et al., 2017, eq. 7):

        ρ = π(a_t|s_t) / π_old(a_t|s_t),   loss = −min(ρ·A_t, clip(ρ, 1−ε, 1+ε)·A_t)

    Scalars; gradients flow through `log_prob_t` only.
    """
    chex.assert_rank([log_prob_t, behaviour_log_prob_t, adv_t], 0)
    ratio = jnp.exp(log_prob_t - jax.lax.stop_gradient(behaviour_log_prob_t))
    adv_t = jax.lax.stop_gradient(adv_t)
    return -jnp.minimum(ratio * adv_t, jnp.clip(ratio, 1.0 - epsilon, 1.0 + epsilon) * adv_t)


def value_loss(v_tm1: jax.Array, return_tm1: jax.Array) -> jax.Array:
    """½ (G − v)² for one state with value target G (no gradient through G). Scalars."""
    chex.assert_rank([v_tm1, return_tm1], 0)
    return 0.5 * jnp.square(jax.lax.stop_gradient(return_tm1) - v_tm1)


def clipped_value_loss(v_tm1: jax.Array, behaviour_v_tm1: jax.Array, return_tm1: jax.Array, epsilon: float) -> jax.Array:
    """PPO's clipped value loss for one state (OpenAI baselines ppo2; CleanRL, PureJaxRL):

        v_clip = v_old + clip(v − v_old, −ε, ε),   loss = ½ max((v − G)², (v_clip − G)²)

    `behaviour_v_tm1` is the value the rollout's critic gave the state. Scalars.
    """
    chex.assert_rank([v_tm1, behaviour_v_tm1, return_tm1], 0)
    behaviour_v_tm1 = jax.lax.stop_gradient(behaviour_v_tm1)
    return_tm1 = jax.lax.stop_gradient(return_tm1)
    v_clipped = behaviour_v_tm1 + jnp.clip(v_tm1 - behaviour_v_tm1, -epsilon, epsilon)
    return 0.5 * jnp.maximum(jnp.square(v_tm1 - return_tm1), jnp.square(v_clipped - return_tm1))


batched_policy_gradient_loss = jax.vmap(policy_gradient_loss)
batched_ppo_clipped_surrogate_loss = jax.vmap(ppo_clipped_surrogate_loss, in_axes=(0, 0, 0, None))
batched_value_loss = jax.vmap(value_loss)
batched_clipped_value_loss = jax.vmap(clipped_value_loss, in_axes=(0, 0, 0, None))
