"""Weight broadcast: blob sizes, round trips per int8 actor scheme against PTQ, corrupt blobs,
what a receiver refuses, Broadcaster."""

import os
import threading
import zlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import serialization

from agents.dqn.config import Config
from agents.dqn.learning import make_network
from qrl.distributed import weights
from qrl.distributed.broadcaster import Broadcaster
from qrl.distributed.weights import (
    ACTOR_INT8_SCHEMES,
    ACTOR_PRECISIONS,
    COMM_PRECISIONS,
    WeightMessage,
    actor_network_precision,
    check_precision,
    decode,
    encode,
    fp32_bytes,
    load,
    scheme_ranges,
    uncalibrated_scheme,
)
from qrl.errors import QrlInputError
from qrl.networks import Conv, Dense
from qrl.networks.continuous import DeterministicActor
from qrl.quant import FP32, Precision, calibrate, params_to_bytes, parse_precision, quantize_params

CALIBRATED_SCHEMES = ("int8", "int8-dyn", "int8-obst-sym")
DYNAMIC_SCHEMES = ("quarl_dyn8", "int8-obst-sym-dyn")

# One dense layer [in=2, out=2] that reads the observation and is the output (role 1 + 2 = 3).
HAND_PARAMS = {"dense": {"kernel": np.array([[1.0, -0.5], [0.25, 2.0]], np.float32),
                         "bias": np.array([0.1, -0.2], np.float32)}}
HAND_RANGES = {"dense": {"role": np.int32(3), "input_absmax": np.float32(2.54),
                         "input_min": np.array([-2.54, -1.0], np.float32),
                         "input_max": np.array([1.0, 2.0], np.float32)}}
HAND_ROLES = {"dense": 3}
HAND_SPEC = weights.WeightSpec(HAND_PARAMS, HAND_ROLES)


