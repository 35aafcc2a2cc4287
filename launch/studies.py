"""The QuaRL study: algorithms × environments × seeds, trained once, quantized many ways.

Each cell of the grid is one training run plus its evaluation, in its own directory under
`<study>/cells/<agent>/<env>/seed<k>/<fp32|qat<N>>/`:

- `fp32` cells train in fp32 (`launch.train`) and run the post-training quantization sweep
  over the study's precisions (`launch.ptq`, static activation scales).
- `qat<N>` cells train with N-bit quantization-aware training after a quantization delay (a
  fraction of the run's updates), then evaluate the policy exported to static `int<N>` with
  the moving-average ranges it trained with — the numerics it trained with
  (`launch.ptq --precisions=int<N> --ranges=trained`).

Cells run as subprocesses (each picks its own XLA threading and frees its memory) and are
skipped when their outputs exist, so an interrupted study resumes where it stopped; a training
run that did not finish starts again. `qrl.quant.study_report` then writes the study's
`results.json`, `report.md` and plots.
"""

import dataclasses
import os
import signal
import subprocess
import sys
from typing import Callable, Mapping, Optional, Sequence

from launch import common, launcher, runs
from qrl import envs, io, workdirs
from qrl.config import QAT_MAX_BITS, QAT_MIN_BITS, total_updates
from qrl.errors import QrlInputError
from qrl.quant import parse_precisions, serving_precision
from qrl.quant import study_report

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PTQ_DIR = "ptq"
QAT_EVAL_DIR = "qat_eval"
TRAIN_DIR = "train"

# Training budgets (environment steps) per agent and environment when --steps is not given:
# small enough to run on a laptop CPU, large enough to learn the task at fp32 with the
# agents' presets. Long runs are for users: pass --steps.
DEFAULT_STEPS: dict[tuple[str, str], int] = {
    ("dqn", "gym:CartPole-v1"): 50_000,
    ("dqn", "gym:MountainCar-v0"): 120_000,
    ("dqn", "gym:Acrobot-v1"): 100_000,
    ("ppo", "gym:CartPole-v1"): 100_000,
    ("a2c", "gym:CartPole-v1"): 200_000,
    ("ppo", "gym:Pendulum-v1"): 300_000,
    ("sac", "gym:Pendulum-v1"): 15_000,
    ("td3", "gym:Pendulum-v1"): 20_000,  # its zoo preset acts randomly for the first 10k steps.
    ("ddpg", "gym:Pendulum-v1"): 20_000,  # likewise.
    ("d4pg", "gym:Pendulum-v1"): 20_000,
    ("ppo", "gymnax:Breakout-MinAtar"): 1_000_000,
    # InvertedPendulum-v5: TD3 and DDPG first hold the pole (1000) between 15k and 20k steps;
    # SAC and D4PG by 15k.
    ("td3", "gym:InvertedPendulum-v5"): 30_000,
    ("ddpg", "gym:InvertedPendulum-v5"): 30_000,
    ("sac", "gym:InvertedPendulum-v5"): 20_000,
    ("d4pg", "gym:InvertedPendulum-v5"): 20_000,
}
FALLBACK_STEPS = 100_000
# Both families side by side: QuaRL's (weight-only quarl<N>, its fp16 and dynamic int8) and qrl's
# weights + activations scheme at every width, with 8-bit edge layers at the narrow ones.
STUDY_PRECISIONS = ",".join([
    "fp32", "fp16", "bf16", "quarl_fp16", *(f"quarl{bits}" for bits in range(8, 1, -1)), "quarl_dyn8",
    *(f"int{bits}" for bits in range(8, 1, -1)), "int4-e8", "int3-e8", "int2-e8",
])


@dataclasses.dataclass(frozen=True)
class Cell:
    """One training run of the study and how it is evaluated."""

    agent: str
    env_id: str
    seed: int
    steps: int
    qat_bits: int = 0  # 0: fp32 training, evaluated by the PTQ sweep.
    quant_delay: int = 0

    @property
    def variant(self) -> str:
        return f"qat{self.qat_bits}" if self.qat_bits else "fp32"

    @property
    def relative_dir(self) -> str:
        return os.path.join("cells", self.agent, env_slug(self.env_id), f"seed{self.seed}", self.variant)

    @property
    def label(self) -> str:
        return f"{self.agent} {self.env_id} seed {self.seed} {self.variant}"


def env_slug(env_id: str) -> str:
    """A directory name for an environment id: `gym:CartPole-v1` -> `gym_CartPole-v1`."""
    return env_id.replace(":", "_").replace("/", "_")


