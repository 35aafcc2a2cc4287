"""ActorQ's three claims on this CPU: int8 actors step faster, int8 publishes are smaller, and
int8 weight updates reach an actor faster.

    .venv/bin/python -m bench.actorq [--quick] [--json=PATH] [--no-ray]

1. Actor env steps/s per actor precision, with the real `qrl.distributed.actor.Actor` node run
   in this process: its replay a `ReplayServer` under `MinSize(1)` (inserts never block), its
   broadcaster holding one blob of the agent's initial policy encoded at the matching comm
   precision (int8 at the default actor scheme, `weights.DEFAULT_ACTOR_INT8_SCHEME`, given input
   ranges calibrated as `Learner.publish` does, which a static scheme ships). Each run builds a fresh actor with `max_steps=N`, loads the
   weights and compiles outside the timed loop (`update(wait=True)`), calls `run()` and reads
   `stats()`. Precisions alternate round by round (the first round is a warm-up that also sizes
   N so the slowest precision's run lasts about `--round_seconds`); medians over rounds. Phase
   fractions of the run: env_step, inference (policy call + exploration), insert (replay
   hand-off) and other (n-step accumulation, bookkeeping). `fp32@onnx` and `int8@onnx` are the
   same actors with `runtime="onnx"` (ONNX Runtime runs the policy). Target: int8 ≥ 1.5× fp32
   in at least one configuration.
2. Bytes per publish per comm precision and their ratio to fp32 (every blob carries what the
   default scheme needs of the calibrated ranges, as the learner ships them). Target: int8 ≤ 0.26× fp32.
3. Seconds per weight update at an actor, pull + deserialize + load (`weights.decode`,
   `weights.load`, then `jax.device_put` — or, for an actor whose policy ONNX Runtime runs
   (`(onnx)` rows), the update's parameter-only part and the session's feeds — as `Actor._load`
   does), per comm → actor precision pair, in
   process (the broadcaster object in this process) and through Ray (one broadcaster Ray actor
   per comm variant, pulled with a blocking call). Timed round-robin (`bench.timing`); medians,
   stage medians and the speedup over fp32 → fp32 (fp32 → int8 shows an int8 actor quantizing
   every update itself). Target: int8 → int8 ≥ 3× faster than fp32 → fp32.

Absolute numbers move with the load on this shared 2-core machine; ratios measured side by side
in one process do not (DESIGN.md §3). XLA:CPU runs one thread (`--xla_threads`), async
dispatch off (`qrl.runtime.configure_jax`), as an actor with one CPU does.
"""

import argparse
import concurrent.futures
import dataclasses
import math
import os
import statistics
import time
from typing import Callable

import numpy as np

from bench.timing import interleaved_medians

ACTOR_TARGET = 1.5  # int8 / fp32 env steps/s, at least one configuration
BYTES_TARGET = 0.26  # int8 / fp32 bytes per publish
PULL_TARGET = 3.0  # fp32 -> fp32 seconds / int8 -> int8 seconds per update
PAPER_PRECISIONS = ("fp32", "bf16", "fp16", "int8")
BATCHED_PRECISIONS = ("fp32", "bf16", "int8")
COMM_VARIANTS = ("fp32", "fp16", "bf16", "int8", "int8+zlib")
# (comm variant, actor precision) pairs of the update-time table; fp32 -> fp32 is the reference,
# fp32 -> int8 is an int8 actor quantizing each update itself instead of the learner doing it once.
PULL_PAIRS = (("fp32", "fp32"), ("bf16", "bf16"), ("int8", "int8"), ("int8+zlib", "int8"), ("fp32", "int8"))
# Actors whose policy ONNX Runtime runs (`--actor_runtime=onnx`): candidates `<precision>@onnx`
# in the steps/s table, and `<comm> -> <actor> (onnx)` update pairs, whose load is feeding the
# session the update's arrays (its parameter-only part computed once) instead of a device_put.
ONNX_PRECISIONS = ("fp32", "int8")
ONNX_PULL_PAIRS = (("fp32", "fp32"), ("int8", "int8"))
ONNX_SUFFIX = "@onnx"
REPLAY_CAPACITY = 100_000
MIN_MEASURED_BATCHED_STEPS = 5


