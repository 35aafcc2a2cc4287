"""The pruning study's report: pure functions over its cells' `results.json` dicts.

A cell record is `{"task", "algo", "pruner", "sparsity", "seed", "results"}` (`results`: what
`launch.prune_runs.run_prune_offline` wrote) and, for mask overlap, `"masks"`: the run's stored
masks (`launch.prune_runs.read_masks`). The dense run is pruner "none" at sparsity 0: one row,
every pruner's sparsity-0 point in the plots.

Per row (task, algo, pruner, sparsity), over seeds: the score (the final evaluation's normalized
score, or its raw return when any seed has no normalized score) as mean ± population std, IQM
(rliable's: mean of the middle 50%, `int(n / 4)` values cut at each end; with fewer than 4 seeds
that cuts nothing and the row says it is the mean) and a 95% percentile bootstrap interval of
the IQM (seeds resampled with replacement, seeded), kept fraction per network and per layer, and
the policy's bytes per storage format (means over seeds).
"""

import math
import os
from typing import Any, Mapping, Optional, Sequence

import numpy as np
from matplotlib.figure import Figure

from pruning.masks import mask_overlap
from qrl import io
from qrl.errors import QrlInputError
from qrl.stats import BOOTSTRAP_REPS, bootstrap_interval, iqm

DENSE = "none"
IQM_MIN_VALUES = 4
LAYER_PLOT_SPARSITY = 0.95
MEMORY_COLUMNS = ("dense fp32", "pytorch_coo fp32", "bitmask fp32", "csr fp32", "bcoo fp32",
                  "bitmask int8", "csr int8", "bcoo int8")


def _field(cell: Mapping, *keys: str) -> Any:
    value: Any = cell
    for depth, key in enumerate(keys):
        if not isinstance(value, Mapping) or key not in value:
            raise QrlInputError(f"study cell lacks {'.'.join(keys[:depth + 1])}")
        value = value[key]
    return value


def _row_key(cell: Mapping) -> tuple:
    return (str(_field(cell, "task")), str(_field(cell, "algo")), str(_field(cell, "pruner")),
            float(_field(cell, "sparsity")))


def _scores(results: Sequence[Mapping]) -> tuple[str, list[float]]:
    normalized = [result.get("normalized_score") for result in results]
    if all(score is not None for score in normalized):
        return "normalized", [float(score["mean"]) for score in normalized]
    return "return", [float(_field(result, "final_eval", "mean")) for result in results]


def _mean_dicts(dicts: Sequence[Mapping[str, float]]) -> dict[str, float]:
    keys = dict.fromkeys(key for mapping in dicts for key in mapping)
    return {key: float(np.mean([mapping[key] for mapping in dicts if key in mapping])) for key in keys}


def _kept(results: Mapping) -> tuple[dict, dict]:
    """`({network: kept fraction}, {network: {layer: kept fraction}})`; an unpruned network keeps 1."""
    kept, layers = {}, {}
    for network, summary in (results.get("masks") or {}).items():
        kept[network] = 1.0 if summary is None else float(summary["kept_fraction"])
        layers[network] = {} if summary is None else dict(summary.get("layers") or {})
    return kept, layers


def _policy_bytes(results: Mapping) -> dict[str, float]:
    return {f"{row['format']} {row['precision']}": float(row["bytes"]) for row in results.get("policy_memory") or []}


def _order(key: tuple, pruners: Mapping[str, int]) -> tuple:
    task, algo, pruner, sparsity = key
    return task, algo, (pruner != DENSE, pruners[pruner]), sparsity


def _by_row(cells: Sequence[Mapping]) -> dict[tuple, list[Mapping]]:
    """Cells grouped by (task, algo, pruner, sparsity), each group ordered by seed."""
    groups: dict[tuple, list[Mapping]] = {}
    for cell in cells:
        groups.setdefault(_row_key(cell), []).append(cell)
    return {key: sorted(group, key=lambda cell: int(_field(cell, "seed"))) for key, group in groups.items()}


