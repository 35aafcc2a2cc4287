"""dm_control suite tasks with observations flattened to one float32 vector.

The suite already speaks `dm_env`; this adapter only concatenates the observation dict (in
the spec's fixed key order) into float32 `[D]` and casts the action spec to float32.
"""

from typing import Optional

import dm_env
import numpy as np
from dm_control import suite
from dm_env import specs

from qrl.envs.base import AdapterEnvironment
from qrl.envs.ids import check_options, unknown_id_error
from qrl.errors import QrlInputError

OPTIONS = ("time_limit", "environment_kwargs")

_TimeStep = dm_env.TimeStep


class DmcEnvironment(AdapterEnvironment):
    """A suite task with observations flattened to float32 `[D]` and float32 actions.

    `task_kwargs={"random": seed}` seeds the task once, so resets continue its RNG and a fresh
    env with the same seed replays the same episodes. Time limits end episodes with discount 1.
    """

    def __init__(self, env: dm_env.Environment):
        self._env = env
        self._slices: list[tuple[str, slice]] = []
        start = 0
        for key, spec in env.observation_spec().items():
            size = int(np.prod(spec.shape, dtype=np.int64))
            self._slices.append((key, slice(start, start + size)))
            start += size
        self._observation_spec = specs.Array((start,), np.float32, name="observation")
        action_spec = env.action_spec()
        self._action_spec = specs.BoundedArray(
            action_spec.shape,
            np.float32,
            minimum=np.asarray(action_spec.minimum, np.float32),
            maximum=np.asarray(action_spec.maximum, np.float32),
            name="action",
        )

    @property
    def dmc_env(self) -> dm_env.Environment:
        """The wrapped suite environment (physics, rendering)."""
        return self._env

    def _flatten(self, observation) -> np.ndarray:
        flat = np.empty(self._observation_spec.shape, np.float32)
        for key, where in self._slices:
            flat[where] = np.ravel(observation[key])
        return flat

    def _convert(self, timestep: dm_env.TimeStep) -> dm_env.TimeStep:
        reward: Optional[float] = None if timestep.reward is None else float(timestep.reward)
        discount: Optional[float] = None if timestep.discount is None else float(timestep.discount)
        return _TimeStep(timestep.step_type, reward, discount, self._flatten(timestep.observation))

    def reset(self) -> dm_env.TimeStep:
        return self._convert(self._env.reset())

    def step(self, action) -> dm_env.TimeStep:
        return self._convert(self._env.step(action))


def known_names() -> list[str]:
    """Every suite task as `domain-task`."""
    return [f"{domain}-{task}" for domain, task in suite.ALL_TASKS]


def make(name: str, seed: int, **options) -> DmcEnvironment:
    """`dmc:<domain>-<task>`; domains may contain underscores, so split on the first `-`.

    Options: `time_limit` (seconds, passed to the task) and `environment_kwargs` (a dict for
    `control.Environment`, e.g. `{"n_sub_steps": 2}`).
    """
    check_options(f"dmc:{name}", options, OPTIONS)
    domain, _, task = name.partition("-")
    if (domain, task) not in suite.ALL_TASKS:
        raise unknown_id_error("dmc", name, known_names())
    task_kwargs: dict = {"random": seed}
    if "time_limit" in options:
        time_limit = options["time_limit"]
        if not isinstance(time_limit, (int, float)) or isinstance(time_limit, bool) or time_limit <= 0:
            raise QrlInputError(f"time_limit must be a positive number of seconds, got {time_limit!r}")
        task_kwargs["time_limit"] = float(time_limit)
    environment_kwargs = options.get("environment_kwargs")
    if environment_kwargs is not None and not isinstance(environment_kwargs, dict):
        raise QrlInputError(f"environment_kwargs must be a dict, got {environment_kwargs!r}")
    env = suite.load(domain, task, task_kwargs=task_kwargs, environment_kwargs=environment_kwargs)
    return DmcEnvironment(env)