@dataclasses.dataclass(frozen=True)
class ActorConfig:
    """One actor setting: agent, env, config overrides, envs per actor, precisions to compare."""

    agent: str
    env_id: str
    overrides: tuple = ()
    num_envs: int = 1
    precisions: tuple = BATCHED_PRECISIONS

    @property
    def hidden(self) -> str:
        key = "actor_hidden_sizes" if self.agent == "d4pg" else "hidden_sizes"
        sizes = dict(self.overrides).get(key) or {"d4pg": (300, 200), "dqn": (256, 256)}[self.agent]
        return "-".join(map(str, sizes))

    @property
    def label(self) -> str:
        return f"{self.agent} {self.hidden} {self.env_id} x{self.num_envs}"


def _hidden(agent: str, sizes: tuple) -> tuple:
    return (("actor_hidden_sizes" if agent == "d4pg" else "hidden_sizes", sizes),)


# The paper's policies (D4PG actor 300-200 on DM Control, DQN 256-256 on CartPole: the agents'
# defaults and presets), one env per actor; then batched envs and wider policies, where the
# policy's matmuls are large enough for int8 to pay. Batched D4PG runs on gym Pendulum: a dm_control
# env takes ≈0.16 s to build (a fresh actor per round would spend minutes building envs).
FULL_CONFIGS = (
    ActorConfig("d4pg", "dmc:cartpole-balance", precisions=PAPER_PRECISIONS),
    ActorConfig("dqn", "gym:CartPole-v1", precisions=PAPER_PRECISIONS),
    ActorConfig("dqn", "gym:CartPole-v1", num_envs=64),
    ActorConfig("dqn", "gym:CartPole-v1", _hidden("dqn", (2048, 2048)), num_envs=16),
    ActorConfig("dqn", "gym:CartPole-v1", _hidden("dqn", (2048, 2048)), num_envs=64),
    ActorConfig("dqn", "gym:CartPole-v1", _hidden("dqn", (2048, 2048)), num_envs=256),
    ActorConfig("d4pg", "gym:Pendulum-v1", num_envs=64),
    ActorConfig("d4pg", "gym:Pendulum-v1", _hidden("d4pg", (1024, 1024)), num_envs=64),
    ActorConfig("d4pg", "gym:Pendulum-v1", _hidden("d4pg", (2048, 2048)), num_envs=256),
)
QUICK_CONFIGS = (
    ActorConfig("d4pg", "dmc:cartpole-balance", precisions=PAPER_PRECISIONS),
    ActorConfig("dqn", "gym:CartPole-v1", precisions=PAPER_PRECISIONS),
    ActorConfig("dqn", "gym:CartPole-v1", _hidden("dqn", (1024, 1024)), num_envs=64),
)
# Nets for publish bytes and update times: (label, index into the configs); the first two are
# the paper's sizes.
FULL_NETS = (("d4pg 300-200", 0), ("dqn 256-256", 1), ("d4pg 2048-2048", 8), ("dqn 2048-2048", 4))
QUICK_NETS = (("d4pg 300-200", 0), ("dqn 256-256", 1), ("dqn 1024-1024", 2))
PAPER_NETS = ("d4pg 300-200", "dqn 256-256")
FULL_DEFAULTS = {"rounds": 3, "round_seconds": 1.0, "pull_rounds": 10, "pull_round_seconds": 0.05, "ray": True}
QUICK_DEFAULTS = {"rounds": 1, "round_seconds": 0.2, "pull_rounds": 3, "pull_round_seconds": 0.01, "ray": False}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke test: 3 configs, 1 short round, no Ray")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    parser.add_argument("--rounds", type=int, default=None, help="measured rounds per actor config (3)")
    parser.add_argument("--round_seconds", type=float, default=None,
                        help="length of the slowest precision's actor run per round (1.0)")
    parser.add_argument("--pull_rounds", type=int, default=None, help="round-robin rounds of update timing (10)")
    parser.add_argument("--pull_round_seconds", type=float, default=None, help="one candidate's turn (0.05)")
    parser.add_argument("--ray", action=argparse.BooleanOptionalAction, default=None,
                        help="also time updates pulled from a Ray broadcaster (on; off with --quick)")
    parser.add_argument("--xla_threads", type=int, default=1, help="XLA:CPU threads (PJRT_NPROC), as one actor CPU")
    args = parser.parse_args(argv)
    defaults = QUICK_DEFAULTS if args.quick else FULL_DEFAULTS
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def load_note() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min) {five:.2f} (5 min) on {os.cpu_count()} CPUs"


