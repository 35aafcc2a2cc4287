"""One functional batched environment interface for on-device loops over brax and gymnax.

A `FunctionalEnv` is N environments of one id as two pure functions that run under
`jit`, `lax.scan` and `vmap` (over seeds):

    env = make_functional("gymnax:CartPole-v1", num_envs=4)
    env_state, observation = env.reset(key)                 # observation [N, D] float32
    env_state, timestep = env.step(env_state, actions, key)  # actions [N] int32 or [N, A]

`timestep` is a `BatchedTimeStep` of device arrays with auto-reset folded in, exactly as the
host `VectorEnv` returns them: `step_type` MID or LAST, `reward`, `discount` (0 on
termination, 1 on truncation and mid-episode), `observation` (the next episode's first one
after LAST) and `final_observation` (the observation this step reached, to bootstrap from).
Specs describe one environment. `FunctionalEnvironment` puts a stateful, jitted
`reset()` / `step(actions)` in front of one for interactive use.
"""

import dataclasses
from typing import Any, Callable, Optional

import dm_env
import jax
import jax.numpy as jnp
import numpy as np
from dm_env import specs

from qrl.envs.base import AdapterEnvironment
from qrl.envs.ids import DEVICE_FAMILIES, HOST_FAMILIES, check_options, split_env_id
from qrl.envs.vector import BatchedTimeStep
from qrl.errors import QrlInputError

BRAX_OPTIONS = ("episode_length", "backend", "action_repeat")

_FIRST = int(dm_env.StepType.FIRST)
_MID = int(dm_env.StepType.MID)
_LAST = int(dm_env.StepType.LAST)

ResetFn = Callable[[jax.Array], tuple[Any, jax.Array]]
StepFn = Callable[[Any, jax.Array, jax.Array], tuple[Any, BatchedTimeStep]]


@dataclasses.dataclass(frozen=True, eq=False)
class FunctionalEnv:
    """N environments of `env_id` as pure functions (see the module docstring).

    Attributes:
      env_id: the `family:name` id.
      num_envs: N, the batch every call works on.
      episode_length: steps after which an episode is truncated (discount 1).
      reset: `key -> (env_state, observation [N, ...] float32)`.
      step: `(env_state, actions [N, ...], key) -> (env_state, BatchedTimeStep [N])`.
    """

    env_id: str
    num_envs: int
    episode_length: int
    reset: ResetFn
    step: StepFn
    _observation_spec: specs.Array
    _action_spec: specs.Array

    def observation_spec(self) -> specs.Array:
        """The spec of one environment's observation (no batch axis)."""
        return self._observation_spec

    def action_spec(self) -> specs.Array:
        """The spec of one environment's action (no batch axis)."""
        return self._action_spec


def timestep_from_step(
    reward: jax.Array, terminated: jax.Array, done: jax.Array, observation: jax.Array, final_observation: jax.Array
) -> BatchedTimeStep:
    """A `BatchedTimeStep` `[N]` from one auto-resetting batched step (all arrays `[N, ...]`)."""
    return BatchedTimeStep(
        step_type=jnp.where(done, _LAST, _MID).astype(jnp.int8),
        reward=reward.astype(jnp.float32),
        discount=jnp.where(terminated, 0.0, 1.0).astype(jnp.float32),
        observation=observation.astype(jnp.float32),
        final_observation=final_observation.astype(jnp.float32),
    )


def _brax_functional(name: str, num_envs: int, **options) -> FunctionalEnv:
    """`brax:<name>` as a `FunctionalEnv`; brax steps are deterministic (the key is unused)."""
    from qrl.envs import brax as brax_family

    check_options(f"brax:{name}", options, BRAX_OPTIONS)
    episode_length = options.get("episode_length", 1000)
    env = brax_family.make_brax(name, num_envs, **options)

    def reset(key):
        state = env.reset(key)
        return state, state.obs.astype(jnp.float32)

    def step(state, actions, key):
        del key
        state = env.step(state, actions.astype(jnp.float32))
        done = state.done > 0
        terminated = done & (state.info["truncation"] == 0)
        final_observation = state.info[brax_family.FINAL_OBSERVATION]
        return state, timestep_from_step(state.reward, terminated, done, state.obs, final_observation)

    action_size = int(env.action_size)
    minimum, maximum = brax_family._action_bounds(env, action_size)
    _, observation = jax.eval_shape(reset, jax.random.PRNGKey(0))
    return FunctionalEnv(
        env_id=f"brax:{name}",
        num_envs=num_envs,
        episode_length=int(episode_length),
        reset=reset,
        step=step,
        _observation_spec=specs.Array((int(observation.shape[-1]),), np.float32, name="observation"),
        _action_spec=specs.BoundedArray((action_size,), np.float32, minimum, maximum, name="action"),
    )


