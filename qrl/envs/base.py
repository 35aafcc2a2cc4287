"""What every qrl dm_env adapter shares: reward/discount specs, spec accessors, close."""

import dm_env
import numpy as np
from dm_env import specs

REWARD_SPEC = specs.Array((), np.float32, name="reward")
DISCOUNT_SPEC = specs.BoundedArray((), np.float32, 0.0, 1.0, name="discount")


class AdapterEnvironment(dm_env.Environment):
    """Base of the adapters: subclasses set `_observation_spec`, `_action_spec` and, when they
    wrap an environment that must be closed, `_env`."""

    _env = None

    def observation_spec(self) -> specs.Array:
        return self._observation_spec

    def action_spec(self) -> specs.Array:
        return self._action_spec

    def reward_spec(self) -> specs.Array:
        return REWARD_SPEC

    def discount_spec(self) -> specs.BoundedArray:
        return DISCOUNT_SPEC

    def close(self) -> None:
        if self._env is not None and hasattr(self._env, "close"):
            self._env.close()