# ----- setup -------------------------------------------------------------------------------------


@dataclasses.dataclass
class Prepared:
    """A config's agent factory, fp32 initial policy params and calibrated input ranges."""

    config: ActorConfig
    factory: Callable
    agent: object
    params: dict
    ranges: dict
    observation_spec: object


def random_actions(action_spec, count: int, rng: np.random.Generator) -> np.ndarray:
    """Uniform actions `[count, ...]`: discrete indices or points in the continuous bounds."""
    from dm_env import specs

    if isinstance(action_spec, specs.DiscreteArray):
        return rng.integers(0, action_spec.num_values, count).astype(action_spec.dtype)
    low = np.broadcast_to(action_spec.minimum, action_spec.shape)
    high = np.broadcast_to(action_spec.maximum, action_spec.shape)
    return rng.uniform(low, high, (count, *action_spec.shape)).astype(action_spec.dtype)


def prepare(config: ActorConfig) -> Prepared:
    """Builds the agent, its initial fp32 policy params, and input ranges calibrated as
    `Learner.publish` calibrates them (on as many observations), from a random-action rollout."""
    import jax
    from flax import serialization

    from agents.actorq import AgentFactory
    from qrl import envs
    from qrl.distributed.learner import CALIBRATION_OBSERVATIONS
    from qrl.quant import FP32, calibrate

    factory = AgentFactory(config.agent, config.env_id, dict(config.overrides))
    vector_env = envs.make_vector(config.env_id, 1, 0)
    observation_spec = vector_env.observation_spec()
    agent = factory(observation_spec, vector_env.action_spec())
    state = agent.init(jax.random.PRNGKey(0))
    params = serialization.to_state_dict(jax.device_get(agent.policy_params(state)))
    rng = np.random.default_rng(0)
    observations = [vector_env.reset()]
    for _ in range(CALIBRATION_OBSERVATIONS - 1):
        observations.append(vector_env.step(random_actions(vector_env.action_spec(), 1, rng)).observation)
    vector_env.close()
    ranges = calibrate(agent.policy_network(FP32).apply, params, np.concatenate(observations))
    return Prepared(config, factory, agent, params, ranges, observation_spec)


def encode_variant(prepared: Prepared, variant: str) -> bytes:
    """The blob the learner would publish at a comm variant (`int8+zlib`: int8, compressed)."""
    from qrl.distributed import weights

    precision, _, compression = variant.partition("+")
    return weights.encode(prepared.params, precision, prepared.ranges, compress=compression == "zlib")


# ----- 1. actor env steps/s ----------------------------------------------------------------------


def actor_run(prepared: Prepared, candidate: str, blob: bytes, steps: int,
              executor: concurrent.futures.Executor) -> dict:
    """One fresh `Actor` run of `steps` env steps (`candidate`: a precision, `@onnx` for the
    ONNX Runtime policy): steps/s and phase fractions of the run."""
    from qrl.distributed.actor import Actor
    from qrl.distributed.broadcaster import Broadcaster
    from qrl.distributed.counting import Counter
    from qrl.distributed.handles import LocalHandle
    from qrl.distributed.rate_limiters import MinSize
    from qrl.distributed.replay import ReplayServer

    config = prepared.config
    precision, _, runtime = candidate.partition("@")
    broadcaster = Broadcaster()
    broadcaster.publish(0, blob)
    replay = ReplayServer(REPLAY_CAPACITY, MinSize(1))
    actor = Actor(
        actor_id=0, agent_factory=prepared.factory, env_id=config.env_id, env_options=None,
        num_envs=config.num_envs, seed=0, actor_precision=precision,
        noise_scale=prepared.agent.exploration_range[0], replay=LocalHandle(replay, executor),
        broadcaster=LocalHandle(broadcaster, executor), counter=LocalHandle(Counter(), executor),
        max_steps=steps, runtime=runtime or "jax",
    )
    actor.update(wait=True)  # first weights: decode, load and compile before the timed run
    before = actor.stats()["seconds"]
    actor.run()
    stats = actor.stats()
    replay.close()
    seconds = {phase: stats["seconds"][phase] - before[phase] for phase in before if phase not in ("other", "total")}
    total = stats["run_seconds"]
    phases = {
        "env_step": seconds["env_step"],
        "inference": seconds["inference"],
        "insert": seconds["insert"],
    }
    timed = sum(value for phase, value in seconds.items() if phase != "compile")
    phases["other"] = max(total - timed, 0.0)
    return {
        "steps": stats["steps"],
        "run_seconds": total,
        "steps_per_second": stats["steps_per_second"],
        "fractions": {phase: value / total for phase, value in phases.items()},
    }


