"""Post-training quantization sweep of a trained run: return, action divergence, bytes and
latency per precision, against fp32.

    python -m launch.ptq --workdir=runs/dqn_cartpole --precisions=fp32,fp16,bf16,int8,int4,int2 \\
        --episodes=10

Restores the trained policy of the finished run in --workdir (or checkpoint --step=N of any run)
and writes ptq/results.json, ptq/report.md and ptq/sweetspot.png (return vs bits). An unfinished
run (no results.json: killed, or still training) is refused unless --step names a checkpoint.
"""

from absl import flags

from launch import common, runs

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "A launch.train run directory (required).")
flags.DEFINE_string("precisions", "fp32,fp16,bf16,quarl_fp16,quarl8,quarl4,quarl_dyn8,int8,int4,int4-e8,int2",
                    "Comma-separated schemes (README, 'Quantization schemes'): fp32, bf16, fp16; QuaRL's quarl<N> "
                    "(weight-only), quarl_fp16, quarl_dyn8; qrl's int<N>[-e<M>][-obst|-obsf][-sym][-dyn] (N in 2..16; "
                    "int8 runs real int8 kernels, other N simulate them).")
flags.DEFINE_integer("episodes", 10, "Evaluation episodes per precision (episode i uses env seed seed+i).")
flags.DEFINE_integer("seed", 0, "First evaluation environment seed.")
flags.DEFINE_enum("activations", "static", ["static", "dynamic"],
                  "Default activation scales of int<N> schemes without -dyn: calibrated on fp32 rollouts, or "
                  "computed per call.")
flags.DEFINE_integer("calibration_steps", 2048, "fp32 rollout states used to calibrate static scales.")
flags.DEFINE_integer("divergence_steps", 2048, "fp32 rollout states on which action divergence is measured.")
flags.DEFINE_string("out", None, "Output directory (default: WORKDIR/ptq).")
flags.DEFINE_integer("max_steps", None, "Cut evaluation episodes after this many steps (default: no cut).")
flags.DEFINE_enum("ranges", "calibrate", ["calibrate", "trained"],
                  "Static activation ranges: calibrated on fp32 rollouts, or a QAT run's trained moving averages.")
flags.DEFINE_integer("step", None,
                     "Evaluate the checkpoint at this environment step (default: the finished run's trained policy; "
                     "needed for an unfinished run).")


FLAG_RANGES = {
    "episodes": common.AT_LEAST_1, "seed": common.AT_LEAST_0, "calibration_steps": common.AT_LEAST_1,
    "divergence_steps": common.AT_LEAST_1, "max_steps": common.AT_LEAST_1,
}


def run() -> None:
    workdir = common.require_workdir(FLAGS.workdir, writable=False)
    common.check_flag_ranges(FLAG_RANGES)
    _, paths = runs.ptq_run(
        workdir, FLAGS.precisions, FLAGS.episodes, seed=FLAGS.seed,
        activations=FLAGS.activations, calibration_steps=FLAGS.calibration_steps,
        divergence_steps=FLAGS.divergence_steps, out_dir=FLAGS.out, max_steps=FLAGS.max_steps,
        step=FLAGS.step, trained_ranges=FLAGS.ranges == "trained",
    )
    print(f"PTQ report: {paths['report.md']}")


if __name__ == "__main__":
    common.run_entry_point(run)
