"""PTQ sweep outputs: results.json, a markdown table and the sweet-spot plot (return vs bits)."""

import os
from typing import Mapping, Optional

from matplotlib.figure import Figure

from qrl import io


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
    header = ["precision", "bits", "return (mean ± std)", "E", *divergence_keys, "param bytes", "packed bytes",
              "bytes / fp32"]
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
            str(row["packed_param_bytes"]),
            _format(row["bytes_ratio_to_fp32"], 3),
            *[f"{row[key]:.0f} ({row[key.replace('us', 'ratio')]:.2f}×)" for key in latency_keys],
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


SCHEME_LABELS = {
    "float": "fp32 / fp16 / bf16 / quarl_fp16",
    "quarl": "QuaRL rule (weights only)",
    "quarl_dyn": "QuaRL dynamic int8",
    "int": "qrl W+A (static, per-feature obs, affine)",
}
SCHEME_MARKERS = {"float": "o", "quarl": "^", "quarl_dyn": "D", "int": "s"}


def scheme_label(family: str) -> str:
    """A legend label for a scheme family (`Precision.scheme`), e.g. `int-e8-dyn` -> `qrl W+A int-e8-dyn`."""
    return SCHEME_LABELS.get(family, f"qrl W+A {family}")


def scheme_series(rows) -> list:
    """`[(family, rows sorted by bits), ...]` in first-seen order: one plot series per scheme."""
    families = list(dict.fromkeys(row["family"] for row in rows))
    return [(family, sorted((row for row in rows if row["family"] == family), key=lambda row: row["bits"]))
            for family in families]


def plot_sweetspot(sweep: Mapping, path: Optional[str] = None, title: Optional[str] = None) -> Figure:
    """Mean return (± std) against bits per weight, one series per quantization family; the
    fp32 return is a dashed reference line. Saved atomically to `path` when given.

    Built on `matplotlib.figure.Figure` (no pyplot), so it neither needs nor changes a backend:
    in a notebook, display the returned figure.
    """
    figure = Figure(figsize=(6.4, 4.2))
    axis = figure.add_subplot()
    for family, rows in scheme_series(sweep["results"]):
        axis.errorbar(
            [row["bits"] for row in rows],
            [row["mean_return"] for row in rows],
            yerr=[row["std_return"] for row in rows],
            marker=SCHEME_MARKERS.get(family, "s"),
            capsize=3,
            label=scheme_label(family),
            linestyle="none" if family == "float" else "-",
        )
        seen_bits: dict = {}
        for row in rows:
            offset = 4 + 10 * seen_bits.get(row["bits"], 0)  # fp16 and bf16 share 16 bits.
            seen_bits[row["bits"]] = seen_bits.get(row["bits"], 0) + 1
            axis.annotate(row["precision"], (row["bits"], row["mean_return"]), textcoords="offset points",
                          xytext=(4, offset), fontsize=7)
    reference = next((row for row in sweep["results"] if row["precision"] == "fp32"), None)
    if reference is not None:
        axis.axhline(reference["mean_return"], color="gray", linestyle="--", linewidth=1, label="fp32 return")
    axis.set_xscale("log", base=2)
    axis.set_xlabel("bits per weight")
    axis.set_ylabel(f"return over {sweep['episodes']} episodes")
    axis.set_title(title or f"PTQ sweet spot: {sweep['env']}")
    return io.finish_plot(figure, axis, path)


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