def measure_actor_config(prepared: Prepared, args, executor) -> dict:
    """Warm-up round (sizes N), then `args.rounds` alternating rounds; medians per precision."""
    config = prepared.config
    candidates = [*config.precisions, *(precision + ONNX_SUFFIX for precision in ONNX_PRECISIONS)]
    blobs = {candidate: encode_variant(prepared, candidate.partition("@")[0]) for candidate in candidates}
    warmup_steps = max(256, 16 * config.num_envs)
    rates = {candidate: actor_run(prepared, candidate, blobs[candidate], warmup_steps, executor)["steps_per_second"]
             for candidate in candidates}
    batches = max(MIN_MEASURED_BATCHED_STEPS, math.ceil(args.round_seconds * min(rates.values()) / config.num_envs))
    steps = batches * config.num_envs
    runs = {candidate: [] for candidate in candidates}
    names = list(candidates)
    for round_index in range(args.rounds):
        shift = round_index % len(names)
        for precision in names[shift:] + names[:shift]:
            runs[precision].append(actor_run(prepared, precision, blobs[precision], steps, executor))
    result = {"label": config.label, "steps_per_run": steps, "precisions": {}}
    for precision, precision_runs in runs.items():
        result["precisions"][precision] = {
            "steps_per_second": statistics.median(run["steps_per_second"] for run in precision_runs),
            "fractions": {phase: statistics.median(run["fractions"][phase] for run in precision_runs)
                          for phase in precision_runs[0]["fractions"]},
            "rounds": [run["steps_per_second"] for run in precision_runs],
        }
    reference = result["precisions"]["fp32"]["steps_per_second"]
    result["ratio_to_fp32"] = {precision: values["steps_per_second"] / reference
                               for precision, values in result["precisions"].items() if precision != "fp32"}
    return result


def format_actor_config(result: dict) -> list[str]:
    lines = [f"{result['label']}  ({result['steps_per_run']} steps per run)"]
    for precision, values in result["precisions"].items():
        fractions = values["fractions"]
        lines.append(
            f"    {precision:10s} {values['steps_per_second']:10.0f} steps/s   env {fractions['env_step']:.2f}  "
            f"inference {fractions['inference']:.2f}  insert {fractions['insert']:.2f}  other {fractions['other']:.2f}"
        )
    lines.append("    ratios: " + "  ".join(f"{precision}/fp32 {ratio:.2f}×"
                                         for precision, ratio in result["ratio_to_fp32"].items()))
    return lines


# ----- 2. bytes per publish ----------------------------------------------------------------------


def publish_bytes(prepared: Prepared) -> dict:
    sizes = {variant: len(encode_variant(prepared, variant)) for variant in COMM_VARIANTS}
    return {"bytes": sizes, "ratio_to_fp32": {variant: size / sizes["fp32"] for variant, size in sizes.items()}}


def format_bytes(label: str, result: dict) -> str:
    cells = "  ".join(f"{variant} {size:,} ({result['ratio_to_fp32'][variant]:.3f})"
                      for variant, size in result["bytes"].items())
    return f"    {label:16s} {cells}"


# ----- 3. update time at the actor ---------------------------------------------------------------


