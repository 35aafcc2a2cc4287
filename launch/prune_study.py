"""The single-shot pruning study in one command: datasets × offline algorithms × pruners ×
sparsities × seeds, then scores, layerwise kept fractions, mask overlap and memory tables.

    python -m launch.prune_study --workdir=runs/prune_study --datasets=data/hopper-medium-qrl.hdf5 \\
        --algos=bc,td3_bc --pruners=snip,grasp --sparsities=0,0.9,0.95,0.98 --seeds=0,1,2 --steps=100000

Each cell is one `launch.prune_runs.run_prune_offline` run, in this process, into
`<workdir>/cells/<task>/<algo>/<pruner>/s<sparsity>/seed<k>/` (task: the dataset file's stem or the
Minari directory's last two parts). Sparsity 0 is the dense run, pruner "none", once per task ×
algo × seed (also run when --pruners lists none); the other pruners run at every nonzero sparsity.
A cell whose results.json exists is skipped and an unfinished one starts again, so rerunning the
command resumes; `--stop_after_minutes` ends a part of a long grid between cells (or programs), and
`--report_only` rewrites the report from the cells on disk (study.json's plan) without the datasets. `--configs_per_program=N` trains up to N pending cells of one task and algorithm
together as one vmapped program (`launch.prune_runs.run_prune_offline_many`, `qrl.offline_many`);
each cell still gets its own directory and files. Bad input in a cell stops the study with its one line; any other failure is
recorded (traceback in `<cell>.error.txt`) and the study goes on, exiting 1 at the end. Then
report.md, summary.json and plots/ go into the workdir (`pruning.study_report`).
"""

import dataclasses
import os
import time
import traceback
from typing import Callable, Mapping, Optional, Sequence

from absl import flags

from launch import common, launcher, studies
from launch.prune_runs import MASKS_FILE, RESULTS_FILE, PruneRun, prepare_run, read_masks, run_prune_offline
from pruning import PruneSettings, check_pruner, check_sparsity
from pruning import study_report
from qrl import io, workdirs
from qrl.errors import QrlInputError

DENSE = study_report.DENSE
STUDY_FILE = "study.json"
Runner = Callable[..., dict]

FLAGS = flags.FLAGS


def define_flags() -> None:
    """The CLI's flags, defined only when this module runs as the entry point: the library part
    (make_options, run_study) is imported by tests and notebooks beside other entry points whose
    flags share these names."""
    flags.DEFINE_string("workdir", None, "Study directory (required).")
    flags.DEFINE_string("datasets", None, "Comma-separated datasets (D4RL HDF5 files or Minari directories); one task each.")
    flags.DEFINE_string("algos", "bc", "Comma-separated offline algorithms (agents.OFFLINE_AGENT_NAMES).")
    flags.DEFINE_string("pruners", "none,snip,grasp", "Comma-separated pruners; none is the dense run.")
    flags.DEFINE_string("sparsities", "0,0.5,0.8,0.9,0.95,0.98,0.99", "Comma-separated sparsities in [0, 1); 0 is dense.")
    flags.DEFINE_string("seeds", "0,1,2", "Comma-separated seeds.")
    flags.DEFINE_integer("steps", 100_000, "Gradient steps per cell.")
    flags.DEFINE_integer("eval_every", 5_000, "Evaluate every N gradient steps (0: only at the end).")
    flags.DEFINE_integer("eval_episodes", 10, "Episodes per evaluation.")
    flags.DEFINE_integer("prune_batches", 1, "Offline batches the scores are computed on.")
    flags.DEFINE_integer("prune_batch_size", 256, "Transitions per scoring batch.")
    flags.DEFINE_enum("scope", "network", ["network", "layer", "global"], "Where the score threshold applies.")
    flags.DEFINE_list("separate", [], "Sub-networks thresholded on their own at network scope, e.g. vae/encoder,vae/decoder.")
    flags.DEFINE_float("temperature", 1.0, "GraSP's temperature (the reference's default: 200).")
    flags.DEFINE_bool("reinit", False, "GraSP's reinit: score a copy with Xavier-normal kernels (the reference's default).")
    flags.DEFINE_integer("iterations", 1, "Rounds of SNIP / GraSP scoring reaching each sparsity (1: single shot).")
    flags.DEFINE_enum("vae", None, ["separate", "joint", "dense"],
                      "How BCQ's VAE is pruned (default: encoder and decoder each with its own threshold).")
    flags.DEFINE_multi_string("set", [], "Algorithm config override algo.key=value (repeatable), e.g. bc.hidden_sizes=64-64.")
    flags.DEFINE_integer("configs_per_program", 1,
                         "Train up to N cells of one task and algorithm as one vmapped program (qrl.offline_many); "
                         "1: cell by cell.")
    flags.DEFINE_bool("progress", True, "Show each cell's progress bar.")
    flags.DEFINE_float("stop_after_minutes", 0.0,
                       "Start no cell or program after this many minutes (0: no limit); the report covers the "
                       "finished cells and rerunning the command resumes.")
    launcher.define_flags()
    flags.DEFINE_bool("report_only", False,
                      "Run nothing: rewrite the report over the finished cells of the plan in <workdir>/study.json "
                      "(only --workdir is read; the datasets need not exist).")


