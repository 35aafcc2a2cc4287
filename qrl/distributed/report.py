"""The ActorQ study's report: tables, speedups vs fp32 actors, learning curves and runtime breakdown.

Input is a list of ActorQ `results.json` dicts (several actor precisions × seeds × envs, see
`qrl.distributed.run`). Rows group runs by (agent, env, actor precision, comm precision). Every
per-row number is a mean over the row's seeds (std: population std over seeds). Speedups pair a
row with the fp32-actor, fp32-comm row of the same agent and env, seed by seed, and are ratios of
means over the paired seeds:

- time to target = fp32 / quantized, over the seeds where BOTH reached the target (> 1: faster);
- actor steps/s = quantized / fp32 (> 1: faster actors);
each with a 95% paired percentile-bootstrap interval (seeds resampled with their pairs,
`qrl.stats.paired_ratio_interval`) once two or more seeds pair up;
- carbon = fp32 kg / quantized kg for the whole runs (> 1: less carbon), and to target, where
  a run's carbon to target is its kg × time-to-target / wall time (its emissions pro rata).

Time to target is the wall time of the first evaluation whose return reaches the target, with no
interpolation between evaluations: it is as coarse as the evaluation period.
"""

import os
from typing import Any, Mapping, Optional, Sequence

import numpy as np
from matplotlib.figure import Figure

from qrl import io, stats
from qrl.distributed.energy import cpu_power_model
from qrl.errors import QrlInputError

PRECISION_ORDER = ("fp32", "bf16", "fp16", "int8")  # display order (= weights.ACTOR_PRECISIONS)
PRECISION_COLORS = {"fp32": "C0", "bf16": "C1", "fp16": "C2", "int8": "C3"}
ACTOR_PARTS = ("env_step", "inference", "pull_wait", "deserialize", "load", "insert", "other")
LEARNER_PARTS = ("sample_wait", "update", "publish", "other")
PULL_PARTS = ("pull_wait", "deserialize", "load")
BASELINE = "fp32"


def time_to_target(evaluations: Sequence[Mapping], target: Optional[float], key: str = "return_fp32") -> Optional[float]:
    """Wall seconds of the first evaluation with `key` >= `target`; None if none did or no target.

    No interpolation between evaluations (the answer is an evaluation's own time).
    """
    if target is None:
        return None
    for evaluation in evaluations:
        value = evaluation.get(key)
        if value is not None and value >= target:
            return float(evaluation["wall_seconds"])
    return None


def _require(result: Mapping, *keys: str) -> Any:
    value: Any = result
    for depth, key in enumerate(keys):
        if not isinstance(value, Mapping) or key not in value:
            raise QrlInputError(f"results.json lacks {'.'.join(keys[:depth + 1])}")
        value = value[key]
    return value


def _mean(values: Sequence[Optional[float]]) -> Optional[float]:
    present = [float(value) for value in values if value is not None]
    return float(np.mean(present)) if present else None


def _std(values: Sequence[Optional[float]]) -> Optional[float]:
    present = [float(value) for value in values if value is not None]
    return float(np.std(present)) if present else None


def _ratio(numerator: Optional[float], denominator: Optional[float]) -> Optional[float]:
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


def run_energy(result: Mapping) -> Optional[dict]:
    """The run's energy dict; runs that recorded none get the CPU-seconds model of their CPU time."""
    energy = result.get("energy")
    if energy and energy.get("kwh") is not None:
        return dict(energy)
    cpu_seconds = (result.get("cpu_seconds") or {}).get("total")
    if cpu_seconds is None:
        return None
    model = cpu_power_model(float(cpu_seconds))
    return {**model, "note": f"{model['note']}; computed by the report (the run recorded no energy)"}


def _pulls(result: Mapping) -> Optional[int]:
    """How many weight blobs actors pulled and loaded: counts.pulls, else publish.pulls."""
    for section in ("counts", "publish"):
        pulls = (result.get(section) or {}).get("pulls")
        if pulls is not None:
            return int(pulls)
    return None


