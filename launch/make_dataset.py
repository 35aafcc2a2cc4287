"""Generate a D4RL-style offline dataset: train SAC once per env (resumable, checkpointed), then
sample a level from it and write D4RL HDF5 or a Minari dataset.

    python -m launch.make_dataset --env=gym:Hopper-v5 --level=medium --size=1000000 \\
        --out=data/hopper-medium-qrl.hdf5
    python -m launch.make_dataset --env=gym:Hopper-v5 --level=expert --size=1000000 \\
        --format=minari --out=data/minari          # -> data/minari/qrl/hopper/expert-v0

Every level of one env and seed shares the SAC run in `--workdir` (default
`runs/make_dataset/<env>-seed<seed>`): the first call trains it, later calls only sample, and an
interrupted call resumes. `--level=random` trains nothing: it samples the initialization at once
(the expert reference is filled in once SAC has been trained, see `qrl.datasets.generate`). See `qrl.datasets.generate` for the recipe and the files.
"""

import os
import re
import sys
import time

from absl import flags

from launch import common
from qrl import runtime, workdirs
from qrl.datasets import d4rl, generate, minari_io
from qrl.datasets.writers import write_d4rl_hdf5
from qrl.errors import QrlInputError

FLAGS = flags.FLAGS
flags.DEFINE_string("env", None, "Continuous-action env id, e.g. gym:HalfCheetah-v5, gym:Hopper-v5, gym:Walker2d-v5.")
flags.DEFINE_enum("level", None, list(generate.LEVELS), "Dataset level (D4RL's names).")
flags.DEFINE_integer("size", 1_000_000, "Transitions to collect (medium-replay: the most recent N training "
                     "steps up to the medium checkpoint; 0 = all of them).")
flags.DEFINE_string("out", None, "d4rl: the HDF5 file to write; minari: the datasets root.")
flags.DEFINE_enum("format", "d4rl", ["d4rl", "minari"], "Output format.")
flags.DEFINE_string("dataset_id", None, "Minari dataset id (default qrl/<env>/<level>-v0).")
flags.DEFINE_string("workdir", None, "Where the shared SAC run lives (default runs/make_dataset/<env>-seed<seed>).")
flags.DEFINE_integer("seed", 0, "Seed of the SAC run (collection seeds derive from it).")
flags.DEFINE_integer("sac_steps", 1_000_000, "SAC training steps (D4RL's expert: 1M).")
flags.DEFINE_integer("checkpoint_every", 10_000, "SAC checkpoint spacing in steps (candidates for medium).")
flags.DEFINE_integer("eval_episodes", 5, "Sampled episodes evaluating each checkpoint.")
flags.DEFINE_integer("reference_episodes", generate.REFERENCE_EPISODES,
                     "Episodes of the random and expert reference returns (D4RL: 100).")
flags.DEFINE_integer("num_envs", 10, "Environments stepped together while collecting.")
flags.DEFINE_float("medium_fraction", generate.MEDIUM_FRACTION,
                   "Medium = the checkpoint closest to random + fraction * (expert - random).")
flags.DEFINE_multi_string("set", [], "SAC config override key=value (repeatable), e.g. --set=matmul_dtype=bf16.")
flags.DEFINE_bool("overwrite", False, "Replace an existing --out file (d4rl) or dataset (minari), once the new one "
                  "is complete.")
flags.DEFINE_string("bundle_out", None, "Also write the trained run's bundle here (a new directory: training.json, "
                    "the medium and final policies, the training steps up to medium), from which --workdir=DIR "
                    "collects every level without training.")
flags.DEFINE_bool("progress", True, "Show progress (periodic one-line summaries when not on a terminal).")


def env_slug(env_id: str) -> str:
    """`gym:HalfCheetah-v5` -> `halfcheetah`: the name part, lower case, version dropped."""
    name = env_id.split(":", 1)[-1]
    return re.sub(r"[^a-z0-9]+", "", re.sub(r"-v\d+$", "", name.lower())) or "env"


def _destination(level: str) -> tuple[str, str]:
    """(path to check for existence, minari dataset id or ''), every check done before anything
    is written: the d4rl file is no directory, the minari root no file, the dataset id resolves
    inside the root, and the location can be created."""
    out = os.path.abspath(FLAGS.out)
    if FLAGS.format == "d4rl":
        if os.path.isdir(out):
            raise QrlInputError(f"--out={FLAGS.out} is a directory; the d4rl format writes one HDF5 file")
        workdirs.check_path(os.path.dirname(out), "--out")
        return out, ""
    if os.path.lexists(out) and not os.path.isdir(out):
        raise QrlInputError(f"--out={FLAGS.out} is a file; the minari format writes under a datasets root directory")
    dataset_id = FLAGS.dataset_id or f"qrl/{env_slug(FLAGS.env)}/{level}-v0"
    try:
        destination = minari_io.dataset_directory(out, dataset_id)
    except QrlInputError as error:
        raise QrlInputError(f"--dataset_id: {error}") from None
    workdirs.check_path(os.path.dirname(destination), "--out")
    return destination, dataset_id


