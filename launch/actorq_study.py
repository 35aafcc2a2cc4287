"""The ActorQ study in one command: distributed training per environment × seed × actor precision,
then speedup, throughput, runtime-breakdown and carbon tables against fp32 actors.

    python -m launch.actorq_study --agent=d4pg --envs=dmc:cartpole-balance,dmc:walker-stand \\
        --precisions=fp32,int8 --seeds=0,1 --workdir=runs/actorq_study --max_seconds=600 \\
        --run_flag=--num_actors=2

Each cell is one `python -m launch.actorq` run into `<workdir>/cells/<env>/<precision>/seed<k>/`
(its log beside it as `seed<k>.log`); weights travel at the actors' precision (fp16, bf16, int8)
or fp32. `--launcher` says where a cell's learner and actors run: `local`, threads in the cell's
own process; `ray`, a Ray process per node, on a local Ray the cell starts (127.0.0.1) or on the
cluster at `--ray_address` — an ActorQ cell is itself a distributed job, so on a cluster its nodes,
not the cells, are what Ray spreads. Cells run one at a time by default, since each times itself,
in the order env → seed → precision so that load drift on the machine touches every precision
alike; `--parallel=N` runs N at once (`launch.launcher`'s local processes), for a grid whose speed
is not the point. A cell whose results.json exists is reused; one that fails is retried once, then
reported, and the study goes on. The study then writes report.md, summary.json and plots/ into
the workdir (`qrl.distributed.report`), and exits 1 if a cell failed; Ctrl-C stops it (exit 130).
"""

import dataclasses
import math
import os
import subprocess
import sys
import typing
from typing import Callable, Optional, Sequence

from absl import flags

from launch import common, launcher, studies
from qrl import io, workdirs
from qrl.errors import QrlInputError

ACTORQ_MODULE = "launch.actorq"
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS_FILE = "results.json"
QUANTIZED_COMM = ("fp16", "bf16", "int8")
STUDY_FLAGS = ("agent", "env", "actor_precision", "comm_precision", "seed", "workdir", "target_return",
               "max_seconds", "max_learner_steps", "max_actor_steps", "launcher", "ray_address", "ray_bind_address")
# launch.actorq flags a --run_flag may give that are not ActorQConfig fields.
RUN_ONLY_FLAGS = ("set", "resume", "overwrite")

# The study's --launcher values (`launch.launcher.LAUNCHERS`) and the --launcher each cell's
# launch.actorq run gets.
NODE_LAUNCHERS = {"local": "inprocess", "ray": "ray"}

Runner = Callable[[Sequence[str], str], int]

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "Study directory (required).")
flags.DEFINE_string("agent", "d4pg", "Algorithm run distributed (d4pg, dqn).")
flags.DEFINE_string("envs", "dmc:cartpole-balance", "Comma-separated environment ids.")
flags.DEFINE_string("precisions", "fp32,int8", "Comma-separated actor precisions; must include fp32 (the baseline).")
flags.DEFINE_string("seeds", "0", "Comma-separated seeds.")
flags.DEFINE_float("target_return", None, "Return that counts as reached (default: launch.actorq's per run).")
flags.DEFINE_float("max_seconds", None, "Wall-time budget per cell.")
flags.DEFINE_integer("max_learner_steps", None, "Learner-step budget per cell.")
flags.DEFINE_integer("max_actor_steps", None, "Actor-step budget per cell.")
flags.DEFINE_multi_string("run_flag", [], "Extra launch.actorq flag for every cell (repeatable), e.g. --run_flag=--num_actors=2.")
launcher.define_flags({
    "launcher": "Where each cell's learner and actors run: local (threads in the cell's process) or ray (a Ray "
                "process per node, on a local Ray on 127.0.0.1 or the cluster at --ray_address).",
    "parallel": "Cells run at once, each in its own process (1: one after another, as speedups are measured: each "
                "cell times itself).",
    "ray_address": "--launcher=ray: host:port of a running Ray cluster's GCS (default: each cell starts a local Ray).",
})
flags.DEFINE_string("ray_bind_address", None,
                    "Each cell's --ray_bind_address (default launch.actorq's, 127.0.0.1: this machine only).")


