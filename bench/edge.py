"""The edge table: for trained policies, what each exported format costs and keeps — bytes on
disk, batch-1 latency (p50, p99) per runtime with one thread, and return against the fp32 export.

    .venv/bin/python -m bench.edge --runs=runs/edge/dqn_cartpole,runs/edge/td3_pendulum,runs/edge/td3_bc_snip95 \\
        --json=results/edge/edge.json

Each run (a `launch.train` or `launch.prune_offline` workdir) is exported by `launch.runs.export_run`
at every `--schemes` entry it supports (a scheme an agent cannot export is listed with the
reason); every exported policy is evaluated with `qrl.deploy.load_policy` over `--episodes`
fixed-seed episodes (numpy observations in, environment actions out, as a robot runs it), and
timed at batch 1 in a separate process without JAX (`bench/onnx_peer.py --models`: ONNX
Runtime, plus qrl's CSR runtime for pruned models), one intra-op thread. Return is compared
with the same run's fp32 export: `E = (R_fp32 - R) / |R_fp32|`, QuaRL's relative error.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

from bench.machine import record

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_SCHEMES = "fp32,fp16,int8,int8-dyn,quarl_dyn8"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", required=True, help="comma-separated run directories (launch.train or launch.prune_offline)")
    parser.add_argument("--schemes", default=DEFAULT_SCHEMES, help="comma-separated precisions to export")
    parser.add_argument("--episodes", type=int, default=10, help="fixed-seed evaluation episodes per exported policy")
    parser.add_argument("--seed", type=int, default=0, help="seed of the evaluation episodes and of the export's calibration")
    parser.add_argument("--single_calls", type=int, default=2000, help="batch-1 calls timed per policy and runtime")
    parser.add_argument("--json", default=None, help="write the results here too")
    args = parser.parse_args(argv)
    if args.episodes < 1 or args.single_calls < 1:
        parser.error("--episodes and --single_calls must be >= 1")
    args.runs = [run for run in args.runs.split(",") if run.strip()]
    args.schemes = [scheme for scheme in args.schemes.split(",") if scheme.strip()]
    for run in args.runs:
        if not os.path.isdir(run):
            parser.error(f"--runs: {run} is not a directory")
    return args


def evaluate_exports(args, directory: str) -> tuple[list, list]:
    """Exports and evaluates every run × scheme into `directory` (`<run>__<scheme>.onnx`);
    returns the rows and the skipped (run, scheme, reason) entries."""
    from launch.runs import export_run
    from qrl import evaluation, io
    from qrl.deploy import load_policy
    from qrl.errors import QrlInputError

    rows, skipped = [], []
    for run in args.runs:
        name = os.path.basename(os.path.normpath(run))
        env_options = io.read_json(os.path.join(run, "config.json")).get("env_options", {})
        for scheme in args.schemes:
            out = os.path.join(directory, f"{name}__{scheme}.onnx")
            try:
                sidecar = export_run(run, scheme, out, seed=args.seed)
            except QrlInputError as error:
                skipped.append({"run": name, "scheme": scheme, "reason": str(error)})
                continue
            runtimes = ["onnxruntime"] + (["csr"] if sidecar.get("pruning") else [])
            for runtime in runtimes:
                result = evaluation.evaluate(load_policy(out, runtime=runtime), sidecar["env"], args.episodes,
                                             seed=args.seed + 50_000, env_options=env_options)
                rows.append({"run": name, "agent": sidecar["agent"], "env": sidecar["env"], "scheme": scheme,
                             "runtime": runtime, "bytes": sidecar["model_bytes"],
                             "pruned": bool(sidecar.get("pruning")),
                             "return_mean": float(np.mean(result.returns)), "return_std": float(np.std(result.returns)),
                             "agreement": sidecar["agreement"]})
    return rows, skipped


def time_exports(directory: str, single_calls: int) -> dict:
    """The peer's p50/p99 (µs) of batch-1 calls per `<run>__<scheme>[+csr]`."""
    command = [sys.executable, "-m", "bench.onnx_peer", f"--models={directory}", "--batches=1", "--rounds=3",
               "--round_seconds=0.01", "--ort_threads=1", f"--single_calls={single_calls}"]
    completed = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True)
    if completed.returncode != 0:
        raise RuntimeError(f"onnx peer failed: {(completed.stderr.strip().splitlines() or ['no output'])[-1]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def report(results: dict) -> str:
    lines = [f"{results['machine']['cpu']} ({results['machine']['cpu_count']} cores, "
             f"{' '.join(results['machine']['isa'])}), onnxruntime {results['onnxruntime']}, 1 thread, batch 1; "
             f"{results['episodes']} episodes per policy", "",
             f"{'policy':<24}{'scheme':<12}{'runtime':<13}{'bytes':>10}{'p50 µs':>9}{'p99 µs':>9}"
             f"{'return':>18}{'E vs fp32':>11}"]
    for row in results["rows"]:
        error = "-" if row["relative_error"] is None else f"{row['relative_error']:.3f}"
        lines.append(f"{row['run']:<24}{row['scheme']:<12}{row['runtime']:<13}{row['bytes']:>10}{row['p50_us']:>9.1f}"
                     f"{row['p99_us']:>9.1f}{row['return_mean']:>11.1f} ± {row['return_std']:<5.1f}{error:>11}")
    for entry in results["skipped"]:
        lines.append(f"skipped {entry['run']} {entry['scheme']}: {entry['reason']}")
    return "\n".join(lines)


def headline_cells(results: dict) -> list[dict]:
    """The README's figures (`bench.tables` cells) per exported policy: bytes, p50 / p99 µs at batch 1
    (p50 with its ratio to the same run's fp32 under ONNX Runtime) and the return."""
    from bench.tables import cell

    fp32_p50 = {row["run"]: row["p50_us"] for row in results["rows"]
                if row["scheme"] == "fp32" and row["runtime"] == "onnxruntime"}
    cells = []
    for row in results["rows"]:
        name = f"{row['run']} {row['scheme']} ({row['runtime']})"
        reference = fp32_p50.get(row["run"])
        cells += [cell("edge policies, batch 1", name, "bytes", row["bytes"], "bytes"),
                  cell("edge policies, batch 1", name, "p50 µs", row["p50_us"], "µs",
                       None if not reference else row["p50_us"] / reference),
                  cell("edge policies, batch 1", name, "p99 µs", row["p99_us"], "µs"),
                  cell("edge policies, batch 1", name, "return", row["return_mean"], "return")]
    return cells


def main(argv=None) -> None:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as directory:
        rows, skipped = evaluate_exports(args, directory)
        timed = time_exports(directory, args.single_calls)
    fp32 = {row["run"]: row["return_mean"] for row in rows if row["scheme"] == "fp32" and row["runtime"] == "onnxruntime"}
    for row in rows:
        key = f"{row['run']}__{row['scheme']}" + ("+csr" if row["runtime"] == "csr" else "")
        row["p50_us"], row["p99_us"] = timed["p50_us"][key], timed["p99_us"][key]
        reference = fp32.get(row["run"])
        row["relative_error"] = (None if reference is None or reference == 0
                                 else (reference - row["return_mean"]) / abs(reference))
    results = {"machine": record(threads=1), "onnxruntime": timed["info"]["onnxruntime"], "episodes": args.episodes,
               "command": " ".join(["python -m bench.edge", *sys.argv[1:]]) if argv is None else None,
               "rows": rows, "skipped": skipped}
    print(report(results), flush=True)
    if args.json:
        from bench.machine import write_json

        write_json(args.json, results, cells=headline_cells(results))


if __name__ == "__main__":
    main()
