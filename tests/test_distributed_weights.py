"""Weight broadcast: blob sizes, round trips, int8 paths against PTQ, corrupt blobs, Broadcaster."""

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
    ACTOR_PRECISIONS,
    COMM_PRECISIONS,
    WeightMessage,
    actor_network_precision,
    check_precision,
    decode,
    encode,
    fp32_bytes,
    load,
)
from qrl.errors import QrlInputError
from qrl.networks import Conv, Dense
from qrl.networks.continuous import DeterministicActor
from qrl.quant import FP32, Precision, calibrate, params_to_bytes, parse_precision, quantize_params

INT8_STATIC = parse_precision(weights.INT8_STATIC)
INT8_DYNAMIC = parse_precision(weights.INT8_DYNAMIC)

# One dense layer [in=2, out=2]: int8 scales per output channel are [1/127, 2/127] and
# values [[127, -32], [32, 127]] (0.25 * 127 = 31.75 -> 32; -0.5 * 63.5 = -31.75 -> -32).
HAND_PARAMS = {"dense": {"kernel": np.array([[1.0, -0.5], [0.25, 2.0]], np.float32),
                         "bias": np.array([0.1, -0.2], np.float32)}}
HAND_RANGES = {"dense": {"input_absmax": np.float32(2.54)}}  # input_scale = 2.54 / 127 = 0.02


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


@pytest.fixture(scope="module")
def dqn():
    """A tiny DQN Q-network (obs 4 -> 16 -> 16 -> 3), its fp32 params, observations and ranges."""
    observations = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    network = make_network(Config(hidden_sizes=(16, 16)), (4,), 3)
    params = network.init(jax.random.PRNGKey(0), observations[:1])["params"]
    return network, params, observations, calibrate(network.apply, params, observations)


@pytest.fixture(scope="module")
def actor():
    """A tiny D4PG actor (obs 3 -> 16 -> 16 -> 2)."""
    observations = np.random.default_rng(1).normal(size=(64, 3)).astype(np.float32)
    network = DeterministicActor(action_low=(-1.0, -2.0), action_high=(1.0, 2.0), hidden_sizes=(16, 16))
    params = network.init(jax.random.PRNGKey(1), observations[:1])["params"]
    return network, params, observations, calibrate(network.apply, params, observations)


def test_hand_computed_int8_blob():
    message = decode(encode(HAND_PARAMS, "int8", HAND_RANGES))
    assert message.precision == "int8" and message.static_scales
    layer = message.params["dense"]
    np.testing.assert_array_equal(layer["kernel"], np.array([[127, -32], [32, 127]], np.int8))
    assert layer["kernel"].dtype == np.int8
    np.testing.assert_allclose(layer["kernel_scale"], [1 / 127, 2 / 127], rtol=1e-6)
    np.testing.assert_allclose(layer["input_scale"], 0.02, rtol=1e-6)
    np.testing.assert_array_equal(layer["bias"], HAND_PARAMS["dense"]["bias"])
    np.testing.assert_array_equal(message.input_ranges["dense"]["input_absmax"], np.float32(2.54))
    dynamic = decode(encode(HAND_PARAMS, "int8")).params["dense"]
    assert "input_scale" not in dynamic and decode(encode(HAND_PARAMS, "int8")).input_ranges is None


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


@pytest.mark.parametrize("comm", COMM_PRECISIONS)
def test_round_trip_equals_ptq_tree(actor, comm):
    _, params, _, ranges = actor
    message = decode(encode(params, comm, ranges))
    assert message.precision == comm
    expected = quantize_params(params, INT8_STATIC if comm == "int8" else parse_precision(comm), ranges)
    assert_trees_identical(message.params, expected)
    assert_trees_identical(message.input_ranges, weights._absmax_ranges(ranges))  # what int8 actors use.
    assert decode(encode(params, comm)).input_ranges is None


