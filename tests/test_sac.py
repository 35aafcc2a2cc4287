"""SAC: config, temperature tuning, a smoke run, and learning Pendulum at fp32 and bf16."""

import jax
import numpy as np
import pytest

from agents import sac
from qrl import envs
from tests.test_offpolicy import _random_batches


@pytest.fixture(autouse=True)
def synchronous_dispatch():
    jax.config.update("jax_cpu_enable_async_dispatch", False)


def test_config_defaults_presets_and_overrides():
    paper = sac.config_for("gym:Hopper-v5")
    assert (paper.learning_rate, paper.batch_size, paper.tau, paper.hidden_sizes) == (3e-4, 256, 0.005, (256, 256))
    assert sac.config_for("gym:Pendulum-v1").learning_rate == 1e-3  # rl-baselines3-zoo sac.yml
    assert sac.config_for("gym:HalfCheetah-v5").learning_starts == 10_000
    config = sac.config_for("gym:Pendulum-v1", {"hidden_sizes": "64-64", "matmul_dtype": "bf16", "gamma": "0.98"})
    assert config.hidden_sizes == (64, 64) and config.matmul_dtype == "bf16" and config.gamma == 0.98
    assert sac.Config.from_dict(config.to_dict()) == config


@pytest.mark.parametrize("target_entropy_per_dim, grows", [(5.0, True), (-50.0, False)])
def test_temperature_moves_toward_the_target_entropy(target_entropy_per_dim, grows):
    env = envs.make("gym:Pendulum-v1", 0)
    config = sac.config_for("gym:Pendulum-v1", {"hidden_sizes": "16", "target_entropy_per_dim": target_entropy_per_dim})
    agent = sac.build(config, env.observation_spec(), env.action_spec())
    state = agent.init(jax.random.PRNGKey(0))
    state, metrics = jax.jit(agent.update(None))(state, _random_batches(jax.random.PRNGKey(1), 5))
    # An entropy below the target raises the temperature (and vice versa); alpha starts at 1.
    assert (float(np.exp(state.log_alpha)) > 1.0) == grows
    assert set(metrics) == {"critic_loss", "actor_loss", "alpha", "entropy", "q_mean"}


def test_smoke_run_on_pendulum():
    config = sac.config_for("gym:Pendulum-v1", {"hidden_sizes": "32-32", "batch_size": 32, "matmul_dtype": "bf16"})
    state, results = sac.train("gym:Pendulum-v1", config, 300, seed=0, eval_episodes=2, progress=False)
    assert results["agent"] == "sac" and results["env_steps"] == 300
    assert results["updates"] == 201 and results["episodes"] == 1  # learning_starts 100; 200-step episodes
    assert np.isfinite(results["final_eval"]["mean"]) and np.isfinite(float(state.log_alpha))


@pytest.mark.slow
@pytest.mark.parametrize("matmul_dtype", ["fp32", "bf16"])
def test_learns_pendulum(matmul_dtype):
    # rl-baselines3-zoo's Pendulum-v1 preset; half its 20k-step budget suffices here.
    config = sac.config_for("gym:Pendulum-v1", {"matmul_dtype": matmul_dtype})
    _, results = sac.train("gym:Pendulum-v1", config, 10_000, seed=0, eval_episodes=10, progress=False)
    assert results["final_eval"]["mean"] >= -250.0, results["final_eval"]