class UpdateCall:
    """One update as `Actor._load` does it after a pull: decode, load at the actor precision,
    then hand the arrays to the policy's runtime (`backend.prepare`: a device_put for JAX, the
    parameter-only part and the session's feeds for ONNX Runtime); records each stage's seconds."""

    def __init__(self, pull: Callable[[], tuple], actor_precision: str, backend):
        self._pull = pull
        self._actor_precision = actor_precision
        self._backend = backend
        self.stages = {"pull": [], "deserialize": [], "load": []}

    def __call__(self) -> None:
        from qrl.distributed import weights

        start = time.perf_counter()
        _, blob = self._pull()
        pulled = time.perf_counter()
        message = weights.decode(blob)
        decoded = time.perf_counter()
        self._backend.prepare(weights.load(message, self._actor_precision))
        loaded = time.perf_counter()
        self.stages["pull"].append(pulled - start)
        self.stages["deserialize"].append(decoded - pulled)
        self.stages["load"].append(loaded - decoded)


def update_backends(prepared: Prepared) -> dict:
    """(actor precision, runtime) -> the policy backend an actor of that kind loads updates into."""
    from qrl.deploy.live import policy_backend
    from qrl.distributed import weights

    spec = prepared.observation_spec
    backends = {}
    pairs = [(variant, actor, "jax") for variant, actor in PULL_PAIRS]
    pairs += [(variant, actor, "onnx") for variant, actor in ONNX_PULL_PAIRS]
    for variant, actor, runtime in pairs:
        if (actor, runtime) not in backends:
            message = weights.decode(encode_variant(prepared, variant))
            template = weights.load(message, actor)
            policy = prepared.agent.policy(weights.actor_network_precision(actor, message.int8_scheme))
            backends[(actor, runtime)] = policy_backend(runtime, policy, template, spec.shape, spec.dtype)
    return backends


def measure_updates(pulls: dict, args, backends: dict) -> dict:
    """`pulls`: (comm variant, actor precision, runtime) -> a pull callable. Medians in ms and speedups."""
    calls = {f"{variant} -> {actor}" + ("" if runtime == "jax" else f" ({runtime})"):
             UpdateCall(pull, actor, backends[(actor, runtime)]) for (variant, actor, runtime), pull in pulls.items()}
    medians = interleaved_medians(calls, args.pull_rounds, args.pull_round_seconds, max_calls=200)
    result = {}
    for name, call in calls.items():
        result[name] = {
            "ms": medians[name]["wall"] * 1e3,
            "stages_ms": {stage: statistics.median(values) * 1e3 for stage, values in call.stages.items()},
        }
    reference = result["fp32 -> fp32"]["ms"]
    for values in result.values():
        values["speedup_vs_fp32"] = reference / values["ms"]
    return result


def format_updates(label: str, result: dict) -> list[str]:
    lines = [f"  {label}"]
    for name, values in result.items():
        stages = values["stages_ms"]
        lines.append(
            f"    {name:25s} {values['ms']:8.3f} ms  (pull {stages['pull']:.3f}, deserialize {stages['deserialize']:.3f},"
            f" load {stages['load']:.3f})  speedup vs fp32 -> fp32 {values['speedup_vs_fp32']:.2f}×"
        )
    return lines


def in_process_pulls(prepared: Prepared) -> dict:
    from qrl.distributed.broadcaster import Broadcaster

    pulls = {}
    pairs = [(variant, actor, "jax") for variant, actor in PULL_PAIRS]
    pairs += [(variant, actor, "onnx") for variant, actor in ONNX_PULL_PAIRS]
    for variant, actor, runtime in pairs:
        broadcaster = Broadcaster()
        broadcaster.publish(0, encode_variant(prepared, variant))
        pulls[(variant, actor, runtime)] = lambda broadcaster=broadcaster: broadcaster.pull(-1)
    return pulls


