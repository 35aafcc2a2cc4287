"""Torso selection and shapes, at fp32 and through quantization."""

import jax
import jax.numpy as jnp
import numpy as np

from qrl.networks import MinAtarCNN, make_torso, torso_for_observation
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
