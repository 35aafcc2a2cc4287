"""The QuaRL study's outputs: per-cell results gathered into tables, sweet-spot and weight plots.

Input is one record per cell (`agent`, `env_id`, `seed`, `qat_bits`, `dir`): an fp32 cell's
directory holds `train/results.json` and the PTQ sweep `ptq/results.json`; a QAT cell's holds
`train/results.json` and `qat_eval/results.json` (its exported `int<N>` policy). Returns are
pooled over every evaluation episode of every seed (mean ± std); E = (R_fp32 − R_q)/|R_fp32|
against the fp32 cells' fp32 return of the same algorithm and environment, as QuaRL reports it.
"""

import os
from typing import Any, Mapping, Optional, Sequence

import numpy as np
from matplotlib.figure import Figure

from qrl import io
from qrl.quant import ops, report
from qrl.quant.precision import Precision

PTQ_DIR, QAT_EVAL_DIR, TRAIN_DIR = "ptq", "qat_eval", "train"
RESULTS_FILE = "results.json"


def _pooled(returns: Sequence[float]) -> tuple[float, float]:
    values = np.asarray(returns, np.float64)
    return float(values.mean()), float(values.std())


def _relative_error(reference: float, value: float) -> Optional[float]:
    return (reference - value) / abs(reference) if reference != 0 else None


def gather(cells: Sequence[Mapping[str, Any]]) -> list[dict]:
    """Per (agent, environment): PTQ rows per precision and QAT rows per bits, over seeds."""
    pairs: dict[tuple[str, str], dict] = {}
    for cell in cells:
        key = (cell["agent"], cell["env_id"])
        pair = pairs.setdefault(key, {"agent": key[0], "env": key[1], "ptq": {}, "qat": {}, "seeds": set(), "train": []})
        pair["seeds"].add(cell["seed"])
        train = io.read_json(os.path.join(cell["dir"], TRAIN_DIR, RESULTS_FILE))
        pair["train"].append({"seed": cell["seed"], "variant": f"qat{cell['qat_bits']}" if cell["qat_bits"] else "fp32",
                              "steps": train["env_steps"], "steps_per_second": train["steps_per_second"],
                              "train_seconds": train["train_seconds"]})
        if cell["qat_bits"]:
            sweep = io.read_json(os.path.join(cell["dir"], QAT_EVAL_DIR, RESULTS_FILE))
            served = next(row for row in sweep["results"] if row["precision"] != "fp32")
            float_row = next(row for row in sweep["results"] if row["precision"] == "fp32")
            entry = pair["qat"].setdefault(cell["qat_bits"], {"returns": [], "float_returns": [], "rows": []})
            entry["returns"] += served["returns"]
            entry["float_returns"] += float_row["returns"]
            entry["rows"].append(served)
            entry["quant_delay"] = cell.get("quant_delay", 0)
        else:
            sweep = io.read_json(os.path.join(cell["dir"], PTQ_DIR, RESULTS_FILE))
            pair["divergence"] = sweep["divergence"]
            for row in sweep["results"]:
                entry = pair["ptq"].setdefault(row["precision"], {"returns": [], "rows": []})
                entry["returns"] += row["returns"]
                entry["rows"].append(row)
    return [_summarize(pair) for pair in pairs.values()]


def _mean_of(rows: Sequence[Mapping], key: str) -> Optional[float]:
    values = [row[key] for row in rows if row.get(key) is not None]
    return float(np.mean(values)) if values else None


