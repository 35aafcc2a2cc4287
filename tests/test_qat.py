"""Quantization-aware training: STE fake quantization, the delay switch, export to int8 serving."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import agents.dqn as dqn
from qrl import config as qrl_config
from qrl.errors import QrlInputError
from qrl.networks import MLP
from qrl.networks.layers import Conv, Dense
from qrl.quant import (
    FP32, apply_frozen, apply_tracking, check_quant_delay, export_params, make_exporter, qat_precision, serving_precision,
)
from qrl.quant import ops


class SmallNet(nn.Module):
    precision: object = FP32

    @nn.compact
    def __call__(self, x):
        x = MLP((32, 32), precision=self.precision)(x)
        return Dense(3, precision=self.precision, name="head")(x)


class SmallCNN(nn.Module):
    precision: object = FP32

    @nn.compact
    def __call__(self, x):
        x = nn.relu(Conv(4, (3, 3), (2, 2), precision=self.precision, reads_observation=True)(x))
        return Dense(2, precision=self.precision, name="head")(x.reshape(x.shape[0], -1))


def test_fake_quantize_ste_rounds_forward_and_passes_gradients_straight_through():
    x = jnp.array([0.26, -0.74, 1.3, 0.05])
    # scale 0.5, qmax 2: 0.26/0.5=0.52 -> 1; -1.48 -> -1; 2.6 -> 3 -> clipped to 2; 0.1 -> 0.
    np.testing.assert_allclose(ops.fake_quantize_ste(x, jnp.float32(0.5), 2), [0.5, -0.5, 1.0, 0.0])
    grad = jax.grad(lambda v: jnp.sum(ops.fake_quantize_ste(v, jnp.float32(0.5), 2) * jnp.arange(1.0, 5.0)))(x)
    np.testing.assert_allclose(grad, [1.0, 2.0, 3.0, 4.0])


def test_qat_precision_keeps_the_fp32_parameter_tree():
    x = jnp.ones((2, 5))
    fp32_params = SmallNet().init(jax.random.PRNGKey(0), x)["params"]
    qat_params = SmallNet(qat_precision(4)).init(jax.random.PRNGKey(0), x)["params"]
    assert jax.tree.structure(fp32_params) == jax.tree.structure(qat_params)
    for a, b in zip(jax.tree.leaves(fp32_params), jax.tree.leaves(qat_params)):
        assert a.shape == b.shape and b.dtype == jnp.float32


def track(net, params, ranges, batches):
    """Training-mode passes over `batches`; returns the updated ranges."""
    for batch in batches:
        _, ranges = apply_tracking(net, params, ranges, batch)
    return ranges


def test_ema_range_starts_from_the_first_batch_then_averages():
    low, high = ops.ema_range(jnp.zeros(2), jnp.zeros(2), jnp.int32(0), jnp.array([-3.0, 1.0]), jnp.array([2.0, 5.0]), 0.9)
    np.testing.assert_allclose(low, [-3.0, 1.0])  # first batch: its own range, no pull towards 0.
    np.testing.assert_allclose(high, [2.0, 5.0])
    low, high = ops.ema_range(low, high, jnp.int32(1), jnp.array([-1.0, 3.0]), jnp.array([4.0, 5.0]), 0.9)
    np.testing.assert_allclose(low, [-2.8, 1.2], rtol=1e-6)  # 0.9 * -3 + 0.1 * -1, 0.9 * 1 + 0.1 * 3
    np.testing.assert_allclose(high, [2.2, 5.0], rtol=1e-6)  # 0.9 * 2 + 0.1 * 4, 0.9 * 5 + 0.1 * 5


def test_layers_track_per_feature_observation_and_per_tensor_hidden_ranges():
    precision = qat_precision(8, range_decay=0.5)
    obs_layer = Dense(3, precision=precision, reads_observation=True)
    hidden = Dense(3, precision=precision)
    batch1 = jnp.array([[1.0, -2.0], [3.0, 4.0]])
    batch2 = jnp.array([[0.0, 0.0], [5.0, -6.0]])
    variables = obs_layer.init(jax.random.PRNGKey(0), batch1)
    ranges = variables["quant_ranges"]
    assert int(ranges["seen"]) == 0 and ranges["input_min"].shape == (2,) and int(ranges["role"]) == 1
    ranges = track(obs_layer, variables["params"], ranges, [batch1, batch2])
    # batch 1: min [1, -2], max [3, 4]; batch 2 (min [0, -6], max [5, 0]) averaged in at decay 0.5.
    np.testing.assert_allclose(ranges["input_min"], [0.5, -4.0])
    np.testing.assert_allclose(ranges["input_max"], [4.0, 2.0])
    assert int(ranges["seen"]) == 2
    hidden_variables = hidden.init(jax.random.PRNGKey(0), batch1)
    hidden_ranges = track(hidden, hidden_variables["params"], hidden_variables["quant_ranges"], [batch1, batch2])
    assert hidden_ranges["input_min"].shape == ()  # one range for the whole tensor.
    np.testing.assert_allclose(hidden_ranges["input_min"], 0.5 * -2.0 + 0.5 * -6.0)
    np.testing.assert_allclose(hidden_ranges["input_max"], 0.5 * 4.0 + 0.5 * 5.0)
    # Outside training mode the ranges are read, never written.
    _, state = obs_layer.apply({"params": variables["params"], "quant_ranges": ranges}, batch1 * 10, mutable=[])
    assert state == {}


def test_affine_grid_fake_quantization_values_and_straight_through_gradient():
    precision = qat_precision(2)  # affine 2-bit grid: integers -2..1.
    scale, zero_point = ops.grid_range(jnp.float32(0.0), jnp.float32(1.5), precision)
    np.testing.assert_allclose([scale, zero_point], [0.5, -2.0])  # (1.5 - 0) / 3, round(-2 - 0 / 0.5).
    x = jnp.array([0.2, 0.8, 1.25, 3.0, -1.0])
    # x / 0.5 = [0.4, 1.6, 2.5, 6, -2] -> round [0, 2, 2, 6, -2] (half to even) -> + z [-2, 0, 0, 4, -4]
    # -> clip to [-2, 1] -> [-2, 0, 0, 1, -2] -> - z = [0, 2, 2, 3, 0]; real values 0.5 * that.
    q = ops.fake_quantize_grid_ste(x, scale, zero_point, precision.activation_qmin, precision.activation_qmax)
    np.testing.assert_allclose(q, [0.0, 2.0, 2.0, 3.0, 0.0])
    grad = jax.grad(lambda v: jnp.sum(scale * ops.fake_quantize_grid_ste(v, scale, zero_point, -2, 1)))(x)
    np.testing.assert_allclose(grad, np.ones(5))  # straight through: d(scale * q)/dx = 1.


@pytest.mark.parametrize("bits", [8, 4, 2])
def test_qat_outputs_differ_from_fp32_by_a_bounded_nonzero_amount(bits):
    x = jax.random.normal(jax.random.PRNGKey(1), (64, 5))
    net = SmallNet(qat_precision(bits))
    variables = net.init(jax.random.PRNGKey(0), x)
    ranges = track(net, variables["params"], variables["quant_ranges"], [x])
    fp32 = SmallNet().apply({"params": variables["params"]}, x)
    fake = apply_frozen(net, variables["params"], ranges, x)
    error = float(jnp.max(jnp.abs(fake - fp32)))
    scale = float(jnp.max(jnp.abs(fp32)))
    assert error > 0.0
    # Relative rounding error of each operand is at most 1/(2·qmax) of its range; through three
    # layers the output error stays well inside a few times that.
    qmax = 2 ** (bits - 1) - 1
    assert error < 6.0 * scale / (2 * qmax), (error, scale)


def test_the_delay_precision_computes_float_but_tracks_ranges():
    x = jax.random.normal(jax.random.PRNGKey(1), (64, 5))
    net = SmallNet(qat_precision(8, fake_quant=False))
    variables = net.init(jax.random.PRNGKey(0), x)
    out, ranges = apply_tracking(net, variables["params"], variables["quant_ranges"], x)
    np.testing.assert_array_equal(out, SmallNet().apply({"params": variables["params"]}, x))
    np.testing.assert_allclose(ranges["MLP_0"]["dense_0"]["input_min"], jnp.min(x, axis=0))
    assert all(int(node["seen"]) == 1 for node in [ranges["head"], *ranges["MLP_0"].values()])


def test_qat_gradients_differ_from_fp32_but_are_finite():
    x = jax.random.normal(jax.random.PRNGKey(1), (64, 5))
    net = SmallNet(qat_precision(4))
    variables = net.init(jax.random.PRNGKey(0), x)
    ranges = track(net, variables["params"], variables["quant_ranges"], [x])
    fp32_grads = jax.grad(lambda p: jnp.mean(jnp.square(SmallNet().apply({"params": p}, x))))(variables["params"])
    qat_grads = jax.grad(lambda p: jnp.mean(jnp.square(apply_tracking(net, p, ranges, x)[0])))(variables["params"])
    difference = sum(float(jnp.sum(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(fp32_grads), jax.tree.leaves(qat_grads)))
    assert difference > 0.0
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(qat_grads))


@pytest.mark.parametrize("net,shape", [(SmallNet, (256, 5)), (SmallCNN, (16, 9, 9, 2))])
def test_frozen_range_qat_network_and_exported_int8_agree(net, shape):
    """Training-mode passes set the ranges; then, on fresh inputs (partly outside the tracked
    ranges, so clipping is exercised), the frozen-range QAT forward pass and the exported int8
    network round onto the same integers and differ only by float rounding: the QAT pass sums
    float products of grid integers and scales afterwards, int8 sums in int32 and has the zero
    point folded into its bias (in float64). Relative 1e-5 of the output scale covers that; one
    float-rounding difference crossing a rounding boundary inside the network would show as a
    whole grid step (≈1e-2 relative at 8 bits), which it would not hide."""
    keys = jax.random.split(jax.random.PRNGKey(2), 6)
    qat = net(qat_precision(8))
    variables = qat.init(jax.random.PRNGKey(0), jnp.zeros(shape))
    ranges = track(qat, variables["params"], variables["quant_ranges"], [jax.random.normal(k, shape) for k in keys[:5]])
    x = 1.5 * jax.random.normal(keys[5], shape)
    fake = apply_frozen(qat, variables["params"], ranges, x)
    exported = export_params(variables["params"], 8, ranges)
    assert np.asarray(exported["head"]["kernel"]).dtype == np.int8
    served = net(serving_precision(8)).apply({"params": exported}, x)
    np.testing.assert_allclose(served, fake, rtol=1e-5, atol=1e-5 * float(jnp.max(jnp.abs(fake))))
    assert bool(jnp.all(jnp.argmax(served, -1) == jnp.argmax(fake, -1)))


@pytest.mark.parametrize("bits", [8, 4])
def test_jitted_exporter_matches_export_params(bits):
    x = jax.random.normal(jax.random.PRNGKey(2), (16, 5))
    net = SmallNet(qat_precision(bits))
    variables = net.init(jax.random.PRNGKey(0), x)
    ranges = track(net, variables["params"], variables["quant_ranges"], [x, 2 * x])
    jitted = make_exporter(bits)(variables["params"], ranges)
    reference = export_params(variables["params"], bits, ranges)
    assert jax.tree.structure(jitted) == jax.tree.structure(reference)
    for a, b in zip(jax.tree.leaves(jitted), jax.tree.leaves(reference)):
        assert np.asarray(a).dtype == np.asarray(b).dtype
        np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=1e-6, atol=1e-7)


def test_export_needs_every_layer_to_have_seen_a_batch():
    variables = SmallNet(qat_precision(8)).init(jax.random.PRNGKey(0), jnp.ones((2, 5)))
    with pytest.raises(QrlInputError, match="no activation range yet"):
        export_params(variables["params"], 8, variables["quant_ranges"])


def test_quant_delay_counts_updates_and_must_leave_quantized_training():
    check_quant_delay(0, 10)
    check_quant_delay(9, 10)
    with pytest.raises(QrlInputError, match=r"not shorter than the training run \(10 updates\)"):
        check_quant_delay(10, 10)
    with pytest.raises(QrlInputError, match=">= 0"):
        check_quant_delay(-1, 10)


def test_unknown_qat_backend_is_an_input_error():
    with pytest.raises(QrlInputError, match="qat_backend must be one of qrl, aqt"):
        dqn.config_for("gym:CartPole-v1", {"qat_bits": 8, "qat_backend": "tflite"})
    with pytest.raises(QrlInputError, match="unknown qat backend"):
        qat_precision(8, backend="tflite")


@pytest.mark.parametrize("bits", [1, 9, 16])
def test_qat_bits_outside_2_to_8_are_input_errors(bits):
    with pytest.raises(QrlInputError, match="2..8"):
        qat_precision(bits)
    with pytest.raises(QrlInputError, match="qat_bits must be in 2..8"):
        dqn.config_for("gym:CartPole-v1", {"qat_bits": bits})


def test_override_parses_flag_strings():
    config = qrl_config.override(dqn.Config(), {"hidden_sizes": "64-32", "double_q": "false", "buffer_size": "1e4"}, "dqn")
    assert config.hidden_sizes == (64, 32) and config.double_q is False and config.buffer_size == 10_000
    with pytest.raises(QrlInputError, match="not a valid int"):
        qrl_config.override(dqn.Config(), {"batch_size": "1.5"}, "dqn")


def test_dqn_tracks_ranges_during_the_delay_then_trains_fake_quantized(monkeypatch):
    """The loop builds one update per precision; record which one each update call used."""
    from agents.dqn import learning

    calls = []
    original = learning.make_update

    def recording_make_update(network, config, num_updates=1):
        update = original(network, config, num_updates)

        def wrapped(state, batches):
            calls.append((network.precision.name, int(state.updates), int(state.quant_ranges["head"]["seen"])))
            return update(state, batches)

        return wrapped

    monkeypatch.setattr(learning, "make_update", recording_make_update)
    config = dqn.config_for("gym:CartPole-v1", {
        "learning_starts": 100, "train_freq": 50, "gradient_steps": 2, "batch_size": 32,
        "qat_bits": 8, "quant_delay": 12, "hidden_sizes": (32, 32),
    })
    state, results = dqn.train("gym:CartPole-v1", config, steps=800, seed=0, eval_episodes=1, progress=False)
    names = [name for name, _, _ in calls]
    # Training phases every 50 steps from step 100 (15 phases of 2 updates): 12 delay updates
    # (6 phases) float with ranges tracked, then fake-quantized on warm ranges.
    assert names == ["qat8-delay"] * 6 + ["qat8"] * 9
    assert [updates for _, updates, _ in calls] == list(range(0, 30, 2))
    assert calls[6][2] == 12  # ranges tracked through every delay update (one batch each).
    assert int(state.updates) == 30 and int(state.quant_ranges["head"]["seen"]) == 30
    assert results["qat_bits"] == 8 and results["quant_delay"] == 12


@pytest.mark.parametrize("args,fragment", [
    (["--agent=dqn", "--env=gym:Pendulum-v1"], "agent dqn needs discrete actions"),
    (["--agent=sac", "--env=gym:CartPole-v1"], "agent sac needs continuous actions"),
    (["--qat_bits=9"], "qat_bits must be in 2..8"),
    (["--agent=ppo", "--qat_bits=1"], "qat_bits must be in 2..8"),
    (["--qat_bits=8", "--quant_delay=1000"], "quant_delay 1000 updates is not shorter than the training run"),
    (["--quant_delay=10"], "--quant_delay needs --qat_bits"),
])
def test_train_cli_rejects_bad_qat_and_pairs_before_writing(tmp_path, args, fragment):
    from tests.test_cli import assert_input_error, run_module

    workdir = tmp_path / "run"
    assert_input_error(run_module("launch.train", f"--workdir={workdir}", "--steps=1000", *args), fragment)
    assert not workdir.exists()


def _dqn_cartpole_qat_evaluations(backend: str, seed: int) -> dict:
    """rl-baselines3-zoo's CartPole DQN, 50k steps, QAT8 after half the updates; the int8
    export's greedy return every 2500 steps, `{env_steps: mean}`."""
    from agents.dqn import learning

    config = dqn.config_for("gym:CartPole-v1", {"qat_bits": 8, "qat_backend": backend})
    config = config.override({"quant_delay": learning.total_updates(config, 50_000) // 2})
    _, results = dqn.train("gym:CartPole-v1", config, steps=50_000, seed=seed, eval_episodes=10, eval_every=2500,
                           progress=False)
    return {record["env_steps"]: record["mean"] for record in results["evaluations"]}


QAT_DQN_SEEDS = (0, 1, 2)


@pytest.mark.parametrize("backend", ["qrl", "aqt"])
def test_dqn_reaches_cartpole_threshold_with_qat8(backend):
    """DQN at this budget oscillates, with QAT as in fp32, and which seed reaches the threshold
    depends on the CPU's float rounding: measured on an AMD EPYC with AVX-512, seed 0's int8
    export scored 500 at some evaluations after the delay and seed 1 reached 306 at best; on an
    AMD EPYC with AVX2 only, seed 0 reached 216 (`qrl`) / 235 (`aqt`) at best while seeds 1
    and 2 scored 500 (the fp32 run of seed 0 reached 500 there). One seed is a coin flip, so
    the claim is made over three: at least two seeds' int8 exports reach the fp32 test's
    threshold at an evaluation during quantization-aware training (fake quantization starts
    near step 25.6k; evaluations from 30k on)."""
    best = {seed: max(mean for steps, mean in _dqn_cartpole_qat_evaluations(backend, seed).items() if steps > 27_500)
            for seed in QAT_DQN_SEEDS}
    assert sum(value >= 475.0 for value in best.values()) >= 2, best


@pytest.mark.slow  # 10k SAC updates at 256-256, as tests/test_sac.py's Pendulum learning test.
@pytest.mark.parametrize("backend", ["qrl", "aqt"])
def test_sac_learns_pendulum_with_qat8(backend):
    """rl-baselines3-zoo's Pendulum preset, 10k steps, QAT8 after half the updates, evaluated as
    the int8 export; the fp32 test's threshold."""
    import agents.sac as sac
    from qrl.config import total_updates

    config = sac.config_for("gym:Pendulum-v1", {"qat_bits": 8, "qat_backend": backend})
    config = config.override({"quant_delay": total_updates(config, 10_000) // 2})
    _, results = sac.train("gym:Pendulum-v1", config, 10_000, seed=0, eval_episodes=10, progress=False)
    assert results["final_eval"]["mean"] >= -250.0, results["final_eval"]
