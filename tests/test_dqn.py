"""DQN: config, updates, fused scan equivalence, acting, and learning CartPole."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agents.dqn import acting, config_for, learning, train
from agents.dqn.config import Config
from qrl.errors import QrlInputError
from qrl.replay import Transition


def _batches(key, num_batches, batch_size, obs_dim=4, num_actions=2):
    keys = jax.random.split(key, 3)
    shape = (num_batches, batch_size)
    return Transition(
        observation=np.asarray(jax.random.normal(keys[0], shape + (obs_dim,))),
        action=np.asarray(jax.random.randint(keys[1], shape, 0, num_actions)),
        reward=np.ones(shape, np.float32),
        discount=np.full(shape, 0.99, np.float32),
        next_observation=np.asarray(jax.random.normal(keys[2], shape + (obs_dim,))),
    )


@pytest.fixture(autouse=True)
def synchronous_dispatch():
    jax.config.update("jax_cpu_enable_async_dispatch", False)


def test_config_presets_and_overrides():
    config = config_for("gym:CartPole-v1", {"learning_rate": "0.01", "hidden_sizes": "64-64", "double_q": "false"})
    assert config.batch_size == 64 and config.train_freq == 256  # rl-baselines3-zoo preset
    assert config.learning_rate == 0.01 and config.hidden_sizes == (64, 64) and config.double_q is False
    assert Config.from_dict(config.to_dict()) == config
    assert config_for("atari:Pong").buffer_size == 1_000_000  # Nature DQN default
    with pytest.raises(QrlInputError, match="unknown DQN config key"):
        config_for("gym:CartPole-v1", {"learning_rat": 1})
    with pytest.raises(QrlInputError, match="batch_size"):
        config_for("gym:CartPole-v1", {"batch_size": 0})
    with pytest.raises(QrlInputError, match="not a valid"):
        config_for("gym:CartPole-v1", {"gamma": "high"})


def test_fused_updates_equal_sequential_updates():
    config = Config(hidden_sizes=(32,), learning_rate=1e-3, target_update_period=2)
    network = learning.make_network(config, (4,), 2)
    batches = _batches(jax.random.PRNGKey(1), num_batches=4, batch_size=8)
    fused = learning.make_update(network, config)
    state_fused, _ = fused(learning.init(jax.random.PRNGKey(0), config, (4,), np.float32, 2), batches)
    state_sequential = learning.init(jax.random.PRNGKey(0), config, (4,), np.float32, 2)
    for k in range(4):
        one = jax.tree.map(lambda x: x[k : k + 1], batches)
        state_sequential, _ = fused(state_sequential, one)
    assert int(state_fused.updates) == int(state_sequential.updates) == 4
    for a, b in zip(jax.tree.leaves(state_fused.params), jax.tree.leaves(state_sequential.params)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_target_network_copied_every_period_only():
    config = Config(hidden_sizes=(16,), learning_rate=1e-2, target_update_period=3)
    network = learning.make_network(config, (4,), 2)
    update = learning.make_update(network, config)
    state = learning.init(jax.random.PRNGKey(0), config, (4,), np.float32, 2)
    initial_target = jax.tree.map(np.asarray, state.target_params)
    state, _ = update(state, _batches(jax.random.PRNGKey(1), 2, 8))
    for a, b in zip(jax.tree.leaves(state.target_params), jax.tree.leaves(initial_target)):
        np.testing.assert_array_equal(a, b)  # 2 updates < period 3: unchanged
    state, _ = update(state, _batches(jax.random.PRNGKey(2), 1, 8))
    for a, b in zip(jax.tree.leaves(state.target_params), jax.tree.leaves(state.params)):
        np.testing.assert_array_equal(a, b)  # 3rd update: hard copy


def test_updates_reduce_td_loss_on_a_fixed_batch():
    config = Config(hidden_sizes=(32,), learning_rate=1e-2, target_update_period=1000)
    network = learning.make_network(config, (4,), 2)
    batch = _batches(jax.random.PRNGKey(3), 1, 32)
    repeated = jax.tree.map(lambda x: np.repeat(x, 50, axis=0), batch)
    update = learning.make_update(network, config)
    state = learning.init(jax.random.PRNGKey(0), config, (4,), np.float32, 2)
    loss = learning.make_loss(network, config)
    before = float(loss(state.params, state.target_params, jax.tree.map(lambda x: x[0], batch))[0])
    state, _ = update(state, repeated)
    after = float(loss(state.params, state.target_params, jax.tree.map(lambda x: x[0], batch))[0])
    assert after < 0.5 * before


def test_epsilon_schedule_and_epsilon_greedy_policy():
    config = Config(exploration_initial_eps=1.0, exploration_final_eps=0.1, exploration_fraction=0.5)
    epsilon = acting.epsilon_schedule(config, total_steps=100)
    assert epsilon(0) == 1.0 and epsilon(25) == pytest.approx(0.55) and epsilon(50) == pytest.approx(0.1)
    assert epsilon(99) == pytest.approx(0.1)
    network = learning.make_network(Config(hidden_sizes=(8,)), (4,), 3)
    params = network.init(jax.random.PRNGKey(0), jnp.zeros((1, 4)))["params"]
    observations = jnp.ones((1000, 4))
    policy = jax.jit(acting.make_epsilon_greedy_policy(network))
    greedy = acting.make_greedy_policy(network)(params, observations)
    np.testing.assert_array_equal(policy(params, observations, jax.random.PRNGKey(0), 0.0), greedy)
    random_actions = policy(params, observations, jax.random.PRNGKey(0), 1.0)
    assert set(np.unique(random_actions)) == {0, 1, 2}


def test_nature_cnn_q_network_on_frames():
    config = config_for("atari:Pong")
    network = learning.make_network(config, (84, 84, 4), 6)
    state = learning.init(jax.random.PRNGKey(0), config, (84, 84, 4), np.uint8, 6)
    assert "conv_0" in state.params["torso"]
    q_values = network.apply({"params": state.params}, jnp.zeros((2, 84, 84, 4), jnp.uint8))
    assert q_values.shape == (2, 6) and q_values.dtype == jnp.float32


def test_dqn_rejects_continuous_actions():
    with pytest.raises(QrlInputError, match="discrete"):
        train("gym:Pendulum-v1", Config(), steps=10, progress=False)


def test_dqn_trains_on_atari_frames_for_a_few_steps():
    config = config_for("atari:Pong", {"learning_starts": 40, "buffer_size": 200, "train_freq": 4, "gradient_steps": 2,
                                       "batch_size": 8})
    state, results = train("atari:Pong", config, steps=64, seed=0, eval_episodes=1, progress=False)
    assert int(state.updates) > 0 and results["env_steps"] == 64


def test_dqn_learns_cartpole():
    """rl-baselines3-zoo's CartPole hyperparameters, 50k steps, fixed seed: greedy return >= 475."""
    _, results = train("gym:CartPole-v1", config_for("gym:CartPole-v1"), steps=50_000, seed=0, eval_episodes=20,
                       progress=False)
    assert results["final_eval"]["mean"] >= 475.0, results["final_eval"]


