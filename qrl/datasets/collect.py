"""Generating D4RL-style datasets: roll out a (stochastic) policy and record step arrays.

`collect_steps` runs a policy `act_fn(params, observations [N, D], noise [N, A]) -> actions`
(SAC's `acting.make_act`: a tanh-Gaussian sample for standard-normal `noise`) on host envs (or a
device batch, `brax:` ids, stepped from the host through `qrl.envs.DeviceBatchVector`) and returns D4RL's step-array format (see `qrl.datasets.d4rl`): `observations [N, D]`,
`actions [N, A]`, `rewards [N]` (float32), `terminals [N]`, `timeouts [N]` (bool) and
`next_observations [N, D]`, episode by episode. As D4RL did, actions are sampled from the
stochastic policy, episodes last at most `max_episode_steps` (1000) steps and `timeouts` mark
truncations. `average_return` measures reference returns (random / expert) over N episodes.

Noise: one `numpy.random.default_rng(seed)` draws `standard_normal((num_envs, A), float32)` per
step of all envs together; host env i is seeded `seed + i` (`qrl.envs.make_vector`), a device
batch `seed`, with its `episode_length` option set to `max_episode_steps`.
"""

from typing import Any, Callable, Mapping, Optional

import jax
import numpy as np

from qrl.envs import is_device_id, is_discrete
from qrl.envs.vector import make_host_vector
from qrl.errors import QrlInputError
from qrl.evaluation import EvalResult, evaluate
from qrl.logging import ProgressBar

ActFn = Callable[[Any, Any, Any], Any]  # (params, observations [N, D], noise [N, A]) -> actions [N, A]
STEP_KEYS = ("observations", "actions", "rewards", "terminals", "timeouts", "next_observations")