@dataclasses.dataclass(frozen=True)
class StudyOptions:
    """A checked study plan (build it with `make_options`)."""

    workdir: str
    agent: str
    envs: tuple[str, ...]
    precisions: tuple[str, ...]
    seeds: tuple[int, ...]
    target_return: Optional[float] = None
    max_seconds: Optional[float] = None
    max_learner_steps: Optional[int] = None
    max_actor_steps: Optional[int] = None
    run_flags: tuple[str, ...] = ()
    launcher: str = "local"
    ray_address: Optional[str] = None
    ray_bind_address: Optional[str] = None
    parallel: int = 1


@dataclasses.dataclass(frozen=True)
class Cell:
    """One ActorQ run of the study."""

    env: str
    precision: str
    seed: int

    @property
    def comm_precision(self) -> str:
        return self.precision if self.precision in QUANTIZED_COMM else "fp32"

    @property
    def relative_dir(self) -> str:
        return os.path.join("cells", studies.env_slug(self.env), self.precision, f"seed{self.seed}")

    @property
    def label(self) -> str:
        return f"{self.env} {self.precision} seed {self.seed}"


def _check_run_flag(item: str) -> str:
    if not item.startswith("--") or len(item) < 3:
        raise QrlInputError(f"--run_flag takes a launch.actorq flag like --num_actors=2, got {item!r}")
    name = item[2:].partition("=")[0]
    for reserved in STUDY_FLAGS:
        if name in (reserved, f"no{reserved}"):
            raise QrlInputError(f"--run_flag={item} is set by the study itself; use the study's own flag")
    return item


def make_options(
    workdir: Optional[str], agent: str, envs: str, precisions: str, seeds: str,
    target_return: Optional[float] = None, max_seconds: Optional[float] = None,
    max_learner_steps: Optional[int] = None, max_actor_steps: Optional[int] = None,
    run_flags: Sequence[str] = (), launcher: str = "local", ray_address: Optional[str] = None,
    ray_bind_address: Optional[str] = None, parallel: int = 1,
) -> StudyOptions:
    """Parses and checks the study's flags (comma-separated lists); bad input -> QrlInputError.
    `check_cells` then checks what each cell will run (environments exist, every setting in range)."""
    from agents.actorq import check_agent
    from qrl.distributed.weights import ACTOR_PRECISIONS
    from qrl.envs.ids import split_env_id

    env_ids = studies.parse_list(envs, "envs")
    for env_id in env_ids:
        split_env_id(env_id)
    precision_list = studies.parse_list(precisions, "precisions")
    for precision in precision_list:
        if precision not in ACTOR_PRECISIONS:
            raise QrlInputError(f"unknown actor precision {precision!r} in --precisions; choose from "
                                f"{', '.join(ACTOR_PRECISIONS)}")
    if "fp32" not in precision_list:
        raise QrlInputError("--precisions must include fp32: speedups are measured against fp32 actors")
    seed_list = studies.parse_ints(seeds, "seeds")
    if not seed_list:
        raise QrlInputError("--seeds is empty")
    if target_return is not None and not math.isfinite(target_return):
        raise QrlInputError(f"--target_return must be a finite number, got {target_return}")
    if max_seconds is not None and not (math.isfinite(max_seconds) and max_seconds > 0):
        raise QrlInputError(f"--max_seconds must be > 0 and finite, got {max_seconds}")
    for name, value in (("max_learner_steps", max_learner_steps), ("max_actor_steps", max_actor_steps)):
        if value is not None and value < 1:
            raise QrlInputError(f"--{name} must be >= 1, got {value}")
    if (target_return, max_seconds, max_learner_steps, max_actor_steps) == (None, None, None, None):
        raise QrlInputError("give a stop condition for every cell: --target_return, --max_seconds, "
                            "--max_learner_steps or --max_actor_steps")
    if launcher not in NODE_LAUNCHERS:
        raise QrlInputError(f"--launcher must be one of {', '.join(NODE_LAUNCHERS)}, got {launcher!r}")
    if ray_address and launcher != "ray":
        raise QrlInputError("--ray_address needs --launcher=ray")
    if parallel < 1:
        raise QrlInputError(f"--parallel must be >= 1, got {parallel}")
    return StudyOptions(
        common.require_workdir(workdir), check_agent(agent), tuple(env_ids), tuple(precision_list), tuple(seed_list),
        target_return, max_seconds, max_learner_steps, max_actor_steps,
        tuple(_check_run_flag(item) for item in run_flags), launcher, ray_address, ray_bind_address, parallel,
    )


