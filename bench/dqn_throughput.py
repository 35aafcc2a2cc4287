"""DQN training throughput on gymnasium CartPole-v1: qrl's DQN against sbx-rl's, same hyperparameters.

Both train at the rl-baselines3-zoo CartPole DQN hyperparameters (lr 2.3e-3, batch 64, buffer
100k, learning_starts 1000, gamma 0.99, target synced once per training phase, train_freq 256,
gradient_steps 128, exploration 16% down to 0.04, MLP 256-256, Huber loss, no double Q, Adam
with global-norm clipping at 10) with one environment. Each run is its own subprocess, qrl and
sbx alternating round by round so machine load hits both alike; sbx runs in `.venv-bench`
(`make bench-deps`). Per run: environment steps/s over the training loop, train seconds, greedy
evaluation return and seconds until the mean of the last 10 training episodes first reached
`--threshold` (195, checked every 1000 steps; these epsilon-0.04 training returns hover around
100-250 late in training, so the crossing is noisy); then the median steps/s ratio qrl/sbx
against the target.

Not matched exactly: sbx collects whole `train_freq` rollouts, so it runs ceil(steps/256)*256
steps and one more training phase (steps/s uses each run's own step count); sbx acts uniformly
at random before learning_starts while qrl acts epsilon-greedily from step 0; sbx syncs the
target every 10 environment steps (so within 10 steps after each phase), qrl after the 128th
update of each phase; evaluation episodes are seeded differently.

    python -m bench.dqn_throughput              # 50k steps, 2 rounds
    python -m bench.dqn_throughput --quick      # 3k steps, 1 round, sbx only if .venv-bench exists
"""

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Optional

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_PEER_PYTHON = os.path.join(REPO_ROOT, ".venv-bench", "bin", "python")
PEER_SCRIPT = os.path.join(REPO_ROOT, "bench", "sbx_dqn_peer.py")
ENV_ID = "gym:CartPole-v1"
CHECK_EVERY = 1_000  # env steps between threshold checks (qrl's metrics rows).
QUICK_STEPS = 3_000


def train_qrl(steps: int, seed: int, eval_episodes: int, threshold: float) -> dict:
    """Trains qrl's DQN once in this process; returns the run's summary."""
    import jax

    jax.config.update("jax_cpu_enable_async_dispatch", False)
    from agents.dqn import config_for, train

    config = config_for(ENV_ID).replace(double_q=False)  # SB3 / sbx DQN is not double DQN.
    with tempfile.TemporaryDirectory(prefix="qrl-dqn-bench-") as workdir:
        _, results = train(
            ENV_ID, config, steps=steps, seed=seed, workdir=workdir,
            eval_episodes=eval_episodes, log_every=CHECK_EVERY, progress=False,
        )
        seconds_to_threshold = first_crossing(os.path.join(workdir, "metrics.csv"), threshold)
    return {
        "agent": "qrl",
        "env_steps": results["env_steps"],
        "updates": results["updates"],
        "train_seconds": results["train_seconds"],
        "steps_per_second": results["steps_per_second"],
        "eval_mean": results["final_eval"]["mean"],
        "eval_std": results["final_eval"]["std"],
        "seconds_to_threshold": seconds_to_threshold,
    }


def first_crossing(metrics_csv: str, threshold: float) -> Optional[float]:
    """Train seconds at the first metrics row whose 10-episode mean return reaches `threshold`."""
    with open(metrics_csv, newline="", encoding="utf-8") as metrics_file:
        for row in csv.DictReader(metrics_file):
            episode_return, steps_per_second = row.get("episode_return"), row.get("steps_per_second")
            if episode_return and steps_per_second and float(episode_return) >= threshold:
                return int(row["step"]) / float(steps_per_second)
    return None


