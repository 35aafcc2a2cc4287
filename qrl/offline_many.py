"""Many configurations of one offline agent on one dataset trained as one program: C (seed, masks)
pairs share every jitted call, their states stacked on a leading axis `[C, ...]` and the update
`jax.vmap`-ed over it; evaluation steps all C x E episodes side by side with one batched policy
call per step (`qrl.evaluation.evaluate_many`).

    states, results = train_many(bc.build, dataset, "gym:Hopper-v5", config, steps=20_000,
                                 seeds=[0, 1, 2], masks=[None, {"actor": m1}, {"actor": m2}])

Configuration c follows `train_offline(..., seed=seeds[c])` with `build(..., mask=masks[c])`: the
same initialization key, the same sampled batches and the same evaluation envs. Its numbers agree
with that run's up to float rounding, not bit for bit: XLA compiles the batched program with other
summation orders (batched matmuls, fused reductions; even `lax.map` over the configurations
differs from a separately compiled run by an ulp), and Adam's normalized steps let such
differences grow over long runs (see tests/test_offline_many.py and bench/offline_many.py for
the measured differences). A configuration without a mask for a network
others mask trains under an all-kept mask there, which leaves every update unchanged.
"""

import time
from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from qrl import evaluation
from qrl.datasets import Dataset, normalize_observations as normalize, sample
from qrl.errors import QrlInputError
from qrl.logging import ProgressBar
from qrl.offline import OfflineAgent, _next_due, _score, check_count, check_dataset_matches_env, env_specs
from qrl.run_monitor import EVAL_SEED_OFFSET

Build = Callable[..., OfflineAgent]
def _all_kept(mask: Any) -> Any:
    return jax.tree.map(lambda kept: jnp.ones(np.shape(kept), bool), mask)


def uniform_masks(masks: Sequence[Optional[dict]]) -> Optional[dict]:
    """`[{network: mask} or None] * C` as one `{network: mask [C, ...]}` (None when no
    configuration has a mask): a network one configuration leaves unmasked gets an all-kept mask,
    so every configuration has the same pytree and the masks can be stacked."""
    masks = [dict(mask or {}) for mask in masks]
    templates = {}
    for mask in masks:
        for name, network_mask in mask.items():
            if network_mask is not None:
                templates.setdefault(name, network_mask)
    if not templates:
        return None
    filled = []
    for index, mask in enumerate(masks):
        row = {}
        for name, template in templates.items():
            network_mask = mask.get(name)
            if network_mask is None:
                network_mask = _all_kept(template)
            elif jax.tree.structure(network_mask) != jax.tree.structure(template) or any(
                    np.shape(a) != np.shape(b) for a, b in zip(jax.tree.leaves(network_mask), jax.tree.leaves(template))):
                raise QrlInputError(f"configuration {index}'s {name} mask has another layout than the others'")
            row[name] = jax.tree.map(jnp.asarray, network_mask)
        filled.append(row)
    return jax.tree.map(lambda *leaves: jnp.stack(leaves), *filled)