@dataclasses.dataclass(frozen=True)
class StudyOptions:
    """A checked study plan (build it with `make_options`)."""

    workdir: str
    datasets: tuple[str, ...]
    algos: tuple[str, ...]
    pruners: tuple[str, ...]
    sparsities: tuple[float, ...]
    seeds: tuple[int, ...]
    steps: int = 100_000
    eval_every: int = 5_000
    eval_episodes: int = 10
    prune_batches: int = 1
    prune_batch_size: int = 256
    scope: str = "network"
    overrides: Mapping[str, Mapping[str, str]] = dataclasses.field(default_factory=dict)
    separate: tuple[str, ...] = ()
    temperature: float = 1.0
    reinit: bool = False
    iterations: int = 1
    vae: Optional[str] = None
    configs_per_program: int = 1


@dataclasses.dataclass(frozen=True)
class Cell:
    """One pruning run of the study."""

    dataset: str
    task: str
    algo: str
    pruner: str
    sparsity: float
    seed: int

    @property
    def relative_dir(self) -> str:
        return os.path.join("cells", self.task, self.algo, self.pruner, f"s{self.sparsity:g}", f"seed{self.seed}")

    @property
    def label(self) -> str:
        return f"{self.task} {self.algo} {self.pruner} s{self.sparsity:g} seed {self.seed}"


def task_name(dataset: str) -> str:
    """`data/hopper-medium.hdf5` -> `hopper-medium`; `minari/qrl/hopper/medium-v0` -> `hopper-medium-v0`."""
    path = os.path.normpath(dataset)
    if os.path.isdir(path):
        return "-".join(part for part in path.split(os.sep)[-2:] if part not in ("", ".", ".."))
    return os.path.splitext(os.path.basename(path))[0]


def parse_sparsities(text: str) -> list[float]:
    values = []
    for item in studies.parse_list(text, "sparsities"):
        try:
            value = float(item)
        except ValueError:
            raise QrlInputError(f"--sparsities takes comma-separated numbers, got {item!r}") from None
        values.append(check_sparsity(value))
    return sorted(set(values))