def run_child(command: list[str]) -> dict:
    """Runs one training subprocess; returns the JSON summary from its last output line."""
    completed = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True)
    if completed.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({completed.returncode}):\n{completed.stderr[-3000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def child_arguments(steps: int, seed: int, eval_episodes: int, threshold: float) -> list[str]:
    return [f"--steps={steps}", f"--seed={seed}", f"--eval-episodes={eval_episodes}", f"--threshold={threshold}"]


def format_run(round_index: int, result: dict) -> str:
    to_threshold = result["seconds_to_threshold"]
    return (
        f"round {round_index}  {result['agent']:3s}  steps/s {result['steps_per_second']:8.1f}  "
        f"train {result['train_seconds']:6.1f} s  steps {result['env_steps']}  updates {result['updates']}  "
        f"eval {result['eval_mean']:6.1f} ± {result['eval_std']:5.1f}  "
        f"to threshold {'-' if to_threshold is None else f'{to_threshold:.1f} s'}"
    )


def load_note() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min) {five:.2f} (5 min) on {os.cpu_count()} CPUs"


def summarize(runs: list[dict], target: float) -> tuple[dict, str]:
    """Median steps/s per agent and the ratio qrl/sbx against `target`."""
    medians = {
        agent: statistics.median(run["steps_per_second"] for run in runs if run["agent"] == agent)
        for agent in ("qrl", "sbx")
        if any(run["agent"] == agent for run in runs)
    }
    if "sbx" not in medians:
        return {"medians": medians, "ratio": None, "target": target, "passed": None}, (
            f"median steps/s: qrl {medians['qrl']:.1f}; "
            f"sbx not run, ratio qrl/sbx (target >= {target:g}x): not measured"
        )
    ratio = medians["qrl"] / medians["sbx"]
    passed = ratio >= target
    return {"medians": medians, "ratio": ratio, "target": target, "passed": passed}, (
        f"median steps/s: qrl {medians['qrl']:.1f}, sbx {medians['sbx']:.1f}; "
        f"ratio qrl/sbx {ratio:.2f}x (target >= {target:g}x): {'PASS' if passed else 'FAIL'}"
    )


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=2, help="qrl, sbx pairs, alternating")
    parser.add_argument("--seed", type=int, default=0, help="round r trains with seed + r")
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument(
        "--threshold", type=float, default=195.0, help="10-episode mean training return (CartPole-v0's solved)"
    )
    parser.add_argument("--target", type=float, default=3.0, help="wanted steps/s ratio qrl/sbx")
    parser.add_argument("--peer-python", default=DEFAULT_PEER_PYTHON, help="python of the sbx virtual env")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_STEPS} steps, 1 round; smoke test")
    parser.add_argument("--json", help="also write runs and summary to this file")
    parser.add_argument("--child", choices=["qrl"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.rounds = QUICK_STEPS, 1

    if args.child == "qrl":
        print(json.dumps(train_qrl(args.steps, args.seed, args.eval_episodes, args.threshold)))
        return

    has_peer = os.path.exists(args.peer_python)
    if not has_peer and not args.quick:
        parser.error(f"{args.peer_python} not found: create the sbx env with `make bench-deps`")
    print(f"DQN {ENV_ID}, {args.steps} steps, {args.rounds} round(s); {load_note()}", flush=True)
    if not has_peer:
        print(f"sbx: skipped ({args.peer_python} not found)", flush=True)
    runs = []
    started = time.perf_counter()
    for round_index in range(1, args.rounds + 1):
        arguments = child_arguments(args.steps, args.seed + round_index - 1, args.eval_episodes, args.threshold)
        commands = [[sys.executable, "-m", "bench.dqn_throughput", "--child=qrl", *arguments]]
        if has_peer:
            commands.append([args.peer_python, PEER_SCRIPT, *arguments])
        for command in commands:
            result = run_child(command)
            runs.append({"round": round_index, **result})
            print(format_run(round_index, result), flush=True)
    summary, line = summarize(runs, args.target)
    print(line)
    print(f"bench took {time.perf_counter() - started:.0f} s; {load_note()}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as json_file:
            json.dump({"steps": args.steps, "threshold": args.threshold, "runs": runs, **summary}, json_file, indent=2)


if __name__ == "__main__":
    main()