def cell_config(cell: Cell, options: StudyOptions):
    """The `ActorQConfig` launch.actorq will build for `cell` (its --run_flag values included)."""
    from qrl.distributed.run import ActorQConfig

    fields = {field.name: field for field in dataclasses.fields(ActorQConfig)}
    values: dict = {}
    overrides: list[str] = []
    for item in options.run_flags:
        name, separator, text = item[2:].partition("=")
        if name == "set":
            overrides.append(text)
        elif name in RUN_ONLY_FLAGS or name.startswith("no") and name[2:] in RUN_ONLY_FLAGS:
            raise QrlInputError(f"--run_flag={item}: the study decides whether a cell resumes or overwrites")
        elif name in fields and name not in ("overrides", "env_options", "samples_per_insert_tolerance",
                                             "priority_exponent", "importance_exponent"):
            values[name] = _flag_value(item, text if separator else "true", fields[name])
        elif name.startswith("no") and name[2:] in fields and isinstance(fields[name[2:]].default, bool) and not separator:
            values[name[2:]] = False
        else:
            raise QrlInputError(f"--run_flag={item}: launch.actorq has no flag --{name}")
    stops = {name: getattr(options, name) for name in ("target_return", "max_seconds", "max_learner_steps",
                                                        "max_actor_steps")}
    bind = {"ray_bind_address": options.ray_bind_address} if options.ray_bind_address else {}
    given = {
        **values, "agent": options.agent, "env": cell.env, "seed": cell.seed, "actor_precision": cell.precision,
        "comm_precision": cell.comm_precision, "launcher": NODE_LAUNCHERS[options.launcher],
        "ray_address": options.ray_address,
        **stops, **bind,
    }
    config = ActorQConfig(**given, overrides=common.parse_overrides(overrides))
    if config.preset is None:
        return config
    from agents.actorq import with_preset

    # As launch.actorq applies it: the preset fills what the cell's flags leave unset.
    explicit = {name for name, value in given.items() if value is not None or name in values}
    return with_preset(dataclasses.replace(config, preset=None), values["preset"], explicit)


def _flag_value(item: str, text: str, field: dataclasses.Field):
    """`text` as the type of the ActorQConfig `field` (`Optional[X]` as X)."""
    kind = next((arg for arg in typing.get_args(field.type) if arg is not type(None)), field.type)
    try:
        if kind is bool:
            if text.lower() not in ("true", "false", "1", "0"):
                raise ValueError(text)
            return text.lower() in ("true", "1")
        return kind(text) if kind in (int, float) else text
    except ValueError:
        raise QrlInputError(f"--run_flag={item}: {text!r} is not a valid {kind.__name__}") from None


def check_cells(options: StudyOptions) -> None:
    """Checks, before anything is written or started, what every cell will run: each cell's
    config passes launch.actorq's checks, each environment exists (built once and closed), the
    agent takes the --set overrides, the workdir can be made and a --ray_address answers."""
    from agents.actorq import AgentFactory
    from qrl import envs
    from qrl.distributed.launching import check_reachable
    from qrl import workdirs
    from qrl.distributed.run import validate

    workdirs.check_path(options.workdir)
    configs = [cell_config(cell, options) for cell in plan_cells(options)]
    for config in configs:
        validate(config)
    for env_id in options.envs:
        envs.make(env_id).close()
    AgentFactory(options.agent, options.envs[0], dict(configs[0].overrides)).config()
    if options.ray_address not in (None, "auto"):
        check_reachable(options.ray_address)


def plan_cells(options: StudyOptions) -> list[Cell]:
    """Every cell, env → seed → precision (a seed's precisions run back to back)."""
    return [Cell(env, precision, seed) for env in options.envs for seed in options.seeds for precision in options.precisions]


