"""One single-shot pruning run as a library call: `launch.prune_offline` parses flags into a
`PruneRun`, `launch.prune_study` runs one per cell.

    results = run_prune_offline(PruneRun(dataset="data/hopper-medium-qrl.hdf5", algo="bc",
                                         pruner="snip", settings=PruneSettings(sparsity=0.95)), workdir)

The workdir gets `config.json`, `masks.msgpack` (every network's mask), `metrics.csv` /
TensorBoard, checkpoints, the pruned policy in CSR (`policy_csr_fp32.msgpack`,
`policy_csr_int8.msgpack`) and, last, `results.json`: normalized score and returns, kept fraction
overall and per layer for every network, and the policy's bytes in every sparse format against
dense fp32 and PyTorch-style COO.
"""

import dataclasses
import os
from typing import Any, Mapping, Optional, Sequence

import jax
import numpy as np
from flax import serialization

import qrl
from pruning import PruneSettings, check_mask, kept_fraction, layer_kept_fractions, mask_from_arrays, mask_to_arrays
from pruning import check_separate_paths, prune_networks, sparse, subtree_at
from qrl import io, offline, runtime, workdirs
from qrl.datasets import d4rl, files, from_qlearning, normalize_observations, sample
from qrl.checkpointing import Checkpointer
from qrl.errors import QrlInputError
from qrl.logging import MetricsLogger
from qrl.networks.continuous import bounds as action_bounds
from qrl.replay import Transition

MASKS_FILE = "masks.msgpack"
RESULTS_FILE = "results.json"
VAE_PARTS = ("vae/encoder", "vae/decoder")
# How an agent's VAE (BCQ's) is pruned: "separate" — the encoder and the decoder each at the
# sparsity with its own threshold (the default where the pruner thresholds scores over a network:
# SNIP, GraSP, magnitude at network scope); "joint" — one threshold over the whole VAE (the
# reference pruning code's per-network threshold); "dense" — the VAE is not pruned (the paper does
# not say whether it prunes BCQ's VAE).
VAE_MODES = ("separate", "joint", "dense")


@dataclasses.dataclass(frozen=True)
class PruneRun:
    """What one run does: the dataset (`env` defaults to its metadata), the offline algorithm and
    its config overrides, the pruner and its settings, the scoring data (`prune_batches` ×
    `prune_batch_size`), whether scores come from a separately initialized copy (the reference
    codes) or the weights that train, how a VAE is pruned (`vae`, one of `VAE_MODES`; None: the
    default, only for agents with a VAE), masks reused from an earlier run, and the training
    budget."""

    dataset: str
    algo: str = "bc"
    pruner: str = "snip"
    settings: PruneSettings = PruneSettings()
    env: Optional[str] = None
    overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    prune_batches: int = 1
    prune_batch_size: int = 256
    score_separate_init: bool = False
    masks_from: Optional[str] = None
    vae: Optional[str] = None
    steps: int = 100_000
    seed: int = 0
    eval_every: int = 5_000
    eval_episodes: int = 10


def scoring_batches(dataset, count: int, batch_size: int, seed: int, normalize: bool) -> list[Transition]:
    """`count` batches `[B, ...]` drawn uniformly from the dataset (observations normalized as the
    agent trains on them when `normalize`)."""
    for name, value in (("prune_batches", count), ("prune_batch_size", batch_size)):
        if value < 1:
            raise QrlInputError(f"{name} must be >= 1, got {value}")
    drawn = sample(dataset, jax.random.PRNGKey(seed), batch_size, count)
    if normalize:
        drawn = drawn.replace(observation=normalize_observations(dataset, drawn.observation),
                              next_observation=normalize_observations(dataset, drawn.next_observation))
    return [jax.tree.map(lambda values, index=index: values[index], drawn) for index in range(count)]


def load_masks(run_dir: str, networks: dict) -> dict:
    """The masks a previous run saved, checked against this run's networks."""
    path = os.path.join(run_dir, MASKS_FILE)
    if not os.path.isfile(path):
        raise QrlInputError(f"masks_from={run_dir}: no {MASKS_FILE} there")
    try:
        with open(path, "rb") as handle:
            stored = serialization.msgpack_restore(handle.read())
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


