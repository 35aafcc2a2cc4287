"""D4PG: config, the deterministic policy gradient loss, hard target copies, a smoke run with
n-step returns, and learning Pendulum."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agents import d4pg
from agents.d4pg import learning
from qrl import envs
from tests.test_offpolicy import _random_batches


@pytest.fixture(autouse=True)
def synchronous_dispatch():
    jax.config.update("jax_cpu_enable_async_dispatch", False)


def test_config_acme_defaults_presets_and_overrides():
    acme = d4pg.config_for("dmc:walker-walk")
    assert (acme.learning_rate, acme.batch_size, acme.n_step, acme.exploration_noise) == (1e-4, 256, 5, 0.3)
    assert (acme.num_atoms, acme.v_min, acme.v_max) == (51, -150.0, 150.0)
    assert (acme.target_update_period, acme.tau) == (100, 1.0)
    assert acme.train_freq == 8  # 32 samples per insert at batch 256
    pendulum = d4pg.config_for("gym:Pendulum-v1")
    assert (pendulum.v_min, pendulum.v_max) == (-1650.0, 0.0)
    config = d4pg.config_for("gym:Pendulum-v1", {"num_atoms": "21", "critic_hidden_sizes": "64-64"})
    assert config.num_atoms == 21 and config.critic_hidden_sizes == (64, 64)
    assert d4pg.Config.from_dict(config.to_dict()) == config
    with pytest.raises(Exception, match="v_min"):
        d4pg.config_for("gym:Pendulum-v1", {"v_min": 1.0, "v_max": 0.0})


def test_dpg_loss_gradient_is_the_clipped_action_gradient():
    actions = jnp.array([[0.5, -0.5], [1.0, 0.0]])
    dqda = jnp.array([[3.0, -0.2], [-4.0, 0.5]])
    loss = learning.dpg_loss(actions, dqda, clipping=1.0)
    # 0.5 * sum(clip(dqda)^2): [0.5 * (1 + 0.04), 0.5 * (1 + 0.25)]
    np.testing.assert_allclose(loss, [0.52, 0.625], rtol=1e-6)
    grads = jax.grad(lambda a: jnp.sum(learning.dpg_loss(a, dqda, 1.0)))(actions)
    np.testing.assert_allclose(grads, -jnp.clip(dqda, -1.0, 1.0), rtol=1e-6)
    np.testing.assert_allclose(jax.grad(lambda a: jnp.sum(learning.dpg_loss(a, dqda, 0.0)))(actions), -dqda)


def test_targets_are_copied_every_target_update_period():
    env = envs.make("gym:Pendulum-v1", 0)
    config = d4pg.config_for("dmc:walker-walk", {"actor_hidden_sizes": "16", "critic_hidden_sizes": "16",
                                                 "target_update_period": 3, "learning_rate": 1e-2})
    agent = d4pg.build(config, env.observation_spec(), env.action_spec())
    update = jax.jit(agent.update(None))
    state = agent.init(jax.random.PRNGKey(0))
    initial = jax.tree.map(np.asarray, state.target_critic_params)
    state, _ = update(state, _random_batches(jax.random.PRNGKey(1), 2))
    for a, b in zip(jax.tree.leaves(state.target_critic_params), jax.tree.leaves(initial)):
        np.testing.assert_array_equal(a, b)
    state, _ = update(state, _random_batches(jax.random.PRNGKey(2), 1))
    for name in ("actor", "critic"):
        for a, b in zip(jax.tree.leaves(getattr(state, f"target_{name}_params")),
                        jax.tree.leaves(getattr(state, f"{name}_params"))):
            np.testing.assert_array_equal(a, b)


def test_smoke_run_on_pendulum_with_n_step_returns():
    config = d4pg.config_for("gym:Pendulum-v1", {"actor_hidden_sizes": "32-32", "critic_hidden_sizes": "32-32",
                                                 "batch_size": 32, "learning_starts": 100})
    _, results = d4pg.train("gym:Pendulum-v1", config, 400, seed=0, num_envs=2, eval_episodes=2, progress=False)
    assert results["agent"] == "d4pg" and results["env_steps"] == 400 and results["updates"] == 301
    assert np.isfinite(results["final_eval"]["mean"]) and results["episodes"] == 2  # 200 steps in each env


def test_on_device_smoke_run_with_n_step_returns():
    config = d4pg.config_for("gymnax:Pendulum-v1", {"actor_hidden_sizes": "16", "critic_hidden_sizes": "16",
                                                    "batch_size": 16, "learning_starts": 32, "train_freq": 1})
    _, results = d4pg.train("gymnax:Pendulum-v1", config, 96, seed=0, num_envs=4, eval_episodes=2,
                            env_options={"episode_length": 12})
    assert results["on_device"] and results["env_steps"] == 96 and results["updates"] == 64
    assert results["episodes"] == 8 and np.isfinite(results["final_eval"]["mean"])  # 24 steps per env


@pytest.mark.slow
def test_learns_pendulum():
    config = d4pg.config_for("gym:Pendulum-v1", {"matmul_dtype": "bf16"})
    _, results = d4pg.train("gym:Pendulum-v1", config, 20_000, seed=0, eval_episodes=10, progress=False)
    assert results["final_eval"]["mean"] >= -250.0, results["final_eval"]