def make_options(
    workdir: Optional[str], datasets: Optional[str], algos: str, pruners: str, sparsities: str, seeds: str,
    steps: int = 100_000, eval_every: int = 5_000, eval_episodes: int = 10, prune_batches: int = 1,
    prune_batch_size: int = 256, scope: str = "network", sets: Sequence[str] = (), separate: Sequence[str] = (),
    temperature: float = 1.0, reinit: bool = False, iterations: int = 1, vae: Optional[str] = None,
    configs_per_program: int = 1,
) -> StudyOptions:
    """Parses and checks the study's flags (comma-separated lists); bad input -> QrlInputError."""
    from agents import OFFLINE_AGENT_NAMES, get_offline_agent
    from qrl.datasets import files

    workdir = common.require_workdir(workdir)
    if not datasets or not str(datasets).strip():
        raise QrlInputError("--datasets is required")
    dataset_list = studies.parse_list(datasets, "datasets")
    tasks: dict[str, str] = {}
    for dataset in dataset_list:
        files.dataset_format(dataset)
        task = task_name(dataset)
        if task in tasks:
            raise QrlInputError(f"--datasets {tasks[task]} and {dataset} are both task {task!r}")
        tasks[task] = dataset
    algo_list = studies.parse_list(algos, "algos")
    for algo in algo_list:
        if algo not in OFFLINE_AGENT_NAMES:
            raise QrlInputError(f"unknown offline algorithm {algo!r} in --algos; known: {', '.join(OFFLINE_AGENT_NAMES)}")
    pruner_list = [check_pruner(pruner) for pruner in studies.parse_list(pruners, "pruners")]
    sparsity_list = parse_sparsities(sparsities)
    seed_list = studies.parse_ints(seeds, "seeds")
    if not seed_list:
        raise QrlInputError("--seeds is empty")
    common.check_ranges([
        ("--steps", steps, common.AT_LEAST_1), ("--eval_every", eval_every, common.AT_LEAST_0),
        ("--eval_episodes", eval_episodes, common.AT_LEAST_1), ("--prune_batches", prune_batches, common.AT_LEAST_1),
        ("--prune_batch_size", prune_batch_size, common.AT_LEAST_1), ("--temperature", temperature, common.POSITIVE),
        ("--iterations", iterations, common.AT_LEAST_1), ("--configs_per_program", configs_per_program, common.AT_LEAST_1),
    ])
    if (temperature != 1.0 or reinit) and "grasp" not in pruner_list:
        raise QrlInputError("--temperature and --reinit are grasp options; --pruners has no grasp")
    if iterations > 1 and not {"snip", "grasp"} & set(pruner_list):
        raise QrlInputError("--iterations (rounds of re-scoring) apply to snip and grasp; --pruners has neither")
    for pruner in pruner_list:
        if pruner != DENSE:
            _cell_settings(pruner, max(sparsity_list), scope, separate, temperature, reinit, iterations).check(pruner)
    if vae is not None and not any(_has_vae(algo) for algo in algo_list):
        raise QrlInputError(f"--vae applies to agents with a VAE (bcq); --algos has none: {','.join(algo_list)}")
    overrides = studies.split_agent_overrides(sets, algo_list)
    for algo in algo_list:
        get_offline_agent(algo).config_for(dict(overrides[algo]))
    return StudyOptions(workdir, tuple(dataset_list), tuple(algo_list), tuple(pruner_list), tuple(sparsity_list),
                        tuple(seed_list), steps, eval_every, eval_episodes, prune_batches, prune_batch_size, scope,
                        overrides, tuple(separate), float(temperature), bool(reinit), int(iterations), vae,
                        int(configs_per_program))


def _has_vae(algo: str) -> bool:
    from agents import get_offline_agent

    return "vae" in getattr(get_offline_agent(algo).learning, "NETWORKS", ())


def _cell_vae(cell: "Cell", options: StudyOptions) -> Optional[str]:
    """The study's `vae` for the cells of agents with a VAE; "separate" only where it applies
    (SNIP, GraSP, magnitude at network scope), the agent's default elsewhere."""
    if options.vae is None or cell.pruner == DENSE or not _has_vae(cell.algo):
        return None
    if options.vae == "separate" and (cell.pruner not in ("snip", "grasp", "magnitude") or options.scope != "network"):
        return None
    return options.vae


def _cell_settings(pruner: str, sparsity: float, scope: str, separate: Sequence[str], temperature: float,
                   reinit: bool, iterations: int) -> PruneSettings:
    """A cell's settings: GraSP's options (temperature, reinit) go to GraSP's cells, the scoring
    rounds to SNIP's and GraSP's, so one study can list every pruner."""
    return PruneSettings(sparsity=sparsity, scope=scope, separate=tuple(separate),
                         temperature=temperature if pruner == "grasp" else 1.0, reinit=reinit and pruner == "grasp",
                         iterations=iterations if pruner in ("snip", "grasp") else 1)


