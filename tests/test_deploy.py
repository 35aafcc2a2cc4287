"""Exported policies (qrl.deploy, launch.export): ONNX graphs that reproduce qrl's JAX policies.

Agreement contract, per precision: discrete actions equal the JAX policy's wherever the JAX
outputs' top-two gap exceeds `TIE_GAP` (closer gaps are ties that float rounding may break
either way); continuous actions within `FLOAT_TOLERANCE` (float schemes) or
`INTEGER_TOLERANCE` (integer schemes: a last-bit difference in a float product can move one
activation to the neighbouring grid step) of the action range.
"""

import hashlib
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import pytest

from agents import get_agent
from qrl import envs, evaluation
from qrl.deploy import export as deploy_export
from qrl.deploy.onnx_graph import to_onnx
from qrl.deploy.policy import load_policy
from qrl.errors import QrlInputError
from qrl.quant import parse_precision
from qrl.quant.ptq import calibrate

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIE_GAP = 1e-4
FLOAT_TOLERANCE = 1e-4
INTEGER_TOLERANCE = 1e-2
ALL_SCHEMES = ("fp32", "fp16", "bf16", "quarl8", "quarl_fp16", "quarl_dyn8", "int8", "int8-dyn", "int4-e8", "int6")
FEW_SCHEMES = ("fp32", "fp16", "quarl8", "int8", "int8-dyn")
FAMILIES = [
    ("dqn", "gym:CartPole-v1", {}, ALL_SCHEMES),
    ("dqn", "gym:CartPole-v1", {"preset": "quarl"}, ALL_SCHEMES),  # layer norm and dueling head.
    ("ppo", "gym:CartPole-v1", {}, FEW_SCHEMES),
    ("ppo", "gym:Pendulum-v1", {}, ALL_SCHEMES),
    ("a2c", "gym:Acrobot-v1", {}, FEW_SCHEMES),
    ("ddpg", "gym:Pendulum-v1", {}, FEW_SCHEMES),
    ("td3", "gym:Pendulum-v1", {}, FEW_SCHEMES),
    ("sac", "gym:Pendulum-v1", {}, FEW_SCHEMES),
    ("d4pg", "gym:Pendulum-v1", {}, FEW_SCHEMES),
    ("ppo", "gymnax:Breakout-MinAtar", {}, ("fp32", "fp16", "quarl8", "int8", "int8-dyn", "int4-e8")),  # CNN.
]


def _family(agent_name, env_id, overrides, seed=1):
    agent = get_agent(agent_name)
    env = envs.make(env_id, 0)
    observation_spec, action_spec = env.observation_spec(), env.action_spec()
    config = agent.config_for(env_id, overrides)
    state = agent.init_state(config, observation_spec, action_spec, seed=seed)
    spec = agent.policy_spec(config, observation_spec, action_spec)
    return spec, agent.policy_params(state), observation_spec, action_spec


def _probe_observations(env_id, shape, count=128):
    rng = np.random.default_rng(0)
    if "MinAtar" in env_id:
        return (rng.random((count, *shape)) < 0.2).astype(np.float32)
    return (2.0 * rng.normal(size=(count, *shape))).astype(np.float32)


def _assert_agreement(jax_actions, jax_outputs, onnx_actions, onnx_outputs, action_spec, integer_scheme):
    if np.issubdtype(jax_actions.dtype, np.integer):
        ordered = np.sort(jax_outputs, axis=-1)
        decided = (ordered[:, -1] - ordered[:, -2]) > TIE_GAP * np.maximum(1.0, np.abs(ordered[:, -1]))
        assert decided.mean() > 0.9, "the probe set is almost all ties: the check would say nothing"
        np.testing.assert_array_equal(onnx_actions[decided], jax_actions[decided])
        return
    span = float(np.max(action_spec.maximum - action_spec.minimum))
    tolerance = (INTEGER_TOLERANCE if integer_scheme else FLOAT_TOLERANCE) * span
    assert np.max(np.abs(onnx_actions - jax_actions)) <= tolerance


