"""`make demo`: QuaRL in miniature — train DQN on CartPole in fp32, quantize the policy after
training to fp16 / bf16 / int8 / fewer bits, and compare reward, bytes and latency with fp32.

    python -m launch.demo --workdir=runs/demo

Writes the training run (config.json, metrics.csv, tb/, checkpoints/, results.json), the PTQ
sweep (ptq/results.json, ptq/report.md, ptq/sweetspot.png) and WORKDIR/report.md with both.
Rerunning it on its own earlier output replaces that output; it never deletes in a directory it
did not create (qrl's `qrl-workdir.json` marker must say kind demo, see `qrl.workdirs`), and
files of yours in its workdir stay.
"""

import os

from absl import flags
from matplotlib.figure import Figure

from launch import common, runs
from qrl import io
from qrl.quant import parse_precisions
from qrl.quant.report import markdown_table

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", "runs/demo",
                    "Where the demo writes: a new or empty directory, or an earlier demo's (whose outputs it replaces).")
flags.DEFINE_string("env", "gym:CartPole-v1", "Environment id (discrete actions).")
flags.DEFINE_integer("steps", 50_000, "DQN training steps.")
flags.DEFINE_integer("seed", 0, "Training seed.")
flags.DEFINE_integer("episodes", 10, "Evaluation episodes per precision.")
flags.DEFINE_string("precisions", "fp32,fp16,bf16,quarl_fp16,quarl8,quarl6,quarl4,quarl2,quarl_dyn8,"
                    "int8,int6,int4,int3,int2,int4-e8",
                    "Precisions of the PTQ sweep: QuaRL's schemes and qrl's W+A scheme side by side.")


def _plot_learning_curve(results: dict, path: str) -> None:
    evaluations = results["evaluations"]
    figure = Figure(figsize=(6.4, 3.6))
    axis = figure.add_subplot()
    axis.plot([e["env_steps"] for e in evaluations], [e["mean"] for e in evaluations], marker="o")
    axis.set_xlabel("environment steps")
    axis.set_ylabel(f"greedy return ({results['final_eval']['episodes']} episodes)")
    axis.set_title(f"DQN on {results['env']} (fp32 training)")
    axis.grid(alpha=0.3)
    figure.tight_layout()
    io.save_figure(figure, path)


FLAG_RANGES = {"steps": common.AT_LEAST_1, "seed": common.AT_LEAST_0, "episodes": common.AT_LEAST_1}


def run() -> None:
    workdir = common.require_workdir(FLAGS.workdir)
    common.check_flag_ranges(FLAG_RANGES)
    parse_precisions(FLAGS.precisions, "static")  # bad precisions fail before training writes anything
    print(f"Training DQN on {FLAGS.env} for {FLAGS.steps} steps (fp32) ...", flush=True)
    results = runs.train_run(
        "dqn", FLAGS.env, FLAGS.steps, FLAGS.seed, workdir, overwrite=True,
        workdir_kind="demo", overwritable_kinds=("demo",),
        eval_episodes=FLAGS.episodes, eval_every=max(FLAGS.steps // 10, 1),
    )
    print("Post-training quantization sweep ...", flush=True)
    sweep, _ = runs.ptq_run(workdir, FLAGS.precisions, FLAGS.episodes, seed=0)
    _plot_learning_curve(results, os.path.join(workdir, "learning_curve.png"))
    by_name = {row["precision"]: row for row in sweep["results"]}
    int8 = by_name.get("int8")
    final = results["final_eval"]
    lines = [
        f"# qrl demo: DQN on {FLAGS.env}, quantized after training",
        "",
        f"Trained in fp32 for {results['env_steps']} environment steps ({results['updates']} updates) in "
        f"{results['train_seconds']:.0f} s ({results['steps_per_second']:.0f} steps/s); greedy return "
        f"{final['mean']:.1f} ± {final['std']:.1f} over {final['episodes']} episodes.",
        "",
        "![learning curve](learning_curve.png)",
        "",
        "## Post-training quantization",
        "",
        "Each precision runs the same network definition on quantized parameters. Two families side by "
        "side (README, \"Quantization schemes\"): QuaRL's — `quarl<N>` its weight-only rule, `quarl_fp16` "
        "fp16 weights, `quarl_dyn8` dynamic-range int8 as its actors ran it — and qrl's weights + activations "
        "scheme `int<N>`: static scales calibrated on fp32 rollouts, per-feature scales for the observation, "
        "an affine (unsigned for ReLU outputs) activation grid, `-e8` for 8-bit first and last layers. "
        "`int8` and `quarl_dyn8` run real int8×int8→int32 arithmetic; other widths simulate it.",
        "",
        markdown_table(sweep),
        "",
        "![sweet spot](ptq/sweetspot.png)",
        "",
    ]
    if int8:
        lines += [
            f"int8: return {int8['mean_return']:.1f} vs fp32 {by_name['fp32']['mean_return']:.1f} "
            f"(E = {int8['relative_error']:.3f}), {int8['bytes_ratio_to_fp32']:.2f}× the bytes, greedy action "
            f"agreement {int8['action_agreement']:.3f}.",
            "",
        ]
    lines += [
        "Reproduce: `python -m launch.train --agent=dqn --env=gym:CartPole-v1 --steps=50000 --workdir=D` then "
        "`python -m launch.ptq --workdir=D --precisions=...`.",
        "",
    ]
    report = os.path.join(workdir, "report.md")
    io.atomic_write_text(report, "\n".join(lines))
    print(f"Report: {os.path.abspath(report)}")


if __name__ == "__main__":
    common.run_entry_point(run)
