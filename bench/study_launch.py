"""Wall time of one pruning-study grid run in sequence, in local processes and as Ray tasks.

    .venv/bin/python -m bench.study_launch [--quick] [--cells=12] [--steps=10000] [--workers=2] [--json=PATH]

The grid: BC (`--hidden`, `--batch`: the study's 256-256, 256) on a generated Pendulum swing-up dataset (2,000
steps), dense and SNIP / GraSP at 90% over seeds 0.. (`--cells` cells in all, a multiple of 3),
`--steps` updates and one `--eval_episodes` evaluation per cell. Arms, each into a fresh study directory, one after another
in this run: `--launcher=local` (cells in this process, one after another), `--launcher=local
--parallel=W` and `--launcher=ray` (a local Ray with one CPU per core). Each arm's cells' mean final
returns are compared with the sequential arm's (the largest relative difference is printed; every
arm runs its cells on one-thread XLA pools, as the study's cells ask for, so they should agree). Prints wall seconds per arm and sequential / arm;
the goal (issue 20) is ≥ 1.7× for Ray with 2 workers on a 2-core machine.
"""

import argparse
import json
import os
import tempfile
import time

import numpy as np

from bench.machine import describe, record

GOAL = 1.7
ENV_ID = "gym:Pendulum-v1"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: 3 cells of BC 32-32, batch 32, 30 updates, 1 evaluation episode")
    parser.add_argument("--cells", type=int, default=None, help="cells in the grid, a multiple of 3 (12)")
    parser.add_argument("--steps", type=int, default=None, help="updates per cell (10000)")
    parser.add_argument("--workers", type=int, default=2, help="local processes (2)")
    parser.add_argument("--hidden", default=None, help="BC hidden sizes (the study's 256-256)")
    parser.add_argument("--batch", type=int, default=None, help="BC batch size (the study's 256)")
    parser.add_argument("--eval_episodes", type=int, default=None, help="evaluation episodes per cell (10)")
    parser.add_argument("--arms", default="sequential,processes,ray", help="comma-separated of sequential, processes, ray")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    defaults = ({"cells": 3, "steps": 30, "hidden": "32-32", "batch": 32, "eval_episodes": 1} if args.quick else
                {"cells": 12, "steps": 10000, "hidden": "256-256", "batch": 256, "eval_episodes": 10})
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.cells < 3 or args.cells % 3:
        parser.error(f"--cells must be a positive multiple of 3, got {args.cells}")
    if min(args.steps, args.workers, args.batch, args.eval_episodes) < 1:
        parser.error("--steps, --workers, --batch and --eval_episodes must be >= 1")
    args.arms = [arm.strip() for arm in args.arms.split(",") if arm.strip()]
    unknown = [arm for arm in args.arms if arm not in ("sequential", "processes", "ray")]
    if unknown or "sequential" not in args.arms:
        parser.error(f"--arms takes sequential (required), processes, ray; got {','.join(args.arms)}")
    return args


def write_dataset(path: str) -> None:
    """2,000 noisy swing-up steps on Pendulum in D4RL format, with reference returns."""
    import jax.numpy as jnp

    from qrl.datasets import collect
    from qrl.datasets.writers import write_d4rl_hdf5

    def swing_up(observations):
        cos, sin, velocity = observations[..., 0], observations[..., 1], observations[..., 2]
        energy = 0.5 * velocity**2 + 10.0 * (cos - 1.0)
        return jnp.clip(jnp.where(cos > 0.9, -10.0 * jnp.arctan2(sin, cos) - velocity,
                                  jnp.sign(velocity * cos + 1e-3) * jnp.sign(-energy + 1e-3) * 2.0), -2.0, 2.0)[..., None]

    act = lambda params, observations, normal: jnp.clip(swing_up(observations) + 0.5 * normal, -2.0, 2.0)  # noqa: E731
    steps, stats = collect.collect_steps(ENV_ID, act, None, 2000, seed=0)
    write_d4rl_hdf5(path, steps, {"env_id": ENV_ID, "ref_min_score": -1400.0,
                                  "ref_max_score": float(np.mean(stats["episode_returns"]))})