def _summarize(pair: dict) -> dict:
    reference = pair["ptq"].get("fp32")
    reference_return = _pooled(reference["returns"])[0] if reference else None
    ptq_rows = []
    for precision, entry in pair["ptq"].items():
        rows = entry["rows"]
        mean, std = _pooled(entry["returns"])
        ptq_rows.append({
            "precision": precision, "bits": rows[0]["bits"], "family": rows[0]["family"],
            "mean_return": mean, "std_return": std,
            "seed_means": [row["mean_return"] for row in rows],
            "relative_error": _relative_error(reference_return, mean) if reference_return is not None else None,
            "kl_divergence": _mean_of(rows, "kl_divergence"), "action_agreement": _mean_of(rows, "action_agreement"),
            "mean_action_distance": _mean_of(rows, "mean_action_distance"),
            "param_bytes": rows[0]["param_bytes"], "packed_param_bytes": rows[0]["packed_param_bytes"],
            "bytes_ratio_to_fp32": rows[0]["bytes_ratio_to_fp32"],
            "latency_ratio_batch1": _mean_of(rows, "latency_ratio_batch1"),
            "latency_ratio_batch256": _mean_of(rows, "latency_ratio_batch256"),
        })
    qat_rows = []
    for bits, entry in sorted(pair["qat"].items(), reverse=True):
        mean, std = _pooled(entry["returns"])
        qat_rows.append({
            "precision": f"qat{bits} → int{bits}", "bits": bits, "quant_delay": entry["quant_delay"],
            "mean_return": mean, "std_return": std, "seed_means": [row["mean_return"] for row in entry["rows"]],
            "float_mean_return": _pooled(entry["float_returns"])[0],
            "relative_error": _relative_error(reference_return, mean) if reference_return is not None else None,
            "param_bytes": entry["rows"][0]["param_bytes"], "packed_param_bytes": entry["rows"][0]["packed_param_bytes"],
        })
    return {
        "agent": pair["agent"], "env": pair["env"], "seeds": sorted(pair["seeds"]),
        "divergence": pair.get("divergence"), "fp32_return": reference_return,
        "ptq": ptq_rows, "qat": qat_rows, "train": pair["train"],
    }


