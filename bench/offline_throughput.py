"""Offline agents' gradient steps per second: qrl's BC, TD3+BC, IQL and BCQ against d3rlpy's.

Both sides train on the same Hopper-sized transitions generated here (11-dim observations, 3-dim
actions in [-1, 1], 1000-step episodes, `--dataset_size` of them; nothing is downloaded) at the
same sizes: each qrl config's defaults (BC, TD3+BC, IQL: 256-256 networks, batch 256; BCQ: VAE
750-750, actor and twin critics 400-300, batch 100, 10 sampled actions per next state), and
d3rlpy's encoders, batch sizes, learning rates and algorithm constants set from those configs
(`bench/d3rlpy_peer.py`).

- qrl: the real fused step, `qrl.offline.make_fused_step` over `agent.update` of each agent's
  `build(config, observation_spec, action_spec)`, K = the config's `updates_per_call` updates per
  jitted call with the batches sampled on device, calls keyed as `train_offline` keys them.
  XLA:CPU with `--xla_threads` threads (default 1, as `launch.prune_offline` runs the agents).
- d3rlpy (PyTorch, CPU) runs in its own process under `.venv-bench` (`make bench-deps`), with
  `--torch_threads` intra-op threads (default 1: on the shared, loaded 2-core machine two torch
  threads ran 20-85x slower than one, e.g. BC 5 against 256 steps/s). A step is `fit`'s step
  without logging: draw a batch from the replay buffer, `algo.update(batch)`.

Per algorithm, rounds alternate between the sides (the first side rotates every round), each
round `--steps` gradient steps (default: 5 rounds of 2000, BCQ 300); both processes stay warm
between rounds and the one not being timed waits idle. Reported: the median steps/s over rounds
of each side (for d3rlpy also of its updates alone, without drawing batches) and the median over
rounds of the ratio qrl / d3rlpy within a round (target >= 3x). `--bf16` adds rows for agents
whose config has a matmul dtype, all of them at bf16 (`matmul_dtype`: every training matmul in
bf16; BCQ's `target_matmul_dtype`: also the 10-sample target pass); BC has none.

    python -m bench.offline_throughput --bf16 --json=runs/bench_offline/throughput.json
    python -m bench.offline_throughput --algos=bc,bcq --rounds=3 --set=bcq.batch_size=256
    python -m bench.offline_throughput --quick          # tiny budgets; d3rlpy only if importable
"""

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import tempfile
import time
from typing import Optional

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_PEER_PYTHON = os.path.join(REPO_ROOT, ".venv-bench", "bin", "python")
PEER_SCRIPT = os.path.join(REPO_ROOT, "bench", "d3rlpy_peer.py")
ALGORITHMS = ("bc", "td3_bc", "iql", "bcq")
LABELS = {"bc": "BC", "td3_bc": "TD3+BC", "iql": "IQL", "bcq": "BCQ"}
STEPS = {"bc": 2000, "td3_bc": 2000, "iql": 2000, "bcq": 300}
QUICK_STEPS = {"bc": 20, "td3_bc": 20, "iql": 20, "bcq": 10}
MATMUL_DTYPE_FIELDS = ("matmul_dtype", "target_matmul_dtype")
OBSERVATION_SIZE, ACTION_SIZE, EPISODE_LENGTH = 11, 3, 1000
TERMINAL_RATE = 0.001
TARGET_RATIO = 3.0


def make_transitions(size: int, seed: int) -> dict[str, np.ndarray]:
    """Random Hopper-sized transitions: `size` steps of 1000-step episodes (timeouts), some ending
    early at random terminals; `next_observations[i]` is `observations[i + 1]`."""
    rng = np.random.default_rng(seed)
    observations = rng.normal(size=(size + 1, OBSERVATION_SIZE)).astype(np.float32)
    terminals = rng.uniform(size=size) < TERMINAL_RATE
    timeouts = np.zeros(size, bool)
    timeouts[EPISODE_LENGTH - 1::EPISODE_LENGTH] = True
    timeouts[-1] = True
    timeouts &= ~terminals
    return {
        "observations": observations[:-1], "next_observations": observations[1:],
        "actions": rng.uniform(-1.0, 1.0, size=(size, ACTION_SIZE)).astype(np.float32),
        "rewards": rng.normal(size=size).astype(np.float32), "terminals": terminals, "timeouts": timeouts,
    }


