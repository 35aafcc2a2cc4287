"""How far a quantized policy's actions are from the fp32 policy's, as QuaRL reported.

All functions take outputs of the two policies on the same states, `[N, ...]`, and return
scalars averaged over states.
"""

import jax
import jax.numpy as jnp


def categorical_kl(logits_reference: jax.Array, logits_other: jax.Array, temperature: float = 1.0) -> jax.Array:
    """Mean KL(p_reference || p_other) of softmax(logits / temperature), logits `[N, A]`.

    For value-based agents the logits are Q-values (a Boltzmann policy); QuaRL measured the
    divergence of action distributions this way.
    """
    log_p = jax.nn.log_softmax(logits_reference.astype(jnp.float32) / temperature, axis=-1)
    log_q = jax.nn.log_softmax(logits_other.astype(jnp.float32) / temperature, axis=-1)
    return jnp.mean(jnp.sum(jnp.exp(log_p) * (log_p - log_q), axis=-1))


def greedy_agreement(logits_reference: jax.Array, logits_other: jax.Array) -> jax.Array:
    """Fraction of states `[N, A]` where both pick the same argmax action."""
    same = jnp.argmax(logits_reference, axis=-1) == jnp.argmax(logits_other, axis=-1)
    return jnp.mean(same.astype(jnp.float32))


def gaussian_kl(
    mean_reference: jax.Array, log_std_reference: jax.Array, mean_other: jax.Array, log_std_other: jax.Array
) -> jax.Array:
    """Mean KL between diagonal Gaussian policies, parameters `[N, D]`, summed over D."""
    var_reference = jnp.exp(2.0 * log_std_reference)
    var_other = jnp.exp(2.0 * log_std_other)
    per_dim = (
        log_std_other
        - log_std_reference
        + (var_reference + (mean_reference - mean_other) ** 2) / (2.0 * var_other)
        - 0.5
    )
    return jnp.mean(jnp.sum(per_dim, axis=-1))


def mean_action_distance(actions_reference: jax.Array, actions_other: jax.Array) -> jax.Array:
    """Mean Euclidean distance between deterministic actions `[N, D]`."""
    difference = actions_reference.astype(jnp.float32) - actions_other.astype(jnp.float32)
    return jnp.mean(jnp.linalg.norm(difference.reshape(difference.shape[0], -1), axis=-1))