def _fmt(value: Optional[float], digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


E_TOLERANCE = 0.05  # |E| a precision may lose and still count as keeping the fp32 return.


def lowest_bits(rows: Sequence[Mapping], tolerance: float = E_TOLERANCE) -> Optional[int]:
    """The fewest bits `b` of one scheme's rows such that every measured width >= b keeps
    |E| <= tolerance (None if even the widest does not): noise at one width below cannot make a
    narrower width count."""
    widths = sorted({row["bits"] for row in rows}, reverse=True)
    best = None
    for bits in widths:
        errors = [row["relative_error"] for row in rows if row["bits"] == bits]
        if any(error is None or abs(error) > tolerance for error in errors):
            break
        best = bits
    return best


def lowest_bits_table(pairs: Sequence[Mapping], tolerance: float = E_TOLERANCE) -> str:
    """Per algorithm/environment and scheme: the lowest bit width keeping |E| <= tolerance, and
    which schemes keep it at 8 bits (the study's goal: at least one per cell)."""
    schemes = list(dict.fromkeys(row["family"] for pair in pairs for row in pair["ptq"] if row["family"] != "float"))
    has_qat = any(pair["qat"] for pair in pairs)
    header = ["algorithm", "environment", "fp32 return", *schemes, *(["qat"] if has_qat else []),
              f"|E| ≤ {tolerance:.0%} at 8 bits"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for pair in pairs:
        cells = [pair["agent"], pair["env"], _fmt(pair["fp32_return"], 1)]
        at_eight = []
        for scheme in schemes:
            rows = [row for row in pair["ptq"] if row["family"] == scheme]
            bits = lowest_bits(rows, tolerance) if rows else None
            cells.append("–" if not rows else (str(bits) if bits is not None else "none"))
            if bits is not None and bits <= 8 and any(row["bits"] == 8 for row in rows):
                at_eight.append(scheme)
        if has_qat:
            bits = lowest_bits(pair["qat"], tolerance) if pair["qat"] else None
            cells.append("–" if not pair["qat"] else (str(bits) if bits is not None else "none"))
            if bits is not None and bits <= 8 and any(row["bits"] == 8 for row in pair["qat"]):
                at_eight.append("qat")
        cells.append(", ".join(at_eight) if at_eight else "**none**")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary_table(pairs: Sequence[Mapping]) -> str:
    """QuaRL-style overview: fp32 return and E per precision for every algorithm/environment."""
    precisions = list(dict.fromkeys(row["precision"] for pair in pairs for row in pair["ptq"] if row["precision"] != "fp32"))
    qat_names = list(dict.fromkeys(row["precision"] for pair in pairs for row in pair["qat"]))
    header = ["algorithm", "environment", "fp32 return", *[f"E {name}" for name in precisions], *[f"E {name}" for name in qat_names]]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for pair in pairs:
        ptq = {row["precision"]: row for row in pair["ptq"]}
        qat = {row["precision"]: row for row in pair["qat"]}
        fp32 = ptq.get("fp32")
        cells = [pair["agent"], pair["env"], f"{fp32['mean_return']:.1f} ± {fp32['std_return']:.1f}" if fp32 else "–"]
        cells += [_fmt(ptq[name]["relative_error"]) if name in ptq else "–" for name in precisions]
        cells += [_fmt(qat[name]["relative_error"]) if name in qat else "–" for name in qat_names]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _seed_spread(row: Mapping) -> str:
    """Mean ± std over seeds of each seed's mean return (n seeds)."""
    means = np.asarray(row["seed_means"], np.float64)
    return f"{means.mean():.1f} ± {means.std():.1f} (n={means.size})"


def pair_table(pair: Mapping) -> str:
    """Every precision of one algorithm/environment: return, E, divergence, bytes, latency."""
    categorical = pair["divergence"] == "categorical"
    divergence = ["KL", "agreement"] if categorical else ["mean action distance"]
    header = ["precision", "bits", "return (mean ± std)", "seed means (mean ± std)", "E", *divergence,
              "bytes (packed)", "bytes / fp32",
              "latency b1 / b256 vs fp32"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in pair["ptq"]:
        div = [_fmt(row["kl_divergence"], 4), _fmt(row["action_agreement"])] if categorical else [_fmt(row["mean_action_distance"], 4)]
        lines.append("| " + " | ".join([
            row["precision"], str(row["bits"]), f"{row['mean_return']:.1f} ± {row['std_return']:.1f}",
            _seed_spread(row), _fmt(row["relative_error"]), *div, f"{row['param_bytes']:,} ({row['packed_param_bytes']:,})",
            _fmt(row["bytes_ratio_to_fp32"]), f"{_fmt(row['latency_ratio_batch1'], 2)} / {_fmt(row['latency_ratio_batch256'], 2)}",
        ]) + " |")
    for row in pair["qat"]:
        lines.append("| " + " | ".join([
            f"{row['precision']} (delay {row['quant_delay']:,})", str(row["bits"]),
            f"{row['mean_return']:.1f} ± {row['std_return']:.1f}", _seed_spread(row), _fmt(row["relative_error"]),
            *(["–"] * len(divergence)), f"{row['param_bytes']:,} ({row['packed_param_bytes']:,})", "–", "–",
        ]) + " |")
    return "\n".join(lines)


def plot_pair_sweetspot(pair: Mapping, path: Optional[str] = None) -> Figure:
    """Return vs bits: PTQ int-N (weights + activations), float precisions, QAT exports, fp32 line."""
    figure = Figure(figsize=(6.0, 4.0))
    axis = figure.add_subplot()
    for family, rows in report.scheme_series(pair["ptq"]):
        axis.errorbar([row["bits"] for row in rows], [row["mean_return"] for row in rows],
                      yerr=[row["std_return"] for row in rows], marker=report.SCHEME_MARKERS.get(family, "s"),
                      capsize=3, label=f"PTQ {report.scheme_label(family)}", linestyle="none" if family == "float" else "-")
    if pair["qat"]:
        rows = sorted(pair["qat"], key=lambda row: row["bits"])
        axis.errorbar([row["bits"] for row in rows], [row["mean_return"] for row in rows],
                      yerr=[row["std_return"] for row in rows], marker="*", markersize=10, capsize=3,
                      label="QAT → int-N", linestyle="--")
    if pair["fp32_return"] is not None:
        axis.axhline(pair["fp32_return"], color="gray", linestyle=":", linewidth=1, label="fp32 return")
    axis.set_xscale("log", base=2)
    axis.set_xlabel("bits per weight")
    axis.set_ylabel("return")
    axis.set_title(f"{pair['agent']} on {pair['env']} (seeds {', '.join(map(str, pair['seeds']))})")
    return io.finish_plot(figure, axis, path)


def _layers(params: Mapping, prefix: str = "") -> list[tuple[str, np.ndarray]]:
    found = []
    for key, child in params.items():
        name = f"{prefix}/{key}" if prefix else key
        if isinstance(child, Mapping) and "kernel" in child and not isinstance(child["kernel"], Mapping):
            found.append((name, np.asarray(child["kernel"], np.float32)))
        elif isinstance(child, Mapping):
            found += _layers(child, name)
    return found


def plot_weight_histograms(params: Mapping, precisions: Sequence[Precision], title: str,
                           path: Optional[str] = None, max_layers: int = 4) -> Figure:
    """Per layer (up to `max_layers`): the fp32 kernel's histogram beside the same kernel after
    quantize-dequantize at each integer precision (what the quantized network computes with)."""
    layers = _layers(params)[:max_layers]
    integer = [precision for precision in precisions if not precision.is_float][:3]
    figure = Figure(figsize=(3.2 * (1 + len(integer)), 2.4 * max(1, len(layers))))
    for row, (name, kernel) in enumerate(layers):
        edges = np.linspace(kernel.min(), kernel.max(), 81)
        for column, precision in enumerate([None, *integer]):
            axis = figure.add_subplot(len(layers), 1 + len(integer), row * (1 + len(integer)) + column + 1)
            if precision is None:
                values, label = kernel, "fp32"
            else:
                quantized, scale = ops.quantize_weights(kernel, precision)
                values, label = np.asarray(ops.dequantize(quantized, scale)), precision.name
            axis.hist(values.ravel(), bins=edges, color="C0" if precision is None else "C1")
            axis.set_yscale("log")
            axis.set_title(f"{name} {label}", fontsize=7)
            axis.tick_params(labelsize=6)
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    if path is not None:
        io.save_figure(figure, path)
    return figure


def write_study_outputs(study_dir: str, cells: Sequence[Mapping[str, Any]],
                        weight_plots: Optional[Mapping[tuple[str, str], str]] = None) -> dict:
    """Writes `results.json`, `report.md` and `plots/sweetspot_*.png`; returns their paths.

    `weight_plots` maps (agent, env) to an already written weight-histogram PNG to embed.
    """
    pairs = gather(cells)
    plots_dir = os.path.join(study_dir, "plots")
    os.makedirs(plots_dir, exist_ok=True)
    paths = {"results.json": os.path.join(study_dir, "results.json"), "report.md": os.path.join(study_dir, "report.md")}
    sections = []
    for pair in pairs:
        slug = f"{pair['agent']}_{pair['env'].replace(':', '_').replace('/', '_')}"
        sweetspot = os.path.join(plots_dir, f"sweetspot_{slug}.png")
        plot_pair_sweetspot(pair, sweetspot)
        paths[f"sweetspot_{slug}"] = sweetspot
        train = ", ".join(f"seed {t['seed']} {t['variant']}: {t['steps']:,} steps at {t['steps_per_second']:.0f}/s"
                          for t in pair["train"])
        section = [f"## {pair['agent']} on {pair['env']}", "", f"Training: {train}.", "", pair_table(pair), "",
                   f"![sweet spot](plots/{os.path.basename(sweetspot)})", ""]
        weights = (weight_plots or {}).get((pair["agent"], pair["env"]))
        if weights:
            section += [f"![weights](plots/{os.path.basename(weights)})", ""]
        sections += section
    lines = [
        "# QuaRL study", "",
        "Returns pooled over all evaluation episodes of all seeds (mean ± std). E = (R_fp32 − R_q) / |R_fp32| "
        "against the fp32-trained policy's fp32 return; seed means ± std in the per-pair tables. PTQ rows "
        "quantize the fp32-trained policy under each scheme (README, \"Quantization schemes\": quarl<N> and "
        "quarl_fp16 / quarl_dyn8 are QuaRL's, int<N>[-...] qrl's weights + activations scheme; int8 runs real "
        "int8 kernels). QAT rows train with N-bit fake quantization after the delay and evaluate the exported "
        "int-N policy.",
        "", f"Lowest bit width per scheme with |E| ≤ {E_TOLERANCE:.0%} at it and every wider width measured:", "",
        lowest_bits_table(pairs), "", summary_table(pairs), "", *sections,
    ]
    io.atomic_write_json(paths["results.json"], {"pairs": pairs, "cells": [dict(cell) for cell in cells]})
    io.atomic_write_text(paths["report.md"], "\n".join(lines))
    return paths