def parse_list(text: str, name: str) -> list[str]:
    items = [item.strip() for item in str(text).split(",") if item.strip()]
    if not items:
        raise QrlInputError(f"--{name} is empty")
    return list(dict.fromkeys(items))


def parse_ints(text: str, name: str, minimum: int = 0) -> list[int]:
    values = []
    for item in parse_list(text, name) if str(text).strip() else []:
        try:
            value = int(item)
        except ValueError:
            raise QrlInputError(f"--{name} takes comma-separated integers, got {item!r}") from None
        if value < minimum:
            raise QrlInputError(f"--{name} values must be >= {minimum}, got {value}")
        values.append(value)
    return values


def parse_qat_bits(text: str) -> list[int]:
    """`"8,4"` -> [8, 4]; empty -> no QAT cells; bits outside 2..8 are input errors."""
    bits = parse_ints(text, "qat_bits") if str(text).strip() else []
    for value in bits:
        if not QAT_MIN_BITS <= value <= QAT_MAX_BITS:
            raise QrlInputError(f"--qat_bits values must be in {QAT_MIN_BITS}..{QAT_MAX_BITS}, got {value}")
    return bits


def split_agent_overrides(items: Sequence[str], agent_names: Sequence[str]) -> dict[str, dict[str, str]]:
    """`["ppo.learning_rate=1e-3"]` -> `{"ppo": {"learning_rate": "1e-3"}}`."""
    overrides: dict[str, dict[str, str]] = {name: {} for name in agent_names}
    for item in items:
        key, separator, value = item.partition("=")
        agent, dot, field = key.strip().partition(".")
        if not separator or not dot or not field:
            raise QrlInputError(f"--set expects agent.key=value (e.g. ppo.learning_rate=1e-3), got {item!r}")
        if agent not in overrides:
            raise QrlInputError(f"--set {item!r} names agent {agent!r}, which is not in --agents")
        overrides[agent][field] = value.strip()
    return overrides


def plan_cells(
    agent_names: Sequence[str],
    env_ids: Sequence[str],
    seeds: Sequence[int],
    qat_bits: Sequence[int],
    steps: Optional[int],
    quant_delay_fraction: float,
    overrides: Mapping[str, Mapping[str, str]],
    skip_incompatible: bool = False,
    log: Callable[[str], None] = print,
    num_envs: Optional[int] = None,
) -> list[Cell]:
    """The study's cells; every agent × environment pair is checked before anything runs.

    A pair the agent cannot run (DQN on continuous actions) is an input error, or skipped with
    `skip_incompatible`. Agent configs (presets + `overrides`, with each QAT variant's bits and
    delay, on `num_envs` environments when given) are built and checked here too, as
    `launch.train` checks them.
    """
    from agents import get_agent

    common.check_ranges([("--quant_delay_fraction", quant_delay_fraction, common.FRACTION_BELOW_1),
                         ("--steps", steps, common.AT_LEAST_1)])
    cells = []
    for agent_name in agent_names:
        agent = get_agent(agent_name)
        for env_id in env_ids:
            env = envs.make(env_id, seed=0)
            try:
                agent.check_env(env_id, env.action_spec())
            except QrlInputError as error:
                if not skip_incompatible:
                    raise QrlInputError(f"unsupported algorithm/environment pair {agent_name} × {env_id}: {error}") from None
                log(f"skipping {agent_name} × {env_id}: {error}")
                continue
            finally:
                env.close()
            config = agent.config_for(env_id, overrides.get(agent_name, {}))
            budget = steps if steps is not None else DEFAULT_STEPS.get((agent_name, env_id), FALLBACK_STEPS)
            quant_delay = int(quant_delay_fraction * total_updates(config, budget))  # counted in updates.
            variants = [config] + [config.override({"qat_bits": bits, "quant_delay": quant_delay}) for bits in qat_bits]
            for variant in variants:
                runs.check_run_config(variant, budget, num_envs)
            for seed in seeds:
                cells.append(Cell(agent_name, env_id, seed, budget))
                for bits in qat_bits:
                    cells.append(Cell(agent_name, env_id, seed, budget, bits, quant_delay))
    if not cells:
        raise QrlInputError("the study has no cells: every algorithm/environment pair was skipped")
    return cells