def read_masks(run_dir: str) -> dict:
    """`{network: nested uint8 arrays}` as a run saved them (for mask overlap between runs)."""
    with open(os.path.join(run_dir, MASKS_FILE), "rb") as handle:
        return serialization.msgpack_restore(handle.read())


def mask_summary(masks: dict) -> dict:
    return {name: None if mask is None else {"kept_fraction": kept_fraction(mask), "layers": layer_kept_fractions(mask)}
            for name, mask in masks.items()}


def _all_kept(params) -> Any:
    """A mask keeping every weight (ndim >= 2, not biases): the accounting of an unpruned network."""
    def flag(path, leaf):
        name = jax.tree_util.keystr(path, simple=True, separator="/")
        return np.ones(np.shape(leaf), bool) if np.ndim(leaf) >= 2 and not name.endswith("bias") else None

    return jax.tree_util.tree_map_with_path(flag, params)


@dataclasses.dataclass(frozen=True)
class PreparedRun:
    """A `PruneRun` read and checked, nothing written: its algorithm, config (with what the
    dataset and budget fill in), dataset, environment and its specs, reference returns, and the
    networks at initialization the pruner scores."""

    algo: Any
    config: Any
    dataset: Any
    env_id: str
    observation_spec: Any
    action_spec: Any
    reference: Optional[tuple[float, float]]
    reference_source: Optional[str]
    scored_state: Any
    networks: dict
    settings: PruneSettings
    vae: Optional[str]


def vae_settings(run: PruneRun, networks: Mapping[str, Any]) -> tuple[PruneSettings, Optional[str]]:
    """The settings the pruner runs with and the VAE mode in force (None: no VAE): "separate"
    adds the encoder and decoder to `settings.separate` (default where the pruner thresholds a
    network's scores); a VAE option on an agent without a VAE is an input error."""
    if "vae" not in networks:
        if run.vae is not None:
            raise QrlInputError(f"vae={run.vae} applies to agents with a VAE (bcq), not {run.algo}")
        return run.settings, None
    if run.vae is not None and run.vae not in VAE_MODES:
        raise QrlInputError(f"unknown vae mode {run.vae!r}; known: {', '.join(VAE_MODES)}")
    settings = run.settings
    if run.pruner == "none":
        return settings, run.vae
    thresholds_networks = run.pruner in ("snip", "grasp", "magnitude") and settings.scope == "network"
    mode = run.vae or ("separate" if thresholds_networks else "joint")
    named = [path for path in settings.separate if path == "vae" or path.startswith("vae/")]
    if named and mode != "separate":
        raise QrlInputError(f"vae={mode} contradicts separate={','.join(named)}")
    if mode == "separate" and not named:
        if not thresholds_networks:
            raise QrlInputError("vae=separate thresholds the encoder and decoder on their own: it applies to snip, "
                                f"grasp and magnitude at network scope, not {run.pruner} at {settings.scope} scope")
        settings = dataclasses.replace(settings, separate=tuple(settings.separate) + VAE_PARTS)
    return settings, mode


