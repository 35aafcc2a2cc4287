"""Single-shot pruning of an agent's networks at initialization, each network scored with its own
training loss on the same offline batches (SNIP, GraSP) or without data (SynFlow, magnitude,
random).

    masks = prune_networks("snip", {"actor": actor_params}, {"actor": actor_loss}, batches,
                           PruneSettings(sparsity=0.95))
    # {"actor": mask}; "none" gives {"actor": None}

`PruneSettings.scope`: "network" (one threshold per network, the reference code's choice),
"layer" (every prunable layer at the sparsity) or "global" (one threshold over all the agent's
networks; SNIP, GraSP and magnitude only: their scores are comparable across networks).
`PruneSettings.iterations` > 1 prunes SNIP or GraSP in rounds: round r of k keeps
`(1 - sparsity) ** (r / k)` of the weights, re-scored on the network masked by round r - 1 (pruned
weights rank last and stay pruned); the last round reaches the sparsity exactly.
`PruneSettings.reinit` scores GraSP on a copy whose dense kernels are redrawn (the reference's
`reinit`, `scorers.xavier_reinit`); the masks apply to the weights that train.
`PruneSettings.separate` refines network scope: each named sub-network (`"vae/encoder"`) gets
its own threshold at the sparsity, and the rest of its network shares one — for networks whose
parts train on one loss but score on different scales (BCQ's VAE: the KL term gives the encoder
SNIP scores ~20x the decoder's, and one threshold empties the decoder).
"""

import dataclasses
import numbers
from typing import Any, Callable, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from pruning.masks import apply_mask, check_min_kept_per_layer, check_pruner, check_sparsity, masks_from_scores
from pruning.scorers import (
    DISTRIBUTIONS,
    grasp_scores,
    layer_names,
    magnitude_scores,
    path_matches,
    prunable_leaves,
    random_masks,
    snip_scores,
    synflow_masks,
    xavier_reinit,
)
from qrl.errors import QrlInputError
from qrl.ranges import POSITIVE

SCORED_PRUNERS = ("snip", "grasp", "magnitude")  # the pruners whose masks come from scores
# SynFlow's data-free input: `{network: (apply_fn(params, inputs [1, ...]) -> outputs, input_shape)}`.
SynflowInputs = Mapping[str, tuple[Callable[[Any, jax.Array], Any], Sequence[int]]]


@dataclasses.dataclass(frozen=True)
class PruneSettings:
    """How to prune: the target `sparsity` of each network's prunable weights, the threshold
    `scope`, GraSP's `temperature` and `reinit`, the scoring rounds (`iterations`, SNIP and GraSP),
    which leaves are prunable (`include_biases`, `exclude` layer
    paths, e.g. the first and last layers), the layer-collapse guard (`min_kept_per_layer`), the
    random pruner's `random_distribution` ("uniform" or "erk"), SynFlow's `synflow_iterations`,
    and `separate`: sub-network paths `network/module[/...]` thresholded on their own at network
    scope (SNIP, GraSP, magnitude)."""

    sparsity: float = 0.95
    scope: str = "network"
    temperature: float = 1.0
    include_biases: bool = False
    exclude: tuple[str, ...] = ()
    min_kept_per_layer: int = 1
    random_distribution: str = "uniform"
    synflow_iterations: int = 100
    separate: tuple[str, ...] = ()
    iterations: int = 1
    reinit: bool = False

    def check(self, pruner: str) -> None:
        check_pruner(pruner)
        check_sparsity(self.sparsity)
        POSITIVE.check("temperature", self.temperature)
        if self.temperature != 1.0 and pruner != "grasp":
            raise QrlInputError(f"temperature is a grasp option; {pruner} does not take it")
        if not isinstance(self.reinit, bool):
            raise QrlInputError(f"reinit must be true or false, got {self.reinit!r}")
        if self.reinit and pruner != "grasp":
            raise QrlInputError(f"reinit is a grasp option; {pruner} does not take it")
        if isinstance(self.iterations, bool) or not isinstance(self.iterations, numbers.Integral) \
                or self.iterations < 1:
            raise QrlInputError(f"iterations must be an integer >= 1, got {self.iterations}")
        if self.iterations > 1 and pruner not in ("snip", "grasp"):
            raise QrlInputError(f"iterations (rounds of re-scoring) apply to snip and grasp, not {pruner}"
                                + (" (use synflow_iterations)" if pruner == "synflow" else ""))
        check_min_kept_per_layer(self.min_kept_per_layer)
        if isinstance(self.synflow_iterations, bool) or not isinstance(self.synflow_iterations, numbers.Integral) \
                or self.synflow_iterations < 1:
            raise QrlInputError(f"synflow_iterations must be an integer >= 1, got {self.synflow_iterations}")
        if self.scope not in ("network", "layer", "global"):
            raise QrlInputError(f"unknown pruning scope {self.scope!r}; known: network, layer, global")
        if self.scope == "global" and pruner in ("synflow", "random"):
            raise QrlInputError(f"{pruner} prunes each network on its own: scope must be network or layer")
        if self.random_distribution not in DISTRIBUTIONS:
            raise QrlInputError(f"unknown random distribution {self.random_distribution!r}; "
                                f"known: {', '.join(DISTRIBUTIONS)}")
        if self.separate:
            if pruner not in SCORED_PRUNERS + ("none",) or self.scope != "network":
                raise QrlInputError("separate thresholds apply to snip, grasp and magnitude at network scope, "
                                    f"not {pruner} at {self.scope} scope")
            for path in self.separate:
                network, _, module = path.partition("/")
                if not network or not module:
                    raise QrlInputError(f"separate takes network/module paths like vae/encoder, got {path!r}")
            for path in self.separate:
                for other in self.separate:
                    if other != path and other.startswith(path + "/"):
                        raise QrlInputError(f"separate paths {path!r} and {other!r} overlap")


