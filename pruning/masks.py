"""Masks from saliency scores, and the operations on masks.

A mask is a pytree shaped like the params: each prunable leaf is a bool array of the leaf's shape
(True = kept), each unprunable leaf is `None`. Scores have the same layout with float leaves.
`None` is an empty pytree node in JAX, so functions here pair masks with params by key path.
"""

import numbers
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from qrl.errors import QrlInputError

PRUNERS = ("snip", "grasp", "synflow", "magnitude", "random", "none")
SCOPES = ("network", "layer", "global")
KEEP = ("highest", "lowest")
MIN_KEPT_PER_LAYER = 1


def _is_none(node: Any) -> bool:
    return node is None


def _path_name(path: Sequence[Any]) -> str:
    return jax.tree_util.keystr(tuple(path), simple=True, separator="/")


def _named_leaves(tree: Any) -> list[tuple[str, Any]]:
    """`(path, leaf)` for every leaf of `tree`, `None` leaves included, in flattening order."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=_is_none)
    return [(_path_name(path), leaf) for path, leaf in flat]


def leaf_paths(tree: Any) -> list[str]:
    """'/'-joined key path of every leaf (e.g. "params/dense_0/kernel"), `None` leaves included."""
    return [name for name, _ in _named_leaves(tree)]


def check_pruner(name: str) -> str:
    """Returns `name` if it is one of `PRUNERS`, else raises QrlInputError naming them."""
    if name not in PRUNERS:
        raise QrlInputError(f"unknown pruner {name!r}; known: {', '.join(PRUNERS)}")
    return name


def check_sparsity(sparsity: float) -> float:
    """Returns `sparsity` (the fraction of prunable weights removed) as a float in [0, 1)."""
    if isinstance(sparsity, bool) or not isinstance(sparsity, numbers.Real) or not 0.0 <= sparsity < 1.0:
        raise QrlInputError(f"sparsity must be in [0, 1), got {sparsity}")
    return float(sparsity)


def check_min_kept_per_layer(min_kept_per_layer: int) -> int:
    """Returns the layer-collapse guard's minimum, an integer >= 0."""
    minimum = min_kept_per_layer
    if isinstance(minimum, bool) or not isinstance(minimum, numbers.Integral) or minimum < 0:
        raise QrlInputError(f"min_kept_per_layer must be an integer >= 0, got {minimum}")
    return int(minimum)


def kept_target(size: int, sparsity: float) -> int:
    """Weights kept out of `size` at `sparsity`: `round((1 - sparsity) * size)`."""
    return int(round((1.0 - sparsity) * size))


def _selection_order(scores: np.ndarray, keep: str) -> np.ndarray:
    """Indices of `scores [N]` from most to least deserving; ties go to the lower index."""
    return np.argsort(-scores if keep == "highest" else scores, kind="stable")


def _select(layer_scores: list[np.ndarray], total: int, keep: str, min_kept_per_layer: int) -> list[np.ndarray]:
    """Kept flags `[n_l]` per layer: the `total` best of the concatenation, after each layer's own
    best `min(min_kept_per_layer, n_l)` (the guard); the guard displaces the lowest-ranked others."""
    sizes = [scores.size for scores in layer_scores]
    order = _selection_order(np.concatenate(layer_scores), keep)
    layer_in_order = np.repeat(np.arange(len(sizes)), sizes)[order]
    chosen = np.zeros(order.size, bool)
    for layer, size in enumerate(sizes):
        chosen[np.flatnonzero(layer_in_order == layer)[: min(min_kept_per_layer, size)]] = True
    budget = total - int(chosen.sum())
    if budget > 0:
        chosen[np.flatnonzero(~chosen)[:budget]] = True
    kept = np.zeros(order.size, bool)
    kept[order[chosen]] = True
    return np.split(kept, np.cumsum(sizes)[:-1])


def _is_dict_of_networks(tree: Any) -> bool:
    return isinstance(tree, Mapping) and bool(tree) and all(isinstance(network, Mapping) for network in tree.values())


