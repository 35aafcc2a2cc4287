"""The lean int8 path (`qrl.quant.lean`) against fp32, bf16, the unpacked int8 layers and ONNX
Runtime's int8, per batch size, and the dispatch table it yields for this ISA class.

    .venv/bin/python -m bench.int8_lean [--quick] [--json=PATH] [--write_dispatch] [--no_onnx]

Models: the study's MLP 17→256→256→6, ActorQ's D4PG actor 17→300→200→6 and QuaRL's
17→2048→2048→2048→6 (batches up to 256), int8 with static (calibrated) activation scales. JAX candidates, timed
round-robin in this process (jitted, parameters passed as arguments, async dispatch off):
`fp32`, `bf16`, `int8 layers` (`qrl.networks.MLP` at int8: per-layer arguments, per-call
products) and `lean int8 on <unit>` for the units `int8`, `bf16`, `fp32` (the same integer
outputs on each). ONNX Runtime runs the same int8 policy exported by `qrl.deploy` (and its fp32
export) in a peer process (`bench/onnx_peer.py --models`, one thread).

Goals (issue 19): the fastest lean unit ≤ 1.0× fp32 at batch 1 and ≤ 0.6× at batch 4096, and
within 1.5× of ONNX Runtime's int8 at every batch. `--write_dispatch` stores the fastest lean
unit per (model, batch) for this ISA class in `qrl/quant/lean_dispatch.json`, which
`qrl.quant.lean.serving_unit` reads.
"""

import argparse
import datetime
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