def gather(cells: Sequence[Mapping]) -> list[dict]:
    """One row per (task, algo, pruner, sparsity), dense rows first, sparsities ascending."""
    groups = _by_row(cells)
    pruners = {pruner: index for index, pruner in enumerate(dict.fromkeys(key[2] for key in groups))}
    rows = []
    for key in sorted(groups, key=lambda key: _order(key, pruners)):
        group = groups[key]
        seeds = [int(cell["seed"]) for cell in group]
        if len(set(seeds)) != len(seeds):
            raise QrlInputError(f"two results for the same seed of {' '.join(map(str, key))}")
        results = [_field(cell, "results") for cell in group]
        kind, scores = _scores(results)
        kept = [_kept(result) for result in results]
        layers = {network: _mean_dicts([layer[network] for _, layer in kept if network in layer])
                  for network in dict.fromkeys(name for _, layer in kept for name in layer)}
        policy = _mean_dicts([_policy_bytes(result) for result in results])
        dense = policy.get("dense fp32")
        rows.append({
            "task": key[0], "algo": key[1], "pruner": key[2], "sparsity": key[3], "seeds": seeds,
            "score_kind": kind, "scores": scores, "score_mean": float(np.mean(scores)),
            "score_std": float(np.std(scores)), "iqm": iqm(scores), "iqm_ci": list(bootstrap_interval(scores)),
            "iqm_note": None if len(scores) >= IQM_MIN_VALUES else f"{len(scores)} seed(s) < {IQM_MIN_VALUES}: IQM is the mean",
            "kept_fraction": _mean_dicts([network for network, _ in kept]), "layers": layers,
            "policy_bytes": policy,
            "policy_vs_dense_fp32": {name: value / dense for name, value in policy.items()} if dense else {},
        })
    return rows


def sparsity_label(sparsity: float) -> str:
    """0 -> "0", 0.95 -> ".95"."""
    return "0" if sparsity == 0 else f"{sparsity:g}".removeprefix("0")


def _pair_rows(rows: Sequence[Mapping], task: str, algo: str) -> list[Mapping]:
    return [row for row in rows if (row["task"], row["algo"]) == (task, algo)]


def score_vs_sparsity_plot(rows: Sequence[Mapping], task: str, algo: str, path: Optional[str] = None) -> Figure:
    """Score mean ± std vs sparsity (evenly spaced labels), one line per pruner starting at the
    dense point; the dense score as a dotted horizontal reference."""
    pair = _pair_rows(rows, task, algo)
    if not pair:
        raise QrlInputError(f"no study rows for {algo} on {task}")
    sparsities = sorted({row["sparsity"] for row in pair} | {0.0})
    position = {sparsity: index for index, sparsity in enumerate(sparsities)}
    dense = next((row for row in pair if row["pruner"] == DENSE), None)
    figure = Figure(figsize=(6.0, 4.0))
    axis = figure.add_subplot()
    if dense is not None:
        axis.axhline(dense["score_mean"], color="0.3", linestyle=":", label="dense")
    for index, pruner in enumerate(dict.fromkeys(row["pruner"] for row in pair if row["pruner"] != DENSE)):
        points = ([dense] if dense is not None else []) + [row for row in pair if row["pruner"] == pruner]
        x = np.asarray([position[row["sparsity"]] for row in points])
        mean = np.asarray([row["score_mean"] for row in points])
        std = np.asarray([row["score_std"] for row in points])
        axis.plot(x, mean, marker="o", color=f"C{index}", label=pruner)
        axis.fill_between(x, mean - std, mean + std, color=f"C{index}", alpha=0.2)
    axis.set_xticks(range(len(sparsities)), [sparsity_label(sparsity) for sparsity in sparsities])
    axis.set_xlabel("sparsity")
    axis.set_ylabel("normalized score" if pair[0]["score_kind"] == "normalized" else "return")
    axis.set_title(f"{algo} on {task}", fontsize=10)
    return io.finish_plot(figure, axis, path)


