"""One ActorQ run: the program (counter, replay, broadcaster, learner, evaluator, N actors), its
launch in-process or on Ray, stop conditions, and everything written into the workdir.

The workdir gets `config.json` (at the start), `metrics.csv` and TensorBoard events (one row per
evaluation: wall time, learner and actor steps, fp32 and actor-precision returns), learner
checkpoints under `checkpoints/`, and at the end `results.json` (counts, time to target, final
returns, throughput per node, the runtime breakdown, bytes per publish, CPU seconds and an energy
estimate; `qrl.distributed.report` reads it) and `breakdown.png`.
"""

import dataclasses
import math
import os
import time
from typing import Any, Callable, Iterable, Mapping, Optional

from qrl import envs, io, runtime, workdirs
from qrl.distributed import energy, weights
from qrl.distributed.broadcaster import Broadcaster
from qrl.distributed.actor import ACTOR_RUNTIMES, Actor
from qrl.distributed.agent import DistributedAgent, exploration_schedule
from qrl.distributed.counting import Counter
from qrl.distributed.evaluator import Evaluator
from qrl.checkpointing import Checkpointer
from qrl.distributed.launching import (
    DEFAULT_BIND_ADDRESS, InProcessBackend, NodeFailure, NodeRef, NodeSpec, Program, check_bind_address, supervise,
)
from qrl.distributed.learner import Learner
from qrl.distributed.rate_limiters import MinSize, SampleToInsertRatio, default_error_buffer
from qrl.distributed.replay import ReplayServer
from qrl.envs.ids import HOST_FAMILIES, check_seed, split_env_id
from qrl.errors import QrlInputError
from qrl.ranges import ANY_FINITE, AT_LEAST_0, AT_LEAST_1, POSITIVE, Range, check_ranges
from qrl.logging import MetricsLogger

LAUNCHERS = ("inprocess", "ray")
# How the replay paces the learner against the actors: `samples_per_insert` (Reverb's
# SampleToInsertRatio: data reuse fixed, either side may wait) or `min_size` (Reverb's MinSize:
# actors never wait; with `max_times_sampled` the learner consumes only what actors produce).
RATE_LIMITERS = ("samples_per_insert", "min_size")
# How the actors' exploration noise runs from actor 0 to actor N-1: `log` (Ape-X's epsilons) or
# `linear` (QuaRL's `get_actor_sigma`: 0, 1/N, ..., (N-1)/N times a maximum).
EXPLORATION_SPACINGS = ("log", "linear")
CONFIG_FILE, RESULTS_FILE, CHECKPOINT_DIR = "config.json", "results.json", "checkpoints"
# Settings a resumed run may change; everything else must match the run it continues.
RESUMABLE_FIELDS = (
    "max_learner_steps", "max_actor_steps", "max_seconds", "target_return", "launcher", "ray_address",
    "ray_bind_address", "learner_cpus", "actor_cpus", "evaluator_cpus", "eval_every_seconds", "eval_episodes",
)
MAX_ACTORS = 1024  # a sanity bound: each actor is a process (Ray) or a thread (in-process).
MAX_CPUS_PER_NODE = 1024.0
COUNTS = ("actor_steps", "learner_steps", "episodes")
ACTOR_PHASES = ("env_step", "inference", "pull_wait", "deserialize", "load", "insert", "other")
LEARNER_PHASES = ("sample_wait", "update", "publish", "other")


