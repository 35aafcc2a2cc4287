"""The pruning paper's ablations in one command: how much scoring data (batch size × number of
batches) and how many scoring rounds (iterative pruning to the same final sparsity) change what a
single shot gets, for each task × algorithm × pruner × seed.

    python -m launch.prune_ablation --workdir=runs/prune_ablation --datasets=data/hopper-medium-qrl.hdf5 \\
        --algos=bc,bcq --pruners=snip,grasp --sparsity=0.95 --seeds=0,1,2 --steps=20000 \\
        --scoring=64x1,256x1,1024x1,4096x1,256x16 --iterations=10,100

Each arm is one `launch.prune_study` in `<workdir>/<arm>/` (resumable as a study): `score<B>x<N>`
scores on N batches of B transitions in one shot; `rounds<k>` prunes in k rounds with the
`--baseline` scoring data. The baseline arm (default `score256x1`, the study's default) also runs
the dense cells. Then `ablation.md` and `ablation.json` (`pruning.ablation_report`): every arm's
score mean ± std, its paired difference to the single shot with a 95% bootstrap interval over
seeds, and the overlap of its kept weights with the single shot's.

Arms run one after another; each arm's cells go through `launch.launcher` (`--launcher`,
`--parallel`, `--ray_address`, as in `launch.prune_study`). Ctrl-C or SIGTERM stops with exit
status 130; a rerun resumes.
"""

import os
import re
from typing import Callable

from absl import flags

from launch import common, launcher, prune_study, studies
from pruning import ablation_report
from qrl import io
from qrl.errors import QrlInputError

FLAGS = flags.FLAGS
SCORING = re.compile(r"^(\d+)x(\d+)$")


def define_flags() -> None:
    flags.DEFINE_string("workdir", None, "Ablation directory (required); one study per arm under it.")
    flags.DEFINE_string("datasets", None, "Comma-separated datasets (D4RL HDF5 files or Minari directories).")
    flags.DEFINE_string("algos", "bc,bcq", "Comma-separated offline algorithms.")
    flags.DEFINE_string("pruners", "snip,grasp", "Comma-separated pruners (snip, grasp).")
    flags.DEFINE_float("sparsity", 0.95, "The final sparsity of every arm.")
    flags.DEFINE_string("seeds", "0,1,2", "Comma-separated seeds.")
    flags.DEFINE_integer("steps", 20_000, "Gradient steps per cell.")
    flags.DEFINE_integer("eval_every", 0, "Evaluate every N gradient steps (0: only at the end).")
    flags.DEFINE_integer("eval_episodes", 10, "Episodes per evaluation.")
    flags.DEFINE_string("scoring", "64x1,256x1,1024x1,4096x1,256x16",
                        "Single-shot arms: comma-separated <batch size>x<batches> of scoring data.")
    flags.DEFINE_string("iterations", "10,100", "Iterative arms: comma-separated numbers of rounds (> 1).")
    flags.DEFINE_string("baseline", "256x1", "The single shot the arms are compared with (one of --scoring).")
    flags.DEFINE_enum("vae", None, ["separate", "joint", "dense"], "How BCQ's VAE is pruned (default separate).")
    flags.DEFINE_integer("configs_per_program", 1, "Cells trained together as one vmapped program (1: cell by cell).")
    flags.DEFINE_multi_string("set", [], "Algorithm config override algo.key=value (repeatable).")
    flags.DEFINE_bool("progress", True, "Show each cell's progress bar.")
    launcher.define_flags()


def parse_scoring(text: str) -> list[tuple[int, int]]:
    """`"64x1,256x4"` -> `[(64, 1), (256, 4)]`; anything else is a one-line input error."""
    specs = []
    for item in studies.parse_list(text, "scoring"):
        match = SCORING.match(item)
        if not match or int(match.group(1)) < 1 or int(match.group(2)) < 1:
            raise QrlInputError(f"--scoring takes <batch size>x<batches> with both >= 1, like 256x1; got {item!r}")
        specs.append((int(match.group(1)), int(match.group(2))))
    return list(dict.fromkeys(specs))


def arm_name(batch_size: int, batches: int) -> str:
    return f"score{batch_size}x{batches}"


def plan_arms(scoring: str, iterations: str, baseline: str) -> dict[str, dict]:
    """`{arm: {"prune_batch_size", "prune_batches", "iterations"}}`, the baseline first."""
    specs = parse_scoring(scoring)
    baselines = parse_scoring(baseline)
    if len(baselines) != 1 or baselines[0] not in specs:
        raise QrlInputError(f"--baseline={baseline} must be one of --scoring ({scoring})")
    base = baselines[0]
    rounds = studies.parse_ints(iterations, "iterations", minimum=2) if str(iterations).strip() else []
    arms = {arm_name(*base): {"prune_batch_size": base[0], "prune_batches": base[1], "iterations": 1}}
    for batch_size, batches in specs:
        arms.setdefault(arm_name(batch_size, batches),
                        {"prune_batch_size": batch_size, "prune_batches": batches, "iterations": 1})
    for count in rounds:
        arms[f"rounds{count}"] = {"prune_batch_size": base[0], "prune_batches": base[1], "iterations": count}
    return arms


