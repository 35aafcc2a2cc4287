"""Single-shot pruning at initialization: saliency scores, masks, and training under a mask.

- `scorers`: which leaves are prunable, SNIP / GraSP / magnitude scores, SynFlow and random
  (uniform or ERK) masks.
- `masks`: exact-count masks from scores (network, layer or global scope, layer-collapse guard),
  applying, checking and measuring masks.
- `single_shot`: `prune_networks` prunes an agent's networks at once, each scored with its own
  loss (`PruneSettings`: sparsity, scope, GraSP's temperature and reinit, scoring rounds,
  prunable leaves, guard).
- `sparse`: compact storage of pruned fp32 / int8 policies with exact byte accounting.
- `masked_optax`: an optax transform that keeps pruned weights, their gradients and optimizer
  moments exactly zero; masked Polyak averaging; masks as arrays for checkpoints.

A mask is a pytree shaped like the params: a bool array (True = kept) on each prunable leaf,
`None` elsewhere. Example, SNIP at 95% sparsity, then Adam under the mask:

    prunable = prunable_leaves(params)
    scores = snip_scores(loss_fn, params, batches, prunable)  # loss_fn(params, batch, temperature)
    mask = masks_from_scores(scores, sparsity=0.95)
    params = apply_mask(params, mask)
    optimizer = masked(optax.adam(1e-3), mask)
"""

from pruning.single_shot import PruneSettings, check_separate_paths, prune_networks, subtree_at
from pruning.masked_optax import mask_from_arrays, mask_to_arrays, masked, polyak_masked
from pruning.masks import (
    KEEP,
    MIN_KEPT_PER_LAYER,
    PRUNERS,
    SCOPES,
    apply_mask,
    check_mask,
    check_min_kept_per_layer,
    check_pruner,
    check_sparsity,
    kept_count,
    kept_fraction,
    kept_target,
    layer_kept_fractions,
    leaf_paths,
    mask_overlap,
    masks_from_scores,
    prunable_count,
)
from pruning.scorers import (
    DISTRIBUTIONS,
    batch_gradient,
    erk_densities,
    grasp_scores,
    hessian_gradient_product,
    layer_names,
    magnitude_scores,
    prunable_leaves,
    random_masks,
    snip_scores,
    synflow_layer_outputs,
    synflow_masks,
    synflow_own_flow,
    xavier_reinit,
)

__all__ = [
    "PruneSettings",
    "check_separate_paths",
    "prune_networks",
    "subtree_at",
    "DISTRIBUTIONS",
    "KEEP",
    "MIN_KEPT_PER_LAYER",
    "PRUNERS",
    "SCOPES",
    "apply_mask",
    "batch_gradient",
    "check_mask",
    "check_min_kept_per_layer",
    "check_pruner",
    "check_sparsity",
    "erk_densities",
    "grasp_scores",
    "hessian_gradient_product",
    "kept_count",
    "kept_fraction",
    "kept_target",
    "layer_kept_fractions",
    "layer_names",
    "leaf_paths",
    "magnitude_scores",
    "mask_from_arrays",
    "mask_overlap",
    "mask_to_arrays",
    "masked",
    "masks_from_scores",
    "polyak_masked",
    "prunable_count",
    "prunable_leaves",
    "random_masks",
    "snip_scores",
    "synflow_layer_outputs",
    "synflow_masks",
    "synflow_own_flow",
    "xavier_reinit",
]