@dataclasses.dataclass(frozen=True)
class ActorQConfig:
    """Everything one run needs (the `launch.actorq` flags)."""

    agent: str = "d4pg"
    env: str = "dmc:cartpole-balance"
    seed: int = 0
    num_actors: int = 2
    envs_per_actor: int = 1
    actor_precision: str = "int8"
    comm_precision: Optional[str] = None  # None: int8/fp16/bf16 actors get their own precision, fp32 actors fp32.
    compress: bool = False
    actor_int8_scheme: str = weights.DEFAULT_ACTOR_INT8_SCHEME  # int8 actors' scheme (weights.ACTOR_INT8_SCHEMES).
    actor_runtime: str = "jax"  # what runs the actors' policy: jax or onnx (qrl.deploy.live).
    learner_device: str = "cpu"  # cpu or gpu: where the learner's state and updates live; actors stay on CPU.
    # Custom Ray resources every actor requests ({"actor_host": 1}): a cluster then places actors only on
    # the nodes that offer them (`ray start --resources='{"actor_host": 8}'`). Ray launcher only.
    actor_resources: Mapping[str, float] = dataclasses.field(default_factory=dict)
    actor_update_period: int = 1000  # actor steps between pulls (Acme's variable_update_period).
    sync_pull: bool = False
    publish_period: int = 100  # learner updates between publishes.
    insert_chunk: int = 64  # transitions per replay insert.
    rate_limiter: str = "samples_per_insert"  # or "min_size": QuaRL's regime, only a minimum size (RATE_LIMITERS).
    max_times_sampled: Optional[int] = None  # items removed after this many draws (QuaRL's run scripts: 16); None: kept.
    samples_per_insert: Optional[float] = None  # None: the agent's gradient_steps * batch_size / train_freq.
    samples_per_insert_tolerance: float = 0.1  # Acme's tolerance rate (error buffer = min size * spi * this).
    min_replay_size: Optional[int] = None  # None: the agent's max(learning_starts, batch_size).
    replay_capacity: Optional[int] = None  # None: the agent's buffer_size.
    prioritized: bool = False
    priority_exponent: float = 0.6
    importance_exponent: float = 0.4
    exploration_first: Optional[float] = None  # actor 0's epsilon / sigma (None: the agent's schedule).
    exploration_last: Optional[float] = None  # actor N-1's.
    exploration_spacing: str = "log"  # or "linear" (EXPLORATION_SPACINGS).
    eval_every_seconds: float = 10.0
    eval_episodes: int = 5
    max_eval_episode_steps: Optional[int] = None
    max_learner_steps: Optional[int] = None
    max_actor_steps: Optional[int] = None
    max_seconds: Optional[float] = None
    target_return: Optional[float] = None
    checkpoint_every: int = 10_000  # learner updates between checkpoints (0: only at the end).
    launcher: str = "inprocess"
    ray_address: Optional[str] = None
    ray_bind_address: str = DEFAULT_BIND_ADDRESS  # the local Ray's node address (loopback: this machine only).
    learner_cpus: float = 1.0
    actor_cpus: float = 1.0
    evaluator_cpus: float = 0.0
    overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # agent config key=value
    env_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    preset: Optional[str] = None  # the ActorQ preset these values came from (`apply_preset`); a record.

    def to_dict(self) -> dict:
        values = dataclasses.asdict(self)
        values["overrides"], values["env_options"] = dict(self.overrides), dict(self.env_options)
        values["actor_resources"] = dict(self.actor_resources)
        return values

    @property
    def resolved_comm_precision(self) -> str:
        if self.comm_precision:
            return self.comm_precision
        return "fp32" if self.actor_precision == "fp32" else self.actor_precision


@dataclasses.dataclass(frozen=True)
class ActorQPreset:
    """A named set of run settings (`ActorQConfig` fields) and agent config overrides, e.g. a
    paper's setup; each agent that runs distributed lists its own (`agents/<name>/actorq.py`)."""

    name: str
    run: Mapping[str, Any]
    agent: Mapping[str, Any]


def apply_preset(config: ActorQConfig, preset: ActorQPreset, explicit: Iterable[str] = ()) -> ActorQConfig:
    """`config` with `preset`'s run settings for every field not named in `explicit` (the fields
    the user set) and its agent values beneath `config.overrides` (the user's overrides win)."""
    unknown = sorted(set(preset.run) - {field.name for field in dataclasses.fields(ActorQConfig)})
    if unknown:
        raise ValueError(f"preset {preset.name!r} sets unknown ActorQ fields: {', '.join(unknown)}")
    explicit = set(explicit)
    run = {name: value for name, value in preset.run.items() if name not in explicit}
    overrides = {**dict(preset.agent), **dict(config.overrides)}
    return dataclasses.replace(config, **run, overrides=overrides, preset=preset.name)