def parse_sets(items: list[str]) -> dict[str, dict[str, str]]:
    """`["bcq.batch_size=256"]` -> `{"bcq": {"batch_size": "256"}}`."""
    from launch.common import parse_overrides

    grouped: dict[str, dict[str, str]] = {}
    for key, value in parse_overrides(items).items():
        algo, separator, field = key.partition(".")
        if not separator or algo not in ALGORITHMS:
            raise SystemExit(f"--set expects ALGO.key=value with ALGO one of {', '.join(ALGORITHMS)}, got {key!r}")
        grouped.setdefault(algo, {})[field] = value
    return grouped


def matmul_dtype_fields(config) -> list[str]:
    """The config's matmul dtype fields (`MATMUL_DTYPE_FIELDS` it has)."""
    names = {field.name for field in dataclasses.fields(config)}
    return [name for name in MATMUL_DTYPE_FIELDS if name in names]


def sizes_note(algo: str, config) -> str:
    def widths(sizes) -> str:
        return "-".join(str(size) for size in sizes)

    if algo == "bcq":
        return (f"VAE {widths(config.vae_hidden_sizes)}, actor {widths(config.actor_hidden_sizes)}, "
                f"critics {widths(config.critic_hidden_sizes)}, batch {config.batch_size}")
    return f"{widths(config.hidden_sizes)}, batch {config.batch_size}"


def peer_spec(config) -> dict:
    """What `bench/d3rlpy_peer.py` needs of a qrl config to configure d3rlpy alike."""
    values = config.to_dict()
    return {name: values[name] for name in values if name != "updates_per_call"}


@dataclasses.dataclass
class Candidate:
    """One qrl configuration of an algorithm: a table row."""

    algo: str
    name: str
    config: object


def candidates_for(algo: str, overrides: dict, bf16: bool) -> list[Candidate]:
    from agents import get_offline_agent

    config = get_offline_agent(algo).config_for(overrides)
    found = [Candidate(algo, LABELS[algo], config)]
    fields = [field for field in matmul_dtype_fields(config) if getattr(config, field) != "bf16"]
    if bf16 and fields:
        name = f"{LABELS[algo]}, {', '.join(f'{field}=bf16' for field in fields)}"
        found.append(Candidate(algo, name, config.replace(**{field: "bf16" for field in fields})))
    return found