def run_metrics(result: Mapping, target: Optional[float]) -> dict:
    """One run's numbers for the tables (see `summary_table`)."""
    breakdown = result.get("breakdown") or {}
    actor = breakdown.get("actor") or {}
    learner = breakdown.get("learner") or {}
    throughput = result.get("throughput") or {}
    energy = run_energy(result)
    ttt = time_to_target(result.get("evaluations") or [], target)
    if not result.get("evaluations") and target is not None and target == result.get("target_return"):
        ttt = result.get("time_to_target_seconds")  # no evaluation log: the run's own measurement.
    pulls = _pulls(result)
    pull_seconds = sum(float(actor.get(part, 0.0)) for part in PULL_PARTS) if actor else None
    wall = result.get("wall_seconds")
    kg = energy["kg_co2"] if energy else None
    return {
        "agent": result.get("agent", ""), "env": _require(result, "env"),
        "actor_precision": _require(result, "actor_precision"),
        "comm_precision": result.get("comm_precision", _require(result, "actor_precision")),
        "seed": int(_require(result, "seed")), "target_return": target, "wall_seconds": wall,
        "final_return": (result.get("final_return") or {}).get("fp32"),
        "final_return_actor": (result.get("final_return") or {}).get("actor"),
        "time_to_target_seconds": ttt,
        "actor_steps_per_second": throughput.get("actor_steps_per_second"),
        "learner_steps_per_second": throughput.get("learner_steps_per_second"),
        "bytes_per_publish": (result.get("publish") or {}).get("bytes_per_publish"),
        "pulls": pulls, "pull_seconds": pull_seconds,
        "pull_seconds_per_pull": _ratio(pull_seconds, pulls) if pulls else None,
        "kwh": energy["kwh"] if energy else None, "kg_co2": kg,
        "kg_co2_to_target": kg * ttt / wall if kg is not None and ttt is not None and wall else None,
        "energy_method": energy["method"] if energy else None, "energy_note": energy["note"] if energy else None,
        "actor_seconds": {part: float(actor.get(part, 0.0)) for part in (*ACTOR_PARTS, "total")},
        "learner_seconds": {part: float(learner.get(part, 0.0)) for part in (*LEARNER_PARTS, "total")},
        "evaluations": list(result.get("evaluations") or []),
    }


def _targets(results: Sequence[Mapping], target_return: Optional[float]) -> dict:
    """The target per (agent, env): `target_return` if given, else the runs' own (which must agree)."""
    targets: dict[tuple, set] = {}
    for result in results:
        key = (result.get("agent", ""), _require(result, "env"))
        targets.setdefault(key, set()).add(target_return if target_return is not None else result.get("target_return"))
    for (agent, env), values in targets.items():
        if len(values) > 1:
            raise QrlInputError(f"runs of {agent} on {env} disagree on target_return ({sorted(values, key=str)}); "
                                "pass one target_return")
    return {key: values.pop() for key, values in targets.items()}


def _group_key(run: Mapping) -> tuple:
    order = {name: index for index, name in enumerate(PRECISION_ORDER)}
    return (run["agent"], run["env"], order.get(run["actor_precision"], len(order)), run["actor_precision"],
            order.get(run["comm_precision"], len(order)), run["comm_precision"])


def group_runs(results: Sequence[Mapping], target_return: Optional[float] = None) -> dict[tuple, list[dict]]:
    """{(agent, env, actor precision, comm precision): run metrics sorted by seed}, in display order."""
    if not results:
        raise QrlInputError("no results to report")
    targets = _targets(results, target_return)
    groups: dict[tuple, list[dict]] = {}
    for result in results:
        run = run_metrics(result, targets[(result.get("agent", ""), result["env"])])
        groups.setdefault(_group_key(run), []).append(run)
    ordered = {}
    for key in sorted(groups):
        runs = sorted(groups[key], key=lambda run: run["seed"])
        seeds = [run["seed"] for run in runs]
        if len(set(seeds)) != len(seeds):
            raise QrlInputError(f"two results for the same seed of {key[1]} with {key[3]} actors")
        ordered[(key[0], key[1], key[3], key[5])] = runs
    return ordered


def _fractions(runs: Sequence[Mapping], section: str, parts: Sequence[str]) -> Optional[dict]:
    total = sum(run[section]["total"] for run in runs)
    if total <= 0:
        return None
    return {part: sum(run[section][part] for run in runs) / total for part in parts}


