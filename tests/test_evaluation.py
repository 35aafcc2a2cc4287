"""qrl.evaluation: seeded, batched evaluation and observation collection on host envs."""

import json

import numpy as np
import pytest

from qrl.envs import make
from qrl.evaluation import EvalResult, collect_observations, evaluate
from qrl.errors import QrlInputError


def always_left(observations: np.ndarray) -> np.ndarray:
    """CartPole action 0 for every row of `[B, 4]` observations."""
    return np.zeros(len(observations), np.int64)


def lean_with_pole(observations: np.ndarray) -> np.ndarray:
    """A hand-written CartPole controller: push toward the side the pole is falling to."""
    return (observations[:, 2] + observations[:, 3] > 0).astype(np.int64)


def test_evaluate_is_reproducible_and_independent_of_episode_count():
    result = evaluate(always_left, "gym:CartPole-v1", episodes=6, seed=0)
    assert isinstance(result, EvalResult)
    assert result == evaluate(always_left, "gym:CartPole-v1", episodes=6, seed=0)
    assert evaluate(always_left, "gym:CartPole-v1", episodes=2, seed=0).returns == result.returns[:2]
    assert evaluate(always_left, "gym:CartPole-v1", episodes=2, seed=4).returns == result.returns[4:]
    assert all(8 <= length <= 12 for length in result.lengths)
    assert result.returns == tuple(float(length) for length in result.lengths)
    assert result.mean == pytest.approx(np.mean(result.returns))
    assert result.std == pytest.approx(np.std(result.returns))


def test_evaluate_returns_match_single_env_episodes():
    result = evaluate(lean_with_pole, "gym:CartPole-v1", episodes=3, seed=10, max_steps=300)
    for index, episode_return in enumerate(result.returns):
        env = make("gym:CartPole-v1", seed=10 + index)
        timestep, total, steps = env.reset(), 0.0, 0
        while not timestep.last() and steps < 300:
            timestep = env.step(int(lean_with_pole(timestep.observation[None])[0]))
            total += timestep.reward
            steps += 1
        assert episode_return == total and result.lengths[index] == steps
    assert result.mean > 150


def test_evaluate_with_jitted_policy_and_to_dict():
    import jax
    import jax.numpy as jnp

    policy = jax.jit(lambda observations: jnp.zeros((observations.shape[0], 1), jnp.float32))
    result = evaluate(policy, "dmc:cartpole-balance", episodes=2, seed=0, max_steps=20)
    assert result.lengths == (20, 20)
    assert all(0.0 < value <= 20.0 for value in result.returns)
    record = json.loads(json.dumps(result.to_dict()))
    assert record["episodes"] == 2 and record["returns"] == list(result.returns)
    assert record["env_id"] == "dmc:cartpole-balance"


def test_evaluate_atari_with_options():
    result = evaluate(always_left, "atari:Pong", episodes=2, seed=0, max_steps=30, env_options={"noop_max": 0})
    assert result.lengths == (30, 30)


def test_collect_observations_spans_episodes():
    observations = collect_observations(always_left, "gym:CartPole-v1", num_steps=30, seed=5)
    assert observations.shape == (30, 4) and observations.dtype == np.float32
    np.testing.assert_array_equal(observations[0], make("gym:CartPole-v1", seed=5).reset().observation)
    starts = np.all(np.abs(observations) <= 0.05, axis=1)
    assert starts.sum() >= 3
    np.testing.assert_array_equal(observations, collect_observations(always_left, "gym:CartPole-v1", 30, seed=5))


def test_evaluate_and_collect_on_a_device_env():
    """brax's `fast` test env: a batch of episodes under one jitted step, first episodes only."""
    zeros = lambda observations: np.zeros((len(observations), 1), np.float32)
    result = evaluate(zeros, "brax:fast", episodes=3, seed=0, max_steps=25, env_options={"episode_length": 10})
    assert result.lengths == (10, 10, 10) and len(result.returns) == 3
    observations = collect_observations(zeros, "brax:fast", num_steps=12, seed=0)
    assert observations.shape[0] == 12


def test_bad_evaluation_input():
    with pytest.raises(QrlInputError, match="episodes"):
        evaluate(always_left, "gym:CartPole-v1", episodes=0)
    with pytest.raises(QrlInputError, match="known families"):
        evaluate(always_left, "gym:NoSuchEnv-v0", episodes=1)
    with pytest.raises(ValueError, match="shape"):
        evaluate(lambda observations: np.zeros(1, np.int64), "gym:CartPole-v1", episodes=3)
