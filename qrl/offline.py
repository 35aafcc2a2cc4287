"""The offline training loop every offline agent (BC, BCQ, TD3+BC, IQL) runs: gradient steps on an
on-device `qrl.datasets.Dataset`, periodic evaluation in the dataset's environment, metrics,
checkpoints and a results dict.

An agent hands the loop an `OfflineAgent` of pure functions. `make_fused_step` samples K batches
from the dataset and runs K updates in one jitted call (no host round trip per update);
`train_offline` runs `steps` updates in such calls:

    agent = bc.build(config, observation_spec, action_spec)
    state, results = train_offline(agent, dataset, "gym:Hopper-v5", steps=100_000, seed=0, workdir=D)
"""

import dataclasses
import numbers
import os
import time
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from qrl import envs, evaluation
from qrl.checkpointing import Checkpointer
from qrl.datasets import Dataset, normalize_observations as normalize, normalized_score, sample
from qrl.errors import QrlInputError
from qrl.logging import MetricsLogger, ProgressBar
from qrl.replay import Transition
from qrl.run_monitor import EVAL_SEED_OFFSET

UpdateFn = Callable[[Any, Transition], tuple[Any, dict]]
PolicyFn = Callable[[Any, jax.Array], jax.Array]
StepFn = Callable[[Any, jax.Array], tuple[Any, dict]]


@dataclasses.dataclass(frozen=True)
class OfflineAgent:
    """An offline agent's pure functions for one config and pair of specs.

    Attributes:
      name: the agent's name (results, progress bar).
      init: `key -> train state`.
      update: `update(state, batches [K, B, ...]) -> (state, metrics)`, K updates under one
        `lax.scan`, metrics averaged over them. Not jitted (the loop jits).
      policy: `policy(policy_params, observations [N, D]) -> actions [N, A]`, deterministic, in
        environment units (what evaluation runs).
      policy_params: `state -> the policy's params`.
      update_count: `state -> int32 count of updates taken`.
    """

    name: str
    init: Callable[[jax.Array], Any]
    update: UpdateFn
    policy: PolicyFn
    policy_params: Callable[[Any], Any]
    update_count: Callable[[Any], jax.Array]


def network_masks(agent: str, masks: Optional[dict], networks: tuple[str, ...]) -> dict:
    """`masks` (`{network name: mask pytree}` or None) as a dict over `networks` (None where a
    network is unpruned); an unknown network name is a one-line input error."""
    masks = dict(masks or {})
    unknown = sorted(set(masks) - set(networks))
    if unknown:
        raise QrlInputError(f"{agent} has no network {', '.join(unknown)} to mask; its networks: {', '.join(networks)}")
    return {name: masks.get(name) for name in networks}


def check_count(name: str, value, minimum: int = 1) -> int:
    """`value` as an int >= `minimum`; anything else is a one-line input error."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise QrlInputError(f"{name} must be {kind}, got {value!r}")
    return int(value)


def _shape_mismatch(name: str, data_shape: tuple, env_shape: tuple, env_id: str) -> str:
    """"dataset observations have 11 dims, gym:Pendulum-v1 has 3" (shapes when not flat)."""
    if len(data_shape) == len(env_shape) == 1:
        return f"dataset {name} have {data_shape[0]} dims, {env_id} has {env_shape[0]}"
    return f"dataset {name} have shape {data_shape}, {env_id} has {env_shape}"


def check_dataset_matches_env(dataset: Dataset, observation_spec, action_spec, env_id: str) -> None:
    """Raises a one-line QrlInputError unless the dataset's observation `[N, ...]` and action
    `[N, A]` shapes match the environment's specs and its actions are continuous."""
    if envs.is_discrete(action_spec):
        raise QrlInputError(f"offline agents need continuous actions; {env_id} has discrete actions")
    for name, rows, spec in (
        ("observations", dataset.transitions.observation, observation_spec),
        ("actions", dataset.transitions.action, action_spec),
    ):
        data_shape, env_shape = tuple(rows.shape[1:]), tuple(spec.shape)
        if data_shape != env_shape:
            raise QrlInputError(_shape_mismatch(name, data_shape, env_shape, env_id))


def env_specs(env_id: str, env_options: Optional[dict] = None) -> tuple[Any, Any]:
    """`(observation_spec, action_spec)` of `env_id` (one environment made and closed)."""
    env = envs.make(env_id, 0, **dict(env_options or {}))
    try:
        return env.observation_spec(), env.action_spec()
    finally:
        env.close()