def layer_plot_sparsity(rows: Sequence[Mapping], task: str, algo: str) -> Optional[float]:
    """The sparsity the layer plot shows: 0.95 if pruned there, else the highest pruned one."""
    pruned = sorted({row["sparsity"] for row in _pair_rows(rows, task, algo) if row["pruner"] != DENSE})
    if not pruned:
        return None
    return LAYER_PLOT_SPARSITY if LAYER_PLOT_SPARSITY in pruned else pruned[-1]


def layer_kept_plot(rows: Sequence[Mapping], task: str, algo: str, path: Optional[str] = None,
                    sparsity: Optional[float] = None) -> Figure:
    """Kept fraction per layer (every network's prunable layers), one bar per pruner, at
    `sparsity` (default `layer_plot_sparsity`)."""
    sparsity = layer_plot_sparsity(rows, task, algo) if sparsity is None else sparsity
    chosen = [row for row in _pair_rows(rows, task, algo) if row["pruner"] != DENSE and row["sparsity"] == sparsity]
    if not chosen:
        raise QrlInputError(f"no pruned study rows for {algo} on {task} at sparsity {sparsity}")
    layers = list(dict.fromkeys((network, layer) for row in chosen for network, kept in row["layers"].items()
                                for layer in kept))
    figure = Figure(figsize=(max(6.0, 0.8 * len(layers)), 4.0))
    axis = figure.add_subplot()
    width = 0.8 / len(chosen)
    for index, row in enumerate(chosen):
        heights = [row["layers"].get(network, {}).get(layer, math.nan) for network, layer in layers]
        axis.bar(np.arange(len(layers)) + (index - (len(chosen) - 1) / 2) * width, heights, width,
                 color=f"C{index}", label=row["pruner"])
    axis.set_xticks(range(len(layers)), [f"{network}/{layer}" for network, layer in layers], rotation=30,
                    ha="right", fontsize=7)
    axis.set_ylabel("kept fraction")
    axis.set_title(f"layerwise kept fraction: {algo} on {task} at sparsity {sparsity_label(sparsity)}", fontsize=10)
    return io.finish_plot(figure, axis, path)


def _evaluation_score(evaluation: Mapping, kind: str) -> float:
    if kind == "normalized":
        return float(_field(evaluation, "normalized_score", "mean"))
    return float(_field(evaluation, "mean"))


def learning_curves(cells: Sequence[Mapping]) -> list[dict]:
    """One curve per (task, algo, pruner, sparsity): the score (normalized, or the return as in
    `gather`) at each gradient step every seed was evaluated at, mean and population std over
    seeds, and `per_seed [S, T]`. Rows whose cells hold one evaluation or none are left out."""
    curves = []
    for key, group in _by_row(cells).items():
        results = [_field(cell, "results") for cell in group]
        kind, _ = _scores(results)
        evaluations = [{int(_field(entry, "steps")): entry for entry in result.get("evaluations") or []}
                       for result in results]
        steps = sorted(set.intersection(*(set(by_step) for by_step in evaluations)))
        if len(steps) < 2:
            continue
        per_seed = np.asarray([[_evaluation_score(by_step[step], kind) for step in steps] for by_step in evaluations])
        curves.append({"task": key[0], "algo": key[1], "pruner": key[2], "sparsity": key[3],
                       "seeds": [int(cell["seed"]) for cell in group], "score_kind": kind, "steps": steps,
                       "mean": per_seed.mean(axis=0).tolist(), "std": per_seed.std(axis=0).tolist(),
                       "per_seed": per_seed.tolist()})
    return curves


