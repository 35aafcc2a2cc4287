"""BCQ: hand-computed losses and targets, the perturbation bound, fused updates, masked training,
deterministic acting, the bf16 sampled passes, learning from a noisy swing-up controller."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import agents
from agents import bcq
from agents.bcq import learning
from pruning import PruneSettings, leaf_paths, prunable_count, prune_networks, random_masks, snip_scores
from qrl import offline
from qrl.checkpointing import Checkpointer
from qrl.errors import QrlInputError
from qrl.evaluation import evaluate
from qrl.networks.continuous import scale_actions
from qrl.replay import Transition
from tests.test_bc import ACTION_NOISE, _swing_up_data
from tests.test_td3_bc import assert_masks_restored, assert_steps_agree, check_synflow_masks, random_batches

ENV_ID = "gym:Pendulum-v1"
BOUNDS = ((-2.0,), (2.0,))
MIN_NORMALIZED_SCORE = 70.0  # random = 0, the data's average return = 100.
SMALL = {"vae_hidden_sizes": "16-16", "actor_hidden_sizes": "16-16", "critic_hidden_sizes": "16-16"}

OBSERVATIONS = np.array([[1.0, 0.5], [-0.5, 2.0], [0.3, -1.2]], np.float32)
ACTIONS = np.array([[1.0], [-2.0], [0.5]], np.float32)
BATCH = Transition(OBSERVATIONS, ACTIONS, np.array([0.5, -1.0, 2.0], np.float32), np.array([1.0, 0.0, 1.0], np.float32),
                   np.array([[0.2, -0.4], [1.1, 0.7], [-0.8, -0.3]], np.float32))


def _tiny_vae():
    """A VAE with one hidden layer of 3 on 2-dim observations, 1-dim actions, 2-dim latents."""
    rng = np.random.default_rng(3)
    layer = lambda rows, columns: {"kernel": rng.normal(size=(rows, columns)).astype(np.float32),
                                   "bias": rng.normal(size=(columns,)).astype(np.float32) * 0.1}
    return {"encoder": {"torso": {"dense_0": layer(3, 3)}, "mean": layer(3, 2), "log_std": layer(3, 2)},
            "decoder": {"torso": {"dense_0": layer(4, 3)}, "head": layer(3, 1)}}


def _np_dense(params, x):
    return x @ params["kernel"] + params["bias"]


def _np_vae_loss(params, observations, unit_actions, noise, temperature):
    """recon MSE + 0.5 * KL, written out (outputs divided by `temperature`)."""
    encoder, decoder = params["encoder"], params["decoder"]
    hidden = np.maximum(_np_dense(encoder["torso"]["dense_0"], np.concatenate([observations, unit_actions], 1)), 0.0)
    mean = _np_dense(encoder["mean"], hidden) / temperature
    log_std = np.clip(_np_dense(encoder["log_std"], hidden) / temperature, -4.0, 15.0)
    z = mean + np.exp(log_std) * noise
    hidden = np.maximum(_np_dense(decoder["torso"]["dense_0"], np.concatenate([observations, z], 1)), 0.0)
    reconstruction = np.tanh(_np_dense(decoder["head"], hidden) / temperature)
    recon = np.mean((reconstruction - unit_actions) ** 2)
    std = np.exp(log_std)
    kl = -0.5 * np.mean(1.0 + np.log(std**2) - mean**2 - std**2)
    return recon + 0.5 * kl


def test_vae_loss_by_hand():
    reconstruction = jnp.array([[0.5], [-0.2]])
    mean = jnp.array([[0.0, 1.0], [0.5, -0.5]])
    log_std = jnp.array([[0.0, 0.0], [np.log(2.0), 0.0]])
    loss, (recon, kl) = learning.vae_loss(reconstruction, jnp.array([[0.3], [0.1]]), mean, log_std)
    # recon: (0.2^2 + 0.3^2) / 2; kl: -0.5 * mean(0, -1, 2 ln 2 - 3.25, -0.25).
    expected_kl = -0.5 * (-1.0 + 2.0 * np.log(2.0) - 3.25 - 0.25) / 4.0
    np.testing.assert_allclose((recon, kl, loss), (0.065, expected_kl, 0.065 + 0.5 * expected_kl), rtol=1e-6)


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_vae_loss_of_a_tiny_network_matches_numpy(temperature):
    config = bcq.config_for({"vae_hidden_sizes": "3"})
    forward = learning.Forward(config, BOUNDS)
    noise = np.array([[0.3, -1.1], [0.8, 0.2], [-0.5, 1.4]], np.float32)
    unit_actions = ACTIONS / 2.0
    params = _tiny_vae()
    loss, _ = forward.vae_loss(jax.tree.map(jnp.asarray, params), OBSERVATIONS, unit_actions, noise, temperature)
    np.testing.assert_allclose(loss, _np_vae_loss(params, OBSERVATIONS, unit_actions, noise, temperature), rtol=1e-5)
    state = learning.init(jax.random.PRNGKey(0), config, 2, BOUNDS)
    assert leaf_paths(state.vae_params) == leaf_paths(params)


def test_soft_clipped_double_q_target_by_hand():
    q = jnp.array([[[1.0, 4.0, 2.0], [0.0, -1.0, 3.0]],   # Q1 [B=2, N=3]
                   [[3.0, 0.0, 2.0], [1.0, -2.0, 5.0]]])  # Q2
    # lambda 0.75: state 0 -> (1.5, 1.0, 2.0), state 1 -> (0.25, -1.75, 3.5); the max of each.
    np.testing.assert_allclose(learning.soft_clipped_max(q, 0.75), [2.0, 3.5], rtol=1e-6)
    np.testing.assert_allclose(learning.soft_clipped_max(q, 1.0), [2.0, 3.0], rtol=1e-6)  # clipped double Q
    target = learning.td_target(jnp.array([1.0, -1.0]), jnp.array([1.0, 0.0]), jnp.array([2.0, 3.5]), 0.99)
    np.testing.assert_allclose(target, [2.98, -1.0], rtol=1e-6)


def test_targets_take_the_best_soft_clipped_sample_per_next_state():
    config = bcq.config_for(SMALL)
    forward = learning.Forward(config, BOUNDS)
    state = learning.init(jax.random.PRNGKey(4), config, 2, BOUNDS)
    latents = forward.target_latents(jax.random.PRNGKey(5), 3)
    assert latents.shape == (3, 10, 2) and float(jnp.max(jnp.abs(latents))) <= 0.5
    target = forward.targets(state.vae_params, state.target_actor_params, state.target_critic_params, BATCH, latents)
    expected = []
    for b in range(3):
        observations = np.repeat(BATCH.next_observation[b:b + 1], 10, axis=0)
        decoded = forward.decode(state.vae_params, observations, latents[b])
        actions = forward.perturb(state.target_actor_params, observations, decoded)
        q = np.asarray(forward.q_values(state.target_critic_params, observations, actions))
        soft = 0.75 * q.min(axis=0) + 0.25 * q.max(axis=0)
        expected.append(BATCH.reward[b] + 0.99 * BATCH.discount[b] * soft.max())
    np.testing.assert_allclose(target, expected, rtol=1e-5, atol=1e-6)


def test_perturbation_is_bounded_by_phi_and_the_action_bounds():
    config = bcq.config_for(SMALL)
    forward = learning.Forward(config, BOUNDS)
    actor_params = learning.init(jax.random.PRNGKey(0), config, 3, BOUNDS).actor_params
    actor_params = {**actor_params, "head": jax.tree.map(lambda leaf: 100.0 * leaf, actor_params["head"])}  # saturate
    rng = np.random.default_rng(1)
    observations = rng.normal(size=(512, 3)).astype(np.float32)
    unit_actions = np.concatenate([rng.uniform(-1.0, 1.0, (500, 1)), np.full((6, 1), 1.0), np.full((6, 1), -1.0)])
    perturbed = forward.perturb(actor_params, observations, jnp.asarray(unit_actions, jnp.float32))
    shift = np.abs(np.asarray(scale_actions(perturbed, *BOUNDS)) - np.asarray(scale_actions(unit_actions, *BOUNDS)))
    max_action = 2.0
    assert np.all(shift <= config.phi * max_action + 1e-6)
    assert np.max(shift) > 0.9 * config.phi * max_action  # the bound is reached, so the test can fail.
    assert np.all(np.abs(np.asarray(perturbed)) <= 1.0)


def test_fused_updates_equal_sequential_updates():
    config = bcq.config_for(SMALL)
    batches = random_batches((4, 8))
    update = jax.jit(learning.make_update(config, BOUNDS))
    state = learning.init(jax.random.PRNGKey(0), config, 3, BOUNDS)
    fused, fused_metrics = update(state, batches)
    sequential, losses = state, []
    for index in range(4):
        sequential, metrics = update(sequential, jax.tree.map(lambda leaf: leaf[index:index + 1], batches))
        losses.append([metrics[name] for name in ("vae_loss", "critic_loss", "actor_loss")])
    assert int(fused.updates) == int(sequential.updates) == 4
    sequential_leaves = dict(jax.tree_util.tree_leaves_with_path(sequential))
    for path, leaf in jax.tree_util.tree_leaves_with_path(fused):
        np.testing.assert_allclose(leaf, sequential_leaves[path], rtol=1e-5, atol=1e-6, err_msg=str(path))
    np.testing.assert_allclose([fused_metrics[name] for name in ("vae_loss", "critic_loss", "actor_loss")],
                               np.mean(losses, axis=0), rtol=1e-5)
    for name in ("vae_params", "actor_params", "critic_params", "target_actor_params", "target_critic_params"):
        before, after = jax.tree.leaves(getattr(state, name)), jax.tree.leaves(getattr(fused, name))
        assert any(np.any(np.asarray(a) != np.asarray(b)) for a, b in zip(after, before)), name


def test_scoring_losses_are_deterministic_and_take_the_temperature():
    config = bcq.config_for(SMALL)
    state = learning.init(jax.random.PRNGKey(0), config, 2, BOUNDS)
    losses, networks = learning.scoring_losses(config, BOUNDS, state), learning.networks_at_init(state)
    assert set(losses) == set(networks) == set(learning.NETWORKS) == {"vae", "actor", "critic"}
    for name, loss_fn in losses.items():
        value = float(loss_fn(networks[name], BATCH, 1.0))
        assert np.isfinite(value) and value == float(loss_fn(networks[name], BATCH, 1.0)), name
        assert abs(float(loss_fn(networks[name], BATCH, 2.0)) - value) > 1e-4, name
        scores = snip_scores(loss_fn, networks[name], [BATCH], _kernels(networks[name]))
        assert leaf_paths(scores) == leaf_paths(networks[name])
        assert all(np.all(np.isfinite(leaf)) for leaf in jax.tree.leaves(scores) if leaf is not None)
    forward = learning.Forward(config, BOUNDS)
    q = forward.q_values(state.critic_params, OBSERVATIONS, ACTIONS / 2.0)
    target = losses["critic"](state.critic_params, BATCH, 1.0) - np.sum(np.mean(np.square(q), axis=1))
    assert float(target) != 0.0  # the TD targets are not zero: the loss is not just sum(Q^2).


def test_synflow_prunes_every_network_to_the_exact_count_without_layer_collapse():
    config = bcq.config_for(SMALL)
    state = learning.init(jax.random.PRNGKey(0), config, 2, BOUNDS)
    networks, synflow_inputs = learning.networks_at_init(state), learning.synflow_inputs(config, BOUNDS, 2)
    # vae: observations 2, actions 1, latents 2; actor and critics: observations 2, actions 1.
    assert {name: shape for name, (_, shape) in synflow_inputs.items()} == {"vae": (1, 5), "actor": (1, 3),
                                                                            "critic": (1, 3)}
    masks = prune_networks("synflow", networks, learning.scoring_losses(config, BOUNDS, state), [BATCH],
                           PruneSettings(sparsity=0.9, min_kept_per_layer=0), key=jax.random.PRNGKey(1),
                           synflow_inputs=synflow_inputs)
    check_synflow_masks(networks, synflow_inputs, masks)
    vae = masks["vae"]
    for part in ("encoder", "decoder"):  # each half of the VAE keeps about its share, neither starves
        share = sum(int(np.sum(kept)) for kept in jax.tree.leaves(vae[part])) / prunable_count(vae[part])
        assert 0.05 < share < 0.2, (part, share)

def test_policy_picks_the_best_candidate_deterministically_within_bounds():
    config = bcq.config_for({**SMALL, "acting_samples": 7})
    state = learning.init(jax.random.PRNGKey(2), config, 3, BOUNDS)
    params = learning.policy_params(state)
    observations = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    policy = jax.jit(bcq.acting.make_policy(config, BOUNDS))
    actions = np.asarray(policy(params, observations))
    np.testing.assert_array_equal(actions, np.asarray(policy(params, observations)))
    assert actions.shape == (5, 1) and np.all(np.abs(actions) <= 2.0)
    forward = learning.Forward(config, BOUNDS)
    latents = learning.sample_latents(jax.random.PRNGKey(config.acting_seed), (7, forward.latent_size), 0.5)
    for b in range(5):  # every state scores the same 7 latents: its action does not depend on the batch.
        repeated = np.repeat(observations[b:b + 1], 7, axis=0)
        decoded = forward.decode(state.vae_params, repeated, latents)
        candidates = forward.perturb(state.actor_params, repeated, decoded)
        best = int(np.argmax(forward.first_q(state.critic_params, repeated, candidates)))
        np.testing.assert_allclose(actions[b], scale_actions(candidates[best], *BOUNDS), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(policy(params, observations[b:b + 1]))[0], actions[b], rtol=1e-5, atol=1e-6)


def test_bf16_sampled_passes_match_fp32_within_tolerance():
    fp32 = bcq.config_for(SMALL)
    bf16 = fp32.replace(target_matmul_dtype="bf16")
    state = learning.init(jax.random.PRNGKey(0), fp32, 3, BOUNDS)
    batch = jax.tree.map(lambda leaf: leaf[0], random_batches((1, 64)))
    forward32, forward16 = learning.Forward(fp32, BOUNDS), learning.Forward(bf16, BOUNDS)
    latents = forward32.target_latents(jax.random.PRNGKey(1), 64)
    args = (state.vae_params, state.target_actor_params, state.target_critic_params, batch, latents)
    target32, target16 = np.asarray(forward32.targets(*args)), np.asarray(forward16.targets(*args))
    assert not np.array_equal(target16, target32)  # bf16 did run
    np.testing.assert_allclose(target16, target32, rtol=2e-2, atol=2e-2)
    # Acting: the fp32 Q_1 of the action bf16 picks is within tolerance of the best fp32 Q_1.
    params = learning.policy_params(state)
    observations = batch.observation
    q_of = lambda actions: np.asarray(forward32.first_q(state.critic_params, observations, actions / 2.0))
    q32 = q_of(bcq.acting.make_policy(fp32, BOUNDS)(params, observations))
    q16 = q_of(bcq.acting.make_policy(bf16, BOUNDS)(params, observations))
    np.testing.assert_allclose(q16, q32, rtol=2e-2, atol=2e-2)


def test_bf16_training_passes_track_fp32_updates():
    """The same 4 fused updates with the losses' passes at bf16 and at fp32 (targets at fp32 both):
    every parameter's step agrees in direction and size, params stay float32, the bf16 path ran."""
    fp32 = bcq.config_for({**SMALL, "vae_hidden_sizes": "64-64", "critic_hidden_sizes": "64-64"})
    bf16 = fp32.replace(matmul_dtype="bf16")
    state = learning.init(jax.random.PRNGKey(0), fp32, 3, BOUNDS)
    batches = random_batches((4, 32))
    after32, metrics32 = jax.jit(learning.make_update(fp32, BOUNDS))(state, batches)
    after16, metrics16 = jax.jit(learning.make_update(bf16, BOUNDS))(state, batches)
    for name in ("vae_params", "actor_params", "critic_params", "target_actor_params", "target_critic_params"):
        start, leaves32, leaves16 = (jax.tree.leaves(getattr(tree, name)) for tree in (state, after32, after16))
        for before, leaf32, leaf16 in zip(start, leaves32, leaves16):
            assert leaf16.dtype == jnp.float32, name
            assert_steps_agree(np.asarray(leaf16) - np.asarray(before), np.asarray(leaf32) - np.asarray(before), name)
    assert not np.array_equal(after32.vae_params["decoder"]["head"]["kernel"],
                              after16.vae_params["decoder"]["head"]["kernel"])
    for metric in ("vae_loss", "critic_loss", "actor_loss"):
        np.testing.assert_allclose(metrics16[metric], metrics32[metric], rtol=0.02, atol=1e-3, err_msg=metric)


