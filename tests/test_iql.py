"""IQL: hand-computed losses, fused updates, masked training, scoring losses, learning a swing-up."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import agents
from agents import iql
from agents.iql import learning
from pruning import PruneSettings, prunable_leaves, prune_networks, random_masks
from qrl import offline
from qrl.checkpointing import Checkpointer
from qrl.datasets import Dataset
from qrl.errors import QrlInputError
from qrl.evaluation import evaluate
from qrl.replay import Transition
from tests.test_bc import ACTION_NOISE, ENV_ID, _swing_up_data
from tests.test_td3_bc import assert_masks_restored, assert_steps_agree, check_synflow_masks

MIN_NORMALIZED_SCORE = 70.0  # IQL must recover 70% of the data policy's return above random.
BOUNDS = ((-2.0,), (2.0,))


@pytest.fixture(scope="module")
def noisy_swing_up_data():
    """5,000 steps of the swing-up controller with N(0, 0.5) torque noise (tests.test_bc)."""
    return _swing_up_data(ACTION_NOISE)


def _batch(key, size=8, observation_size=3):
    """Random transitions `[size, ...]` with actions inside BOUNDS and some terminals."""
    keys = jax.random.split(key, 4)
    observations = jax.random.normal(keys[0], (size, observation_size))
    return Transition(
        observation=observations,
        action=jax.random.uniform(keys[1], (size, 1), minval=-2.0, maxval=2.0),
        reward=jax.random.normal(keys[2], (size,)),
        discount=(jax.random.uniform(keys[3], (size,)) > 0.2).astype(jnp.float32),
        next_observation=observations + 0.1,
    )


def _kernels(params):
    """Prunable flags for the kernels only: `prunable_leaves` also flags the stacked critics'
    biases, whose leaves are `[2, H]`."""
    return jax.tree_util.tree_map_with_path(lambda path, leaf: path[-1].key == "kernel", params)


def test_expectile_loss_by_hand():
    diff = jnp.array([2.0, -1.0, 0.5, -3.0])
    # weights 0.7 where q > v, 0.3 where q < v: (0.7*4 + 0.3*1 + 0.7*0.25 + 0.3*9) / 4
    np.testing.assert_allclose(learning.expectile_loss(diff, 0.7), (2.8 + 0.3 + 0.175 + 2.7) / 4, rtol=1e-6)
    np.testing.assert_allclose(learning.expectile_loss(diff, 0.5), 0.5 * (4 + 1 + 0.25 + 9) / 4, rtol=1e-6)


def test_advantage_weighted_actor_loss_by_hand():
    q, v = jnp.array([1.0, 3.0, -0.5]), jnp.array([0.5, 1.0, 0.5])
    weights = learning.advantage_weights(q, v, beta=3.0, max_weight=100.0)
    np.testing.assert_allclose(weights, [np.exp(1.5), 100.0, np.exp(-3.0)], rtol=1e-6)  # exp(6) = 403 is clipped
    h = jnp.array([[0.2, -1.0], [1.5, 0.0], [-0.3, 0.7]])
    log_std = jnp.array([-0.5, 3.0])  # the second is clipped to 2
    unit_actions = jnp.array([[0.1, -0.5], [0.9, 0.2], [-0.8, 0.0]])
    clipped = np.array([-0.5, 2.0])
    z = (np.asarray(unit_actions) - np.tanh(np.asarray(h))) / np.exp(clipped)
    log_prob = np.sum(-0.5 * z**2 - clipped - 0.5 * np.log(2 * np.pi), axis=1)
    expected = -np.mean(np.array([np.exp(1.5), 100.0, np.exp(-3.0)]) * log_prob)
    np.testing.assert_allclose(learning.awr_loss(h, log_std, unit_actions, weights), expected, rtol=1e-5)


def test_critic_loss_by_hand():
    q = jnp.array([[1.0, 2.0, 0.0], [0.5, 2.5, -1.0]])
    target = jnp.array([1.5, 2.0, 1.0])
    # critic 1: (0.25 + 0 + 1) / 3; critic 2: (1 + 0.25 + 4) / 3
    np.testing.assert_allclose(learning.critic_loss(q, target), 1.25 / 3 + 5.25 / 3, rtol=1e-6)


def test_update_reports_the_value_loss_of_the_scoring_loss_and_the_policy_is_the_mean():
    config = iql.config_for({"hidden_sizes": "16-16", "actor_lr_decay_steps": 10})
    state = learning.init(jax.random.PRNGKey(0), config, 3, BOUNDS)
    batch = _batch(jax.random.PRNGKey(1))
    expected = learning.scoring_losses(config, BOUNDS, state)["value"](state.value_params, batch, 1.0)
    _, metrics = jax.jit(learning.make_update(config, BOUNDS))(state, jax.tree.map(lambda leaf: leaf[None], batch))
    np.testing.assert_allclose(metrics["value_loss"], expected, rtol=1e-5)
    h, _ = learning.make_actor_outputs(config, BOUNDS).apply({"params": state.actor_params}, batch.observation)
    actions = iql.acting.make_policy(config, BOUNDS)(learning.policy_params(state), batch.observation)
    np.testing.assert_allclose(actions, 2.0 * np.tanh(h), rtol=1e-5)


def test_fused_updates_equal_sequential_updates():
    config = iql.config_for({"hidden_sizes": "16-16", "actor_lr_decay_steps": 8})
    state = learning.init(jax.random.PRNGKey(0), config, 3, BOUNDS)
    batches = jax.vmap(_batch)(jax.random.split(jax.random.PRNGKey(1), 4))
    update = jax.jit(learning.make_update(config, BOUNDS))
    fused, _ = update(state, batches)
    sequential = state
    for index in range(4):
        sequential, _ = update(sequential, jax.tree.map(lambda leaf: leaf[index:index + 1], batches))
    assert int(fused.updates) == int(sequential.updates) == 4
    for name in ("actor_params", "critic_params", "value_params", "target_critic_params"):
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                     getattr(fused, name), getattr(sequential, name))


def test_bf16_updates_track_fp32_updates():
    """The same 4 fused updates at bf16 and fp32 matmuls: every parameter's change agrees to bf16's
    precision, `log_std` stays float32 throughout, and the bf16 path did run."""
    fp32 = iql.config_for({"hidden_sizes": "64-64", "actor_lr_decay_steps": 8})
    bf16 = fp32.replace(matmul_dtype="bf16")
    state = learning.init(jax.random.PRNGKey(0), fp32, 3, BOUNDS)
    batches = jax.vmap(lambda key: _batch(key, size=32))(jax.random.split(jax.random.PRNGKey(1), 4))
    after32, metrics32 = jax.jit(learning.make_update(fp32, BOUNDS))(state, batches)
    after16, metrics16 = jax.jit(learning.make_update(bf16, BOUNDS))(state, batches)
    for name in ("actor_params", "critic_params", "value_params", "target_critic_params"):
        start, leaves32, leaves16 = (jax.tree.leaves(getattr(tree, name)) for tree in (state, after32, after16))
        for before, leaf32, leaf16 in zip(start, leaves32, leaves16):
            assert leaf16.dtype == jnp.float32, name
            step32, step16 = np.asarray(leaf32) - np.asarray(before), np.asarray(leaf16) - np.asarray(before)
            assert_steps_agree(step16, step32, name)
    assert not np.array_equal(after32.value_params["head"]["kernel"], after16.value_params["head"]["kernel"])
    for metric in ("value_loss", "actor_loss", "critic_loss"):
        np.testing.assert_allclose(metrics16[metric], metrics32[metric], rtol=0.02, err_msg=metric)


def test_scoring_losses_keys_and_temperature():
    config = iql.config_for({"hidden_sizes": "16-16", "actor_lr_decay_steps": 10})
    state = learning.init(jax.random.PRNGKey(0), config, 3, BOUNDS)
    losses, params = learning.scoring_losses(config, BOUNDS, state), learning.networks_at_init(state)
    assert set(losses) == set(params) == set(learning.NETWORKS) == {"actor", "critic", "value"}
    batch = _batch(jax.random.PRNGKey(1))
    for name, loss_fn in losses.items():
        at_one, at_two = float(loss_fn(params[name], batch, 1.0)), float(loss_fn(params[name], batch, 2.0))
        assert np.isfinite(at_one) and abs(at_one - at_two) > 1e-4, name
        assert any(np.any(leaf != 0) for leaf in jax.tree.leaves(jax.grad(loss_fn)(params[name], batch, 1.0))), name


def test_synflow_prunes_every_network_to_the_exact_count_without_layer_collapse():
    config = iql.config_for({"hidden_sizes": "16-16", "actor_lr_decay_steps": 10})
    state = learning.init(jax.random.PRNGKey(0), config, 3, BOUNDS)
    networks, synflow_inputs = learning.networks_at_init(state), learning.synflow_inputs(config, BOUNDS, 3)
    shapes = {name: shape for name, (_, shape) in synflow_inputs.items()}
    assert shapes == {"actor": (1, 3), "critic": (1, 4), "value": (1, 3)}
    masks = prune_networks("synflow", networks, learning.scoring_losses(config, BOUNDS, state),
                           [_batch(jax.random.PRNGKey(1))], PruneSettings(sparsity=0.9, min_kept_per_layer=0),
                           key=jax.random.PRNGKey(1), synflow_inputs=synflow_inputs)
    assert masks["actor"]["log_std"] is None  # a parameter, not a layer: never pruned.
    check_synflow_masks(networks, synflow_inputs, masks)

def test_reward_scale_from_trajectories():
    # Two trajectories split where next_observation[i] != observation[i + 1]; a third after a terminal.
    observations = jnp.array([[0.0], [1.0], [5.0], [6.0], [7.0]])
    next_observations = jnp.array([[1.0], [2.0], [6.0], [7.0], [8.0]])
    rewards = jnp.array([1.0, 2.0, -1.0, -3.0, 4.0])
    discounts = jnp.array([1.0, 1.0, 1.0, 0.0, 1.0])
    dataset = Dataset(Transition(observations, jnp.zeros((5, 1)), rewards, discounts, next_observations),
                      jnp.zeros(1), jnp.ones(1))
    np.testing.assert_allclose(learning.trajectory_returns(dataset), [3.0, -4.0, 4.0])
    assert learning.reward_scale(dataset) == pytest.approx(1000.0 / 8.0)
    config = iql.config_for_run(iql.config_for({}), dataset, steps=123)
    assert config.reward_scale == pytest.approx(125.0) and config.actor_lr_decay_steps == 123
    fixed = iql.config_for_run(iql.config_for({"normalize_rewards": False, "actor_lr_decay_steps": 7}), dataset, 123)
    assert fixed.reward_scale == 1.0 and fixed.actor_lr_decay_steps == 7


# Pendulum's rewards run to -16 per step; the reference's locomotion scale, 1000 / (return range),
# multiplies them by 2.9 on this set (returns -0.5 to -346), so Q - V spans tens and the advantage
# weights exp(3 (Q - V)) sit at 0 or the 100 clip: 3000 updates scored 68 / 61 (seeds 0 / 1), 6000
# updates 28 / 27. Rewards scaled by 0.1, as D4RL locomotion's end up, scored 101 / 99 at both budgets.
PENDULUM_IQL = {"normalize_rewards": False, "reward_scale": 0.1}


@pytest.mark.parametrize("matmul_dtype,steps", [("fp32", 3000), ("fp32", 6000), ("bf16", 3000)])
def test_iql_recovers_the_data_policys_return(noisy_swing_up_data, matmul_dtype, steps):
    dataset, data_return = noisy_swing_up_data
    random_policy = np.random.default_rng(0)
    random_return = evaluate(lambda obs: random_policy.uniform(-2.0, 2.0, (len(obs), 1)), ENV_ID, 10, seed=0).mean
    assert data_return > random_return + 500.0
    config = iql.config_for({**PENDULUM_IQL, "matmul_dtype": matmul_dtype})
    _, results = iql.train(dataset, ENV_ID, config, steps=steps, seed=0, eval_every=0,
                           reference=(random_return, data_return), progress=False)
    assert results["updates"] == steps
    assert results["normalized_score"]["mean"] >= MIN_NORMALIZED_SCORE, (results["final_eval"], data_return)


def test_masked_iql_keeps_pruned_weights_targets_and_moments_zero_and_checkpoints_the_masks(
    noisy_swing_up_data, tmp_path
):
    dataset, _ = noisy_swing_up_data
    config = iql.config_for({"hidden_sizes": "64-64", "actor_lr_decay_steps": 300})
    dense = learning.networks_at_init(learning.init(jax.random.PRNGKey(1), config, 3, BOUNDS))
    masks = {name: random_masks(jax.random.PRNGKey(2 + index), params, 0.9, _kernels(params))
             for index, (name, params) in enumerate(dense.items())}
    workdir = str(tmp_path / "masked")
    state, results = iql.train(dataset, ENV_ID, config, steps=300, seed=0, workdir=workdir, mask=masks,
                               eval_every=0, eval_episodes=1, progress=False)
    assert results["updates"] == 300
    trained = {"actor": (state.actor_params, state.actor_opt_state),
               "critic": (state.critic_params, state.critic_opt_state),
               "value": (state.value_params, state.value_opt_state)}
    for name, (params, opt_state) in trained.items():
        kept = {path: np.asarray(leaf) for path, leaf in jax.tree_util.tree_leaves_with_path(masks[name])}
        assert 0.09 < sum(leaf.sum() for leaf in kept.values()) / sum(leaf.size for leaf in kept.values()) < 0.11
        mu, nu = (optax.tree_utils.tree_get(opt_state, moment) for moment in ("mu", "nu"))
        trees = (params, mu, nu) + ((state.target_critic_params,) if name == "critic" else ())
        for tree in trees:
            for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
                if path in kept:
                    assert np.all(np.asarray(leaf)[~kept[path]] == 0.0), (name, path)
        for path, leaf in jax.tree_util.tree_leaves_with_path(nu):  # it trained
            assert np.asarray(leaf)[kept[path]].any() if path in kept else np.asarray(leaf).any(), (name, path)

    checkpointer = Checkpointer(os.path.join(workdir, "checkpoints"))
    other = {name: random_masks(jax.random.PRNGKey(9), params, 0.9, _kernels(params))
             for name, params in dense.items()}
    template = iql.build(config, *offline.env_specs(ENV_ID), other).init(jax.random.PRNGKey(5))
    restored = checkpointer.restore(template)
    checkpointer.close()
    assert_masks_restored(restored.masks, masks, learning.NETWORKS)


def test_partial_masks_leave_other_networks_dense():
    config = iql.config_for({"hidden_sizes": "8-8", "actor_lr_decay_steps": 10})
    value = learning.init(jax.random.PRNGKey(0), config, 3, BOUNDS).value_params
    mask = random_masks(jax.random.PRNGKey(1), value, 0.5, prunable_leaves(value))
    state = iql.build(config, *offline.env_specs(ENV_ID), {"value": mask}).init(jax.random.PRNGKey(0))
    assert state.masks["actor"] is None and state.masks["critic"] is None
    kernel = np.asarray(state.value_params["torso"]["dense_1"]["kernel"])
    assert np.all(kernel[~np.asarray(mask["torso"]["dense_1"]["kernel"])] == 0.0)


def test_bad_input_is_one_line():
    config = iql.config_for({"hidden_sizes": "8-8", "actor_lr_decay_steps": 10})
    specs = offline.env_specs(ENV_ID)
    message = "^iql has no network actor_target to mask; its networks: actor, critic, value$"
    with pytest.raises(QrlInputError, match=message):
        iql.build(config, *specs, mask={"actor_target": None})
    other = learning.init(jax.random.PRNGKey(0), iql.config_for({"hidden_sizes": "4-4", "actor_lr_decay_steps": 1}),
                          3, BOUNDS)
    mask = jax.tree.map(lambda leaf: jnp.ones(leaf.shape, bool), other.critic_params)
    with pytest.raises(QrlInputError, match="^mask does not match params"):
        iql.build(config, *specs, mask={"critic": mask}).init(jax.random.PRNGKey(0))
    with pytest.raises(QrlInputError, match="^IQL's cosine actor_lr_schedule needs actor_lr_decay_steps > 0"):
        iql.build(iql.config_for({}), *specs)
    with pytest.raises(QrlInputError, match="IQL config expectile must be in"):
        iql.config_for({"expectile": 1.0})
    with pytest.raises(QrlInputError, match="IQL config actor_lr_schedule must be one of cosine, constant"):
        iql.config_for({"actor_lr_schedule": "linear"})
    with pytest.raises(QrlInputError, match="IQL config matmul_dtype must be one of fp32, bf16"):
        iql.config_for({"matmul_dtype": "int8"})


def test_config_and_registry():
    config = iql.Config()
    assert config == iql.config_for()
    assert (config.expectile, config.beta, config.max_weight) == (0.7, 3.0, 100.0)
    assert (config.tau, config.gamma) == (0.005, 0.99)
    assert config.batch_size == 256 and config.hidden_sizes == (256, 256) and config.actor_lr_schedule == "cosine"
    assert agents.get_offline_agent("iql") is iql and "iql" not in agents.AGENT_NAMES
