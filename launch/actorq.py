"""ActorQ: distributed actor-learner training with a full-precision learner and quantized actors.

    # every node in this process (threads): 2 int8 actors, D4PG on DM Control cartpole-balance
    python -m launch.actorq --agent=d4pg --env=dmc:cartpole-balance --num_actors=2 \\
        --actor_precision=int8 --max_seconds=600 --target_return=800 --workdir=runs/actorq_int8
    # the same with each node a Ray actor process (a local Ray; --ray_address=host:port joins a cluster)
    python -m launch.actorq --launcher=ray --agent=dqn --env=gym:CartPole-v1 --num_actors=2 \\
        --actor_precision=int8 --max_learner_steps=20000 --workdir=runs/actorq_dqn
    # QuaRL's ActorQ setup (2048^3 policy, MinSize limiter, items sampled 16 times, 4 actors, ...)
    python -m launch.actorq --preset=quarl --agent=d4pg --env=dmc:walker-stand --actor_precision=int8 \
        --max_seconds=3600 --workdir=runs/actorq_quarl
    # continue a run from its latest learner checkpoint
    python -m launch.actorq ... --workdir=runs/actorq_int8 --resume --max_seconds=1200

Writes config.json, metrics.csv, TensorBoard events (tb/), learner checkpoints (checkpoints/),
results.json (time to target, returns, throughput per node, runtime breakdown, bytes per
publish, CPU seconds, energy estimate) and breakdown.png.

Exit status: 0 done; 2 bad input (one `error:` line, before anything is written — or, for what
only a node can find, such as no intact checkpoint to resume from, as soon as it finds it); 1 a
node died or failed (one `error:` line naming the last checkpoint); 130 Ctrl-C or SIGTERM, after
every node stopped and the learner wrote a final checkpoint.
"""

import dataclasses
import signal
import sys

from absl import flags

from launch import common
from agents.actorq import run_actorq, with_preset
from qrl.distributed.launching import NodeFailure
from qrl.distributed.run import ActorQConfig
from qrl.errors import QrlInputError

FLAGS = flags.FLAGS
_DEFAULTS = ActorQConfig()
flags.DEFINE_string("agent", _DEFAULTS.agent, "Algorithm: dqn or d4pg.")
flags.DEFINE_string("env", _DEFAULTS.env, "Host environment id, e.g. dmc:walker-stand, gym:CartPole-v1.")
flags.DEFINE_integer("seed", _DEFAULTS.seed, "Seed of the learner, replay, actors' and evaluation environments.")
flags.DEFINE_string("workdir", None, "Directory for everything the run writes (required).")
flags.DEFINE_integer("num_actors", _DEFAULTS.num_actors, "Actors (each its own process under --launcher=ray).")
flags.DEFINE_integer("envs_per_actor", _DEFAULTS.envs_per_actor, "Environments each actor steps with one batched policy call.")
flags.DEFINE_string("actor_precision", _DEFAULTS.actor_precision, "Actors' policy precision: fp32, bf16, fp16 or int8.")
flags.DEFINE_string("learner_device", _DEFAULTS.learner_device,
                    "Where the learner's state and updates live: cpu, or gpu (needs make venv-cuda); actors stay on CPU.")
flags.DEFINE_list("actor_resources", [], "Custom Ray resources each actor requests, name:amount (e.g. actor_host:1): "
                  "a cluster places actors only on nodes started with them (ray start --resources).")
flags.DEFINE_string("actor_runtime", _DEFAULTS.actor_runtime,
                    "What runs the actors' policy: jax (jitted) or onnx (ONNX Runtime, fed each weight update).")
flags.DEFINE_string("comm_precision", None,
                    "Precision of weight publishes: fp32, fp16, bf16 or int8 (default: the actors' own; fp32 for fp32 actors).")
flags.DEFINE_bool("compress", _DEFAULTS.compress, "zlib-compress every weight publish.")
flags.DEFINE_string("actor_int8_scheme", _DEFAULTS.actor_int8_scheme,
                    "int8 actors' scheme: int8 (static scales calibrated by the learner at each publish, per-feature "
                    "observation scales, affine grids), int8-dyn, quarl_dyn8 (QuaRL's dynamic-range int8), "
                    "int8-obst-sym or int8-obst-sym-dyn (one symmetric scale per layer input).")