def cell_argv(cell: Cell, options: StudyOptions) -> list[str]:
    """`python -m launch.actorq ...` for one cell."""
    argv = [sys.executable, "-m", ACTORQ_MODULE, f"--agent={options.agent}", f"--env={cell.env}",
            f"--actor_precision={cell.precision}", f"--comm_precision={cell.comm_precision}", f"--seed={cell.seed}",
            f"--workdir={os.path.join(options.workdir, cell.relative_dir)}",
            f"--launcher={NODE_LAUNCHERS[options.launcher]}"]
    for name in ("target_return", "max_seconds", "max_learner_steps", "max_actor_steps", "ray_address",
                 "ray_bind_address"):
        value = getattr(options, name)
        if value is not None:
            argv.append(f"--{name}={value}")
    return argv + list(options.run_flags)


def run_subprocess(argv: Sequence[str], log_path: str) -> int:
    """Runs `argv` from the repository root with its output appended to `log_path`; the exit status."""
    env = {**os.environ, "PYTHONPATH": REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with open(log_path, "a", encoding="utf-8") as log_file:
        log_file.write(f"$ {' '.join(argv)}\n")
        log_file.flush()
        return subprocess.run(list(argv), cwd=REPO_ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT).returncode


def _last_line(log_path: str) -> str:
    try:
        with open(log_path, encoding="utf-8", errors="replace") as log_file:
            lines = [line.strip() for line in log_file if line.strip()]
    except OSError:
        return "(no log)"
    return lines[-1] if lines else "(no output)"


def run_cell(cell: Cell, options: StudyOptions, runner: Runner = run_subprocess) -> str:
    """Runs one cell unless its results.json exists: "already done" or "ran"; a failed run raises
    `launcher.CellFailure` with the last line of its log (the whole log is beside the cell)."""
    cell_dir = os.path.join(options.workdir, cell.relative_dir)
    if os.path.exists(os.path.join(cell_dir, RESULTS_FILE)):
        return "already done"
    workdirs.remove_outputs(cell_dir)  # an unfinished run: start it again.
    os.makedirs(os.path.dirname(cell_dir), exist_ok=True)
    status = runner(cell_argv(cell, options), cell_dir + ".log")
    if status == 0 and os.path.exists(os.path.join(cell_dir, RESULTS_FILE)):
        return "ran"
    raise launcher.CellFailure(_last_line(cell_dir + ".log"))


def run_study(options: StudyOptions, runner: Runner = run_subprocess, log: Callable[[str], None] = print) -> dict:
    """Runs the cells not done yet (one at a time, or `options.parallel` at once), retrying a
    failed cell once, then writes the report over every finished cell.

    Returns {"paths": write_report's paths or None when no cell finished, "failed": [labels]}.
    """
    from qrl.distributed.report import write_report

    cells = plan_cells(options)
    os.makedirs(options.workdir, exist_ok=True)
    io.atomic_write_json(os.path.join(options.workdir, "study.json"),
                         {**dataclasses.asdict(options), "cells": [dataclasses.asdict(cell) for cell in cells]})
    tasks = [launcher.CellTask(cell.label, run_cell, (cell, options, runner)) for cell in cells]
    by_label = {cell.label: cell for cell in cells}
    failures = launcher.run_tasks(tasks, launcher.LaunchOptions(parallel=options.parallel), options.workdir, log=log)
    failed = [f"{task.label} ({reason}; log {os.path.join(options.workdir, by_label[task.label].relative_dir)}.log)"
              for task, reason in failures]
    results = [io.read_json(path) for path in
               (os.path.join(options.workdir, cell.relative_dir, RESULTS_FILE) for cell in cells) if os.path.exists(path)]
    paths = write_report(results, options.workdir, options.target_return, missing=failed) if results else None
    return {"paths": paths, "failed": failed}


def run() -> None:
    options = make_options(
        FLAGS.workdir, FLAGS.agent, FLAGS.envs, FLAGS.precisions, FLAGS.seeds, FLAGS.target_return,
        FLAGS.max_seconds, FLAGS.max_learner_steps, FLAGS.max_actor_steps, FLAGS.run_flag, FLAGS.launcher,
        FLAGS.ray_address, FLAGS.ray_bind_address, FLAGS.parallel,
    )
    check_cells(options)
    studies.run_and_report(lambda: run_study(options), "ActorQ study")


if __name__ == "__main__":
    common.run_entry_point(run)