def masks_from_scores(
    scores: Any,
    sparsity: float,
    scope: str = "network",
    keep: str = "highest",
    min_kept_per_layer: int = MIN_KEPT_PER_LAYER,
) -> Any:
    """Mask keeping `round((1 - sparsity) * n)` weights by score; `None` score leaves stay `None`.

    `scope`: "network" — one ranking over all leaves of one network's `scores`; "layer" — each leaf
    on its own at `sparsity`; "global" — `scores` is `{name: network scores}`, one ranking spans
    them all, and the result is `{name: mask}`. `keep`: "highest" (SNIP, magnitude, SynFlow) or
    "lowest" (GraSP, which removes the largest scores). Ties go to the earlier weight in
    flattening order, so counts are exact and masks deterministic.

    Layer-collapse guard: every leaf keeps at least its `min_kept_per_layer` best weights; what
    the guard adds displaces the lowest-ranked weights of the ranking, so the total stays exact.
    When the guard's minimums alone exceed the target, each leaf keeps exactly its minimum and
    the total is their sum (more than the target).
    """
    sparsity = check_sparsity(sparsity)
    if scope not in SCOPES:
        raise QrlInputError(f"unknown mask scope {scope!r}; known: {', '.join(SCOPES)}")
    if keep not in KEEP:
        raise QrlInputError(f"keep must be one of {', '.join(KEEP)}, got {keep!r}")
    min_kept_per_layer = check_min_kept_per_layer(min_kept_per_layer)
    if scope == "global" and not _is_dict_of_networks(scores):
        raise QrlInputError("global mask scope takes a non-empty dict of networks {name: scores pytree}")
    flat, treedef = jax.tree.flatten(scores, is_leaf=_is_none)
    names = leaf_paths(scores)
    arrays = []
    for name, leaf in zip(names, flat):
        if leaf is None:
            continue
        array = np.asarray(leaf, np.float64)
        if not np.all(np.isfinite(array)):
            raise QrlInputError(f"scores of {name} are not all finite (NaN or inf)")
        arrays.append(array)
    if not arrays:
        raise QrlInputError("no prunable leaves: every score leaf is None")
    if scope == "layer":
        kept = [_select([a.ravel()], kept_target(a.size, sparsity), keep, min_kept_per_layer)[0] for a in arrays]
    else:
        total = kept_target(sum(a.size for a in arrays), sparsity)
        kept = _select([a.ravel() for a in arrays], total, keep, min_kept_per_layer)
    kept_leaves = iter(jnp.asarray(flags.reshape(a.shape)) for flags, a in zip(kept, arrays))
    return jax.tree.unflatten(treedef, [None if leaf is None else next(kept_leaves) for leaf in flat])


def _mask_leaves(params: Any, mask: Any, where: str) -> list[Any]:
    """The mask's leaves (bool arrays or None) in the order of `jax.tree.leaves(params)`."""
    by_path = dict(_named_leaves(mask))
    param_leaves = _named_leaves(params)
    mismatch = f"{where} does not match params:"
    extra = set(by_path) - {name for name, _ in param_leaves}
    if extra:
        raise QrlInputError(f"{mismatch} {where} has {sorted(extra)[0]}, which the params lack")
    leaves = []
    for name, leaf in param_leaves:
        if name not in by_path:
            raise QrlInputError(f"{mismatch} {name} is missing from the {where}")
        kept = by_path[name]
        if kept is not None:
            if getattr(kept, "dtype", None) != jnp.bool_:
                raise QrlInputError(f"{mismatch} {name} is {getattr(kept, 'dtype', type(kept).__name__)}, not bool")
            if tuple(kept.shape) != tuple(np.shape(leaf)):
                raise QrlInputError(f"{mismatch} {name} has shape {tuple(np.shape(leaf))}, {where} {tuple(kept.shape)}")
        leaves.append(kept)
    return leaves


def check_mask(params: Any, mask: Any, where: str = "mask") -> None:
    """Raises QrlInputError (one line, naming `where`) unless `mask` has the params' key paths,
    with bool leaves of each leaf's shape or `None`. Works on tracers (shapes only)."""
    _mask_leaves(params, mask, where)


def apply_mask(params: Any, mask: Any) -> Any:
    """Params with pruned entries set exactly to 0; leaves whose mask is `None` are unchanged."""
    leaves, treedef = jax.tree.flatten(params)
    masked = [
        leaf if kept is None else jnp.where(kept, leaf, jnp.zeros_like(leaf))
        for leaf, kept in zip(leaves, _mask_leaves(params, mask, "mask"))
    ]
    return jax.tree.unflatten(treedef, masked)


def kept_count(mask: Any) -> int:
    """Number of kept weights over the prunable (non-None) leaves."""
    return sum(int(np.count_nonzero(np.asarray(kept))) for kept in jax.tree.leaves(mask))


def prunable_count(mask: Any) -> int:
    """Number of weights in the prunable (non-None) leaves."""
    return sum(int(np.size(kept)) for kept in jax.tree.leaves(mask))


def kept_fraction(mask: Any) -> float:
    """Kept / prunable weights; 1.0 when nothing is prunable."""
    total = prunable_count(mask)
    return kept_count(mask) / total if total else 1.0


def layer_kept_fractions(mask: Any) -> dict[str, float]:
    """`{path: kept fraction}` for each prunable leaf, in flattening order."""
    return {
        name: float(np.count_nonzero(np.asarray(kept))) / max(int(np.size(kept)), 1)
        for name, kept in _named_leaves(mask)
        if kept is not None
    }


def mask_overlap(mask_a: Any, mask_b: Any) -> float:
    """Jaccard index |A ∩ B| / |A ∪ B| of the kept weights of two masks of the same params
    (1.0 when neither keeps anything)."""
    named_a, named_b = _named_leaves(mask_a), _named_leaves(mask_b)
    if [name for name, _ in named_a] != [name for name, _ in named_b]:
        raise QrlInputError("masks to compare have different key paths")
    both = either = 0
    for (name, kept_a), (_, kept_b) in zip(named_a, named_b):
        if (kept_a is None) != (kept_b is None):
            raise QrlInputError(f"masks to compare differ at {name}: pruned in one, not in the other")
        if kept_a is None:
            continue
        kept_a, kept_b = np.asarray(kept_a, bool), np.asarray(kept_b, bool)
        if kept_a.shape != kept_b.shape:
            raise QrlInputError(f"masks to compare differ at {name}: shapes {kept_a.shape} and {kept_b.shape}")
        both += int(np.count_nonzero(kept_a & kept_b))
        either += int(np.count_nonzero(kept_a | kept_b))
    return both / either if either else 1.0