def _summarize(runs: Sequence[Mapping]) -> dict:
    first = runs[0]
    reached = [run["time_to_target_seconds"] for run in runs if run["time_to_target_seconds"] is not None]
    methods = sorted({run["energy_method"] for run in runs if run["energy_method"]})
    return {
        "agent": first["agent"], "env": first["env"], "actor_precision": first["actor_precision"],
        "comm_precision": first["comm_precision"], "seeds": [run["seed"] for run in runs],
        "target_return": first["target_return"],
        "final_return_mean": _mean([run["final_return"] for run in runs]),
        "final_return_std": _std([run["final_return"] for run in runs]),
        "final_return_actor_mean": _mean([run["final_return_actor"] for run in runs]),
        "final_return_actor_std": _std([run["final_return_actor"] for run in runs]),
        "time_to_target_mean": _mean(reached), "seeds_reached_target": len(reached),
        "time_to_target_ci": list(stats.bootstrap_interval(reached, statistic="mean")) if len(reached) >= 2 else None,
        "actor_steps_per_second": _mean([run["actor_steps_per_second"] for run in runs]),
        "learner_steps_per_second": _mean([run["learner_steps_per_second"] for run in runs]),
        "bytes_per_publish": _mean([run["bytes_per_publish"] for run in runs]),
        "pull_seconds_per_pull": _mean([run["pull_seconds_per_pull"] for run in runs]),
        "kwh": _mean([run["kwh"] for run in runs]), "kg_co2": _mean([run["kg_co2"] for run in runs]),
        "energy_methods": methods,
        "actor_breakdown": _fractions(runs, "actor_seconds", ACTOR_PARTS),
        "learner_breakdown": _fractions(runs, "learner_seconds", LEARNER_PARTS),
    }


def summary_table(results: Sequence[Mapping], target_return: Optional[float] = None) -> list[dict]:
    """One row per (agent, env, actor precision, comm precision), means over seeds: final fp32
    return (mean, std), time to target (mean over the seeds that reached it, and how many did),
    actor and learner steps/s, bytes per publish, pull + deserialize + load seconds per pull,
    kWh and kg CO2 per run, and the actor/learner time fractions of the runtime breakdown."""
    return [_summarize(runs) for runs in group_runs(results, target_return).values()]


def _paired_ratio(baseline: Mapping[int, Mapping], runs: Mapping[int, Mapping], seeds: Sequence[int], key: str,
                  baseline_over_run: bool) -> tuple[Optional[float], int, Optional[list[float]]]:
    """(ratio of means over the seeds where both have `key`, how many, its paired bootstrap
    interval when two or more seeds pair up)."""
    both = [seed for seed in seeds if baseline[seed][key] is not None and runs[seed][key] is not None]
    if not both:
        return None, 0, None
    base = [float(baseline[seed][key]) for seed in both]
    value = [float(runs[seed][key]) for seed in both]
    numerators, denominators = (base, value) if baseline_over_run else (value, base)
    ratio = _ratio(float(np.mean(numerators)), float(np.mean(denominators)))
    interval = None
    if len(both) >= 2 and ratio is not None:
        interval = list(stats.paired_ratio_interval(numerators, denominators))
    return ratio, len(both), interval


