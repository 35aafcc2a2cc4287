"""The benchmark suite behind the README's tables: record runs per machine kind, or check a fresh
run against the stored one.

    python -m bench.suite --record                     # every benchmark -> results/bench/<kind>/<bench>.json
    python -m bench.suite --check                      # `make bench-check`: what moved by more than 15%
    python -m bench.suite --check --benches=inference,qat_overhead --tolerance=0.1
    python -m bench.suite --check --fresh=DIR          # compare JSON files already in DIR, run nothing

A check runs each benchmark that has a stored run for this machine's kind (`bench.machine.kind`:
ISA class and core count) into a temporary directory and compares figure by figure
(`bench.tables` cells): a cell's ratio where it has one, or its value where the value is itself a
ratio ("×"); absolute figures (µs, steps/s) only with `--absolute`, since they follow the
machine's load more than its kind. It prints every figure that moved by more than `--tolerance`
(relative) and every stored figure the fresh run lacks, and exits 1 when any moved.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Optional

from bench import machine, tables

REPO_ROOT = tables.REPO_ROOT
PEER_PYTHON = os.path.join(REPO_ROOT, ".venv-bench", "bin", "python")
# name -> (module and arguments of a recorded run, whether it needs the peer venv (`make bench-deps`)).
SUITE = {
    "inference": (["bench.inference", f"--peer_python={PEER_PYTHON}"], True),
    "int8_lean": (["bench.int8_lean", f"--peer_python={PEER_PYTHON}"], True),
    "qat_overhead": (["bench.qat_overhead"], False),
    "actorq": (["bench.actorq"], False),
    "dqn_throughput": (["bench.dqn_throughput", "--setting=all", f"--peer-python={PEER_PYTHON}"], True),
    "train_throughput": (["bench.train_throughput", "--case=all", f"--peer-python={PEER_PYTHON}"], True),
    "offline_throughput": (["bench.offline_throughput", "--bf16", f"--peer_python={PEER_PYTHON}"], True),
    "offline_sampling": (["bench.offline_data", "sampling"], False),
    "pruning": (["bench.pruning"], False),
    "offline_many": (["bench.offline_many"], False),
    "study_launch": (["bench.study_launch"], False),
}


def parse_names(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in SUITE]
    if unknown or not names:
        raise ValueError(f"unknown benchmark(s) {', '.join(unknown) or '(none given)'}; known: {', '.join(SUITE)}")
    return names


def run_bench(name: str, json_path: str, quick: bool) -> tuple[int, float]:
    """Runs benchmark `name` writing `json_path`; its output goes to this process's. Returns the
    exit status and the wall seconds."""
    arguments, _ = SUITE[name]
    command = [sys.executable, "-m", *arguments, f"--json={json_path}"] + (["--quick"] if quick else [])
    started = time.perf_counter()
    status = subprocess.run(command, cwd=REPO_ROOT, check=False).returncode
    return status, time.perf_counter() - started


def comparable(record: dict, absolute: bool) -> Optional[float]:
    """The figure a check compares: the ratio, a value that is a ratio, or (with `absolute`) any value."""
    if record.get("ratio") is not None:
        return record["ratio"]
    if record["unit"] == tables.RATIO_UNIT or absolute:
        return record["value"]
    return None


def compare(stored: list[dict], fresh: list[dict], tolerance: float, absolute: bool = False) -> tuple[list[dict], list[str]]:
    """Cells whose comparable figure moved by more than `tolerance` (relative to the stored one):
    `{"table", "row", "column", "stored", "fresh", "change"}`; and the stored cells the fresh run
    does not have."""
    fresh_by_key = {(record["table"], record["row"], record["column"]): record for record in fresh}
    moved, missing = [], []
    for record in stored:
        key = (record["table"], record["row"], record["column"])
        before = comparable(record, absolute)
        if before is None:
            continue
        after = comparable(fresh_by_key[key], absolute) if key in fresh_by_key else None
        if after is None:
            missing.append(" / ".join(key))
            continue
        change = (after - before) / abs(before) if before else float("inf") if after else 0.0
        if abs(change) > tolerance:
            moved.append({"table": key[0], "row": key[1], "column": key[2], "stored": before, "fresh": after,
                          "change": change})
    return moved, missing


def check(names: list[str], stored_dir: str, fresh_dir: str, tolerance: float, absolute: bool) -> int:
    """Prints what moved per benchmark; 1 when anything moved, else 0."""
    any_moved = False
    for name in names:
        stored = tables.load_runs_file(os.path.join(stored_dir, f"{name}.json"))
        fresh_path = os.path.join(fresh_dir, f"{name}.json")
        if not os.path.exists(fresh_path):
            print(f"{name}: no fresh run ({fresh_path})")
            any_moved = True
            continue
        fresh = tables.load_runs_file(fresh_path)
        moved, missing = compare(stored["cells"], fresh["cells"], tolerance, absolute)
        print(f"{name}: stored {stored['machine'].get('time', '?')} on {stored['machine'].get('cpu', '?')}, "
              f"fresh on {machine.describe(fresh['machine'])}: {len(moved)} moved by more than {tolerance:.0%}"
              + (f", {len(missing)} not measured" if missing else ""))
        for entry in moved:
            print(f"  {entry['table']} / {entry['row']} / {entry['column']}: {entry['stored']:.3g} -> "
                  f"{entry['fresh']:.3g} ({entry['change']:+.0%})")
        for key in missing:
            print(f"  not measured: {key}")
        any_moved = any_moved or bool(moved)
    return 1 if any_moved else 0


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--record", action="store_true", help="run and store as this machine kind's figures")
    mode.add_argument("--check", action="store_true", help="run and compare with this machine kind's stored figures")
    parser.add_argument("--benches", default=None, help=f"comma-separated of {', '.join(SUITE)} (default: all; "
                                                        "--check: those stored for this kind)")
    parser.add_argument("--tolerance", type=float, default=0.15, help="relative change reported as moved")
    parser.add_argument("--absolute", action="store_true", help="also compare absolute figures (µs, steps/s)")
    parser.add_argument("--fresh", default=None, help="--check: compare the JSON files in this directory; run nothing")
    parser.add_argument("--results", default=tables.RESULTS_ROOT, help="stored runs: <results>/<machine kind>/")
    parser.add_argument("--quick", action="store_true", help="each benchmark's --quick (a smoke test of the suite)")
    args = parser.parse_args(argv)

    def refuse(message: str) -> int:
        print(f"error: {message}", file=sys.stderr)
        return 2

    if not 0 < args.tolerance < 10:
        return refuse(f"--tolerance must be in (0, 10), got {args.tolerance}")
    if args.record and args.quick and os.path.abspath(args.results) == os.path.abspath(tables.RESULTS_ROOT):
        return refuse("--quick runs are smoke tests, not figures: record them elsewhere with --results=DIR")
    if args.fresh and not args.check:
        return refuse("--fresh goes with --check")
    if args.fresh and not os.path.isdir(args.fresh):
        return refuse(f"--fresh: no directory {args.fresh}")
    here = machine.record()
    stored_dir = os.path.join(args.results, tables.kind_directory(here["kind"]))
    try:
        names = parse_names(args.benches) if args.benches else None
    except ValueError as error:
        return refuse(str(error))
    if args.check:
        stored = [name for name in SUITE if os.path.exists(os.path.join(stored_dir, f"{name}.json"))]
        if names is None:
            names = stored
        unstored = [name for name in names if name not in stored]
        if not names or unstored:
            return refuse(f"no stored run of {', '.join(unstored) or 'any benchmark'} for this machine kind "
                          f"({here['kind']}) in {stored_dir}: record one with python -m bench.suite --record")
    names = names or list(SUITE)
    if not args.fresh:
        need_peer = [name for name in names if SUITE[name][1]]
        if need_peer and not args.quick and not os.path.exists(PEER_PYTHON):
            return refuse(f"{', '.join(need_peer)} need(s) the peer environment {PEER_PYTHON}: run `make bench-deps`")

    if args.check and args.fresh:
        return check(names, stored_dir, args.fresh, args.tolerance, args.absolute)
    target = stored_dir if args.record else tempfile.mkdtemp(prefix="bench-check-")
    os.makedirs(target, exist_ok=True)
    failed = []
    try:
        for name in names:
            print(f"== {name} ({machine.describe(here)})", flush=True)
            status, seconds = run_bench(name, os.path.join(target, f"{name}.json"), args.quick)
            print(f"== {name}: exit {status}, {seconds:.0f} s", flush=True)
            if status != 0:
                failed.append(name)
        if args.record:
            print(f"stored in {target}; regenerate the README's tables with python -m bench.tables")
            return 1 if failed else 0
        return max(check([name for name in names if name not in failed], stored_dir, target, args.tolerance,
                         args.absolute), 1 if failed else 0)
    finally:
        if args.check:
            shutil.rmtree(target, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
