"""The QuaRL study in one command: train each algorithm on each environment (per seed) in fp32
and with quantization-aware training, quantize after training, and report.

    python -m launch.quarl_study --workdir=runs/quarl --agents=dqn,ppo,a2c --envs=gym:CartPole-v1 \\
        --seeds=0,1,2 --precisions=fp32,fp16,bf16,quarl8,quarl4,quarl_dyn8,int8,int4,int4-e8 --qat_bits=8,4
    # DQN with QuaRL's own CartPole network and hyperparameters (agents/dqn/config.py PRESETS)
    python -m launch.quarl_study --workdir=runs/quarl_dqn --agents=dqn --envs=gym:CartPole-v1 \\
        --set=dqn.preset=quarl --steps=100000
    python -m launch.quarl_study --workdir=runs/quarl_pendulum --agents=ddpg,d4pg,sac,td3 \\
        --envs=gym:Pendulum-v1 --seeds=0

Writes <workdir>/results.json, report.md (QuaRL-style tables: return per precision, E, action
divergence, bytes, latency), plots/ (sweet spot per algorithm and environment, fp32 vs quantized
weight histograms) and one directory per cell under cells/. Rerunning the same command skips
finished cells; an interrupted training run starts again. `--launcher=local --parallel=N` or
`--launcher=ray [--ray_address=host:port]` spread the cells over processes or a Ray cluster
(`launch.launcher`).
"""

from absl import flags

from launch import common, launcher, studies

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "Study directory (required).")
flags.DEFINE_string("agents", "dqn", "Comma-separated algorithms.")
flags.DEFINE_string("envs", "gym:CartPole-v1", "Comma-separated environment ids.")
flags.DEFINE_string("seeds", "0", "Comma-separated training seeds.")
flags.DEFINE_string("precisions", studies.STUDY_PRECISIONS,
                    "Post-training precisions, both families (README, 'Quantization schemes'): QuaRL's "
                    "quarl<N>, quarl_fp16, quarl_dyn8 and qrl's int<N>[-e<M>][-obst|-obsf][-sym][-dyn].")
flags.DEFINE_string("qat_bits", "8,6,4", "Comma-separated QAT bit widths (2..8); empty for none.")
flags.DEFINE_float("quant_delay_fraction", 0.5, "QAT: fraction of the run's updates trained float (ranges tracked) before fake quantization.")
flags.DEFINE_integer("steps", None, "Environment steps per training run (default: a small per-task budget).")
flags.DEFINE_integer("episodes", 10, "Evaluation episodes per precision and seed.")
flags.DEFINE_multi_string("set", [], "Agent config override agent.key=value (repeatable), e.g. ppo.learning_rate=1e-3; "
                          "agent.preset=NAME picks a named preset, e.g. dqn.preset=quarl.")
flags.DEFINE_bool("skip_incompatible", False, "Skip algorithm/environment pairs the algorithm cannot run instead of failing.")
flags.DEFINE_integer("num_envs", None, "Host environments per training run (default: the agent's).")
flags.DEFINE_integer("probe_steps", 2048, "fp32 rollout states for calibrating static scales and for action divergence.")
flags.DEFINE_integer("eval_max_steps", None, "Cut evaluation episodes after this many steps (default: no cut).")
launcher.define_flags()


FLAG_RANGES = {
    "quant_delay_fraction": common.FRACTION_BELOW_1, "steps": common.AT_LEAST_1, "episodes": common.AT_LEAST_1,
    "num_envs": common.AT_LEAST_1, "probe_steps": common.AT_LEAST_1, "eval_max_steps": common.AT_LEAST_1,
}


def run() -> None:
    workdir = common.require_workdir(FLAGS.workdir)
    common.check_flag_ranges(FLAG_RANGES)
    launch_options = launcher.options_from_flags()
    agents = studies.parse_list(FLAGS.agents, "agents")
    eval_args = [f"--calibration_steps={FLAGS.probe_steps}", f"--divergence_steps={FLAGS.probe_steps}"]
    if FLAGS.eval_max_steps is not None:
        eval_args.append(f"--max_steps={FLAGS.eval_max_steps}")
    studies.run_and_report(lambda: studies.run_study(
        workdir, agents, studies.parse_list(FLAGS.envs, "envs"),
        studies.parse_ints(FLAGS.seeds, "seeds"), FLAGS.precisions, studies.parse_qat_bits(FLAGS.qat_bits),
        episodes=FLAGS.episodes, steps=FLAGS.steps, quant_delay_fraction=FLAGS.quant_delay_fraction,
        overrides=studies.split_agent_overrides(FLAGS.set, agents), skip_incompatible=FLAGS.skip_incompatible,
        eval_args=eval_args, num_envs=FLAGS.num_envs, launch_options=launch_options,
    ), "QuaRL study")


if __name__ == "__main__":
    common.run_entry_point(run)