def prune_networks(
    pruner: str,
    networks: Mapping[str, Any],
    losses: Mapping[str, Callable],
    batches: Sequence[Any],
    settings: PruneSettings,
    key: Optional[jax.Array] = None,
    synflow_inputs: Optional[SynflowInputs] = None,
) -> dict[str, Any]:
    """`{network: mask}` for `networks` (`{name: params}`) pruned by `pruner` under `settings`.

    `losses[name](params, batch, temperature)` is the network's own training loss (SNIP, GraSP);
    `batches` the offline batches they are scored on; `key` seeds the random pruner and GraSP's
    `reinit`;
    `synflow_inputs` gives SynFlow each network's apply function and input shape.
    """
    settings.check(pruner)
    groups = _separate_groups(settings.separate, networks)
    if pruner == "none":
        return {name: None for name in networks}
    excluded = {name: _matching(settings.exclude, params) for name, params in networks.items()}
    unmatched = [pattern for pattern in settings.exclude if not any(pattern in found for found in excluded.values())]
    if unmatched:
        raise QrlInputError(f"exclude pattern {unmatched[0]!r} matches no layer of {', '.join(networks)}")
    prunable = {name: prunable_leaves(params, settings.include_biases, excluded[name])
                for name, params in networks.items()}
    mask_options = {"min_kept_per_layer": settings.min_kept_per_layer}
    if pruner == "random":
        if key is None:
            raise QrlInputError("the random pruner needs a key")
        keys = dict(zip(networks, jax.random.split(key, len(networks))))
        return {name: random_masks(keys[name], params, settings.sparsity, prunable[name],
                                   settings.random_distribution, scope=settings.scope, **mask_options)
                for name, params in networks.items()}
    if pruner == "synflow":
        missing = sorted(set(networks) - set(synflow_inputs or {}))
        if missing:
            raise QrlInputError(f"synflow needs each network's apply function and input shape; missing: {', '.join(missing)}")
        return {name: synflow_masks(synflow_inputs[name][0], params, synflow_inputs[name][1], settings.sparsity,
                                    prunable[name], settings.synflow_iterations, scope=settings.scope, **mask_options)
                for name, params in networks.items()}
    keep = "lowest" if pruner == "grasp" else "highest"
    scored = dict(networks)
    if settings.reinit:
        if key is None:
            raise QrlInputError("grasp's reinit needs a key")
        reinit_keys = jax.random.split(jax.random.fold_in(key, 1), len(networks))
        scored = {name: xavier_reinit(k, params, prunable[name])
                  for k, (name, params) in zip(reinit_keys, networks.items())}

    def network_scores(name: str, params: Any) -> Any:
        if pruner == "magnitude":
            return magnitude_scores(params, prunable[name])
        if pruner == "snip":
            return snip_scores(losses[name], params, batches, prunable[name])
        return grasp_scores(losses[name], params, batches, prunable[name], settings.temperature)

    def threshold(scores: dict, sparsity: float) -> dict:
        if settings.scope == "global":
            return masks_from_scores(scores, sparsity, scope="global", keep=keep, **mask_options)
        return {name: _network_masks(network_scores, groups[name], settings.scope, sparsity, keep, mask_options)
                for name, network_scores in scores.items()}

    masks = None
    for round_ in range(1, settings.iterations + 1):
        sparsity = settings.sparsity if round_ == settings.iterations else \
            1.0 - (1.0 - settings.sparsity) ** (round_ / settings.iterations)
        if masks is None:
            scores = {name: network_scores(name, params) for name, params in scored.items()}
        else:
            scores = _pruned_last({name: network_scores(name, apply_mask(params, masks[name]))
                                   for name, params in scored.items()}, masks, keep)
        masks = threshold(scores, sparsity)
    return masks