def budget_verdicts(curves: Sequence[Mapping]) -> list[dict]:
    """Whether each curve (dense and pruned) has flattened by the end of its budget B. Per seed, the gain is
    the mean score of the evaluations in the last quarter (steps > 3B/4) minus that of the
    second quarter (B/4 < steps ≤ B/2); averaging windows keeps one noisy evaluation from
    deciding. "flattened" when the mean gain over seeds is within the seeds' std of their
    last-quarter means (the late progress is not resolved above the spread between seeds), else
    "still rising" (the budget is short: pruned-vs-dense verdicts then compare unconverged runs)
    or "falling". A pruned curve still rising where dense has flattened is one the budget may
    under-train, which `dense_verdicts` carries into "pruned ≈ dense". Curves without an evaluation
    in both windows get no verdict."""
    verdicts = []
    for curve in curves:
        steps, per_seed = np.asarray(curve["steps"]), np.asarray(curve["per_seed"])
        budget = int(steps[-1])
        late, middle = steps > 0.75 * budget, (steps > 0.25 * budget) & (steps <= 0.5 * budget)
        if not late.any() or not middle.any():
            continue
        late_means = per_seed[:, late].mean(axis=1)
        gain, spread = float(np.mean(late_means - per_seed[:, middle].mean(axis=1))), float(late_means.std())
        verdict = "flattened" if abs(gain) <= spread else "still rising" if gain > 0 else "falling"
        verdicts.append({"task": curve["task"], "algo": curve["algo"], "pruner": curve["pruner"],
                         "sparsity": curve["sparsity"], "budget": budget,
                         "late_steps": steps[late].tolist(), "middle_steps": steps[middle].tolist(),
                         "final_mean": float(per_seed[:, -1].mean()), "late_mean": float(late_means.mean()),
                         "gain": gain, "late_std": spread, "seeds": len(per_seed), "verdict": verdict})
    return verdicts


def _window(steps: Sequence[int]) -> str:
    return f"{steps[0]:,}" if len(steps) == 1 else f"{steps[0]:,}–{steps[-1]:,}"


def learning_curve_plot(curves: Sequence[Mapping], task: str, algo: str, sparsity: Optional[float] = None,
                        path: Optional[str] = None) -> Figure:
    """Score mean ± std over seeds vs gradient steps: the dense curve and each pruner's at
    `sparsity` (default: 0.95 where pruned there, else the highest pruned sparsity)."""
    pair = [curve for curve in curves if (curve["task"], curve["algo"]) == (task, algo)]
    if not pair:
        raise QrlInputError(f"no learning curves for {algo} on {task}")
    pruned = sorted({curve["sparsity"] for curve in pair if curve["pruner"] != DENSE})
    if sparsity is None and pruned:
        sparsity = LAYER_PLOT_SPARSITY if LAYER_PLOT_SPARSITY in pruned else pruned[-1]
    chosen = [curve for curve in pair if curve["pruner"] == DENSE or curve["sparsity"] == sparsity]
    figure = Figure(figsize=(6.0, 4.0))
    axis = figure.add_subplot()
    for index, curve in enumerate(chosen):
        steps, mean, std = (np.asarray(curve[key]) for key in ("steps", "mean", "std"))
        color = "0.3" if curve["pruner"] == DENSE else f"C{index}"
        label = "dense" if curve["pruner"] == DENSE else f"{curve['pruner']} {sparsity_label(curve['sparsity'])}"
        axis.plot(steps, mean, marker=".", color=color, label=label)
        axis.fill_between(steps, mean - std, mean + std, color=color, alpha=0.15)
    axis.set_xlabel("gradient steps")
    axis.set_ylabel("normalized score" if pair[0]["score_kind"] == "normalized" else "return")
    axis.set_title(f"learning curves: {algo} on {task} (mean ± std over seeds)", fontsize=10)
    return io.finish_plot(figure, axis, path)


def _network_overlaps(masks_a: Mapping, masks_b: Mapping) -> dict[str, float]:
    return {network: mask_overlap(masks_a[network], masks_b[network])
            for network in masks_a if network in masks_b}