def _check_numbers() -> None:
    """The numeric flags in range, before anything is built or written."""
    if FLAGS.size < 0 or (FLAGS.size == 0 and FLAGS.level != "medium-replay"):
        raise QrlInputError(f"--size must be >= 1 (0 only for medium-replay), got {FLAGS.size}")
    common.check_flag_ranges({
        **{name: common.AT_LEAST_1 for name in ("sac_steps", "checkpoint_every", "eval_episodes",
                                                 "reference_episodes", "num_envs")},
        "medium_fraction": common.Range(minimum=0, maximum=1, open_minimum=True, open_maximum=True),
    })


def _say(message: str) -> None:
    print(message, flush=True)


def run() -> None:
    from agents import sac

    if not FLAGS.env or not FLAGS.level or not FLAGS.out:
        raise QrlInputError("--env, --level and --out are required")
    _check_numbers()
    destination, dataset_id = _destination(FLAGS.level)
    if os.path.lexists(destination) and not FLAGS.overwrite:
        raise QrlInputError(f"{destination} exists; pass --overwrite to replace it")
    workdir = FLAGS.workdir or os.path.join("runs", "make_dataset", f"{env_slug(FLAGS.env)}-seed{FLAGS.seed}")
    workdirs.check_path(workdir, "--workdir")
    if FLAGS.bundle_out is not None:
        workdirs.check_path(FLAGS.bundle_out, "--bundle_out")
        if os.path.lexists(FLAGS.bundle_out):
            raise QrlInputError(f"--bundle_out {FLAGS.bundle_out} exists; a bundle is written into a new directory")
    runtime.configure_jax(1)  # SAC on vector observations: one XLA thread (qrl.runtime)
    config = sac.config_for(FLAGS.env, common.parse_overrides(FLAGS.set))
    behavior = generate.BehaviorRun(
        sac.AGENT, config, FLAGS.env, FLAGS.sac_steps, FLAGS.seed, workdir, checkpoint_every=FLAGS.checkpoint_every,
        eval_episodes=FLAGS.eval_episodes, reference_episodes=FLAGS.reference_episodes,
        medium_fraction=FLAGS.medium_fraction,
    )
    started = time.perf_counter()
    needs_training = FLAGS.level != "random" or FLAGS.bundle_out is not None  # random samples the initialization
    if needs_training and not behavior.trained and FLAGS.progress:
        done = behavior.record["checkpoints"][-1]["step"] if behavior.record["checkpoints"] else 0
        _say(f"training SAC on {FLAGS.env} for {FLAGS.sac_steps} steps in {workdir}"
             + (f" (resuming at step {done})" if done else ""))
    if needs_training or behavior.trained:
        behavior.train(progress=FLAGS.progress)
    if FLAGS.bundle_out is not None:
        written = behavior.write_bundle(FLAGS.bundle_out)
        print(f"bundle of the SAC run ({len(written)} files) -> {FLAGS.bundle_out}")
    references = behavior.known_references()
    arrays = behavior.level_arrays(FLAGS.level, FLAGS.size or None, num_envs=FLAGS.num_envs,
                                   progress=_say if FLAGS.progress else None)
    stored = arrays.pop("metadata")
    metadata = {key: d4rl.metadata_value(stored, key) for key in stored}
    if FLAGS.format == "d4rl":
        write_d4rl_hdf5(destination, arrays, metadata)
    else:
        minari_io.write_minari(arrays, os.path.abspath(FLAGS.out), dataset_id, FLAGS.env, metadata,
                               overwrite=FLAGS.overwrite)
    if "expert" not in references:
        print(f"note: no expert reference yet (SAC in {workdir} is not trained), so normalized scores of this "
              "dataset are undefined; any other level trains SAC, after which this command fills the reference in "
              "(pass --overwrite to rewrite --out)", file=sys.stderr)
    elif not references["expert"]["return_mean"] > references["random"]["return_mean"]:
        print(f"warning: the expert's return ({references['expert']['return_mean']:.1f}) does not exceed the random "
              f"policy's ({references['random']['return_mean']:.1f}); normalized scores are undefined: train longer "
              "(--sac_steps)", file=sys.stderr)
    expert = f"{references['expert']['return_mean']:.1f}" if "expert" in references else "not measured yet"
    print(f"{FLAGS.level} {FLAGS.env}: {len(arrays['rewards'])} transitions, policy return "
          f"{metadata['policy_return']:.1f} (random {references['random']['return_mean']:.1f}, expert "
          f"{expert}) -> {destination} [{time.perf_counter() - started:.0f} s]")


if __name__ == "__main__":
    common.run_entry_point(run)
