"""DQN's host training loop for gymnasium, Atari and dm_control environments.

Per environment step the loop makes one small jitted call (greedy actions for all N envs; none
while every env explores), steps the environments and writes transitions into a numpy replay.
Every `train_freq` environment steps it runs `gradient_steps` updates in one jitted call on
`[K, B, ...]` batches sampled at once — the same schedule as SB3's `train_freq` /
`gradient_steps`, at a fraction of the per-update dispatch cost.
"""

import os
import time
from typing import Callable, Optional

import jax
import numpy as np

from agents.dqn import acting, learning
from agents.dqn.config import Config
from qrl import envs, evaluation
from qrl.checkpointing import Checkpointer
from qrl.errors import QrlInputError
from qrl.logging import MetricsLogger, ProgressBar
from qrl.replay import NStepAccumulator, UniformReplay

EVAL_SEED_OFFSET = 1_000_000  # evaluation episodes never share seeds with training envs.


def check_env(env_id: str, action_spec) -> None:
    """DQN needs discrete actions."""
    if not envs.is_discrete(action_spec):
        raise QrlInputError(f"agent dqn needs discrete actions; {env_id} has continuous actions")


def make_greedy_policy_fn(network, params_ref: Callable[[], dict]) -> Callable[[np.ndarray], np.ndarray]:
    """A numpy-in/numpy-out greedy policy reading the current params through `params_ref`."""
    greedy = jax.jit(acting.make_greedy_policy(network))
    return lambda observations: np.asarray(greedy(params_ref(), observations))


def train(
    env_id: str,
    config: Config,
    steps: int,
    seed: int = 0,
    workdir: Optional[str] = None,
    num_envs: int = 1,
    eval_episodes: int = 10,
    eval_every: int = 0,
    checkpoint_every: int = 0,
    log_every: int = 1_000,
    progress: bool = True,
    env_options: Optional[dict] = None,
) -> tuple[learning.TrainState, dict]:
    """Trains DQN for `steps` environment steps; returns the final state and a results dict.

    With a `workdir`, writes `metrics.csv`, TensorBoard events under `tb/` and orbax checkpoints
    under `checkpoints/` (every `checkpoint_every` steps when > 0, and at the end). Every
    `eval_every` steps (when > 0) and at the end, the greedy policy is evaluated over
    `eval_episodes` episodes seeded from `seed + EVAL_SEED_OFFSET`.
    """
    if steps < 1:
        raise QrlInputError(f"steps must be >= 1, got {steps}")
    env_options = env_options or {}
    vector_env = envs.make_vector(env_id, num_envs, seed, **env_options)
    observation_spec, action_spec = vector_env.observation_spec(), vector_env.action_spec()
    check_env(env_id, action_spec)
    observation_shape = tuple(observation_spec.shape)
    num_actions = envs.num_actions(action_spec)

    state = learning.init(jax.random.PRNGKey(seed), config, observation_shape, observation_spec.dtype, num_actions)
    network = learning.make_network(config, observation_shape, num_actions)
    update = learning.make_update(network, config, learning.total_updates(config, steps))
    policy = make_greedy_policy_fn(network, lambda: state.params)
    epsilon_at = acting.epsilon_schedule(config, steps)

    replay = UniformReplay(config.buffer_size, seed=seed)
    accumulators = [NStepAccumulator(config.n_step, config.gamma) for _ in range(num_envs)]
    rng = np.random.default_rng(seed)
    logger = MetricsLogger(workdir) if workdir else None
    checkpointer = Checkpointer(os.path.join(workdir, "checkpoints")) if workdir else None
    bar = ProgressBar(steps, desc=f"dqn {env_id}", disable=None if progress else True)

    def evaluate_now():
        return evaluation.evaluate(
            policy, env_id, eval_episodes, seed=seed + EVAL_SEED_OFFSET, env_options=env_options
        )

    def save(step):
        if checkpointer:
            checkpointer.save(step, state, extra={"env_steps": step, "config": config.to_dict()})

    episode_returns = np.zeros(num_envs)
    finished_returns: list[float] = []
    last_metrics: dict = {}
    evaluations = []
    env_steps = 0
    next_train = max(config.learning_starts, config.train_freq)
    next_log = log_every
    next_eval = eval_every if eval_every > 0 else None
    next_checkpoint = checkpoint_every if checkpoint_every > 0 else None
    start = time.perf_counter()
    observations = vector_env.reset()
    while env_steps < steps:
        epsilon = epsilon_at(env_steps)
        explore = rng.random(num_envs) < epsilon
        if explore.all():
            actions = rng.integers(0, num_actions, num_envs)
        else:
            actions = policy(observations)
            if explore.any():
                actions = np.where(explore, rng.integers(0, num_actions, num_envs), actions)
        timestep = vector_env.step(actions)
        for index in range(num_envs):
            if timestep.step_type[index] == 0:  # FIRST: the env had not been reset; nothing to learn.
                continue
            episode_end = bool(timestep.step_type[index] == 2)
            for transition in accumulators[index].add(
                observations[index], actions[index], timestep.reward[index], timestep.discount[index],
                timestep.final_observation[index], episode_end,
            ):
                replay.add(transition)
            episode_returns[index] += timestep.reward[index]
            if episode_end:
                finished_returns.append(float(episode_returns[index]))
                episode_returns[index] = 0.0
        observations = timestep.observation
        env_steps += num_envs

        if env_steps >= next_train and len(replay) >= config.batch_size:
            while next_train <= env_steps:
                state, last_metrics = update(state, replay.sample(config.batch_size, config.gradient_steps))
                next_train += config.train_freq
        latest_return = finished_returns[-1] if finished_returns else None
        if env_steps >= next_log or env_steps >= steps:
            next_log += log_every
            elapsed = time.perf_counter() - start
            metrics = {"epsilon": epsilon, "episodes": len(finished_returns), "steps_per_second": env_steps / elapsed}
            if finished_returns:
                metrics["episode_return"] = float(np.mean(finished_returns[-10:]))
            metrics.update({key: float(value) for key, value in last_metrics.items()})
            if logger:
                logger.write(env_steps, metrics)
            bar.update(min(env_steps, steps), latest_return=latest_return)
        if next_eval is not None and env_steps >= next_eval:
            next_eval += eval_every
            result = evaluate_now()
            evaluations.append({"env_steps": env_steps, **result.to_dict()})
            if logger:
                logger.write(env_steps, {"eval_return": result.mean, "eval_return_std": result.std})
        if next_checkpoint is not None and env_steps >= next_checkpoint:
            next_checkpoint += checkpoint_every
            save(env_steps)

    train_seconds = time.perf_counter() - start
    bar.close()
    final = evaluate_now()
    if logger:
        logger.write(env_steps, {"eval_return": final.mean, "eval_return_std": final.std})
        logger.close()
    save(env_steps)
    if checkpointer:
        checkpointer.close()
    vector_env.close()
    results = {
        "agent": "dqn",
        "env": env_id,
        "seed": seed,
        "env_steps": env_steps,
        "updates": int(state.updates),
        "episodes": len(finished_returns),
        "train_seconds": train_seconds,
        "steps_per_second": env_steps / train_seconds,
        "final_eval": final.to_dict(),
        "evaluations": evaluations,
        "last_train_returns": finished_returns[-10:],
    }
    return state, results
