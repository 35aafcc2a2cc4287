"""Quantization schemes: names, grids, per-feature observation scales, edge layers, QuaRL's
fp16 and dynamic int8 — against hand-computed values."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from qrl.errors import QrlInputError
from qrl.networks import MLP, Dense
from qrl.quant import calibrate, packed_param_bytes, parse_precision, parse_precisions, quantize_params
from qrl.quant import ops
from tests.test_quant import _integer_ops


@pytest.mark.parametrize("name, canonical", [
    ("int8", "int8"), ("INT4-dyn-e8", "int4-e8-dyn"), ("int4-e8", "int4-e8"), ("int6-sym-obst", "int6-obst-sym"),
    ("int8-obsf-dyn", "int8-obsf-dyn"), ("quarl5", "quarl5"), ("quarl_fp16", "quarl_fp16"), ("quarl_dyn8", "quarl_dyn8"),
])
def test_scheme_names_are_canonical(name, canonical):
    assert parse_precision(name).name == canonical


@pytest.mark.parametrize("name, message", [
    ("quarl4-e8", "takes no modifiers"), ("int8-e8", "more bits"), ("int8-e4", "more bits"),
    ("int4-e17", "edge bits"), ("int8-obst-obsf", "cannot both"), ("int8-fast", "unknown modifier"),
    ("int8--dyn", "unknown precision"), ("int8-dyn-dyn", "twice"), ("int4-e6-e8", "more than one"),
    ("quarl_dyn8-e8", "unknown precision"), ("fp16-dyn", "unknown precision"),
])
def test_bad_scheme_names_are_one_line_input_errors(name, message):
    with pytest.raises(QrlInputError, match=message) as error:
        parse_precisions(f"fp32,{name}")
    assert "\n" not in str(error.value)


def test_scheme_attributes():
    default = parse_precision("int8")
    assert (default.grid, default.observation, default.activations, default.integer_kernel) == (
        "affine", "feature", "static", True)
    legacy = parse_precision("int8-obst-sym")
    assert (legacy.grid, legacy.observation) == ("symmetric", "tensor")
    dynamic = parse_precision("quarl_dyn8")
    assert (dynamic.weight_rule, dynamic.grid, dynamic.observation, dynamic.activations) == (
        "symmetric", "affine", "tensor", "dynamic")
    assert parse_precision("int8", "dynamic").name == "int8-dyn"
    assert parse_precision("int4-e8").for_layer(reads_observation=False, is_output=True).bits == 8
    assert parse_precision("int4-e8").for_layer(reads_observation=False, is_output=False).bits == 4
    assert parse_precision("int6-obsf").for_layer(reads_observation=True, is_output=False).activations == "none"
    assert parse_precision("int8-dyn").for_layer(reads_observation=True, is_output=False).activations == "static"
    assert parse_precision("quarl3").for_layer(reads_observation=True, is_output=True) == parse_precision("quarl3")
    assert [p.scheme for p in parse_precisions("fp16,quarl_fp16,quarl4,quarl_dyn8,int4,int4-e8-dyn")] == [
        "float", "float", "quarl", "quarl_dyn", "int", "int-e8-dyn"]


def test_affine_grid_hand_computed():
    eight = parse_precision("int8")
    # [0, 2.55] onto 256 levels: scale 0.01, zero point -128 (0 -> -128, 2.55 -> 127).
    scale, zero_point = ops.grid_range(np.float32(0.0), np.float32(2.55), eight)
    np.testing.assert_allclose(scale, 0.01, rtol=1e-6)
    assert float(zero_point) == -128
    x = jnp.array([0.0, 0.5, 2.55])
    q = ops.quantize_to_grid(x, scale, zero_point, eight, jnp.int8)
    np.testing.assert_array_equal(q, [-128, -78, 127])
    np.testing.assert_allclose((np.asarray(q, np.float32) - zero_point) * scale, [0.0, 0.5, 2.55], rtol=1e-5)
    # [-1, 3] at 4 bits: scale 4/15, zero point round(-8 + 1 / (4/15)) = round(-4.25) = -4.
    scale, zero_point = ops.grid_range(np.float32(-1.0), np.float32(3.0), parse_precision("int4"))
    np.testing.assert_allclose(scale, 4.0 / 15, rtol=1e-6)
    assert float(zero_point) == -4
    # A range that excludes 0 is widened to contain it: [0.5, 1] -> [0, 1].
    scale, zero_point = ops.grid_range(np.float32(0.5), np.float32(1.0), eight)
    np.testing.assert_allclose(scale, 1.0 / 255, rtol=1e-6)
    assert float(zero_point) == -128


def test_unsigned_grid_doubles_the_levels_of_a_non_negative_input():
    """A post-ReLU input on the affine grid uses all 2^N levels; on the symmetric grid half."""
    x = jnp.linspace(0.0, 1.0, 1001)
    for bits in (4, 6):
        affine, symmetric = parse_precision(f"int{bits}"), parse_precision(f"int{bits}-sym")
        levels = {}
        for precision in (affine, symmetric):
            scale, zero_point = ops.grid_range(jnp.min(x), jnp.max(x), precision)
            levels[precision.grid] = len(np.unique(ops.quantize_to_grid(x, scale, zero_point, precision, jnp.float32)))
        assert levels == {"affine": 2**bits, "symmetric": 2 ** (bits - 1)}


def test_per_feature_observation_layer_hand_computed():
    """int8, per-feature scales folded into the kernel, zero points folded into the bias."""
    layer = Dense(1, reads_observation=True)
    params = {"kernel": np.array([[2.0], [10.0]], np.float32), "bias": np.array([0.5], np.float32)}
    observations = np.array([[-1.2, -0.07], [0.6, 0.07]], np.float32)  # position, velocity
    precision = parse_precision("int8")
    quantized = quantize_params(params, precision, calibrate(layer.apply, params, observations))
    scales = np.array([1.8 / 255, 0.14 / 255])
    np.testing.assert_allclose(quantized["input_scale"], scales, rtol=1e-6)
    # zero points: round(-128 + 1.2 / s0) = round(-128 + 170) = 42; round(-128 + 127.5) = round(-0.5) = 0.
    np.testing.assert_array_equal(quantized["input_zero_point"], [42, 0])
    # folded kernel [2 s0, 10 s1] = [0.014118, 0.005490]; its scale 0.014118 / 127; values [127, 49].
    kernel_scale = 2.0 * scales[0] / 127
    np.testing.assert_allclose(quantized["kernel_scale"], [kernel_scale], rtol=1e-6)
    np.testing.assert_array_equal(quantized["kernel"][:, 0], [127, 49])
    # bias 0.5 - kernel_scale * (42 * 127 + 0 * 49)
    np.testing.assert_allclose(quantized["bias"], [0.5 - kernel_scale * 42 * 127], rtol=1e-5)
    # x = [0.3, 0.035]: q = [round(42.5) + 42, round(63.75) + 0] = [84, 64]; 84*127 + 64*49 = 13804.
    out = Dense(1, precision=precision, reads_observation=True).apply({"params": quantized}, np.array([[0.3, 0.035]]))
    np.testing.assert_allclose(out, [[13804 * kernel_scale + 0.5 - kernel_scale * 42 * 127]], rtol=1e-5)
    np.testing.assert_allclose(out, [[2 * 0.3 + 10 * 0.035 + 0.5]], atol=0.01)


def test_per_feature_scales_keep_a_small_feature_resolved():
    """MountainCar's shape: position in [-1.2, 0.6], velocity in [-0.07, 0.07]. At 6 bits one
    per-tensor scale leaves velocity a handful of levels; per-feature scales give it all 64."""
    observations = np.stack([np.linspace(-1.2, 0.6, 512), np.linspace(-0.07, 0.07, 512)], axis=1).astype(np.float32)
    velocity_sweep = np.stack([np.zeros(512), np.linspace(-0.07, 0.07, 512)], axis=1).astype(np.float32)
    layer = Dense(1, reads_observation=True)
    params = {"kernel": np.array([[0.0], [1.0]], np.float32), "bias": np.zeros(1, np.float32)}
    ranges = calibrate(layer.apply, params, observations)
    levels = {}
    for name in ("int6", "int6-obst", "int6-obst-sym"):
        precision = parse_precision(name)
        out = Dense(1, precision=precision, reads_observation=True).apply(
            {"params": quantize_params(params, precision, ranges)}, velocity_sweep)
        levels[name] = len(np.unique(np.round(np.asarray(out), 7)))
    assert levels["int6"] == 64
    assert levels["int6-obst"] <= 6 and levels["int6-obst-sym"] <= 6


def _mlp_and_ranges(observations):
    network = MLP((32, 32, 3), activate_final=False)
    params = network.init(jax.random.PRNGKey(0), observations)["params"]
    return network, params, calibrate(network.apply, params, observations)


def test_edge_layers_take_the_edge_bits():
    observations = np.asarray(jax.random.normal(jax.random.PRNGKey(1), (128, 5)))
    _, params, ranges = _mlp_and_ranges(observations)
    quantized = quantize_params(params, parse_precision("int4-e8"), ranges)
    widths = {name: int(np.max(np.abs(layer["kernel"]))) for name, layer in quantized.items()}
    assert widths == {"dense_0": 127, "dense_1": 7, "dense_2": 127}
    precision = parse_precision("int4-e8")
    fn = jax.jit(lambda x: MLP((32, 32, 3), precision=precision, activate_final=False).apply({"params": quantized}, x))
    dots = _integer_ops(fn, observations, primitive="dot_general")
    int8_dots = [operands for operands, _ in dots if operands == [jnp.int8, jnp.int8]]
    assert len(int8_dots) == 2  # the edge layers run real int8; the 4-bit middle layer is simulated


def test_float_observation_layer_is_weight_only():
    observations = np.asarray(jax.random.normal(jax.random.PRNGKey(2), (64, 5))) * 3
    network, params, ranges = _mlp_and_ranges(observations)
    precision = parse_precision("int6-obsf")
    quantized = quantize_params(params, precision, ranges)
    assert "input_scale" not in quantized["dense_0"] and "input_scale" in quantized["dense_1"]
    first = Dense(32, precision=precision, reads_observation=True).apply({"params": quantized["dense_0"]}, observations)
    expected = observations @ ops.dequantize(quantized["dense_0"]["kernel"], quantized["dense_0"]["kernel_scale"])
    np.testing.assert_allclose(first, expected + quantized["dense_0"]["bias"], rtol=1e-5, atol=1e-5)


def test_quarl_fp16_stores_half_and_computes_float32():
    observations = np.asarray(jax.random.normal(jax.random.PRNGKey(3), (16, 5)))
    network, params, _ = _mlp_and_ranges(observations)
    precision = parse_precision("quarl_fp16")
    cast = quantize_params(params, precision)
    assert all(leaf.dtype == np.float16 for leaf in jax.tree.leaves(cast))
    out = MLP((32, 32, 3), precision=precision, activate_final=False).apply({"params": cast}, observations)
    widened = jax.tree.map(lambda leaf: np.asarray(leaf, np.float32), cast)
    expected = network.apply({"params": widened}, observations)
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)


def test_quarl_dyn8_quantizes_each_call_on_an_affine_grid():
    """One hidden layer by hand: input [0, 1, 2.55] -> scale 0.01, zero point -128,
    q = [-128, -28, 127]; y = (q · W - (-128) Σ W) * 0.01 * s_w + b."""
    precision = parse_precision("quarl_dyn8")
    params = {"kernel": np.array([[10], [-20], [30]], np.int8), "kernel_scale": np.array([0.05], np.float32),
              "bias": np.array([0.25], np.float32)}
    x = np.array([[0.0, 1.0, 2.55]], np.float32)
    out = Dense(1, precision=precision).apply({"params": params}, x)
    accumulated = (-128 * 10 + -28 * -20 + 127 * 30) - (-128) * (10 - 20 + 30)
    np.testing.assert_allclose(out, [[accumulated * 0.01 * 0.05 + 0.25]], rtol=1e-5)
    np.testing.assert_allclose(out, x @ np.array([[0.5], [-1.0], [1.5]]) + 0.25, atol=1e-5)


@pytest.mark.parametrize("name", ["int8", "int8-dyn", "int4-e8", "int8-obsf", "quarl_dyn8", "int8-obst-sym"])
def test_schemes_track_fp32_closely_at_eight_bits_or_with_eight_bit_edges(name):
    observations = np.asarray(jax.random.normal(jax.random.PRNGKey(4), (256, 5))) * np.array([1, 10, 0.1, 1, 1])
    network, params, ranges = _mlp_and_ranges(observations)
    precision = parse_precision(name)
    out = MLP((32, 32, 3), precision=precision, activate_final=False).apply(
        {"params": quantize_params(params, precision, ranges)}, observations)
    reference = network.apply({"params": params}, observations)
    error = float(jnp.max(jnp.abs(out - reference)) / jnp.max(jnp.abs(reference)))
    assert error < (0.25 if name == "int4-e8" else 0.05)


def test_packed_bytes_count_edge_layers_at_the_edge_width():
    observations = np.asarray(jax.random.normal(jax.random.PRNGKey(5), (64, 5)))
    _, params, ranges = _mlp_and_ranges(observations)
    precision = parse_precision("int4-e8")
    quantized = quantize_params(params, precision, ranges)
    float_bytes = sum(leaf.nbytes for leaf in jax.tree.leaves(quantized) if leaf.dtype.kind == "f")
    kernel_bits = 5 * 32 * 8 + 32 * 32 * 4 + 32 * 3 * 8  # edges at 8 bits, the middle layer at 4
    assert packed_param_bytes(quantized, precision) == float_bytes + kernel_bits // 8