def validate(config: ActorQConfig) -> None:
    """One `QrlInputError` line for the first bad setting (the agent factory checks the agent)."""
    family, _ = split_env_id(config.env)
    if family not in HOST_FAMILIES:
        raise QrlInputError(f"ActorQ actors step host environments ({', '.join(HOST_FAMILIES)}); got {config.env}")
    check_seed(config.seed)
    weights.check_precision(config.actor_precision, weights.ACTOR_PRECISIONS, "actor precision")
    weights.check_precision(config.resolved_comm_precision, weights.COMM_PRECISIONS, "communication precision")
    if config.actor_int8_scheme not in weights.ACTOR_INT8_SCHEMES:
        raise QrlInputError(f"--actor_int8_scheme must be one of {', '.join(weights.ACTOR_INT8_SCHEMES)}, "
                            f"got {config.actor_int8_scheme!r}")
    if config.actor_runtime not in ACTOR_RUNTIMES:
        raise QrlInputError(f"--actor_runtime must be one of {', '.join(ACTOR_RUNTIMES)}, got {config.actor_runtime!r}")
    if config.learner_device not in runtime.DEVICE_KINDS:
        raise QrlInputError(f"--learner_device must be one of {', '.join(runtime.DEVICE_KINDS)}, "
                            f"got {config.learner_device!r}")
    if config.learner_device != "cpu" and not (config.launcher == "ray" and config.ray_address):
        try:  # this machine runs the learner: it must see the device (a cluster's is checked on joining).
            runtime.device_of(config.learner_device)
        except QrlInputError as error:
            raise QrlInputError(f"--learner_device={config.learner_device}: {error}") from None
    if config.actor_resources and config.launcher != "ray":
        raise QrlInputError("--actor_resources places actors on Ray nodes: it needs --launcher=ray")
    for name, amount in dict(config.actor_resources).items():
        if not name or not (isinstance(amount, (int, float)) and math.isfinite(amount) and amount > 0):
            raise QrlInputError(f"--actor_resources: {name!r} needs a positive amount, got {amount!r}")
    if config.rate_limiter not in RATE_LIMITERS:
        raise QrlInputError(f"--rate_limiter must be one of {', '.join(RATE_LIMITERS)}, got {config.rate_limiter!r}")
    if config.rate_limiter == "min_size" and config.samples_per_insert is not None:
        raise QrlInputError("--samples_per_insert sets the samples_per_insert limiter's ratio; "
                            "--rate_limiter=min_size has none")
    tolerance_default = ActorQConfig.__dataclass_fields__["samples_per_insert_tolerance"].default
    if config.rate_limiter == "min_size" and config.samples_per_insert_tolerance != tolerance_default:
        raise QrlInputError("samples_per_insert_tolerance is the samples_per_insert limiter's; "
                            "--rate_limiter=min_size has no ratio to tolerate")
    if config.launcher not in LAUNCHERS:
        raise QrlInputError(f"--launcher must be one of {', '.join(LAUNCHERS)}, got {config.launcher!r}")
    if config.ray_address and config.launcher != "ray":
        raise QrlInputError("--ray_address needs --launcher=ray")
    check_bind_address(config.ray_bind_address)
    stops = (config.max_learner_steps, config.max_actor_steps, config.max_seconds, config.target_return)
    if all(value is None for value in stops):
        raise QrlInputError("give a stop condition: --max_learner_steps, --max_actor_steps, --max_seconds or --target_return")
    counts = ("envs_per_actor", "actor_update_period", "publish_period", "insert_chunk", "eval_episodes",
              "max_learner_steps", "max_actor_steps", "min_replay_size", "replay_capacity", "max_eval_episode_steps",
              "max_times_sampled")
    if config.exploration_spacing not in EXPLORATION_SPACINGS:
        raise QrlInputError(f"--exploration_spacing must be one of {', '.join(EXPLORATION_SPACINGS)}, "
                            f"got {config.exploration_spacing!r}")
    noise_ends = ("exploration_first", "exploration_last")
    if config.exploration_spacing == "log" and any(getattr(config, name) == 0 for name in noise_ends):
        raise QrlInputError("--exploration_spacing=log needs nonzero --exploration_first and --exploration_last "
                            "(linear spacing may start at 0)")
    rates = ("max_seconds", "samples_per_insert", "eval_every_seconds")
    check_ranges([
        ("--num_actors", config.num_actors, AT_LEAST_1),
        ("--num_actors", config.num_actors, Range(maximum=MAX_ACTORS)),
        *((f"--{name}", getattr(config, name), AT_LEAST_1) for name in counts),
        *((f"--{name}", getattr(config, name), POSITIVE) for name in rates),
        ("--target_return", config.target_return, ANY_FINITE),
        *((f"--{name}", getattr(config, name), AT_LEAST_0)
          for name in ("checkpoint_every", "samples_per_insert_tolerance", "priority_exponent", *noise_ends)),
        ("--importance_exponent", config.importance_exponent, Range(minimum=0, maximum=1)),
        *((f"--{name}", getattr(config, name), allowed) for name in ("learner_cpus", "actor_cpus", "evaluator_cpus")
          for allowed in (AT_LEAST_0, Range(maximum=MAX_CPUS_PER_NODE))),
    ])