def mask_overlap_table(cells: Sequence[Mapping]) -> list[dict]:
    """Jaccard overlap of kept weights between every two pruners with masks at the same task,
    algo, sparsity and seed, per network, averaged over the seeds both have.

    Each cell: `{"task", "algo", "pruner", "sparsity", "seed", "masks": {network: stored mask}}`.
    """
    groups: dict[tuple, dict[str, Mapping]] = {}
    for cell in cells:
        if cell.get("masks"):
            task, algo, pruner, sparsity = _row_key(cell)
            groups.setdefault((task, algo, sparsity, int(_field(cell, "seed"))), {})[pruner] = cell["masks"]
    pairs: dict[tuple, dict[str, list[float]]] = {}
    for (task, algo, sparsity, _), by_pruner in groups.items():
        names = list(by_pruner)
        for first, name_a in enumerate(names):
            for name_b in names[first + 1:]:
                for network, value in _network_overlaps(by_pruner[name_a], by_pruner[name_b]).items():
                    pairs.setdefault((task, algo, sparsity, name_a, name_b), {}).setdefault(network, []).append(value)
    return [{"task": task, "algo": algo, "sparsity": sparsity, "pruner_a": name_a, "pruner_b": name_b,
             "network": network, "overlap": float(np.mean(values)), "seeds": len(values)}
            for (task, algo, sparsity, name_a, name_b), networks in sorted(pairs.items())
            for network, values in networks.items()]


def memory_table(rows: Sequence[Mapping]) -> list[dict]:
    """Per row: the policy's bytes in every format and precision, and the ratio to dense fp32."""
    return [{"task": row["task"], "algo": row["algo"], "pruner": row["pruner"], "sparsity": row["sparsity"],
             "bytes": dict(row["policy_bytes"]), "vs_dense_fp32": dict(row["policy_vs_dense_fp32"])}
            for row in rows if row["policy_bytes"]]


def _markdown(header: Sequence[str], lines: Sequence[Sequence[str]]) -> str:
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
                      *("| " + " | ".join(line) + " |" for line in lines)])


def _pruner_label(pruner: str) -> str:
    return "dense" if pruner == DENSE else pruner


def score_markdown(rows: Sequence[Mapping]) -> str:
    header = ["task", "algo", "pruner", "sparsity", "seeds", "score", "mean ± std", "IQM [95% CI]", "kept fraction"]
    return _markdown(header, [[
        row["task"], row["algo"], _pruner_label(row["pruner"]), f"{row['sparsity']:g}", str(len(row["seeds"])),
        row["score_kind"], f"{row['score_mean']:.1f} ± {row['score_std']:.1f}",
        f"{row['iqm']:.1f} [{row['iqm_ci'][0]:.1f}, {row['iqm_ci'][1]:.1f}]" + ("*" if row["iqm_note"] else ""),
        ", ".join(f"{network} {kept:.3f}" for network, kept in row["kept_fraction"].items()),
    ] for row in rows])


def score_grid_markdown(rows: Sequence[Mapping], verdicts: Sequence[Mapping] = ()) -> str:
    """The scores as one line per (task, algo, pruner) and one column per sparsity: "mean ± std",
    then "(score / dense)" where the dense mean is positive and † where the row is "below dense"
    (`dense_verdicts`). The dense row fills sparsity 0."""
    sparsities = sorted({row["sparsity"] for row in rows})
    below = {(verdict["task"], verdict["algo"], verdict["pruner"], verdict["sparsity"]) for verdict in verdicts
             if verdict["verdict"] == "below dense"}
    relative = {(verdict["task"], verdict["algo"], verdict["pruner"], verdict["sparsity"]): verdict["relative"]
                for verdict in verdicts}
    lines: dict[tuple, dict[float, str]] = {}
    for row in rows:
        key = (row["task"], row["algo"], row["pruner"], row["sparsity"])
        text = f"{row['score_mean']:.1f} ± {row['score_std']:.1f}"
        if relative.get(key) is not None:
            text += f" ({relative[key]:.2f})"
        lines.setdefault(key[:3], {})[row["sparsity"]] = text + (" †" if key in below else "")
    return _markdown(["task", "algo", "pruner", *(f"{sparsity:g}" for sparsity in sparsities)], [
        [task, algo, _pruner_label(pruner), *(cells.get(sparsity, "") for sparsity in sparsities)]
        for (task, algo, pruner), cells in lines.items()])