def _kernels(params):
    """The kernels as prunable leaves (`prunable_leaves` would also take the stacked critics' biases)."""
    return jax.tree_util.tree_map_with_path(lambda path, _: path[-1].key == "kernel", params)


@pytest.fixture(scope="module")
def noisy_swing_up_data():
    """The swing-up controller with N(0, 0.5) torque noise (tests.test_bc's data set)."""
    return _swing_up_data(ACTION_NOISE)


def test_masked_bcq_keeps_pruned_weights_and_moments_zero_and_checkpoints_the_masks(noisy_swing_up_data, tmp_path):
    dataset, _ = noisy_swing_up_data
    config = bcq.config_for({"vae_hidden_sizes": "64-64", "actor_hidden_sizes": "64-64",
                             "critic_hidden_sizes": "64-64"})
    observation_spec, action_spec = offline.env_specs(ENV_ID)
    dense = learning.networks_at_init(learning.init(jax.random.PRNGKey(1), config, 3, BOUNDS))

    def masks_for(seed):
        return {name: random_masks(jax.random.PRNGKey(seed + index), params, 0.9, _kernels(params))
                for index, (name, params) in enumerate(sorted(dense.items()))}

    masks = masks_for(2)
    workdir = str(tmp_path / "masked")
    state, results = bcq.train(dataset, ENV_ID, config, steps=300, seed=0, workdir=workdir, mask=masks,
                               eval_every=0, eval_episodes=1, progress=False)
    assert results["updates"] == 300
    trees = {
        "vae": (state.vae_params, state.vae_opt_state, None),
        "actor": (state.actor_params, state.actor_opt_state, state.target_actor_params),
        "critic": (state.critic_params, state.critic_opt_state, state.target_critic_params),
    }
    for name, (online, opt_state, target) in trees.items():
        kept = {path: np.asarray(leaf) for path, leaf in jax.tree_util.tree_leaves_with_path(masks[name])}
        assert 0.09 < sum(leaf.sum() for leaf in kept.values()) / sum(leaf.size for leaf in kept.values()) < 0.11
        mu, nu = (optax.tree_utils.tree_get(opt_state, moment) for moment in ("mu", "nu"))
        for tree in (online, mu, nu) + ((target,) if target is not None else ()):
            for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
                if path in kept:
                    assert np.all(np.asarray(leaf)[~kept[path]] == 0.0), (name, path)
        for path, leaf in jax.tree_util.tree_leaves_with_path(nu):  # it trained
            assert np.asarray(leaf)[kept[path]].any() if path in kept else np.asarray(leaf).any(), (name, path)
        if target is not None:  # the targets moved off their start
            start = dict(jax.tree_util.tree_leaves_with_path(dense[name]))
            for path, leaf in jax.tree_util.tree_leaves_with_path(target):
                assert np.any(np.asarray(leaf) != np.asarray(start[path])), (name, path)

    checkpointer = Checkpointer(os.path.join(workdir, "checkpoints"))
    template = bcq.build(config, observation_spec, action_spec, masks_for(7)).init(jax.random.PRNGKey(5))
    restored = checkpointer.restore(template)
    checkpointer.close()
    assert_masks_restored(restored.masks, masks, learning.NETWORKS)
    for path, leaf in jax.tree_util.tree_leaves_with_path(restored.vae_params):
        np.testing.assert_array_equal(leaf, dict(jax.tree_util.tree_leaves_with_path(state.vae_params))[path])


