"""Behaviour cloning: hand-computed losses, learning a swing-up controller, masked training."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import agents
from agents import bc
from agents.bc import learning
from pruning import prunable_leaves, random_masks
from qrl import offline
from qrl.checkpointing import Checkpointer
from qrl.datasets import collect, d4rl, from_qlearning
from qrl.errors import QrlInputError
from qrl.evaluation import evaluate
from qrl.replay import Transition

ENV_ID = "gym:Pendulum-v1"
MIN_NORMALIZED_SCORE = 80.0  # BC must recover 80% of the data policy's return above random.


def swing_up(observations):
    """Pendulum-v1 energy-pumping swing-up with a PD balance near the top: `[N, 3] -> [N, 1]`.

    Pendulum's dynamics are `theta'' = 15 sin(theta) + 3 u` (theta = 0 upright), so
    `E = theta'^2 / 2 + 15 cos(theta)` moves at `3 u theta'`: full torque along the velocity pumps
    E up to 15 (upright at rest); within cos(theta) > 0.8 a PD law holds the top.
    """
    observations = jnp.asarray(observations)
    cos, sin, velocity = observations[..., 0], observations[..., 1], observations[..., 2]
    energy = 0.5 * velocity**2 + 15.0 * cos
    direction = jnp.where(velocity >= 0.0, 1.0, -1.0)
    pump = 2.0 * direction * jnp.sign(15.0 - energy)
    balance = -(10.0 * jnp.arctan2(sin, cos) + 2.0 * velocity)
    return jnp.clip(jnp.where(cos > 0.8, balance, pump), -2.0, 2.0)[..., None]


ACTION_NOISE = 0.5  # std of the Gaussian added to the controller's torque in the noisy data set


def _swing_up_data(noise: float):
    """5,000 steps (25 episodes) of the controller, plus `noise` times standard-normal torque
    (clipped to the bounds), and the data's average episode return."""
    act = lambda params, observations, normal: jnp.clip(swing_up(observations) + noise * normal, -2.0, 2.0)
    steps, stats = collect.collect_steps(ENV_ID, act, None, 5000, seed=0)
    return from_qlearning(d4rl.qlearning_arrays(steps)), float(np.mean(stats["episode_returns"]))


@pytest.fixture(scope="module")
def swing_up_data():
    """The deterministic controller's data."""
    return _swing_up_data(0.0)


@pytest.fixture(scope="module")
def noisy_swing_up_data():
    """A stochastic behaviour policy's data (D4RL's data sets sample their policies' actions)."""
    return _swing_up_data(ACTION_NOISE)


def _specs():
    return offline.env_specs(ENV_ID)


def _tiny_params(outputs):
    """A 2 -> 3 -> head network with fixed weights (the `ActorOutputs` tree)."""
    kernel_0 = np.array([[0.5, -1.0, 0.25], [1.5, 0.5, -0.75]], np.float32)
    bias_0 = np.array([0.1, -0.2, 0.3], np.float32)
    head = np.array([[0.8, -0.6, 2.0, -3.0], [-0.4, 0.3, 1.5, 4.0], [1.2, 0.9, -2.5, 1.0]], np.float32)
    head_bias = np.array([0.05, -0.1, 0.2, -3.0], np.float32)
    return {
        "torso": {"dense_0": {"kernel": jnp.asarray(kernel_0), "bias": jnp.asarray(bias_0)}},
        "head": {"kernel": jnp.asarray(head[:, :outputs]), "bias": jnp.asarray(head_bias[:outputs])},
    }


OBSERVATIONS = np.array([[1.0, 0.5], [-0.5, 2.0], [0.3, -1.2]], np.float32)


