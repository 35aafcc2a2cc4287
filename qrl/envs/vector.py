"""N host environments stepped in one process, with auto-reset and batched numpy arrays.

`step` resets an environment as soon as its episode ends, in the same call: the returned
`observation` row is then the first observation of the next episode, and `final_observation`
keeps the last observation of the finished one, so learners bootstrap from the right state:

    transition = (obs, action, step.reward, step.discount, step.final_observation)
    obs = step.observation
"""

from typing import NamedTuple

import dm_env
import numpy as np
from dm_env import specs

from qrl.envs.action_specs import is_discrete
from qrl.envs.ids import HOST_FAMILIES, check_seed, split_env_id
from qrl.envs.registry import make
from qrl.errors import QrlInputError

_FIRST = int(dm_env.StepType.FIRST)
_MID = int(dm_env.StepType.MID)
_LAST = int(dm_env.StepType.LAST)


class BatchedTimeStep(NamedTuple):
    """One step of N environments. Fields are arrays with a leading batch axis `[N]`.

    step_type: int8 `[N]`, a `dm_env.StepType` per row: FIRST only from a reset, LAST when the
        episode ended in this step, MID otherwise.
    reward: float32 `[N]` (0 on FIRST).
    discount: float32 `[N]`: 0 on termination, 1 on truncation and mid-episode.
    observation: `[N, ...]`, what to act on next (the next episode's first one after LAST).
    final_observation: `[N, ...]`, the observation this step reached (differs from
        `observation` only on LAST rows): the next state for learning.
    """

    step_type: np.ndarray
    reward: np.ndarray
    discount: np.ndarray
    observation: np.ndarray
    final_observation: np.ndarray

    def first(self) -> np.ndarray:
        """bool `[N]`: rows that come straight from a reset."""
        return self.step_type == _FIRST

    def mid(self) -> np.ndarray:
        """bool `[N]`: rows in the middle of an episode."""
        return self.step_type == _MID

    def last(self) -> np.ndarray:
        """bool `[N]`: rows whose episode ended in this step (and were reset)."""
        return self.step_type == _LAST


class VectorEnv:
    """N `dm_env` environments of one id, seeded `seed + i`, stepped together with auto-reset."""

    def __init__(self, envs: list[dm_env.Environment]):
        if not envs:
            raise QrlInputError("a vector environment needs at least one environment")
        self._envs = envs
        self._observation_spec = envs[0].observation_spec()
        self._action_spec = envs[0].action_spec()
        self._discrete = is_discrete(self._action_spec)
        self._obs_shape = (len(envs),) + tuple(self._observation_spec.shape)
        self._obs_dtype = self._observation_spec.dtype

    @property
    def num_envs(self) -> int:
        return len(self._envs)

    @property
    def envs(self) -> list[dm_env.Environment]:
        """The single environments, in seed order."""
        return self._envs

    def observation_spec(self) -> specs.Array:
        """The spec of one environment's observation (no batch axis)."""
        return self._observation_spec

    def action_spec(self) -> specs.Array:
        """The spec of one environment's action (no batch axis)."""
        return self._action_spec

    def reset(self) -> np.ndarray:
        """Resets every environment; returns observations `[N, ...]`."""
        observation = np.empty(self._obs_shape, self._obs_dtype)
        for index, env in enumerate(self._envs):
            observation[index] = env.reset().observation
        return observation

    def step(self, actions) -> BatchedTimeStep:
        """Steps every environment with `actions [N, ...]`; finished episodes restart at once.

        An environment that was never reset starts its episode here (a FIRST row).
        """
        count = len(self._envs)
        actions = np.asarray(actions)
        if self._discrete and actions.size == count:
            per_env_actions = actions.reshape(count).tolist()
        elif not self._discrete and actions.shape[:1] == (count,):
            per_env_actions = actions
        else:
            raise ValueError(f"expected one action per environment ({count}), got shape {actions.shape}")
        final_observation = np.empty(self._obs_shape, self._obs_dtype)
        reward = np.empty(count, np.float32)
        discount = np.empty(count, np.float32)
        step_type = np.full(count, _MID, np.int8)
        restarted = []
        for index, (env, action) in enumerate(zip(self._envs, per_env_actions)):
            timestep = env.step(action)
            final_observation[index] = timestep.observation
            if timestep.step_type == _FIRST:
                step_type[index] = _FIRST
                reward[index] = 0.0
                discount[index] = 1.0
                continue
            reward[index] = timestep.reward
            discount[index] = timestep.discount
            if timestep.step_type == _LAST:
                step_type[index] = _LAST
                restarted.append((index, env.reset().observation))
        observation = final_observation.copy()
        for index, first_observation in restarted:
            observation[index] = first_observation
        return BatchedTimeStep(step_type, reward, discount, observation, final_observation)

    def close(self) -> None:
        for env in self._envs:
            env.close()


class DeviceBatchVector:
    """`VectorEnv`'s interface over a device-batched env (`brax:` / `gymnax:` ids, N envs behind
    one jitted step): numpy observations and `BatchedTimeStep`s, auto-reset inside the env.

    Lets host loops (dataset generation, `qrl.offpolicy.train_host`) run device ids. Each step
    is one jitted call plus a device-to-host copy, so it pays where the physics dominates, not
    where the on-device loops would run thousands of steps per call.
    """

    def __init__(self, env: dm_env.Environment):
        self._env = env
        self._num_envs = int(env.batch_size)

    @property
    def num_envs(self) -> int:
        return self._num_envs

    def observation_spec(self) -> specs.Array:
        return self._env.observation_spec()

    def action_spec(self) -> specs.Array:
        return self._env.action_spec()

    def reset(self) -> np.ndarray:
        return np.asarray(self._env.reset().observation)

    def step(self, actions) -> BatchedTimeStep:
        timestep = self._env.step(np.asarray(actions, np.float32))
        return BatchedTimeStep(*(np.asarray(field) for field in timestep))

    def close(self) -> None:
        self._env.close()


def make_host_vector(env_id: str, num_envs: int, seed: int = 0, **options):
    """`make_vector` for host ids; for device ids (brax, gymnax) one batched env of `num_envs`
    behind the same interface (`DeviceBatchVector`)."""
    family, _ = split_env_id(env_id)
    if family in HOST_FAMILIES:
        return make_vector(env_id, num_envs, seed, **options)
    if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)) or num_envs < 1:
        raise QrlInputError(f"num_envs must be a positive integer, got {num_envs!r}")
    if "batch_size" in options:
        raise QrlInputError(f"{env_id}: give num_envs, not the batch_size option")
    return DeviceBatchVector(make(env_id, seed, batch_size=int(num_envs), **options))


def make_vector(env_id: str, num_envs: int, seed: int = 0, **options) -> VectorEnv:
    """`num_envs` host environments of `env_id` (gym, atari, dmc) seeded `seed + i`.

    Brax ids are batched already: use `make("brax:<name>", seed, batch_size=N)`.
    """
    family, _ = split_env_id(env_id)
    seed = check_seed(seed)
    if family not in HOST_FAMILIES:
        raise QrlInputError(
            f"make_vector takes host ids ({', '.join(HOST_FAMILIES)}); {env_id} is batched on device: "
            f"use make({env_id!r}, seed, batch_size=N)"
        )
    if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)) or num_envs < 1:
        raise QrlInputError(f"num_envs must be a positive integer, got {num_envs!r}")
    return VectorEnv([make(env_id, seed + index, **options) for index in range(int(num_envs))])