@pytest.mark.parametrize("agent_name,env_id,overrides,schemes", FAMILIES,
                         ids=[f"{a}-{e.split(':')[1]}{'-' + o['preset'] if o else ''}" for a, e, o, _ in FAMILIES])
def test_exported_policy_acts_as_the_jax_policy_at_every_scheme(agent_name, env_id, overrides, schemes, tmp_path):
    spec, params, observation_spec, action_spec = _family(agent_name, env_id, overrides)
    observations = _probe_observations(env_id, tuple(observation_spec.shape))
    ranges = calibrate(spec.build_network(parse_precision("fp32")).apply, params, observations)
    path = str(tmp_path / "policy.onnx")
    for name in schemes:
        precision = parse_precision(name)
        fn = deploy_export.policy_function(spec, params, precision, ranges)
        sidecar = deploy_export.export_policy(
            fn, observation_spec.shape, path,
            {"agent": agent_name, "env": env_id, "precision": name, "action": deploy_export.action_description(action_spec)},
            probe_observations=observations,
        )
        policy = load_policy(path)
        onnx_actions, onnx_outputs = policy.outputs(observations)
        jax_actions, jax_outputs = (np.asarray(x) for x in jax.jit(fn)(jnp.asarray(observations)))
        assert onnx_actions.shape == jax_actions.shape and onnx_actions.dtype == jax_actions.dtype, name
        _assert_agreement(jax_actions, jax_outputs, onnx_actions, onnx_outputs, action_spec, not precision.is_float)
        ops = {node.op_type for node in onnx.load(path).graph.node}
        if precision.integer_kernel and precision.quantizes_activations and precision.bits == 8:
            assert ops & {"MatMulInteger", "ConvInteger"}, f"{name}: int8 layers must run ONNX integer operators"
        if name == "int8" and "MinAtar" not in env_id:  # every dense layer's input quantization is one QuantizeLinear.
            assert "QuantizeLinear" in ops and "Round" not in ops, sorted(ops)
        if name in ("quarl_dyn8", "int8-dyn") and "MinAtar" not in env_id:  # dynamic dense layers: one operator each.
            assert "DynamicQuantizeLinear" in ops and not ops & {"Round", "ReduceMin", "ReduceMax"}, sorted(ops)
        assert sidecar["precision"] == precision.name and sidecar["agreement"]["probe_states"] == len(observations)
        np.testing.assert_array_equal(policy.act(observations[0]), policy(observations[:1])[0])  # dynamic scales are per batch.


def test_int8_graph_is_integer_arithmetic_with_hand_computed_values():
    """x · W on the int8 grid: q = round(x / 0.5) clipped to [-127, 127], (q · W_int) * 0.5 * 0.25."""
    kernel = np.array([[1, -2], [3, 4]], np.int8)

    def fn(x):
        q = jnp.clip(jnp.round(x / 0.5), -127, 127).astype(jnp.int8)
        accumulated = jax.lax.dot_general(q, jnp.asarray(kernel), (((1,), (0,)), ((), ())), preferred_element_type=jnp.int32)
        return accumulated.astype(jnp.float32) * (0.5 * 0.25)

    model = to_onnx(fn, (2,), ["y"])
    assert [n.op_type for n in model.graph.node].count("MatMulInteger") == 1
    from qrl.deploy.policy import session_from_bytes

    session = session_from_bytes(model.SerializeToString())
    x = np.array([[1.25, -0.75], [100.0, 0.24]], np.float32)  # round half to even: 2.5 -> 2, -1.5 -> -2, 0.48 -> 0.
    (y,) = session.run(None, {"observation": x})
    expected = np.array([[2 * 1 + -2 * 3, 2 * -2 + -2 * 4], [127 * 1, 127 * -2]], np.float32) * 0.125
    np.testing.assert_array_equal(y, expected)
    (y_batch_one,) = session.run(None, {"observation": x[:1]})  # the batch axis is symbolic.
    np.testing.assert_array_equal(y_batch_one, expected[:1])