def memory_markdown(memory: Sequence[Mapping]) -> str:
    columns = list(dict.fromkeys([*MEMORY_COLUMNS, *(name for row in memory for name in row["bytes"])]))
    columns = [name for name in columns if any(name in row["bytes"] for row in memory)]

    def cell(row: Mapping, name: str) -> str:
        if name not in row["bytes"]:
            return "–"
        ratio = row["vs_dense_fp32"].get(name)
        return f"{row['bytes'][name]:,.0f}" + ("" if ratio is None else f" ({ratio:.3f}×)")

    return _markdown(["task", "algo", "pruner", "sparsity", *columns], [
        [row["task"], row["algo"], _pruner_label(row["pruner"]), f"{row['sparsity']:g}",
         *(cell(row, name) for name in columns)] for row in memory])


def overlap_markdown(overlaps: Sequence[Mapping]) -> str:
    return _markdown(["task", "algo", "sparsity", "pruners", "network", "Jaccard overlap", "seeds"], [
        [row["task"], row["algo"], f"{row['sparsity']:g}", f"{row['pruner_a']} vs {row['pruner_b']}",
         row["network"], f"{row['overlap']:.3f}", str(row["seeds"])] for row in overlaps])


def _slug(*parts: str) -> str:
    return "_".join(parts).replace(":", "_").replace("/", "_")


def dense_verdicts(rows: Sequence[Mapping], budgets: Sequence[Mapping] = ()) -> list[dict]:
    """The claim "pruned ≈ dense" per pruned row: its score mean against its task and algorithm's
    dense row, "≈ dense" when within one dense std below the dense mean (or above it), else
    "below dense"; `relative` is score mean / dense mean where the dense mean is positive;
    `curve`: the row's own `budget_verdicts` verdict where it has one ("still rising": the
    comparison is at a budget that may under-train the pruned network), else None."""
    dense = {(row["task"], row["algo"]): row for row in rows if row["pruner"] == DENSE}
    curve = {(budget["task"], budget["algo"], budget["pruner"], budget["sparsity"]): budget["verdict"]
             for budget in budgets}
    verdicts = []
    for row in rows:
        reference = dense.get((row["task"], row["algo"]))
        if row["pruner"] == DENSE or reference is None:
            continue
        within = row["score_mean"] >= reference["score_mean"] - reference["score_std"]
        verdicts.append({
            "task": row["task"], "algo": row["algo"], "pruner": row["pruner"], "sparsity": row["sparsity"],
            "score_mean": row["score_mean"], "dense_mean": reference["score_mean"], "dense_std": reference["score_std"],
            "relative": row["score_mean"] / reference["score_mean"] if reference["score_mean"] > 0 else None,
            "verdict": "≈ dense" if within else "below dense",
            "curve": curve.get((row["task"], row["algo"], row["pruner"], row["sparsity"])),
        })
    return verdicts


def is_output_layer(path: str) -> bool:
    """Whether a kept-fraction path names an output layer: qrl's networks put their hidden layers
    under `torso` and their outputs elsewhere (`head`, an encoder's `mean` / `log_std`)."""
    return "torso" not in path.split("/")


def final_layer_rows(rows: Sequence[Mapping], sparsity: float = LAYER_PLOT_SPARSITY) -> list[dict]:
    """Per (task, algo, network, pruner) at `sparsity`: the output layers' kept fraction (kept /
    size summed over them is not stored, so their mean fraction), the hidden layers' mean
    fraction and the network's overall kept fraction — what "GraSP keeps more weights in the
    final layer" can be read against, across layers and across pruners."""
    found = []
    for row in rows:
        if row["pruner"] == DENSE or abs(row["sparsity"] - sparsity) > 1e-9:
            continue
        for network, layers in row["layers"].items():
            outputs = [value for path, value in layers.items() if is_output_layer(path)]
            hidden = [value for path, value in layers.items() if not is_output_layer(path)]
            if outputs:
                found.append({"task": row["task"], "algo": row["algo"], "network": network, "pruner": row["pruner"],
                              "sparsity": row["sparsity"], "output_kept": float(np.mean(outputs)),
                              "hidden_kept": float(np.mean(hidden)) if hidden else None,
                              "network_kept": float(row["kept_fraction"].get(network, float("nan")))})
    return found