def plan_cells(options: StudyOptions) -> list[Cell]:
    """Every cell, dataset → algo → seed → (dense, then pruner → sparsity); raises QrlInputError
    for a plan with no cells (only pruner none without sparsity 0 is still dense)."""
    pruned = [pruner for pruner in options.pruners if pruner != DENSE]
    nonzero = [sparsity for sparsity in options.sparsities if sparsity > 0]
    dense = DENSE in options.pruners or 0.0 in options.sparsities
    cells = []
    for dataset in options.datasets:
        for algo in options.algos:
            for seed in options.seeds:
                if dense:
                    cells.append(Cell(dataset, task_name(dataset), algo, DENSE, 0.0, seed))
                cells += [Cell(dataset, task_name(dataset), algo, pruner, sparsity, seed)
                          for pruner in pruned for sparsity in nonzero]
    if not cells:
        raise QrlInputError("the study has no cells: give a nonzero sparsity for the pruners, or sparsity 0 for dense")
    return cells


def check_tasks(options: StudyOptions, cells: Sequence[Cell]) -> None:
    """Reads each dataset with each algorithm as its cells will (`prepare_run`: the dataset's
    environment and shapes, the config with what the dataset fills in, the separate sub-network
    paths), so that bad input stops the study before it writes anything."""
    checked = set()
    for cell in cells:
        if (cell.dataset, cell.algo) not in checked:
            checked.add((cell.dataset, cell.algo))
            try:
                prepare_run(cell_run(cell, options))
            except QrlInputError as error:
                raise QrlInputError(f"{cell.task} {cell.algo}: {error}") from None


def cell_run(cell: Cell, options: StudyOptions) -> PruneRun:
    return PruneRun(
        dataset=cell.dataset, algo=cell.algo, pruner=cell.pruner,
        settings=_cell_settings(cell.pruner, cell.sparsity, options.scope, options.separate, options.temperature,
                                options.reinit, options.iterations),
        vae=_cell_vae(cell, options),
        overrides=dict(options.overrides[cell.algo]),
        prune_batches=options.prune_batches, prune_batch_size=options.prune_batch_size, steps=options.steps,
        seed=cell.seed, eval_every=options.eval_every, eval_episodes=options.eval_episodes,
    )


def run_cell(cell: Cell, options: StudyOptions, runner: Runner = run_prune_offline, progress: bool = True,
             printer: Callable[[str], None] = print) -> str:
    """Runs one cell unless its results.json exists: "already done" or "ran". A QrlInputError
    propagates; any other failure leaves its traceback in `<cell>.error.txt` and is re-raised."""
    cell_dir = os.path.join(options.workdir, cell.relative_dir)
    error_path = cell_dir + ".error.txt"
    if os.path.exists(os.path.join(cell_dir, RESULTS_FILE)):
        return "already done"
    workdirs.remove_outputs(cell_dir)  # an unfinished run: start it again.
    try:
        runner(cell_run(cell, options), cell_dir, overwrite=False, progress=progress, printer=printer)
    except QrlInputError:
        raise
    except Exception:
        io.atomic_write_text(error_path, traceback.format_exc())
        raise
    if os.path.exists(error_path):
        os.remove(error_path)
    return "ran"


def run_cell_task(cell: Cell, options: StudyOptions, runner: Runner, progress: bool,
                  printer: Optional[Callable[[str], None]]) -> str:
    """One cell as a launcher task (`launch.launcher`): `run_cell`, bad input named by the cell."""
    try:
        return run_cell(cell, options, runner, progress, printer or print)
    except QrlInputError as error:
        raise QrlInputError(f"{cell.label}: {error}") from None


