"""Saliency scores for single-shot pruning at initialization, and the data-free pruners.

Data-driven scorers take `loss_fn(params, batch, temperature) -> scalar` and a sequence of batches
(pytrees); gradients are averaged over the batches. `prunable` is a bool pytree shaped like the
params (see `prunable_leaves`); scores are float arrays on prunable leaves and `None` elsewhere,
ready for `pruning.masks.masks_from_scores`.
"""

import math
import numbers
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from pruning.masks import (
    MIN_KEPT_PER_LAYER,
    apply_mask,
    check_min_kept_per_layer,
    check_sparsity,
    kept_target,
    leaf_paths,
    masks_from_scores,
)
from qrl.errors import QrlInputError

Params = Any
Batch = Any
LossFn = Callable[[Params, Batch, float], jax.Array]
DISTRIBUTIONS = ("uniform", "erk")


def layer_names(params: Params) -> list[str]:
    """'/'-joined path of each leaf (e.g. "params/dense_0/kernel"), in `jax.tree.leaves` order."""
    return leaf_paths(params)


def path_matches(name: str, pattern: str) -> bool:
    """Whether layer path `pattern` names leaf path `name` (whole path components)."""
    return f"/{pattern.strip('/')}/" in f"/{name}/"


def prunable_leaves(params: Params, include_biases: bool = False, exclude: Sequence[str] = ()) -> Any:
    """Bool pytree shaped like `params`: True for leaves that may be pruned.

    By default arrays with ndim >= 2 (dense and conv kernels) except leaves named "bias" (a stack
    of E networks has `[E, H]` biases); with `include_biases` the biases too. `exclude` holds layer paths to skip (first/last layer exclusion), matched
    on whole path components: "dense_0" or "torso/dense_0" match "params/torso/dense_0/kernel",
    "dense_1" does not match "dense_10". A pattern that matches no leaf is an error (a typo would
    silently prune the layer).
    """
    patterns = (exclude,) if isinstance(exclude, str) else tuple(exclude)
    names = layer_names(params)
    for pattern in patterns:
        if not any(path_matches(name, pattern) for name in names):
            raise QrlInputError(f"exclude pattern {pattern!r} matches no layer; leaves: {', '.join(names)}")

    def is_prunable(path, leaf) -> bool:
        name = jax.tree_util.keystr(path, simple=True, separator="/")
        if any(path_matches(name, pattern) for pattern in patterns):
            return False
        is_bias = name.rsplit("/", 1)[-1] == "bias"  # stacked networks have [E, H] biases
        return (np.ndim(leaf) >= 2 and not is_bias) or (include_biases and is_bias)

    return jax.tree_util.tree_map_with_path(is_prunable, params)


def _prunable_flags(params: Params, prunable: Any) -> list[bool]:
    """`prunable`'s flags in the order of `jax.tree.leaves(params)`; QrlInputError on a mismatch."""
    if leaf_paths(prunable) != layer_names(params):
        raise QrlInputError("prunable does not match params: build it with prunable_leaves(params)")
    return [bool(flag) for flag in jax.tree.leaves(prunable)]


def _check_batches(batches: Sequence[Batch]) -> list[Batch]:
    batches = list(batches)
    if not batches:
        raise QrlInputError("scoring needs at least one batch")
    return batches


def _check_temperature(temperature: float) -> float:
    if not temperature > 0:
        raise QrlInputError(f"temperature must be > 0, got {temperature}")
    return float(temperature)


def _on_prunable(function: Callable[..., jax.Array], params: Params, prunable: Any, *trees: Any) -> Any:
    """`function(leaf, *other_leaves)` on prunable leaves, `None` elsewhere."""
    leaves, treedef = jax.tree.flatten(params)
    others = [treedef.flatten_up_to(tree) for tree in trees]
    flags = _prunable_flags(params, prunable)
    scores = [
        function(leaf, *(other[i] for other in others)) if flag else None
        for i, (leaf, flag) in enumerate(zip(leaves, flags))
    ]
    return jax.tree.unflatten(treedef, scores)


def batch_gradient(loss_fn: LossFn, params: Params, batches: Sequence[Batch], temperature: float = 1.0) -> Params:
    """`g`: the gradient of `loss_fn(params, batch, temperature)` averaged over `batches`."""
    batches = _check_batches(batches)
    grad_fn = jax.jit(jax.grad(loss_fn))
    total = None
    for batch in batches:
        gradient = grad_fn(params, batch, temperature)
        total = gradient if total is None else jax.tree.map(jnp.add, total, gradient)
    return jax.tree.map(lambda leaf: leaf / len(batches), total)


