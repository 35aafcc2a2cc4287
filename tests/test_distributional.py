"""Categorical distributions: the L2 projection and D4PG's loss against hand-computed values."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from qrl import distributional

SUPPORT = jnp.array([0.0, 1.0, 2.0])


class ProjectionTest(parameterized.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.named_parameters(
        # One atom halfway between two support atoms splits evenly.
        ("between", [0.5], [1.0], [0.5, 0.5, 0.0]),
        # -1 clips to 0 and 2.5 to 2; 1.25 gives 0.75 to atom 1 and 0.25 to atom 2:
        # [0.2, 0.5 * 0.75, 0.3 + 0.5 * 0.25].
        ("clip_and_split", [-1.0, 2.5, 1.25], [0.2, 0.3, 0.5], [0.2, 0.375, 0.425]),
        ("on_atoms", [0.0, 1.0, 2.0], [0.1, 0.6, 0.3], [0.1, 0.6, 0.3]),
    )
    def test_hand_computed(self, z_p, probs, expected):
        project = self.variant(distributional.categorical_l2_project)
        np.testing.assert_allclose(project(jnp.array(z_p), jnp.array(probs), SUPPORT), expected, atol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_uneven_support(self):
        # 2 lies between 1 and 3 (gap 2): weights 1 - 1/2 at each neighbour.
        project = self.variant(distributional.categorical_l2_project)
        result = project(jnp.array([2.0]), jnp.array([1.0]), jnp.array([0.0, 1.0, 3.0]))
        np.testing.assert_allclose(result, [0.0, 0.5, 0.5], atol=1e-6)


def test_projection_preserves_mass_and_mean_inside_the_support():
    key_atoms, key_probs = jax.random.split(jax.random.PRNGKey(0))
    z = distributional.atoms(-10.0, 10.0, 21)
    z_p = jax.random.uniform(key_atoms, (7,), minval=-9.5, maxval=9.5)
    probs = jax.nn.softmax(jax.random.normal(key_probs, (7,)))
    projected = distributional.categorical_l2_project(z_p, probs, z)
    np.testing.assert_allclose(jnp.sum(projected), 1.0, rtol=1e-5)
    np.testing.assert_allclose(jnp.sum(projected * z), jnp.sum(probs * z_p), rtol=1e-5, atol=1e-5)
    assert bool(jnp.all(projected >= 0))


def test_td_target_shifts_and_scales_the_next_distribution():
    # r + 0.5 * z with all mass on z = 0 lands at 0.25: 0.75 on atom 0, 0.25 on atom 1.
    target = distributional.categorical_td_target(jnp.array(0.25), jnp.array(0.5), jnp.array([1.0, 0.0, 0.0]), SUPPORT)
    np.testing.assert_allclose(target, [0.75, 0.25, 0.0], atol=1e-6)
    # A terminal transition (discount 0) puts all mass at the reward.
    target = distributional.categorical_td_target(jnp.array(1.0), jnp.array(0.0), jnp.array([0.2, 0.3, 0.5]), SUPPORT)
    np.testing.assert_allclose(target, [0.0, 1.0, 0.0], atol=1e-6)


def test_cross_entropy_and_batched_loss():
    np.testing.assert_allclose(
        distributional.categorical_cross_entropy(jnp.zeros(2), jnp.array([1.0, 0.0])), np.log(2.0), rtol=1e-6
    )
    logits_tm1 = jnp.array([[0.0, 0.0, 0.0], [1.0, 2.0, 3.0]])
    logits_t = jnp.array([[0.0, -1e9, -1e9], [0.0, 0.0, 0.0]])  # row 0: all mass on atom 0
    losses = distributional.batched_categorical_loss(
        logits_tm1, jnp.array([0.25, 5.0]), jnp.array([0.5, 0.0]), logits_t, SUPPORT
    )
    log_softmax = jax.nn.log_softmax(logits_tm1, axis=-1)
    expected = [-(0.75 * log_softmax[0, 0] + 0.25 * log_softmax[0, 1]), -log_softmax[1, 2]]  # row 1 clips to 2
    np.testing.assert_allclose(losses, expected, rtol=1e-5)
    def total_loss(logits):
        return jnp.sum(distributional.batched_categorical_loss(logits, jnp.zeros(2), jnp.ones(2), logits, SUPPORT))

    grads = jax.grad(total_loss)(logits_tm1)
    # The target is a constant: the gradient is softmax(logits) - target, rows summing to 0.
    np.testing.assert_allclose(jnp.sum(grads, axis=-1), 0.0, atol=1e-6)


def test_mean_and_atoms():
    np.testing.assert_allclose(distributional.atoms(-1.0, 1.0, 5), [-1.0, -0.5, 0.0, 0.5, 1.0])
    np.testing.assert_allclose(distributional.mean(jnp.zeros(3), SUPPORT), 1.0, rtol=1e-6)
    with pytest.raises(ValueError):
        distributional.atoms(1.0, 0.0, 5)
    with pytest.raises(AssertionError):
        distributional.categorical_l2_project(jnp.zeros((2, 3)), jnp.zeros((2, 3)), SUPPORT)