def make_fused_step(
    agent: OfflineAgent, dataset: Dataset, batch_size: int, updates_per_call: int,
    normalize_observations: bool = False,
) -> StepFn:
    """`step(state, key) -> (state, metrics)`: one jitted call that draws `[K, B]` transitions
    from `dataset` with `key` (`qrl.datasets.sample`) and runs `agent.update` on them.

    The dataset is an argument of the compiled call, not a constant folded into it; the input
    state's buffers are donated. With `normalize_observations` the sampled observations and next
    observations become `(x - mean) / std` with the dataset's statistics.
    """
    batch_size = check_count("batch_size", batch_size)
    updates_per_call = check_count("updates_per_call", updates_per_call)

    def fused(state, data: Dataset, key: jax.Array):
        batches = sample(data, key, batch_size, updates_per_call)
        if normalize_observations:
            batches = batches.replace(
                observation=normalize(data, batches.observation),
                next_observation=normalize(data, batches.next_observation),
            )
        return agent.update(state, batches)

    compiled = jax.jit(fused, donate_argnums=0)
    return lambda state, key: compiled(state, dataset, key)


def _evaluation_policy(agent: OfflineAgent, dataset: Dataset, normalize_observations: bool):
    """`policy(params, observations [N, D]) -> actions [N, A]` jitted, seeing normalized
    observations when the agent trained on them."""
    if not normalize_observations:
        return jax.jit(agent.policy)
    mean, std = dataset.observation_mean, dataset.observation_std
    return jax.jit(lambda params, observations: agent.policy(params, (observations - mean) / std))