def _run_module(module: str, args: Sequence[str], log_path: str) -> None:
    """Runs `python -m module args` with output appended to `log_path`; failures are input errors
    quoting the subprocess's last line."""
    env = {**os.environ, "PYTHONPATH": REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with open(log_path, "a", encoding="utf-8") as log_file:
        log_file.write(f"$ python -m {module} {' '.join(args)}\n")
        log_file.flush()
        completed = subprocess.run(
            [sys.executable, "-m", module, *args], cwd=REPO_ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT,
        )
    if completed.returncode != 0:
        with open(log_path, encoding="utf-8") as log_file:
            lines = [line.strip() for line in log_file if line.strip()]
        last = lines[-1] if lines else "(no output)"
        raise QrlInputError(f"{module} failed (exit {completed.returncode}, log {log_path}): {last}")


def run_cell(
    cell: Cell,
    study_dir: str,
    precisions: str,
    episodes: int,
    overrides: Mapping[str, str],
    train_args: Sequence[str] = (),
    eval_args: Sequence[str] = (),
) -> dict:
    """Trains (unless finished before) and evaluates (unless done before) one cell; returns what
    it did: `{"trained": bool, "evaluated": bool}`."""
    cell_dir = os.path.join(study_dir, cell.relative_dir)
    train_dir = os.path.join(cell_dir, TRAIN_DIR)
    log_path = os.path.join(cell_dir, "log.txt")
    os.makedirs(cell_dir, exist_ok=True)
    done = {"trained": False, "evaluated": False}
    eval_dir = _eval_dir(cell, cell_dir)
    evaluated = os.path.exists(os.path.join(eval_dir, runs.RESULTS_FILE))
    # Train again a run that did not finish, and a finished one whose checkpoints are gone (a
    # study resumed from its committed results) while its evaluation is still to do.
    if not runs.is_finished(train_dir) or (not evaluated and not has_checkpoint(train_dir)):
        workdirs.remove_outputs(train_dir)
        args = [f"--agent={cell.agent}", f"--env={cell.env_id}", f"--steps={cell.steps}", f"--seed={cell.seed}",
                f"--workdir={train_dir}", f"--eval_episodes={episodes}", "--progress=false", *train_args]
        args += [f"--set={key}={value}" for key, value in overrides.items()]
        if cell.qat_bits:
            args += [f"--qat_bits={cell.qat_bits}", f"--quant_delay={cell.quant_delay}"]
        _run_module("launch.train", args, log_path)
        done["trained"] = True
    if not evaluated:
        if cell.qat_bits:
            args = [f"--precisions={serving_precision(cell.qat_bits).name}", "--ranges=trained"]
        else:
            args = [f"--precisions={precisions}", "--activations=static"]
        args += [f"--workdir={train_dir}", f"--episodes={episodes}", f"--out={eval_dir}", *eval_args]
        _run_module("launch.ptq", args, log_path)
        done["evaluated"] = True
    return done


def has_checkpoint(train_dir: str) -> bool:
    """Whether a training run's directory still holds a checkpoint (studies commit only the cells'
    JSON and CSV outputs, see .gitignore)."""
    checkpoints = os.path.join(train_dir, runs.CHECKPOINT_DIR)
    return os.path.isdir(checkpoints) and any(name.isdigit() for name in os.listdir(checkpoints))


def run_study(
    study_dir: str,
    agent_names: Sequence[str],
    env_ids: Sequence[str],
    seeds: Sequence[int],
    precisions: str,
    qat_bits: Sequence[int],
    episodes: int = 10,
    steps: Optional[int] = None,
    quant_delay_fraction: float = 0.5,
    overrides: Optional[Mapping[str, Mapping[str, str]]] = None,
    skip_incompatible: bool = False,
    train_args: Sequence[str] = (),
    eval_args: Sequence[str] = (),
    log: Callable[[str], None] = print,
    num_envs: Optional[int] = None,
    launch_options: launcher.LaunchOptions = launcher.LaunchOptions(),
) -> dict:
    """Runs every cell that is not done yet where `launch_options` say (`launch.launcher`), then
    writes the study's results and report over the finished cells.

    `num_envs` (None: each agent's) sizes every training run; `train_args` / `eval_args` are
    extra flags for `launch.train` / `launch.ptq`. Returns `{"paths": what
    `study_report.write_study_outputs` wrote (None when no cell finished), "failed": [cells with
    their one-line reason], "pending": [cells without results]}`; in this process a failed cell
    (its subprocess's last line) stops the study, as bad input does.
    """
    parse_precisions(precisions, "static")
    common.check_ranges([("--episodes", episodes, common.AT_LEAST_1)])
    overrides = overrides or {}
    cells = plan_cells(agent_names, env_ids, seeds, qat_bits, steps, quant_delay_fraction, overrides,
                       skip_incompatible, log, num_envs)
    if num_envs is not None:
        train_args = [f"--num_envs={num_envs}", *train_args]
    os.makedirs(study_dir, exist_ok=True)
    plan = {
        "agents": list(agent_names), "envs": list(env_ids), "seeds": list(seeds), "precisions": precisions,
        "qat_bits": list(qat_bits), "episodes": episodes, "quant_delay_fraction": quant_delay_fraction,
        "cells": [dataclasses.asdict(cell) for cell in cells],
    }
    io.atomic_write_json(os.path.join(study_dir, "study.json"), plan)
    tasks = [launcher.CellTask(cell.label, run_cell_task, (cell, study_dir, precisions, episodes,
                                                          dict(overrides.get(cell.agent, {})), tuple(train_args),
                                                          tuple(eval_args)))
             for cell in cells]
    failed = [f"{task.label} ({reason})" for task, reason in launcher.run_tasks(tasks, launch_options, study_dir, log)]
    finished = [cell for cell in cells if is_done(cell, study_dir)]
    pending = [cell.label for cell in cells if cell not in finished]
    if not finished:
        return {"paths": None, "failed": failed, "pending": pending}
    records = [{**dataclasses.asdict(cell), "dir": os.path.join(study_dir, cell.relative_dir)} for cell in finished]
    paths = study_report.write_study_outputs(study_dir, records, write_weight_plots(study_dir, finished, precisions))
    return {"paths": paths, "failed": failed, "pending": pending}


def run_cell_task(cell: Cell, study_dir: str, precisions: str, episodes: int, overrides: Mapping[str, str],
                  train_args: Sequence[str], eval_args: Sequence[str]) -> str:
    """One cell as a launcher task (`launch.launcher`): what it did, or "already done"."""
    done = run_cell(cell, study_dir, precisions, episodes, overrides, train_args, eval_args)
    return ", ".join(name for name, happened in done.items() if happened) or "already done"


def is_done(cell: Cell, study_dir: str) -> bool:
    """Whether a cell has its training results and its evaluation."""
    cell_dir = os.path.join(study_dir, cell.relative_dir)
    return (os.path.exists(os.path.join(cell_dir, TRAIN_DIR, runs.RESULTS_FILE))
            and os.path.exists(os.path.join(_eval_dir(cell, cell_dir), runs.RESULTS_FILE)))


def _eval_dir(cell: Cell, cell_dir: str) -> str:
    """Where a cell's evaluation goes: the QAT export's or the PTQ sweep's directory."""
    return os.path.join(cell_dir, QAT_EVAL_DIR if cell.qat_bits else PTQ_DIR)


def write_weight_plots(study_dir: str, cells: Sequence[Cell], precisions: str) -> dict:
    """Weight histograms (fp32 vs quantized kernels) of each pair's first fp32-trained policy; a
    pair whose plot is missing and whose fp32 checkpoints are all gone gets none."""
    plots = {}
    parsed = parse_precisions(precisions, "static")
    for cell in cells:
        key = (cell.agent, cell.env_id)
        if cell.qat_bits or key in plots:
            continue
        path = os.path.join(study_dir, "plots", f"weights_{cell.agent}_{env_slug(cell.env_id)}.png")
        if not os.path.exists(path):
            if not has_checkpoint(os.path.join(study_dir, cell.relative_dir, TRAIN_DIR)):
                continue
            restored = runs.restore_run(os.path.join(study_dir, cell.relative_dir, TRAIN_DIR))
            params = restored.agent.policy_params(restored.state)
            study_report.plot_weight_histograms(params, parsed, f"{cell.agent} on {cell.env_id}, seed {cell.seed}", path)
        plots[key] = path
    return plots


def run_and_report(run_study: Callable[[], dict], what: str) -> None:
    """A study CLI's body: `run_study()`, then `report_outcome`. Ctrl-C or SIGTERM stops the study
    with one line and exit status 130: the launcher has cancelled pending cells, stopped running
    ones and the local Ray it started; finished cells stay, so a rerun resumes."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        outcome = run_study()
    except KeyboardInterrupt:
        print(f"interrupted: {what} stopped; finished cells are kept and a rerun resumes", file=sys.stderr)
        sys.exit(130)
    report_outcome(outcome, what)


def report_outcome(outcome: dict, what: str) -> None:
    """A study CLI's last lines: where `what`'s report went (or that no cell finished), and the
    failed cells, exiting 1 when any failed. `outcome` is `run_study`'s `{"paths", "failed"}`."""
    if outcome["paths"]:
        print(f"{what} report: {outcome['paths']['report.md']}")
    else:
        print("no cell finished: no report written", file=sys.stderr)
    if outcome["failed"]:
        print(f"{len(outcome['failed'])} cell(s) failed: {'; '.join(outcome['failed'])}", file=sys.stderr)
        sys.exit(1)