flags.DEFINE_integer("actor_update_period", _DEFAULTS.actor_update_period, "Actor steps between weight pulls.")
flags.DEFINE_bool("sync_pull", _DEFAULTS.sync_pull, "Actors wait for each pull instead of acting while it travels.")
flags.DEFINE_integer("publish_period", _DEFAULTS.publish_period, "Learner updates between weight publishes.")
flags.DEFINE_integer("insert_chunk", _DEFAULTS.insert_chunk, "Transitions per replay insert.")
flags.DEFINE_enum("rate_limiter", _DEFAULTS.rate_limiter, ["samples_per_insert", "min_size"],
                  "Replay pacing: a samples-per-insert ratio (learner and actors wait on each other), or QuaRL's "
                  "minimum size only (actors never wait).")
flags.DEFINE_integer("max_times_sampled", None, "Remove a transition after this many draws (QuaRL's scripts: 16); "
                     "a full replay then evicts its oldest. Default: never removed.")
flags.DEFINE_float("samples_per_insert", None, "Rate limiter ratio (default: the agent's gradient_steps*batch_size/train_freq).")
flags.DEFINE_integer("min_replay_size", None, "Transitions before the first sample (default: the agent's).")
flags.DEFINE_integer("replay_capacity", None, "Replay capacity (default: the agent's buffer_size).")
flags.DEFINE_bool("prioritized", _DEFAULTS.prioritized, "Proportional prioritized replay (Schaul et al. 2016).")
flags.DEFINE_float("exploration_first", None, "Actor 0's epsilon (dqn) or Gaussian sigma (d4pg); default: the agent's.")
flags.DEFINE_float("exploration_last", None, "The last actor's; actors in between are log-spaced.")
flags.DEFINE_enum("exploration_spacing", _DEFAULTS.exploration_spacing, ["log", "linear"],
                  "How exploration noise runs from the first actor to the last (linear may start at 0).")
flags.DEFINE_string("preset", None, "An ActorQ preset of the agent: quarl (QuaRL's ActorQ sizes, replay and settings; "
                    "see the README). Flags given on the command line and --set values override it.")
flags.DEFINE_float("eval_every_seconds", _DEFAULTS.eval_every_seconds, "Seconds between evaluations.")
flags.DEFINE_integer("eval_episodes", _DEFAULTS.eval_episodes, "Episodes per evaluation.")
flags.DEFINE_integer("max_eval_episode_steps", None, "Cap on each evaluation episode's steps.")
flags.DEFINE_integer("max_learner_steps", None, "Stop after this many learner updates.")
flags.DEFINE_integer("max_actor_steps", None, "Stop after this many environment steps over all actors.")
flags.DEFINE_float("max_seconds", None, "Stop after this many seconds.")
flags.DEFINE_float("target_return", None, "Stop once an evaluation of the fp32 policy reaches this return.")
flags.DEFINE_integer("checkpoint_every", _DEFAULTS.checkpoint_every, "Learner updates between checkpoints (0: only at the end).")
flags.DEFINE_string("launcher", _DEFAULTS.launcher, "inprocess (threads) or ray (a process per node).")
flags.DEFINE_string("ray_address", None, "host:port of a running Ray cluster to join (default: start a local Ray).")
flags.DEFINE_string("ray_bind_address", _DEFAULTS.ray_bind_address,
                    "IP address of this machine the local Ray's servers listen on and advertise (default loopback: "
                    "reachable from this machine only); joining a cluster, the address the driver is reached at.")
flags.DEFINE_float("learner_cpus", _DEFAULTS.learner_cpus, "Ray CPUs of the learner.")
flags.DEFINE_float("actor_cpus", _DEFAULTS.actor_cpus, "Ray CPUs of each actor.")
flags.DEFINE_float("evaluator_cpus", _DEFAULTS.evaluator_cpus, "Ray CPUs of the evaluator.")
flags.DEFINE_multi_string("set", [], "Agent config override key=value (repeatable), e.g. --set=batch_size=128.")
flags.DEFINE_bool("resume", False, "Continue the run in --workdir from its latest learner checkpoint.")
flags.DEFINE_bool("overwrite", False, "Replace a run already in --workdir.")