def hessian_gradient_product(
    loss_fn: LossFn, params: Params, batches: Sequence[Batch], temperature: float = 1.0, direction: Any = None
) -> tuple[Params, Params]:
    """`(g, Hg)`: the batch-averaged gradient and the batch-averaged Hessian-vector product with it.

    `g` is computed in a first pass and enters the second as a constant tangent (`jax.jvp` of
    `jax.grad`), as the GraSP reference's detached `grad_w`. Both passes use `temperature`.
    `direction` (a bool pytree like `params`, e.g. the prunable leaves) restricts the tangent to
    those leaves, the rest set to zero: then `Hg` is `H[:, d] g_d`, and on the direction's own
    leaves `H_dd g_d`, what the reference computes over the conv/linear weights only. None: every
    leaf (`H g` over all params, biases included).
    """
    temperature = _check_temperature(temperature)
    batches = _check_batches(batches)
    gradient = batch_gradient(loss_fn, params, batches, temperature)
    tangent = gradient
    if direction is not None:
        flags = _prunable_flags(params, direction)
        leaves, treedef = jax.tree.flatten(gradient)
        tangent = jax.tree.unflatten(treedef, [leaf if flag else jnp.zeros_like(leaf)
                                               for leaf, flag in zip(leaves, flags)])

    @jax.jit
    def hvp(params, batch, temperature, tangent):
        def batch_grad(p):
            return jax.grad(loss_fn)(p, batch, temperature)

        return jax.jvp(batch_grad, (params,), (tangent,))[1]

    total = None
    for batch in batches:
        product = hvp(params, batch, temperature, tangent)
        total = product if total is None else jax.tree.map(jnp.add, total, product)
    return gradient, jax.tree.map(lambda leaf: leaf / len(batches), total)


def snip_scores(loss_fn: LossFn, params: Params, batches: Sequence[Batch], prunable: Any) -> Any:
    """SNIP (Lee et al., 2019): `|w * g|` per weight, `g` the batch-averaged gradient at temperature
    1. Keep the highest."""
    gradient = batch_gradient(loss_fn, params, batches, 1.0)
    return _on_prunable(lambda w, g: jnp.abs(w * g), params, prunable, gradient)


def grasp_scores(
    loss_fn: LossFn, params: Params, batches: Sequence[Batch], prunable: Any, temperature: float = 1.0
) -> Any:
    """GraSP (Wang et al., 2020): `S = -w * (H_ww g_w)` per prunable weight, `g_w` the batch-
    averaged gradient over the prunable weights only (biases and excluded layers are not in the
    Hessian-vector product's direction, as in the reference; see `hessian_gradient_product`).

    GraSP removes the LARGEST scores: build its mask with `masks_from_scores(..., keep="lowest")`.
    `temperature` is the loss's own (the reference divides network outputs by it, 200 there).
    """
    _, product = hessian_gradient_product(loss_fn, params, batches, temperature, direction=prunable)
    return _on_prunable(lambda w, hg: -w * hg, params, prunable, product)


def xavier_reinit(key: jax.Array, params: Params, prunable: Any) -> Params:
    """GraSP's `reinit`: params whose prunable dense kernels are redrawn from Xavier (Glorot)
    normal, std `sqrt(2 / (fan_in + fan_out))` (PyTorch's `xavier_normal_`, untruncated), as the
    reference does to its linear layers' weights before scoring; `[in, out]` kernels and stacks
    `[E, in, out]` (one draw per member). Other leaves (biases, convolution kernels) are unchanged.
    The masks computed on the redrawn copy apply to the weights that train."""
    leaves, treedef = jax.tree.flatten(params)
    flags = _prunable_flags(params, prunable)
    keys = jax.random.split(key, len(leaves))

    def redraw(leaf_key, leaf):
        shape = np.shape(leaf)
        std = math.sqrt(2.0 / (shape[-2] + shape[-1]))
        return (std * jax.random.normal(leaf_key, shape, jnp.float32)).astype(jnp.asarray(leaf).dtype)

    return jax.tree.unflatten(treedef, [redraw(k, leaf) if flag and np.ndim(leaf) in (2, 3) else leaf
                                        for k, leaf, flag in zip(keys, leaves, flags)])


def magnitude_scores(params: Params, prunable: Any) -> Any:
    """Magnitude: `|w|` per weight. Keep the highest."""
    return _on_prunable(jnp.abs, params, prunable)


