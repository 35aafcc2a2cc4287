"""Training with a fixed mask: a masked optax transform, masked Polyak averaging, mask storage."""

from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax

from pruning.masks import apply_mask, check_mask
from qrl.errors import QrlInputError


def masked(inner: optax.GradientTransformation, mask: Any) -> optax.GradientTransformationExtraArgs:
    """`inner` restricted to the kept weights of `mask` (a mask pytree, see `pruning.masks`).

    Gradients of pruned weights are zeroed before `inner` and its updates zeroed after, so params
    that start masked (`apply_mask`) keep pruned weights exactly 0, and state that starts at zero
    (Adam's mu and nu) stays exactly 0 for them. State that starts elsewhere (an Adagrad initial
    accumulator) keeps its initial value there, which never reaches the params. Works in `jit`,
    inside or around `optax.chain` (clipping then sees the masked gradients; adamw's decay of a
    pruned weight is decay of 0). The mask is a constant of the transform.
    """
    inner = optax.with_extra_args_support(inner)
    mask = jax.tree.map(jnp.asarray, mask)

    def init_fn(params):
        check_mask(params, mask)
        return inner.init(params)

    def update_fn(updates, state, params=None, **extra_args):
        updates, state = inner.update(apply_mask(updates, mask), state, params, **extra_args)
        return apply_mask(updates, mask), state

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def polyak_masked(online: Any, target: Any, tau: float, mask: Any) -> Any:
    """`apply_mask(tau * online + (1 - tau) * target, mask)`: target networks share their online
    network's mask, so the average stays exactly as sparse as the online params."""
    return apply_mask(optax.incremental_update(online, target, tau), mask)


def _key_name(key: Any) -> str:
    return jax.tree_util.keystr((key,), simple=True, separator="/")


def mask_to_arrays(mask: Any) -> dict:
    """Mask -> nested dict of uint8 arrays (0 pruned, 1 kept) holding only the prunable leaves,
    under the params' keys; `None` leaves (and subtrees with none) are absent. msgpack and orbax
    store it as is; `mask_from_arrays` inverts it."""
    arrays: dict = {}
    for path, kept in jax.tree_util.tree_flatten_with_path(mask)[0]:
        node = arrays
        for key in path[:-1]:
            node = node.setdefault(_key_name(key), {})
        node[_key_name(path[-1])] = np.asarray(kept, np.uint8)
    return arrays


def mask_from_arrays(arrays: Mapping, params: Any) -> Any:
    """Stored arrays (`mask_to_arrays`'s layout, uint8 or bool) -> a mask shaped like `params`:
    bool where an array is stored, `None` elsewhere. Raises QrlInputError on a mismatch."""
    stored = {
        tuple(_key_name(key) for key in path): np.asarray(value)
        for path, value in jax.tree_util.tree_flatten_with_path(arrays)[0]
    }
    flat, treedef = jax.tree_util.tree_flatten_with_path(params)
    leaves = []
    for path, leaf in flat:
        keys = tuple(_key_name(key) for key in path)
        value = stored.pop(keys, None)
        if value is not None and value.shape != np.shape(leaf):
            name, shape = "/".join(keys), np.shape(leaf)
            message = f"{name} has shape {shape}, stored mask {value.shape}"
            raise QrlInputError(f"stored mask does not match params: {message}")
        leaves.append(None if value is None else jnp.asarray(value != 0))
    if stored:
        name = "/".join(next(iter(stored)))
        raise QrlInputError(f"stored mask does not match params: it has {name}, which the params lack")
    return jax.tree.unflatten(treedef, leaves)
