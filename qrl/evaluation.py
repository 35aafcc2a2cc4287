"""Policy evaluation on host environments: returns over seeded episodes, and visited observations.

A policy here is a batched callable `policy(obs [B, ...]) -> actions [B, ...]` (a jitted JAX
function or numpy). Evaluation runs all episodes side by side through one policy call per
step, always with the full batch so a jitted policy compiles once.
"""

import dataclasses
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from qrl.envs import HOST_FAMILIES, is_discrete, make
from qrl.envs.ids import check_seed, split_env_id
from qrl.errors import QrlInputError

Policy = Callable[[np.ndarray], Any]


@dataclasses.dataclass(frozen=True)
class EvalResult:
    """Undiscounted returns of `len(returns)` episodes; episode i ran in env seeded `seed + i`.

    `std` is the population standard deviation (ddof 0) of `returns`.
    """

    env_id: str
    seed: int
    mean: float
    std: float
    returns: tuple[float, ...]
    lengths: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values (lists, floats, ints)."""
        return {
            "env_id": self.env_id,
            "seed": self.seed,
            "episodes": len(self.returns),
            "mean": self.mean,
            "std": self.std,
            "returns": list(self.returns),
            "lengths": list(self.lengths),
        }


def _is_device_id(env_id: str) -> bool:
    """Whether `env_id` names a batched JAX-native environment (brax, gymnax)."""
    family, _ = split_env_id(env_id)
    return family not in HOST_FAMILIES


def _evaluate_batched(policy: Policy, env_id: str, episodes: int, seed: int, max_steps: Optional[int],
                      options: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """First-episode returns and lengths of a batch of `episodes` device envs seeded `seed`.

    The batch steps until every env has finished its first episode (auto-reset rows keep
    stepping, their rewards ignored); a device env's batch shares one seed, so episode i's
    return depends on the batch size, unlike host envs.
    """
    env = make(env_id, seed, batch_size=episodes, **options)
    try:
        discrete = is_discrete(env.action_spec())
        timestep = env.reset()
        returns = np.zeros(episodes, np.float64)
        lengths = np.zeros(episodes, np.int64)
        active = np.ones(episodes, bool)
        while active.any():
            actions = np.asarray(policy(np.asarray(timestep.observation)))
            if discrete:
                actions = actions.reshape(episodes).astype(np.int32)
            elif actions.shape[:1] != (episodes,):
                raise ValueError(f"policy returned actions of shape {actions.shape} for a batch of {episodes}")
            timestep = env.step(actions)
            returns += np.where(active, np.asarray(timestep.reward, np.float64), 0.0)
            lengths += active
            active &= ~(np.asarray(timestep.step_type) == 2)
            if max_steps is not None:
                active &= lengths < max_steps
    finally:
        env.close()
    return returns, lengths


def _check_count(name: str, value, allow_none: bool = False) -> Optional[int]:
    if allow_none and value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise QrlInputError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _actions_for_envs(actions, batch_size: int, discrete: bool):
    """Policy output as one action per env: Python ints for discrete specs, rows otherwise."""
    actions = np.asarray(actions)
    if discrete:
        if actions.size != batch_size:
            raise ValueError(f"policy returned actions of shape {actions.shape} for a batch of {batch_size}")
        return actions.reshape(batch_size).tolist()
    if actions.shape[:1] != (batch_size,):
        raise ValueError(f"policy returned actions of shape {actions.shape} for a batch of {batch_size}")
    return actions


def evaluate(
    policy: Policy,
    env_id: str,
    episodes: int,
    seed: int = 0,
    max_steps: Optional[int] = None,
    env_options: Optional[Mapping[str, Any]] = None,
) -> EvalResult:
    """Runs `episodes` episodes of `policy` on `env_id`, episode i in an env seeded `seed + i`.

    All episodes run in parallel: each step calls `policy` once on `[episodes, ...]`
    observations (finished rows keep their last observation and their actions are ignored).
    Episode i's return therefore does not depend on how many episodes are requested (up to
    float rounding a batched policy may show at another batch size). `max_steps` cuts
    episodes longer than that many steps. Device ids (`brax:`, `gymnax:`) run as one batch of
    `episodes` envs seeded `seed` (see `_evaluate_batched`).
    """
    episodes = _check_count("episodes", episodes)
    max_steps = _check_count("max_steps", max_steps, allow_none=True)
    seed = check_seed(seed)
    options = dict(env_options or {})
    if _is_device_id(env_id):
        returns, lengths = _evaluate_batched(policy, env_id, episodes, seed, max_steps, options)
        return EvalResult(env_id=env_id, seed=seed, mean=float(np.mean(returns)), std=float(np.std(returns)),
                          returns=tuple(float(v) for v in returns), lengths=tuple(int(v) for v in lengths))
    envs = [make(env_id, seed + index, **options) for index in range(episodes)]
    returns, lengths = _run_host_episodes(policy, envs, max_steps)
    return EvalResult(
        env_id=env_id,
        seed=seed,
        mean=float(np.mean(returns)),
        std=float(np.std(returns)),
        returns=tuple(float(value) for value in returns),
        lengths=tuple(int(value) for value in lengths),
    )


def _run_host_episodes(policy: Policy, envs: list, max_steps: Optional[int]) -> tuple[np.ndarray, np.ndarray]:
    """Returns and lengths of one episode in each of `envs` (closed afterwards), all stepped side
    by side with one `policy` call per step on every env's observation."""
    episodes = len(envs)
    try:
        discrete = is_discrete(envs[0].action_spec())
        observations = np.stack([env.reset().observation for env in envs])
        returns = np.zeros(episodes, np.float64)
        lengths = np.zeros(episodes, np.int64)
        active = list(range(episodes))
        while active:
            actions = _actions_for_envs(policy(observations), episodes, discrete)
            observations = observations.copy()
            still_active = []
            for index in active:
                timestep = envs[index].step(actions[index])
                returns[index] += timestep.reward
                lengths[index] += 1
                observations[index] = timestep.observation
                if not timestep.last() and (max_steps is None or lengths[index] < max_steps):
                    still_active.append(index)
            active = still_active
    finally:
        for env in envs:
            env.close()
    return returns, lengths