def _next_due(done: int, every: int, steps: int) -> int:
    """The first multiple of `every` after `done` (`steps` when `every` is 0 or past the end)."""
    return min((done // every + 1) * every, steps) if every else steps


def _score(returns, reference) -> Optional[dict]:
    if reference is None:
        return None
    scores = normalized_score(returns, reference)
    return {"mean": float(np.mean(scores)), "std": float(np.std(scores))}


def train_offline(
    agent: OfflineAgent,
    dataset: Dataset,
    env_id: str,
    steps: int,
    seed: int,
    workdir: Optional[str] = None,
    batch_size: int = 256,
    updates_per_call: int = 10,
    eval_every: int = 5000,
    eval_episodes: int = 10,
    reference: Optional[tuple[float, float]] = None,
    normalize_observations: bool = False,
    log_every: int = 1000,
    checkpoint_every: int = 0,
    progress: bool = True,
    env_options: Optional[dict] = None,
    config: Any = None,
) -> tuple[Any, dict]:
    """Runs `steps` gradient steps of `agent` on `dataset`, K = `updates_per_call` per jitted call
    (a shorter last call when K does not divide `steps`); returns `(state, results)`.

    Evaluates the deterministic policy in `env_id` (`eval_episodes` episodes seeded
    `seed + 1e6 + i`) at the first call boundary at or after each multiple of `eval_every`
    (0: only at the end) and at the end. With `normalize_observations` the agent trains and acts
    on `(obs - mean) / std` with the dataset's statistics. With a `workdir`: `metrics.csv` and
    TensorBoard rows every `log_every` steps and at each evaluation, checkpoints of the state
    under `workdir/checkpoints` every `checkpoint_every` steps (0: off) and at the end, with
    `config.to_dict()` as metadata when a config is given. `reference` = (random, expert) returns
    adds normalized scores. Timings exclude compilation (`compile_seconds`) and evaluation.
    """
    steps = check_count("steps", steps)
    batch_size = check_count("batch_size", batch_size)
    updates_per_call = check_count("updates_per_call", updates_per_call)
    eval_episodes = check_count("eval_episodes", eval_episodes)
    eval_every = check_count("eval_every", eval_every, minimum=0)
    log_every = check_count("log_every", log_every, minimum=0)
    checkpoint_every = check_count("checkpoint_every", checkpoint_every, minimum=0)
    if reference is not None:
        normalized_score(0.0, reference)  # rejects expert <= random before any training.
    env_options = dict(env_options or {})
    check_dataset_matches_env(dataset, *env_specs(env_id, env_options), env_id)

    init_key, sample_key = jax.random.split(jax.random.PRNGKey(seed))
    state = agent.init(init_key)
    calls = [updates_per_call] * (steps // updates_per_call)
    if steps % updates_per_call:
        calls.append(steps % updates_per_call)
    compile_start = time.perf_counter()
    fused_steps = {
        count: make_fused_step(agent, dataset, batch_size, count, normalize_observations) for count in set(calls)
    }
    for fused_step in fused_steps.values():  # compiles outside the timings; the call's result is dropped
        jax.block_until_ready(fused_step(jax.tree.map(jnp.copy, state), sample_key))
    compile_seconds = time.perf_counter() - compile_start
    policy = _evaluation_policy(agent, dataset, normalize_observations)

    def evaluate(state) -> dict:
        params = agent.policy_params(state)
        result = evaluation.evaluate(
            lambda observations: np.asarray(policy(params, observations)), env_id, eval_episodes,
            seed=seed + EVAL_SEED_OFFSET, env_options=env_options,
        )
        return {**result.to_dict(), "normalized_score": _score(result.returns, reference)}

    logger = MetricsLogger(workdir) if workdir else None
    checkpointer = Checkpointer(os.path.join(workdir, "checkpoints")) if workdir else None
    bar = ProgressBar(steps, desc=f"{agent.name} {env_id}", disable=None if progress else True)
    extra = {"agent": agent.name, "env_id": env_id, **({"config": config.to_dict()} if config is not None else {})}

    def record_evaluation(step: int, state) -> dict:
        result = evaluate(state)
        row = {"eval_return": result["mean"], "eval_return_std": result["std"]}
        if result["normalized_score"] is not None:
            row["normalized_score"] = result["normalized_score"]["mean"]
        if logger:
            logger.write(step, row)
        bar.update(step, latest_return=result["mean"])
        return {"steps": step, **result}

    evaluations = []
    train_seconds, done, metrics = 0.0, 0, {}
    next_log, next_eval = _next_due(0, log_every, steps), _next_due(0, eval_every, steps)
    next_checkpoint = _next_due(0, checkpoint_every, steps)
    try:
        for index, count in enumerate(calls):
            start = time.perf_counter()
            state, metrics = fused_steps[count](state, jax.random.fold_in(sample_key, index))
            done += count
            if done >= min(next_log, next_eval, next_checkpoint):
                metrics = {name: float(value) for name, value in jax.device_get(metrics).items()}
            train_seconds += time.perf_counter() - start
            if done >= next_log:
                next_log = _next_due(done, log_every, steps)
                if logger:
                    logger.write(done, {"steps_per_second": done / max(train_seconds, 1e-9), **metrics})
                bar.update(done)
            if done >= next_eval and done < steps:
                next_eval = _next_due(done, eval_every, steps)
                evaluations.append(record_evaluation(done, state))
            if done >= next_checkpoint and done < steps:
                next_checkpoint = _next_due(done, checkpoint_every, steps)
                if checkpointer:
                    checkpointer.save(done, state, extra={"steps": done, **extra})
        final = record_evaluation(steps, state)
        evaluations.append(final)
        if checkpointer:
            checkpointer.save(steps, state, extra={"steps": steps, **extra})
    finally:
        bar.close()
        if logger:
            logger.close()
        if checkpointer:
            checkpointer.close()
    final_eval = {key: value for key, value in final.items() if key not in ("steps", "normalized_score")}
    results = {
        "agent": agent.name,
        "env": env_id,
        "seed": seed,
        "steps": steps,
        "updates": int(agent.update_count(state)),
        "batch_size": batch_size,
        "updates_per_call": updates_per_call,
        "train_seconds": train_seconds,
        "compile_seconds": compile_seconds,
        "steps_per_second": steps / max(train_seconds, 1e-9),
        "final_eval": final_eval,
        "normalized_score": final["normalized_score"],
        "evaluations": evaluations,
        "last_metrics": metrics,
    }
    return state, results


def train_agent(
    build: Callable[..., OfflineAgent],
    dataset: Dataset,
    env_id: str,
    config: Any,
    steps: int,
    seed: int,
    mask: Optional[dict] = None,
    env_options: Optional[dict] = None,
    **options,
) -> tuple[Any, dict]:
    """What every offline agent's `train` does: checks `dataset` against `env_id`'s specs, builds
    the agent (`build(config, observation_spec, action_spec, mask=mask)`) and runs `train_offline`
    with the config's `batch_size`, `updates_per_call` and `normalize_observations`; `options` are
    `train_offline`'s (workdir, eval_every, eval_episodes, reference, log_every, checkpoint_every,
    progress). Returns `(state, results)`."""
    observation_spec, action_spec = env_specs(env_id, env_options)
    check_dataset_matches_env(dataset, observation_spec, action_spec, env_id)
    agent = build(config, observation_spec, action_spec, mask=mask)
    return train_offline(
        agent, dataset, env_id, steps, seed, batch_size=config.batch_size, updates_per_call=config.updates_per_call,
        normalize_observations=config.normalize_observations, env_options=env_options, config=config, **options,
    )