def prepare_run(run: PruneRun, shared: Optional[PreparedRun] = None) -> PreparedRun:
    """Reads and checks everything `run` needs (settings, algorithm, config overrides, budget,
    dataset against its environment, separate sub-network paths) without writing anything.
    `shared`: an earlier run's preparation on the same dataset, algorithm, overrides and budget,
    whose dataset, config and specs this run reuses instead of reading them again."""
    from agents import OFFLINE_AGENT_NAMES, get_offline_agent

    run.settings.check(run.pruner)
    if shared is None:
        if run.algo not in OFFLINE_AGENT_NAMES:
            raise QrlInputError(f"unknown offline algorithm {run.algo!r}; known: {', '.join(OFFLINE_AGENT_NAMES)}")
        offline.check_count("steps", run.steps)
        offline.check_count("eval_every", run.eval_every, minimum=0)
        offline.check_count("eval_episodes", run.eval_episodes)
        algo = get_offline_agent(run.algo)
        config = algo.config_for(dict(run.overrides))
        arrays = files.read_steps(run.dataset)
        metadata = arrays.get("metadata", {})
        env_id = run.env or files.env_id(metadata)
        if not env_id:
            raise QrlInputError(f"{run.dataset} names no environment: pass an env")
        reference, reference_source = files.reference_returns(run.dataset, metadata)
        if reference is not None and not reference[1] > reference[0]:
            reference, reference_source = None, None
        runtime.configure_jax(1)
        dataset = from_qlearning(d4rl.qlearning_arrays(arrays))
        observation_spec, action_spec = offline.env_specs(env_id)
        offline.check_dataset_matches_env(dataset, observation_spec, action_spec, env_id)
        if hasattr(algo, "config_for_run"):  # what the dataset and budget fill in (IQL's reward scale, schedule)
            config = algo.config_for_run(config, dataset, run.steps)
    else:
        algo, config, dataset, env_id = shared.algo, shared.config, shared.dataset, shared.env_id
        observation_spec, action_spec = shared.observation_spec, shared.action_spec
        reference, reference_source = shared.reference, shared.reference_source
    if run.prune_batch_size > dataset.size:
        raise QrlInputError(f"prune_batch_size={run.prune_batch_size} is larger than the dataset "
                            f"({dataset.size} transitions)")
    dense = algo.build(config, observation_spec, action_spec)
    scored_state = dense.init(jax.random.PRNGKey(run.seed + (1 if run.score_separate_init else 0)))
    networks = algo.learning.networks_at_init(scored_state)
    settings, vae = vae_settings(run, networks)
    settings.check(run.pruner)
    check_separate_paths(settings.separate, networks)
    return PreparedRun(algo, config, dataset, env_id, observation_spec, action_spec, reference, reference_source,
                       scored_state, networks, settings, vae)


def run_masks(run: PruneRun, prepared: PreparedRun) -> dict:
    """`{network: mask or None}` of `run`: reused from `masks_from`, or computed by its pruner on
    its scoring batches (a VAE left dense under `vae=dense`)."""
    networks = prepared.networks
    if run.masks_from:
        return load_masks(run.masks_from, networks)
    config = prepared.config
    bounds = action_bounds(prepared.action_spec)
    batches = scoring_batches(prepared.dataset, run.prune_batches, run.prune_batch_size, run.seed,
                              bool(getattr(config, "normalize_observations", False)))
    synflow = getattr(prepared.algo.learning, "synflow_inputs", None)
    pruned = {name: params for name, params in networks.items() if not (name == "vae" and prepared.vae == "dense")}
    masks = prune_networks(
        run.pruner, pruned, prepared.algo.learning.scoring_losses(config, bounds, prepared.scored_state), batches,
        prepared.settings, key=jax.random.PRNGKey(run.seed + 2),
        synflow_inputs=synflow(config, bounds, int(prepared.observation_spec.shape[-1])) if synflow else None,
    )
    return {name: masks.get(name) for name in networks}


def _start_cell(run: PruneRun, prepared: PreparedRun, masks: dict, workdir: str, overwrite: bool) -> dict:
    """Claims `workdir` and writes the run's `config.json` and masks; returns the run config."""
    workdirs.claim(workdir, "prune_offline", overwrite)
    run_config = {
        **dataclasses.asdict(run), "dataset": os.path.abspath(run.dataset), "env": prepared.env_id,
        "pruned_with": dataclasses.asdict(prepared.settings), "vae_mode": prepared.vae,
        "agent_config": prepared.config.to_dict(), "reference_returns": prepared.reference,
        "reference_source": prepared.reference_source, "qrl_version": qrl.__version__,
    }
    io.atomic_write_json(os.path.join(workdir, "config.json"), run_config)
    io.atomic_write_bytes(os.path.join(workdir, MASKS_FILE), serialization.msgpack_serialize(
        {name: mask_to_arrays(mask) for name, mask in masks.items() if mask is not None}))
    return run_config


