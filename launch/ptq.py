"""Post-training quantization sweep of a trained run: reward, divergence, bytes and latency
per precision, against fp32.

    python -m launch.ptq --workdir=runs/dqn_cartpole --precisions=fp32,fp16,bf16,int8,int4,int2 \
        --episodes=10

Restores the checkpoint in --workdir and writes ptq/results.json, ptq/report.md and
ptq/sweetspot.png (return vs bits).
"""

import os

from absl import flags

from launch import common
from qrl.errors import QrlInputError
from qrl.quant import parse_precisions
from qrl.quant.report import write_ptq_outputs
from qrl.quant.sweep import run_sweep

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "A launch.train run directory.")
flags.DEFINE_string("precisions", "fp32,fp16,bf16,int8,int4,int2",
                    "Comma-separated: fp32, fp16, bf16, int<N> (N in 2..16; int8 runs real int8 kernels), "
                    "quarl<N> (QuaRL's weight-only rule).")
flags.DEFINE_integer("episodes", 10, "Evaluation episodes per precision (episode i uses env seed seed+i).")
flags.DEFINE_integer("seed", 0, "First evaluation environment seed.")
flags.DEFINE_enum("activations", "static", ["static", "dynamic"],
                  "Activation scales of integer precisions: calibrated from fp32 rollouts, or per call.")
flags.DEFINE_integer("calibration_steps", 2048, "fp32 rollout states used to calibrate static scales.")
flags.DEFINE_integer("divergence_steps", 2048, "fp32 rollout states on which action divergence is measured.")
flags.DEFINE_string("out", None, "Output directory (default: WORKDIR/ptq).")


def run() -> dict:
    common.synchronous_dispatch()
    precisions = parse_precisions(FLAGS.precisions, FLAGS.activations)
    for name, value in (("episodes", FLAGS.episodes), ("calibration_steps", FLAGS.calibration_steps),
                        ("divergence_steps", FLAGS.divergence_steps)):
        if value < 1:
            raise QrlInputError(f"--{name} must be >= 1, got {value}")
    restored = common.restore_run(FLAGS.workdir)
    spec = restored.agent.policy_spec(restored.config, restored.observation_spec, restored.action_spec)
    sweep = run_sweep(
        spec, restored.agent.policy_params(restored.state), restored.env_id, precisions, FLAGS.episodes,
        seed=FLAGS.seed, calibration_steps=FLAGS.calibration_steps, divergence_steps=FLAGS.divergence_steps,
        env_options=restored.run_config.get("env_options", {}),
    )
    sweep["run"] = {"workdir": FLAGS.workdir, "agent": restored.run_config["agent"], "activations": FLAGS.activations}
    out_dir = FLAGS.out or os.path.join(FLAGS.workdir, "ptq")
    paths = write_ptq_outputs(sweep, out_dir, title=f"{restored.run_config['agent']} on {restored.env_id}")
    print(f"PTQ report: {paths['report.md']}")
    return sweep


if __name__ == "__main__":
    common.run_entry_point(run)
