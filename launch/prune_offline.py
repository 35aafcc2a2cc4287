"""One single-shot pruning run: prune an offline agent's networks at initialization on offline
batches, train it under the fixed masks, evaluate, and account the pruned policy's memory.

    python -m launch.prune_offline --dataset=data/hopper-medium-qrl.hdf5 --algo=bc --pruner=snip \\
        --sparsity=0.95 --steps=100000 --seed=0 --workdir=runs/prune/hopper_bc_snip95

`--env` defaults to the dataset's metadata. The workdir gets `config.json`, `masks.msgpack`
(every network's mask), `metrics.csv` / TensorBoard, checkpoints, the pruned policy in CSR
(`policy_csr_fp32.msgpack`, `policy_csr_int8.msgpack`) and `results.json`: normalized score and
returns, kept fraction overall and per layer for every network, and the policy's bytes in every
sparse format against dense fp32 and PyTorch-style COO.
"""

import os

import jax
import numpy as np
from absl import flags
from flax import serialization

import qrl
from launch import common
from launch.runs import prepare_workdir
from pruning import PruneSettings, check_mask, layer_kept_fractions, mask_from_arrays, mask_to_arrays, prune_networks
from pruning import kept_fraction, sparse
from qrl import io, offline, runtime
from qrl.datasets import d4rl, files, from_qlearning, normalize_observations, sample
from qrl.errors import QrlInputError
from qrl.networks.continuous import bounds as action_bounds
from qrl.replay import Transition

FLAGS = flags.FLAGS
flags.DEFINE_string("dataset", None, "A D4RL-format HDF5 file or a Minari dataset directory.")
flags.DEFINE_string("env", None, "Environment to evaluate in (default: the dataset's metadata).")
flags.DEFINE_string("algo", "bc", "Offline algorithm (agents.OFFLINE_AGENT_NAMES).")
flags.DEFINE_string("pruner", "snip", "snip, grasp, synflow, magnitude, random or none.")
flags.DEFINE_float("sparsity", 0.95, "Fraction of each network's prunable weights removed, in [0, 1).")
flags.DEFINE_enum("scope", "network", ["network", "layer", "global"], "Where the score threshold applies.")
flags.DEFINE_integer("prune_batches", 1, "Offline batches the scores are computed on.")
flags.DEFINE_integer("prune_batch_size", 256, "Transitions per scoring batch.")
flags.DEFINE_float("temperature", 1.0, "GraSP's temperature (network outputs divided by it in the scoring loss).")
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

MASKS_FILE = "masks.msgpack"


def scoring_batches(dataset, count: int, batch_size: int, seed: int, normalize: bool) -> list[Transition]:
    """`count` batches `[B, ...]` drawn uniformly from the dataset (observations normalized as the
    agent trains on them when `normalize`)."""
    for name, value in (("prune_batches", count), ("prune_batch_size", batch_size)):
        if value < 1:
            raise QrlInputError(f"--{name} must be >= 1, got {value}")
    drawn = sample(dataset, jax.random.PRNGKey(seed), batch_size, count)
    if normalize:
        drawn = drawn.replace(observation=normalize_observations(dataset, drawn.observation),
                              next_observation=normalize_observations(dataset, drawn.next_observation))
    return [jax.tree.map(lambda values, index=index: values[index], drawn) for index in range(count)]


def load_masks(run_dir: str, networks: dict) -> dict:
    """The masks a previous run saved, checked against this run's networks."""
    path = os.path.join(run_dir, MASKS_FILE)
    if not os.path.isfile(path):
        raise QrlInputError(f"--masks_from={run_dir}: no {MASKS_FILE} there")
    try:
        stored = serialization.msgpack_restore(open(path, "rb").read())
    except Exception:
        raise QrlInputError(f"{path}: corrupt masks file") from None
    unknown = sorted(set(stored) - set(networks))
    if unknown:
        raise QrlInputError(f"{path}: masks for networks this algorithm does not have: {', '.join(unknown)}")
    masks = {}
    for name, params in networks.items():
        masks[name] = None if name not in stored else mask_from_arrays(stored[name], params)
        if masks[name] is not None:
            check_mask(params, masks[name], where=f"{path} ({name})")
    return masks


def mask_summary(masks: dict) -> dict:
    return {name: None if mask is None else {"kept_fraction": kept_fraction(mask), "layers": layer_kept_fractions(mask)}
            for name, mask in masks.items()}