def train_many(
    build: Build,
    dataset: Dataset,
    env_id: str,
    config: Any,
    steps: int,
    seeds: Sequence[int],
    masks: Optional[Sequence[Optional[dict]]] = None,
    eval_every: int = 5000,
    eval_episodes: int = 10,
    reference: Optional[tuple[float, float]] = None,
    env_options: Optional[dict] = None,
    progress: bool = True,
) -> tuple[Any, list[dict]]:
    """Trains C = `len(seeds)` configurations of the agent `build(config, observation_spec,
    action_spec, mask=...)` on `dataset` for `steps` updates each, in calls of the config's
    `updates_per_call` updates for all C at once; evaluates every configuration's deterministic
    policy at the schedule of `train_offline` (`eval_every`, 0: only at the end). Returns the
    stacked states `[C, ...]` and one results dict per configuration, as `train_offline`'s
    (`train_seconds` is the shared wall time; `steps_per_second` counts one configuration's steps).
    """
    steps = check_count("steps", steps)
    eval_episodes = check_count("eval_episodes", eval_episodes)
    eval_every = check_count("eval_every", eval_every, minimum=0)
    seeds = [check_count("seed", seed, minimum=0) for seed in seeds]
    if not seeds:
        raise QrlInputError("train_many needs at least one configuration")
    masks = list(masks) if masks is not None else [None] * len(seeds)
    if len(masks) != len(seeds):
        raise QrlInputError(f"train_many got {len(seeds)} seeds and {len(masks)} masks; give one mask per seed")
    batch_size = check_count("batch_size", config.batch_size)
    updates_per_call = check_count("updates_per_call", config.updates_per_call)
    normalized = bool(getattr(config, "normalize_observations", False))
    env_options = dict(env_options or {})
    observation_spec, action_spec = env_specs(env_id, env_options)
    check_dataset_matches_env(dataset, observation_spec, action_spec, env_id)
    stacked_masks = uniform_masks(masks)

    def agent_for(mask) -> OfflineAgent:
        return build(config, observation_spec, action_spec, mask=mask)

    def init_one(key, mask):
        return agent_for(mask).init(key)

    def fused_one(state, mask, data: Dataset, key, count: int):
        batches = sample(data, key, batch_size, count)
        if normalized:
            batches = batches.replace(observation=normalize(data, batches.observation),
                                      next_observation=normalize(data, batches.next_observation))
        return agent_for(mask).update(state, batches)

    keys = jnp.stack([jnp.stack(jax.random.split(jax.random.PRNGKey(seed))) for seed in seeds])
    init_keys, sample_keys = keys[:, 0], keys[:, 1]
    states = jax.jit(jax.vmap(init_one))(init_keys, stacked_masks)
    calls = [updates_per_call] * (steps // updates_per_call) + ([steps % updates_per_call] if steps % updates_per_call else [])
    compile_start = time.perf_counter()
    fused = {count: jax.jit(jax.vmap(lambda s, m, d, k, count=count: fused_one(s, m, d, k, count),
                                     in_axes=(0, 0, None, 0)), donate_argnums=0) for count in set(calls)}
    call_keys = jax.jit(jax.vmap(jax.random.fold_in, in_axes=(0, None)))
    for count, step in fused.items():  # compiles outside the timings; the result is dropped
        jax.block_until_ready(step(jax.tree.map(jnp.copy, states), stacked_masks, dataset, call_keys(sample_keys, 0)))
    probe = agent_for(None)
    mean, std = dataset.observation_mean, dataset.observation_std

    def act_one(params, observations):
        return probe.policy(params, (observations - mean) / std if normalized else observations)

    policies = jax.jit(jax.vmap(act_one))
    policy_params = jax.jit(jax.vmap(probe.policy_params))
    compile_seconds = time.perf_counter() - compile_start

    def evaluate(states, step: int) -> list[dict]:
        params = policy_params(states)
        results = evaluation.evaluate_many(lambda observations: np.asarray(policies(params, observations)), env_id,
                                           [seed + EVAL_SEED_OFFSET for seed in seeds], eval_episodes,
                                           env_options=env_options)
        return [{"steps": step, **result.to_dict(), "normalized_score": _score(result.returns, reference)}
                for result in results]

    bar = ProgressBar(steps, desc=f"{probe.name} x{len(seeds)} {env_id}", disable=None if progress else True)
    evaluations: list[list[dict]] = []
    train_seconds, done, metrics = 0.0, 0, {}
    next_eval = _next_due(0, eval_every, steps)
    try:
        for index, count in enumerate(calls):
            start = time.perf_counter()
            states, metrics = fused[count](states, stacked_masks, dataset, call_keys(sample_keys, index))
            done += count
            if done >= next_eval:
                jax.block_until_ready(states)
            train_seconds += time.perf_counter() - start
            if done >= next_eval and done < steps:
                next_eval = _next_due(done, eval_every, steps)
                evaluations.append(evaluate(states, done))
                bar.update(done, latest_return=float(np.mean([row["mean"] for row in evaluations[-1]])))
        jax.block_until_ready(states)
        evaluations.append(evaluate(states, steps))
        bar.update(steps)
    finally:
        bar.close()
    metrics = jax.device_get(metrics)
    updates = np.asarray(jax.vmap(probe.update_count)(states))
    results = []
    for c, seed in enumerate(seeds):
        final = evaluations[-1][c]
        results.append({
            "agent": probe.name, "env": env_id, "seed": seed, "steps": steps, "updates": int(updates[c]),
            "batch_size": batch_size, "updates_per_call": updates_per_call, "configurations": len(seeds),
            "train_seconds": train_seconds, "compile_seconds": compile_seconds,
            "steps_per_second": steps / max(train_seconds, 1e-9),
            "final_eval": {key: value for key, value in final.items() if key not in ("steps", "normalized_score")},
            "normalized_score": final["normalized_score"],
            "evaluations": [rows[c] for rows in evaluations],
            "last_metrics": {name: float(np.asarray(value)[c]) for name, value in metrics.items()},
        })
    return states, results
