"""TD losses against hand-computed values."""

import jax.numpy as jnp
import numpy as np
import pytest

from qrl import losses


def test_huber_quadratic_inside_linear_outside():
    np.testing.assert_allclose(losses.huber(jnp.array([0.5, -2.0, 3.0])), [0.125, 1.5, 2.5])
    np.testing.assert_allclose(losses.huber(jnp.array([3.0]), delta=2.0), [4.0])  # 0.5*4 + 2*(3-2)


def test_double_q_learning_uses_online_argmax_and_target_value():
    q_tm1 = jnp.array([1.0, 2.0, 3.0])
    q_t_value = jnp.array([10.0, 20.0, 30.0])  # target network
    q_t_selector = jnp.array([5.0, 0.0, 1.0])  # online network picks action 0
    td = losses.double_q_learning_td(q_tm1, jnp.array(1), jnp.array(0.5), jnp.array(0.9), q_t_value, q_t_selector)
    np.testing.assert_allclose(td, 0.5 + 0.9 * 10.0 - 2.0)


def test_q_learning_uses_max_of_target():
    td = losses.q_learning_td(jnp.array([1.0, 2.0]), jnp.array(0), jnp.array(1.0), jnp.array(0.0), jnp.array([7.0, 9.0]))
    np.testing.assert_allclose(td, 1.0 - 1.0)  # terminal: no bootstrap


def test_batched_losses_and_rank_checks():
    q = jnp.array([[1.0, 2.0], [3.0, 4.0]])
    td = losses.batched_double_q_learning_td(q, jnp.array([0, 1]), jnp.array([1.0, 0.0]), jnp.array([1.0, 0.5]), q, q)
    np.testing.assert_allclose(td, [1.0 + 2.0 - 1.0, 0.0 + 0.5 * 4.0 - 4.0])
    with pytest.raises(AssertionError):
        losses.double_q_learning_td(q, jnp.array(0), jnp.array(1.0), jnp.array(1.0), q[0], q[0])
