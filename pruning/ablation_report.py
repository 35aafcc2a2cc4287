"""The pruning paper's ablations as tables: each arm (a scoring-data size, a number of scoring
rounds) against the single-shot baseline arm, cell by cell.

A cell is `{"arm", "task", "algo", "pruner", "seed", "score", "masks"}` (`score`: normalized score,
or return when the dataset has no references; `masks`: `{network: stored mask}`). Rows pair each
arm's seeds with the baseline's: mean ± std of the arm's scores, the paired difference to the
baseline (mean and a 95% bootstrap interval over seeds) and the Jaccard overlap of the kept
weights with the baseline's masks, per network.
"""

from typing import Mapping, Sequence

import numpy as np

from pruning.masks import mask_overlap
from qrl.stats import bootstrap_interval


def ablation_rows(cells: Sequence[Mapping], baseline: str) -> list[dict]:
    """One row per (task, algo, pruner, arm), arms in first-seen order, the baseline first."""
    groups: dict[tuple, dict[int, Mapping]] = {}
    arms: dict[str, None] = {baseline: None}
    for cell in cells:
        arms.setdefault(cell["arm"], None)
        groups.setdefault((cell["task"], cell["algo"], cell["pruner"], cell["arm"]), {})[int(cell["seed"])] = cell
    order = {arm: index for index, arm in enumerate(arms)}
    rows = []
    for task, algo, pruner, arm in sorted(groups, key=lambda key: (key[0], key[1], key[2], order[key[3]])):
        mine = groups[(task, algo, pruner, arm)]
        base = groups.get((task, algo, pruner, baseline), {})
        seeds = sorted(mine)
        scores = [float(mine[seed]["score"]) for seed in seeds]
        paired = [seed for seed in seeds if seed in base]
        differences = [float(mine[seed]["score"]) - float(base[seed]["score"]) for seed in paired]
        overlaps: dict[str, list[float]] = {}
        for seed in paired:
            for network, stored in (mine[seed].get("masks") or {}).items():
                other = (base[seed].get("masks") or {}).get(network)
                if other is not None:
                    overlaps.setdefault(network, []).append(mask_overlap(stored, other))
        rows.append({
            "task": task, "algo": algo, "pruner": pruner, "arm": arm, "seeds": seeds, "scores": scores,
            "score_mean": float(np.mean(scores)), "score_std": float(np.std(scores)),
            "paired_seeds": paired, "difference_mean": float(np.mean(differences)) if differences else None,
            "difference_interval": list(bootstrap_interval(differences, statistic="mean")) if len(differences) > 1 else None,
            "overlap_with_baseline": {network: float(np.mean(values)) for network, values in overlaps.items()},
        })
    return rows


def verdict(row: Mapping) -> str:
    """Whether the arm beats, trails or ties the single shot: beats when the paired difference's
    interval lies above 0, trails when below, otherwise no difference resolved."""
    interval = row["difference_interval"]
    if interval is None:
        return "too few paired seeds"
    if interval[0] > 0:
        return "beats single shot"
    if interval[1] < 0:
        return "trails single shot"
    return "no difference resolved"


def ablation_markdown(rows: Sequence[Mapping], baseline: str) -> str:
    header = ["task", "algo", "pruner", "arm", "seeds", "score mean ± std", "Δ vs single shot [95% CI]",
              "kept-weight overlap with single shot", "verdict"]
    lines = []
    for row in rows:
        is_baseline = row["arm"] == baseline
        difference = "—" if is_baseline or row["difference_mean"] is None else (
            f"{row['difference_mean']:+.1f}" + (f" [{row['difference_interval'][0]:+.1f}, "
                                                f"{row['difference_interval'][1]:+.1f}]"
                                                if row["difference_interval"] else ""))
        overlap = "—" if is_baseline else ", ".join(f"{network} {value:.2f}"
                                                     for network, value in row["overlap_with_baseline"].items())
        lines.append([row["task"], row["algo"], row["pruner"], row["arm"], str(len(row["seeds"])),
                      f"{row['score_mean']:.1f} ± {row['score_std']:.1f}", difference, overlap,
                      "baseline" if is_baseline else verdict(row)])
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
                      *("| " + " | ".join(line) + " |" for line in lines)])
