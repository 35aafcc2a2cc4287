"""Single-shot pruning of an agent's networks at initialization, each network scored with its own
training loss on the same offline batches (SNIP, GraSP) or without data (SynFlow, magnitude,
random).

    masks = prune_networks("snip", {"actor": actor_params}, {"actor": actor_loss}, batches,
                           PruneSettings(sparsity=0.95))
    # {"actor": mask}; "none" gives {"actor": None}

`PruneSettings.scope`: "network" (one threshold per network, the reference code's choice),
"layer" (every prunable layer at the sparsity) or "global" (one threshold over all the agent's
networks; SNIP, GraSP and magnitude only: their scores are comparable across networks).
"""

import dataclasses
from typing import Any, Callable, Mapping, Optional, Sequence

import jax

from pruning.masks import check_pruner, check_sparsity, masks_from_scores
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
)
from qrl.errors import QrlInputError

SCORED_PRUNERS = ("snip", "grasp", "magnitude")  # the pruners whose masks come from scores
# SynFlow's data-free input: `{network: (apply_fn(params, inputs [1, ...]) -> outputs, input_shape)}`.
SynflowInputs = Mapping[str, tuple[Callable[[Any, jax.Array], Any], Sequence[int]]]


@dataclasses.dataclass(frozen=True)
class PruneSettings:
    """How to prune: the target `sparsity` of each network's prunable weights, the threshold
    `scope`, GraSP's `temperature`, which leaves are prunable (`include_biases`, `exclude` layer
    paths, e.g. the first and last layers), the layer-collapse guard (`min_kept_per_layer`), the
    random pruner's `random_distribution` ("uniform" or "erk") and SynFlow's `synflow_iterations`."""

    sparsity: float = 0.95
    scope: str = "network"
    temperature: float = 1.0
    include_biases: bool = False
    exclude: tuple[str, ...] = ()
    min_kept_per_layer: int = 1
    random_distribution: str = "uniform"
    synflow_iterations: int = 100

    def check(self, pruner: str) -> None:
        check_pruner(pruner)
        check_sparsity(self.sparsity)
        if self.scope not in ("network", "layer", "global"):
            raise QrlInputError(f"unknown pruning scope {self.scope!r}; known: network, layer, global")
        if self.scope == "global" and pruner in ("synflow", "random"):
            raise QrlInputError(f"{pruner} prunes each network on its own: scope must be network or layer")
        if self.random_distribution not in DISTRIBUTIONS:
            raise QrlInputError(f"unknown random distribution {self.random_distribution!r}; "
                                f"known: {', '.join(DISTRIBUTIONS)}")


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
    `batches` the offline batches they are scored on; `key` seeds the random pruner;
    `synflow_inputs` gives SynFlow each network's apply function and input shape.
    """
    settings.check(pruner)
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
    scores = {}
    for name, params in networks.items():
        if pruner == "magnitude":
            scores[name] = magnitude_scores(params, prunable[name])
        elif pruner == "snip":
            scores[name] = snip_scores(losses[name], params, batches, prunable[name])
        else:
            scores[name] = grasp_scores(losses[name], params, batches, prunable[name], settings.temperature)
    keep = "lowest" if pruner == "grasp" else "highest"
    if settings.scope == "global":
        return masks_from_scores(scores, settings.sparsity, scope="global", keep=keep, **mask_options)
    return {name: masks_from_scores(network_scores, settings.sparsity, scope=settings.scope, keep=keep,
                                    **mask_options)
            for name, network_scores in scores.items()}


def _matching(patterns: Sequence[str], params: Any) -> tuple[str, ...]:
    """The exclusion patterns that name a layer of this network (others name another network's)."""
    names = layer_names(params)
    return tuple(pattern for pattern in patterns if any(path_matches(name, pattern) for name in names))