def test_an_unsupported_operation_is_named():
    with pytest.raises(QrlInputError, match="'cumsum'"):
        to_onnx(lambda x: jnp.cumsum(x, axis=-1), (3,), ["y"])


def test_exported_policy_returns_equal_the_jax_policy_returns_on_fixed_seeds(tmp_path):
    for agent_name, env_id, scheme in (("dqn", "gym:CartPole-v1", "int8"), ("ddpg", "gym:Pendulum-v1", "int8")):
        spec, params, observation_spec, action_spec = _family(agent_name, env_id, {}, seed=4)
        observations = evaluation.collect_observations(
            lambda o: np.asarray(spec.outputs_to_actions(spec.build_network(parse_precision("fp32")).apply({"params": params}, o))),
            env_id, 256, seed=7)
        ranges = calibrate(spec.build_network(parse_precision("fp32")).apply, params, observations)
        fn = deploy_export.policy_function(spec, params, parse_precision(scheme), ranges)
        path = str(tmp_path / f"{agent_name}.onnx")
        deploy_export.export_policy(fn, observation_spec.shape, path, {
            "agent": agent_name, "env": env_id, "precision": scheme, "action": deploy_export.action_description(action_spec)})
        jitted = jax.jit(lambda o, fn=fn: fn(o)[0])
        jax_result = evaluation.evaluate(lambda o, jitted=jitted: np.asarray(jitted(jnp.asarray(o, jnp.float32))),
                                         env_id, 3, seed=11)
        onnx_result = evaluation.evaluate(load_policy(path), env_id, 3, seed=11)
        np.testing.assert_allclose(onnx_result.returns, jax_result.returns, rtol=1e-4)


def _exported(tmp_path):
    spec, params, observation_spec, action_spec = _family("dqn", "gym:CartPole-v1", {})
    fn = deploy_export.policy_function(spec, params, parse_precision("fp32"))
    path = str(tmp_path / "policy.onnx")
    deploy_export.export_policy(fn, observation_spec.shape, path, {
        "agent": "dqn", "env": "gym:CartPole-v1", "precision": "fp32", "action": deploy_export.action_description(action_spec)})
    return path


def test_loading_refuses_corrupted_foreign_or_sidecarless_models(tmp_path):
    path = _exported(tmp_path)
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF
    corrupted = tmp_path / "corrupted.onnx"
    corrupted.write_bytes(bytes(data))
    (tmp_path / "corrupted.onnx.json").write_text(open(path + ".json").read())
    with pytest.raises(QrlInputError, match="SHA-256"):
        load_policy(str(corrupted))
    foreign = tmp_path / "foreign.onnx"
    foreign.write_bytes(b"not an onnx model")
    sidecar = json.load(open(path + ".json"))
    sidecar["model_sha256"] = hashlib.sha256(b"not an onnx model").hexdigest()
    (tmp_path / "foreign.onnx.json").write_text(json.dumps(sidecar))
    with pytest.raises(QrlInputError, match="not a model ONNX Runtime can run"):
        load_policy(str(foreign))
    (tmp_path / "other.onnx").write_bytes(open(path, "rb").read())
    with pytest.raises(QrlInputError, match="has no sidecar"):
        load_policy(str(tmp_path / "other.onnx"))
    (tmp_path / "other.onnx.json").write_text(json.dumps({**sidecar, "format": "something-else"}))
    with pytest.raises(QrlInputError, match="not a qrl policy sidecar"):
        load_policy(str(tmp_path / "other.onnx"))
    (tmp_path / "other.onnx.json").write_text("{broken")
    with pytest.raises(QrlInputError, match="not a readable qrl policy sidecar"):
        load_policy(str(tmp_path / "other.onnx"))
    with pytest.raises(QrlInputError, match=r"observations of shape \(3,\)"):
        load_policy(path)(np.zeros((2, 3), np.float32))