def run_program_task(program: Sequence[Cell], options: StudyOptions, many_runner: Optional[Callable[..., list]],
                     progress: bool, printer: Optional[Callable[[str], None]]) -> str:
    """Cells of one task and algorithm trained as one vmapped program
    (`launch.prune_runs.run_prune_offline_many`), as a launcher task. A failure leaves its
    traceback beside each of the program's cells and is re-raised."""
    from launch.prune_runs import run_prune_offline_many

    cell_dirs = [os.path.join(options.workdir, cell.relative_dir) for cell in program]
    for cell_dir in cell_dirs:
        workdirs.remove_outputs(cell_dir)  # unfinished cells start again.
    try:
        (many_runner or run_prune_offline_many)([cell_run(cell, options) for cell in program], cell_dirs,
                                                overwrite=False, progress=progress, printer=printer or print)
    except QrlInputError as error:
        raise QrlInputError(f"{program[0].label}: {error}") from None
    except Exception:
        for cell_dir in cell_dirs:
            io.atomic_write_text(cell_dir + ".error.txt", traceback.format_exc())
        raise
    for cell_dir in cell_dirs:
        if os.path.exists(cell_dir + ".error.txt"):
            os.remove(cell_dir + ".error.txt")
    return "ran"


def plan_tasks(cells: Sequence[Cell], options: StudyOptions, runner: Runner = run_prune_offline,
               many_runner: Optional[Callable[..., list]] = None, progress: bool = True,
               printer: Optional[Callable[[str], None]] = None) -> list[tuple[launcher.CellTask, tuple]]:
    """`(task, its cells)` per launcher task: one per cell, or with `configs_per_program` > 1 one
    per program of up to that many pending cells of one task and algorithm (finished cells are
    left out)."""
    if options.configs_per_program == 1:
        return [(launcher.CellTask(cell.label, run_cell_task, (cell, options, runner, progress, printer)), (cell,))
                for cell in cells]
    pending: dict[tuple[str, str], list[Cell]] = {}
    for cell in cells:
        if not os.path.exists(os.path.join(options.workdir, cell.relative_dir, RESULTS_FILE)):
            pending.setdefault((cell.dataset, cell.algo), []).append(cell)
    planned = []
    for group in pending.values():
        for first in range(0, len(group), options.configs_per_program):
            program = tuple(group[first:first + options.configs_per_program])
            label = f"{len(program)} cells of {program[0].task} {program[0].algo} as one program"
            planned.append((launcher.CellTask(label, run_program_task, (program, options, many_runner, progress, printer)),
                            program))
    return planned


def _past(deadline: Optional[float]) -> bool:
    return deadline is not None and time.monotonic() >= deadline


def study_cells(workdir: str, cells: Sequence[Cell]) -> list[dict]:
    """The finished cells as `pruning.study_report` records, each with its results and stored masks."""
    records = []
    for cell in cells:
        cell_dir = os.path.join(workdir, cell.relative_dir)
        if not os.path.exists(os.path.join(cell_dir, RESULTS_FILE)):
            continue
        masks = read_masks(cell_dir) if os.path.exists(os.path.join(cell_dir, MASKS_FILE)) else {}
        records.append({"task": cell.task, "algo": cell.algo, "pruner": cell.pruner, "sparsity": cell.sparsity,
                        "seed": cell.seed, "results": io.read_json(os.path.join(cell_dir, RESULTS_FILE)),
                        "masks": masks})
    return records


