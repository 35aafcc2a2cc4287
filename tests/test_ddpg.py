"""DDPG: config, Polyak targets and the critic's L2 penalty, a smoke run, and learning Pendulum."""

import jax
import numpy as np
import pytest

from agents import ddpg
from qrl import envs
from tests.test_offpolicy import _random_batches


@pytest.fixture(autouse=True)
def synchronous_dispatch():
    jax.config.update("jax_cpu_enable_async_dispatch", False)


def test_config_defaults_presets_and_overrides():
    paper = ddpg.config_for("gym:Hopper-v5")  # Lillicrap et al. 2016
    assert (paper.actor_learning_rate, paper.critic_learning_rate, paper.critic_l2) == (1e-4, 1e-3, 1e-2)
    assert (paper.tau, paper.batch_size, paper.hidden_sizes) == (1e-3, 64, (400, 300))
    zoo = ddpg.config_for("gym:Pendulum-v1")  # rl-baselines3-zoo ddpg.yml on SB3 defaults
    assert (zoo.gamma, zoo.learning_starts, zoo.batch_size, zoo.tau, zoo.critic_l2) == (0.98, 10_000, 256, 0.005, 0.0)
    config = ddpg.config_for("gym:Pendulum-v1", {"critic_l2": "0.01", "hidden_sizes": "64-64"})
    assert config.critic_l2 == 0.01 and config.hidden_sizes == (64, 64)
    assert ddpg.Config.from_dict(config.to_dict()) == config


def _one_update(values):
    env = envs.make("gym:Pendulum-v1", 0)
    config = ddpg.config_for("gym:Pendulum-v1", {"hidden_sizes": "16-16", **values})
    agent = ddpg.build(config, env.observation_spec(), env.action_spec())
    state = agent.init(jax.random.PRNGKey(0))
    before = jax.tree.map(np.asarray, state)
    state, _ = jax.jit(agent.update(None))(state, _random_batches(jax.random.PRNGKey(1), 1))
    return config, before, state


def test_targets_move_by_tau_after_each_update():
    config, before, state = _one_update({"tau": 0.1})
    for name in ("actor", "critic"):
        for target, online, old in zip(jax.tree.leaves(getattr(state, f"target_{name}_params")),
                                       jax.tree.leaves(getattr(state, f"{name}_params")),
                                       jax.tree.leaves(getattr(before, f"target_{name}_params"))):
            np.testing.assert_allclose(target, 0.1 * online + 0.9 * old, rtol=1e-5, atol=1e-7)


def test_critic_l2_penalty_changes_the_critic_step():
    _, _, plain = _one_update({"critic_l2": 0.0})
    _, _, decayed = _one_update({"critic_l2": 10.0})
    assert not np.allclose(plain.critic_params["torso"]["dense_0"]["kernel"],
                           decayed.critic_params["torso"]["dense_0"]["kernel"])


def test_smoke_run_on_pendulum():
    config = ddpg.config_for("gym:Pendulum-v1", {"hidden_sizes": "32-32", "batch_size": 32, "learning_starts": 100})
    _, results = ddpg.train("gym:Pendulum-v1", config, 300, seed=0, eval_episodes=2, progress=False)
    assert results["agent"] == "ddpg" and results["env_steps"] == 300 and results["updates"] == 201
    assert np.isfinite(results["final_eval"]["mean"])


@pytest.mark.slow
def test_learns_pendulum():
    # rl-baselines3-zoo's Pendulum-v1 preset and budget (20k steps, the first 10k random).
    config = ddpg.config_for("gym:Pendulum-v1", {"matmul_dtype": "bf16"})
    _, results = ddpg.train("gym:Pendulum-v1", config, 20_000, seed=0, eval_episodes=10, progress=False)
    assert results["final_eval"]["mean"] >= -250.0, results["final_eval"]