def _env_specs(config: ActorQConfig):
    env = envs.make(config.env, seed=config.seed, **dict(config.env_options))
    try:
        return env.observation_spec(), env.action_spec()
    finally:
        env.close()


def build_program(config: ActorQConfig, agent: DistributedAgent, factory, specs, workdir: Optional[str],
                  resume: bool, start_time: float) -> Program:
    """The nodes of one run, in creation order."""
    observation_spec, action_spec = specs
    settings = agent.replay
    samples_per_insert = config.samples_per_insert or settings.samples_per_insert
    min_size = config.min_replay_size or settings.min_size
    capacity = config.replay_capacity or settings.capacity
    batch_items = settings.batch_size * settings.updates_per_step
    error_buffer = default_error_buffer(
        samples_per_insert, min_size, batch_items, config.insert_chunk, config.samples_per_insert_tolerance
    )
    first, last = agent.exploration_range
    noise_scales = exploration_schedule(
        config.num_actors,
        config.exploration_first if config.exploration_first is not None else first,
        config.exploration_last if config.exploration_last is not None else last,
        config.exploration_spacing,
    )
    comm_precision = config.resolved_comm_precision
    rate_limiter = (MinSize(min_size) if config.rate_limiter == "min_size"
                    else SampleToInsertRatio(samples_per_insert, min_size, error_buffer))
    nodes = [
        NodeSpec("counter", Counter, {}, concurrency=4),
        NodeSpec("replay", ReplayServer, dict(
            capacity=max(capacity, min_size), rate_limiter=rate_limiter,
            prioritized=config.prioritized, priority_exponent=config.priority_exponent,
            importance_exponent=config.importance_exponent, seed=config.seed, max_times_sampled=config.max_times_sampled,
        ), concurrency=config.num_actors + 6),
        NodeSpec("broadcaster", Broadcaster, {}, concurrency=config.num_actors + 4),
        NodeSpec("learner", Learner, dict(
            agent_factory=factory, observation_spec=observation_spec, action_spec=action_spec, seed=config.seed,
            replay=NodeRef("replay"), broadcaster=NodeRef("broadcaster"), counter=NodeRef("counter"),
            comm_precision=comm_precision, compress=config.compress,
            int8_scheme=config.actor_int8_scheme, publish_period=config.publish_period,
            prioritized=config.prioritized,
            checkpoint_dir=os.path.join(os.path.abspath(workdir), CHECKPOINT_DIR) if workdir else None,
            checkpoint_every=config.checkpoint_every, resume=resume, max_steps=config.max_learner_steps,
            xla_threads=max(1, int(config.learner_cpus)), device=config.learner_device,
        ), num_cpus=config.learner_cpus, num_gpus=1.0 if config.learner_device == "gpu" else 0.0, concurrency=4),
        NodeSpec("evaluator", Evaluator, dict(
            agent_factory=factory, observation_spec=observation_spec, action_spec=action_spec, env_id=config.env,
            env_options=dict(config.env_options), seed=config.seed, actor_precision=config.actor_precision,
            learner=NodeRef("learner"), broadcaster=NodeRef("broadcaster"), counter=NodeRef("counter"),
            episodes=config.eval_episodes, every_seconds=config.eval_every_seconds, start_time=start_time,
            max_episode_steps=config.max_eval_episode_steps, runtime=config.actor_runtime,
        ), num_cpus=config.evaluator_cpus, concurrency=4),
    ]
    for actor_id in range(config.num_actors):
        nodes.append(NodeSpec(f"actor_{actor_id}", Actor, dict(
            actor_id=actor_id, agent_factory=factory, env_id=config.env, env_options=dict(config.env_options),
            num_envs=config.envs_per_actor, seed=config.seed, actor_precision=config.actor_precision,
            noise_scale=noise_scales[actor_id], replay=NodeRef("replay"), broadcaster=NodeRef("broadcaster"),
            counter=NodeRef("counter"), update_period=config.actor_update_period, sync_pull=config.sync_pull,
            insert_chunk=config.insert_chunk, xla_threads=max(1, int(config.actor_cpus)), runtime=config.actor_runtime,
        ), num_cpus=config.actor_cpus, resources=dict(config.actor_resources), concurrency=3, restartable=True))
    return Program(nodes)


