"""Train an agent on an environment; everything the run writes goes into --workdir.

    python -m launch.train --agent=dqn --env=gym:CartPole-v1 --steps=50000 --seed=0 \\
        --workdir=runs/dqn_cartpole
    # quantization-aware training: float for 12288 updates (half the run's), ranges tracked,
    # then 8-bit fake quantization; --set=qat_backend=aqt trains through AQT instead
    python -m launch.train --agent=dqn --env=gym:CartPole-v1 --steps=50000 --qat_bits=8 \\
        --quant_delay=12288 --workdir=runs/dqn_cartpole_qat8
    # a named preset: DQN as QuaRL trained it (64-unit layer-normalized dueling MLP, its zoo
    # hyperparameters); --set=preset=quarl is the same, and launch.quarl_study takes --set=dqn.preset=quarl
    python -m launch.train --agent=dqn --env=gym:CartPole-v1 --preset=quarl --steps=100000 \\
        --workdir=runs/dqn_cartpole_quarl

Writes config.json, metrics.csv, TensorBoard events (tb/), orbax checkpoints (checkpoints/)
and results.json (final evaluation, throughput), written last: a run is finished when its
results.json is there. qrl claims --workdir with a `qrl-workdir.json` marker (see
`qrl.workdirs`): a non-empty directory without one is refused, and --overwrite removes only
the outputs the marker lists.

A run killed before it finished continues with --resume (same agent, env, seed and config;
--steps may grow, also past a finished run's):

    python -m launch.train --agent=dqn --env=gym:CartPole-v1 --steps=50000 --checkpoint_every=5000 \
        --workdir=runs/dqn_cartpole --resume

It restarts from the newest intact checkpoint (so --checkpoint_every bounds the work lost): the
train state (params, optimizer, update count) and the evaluations so far come back; the
environments restart and the replay buffer refills from scratch (updates wait for
`learning_starts` new steps again), so the continuation is not the trajectory an uninterrupted
run would have taken. metrics.csv keeps its rows up to the checkpoint and continues from there
(TensorBoard events logged after the checkpoint stay, and are logged again). On-device runs (brax, gymnax ids: one compiled call)
do not resume.
"""

from absl import flags

from launch import common, runs
from qrl.config import PRESET_KEY
from qrl.errors import QrlInputError

FLAGS = flags.FLAGS
flags.DEFINE_string("agent", "dqn", "Algorithm: dqn, ppo, a2c, ddpg, td3, sac, d4pg.")
flags.DEFINE_string("env", "gym:CartPole-v1", "Environment id, e.g. gym:CartPole-v1, atari:Pong, dmc:cartpole-balance.")
flags.DEFINE_integer("steps", 50_000, "Environment steps to train for.")
flags.DEFINE_integer("seed", 0, "Seed of the agent and the training environments.")
flags.DEFINE_string("workdir", None, "Directory for everything the run writes (required).")
flags.DEFINE_integer("num_envs", None, "Environments stepped together (default: the agent's preset, else 1).")
flags.DEFINE_integer("eval_episodes", 10, "Episodes of each evaluation.")
flags.DEFINE_integer("eval_every", 0, "Evaluate every N environment steps (0: only at the end).")
flags.DEFINE_integer("checkpoint_every", 0, "Checkpoint every N environment steps (0: only at the end).")
flags.DEFINE_integer("qat_bits", None,
                     "Quantization-aware training of the policy network at N bits (2..8); default off.")
flags.DEFINE_integer("quant_delay", None,
                     "With --qat_bits: updates (gradient steps) of float training before fake quantization "
                     "starts; activation ranges are tracked during the delay.")
flags.DEFINE_string("preset", None,
                    "Named preset of the agent for --env instead of its default one, e.g. quarl "
                    "(DQN on gym:CartPole-v1 as QuaRL trained it); the same as --set=preset=NAME.")
flags.DEFINE_multi_string("set", [], "Agent config override key=value (repeatable), e.g. --set=learning_rate=1e-3.")
flags.DEFINE_bool("overwrite", False,
                  "Replace a qrl run already in --workdir: removes only the outputs its qrl-workdir.json lists.")
flags.DEFINE_bool("resume", False,
                  "Continue the run in --workdir from its newest intact checkpoint (same agent, env, seed and config; "
                  "--steps may grow). The replay buffer refills from scratch; host environments only.")
flags.DEFINE_integer("xla_threads", None,
                     "XLA:CPU thread pool size (default: 1 for vector observations, one per core for images).")
flags.DEFINE_bool("progress", True, "Show a progress bar (periodic one-line summaries when not on a terminal).")


FLAG_RANGES = {
    "steps": common.AT_LEAST_1, "seed": common.AT_LEAST_0, "num_envs": common.AT_LEAST_1,
    "eval_episodes": common.AT_LEAST_1, "eval_every": common.AT_LEAST_0, "checkpoint_every": common.AT_LEAST_0,
    "quant_delay": common.AT_LEAST_0, "xla_threads": common.AT_LEAST_0,
}


def run() -> None:
    workdir = common.require_workdir(FLAGS.workdir)
    common.check_flag_ranges(FLAG_RANGES)
    overrides = common.parse_overrides(FLAGS.set)
    train_options = {}
    if FLAGS.preset is not None:
        overrides[PRESET_KEY] = FLAGS.preset
    if FLAGS.qat_bits is not None:
        overrides["qat_bits"] = FLAGS.qat_bits
    if FLAGS.quant_delay is not None:
        if FLAGS.qat_bits is None:
            raise QrlInputError("--quant_delay needs --qat_bits")
        overrides["quant_delay"] = FLAGS.quant_delay
    if FLAGS.num_envs is not None:
        train_options["num_envs"] = FLAGS.num_envs
    results = runs.train_run(
        FLAGS.agent, FLAGS.env, FLAGS.steps, FLAGS.seed, workdir,
        overrides=overrides, overwrite=FLAGS.overwrite, resume=FLAGS.resume, xla_threads=FLAGS.xla_threads,
        eval_episodes=FLAGS.eval_episodes, eval_every=FLAGS.eval_every, checkpoint_every=FLAGS.checkpoint_every,
        progress=FLAGS.progress, **train_options,
    )
    final = results["final_eval"]
    print(
        f"{FLAGS.agent} on {FLAGS.env}: {results['env_steps']} steps at {results['steps_per_second']:.0f} steps/s; "
        f"final return {final['mean']:.1f} ± {final['std']:.1f} over {final['episodes']} episodes -> {FLAGS.workdir}"
    )


if __name__ == "__main__":
    common.run_entry_point(run)