@pytest.mark.parametrize("fixture", ["dqn", "actor"])
@pytest.mark.parametrize("static", [True, False])
def test_int8_comm_int8_actor_equals_ptq_network(request, fixture, static):
    network, params, observations, ranges = request.getfixturevalue(fixture)
    message = decode(encode(params, "int8", ranges if static else None))
    precision = actor_network_precision("int8", message.static_scales)
    assert precision == (INT8_STATIC if static else INT8_DYNAMIC)
    loaded = load(message, "int8")
    ptq = quantize_params(params, precision, ranges if static else None)
    assert_trees_identical(loaded, ptq)
    int8_network = network.clone(precision=precision)
    initialized = int8_network.init(jax.random.PRNGKey(0), observations[:1])["params"]
    assert jax.tree.map(lambda x: (x.shape, x.dtype), serialization.to_state_dict(initialized)) == jax.tree.map(
        lambda x: (x.shape, np.asarray(x).dtype), loaded)
    np.testing.assert_array_equal(int8_network.apply({"params": loaded}, observations),
                                  int8_network.apply({"params": ptq}, observations))


@pytest.mark.parametrize("actor_precision", ["fp32", "bf16", "fp16"])
def test_int8_comm_float_actor_dequantizes(dqn, actor_precision):
    network, params, observations, ranges = dqn
    loaded = load(decode(encode(params, "int8", ranges)), actor_precision)
    quantized = quantize_params(params, INT8_STATIC, ranges)
    dtype = parse_precision(actor_precision).dtype
    for name in ("dense_0", "dense_1"):
        got, fp32 = loaded["torso"][name], params["torso"][name]
        assert sorted(got) == ["bias", "kernel"]
        assert got["kernel"].dtype == dtype and got["bias"].dtype == dtype
        scale = quantized["torso"][name]["kernel_scale"]
        if actor_precision == "fp32":
            np.testing.assert_array_equal(got["kernel"], quantized["torso"][name]["kernel"] * scale)
            assert np.all(np.abs(got["kernel"] - np.asarray(fp32["kernel"])) <= scale / 2 * (1 + 1e-6))
        np.testing.assert_array_equal(got["bias"], np.asarray(fp32["bias"]).astype(dtype))
    float_network = network.clone(precision=parse_precision(actor_precision))
    assert np.all(np.isfinite(float_network.apply({"params": loaded}, observations)))


@pytest.mark.parametrize("comm", ["fp32", "bf16", "fp16"])
def test_float_comm_int8_actor_equals_ptq(actor, comm):
    network, params, observations, ranges = actor
    on_the_wire = jax.tree.map(lambda x: np.asarray(x).astype(parse_precision(comm).dtype).astype(np.float32), params)
    for static in (True, False):
        message = decode(encode(params, comm, ranges if static else None))
        precision = actor_network_precision("int8", message.static_scales)
        loaded = load(message, "int8")
        assert_trees_identical(loaded, quantize_params(on_the_wire, precision, ranges if static else None))
        assert network.clone(precision=precision).apply({"params": loaded}, observations).shape == (64, 2)


def test_float_comm_float_actor_casts(actor):
    _, params, _, _ = actor
    bf16 = quantize_params(params, parse_precision("bf16"))
    fp32_message = decode(encode(params, "fp32"))
    assert_trees_identical(load(fp32_message, "bf16"), bf16)
    assert_trees_identical(load(fp32_message, "fp32"), jax.tree.map(np.asarray, params))
    upcast = jax.tree.map(lambda x: x.astype(np.float32), bf16)
    assert_trees_identical(load(decode(encode(params, "bf16")), "fp32"), upcast)


@pytest.mark.parametrize("comm", COMM_PRECISIONS)
def test_compressed_blob_decodes_identically(actor, comm):
    _, params, _, ranges = actor
    raw, packed = encode(params, comm, ranges), encode(params, comm, ranges, compress=True)
    assert raw[0] == 0 and packed[0] == 1
    assert zlib.decompress(packed[1:]) == raw[1:]
    a, b = decode(raw), decode(packed)
    assert a.precision == b.precision
    assert_trees_identical(a.params, b.params)
    assert_trees_identical(a.input_ranges, b.input_ranges)