def _finish_cell(run: PruneRun, prepared: PreparedRun, masks: dict, state: Any, results: dict, run_config: dict,
                 workdir: str, printer) -> dict:
    """Accounts the trained policy's memory, writes its CSR files and, last, `results.json`."""
    algo = prepared.algo
    trained = algo.learning.networks_at_init(state)
    policy_networks = getattr(algo.learning, "POLICY_NETWORKS", ("actor",))
    # The parts of the networks the deployed policy runs (BCQ acts with the VAE's decoder, not its encoder).
    policy = {name: subtree_at(trained, name) for name in policy_networks}
    policy_mask = {name: subtree_at(masks, name) for name in policy_networks}
    policy_mask = {name: mask if mask is not None else _all_kept(policy[name]) for name, mask in policy_mask.items()}
    memory = sparse.memory_table(policy, policy_mask)
    for precision in sparse.PRECISIONS:
        blob = sparse.export_sparse(policy, policy_mask, "csr", precision)
        io.atomic_write_bytes(os.path.join(workdir, f"policy_csr_{precision}.msgpack"), sparse.to_bytes(blob))
    # A cell's float sums depend on XLA:CPU's thread pool (one thread, as asked for before JAX
    # starts, or one per core where JAX had started first): the record says which it ran on.
    results = {"config": run_config, **results, "masks": mask_summary(masks), "policy_networks": list(policy_networks),
               "policy_memory": memory, "xla_cpu_threads": 1 if runtime.single_threaded_xla() else "one per core"}
    io.atomic_write_json(os.path.join(workdir, RESULTS_FILE), results)
    final, score = results["final_eval"], results.get("normalized_score")
    best = min(memory[2:], key=lambda row: row["bytes"])
    printer(f"{run.algo} {run.pruner} at sparsity {run.settings.sparsity:g} on {prepared.env_id}: return "
            f"{final['mean']:.1f} ± {final['std']:.1f}" + (f", normalized {score['mean']:.1f}" if score else "")
            + f"; policy {best['bytes']} bytes as {best['format']} {best['precision']} "
            f"({best['vs_dense_fp32']:.3f}× dense fp32) -> {workdir}")
    return results


def _present(masks: dict) -> Optional[dict]:
    return {name: mask for name, mask in masks.items() if mask is not None} or None


def run_prune_offline(run: PruneRun, workdir: str, overwrite: bool = False, progress: bool = True,
                      printer=print) -> dict:
    """Prunes, trains and accounts one run into `workdir`; returns its results dict."""
    prepared = prepare_run(run)
    masks = run_masks(run, prepared)
    run_config = _start_cell(run, prepared, masks, workdir, overwrite)
    state, results = prepared.algo.train(
        prepared.dataset, prepared.env_id, prepared.config, run.steps, run.seed, workdir=workdir, mask=_present(masks),
        eval_every=run.eval_every, eval_episodes=run.eval_episodes, reference=prepared.reference, progress=progress,
    )
    return _finish_cell(run, prepared, masks, state, results, run_config, workdir, printer)


SHARED_FIELDS = ("dataset", "algo", "env", "overrides", "steps", "eval_every", "eval_episodes")


def _in_layout(state: Any, template: Any) -> Any:
    """`state`'s values in `template`'s pytree (the run's own layout): a configuration the program
    trained under all-kept masks for networks it leaves unpruned drops those mask leaves, so its
    checkpoint is what the sequential run would save."""
    values = {jax.tree_util.keystr(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]}
    paths, treedef = jax.tree_util.tree_flatten_with_path(template)
    missing = [jax.tree_util.keystr(path) for path, _ in paths if jax.tree_util.keystr(path) not in values]
    if missing:
        raise ValueError(f"the program's state lacks {missing[0]} of the run's layout")
    return jax.tree_util.tree_unflatten(treedef, [values[jax.tree_util.keystr(path)] for path, _ in paths])


