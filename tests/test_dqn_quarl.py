"""DQN as QuaRL trained it: the named preset `gym:CartPole-v1@quarl`, its 64-unit layer-normalized
dueling network (float32 layer norms at every precision), PTQ of it, learning CartPole with it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agents.dqn import config_for, learning, train
from qrl.errors import QrlInputError
from qrl.quant import calibrate, parse_precision, quantize_params

CARTPOLE = "gym:CartPole-v1"
OBSERVATION_SCALES = np.array([1.0, 1.5, 0.1, 1.5], np.float32)  # CartPole's typical magnitudes.


@pytest.fixture(autouse=True)
def synchronous_dispatch():
    jax.config.update("jax_cpu_enable_async_dispatch", False)


def _quarl_network_and_params(precision_name="fp32"):
    config = config_for(CARTPOLE, {"preset": "quarl"})
    network = learning.make_network(config, (4,), 2, parse_precision(precision_name))
    params = learning.init(jax.random.PRNGKey(0), config, (4,), np.float32, 2).params
    return network, params


def _observations(count, seed=1):
    return np.asarray(jax.random.normal(jax.random.PRNGKey(seed), (count, 4))) * OBSERVATION_SCALES


def test_quarl_preset_is_the_zoo_network_and_hyperparameters_quarl_trained():
    config = config_for(CARTPOLE, {"preset": "quarl"})
    network = (config.hidden_sizes, config.layer_norm, config.dueling, config.separate_value_stream)
    assert network == ((64,), True, True, True)
    assert (config.learning_rate, config.batch_size, config.buffer_size, config.train_freq,
            config.target_update_period, config.exploration_final_eps) == (1e-3, 32, 50_000, 1, 500, 0.02)
    assert config_for(CARTPOLE, {"preset": "quarl", "learning_rate": "5e-4"}).learning_rate == 5e-4
    default = config_for(CARTPOLE)
    assert (default.hidden_sizes, default.layer_norm, default.dueling) == ((256, 256), False, False)


def test_quarl_parameter_tree_and_forward_pass_by_hand():
    network, params = _quarl_network_and_params()
    shapes = jax.tree.map(np.shape, params)
    stream = {"dense_0": {"kernel": (4, 64), "bias": (64,)}, "layer_norm_0": {"scale": (64,), "bias": (64,)}}
    assert shapes == {"torso": stream, "value_torso": stream, "value": {"kernel": (64, 1), "bias": (1,)},
                      "advantage": {"kernel": (64, 2), "bias": (2,)}}
    observations = _observations(5)

    def hidden(stream_params):  # dense -> layer norm -> ReLU
        x = observations @ stream_params["dense_0"]["kernel"] + stream_params["dense_0"]["bias"]
        normalized = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-6)
        return np.maximum(normalized * stream_params["layer_norm_0"]["scale"] + stream_params["layer_norm_0"]["bias"], 0)

    value = hidden(params["value_torso"]) @ params["value"]["kernel"] + params["value"]["bias"]
    advantages = hidden(params["torso"]) @ params["advantage"]["kernel"] + params["advantage"]["bias"]
    expected = value + advantages - advantages.mean(-1, keepdims=True)
    np.testing.assert_allclose(network.apply({"params": params}, observations), expected, rtol=1e-4, atol=1e-5)


def test_layer_places_are_recorded_for_both_streams():
    network, params = _quarl_network_and_params()
    ranges = calibrate(network.apply, params, _observations(64))
    roles = [int(layer["role"]) for layer in (ranges["torso"]["dense_0"], ranges["value_torso"]["dense_0"],
                                               ranges["value"], ranges["advantage"])]
    assert roles == [1, 1, 2, 2]  # both streams read the observation; the heads are outputs.
    assert "layer_norm_0" not in ranges["torso"]  # layer norms are not quantized: no ranges.


@pytest.mark.parametrize("precision_name", ["int8", "fp16"])
def test_layer_norm_stays_float32_when_the_dense_layers_are_quantized(precision_name):
    fp32_network, params = _quarl_network_and_params()
    observations = _observations(64)
    precision = parse_precision(precision_name)
    quantized = quantize_params(params, precision, calibrate(fp32_network.apply, params, observations))
    for stream in ("torso", "value_torso"):
        for name in ("scale", "bias"):
            leaf = quantized[stream]["layer_norm_0"][name]
            assert leaf.dtype == np.float32
            np.testing.assert_array_equal(leaf, params[stream]["layer_norm_0"][name])
    assert quantized["torso"]["dense_0"]["kernel"].dtype == (np.int8 if precision_name == "int8" else np.float16)
    network, _ = _quarl_network_and_params(precision_name)
    _, state = network.apply({"params": quantized}, observations, capture_intermediates=True)
    (normalized,) = state["intermediates"]["torso"]["layer_norm_0"]["__call__"]
    assert normalized.dtype == jnp.float32


@pytest.mark.parametrize("precision_name, tolerance", [("int8", 0.1), ("quarl8", 0.02), ("int4-e8", 0.1)])
def test_post_training_quantization_of_the_quarl_network_tracks_fp32(precision_name, tolerance):
    """Every layer of this network is an edge layer (dense_0 reads the observation, the heads are
    outputs), so int4-e8 runs it all at 8 bits. quarl8 rounds weights only, int8 activations too."""
    fp32_network, params = _quarl_network_and_params()
    observations = _observations(512, seed=2)
    precision = parse_precision(precision_name)
    quantized = quantize_params(params, precision, calibrate(fp32_network.apply, params, observations))
    network, _ = _quarl_network_and_params(precision_name)
    out = network.apply({"params": quantized}, observations)
    reference = fp32_network.apply({"params": params}, observations)
    assert out.dtype == jnp.float32
    error = float(jnp.max(jnp.abs(out - reference)) / jnp.max(jnp.abs(reference)))
    assert error < tolerance, error
    assert float(jnp.mean(jnp.argmax(out, -1) == jnp.argmax(reference, -1))) >= 0.97


def test_unknown_preset_names_are_input_errors():
    with pytest.raises(QrlInputError, match="unknown DQN preset 'qaurl'; known for gym:CartPole-v1: quarl"):
        config_for(CARTPOLE, {"preset": "qaurl"})
    with pytest.raises(QrlInputError, match="DQN has no named presets for gym:Acrobot-v1"):
        config_for("gym:Acrobot-v1", {"preset": "quarl"})
    with pytest.raises(QrlInputError, match="separate_value_stream needs dueling"):
        config_for(CARTPOLE, {"preset": "quarl", "dueling": "false"})


def test_dqn_learns_cartpole_with_the_quarl_preset():
    """QuaRL's network and zoo hyperparameters, 20k of their 100k steps, fixed seed: greedy
    return >= 200 (a random policy gets ≈22)."""
    _, results = train(CARTPOLE, config_for(CARTPOLE, {"preset": "quarl"}), steps=20_000, seed=0, eval_episodes=20,
                       progress=False)
    assert results["final_eval"]["mean"] >= 200.0, results["final_eval"]
