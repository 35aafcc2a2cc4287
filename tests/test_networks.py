"""Torso selection and shapes, at fp32 and through quantization."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from qrl.errors import QrlInputError
from qrl.networks import MLP, MinAtarCNN, make_torso, torso_for_observation
from qrl.quant import FP32, calibrate, parse_precision, quantize_params


def test_torso_for_observation_picks_by_shape():
    assert torso_for_observation((4,)) == "mlp"
    assert torso_for_observation((84, 84, 4)) == "cnn"
    assert torso_for_observation((10, 10, 4)) == "minatar_cnn"


def test_minatar_cnn_shapes_and_int8_serving():
    frames = jax.random.bernoulli(jax.random.PRNGKey(0), 0.2, (8, 10, 10, 4))
    network = MinAtarCNN()
    params = network.init(jax.random.PRNGKey(1), frames)["params"]
    assert params["conv_0"]["kernel"].shape == (3, 3, 4, 16) and params["dense"]["kernel"].shape == (8 * 8 * 16, 128)
    features = network.apply({"params": params}, frames)
    assert features.shape == (8, 128) and features.dtype == jnp.float32
    int8 = parse_precision("int8")
    quantized = quantize_params(params, int8, calibrate(network.apply, params, np.asarray(frames)))
    served = MinAtarCNN(precision=int8).apply({"params": quantized}, frames)
    assert float(jnp.max(jnp.abs(served - features))) < 0.05 * float(jnp.max(jnp.abs(features))) + 1e-6


def test_make_torso_names_the_known_kinds():
    try:
        make_torso("rnn", FP32)
    except ValueError as error:
        assert "mlp, cnn, minatar_cnn" in str(error)
    else:
        raise AssertionError("expected ValueError")


def test_mlp_layer_norm_normalizes_hidden_layers_in_float32_and_keeps_layer_places():
    observations = jax.random.normal(jax.random.PRNGKey(0), (16, 5)) * 3
    network = MLP((8, 3), layer_norm=True, activate_final=False)
    params = network.init(jax.random.PRNGKey(1), observations)["params"]
    assert set(params) == {"dense_0", "layer_norm_0", "dense_1"}  # no layer norm on the output layer
    hidden = observations @ params["dense_0"]["kernel"] + params["dense_0"]["bias"]
    normalized = (hidden - hidden.mean(-1, keepdims=True)) / jnp.sqrt(hidden.var(-1, keepdims=True) + 1e-6)
    expected = jax.nn.relu(normalized) @ params["dense_1"]["kernel"] + params["dense_1"]["bias"]
    np.testing.assert_allclose(network.apply({"params": params}, observations), expected, rtol=1e-4, atol=1e-5)
    roles = calibrate(network.apply, params, np.asarray(observations))
    assert (int(roles["dense_0"]["role"]), int(roles["dense_1"]["role"])) == (1, 2)
    half = parse_precision("bf16")
    _, state = MLP((8, 3), precision=half, layer_norm=True, activate_final=False).apply(
        {"params": quantize_params(params, half)}, observations, capture_intermediates=True)
    assert state["intermediates"]["layer_norm_0"]["__call__"][0].dtype == jnp.float32


def test_layer_norm_is_for_the_mlp_torso_only():
    assert make_torso("mlp", FP32, (4,), layer_norm=True, name="value_torso").name == "value_torso"
    with pytest.raises(QrlInputError, match="layer_norm applies to the MLP torso"):
        make_torso("cnn", FP32, layer_norm=True)