def run_prune_offline_many(runs: Sequence[PruneRun], run_workdirs: Sequence[str], overwrite: bool = False,
                           progress: bool = True, printer=print) -> list[dict]:
    """Runs that differ only in pruner, settings, scoring data and seed, trained as one program
    (`qrl.offline_many.train_many`): each is pruned on its own, then all train together, and
    each workdir gets what `run_prune_offline` writes (metrics.csv holds the evaluations, the
    checkpoint the final state). Returns each run's results dict."""
    from qrl.offline_many import train_many

    runs, run_workdirs = list(runs), list(run_workdirs)
    if not runs or len(runs) != len(run_workdirs):
        raise QrlInputError(f"run_prune_offline_many takes one workdir per run; got {len(runs)} runs, "
                            f"{len(run_workdirs)} workdirs")
    for run in runs[1:]:
        differing = [field for field in SHARED_FIELDS if getattr(run, field) != getattr(runs[0], field)]
        if differing:
            raise QrlInputError(f"runs trained as one program must share {', '.join(differing)}")
    first = prepare_run(runs[0])
    prepared = [first] + [prepare_run(run, shared=first) for run in runs[1:]]  # one dataset on device for all
    masks = [run_masks(run, ready) for run, ready in zip(runs, prepared)]
    run_configs = [_start_cell(run, ready, mask, workdir, overwrite)
                   for run, ready, mask, workdir in zip(runs, prepared, masks, run_workdirs)]
    states, results = train_many(
        first.algo.build, first.dataset, first.env_id, first.config, runs[0].steps, [run.seed for run in runs],
        [_present(mask) for mask in masks], eval_every=runs[0].eval_every, eval_episodes=runs[0].eval_episodes,
        reference=first.reference, progress=progress,
    )
    finished = []
    for index, (run, ready, mask, workdir) in enumerate(zip(runs, prepared, masks, run_workdirs)):
        template = ready.algo.build(ready.config, ready.observation_spec, ready.action_spec,
                                    mask=_present(mask)).init(jax.random.PRNGKey(0))
        state = _in_layout(jax.tree.map(lambda leaf, index=index: leaf[index], states), template)
        logger = MetricsLogger(workdir)
        try:
            for row in results[index]["evaluations"]:
                values = {"eval_return": row["mean"], "eval_return_std": row["std"]}
                if row["normalized_score"] is not None:
                    values["normalized_score"] = row["normalized_score"]["mean"]
                logger.write(row["steps"], values)
        finally:
            logger.close()
        checkpointer = Checkpointer(os.path.join(workdir, "checkpoints"))
        try:
            checkpointer.save(run.steps, state, extra={"steps": run.steps, "agent": ready.algo.NAME,
                                                       "env_id": ready.env_id, "config": ready.config.to_dict()})
        finally:
            checkpointer.close()
        finished.append(_finish_cell(run, ready, mask, state, results[index], run_configs[index], workdir, printer))
    return finished


@dataclasses.dataclass(frozen=True)
class RestoredOfflineRun:
    """A `launch.prune_offline` run read back from its workdir: its algorithm and config, the
    restored train state, the masks it trained under, the dataset (for observation statistics),
    the environment and its specs, the checkpoint's gradient step and whether the run finished."""

    workdir: str
    run_config: dict
    algo: Any
    config: Any
    state: Any
    masks: dict
    dataset: Any
    env_id: str
    observation_spec: Any
    action_spec: Any
    step: int
    finished: bool


def restore_offline_run(workdir: str, step: Optional[int] = None, require_finished: bool = False) -> RestoredOfflineRun:
    """Reads `config.json` and `masks.msgpack` of an offline run and restores its checkpoint
    (`step`, or the newest intact one; with `require_finished` an unfinished run is refused,
    naming its newest step). The dataset the run trained on must still be where it was."""
    from agents import get_offline_agent
    from launch.runs import read_run_config, restore_checkpoint

    config_path, run_config = read_run_config(workdir, "an offline")
    try:
        algo = get_offline_agent(run_config["algo"])
        config = algo.Config.from_dict(run_config["agent_config"])
        env_id, dataset_path = run_config["env"], run_config["dataset"]
    except (KeyError, TypeError, AttributeError) as error:
        raise QrlInputError(f"{config_path} is missing or has a malformed field: {error}") from None
    if not os.path.exists(dataset_path):
        raise QrlInputError(f"the run in {workdir} trained on {dataset_path}, which no longer exists: its observation "
                            "statistics are needed")
    runtime.configure_jax(1)
    dataset = from_qlearning(d4rl.qlearning_arrays(files.read_steps(dataset_path)))
    observation_spec, action_spec = offline.env_specs(env_id)
    networks = algo.learning.networks_at_init(algo.build(config, observation_spec, action_spec).init(jax.random.PRNGKey(0)))
    masks = load_masks(workdir, networks) if os.path.isfile(os.path.join(workdir, MASKS_FILE)) else {}
    masks = {name: mask for name, mask in masks.items() if mask is not None}
    template = algo.build(config, observation_spec, action_spec, mask=masks or None).init(jax.random.PRNGKey(0))
    finished = os.path.isfile(os.path.join(workdir, RESULTS_FILE))
    step, state = restore_checkpoint(workdir, template, step, require_finished and not finished)
    return RestoredOfflineRun(workdir, run_config, algo, config, state, masks, dataset, env_id, observation_spec,
                              action_spec, int(step), finished)


