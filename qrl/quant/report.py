"""PTQ sweep outputs: results.json, a markdown table and the sweet-spot plot (return vs bits)."""

import os
from typing import Mapping, Optional

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the headless backend)

from qrl import io  # noqa: E402


def _format(value, digits: int = 2) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def markdown_table(sweep: Mapping) -> str:
    """One row per precision: return, E, divergence, bytes, latency."""
    rows = sweep["results"]
    latency_keys = sorted(
        (key for key in rows[0] if key.startswith("latency_us_batch")), key=lambda k: int(k.rsplit("batch", 1)[1])
    )
    divergence_keys = ["kl_divergence", "action_agreement"] if sweep["divergence"] == "categorical" else ["mean_action_distance"]
    header = ["precision", "bits", "return (mean ± std)", "E", *divergence_keys, "param bytes", "bytes / fp32"]
    header += [f"latency µs (batch {key.rsplit('batch', 1)[1]})" for key in latency_keys]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [
            row["precision"],
            str(row["bits"]),
            f"{row['mean_return']:.1f} ± {row['std_return']:.1f}",
            _format(row["relative_error"], 3),
            *[_format(row[key], 4) for key in divergence_keys],
            str(row["param_bytes"]),
            _format(row["bytes_ratio_to_fp32"], 3),
            *[f"{row[key]:.0f} ({row[key.replace('us', 'ratio')]:.2f}×)" for key in latency_keys],
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_sweetspot(sweep: Mapping, path: str, title: Optional[str] = None) -> None:
    """Mean return (± std) against bits per weight, one series per quantization family."""
    figure, axis = plt.subplots(figsize=(6.4, 4.2))
    families = {"float": ("fp32 / fp16 / bf16", "o"), "symmetric": ("int-N (weights + activations)", "s"),
                "quarl": ("QuaRL rule (weights only)", "^")}
    for family, (label, marker) in families.items():
        rows = sorted((row for row in sweep["results"] if row["family"] == family), key=lambda row: row["bits"])
        if not rows:
            continue
        axis.errorbar(
            [row["bits"] for row in rows],
            [row["mean_return"] for row in rows],
            yerr=[row["std_return"] for row in rows],
            marker=marker,
            capsize=3,
            label=label,
        )
        for row in rows:
            axis.annotate(row["precision"], (row["bits"], row["mean_return"]), textcoords="offset points",
                          xytext=(4, 4), fontsize=7)
    axis.set_xscale("log", base=2)
    axis.set_xlabel("bits per weight")
    axis.set_ylabel(f"return over {sweep['episodes']} episodes")
    axis.set_title(title or f"PTQ sweet spot: {sweep['env']}")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    io.save_figure(figure, path)
    plt.close(figure)


def write_ptq_outputs(sweep: Mapping, out_dir: str, title: Optional[str] = None) -> dict:
    """Writes `results.json`, `report.md` and `sweetspot.png` into `out_dir` atomically."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {name: os.path.join(out_dir, name) for name in ("results.json", "report.md", "sweetspot.png")}
    plot_sweetspot(sweep, paths["sweetspot.png"], title)
    report = "\n".join([
        f"# Post-training quantization: {sweep['env']}",
        "",
        f"{sweep['episodes']} evaluation episodes per precision (environment seeds {sweep['seed']}.."
        f"{sweep['seed'] + sweep['episodes'] - 1}); E = (R_fp32 − R_q) / |R_fp32|; divergence measured on "
        f"{sweep['divergence_steps']} states visited by the fp32 policy; static activation scales "
        f"calibrated on {sweep['calibration_steps']} other fp32 states. Latency: median of the jitted "
        "policy (observations → actions) on this machine.",
        "",
        markdown_table(sweep),
        "",
        "![sweet spot](sweetspot.png)",
        "",
    ])
    io.atomic_write_text(paths["report.md"], report)
    io.atomic_write_json(paths["results.json"], sweep)
    return paths