def run_study(options: StudyOptions, runner: Runner = run_prune_offline, progress: bool = True,
              log: Callable[[str], None] = print, many_runner: Optional[Callable[..., list]] = None,
              stop_after_s: float = 0.0, launch_options: launcher.LaunchOptions = launcher.LaunchOptions()) -> dict:
    """Runs the cells not done yet where `launch_options` say (in this process by default, or local
    processes, or Ray tasks: `launch.launcher`), then writes the report over every finished cell.
    With `stop_after_s` > 0 no cell (or program) starts after that many seconds; the rest wait for
    a rerun. A failed cell is retried once, then reported; bad input in a cell run in this process
    stops the study.

    Returns {"paths": write_report's paths or None when no cell finished, "failed": [labels],
    "pending": cells left without results}.
    """
    cells = plan_cells(options)
    check_tasks(options, cells)
    os.makedirs(options.workdir, exist_ok=True)
    io.atomic_write_json(os.path.join(options.workdir, STUDY_FILE),
                         {**dataclasses.asdict(options), "cells": [dataclasses.asdict(cell) for cell in cells]})
    deadline = time.monotonic() + stop_after_s if stop_after_s > 0 else None
    in_process = launch_options.launcher == "local" and launch_options.parallel == 1
    planned = plan_tasks(cells, options, runner, many_runner, progress, log if in_process else None)
    cells_of = {id(task): program for task, program in planned}
    failed = []
    for task, reason in launcher.run_tasks([task for task, _ in planned], launch_options, options.workdir, log,
                                           deadline):
        for cell in cells_of[id(task)]:
            error_path = os.path.join(options.workdir, cell.relative_dir) + ".error.txt"
            failed.append(f"{cell.label} ({reason}" + (f"; traceback in {error_path})" if os.path.exists(error_path)
                                                       else ")"))
    outcome = write_study_report(options.workdir, cells, failed)
    if outcome["pending"] and _past(deadline):
        log(f"stopped after {stop_after_s / 60:g} minutes: {len(outcome['pending'])} of {len(cells)} cells left; "
            f"rerun the command to resume")
    return outcome


def write_study_report(workdir: str, cells: Sequence[Cell], failed: Sequence[str] = ()) -> dict:
    """The report over the cells that have results: `{"paths", "failed", "pending"}` as `run_study`."""
    records = study_cells(workdir, cells)
    done = {(record["task"], record["algo"], record["pruner"], record["sparsity"], record["seed"]) for record in records}
    pending = [cell.label for cell in cells if (cell.task, cell.algo, cell.pruner, cell.sparsity, cell.seed) not in done]
    if not records:
        return {"paths": None, "failed": list(failed), "pending": pending}
    overlaps = study_report.mask_overlap_table(records)
    return {"paths": study_report.write_report(workdir, records, overlaps, list(failed), pending),
            "failed": list(failed), "pending": pending}


def report_only(workdir: Optional[str]) -> dict:
    """Rewrites the report of the study in `workdir` from its study.json plan and the cells on disk."""
    workdir = common.require_workdir(workdir)
    path = os.path.join(workdir, STUDY_FILE)
    if not os.path.isfile(path):
        raise QrlInputError(f"--report_only: {path} does not exist (run the study first)")
    try:
        cells = [Cell(**{field.name: cell[field.name] for field in dataclasses.fields(Cell)})
                 for cell in io.read_json(path)["cells"]]
    except (KeyError, TypeError, ValueError) as error:
        raise QrlInputError(f"--report_only: {path} is not a study plan ({type(error).__name__}: {error})") from None
    return write_study_report(workdir, cells)


def run() -> None:
    if FLAGS.report_only:
        studies.report_outcome(report_only(FLAGS.workdir), "pruning study")
        return
    common.check_ranges([("--stop_after_minutes", FLAGS.stop_after_minutes, common.AT_LEAST_0)])
    options = make_options(
        FLAGS.workdir, FLAGS.datasets, FLAGS.algos, FLAGS.pruners, FLAGS.sparsities, FLAGS.seeds, FLAGS.steps,
        FLAGS.eval_every, FLAGS.eval_episodes, FLAGS.prune_batches, FLAGS.prune_batch_size, FLAGS.scope, FLAGS.set,
        FLAGS.separate, FLAGS.temperature, FLAGS.reinit, FLAGS.iterations, FLAGS.vae, FLAGS.configs_per_program,
    )
    launch_options = launcher.options_from_flags()
    studies.run_and_report(lambda: run_study(options, progress=FLAGS.progress,
                                             stop_after_s=60.0 * FLAGS.stop_after_minutes,
                                             launch_options=launch_options), "pruning study")


if __name__ == "__main__":
    define_flags()
    common.run_entry_point(run)