def offline_policy_function(restored: RestoredOfflineRun, precision, calibration_states: Optional[np.ndarray] = None):
    """`fn(observations [B, D]) -> (actions [B, A], actions [B, A])` of the run's policy at
    `precision`, on observations as the policy sees them (normalized when it trained so);
    static activation scales are calibrated on `calibration_states [N, D]` (seen the same way).

    BC, TD3+BC and IQL act with one deterministic actor (`learning.make_actor`), quantized like
    any qrl network (`qrl.deploy.export.policy_function`). BCQ acts with three networks and a
    search over sampled candidates (`acting.make_policy`); it exports at fp32 only."""
    from qrl.deploy import export as deploy_export
    from qrl.quant.precision import FP32
    from qrl.quant.ptq import calibrate, needs_calibration
    from qrl.quant.sweep import PolicySpec

    algo, config, bounds = restored.algo, restored.config, action_bounds(restored.action_spec)
    params = algo.learning.policy_params(restored.state)
    if not hasattr(algo.learning, "make_actor"):
        if precision.name != "fp32":
            raise QrlInputError(f"{restored.run_config['algo']} exports at fp32 only (its policy searches over "
                                f"decoder samples with three networks); got --precision={precision.name}")
        policy = algo.acting.make_policy(config.replace(target_matmul_dtype="fp32"), bounds)
        params = jax.tree.map(np.asarray, params)

        def fn(observations):
            actions = policy(params, observations)
            return actions, actions

        return fn
    spec = PolicySpec(build_network=lambda p: algo.learning.make_actor(config, bounds, p),
                      outputs_to_actions=lambda actions: actions, divergence="deterministic")
    input_ranges = None
    if needs_calibration(precision):
        input_ranges = calibrate(spec.build_network(FP32).apply, params, calibration_states)
    return deploy_export.policy_function(spec, params, precision, input_ranges)


def export_offline_run(workdir: str, precision, out_path: str, calibration_steps: int = 2048, probe_steps: int = 1024,
                       seed: int = 0, step: Optional[int] = None) -> dict:
    """Exports the policy of the offline run in `workdir` (see `runs.export_run`). Static
    activation scales are calibrated on `calibration_steps` dataset states and the model checked
    on `probe_steps` others (drawn with `seed + 30_000`); the dataset's observation statistics go
    into the sidecar when the agent trained on normalized observations. Kernels the run pruned
    are stored sparse in the model (`qrl.deploy.onnx_graph`); the sidecar records the masks'
    kept fractions."""
    from qrl.deploy import export as deploy_export
    from qrl.quant.ptq import needs_calibration

    restored = restore_offline_run(workdir, step=step, require_finished=step is None)
    normalized = bool(getattr(restored.config, "normalize_observations", False))
    observations = np.asarray(restored.dataset.transitions.observation)
    count = calibration_steps + probe_steps
    drawn = np.random.default_rng(seed + 30_000).choice(len(observations), count, replace=count > len(observations))
    states = observations[drawn]
    if normalized:
        states = np.asarray(normalize_observations(restored.dataset, states))
    calibration_states, probes = states[:calibration_steps], states[calibration_steps:]
    fn = offline_policy_function(restored, precision, calibration_states)
    description = {
        "agent": restored.run_config["algo"], "env": restored.env_id, "precision": precision.name,
        "action": deploy_export.action_description(restored.action_spec),
        "pruning": None if not restored.masks else {
            "pruner": restored.run_config.get("pruner"), "masks": mask_summary(restored.masks)},
        "source": {"workdir": os.path.abspath(workdir), "checkpoint_step": restored.step,
                   "run_finished": restored.finished, "dataset": restored.run_config["dataset"],
                   "activation_ranges": (f"calibrated on {calibration_steps} dataset states (seed {seed + 30_000})"
                                         if needs_calibration(precision) else "none")},
    }
    normalization = None
    if normalized:
        normalization = {"mean": np.asarray(restored.dataset.observation_mean),
                         "std": np.asarray(restored.dataset.observation_std)}
    return deploy_export.export_policy(fn, restored.observation_spec.shape, out_path, description,
                                       normalization=normalization, probe_observations=probes.astype(np.float32))