def _check_mask_options(mask_options: dict, pruner: str) -> dict:
    """Mask options for a one-network pruner: `scope` ("network" or "layer"), `min_kept_per_layer`."""
    unknown = set(mask_options) - {"scope", "min_kept_per_layer"}
    if unknown:
        raise QrlInputError(f"{pruner} takes mask options scope and min_kept_per_layer, not {sorted(unknown)[0]}")
    scope = mask_options.get("scope", "network")
    if scope not in ("network", "layer"):
        raise QrlInputError(f"{pruner} prunes one network: scope must be network or layer, got {scope!r}")
    return mask_options


def synflow_own_flow(flow: jax.Array) -> jax.Array:
    """`flow / flow` elementwise with the denominator held constant (1 where `flow <= 0`): for a
    SynFlow `apply_fn` over independent sub-networks (a VAE's encoder and decoder, each critic of a
    stacked pair), each adds 1 to the objective, so its weights are scored against its own flow and
    iterative SynFlow does not let the weaker network of a pair starve."""
    return flow / jax.lax.stop_gradient(jnp.where(flow > 0, flow, 1.0))


def synflow_layer_outputs(module, params: Params, names: Sequence[str], *inputs) -> list:
    """The outputs of flax `module`'s layers `names` on `inputs` (`module.apply({"params": params},
    *inputs)`), read before the tanh or clip that follows them: under SynFlow's all-ones inputs and
    absolute weights a saturated head has no gradient, and every score would be 0."""
    _, state = module.apply({"params": params}, *inputs, mutable=["intermediates"],
                            capture_intermediates=lambda layer, _: layer.name in names)
    return [state["intermediates"][name]["__call__"][0] for name in names]


def synflow_masks(
    apply_fn: Callable[[Params, jax.Array], Any],
    params: Params,
    input_shape: Sequence[int],
    sparsity: float,
    prunable: Any,
    iterations: int = 100,
    **mask_options: Any,
) -> Any:
    """SynFlow (Tanaka et al., 2020): a data-free mask keeping the highest synaptic flow.

    Params are linearized to `|params|` (biases too); `R = sum(apply_fn(|params| * mask, ones))`
    with `ones` of `input_shape` (batch included, e.g. `(1, obs_dim)`; every output leaf is
    summed); scores are `|θ * dR/dθ|` on the masked params. Pruning is iterative: at k = 1..
    `iterations` the mask keeps `(1 - sparsity) ** (k / iterations)` of the weights, scored on
    the previous mask; weights once pruned stay pruned (they rank below kept weights whose flow
    is 0). `mask_options` are `scope` ("network" or "layer") and `min_kept_per_layer` of
    `masks_from_scores`; the final count is exact.

    Runs in float64 when `jax_enable_x64` is on, else float32. Either way the objective is
    `R / R0` with `R0` R's value held constant: scores scale by one positive number (ranking
    unchanged) and the backward pass cannot overflow. A forward pass that overflows float32
    raises QrlInputError (enable x64).
    """
    sparsity = check_sparsity(sparsity)
    mask_options = _check_mask_options(mask_options, "synflow")
    if isinstance(iterations, bool) or not isinstance(iterations, numbers.Integral) or iterations < 1:
        raise QrlInputError(f"synflow iterations must be an integer >= 1, got {iterations}")
    dtype = jnp.float64 if jax.config.jax_enable_x64 else jnp.float32
    linearized = jax.tree.map(lambda leaf: jnp.abs(jnp.asarray(leaf, dtype)), params)
    ones = jnp.ones(tuple(input_shape), dtype)

    def flow(masked_params):
        return sum(jnp.sum(out) for out in jax.tree.leaves(apply_fn(masked_params, ones)))

    @jax.jit
    def flow_scores(mask):
        masked_params = apply_mask(linearized, mask)

        def normalized_flow(p):
            value = flow(p)
            scale = jax.lax.stop_gradient(jnp.where(value > 0, value, 1.0))
            return value / scale, value

        gradient, value = jax.grad(normalized_flow, has_aux=True)(masked_params)
        pruned_last = jnp.asarray(-1.0, dtype)
        scores = jax.tree.map(
            lambda w, g, kept: None if kept is None else jnp.where(kept, jnp.abs(w * g), pruned_last),
            masked_params,
            gradient,
            mask,
        )
        return scores, value

    mask = _on_prunable(lambda leaf: jnp.ones(np.shape(leaf), bool), params, prunable)
    for k in range(1, iterations + 1):
        scores, value = flow_scores(mask)
        if not np.isfinite(float(value)):
            raise QrlInputError(f"synflow's flow R overflowed {jnp.dtype(dtype).name}; enable jax_enable_x64")
        step_sparsity = sparsity if k == iterations else 1.0 - (1.0 - sparsity) ** (k / iterations)
        mask = masks_from_scores(scores, step_sparsity, keep="highest", **mask_options)
    return mask


