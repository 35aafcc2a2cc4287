"""DQN training throughput on gymnasium CartPole-v1: qrl's DQN against sbx-rl's, same hyperparameters.

Two fixed hyperparameter settings (`--setting`, `all` runs both), each the same on both sides,
with one environment, MLP 256-256, Huber loss, no double Q, Adam with global-norm clipping at 10
and gamma 0.99:

- `zoo` (default): rl-baselines3-zoo's CartPole DQN hyperparameters (lr 2.3e-3, batch 64,
  buffer 100k, learning_starts 1000, target synced once per training phase, train_freq 256,
  gradient_steps 128, exploration 16% down to 0.04). Half an update per environment step, fused
  into long training phases: both sides spend most of their time in the same XLA update, so the
  ratio mostly measures that.
- `nature`: the Nature-DQN update ratio, sized for CartPole (SB3's DQN defaults but buffer 50k,
  learning_starts 1000, target every 1000 steps): train_freq 4, gradient_steps 1, batch 32,
  lr 1e-4, target synced every 250 updates (sbx: every 1000 environment steps), exploration 10%
  down to 0.05. One small update every 4 steps, so acting and per-update dispatch weigh more.

Each run is its own subprocess, qrl and sbx alternating round by round so machine load hits both
alike; sbx runs in `.venv-bench` (`make bench-deps`). Per run: environment steps/s over the
training loop, train seconds, greedy evaluation return and seconds until the mean of the last 10
training episodes first reached `--threshold` (195, checked every 1000 steps; epsilon-greedy
training returns are noisy, so the crossing is too); then, per setting, the median steps/s ratio
qrl/sbx against the target.

Not matched exactly: sbx collects whole `train_freq` rollouts, so it runs steps rounded up to a
multiple of train_freq (steps/s uses each run's own step count) and trains only once past
learning_starts (zoo: one more phase than qrl; nature: from step 1004, one update fewer); sbx
acts uniformly at random before learning_starts while qrl acts epsilon-greedily from step 0;
zoo: sbx syncs the target every 10 environment steps (so within 10 steps after each phase), qrl
after the 128th update of each phase; nature: sbx copies the target at every 1000th environment
step, before that step's update (after updates 249, 499, ...), qrl after updates 250, 500, ...;
evaluation episodes are seeded differently. qrl runs as `launch.train` does for vector
observations: XLA:CPU with one thread and the optimizer on one flat vector (`qrl.runtime`);
sbx runs as installed (with one XLA thread it measured ≈4% faster on `nature`, 1627 vs 1558
steps/s).

    python -m bench.dqn_throughput                    # zoo, 50k steps, 2 rounds
    python -m bench.dqn_throughput --setting all      # zoo, then nature
    python -m bench.dqn_throughput --quick            # 3k steps, 1 round, sbx only if .venv-bench exists
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

# qrl config overrides on top of `config_for(ENV_ID)` (the zoo preset); sbx_dqn_peer.py holds the same values.
SETTINGS: dict[str, dict] = {
    "zoo": {},
    "nature": dict(
        learning_rate=1e-4, learning_rate_schedule="constant", max_grad_norm=10.0, batch_size=32,
        buffer_size=50_000, learning_starts=1_000, train_freq=4, gradient_steps=1, target_update_period=250,
        tau=1.0, gamma=0.99, exploration_fraction=0.1, exploration_final_eps=0.05, hidden_sizes=(256, 256),
    ),
}


def qrl_config(setting: str):
    """qrl's DQN config for `setting`; SB3 / sbx DQN is not double DQN."""
    from agents.dqn import config_for

    return config_for(ENV_ID, SETTINGS[setting]).replace(double_q=False)


def train_qrl(setting: str, steps: int, seed: int, eval_episodes: int, threshold: float) -> dict:
    """Trains qrl's DQN at `setting` once in this process; returns the run's summary."""
    from qrl import runtime

    # As launch.train runs it: one XLA thread and a flat optimizer for this MLP (qrl.runtime).
    runtime.configure_jax(runtime.recommended_xla_threads((4,)))
    from agents.dqn import train

    config = qrl_config(setting)
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