from bench.timing import interleaved_medians

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INPUT_SIZE = 17
MODELS = {"mlp 256-256": (256, 256, 6), "d4pg 300-200": (300, 200, 6), "mlp 2048-2048-2048": (2048, 2048, 2048, 6)}
QUICK_MODELS = ("mlp 256-256",)
# The 2048-wide policy stops at batch 256: one int8-layers call at 4096 takes seconds on AVX2.
LARGEST_BATCH = {"mlp 2048-2048-2048": 256}
CALIBRATION_SIZE = 1024
UNITS = ("int8", "bf16", "fp32")
GOAL_BATCH1, GOAL_BATCH4096, GOAL_VS_ORT = 1.0, 0.6, 1.5
FULL_DEFAULTS = {"rounds": 15, "round_seconds": 0.01, "batches": "1,32,256,4096"}
QUICK_DEFAULTS = {"rounds": 3, "round_seconds": 0.005, "batches": "1,32"}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke test: the 256-256 MLP, batches 1,32, 3 short rounds")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    parser.add_argument("--models", default=None, help=f"comma-separated, of: {', '.join(MODELS)} (all; quick: 256-256)")
    parser.add_argument("--batches", default=None, help="comma-separated batch sizes (1,32,256,4096)")
    parser.add_argument("--rounds", type=int, default=None, help="round-robin rounds per batch size (15)")
    parser.add_argument("--round_seconds", type=float, default=None, help="time of one candidate's turn (0.01)")
    parser.add_argument("--no_onnx", action="store_true", help="skip ONNX Runtime")
    parser.add_argument("--peer_python", default=sys.executable,
                        help="interpreter with onnx + onnxruntime for bench/onnx_peer.py")
    parser.add_argument("--write_dispatch", nargs="?", const=os.path.join(REPO_ROOT, "qrl", "quant", "lean_dispatch.json"),
                        default=None, help="store this ISA class's fastest unit per model and batch in this table "
                        "(qrl/quant/lean_dispatch.json)")
    args = parser.parse_args(argv)
    defaults = QUICK_DEFAULTS if args.quick else FULL_DEFAULTS
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    try:
        args.batches = sorted({int(item) for item in str(args.batches).split(",") if item.strip()})
    except ValueError:
        parser.error(f"--batches must be comma-separated integers, got {args.batches!r}")
    if not args.batches or min(args.batches) < 1:
        parser.error("--batches must be integers >= 1")
    if args.rounds < 1 or args.round_seconds <= 0:
        parser.error("--rounds must be >= 1 and --round_seconds > 0")
    names = args.models.split(",") if args.models else list(QUICK_MODELS if args.quick else MODELS)
    unknown = [name for name in names if name not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    args.models = names
    for flag, path in (("--write_dispatch", args.write_dispatch), ("--json", args.json)):
        if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            parser.error(f"{flag}: no directory {os.path.dirname(os.path.abspath(path))}")
    if not args.no_onnx and not _has_onnx(args.peer_python):
        parser.error(f"{args.peer_python} lacks onnx / onnxruntime: `make bench-deps` installs them "
                     "(.venv-bench), or pass --no_onnx")
    return args


def _has_onnx(python: str) -> bool:
    if python == sys.executable:
        return all(importlib.util.find_spec(name) for name in ("onnx", "onnxruntime"))
    try:
        probe = subprocess.run([python, "-c", "import onnx, onnxruntime"], capture_output=True, check=False)
    except OSError:
        return False
    return probe.returncode == 0


def build_candidates(layers: tuple, rng: np.random.Generator):
    """(JAX candidates `{name: (apply, params)}`, quantized int8 params, fp32 params, calibration
    observations, parameter count) for one MLP."""
    import jax

    from qrl.networks import MLP
    from qrl.quant import calibrate, parse_precision, quantize_params
    from qrl.quant import lean

    observations = rng.standard_normal((CALIBRATION_SIZE, INPUT_SIZE)).astype(np.float32)
    fp32 = MLP(layers, activate_final=False)
    params = jax.jit(fp32.init)(jax.random.PRNGKey(0), observations[:1])["params"]
    ranges = calibrate(fp32.apply, params, observations)
    int8 = parse_precision("int8")
    quantized = quantize_params(params, int8, ranges)
    candidates = {}
    for name, precision_name in (("fp32", "fp32"), ("bf16", "bf16"), ("int8 layers", "int8")):
        precision = parse_precision(precision_name)
        network = MLP(layers, precision=precision, activate_final=False)
        candidate_params = quantize_params(params, precision, ranges)
        candidates[name] = (jax.jit(lambda p, x, network=network: network.apply({"params": p}, x)),
                            jax.device_put(candidate_params))
    for unit in UNITS:
        layout, packed = lean.pack_mlp(quantized, int8, unit=unit)
        candidates[f"lean int8 on {unit}"] = (lean.lean_apply(layout), jax.device_put(packed))
    count = sum(int(np.size(leaf)) for leaf in jax.tree_util.tree_leaves(params))
    return candidates, quantized, params, observations, count


def time_jax(candidates: dict, batches: list, args, rng: np.random.Generator) -> dict:
    """Median wall µs per call per candidate and batch, and each lean unit's max |difference|
    from the int8 layers' outputs."""
    import jax

    latency, difference = {name: {} for name in candidates}, {}
    for batch in batches:
        x = jax.device_put(rng.standard_normal((batch, INPUT_SIZE)).astype(np.float32))
        reference = np.asarray(candidates["int8 layers"][0](candidates["int8 layers"][1], x))
        for name, (apply, params) in candidates.items():
            if name.startswith("lean"):
                difference.setdefault(name, {})[batch] = float(np.max(np.abs(np.asarray(apply(params, x)) - reference)))
        calls = {name: (lambda apply=apply, params=params: jax.block_until_ready(apply(params, x)))
                 for name, (apply, params) in candidates.items()}
        for name, seconds in interleaved_medians(calls, args.rounds, args.round_seconds).items():
            latency[name][batch] = seconds["wall"] * 1e6
    return {"latency_us": latency, "max_abs_difference_vs_int8_layers": difference}


def time_onnx(models: dict, batches: list, args) -> dict:
    """Exports each model's fp32 and int8 (static) policy with qrl.deploy and times them in the
    ONNX Runtime peer; `{model: {"fp32": {batch: µs}, "int8": {...}}}` or `{"error": ...}`."""
    import jax

    from qrl.deploy.onnx_graph import to_onnx
    from qrl.networks import MLP
    from qrl.quant import parse_precision

    with tempfile.TemporaryDirectory() as directory:
        for model_name, (layers, params, quantized, observations) in models.items():
            for scheme, scheme_params in (("fp32", params), ("int8", quantized)):
                network = MLP(layers, precision=parse_precision(scheme), activate_final=False)
                frozen = jax.tree.map(np.asarray, scheme_params)
                model = to_onnx(lambda x, network=network, frozen=frozen: network.apply({"params": frozen}, x),
                                observations.shape[1:], ["y"], observation_dtype=observations.dtype)
                with open(os.path.join(directory, f"{model_name}__{scheme}.onnx"), "wb") as handle:
                    handle.write(model.SerializeToString())
        command = [args.peer_python, "-m", "bench.onnx_peer", f"--models={directory}",
                   f"--batches={','.join(map(str, batches))}", f"--rounds={args.rounds}",
                   f"--round_seconds={args.round_seconds}", "--ort_threads=1", "--single_calls=0"]
        completed = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        lines = completed.stderr.strip().splitlines() or ["no output"]
        return {"error": f"onnx peer exited with status {completed.returncode}: {lines[-1]}"}
    timed = json.loads(completed.stdout.strip().splitlines()[-1])
    result = {}
    for name, row in timed["latency_us"].items():
        model_name, scheme = name.split("__", 1)
        result.setdefault(model_name, {})[scheme] = {int(batch): value for batch, value in row.items()}
    return result


def summarize(model_name: str, jax_times: dict, ort: dict) -> dict:
    """Ratios to JAX fp32, the fastest lean unit per batch, and lean-best / ORT int8."""
    latency = jax_times["latency_us"]
    fp32 = latency["fp32"]
    ratios = {name: {batch: value / fp32[batch] for batch, value in row.items()} for name, row in latency.items()}
    fastest, best_ratio, versus_ort = {}, {}, {}
    for batch in fp32:
        unit = min(UNITS, key=lambda unit: latency[f"lean int8 on {unit}"][batch])
        fastest[batch] = unit
        best_ratio[batch] = ratios[f"lean int8 on {unit}"][batch]
        ort_int8 = ort.get(model_name, {}).get("int8", {}).get(batch)
        if ort_int8:
            versus_ort[batch] = latency[f"lean int8 on {unit}"][batch] / ort_int8
    return {"ratio_to_fp32": ratios, "fastest_unit": fastest, "best_lean_ratio_to_fp32": best_ratio,
            "best_lean_over_ort_int8": versus_ort}


def evaluate_goals(results: dict) -> list:
    goals = []
    for model_name, model in results["models"].items():
        best = model["summary"]["best_lean_ratio_to_fp32"]
        for batch, bound in ((1, GOAL_BATCH1), (4096, GOAL_BATCH4096)):
            if batch in best:
                goals.append({"name": f"{model_name}: fastest lean int8 / fp32 at batch {batch}", "bound": bound,
                              "value": best[batch], "passed": best[batch] <= bound})
        for batch, value in model["summary"]["best_lean_over_ort_int8"].items():
            goals.append({"name": f"{model_name}: fastest lean int8 / ORT int8 at batch {batch}", "bound": GOAL_VS_ORT,
                          "value": value, "passed": value <= GOAL_VS_ORT})
    return goals


def dispatch_entries(results: dict) -> list:
    return [{"params": model["param_count"], "batch": int(batch), "unit": unit, "model": model_name}
            for model_name, model in results["models"].items()
            for batch, unit in model["summary"]["fastest_unit"].items()]


def write_dispatch(path: str, machine_record: dict, entries: list, command: str) -> None:
    """Replaces this ISA class's entry of the dispatch table at `path` (atomically)."""
    table = {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as handle:
            table = json.load(handle)
    from bench.machine import describe

    table[machine_record["isa_class"]] = {
        "machine": describe(machine_record), "measured": datetime.date.today().isoformat(), "command": command,
        "entries": entries}
    temporary = f"{path}.tmp-{os.getpid()}"
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(table, handle, indent=1, sort_keys=True)
        handle.write("\n")
    os.replace(temporary, path)


def headline_cells(results: dict) -> list:
    from bench.tables import cell

    cells = []
    for model_name, model in results["models"].items():
        for name, row in model["jax"]["latency_us"].items():
            for batch, value in row.items():
                cells.append(cell("lean int8 latency", f"{model_name} {name}", f"batch {batch}", value, "µs",
                                  model["summary"]["ratio_to_fp32"][name][batch]))
        for batch, value in model["summary"]["best_lean_over_ort_int8"].items():
            cells.append(cell("lean int8 vs ORT", f"{model_name} fastest lean / ORT int8", f"batch {batch}", value, "×"))
    return cells


def report(results: dict) -> str:
    lines = [f"lean int8 path — {results['machine_line']}"]
    for model_name, model in results["models"].items():
        batches = sorted(model["jax"]["latency_us"]["fp32"])
        lines.append(f"\n{model_name} ({model['param_count']:,} params): median µs per call (ratio to JAX fp32)")
        lines.append(f"{'candidate':<22}" + "".join(f"{f'batch {batch}':>20}" for batch in batches))
        for name, row in model["jax"]["latency_us"].items():
            ratio = model["summary"]["ratio_to_fp32"][name]
            lines.append(f"{name:<22}" + "".join(f"{f'{row[b]:.1f} ({ratio[b]:.2f})':>20}" for b in batches))
        for scheme, row in results["onnx"].get(model_name, {}).items() if "error" not in results["onnx"] else ():
            lines.append(f"{'ORT ' + scheme:<22}" + "".join(f"{row.get(b, float('nan')):>20.1f}" for b in batches))
        lines.append("fastest lean unit: " + ", ".join(f"batch {b}: {u}" for b, u in model["summary"]["fastest_unit"].items()))
        differences = model["jax"]["max_abs_difference_vs_int8_layers"]
        lines.append("max |lean - int8 layers|: " + ", ".join(
            f"{name[len('lean int8 on '):]} {max(row.values()):.1e}" for name, row in differences.items()))
    if "error" in results["onnx"]:
        lines.append(f"\nONNX Runtime: {results['onnx']['error']}")
    lines.append("\nGoals:")
    for goal in results["goals"]:
        lines.append(f"  {goal['name']}: {goal['value']:.2f} (≤ {goal['bound']}) {'met' if goal['passed'] else 'MISSED'}")
    return "\n".join(lines)


def main(argv=None) -> None:
    args = parse_args(argv)
    import jax

    jax.config.update("jax_cpu_enable_async_dispatch", False)
    from bench.machine import describe, record

    machine_record = record()
    rng = np.random.default_rng(0)
    results = {"machine_line": describe(machine_record), "models": {},
               "settings": {"rounds": args.rounds, "round_seconds": args.round_seconds, "batches": args.batches}}
    exported = {}
    for model_name in args.models:
        layers = MODELS[model_name]
        candidates, quantized, params, observations, count = build_candidates(layers, rng)
        exported[model_name] = (layers, params, quantized, observations)
        batches = [batch for batch in args.batches if batch <= LARGEST_BATCH.get(model_name, batch)]
        results["models"][model_name] = {"param_count": count, "jax": time_jax(candidates, batches, args, rng)}
    results["onnx"] = {"skipped": "--no_onnx"} if args.no_onnx else time_onnx(exported, args.batches, args)
    ort = results["onnx"] if "error" not in results["onnx"] and "skipped" not in results["onnx"] else {}
    for model_name, model in results["models"].items():
        model["summary"] = summarize(model_name, model["jax"], ort)
    results["goals"] = evaluate_goals(results)
    results["dispatch"] = dispatch_entries(results)
    print(report(results), flush=True)
    if args.write_dispatch:
        write_dispatch(args.write_dispatch, machine_record, results["dispatch"],
                       "python -m bench.int8_lean " + " ".join(argv if argv is not None else sys.argv[1:]))
        print(f"dispatch table for {machine_record['isa_class']} written to {args.write_dispatch}")
    if args.json:
        from bench.machine import write_json

        write_json(args.json, results, cells=headline_cells(results))


if __name__ == "__main__":
    main()