def make_functional(env_id: str, num_envs: int, **options) -> FunctionalEnv:
    """`num_envs` environments of a device id (`brax:<name>`, `gymnax:<name>`) as a `FunctionalEnv`.

    Options: brax `episode_length` (default 1000), `backend`, `action_repeat`; gymnax
    `episode_length` (default: the environment's own limit). Host ids and unknown names or
    options raise `QrlInputError` with one line.
    """
    family, name = split_env_id(env_id)
    if family in HOST_FAMILIES:
        raise QrlInputError(
            f"make_functional takes device ids ({', '.join(DEVICE_FAMILIES)}); {env_id} runs on the host: "
            "use qrl.envs.make_vector"
        )
    if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)) or num_envs < 1:
        raise QrlInputError(f"num_envs must be a positive integer, got {num_envs!r}")
    if family == "brax":
        return _brax_functional(name, int(num_envs), **options)
    from qrl.envs import gymnax as gymnax_family

    return gymnax_family.make_functional(name, int(num_envs), **options)


def is_device_id(env_id: str) -> bool:
    """Whether `env_id` names a JAX-native family that runs on device (brax, gymnax)."""
    family, _ = split_env_id(env_id)
    return family in DEVICE_FAMILIES


def episode_returns(
    env: FunctionalEnv, policy: Callable[[jax.Array], jax.Array], key: jax.Array, max_steps: Optional[int] = None
) -> tuple[jax.Array, jax.Array]:
    """Undiscounted returns and lengths `[N]` of each env's first episode under `policy`.

    `policy(observation [N, ...]) -> actions [N, ...]`. Runs `max_steps` (default the env's
    `episode_length`) steps in one `lax.scan`; rows whose episode ended stop accumulating.
    Pure: jit it, or call it inside a jitted training function.
    """
    steps = env.episode_length if max_steps is None else int(max_steps)
    reset_key, key = jax.random.split(key)
    env_state, observation = env.reset(reset_key)
    zeros = jnp.zeros((env.num_envs,), jnp.float32)

    def one_step(carry, step_key):
        env_state, observation, returns, lengths, active = carry
        env_state, timestep = env.step(env_state, policy(observation), step_key)
        returns = returns + jnp.where(active, timestep.reward, 0.0)
        lengths = lengths + active.astype(jnp.int32)
        active = active & (timestep.step_type != _LAST)
        return (env_state, timestep.observation, returns, lengths, active), None

    carry = (env_state, observation, zeros, jnp.zeros((env.num_envs,), jnp.int32), jnp.ones((env.num_envs,), bool))
    (_, _, returns, lengths, _), _ = jax.lax.scan(one_step, carry, jax.random.split(key, steps))
    return returns, lengths


class FunctionalEnvironment(AdapterEnvironment):
    """A `FunctionalEnv` behind stateful, jitted `reset()` / `step(actions [N, ...])`.

    Both return `BatchedTimeStep`s of device arrays (reset's rows are FIRST); the env's key is
    seeded with `seed` and split at every call, so a fresh adapter with the same seed replays
    the same states.
    """

    def __init__(self, env: FunctionalEnv, seed: int):
        self._functional = env
        self._key = jax.random.PRNGKey(seed)
        self._state = None
        self._reset_fn = jax.jit(self._reset_batch)
        self._step_fn = jax.jit(self._step_batch)
        self._observation_spec = env.observation_spec()
        self._action_spec = env.action_spec()

    @property
    def functional_env(self) -> FunctionalEnv:
        return self._functional

    @property
    def batch_size(self) -> int:
        return self._functional.num_envs

    def _reset_batch(self, key):
        key, reset_key = jax.random.split(key)
        state, observation = self._functional.reset(reset_key)
        count = self._functional.num_envs
        timestep = BatchedTimeStep(
            step_type=jnp.full((count,), _FIRST, jnp.int8),
            reward=jnp.zeros((count,), jnp.float32),
            discount=jnp.ones((count,), jnp.float32),
            observation=observation,
            final_observation=observation,
        )
        return key, state, timestep

    def _step_batch(self, key, state, actions):
        key, step_key = jax.random.split(key)
        state, timestep = self._functional.step(state, actions, step_key)
        return key, state, timestep

    def reset(self) -> BatchedTimeStep:
        self._key, self._state, timestep = self._reset_fn(self._key)
        return timestep

    def step(self, action) -> BatchedTimeStep:
        if self._state is None:
            return self.reset()
        self._key, self._state, timestep = self._step_fn(self._key, self._state, jnp.asarray(action))
        return timestep