@pytest.fixture(scope="module")
def dqn_run(tmp_path_factory):
    """A finished launch.train DQN run on CartPole (1,500 steps)."""
    workdir = tmp_path_factory.mktemp("trained") / "dqn"
    subprocess.run([sys.executable, "-m", "launch.train", "--agent=dqn", "--env=gym:CartPole-v1", "--steps=1500",
                    f"--workdir={workdir}", "--eval_episodes=1", "--progress=false"],
                   check=True, cwd=REPO, env={**os.environ, "PYTHONPATH": REPO}, capture_output=True)
    return workdir


def test_export_cli_writes_a_model_that_acts_as_the_ptq_policy(dqn_run, tmp_path):
    workdir = dqn_run
    env = {**os.environ, "PYTHONPATH": REPO}
    out = tmp_path / "policy.onnx"
    completed = subprocess.run([sys.executable, "-m", "launch.export", f"--workdir={workdir}", "--precision=int8",
                                f"--out={out}", "--calibration_steps=256", "--probe_steps=256"],
                               cwd=REPO, env=env, capture_output=True, text=True)
    assert completed.returncode == 0, completed.stderr
    assert "action agreement" in completed.stdout
    sidecar = json.load(open(f"{out}.json"))
    assert sidecar["agent"] == "dqn" and sidecar["precision"] == "int8" and sidecar["source"]["checkpoint_step"] == 1500
    assert sidecar["agreement"]["action_agreement"] >= 0.99
    assert sorted(os.listdir(tmp_path)) == ["policy.onnx", "policy.onnx.json"]  # no temporary files left.
    policy = load_policy(str(out))
    assert policy.precision == "int8" and policy.act(np.zeros(4, np.float32)) in (0, 1)


# ----- offline and pruned policies ---------------------------------------------------------------

OFFLINE_ENV = "gym:Pendulum-v1"
OFFLINE_RUNS = {  # small networks, pruned to 90% by SNIP; TD3+BC trains on normalized observations.
    "bc": {"hidden_sizes": "64-64", "batch_size": 64},
    "td3_bc": {"hidden_sizes": "64-64", "batch_size": 64},
    "iql": {"hidden_sizes": "64-64", "batch_size": 64},
    "bcq": {"vae_hidden_sizes": "64-64", "actor_hidden_sizes": "64-64", "critic_hidden_sizes": "64-64",
            "batch_size": 64, "acting_samples": 10},
}


@pytest.fixture(scope="module")
def offline_runs(tmp_path_factory):
    """`{algo: workdir}`: each offline agent trained 200 steps under 90%-sparse SNIP masks on
    2,000 noisy swing-up steps of Pendulum."""
    from launch.prune_runs import PruneRun, run_prune_offline
    from pruning import PruneSettings
    from qrl.datasets import collect
    from qrl.datasets.writers import write_d4rl_hdf5
    from tests.test_bc import swing_up

    root = tmp_path_factory.mktemp("offline")
    act = lambda params, observations, normal: jnp.clip(swing_up(observations) + 0.5 * normal, -2.0, 2.0)
    steps, _ = collect.collect_steps(OFFLINE_ENV, act, None, 2000, seed=0)
    dataset = str(root / "pendulum.hdf5")
    write_d4rl_hdf5(dataset, steps, {"env_id": OFFLINE_ENV})
    runs = {}
    for algo, overrides in OFFLINE_RUNS.items():
        runs[algo] = str(root / algo)
        run_prune_offline(PruneRun(dataset=dataset, algo=algo, pruner="snip", settings=PruneSettings(sparsity=0.9),
                                   overrides=overrides, steps=200, eval_every=0, eval_episodes=1),
                          runs[algo], progress=False, printer=lambda *_: None)
    return runs


