"""Action distributions as small pure functions: categorical, diagonal Gaussian, tanh-Gaussian.

Written here rather than taken from distrax / TFP: distrax pins an older JAX API and TFP's JAX
substrate pulls TensorFlow-probability nightlies; these few formulas are all the agents need.
Shapes: logits `[..., A]`, discrete actions `[...]` int; means / log-stds / actions `[..., D]`;
log-probs and entropies `[...]` (summed over the action dimensions).
"""

import math

import jax
import jax.numpy as jnp

_LOG_2PI = math.log(2.0 * math.pi)


def categorical_log_prob(logits: jax.Array, actions: jax.Array) -> jax.Array:
    """log π(a) for integer actions `[...]` under `logits [..., A]`."""
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    return jnp.take_along_axis(log_probs, actions.astype(jnp.int32)[..., None], axis=-1)[..., 0]


def categorical_entropy(logits: jax.Array) -> jax.Array:
    """H(π) = -Σ p log p over the last axis."""
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)


def categorical_sample(key: jax.Array, logits: jax.Array) -> jax.Array:
    """Samples int32 actions `[...]` from `logits [..., A]`."""
    return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


def gaussian_log_prob(mean: jax.Array, log_std: jax.Array, x: jax.Array) -> jax.Array:
    """log N(x; mean, exp(log_std)²) of a diagonal Gaussian, summed over the last axis."""
    z = (x - mean) * jnp.exp(-log_std)
    return jnp.sum(-0.5 * jnp.square(z) - log_std - 0.5 * _LOG_2PI, axis=-1)


def gaussian_entropy(log_std: jax.Array) -> jax.Array:
    """Entropy of a diagonal Gaussian, summed over the last axis: Σ (log σ + ½ log 2πe)."""
    return jnp.sum(log_std + 0.5 * (_LOG_2PI + 1.0), axis=-1)


def gaussian_sample(key: jax.Array, mean: jax.Array, log_std: jax.Array) -> jax.Array:
    """mean + σ·ε with ε ~ N(0, I); `log_std` broadcasts against `mean`."""
    return mean + jnp.exp(log_std) * jax.random.normal(key, jnp.shape(mean), jnp.result_type(mean))


def tanh_log_det_jacobian(pre_tanh: jax.Array) -> jax.Array:
    """log |d tanh(u)/du| summed over the last axis, in the stable form 2(log 2 - u - softplus(-2u))."""
    return jnp.sum(2.0 * (math.log(2.0) - pre_tanh - jax.nn.softplus(-2.0 * pre_tanh)), axis=-1)


def tanh_gaussian_sample_and_log_prob(key: jax.Array, mean: jax.Array, log_std: jax.Array) -> tuple[jax.Array, jax.Array]:
    """A sample a = tanh(u), u ~ N(mean, σ²), in (-1, 1)^D, and its log-density (Haarnoja et al.
    2018, appendix C: log π(a) = log N(u) - Σ log(1 - tanh²(u))), reparameterized."""
    pre_tanh = gaussian_sample(key, mean, log_std)
    log_prob = gaussian_log_prob(mean, log_std, pre_tanh) - tanh_log_det_jacobian(pre_tanh)
    return jnp.tanh(pre_tanh), log_prob


def tanh_gaussian_mode(mean: jax.Array) -> jax.Array:
    """The deterministic action of a tanh-Gaussian policy: tanh(mean)."""
    return jnp.tanh(mean)


def scale_to_bounds(unit_actions: jax.Array, minimum: jax.Array, maximum: jax.Array) -> jax.Array:
    """Maps actions in [-1, 1] onto [minimum, maximum] per dimension."""
    return minimum + (unit_actions + 1.0) * 0.5 * (maximum - minimum)
