"""Training throughput against sbx-rl at the same hyperparameters, the on-device path against the
host path, and the cost of quantization-aware training.

Cases (`--case`, comma-separated, or `all`):

- `ppo_cartpole`: PPO on gymnasium CartPole-v1 at rl-baselines3-zoo's hyperparameters (8 envs ×
  32 steps, 20 epochs of batch 256, linear lr 1e-3 and clip 0.2, γ 0.98, λ 0.8, 64-64 tanh):
  qrl's host loop vs sbx. Target ≥ 3×.
- `sac_pendulum`, `sac_halfcheetah`: SAC on Pendulum-v1 (zoo: lr 1e-3) and HalfCheetah-v5 (SAC
  defaults; learning starts at 5k steps here instead of zoo's 10k to keep the run short), one
  update per environment step: qrl with fp32 and with bf16 matmuls vs sbx. Target ≥ 1.25× at
  equal return.
- `ppo_device`: PPO on gymnax CartPole-v1 fully on device (`make_train`, one jit) vs the same
  PPO config on gymnasium CartPole-v1 through the host loop. Target ≥ 100k env steps/s.
- `dqn_device`, `ppo_rejax`: DQN and PPO on gymnax CartPole-v1 fully on device against rejax
  (`bench/rejax_peer.py`, its own `train` under one jit) at rejax's CartPole configs
  (`configs/gymnax/cartpole.yaml` in its repository), set in qrl's names. DQN: 10 envs, 5
  updates per 10 steps, batch 100, buffer 50k from 5k steps, dueling 64-64, lr 1e-3, Polyak 0.98
  once per 5 updates, epsilon 1 -> 0.05 over half the run, double Q; qrl keeps its ReLU and Huber
  loss where rejax has swish and an L2 loss. PPO: 5 envs x 100 steps, 5 epochs of 5 minibatches,
  lr 7.5e-4, entropy 0.01, 64-64 tanh. Compilation excluded on both sides. Target >= 1x.
- `qat`: DQN (zoo preset) and PPO (zoo preset) on CartPole in fp32 and with 8-bit QAT from step
  0: the training-time cost of fake quantization, as a steps/s ratio.

Every run is its own subprocess, candidates alternating round by round so machine load hits all
alike; sbx runs in `.venv-bench` (`make bench-deps`). Reported per run: env steps/s, train
seconds, deterministic evaluation return, seconds until the mean of the last 10 training
episodes first reached the case's threshold; per case the median steps/s ratio to the baseline.

    python -m bench.train_throughput --case=ppo_cartpole
    python -m bench.train_throughput --case=all --rounds=1
    python -m bench.train_throughput --quick          # tiny budgets, a smoke test
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
PEER_SCRIPT = os.path.join(REPO_ROOT, "bench", "sbx_peer.py")
REJAX_PEER_SCRIPT = os.path.join(REPO_ROOT, "bench", "rejax_peer.py")
PEER_KINDS = ("sbx", "rejax")
CHECK_EVERY = 1_000

PPO_ZOO_SBX = {
    "n_envs": 8, "n_steps": 32, "batch_size": 256, "gae_lambda": 0.8, "gamma": 0.98, "n_epochs": 20,
    "ent_coef": 0.0, "learning_rate": 1e-3, "clip_range": 0.2, "linear": ["learning_rate", "clip_range"],
    "net_arch": [64, 64],
}
SAC_SBX = {"pendulum": {"learning_rate": 1e-3, "learning_starts": 100},
           "halfcheetah": {"learning_starts": 5_000}}

# rejax's gymnax CartPole configs (configs/gymnax/cartpole.yaml), and the same runs in qrl's names.
DQN_REJAX = {"agent": "DuelingQNetwork", "agent_kwargs": {"activation": "swish"}, "num_envs": 10, "buffer_size": 50_000,
             "fill_buffer": 5_000, "batch_size": 100, "max_grad_norm": 10, "learning_rate": 1e-3, "num_epochs": 5,
             "polyak": 0.98, "eps_start": 1, "eps_end": 0.05, "exploration_fraction": 0.5, "gamma": 0.99, "ddqn": True,
             "normalize_observations": False}
DQN_REJAX_IN_QRL = {"hidden_sizes": (64, 64), "dueling": True, "batch_size": 100, "buffer_size": 50_000,
                    "learning_starts": 5_000, "learning_rate": 1e-3, "max_grad_norm": 10.0, "train_freq": 10,
                    "gradient_steps": 5, "target_update_period": 5, "tau": 0.02, "exploration_initial_eps": 1.0,
                    "exploration_final_eps": 0.05, "exploration_fraction": 0.5, "gamma": 0.99, "double_q": True}
PPO_REJAX = {"agent_kwargs": {"activation": "tanh"}, "num_envs": 5, "num_steps": 100, "num_epochs": 5,
             "num_minibatches": 5, "learning_rate": 7.5e-4, "max_grad_norm": 0.5, "gamma": 0.99, "gae_lambda": 0.95,
             "clip_eps": 0.2, "ent_coef": 0.01, "vf_coef": 0.5}
PPO_REJAX_IN_QRL = {"num_envs": 5, "num_steps": 100, "num_epochs": 5, "batch_size": 100, "learning_rate": 7.5e-4,
                    "max_grad_norm": 0.5, "gamma": 0.99, "gae_lambda": 0.95, "clip_range": 0.2, "ent_coef": 0.01,
                    "vf_coef": 0.5, "hidden_sizes": (64, 64), "activation": "tanh", "learning_rate_schedule": "constant",
                    "clip_range_vf": 0.2}

# case -> (env id, steps, quick steps, threshold, target, baseline candidate (or a map from
# candidate to its own baseline), candidates).
# A candidate is (name, kind, spec): kind "qrl" trains agent spec["agent"] with spec["overrides"]
# on spec["env"] (default: the case's env) with spec["num_envs"] environments where given; kinds
# "sbx" and "rejax" run that peer with spec as hyperparameters.
CASES: dict[str, dict] = {
    "ppo_cartpole": dict(
        env="gym:CartPole-v1", steps=100_000, quick_steps=4_096, threshold=475.0, target=3.0, baseline="sbx",
        candidates=[("qrl", "qrl", {"agent": "ppo", "overrides": {}}), ("sbx", "sbx", {"algo": "ppo", **PPO_ZOO_SBX})],
    ),
    "sac_pendulum": dict(
        env="gym:Pendulum-v1", steps=10_000, quick_steps=400, threshold=-250.0, target=1.25, baseline="sbx",
        candidates=[
            ("qrl bf16", "qrl", {"agent": "sac", "overrides": {"matmul_dtype": "bf16", "learning_starts": 100}}),
            ("qrl fp32", "qrl", {"agent": "sac", "overrides": {"learning_starts": 100}}),
            ("sbx", "sbx", {"algo": "sac", **SAC_SBX["pendulum"]}),
        ],
    ),
    "sac_halfcheetah": dict(
        env="gym:HalfCheetah-v5", steps=15_000, quick_steps=400, threshold=1_000.0, target=1.25, baseline="sbx",
        candidates=[
            ("qrl bf16", "qrl", {"agent": "sac", "overrides": {"matmul_dtype": "bf16", "learning_starts": 5_000}}),
            ("qrl fp32", "qrl", {"agent": "sac", "overrides": {"learning_starts": 5_000}}),
            ("sbx", "sbx", {"algo": "sac", **SAC_SBX["halfcheetah"]}),
        ],
    ),
    "ppo_device": dict(
        env="gymnax:CartPole-v1", steps=500_000, quick_steps=8_192, threshold=475.0, target=100_000.0,
        baseline=None, candidates=[
            ("qrl device", "qrl", {"agent": "ppo", "overrides": {}}),
            ("qrl host", "qrl", {"agent": "ppo", "env": "gym:CartPole-v1", "preset_of": "gymnax:CartPole-v1",
                                 "overrides": {}}),
        ],
    ),
    "dqn_device": dict(
        env="gymnax:CartPole-v1", steps=100_000, quick_steps=6_000, threshold=475.0, target=1.0, baseline="rejax",
        candidates=[
            ("qrl device", "qrl", {"agent": "dqn", "overrides": DQN_REJAX_IN_QRL, "num_envs": 10}),
            ("rejax", "rejax", {"algo": "dqn", **DQN_REJAX}),
        ],
    ),
    "ppo_rejax": dict(
        env="gymnax:CartPole-v1", steps=100_000, quick_steps=1_000, threshold=475.0, target=1.0, baseline="rejax",
        candidates=[
            ("qrl device", "qrl", {"agent": "ppo", "overrides": PPO_REJAX_IN_QRL}),
            ("rejax", "rejax", {"algo": "ppo", **PPO_REJAX}),
        ],
    ),
    "qat": dict(
        env="gym:CartPole-v1", steps=50_000, quick_steps=3_000, threshold=475.0, target=None,
        baseline={"dqn qat8": "dqn fp32", "ppo qat8": "ppo fp32"},
        candidates=[
            ("dqn fp32", "qrl", {"agent": "dqn", "overrides": {}}),
            ("dqn qat8", "qrl", {"agent": "dqn", "overrides": {"qat_bits": 8, "quant_delay": 0}}),
            ("ppo fp32", "qrl", {"agent": "ppo", "overrides": {}}),
            ("ppo qat8", "qrl", {"agent": "ppo", "overrides": {"qat_bits": 8, "quant_delay": 0}}),
        ],
    ),
}


def first_crossing(metrics_csv: str, threshold: float) -> Optional[float]:
    """Train seconds at the first metrics row whose 10-episode mean return reaches `threshold`."""
    if not os.path.exists(metrics_csv):
        return None
    with open(metrics_csv, newline="", encoding="utf-8") as metrics_file:
        for row in csv.DictReader(metrics_file):
            episode_return, steps_per_second = row.get("episode_return"), row.get("steps_per_second")
            if episode_return and steps_per_second and float(episode_return) >= threshold:
                return int(row["step"]) / float(steps_per_second)
    return None


def train_qrl(spec: dict, env_id: str, steps: int, seed: int, eval_episodes: int, threshold: float) -> dict:
    """One qrl training run in this process, configured as `launch.train` configures it."""
    from qrl import envs, runtime

    from agents import get_agent

    env_id = spec.get("env", env_id)
    if env_id.split(":", 1)[0] in envs.HOST_FAMILIES:
        env = envs.make(env_id, seed=0)
        runtime.configure_jax(runtime.recommended_xla_threads(env.observation_spec().shape))
        env.close()
    else:
        runtime.configure_jax(0)  # one jitted program per run: every core (as launch.train).
    agent = get_agent(spec["agent"])
    config = agent.config_for(spec.get("preset_of", env_id), spec["overrides"])
    with tempfile.TemporaryDirectory(prefix="qrl-train-bench-") as workdir:
        extra = {"num_envs": spec["num_envs"]} if "num_envs" in spec else {}
        _, results = agent.train(env_id, config, steps=steps, seed=seed, workdir=workdir,
                                 eval_episodes=eval_episodes, log_every=CHECK_EVERY, progress=False, **extra)
        seconds_to_threshold = first_crossing(os.path.join(workdir, "metrics.csv"), threshold)
    return {
        "env_steps": results["env_steps"], "train_seconds": results["train_seconds"],
        "steps_per_second": results["steps_per_second"], "eval_mean": results["final_eval"]["mean"],
        "eval_std": results["final_eval"]["std"], "seconds_to_threshold": seconds_to_threshold,
    }


def run_child(command: list[str]) -> dict:
    completed = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True)
    if completed.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({completed.returncode}):\n{completed.stderr[-3000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def candidate_command(args, case_name: str, case: dict, name: str, kind: str, spec: dict, seed: int, steps: int) -> list[str]:
    common = [f"--steps={steps}", f"--seed={seed}", f"--eval-episodes={args.eval_episodes}",
              f"--threshold={case['threshold']}"]
    if kind in PEER_KINDS:
        hyperparameters = {key: value for key, value in spec.items() if key != "algo"}
        gym_id = case["env"].split(":", 1)[1]
        script = PEER_SCRIPT if kind == "sbx" else REJAX_PEER_SCRIPT
        return [args.peer_python, script, f"--algo={spec['algo']}", f"--env={gym_id}",
                f"--hyperparameters={json.dumps(hyperparameters)}", *common]
    return [sys.executable, "-m", "bench.train_throughput", f"--child={case_name}/{name}", *common]


def format_run(case_name: str, result: dict) -> str:
    to_threshold = result["seconds_to_threshold"]
    return (
        f"{case_name:15s} round {result['round']}  {result['name']:9s} steps/s {result['steps_per_second']:10.1f}  "
        f"train {result['train_seconds']:6.1f} s  steps {result['env_steps']}  "
        f"eval {result['eval_mean']:8.1f} ± {result['eval_std']:6.1f}  "
        f"to threshold {'-' if to_threshold is None else f'{to_threshold:.1f} s'}"
    )


def load_note() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min) {five:.2f} (5 min) on {os.cpu_count()} CPUs"


def summarize(case_name: str, case: dict, runs: list[dict]) -> dict:
    medians = {}
    for name, _, _ in case["candidates"]:
        values = [run["steps_per_second"] for run in runs if run["name"] == name]
        if values:
            medians[name] = statistics.median(values)
    summary = {"medians": medians, "ratios": {}, "target": case["target"]}
    baseline = case["baseline"]
    parts = [f"{name} {value:.0f}" for name, value in medians.items()]
    if isinstance(baseline, dict):
        for name, reference in baseline.items():
            if name in medians and reference in medians:
                summary["ratios"][name] = medians[name] / medians[reference]
        parts.append("ratios: " + ", ".join(f"{name} / {baseline[name]} {ratio:.2f}×" for name, ratio in summary["ratios"].items()))
    elif baseline in medians:
        for name, value in medians.items():
            if name != baseline:
                summary["ratios"][name] = value / medians[baseline]
        parts.append("ratios to " + baseline + ": " + ", ".join(f"{name} {ratio:.2f}×" for name, ratio in summary["ratios"].items()))
        if case["target"] is not None and summary["ratios"]:
            best = max(summary["ratios"].values())
            summary["passed"] = best >= case["target"]
            parts.append(f"target ≥ {case['target']}×: {'PASS' if summary['passed'] else 'FAIL'}")
    elif baseline is None and case["target"] is not None:
        first = case["candidates"][0][0]
        if first in medians:
            summary["passed"] = medians[first] >= case["target"]
            parts.append(f"{first} target ≥ {case['target']:.0f} steps/s: {'PASS' if summary['passed'] else 'FAIL'}")
            if len(medians) > 1:
                other = case["candidates"][1][0]
                parts.append(f"{first} / {other}: {medians[first] / medians[other]:.1f}×")
    print(f"{case_name}: median steps/s " + "; ".join(parts), flush=True)
    return summary


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", default="ppo_cartpole", help=f"comma-separated of {', '.join(CASES)}, or all")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=None, help="override every case's step budget")
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--threshold", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--peer-python", default=DEFAULT_PEER_PYTHON)
    parser.add_argument("--quick", action="store_true", help="tiny budgets, one round: a smoke test")
    parser.add_argument("--json", help="also write every run and summary to this file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        case_name, name = args.child.split("/", 1)
        case = CASES[case_name]
        spec = next(spec for candidate, _, spec in case["candidates"] if candidate == name)
        print(json.dumps(train_qrl(spec, case["env"], args.steps, args.seed, args.eval_episodes, args.threshold)))
        return

    names = list(CASES) if args.case == "all" else [name.strip() for name in args.case.split(",")]
    unknown = [name for name in names if name not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(CASES)}")
    if args.quick:
        args.rounds, args.eval_episodes = 1, 2
    has_peer = os.path.exists(args.peer_python)
    if not has_peer:
        if not args.quick:
            parser.error(f"{args.peer_python} not found: create the sbx env with `make bench-deps`")
        print(f"sbx: skipped ({args.peer_python} not found)", flush=True)
    results, started = {}, time.perf_counter()
    for case_name in names:
        case = CASES[case_name]
        steps = args.steps or (case["quick_steps"] if args.quick else case["steps"])
        print(f"{case_name}: {case['env']}, {steps} steps, {args.rounds} round(s); {load_note()}", flush=True)
        runs = []
        for round_index in range(1, args.rounds + 1):
            seed = args.seed + round_index - 1
            candidates = case["candidates"][round_index % 2:] + case["candidates"][:round_index % 2]
            for name, kind, spec in candidates:
                if kind in PEER_KINDS and not has_peer:
                    continue
                result = run_child(candidate_command(args, case_name, case, name, kind, spec, seed, steps))
                result.update(round=round_index, name=name)
                runs.append(result)
                print(format_run(case_name, result), flush=True)
        results[case_name] = {"steps": steps, "runs": runs, **summarize(case_name, case, runs)}
    print(f"bench took {time.perf_counter() - started:.0f} s; {load_note()}")
    if args.json:
        from bench.machine import write_json

        from bench.tables import cell

        cells = [cell("training steps/s", f"{case_name}: {name}", "steps/s", rate, "steps/s",
                      result["ratios"].get(name))
                 for case_name, result in results.items() for name, rate in result["medians"].items()]
        write_json(args.json, results, cells=cells)


if __name__ == "__main__":
    main()
