"""Brax environments: the functional batched env for on-device loops, and a jitted adapter.

`make_brax` returns brax's own env wrapped for training (episode limit, vmap over a batch,
auto-reset) for `make_train(config) -> train(key)` loops under one `jit`/`scan`.
`make("brax:<name>", seed, batch_size=N)` wraps that env in `BraxEnvironment`, whose jitted
`reset`/`step` take and return `[N, ...]` device arrays as `BatchedTimeStep`s.

Brax's auto-reset restores each env's *first* state of the batch reset (it does not sample a
new initial state per episode), as in brax's own training.
"""

import functools
from typing import Optional

import dm_env
import jax
import jax.numpy as jnp
import numpy as np
from brax import envs as brax_envs
from brax.envs.wrappers import training
from dm_env import specs

from qrl.envs.base import AdapterEnvironment
from qrl.envs.ids import check_options, one_line, unknown_id_error
from qrl.envs.vector import BatchedTimeStep
from qrl.errors import QrlInputError

BACKENDS = ("spring", "positional", "generalized", "mjx")
DEFAULT_BACKEND = "spring"
OPTIONS = ("batch_size", "episode_length", "backend", "action_repeat")
FINAL_OBSERVATION = "final_obs"

_FIRST = int(dm_env.StepType.FIRST)
_MID = int(dm_env.StepType.MID)
_LAST = int(dm_env.StepType.LAST)


class RecordFinalObservation(brax_envs.Wrapper):
    """Keeps each step's observation in `state.info["final_obs"]` before auto-reset replaces it."""

    def reset(self, rng: jax.Array) -> brax_envs.State:
        state = self.env.reset(rng)
        state.info[FINAL_OBSERVATION] = state.obs
        return state

    def step(self, state: brax_envs.State, action: jax.Array) -> brax_envs.State:
        state = self.env.step(state, action)
        state.info[FINAL_OBSERVATION] = state.obs
        return state


def known_names() -> list[str]:
    """Names in brax's environment registry."""
    return sorted(getattr(brax_envs, "_envs", {}))


def _check_positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise QrlInputError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def make_brax(
    name: str,
    batch_size: int,
    episode_length: int = 1000,
    backend: str = DEFAULT_BACKEND,
    action_repeat: int = 1,
) -> brax_envs.Env:
    """The functional brax env `name`: `reset(key) -> State [N]`, `step(state, action [N, A])`.

    Wrapped as `brax.envs.create(..., batch_size=N)` does (episode limit inside a vmap over
    `batch_size`, then auto-reset), plus `state.info["final_obs"]`, the observation a step
    reached before auto-reset. `state.info["truncation"]` is 1 where the episode limit ended
    an episode. "spring" is the default backend: on CPU it compiled and stepped fastest of
    the four (halfcheetah, batch 2: about 8 s to compile reset+step, generalized 12 s, mjx
    19 s). Brax tunes halfcheetah for spring; most other envs are tuned for "generalized"
    (their own default), so pass that backend when physics fidelity matters more than speed.
    """
    if name not in known_names():
        raise unknown_id_error("brax", name, known_names())
    if backend not in BACKENDS:
        raise QrlInputError(f"unknown brax backend {backend!r}; known: {', '.join(BACKENDS)}")
    batch_size = _check_positive_int("batch_size", batch_size)
    episode_length = _check_positive_int("episode_length", episode_length)
    action_repeat = _check_positive_int("action_repeat", action_repeat)
    try:
        env = brax_envs.get_environment(name, backend=backend)
    except (TypeError, ValueError) as error:
        raise QrlInputError(f"cannot create brax:{name} with backend {backend}: {one_line(error)}") from error
    env = training.EpisodeWrapper(env, episode_length, action_repeat)
    env = training.VmapWrapper(env, batch_size)
    env = RecordFinalObservation(env)
    return training.AutoResetWrapper(env)


