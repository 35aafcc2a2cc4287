"""TD3+BC: hand-computed losses, fused updates, masked training, learning from a noisy swing-up controller."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import agents
from agents import td3_bc
from agents.td3_bc import learning
from pruning import (
    PruneSettings,
    kept_count,
    leaf_paths,
    prunable_count,
    prunable_leaves,
    prune_networks,
    random_masks,
    snip_scores,
)
from qrl import offline
from qrl.checkpointing import Checkpointer
from qrl.errors import QrlInputError
from qrl.evaluation import evaluate
from qrl.replay import Transition
from tests.test_bc import ACTION_NOISE, _swing_up_data

ENV_ID = "gym:Pendulum-v1"
BOUNDS = ((-2.0,), (2.0,))
MIN_NORMALIZED_SCORE = 70.0  # random = 0, the data's average return = 100.

OBSERVATIONS = np.array([[1.0, 0.5], [-0.5, 2.0], [0.3, -1.2]], np.float32)
NEXT_OBSERVATIONS = np.array([[0.2, -0.4], [1.1, 0.7], [-0.8, -0.3]], np.float32)
ACTIONS = np.array([[1.0], [-2.0], [0.5]], np.float32)
REWARDS = np.array([0.5, -1.0, 2.0], np.float32)
DISCOUNTS = np.array([1.0, 0.0, 1.0], np.float32)
BATCH = Transition(OBSERVATIONS, ACTIONS, REWARDS, DISCOUNTS, NEXT_OBSERVATIONS)


def random_batches(shape, observation_size=3, seed=0) -> Transition:
    """Random transitions `[*shape, ...]`: actions inside BOUNDS, about 10% terminals."""
    rng = np.random.default_rng(seed)
    return Transition(
        rng.normal(size=shape + (observation_size,)).astype(np.float32),
        rng.uniform(-2.0, 2.0, shape + (1,)).astype(np.float32),
        rng.normal(size=shape).astype(np.float32), (rng.uniform(size=shape) > 0.1).astype(np.float32),
        rng.normal(size=shape + (observation_size,)).astype(np.float32),
    )


def _tiny_actor(head_scale=1.0):
    """A 2 -> 3 -> 1 actor with fixed weights (`DeterministicActor`'s tree)."""
    return {
        "torso": {"dense_0": {"kernel": np.array([[0.5, -1.0, 0.25], [1.5, 0.5, -0.75]], np.float32),
                              "bias": np.array([0.1, -0.2, 0.3], np.float32)}},
        "head": {"kernel": head_scale * np.array([[0.8], [-0.4], [1.2]], np.float32),
                 "bias": np.array([0.05], np.float32)},
    }


def _tiny_critics(scale=1.0):
    """Twin (2 + 1) -> 3 -> 1 critics with fixed weights, stacked (`CriticEnsemble`'s tree)."""
    kernel = np.array([[[0.7, -0.3, 0.2], [-0.5, 0.9, 0.4], [1.2, -0.8, 0.6]],
                       [[-0.2, 0.5, 0.8], [0.6, -0.4, 0.3], [-1.0, 0.7, 0.9]]], np.float32)
    head = np.array([[[1.5], [-1.1], [0.9]], [[0.4], [1.3], [-0.7]]], np.float32)
    bias = np.array([[0.1, 0.2, -0.1], [0.0, -0.3, 0.2]], np.float32)
    return {"critics": {
        "torso": {"dense_0": {"kernel": scale * kernel, "bias": bias}},
        "head": {"kernel": scale * head, "bias": np.array([[-0.4], [0.3]], np.float32)},
    }}


def _np_unit_actor(params, observations, temperature=1.0):
    """`tanh(head / temperature)` `[B, 1]`, written out."""
    torso = params["torso"]["dense_0"]
    hidden = np.maximum(observations @ np.asarray(torso["kernel"]) + np.asarray(torso["bias"]), 0.0)
    return np.tanh((hidden @ np.asarray(params["head"]["kernel"]) + np.asarray(params["head"]["bias"])) / temperature)


def _np_critics(params, observations, unit_actions):
    """Both critics' Q `[2, B]` at unit actions, written out."""
    params = jax.tree.map(np.asarray, params["critics"])
    inputs = np.concatenate([observations, unit_actions], axis=1)
    return np.stack([
        (np.maximum(inputs @ params["torso"]["dense_0"]["kernel"][i] + params["torso"]["dense_0"]["bias"][i], 0.0)
         @ params["head"]["kernel"][i] + params["head"]["bias"][i])[:, 0]
        for i in range(2)
    ])


def _tiny_state(config):
    """A state whose online and target networks are the fixed tiny ones (targets differ)."""
    state = learning.init(jax.random.PRNGKey(0), config, 2, BOUNDS)
    return state.replace(
        actor_params=jax.tree.map(jnp.asarray, _tiny_actor()),
        critic_params=jax.tree.map(jnp.asarray, _tiny_critics()),
        target_actor_params=jax.tree.map(jnp.asarray, _tiny_actor(head_scale=-0.5)),
        target_critic_params=jax.tree.map(jnp.asarray, _tiny_critics(scale=0.5)),
    )


def _expected_actor_loss(critic_params, temperature, alpha=2.5):
    """`(loss, lambda)`: `-lambda * mean Q1(s, pi(s)) + mean (pi(s) - a)^2` in unit actions."""
    policy = _np_unit_actor(_tiny_actor(), OBSERVATIONS, temperature)
    q1 = _np_critics(critic_params, OBSERVATIONS, policy)[0]
    weight = alpha / np.mean(np.abs(q1))
    return -weight * np.mean(q1) + np.mean((policy - ACTIONS / 2.0) ** 2), weight, q1


def _one_batch(batch):
    return jax.tree.map(lambda leaf: jnp.asarray(leaf)[None], batch)


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_actor_loss_and_lambda_by_hand(temperature):
    config = td3_bc.config_for({"hidden_sizes": "3"})
    state = _tiny_state(config)
    expected, weight, q1 = _expected_actor_loss(_tiny_critics(), temperature)
    assert q1.min() < 0.0 < q1.max()  # lambda's |Q| differs from Q
    loss = learning.scoring_losses(config, BOUNDS, state)["actor"](state.actor_params, BATCH, temperature)
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    policy = _np_unit_actor(_tiny_actor(), OBSERVATIONS, temperature)
    value, (lam, bc_mse) = learning.actor_loss(jnp.asarray(q1, jnp.float32), jnp.asarray(policy, jnp.float32),
                                               jnp.asarray(ACTIONS / 2.0), 2.5)
    np.testing.assert_allclose((value, lam, bc_mse), (expected, weight, np.mean((policy - ACTIONS / 2.0) ** 2)),
                               rtol=1e-5)
    if temperature == 1.0:  # the update's actor loss runs under the critics it has just updated.
        config = td3_bc.config_for({"hidden_sizes": "3", "policy_delay": 1})
        new_state, metrics = learning.make_update(config, BOUNDS)(_tiny_state(config), _one_batch(BATCH))
        expected, weight, _ = _expected_actor_loss(new_state.critic_params, 1.0)
        np.testing.assert_allclose((metrics["actor_loss"], metrics["lambda"]), (expected, weight), rtol=1e-5)
        policy = td3_bc.acting.make_policy(config, BOUNDS)(state.actor_params, OBSERVATIONS)
        np.testing.assert_allclose(policy, 2.0 * _np_unit_actor(_tiny_actor(), OBSERVATIONS), rtol=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_critic_loss_by_hand(temperature):
    config = td3_bc.config_for({"hidden_sizes": "3", "target_policy_noise": 0.0})
    state = _tiny_state(config)
    next_actions = _np_unit_actor(_tiny_actor(head_scale=-0.5), NEXT_OBSERVATIONS)
    next_q = _np_critics(_tiny_critics(scale=0.5), NEXT_OBSERVATIONS, next_actions)
    target = REWARDS + 0.99 * DISCOUNTS * next_q.min(axis=0)
    q = _np_critics(_tiny_critics(), OBSERVATIONS, ACTIONS / 2.0) / temperature
    expected = np.sum(np.mean((q - target) ** 2, axis=1))
    loss = learning.scoring_losses(config, BOUNDS, state)["critic"](state.critic_params, BATCH, temperature)
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    if temperature == 1.0:  # without smoothing noise the update's reported loss is the same, before its step.
        _, metrics = learning.make_update(config, BOUNDS)(state, _one_batch(BATCH))
        np.testing.assert_allclose(metrics["critic_loss"], expected, rtol=1e-5)
        assert np.isnan(metrics["actor_loss"])  # update 1 of policy_delay 2: no actor update.


def test_scoring_losses_keys_and_temperature():
    config = td3_bc.config_for({"hidden_sizes": "3"})
    state = _tiny_state(config)
    losses, networks = learning.scoring_losses(config, BOUNDS, state), learning.networks_at_init(state)
    assert set(losses) == set(networks) == set(learning.NETWORKS) == {"actor", "critic"}
    for name, loss_fn in losses.items():
        assert abs(float(loss_fn(networks[name], BATCH, 2.0)) - float(loss_fn(networks[name], BATCH, 1.0))) > 1e-3
        scores = snip_scores(loss_fn, networks[name], [BATCH], prunable_leaves(networks[name]))
        assert leaf_paths(scores) == leaf_paths(networks[name])
        assert all(np.all(np.isfinite(leaf)) for leaf in jax.tree.leaves(scores))


def check_synflow_masks(networks, synflow_inputs, masks, stacked=("critic",), sparsity=0.9):
    """Each network keeps exactly `round((1 - sparsity) * n)` weights; no prunable leaf (and no
    critic of a `stacked` network's `[C, ...]` leaves) is fully pruned; every prunable weight has
    a positive synaptic-flow gradient at `|params|` on the network's all-ones input."""
    assert set(masks) == set(networks) == set(synflow_inputs)
    for name, params in networks.items():
        mask = masks[name]
        assert kept_count(mask) == round((1 - sparsity) * prunable_count(mask)), name
        apply_fn, input_shape = synflow_inputs[name]
        flow = lambda p: sum(jnp.sum(out) for out in jax.tree.leaves(apply_fn(p, jnp.ones(input_shape))))
        gradient = jax.grad(flow)(jax.tree.map(jnp.abs, params))
        kept_leaves = jax.tree_util.tree_flatten_with_path(mask, is_leaf=lambda node: node is None)[0]
        for (path, kept), grad in zip(kept_leaves, jax.tree.leaves(gradient), strict=True):
            if kept is None:
                continue
            where = f"{name}{jax.tree_util.keystr(path)}"
            assert np.all(np.asarray(grad) > 0), where
            kept = np.asarray(kept)
            assert kept.any(), where
            if name in stacked:
                assert kept.reshape(kept.shape[0], -1).any(axis=1).all(), where


def test_synflow_prunes_every_network_to_the_exact_count_without_layer_collapse():
    config = td3_bc.config_for({"hidden_sizes": "16-16"})
    state = learning.init(jax.random.PRNGKey(0), config, 2, BOUNDS)
    networks, synflow_inputs = learning.networks_at_init(state), learning.synflow_inputs(config, BOUNDS, 2)
    assert {name: shape for name, (_, shape) in synflow_inputs.items()} == {"actor": (1, 2), "critic": (1, 3)}
    masks = prune_networks("synflow", networks, learning.scoring_losses(config, BOUNDS, state), [BATCH],
                           PruneSettings(sparsity=0.9, min_kept_per_layer=0), key=jax.random.PRNGKey(1),
                           synflow_inputs=synflow_inputs)
    check_synflow_masks(networks, synflow_inputs, masks)

def test_fused_updates_equal_sequential_updates():
    config = td3_bc.config_for({"hidden_sizes": "16-16"})
    batches = random_batches((4, 8))
    update = jax.jit(learning.make_update(config, BOUNDS))
    state = learning.init(jax.random.PRNGKey(0), config, 3, BOUNDS)
    fused, fused_metrics = update(state, batches)
    sequential, critic_losses = state, []
    for index in range(4):
        sequential, metrics = update(sequential, jax.tree.map(lambda leaf: leaf[index:index + 1], batches))
        critic_losses.append(metrics["critic_loss"])
    assert int(fused.updates) == int(sequential.updates) == 4
    for path, leaf in jax.tree_util.tree_leaves_with_path(fused):
        np.testing.assert_allclose(leaf, dict(jax.tree_util.tree_leaves_with_path(sequential))[path],
                                   rtol=1e-5, atol=1e-6, err_msg=str(path))
    np.testing.assert_allclose(fused_metrics["critic_loss"], np.mean(critic_losses), rtol=1e-5)
    assert np.all(np.asarray(fused.actor_params["head"]["kernel"]) != np.asarray(state.actor_params["head"]["kernel"]))


def test_bf16_updates_track_fp32_updates():
    """The same 4 fused updates at bf16 and fp32 matmuls: every parameter's change agrees to bf16's
    precision, and the bf16 path did run (the results differ)."""
    fp32 = td3_bc.config_for({"hidden_sizes": "64-64"})
    bf16 = fp32.replace(matmul_dtype="bf16")
    batches = random_batches((4, 32), seed=3)
    state = learning.init(jax.random.PRNGKey(0), fp32, 3, BOUNDS)
    after32, metrics32 = jax.jit(learning.make_update(fp32, BOUNDS))(state, batches)
    after16, metrics16 = jax.jit(learning.make_update(bf16, BOUNDS))(state, batches)
    for name in ("actor_params", "critic_params", "target_actor_params", "target_critic_params"):
        start, leaves32, leaves16 = (jax.tree.leaves(getattr(tree, name)) for tree in (state, after32, after16))
        for before, leaf32, leaf16 in zip(start, leaves32, leaves16):
            step32, step16 = np.asarray(leaf32) - np.asarray(before), np.asarray(leaf16) - np.asarray(before)
            assert_steps_agree(step16, step32, name)
    assert not np.array_equal(after32.critic_params["critics"]["head"]["kernel"],
                              after16.critic_params["critics"]["head"]["kernel"])
    np.testing.assert_allclose(metrics16["critic_loss"], metrics32["critic_loss"], rtol=0.02)
    assert jax.tree.map(lambda leaf: leaf.dtype, after16.critic_params) == jax.tree.map(
        lambda leaf: leaf.dtype, state.critic_params)  # params stay float32


def assert_steps_agree(step16: np.ndarray, step32: np.ndarray, name: str) -> None:
    """A bf16 parameter step points where the fp32 step points (cosine >= 0.97) with a norm within
    10%. Adam's first steps are near `lr * sign(g)`, so an element whose gradient is near zero may
    flip sign under bf16: the steps agree in direction, not element by element."""
    norm16, norm32 = np.linalg.norm(step16), np.linalg.norm(step32)
    if norm32 == 0.0:
        assert norm16 == 0.0, name
        return
    cosine = float(np.vdot(step16, step32) / (norm16 * norm32))
    assert cosine >= 0.97 and abs(norm16 / norm32 - 1.0) <= 0.1, (name, cosine, norm16 / norm32)


def _kernels(params):
    """The kernels as prunable leaves. `prunable_leaves` would also take the stacked critics'
    biases (`[2, H]`, ndim 2) for weights."""
    return jax.tree_util.tree_map_with_path(lambda path, _: path[-1].key == "kernel", params)


@pytest.fixture(scope="module")
def noisy_swing_up_data():
    """The swing-up controller with N(0, 0.5) torque noise (tests.test_bc's data set)."""
    return _swing_up_data(ACTION_NOISE)


def test_masked_td3_bc_keeps_pruned_weights_and_moments_zero_and_checkpoints_the_masks(noisy_swing_up_data, tmp_path):
    dataset, _ = noisy_swing_up_data
    config = td3_bc.config_for({"hidden_sizes": "64-64"})
    observation_spec, action_spec = offline.env_specs(ENV_ID)
    dense = learning.networks_at_init(learning.init(jax.random.PRNGKey(1), config, 3, BOUNDS))

    def masks_for(seed):
        return {name: random_masks(jax.random.PRNGKey(seed + index), params, 0.9, _kernels(params))
                for index, (name, params) in enumerate(sorted(dense.items()))}

    masks = masks_for(2)
    workdir = str(tmp_path / "masked")
    state, results = td3_bc.train(dataset, ENV_ID, config, steps=500, seed=0, workdir=workdir, mask=masks,
                                  eval_every=0, eval_episodes=1, progress=False)
    assert results["updates"] == 500
    trees = {
        "actor": (state.actor_params, state.target_actor_params, state.actor_opt_state),
        "critic": (state.critic_params, state.target_critic_params, state.critic_opt_state),
    }
    for name, (online, target, opt_state) in trees.items():
        kept = {path: np.asarray(leaf) for path, leaf in jax.tree_util.tree_leaves_with_path(masks[name])}
        assert 0.09 < sum(leaf.sum() for leaf in kept.values()) / sum(leaf.size for leaf in kept.values()) < 0.11
        mu, nu = (optax.tree_utils.tree_get(opt_state, moment) for moment in ("mu", "nu"))
        for tree in (online, target, mu, nu):
            for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
                if path in kept:
                    assert np.all(np.asarray(leaf)[~kept[path]] == 0.0), (name, path)
        for path, leaf in jax.tree_util.tree_leaves_with_path(nu):  # it trained
            assert np.asarray(leaf)[kept[path]].any() if path in kept else np.asarray(leaf).any(), (name, path)
        for path, leaf in jax.tree_util.tree_leaves_with_path(target):  # the targets moved off their start
            start = dict(jax.tree_util.tree_leaves_with_path(dense[name]))[path]
            assert np.any(np.asarray(leaf) != np.asarray(start)), (name, path)

    checkpointer = Checkpointer(os.path.join(workdir, "checkpoints"))
    template = td3_bc.build(config, observation_spec, action_spec, masks_for(7)).init(jax.random.PRNGKey(5))
    restored = checkpointer.restore(template)
    checkpointer.close()
    assert_masks_restored(restored.masks, masks, learning.NETWORKS)
    for path, leaf in jax.tree_util.tree_leaves_with_path(restored.critic_params):
        np.testing.assert_array_equal(leaf, dict(jax.tree_util.tree_leaves_with_path(state.critic_params))[path])


def test_masks_that_do_not_fit_are_input_errors():
    config = td3_bc.config_for({"hidden_sizes": "16-16"})
    specs = offline.env_specs(ENV_ID)
    with pytest.raises(QrlInputError, match="^td3_bc has no network value to mask; its networks: actor, critic$"):
        td3_bc.build(config, *specs, mask={"value": None})
    other = learning.init(jax.random.PRNGKey(0), td3_bc.config_for({"hidden_sizes": "64-64"}), 3, BOUNDS)
    mask = jax.tree.map(lambda leaf: jnp.ones(leaf.shape, bool), other.critic_params)
    with pytest.raises(QrlInputError, match="^critic mask does not match params"):
        td3_bc.build(config, *specs, mask={"critic": mask}).init(jax.random.PRNGKey(0))


@pytest.mark.parametrize("matmul_dtype", ["fp32", "bf16"])
def test_td3_bc_recovers_the_noisy_data_policys_return(noisy_swing_up_data, matmul_dtype):
    dataset, data_return = noisy_swing_up_data
    random_policy = np.random.default_rng(0)
    random_return = evaluate(lambda obs: random_policy.uniform(-2.0, 2.0, (len(obs), 1)), ENV_ID, 10, seed=0).mean
    assert data_return > random_return + 500.0  # the controller swings up; random actions do not.
    config = td3_bc.config_for({"matmul_dtype": matmul_dtype})
    _, results = td3_bc.train(dataset, ENV_ID, config, steps=3000, seed=0, eval_every=0,
                              reference=(random_return, data_return), progress=False)
    assert results["updates"] == 3000
    assert results["normalized_score"]["mean"] >= MIN_NORMALIZED_SCORE, (results["final_eval"], data_return)


def test_config_and_registry():
    config = td3_bc.Config()
    assert config == td3_bc.config_for() and config.alpha == 2.5 and config.normalize_observations
    assert (config.actor_learning_rate, config.critic_learning_rate, config.batch_size) == (3e-4, 3e-4, 256)
    with pytest.raises(QrlInputError, match="TD3_BC config alpha must be > 0"):
        td3_bc.config_for({"alpha": 0.0})
    assert config.matmul_dtype == "fp32"
    with pytest.raises(QrlInputError, match="config matmul_dtype must be one of fp32, bf16"):
        td3_bc.config_for({"matmul_dtype": "fp16"})
    assert agents.get_offline_agent("td3_bc") is td3_bc and "td3_bc" not in agents.AGENT_NAMES


def assert_masks_restored(restored_masks: dict, masks: dict, networks) -> None:
    """Every network's restored mask has the saved mask's leaves, equal bit for bit."""
    for name in networks:
        restored_mask = dict(jax.tree_util.tree_leaves_with_path(restored_masks[name]))
        expected = dict(jax.tree_util.tree_leaves_with_path(masks[name]))
        assert set(restored_mask) == set(expected)
        for path, leaf in restored_mask.items():
            np.testing.assert_array_equal(leaf, expected[path])
