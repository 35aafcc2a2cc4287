"""Categorical return distributions (Bellemare et al., 2017, "A Distributional Perspective on
Reinforcement Learning"): a fixed support of atoms, the L2 projection of a shifted and scaled
distribution back onto it, and the cross-entropy loss D4PG trains its critic with.

Per-transition functions with time-indexed names, vmapped over the batch, as rlax does.
"""

import chex
import jax
import jax.numpy as jnp


def atoms(v_min: float, v_max: float, num_atoms: int) -> jax.Array:
    """The evenly spaced support `z [num_atoms]` from `v_min` to `v_max` (both included)."""
    if num_atoms < 2:
        raise ValueError(f"a categorical support needs at least 2 atoms, got {num_atoms}")
    if not v_min < v_max:
        raise ValueError(f"v_min must be below v_max, got {v_min} and {v_max}")
    return jnp.linspace(v_min, v_max, num_atoms, dtype=jnp.float32)


def categorical_l2_project(z_p: jax.Array, probs: jax.Array, z_q: jax.Array) -> jax.Array:
    """Projects the distribution (`z_p [N]` atoms, `probs [N]`) onto the support `z_q [M]`.

    `z_q` must be increasing (not necessarily evenly spaced). Atoms of `z_p` are clipped into
    `[z_q[0], z_q[-1]]`; each then splits its probability between its two neighbouring support
    atoms in proportion to closeness (the Cramér/L2 projection of Bellemare et al., 2017, eq. 7;
    rlax's `categorical_l2_project`). Inside the support the mean is preserved exactly.

    Returns the projected probabilities `[M]`.
    """
    chex.assert_rank([z_p, probs, z_q], 1)
    chex.assert_equal_shape([z_p, probs])
    v_min, v_max = z_q[0], z_q[-1]
    z_p = jnp.clip(z_p, v_min, v_max)
    # Gaps to each support atom's right and left neighbours ([M]); an edge atom has no
    # neighbour on one side, and a zero inverse gap there gives the full weight (1 - 0).
    gap_right = jnp.concatenate([z_q[1:] - z_q[:-1], jnp.zeros((1,), z_q.dtype)])
    gap_left = jnp.concatenate([jnp.zeros((1,), z_q.dtype), z_q[1:] - z_q[:-1]])
    inv_right = jnp.where(gap_right > 0, 1.0 / jnp.where(gap_right > 0, gap_right, 1.0), 0.0)
    inv_left = jnp.where(gap_left > 0, 1.0 / jnp.where(gap_left > 0, gap_left, 1.0), 0.0)
    delta = z_p[None, :] - z_q[:, None]  # [M, N]: how far each source atom lies from each target.
    scaled = jnp.where(delta >= 0, delta * inv_right[:, None], -delta * inv_left[:, None])
    weights = jnp.clip(1.0 - scaled, 0.0, 1.0)  # [M, N]: the share of source atom j at target i.
    return jnp.sum(weights * probs[None, :], axis=-1)


def categorical_td_target(r_t: jax.Array, discount_t: jax.Array, probs_t: jax.Array, z: jax.Array) -> jax.Array:
    """The projected target distribution `[M]` of `r_t + discount_t * Z_t` on the support `z [M]`.

    `r_t` and `discount_t` are scalars (for n-step transitions: the discounted reward sum and
    gamma^n times the environment discounts); `probs_t [M]` is the next state's distribution.
    """
    chex.assert_rank([r_t, discount_t, probs_t, z], [0, 0, 1, 1])
    return categorical_l2_project(r_t + discount_t * z, probs_t, z)


def categorical_cross_entropy(logits_tm1: jax.Array, target_probs: jax.Array) -> jax.Array:
    """`-sum(target * log softmax(logits))` for one transition: `logits [M]`, `target [M]` -> `[]`.

    The target is a constant (its gradient is stopped).
    """
    chex.assert_rank([logits_tm1, target_probs], 1)
    chex.assert_equal_shape([logits_tm1, target_probs])
    target_probs = jax.lax.stop_gradient(target_probs)
    return -jnp.sum(target_probs * jax.nn.log_softmax(logits_tm1))


def batched_categorical_loss(
    logits_tm1: jax.Array, r_t: jax.Array, discount_t: jax.Array, logits_t: jax.Array, z: jax.Array
) -> jax.Array:
    """Per-transition distributional TD losses `[B]`: cross-entropy of `logits_tm1 [B, M]`
    against the projection of `r_t [B] + discount_t [B] * z` under `softmax(logits_t) [B, M]`."""
    chex.assert_rank([logits_tm1, r_t, discount_t, logits_t, z], [2, 1, 1, 2, 1])
    probs_t = jax.nn.softmax(logits_t, axis=-1)
    targets = jax.vmap(categorical_td_target, in_axes=(0, 0, 0, None))(r_t, discount_t, probs_t, z)
    return jax.vmap(categorical_cross_entropy)(logits_tm1, targets)


def mean(logits: jax.Array, z: jax.Array) -> jax.Array:
    """Expected value `[...]` of categorical distributions given by `logits [..., M]` on `z [M]`."""
    return jnp.sum(jax.nn.softmax(logits, axis=-1) * z, axis=-1)