def _offline_jax_policy(workdir):
    """The run's own evaluation policy: numpy raw observations -> actions (normalizing as it trained)."""
    from launch.prune_runs import restore_offline_run
    from qrl.datasets import normalize_observations

    restored = restore_offline_run(workdir)
    agent = restored.algo.build(restored.config, restored.observation_spec, restored.action_spec)
    params = restored.algo.learning.policy_params(restored.state)
    normalize = restored.config.normalize_observations
    policy = jax.jit(lambda o: agent.policy(params, normalize_observations(restored.dataset, o) if normalize else o))
    return lambda observations: np.asarray(policy(jnp.asarray(observations, jnp.float32))), restored


@pytest.mark.parametrize("algo", sorted(OFFLINE_RUNS))
def test_exported_offline_pruned_policy_acts_as_the_runs_policy(offline_runs, algo, tmp_path):
    from launch.runs import export_run

    jax_policy, restored = _offline_jax_policy(offline_runs[algo])
    observations = np.asarray(restored.dataset.transitions.observation)[::7][:256]
    expected = jax_policy(observations)
    span = float(np.max(restored.action_spec.maximum - restored.action_spec.minimum))
    for scheme in ("fp32",) if algo == "bcq" else ("fp32", "int8", "int8-dyn"):
        out = str(tmp_path / f"{algo}-{scheme}.onnx")
        sidecar = export_run(offline_runs[algo], scheme, out, calibration_steps=256, probe_steps=128)
        assert sidecar["agent"] == algo and sidecar["precision"] == scheme
        assert (sidecar["observation"]["normalization"] is not None) == restored.config.normalize_observations
        assert sidecar["pruning"]["pruner"] == "snip" and sidecar["agreement"]["probe_states"] == 128
        model = onnx.load(out)
        stored = sum(int(tensor.values.dims[0]) for tensor in model.graph.sparse_initializer)
        assert model.graph.sparse_initializer and stored <= 0.1 * sum(
            int(np.prod(tensor.dims)) for tensor in model.graph.sparse_initializer) + 1, "pruned kernels are stored sparse"
        for runtime in ("onnxruntime", "csr"):
            actions = load_policy(out, runtime=runtime)(observations)
            if scheme == "fp32":
                assert np.max(np.abs(actions - expected)) <= FLOAT_TOLERANCE * span, (scheme, runtime)
            else:  # the quantized policy against the JAX policy at the same scheme.
                from launch.prune_runs import offline_policy_function
                from qrl.datasets import normalize_observations
                from qrl.quant import parse_precision

                seen = (np.asarray(normalize_observations(restored.dataset, observations))
                        if restored.config.normalize_observations else observations)
                calibration = json.load(open(out + ".json"))["source"]["activation_ranges"]
                assert calibration.startswith("calibrated on 256 dataset states") or scheme == "int8-dyn"
                quantized = offline_policy_function(restored, parse_precision(scheme), _calibration_states(restored, 256, 128))
                reference = np.asarray(jax.jit(lambda o: quantized(o)[0])(jnp.asarray(seen)))
                assert np.max(np.abs(actions - reference)) <= INTEGER_TOLERANCE * span, (scheme, runtime)
    if algo == "bcq":
        with pytest.raises(QrlInputError, match="bcq exports at fp32 only"):
            export_run(offline_runs[algo], "int8", str(tmp_path / "refused.onnx"))
        assert not (tmp_path / "refused.onnx").exists()


def _calibration_states(restored, calibration_steps, probe_steps, seed=0):
    """The dataset states `export_offline_run` calibrates on (same draw)."""
    from qrl.datasets import normalize_observations

    observations = np.asarray(restored.dataset.transitions.observation)
    count = calibration_steps + probe_steps
    drawn = np.random.default_rng(seed + 30_000).choice(len(observations), count, replace=count > len(observations))
    states = observations[drawn][:calibration_steps]
    return np.asarray(normalize_observations(restored.dataset, states)) if restored.config.normalize_observations else states