def prepare_workdir(workdir: str, config: ActorQConfig, resume: bool, overwrite: bool) -> None:
    """A fresh workdir, or (resume) one whose run has the same settings. Writes config.json.

    qrl claims the workdir through `qrl.workdirs`: overwriting removes only the outputs its
    marker lists, and a non-empty directory qrl did not create is refused.
    """
    config_path = os.path.join(workdir, CONFIG_FILE)
    if not resume:
        workdirs.claim(workdir, "actorq", overwrite,
                       hint="pass --resume to continue it or --overwrite to replace its outputs")
    elif not os.path.exists(config_path):
        raise QrlInputError(f"--resume: {workdir} holds no ActorQ run")
    else:
        workdirs.require_kind(workdir, ("actorq",), "--resume")
        saved = io.read_json(config_path).get("actorq", {})
        current = io.to_json_compatible(config.to_dict())
        defaults = io.to_json_compatible(ActorQConfig().to_dict())  # for fields newer than the saved run.
        differing = sorted(
            key for key in set(saved) | set(current)
            if key not in RESUMABLE_FIELDS and saved.get(key, defaults.get(key)) != current.get(key)
        )
        if differing:
            details = ", ".join(f"{key} ({saved.get(key)!r} -> {current.get(key)!r})" for key in differing)
            raise QrlInputError(f"--resume with a different config than the run in {workdir}: {details}")
    io.atomic_write_json(config_path, {"actorq": config.to_dict()})


class _Progress:
    """The driver's view while the program runs: new evaluation records go to metrics.csv and
    TensorBoard; stop conditions are checked against the counter and the records."""

    def __init__(self, config: ActorQConfig, logger: Optional[MetricsLogger], printer: Callable[[str], None]):
        self.config = config
        self.logger = logger
        self.printer = printer
        self.records: list[dict] = []
        self.target_record: Optional[dict] = None
        self.counts: dict = {}
        self._last_print = 0.0

    def absorb(self, records: list[dict]) -> None:
        for record in records:
            self.records.append(record)
            if self.logger is not None:
                self.logger.write(record["learner_steps"], {
                    key: record[key] for key in ("wall_seconds", "actor_steps", "episodes", "return_fp32", "return_actor")
                })
            target = self.config.target_return
            if target is not None and self.target_record is None and record["return_fp32"] >= target:
                self.target_record = record
            self.printer(
                f"[{record['wall_seconds']:7.1f}s] learner {record['learner_steps']:>8d}  actor {record['actor_steps']:>9d}  "
                f"return fp32 {record['return_fp32']:9.2f}  {self.config.actor_precision} {record['return_actor']:9.2f}"
            )

    def should_stop(self, handles: dict, elapsed: float) -> Optional[str]:
        self.absorb(handles["evaluator"].call("records", len(self.records)))
        self.counts = handles["counter"].call("get_counts")
        config = self.config
        if self.target_record is not None:
            return "target_return"
        if config.max_learner_steps is not None and self.counts.get("learner_steps", 0) >= config.max_learner_steps:
            return "max_learner_steps"
        if config.max_actor_steps is not None and self.counts.get("actor_steps", 0) >= config.max_actor_steps:
            return "max_actor_steps"
        if config.max_seconds is not None and elapsed >= config.max_seconds:
            return "max_seconds"
        return None


