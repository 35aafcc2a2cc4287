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