def _pruned_last(scores: dict, masks: dict, keep: str) -> dict:
    """`{network: scores}` with every weight `masks` pruned moved below (keep "highest") or above
    (keep "lowest") every kept weight's score, so a later round never revives it."""
    kept_values = [np.asarray(score)[np.asarray(kept)]
                   for name in scores
                   for score, kept in zip(jax.tree.leaves(scores[name]), jax.tree.leaves(masks[name]))]
    values = np.concatenate([v.ravel() for v in kept_values] + [np.zeros(1)])
    sentinel = values.min() - 1.0 - abs(values.min()) if keep == "highest" else values.max() + 1.0 + abs(values.max())

    def demote(score, kept):
        return None if score is None else jnp.where(kept, score, jnp.asarray(sentinel, jnp.asarray(score).dtype))

    return {name: jax.tree.map(demote, scores[name], masks[name], is_leaf=lambda leaf: leaf is None)
            for name in scores}


def check_separate_paths(paths: Sequence[str], networks: Mapping[str, Any]) -> None:
    """Each `PruneSettings.separate` path names a network of `networks` and a sub-tree of it."""
    _separate_groups(paths, networks)


def _separate_groups(paths: Sequence[str], networks: Mapping[str, Any]) -> dict[str, list[tuple[str, ...]]]:
    """`{network: [module key paths]}` of `PruneSettings.separate`; a path naming no network or
    no sub-tree of one is an input error."""
    groups = {name: [] for name in networks}
    for path in paths:
        network, _, module = path.partition("/")
        if network not in networks:
            raise QrlInputError(f"separate path {path!r} names no network; networks: {', '.join(networks)}")
        keys = tuple(module.split("/"))
        subtree = networks[network]
        for key in keys:
            if not isinstance(subtree, Mapping) or key not in subtree:
                raise QrlInputError(f"separate path {path!r} names no sub-network of {network}")
            subtree = subtree[key]
        groups[network].append(keys)
    return groups


def subtree_at(tree: Any, path: str) -> Any:
    """`tree["vae"]["decoder"]` for `path="vae/decoder"` (a sub-network by its slash path); None
    where the walk meets a None (an absent mask)."""
    return _subtree(tree, tuple(path.split("/")))


def _subtree(tree: Any, keys: tuple[str, ...]) -> Any:
    for key in keys:
        tree = None if tree is None else tree[key]
    return tree


def _with_subtree(tree: Mapping, keys: tuple[str, ...], value: Any) -> dict:
    """A copy of nested dict `tree` with the sub-tree at `keys` replaced by `value`."""
    copy = dict(tree)
    copy[keys[0]] = value if len(keys) == 1 else _with_subtree(tree[keys[0]], keys[1:], value)
    return copy


def _has_scores(tree: Any) -> bool:
    return any(leaf is not None for leaf in jax.tree.leaves(tree, is_leaf=lambda leaf: leaf is None))


def _network_masks(scores: Any, groups: Sequence[tuple[str, ...]], scope: str, sparsity: float, keep: str,
                   mask_options: dict) -> Any:
    """One network's mask from its `scores`: one threshold (or one per layer) over the network,
    except that each sub-tree in `groups` is thresholded on its own at the same sparsity."""
    def masks_for(tree):
        return masks_from_scores(tree, sparsity, scope=scope, keep=keep, **mask_options)

    if not groups:
        return masks_for(scores)
    rest = scores
    for keys in groups:
        rest = _with_subtree(rest, keys, jax.tree.map(lambda _: None, _subtree(scores, keys)))
    mask = masks_for(rest) if _has_scores(rest) else rest
    for keys in groups:
        part = _subtree(scores, keys)
        mask = _with_subtree(mask, keys, masks_for(part) if _has_scores(part) else part)
    return mask


def _matching(patterns: Sequence[str], params: Any) -> tuple[str, ...]:
    """The exclusion patterns that name a layer of this network (others name another network's)."""
    names = layer_names(params)
    return tuple(pattern for pattern in patterns if any(path_matches(name, pattern) for name in names))