def run_actorq(config: ActorQConfig, agent_factory: Callable[[Any, Any], DistributedAgent], workdir: Optional[str] = None,
               resume: bool = False, overwrite: bool = False, printer: Callable[[str], None] = print) -> dict:
    """Runs ActorQ with `config`; returns the results dict (also written to `workdir`).

    Bad input — here or raised inside a node, e.g. no intact checkpoint to resume from — is a
    QrlInputError; a node that dies or fails for good a one-line NodeFailure naming the last
    checkpoint; Ctrl-C (and SIGTERM under launch.actorq) KeyboardInterrupt, after every node
    stopped and the learner wrote a final checkpoint.

    `agent_factory(observation_spec, action_spec) -> DistributedAgent` builds the agent in each
    node's process, so it must pickle by value (see `agents.actorq.AgentFactory`).
    """
    validate(config)
    if workdir:
        workdirs.check_path(workdir)
    factory = agent_factory
    specs = _env_specs(config)
    agent = factory(*specs)  # builds the agent here first: bad overrides fail before any node starts
    backend = _make_backend(config)  # joining a cluster fails here, before the workdir is touched
    if workdir:
        try:
            prepare_workdir(workdir, config, resume, overwrite)
        except BaseException:
            backend.shutdown()
            raise
    logger = MetricsLogger(workdir) if workdir else None
    progress = _Progress(config, logger, printer)
    meter = energy.EnergyMeter()
    start_time = time.time()
    program = build_program(config, agent, factory, specs, workdir, resume, start_time)
    pids: dict[str, int] = {}

    def on_start(handles):
        nonlocal start_time
        resumed = handles["learner"].call("stats")["resumed_counts"]
        if resumed:
            handles["counter"].call("increment", **{key: int(resumed.get(key, 0)) for key in COUNTS})
        start_time = time.time()
        handles["evaluator"].call("set_start_time", start_time)
        meter.start()

    def on_stop(handles):
        record = handles["evaluator"].call("evaluate_now")
        progress.absorb(handles["evaluator"].call("records", len(progress.records)))
        handles["learner"].call("checkpoint")
        for name in program.names():
            pids[name] = handles[name].call("pid")
        return record

    try:
        outcome = supervise(backend, program, progress.should_stop, on_start=on_start, on_stop=on_stop)
    finally:
        if logger is not None:
            logger.close()
    if outcome.reason == "interrupted":
        raise KeyboardInterrupt
    if outcome.error is not None:
        if outcome.input_error:
            raise QrlInputError(outcome.error)
        raise NodeFailure(f"{outcome.error}; {_checkpoint_note(workdir)}")
    results = _results(config, outcome, progress, pids, meter)
    if workdir:
        io.atomic_write_json(os.path.join(workdir, RESULTS_FILE), results)
        from qrl.distributed import report

        report.plot_breakdown(
            report.summary_table([results]), f"{config.agent} on {config.env}: where the time went",
            os.path.join(workdir, "breakdown.png"),
        )
    return results


def _checkpoint_note(workdir: Optional[str]) -> str:
    """Where the run can be resumed from: its latest learner checkpoint, or that there is none."""
    directory = os.path.join(os.path.abspath(workdir), CHECKPOINT_DIR) if workdir else None
    step = Checkpointer(directory).latest_step() if directory and os.path.isdir(directory) else None
    if step is None:
        return "no checkpoint was written" if workdir else "no workdir, so no checkpoint"
    return f"last checkpoint at step {step} in {directory}"


def _make_backend(config: ActorQConfig):
    if config.launcher == "inprocess":
        return InProcessBackend()
    from qrl.distributed.ray_launcher import RayBackend

    requested = config.learner_cpus + config.evaluator_cpus + config.num_actors * config.actor_cpus
    backend = RayBackend(config.ray_address, num_cpus=requested, bind_address=config.ray_bind_address)
    available = backend.cluster_resources()  # a node asking for what no node has would wait forever.
    missing = [f"{name} {amount:g}" for name, amount in {**({"GPU": 1.0} if config.learner_device == "gpu" else {}),
                                                         **dict(config.actor_resources)}.items()
               if available.get(name, 0.0) < amount]
    if missing:
        backend.shutdown()
        raise QrlInputError(f"the Ray cluster at {config.ray_address or 'this machine'} has no node offering "
                            f"{', '.join(missing)} (--learner_device / --actor_resources)")
    return backend