def test_dueling_head_combines_value_and_mean_centred_advantages():
    config = Config(hidden_sizes=(8,), dueling=True)
    network = learning.make_network(config, (4,), 3)
    observations = jax.random.normal(jax.random.PRNGKey(1), (5, 4))
    params = network.init(jax.random.PRNGKey(0), observations)["params"]
    assert set(params) == {"torso", "value", "advantage"}
    features = jax.nn.relu(observations @ params["torso"]["dense_0"]["kernel"] + params["torso"]["dense_0"]["bias"])
    value = features @ params["value"]["kernel"] + params["value"]["bias"]
    advantages = features @ params["advantage"]["kernel"] + params["advantage"]["bias"]
    expected = value + advantages - advantages.mean(axis=-1, keepdims=True)
    np.testing.assert_allclose(network.apply({"params": params}, observations), expected, rtol=1e-5, atol=1e-6)


def test_total_updates_and_linear_learning_rate_schedule():
    config = config_for("gym:CartPole-v1", {"learning_rate_schedule": "linear"})
    # training phases at steps 1000, 1256, ..., 49960: 192 phases of 128 updates.
    assert learning.total_updates(config, 50_000) == 192 * 128
    optimizer = learning.make_optimizer(config, num_updates=4)
    params = {"w": jnp.ones(3)}
    state = optimizer.init(params)
    sizes = []
    for _ in range(5):
        updates, state = optimizer.update({"w": jnp.ones(3)}, state, params)
        sizes.append(float(jnp.abs(updates["w"][0])))
    # Adam's first step is lr-sized; the linear schedule reaches 0 after 4 updates.
    assert sizes[0] == pytest.approx(config.learning_rate, rel=1e-3)
    assert sizes[1] < sizes[0] and sizes[4] == 0.0
    with pytest.raises(QrlInputError, match="learning_rate_schedule"):
        config_for("gym:CartPole-v1", {"learning_rate_schedule": "cosine"})


def test_dqn_trains_with_several_environments_per_process():
    config = config_for("gym:CartPole-v1", {"learning_starts": 200, "train_freq": 64, "gradient_steps": 4})
    state, results = train("gym:CartPole-v1", config, steps=1_000, seed=1, num_envs=4, eval_episodes=2,
                           progress=False)
    assert results["env_steps"] == 1_000
    # phases at 200, 264, ..., 968: 13 phases of 4 updates
    assert int(state.updates) == 13 * 4
    assert results["episodes"] > 4 * 1_000 / 500  # CartPole episodes are short at first


# ----- on device (gymnax, brax ids) -----------------------------------------------------------


def _device_env(num_envs):
    from qrl.envs.functional import make_functional

    return make_functional("gymnax:CartPole-v1", num_envs)