def make_arm_options(workdir: str, datasets: str, algos: str, pruners: str, sparsity: float, seeds: str,
                     steps: int, eval_every: int, eval_episodes: int, arms: dict, sets=(), vae=None,
                     configs_per_program: int = 1) -> dict[str, prune_study.StudyOptions]:
    """Each arm's checked study options (bad input in any arm -> QrlInputError, nothing written)."""
    workdir = common.require_workdir(workdir)
    listed = studies.parse_list(pruners, "pruners")
    unknown = [pruner for pruner in listed if pruner not in ("snip", "grasp")]
    if unknown:
        raise QrlInputError(f"the ablations score data: --pruners takes snip and grasp, not {unknown[0]}")
    if not 0.0 < sparsity < 1.0:
        raise QrlInputError(f"--sparsity must be in (0, 1), got {sparsity}")
    options = {}
    for index, (arm, settings) in enumerate(arms.items()):
        options[arm] = prune_study.make_options(
            os.path.join(workdir, arm), datasets, algos, ("none," if index == 0 else "") + ",".join(listed),
            ("0," if index == 0 else "") + f"{sparsity:g}", seeds, steps, eval_every, eval_episodes,
            settings["prune_batches"], settings["prune_batch_size"], sets=sets, iterations=settings["iterations"],
            vae=vae, configs_per_program=configs_per_program)
    return options


def ablation_cells(arm: str, options: prune_study.StudyOptions) -> list[dict]:
    """The arm's finished pruned cells as `pruning.ablation_report` cells."""
    cells = []
    for record in prune_study.study_cells(options.workdir, prune_study.plan_cells(options)):
        if record["pruner"] == prune_study.DENSE:
            continue
        results = record["results"]
        score = results.get("normalized_score")
        cells.append({"arm": arm, "task": record["task"], "algo": record["algo"], "pruner": record["pruner"],
                      "seed": record["seed"], "masks": record["masks"],
                      "score": score["mean"] if score else results["final_eval"]["mean"]})
    return cells


def run_ablation(arm_options: dict, progress: bool = True, log: Callable[[str], None] = print,
                 launch_options: launcher.LaunchOptions = launcher.LaunchOptions()) -> dict:
    """Runs every arm's study (resuming; the arm's cells through `launch_options`), then writes
    `ablation.md` / `ablation.json` beside them."""
    arms = list(arm_options)
    for arm in arms:  # every arm's datasets and algorithms checked before any cell runs
        prune_study.check_tasks(arm_options[arm], prune_study.plan_cells(arm_options[arm]))
    failed = []
    for arm in arms:
        log(f"arm {arm}")
        outcome = prune_study.run_study(arm_options[arm], progress=progress, log=log, launch_options=launch_options)
        failed += [f"{arm}: {label}" for label in outcome["failed"]]
    cells = [cell for arm in arms for cell in ablation_cells(arm, arm_options[arm])]
    workdir = os.path.dirname(arm_options[arms[0]].workdir)
    rows = ablation_report.ablation_rows(cells, arms[0]) if cells else []
    io.atomic_write_json(os.path.join(workdir, "ablation.json"), {"baseline": arms[0], "arms": arms, "rows": rows,
                                                                   "failed": failed})
    text = (f"# Pruning ablations\n\nBaseline (single shot): `{arms[0]}`; dense and per-arm details in each arm's "
            f"report.md.\n\n" + (ablation_report.ablation_markdown(rows, arms[0]) if rows else "No cell finished.")
            + ("\n\n## Cells without results\n\n" + "\n".join(f"- {label}" for label in failed) if failed else "")
            + "\n")
    io.atomic_write_text(os.path.join(workdir, "ablation.md"), text)
    return {"paths": {"report.md": os.path.join(workdir, "ablation.md")}, "failed": failed}


def run() -> None:
    arms = plan_arms(FLAGS.scoring, FLAGS.iterations, FLAGS.baseline)
    options = make_arm_options(FLAGS.workdir, FLAGS.datasets, FLAGS.algos, FLAGS.pruners, FLAGS.sparsity, FLAGS.seeds,
                               FLAGS.steps, FLAGS.eval_every, FLAGS.eval_episodes, arms, FLAGS.set, FLAGS.vae,
                               FLAGS.configs_per_program)
    launch_options = launcher.options_from_flags()
    studies.run_and_report(lambda: run_ablation(options, progress=FLAGS.progress, launch_options=launch_options),
                           "pruning ablation")


if __name__ == "__main__":
    define_flags()
    common.run_entry_point(run)
