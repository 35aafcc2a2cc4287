"""TD3: config, delayed policy updates, a smoke run, and learning Pendulum."""

import jax
import numpy as np
import pytest

from agents import td3
from qrl import envs
from tests.test_offpolicy import _random_batches


@pytest.fixture(autouse=True)
def synchronous_dispatch():
    jax.config.update("jax_cpu_enable_async_dispatch", False)


def test_config_defaults_presets_and_overrides():
    paper = td3.config_for("gym:Hopper-v5")
    assert (paper.learning_rate, paper.batch_size, paper.hidden_sizes, paper.policy_delay) == (1e-3, 100, (400, 300), 2)
    assert (paper.target_policy_noise, paper.target_noise_clip, paper.exploration_noise) == (0.2, 0.5, 0.1)
    zoo = td3.config_for("gym:Pendulum-v1")  # rl-baselines3-zoo td3.yml
    assert (zoo.gamma, zoo.buffer_size, zoo.learning_starts, zoo.batch_size) == (0.98, 200_000, 10_000, 256)
    config = td3.config_for("gym:Pendulum-v1", {"policy_delay": "3", "hidden_sizes": "64-64"})
    assert config.policy_delay == 3 and config.hidden_sizes == (64, 64)
    assert td3.Config.from_dict(config.to_dict()) == config


def test_actor_and_targets_move_only_every_policy_delay_updates():
    env = envs.make("gym:Pendulum-v1", 0)
    config = td3.config_for("gym:Pendulum-v1", {"hidden_sizes": "16-16", "policy_delay": 2})
    agent = td3.build(config, env.observation_spec(), env.action_spec())
    update = jax.jit(agent.update(None))
    state = agent.init(jax.random.PRNGKey(0))
    before = jax.tree.map(np.asarray, state)
    state, metrics = update(state, _random_batches(jax.random.PRNGKey(1), 1))
    assert np.isnan(float(metrics["actor_loss"]))  # no actor update on the first critic update
    for name in ("actor_params", "target_actor_params", "target_critic_params"):
        for a, b in zip(jax.tree.leaves(getattr(state, name)), jax.tree.leaves(getattr(before, name))):
            np.testing.assert_array_equal(a, b)
    state, metrics = update(state, _random_batches(jax.random.PRNGKey(2), 1))
    assert np.isfinite(float(metrics["actor_loss"]))
    assert not np.allclose(state.actor_params["head"]["kernel"], before.actor_params["head"]["kernel"])
    # Targets: tau * new critic + (1 - tau) * old target.
    for target, online, old in zip(jax.tree.leaves(state.target_critic_params), jax.tree.leaves(state.critic_params),
                                   jax.tree.leaves(before.target_critic_params)):
        np.testing.assert_allclose(target, config.tau * online + (1 - config.tau) * old, rtol=1e-5, atol=1e-7)


def test_smoke_run_on_pendulum():
    config = td3.config_for("gym:Pendulum-v1", {"hidden_sizes": "32-32", "batch_size": 32, "learning_starts": 100})
    _, results = td3.train("gym:Pendulum-v1", config, 300, seed=0, eval_episodes=2, progress=False)
    assert results["agent"] == "td3" and results["env_steps"] == 300 and results["updates"] == 201
    assert np.isfinite(results["final_eval"]["mean"])


@pytest.mark.slow
def test_learns_pendulum():
    # rl-baselines3-zoo's Pendulum-v1 preset and budget (20k steps, the first 10k random).
    config = td3.config_for("gym:Pendulum-v1", {"matmul_dtype": "bf16"})
    _, results = td3.train("gym:Pendulum-v1", config, 20_000, seed=0, eval_episodes=10, progress=False)
    assert results["final_eval"]["mean"] >= -250.0, results["final_eval"]