def _check_positive(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise QrlInputError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _continuous_vector(env_id: str, num_envs: int, seed: int, max_episode_steps: int,
                       env_options: Optional[Mapping[str, Any]]):
    """Host envs (`VectorEnv`), or one device batch (`DeviceBatchVector`) whose own episode
    limit is `max_episode_steps` (a device batch cannot reset one env early)."""
    options = dict(env_options or {})
    if is_device_id(env_id):
        limit = options.setdefault("episode_length", max_episode_steps)
        if limit > max_episode_steps:
            raise QrlInputError(f"{env_id}: episode_length {limit} exceeds max_episode_steps {max_episode_steps}")
    vector = make_host_vector(env_id, num_envs, seed, **options)
    if is_discrete(vector.action_spec()):
        vector.close()
        raise QrlInputError(f"{env_id} has discrete actions; dataset collection needs a continuous action space")
    return vector


def _reset_one(vector, index: int) -> np.ndarray:
    """Restarts host env `index` (an episode cut at `max_episode_steps`)."""
    return np.asarray(vector.envs[index].reset().observation, np.float32)


class _Episode:
    """One env's steps of its current episode (lists of rows)."""

    def __init__(self):
        self.rows: dict[str, list] = {key: [] for key in STEP_KEYS}

    def __len__(self) -> int:
        return len(self.rows["rewards"])

    def add(self, observation, action, reward, terminal, timeout, next_observation):
        for key, value in zip(STEP_KEYS, (observation, action, reward, terminal, timeout, next_observation)):
            self.rows[key].append(value)

    def arrays(self) -> dict[str, np.ndarray]:
        return {
            "observations": np.asarray(self.rows["observations"], np.float32),
            "actions": np.asarray(self.rows["actions"], np.float32),
            "rewards": np.asarray(self.rows["rewards"], np.float32),
            "terminals": np.asarray(self.rows["terminals"], bool),
            "timeouts": np.asarray(self.rows["timeouts"], bool),
            "next_observations": np.asarray(self.rows["next_observations"], np.float32),
        }


def collect_steps(
    env_id: str,
    act_fn: ActFn,
    params,
    num_steps: int,
    seed: int,
    num_envs: int = 1,
    max_episode_steps: int = 1000,
    env_options: Optional[Mapping[str, Any]] = None,
    progress: bool = False,
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Exactly `num_steps` steps of `act_fn` on `env_id` (a host id: gym, dmc) as D4RL arrays.

    Returns `(arrays, stats)`. `arrays` holds the step arrays ordered episode by episode (each
    episode's steps contiguous): completed episodes in the order they finished, then the
    unfinished episodes of each env (env order), cut at `num_steps`. `terminals` = termination
    (discount 0), `timeouts` = truncation: the env's time limit or `max_episode_steps`
    (enforced here by resetting the env), and the last row of an unfinished (cut) episode, so
    that no loader bootstraps across the end of the data. `next_observations[i]` is the
    observation step i reached. `stats`: `episode_returns` / `episode_lengths` (float64 /
    int64, completed episodes in the arrays' order), `episodes` (completed), `env_steps`
    (steps taken, >= num_steps with several envs). `progress` shows a bar (summaries off a terminal).
    """
    num_steps = _check_positive("num_steps", num_steps)
    num_envs = _check_positive("num_envs", num_envs)
    max_episode_steps = _check_positive("max_episode_steps", max_episode_steps)
    vector = _continuous_vector(env_id, num_envs, seed, max_episode_steps, env_options)
    act = jax.jit(act_fn)
    rng = np.random.default_rng(seed)
    action_shape = (num_envs,) + tuple(vector.action_spec().shape)
    finished: list[dict[str, np.ndarray]] = []
    finished_rows = 0
    current = [_Episode() for _ in range(num_envs)]
    env_steps = 0
    bar = ProgressBar(num_steps, desc=f"collect {env_id}", disable=None if progress else True)
    try:
        observations = np.asarray(vector.reset(), np.float32)
        while finished_rows + sum(len(episode) for episode in current) < num_steps:
            if env_steps % 1000 < num_envs:
                bar.update(min(num_steps, finished_rows + sum(len(episode) for episode in current)))
            noise = rng.standard_normal(action_shape, dtype=np.float32)
            actions = np.asarray(act(params, observations, noise), np.float32)
            timestep = vector.step(actions)  # ended episodes restart in the same call
            env_steps += num_envs
            next_observations = np.asarray(timestep.observation, np.float32)
            for index in range(num_envs):
                episode = current[index]
                last = bool(timestep.step_type[index] == 2)
                terminal = last and float(timestep.discount[index]) == 0.0
                cut = not last and len(episode) + 1 >= max_episode_steps
                timeout = not terminal and (last or cut)
                episode.add(observations[index].copy(), actions[index], float(timestep.reward[index]), terminal,
                            timeout, np.array(timestep.final_observation[index], np.float32))
                if terminal or timeout:
                    finished.append(episode.arrays())
                    finished_rows += len(episode)
                    current[index] = _Episode()
                if cut:
                    next_observations[index] = _reset_one(vector, index)
            observations = next_observations
    finally:
        bar.close()
        vector.close()
    returns = [float(np.sum(episode["rewards"], dtype=np.float64)) for episode in finished]
    lengths = [len(episode["rewards"]) for episode in finished]
    pieces = finished + [episode.arrays() for episode in current if len(episode)]
    for piece in pieces[len(finished):]:
        piece["timeouts"][-1] = True  # an unfinished episode: never bootstrap past the data's end
    arrays = {key: np.concatenate([piece[key] for piece in pieces])[:num_steps] for key in STEP_KEYS}
    if not (arrays["terminals"][-1] or arrays["timeouts"][-1]):
        arrays["timeouts"][-1] = True  # the cut fell inside an episode
    # Completed episodes that the cut reached into are no longer complete in the arrays.
    kept, total = 0, 0
    for length in lengths:
        if total + length > num_steps:
            break
        total += length
        kept += 1
    stats = {
        "episode_returns": np.asarray(returns[:kept], np.float64),
        "episode_lengths": np.asarray(lengths[:kept], np.int64),
        "episodes": kept,
        "env_steps": env_steps,
    }
    return arrays, stats


def average_return(
    env_id: str,
    act_fn: Callable,
    params,
    episodes: int,
    seed: int,
    stochastic: bool = True,
    max_episode_steps: int = 1000,
    env_options: Optional[Mapping[str, Any]] = None,
) -> EvalResult:
    """Undiscounted returns of `episodes` episodes, episode i in an env seeded `seed + i`, each
    cut at `max_episode_steps` (D4RL's reference scores: averages over 100 episodes).

    `stochastic`: `act_fn(params, observations, noise)` with standard-normal noise drawn from
    `default_rng(seed)` (`[episodes, A]` per step), as the datasets were collected; otherwise
    `act_fn(params, observations)` is a deterministic policy (SAC's `make_policy`), evaluated
    with `qrl.evaluation.evaluate`.
    """
    episodes = _check_positive("episodes", episodes)
    max_episode_steps = _check_positive("max_episode_steps", max_episode_steps)
    if not stochastic:
        policy = jax.jit(act_fn)
        return evaluate(lambda observations: policy(params, observations), env_id, episodes, seed,
                        max_steps=max_episode_steps, env_options=env_options)
    vector = _continuous_vector(env_id, episodes, seed, max_episode_steps, env_options)
    act = jax.jit(act_fn)
    rng = np.random.default_rng(seed)
    action_shape = (episodes,) + tuple(vector.action_spec().shape)
    returns = np.zeros(episodes, np.float64)
    lengths = np.zeros(episodes, np.int64)
    active = np.ones(episodes, bool)
    try:
        observations = np.asarray(vector.reset(), np.float32)
        while active.any():
            noise = rng.standard_normal(action_shape, dtype=np.float32)
            actions = np.asarray(act(params, observations, noise), np.float32)
            timestep = vector.step(actions)
            returns += np.where(active, timestep.reward, 0.0)
            lengths += active
            active &= (timestep.step_type != 2) & (lengths < max_episode_steps)
            observations = np.asarray(timestep.observation, np.float32)
    finally:
        vector.close()
    return EvalResult(env_id=env_id, seed=int(seed), mean=float(np.mean(returns)), std=float(np.std(returns)),
                      returns=tuple(float(v) for v in returns), lengths=tuple(int(v) for v in lengths))