def speedup_table(results: Sequence[Mapping], target_return: Optional[float] = None) -> list[dict]:
    """Per non-baseline row: ratios against the fp32-actor/fp32-comm row of the same agent and env
    over the seeds both have (see the module docstring for each ratio's direction)."""
    groups = group_runs(results, target_return)
    rows = []
    for (agent, env, actor_precision, comm_precision), runs in groups.items():
        baseline_runs = groups.get((agent, env, BASELINE, BASELINE))
        if baseline_runs is None or (actor_precision, comm_precision) == (BASELINE, BASELINE):
            continue
        baseline = {run["seed"]: run for run in baseline_runs}
        by_seed = {run["seed"]: run for run in runs}
        seeds = sorted(set(baseline) & set(by_seed))
        ttt, reached, ttt_ci = _paired_ratio(baseline, by_seed, seeds, "time_to_target_seconds", True)
        actor_speed, _, actor_speed_ci = _paired_ratio(baseline, by_seed, seeds, "actor_steps_per_second", False)
        learner_speed, _, learner_speed_ci = _paired_ratio(baseline, by_seed, seeds, "learner_steps_per_second", False)
        carbon, _, _ = _paired_ratio(baseline, by_seed, seeds, "kg_co2", True)
        carbon_to_target, _, _ = _paired_ratio(baseline, by_seed, seeds, "kg_co2_to_target", True)
        rows.append({
            "agent": agent, "env": env, "actor_precision": actor_precision, "comm_precision": comm_precision,
            "paired_seeds": seeds, "time_to_target_ratio": ttt, "time_to_target_ratio_ci": ttt_ci,
            "seeds_both_reached": reached,
            "actor_steps_per_second_ratio": actor_speed, "actor_steps_per_second_ratio_ci": actor_speed_ci,
            "learner_steps_per_second_ratio": learner_speed, "learner_steps_per_second_ratio_ci": learner_speed_ci,
            "carbon_ratio": carbon, "carbon_to_target_ratio": carbon_to_target,
        })
    return rows


def _slug(agent: str, env: str) -> str:
    name = f"{agent}_{env}" if agent else env
    return name.replace(":", "_").replace("/", "_")


def _label(actor_precision: str, comm_precision: str) -> str:
    if actor_precision == comm_precision:
        return f"{actor_precision} actors"
    return f"{actor_precision} actors, {comm_precision} comm"


def _curve(evaluations: Sequence[Mapping], x_key: str, y_key: str = "return_fp32") -> Optional[tuple[np.ndarray, np.ndarray]]:
    points = sorted((float(e[x_key]), float(e[y_key])) for e in evaluations
                    if e.get(x_key) is not None and e.get(y_key) is not None)
    if not points:
        return None
    x, y = np.asarray(points).T
    return x, y


def _mean_curve(curves: Sequence[tuple[np.ndarray, np.ndarray]]) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """Mean over seeds on a common grid spanning the range every seed covers (linear interpolation)."""
    if len(curves) == 1:
        return curves[0]
    low, high = max(x[0] for x, _ in curves), min(x[-1] for x, _ in curves)
    if high <= low:
        return None
    grid = np.linspace(low, high, 200)
    return grid, np.mean([np.interp(grid, x, y) for x, y in curves], axis=0)


def plot_returns(groups: Mapping[tuple, Sequence[Mapping]], agent: str, env: str, x_key: str, x_label: str,
                 path: Optional[str] = None) -> Figure:
    """fp32 evaluation return vs `x_key` for one agent/env: per precision a thick mean over seeds
    and thin per-seed lines; the target as a dotted line."""
    figure = Figure(figsize=(6.0, 4.0))
    axis = figure.add_subplot()
    target = None
    for index, ((group_agent, group_env, actor_precision, comm_precision), runs) in enumerate(groups.items()):
        if (group_agent, group_env) != (agent, env):
            continue
        color = PRECISION_COLORS.get(actor_precision, f"C{4 + index % 6}")
        curves = [curve for curve in (_curve(run["evaluations"], x_key) for run in runs) if curve is not None]
        for x, y in curves:
            axis.plot(x, y, color=color, linewidth=0.7, alpha=0.35)
        mean = _mean_curve(curves) if curves else None
        if mean is not None:
            axis.plot(*mean, color=color, linewidth=2.0,
                      label=f"{_label(actor_precision, comm_precision)} (mean of {len(curves)})")
        target = runs[0]["target_return"]
    if target is not None:
        axis.axhline(target, color="gray", linestyle=":", linewidth=1, label="target")
    axis.set_xlabel(x_label)
    axis.set_ylabel("evaluation return (fp32 policy)")
    axis.set_title(f"{agent} on {env}" if agent else env)
    return io.finish_plot(figure, axis, path)