def _flat(tree):
    return {"/".join(str(k.key) for k in path): leaf for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def assert_trees_identical(actual, expected):
    """Same keys, dtypes, shapes and bits."""
    actual, expected = _flat(actual), _flat(expected)
    assert sorted(actual) == sorted(expected)
    for key, value in expected.items():
        got, want = np.asarray(actual[key]), np.asarray(value)
        assert got.dtype == want.dtype, key
        assert got.shape == want.shape, key
        np.testing.assert_array_equal(got.reshape(-1).view(np.uint8), want.reshape(-1).view(np.uint8), err_msg=key)


def _roles(network, observations):
    return weights.layer_roles(network, jax.ShapeDtypeStruct((1, *observations.shape[1:]), np.float32))


@pytest.fixture(scope="module")
def dqn():
    """A tiny DQN Q-network (obs 4 -> 16 -> 16 -> 3), its fp32 params, observations, ranges, spec."""
    observations = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    network = make_network(Config(hidden_sizes=(16, 16)), (4,), 3)
    params = network.init(jax.random.PRNGKey(0), observations[:1])["params"]
    spec = weights.WeightSpec(jax.eval_shape(lambda: params), _roles(network, observations))
    return network, params, observations, calibrate(network.apply, params, observations), spec


@pytest.fixture(scope="module")
def actor():
    """A tiny D4PG actor (obs 3 -> 16 -> 16 -> 2)."""
    observations = np.random.default_rng(1).normal(size=(64, 3)).astype(np.float32)
    network = DeterministicActor(action_low=(-1.0, -2.0), action_high=(1.0, 2.0), hidden_sizes=(16, 16))
    params = network.init(jax.random.PRNGKey(1), observations[:1])["params"]
    spec = weights.WeightSpec(jax.eval_shape(lambda: params), _roles(network, observations))
    return network, params, observations, calibrate(network.apply, params, observations), spec


def test_layer_roles_name_the_observation_and_output_layers(dqn):
    network, _, observations, ranges, _ = dqn
    assert _roles(network, observations) == {"torso/dense_0": 1, "torso/dense_1": 0, "head": 2}
    assert {layer: int(ranges[layer.split("/")[0]][layer.split("/")[1]]["role"]) if "/" in layer
            else int(ranges[layer]["role"]) for layer in ("torso/dense_0", "torso/dense_1", "head")} == \
        _roles(network, observations)


def test_hand_computed_int8_obst_sym_blob():
    message = HAND_SPEC.check(decode(encode(HAND_PARAMS, "int8", HAND_RANGES, int8_scheme="int8-obst-sym")))
    assert message.precision == "int8" and message.int8_scheme == "int8-obst-sym" and message.input_ranges is None
    layer = message.params["dense"]
    # Per output channel scales [1/127, 2/127]: values [[127, -32], [32, 127]] (0.25 * 127 = 31.75 -> 32).
    np.testing.assert_array_equal(layer["kernel"], np.array([[127, -32], [32, 127]], np.int8))
    np.testing.assert_allclose(layer["kernel_scale"], [1 / 127, 2 / 127], rtol=1e-6)
    np.testing.assert_allclose(layer["input_scale"], 2.54 / 127, rtol=1e-6)  # max(2.54, 2.0) / 127, one scale
    assert sorted(layer) == ["bias", "input_scale", "kernel", "kernel_scale"]  # symmetric: no zero point
    np.testing.assert_array_equal(layer["bias"], HAND_PARAMS["dense"]["bias"])
    shipped = decode(encode(HAND_PARAMS, "fp32", HAND_RANGES, int8_scheme="int8-obst-sym")).input_ranges
    assert_trees_identical(shipped, {"dense": {"role": np.int32(3), "input_min": np.float32(-2.54),
                                               "input_max": np.float32(2.0)}})


def test_hand_computed_int8_per_feature_affine_blob():
    layer = decode(encode(HAND_PARAMS, "int8", HAND_RANGES, int8_scheme="int8")).params["dense"]
    # Feature scales (max - min) / 255: [3.54 / 255, 3 / 255]; zero points round(-128 - min / scale): [55, -43].
    input_scale = np.array([3.54 / 255, 3.0 / 255])
    np.testing.assert_allclose(layer["input_scale"], input_scale, rtol=1e-6)
    np.testing.assert_array_equal(layer["input_zero_point"], [55.0, -43.0])
    # Scales folded into the kernel rows, then per output channel: [[127, -37], [27, 127]]
    # (0.25 * 3/255 / (3.54/255) * 127 = 26.9; -0.5 * 3.54/255 / (2 * 3/255) * 127 = -37.5 + 0.03).
    np.testing.assert_array_equal(layer["kernel"], np.array([[127, -37], [27, 127]], np.int8))
    kernel_scale = np.array([3.54 / 255, 2 * 3.0 / 255]) / 127
    np.testing.assert_allclose(layer["kernel_scale"], kernel_scale, rtol=1e-6)
    # The zero points' constant (sum_i z_i * q_i: [55*127 - 43*27, -55*37 - 43*127] = [5824, -7496]) leaves the bias.
    np.testing.assert_allclose(layer["bias"], np.array([0.1, -0.2]) - kernel_scale * np.array([5824, -7496]), rtol=1e-5)
    shipped = decode(encode(HAND_PARAMS, "fp32", HAND_RANGES, int8_scheme="int8")).input_ranges
    assert_trees_identical(shipped, {"dense": {"role": np.int32(3), "input_min": HAND_RANGES["dense"]["input_min"],
                                               "input_max": HAND_RANGES["dense"]["input_max"]}})


def test_hand_computed_half_precision_blobs():
    bf16 = decode(encode(HAND_PARAMS, "bf16")).params["dense"]["bias"]
    assert bf16.dtype == jnp.bfloat16  # msgpack carries bf16 as bf16, not as a float32 copy.
    np.testing.assert_array_equal(bf16.astype(np.float32), [0.10009765625, -0.2001953125])
    fp16 = decode(encode(HAND_PARAMS, "fp16")).params["dense"]["bias"]
    assert fp16.dtype == np.float16
    np.testing.assert_array_equal(fp16.astype(np.float32), [0.0999755859375, -0.199951171875])


def test_blob_sizes_for_a_256_256_actor():
    rng = np.random.default_rng(3)
    shapes = {"torso": {"dense_0": (17, 256), "dense_1": (256, 256)}, "head": (256, 6)}

    def layer(shape):
        return {"kernel": rng.normal(size=shape).astype(np.float32), "bias": np.zeros(shape[1], np.float32)}

    params = {"torso": {name: layer(shape) for name, shape in shapes["torso"].items()}, "head": layer(shapes["head"])}
    weights_count = 17 * 256 + 256 * 256 + 256 * 6
    outputs_count = 256 + 256 + 6
    fp32 = fp32_bytes(params)
    assert fp32 == len(encode(params, "fp32"))
    assert 0 < fp32 - 4 * (weights_count + outputs_count) < 500  # msgpack framing only.
    # int8: one byte per weight plus f32 kernel_scale and bias per output: 75,568 array bytes,
    # 0.2626 of fp32's 287,768 — per-channel scales keep an uncompressed blob just above 0.26.
    int8 = len(encode(params, "int8"))
    assert 0 < int8 - (weights_count + 8 * outputs_count) < 500
    assert int8 / fp32 <= 0.265
    assert len(encode(params, "int8", compress=True)) / fp32 <= 0.26
    for half in ("fp16", "bf16"):
        assert abs(len(encode(params, half)) / fp32 - 0.5) < 0.002


@pytest.mark.parametrize("scheme", ACTOR_INT8_SCHEMES)
@pytest.mark.parametrize("comm", COMM_PRECISIONS)
def test_round_trip_equals_ptq_tree(actor, comm, scheme):
    _, params, _, ranges, spec = actor
    message = spec.check(decode(encode(params, comm, ranges, int8_scheme=scheme)))
    assert message.precision == comm and message.int8_scheme == scheme
    expected = quantize_params(params, parse_precision(scheme if comm == "int8" else comm), ranges)
    assert_trees_identical(message.params, expected)
    if comm == "int8" or scheme in DYNAMIC_SCHEMES:
        assert message.input_ranges is None  # folded into the int8 params, or not needed
    else:
        assert_trees_identical(message.input_ranges, scheme_ranges(ranges, scheme))
    uncalibrated = decode(encode(params, comm, int8_scheme=scheme))
    assert uncalibrated.input_ranges is None and uncalibrated.int8_scheme == uncalibrated_scheme(scheme)


@pytest.mark.parametrize("fixture", ["dqn", "actor"])
@pytest.mark.parametrize("comm", ["int8", "fp32"])
@pytest.mark.parametrize("scheme", ACTOR_INT8_SCHEMES)
def test_each_scheme_loads_exactly_the_ptq_network(request, fixture, comm, scheme):
    """encode -> decode -> check -> load, the path actors take, gives exactly
    `quantize_params(params, parse_precision(scheme), ranges)` and that network's outputs."""
    network, params, observations, ranges, spec = request.getfixturevalue(fixture)
    message = spec.check(decode(encode(params, comm, ranges, int8_scheme=scheme), spec.max_message_bytes))
    precision = actor_network_precision("int8", message.int8_scheme)
    assert precision == parse_precision(scheme)
    loaded = load(message, "int8")
    ptq = quantize_params(params, precision, ranges)
    assert_trees_identical(loaded, ptq)
    int8_network = network.clone(precision=precision)
    initialized = int8_network.init(jax.random.PRNGKey(0), observations[:1])["params"]
    assert jax.tree.map(lambda x: (x.shape, x.dtype), serialization.to_state_dict(initialized)) == jax.tree.map(
        lambda x: (x.shape, np.asarray(x).dtype), loaded)
    np.testing.assert_array_equal(int8_network.apply({"params": loaded}, observations),
                                  int8_network.apply({"params": ptq}, observations))


@pytest.mark.parametrize("scheme", CALIBRATED_SCHEMES)
def test_calibrated_schemes_without_ranges_fall_back_to_per_call_scales(dqn, scheme):
    network, params, observations, _, spec = dqn
    message = spec.check(decode(encode(params, "int8", int8_scheme=scheme)))
    assert message.int8_scheme == {"int8": "quarl_dyn8", "int8-dyn": "quarl_dyn8",
                                   "int8-obst-sym": "int8-obst-sym-dyn"}[scheme]
    precision = actor_network_precision("int8", message.int8_scheme)
    assert_trees_identical(load(message, "int8"), quantize_params(params, precision))


@pytest.mark.parametrize("scheme", ACTOR_INT8_SCHEMES)
@pytest.mark.parametrize("actor_precision", ["fp32", "bf16", "fp16"])
def test_int8_comm_float_actor_dequantizes(dqn, scheme, actor_precision):
    """An int8 blob loads at a float actor as the same function in float: per-feature input
    scales unfolded from the kernel, zero-point corrections put back into the bias."""
    network, params, observations, ranges, _ = dqn
    loaded = load(decode(encode(params, "int8", ranges, int8_scheme=scheme)), actor_precision)
    quantized = quantize_params(params, parse_precision(scheme), ranges)
    dtype = parse_precision(actor_precision).dtype
    for name in ("dense_0", "dense_1"):
        got, fp32, q = loaded["torso"][name], params["torso"][name], quantized["torso"][name]
        assert sorted(got) == ["bias", "kernel"]
        assert got["kernel"].dtype == dtype and got["bias"].dtype == dtype
        per_feature = "input_scale" in q and q["input_scale"].ndim == 1
        if actor_precision == "fp32" and per_feature:
            np.testing.assert_allclose(got["kernel"] * q["input_scale"][:, None], q["kernel"] * q["kernel_scale"], rtol=1e-6)
        elif actor_precision == "fp32":
            np.testing.assert_array_equal(got["kernel"], q["kernel"] * q["kernel_scale"])
        if actor_precision == "fp32" and "input_zero_point" not in q:
            np.testing.assert_array_equal(got["bias"], np.asarray(fp32["bias"]))
    outputs = network.clone(precision=parse_precision(actor_precision)).apply({"params": loaded}, observations)
    fp32_outputs = network.apply({"params": params}, observations)
    # Weight rounding only (at most half a step per weight): close to the fp32 network.
    assert np.max(np.abs(np.asarray(outputs, np.float32) - fp32_outputs)) < 0.05 * np.max(np.abs(fp32_outputs)) + 0.02


@pytest.mark.parametrize("comm", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("scheme", ACTOR_INT8_SCHEMES)
def test_float_comm_int8_actor_equals_ptq(actor, comm, scheme):
    network, params, observations, ranges, spec = actor
    on_the_wire = jax.tree.map(lambda x: np.asarray(x).astype(parse_precision(comm).dtype).astype(np.float32), params)
    message = spec.check(decode(encode(params, comm, ranges, int8_scheme=scheme)))
    precision = actor_network_precision("int8", message.int8_scheme)
    loaded = load(message, "int8")
    assert_trees_identical(loaded, quantize_params(on_the_wire, precision, ranges))
    assert network.clone(precision=precision).apply({"params": loaded}, observations).shape == (64, 2)


def test_float_comm_float_actor_casts(actor):
    _, params, _, _, _ = actor
    bf16 = quantize_params(params, parse_precision("bf16"))
    fp32_message = decode(encode(params, "fp32"))
    assert_trees_identical(load(fp32_message, "bf16"), bf16)
    assert_trees_identical(load(fp32_message, "fp32"), jax.tree.map(np.asarray, params))
    upcast = jax.tree.map(lambda x: x.astype(np.float32), bf16)
    assert_trees_identical(load(decode(encode(params, "bf16")), "fp32"), upcast)


@pytest.mark.parametrize("comm", COMM_PRECISIONS)
def test_compressed_blob_decodes_identically(actor, comm):
    _, params, _, ranges, _ = actor
    raw, packed = encode(params, comm, ranges), encode(params, comm, ranges, compress=True)
    assert raw[0] == 0 and packed[0] == 1
    assert zlib.decompress(packed[1:]) == raw[1:]
    a, b = decode(raw), decode(packed)
    assert a.precision == b.precision and a.int8_scheme == b.int8_scheme
    assert_trees_identical(a.params, b.params)
    assert_trees_identical(a.input_ranges or {}, b.input_ranges or {})


def _message(precision="fp32", params=None, ranges=None, scheme="int8-obst-sym", format_=weights.FORMAT):
    return {"format": format_, "precision": precision, "int8_scheme": scheme, "params": params or {},
            "input_ranges": ranges or {}}


def _message_blob(precision, params, ranges=None, scheme="int8-obst-sym"):
    return b"\x00" + serialization.msgpack_serialize(_message(precision, params, ranges, scheme))


def _not_a_message():
    return b"\x00" + params_to_bytes({"a": np.zeros(2, np.float32)})


def _old_format():
    message = _message()
    del message["int8_scheme"]
    return b"\x00" + serialization.msgpack_serialize({**message, "format": 1})


@pytest.mark.parametrize("make_blob", [
    lambda blob: b"",
    lambda blob: b"\x00",
    lambda blob: b"\x02" + blob[1:],  # unknown header
    lambda blob: blob[:-7],  # truncated raw
    lambda blob: b"\x01" + zlib.compress(blob[1:], 1)[:-5],  # truncated compressed
    lambda blob: b"\x01" + blob[1:],  # raw payload flagged as compressed
    lambda blob: b"\x00" + bytes(range(256)) * 4,  # garbage
    lambda blob: blob + b"\x00\x01",  # trailing bytes
    lambda blob: "not bytes",
    lambda blob: _not_a_message(),
    lambda blob: _old_format(),
    lambda blob: b"\x00" + serialization.msgpack_serialize(_message(format_=3)),
    lambda blob: b"\x00" + serialization.msgpack_serialize(_message(precision="int4")),
    lambda blob: b"\x00" + serialization.msgpack_serialize(_message(scheme="int4-dyn")),
])
def test_corrupt_blobs_raise_one_line(make_blob):
    blob = encode(HAND_PARAMS, "int8", HAND_RANGES)
    with pytest.raises(QrlInputError) as error:
        decode(make_blob(blob))
    assert "\n" not in str(error.value) and "corrupt" in str(error.value)


def test_unknown_precision_and_scheme_names_raise_naming_choices():
    with pytest.raises(QrlInputError, match="fp32, fp16, bf16, int8"):
        encode(HAND_PARAMS, "int4")
    message = decode(encode(HAND_PARAMS, "fp32"))
    with pytest.raises(QrlInputError, match="fp32, bf16, fp16, int8"):
        load(message, "fp64")
    with pytest.raises(QrlInputError, match="actor precision"):
        actor_network_precision("int16", "int8")
    with pytest.raises(QrlInputError) as error:
        encode(HAND_PARAMS, "int8", int8_scheme="int4")
    assert str(error.value) == ("unknown actor int8 scheme 'int4'; choose one of "
                                "int8, int8-dyn, quarl_dyn8, int8-obst-sym, int8-obst-sym-dyn")
    with pytest.raises(QrlInputError, match="actor int8 scheme"):
        actor_network_precision("int8", "int8-e16")
    with pytest.raises(QrlInputError) as error:
        check_precision("x", ("a", "b"), "thing")
    assert str(error.value) == "unknown thing 'x'; choose one of a, b"
    assert check_precision(" INT8 ", COMM_PRECISIONS, "comm precision") == "int8"
    assert actor_network_precision("bf16", "quarl_dyn8") == parse_precision("bf16")
    assert set(ACTOR_PRECISIONS) == set(COMM_PRECISIONS)
    assert weights.DEFAULT_ACTOR_INT8_SCHEME in ACTOR_INT8_SCHEMES


def test_int8_with_ranges_missing_a_layer_names_it():
    with pytest.raises(QrlInputError, match="layer dense"):
        encode(HAND_PARAMS, "int8", {"other": HAND_RANGES["dense"]}, int8_scheme="int8")
    with pytest.raises(QrlInputError, match="layer dense"):
        load(WeightMessage("fp32", "int8", HAND_PARAMS, {"other": {}}), "int8")


def test_broadcaster_versions_and_stats():
    broadcaster = Broadcaster()
    assert broadcaster.pull() is None
    broadcaster.publish(0, b"abc")
    assert broadcaster.pull() == (0, b"abc")
    assert broadcaster.pull(0) is None
    broadcaster.publish(5, b"defgh")
    assert broadcaster.pull(0) == (5, b"defgh")
    assert broadcaster.pull(5) is None and broadcaster.pull(9) is None
    with pytest.raises(ValueError, match="not newer"):
        broadcaster.publish(5, b"x")
    stats = broadcaster.stats()
    assert stats.pop("process_cpu_seconds") > 0.0
    assert stats == {"publishes": 2, "pulls": 6, "bytes_last": 5, "bytes_total": 8, "version": 5}
    assert broadcaster.pid() == os.getpid()
    assert broadcaster.run() is None and broadcaster.stop() is None


def test_broadcaster_from_two_threads():
    broadcaster, last_version, seen, errors = Broadcaster(), 299, [], []

    def publisher():
        for version in range(last_version + 1):
            broadcaster.publish(version, str(version).encode())

    def puller():
        known = -1
        while known < last_version:
            update = broadcaster.pull(known)
            if update is not None:
                version, blob = update
                if version <= known or blob != str(version).encode():
                    errors.append(update)
                known = version
                seen.append(version)

    threads = [threading.Thread(target=puller), threading.Thread(target=publisher)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    assert not any(thread.is_alive() for thread in threads)
    assert not errors and seen[-1] == last_version and seen == sorted(set(seen))
    stats = broadcaster.stats()
    assert stats["publishes"] == last_version + 1
    assert stats["bytes_total"] == sum(len(str(v)) for v in range(last_version + 1))




class _TinyConvNet(nn.Module):
    """Frames `[B, 6, 6, 2]` -> `[B, 3]`: one qrl Conv (per-output-channel scales [4]) and a Dense."""

    precision: Precision = FP32

    @nn.compact
    def __call__(self, frames):
        x = nn.relu(Conv(4, (3, 3), precision=self.precision, name="conv")(frames))
        return Dense(3, precision=self.precision, name="head")(x.reshape(x.shape[0], -1))


@pytest.mark.parametrize("scheme", ACTOR_INT8_SCHEMES)
def test_int8_params_match_quantize_params_on_a_conv_network(scheme):
    frames = np.random.default_rng(2).uniform(size=(8, 6, 6, 2)).astype(np.float32)
    network = _TinyConvNet()
    params = network.init(jax.random.PRNGKey(0), frames)["params"]
    ranges = calibrate(network.apply, params, frames)
    expected = quantize_params(params, parse_precision(scheme), ranges)
    assert expected["conv"]["kernel_scale"].shape == (4,)
    assert_trees_identical(weights.int8_params(params, scheme, ranges), expected)
    spec = weights.WeightSpec(jax.eval_shape(lambda: params), _roles(network, frames))
    for comm in ("fp32", "int8"):
        message = spec.check(decode(encode(params, comm, ranges, int8_scheme=scheme)))
        assert_trees_identical(load(message, "int8"), expected)


# ----- what a receiver refuses ----------------------------------------------------------------


@pytest.mark.parametrize("scheme", ACTOR_INT8_SCHEMES)
def test_every_precision_passes_its_receivers_check(actor, scheme):
    _, params, _, ranges, spec = actor
    for comm in COMM_PRECISIONS:
        for given_ranges in (None, ranges):
            blob = encode(params, comm, given_ranges, compress=True, int8_scheme=scheme)
            assert len(blob) < spec.max_message_bytes
            message = spec.check(decode(blob, spec.max_message_bytes))
            for actor_precision in ACTOR_PRECISIONS:
                load(message, actor_precision)


def test_expected_leaves_per_scheme(dqn):
    """Each scheme's exact int8 leaves: input scales (and zero points on affine grids) only
    where the scheme's input scale is static; per feature `[4]` on the observation layer."""
    spec = dqn[4]
    extra = {scheme: {path: value for path, value in spec.expected_leaves("int8", scheme).items()
                      if path.rsplit("/", 1)[1] in ("input_scale", "input_zero_point")}
             for scheme in ACTOR_INT8_SCHEMES}
    f32 = np.dtype(np.float32)
    assert extra["int8"] == {
        "torso/dense_0/input_scale": ((4,), f32), "torso/dense_0/input_zero_point": ((4,), f32),
        "torso/dense_1/input_scale": ((), f32), "torso/dense_1/input_zero_point": ((), f32),
        "head/input_scale": ((), f32), "head/input_zero_point": ((), f32)}
    assert extra["int8-dyn"] == {"torso/dense_0/input_scale": ((4,), f32), "torso/dense_0/input_zero_point": ((4,), f32)}
    assert extra["int8-obst-sym"] == {"torso/dense_0/input_scale": ((), f32), "torso/dense_1/input_scale": ((), f32),
                                      "head/input_scale": ((), f32)}
    assert extra["quarl_dyn8"] == extra["int8-obst-sym-dyn"] == {}
    ranges = {scheme: spec.expected_ranges("fp32", scheme) for scheme in ACTOR_INT8_SCHEMES}
    assert ranges["quarl_dyn8"] == ranges["int8-obst-sym-dyn"] == {} and spec.expected_ranges("int8", "int8") == {}
    assert sorted(ranges["int8-dyn"]) == ["head/role", "torso/dense_0/input_max", "torso/dense_0/input_min",
                                          "torso/dense_0/role", "torso/dense_1/role"]
    assert ranges["int8"]["torso/dense_0/input_min"] == ((4,), f32) and ranges["int8"]["head/input_max"] == ((), f32)


def _float_blob(spec_fixture, scheme, edit):
    """An fp32 blob of the fixture's params for `scheme` whose input ranges `edit` changed."""
    _, params, _, ranges, _ = spec_fixture
    message = decode(encode(params, "fp32", ranges, int8_scheme=scheme))
    shipped = jax.tree.map(np.asarray, message.input_ranges)
    edit(shipped)
    return _message_blob("fp32", message.params, shipped, scheme)


@pytest.mark.parametrize("scheme, edit, fragment", [
    ("int8", lambda r: r["torso"]["dense_1"].pop("input_min"), "missing torso/dense_1/input_min"),
    ("int8-dyn", lambda r: r["torso"]["dense_1"].update(input_min=np.float32(0.0)), "unexpected torso/dense_1/input_min"),
    ("int8", lambda r: r["torso"]["dense_0"].update(input_min=np.zeros(3, np.float32)),
     "torso/dense_0/input_min is float32 [3], expected float32 [4]"),
    ("int8-obst-sym", lambda r: r["head"].update(input_max=np.zeros(16, np.float32)),
     "head/input_max is float32 [16], expected float32 []"),
    ("int8", lambda r: r["head"].update(role=np.int32(3)), "head/role is 3, this network's is 2"),
    ("int8", lambda r: r["head"].update(role=np.float32(2)), "head/role is float32 [], expected int32 []"),
    ("int8", lambda r: r["head"].update(input_min=np.float32(np.inf)), "head/input_min holds NaN or infinite"),
    ("int8", lambda r: r["head"].update(input_min=np.float32(5.0), input_max=np.float32(1.0)),
     "head/input_min exceeds input_max"),
    ("int8", lambda r: r.clear(), "missing head/input_max"),
])
def test_untrustworthy_ranges_are_refused_with_one_line(dqn, scheme, edit, fragment):
    spec = dqn[4]
    with pytest.raises(QrlInputError) as error:
        spec.check(decode(_float_blob(dqn, scheme, edit), spec.max_message_bytes))
    assert fragment in str(error.value) and "\n" not in str(error.value)


def test_negative_ranges_are_accepted(dqn):
    """Observation features below zero are ordinary: `input_min` and even `input_max` may be negative."""
    spec = dqn[4]

    def negative(ranges):
        ranges["torso"]["dense_0"]["input_min"] = np.full(4, -3.0, np.float32)
        ranges["torso"]["dense_0"]["input_max"] = np.full(4, -1.0, np.float32)

    message = spec.check(decode(_float_blob(dqn, "int8", negative), spec.max_message_bytes))
    assert np.all(np.isfinite(load(message, "int8")["torso"]["dense_0"]["input_scale"]))


@pytest.mark.parametrize("claimed", ["int8", "int8-dyn", "quarl_dyn8"])
def test_int8_params_of_another_scheme_are_refused(dqn, claimed):
    """int8-obst-sym params labelled as another scheme: their input scales are not that scheme's."""
    _, params, _, ranges, spec = dqn
    shipped = decode(encode(params, "int8", ranges, int8_scheme="int8-obst-sym")).params
    with pytest.raises(QrlInputError, match="weights refused"):
        spec.check(decode(_message_blob("int8", shipped, None, claimed)))


def test_non_positive_input_scales_are_refused(dqn):
    _, params, _, ranges, spec = dqn
    shipped = jax.tree.map(np.asarray, decode(encode(params, "int8", ranges, int8_scheme="int8")).params)
    shipped["head"]["input_scale"] = np.float32(0.0)
    with pytest.raises(QrlInputError, match="head/input_scale is not positive"):
        spec.check(decode(_message_blob("int8", shipped, None, "int8")))


def test_policy_weight_spec_accepts_the_agents_own_publish():
    from agents.actorq import AgentFactory
    from qrl import envs

    env = envs.make("gym:CartPole-v1")
    agent = AgentFactory("dqn", "gym:CartPole-v1", {"hidden_sizes": "16-16"})(env.observation_spec(), env.action_spec())
    params = agent.policy_params(agent.init(jax.random.PRNGKey(3)))
    observations = np.random.default_rng(0).normal(size=(32, 4)).astype(np.float32)
    ranges = calibrate(agent.policy_network(FP32).apply, params, observations)
    spec = weights.policy_weight_spec(agent, env.observation_spec())
    for scheme in ACTOR_INT8_SCHEMES:
        for comm in ("int8", "fp32"):
            assert spec.check(decode(encode(params, comm, ranges, int8_scheme=scheme)))


def test_zip_bomb_is_refused_without_inflating_it():
    bomb = b"\x01" + zlib.compress(b"\x00" * 2**30, 9)  # ≈1 MiB that inflates to 1 GiB
    assert len(bomb) < 2**21
    with pytest.raises(QrlInputError, match="inflates past the 1048576 bytes"):
        decode(bomb, max_bytes=2**20)
    spec = weights.WeightSpec({"dense": {"kernel": np.zeros((4, 4), np.float32), "bias": np.zeros(4, np.float32)}},
                              {"dense": 3})
    assert spec.max_message_bytes < 2**21
    with pytest.raises(QrlInputError, match="weight blob refused"):
        decode(bomb, spec.max_message_bytes)
    with pytest.raises(QrlInputError, match="weight blob refused"):
        decode(b"\x00" + b"\x00" * (spec.max_message_bytes + 1), spec.max_message_bytes)


@pytest.mark.parametrize("name, blob, fragment", [
    ("nan", _message_blob("fp32", {"dense": {"kernel": np.array([[1.0, np.nan], [0.0, 1.0]], np.float32),
                                             "bias": np.zeros(2, np.float32)}}, None, "quarl_dyn8"), "dense/kernel holds NaN"),
    ("inf", _message_blob("fp16", {"dense": {"kernel": np.ones((2, 2), np.float16),
                                             "bias": np.array([np.inf, 0.0], np.float16)}}, None, "quarl_dyn8"),
     "dense/bias holds NaN or inf"),
    ("wrong-dtype", _message_blob("fp32", {"dense": {"kernel": np.ones((2, 2), np.float64),
                                                     "bias": np.zeros(2, np.float32)}}, None, "quarl_dyn8"),
     "dense/kernel is float64 [2, 2], expected float32 [2, 2]"),
    ("int8-kernel-as-float", _message_blob("int8", {"dense": {"kernel": np.ones((2, 2), np.float32),
                                                              "kernel_scale": np.ones(2, np.float32),
                                                              "bias": np.zeros(2, np.float32)}}, None, "quarl_dyn8"),
     "dense/kernel is float32 [2, 2], expected int8 [2, 2]"),
    ("wrong-shape", _message_blob("fp32", {"dense": {"kernel": np.ones((2, 3), np.float32),
                                                     "bias": np.zeros(2, np.float32)}}, None, "quarl_dyn8"),
     "dense/kernel is float32 [2, 3], expected float32 [2, 2]"),
    ("missing-key", _message_blob("fp32", {"dense": {"kernel": np.ones((2, 2), np.float32)}}, None, "quarl_dyn8"),
     "missing dense/bias"),
    ("extra-key", _message_blob("fp32", {"dense": {"kernel": np.ones((2, 2), np.float32), "bias": np.zeros(2, np.float32)},
                                         "other": {"bias": np.zeros(2, np.float32)}}, None, "quarl_dyn8"),
     "unexpected other/bias"),
    ("not-an-array", _message_blob("fp32", {"dense": {"kernel": "ones", "bias": np.zeros(2, np.float32)}}, None,
                                   "quarl_dyn8"), "dense/kernel is str"),
    ("missing-static-scale", _message_blob("int8", {"dense": {"kernel": np.ones((2, 2), np.int8),
                                                              "kernel_scale": np.ones(2, np.float32),
                                                              "bias": np.zeros(2, np.float32)}}, None, "int8-obst-sym"),
     "missing dense/input_scale"),
    ("nan-range", _message_blob("fp32", HAND_PARAMS, {"dense": {"role": np.int32(3), "input_min": np.float32(np.nan),
                                                                "input_max": np.float32(1.0)}}),
     "input ranges refused: dense/input_min holds NaN"),
    ("ranges-for-a-dynamic-scheme", _message_blob("fp32", HAND_PARAMS, {"dense": {"role": np.int32(3)}}, "quarl_dyn8"),
     "input ranges refused: not the receiver's policy tree (unexpected dense/role)"),
    ("absmax-range", _message_blob("fp32", HAND_PARAMS, {"dense": {"role": np.int32(3), "input_absmax": np.float32(1.0)}}),
     "missing dense/input_max, dense/input_min; unexpected dense/input_absmax"),
])
def test_untrustworthy_weights_are_refused_with_one_line(name, blob, fragment):
    with pytest.raises(QrlInputError) as error:
        HAND_SPEC.check(decode(blob, HAND_SPEC.max_message_bytes))
    assert fragment in str(error.value) and "\n" not in str(error.value)


def test_a_spec_needs_every_layers_role():
    with pytest.raises(ValueError, match="roles name layers"):
        weights.WeightSpec(HAND_PARAMS, {"other": 1})


@pytest.mark.parametrize("blob", [b"\x07" + b"\x00" * 16, b"\xff", b"\x01" + b"not zlib at all"])
def test_garbage_headers_are_refused(blob):
    with pytest.raises(QrlInputError, match="corrupt weight blob"):
        decode(blob, HAND_SPEC.max_message_bytes)