def test_exported_offline_policy_returns_equal_the_runs_returns_on_fixed_seeds(offline_runs, tmp_path):
    from launch.runs import export_run

    for algo in ("td3_bc", "bcq"):  # normalized observations; a policy searching over candidates.
        jax_policy, _ = _offline_jax_policy(offline_runs[algo])
        out = str(tmp_path / f"{algo}.onnx")
        export_run(offline_runs[algo], "fp32", out, calibration_steps=64, probe_steps=64)
        jax_result = evaluation.evaluate(jax_policy, OFFLINE_ENV, 2, seed=5)
        for runtime in ("onnxruntime", "csr"):
            onnx_result = evaluation.evaluate(load_policy(out, runtime=runtime), OFFLINE_ENV, 2, seed=5)
            np.testing.assert_allclose(onnx_result.returns, jax_result.returns, rtol=1e-3)


def test_csr_runtime_matches_hand_computed_sparse_products():
    """relu(x · W1 + b1) · W2 with W1 90% zeros (CSR) and W2 dense; and an int8 product in int32."""
    from qrl.deploy.csr_runtime import CsrProgram

    w1 = np.zeros((4, 10), np.float32)
    w1[0, 1], w1[2, 5], w1[3, 9], w1[1, 0] = 2.0, -1.0, 0.5, 3.0  # 4 of 40 kept.
    b1 = np.arange(10, dtype=np.float32) * 0.1
    w2 = np.ones((10, 2), np.float32)

    model = to_onnx(lambda x: jax.nn.relu(x @ w1 + b1) @ w2, (4,), ["y"])
    assert len(model.graph.sparse_initializer) == 1
    program = CsrProgram(model)
    assert program.sparse_kernels == 1
    x = np.array([[1.0, 1.0, 1.0, 1.0], [0.0, -2.0, 4.0, 0.0]], np.float32)
    hidden = np.maximum(0.0, np.array([[3.0, 2.0, 0, 0, 0, -1.0, 0, 0, 0, 0.5],
                                       [-6.0, 0.0, 0, 0, 0, -4.0, 0, 0, 0, 0.0]], np.float32) + b1)
    (y,) = program.run(["y"], {"observation": x})
    np.testing.assert_allclose(y, hidden @ w2, rtol=1e-6)

    kernel = np.zeros((3, 8), np.int8)
    kernel[0, 0], kernel[2, 7] = 127, -128

    def integer(x):
        q = jnp.clip(jnp.round(x), -128, 127).astype(jnp.int8)
        return jax.lax.dot_general(q, jnp.asarray(kernel), (((1,), (0,)), ((), ())), preferred_element_type=jnp.int32)

    program = CsrProgram(to_onnx(integer, (3,), ["y"]))
    assert program.sparse_kernels == 1
    (y,) = program.run(["y"], {"observation": np.array([[127.0, 5.0, -128.0]], np.float32)})
    expected = np.zeros((1, 8), np.int32)
    expected[0, 0], expected[0, 7] = 127 * 127, -128 * -128
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, expected)


def test_csr_runtime_names_what_it_cannot_run(tmp_path):
    from qrl.deploy.csr_runtime import CsrProgram

    kernel = np.ones((3, 3, 1, 2), np.float32)
    model = to_onnx(lambda x: jax.lax.conv_general_dilated(x, kernel, (1, 1), "VALID",
                                                           dimension_numbers=("NHWC", "HWIO", "NHWC")), (5, 5, 1), ["y"])
    with pytest.raises(QrlInputError, match="'Conv'"):
        CsrProgram(model)
    with pytest.raises(QrlInputError, match="unknown policy runtime 'tvm'"):
        load_policy(_exported(tmp_path), runtime="tvm")