def erk_densities(shapes: Sequence[Sequence[int]], sparsity: float) -> list[float]:
    """Erdős–Rényi-Kernel densities (RigL, Evci et al., 2020) of layers with kernel `shapes`.

    Density ∝ `sum(shape) / prod(shape)`, scaled so the layers keep `(1 - sparsity)` of their
    weights in total; layers whose density would exceed 1 are dense and the rest re-scaled.
    """
    sparsity = check_sparsity(sparsity)
    sizes = [math.prod(shape) for shape in shapes]
    raw = [sum(shape) / size for shape, size in zip(shapes, sizes)]
    dense: set[int] = set()
    scale = 0.0
    while len(dense) < len(sizes):
        free = [i for i in range(len(sizes)) if i not in dense]
        kept_in_free = (1.0 - sparsity) * sum(sizes) - sum(sizes[i] for i in dense)
        scale = kept_in_free / sum(raw[i] * sizes[i] for i in free)
        largest = max(raw[i] for i in free)
        if scale * largest <= 1.0:
            break
        dense.update(i for i in free if raw[i] == largest)
    return [1.0 if i in dense else scale * raw[i] for i in range(len(sizes))]


def _apportion(targets: np.ndarray, total: int) -> np.ndarray:
    """Integer counts, each the floor or ceiling of `targets [L]`, summing to `total`
    (largest remainders first, ties to the earlier layer)."""
    counts = np.floor(targets).astype(np.int64)
    remainder = total - int(counts.sum())
    counts[np.argsort(-(targets - counts), kind="stable")[:remainder]] += 1
    return counts


def _guarded_counts(counts: np.ndarray, sizes: np.ndarray, min_kept: int) -> np.ndarray:
    """`counts [L]` raised to `min(min_kept, sizes)`; the extra is taken back one weight at a time
    from the layer keeping the most above its minimum (ties to the earlier layer) while any can give."""
    minimums = np.minimum(min_kept, sizes)
    guarded = np.maximum(counts, minimums)
    for _ in range(int(guarded.sum() - counts.sum())):
        spare = guarded - minimums
        if spare.max() <= 0:
            break
        guarded[np.argmax(spare)] -= 1
    return guarded


def random_masks(
    key: jax.Array,
    params: Params,
    sparsity: float,
    prunable: Any,
    distribution: str = "uniform",
    **mask_options: Any,
) -> Any:
    """Random masks: per-layer kept counts from `distribution`, kept weights drawn at random.

    "uniform": every prunable leaf at density `1 - sparsity` (each within one weight of it);
    "erk": `erk_densities`. Counts are apportioned (largest remainder) so the total is exactly
    `round((1 - sparsity) * n)`. `mask_options` as `synflow_masks`; `scope` changes nothing (the
    distribution sets the layer counts); `min_kept_per_layer` (default 1) raises small layers'
    counts, taken back from the layers with the most kept, so the total stays exact when possible.
    """
    sparsity = check_sparsity(sparsity)
    mask_options = _check_mask_options(mask_options, "random")
    if distribution not in DISTRIBUTIONS:
        raise QrlInputError(f"unknown random mask distribution {distribution!r}; known: {', '.join(DISTRIBUTIONS)}")
    min_kept = check_min_kept_per_layer(mask_options.get("min_kept_per_layer", MIN_KEPT_PER_LAYER))
    leaves, treedef = jax.tree.flatten(params)
    flags = _prunable_flags(params, prunable)
    shapes = [np.shape(leaf) for leaf, flag in zip(leaves, flags) if flag]
    if not shapes:
        raise QrlInputError("no prunable leaves: prunable is False everywhere")
    sizes = np.array([math.prod(shape) for shape in shapes])
    densities = erk_densities(shapes, sparsity) if distribution == "erk" else [1.0 - sparsity] * len(shapes)
    counts = _apportion(np.array(densities) * sizes, kept_target(int(sizes.sum()), sparsity))
    counts = _guarded_counts(counts, sizes, min_kept)
    layer_keys = jax.random.split(key, len(shapes))
    layer_masks = iter(_random_kept(k, shape, count) for k, shape, count in zip(layer_keys, shapes, counts))
    return jax.tree.unflatten(treedef, [next(layer_masks) if flag else None for flag in flags])


def _random_kept(key: jax.Array, shape: Sequence[int], count: int) -> jax.Array:
    """Bool `shape` with `count` True entries at uniformly random positions."""
    size = math.prod(shape)
    kept = np.zeros(size, bool)
    kept[np.asarray(jax.random.permutation(key, size))[:count]] = True
    return jnp.asarray(kept.reshape(shape))