def _resources(items) -> dict:
    """`["name:amount", ...]` -> `{name: float(amount)}`; a malformed item is an input error."""
    resources = {}
    for item in items:
        name, _, amount = item.partition(":")
        try:
            resources[name.strip()] = float(amount)
        except ValueError:
            raise QrlInputError(f"--actor_resources: {item!r} is not name:amount") from None
    return resources


def config_from_flags() -> ActorQConfig:
    """The flags as a config; with --preset, the preset fills every setting not given on the
    command line (and its agent values sit beneath --set)."""
    config = _config_from_flag_values()
    if FLAGS.preset is None:
        return config
    explicit = [field.name for field in dataclasses.fields(ActorQConfig)
                if field.name in FLAGS and FLAGS[field.name].present]
    return with_preset(config, FLAGS.preset.strip().lower(), explicit)


def _config_from_flag_values() -> ActorQConfig:
    return ActorQConfig(
        agent=FLAGS.agent, env=FLAGS.env, seed=FLAGS.seed, num_actors=FLAGS.num_actors,
        envs_per_actor=FLAGS.envs_per_actor, actor_precision=FLAGS.actor_precision.strip().lower(),
        actor_runtime=FLAGS.actor_runtime.strip().lower(), learner_device=FLAGS.learner_device.strip().lower(),
        actor_resources=_resources(FLAGS.actor_resources),
        comm_precision=FLAGS.comm_precision.strip().lower() if FLAGS.comm_precision else None,
        compress=FLAGS.compress, actor_int8_scheme=FLAGS.actor_int8_scheme.strip().lower(),
        actor_update_period=FLAGS.actor_update_period, sync_pull=FLAGS.sync_pull, publish_period=FLAGS.publish_period,
        insert_chunk=FLAGS.insert_chunk, rate_limiter=FLAGS.rate_limiter, max_times_sampled=FLAGS.max_times_sampled,
        samples_per_insert=FLAGS.samples_per_insert,
        min_replay_size=FLAGS.min_replay_size, replay_capacity=FLAGS.replay_capacity, prioritized=FLAGS.prioritized,
        exploration_first=FLAGS.exploration_first, exploration_last=FLAGS.exploration_last,
        exploration_spacing=FLAGS.exploration_spacing,
        eval_every_seconds=FLAGS.eval_every_seconds, eval_episodes=FLAGS.eval_episodes,
        max_eval_episode_steps=FLAGS.max_eval_episode_steps, max_learner_steps=FLAGS.max_learner_steps,
        max_actor_steps=FLAGS.max_actor_steps, max_seconds=FLAGS.max_seconds, target_return=FLAGS.target_return,
        checkpoint_every=FLAGS.checkpoint_every, launcher=FLAGS.launcher, ray_address=FLAGS.ray_address,
        ray_bind_address=FLAGS.ray_bind_address,
        learner_cpus=FLAGS.learner_cpus, actor_cpus=FLAGS.actor_cpus, evaluator_cpus=FLAGS.evaluator_cpus,
        overrides=common.parse_overrides(FLAGS.set),
    )


def run() -> None:
    # SIGTERM ends the run like Ctrl-C: every node is stopped and no process is left behind.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    workdir = common.require_workdir(FLAGS.workdir)
    try:
        results = run_actorq(config_from_flags(), workdir, resume=FLAGS.resume, overwrite=FLAGS.overwrite)
    except KeyboardInterrupt:
        print("interrupted: every node stopped", file=sys.stderr)
        sys.exit(130)
    except NodeFailure as failure:
        print(f"error: {failure}", file=sys.stderr, flush=True)
        sys.exit(1)
    final, target = results["final_return"], results["time_to_target_seconds"]
    reached = f"target reached after {target:.1f} s; " if target is not None else ""
    print(
        f"{results['agent']} on {results['env']} with {results['num_actors']} {results['actor_precision']} actors: "
        f"{reached}stopped by {results['stop_reason']} after {results['wall_seconds']:.1f} s; "
        f"{results['counts']['actor_steps']} actor steps ({results['throughput']['actor_steps_per_second']:.0f}/s), "
        f"{results['counts']['learner_steps']} learner steps; final return fp32 {_fmt(final['fp32'])}, "
        f"{results['actor_precision']} {_fmt(final['actor'])} -> {workdir}"
    )


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:.1f}"


if __name__ == "__main__":
    common.run_entry_point(run)
