"""Action distributions against hand-computed values."""

import math

import jax
import jax.numpy as jnp
import numpy as np

from qrl import distributions as d


def test_categorical_log_prob_and_entropy():
    logits = jnp.log(jnp.array([[0.5, 0.25, 0.25]]))
    np.testing.assert_allclose(d.categorical_log_prob(logits, jnp.array([1])), [math.log(0.25)], rtol=1e-6)
    expected = -(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25))
    np.testing.assert_allclose(d.categorical_entropy(logits), [expected], rtol=1e-6)


def test_categorical_sample_frequencies_follow_the_probabilities():
    logits = jnp.log(jnp.array([0.7, 0.2, 0.1]))
    samples = d.categorical_sample(jax.random.PRNGKey(0), jnp.broadcast_to(logits, (20_000, 3)))
    assert samples.dtype == jnp.int32
    np.testing.assert_allclose(np.bincount(np.asarray(samples), minlength=3) / 20_000, [0.7, 0.2, 0.1], atol=0.015)


def test_gaussian_log_prob_and_entropy():
    mean, log_std, x = jnp.array([0.0, 1.0]), jnp.log(jnp.array([1.0, 2.0])), jnp.array([1.0, 0.0])
    # N(1; 0, 1): -0.5 - 0.5 log 2π;  N(0; 1, 4): -0.125 - log 2 - 0.5 log 2π.
    expected = (-0.5 - 0.5 * math.log(2 * math.pi)) + (-0.125 - math.log(2.0) - 0.5 * math.log(2 * math.pi))
    np.testing.assert_allclose(d.gaussian_log_prob(mean, log_std, x), expected, rtol=1e-6)
    expected_entropy = 2 * 0.5 * (1 + math.log(2 * math.pi)) + math.log(2.0)
    np.testing.assert_allclose(d.gaussian_entropy(log_std), expected_entropy, rtol=1e-6)


def test_tanh_gaussian_log_prob_matches_change_of_variables():
    mean, log_std = jnp.array([[0.3, -0.5]]), jnp.array([[-0.2, 0.1]])
    key = jax.random.PRNGKey(3)
    action, log_prob = d.tanh_gaussian_sample_and_log_prob(key, mean, log_std)
    pre_tanh = d.gaussian_sample(key, mean, log_std)
    np.testing.assert_allclose(action, np.tanh(pre_tanh), rtol=1e-6)
    naive = d.gaussian_log_prob(mean, log_std, pre_tanh) - jnp.sum(jnp.log(1 - jnp.tanh(pre_tanh) ** 2), -1)
    np.testing.assert_allclose(log_prob, naive, rtol=1e-5)
    assert np.all(np.abs(np.asarray(action)) < 1)


def test_scale_to_bounds_maps_unit_box_onto_the_spec():
    np.testing.assert_allclose(
        d.scale_to_bounds(jnp.array([-1.0, 0.0, 1.0]), jnp.array([-2.0, 0.0, 1.0]), jnp.array([2.0, 4.0, 3.0])),
        [-2.0, 2.0, 3.0],
    )