def test_device_agent_runs_the_host_loop_s_update_and_epsilon_schedule():
    from agents.dqn.training import device_agent

    config = Config(hidden_sizes=(32,), learning_rate=1e-3, target_update_period=2, exploration_fraction=0.5)
    env = _device_env(1)
    agent = device_agent(config, env.observation_spec(), env.action_spec(), steps=1000)
    state = agent.init(jax.random.PRNGKey(0))
    batches = _batches(jax.random.PRNGKey(1), num_batches=3, batch_size=8)
    host_update = learning.make_update(learning.make_network(config, (4,), 2), config, learning.total_updates(config, 1000))
    device_state, device_metrics = jax.jit(agent.update(None))(state, batches)
    host_state, host_metrics = host_update(agent.init(jax.random.PRNGKey(0)), batches)
    for a, b in zip(jax.tree.leaves(device_state), jax.tree.leaves(host_state)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(device_metrics["loss"], host_metrics["loss"], rtol=1e-6)
    # epsilon-greedy over 20,000 envs: the exploring share follows the host schedule, explorers act
    # uniformly, the rest greedily.
    epsilon_at = acting.epsilon_schedule(config, 1000)
    observations = jnp.asarray(np.random.default_rng(0).normal(size=(20_000, 4)), jnp.float32)
    greedy = acting.make_greedy_policy(learning.make_network(config, (4,), 2))(agent.policy_params(state), observations)
    for env_steps in (0, 250, 500, 900):
        noise = agent.explore(jax.random.PRNGKey(env_steps), 20_000, jnp.int32(env_steps))
        assert abs(float(jnp.mean(noise["explore"])) - epsilon_at(env_steps)) < 0.015
        actions = agent.act(None)(agent.policy_params(state), observations, noise)
        np.testing.assert_array_equal(actions[~noise["explore"]], greedy[~noise["explore"]])
        if env_steps == 0:
            assert abs(float(jnp.mean(actions[noise["explore"]])) - 0.5) < 0.02
    random_actions = agent.random_act(jax.random.PRNGKey(3), 5)
    assert random_actions.shape == (5,) and random_actions.dtype == jnp.int32


def test_device_training_is_vmappable_over_seeds_and_equals_each_seed_s_own_run():
    from agents.dqn.training import make_device_train

    config = config_for("gymnax:CartPole-v1", {"hidden_sizes": (32, 32), "learning_starts": 256, "buffer_size": 4096})
    train_fn = make_device_train(config, _device_env(2), steps=1536, eval_env=_device_env(2))
    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    states, summaries = jax.jit(jax.vmap(train_fn))(keys)
    assert summaries["updates"].tolist() == [640, 640]  # 1536 steps: warm-up 256, then 128 updates per 256 steps
    assert summaries["env_steps"].tolist() == [1536, 1536] and summaries["eval_returns"].shape == (2, 2)
    for index in range(2):
        state, summary = jax.jit(train_fn)(keys[index])
        for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(states.params)):
            np.testing.assert_allclose(a, b[index], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(summary["eval_returns"], summaries["eval_returns"][index])


def test_dqn_learns_gymnax_cartpole_on_device():
    """The zoo preset on gymnax's CartPole-v1, 40k steps, two seeds trained as one vmapped program:
    the greedy policy's mean return over 2 x 10 episodes >= 150 (random play: about 22)."""
    from agents.dqn.training import make_device_train

    train_fn = make_device_train(config_for("gymnax:CartPole-v1"), _device_env(1), steps=40_000,
                                 eval_env=_device_env(10))
    _, summaries = jax.jit(jax.vmap(train_fn))(jax.random.split(jax.random.PRNGKey(0), 2))
    returns = np.asarray(summaries["eval_returns"])
    assert returns.mean() >= 150.0, returns.mean(axis=1)
    assert summaries["updates"].tolist() == [19_584, 19_584]


def test_dqn_train_dispatches_gymnax_ids_to_the_device_loop_and_refuses_what_it_cannot_do(tmp_path):
    config = config_for("gymnax:CartPole-v1", {"hidden_sizes": (16,), "learning_starts": 256})
    state, results = train("gymnax:CartPole-v1", config, steps=768, seed=0, eval_episodes=2, workdir=str(tmp_path),
                           progress=False)
    assert results["on_device"] and results["env_steps"] == 768 and results["updates"] == int(state.updates) == 256
    assert len(results["final_eval"]["returns"]) == 2 and (tmp_path / "metrics.csv").exists()
    with pytest.raises(QrlInputError, match="at float precision only: qat_bits needs a host env id"):
        train("gymnax:CartPole-v1", config.override({"qat_bits": 8}), steps=768, progress=False)


def test_launch_train_refuses_qat_on_device_in_one_line_before_writing(tmp_path):
    import os
    import subprocess
    import sys

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    workdir = tmp_path / "run"
    completed = subprocess.run(
        [sys.executable, "-m", "launch.train", "--agent=dqn", "--env=gymnax:CartPole-v1", "--set=qat_bits=8",
         "--steps=1000", f"--workdir={workdir}"],
        cwd=repo, env={**os.environ, "PYTHONPATH": repo}, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 2
    lines = [line for line in completed.stderr.splitlines() if "error" in line.lower()]
    assert len(lines) == 1 and lines[0].startswith("error: DQN on gymnax:CartPole-v1 trains on device")
    assert not workdir.exists()
