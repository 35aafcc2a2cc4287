"""Export a trained policy for edge runtimes: an ONNX model plus a JSON sidecar.

    python -m launch.export --workdir=runs/dqn_cartpole --precision=int8 --out=policy.onnx

Restores the finished run in --workdir (or checkpoint --step=N), quantizes its policy to
--precision as `launch.ptq` does (static activation scales calibrated on the same fp32 rollouts,
or a QAT run's trained ranges with --ranges=trained) and writes --out and --out.json. An offline
run of `launch.prune_offline` exports the same way: scales calibrated on dataset states, the
dataset's observation normalization in the sidecar, pruned kernels stored sparse. The model
takes float32 observations `[B, ...]` and returns environment actions; int8 layers run ONNX's
integer operators (MatMulInteger / ConvInteger). Before writing, the model is run by ONNX Runtime
on --probe_steps states and compared with the JAX policy (printed, and kept in the sidecar).
Load it with `qrl.deploy.load_policy` (numpy and onnxruntime only).
"""

from absl import flags

from launch import common, runs

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "A launch.train run directory (required).")
flags.DEFINE_string("precision", "int8",
                    "One scheme (README, 'Quantization schemes'): fp32, fp16, bf16, quarl<N>, quarl_fp16, quarl_dyn8, "
                    "int<N>[-e<M>][-obst|-obsf][-sym][-dyn].")
flags.DEFINE_string("out", None, "The ONNX model to write (required); its sidecar is OUT.json.")
flags.DEFINE_enum("activations", "static", ["static", "dynamic"],
                  "Default activation scales of int<N> schemes without -dyn: calibrated, or computed per call.")
flags.DEFINE_enum("ranges", "calibrate", ["calibrate", "trained"],
                  "Static activation ranges: calibrated on fp32 rollouts, or a QAT run's trained moving averages.")
flags.DEFINE_integer("calibration_steps", 2048, "fp32 rollout states used to calibrate static scales.")
flags.DEFINE_integer("probe_steps", 1024, "fp32 rollout states on which the model is checked against the JAX policy.")
flags.DEFINE_integer("seed", 0, "Seed of the calibration (seed+10000) and probe (seed+20000) rollouts.")
flags.DEFINE_integer("step", None, "Export the checkpoint at this environment step (default: the finished run's policy).")

FLAG_RANGES = {"calibration_steps": common.AT_LEAST_1, "probe_steps": common.AT_LEAST_1, "seed": common.AT_LEAST_0}


def run() -> None:
    workdir = common.require_workdir(FLAGS.workdir, writable=False)
    common.check_flag_ranges(FLAG_RANGES)
    sidecar = runs.export_run(
        workdir, FLAGS.precision, FLAGS.out, activations=FLAGS.activations,
        calibration_steps=FLAGS.calibration_steps, probe_steps=FLAGS.probe_steps, seed=FLAGS.seed,
        step=FLAGS.step, trained_ranges=FLAGS.ranges == "trained",
    )
    agreement = sidecar["agreement"]
    measure = (f"action agreement {agreement['action_agreement']:.4f}" if "action_agreement" in agreement
               else f"max action difference {agreement['max_action_difference']:.3g}")
    print(f"{sidecar['agent']} on {sidecar['env']} at {sidecar['precision']}: {FLAGS.out} "
          f"({sidecar['model_bytes']} bytes); vs the JAX policy on {agreement['probe_states']} states: {measure}")


if __name__ == "__main__":
    common.run_entry_point(run)