def _action_bounds(env: brax_envs.Env, action_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The actuators' control range, or [-1, 1] where the env does not define one."""
    try:
        ctrl_range = np.asarray(env.unwrapped.sys.actuator.ctrl_range, np.float32)
    except AttributeError:
        ctrl_range = np.zeros((0, 2), np.float32)
    if ctrl_range.shape != (action_size, 2):
        return -np.ones(action_size, np.float32), np.ones(action_size, np.float32)
    return ctrl_range[:, 0].copy(), ctrl_range[:, 1].copy()


class BraxEnvironment(AdapterEnvironment):
    """A batch of N brax envs behind jitted `reset()` / `step(actions [N, A])`.

    Both return `BatchedTimeStep`s of device arrays (`observation` float32 `[N, D]`); specs
    describe one env. Termination gives discount 0, the episode limit discount 1. Resets
    split a key seeded with `seed`, so a fresh env with the same seed replays the same states.
    """

    def __init__(self, env: brax_envs.Env, seed: int, batch_size: int, jitted: Optional[tuple] = None):
        self._env = env
        self._batch_size = batch_size
        self._key = jax.random.PRNGKey(seed)
        self._state: Optional[brax_envs.State] = None
        self._reset_fn, self._step_fn = jitted or (jax.jit(self._reset_batch), jax.jit(self._step_batch))
        action_size = int(env.action_size)
        minimum, maximum = _action_bounds(env, action_size)
        self._action_spec = specs.BoundedArray((action_size,), np.float32, minimum, maximum, name="action")
        self._observation_spec: Optional[specs.Array] = None

    @property
    def brax_env(self) -> brax_envs.Env:
        """The functional env (see `make_brax`)."""
        return self._env

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def state(self) -> Optional[brax_envs.State]:
        """The current batched brax state (None before the first reset)."""
        return self._state

    def _reset_batch(self, key: jax.Array) -> tuple[jax.Array, brax_envs.State, BatchedTimeStep]:
        key, reset_key = jax.random.split(key)
        state = self._env.reset(reset_key)
        observation = state.obs.astype(jnp.float32)
        timestep = BatchedTimeStep(
            step_type=jnp.full((self._batch_size,), _FIRST, jnp.int8),
            reward=jnp.zeros((self._batch_size,), jnp.float32),
            discount=jnp.ones((self._batch_size,), jnp.float32),
            observation=observation,
            final_observation=observation,
        )
        return key, state, timestep

    def _step_batch(self, state: brax_envs.State, action: jax.Array) -> tuple[brax_envs.State, BatchedTimeStep]:
        state = self._env.step(state, action.astype(jnp.float32))
        done = state.done > 0
        terminated = done & (state.info["truncation"] == 0)
        timestep = BatchedTimeStep(
            step_type=jnp.where(done, _LAST, _MID).astype(jnp.int8),
            reward=state.reward.astype(jnp.float32),
            discount=jnp.where(terminated, 0.0, 1.0).astype(jnp.float32),
            observation=state.obs.astype(jnp.float32),
            final_observation=state.info[FINAL_OBSERVATION].astype(jnp.float32),
        )
        return state, timestep

    def reset(self) -> BatchedTimeStep:
        self._key, self._state, timestep = self._reset_fn(self._key)
        return timestep

    def step(self, action) -> BatchedTimeStep:
        if self._state is None:
            return self.reset()
        self._state, timestep = self._step_fn(self._state, jnp.asarray(action))
        return timestep

    def observation_spec(self) -> specs.Array:
        if self._observation_spec is None:
            _, _, timestep = jax.eval_shape(self._reset_fn, self._key)
            size = int(timestep.observation.shape[-1])
            self._observation_spec = specs.Array((size,), np.float32, name="observation")
        return self._observation_spec



@functools.lru_cache(maxsize=16)
def _shared_batch(name: str, batch_size: int, options: tuple) -> BraxEnvironment:
    """One env per (name, batch size, options) and process, whose jitted reset/step later
    environments reuse: each new compile of a brax step costs 10-20 s on this CPU."""
    return BraxEnvironment(make_brax(name, batch_size, **dict(options)), 0, batch_size)


def make(name: str, seed: int, **options) -> BraxEnvironment:
    """`brax:<name>` with options `batch_size` (default 1), `episode_length`, `backend`, `action_repeat`.

    Environments with the same name, batch size and options share their compiled functions.
    """
    check_options(f"brax:{name}", options, OPTIONS)
    batch_size = _check_positive_int("batch_size", options.pop("batch_size", 1))
    shared = _shared_batch(name, batch_size, tuple(sorted(options.items())))
    return BraxEnvironment(shared.brax_env, seed, batch_size, jitted=(shared._reset_fn, shared._step_fn))
