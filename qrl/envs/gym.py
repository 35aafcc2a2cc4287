"""gymnasium environments (classic control, MuJoCo v5) as `dm_env` environments.

The adapter sits in hot host loops, so everything that can be decided once (observation
conversion, action offset, bound methods) is decided in the constructor; a step is one
gymnasium call plus a tuple.
"""

import functools
import warnings
from typing import Any, Callable, Optional

import dm_env
import gymnasium
import numpy as np
from dm_env import specs

from qrl.envs.base import AdapterEnvironment
from qrl.envs.ids import one_line, unknown_id_error
from qrl.errors import QrlInputError

_FIRST = dm_env.StepType.FIRST
_MID = dm_env.StepType.MID
_LAST = dm_env.StepType.LAST
_TimeStep = dm_env.TimeStep



def observation_converter(space: gymnasium.Space) -> tuple[Optional[Callable[[Any], np.ndarray]], int]:
    """How to turn one observation of `space` into float32 `[D]`, and `D`.

    Returns `None` as the converter when gymnasium already yields float32 vectors, so the hot
    path skips the call entirely.
    """
    if isinstance(space, gymnasium.spaces.Box):
        size = int(np.prod(space.shape, dtype=np.int64))
        if space.dtype == np.float32 and len(space.shape) == 1:
            return None, size
        return (lambda obs: np.asarray(obs, dtype=np.float32).reshape(-1)), size
    try:
        size = int(gymnasium.spaces.flatdim(space))
    except (NotImplementedError, ValueError) as error:
        raise QrlInputError(f"observation space {space} cannot be flattened to a vector") from error
    return (lambda obs: gymnasium.spaces.flatten(space, obs).astype(np.float32)), size


def action_spec_for(space: gymnasium.Space) -> specs.Array:
    """`DiscreteArray` for `Discrete`, float32 `BoundedArray` for `Box`; other spaces are input errors."""
    if isinstance(space, gymnasium.spaces.Discrete):
        return specs.DiscreteArray(int(space.n), dtype=np.int32, name="action")
    if isinstance(space, gymnasium.spaces.Box):
        return specs.BoundedArray(
            space.shape,
            np.float32,
            minimum=space.low.astype(np.float32),
            maximum=space.high.astype(np.float32),
            name="action",
        )
    raise QrlInputError(f"action space {space} is not supported (only Discrete and Box)")


class GymEnvironment(AdapterEnvironment):
    """A gymnasium env speaking `dm_env`: float32 `[D]` observations, terminal discount 0.

    Termination gives `dm_env.termination` (discount 0), truncation (time limit) gives
    `dm_env.truncation` (discount 1). The first reset seeds gymnasium with `seed`; later resets
    continue its RNG, so a fresh env with the same seed replays the same episodes. Stepping
    after a LAST step resets, as `dm_env` specifies.
    """

    def __init__(self, env: gymnasium.Env, seed: int):
        self._env = env
        self._next_seed: Optional[int] = seed
        self._convert, obs_size = observation_converter(env.observation_space)
        self._observation_spec = specs.Array((obs_size,), np.float32, name="observation")
        self._action_spec = action_spec_for(env.action_space)
        self._gym_step = env.step
        start = getattr(env.action_space, "start", 0)
        if isinstance(env.action_space, gymnasium.spaces.Discrete) and int(start) != 0:
            offset = int(start)
            self._gym_step = lambda action: env.step(int(action) + offset)
        self._needs_reset = True

    @property
    def gym_env(self) -> gymnasium.Env:
        """The wrapped gymnasium environment (for rendering or inspection)."""
        return self._env

    def reset(self) -> dm_env.TimeStep:
        obs, _ = self._env.reset(seed=self._next_seed)
        self._next_seed = None
        self._needs_reset = False
        if self._convert is not None:
            obs = self._convert(obs)
        return _TimeStep(_FIRST, None, None, obs)

    def step(self, action) -> dm_env.TimeStep:
        if self._needs_reset:
            return self.reset()
        obs, reward, terminated, truncated, _ = self._gym_step(action)
        if self._convert is not None:
            obs = self._convert(obs)
        if terminated:
            self._needs_reset = True
            return _TimeStep(_LAST, float(reward), 0.0, obs)
        if truncated:
            self._needs_reset = True
            return _TimeStep(_LAST, float(reward), 1.0, obs)
        return _TimeStep(_MID, float(reward), 1.0, obs)


def known_names() -> list[str]:
    """Registered gymnasium ids that this family serves (Atari has its own family)."""
    return [name for name in gymnasium.registry if not name.startswith("ALE/")]


# MuJoCo 3.17 deprecates an attribute of gymnasium's own HalfCheetah XML; its default handler
# prints that to stderr (and MUJOCO_LOG.TXT) on every make, burying one-line errors.
KNOWN_MUJOCO_WARNINGS = ("compiler attribute 'settotalmass' is deprecated",)


def _mujoco_warning(text: str) -> None:
    if not any(known in text for known in KNOWN_MUJOCO_WARNINGS):
        warnings.warn(f"MuJoCo: {text.strip()}", RuntimeWarning, stacklevel=2)


@functools.cache
def _route_mujoco_warnings() -> None:
    """MuJoCo's warnings become Python warnings, minus the known gymnasium-XML deprecations."""
    try:
        import mujoco
    except ImportError:
        return
    mujoco.set_mju_user_warning(_mujoco_warning)


def make(name: str, seed: int, **options) -> GymEnvironment:
    """`gym:<name>`: `gymnasium.make(name, **options)` behind the `dm_env` adapter."""
    _route_mujoco_warnings()
    if name.startswith("ALE/"):
        game = name[4:].split("-")[0]
        raise QrlInputError(f"Atari runs through the atari family with DQN preprocessing: use atari:{game}")
    if name not in gymnasium.registry:
        raise unknown_id_error("gym", name, known_names())
    try:
        env = gymnasium.make(name, **options)
    except TypeError as error:
        raise QrlInputError(f"bad options {sorted(options)} for gym:{name}: {one_line(error)}") from error
    except gymnasium.error.DependencyNotInstalled as error:
        raise QrlInputError(f"gym:{name} needs a package that is not installed: {one_line(error)}") from error
    return GymEnvironment(env, seed)