class QrlSide:
    """A candidate's compiled fused step and its train state, timed `steps` updates at a time."""

    def __init__(self, candidate: Candidate, dataset, seed: int):
        import jax
        from dm_env import specs

        from agents import get_offline_agent
        from qrl import offline

        observation_spec = specs.Array((OBSERVATION_SIZE,), np.float32, name="observation")
        action_spec = specs.BoundedArray((ACTION_SIZE,), np.float32, -1.0, 1.0, name="action")
        config = candidate.config
        self.agent = get_offline_agent(candidate.algo).build(config, observation_spec, action_spec)
        self.updates_per_call = config.updates_per_call
        self.fused_step = offline.make_fused_step(self.agent, dataset, config.batch_size, config.updates_per_call,
                                                  config.normalize_observations)
        init_key, self.sample_key = jax.random.split(jax.random.PRNGKey(seed))
        self.state = self.agent.init(init_key)
        self.calls = 0
        compile_start = time.perf_counter()
        self.run(self.updates_per_call)
        self.compile_seconds = time.perf_counter() - compile_start

    def run(self, steps: int) -> dict:
        import jax

        if steps % self.updates_per_call:
            raise SystemExit(f"steps per round must be a multiple of updates_per_call ({self.updates_per_call})")
        cpu_start, wall_start = time.process_time(), time.perf_counter()
        for _ in range(steps // self.updates_per_call):
            self.state, _ = self.fused_step(self.state, jax.random.fold_in(self.sample_key, self.calls))
            self.calls += 1
        jax.block_until_ready(self.state)
        return {"wall": time.perf_counter() - wall_start, "cpu": time.process_time() - cpu_start}


class PeerProcess:
    """`bench/d3rlpy_peer.py` running in `python`, served one round at a time."""

    def __init__(self, python: str, data_path: str, specs: dict, seed: int, torch_threads: int):
        self.log = tempfile.TemporaryFile(mode="w+")
        self.process = subprocess.Popen(
            [python, PEER_SCRIPT, f"--data={data_path}", f"--specs={json.dumps(specs)}", f"--seed={seed}",
             f"--torch_threads={torch_threads}"],
            cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
        )
        self.info = self._reply()

    def _reply(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            self.process.wait()
            self.log.seek(0)
            tail = self.log.read()[-2000:]
            raise RuntimeError(f"d3rlpy peer exited ({self.process.returncode}):\n{tail}")
        return json.loads(line)

    def run(self, algo: str, steps: int) -> dict:
        self.process.stdin.write(json.dumps({"algo": algo, "steps": steps}) + "\n")
        self.process.stdin.flush()
        return self._reply()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            self.process.wait(timeout=60)
        self.log.close()


def start_peer(args, data_path: str, specs: dict) -> Optional[PeerProcess]:
    """The running peer; None (with a note) in `--quick` mode when it cannot start."""
    if args.no_peer:
        print("d3rlpy: skipped (--no_peer)", flush=True)
        return None
    try:
        return PeerProcess(args.peer_python, data_path, specs, args.seed, args.torch_threads)
    except (OSError, RuntimeError) as error:
        if not args.quick:
            raise SystemExit(f"d3rlpy peer did not start ({error}); create .venv-bench with `make bench-deps`")
        last_line = [line for line in str(error).splitlines() if line.strip()][-1]
        print(f"d3rlpy: skipped ({last_line})", flush=True)
        return None


def median_rate(runs: list[dict], name: str, seconds: str = "wall") -> Optional[float]:
    """Median steps/s of `name`'s rounds, over `seconds` ("wall", or "update_wall" for d3rlpy's
    updates without its batch drawing)."""
    rates = [run["steps"] / run[seconds] for run in runs if run["name"] == name]
    return statistics.median(rates) if rates else None


def median_paired_ratio(runs: list[dict], name: str) -> Optional[float]:
    """Median over rounds of `name`'s steps/s over d3rlpy's in the same round (load drifts
    between rounds; within one it hits both sides alike)."""
    peer = {run["round"]: run["steps"] / run["wall"] for run in runs if run["name"] == "d3rlpy"}
    ratios = [run["steps"] / run["wall"] / peer[run["round"]] for run in runs
              if run["name"] == name and run["round"] in peer]
    return statistics.median(ratios) if ratios else None


def format_table(rows: list[dict]) -> str:
    """The results as a Markdown table, '-' where d3rlpy was not run."""
    lines = ["| algorithm | sizes | d3rlpy steps/s (updates alone) | qrl steps/s | qrl / d3rlpy (target ≥ 3×) |",
             "|---|---|---|---|---|"]
    for row in rows:
        peer, ratio = row["d3rlpy_steps_per_second"], row["ratio"]
        peer_cell = "-" if peer is None else f"{peer:,.0f} ({row['d3rlpy_update_steps_per_second']:,.0f})"
        lines.append(
            f"| {row['name']} | {row['sizes']} | {peer_cell} | "
            f"{row['qrl_steps_per_second']:,.0f} | {'-' if ratio is None else f'{ratio:.2f}×'} |"
        )
    return "\n".join(lines)


def load_note() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min) {five:.2f} (5 min) on {os.cpu_count()} CPUs"


def benchmark(args) -> dict:
    from agents import iql
    from qrl.datasets import from_qlearning

    sets = parse_sets(args.set)
    algos = [name.strip() for name in args.algos.split(",")]
    unknown = [name for name in algos if name not in ALGORITHMS]
    if unknown:
        raise SystemExit(f"unknown algorithm(s) {', '.join(unknown)}; known: {', '.join(ALGORITHMS)}")
    default_steps = QUICK_STEPS if args.quick else STEPS
    steps = {algo: args.steps or default_steps[algo] for algo in algos}
    arrays = make_transitions(args.dataset_size, args.seed)
    dataset = from_qlearning(arrays)
    candidates = {algo: candidates_for(algo, sets.get(algo, {}), args.bf16) for algo in algos}
    if "iql" in candidates:
        run_steps = (args.rounds + 1) * steps["iql"]  # the actor's cosine outlasts both sides' updates
        for candidate in candidates["iql"]:
            candidate.config = iql.config_for_run(candidate.config, dataset, run_steps)
    specs = {algo: peer_spec(found[0].config) for algo, found in candidates.items()}
    with tempfile.TemporaryDirectory(prefix="qrl-offline-bench-") as workdir:
        data_path = os.path.join(workdir, "transitions.npz")
        np.savez(data_path, **{key: arrays[key] for key in ("observations", "actions", "rewards", "terminals",
                                                             "timeouts")})
        peer = start_peer(args, data_path, specs)
        try:
            setup = {
                "dataset_size": args.dataset_size, "observation_size": OBSERVATION_SIZE, "action_size": ACTION_SIZE,
                "rounds": args.rounds, "steps_per_round": steps, "xla_threads": args.xla_threads,
                "d3rlpy": peer.info if peer else None, "load": load_note(),
            }
            peer_note = (f"d3rlpy {peer.info['d3rlpy']}, torch {peer.info['torch']} with "
                         f"{peer.info['torch_threads']} thread(s)" if peer else "no d3rlpy")
            print(f"{args.dataset_size} transitions (11-dim observations, 3-dim actions); XLA threads "
                  f"{args.xla_threads}; {peer_note}; {args.rounds} round(s); {load_note()}", flush=True)
            runs, rows = [], []
            for algo in algos:
                sides = {candidate.name: QrlSide(candidate, dataset, args.seed) for candidate in candidates[algo]}
                for name, side in sides.items():
                    print(f"{name}: compiled in {side.compile_seconds:.1f} s (K={side.updates_per_call})", flush=True)
                order = list(sides) + (["d3rlpy"] if peer else [])
                for round_index in range(args.rounds):
                    shift = round_index % len(order)
                    for name in order[shift:] + order[:shift]:
                        if name == "d3rlpy":
                            timing = peer.run(algo, steps[algo])
                            timing["update_wall"] = timing["wall"] - timing["sample_wall"]
                        else:
                            timing = sides[name].run(steps[algo])
                        run = {"algo": algo, "name": name, "round": round_index + 1, "steps": steps[algo], **timing}
                        runs.append(run)
                        print(f"{LABELS[algo]:7s} round {run['round']}  {name:28s} {run['steps'] / run['wall']:9.1f} "
                              f"steps/s  cpu/wall {run['cpu'] / run['wall']:.2f}", flush=True)
                algo_runs = [run for run in runs if run["algo"] == algo]
                peer_rate = median_rate(algo_runs, "d3rlpy")
                for candidate in candidates[algo]:
                    rate = median_rate(algo_runs, candidate.name)
                    rows.append({
                        "algo": algo, "name": candidate.name, "sizes": sizes_note(algo, candidate.config),
                        "updates_per_call": candidate.config.updates_per_call,
                        "compile_seconds": sides[candidate.name].compile_seconds,
                        "qrl_steps_per_second": rate, "d3rlpy_steps_per_second": peer_rate,
                        "d3rlpy_update_steps_per_second": median_rate(algo_runs, "d3rlpy", "update_wall"),
                        "ratio": median_paired_ratio(algo_runs, candidate.name),
                        "ratio_of_medians": rate / peer_rate if peer_rate else None,
                    })
                del sides
        finally:
            if peer:
                peer.close()
    return {"setup": setup, "rows": rows, "runs": runs}


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algos", default=",".join(ALGORITHMS), help="comma-separated of " + ", ".join(ALGORITHMS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=None, help="gradient steps per round for every algorithm")
    parser.add_argument("--dataset_size", type=int, default=200_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", action="append", default=[],
                        help="qrl config override ALGO.key=value (d3rlpy's sizes follow)")
    parser.add_argument("--bf16", action="store_true", help="add rows with bf16 matmuls where a config has the option")
    parser.add_argument("--xla_threads", type=int, default=1, help="XLA:CPU threads (0: one per core)")
    parser.add_argument("--torch_threads", type=int, default=1, help="the peer's torch threads (0: torch's default)")
    parser.add_argument("--peer_python", default=DEFAULT_PEER_PYTHON, help="interpreter with d3rlpy (.venv-bench)")
    parser.add_argument("--no_peer", action="store_true", help="time qrl only")
    parser.add_argument("--quick", action="store_true", help="tiny budgets, one round; skips d3rlpy if it cannot start")
    parser.add_argument("--json", help="also write setup, rows and every round to this file")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.dataset_size = 1, min(args.dataset_size, 10_000)

    from qrl import runtime

    runtime.configure_jax(args.xla_threads)
    started = time.perf_counter()
    results = benchmark(args)
    print(format_table(results["rows"]))
    measured = [row for row in results["rows"] if row["ratio"] is not None]
    if measured:
        met = [row["name"] for row in measured if row["ratio"] >= TARGET_RATIO]
        print(f"target qrl / d3rlpy ≥ {TARGET_RATIO:.0f}×: met by {', '.join(met) or 'none'} "
              f"of {len(measured)} rows")
    print(f"bench took {time.perf_counter() - started:.0f} s; {load_note()}", flush=True)
    if args.json:
        from bench.machine import write_json

        from bench.tables import cell

        cells = []
        for row in results["rows"]:
            name = f"{LABELS[row['algo']]} {row['name']}"
            cells += [cell("offline steps/s against d3rlpy", name, "qrl steps/s", row["qrl_steps_per_second"], "steps/s"),
                      cell("offline steps/s against d3rlpy", name, "d3rlpy steps/s", row["d3rlpy_steps_per_second"],
                           "steps/s"),
                      cell("offline steps/s against d3rlpy", name, "qrl / d3rlpy", row["ratio"], "×")]
        write_json(args.json, results, cells=cells)


if __name__ == "__main__":
    main()