def _not_a_message():
    return b"\x00" + params_to_bytes({"a": np.zeros(2, np.float32)})


def _wrong_format():
    message = {"format": 2, "precision": "fp32", "params": {}, "input_ranges": {}}
    return b"\x00" + serialization.msgpack_serialize(message)


def _unknown_precision():
    message = {"format": 1, "precision": "int4", "params": {}, "input_ranges": {}}
    return b"\x00" + serialization.msgpack_serialize(message)


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
    lambda blob: _wrong_format(),
    lambda blob: _unknown_precision(),
])
def test_corrupt_blobs_raise_one_line(make_blob):
    blob = encode(HAND_PARAMS, "int8", HAND_RANGES)
    with pytest.raises(QrlInputError) as error:
        decode(make_blob(blob))
    assert "\n" not in str(error.value) and "corrupt" in str(error.value)


def test_unknown_precision_names_raise_naming_choices():
    with pytest.raises(QrlInputError, match="fp32, fp16, bf16, int8"):
        encode(HAND_PARAMS, "int4")
    message = decode(encode(HAND_PARAMS, "fp32"))
    with pytest.raises(QrlInputError, match="fp32, bf16, fp16, int8"):
        load(message, "fp64")
    with pytest.raises(QrlInputError, match="actor precision"):
        actor_network_precision("int16", True)
    with pytest.raises(QrlInputError) as error:
        check_precision("x", ("a", "b"), "thing")
    assert str(error.value) == "unknown thing 'x'; choose one of a, b"
    assert check_precision(" INT8 ", COMM_PRECISIONS, "comm precision") == "int8"
    assert actor_network_precision("bf16", True) == parse_precision("bf16")
    assert set(ACTOR_PRECISIONS) == set(COMM_PRECISIONS)


def test_int8_with_ranges_missing_a_layer_names_it():
    with pytest.raises(QrlInputError, match="layer dense"):
        encode(HAND_PARAMS, "int8", {"other": {"input_absmax": np.float32(1.0)}})
    with pytest.raises(QrlInputError, match="layer dense"):
        load(WeightMessage("fp32", HAND_PARAMS, {"other": {}}), "int8")


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


def test_int8_params_match_quantize_params_on_a_conv_network():
    frames = np.random.default_rng(2).uniform(size=(8, 6, 6, 2)).astype(np.float32)
    network = _TinyConvNet()
    params = network.init(jax.random.PRNGKey(0), frames)["params"]
    ranges = calibrate(network.apply, params, frames)
    expected = quantize_params(params, INT8_STATIC, ranges)
    assert expected["conv"]["kernel_scale"].shape == (4,)
    assert_trees_identical(weights.int8_params(params, ranges), expected)
    assert_trees_identical(load(decode(encode(params, "fp32", ranges)), "int8"), expected)


# ----- what a receiver refuses ----------------------------------------------------------------


def _message_blob(precision, params, ranges=None):
    return b"\x00" + serialization.msgpack_serialize(
        {"format": 1, "precision": precision, "params": params, "input_ranges": ranges or {}})


def test_every_precision_passes_its_receivers_check(actor):
    _, params, _, ranges = actor
    spec = weights.WeightSpec(jax.eval_shape(lambda: params))
    for comm in COMM_PRECISIONS:
        for given_ranges in (None, ranges):
            blob = encode(params, comm, given_ranges, compress=True)
            assert len(blob) < spec.max_message_bytes
            message = spec.check(decode(blob, spec.max_message_bytes))
            for actor_precision in ACTOR_PRECISIONS:
                load(message, actor_precision)


def test_policy_weight_spec_accepts_the_agents_own_publish():
    from agents.actorq import AgentFactory
    from qrl import envs

    env = envs.make("gym:CartPole-v1")
    agent = AgentFactory("dqn", "gym:CartPole-v1", {"hidden_sizes": "16-16"})(env.observation_spec(), env.action_spec())
    params = agent.policy_params(agent.init(jax.random.PRNGKey(3)))
    spec = weights.policy_weight_spec(agent)
    assert spec.check(decode(encode(params, "int8")))