def plot_breakdown(rows: Sequence[Mapping], title: str, path: Optional[str] = None) -> Figure:
    """ActorQ-style stacked bars per precision row: actor time fractions (env step, inference,
    pull wait, deserialize, load, insert, other) and learner fractions (sample wait, update,
    publish, other)."""
    figure = Figure(figsize=(10.0, 4.0))
    for panel, (key, parts, name) in enumerate((("actor_breakdown", ACTOR_PARTS, "actor time"),
                                                ("learner_breakdown", LEARNER_PARTS, "learner time"))):
        axis = figure.add_subplot(1, 2, panel + 1)
        labels = [_label(row["actor_precision"], row["comm_precision"]) for row in rows]
        bottoms = np.zeros(len(rows))
        for part_index, part in enumerate(parts):
            heights = np.asarray([(row[key] or {}).get(part, 0.0) for row in rows])
            color = "0.65" if part == "other" else f"C{part_index}"
            axis.bar(range(len(rows)), heights, bottom=bottoms, label=part, color=color)
            bottoms += heights
        axis.set_xticks(range(len(rows)), labels, fontsize=8)
        axis.set_ylim(0, 1)
        axis.set_ylabel(f"fraction of {name}")
        axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    if path is not None:
        io.save_figure(figure, path)
    return figure


def _fmt(value: Optional[float], digits: int = 2) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def _sci(value: Optional[float]) -> str:
    return "–" if value is None else f"{value:.3g}"


def _markdown(header: Sequence[str], lines: Sequence[Sequence[str]]) -> str:
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
                      *("| " + " | ".join(line) + " |" for line in lines)])


def _interval(values: Optional[Sequence[float]], digits: int = 2) -> str:
    return "" if values is None else f" [{_fmt(values[0], digits)}, {_fmt(values[1], digits)}]"


def summary_markdown(rows: Sequence[Mapping]) -> str:
    header = ["agent", "env", "actors", "comm", "seeds", "final return fp32 policy", "final return actors' policy",
              "time to target s [95% CI] (reached)", "actor steps/s", "learner steps/s", "bytes/publish",
              "pull+deser+load s/pull", "kWh", "kg CO2"]
    return _markdown(header, [[
        row["agent"], row["env"], row["actor_precision"], row["comm_precision"], ",".join(map(str, row["seeds"])),
        f"{_fmt(row['final_return_mean'], 1)} ± {_fmt(row['final_return_std'], 1)}",
        f"{_fmt(row.get('final_return_actor_mean'), 1)} ± {_fmt(row.get('final_return_actor_std'), 1)}",
        f"{_fmt(row['time_to_target_mean'], 1)}{_interval(row.get('time_to_target_ci'), 1)} "
        f"({row['seeds_reached_target']}/{len(row['seeds'])})",
        _fmt(row["actor_steps_per_second"], 0), _fmt(row["learner_steps_per_second"], 1),
        _fmt(row["bytes_per_publish"], 0), _sci(row["pull_seconds_per_pull"]), _sci(row["kwh"]), _sci(row["kg_co2"]),
    ] for row in rows])


def speedup_markdown(rows: Sequence[Mapping]) -> str:
    header = ["agent", "env", "actors", "comm", "paired seeds", "time to target fp32/q [95% CI] (seeds)",
              "actor steps/s q/fp32 [95% CI]", "learner steps/s q/fp32 [95% CI]", "carbon fp32/q",
              "carbon to target fp32/q"]
    return _markdown(header, [[
        row["agent"], row["env"], row["actor_precision"], row["comm_precision"],
        ",".join(map(str, row["paired_seeds"])) or "–",
        f"{_fmt(row['time_to_target_ratio'])}{_interval(row.get('time_to_target_ratio_ci'))} "
        f"({row['seeds_both_reached']})",
        f"{_fmt(row['actor_steps_per_second_ratio'])}{_interval(row.get('actor_steps_per_second_ratio_ci'))}",
        f"{_fmt(row['learner_steps_per_second_ratio'])}{_interval(row.get('learner_steps_per_second_ratio_ci'))}",
        _fmt(row["carbon_ratio"]), _fmt(row["carbon_to_target_ratio"]),
    ] for row in rows])


