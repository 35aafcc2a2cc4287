"""The shared continuous off-policy machinery: device replay and n-step window, continuous
networks (stacked critics, bf16 training backward), and the host and on-device loops."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agents import sac
from qrl import offpolicy
from qrl.errors import QrlInputError
from qrl.networks import continuous
from qrl.networks.continuous import (
    Critic, CriticEnsemble, DeterministicActor, GaussianActor, compute_params, scale_actions, unscale_actions,
)
from qrl.quant import FP32, apply_tracking, parse_precision, qat_precision
from qrl.replay import (
    DeviceReplay, NStepAccumulator, Transition, nstep_window_init, nstep_window_push,
)

BF16 = parse_precision("bf16")
LOW, HIGH = (-2.0, -1.0), (2.0, 3.0)


@pytest.fixture(autouse=True)
def synchronous_dispatch():
    jax.config.update("jax_cpu_enable_async_dispatch", False)


def _tiny_sac(**values):
    return sac.config_for("gym:Pendulum-v1", {"hidden_sizes": "32-32", "batch_size": 16, **values})


# ----- device replay and n-step window ---------------------------------------------------------


def _rows(start, count):
    values = np.arange(start, start + count, dtype=np.float32)
    return Transition(values[:, None], values[:, None], values, values, values[:, None])


def test_device_replay_rounds_capacity_wraps_and_skips_invalid_rows():
    replay = DeviceReplay(10, insert_size=4)
    assert replay.capacity == 12
    state = replay.init(jax.tree.map(lambda x: x[0], _rows(0, 1)))
    add = jax.jit(replay.add)
    state = add(state, _rows(100, 4), False)  # written but not kept
    assert int(state.size) == 0 and int(state.position) == 0
    for start in (0, 4, 8, 12):
        state = add(state, _rows(start, 4), True)
    assert int(state.size) == 12 and int(state.position) == 4
    np.testing.assert_array_equal(state.storage.reward, [12, 13, 14, 15, 4, 5, 6, 7, 8, 9, 10, 11])
    batches = jax.jit(replay.sample, static_argnums=(2, 3))(state, jax.random.PRNGKey(0), 5, 3)
    assert batches.observation.shape == (3, 5, 1) and batches.reward.shape == (3, 5)
    assert set(np.asarray(batches.reward).ravel()) <= set(range(4, 16))


def test_nstep_window_emits_the_host_accumulators_transitions():
    n, gamma, num_envs, length = 3, 0.9, 2, 40
    rng = np.random.default_rng(0)
    done = rng.random((length, num_envs)) < 0.15
    discount = np.where(done & (rng.random((length, num_envs)) < 0.5), 0.0, 1.0).astype(np.float32)
    reward = rng.normal(size=(length, num_envs)).astype(np.float32)
    observation = (np.arange(length)[:, None] * 10 + np.arange(num_envs)[None]).astype(np.float32)[..., None]
    next_observation = observation + 1000.0

    host = {}
    for index in range(num_envs):
        accumulator = NStepAccumulator(n, gamma)
        for t in range(length):
            for transition in accumulator.add(observation[t, index], np.zeros(1), reward[t, index], discount[t, index],
                                              next_observation[t, index], bool(done[t, index])):
                host[float(transition.observation[0])] = transition

    push = jax.jit(nstep_window_push, static_argnums=7)
    window = nstep_window_init(n, jnp.asarray(observation[0]), jnp.zeros((num_envs, 1)))
    device = {}
    for t in range(length):
        window, transition, valid = push(window, observation[t], np.zeros((num_envs, 1)), reward[t], discount[t],
                                         done[t], next_observation[t], gamma)
        if bool(valid):
            for index in range(num_envs):
                row = jax.tree.map(lambda x: np.asarray(x[index]), transition)
                device[float(row.observation[0])] = row
    # The window emits each step's transition n-1 steps late; all earlier starts must match.
    starts = {key for key in host if key // 10 < length - (n - 1)}
    assert starts == set(device)
    for key in starts:
        for field in ("reward", "discount", "next_observation"):
            np.testing.assert_allclose(getattr(device[key], field), getattr(host[key], field), rtol=1e-5, atol=1e-6)


# ----- networks --------------------------------------------------------------------------------


def test_actions_scale_between_unit_range_and_bounds():
    unit = jnp.array([[-1.0, 1.0], [0.0, 0.0]])
    np.testing.assert_allclose(scale_actions(unit, LOW, HIGH), [[-2.0, 3.0], [0.0, 1.0]])
    np.testing.assert_allclose(unscale_actions(scale_actions(unit, LOW, HIGH), LOW, HIGH), unit, atol=1e-6)


def test_actors_stay_in_bounds_and_share_params_across_precisions():
    observations = 100.0 * jax.random.normal(jax.random.PRNGKey(0), (8, 3))
    actor = DeterministicActor(LOW, HIGH, (16, 16))
    params = actor.init(jax.random.PRNGKey(1), observations)["params"]
    for precision in (FP32, BF16, qat_precision(4)):
        module = DeterministicActor(LOW, HIGH, (16, 16), precision)
        variables = module.init(jax.random.PRNGKey(1), observations)
        assert jax.tree.structure(variables["params"]) == jax.tree.structure(params)
        actions, _ = apply_tracking(module, compute_params(params, precision), variables.get("quant_ranges", {}), observations)
        assert actions.shape == (8, 2) and actions.dtype == jnp.float32
        assert bool(jnp.all(actions >= jnp.array(LOW))) and bool(jnp.all(actions <= jnp.array(HIGH)))
    gaussian = GaussianActor(LOW, HIGH, (16,))
    gaussian_params = gaussian.init(jax.random.PRNGKey(2), observations)["params"]
    mean, log_std = gaussian.apply({"params": gaussian_params}, observations)
    deterministic = GaussianActor(LOW, HIGH, (16,), deterministic=True).apply({"params": gaussian_params}, observations)
    np.testing.assert_allclose(deterministic, scale_actions(jnp.tanh(mean), LOW, HIGH), rtol=1e-6)
    assert log_std.shape == (8, 2) and float(jnp.max(log_std)) <= 2.0


def test_stacked_critics_equal_separate_critics():
    observations, actions = jnp.ones((5, 3)), jnp.zeros((5, 2))
    ensemble = CriticEnsemble(LOW, HIGH, (16, 16), num_critics=2)
    params = ensemble.init(jax.random.PRNGKey(0), observations, actions)["params"]
    q = ensemble.apply({"params": params}, observations, actions)
    assert q.shape == (2, 5)
    single = Critic(LOW, HIGH, (16, 16))
    for index in range(2):
        one = jax.tree.map(lambda leaf: leaf[index], params["critics"])
        np.testing.assert_allclose(q[index], single.apply({"params": one}, observations, actions), rtol=1e-5)
    assert not np.allclose(q[0], q[1])  # independently initialized


@pytest.mark.parametrize("stacked", [False, True])
def test_bf16_training_backward_matches_autodiff_of_the_bf16_forward(stacked, monkeypatch):
    key_obs, key_act, key_init = jax.random.split(jax.random.PRNGKey(0), 3)
    observations = jax.random.normal(key_obs, (64, 3))
    actions = jax.random.uniform(key_act, (64, 2), minval=-1.0, maxval=1.0)

    def build(precision):
        if stacked:
            return CriticEnsemble(LOW, HIGH, (64, 64), precision, num_critics=2, num_outputs=3)
        return Critic(LOW, HIGH, (64, 64), precision, num_outputs=3)

    params = build(FP32).init(key_init, observations, actions)["params"]

    def loss(params, actions, precision):
        q = build(precision).apply({"params": compute_params(params, precision)}, observations, actions)
        return jnp.mean(jnp.square(q - 1.0))

    gradients = jax.jit(jax.grad(loss, argnums=(0, 1)), static_argnums=2)
    custom = jax.tree.leaves(gradients(params, actions, BF16))
    float32 = jax.tree.leaves(gradients(params, actions, FP32))
    # The reference: plain autodiff of the same bf16 forward pass (float32 backward matmuls).
    monkeypatch.setattr(continuous, "_low_precision_float", lambda precision: False)
    reference = jax.tree.leaves(jax.jit(jax.grad(loss, argnums=(0, 1)), static_argnums=2)(params, actions, BF16))
    for mine, ref, exact in zip(custom, reference, float32):
        assert mine.dtype == jnp.float32
        assert float(jnp.linalg.norm(mine - ref)) < 0.01 * float(jnp.linalg.norm(ref))
        assert float(jnp.linalg.norm(mine - exact)) < 0.1 * float(jnp.linalg.norm(exact))


# ----- loops -----------------------------------------------------------------------------------


def test_continuous_agents_reject_discrete_actions():
    with pytest.raises(QrlInputError, match="agent sac needs continuous actions; gym:CartPole-v1 has discrete actions"):
        sac.train("gym:CartPole-v1", sac.Config(), 10, progress=False)


def test_host_loop_schedule_and_results(tmp_path):
    config = _tiny_sac(learning_starts=10, train_freq=5, gradient_steps=3)
    state, results = sac.train("gym:Pendulum-v1", config, 50, seed=1, workdir=str(tmp_path), num_envs=2,
                               eval_episodes=2, log_every=10, progress=False)
    # Training phases at 10, 15, ..., 50 environment steps, 3 updates each.
    assert results["updates"] == int(state.updates) == 27
    assert results["env_steps"] == 50 and results["final_eval"]["episodes"] == 2
    assert results["qat_bits"] == 0 and (tmp_path / "metrics.csv").exists()
    assert (tmp_path / "checkpoints").exists()


def test_host_loop_switches_the_actor_to_qat():
    config = _tiny_sac(learning_starts=10, qat_bits=4, quant_delay=20)
    state, results = sac.train("gym:Pendulum-v1", config, 40, eval_episodes=1, progress=False)
    assert results["qat_bits"] == 4 and results["quant_delay"] == 20 and results["updates"] == 31
    assert np.isfinite(results["final_eval"]["mean"])
    with pytest.raises(QrlInputError, match="quant_delay"):
        sac.train("gym:Pendulum-v1", config.replace(quant_delay=40), 40, progress=False)


def test_device_schedule_matches_the_host_update_rate():
    schedule = offpolicy.DeviceSchedule.for_run(_tiny_sac(learning_starts=16), num_envs=4, steps=64)
    assert (schedule.rollout, schedule.updates_per_iteration) == (1, 4)
    assert (schedule.warmup_iterations, schedule.fp32_iterations, schedule.qat_iterations) == (4, 12, 0)
    schedule = offpolicy.DeviceSchedule.for_run(
        _tiny_sac(learning_starts=0, train_freq=8, gradient_steps=2, qat_bits=8, quant_delay=8), num_envs=4, steps=64
    )
    assert (schedule.rollout, schedule.updates_per_iteration) == (2, 2)
    # quant_delay counts updates: 8 updates = 4 iterations of 2.
    assert (schedule.warmup_iterations, schedule.fp32_iterations, schedule.qat_iterations) == (0, 4, 4)
    schedule = offpolicy.DeviceSchedule.for_run(
        _tiny_sac(learning_starts=0, train_freq=8, gradient_steps=2, qat_bits=8, quant_delay=0), num_envs=4, steps=64
    )
    # No delay still runs one float iteration: its updates give the acting export its ranges.
    assert (schedule.warmup_iterations, schedule.fp32_iterations, schedule.qat_iterations) == (0, 1, 7)


def test_on_device_training_on_gymnax_pendulum_is_vmappable_over_seeds():
    from qrl.envs import make_functional

    config = _tiny_sac(learning_starts=16, qat_bits=8, quant_delay=24)
    env = make_functional("gymnax:Pendulum-v1", 4)
    eval_env = make_functional("gymnax:Pendulum-v1", 2, episode_length=20)
    agent = sac.build(config, env.observation_spec(), env.action_spec())
    train = jax.jit(jax.vmap(offpolicy.make_train(agent, config, env, 64, eval_env)))
    states, summary = train(jax.random.split(jax.random.PRNGKey(0), 2))
    np.testing.assert_array_equal(summary["env_steps"], [64, 64])
    np.testing.assert_array_equal(summary["updates"], [48, 48])
    assert summary["eval_returns"].shape == (2, 2) and bool(jnp.all(jnp.isfinite(summary["eval_returns"])))
    assert not np.allclose(summary["eval_returns"][0], summary["eval_returns"][1])  # different seeds
    assert states.actor_params["head"]["kernel"].shape[0] == 2


def test_train_dispatches_brax_ids_to_the_device_loop(tmp_path):
    config = sac.config_for("brax:halfcheetah", {"hidden_sizes": "32-32", "batch_size": 32, "learning_starts": 64})
    state, results = sac.train(
        "brax:halfcheetah", config, 200, seed=0, workdir=str(tmp_path), num_envs=4, eval_episodes=2,
        progress=False, env_options={"episode_length": 50},
    )
    assert results["on_device"] and results["env_steps"] == 200 and results["updates"] == 136
    assert results["episodes"] == 4 and len(results["last_train_returns"]) == 4  # 50 steps per env
    assert np.isfinite(results["final_eval"]["mean"]) and results["final_eval"]["episodes"] == 2
    assert (tmp_path / "metrics.csv").exists() and (tmp_path / "checkpoints").exists()


# ----- every continuous agent ----------------------------------------------------------------

AGENT_NAMES = ("ddpg", "td3", "sac", "d4pg")
TINY = {
    "ddpg": {"hidden_sizes": "16-16"},
    "td3": {"hidden_sizes": "16-16", "policy_delay": 2},
    "sac": {"hidden_sizes": "16-16"},
    "d4pg": {"actor_hidden_sizes": "16-16", "critic_hidden_sizes": "16-16", "target_update_period": 2},
}


def _agent(name):
    import importlib

    return importlib.import_module(f"agents.{name}")


def _specs():
    from qrl import envs

    env = envs.make("gym:Pendulum-v1", 0)
    return env.observation_spec(), env.action_spec()


def _random_batches(key, num_batches, batch_size=8):
    keys = jax.random.split(key, 4)
    shape = (num_batches, batch_size)
    return Transition(
        observation=np.asarray(jax.random.normal(keys[0], shape + (3,))),
        action=np.asarray(jax.random.uniform(keys[1], shape + (1,), minval=-2.0, maxval=2.0)),
        reward=np.asarray(jax.random.uniform(keys[2], shape, minval=-16.0, maxval=0.0)),
        discount=np.full(shape, 0.99, np.float32),
        next_observation=np.asarray(jax.random.normal(keys[3], shape + (3,))),
    )


@pytest.mark.parametrize("name", AGENT_NAMES)
def test_fused_updates_equal_sequential_updates(name):
    agent_module = _agent(name)
    config = agent_module.config_for("gym:Pendulum-v1", {**TINY[name], "batch_size": 8})
    agent = agent_module.build(config, *_specs())
    update = jax.jit(agent.update(None))
    batches = _random_batches(jax.random.PRNGKey(1), 4)
    fused, _ = update(agent.init(jax.random.PRNGKey(0)), batches)
    sequential = agent.init(jax.random.PRNGKey(0))
    for k in range(4):
        sequential, _ = update(sequential, jax.tree.map(lambda x: x[k : k + 1], batches))
    assert int(agent.update_count(fused)) == int(agent.update_count(sequential)) == 4
    for a, b in zip(jax.tree.leaves(fused), jax.tree.leaves(sequential)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", AGENT_NAMES)
def test_package_surface(name):
    agent_module = _agent(name)
    observation_spec, action_spec = _specs()
    config = agent_module.config_for("gym:Pendulum-v1", TINY[name])
    state = agent_module.init_state(config, observation_spec, action_spec, seed=3)
    agent = agent_module.build(config, observation_spec, action_spec)
    assert jax.tree.structure(state) == jax.tree.structure(agent.init(jax.random.PRNGKey(0)))
    spec = agent_module.policy_spec(config, observation_spec, action_spec)
    assert spec.divergence == "deterministic"
    observations = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    params = agent_module.policy_params(state)
    deployed = spec.outputs_to_actions(spec.build_network(FP32).apply({"params": params}, observations))
    np.testing.assert_allclose(deployed, agent.policy(None)(params, observations), rtol=1e-6)
    assert deployed.shape == (5, 1) and bool(jnp.all(jnp.abs(deployed) <= 2.0))
    explored = agent.act(None)(params, observations, np.ones((5, 1), np.float32))
    assert explored.shape == (5, 1) and not np.allclose(explored, deployed)
    with pytest.raises(QrlInputError, match=f"agent {name} needs continuous actions; gym:CartPole-v1 has discrete"):
        agent_module.check_env("gym:CartPole-v1", _cartpole_action_spec())
    with pytest.raises(QrlInputError, match=f"unknown {name.upper()} config key"):
        agent_module.config_for("gym:Pendulum-v1", {"no_such_key": 1})
    with pytest.raises(QrlInputError, match="matmul_dtype"):
        agent_module.config_for("gym:Pendulum-v1", {"matmul_dtype": "fp8"})
    with pytest.raises(QrlInputError, match="qat_bits"):
        agent_module.config_for("gym:Pendulum-v1", {"qat_bits": 9})


def _cartpole_action_spec():
    from qrl import envs

    return envs.make("gym:CartPole-v1", 0).action_spec()
