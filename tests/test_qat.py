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
from qrl.quant import FP32, check_quant_delay, export_params, qat_precision, serving_precision
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
        x = nn.relu(Conv(4, (3, 3), (2, 2), precision=self.precision)(x))
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


@pytest.mark.parametrize("bits", [8, 4, 2])
def test_qat_outputs_differ_from_fp32_by_a_bounded_nonzero_amount(bits):
    x = jax.random.normal(jax.random.PRNGKey(1), (64, 5))
    params = SmallNet().init(jax.random.PRNGKey(0), x)["params"]
    fp32 = SmallNet().apply({"params": params}, x)
    fake = SmallNet(qat_precision(bits)).apply({"params": params}, x)
    error = float(jnp.max(jnp.abs(fake - fp32)))
    scale = float(jnp.max(jnp.abs(fp32)))
    assert error > 0.0
    # Relative rounding error of each operand is at most 1/(2·qmax); through three layers the
    # output error stays well inside a few times that.
    qmax = 2 ** (bits - 1) - 1
    assert error < 6.0 * scale / (2 * qmax), (error, scale)


def test_qat_gradients_differ_from_fp32_but_are_finite():
    x = jax.random.normal(jax.random.PRNGKey(1), (64, 5))
    params = SmallNet().init(jax.random.PRNGKey(0), x)["params"]

    def loss(precision):
        return lambda p: jnp.mean(jnp.square(SmallNet(precision).apply({"params": p}, x)))

    fp32_grads = jax.grad(loss(FP32))(params)
    qat_grads = jax.grad(loss(qat_precision(4)))(params)
    difference = sum(float(jnp.sum(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(fp32_grads), jax.tree.leaves(qat_grads)))
    assert difference > 0.0
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(qat_grads))


@pytest.mark.parametrize("net,shape", [(SmallNet, (256, 5)), (SmallCNN, (16, 9, 9, 2))])
def test_exported_int8_reproduces_the_fake_quantized_network(net, shape):
    x = jax.random.normal(jax.random.PRNGKey(2), shape)
    params = net().init(jax.random.PRNGKey(0), x)["params"]
    fake = net(qat_precision(8)).apply({"params": params}, x)
    exported = export_params(params, 8)
    assert np.asarray(exported["head"]["kernel"]).dtype == np.int8
    served = net(serving_precision(8)).apply({"params": exported}, x)
    np.testing.assert_allclose(served, fake, rtol=1e-5, atol=1e-5 * float(jnp.max(jnp.abs(fake))))
    assert bool(jnp.all(jnp.argmax(served, -1) == jnp.argmax(fake, -1)))


def test_quant_delay_must_leave_quantized_training():
    check_quant_delay(0, 10)
    check_quant_delay(9, 10)
    with pytest.raises(QrlInputError, match="not shorter than the training run"):
        check_quant_delay(10, 10)
    with pytest.raises(QrlInputError, match=">= 0"):
        check_quant_delay(-1, 10)


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


def test_dqn_trains_fp32_before_the_delay_and_fake_quantized_after(monkeypatch):
    """The loop builds updates per precision; record which precision each update call used."""
    from agents.dqn import learning

    calls = []
    original = learning.make_update

    def recording_make_update(network, config, num_updates=1):
        update = original(network, config, num_updates)

        def wrapped(state, batches):
            calls.append((network.precision.name, int(state.updates)))
            return update(state, batches)

        return wrapped

    monkeypatch.setattr(learning, "make_update", recording_make_update)
    config = dqn.config_for("gym:CartPole-v1", {
        "learning_starts": 100, "train_freq": 50, "gradient_steps": 2, "batch_size": 32,
        "qat_bits": 8, "quant_delay": 400, "hidden_sizes": (32, 32),
    })
    state, results = dqn.train("gym:CartPole-v1", config, steps=800, seed=0, eval_episodes=1, progress=False)
    names = [name for name, _ in calls]
    assert names and set(names) == {"fp32", "qat8"}
    switch = names.index("qat8")
    assert all(name == "fp32" for name in names[:switch]) and all(name == "qat8" for name in names[switch:])
    # updates happen every 50 steps from step 100: 100..350 fp32 (6 phases), 400..800 QAT (9 phases).
    assert switch == 6 and len(names) == 15
    assert results["qat_bits"] == 8 and results["quant_delay"] == 400


def test_jitted_exporter_matches_export_params():
    x = jax.random.normal(jax.random.PRNGKey(2), (16, 5))
    params = SmallNet().init(jax.random.PRNGKey(0), x)["params"]
    from qrl.quant import make_exporter

    jitted = make_exporter(4)(params)
    reference = export_params(params, 4)
    for a, b in zip(jax.tree.leaves(jitted), jax.tree.leaves(reference)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert jax.tree.structure(jitted) == jax.tree.structure(reference)


@pytest.mark.parametrize("args,fragment", [
    (["--agent=dqn", "--env=gym:Pendulum-v1"], "agent dqn needs discrete actions"),
    (["--agent=sac", "--env=gym:CartPole-v1"], "agent sac needs continuous actions"),
    (["--qat_bits=9"], "qat_bits must be in 2..8"),
    (["--agent=ppo", "--qat_bits=1"], "qat_bits must be in 2..8"),
    (["--qat_bits=8", "--quant_delay=1000"], "quant_delay 1000 is not shorter than the training run (1000 steps)"),
    (["--quant_delay=10"], "--quant_delay needs --qat_bits"),
])
def test_train_cli_rejects_bad_qat_and_pairs_before_writing(tmp_path, args, fragment):
    from tests.test_cli import assert_input_error, run_module

    workdir = tmp_path / "run"
    assert_input_error(run_module("launch.train", f"--workdir={workdir}", "--steps=1000", *args), fragment)
    assert not workdir.exists()