def measure_ray_updates(nets: list[tuple[str, Prepared]], args) -> dict:
    """One Ray broadcaster actor per comm variant; each net's blobs published in turn, then timed."""
    from qrl.distributed.broadcaster import Broadcaster
    from qrl.distributed.launching import NodeSpec
    from qrl.distributed.ray_launcher import RayBackend

    variants = list(dict.fromkeys(variant for variant, _ in PULL_PAIRS))
    node_names = {variant: f"broadcaster-{variant.replace('+', '-')}" for variant in variants}
    started = time.perf_counter()
    backend = RayBackend(None, num_cpus=2, run_name="bench-actorq")
    try:
        handles = {variant: backend.create(NodeSpec(node_names[variant], Broadcaster, {}), {}) for variant in variants}
        backend.wait_ready(list(node_names.values()))
        startup = time.perf_counter() - started
        results = {}
        for version, (label, prepared) in enumerate(nets):
            for variant in variants:
                handles[variant].call("publish", version, encode_variant(prepared, variant))
            pulls = {(variant, actor, "jax"): (lambda handle=handles[variant]: handle.call("pull", -1))
                     for variant, actor in PULL_PAIRS}
            pulls.update({(variant, actor, "onnx"): (lambda handle=handles[variant]: handle.call("pull", -1))
                          for variant, actor in ONNX_PULL_PAIRS})
            results[label] = measure_updates(pulls, args, update_backends(prepared))
        return {"startup_seconds": startup, "nets": results}
    finally:
        backend.shutdown()


# ----- report ------------------------------------------------------------------------------------


def summarize(results: dict) -> list[str]:
    """The three targets: PASS/MISS at the best configuration, and how the paper's sizes fare."""
    lines = ["", "targets"]
    for runtime, candidate in (("jax", "int8"), ("onnx", "int8" + ONNX_SUFFIX)):
        # against the faster fp32 actor of either runtime: the speedup an int8 actor buys over the best fp32 one.
        ratios = {}
        for result in results["actor"]:
            rates = result["precisions"]
            fastest_fp32 = max(rates[name]["steps_per_second"] for name in ("fp32", "fp32" + ONNX_SUFFIX) if name in rates)
            ratios[result["label"]] = rates[candidate]["steps_per_second"] / fastest_fp32
        best = max(ratios, key=ratios.get)
        paper = ", ".join(f"{label} {ratio:.2f}×" for label, ratio in ratios.items() if label.endswith(" x1"))
        lines.append(f"  1{'ab'[runtime == 'onnx']}. actor env steps/s int8 ({runtime}) / fastest fp32 >= {ACTOR_TARGET}×: "
                     f"{_verdict(ratios[best] >= ACTOR_TARGET)} — best {ratios[best]:.2f}× ({best}); one env per actor "
                     f"(paper sizes): {paper}")
    plain = {label: result["ratio_to_fp32"]["int8"] for label, result in results["bytes"].items()}
    zlib = {label: result["ratio_to_fp32"]["int8+zlib"] for label, result in results["bytes"].items()}
    best = min(plain, key=plain.get)
    paper_plain = ", ".join(f"{label} {plain[label]:.3f}" for label in PAPER_NETS if label in plain)
    paper_zlib = ", ".join(f"{label} {zlib[label]:.3f}" for label in PAPER_NETS if label in zlib)
    paper_pass = all(plain[label] <= BYTES_TARGET for label in PAPER_NETS if label in plain)
    lines.append(f"  2. bytes per publish int8/fp32 <= {BYTES_TARGET}: {_verdict(plain[best] <= BYTES_TARGET)}"
                 f" — best {plain[best]:.3f} ({best}); paper sizes {_verdict(paper_pass)}: int8 {paper_plain},"
                 f" int8+zlib {paper_zlib}")
    speedups = {}
    for where in ("in_process", "ray"):
        for label, result in (results.get(where) or {}).get("nets", {}).items():
            speedups[f"{where.replace('_', '-')} {label}"] = result["int8 -> int8"]["speedup_vs_fp32"]
    best = max(speedups, key=speedups.get)
    lines.append(f"  3. update (pull + deserialize + load) int8->int8 >= {PULL_TARGET}× faster than fp32->fp32: "
                 f"{_verdict(speedups[best] >= PULL_TARGET)} — best {speedups[best]:.2f}× ({best}); "
                 + ", ".join(f"{where} {speedup:.2f}×" for where, speedup in speedups.items()))
    return lines


def _verdict(passed: bool) -> str:
    return "PASS" if passed else "MISS"