def test_zip_bomb_is_refused_without_inflating_it():
    bomb = b"\x01" + zlib.compress(b"\x00" * 2**30, 9)  # ≈1 MiB that inflates to 1 GiB
    assert len(bomb) < 2**21
    with pytest.raises(QrlInputError, match="inflates past the 1048576 bytes"):
        decode(bomb, max_bytes=2**20)
    spec = weights.WeightSpec({"dense": {"kernel": np.zeros((4, 4), np.float32), "bias": np.zeros(4, np.float32)}})
    assert spec.max_message_bytes < 2**21
    with pytest.raises(QrlInputError, match="weight blob refused"):
        decode(bomb, spec.max_message_bytes)
    with pytest.raises(QrlInputError, match="weight blob refused"):
        decode(b"\x00" + b"\x00" * (spec.max_message_bytes + 1), spec.max_message_bytes)


HAND_SPEC = weights.WeightSpec(HAND_PARAMS)


@pytest.mark.parametrize("name, blob, fragment", [
    ("nan", _message_blob("fp32", {"dense": {"kernel": np.array([[1.0, np.nan], [0.0, 1.0]], np.float32),
                                             "bias": np.zeros(2, np.float32)}}), "dense/kernel holds NaN"),
    ("inf", _message_blob("fp16", {"dense": {"kernel": np.ones((2, 2), np.float16),
                                             "bias": np.array([np.inf, 0.0], np.float16)}}), "dense/bias holds NaN or inf"),
    ("wrong-dtype", _message_blob("fp32", {"dense": {"kernel": np.ones((2, 2), np.float64),
                                                     "bias": np.zeros(2, np.float32)}}),
     "dense/kernel is float64 [2, 2], expected float32 [2, 2]"),
    ("int8-kernel-as-float", _message_blob("int8", {"dense": {"kernel": np.ones((2, 2), np.float32),
                                                              "kernel_scale": np.ones(2, np.float32),
                                                              "bias": np.zeros(2, np.float32)}}),
     "dense/kernel is float32 [2, 2], expected int8 [2, 2]"),
    ("wrong-shape", _message_blob("fp32", {"dense": {"kernel": np.ones((2, 3), np.float32),
                                                     "bias": np.zeros(2, np.float32)}}),
     "dense/kernel is float32 [2, 3], expected float32 [2, 2]"),
    ("missing-key", _message_blob("fp32", {"dense": {"kernel": np.ones((2, 2), np.float32)}}), "missing dense/bias"),
    ("extra-key", _message_blob("fp32", {"dense": {"kernel": np.ones((2, 2), np.float32), "bias": np.zeros(2, np.float32)},
                                         "other": {"bias": np.zeros(2, np.float32)}}), "unexpected other/bias"),
    ("not-an-array", _message_blob("fp32", {"dense": {"kernel": "ones", "bias": np.zeros(2, np.float32)}}),
     "dense/kernel is str"),
    ("nan-range", _message_blob("fp32", HAND_PARAMS, {"dense": {"input_absmax": np.float32(np.nan)}}),
     "input ranges refused: dense/input_absmax holds NaN"),
    ("negative-range", _message_blob("fp32", HAND_PARAMS, {"dense": {"input_absmax": np.float32(-1.0)}}),
     "dense/input_absmax is negative"),
])
def test_untrustworthy_weights_are_refused_with_one_line(name, blob, fragment):
    with pytest.raises(QrlInputError) as error:
        HAND_SPEC.check(decode(blob, HAND_SPEC.max_message_bytes))
    assert fragment in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("blob", [b"\x07" + b"\x00" * 16, b"\xff", b"\x01" + b"not zlib at all"])
def test_garbage_headers_are_refused(blob):
    with pytest.raises(QrlInputError, match="corrupt weight blob"):
        decode(blob, HAND_SPEC.max_message_bytes)