def final_layer_verdicts(layer_rows: Sequence[Mapping]) -> list[str]:
    """One line per (task, algo, network) with both SNIP and GraSP: does GraSP keep a larger share
    of the output layer than SNIP, and than of its own hidden layers?"""
    by_key: dict[tuple, dict[str, Mapping]] = {}
    for row in layer_rows:
        by_key.setdefault((row["task"], row["algo"], row["network"]), {})[row["pruner"]] = row
    lines = []
    for (task, algo, network), pruners in by_key.items():
        if "grasp" not in pruners or "snip" not in pruners:
            continue
        grasp, snip = pruners["grasp"], pruners["snip"]
        across = "more" if grasp["output_kept"] > snip["output_kept"] else "not more"
        within = ("more" if grasp["hidden_kept"] is not None and grasp["output_kept"] > grasp["hidden_kept"]
                  else "not more")
        lines.append(f"{task} {algo} {network}: GraSP keeps {grasp['output_kept']:.3f} of the output layer, "
                     f"{across} than SNIP ({snip['output_kept']:.3f}); {within} than of its hidden layers "
                     f"({grasp['hidden_kept'] if grasp['hidden_kept'] is not None else float('nan'):.3f})")
    return lines


def write_report(study_dir: str, cells: Sequence[Mapping], overlaps: Sequence[Mapping],
                 failed: Sequence[str] = (), pending: Sequence[str] = ()) -> dict:
    """Writes `report.md`, `summary.json` and `plots/*.png` into `study_dir`; returns their paths.
    `overlaps`: `mask_overlap_table`'s rows; `failed`: cells that failed, named in the report;
    `pending`: the plan's cells without results (failed or not run yet), counted in the report."""
    rows, curves = gather(cells), learning_curves(cells)
    memory = memory_table(rows)
    budgets = budget_verdicts(curves)
    verdicts, layer_rows = dense_verdicts(rows, budgets), final_layer_rows(rows)
    paths = {"report.md": os.path.join(study_dir, "report.md"), "summary.json": os.path.join(study_dir, "summary.json")}
    sections = []
    for task, algo in dict.fromkeys((row["task"], row["algo"]) for row in rows):
        name = f"score_vs_sparsity_{_slug(task, algo)}"
        paths[name] = os.path.join(study_dir, "plots", f"{name}.png")
        score_vs_sparsity_plot(rows, task, algo, paths[name])
        sections += [f"## {algo} on {task}", "", f"![{name}](plots/{name}.png)", ""]
        sparsity = layer_plot_sparsity(rows, task, algo)
        if sparsity is not None:
            name = f"layer_kept_{_slug(task, algo)}"
            paths[name] = os.path.join(study_dir, "plots", f"{name}.png")
            layer_kept_plot(rows, task, algo, paths[name], sparsity)
            sections += [f"Layerwise kept fraction at sparsity {sparsity:g}:", "", f"![{name}](plots/{name}.png)", ""]
        if any((curve["task"], curve["algo"]) == (task, algo) for curve in curves):
            name = f"learning_curves_{_slug(task, algo)}"
            paths[name] = os.path.join(study_dir, "plots", f"{name}.png")
            learning_curve_plot(curves, task, algo, path=paths[name])
            sections += ["Learning curves:", "", f"![{name}](plots/{name}.png)", ""]
    report = [
        "# Pruning study", "",
        "Score: the final evaluation's normalized score (raw return where the dataset has no reference returns), "
        "mean ± population std over seeds. IQM: mean of the middle 50% of seeds, with a 95% percentile bootstrap "
        f"interval ({BOOTSTRAP_REPS} resamples of the seeds); * marks rows with fewer than {IQM_MIN_VALUES} seeds, "
        "where the IQM is the mean. Dense: pruner none at sparsity 0, every pruner's sparsity-0 point.", "",
        *([f"**Partial: {len(cells)} of {len(cells) + len(pending)} planned cells have results**; rerun the study's "
           "command to run the rest.", ""] if pending else []),
        "## Scores", "", score_markdown(rows), "",
        "Per sparsity: mean ± std (score / dense); † below dense by more than one dense std.", "",
        score_grid_markdown(rows, verdicts), "",
        "## Budget", "",
        "Has each learning curve flattened? Gain: the mean over seeds of (mean score of the evaluations in the "
        "budget's last quarter − that of its second quarter); flattened when it is within the seeds' std of their "
        "last-quarter means. The budget is chosen by the dense curve; a pruned curve still rising at it may be "
        "under-trained.", "",
        _markdown(["task", "algo", "pruner", "sparsity", "budget (steps)", "final", "last quarter", "gain (steps)",
                   "std", "seeds", "verdict"], [[
            budget["task"], budget["algo"], _pruner_label(budget["pruner"]), f"{budget['sparsity']:g}",
            f"{budget['budget']:,}", f"{budget['final_mean']:.1f}",
            f"{budget['late_mean']:.1f}",
            f"{budget['gain']:+.1f} ({_window(budget['middle_steps'])} → {_window(budget['late_steps'])})",
            f"{budget['late_std']:.1f}", str(budget["seeds"]), budget["verdict"]] for budget in budgets])
        if budgets else "No dense run with two or more evaluations (set --eval_every).", "",
        "## Verdicts", "",
        "Pruned ≈ dense: the pruned score mean is at most one dense std below the dense mean (per task and "
        "algorithm). Pruned curve: that row's own budget verdict (\"still rising\": more updates may close the gap).",
        "",
        _markdown(["task", "algo", "pruner", "sparsity", "score / dense", "verdict", "pruned curve"], [[
            verdict["task"], verdict["algo"], verdict["pruner"], f"{verdict['sparsity']:g}",
            "—" if verdict["relative"] is None else f"{verdict['relative']:.2f}", verdict["verdict"],
            verdict["curve"] or "—"]
            for verdict in verdicts]) if verdicts else "No pruned row with a dense row to compare.", "",
        f"Output layers at sparsity {LAYER_PLOT_SPARSITY:g} (mean kept fraction of the output layers, of the hidden "
        "layers, and of the whole network):", "",
        _markdown(["task", "algo", "network", "pruner", "output", "hidden", "network"], [[
            row["task"], row["algo"], row["network"], row["pruner"], f"{row['output_kept']:.3f}",
            "—" if row["hidden_kept"] is None else f"{row['hidden_kept']:.3f}", f"{row['network_kept']:.3f}"]
            for row in layer_rows]) if layer_rows else f"No pruned row at sparsity {LAYER_PLOT_SPARSITY:g}.", "",
        *[f"- {line}" for line in final_layer_verdicts(layer_rows)], "",
        "## Policy memory (bytes, × dense fp32)", "", memory_markdown(memory) if memory else "No memory accounting.", "",
        "## Mask overlap between pruners (Jaccard of kept weights, mean over seeds)", "",
        overlap_markdown(overlaps) if overlaps else "No two pruners with masks at the same task, algo, sparsity and seed.",
        "", *sections,
    ]
    if failed:
        report += ["## Cells without results", "", *[f"- {cell}" for cell in failed], ""]
    io.atomic_write_json(paths["summary.json"], {"rows": rows, "memory": memory, "overlaps": list(overlaps),
                                                 "verdicts": verdicts, "output_layers": layer_rows,
                                                 "learning_curves": curves, "budgets": budgets,
                                                 "failed": list(failed), "pending": list(pending)})
    io.atomic_write_text(paths["report.md"], "\n".join(report))
    return paths