def evaluate_many(
    policy: Callable[[np.ndarray], Any],
    env_id: str,
    seeds: Sequence[int],
    episodes: int,
    max_steps: Optional[int] = None,
    env_options: Optional[Mapping[str, Any]] = None,
) -> list[EvalResult]:
    """`evaluate` for G policies at once: `policy(obs [G, E, ...]) -> actions [G, E, ...]` (G =
    `len(seeds)`, E = `episodes`), policy g's episode i in an env seeded `seeds[g] + i`, exactly
    the envs `evaluate(..., seed=seeds[g])` would make. All G x E episodes step side by side, so a
    batch of trained configurations is evaluated with one policy call per step. Host envs only."""
    episodes = _check_count("episodes", episodes)
    max_steps = _check_count("max_steps", max_steps, allow_none=True)
    seeds = [check_seed(seed) for seed in seeds]
    if not seeds:
        raise QrlInputError("evaluate_many needs at least one seed")
    if _is_device_id(env_id):
        raise QrlInputError(f"evaluate_many runs host environments; {env_id} is a device environment")
    options = dict(env_options or {})
    groups = len(seeds)
    envs = [make(env_id, seed + index, **options) for seed in seeds for index in range(episodes)]

    def flat_policy(observations):
        actions = np.asarray(policy(observations.reshape(groups, episodes, *observations.shape[1:])))
        return actions.reshape(groups * episodes, *actions.shape[2:])

    returns, lengths = _run_host_episodes(flat_policy, envs, max_steps)
    returns, lengths = returns.reshape(groups, episodes), lengths.reshape(groups, episodes)
    return [EvalResult(env_id=env_id, seed=seed, mean=float(np.mean(returns[g])), std=float(np.std(returns[g])),
                       returns=tuple(float(v) for v in returns[g]), lengths=tuple(int(v) for v in lengths[g]))
            for g, seed in enumerate(seeds)]


def collect_observations(
    policy: Policy,
    env_id: str,
    num_steps: int,
    seed: int = 0,
    env_options: Optional[Mapping[str, Any]] = None,
) -> np.ndarray:
    """The `[num_steps, ...]` observations `policy` acts on in one env seeded `seed`.

    Episodes follow one another (a reset after each end); every returned observation is one
    the policy was called on (batch of 1), as quantization calibration and action-divergence
    measurements need. Device ids run a batch of one env.
    """
    num_steps = _check_count("num_steps", num_steps)
    seed = check_seed(seed)
    if _is_device_id(env_id):
        return _collect_batched(policy, env_id, num_steps, seed, dict(env_options or {}))
    env = make(env_id, seed, **dict(env_options or {}))
    try:
        discrete = is_discrete(env.action_spec())
        spec = env.observation_spec()
        observations = np.empty((num_steps,) + tuple(spec.shape), spec.dtype)
        observation = env.reset().observation
        for step in range(num_steps):
            observations[step] = observation
            action = _actions_for_envs(policy(observation[None]), 1, discrete)[0]
            timestep = env.step(action)
            observation = env.reset().observation if timestep.last() else timestep.observation
    finally:
        env.close()
    return observations


def _collect_batched(policy: Policy, env_id: str, num_steps: int, seed: int, options: Mapping[str, Any]) -> np.ndarray:
    """`collect_observations` on a device env (a batch of one, auto-reset)."""
    env = make(env_id, seed, batch_size=1, **options)
    try:
        discrete = is_discrete(env.action_spec())
        observation = np.asarray(env.reset().observation)
        observations = np.empty((num_steps,) + observation.shape[1:], observation.dtype)
        for step in range(num_steps):
            observations[step] = observation[0]
            actions = np.asarray(policy(observation))
            actions = actions.reshape(1).astype(np.int32) if discrete else actions.reshape((1,) + actions.shape[1:])
            observation = np.asarray(env.step(actions).observation)
    finally:
        env.close()
    return observations