def test_masks_that_do_not_fit_are_input_errors():
    config = bcq.config_for(SMALL)
    specs = offline.env_specs(ENV_ID)
    with pytest.raises(QrlInputError, match="^bcq has no network value to mask; its networks: vae, actor, critic$"):
        bcq.build(config, *specs, mask={"value": None})
    other = learning.init(jax.random.PRNGKey(0), config.replace(vae_hidden_sizes=(8,)), 3, BOUNDS)
    mask = jax.tree.map(lambda leaf: jnp.ones(leaf.shape, bool), other.vae_params)
    with pytest.raises(QrlInputError, match="^vae mask does not match params"):
        bcq.build(config, *specs, mask={"vae": mask}).init(jax.random.PRNGKey(0))


def test_bcq_trains_a_few_default_sized_updates(noisy_swing_up_data, tmp_path):
    dataset, _ = noisy_swing_up_data
    state, results = bcq.train(dataset, ENV_ID, bcq.config_for(), steps=25, seed=0, workdir=str(tmp_path),
                               eval_every=0, eval_episodes=1, log_every=10, progress=False)
    assert results["updates"] == 25 and int(state.updates) == 25  # K = 10: calls of 10, 10 and 5
    assert all(np.all(np.isfinite(leaf)) for leaf in jax.tree.leaves((state.vae_params, state.actor_params,
                                                                       state.critic_params)))
    assert np.isfinite(results["final_eval"]["mean"])


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_bcq_recovers_the_noisy_data_policys_return(noisy_swing_up_data, dtype):
    dataset, data_return = noisy_swing_up_data
    random_policy = np.random.default_rng(0)
    random_return = evaluate(lambda obs: random_policy.uniform(-2.0, 2.0, (len(obs), 1)), ENV_ID, 10, seed=0).mean
    assert data_return > random_return + 500.0  # the controller swings up; random actions do not.
    config = bcq.config_for({"matmul_dtype": dtype, "target_matmul_dtype": dtype})
    _, results = bcq.train(dataset, ENV_ID, config, steps=3000, seed=0, eval_every=0,
                           reference=(random_return, data_return), progress=False)
    assert results["updates"] == 3000
    assert results["normalized_score"]["mean"] >= MIN_NORMALIZED_SCORE, (results["final_eval"], data_return)