def _hidden():
    """relu(OBSERVATIONS @ kernel_0 + bias_0), written out."""
    kernel_0 = np.array([[0.5, -1.0, 0.25], [1.5, 0.5, -0.75]])
    return np.maximum(OBSERVATIONS @ kernel_0 + np.array([0.1, -0.2, 0.3]), 0.0)


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_mse_loss_by_hand(temperature):
    config = bc.config_for({"hidden_sizes": "3", "loss": "mse"})
    bounds = ((-2.0,), (2.0,))
    params = _tiny_params(outputs=1)
    actions = np.array([[1.0], [-2.0], [0.5]], np.float32)
    head = _hidden() @ np.array([[0.8], [-0.4], [1.2]]) + 0.05
    expected = np.mean((np.tanh(head / temperature) - actions / 2.0) ** 2)
    batch = Transition(OBSERVATIONS, actions, np.zeros(3), np.ones(3), OBSERVATIONS)
    loss = learning.scoring_loss(config, bounds)(params, batch, temperature)
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    if temperature == 1.0:  # the update's reported loss is the same loss before its step.
        state = learning.init(jax.random.PRNGKey(0), config, 2, bounds).replace(actor_params=params)
        batches = jax.tree.map(lambda leaf: jnp.asarray(leaf)[None], batch)
        _, metrics = learning.make_update(config, bounds)(state, batches)
        np.testing.assert_allclose(metrics["loss"], expected, rtol=1e-5)
        np.testing.assert_allclose(bc.acting.make_policy(config, bounds)(params, OBSERVATIONS), 2.0 * np.tanh(head),
                                   rtol=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_gaussian_nll_by_hand(temperature):
    config = bc.config_for({"hidden_sizes": "3", "loss": "gaussian"})
    low, high = np.array([-1.0, -2.0]), np.array([1.0, 2.0])
    bounds = (tuple(low), tuple(high))
    params = _tiny_params(outputs=4)
    actions = np.array([[0.5, -1.0], [-0.9, 1.5], [0.0, 0.4]], np.float32)
    head = _hidden() @ np.array([[0.8, -0.6, 2.0, -3.0], [-0.4, 0.3, 1.5, 4.0], [1.2, 0.9, -2.5, 1.0]])
    head = (head + np.array([0.05, -0.1, 0.2, -3.0])) / temperature
    if temperature == 1.0:  # both log-std clips are exercised
        assert head[:, 2:].max() > 2.0 and head[:, 2:].min() < -5.0
    mean, log_std = np.tanh(head[:, :2]), np.clip(head[:, 2:], -5.0, 2.0)
    unit_actions = (actions - low) / (high - low) * 2.0 - 1.0
    nll = 0.5 * ((unit_actions - mean) / np.exp(log_std)) ** 2 + log_std + 0.5 * np.log(2.0 * np.pi)
    expected = np.mean(np.sum(nll, axis=1))
    batch = Transition(OBSERVATIONS, actions, np.zeros(3), np.ones(3), OBSERVATIONS)
    np.testing.assert_allclose(learning.scoring_loss(config, bounds)(params, batch, temperature), expected, rtol=1e-5)
    if temperature == 1.0:  # the deterministic policy is the scaled mean.
        policy = bc.acting.make_policy(config, bounds)
        np.testing.assert_allclose(policy(params, OBSERVATIONS), low + (mean + 1.0) * (high - low) / 2.0, rtol=1e-5)


def test_scoring_loss_temperature_changes_the_loss():
    config = bc.config_for({"hidden_sizes": "3"})
    bounds = ((-2.0,), (2.0,))
    batch = Transition(OBSERVATIONS, np.array([[1.0], [-2.0], [0.5]], np.float32), np.zeros(3), np.ones(3),
                       OBSERVATIONS)
    loss_fn = learning.scoring_loss(config, bounds)
    params = _tiny_params(outputs=1)
    assert abs(float(loss_fn(params, batch, 2.0)) - float(loss_fn(params, batch, 1.0))) > 1e-3


# MSE on the deterministic controller's data. A Gaussian with state-dependent std fitted to that
# data scores about -1440 (worse than random): its NLL is minimized by a tiny std on the balancing
# states and a large one on the rare, discontinuous pumping states, whose mean it then barely
# fits. On data from a stochastic policy (what D4RL holds) the Gaussian's mean is the policy.
@pytest.mark.parametrize("loss, data", [("mse", "swing_up_data"), ("gaussian", "noisy_swing_up_data")])
def test_bc_recovers_the_data_policys_return(loss, data, request):
    dataset, data_return = request.getfixturevalue(data)
    random_policy = np.random.default_rng(0)
    random_return = evaluate(lambda obs: random_policy.uniform(-2.0, 2.0, (len(obs), 1)), ENV_ID, 10, seed=0).mean
    assert data_return > random_return + 500.0  # the controller swings up; random actions do not.
    config = bc.config_for({"loss": loss})
    _, results = bc.train(dataset, ENV_ID, config, steps=3000, seed=0, eval_every=0,
                          reference=(random_return, data_return), progress=False)
    assert results["updates"] == 3000
    assert results["normalized_score"]["mean"] >= MIN_NORMALIZED_SCORE, (results["final_eval"], data_return)


def test_masked_bc_keeps_pruned_weights_and_moments_zero_and_checkpoints_the_mask(swing_up_data, tmp_path):
    dataset, _ = swing_up_data
    config = bc.config_for({"hidden_sizes": "64-64"})
    observation_spec, action_spec = _specs()
    bounds = ((-2.0,), (2.0,))
    dense_params = learning.init(jax.random.PRNGKey(1), config, 3, bounds).actor_params
    mask = random_masks(jax.random.PRNGKey(2), dense_params, 0.9, prunable_leaves(dense_params))
    workdir = str(tmp_path / "masked")
    state, results = bc.train(dataset, ENV_ID, config, steps=500, seed=0, workdir=workdir, mask={"actor": mask}, eval_every=0,
                              eval_episodes=1, progress=False)
    assert results["updates"] == 500
    kept = {path: np.asarray(leaf) for path, leaf in jax.tree_util.tree_leaves_with_path(mask)}
    assert 0.09 < sum(leaf.sum() for leaf in kept.values()) / sum(leaf.size for leaf in kept.values()) < 0.11
    mu, nu = (optax.tree_utils.tree_get(state.opt_state, name) for name in ("mu", "nu"))
    for tree in (state.actor_params, mu, nu):
        for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
            if path in kept:
                assert np.all(np.asarray(leaf)[~kept[path]] == 0.0), path
    for path, leaf in jax.tree_util.tree_leaves_with_path(nu):
        assert np.asarray(leaf)[kept[path]].any() if path in kept else np.asarray(leaf).any(), path  # it trained

    checkpointer = Checkpointer(os.path.join(workdir, "checkpoints"))
    other_mask = random_masks(jax.random.PRNGKey(3), dense_params, 0.9, prunable_leaves(dense_params))
    template = bc.build(config, observation_spec, action_spec, {"actor": other_mask}).init(jax.random.PRNGKey(5))
    restored = checkpointer.restore(template)
    checkpointer.close()
    restored_mask = dict(jax.tree_util.tree_leaves_with_path(restored.mask))
    assert set(restored_mask) == set(kept)
    for path, leaf in restored_mask.items():
        np.testing.assert_array_equal(leaf, kept[path])
    for path, leaf in jax.tree_util.tree_leaves_with_path(restored.actor_params):
        np.testing.assert_array_equal(leaf, dict(jax.tree_util.tree_leaves_with_path(state.actor_params))[path])


def test_mask_that_does_not_match_the_actor_is_an_input_error():
    config = bc.config_for({"hidden_sizes": "8-8"})
    other = learning.init(jax.random.PRNGKey(0), bc.config_for({"hidden_sizes": "4-4"}), 3, ((-2.0,), (2.0,)))
    mask = jax.tree.map(lambda leaf: jnp.ones(leaf.shape, bool), other.actor_params)
    agent = bc.build(config, *_specs(), mask={"actor": mask})
    with pytest.raises(QrlInputError, match="^mask does not match params"):
        agent.init(jax.random.PRNGKey(0))


def test_config_and_registry():
    assert bc.Config() == bc.config_for() and bc.Config().learning_rate == 3e-4 and bc.Config().batch_size == 256
    with pytest.raises(QrlInputError, match="BC config loss must be one of mse, gaussian"):
        bc.config_for({"loss": "l1"})
    assert agents.get_offline_agent("bc") is bc and "bc" not in agents.AGENT_NAMES
    with pytest.raises(QrlInputError, match="unknown offline agent 'cql'"):
        agents.get_offline_agent("cql")


def test_masks_for_networks_bc_does_not_have_are_an_input_error():
    with pytest.raises(QrlInputError, match="^bc has no network critic to mask; its networks: actor$"):
        bc.build(bc.config_for({}), *_specs(), mask={"critic": None})
