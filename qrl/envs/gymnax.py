"""gymnax environments (JAX-native classic control, MinAtar, bsuite) for on-device loops.

`make_functional(name, num_envs)` vmaps gymnax's `reset`/`step` over N environments as a
`qrl.envs.functional.FunctionalEnv` (gymnax 1.x auto-resets inside `step` and reports
`terminated`, `truncated` and the `final_observation` separately, so time limits keep
bootstrapping). `make("gymnax:<name>", seed, batch_size=N)` puts jitted stateful
`reset()`/`step(actions [N])` in front of it, returning `BatchedTimeStep`s of device arrays.
Observations are float32; discrete actions are int32 `DiscreteArray`s, continuous ones
float32 `BoundedArray`s with the environment's bounds.
"""

from typing import Optional

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
from dm_env import specs
from gymnax.environments import spaces

from qrl.envs.functional import FunctionalEnv, FunctionalEnvironment, timestep_from_step
from qrl.envs.ids import check_options, unknown_id_error
from qrl.errors import QrlInputError

OPTIONS = ("batch_size", "episode_length")


def known_names() -> list[str]:
    """Names in gymnax's registry (`CartPole-v1`, `Pendulum-v1`, `Breakout-MinAtar`, ...)."""
    return list(gymnax.registered_envs)


def _check_positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise QrlInputError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def make_gymnax(name: str, episode_length: Optional[int] = None):
    """gymnax's `(env, params)` for `name`; `episode_length` replaces its step limit."""
    if name not in known_names():
        raise unknown_id_error("gymnax", name, known_names())
    env, params = gymnax.make(name)
    if episode_length is not None:
        params = params.replace(max_steps_in_episode=_check_positive_int("episode_length", episode_length))
    return env, params


def _action_spec(space) -> specs.Array:
    if isinstance(space, spaces.Discrete):
        return specs.DiscreteArray(int(space.n), dtype=np.int32, name="action")
    if isinstance(space, spaces.Box):
        shape = tuple(int(dim) for dim in space.shape)
        minimum = np.broadcast_to(np.asarray(space.low, np.float32), shape).copy()
        maximum = np.broadcast_to(np.asarray(space.high, np.float32), shape).copy()
        return specs.BoundedArray(shape, np.float32, minimum, maximum, name="action")
    raise QrlInputError(f"gymnax action space {space!r} is not supported (Discrete and Box are)")


def make_functional(name: str, num_envs: int, episode_length: Optional[int] = None, **unknown_options) -> FunctionalEnv:
    """`gymnax:<name>` as a `FunctionalEnv` of `num_envs` environments (keys split per env)."""
    check_options(f"gymnax:{name}", unknown_options, ("episode_length",))
    env, params = make_gymnax(name, episode_length)
    num_envs = _check_positive_int("num_envs", num_envs)
    batched_reset = jax.vmap(env.reset, in_axes=(0, None))
    batched_step = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    def reset(key):
        observation, state = batched_reset(jax.random.split(key, num_envs), params)
        return state, observation.astype(jnp.float32)

    def step(state, actions, key):
        observation, state, reward, terminated, truncated, info = batched_step(
            jax.random.split(key, num_envs), state, actions, params
        )
        done = jnp.logical_or(terminated, truncated)
        return state, timestep_from_step(reward, terminated, done, observation, info["final_observation"])

    observation_shape = tuple(int(dim) for dim in env.observation_space(params).shape)
    return FunctionalEnv(
        env_id=f"gymnax:{name}",
        num_envs=num_envs,
        episode_length=int(params.max_steps_in_episode),
        reset=reset,
        step=step,
        _observation_spec=specs.Array(observation_shape, np.float32, name="observation"),
        _action_spec=_action_spec(env.action_space(params)),
    )


def make(name: str, seed: int, **options) -> FunctionalEnvironment:
    """`gymnax:<name>` with options `batch_size` (default 1) and `episode_length`."""
    check_options(f"gymnax:{name}", options, OPTIONS)
    batch_size = _check_positive_int("batch_size", options.pop("batch_size", 1))
    return FunctionalEnvironment(make_functional(name, batch_size, **options), seed)
