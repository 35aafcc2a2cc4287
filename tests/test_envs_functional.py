"""qrl.envs.functional and the gymnax family: pure batched reset/step, auto-reset, final observations."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from dm_env import StepType, specs

from qrl.envs import episode_returns, is_device_id, make, make_functional, make_vector
from qrl.errors import QrlInputError

CARTPOLE_THETA_LIMIT = 12 * 2 * np.pi / 360


def _run(env, actions, steps, seed=0):
    """Steps `env` from a reset with constant `actions` for `steps` steps (one jitted scan)."""

    def rollout(key):
        reset_key, key = jax.random.split(key)
        state, observation = env.reset(reset_key)

        def one(state, step_key):
            state, timestep = env.step(state, actions, step_key)
            return state, timestep

        _, timesteps = jax.lax.scan(one, state, jax.random.split(key, steps))
        return observation, timesteps

    observation, timesteps = jax.jit(rollout)(jax.random.PRNGKey(seed))
    return np.asarray(observation), jax.tree.map(np.asarray, timesteps)


def test_gymnax_cartpole_specs_termination_and_auto_reset():
    env = make_functional("gymnax:CartPole-v1", 3)
    assert env.num_envs == 3 and env.episode_length == 500
    assert env.observation_spec() == specs.Array((4,), np.float32)
    assert isinstance(env.action_spec(), specs.DiscreteArray) and env.action_spec().num_values == 2
    first, steps = _run(env, jnp.zeros(3, jnp.int32), 15)
    assert first.shape == (3, 4) and first.dtype == np.float32
    assert steps.observation.shape == (15, 3, 4) and steps.reward.dtype == np.float32
    last = steps.step_type == int(StepType.LAST)
    assert set(np.unique(steps.step_type)) <= {int(StepType.MID), int(StepType.LAST)}
    assert last.any(axis=0).all()  # always pushing left ends every episode within 15 steps
    np.testing.assert_array_equal(steps.discount, np.where(last, 0.0, 1.0))  # terminations
    np.testing.assert_array_equal(steps.observation[~last], steps.final_observation[~last])
    for t, row in zip(*np.nonzero(last)):
        x, _, theta, _ = steps.final_observation[t, row]
        assert abs(theta) > CARTPOLE_THETA_LIMIT or abs(x) > 2.4
        assert np.all(np.abs(steps.observation[t, row]) <= 0.05)  # a fresh reset state


def test_gymnax_truncation_keeps_discount_and_final_observation():
    env = make_functional("gymnax:Pendulum-v1", 2, episode_length=3)
    assert env.episode_length == 3
    spec = env.action_spec()
    assert isinstance(spec, specs.BoundedArray) and spec.shape == (1,)
    np.testing.assert_array_equal(spec.minimum, [-2.0]) and np.testing.assert_array_equal(spec.maximum, [2.0])
    _, steps = _run(env, jnp.ones((2, 1), jnp.float32), 4)
    np.testing.assert_array_equal(steps.step_type[:, 0], [1, 1, 2, 1])
    np.testing.assert_array_equal(steps.discount, np.ones((4, 2)))  # time limits bootstrap
    assert not np.allclose(steps.final_observation[2], steps.observation[2])


def test_episode_returns_counts_each_first_episode_once():
    env = make_functional("gymnax:CartPole-v1", 4)
    returns, lengths = jax.jit(
        lambda key: episode_returns(env, lambda observation: jnp.zeros(observation.shape[0], jnp.int32), key, 30)
    )(jax.random.PRNGKey(0))
    returns, lengths = np.asarray(returns), np.asarray(lengths)
    assert returns.shape == (4,) and np.all((lengths >= 8) & (lengths <= 12))
    np.testing.assert_array_equal(returns, lengths)  # CartPole pays 1 per step


def test_functional_env_vmaps_over_seeds():
    env = make_functional("gymnax:CartPole-v1", 2)
    _, observations = jax.vmap(env.reset)(jax.random.split(jax.random.PRNGKey(0), 3))
    assert observations.shape == (3, 2, 4)
    assert not np.allclose(observations[0], observations[1])


def test_gymnax_adapter_and_bad_ids():
    env = make("gymnax:CartPole-v1", seed=0, batch_size=2)
    first = env.reset()
    np.testing.assert_array_equal(np.asarray(first.step_type), [int(StepType.FIRST)] * 2)
    step = env.step(np.zeros(2, np.int32))
    assert np.asarray(step.observation).shape == (2, 4)
    again = make("gymnax:CartPole-v1", seed=0, batch_size=2).reset()
    np.testing.assert_array_equal(np.asarray(first.observation), np.asarray(again.observation))
    assert is_device_id("gymnax:CartPole-v1") and is_device_id("brax:ant") and not is_device_id("gym:CartPole-v1")
    with pytest.raises(QrlInputError) as error:
        make_functional("gymnax:CartPol-v1", 2)
    assert "gymnax:CartPole-v1" in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(QrlInputError, match="make_vector"):
        make_functional("gym:CartPole-v1", 2)
    with pytest.raises(QrlInputError, match="unknown option"):
        make_functional("gymnax:CartPole-v1", 2, frame_skip=2)
    with pytest.raises(QrlInputError, match="num_envs"):
        make_functional("gymnax:CartPole-v1", 0)
    with pytest.raises(QrlInputError, match="batch_size"):
        make_vector("gymnax:CartPole-v1", 2)


@pytest.mark.parametrize(
    "name, obs_size, action_size",
    [("fast", 2, 1), pytest.param("halfcheetah", 17, 6, marks=pytest.mark.slow)],  # halfcheetah compiles ~10 s
)
def test_brax_functional_auto_reset_and_final_observation(name, obs_size, action_size):
    env = make_functional(f"brax:{name}", 2, episode_length=3)
    assert env.observation_spec() == specs.Array((obs_size,), np.float32)
    assert env.action_spec().shape == (action_size,)
    first, steps = _run(env, jnp.full((2, action_size), 0.5, jnp.float32), 4)
    np.testing.assert_array_equal(steps.step_type[:, 0], [1, 1, 2, 1])
    np.testing.assert_array_equal(steps.discount, np.ones((4, 2)))  # only the episode limit ends these
    np.testing.assert_allclose(steps.observation[2], first, atol=1e-6)  # brax restores the first state
    assert not np.allclose(steps.final_observation[2], first)
    np.testing.assert_array_equal(steps.observation[:2], steps.final_observation[:2])
    with pytest.raises(QrlInputError, match="unknown option"):
        make_functional(f"brax:{name}", 2, batch_size=3)