def run_arm(arm: str, dataset: str, directory: str, args) -> tuple[float, dict]:
    from launch import launcher, prune_study

    seeds = ",".join(str(seed) for seed in range(args.cells // 3))
    options = prune_study.make_options(
        os.path.join(directory, arm), dataset, "bc", "snip,grasp", "0,0.9", seeds, steps=args.steps, eval_every=0,
        eval_episodes=args.eval_episodes, prune_batch_size=64,
        sets=[f"bc.hidden_sizes={args.hidden}", f"bc.batch_size={args.batch}"])
    launch = {"sequential": launcher.make_options(), "processes": launcher.make_options("local", parallel=args.workers),
              "ray": launcher.make_options("ray")}[arm]
    start = time.perf_counter()
    outcome = prune_study.run_study(options, progress=False, log=lambda line: None, launch_options=launch)
    seconds = time.perf_counter() - start
    if outcome["failed"] or outcome["pending"]:
        raise SystemExit(f"{arm}: cells failed or left: {outcome['failed'] or outcome['pending']}")
    returns = {}
    for cell in prune_study.plan_cells(options):
        with open(os.path.join(options.workdir, cell.relative_dir, "results.json"), encoding="utf-8") as handle:
            returns[cell.label] = json.load(handle)["final_eval"]["returns"]
    return seconds, returns


def main(argv=None) -> None:
    args = parse_args(argv)
    # A study cell asks for a one-thread XLA pool (`launch.prune_runs` -> `qrl.runtime.configure_jax(1)`),
    # which only takes effect before JAX starts its backend. Writing the dataset below starts it, so
    # without this the sequential arm's cells would run on a pool of one thread per core (other float
    # sums, and both cores for one cell) while every worker's cells run on one thread.
    os.environ.setdefault("PJRT_NPROC", "1")
    machine = record()
    results = {"cells": args.cells, "steps": args.steps, "workers": args.workers, "hidden": args.hidden,
               "batch": args.batch, "eval_episodes": args.eval_episodes, "seconds": {}, "ratio": {},
               "max_mean_return_difference": {}}
    with tempfile.TemporaryDirectory() as directory:
        dataset = os.path.join(directory, "pendulum-swingup.hdf5")
        write_dataset(dataset)
        reference = None
        for arm in args.arms:
            seconds, returns = run_arm(arm, dataset, directory, args)
            results["seconds"][arm] = seconds
            if reference is None:
                reference = returns
            results["max_mean_return_difference"][arm] = max(
                abs(float(np.mean(values)) - float(np.mean(reference[label]))) / max(abs(float(np.mean(reference[label]))), 1e-9)
                for label, values in returns.items())
    for arm, seconds in results["seconds"].items():
        results["ratio"][arm] = results["seconds"]["sequential"] / seconds
    print(f"{args.cells}-cell pruning grid (BC {args.hidden}, batch {args.batch}, {args.steps} updates and "
          f"{args.eval_episodes} evaluation episodes per cell), {describe(machine)}")
    for arm, seconds in results["seconds"].items():
        print(f"  {arm:<11} {seconds:8.1f} s   sequential / {arm}: {results['ratio'][arm]:.2f}×   largest relative "
              f"difference of a cell's mean return from sequential: {results['max_mean_return_difference'][arm]:.1e}")
    if "ray" in results["ratio"]:
        met = results["ratio"]["ray"] >= GOAL
        print(f"goal: Ray with {args.workers} workers ≥ {GOAL}× sequential: {'met' if met else 'MISSED'}")
    if args.json:
        from bench.machine import write_json
        from bench.tables import cell

        cells = [cell("study grid wall time", arm, f"{args.cells} cells", seconds, "s", results["ratio"][arm])
                 for arm, seconds in results["seconds"].items()]
        write_json(args.json, results, cells=cells)


if __name__ == "__main__":
    main()
