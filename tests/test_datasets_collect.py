"""Dataset generation: exact sizes, contiguous episodes, flags, reproducibility, D4RL loading."""

import jax
import numpy as np
import pytest

from agents import sac
from qrl import envs
from agents.sac import behavior
from qrl.datasets import collect, d4rl, writers
from qrl.errors import QrlInputError

ENV_ID = "gym:Pendulum-v1"


@pytest.fixture(scope="module")
def policy():
    env = envs.make(ENV_ID, 0)
    config = sac.config_for(ENV_ID, {"hidden_sizes": "16-16"})
    params = behavior.random_policy_params(config, env.observation_spec(), env.action_spec(), seed=3)
    return behavior.make_sampling_act(config, env.action_spec()), params, config, env.action_spec()


def _episode_bounds(arrays):
    ends = np.flatnonzero(arrays["terminals"] | arrays["timeouts"])
    return np.concatenate([[0], ends[:-1] + 1]), ends + 1


def _check_contiguous(arrays):
    starts, stops = _episode_bounds(arrays)
    assert stops[-1] == len(arrays["rewards"])  # the last row always ends an episode
    for start, stop in zip(starts, stops):
        np.testing.assert_array_equal(arrays["next_observations"][start:stop - 1],
                                      arrays["observations"][start + 1:stop])


def test_single_env_pendulum_episodes_and_resimulation(policy):
    act, params, _, action_spec = policy
    arrays, stats = collect.collect_steps(ENV_ID, act, params, num_steps=450, seed=7)
    assert set(arrays) == set(collect.STEP_KEYS) and all(len(v) == 450 for v in arrays.values())
    assert arrays["observations"].dtype == np.float32 and arrays["actions"].shape == (450, 1)
    assert arrays["terminals"].dtype == bool and not arrays["terminals"].any()
    # Pendulum: 200-step time limit; the cut episode ends with a timeout on the last row.
    np.testing.assert_array_equal(np.flatnonzero(arrays["timeouts"]), [199, 399, 449])
    assert stats["episodes"] == 2 and list(stats["episode_lengths"]) == [200, 200]
    expected = [arrays["rewards"][:200].sum(), arrays["rewards"][200:400].sum()]
    np.testing.assert_allclose(stats["episode_returns"], expected, rtol=1e-5)
    _check_contiguous(arrays)
    low, high = action_spec.minimum, action_spec.maximum
    assert (arrays["actions"] >= low).all() and (arrays["actions"] <= high).all()

    # Re-simulation with the same env seed and noise stream gives the same rewards.
    env, rng, jitted = envs.make(ENV_ID, 7), np.random.default_rng(7), jax.jit(act)
    observation = env.reset().observation
    for step in range(5):
        noise = rng.standard_normal((1, 1), dtype=np.float32)
        action = np.asarray(jitted(params, observation[None], noise))[0]
        np.testing.assert_allclose(observation, arrays["observations"][step])
        np.testing.assert_allclose(action, arrays["actions"][step], rtol=1e-6)
        timestep = env.step(action)
        np.testing.assert_allclose(timestep.reward, arrays["rewards"][step], rtol=1e-5)
        observation = timestep.observation


def test_max_episode_steps_truncates_and_batched_envs_keep_episodes_contiguous(policy):
    act, params, _, _ = policy
    arrays, stats = collect.collect_steps(ENV_ID, act, params, num_steps=230, seed=1, num_envs=3,
                                          max_episode_steps=50)
    assert all(len(v) == 230 for v in arrays.values())
    starts, stops = _episode_bounds(arrays)
    lengths = stops - starts
    assert (lengths <= 50).all() and (lengths[:stats["episodes"]] == 50).all()
    # 3 envs x 50 steps finish 3 episodes; 27 more steps each leave 3 cut episodes (27, 27, 26 rows).
    assert stats["episodes"] == 3 and stats["env_steps"] == 3 * 77
    assert np.flatnonzero(arrays["timeouts"]).tolist() == [49, 99, 149, 176, 203, 229]
    _check_contiguous(arrays)
    # Every episode starts from a reset state, so its first observation is not the previous next one.
    for start in starts[1:]:
        assert not np.allclose(arrays["observations"][start], arrays["next_observations"][start - 1])


def test_seeds_reproduce_and_differ(policy):
    act, params, _, _ = policy
    first, _ = collect.collect_steps(ENV_ID, act, params, 60, seed=5, num_envs=2)
    again, _ = collect.collect_steps(ENV_ID, act, params, 60, seed=5, num_envs=2)
    other, _ = collect.collect_steps(ENV_ID, act, params, 60, seed=6, num_envs=2)
    for key in collect.STEP_KEYS:
        np.testing.assert_array_equal(first[key], again[key])
    assert not np.array_equal(first["actions"], other["actions"])
    assert not np.array_equal(first["observations"], other["observations"])


def test_arrays_load_as_a_d4rl_file(policy, tmp_path):
    act, params, _, _ = policy
    arrays, _ = collect.collect_steps(ENV_ID, act, params, 260, seed=2, max_episode_steps=100)
    path = tmp_path / "pendulum-random.hdf5"
    writers.write_d4rl_hdf5(path, arrays, {"policy": "random", "seed": 2})
    loaded = d4rl.read_hdf5(path)
    for key in collect.STEP_KEYS:
        np.testing.assert_array_equal(loaded[key], arrays[key])
    assert d4rl.metadata_value(loaded["metadata"], "policy") == "random"
    transitions = d4rl.qlearning_arrays(loaded)
    assert len(transitions["rewards"]) == 259 - 2  # timeouts at rows 99 and 199 dropped, last row unused
    returns, lengths = d4rl.episode_returns(loaded)
    assert lengths.tolist() == [100, 100, 60]


def test_average_return_of_a_random_policy(policy):
    act, params, config, action_spec = policy
    result = collect.average_return(ENV_ID, act, params, episodes=4, seed=0)
    assert result.lengths == (200,) * 4 and -1700 <= result.mean <= -700, result
    deterministic = collect.average_return(ENV_ID, sac.acting.make_policy(config, (action_spec.minimum,
                                           action_spec.maximum)), params, episodes=2, seed=0, stochastic=False,
                                           max_episode_steps=50)
    assert deterministic.lengths == (50, 50) and np.isfinite(deterministic.mean)


def test_bad_inputs(policy):
    act, params, _, _ = policy
    with pytest.raises(QrlInputError, match="num_steps"):
        collect.collect_steps(ENV_ID, act, params, 0, seed=0)
    with pytest.raises(QrlInputError, match="discrete"):
        collect.collect_steps("gym:CartPole-v1", act, params, 10, seed=0)


def test_terminations_on_hopper():
    pytest.importorskip("mujoco")
    env = envs.make("gym:Hopper-v5", 0)
    config = sac.config_for("gym:Hopper-v5", {"hidden_sizes": "16-16"})
    params = behavior.random_policy_params(config, env.observation_spec(), env.action_spec(), seed=0)
    arrays, stats = collect.collect_steps("gym:Hopper-v5", behavior.make_sampling_act(config, env.action_spec()), params,
                                          300, seed=0, num_envs=2)
    assert len(arrays["rewards"]) == 300 and arrays["terminals"].sum() == stats["episodes"] > 5
    assert not (arrays["terminals"] & arrays["timeouts"]).any()
    _check_contiguous(arrays)
    d4rl._validate("hopper", arrays)
