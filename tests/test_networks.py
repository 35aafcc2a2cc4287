"""Torso selection and shapes, at fp32 and through quantization."""

import os

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


ORTHOGONAL_STRESS = """
import jax, jax.numpy as jnp
from qrl.networks import orthogonal
init = orthogonal(1.0)
def layers(key):
    return [init(k, (64, 64)) for k in jax.random.split(key, 8)]
run = jax.jit(jax.vmap(layers))
for seed in range(400):
    jax.block_until_ready(run(jax.random.split(jax.random.PRNGKey(seed), 2)))
print("ok")
"""


def test_orthogonal_matches_flax_per_key_and_under_vmap():
    from flax.linen.initializers import orthogonal as flax_orthogonal

    from qrl.networks import orthogonal

    keys = jax.random.split(jax.random.PRNGKey(3), 3)
    for shape in ((6, 4), (4, 6), (3, 2, 5)):
        batched = jax.jit(jax.vmap(lambda key: orthogonal(2.0)(key, shape)))(keys)
        for index, key in enumerate(keys):
            expected = flax_orthogonal(2.0)(key, shape)
            np.testing.assert_array_equal(orthogonal(2.0)(key, shape), expected)
            np.testing.assert_allclose(batched[index], expected, rtol=1e-6, atol=1e-6)
    square = np.asarray(orthogonal(1.0)(keys[0], (8, 8)))
    np.testing.assert_allclose(square.T @ square, np.eye(8), atol=1e-5)


def test_orthogonal_vmapped_over_seeds_does_not_deadlock_xla_cpu():
    """jaxlib 0.10.2's batched CPU QR waits on XLA's intra-op pool; with flax's initializer this
    program (8 layers initialized for 2 seeds under vmap, XLA running 2 threads) deadlocked
    within its 400 calls in each of 3 tries on a 2-core machine. qrl's initializer must finish."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", ORTHOGONAL_STRESS], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PJRT_NPROC": "2", "JAX_PLATFORMS": "cpu"},
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]


def test_quarl_mlp_is_a_tanh_mlp_with_a_linear_last_hidden_layer():
    from qrl.networks import quarl_mlp

    observations = jax.random.normal(jax.random.PRNGKey(0), (16, 5))
    network = quarl_mlp((32, 32, 8))
    params = network.init(jax.random.PRNGKey(1), observations)["params"]
    x = observations
    for index in range(3):
        x = x @ params[f"dense_{index}"]["kernel"] + params[f"dense_{index}"]["bias"]
        if index < 2:
            x = jnp.tanh(x)
    np.testing.assert_allclose(network.apply({"params": params}, observations), x, rtol=1e-5, atol=1e-6)
    # Acme's uniform fan-out initializer: |w| <= sqrt(3 * 0.333 / fan_out), biases zero.
    for index, fan_out in enumerate((32, 32, 8)):
        kernel = np.asarray(params[f"dense_{index}"]["kernel"])
        assert np.abs(kernel).max() <= np.sqrt(3 * 0.333 / fan_out) and np.abs(kernel).max() > 0.8 * np.sqrt(3 * 0.333 / fan_out)
        assert not np.any(np.asarray(params[f"dense_{index}"]["bias"]))
    roles = calibrate(network.apply, params, np.asarray(observations))
    # The linear last layer is a hidden layer (a head reads it), not the network's output.
    assert [int(roles[f"dense_{index}"]["role"]) for index in range(3)] == [1, 0, 0]
    assert make_torso("quarl_mlp", FP32, (4, 4)).activation is jnp.tanh
