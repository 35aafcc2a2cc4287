"""Quantizers, int8 kernels, PTQ conversion and serialization against hand-computed values."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from qrl.errors import QrlInputError
from qrl.networks import MLP, Conv, Dense, NatureCNN
from qrl.quant import (
    FP32,
    calibrate,
    categorical_kl,
    gaussian_kl,
    greedy_agreement,
    mean_action_distance,
    packed_param_bytes,
    param_bytes,
    params_from_bytes,
    params_to_bytes,
    parse_precision,
    parse_precisions,
    quantize_params,
)
from qrl.quant import ops


def test_symmetric_weights_per_output_channel_hand_computed():
    weights = jnp.array([[1.0, -0.5], [0.25, 2.0]])  # [in=2, out=2]
    values, scale = ops.quantize_weights(weights, parse_precision("int8"))
    np.testing.assert_allclose(scale, [1.0 / 127, 2.0 / 127], rtol=1e-6)
    # 0.25 * 127 = 31.75 -> 32; -0.5 * 63.5 = -31.75 -> -32.
    np.testing.assert_array_equal(values, [[127, -32], [32, 127]])
    assert values.dtype == jnp.int8


def test_symmetric_four_bits_saturates_at_seven():
    weights = jnp.array([[0.7], [-0.36], [0.1]])
    values, scale = ops.quantize_weights(weights, parse_precision("int4"))
    np.testing.assert_allclose(scale, [0.1], rtol=1e-6)
    np.testing.assert_array_equal(values[:, 0], [7, -4, 1])


def test_quarl_rule_per_tensor_for_dense_hand_computed():
    # d = (|min| + |max|) / 2^2 = (1 + 3) / 4 = 1; W/d rounded half to even.
    weights = jnp.array([[-1.0, 0.5], [0.25, 3.0]])
    values, scale = ops.quantize_weights(weights, parse_precision("quarl2"))
    assert scale.shape == ()
    np.testing.assert_allclose(scale, 1.0)
    np.testing.assert_array_equal(values, [[-1, 0], [0, 3]])
    np.testing.assert_allclose(ops.dequantize(values, scale), [[-1.0, 0.0], [0.0, 3.0]])


def test_quarl_rule_per_output_channel_for_conv():
    kernel = np.zeros((1, 1, 2, 2), np.float32)
    kernel[0, 0, :, 0] = [-1.0, 1.0]  # channel 0: d = 2 / 2^3 = 0.25
    kernel[0, 0, :, 1] = [0.0, 4.0]  # channel 1: d = 4 / 8 = 0.5
    values, scale = ops.quantize_weights(jnp.asarray(kernel), parse_precision("quarl3"))
    np.testing.assert_allclose(scale, [0.25, 0.5])
    np.testing.assert_array_equal(values[0, 0], [[-4, 0], [4, 8]])


def test_zero_channel_gets_unit_scale_not_nan():
    values, scale = ops.quantize_weights(jnp.zeros((3, 2)), parse_precision("int8"))
    np.testing.assert_array_equal(scale, [1.0, 1.0])
    np.testing.assert_array_equal(values, np.zeros((3, 2)))


def test_symmetric_activation_grid_hand_computed():
    precision = parse_precision("int4-sym")
    x = jnp.array([0.1, -0.45, 1.0])
    scale, zero_point = ops.grid_range(jnp.min(x), jnp.max(x), precision)  # 1 / 7, 0
    np.testing.assert_allclose(scale, 1.0 / 7, rtol=1e-6)
    assert float(zero_point) == 0.0
    # x / s = [0.7, -3.15, 7] -> [1, -3, 7]; 2.0 saturates at 7.
    np.testing.assert_array_equal(ops.quantize_to_grid(x, scale, zero_point, precision, jnp.float32), [1, -3, 7])
    np.testing.assert_array_equal(ops.quantize_to_grid(jnp.array([2.0, -2.0]), scale, 0.0, precision, jnp.float32),
                                  [7, -7])


def test_legacy_int8_dense_hand_computed():
    """`int8-obst-sym`: one symmetric per-tensor input scale, `y = (q · W) * s_in * s_w + b`."""
    x = jnp.array([[1.2, -2.0]])  # input scale 2/127 -> x_q = [round(76.2), -127] = [76, -127]
    params = {"kernel": jnp.array([[10, -20], [30, 40]], jnp.int8), "kernel_scale": jnp.array([0.01, 0.02]),
              "bias": jnp.array([0.5, -0.5]), "input_scale": jnp.float32(2.0 / 127)}
    out = Dense(2, precision=parse_precision("int8-obst-sym")).apply({"params": params}, x)
    accumulated = np.array([76 * 10 + (-127) * 30, 76 * (-20) + (-127) * 40])
    expected = accumulated * (2.0 / 127) * np.array([0.01, 0.02]) + np.array([0.5, -0.5])
    np.testing.assert_allclose(out[0], expected, rtol=1e-5)


def test_dynamic_int8_conv_matches_float_conv_of_quantized_operands():
    key_x, key_w = jax.random.split(jax.random.PRNGKey(0))
    x = jax.random.uniform(key_x, (2, 9, 9, 3), minval=-1.0, maxval=2.0)
    precision = parse_precision("int8-dyn")
    kernel, kernel_scale = ops.quantize_weights(jax.random.normal(key_w, (3, 3, 3, 4)), precision)
    params = {"kernel": kernel, "kernel_scale": kernel_scale, "bias": jnp.zeros(4)}
    out = Conv(4, (3, 3), (2, 2), precision=precision).apply({"params": params}, x)
    scale, zero_point = ops.grid_range(jnp.min(x), jnp.max(x), precision)  # affine: [-1, 2] onto 256 levels
    x_dequantized = (ops.quantize_to_grid(x, scale, zero_point, precision, jnp.float32) - zero_point) * scale
    expected = jax.lax.conv_general_dilated(
        x_dequantized, ops.dequantize(kernel, kernel_scale), (2, 2), "VALID",
        dimension_numbers=("NHWC", "HWIO", "NHWC"), precision=jax.lax.Precision.HIGHEST,
    )
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


def _jaxpr_equations(jaxpr):
    """Every equation, descending into sub-jaxprs (pjit, scan, ...)."""
    for equation in jaxpr.eqns:
        yield equation
        for param in equation.params.values():
            inner = getattr(param, "jaxpr", None)
            if inner is not None:
                yield from _jaxpr_equations(getattr(inner, "jaxpr", inner))


def _integer_ops(fn, *args, primitive):
    jaxpr = jax.make_jaxpr(fn)(*args).jaxpr
    found = []
    for equation in _jaxpr_equations(jaxpr):
        if equation.primitive.name == primitive:
            found.append(([v.aval.dtype for v in equation.invars], equation.outvars[0].aval.dtype))
    return found


@pytest.mark.parametrize("activations", ["static", "dynamic"])
def test_int8_mlp_runs_int8_dots_with_int32_accumulation(activations):
    observations = jax.random.normal(jax.random.PRNGKey(1), (64, 17))
    network = MLP((256, 256, 6), activate_final=False)
    params = network.init(jax.random.PRNGKey(0), observations)["params"]
    precision = parse_precision("int8", activations)
    quantized = quantize_params(params, precision, calibrate(network.apply, params, np.asarray(observations)))
    int8_network = MLP((256, 256, 6), precision=precision, activate_final=False)
    fn = jax.jit(lambda x: int8_network.apply({"params": quantized}, x))
    dots = _integer_ops(fn, observations, primitive="dot_general")
    assert len(dots) == 3
    for operand_dtypes, output_dtype in dots:
        assert operand_dtypes == [jnp.int8, jnp.int8]
        assert output_dtype == jnp.int32
    relative_error = jnp.max(jnp.abs(fn(observations) - network.apply({"params": params}, observations)))
    relative_error /= jnp.max(jnp.abs(network.apply({"params": params}, observations)))
    assert 0.0 < float(relative_error) < 0.05


def test_int8_nature_cnn_runs_int8_convolutions_and_dense():
    frames = jax.random.randint(jax.random.PRNGKey(2), (4, 84, 84, 4), 0, 256).astype(jnp.uint8)
    network = NatureCNN()
    params = network.init(jax.random.PRNGKey(0), frames)["params"]
    precision = parse_precision("int8")
    quantized = quantize_params(params, precision, calibrate(network.apply, params, np.asarray(frames)))
    fn = jax.jit(lambda x: NatureCNN(precision=precision).apply({"params": quantized}, x))
    convolutions = _integer_ops(fn, frames, primitive="conv_general_dilated")
    dots = _integer_ops(fn, frames, primitive="dot_general")
    assert len(convolutions) == 3 and len(dots) == 1
    for operand_dtypes, output_dtype in convolutions + dots:
        assert operand_dtypes == [jnp.int8, jnp.int8]
        assert output_dtype == jnp.int32
    reference = network.apply({"params": params}, frames)
    relative_error = jnp.max(jnp.abs(fn(frames) - reference)) / jnp.max(jnp.abs(reference))
    assert float(relative_error) < 0.1


def test_fake_quantized_precisions_run_float_arithmetic():
    x = jnp.ones((2, 5))
    network = MLP((4,), activate_final=False)
    params = network.init(jax.random.PRNGKey(0), x)["params"]
    precision = parse_precision("int4")
    quantized = quantize_params(params, precision, calibrate(network.apply, params, np.asarray(x)))
    fn = lambda x: MLP((4,), precision=precision, activate_final=False).apply({"params": quantized}, x)
    assert _integer_ops(fn, x, primitive="dot_general")[0] == ([jnp.float32, jnp.float32], jnp.float32)


def test_float_precisions_cast_params_and_compute():
    x = jax.random.normal(jax.random.PRNGKey(0), (8, 5))
    network = MLP((16, 3), activate_final=False)
    params = network.init(jax.random.PRNGKey(0), x)["params"]
    reference = network.apply({"params": params}, x)
    for name, dtype in (("bf16", jnp.bfloat16), ("fp16", jnp.float16)):
        precision = parse_precision(name)
        cast = quantize_params(params, precision)
        assert all(leaf.dtype == dtype for leaf in jax.tree.leaves(cast))
        out = MLP((16, 3), precision=precision, activate_final=False).apply({"params": cast}, x)
        assert out.dtype == jnp.float32  # dtype operands, float32 accumulation
        dots = _integer_ops(lambda x: MLP((16, 3), precision=precision, activate_final=False).apply(
            {"params": cast}, x), x, primitive="dot_general")
        assert dots and all(operands == [dtype, dtype] and result == jnp.float32 for operands, result in dots)
        np.testing.assert_allclose(np.asarray(out, np.float32), reference, atol=0.05, rtol=0.05)


def test_calibration_records_max_abs_input_per_layer():
    x = np.array([[1.0, -3.0], [2.0, 0.5]], np.float32)
    network = MLP((3, 2), activate_final=False)
    params = network.init(jax.random.PRNGKey(0), x)["params"]
    ranges = calibrate(network.apply, params, x, batch_size=1)  # reduced over two batches
    np.testing.assert_allclose(ranges["dense_0"]["input_absmax"], 3.0)
    hidden = jax.nn.relu(x @ params["dense_0"]["kernel"] + params["dense_0"]["bias"])
    np.testing.assert_allclose(ranges["dense_1"]["input_absmax"], np.max(np.abs(hidden)), rtol=1e-6)
    quantized = quantize_params(params, parse_precision("int8-obst-sym"), ranges)
    np.testing.assert_allclose(quantized["dense_0"]["input_scale"], 3.0 / 127, rtol=1e-6)
    np.testing.assert_array_equal(ranges["dense_0"]["input_min"], [1.0, -3.0])
    np.testing.assert_array_equal(ranges["dense_0"]["input_max"], [2.0, 0.5])
    assert int(ranges["dense_0"]["role"]) == 1 and int(ranges["dense_1"]["role"]) == 2  # reads obs / output


def test_static_scales_need_calibration():
    params = {"dense": {"kernel": np.ones((2, 2), np.float32), "bias": np.zeros(2, np.float32)}}
    with pytest.raises(QrlInputError, match="calibration"):
        quantize_params(params, parse_precision("int8"))
    with pytest.raises(QrlInputError, match="calibration"):
        quantize_params(params, parse_precision("int8-dyn"))  # per-feature observation scales are calibrated
    assert "input_scale" not in quantize_params(params, parse_precision("int8-obst-dyn"))["dense"]
    assert "input_scale" not in quantize_params(params, parse_precision("quarl_dyn8"))["dense"]


@pytest.mark.parametrize("name", ["int1", "int17", "int0", "quarl1", "quarl33", "fp8", "int", "float32x", ""])
def test_bad_precision_names_are_input_errors(name):
    with pytest.raises(QrlInputError):
        parse_precisions(name)


def test_precision_parsing_and_storage_types():
    assert parse_precision("INT8").integer_kernel
    assert not parse_precision("int4").integer_kernel
    assert parse_precision("int12").storage_dtype == np.int16
    assert parse_precision("quarl6").storage_dtype == np.int8  # |values| <= 2^6 = 64
    assert parse_precision("quarl7").storage_dtype == np.int16  # 2^7 = 128 > 127
    assert parse_precision("quarl4").activations == "none"
    assert [p.name for p in parse_precisions("fp32,int8,fp32, bf16")] == ["fp32", "int8", "bf16"]
    with pytest.raises(QrlInputError, match="activation"):
        parse_precision("int8", activations="sometimes")


def test_serialization_round_trip_and_byte_counts():
    network = Dense(3)
    x = np.ones((1, 4), np.float32)
    params = network.init(jax.random.PRNGKey(0), x)["params"]
    quantized = quantize_params(params, parse_precision("int4"), calibrate(network.apply, params, x))
    restored = params_from_bytes(params_to_bytes(quantized))
    assert jax.tree.structure(restored) == jax.tree.structure(quantized)
    for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(quantized)):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    # kernel 12 int8 + kernel_scale 3 f32 + bias 3 f32 + input_scale and input_zero_point 1 f32
    # each (a bare Dense is a hidden layer: one scale) = 12 + 32 bytes.
    assert param_bytes(quantized) == 12 + 32
    assert packed_param_bytes(quantized, parse_precision("int4")) == 6 + 32
    assert param_bytes(params) == 12 * 4 + 3 * 4


def test_corrupt_serialized_bytes_are_input_errors():
    with pytest.raises(QrlInputError, match="corrupt"):
        params_from_bytes(b"\x00\x01 definitely not msgpack")


def test_divergences_hand_computed():
    reference = jnp.array([[0.0, np.log(3.0)]])  # softmax -> [0.25, 0.75]
    other = jnp.array([[1.0, 1.0]])  # uniform
    expected_kl = 0.25 * np.log(0.5) + 0.75 * np.log(1.5)
    np.testing.assert_allclose(categorical_kl(reference, other), expected_kl, rtol=1e-5)
    np.testing.assert_allclose(categorical_kl(reference, reference), 0.0, atol=1e-7)
    assert float(greedy_agreement(jnp.array([[0, 1], [2, 1]]), jnp.array([[0, 1], [0, 1]]))) == 0.5
    np.testing.assert_allclose(mean_action_distance(jnp.array([[3.0, 4.0], [0, 0]]), jnp.zeros((2, 2))), 2.5)
    # KL(N(0,1) || N(1,1)) = 0.5 per dimension.
    np.testing.assert_allclose(gaussian_kl(jnp.zeros((1, 2)), jnp.zeros((1, 2)), jnp.ones((1, 2)), jnp.zeros((1, 2))), 1.0)


def test_fp32_precision_is_the_default_float_path():
    assert FP32.is_float and FP32.dtype == jnp.float32 and FP32.bits is None