def headline_cells(results: dict) -> list[dict]:
    """The README's figures (`bench.tables` cells): actor env steps/s per precision (ratio to
    fp32), bytes per publish (ratio to fp32), and the update's (pull + deserialize + load) ms
    with its speedup over fp32 -> fp32."""
    from bench.tables import cell

    cells = []
    for result in results["actor"]:
        for precision, values in result["precisions"].items():
            cells.append(cell("actor env steps/s", result["label"], precision, values["steps_per_second"], "steps/s",
                              1.0 if precision == "fp32" else result["ratio_to_fp32"][precision]))
    for label, result in results["bytes"].items():
        for variant, size in result["bytes"].items():
            cells.append(cell("bytes per publish", label, variant, size, "bytes", result["ratio_to_fp32"][variant]))
    for where in ("in_process", "ray"):
        for label, result in (results.get(where) or {}).get("nets", {}).items():
            for variant, values in result.items():
                if isinstance(values, dict) and "ms" in values:
                    cells.append(cell("update ms (speedup vs fp32 -> fp32)", f"{where.replace('_', '-')} {label}",
                                      variant, values["ms"], "ms", values.get("speedup_vs_fp32")))
    return cells


def main(argv=None) -> None:
    args = parse_args(argv)
    from qrl import runtime

    runtime.configure_jax(args.xla_threads)
    import jax

    started = time.perf_counter()
    configs = QUICK_CONFIGS if args.quick else FULL_CONFIGS
    net_choices = QUICK_NETS if args.quick else FULL_NETS
    print(f"ActorQ bench: jax {jax.__version__}, PJRT_NPROC={os.environ.get('PJRT_NPROC', 'unset')}, "
          f"async dispatch off; {load_note()}", flush=True)
    results = {"environment": {"jax": jax.__version__, "PJRT_NPROC": os.environ.get("PJRT_NPROC", ""),
                               "rounds": args.rounds, "round_seconds": args.round_seconds,
                               "cpu_count": os.cpu_count()}, "actor": []}
    print(f"\n1. actor env steps/s: qrl.distributed.actor.Actor.run in this process, medians of "
          f"{args.rounds} alternating round(s) after a warm-up; phase fractions of the run", flush=True)
    prepared_configs = []
    with concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="bench-actorq") as executor:
        for config in configs:
            prepared = prepare(config)
            prepared_configs.append(prepared)
            result = measure_actor_config(prepared, args, executor)
            results["actor"].append(result)
            print("\n".join("  " + line for line in format_actor_config(result)), flush=True)

    nets = [(label, prepared_configs[index]) for label, index in net_choices]
    print("\n2. bytes per publish (ratio to fp32) at the default int8 actor scheme", flush=True)
    results["bytes"] = {label: publish_bytes(prepared) for label, prepared in nets}
    for label, result in results["bytes"].items():
        print(format_bytes(label, result), flush=True)
    print("    ratios: " + "  ".join(f"{label} int8/fp32 {result['ratio_to_fp32']['int8']:.3f}"
                                      for label, result in results["bytes"].items()), flush=True)

    print(f"\n3. update at an actor: pull + deserialize + load (+ device_put), median ms over "
          f"{args.pull_rounds} round-robin rounds", flush=True)
    print("  in process (broadcaster object in this process)", flush=True)
    results["in_process"] = {"nets": {}}
    for label, prepared in nets:
        result = measure_updates(in_process_pulls(prepared), args, update_backends(prepared))
        results["in_process"]["nets"][label] = result
        print("\n".join("  " + line for line in format_updates(label, result)), flush=True)
    if args.ray:
        print("  through Ray (a broadcaster Ray actor per comm variant, blocking pulls from this driver)", flush=True)
        results["ray"] = measure_ray_updates(nets, args)
        print(f"    (Ray start and broadcaster actors ready: {results['ray']['startup_seconds']:.1f} s)", flush=True)
        for label, result in results["ray"]["nets"].items():
            print("\n".join("  " + line for line in format_updates(label, result)), flush=True)
    else:
        print("  through Ray: skipped (--no-ray)", flush=True)

    print("\n".join(summarize(results)), flush=True)
    print(f"bench took {time.perf_counter() - started:.0f} s; {load_note()}", flush=True)
    if args.json:
        from bench.machine import write_json

        write_json(args.json, results, cells=headline_cells(results))


if __name__ == "__main__":
    main()