def test_config_and_registry():
    config = bcq.Config()
    assert config == bcq.config_for() and not config.normalize_observations
    assert (config.vae_hidden_sizes, config.actor_hidden_sizes, config.critic_hidden_sizes) == (
        (750, 750), (400, 300), (400, 300))
    assert (config.phi, config.lmbda, config.target_samples, config.acting_samples) == (0.05, 0.75, 10, 100)
    assert (config.actor_learning_rate, config.critic_learning_rate, config.vae_learning_rate) == (1e-3, 1e-3, 1e-3)
    assert (config.batch_size, config.tau, config.gamma) == (100, 0.005, 0.99)
    assert learning.latent_size(config, 3) == 6
    with pytest.raises(QrlInputError, match="BCQ config target_matmul_dtype must be one of fp32, bf16"):
        bcq.config_for({"target_matmul_dtype": "fp16"})
    with pytest.raises(QrlInputError, match="BCQ config matmul_dtype must be one of fp32, bf16"):
        bcq.config_for({"matmul_dtype": "int8"})
    with pytest.raises(QrlInputError, match="BCQ config lmbda must be in"):
        bcq.config_for({"lmbda": 1.5})
    assert agents.get_offline_agent("bcq") is bcq and "bcq" not in agents.AGENT_NAMES