def run() -> None:
    from agents import OFFLINE_AGENT_NAMES, get_offline_agent

    if not FLAGS.dataset:
        raise QrlInputError("--dataset is required")
    workdir = common.require_workdir(FLAGS.workdir)
    settings = PruneSettings(
        sparsity=FLAGS.sparsity, scope=FLAGS.scope, temperature=FLAGS.temperature,
        include_biases=FLAGS.include_biases, exclude=tuple(FLAGS.exclude_layers),
        min_kept_per_layer=FLAGS.min_kept_per_layer, random_distribution=FLAGS.random_distribution,
    )
    settings.check(FLAGS.pruner)
    if FLAGS.algo not in OFFLINE_AGENT_NAMES:
        raise QrlInputError(f"unknown offline algorithm {FLAGS.algo!r}; known: {', '.join(OFFLINE_AGENT_NAMES)}")
    algo = get_offline_agent(FLAGS.algo)
    config = algo.config_for(common.parse_overrides(FLAGS.set))
    arrays = files.read_steps(FLAGS.dataset)
    metadata = arrays.get("metadata", {})
    env_id = FLAGS.env or files.env_id(metadata)
    if not env_id:
        raise QrlInputError(f"{FLAGS.dataset} names no environment: pass --env")
    reference, reference_source = files.reference_returns(FLAGS.dataset, metadata)
    if reference is not None and not reference[1] > reference[0]:
        reference, reference_source = None, None
    runtime.configure_jax(1)
    dataset = from_qlearning(d4rl.qlearning_arrays(arrays))
    observation_spec, action_spec = offline.env_specs(env_id)
    offline.check_dataset_matches_env(dataset, observation_spec, action_spec, env_id)
    bounds = action_bounds(action_spec)
    observation_size = int(observation_spec.shape[-1])

    dense = algo.build(config, observation_spec, action_spec)
    scored_state = dense.init(jax.random.PRNGKey(FLAGS.seed + (1 if FLAGS.score_separate_init else 0)))
    networks = algo.learning.networks_at_init(scored_state)
    if FLAGS.masks_from:
        masks = load_masks(FLAGS.masks_from, networks)
    else:
        batches = scoring_batches(dataset, FLAGS.prune_batches, FLAGS.prune_batch_size, FLAGS.seed,
                                  bool(getattr(config, "normalize_observations", False)))
        synflow = getattr(algo.learning, "synflow_inputs", None)
        masks = prune_networks(
            FLAGS.pruner, networks, algo.learning.scoring_losses(config, bounds, scored_state), batches, settings,
            key=jax.random.PRNGKey(FLAGS.seed + 2),
            synflow_inputs=synflow(config, bounds, observation_size) if synflow else None,
        )
    prepare_workdir(workdir, FLAGS.overwrite)
    run_config = {
        "dataset": os.path.abspath(FLAGS.dataset), "env": env_id, "algo": FLAGS.algo, "pruner": FLAGS.pruner,
        "settings": settings, "prune_batches": FLAGS.prune_batches, "prune_batch_size": FLAGS.prune_batch_size,
        "score_separate_init": FLAGS.score_separate_init, "masks_from": FLAGS.masks_from, "steps": FLAGS.steps,
        "seed": FLAGS.seed, "agent_config": config.to_dict(), "reference_returns": reference,
        "reference_source": reference_source, "qrl_version": qrl.__version__,
    }
    io.atomic_write_json(os.path.join(workdir, "config.json"), run_config)
    io.atomic_write_bytes(os.path.join(workdir, MASKS_FILE), serialization.msgpack_serialize(
        {name: mask_to_arrays(mask) for name, mask in masks.items() if mask is not None}))

    state, results = algo.train(
        dataset, env_id, config, FLAGS.steps, FLAGS.seed, workdir=workdir,
        mask={name: mask for name, mask in masks.items() if mask is not None} or None,
        eval_every=FLAGS.eval_every, eval_episodes=FLAGS.eval_episodes, reference=reference,
        progress=FLAGS.progress,
    )
    policy_params = dense.policy_params(state)
    policy_mask = masks.get("actor")
    if policy_mask is None:  # an unpruned policy: every weight kept, for the same accounting
        policy_mask = jax.tree.map(lambda leaf: np.ones(np.shape(leaf), bool) if np.ndim(leaf) >= 2 else None,
                                   policy_params)
    memory = sparse.memory_table(policy_params, policy_mask)
    for precision in sparse.PRECISIONS:
        blob = sparse.export_sparse(policy_params, policy_mask, "csr", precision)
        io.atomic_write_bytes(os.path.join(workdir, f"policy_csr_{precision}.msgpack"), sparse.to_bytes(blob))
    results = {"config": run_config, **results, "masks": mask_summary(masks), "policy_memory": memory}
    io.atomic_write_json(os.path.join(workdir, "results.json"), results)
    final, score = results["final_eval"], results.get("normalized_score")
    best = min(memory[2:], key=lambda row: row["bytes"])
    print(f"{FLAGS.algo} {FLAGS.pruner} at sparsity {FLAGS.sparsity:g} on {env_id}: return {final['mean']:.1f} ± "
          f"{final['std']:.1f}" + (f", normalized {score['mean']:.1f}" if score else "")
          + f"; policy {best['bytes']} bytes as {best['format']} {best['precision']} "
          f"({best['vs_dense_fp32']:.3f}× dense fp32) -> {workdir}")


if __name__ == "__main__":
    common.run_entry_point(run)
