"""A2C: config and bad input, the one-step update, the optimizer, and learning CartPole."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from dm_env import specs

from agents import a2c
from agents.a2c import learning
from qrl import onpolicy
from qrl.errors import QrlInputError

CARTPOLE_OBS = specs.Array((4,), np.float32)
CARTPOLE_ACTIONS = specs.DiscreteArray(2, dtype=np.int32)


@pytest.fixture(autouse=True)
def synchronous_dispatch():
    jax.config.update("jax_cpu_enable_async_dispatch", False)


def test_config_presets_overrides_and_bad_input():
    config = a2c.config_for("gym:CartPole-v1")
    assert (config.num_envs, config.num_steps, config.ent_coef, config.gae_lambda) == (8, 5, 0.0, 1.0)  # rl-zoo
    assert config.learning_rate == 7e-4 and config.rmsprop_decay == 0.99 and config.rmsprop_eps == 1e-5
    assert a2c.config_for("atari:Pong").num_envs == 16 and a2c.config_for("atari:Pong").ent_coef == 0.01
    assert a2c.Config.from_dict(config.to_dict()) == config
    for bad in ({"learning_rate": -7e-4}, {"num_steps": 0}, {"gae_lambda": 2.0}, {"vf_coef": -1},
                {"rmsprop_decay": 1.5}, {"qat_bits": 1}, {"unknown": 1}, {"learning_rate_schedule": "cosine"}):
        with pytest.raises(QrlInputError):
            a2c.config_for("gym:CartPole-v1", bad)
    a2c.check_env("gym:CartPole-v1", CARTPOLE_ACTIONS)
    a2c.check_env("gym:Pendulum-v1", specs.BoundedArray((1,), np.float32, -2.0, 2.0))
    with pytest.raises(QrlInputError, match="a2c"):
        a2c.check_env("x:y", specs.BoundedArray((2, 2), np.float32, -1.0, 1.0))


def test_rmsprop_matches_torch_form():
    config = a2c.Config(learning_rate=0.1, max_grad_norm=1e9, flat_optimizer=False)
    optimizer = learning.make_optimizer(config)
    params = {"w": jnp.array([1.0])}
    state = optimizer.init(params)
    updates, _ = optimizer.update({"w": jnp.array([2.0])}, state, params)
    # v = 0.01 * 4 = 0.04; Δ = -0.1 * 2 / (0.2 + 1e-5)
    np.testing.assert_allclose(updates["w"], [-0.1 * 2.0 / (0.2 + 1e-5)], rtol=1e-6)
    assert isinstance(optimizer, optax.GradientTransformation)


def test_one_update_step_raises_rewarded_log_probs():
    config = a2c.Config(num_envs=4, num_steps=5, hidden_sizes=(16,), gamma=0.0, learning_rate=1e-2)
    state = learning.init(jax.random.PRNGKey(0), config, CARTPOLE_OBS, CARTPOLE_ACTIONS)
    keys = jax.random.split(jax.random.PRNGKey(1), 2)
    actions = jax.random.randint(keys[0], (5, 4), 0, 2)
    rollout = onpolicy.Rollout(
        observation=jax.random.normal(keys[1], (5, 4, 4)), action=actions, log_prob=jnp.zeros((5, 4)),
        reward=jnp.where(actions == 1, 1.0, -1.0), discount=jnp.ones((5, 4)), done=jnp.zeros((5, 4)),
        final_observation=jnp.zeros((5, 4, 4)),
    )
    actor_critic = a2c.networks.make_actor_critic(config, CARTPOLE_OBS, CARTPOLE_ACTIONS)

    def rewarded_log_prob(params):
        log_prob, _ = actor_critic.log_prob_and_entropy(params, rollout.observation.reshape(20, 4), jnp.ones(20, jnp.int32))
        return float(jnp.mean(log_prob))

    new_state, metrics = jax.jit(learning.make_update(config, CARTPOLE_OBS, CARTPOLE_ACTIONS))(state, rollout)
    assert int(new_state.updates) == 1 and int(new_state.iterations) == 1
    assert rewarded_log_prob(new_state.params) > rewarded_log_prob(state.params)
    assert set(metrics) == {"loss", "policy_loss", "value_loss", "entropy"}


def test_learns_cartpole_on_host():
    config = a2c.config_for("gym:CartPole-v1")  # rl-zoo: 8 envs x 5 steps, RMSProp 7e-4
    state, results = a2c.train("gym:CartPole-v1", config, 200_000, seed=0, progress=False)
    assert results["final_eval"]["mean"] >= 200.0, results["final_eval"]
    assert results["agent"] == "a2c" and results["updates"] == 5000 and results["env_steps"] == 200_000
    assert a2c.policy_spec(config, CARTPOLE_OBS, CARTPOLE_ACTIONS).divergence == "categorical"
    assert jax.tree.structure(a2c.policy_params(state)) == jax.tree.structure(
        a2c.policy_params(a2c.init_state(config, CARTPOLE_OBS, CARTPOLE_ACTIONS))
    )


def test_make_train_on_device_smoke():
    config = a2c.config_for("gymnax:CartPole-v1", {"hidden_sizes": "16"})
    state, metrics = jax.jit(a2c.make_train(config, "gymnax:CartPole-v1", 400))(jax.random.PRNGKey(0))
    assert metrics["loss"].shape == (10,) and int(state.updates) == 10
    assert int(metrics["env_steps"][-1]) == 400


@pytest.mark.parametrize("backend", ["qrl", "aqt"])
def test_learns_gymnax_cartpole_with_qat8_on_device(backend):
    """rl-zoo's CartPole A2C setting on gymnax, 500k steps, QAT8 after half the updates,
    evaluated as the static int8 export with the trained ranges (measured 500.0 on both
    backends, seed 0; the host fp32 test's threshold)."""
    from qrl import onpolicy
    from qrl.config import total_updates
    from qrl.envs import make_functional
    from qrl.quant import make_exporter, serving_precision

    config = a2c.config_for("gymnax:CartPole-v1", {"qat_bits": 8, "qat_backend": backend})
    config = config.override({"quant_delay": total_updates(config, 500_000) // 2})
    state, _ = jax.jit(a2c.make_train(config, "gymnax:CartPole-v1", 500_000))(jax.random.PRNGKey(0))
    assert int(state.updates) == 12_500 and int(state.quant_ranges["head"]["seen"]) == 12_500
    env = make_functional("gymnax:CartPole-v1", 10)
    int8_actor_critic = a2c.networks.make_actor_critic(config, env.observation_spec(), env.action_spec(),
                                                       serving_precision(8))
    params = onpolicy.quantized_acting_params(make_exporter(8), state.params, state.quant_ranges)
    assert onpolicy.make_device_evaluator(int8_actor_critic, env)(params, 1_000_000).mean >= 200.0