def breakdown_markdown(rows: Sequence[Mapping]) -> str:
    header = ["agent", "env", "actors", "comm", *[f"actor {part}" for part in ACTOR_PARTS],
              *[f"learner {part}" for part in LEARNER_PARTS]]

    def percents(fractions: Optional[Mapping], parts: Sequence[str]) -> list[str]:
        return [f"{100 * fractions[part]:.1f}%" if fractions else "–" for part in parts]

    return _markdown(header, [[
        row["agent"], row["env"], row["actor_precision"], row["comm_precision"],
        *percents(row["actor_breakdown"], ACTOR_PARTS), *percents(row["learner_breakdown"], LEARNER_PARTS),
    ] for row in rows])


def _energy_lines(groups: Mapping[tuple, Sequence[Mapping]]) -> list[str]:
    notes: dict[str, int] = {}
    for runs in groups.values():
        for run in runs:
            note = run["energy_note"] or "no energy recorded and no CPU time to model it from"
            notes[note] = notes.get(note, 0) + 1
    return [f"- {count} run(s): {note}" for note, count in notes.items()]


def write_report(results: Sequence[Mapping], out_dir: str, target_return: Optional[float] = None,
                 missing: Sequence[str] = ()) -> dict:
    """Writes `report.md`, `summary.json` and `plots/*.png` into `out_dir`; returns their paths.

    `target_return` overrides the runs' own targets; `missing` lists cells without results
    (named in the report).
    """
    groups = group_runs(results, target_return)
    summary = [_summarize(runs) for runs in groups.values()]
    speedups = speedup_table(results, target_return)
    plots_dir = os.path.join(out_dir, "plots")
    paths = {"report.md": os.path.join(out_dir, "report.md"), "summary.json": os.path.join(out_dir, "summary.json")}
    sections = []
    for agent, env in dict.fromkeys((key[0], key[1]) for key in groups):
        slug = _slug(agent, env)
        env_rows = [row for row in summary if (row["agent"], row["env"]) == (agent, env)]
        figures = {
            f"return_vs_time_{slug}": lambda path: plot_returns(groups, agent, env, "wall_seconds", "wall time (s)", path),
            f"return_vs_learner_steps_{slug}": lambda path: plot_returns(groups, agent, env, "learner_steps",
                                                                         "learner steps", path),
            f"breakdown_{slug}": lambda path: plot_breakdown(env_rows, f"runtime breakdown: {agent} on {env}", path),
        }
        section = [f"## {agent} on {env}" if agent else f"## {env}", ""]
        for name, draw in figures.items():
            paths[name] = os.path.join(plots_dir, f"{name}.png")
            draw(paths[name])
            section += [f"![{name}](plots/{name}.png)", ""]
        sections += section
    targets = sorted({f"{row['env']}: {row['target_return']}" for row in summary})
    report = [
        "# ActorQ study", "",
        "Per row: means over seeds (± population std). Final return: the learner's policy evaluated at the end, "
        "in fp32 and at the actors' precision (the policy the actors run). Intervals: 95% percentile bootstrap "
        "over seeds (paired by seed for ratios). Time to target: wall time of the first evaluation reaching the target (no interpolation "
        "between evaluations), mean over the seeds that reached it. Speedups pair each row with the fp32-actor "
        "row of the same env seed by seed (ratios of means over paired seeds; time to target only over seeds "
        "where both reached it; carbon to target = each run's kg CO2 × time to target / wall time).", "",
        f"Targets: {', '.join(targets)}.", "",
        "Energy per run estimated as follows:", *_energy_lines(groups), "",
        "## Summary", "", summary_markdown(summary), "",
        "## Speedup vs fp32 actors", "", speedup_markdown(speedups) if speedups else "No fp32-actor baseline rows.", "",
        "## Runtime breakdown (fraction of summed actor / learner time)", "", breakdown_markdown(summary), "",
        *sections,
    ]
    if missing:
        report += ["## Cells without results", "", *[f"- {cell}" for cell in missing], ""]
    runs = [{key: value for key, value in run.items() if key != "evaluations"} for runs in groups.values() for run in runs]
    io.atomic_write_json(paths["summary.json"], {"summary": summary, "speedups": speedups, "runs": runs,
                                                 "missing": list(missing)})
    io.atomic_write_text(paths["report.md"], "\n".join(report))
    return paths