def test_edge_bench_tabulates_bytes_latency_and_return_per_format(dqn_run, offline_runs, tmp_path):
    json_path = tmp_path / "edge.json"
    completed = subprocess.run(
        [sys.executable, "-m", "bench.edge", f"--runs={dqn_run},{offline_runs['bcq']}", "--schemes=fp32,int8",
         "--episodes=2", "--single_calls=20", f"--json={json_path}"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": REPO}, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr[-3000:]
    results = json.loads(json_path.read_text())
    assert results["machine"]["threads"] == 1 and results["machine"]["isa_class"]
    rows = {(row["run"], row["scheme"], row["runtime"]): row for row in results["rows"]}
    assert set(rows) == {("dqn", "fp32", "onnxruntime"), ("dqn", "int8", "onnxruntime"),
                         ("bcq", "fp32", "onnxruntime"), ("bcq", "fp32", "csr")}
    assert [(entry["run"], entry["scheme"]) for entry in results["skipped"]] == [("bcq", "int8")]
    assert rows[("dqn", "int8", "onnxruntime")]["bytes"] < 0.35 * rows[("dqn", "fp32", "onnxruntime")]["bytes"]
    for row in results["rows"]:
        assert 0 < row["p50_us"] <= row["p99_us"] and np.isfinite(row["return_mean"])
    assert rows[("dqn", "fp32", "onnxruntime")]["relative_error"] == 0.0
    p50 = {record["row"]: record for record in results["cells"] if record["column"] == "p50 µs"}
    assert p50["dqn fp32 (onnxruntime)"]["ratio"] == 1.0 and p50["bcq fp32 (csr)"]["value"] == rows[("bcq", "fp32", "csr")]["p50_us"]
    assert p50["dqn int8 (onnxruntime)"]["ratio"] == pytest.approx(
        rows[("dqn", "int8", "onnxruntime")]["p50_us"] / rows[("dqn", "fp32", "onnxruntime")]["p50_us"])
    # The CSR runtime runs the same pruned policy: the same episodes, the same return.
    assert rows[("bcq", "fp32", "csr")]["return_mean"] == pytest.approx(rows[("bcq", "fp32", "onnxruntime")]["return_mean"], rel=1e-3)
    assert results["machine"]["cpu"] and "skipped bcq int8: bcq exports at fp32 only" in completed.stdout
    refused = subprocess.run([sys.executable, "-m", "bench.edge", f"--runs={tmp_path / 'missing'}"],
                             cwd=REPO, env={**os.environ, "PYTHONPATH": REPO}, capture_output=True, text=True)
    assert refused.returncode == 2 and "is not a directory" in refused.stderr


def test_parameter_only_work_moves_to_the_prepare_program():
    """fn(p, x) = x · (w ⊙ s) + Σ b: the product and the sum run once in prepare, the graph
    keeps one MatMul and one Add, and the model fed prepare's arrays computes fn."""
    from qrl.deploy.onnx_graph import to_onnx_with_parameters
    from qrl.deploy.policy import session_from_bytes

    rng = np.random.default_rng(0)
    params = {"w": rng.normal(size=(3, 2)).astype(np.float32), "s": rng.normal(size=(2,)).astype(np.float32),
              "b": rng.normal(size=(4,)).astype(np.float32)}

    def fn(p, x):
        return x @ (p["w"] * p["s"]) + jnp.sum(p["b"])

    model, prepare = to_onnx_with_parameters(fn, params, (3,), ["y"])
    assert sorted(node.op_type for node in model.graph.node) == ["Add", "Identity", "MatMul"]
    session = session_from_bytes(model.SerializeToString())
    x = rng.normal(size=(5, 3)).astype(np.float32)
    for scale in (1.0, -2.0):  # a second weight update through the same session.
        updated = {**params, "s": params["s"] * scale}
        feeds = prepare(updated)
        assert len(feeds) == 2 and all(name.startswith("derived/") for name in feeds)
        (y,) = session.run(None, {"observation": x, **feeds})
        np.testing.assert_allclose(y, np.asarray(fn(updated, x)), rtol=1e-5, atol=1e-6)