def _sum_phases(stats_list: list[dict], phases) -> dict:
    totals = {phase: float(sum(stats["seconds"].get(phase, 0.0) for stats in stats_list)) for phase in phases}
    totals["total"] = float(sum(stats["seconds"]["total"] for stats in stats_list))
    return totals


def _results(config: ActorQConfig, outcome, progress: _Progress, pids: dict, meter) -> dict:
    stats = outcome.stats
    actor_stats = [stats[name] for name in sorted(stats) if name.startswith("actor_")]
    learner, replay = stats.get("learner", {}), stats.get("replay", {})
    counts = progress.counts = {**progress.counts, **(stats.get("counter", {}).get("counts", {}))}
    cpu_by_process: dict[int, float] = {}
    cpu_by_node = {}
    for name, node_stats in stats.items():
        if "process_cpu_seconds" in node_stats and name in pids:
            cpu_by_process[pids[name]] = node_stats["process_cpu_seconds"]
            cpu_by_node[name] = node_stats["process_cpu_seconds"]
    cpu_total = float(sum(cpu_by_process.values()))
    records, target = progress.records, progress.target_record
    final = records[-1] if records else None
    fp32_bytes = learner.get("fp32_bytes", 0)
    publish_bytes = learner.get("bytes_per_publish", 0)
    return {
        "config": config.to_dict(),
        "agent": config.agent,
        "env": config.env,
        "seed": config.seed,
        "actor_precision": config.actor_precision,
        "actor_int8_scheme": config.actor_int8_scheme,
        "actor_runtime": config.actor_runtime,
        "comm_precision": config.resolved_comm_precision,
        "launcher": config.launcher,
        "num_actors": config.num_actors,
        "stop_reason": outcome.reason,
        "wall_seconds": outcome.seconds,
        "counts": {**{key: int(counts.get(key, 0)) for key in COUNTS},
                   "pulls": int(sum(s["loads"] for s in actor_stats))},
        "target_return": config.target_return,
        "time_to_target_seconds": target["wall_seconds"] if target else None,
        "actor_steps_to_target": target["actor_steps"] if target else None,
        "learner_steps_to_target": target["learner_steps"] if target else None,
        "final_return": {"fp32": final["return_fp32"] if final else None, "actor": final["return_actor"] if final else None},
        "evaluations": records,
        "throughput": {
            "actor_steps_per_second": float(sum(s["steps_per_second"] for s in actor_stats)),
            "per_actor_steps_per_second": [s["steps_per_second"] for s in actor_stats],
            "learner_steps_per_second": learner.get("steps_per_second", 0.0),
        },
        "breakdown": {
            "actor": _sum_phases(actor_stats, ACTOR_PHASES) if actor_stats else {},
            "actor_compile_seconds": float(sum(s["seconds"].get("compile", 0.0) for s in actor_stats)),
            "learner": _sum_phases([learner], LEARNER_PHASES) if learner else {},
            "replay": {"insert": replay.get("insert_seconds", 0.0), "sample": replay.get("sample_seconds", 0.0),
                       "insert_wait": replay.get("insert_wait_seconds", 0.0),
                       "sample_wait": replay.get("sample_wait_seconds", 0.0)},
            "replay_items": {key: int(replay.get(key, 0)) for key in ("inserted", "sampled", "size", "removed_sampled_out",
                                                                      "removed_evicted") if key in replay},
            "pulls": int(sum(s["pulls"] for s in actor_stats)),
            "loads": int(sum(s["loads"] for s in actor_stats)),
        },
        "publish": {
            "count": learner.get("publishes", 0),
            "bytes_per_publish": publish_bytes,
            "fp32_bytes": fp32_bytes,
            "ratio_to_fp32": publish_bytes / fp32_bytes if fp32_bytes else None,
            "encode_seconds_mean": learner.get("encode_seconds_mean", 0.0),
        },
        "cpu_seconds": {"total": cpu_total, "by_node": cpu_by_node, "processes": len(cpu_by_process)},
        "energy": meter.stop(cpu_total),
        "restarts": dict(outcome.restarts),
        "resumed_from": learner.get("resumed_from"),  # the learner checkpoint step a resumed run started from
        "learner_metrics": learner.get("metrics", {}),
        "actors": actor_stats,
    }