def child_arguments(setting: str, steps: int, seed: int, eval_episodes: int, threshold: float) -> list[str]:
    return [
        f"--setting={setting}", f"--steps={steps}", f"--seed={seed}",
        f"--eval-episodes={eval_episodes}", f"--threshold={threshold}",
    ]


def format_run(setting: str, round_index: int, result: dict) -> str:
    to_threshold = result["seconds_to_threshold"]
    return (
        f"{setting:6s}  round {round_index}  {result['agent']:3s}  steps/s {result['steps_per_second']:8.1f}  "
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


def run_setting(args: argparse.Namespace, setting: str, has_peer: bool) -> tuple[list[dict], dict]:
    """Runs `args.rounds` alternating qrl, sbx rounds at `setting`; prints each run and the summary."""
    print(f"DQN {ENV_ID}, setting {setting}, {args.steps} steps, {args.rounds} round(s); {load_note()}", flush=True)
    runs = []
    for round_index in range(1, args.rounds + 1):
        seed = args.seed + round_index - 1
        arguments = child_arguments(setting, args.steps, seed, args.eval_episodes, args.threshold)
        commands = [[sys.executable, "-m", "bench.dqn_throughput", "--child=qrl", *arguments]]
        if has_peer:
            commands.append([args.peer_python, PEER_SCRIPT, *arguments])
        for command in commands:
            result = run_child(command)
            runs.append({"round": round_index, **result})
            print(format_run(setting, round_index, result), flush=True)
    summary, line = summarize(runs, args.target)
    print(f"{setting}: {line}", flush=True)
    return runs, summary


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--setting", choices=[*SETTINGS, "all"], default="zoo", help="hyperparameter set; all runs each in turn"
    )
    parser.add_argument("--steps", type=int, default=50_000, help="environment steps per run, every setting")
    parser.add_argument("--rounds", type=int, default=2, help="qrl, sbx pairs, alternating")
    parser.add_argument("--seed", type=int, default=0, help="round r trains with seed + r")
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument(
        "--threshold", type=float, default=195.0, help="10-episode mean training return (CartPole-v0's solved)"
    )
    parser.add_argument("--target", type=float, default=3.0, help="wanted steps/s ratio qrl/sbx")
    parser.add_argument("--peer-python", default=DEFAULT_PEER_PYTHON, help="python of the sbx virtual env")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_STEPS} steps, 1 round; smoke test")
    parser.add_argument("--json", help="also write runs and summary per setting to this file")
    parser.add_argument("--child", choices=["qrl"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.rounds = QUICK_STEPS, 1

    if args.child == "qrl":
        if args.setting == "all":
            parser.error("--child needs one setting")
        print(json.dumps(train_qrl(args.setting, args.steps, args.seed, args.eval_episodes, args.threshold)))
        return

    has_peer = os.path.exists(args.peer_python)
    if not has_peer and not args.quick:
        parser.error(f"{args.peer_python} not found: create the sbx env with `make bench-deps`")
    if not has_peer:
        print(f"sbx: skipped ({args.peer_python} not found)", flush=True)
    settings = list(SETTINGS) if args.setting == "all" else [args.setting]
    results = {}
    started = time.perf_counter()
    for setting in settings:
        runs, summary = run_setting(args, setting, has_peer)
        results[setting] = {"steps": args.steps, "threshold": args.threshold, "runs": runs, **summary}
    print(f"bench took {time.perf_counter() - started:.0f} s; {load_note()}")
    if args.json:
        from bench.machine import write_json

        from bench.tables import cell

        cells = []
        for setting, result in results.items():
            for name, rate in result["medians"].items():
                cells.append(cell("DQN steps/s against sbx", setting, f"{name} steps/s", rate, "steps/s"))
            cells.append(cell("DQN steps/s against sbx", setting, "qrl / sbx", result["ratio"], "×"))
        write_json(args.json, {"settings": results}, cells=cells)


if __name__ == "__main__":
    main()
