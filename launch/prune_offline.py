"""One single-shot pruning run: prune an offline agent's networks at initialization on offline
batches, train it under the fixed masks, evaluate, and account the pruned policy's memory.

    python -m launch.prune_offline --dataset=data/hopper-medium-qrl.hdf5 --algo=bc --pruner=snip \\
        --sparsity=0.95 --steps=100000 --seed=0 --workdir=runs/prune/hopper_bc_snip95

`--env` defaults to the dataset's metadata. What the workdir gets: `launch.prune_runs`.
"""

from absl import flags

from launch import common
from launch.prune_runs import PruneRun, run_prune_offline
from pruning import PruneSettings
from qrl.errors import QrlInputError

FLAGS = flags.FLAGS
flags.DEFINE_string("dataset", None, "A D4RL-format HDF5 file or a Minari dataset directory.")
flags.DEFINE_string("env", None, "Environment to evaluate in (default: the dataset's metadata).")
flags.DEFINE_string("algo", "bc", "Offline algorithm (agents.OFFLINE_AGENT_NAMES).")
flags.DEFINE_string("pruner", "snip", "snip, grasp, synflow, magnitude, random or none.")
flags.DEFINE_float("sparsity", 0.95, "Fraction of each network's prunable weights removed, in [0, 1).")
flags.DEFINE_enum("scope", "network", ["network", "layer", "global"], "Where the score threshold applies.")
flags.DEFINE_list("separate", [], "Sub-networks thresholded on their own at network scope, e.g. vae/encoder,vae/decoder.")
flags.DEFINE_integer("prune_batches", 1, "Offline batches the scores are computed on.")
flags.DEFINE_integer("prune_batch_size", 256, "Transitions per scoring batch.")
flags.DEFINE_float("temperature", 1.0, "GraSP's temperature: network outputs divided by it in the scoring loss "
                   "(the reference's default: 200).")
flags.DEFINE_bool("reinit", False, "GraSP's reinit: score a copy whose dense kernels are redrawn from Xavier normal "
                  "(the reference's default); the masks apply to the weights that train.")
flags.DEFINE_integer("iterations", 1, "Rounds of SNIP / GraSP scoring, each re-scoring the masked network, reaching "
                     "--sparsity in the last (1: single shot).")
flags.DEFINE_enum("vae", None, ["separate", "joint", "dense"],
                  "How a VAE (BCQ's) is pruned: encoder and decoder each with its own threshold (default for "
                  "snip, grasp, magnitude at network scope), one threshold over the VAE, or not at all.")
flags.DEFINE_bool("include_biases", False, "Prune biases too (default: weights only).")
flags.DEFINE_list("exclude_layers", [], "Layer paths never pruned, e.g. torso/dense_0,head (first/last layers).")
flags.DEFINE_integer("min_kept_per_layer", 1, "Layer-collapse guard: weights every prunable layer keeps.")
flags.DEFINE_enum("random_distribution", "uniform", ["uniform", "erk"], "Per-layer densities of --pruner=random.")
flags.DEFINE_bool("score_separate_init", False,
                  "Score a separately initialized copy (the reference codes) instead of the weights that train.")
flags.DEFINE_string("masks_from", None, "Reuse the masks of an earlier run directory instead of pruning.")
flags.DEFINE_integer("steps", 100_000, "Gradient steps.")
flags.DEFINE_integer("seed", 0, "Seed of initialization, scoring batches, training and evaluation.")
flags.DEFINE_string("workdir", None, "Run directory.")
flags.DEFINE_integer("eval_every", 5_000, "Evaluate every N gradient steps (0: only at the end).")
flags.DEFINE_integer("eval_episodes", 10, "Episodes per evaluation.")
flags.DEFINE_multi_string("set", [], "Algorithm config override key=value (repeatable).")
flags.DEFINE_bool("overwrite", False, "Replace a run already in --workdir.")
flags.DEFINE_bool("progress", True, "Show a progress bar (periodic summaries when not on a terminal).")


FLAG_RANGES = {
    "sparsity": common.FRACTION_BELOW_1, "temperature": common.POSITIVE, "iterations": common.AT_LEAST_1, "prune_batches": common.AT_LEAST_1,
    "prune_batch_size": common.AT_LEAST_1, "min_kept_per_layer": common.AT_LEAST_0, "steps": common.AT_LEAST_1,
    "seed": common.AT_LEAST_0, "eval_every": common.AT_LEAST_0, "eval_episodes": common.AT_LEAST_1,
}


def run() -> None:
    if not FLAGS.dataset:
        raise QrlInputError("--dataset is required")
    workdir = common.require_workdir(FLAGS.workdir)
    common.check_flag_ranges(FLAG_RANGES)
    settings = PruneSettings(
        sparsity=FLAGS.sparsity, scope=FLAGS.scope, temperature=FLAGS.temperature,
        include_biases=FLAGS.include_biases, exclude=tuple(FLAGS.exclude_layers),
        min_kept_per_layer=FLAGS.min_kept_per_layer, random_distribution=FLAGS.random_distribution,
        separate=tuple(FLAGS.separate), iterations=FLAGS.iterations, reinit=FLAGS.reinit,
    )
    run_prune_offline(PruneRun(
        dataset=FLAGS.dataset, algo=FLAGS.algo, pruner=FLAGS.pruner, settings=settings, env=FLAGS.env,
        overrides=common.parse_overrides(FLAGS.set), prune_batches=FLAGS.prune_batches,
        prune_batch_size=FLAGS.prune_batch_size, score_separate_init=FLAGS.score_separate_init,
        masks_from=FLAGS.masks_from, vae=FLAGS.vae, steps=FLAGS.steps, seed=FLAGS.seed, eval_every=FLAGS.eval_every,
        eval_episodes=FLAGS.eval_episodes,
    ), workdir, overwrite=FLAGS.overwrite, progress=FLAGS.progress)


if __name__ == "__main__":
    common.run_entry_point(run)
