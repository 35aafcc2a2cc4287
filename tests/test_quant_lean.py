"""`qrl.quant.lean`: packed int8 MLP policies give the integer layers' outputs on every unit."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from qrl.errors import QrlInputError
from qrl.networks import MLP
from qrl.quant import calibrate, parse_precision, quantize_params
from qrl.quant import lean

SIZES = (256, 256, 6)
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def policy():
    rng = np.random.default_rng(0)
    observations = (rng.standard_normal((64, 17)) * 3).astype(np.float32)
    network = MLP(SIZES, activate_final=False)
    params = network.init(jax.random.PRNGKey(0), observations[:1])["params"]
    return observations, params, calibrate(network.apply, params, observations)


@pytest.mark.parametrize("name, activations", [
    ("int8", "static"), ("int8", "dynamic"), ("int8-sym", "static"), ("int8-dyn-sym", "dynamic"),
    ("quarl_dyn8", "static"), ("int4", "static"), ("int8-obst", "static"),
])
def test_every_unit_gives_the_integer_layers_outputs(policy, name, activations):
    observations, params, ranges = policy
    precision = parse_precision(name, activations=activations)
    quantized = quantize_params(params, precision, ranges)
    reference = np.asarray(MLP(SIZES, precision=precision, activate_final=False).apply({"params": quantized}, observations))
    outputs = {}
    for unit in lean.UNITS:
        layout, packed = lean.pack_mlp(quantized, precision, unit=unit)
        assert layout.units == (unit,) * len(SIZES)
        outputs[unit] = np.asarray(lean.lean_apply(layout)(packed, observations))
        np.testing.assert_allclose(outputs[unit], reference, rtol=0, atol=1e-6 * np.max(np.abs(reference)))
    np.testing.assert_array_equal(outputs["bf16"], outputs["int8"])
    np.testing.assert_array_equal(outputs["fp32"], outputs["int8"])


def test_a_static_layer_by_hand():
    """x = [1.0, -0.5], scale 0.25, zero point 2: q = [6, 0]; kernel [[1, -2], [3, 4]] ->
    q·k = [6, -12]; output scale 0.25 * [0.5, 0.1] -> [0.75, -0.3]; plus bias [1, 0]."""
    layer = {"kernel": np.array([[1, -2], [3, 4]], np.int8), "kernel_scale": np.array([0.5, 0.1], np.float32),
             "input_scale": np.float32(0.25), "input_zero_point": np.float32(2.0),
             "bias": np.array([1.0, 0.0], np.float32)}
    precision = parse_precision("int8-obst")
    for unit in lean.UNITS:
        layout, packed = lean.pack_mlp({"dense_0": layer}, precision, unit=unit)
        output = np.asarray(lean.lean_apply(layout)(packed, np.array([[1.0, -0.5]], np.float32)))
        np.testing.assert_allclose(output, [[1.75, -0.3]], rtol=1e-6)


def test_a_dynamic_layer_by_hand():
    """x = [2, -1] on the affine 8-bit grid: scale 3/255, zero point round(-128 + 85) = -43,
    q = [127, -128]; kernel [[2], [1]]: q·k = 126, minus z · column sum (-43 * 3) = 255;
    times 3/255 * kernel scale 0.5 = 1.5; plus bias 0.25."""
    layer = {"kernel": np.array([[2], [1]], np.int8), "kernel_scale": np.array([0.5], np.float32),
             "bias": np.array([0.25], np.float32)}
    precision = parse_precision("int8-obst-dyn")
    for unit in lean.UNITS:
        layout, packed = lean.pack_mlp({"dense_0": layer}, precision, unit=unit)
        output = np.asarray(lean.lean_apply(layout)(packed, np.array([[2.0, -1.0]], np.float32)))
        np.testing.assert_allclose(output, [[1.75]], rtol=1e-6)


def test_a_layer_whose_float_sums_could_round_stays_on_the_int8_unit():
    rng = np.random.default_rng(1)
    wide = {"kernel": np.full((1100, 4), 127, np.int8), "kernel_scale": np.full((4,), 1e-3, np.float32),
            "bias": np.zeros((4,), np.float32)}
    narrow = {"kernel": rng.integers(-127, 128, (4, 3)).astype(np.int8), "kernel_scale": np.full((3,), 1e-2, np.float32),
              "bias": np.zeros((3,), np.float32)}
    params = {"dense_0": wide, "dense_1": narrow}
    precision = parse_precision("int8-obst-dyn")
    layout, packed = lean.pack_mlp(params, precision, unit="fp32")
    assert layout.units == ("int8", "fp32")  # 1100 * 127 * 128 >= 2^24
    x = rng.standard_normal((8, 1100)).astype(np.float32)
    int8_layout, int8_packed = lean.pack_mlp(params, precision, unit="int8")
    np.testing.assert_array_equal(np.asarray(lean.lean_apply(layout)(packed, x)),
                                  np.asarray(lean.lean_apply(int8_layout)(int8_packed, x)))


def test_a_packed_policy_is_one_kernel_per_layer_and_one_float_vector(policy):
    observations, params, ranges = policy
    precision = parse_precision("int8")
    quantized = quantize_params(params, precision, ranges)
    layout, packed = lean.pack_mlp(quantized, precision, unit="fp32")
    assert len(jax.tree_util.tree_leaves(packed)) == len(SIZES) + 1
    assert len(jax.tree_util.tree_leaves(quantized)) == 5 * len(SIZES)
    assert [kernel.dtype for kernel in packed[0]] == [jnp.float32] * len(SIZES)
    assert packed[1].shape == (layout.float_count,)


def test_dynamic_column_sums_are_computed_at_load_not_per_call(policy):
    observations, params, ranges = policy
    precision = parse_precision("int8", activations="dynamic")
    quantized = quantize_params(params, precision, ranges)
    layout, packed = lean.pack_mlp(quantized, precision, unit="int8")
    jaxpr = jax.make_jaxpr(lambda packed, x: lean._forward(layout, packed, x))(packed, observations)
    reductions = [eqn.primitive.name for eqn in jaxpr.eqns if eqn.primitive.name.startswith("reduce_")]
    assert "reduce_sum" not in reductions
    flax = MLP(SIZES, precision=precision, activate_final=False)
    flax_jaxpr = str(jax.make_jaxpr(lambda x: flax.apply({"params": quantized}, x))(observations))
    assert "reduce_sum" in flax_jaxpr  # the unpacked layers sum the kernel's columns on every call.


@pytest.mark.parametrize("name, message", [
    ("fp32", "integer weights and activations"), ("quarl4", "integer weights and activations"),
    ("int8-obsf", "integer weights and activations"), ("int12", "stored in int8"),
])
def test_precisions_lean_serving_cannot_pack_are_refused(policy, name, message):
    observations, params, ranges = policy
    precision = parse_precision(name)
    quantized = quantize_params(params, precision, ranges)
    with pytest.raises(QrlInputError, match=message):
        lean.pack_mlp(quantized, precision)


def test_bad_units_activations_and_networks_are_refused(policy):
    observations, params, ranges = policy
    precision = parse_precision("int8")
    quantized = quantize_params(params, precision, ranges)
    with pytest.raises(QrlInputError, match="unknown unit"):
        lean.pack_mlp(quantized, precision, unit="int4")
    with pytest.raises(QrlInputError, match="unknown activation"):
        lean.pack_mlp(quantized, precision, activation="sigmoid")
    with pytest.raises(QrlInputError, match="dense_0"):
        lean.pack_mlp({**quantized, "layer_norm_0": {}}, precision)
    with pytest.raises(QrlInputError, match="dense_0"):
        lean.pack_mlp({"dense_1": quantized["dense_1"]}, precision)


def test_serving_unit_reads_the_nearest_measured_policy_then_batch():
    table = {"AVX2": {"machine": "test", "entries": [
        {"params": 70_000, "batch": 1, "unit": "fp32"}, {"params": 70_000, "batch": 4096, "unit": "bf16"},
        {"params": 8_000_000, "batch": 1, "unit": "int8"}]}}
    assert lean.serving_unit(1, 70_000, isa="AVX2", table=table) == "fp32"
    assert lean.serving_unit(2048, 90_000, isa="AVX2", table=table) == "bf16"
    assert lean.serving_unit(64, 5_000_000, isa="AVX2", table=table) == "int8"
    assert lean.serving_unit(1, 70_000, isa="AMX", table=table) == "int8"  # never measured there.
    with pytest.raises(QrlInputError, match="batch"):
        lean.serving_unit(0, 70_000, isa="AVX2", table=table)
    with pytest.raises(QrlInputError, match="unknown unit"):
        lean.serving_unit(1, 10, isa="X", table={"X": {"entries": [{"params": 10, "batch": 1, "unit": "fp8"}]}})


def test_a_corrupt_dispatch_table_is_one_input_error(tmp_path):
    path = tmp_path / "table.json"
    path.write_text("{not json")
    with pytest.raises(QrlInputError, match="not a readable dispatch table"):
        lean.load_dispatch_table(str(path))
    path.write_text("[]")
    with pytest.raises(QrlInputError, match="keyed by ISA class"):
        lean.load_dispatch_table(str(path))


def test_the_shipped_dispatch_table_names_known_units_per_isa_class():
    table = lean.load_dispatch_table()
    assert table, "qrl/quant/lean_dispatch.json is missing or empty"
    for isa, measured in table.items():
        assert measured["machine"] and measured["entries"]
        for entry in measured["entries"]:
            assert entry["unit"] in lean.UNITS and entry["batch"] >= 1 and entry["params"] >= 1


def test_the_benchmark_times_every_candidate_and_writes_cells_and_a_dispatch_table(tmp_path):
    from bench import int8_lean

    table_path = tmp_path / "dispatch.json"
    table_path.write_text(json.dumps({"AMX": {"machine": "another", "entries": [{"params": 1, "batch": 1, "unit": "int8"}]}}))
    json_path = tmp_path / "lean.json"
    int8_lean.main(["--quick", "--no_onnx", "--rounds=1", f"--json={json_path}", f"--write_dispatch={table_path}"])
    results = json.loads(json_path.read_text())
    model = results["models"]["mlp 256-256"]
    assert set(model["jax"]["latency_us"]) == {"fp32", "bf16", "int8 layers", *(f"lean int8 on {u}" for u in lean.UNITS)}
    assert all(value < 1e-3 for row in model["jax"]["max_abs_difference_vs_int8_layers"].values() for value in row.values())
    assert {cell["column"] for cell in results["cells"]} == {"batch 1", "batch 32"}
    assert any(cell["row"] == "mlp 256-256 lean int8 on fp32" and cell["ratio"] > 0 for cell in results["cells"])
    assert [goal["name"] for goal in results["goals"]] == ["mlp 256-256: fastest lean int8 / fp32 at batch 1"]
    table = json.loads(table_path.read_text())
    assert table["AMX"]["machine"] == "another"  # other ISA classes are kept.
    isa = results["machine"]["isa_class"]
    assert [(entry["batch"], entry["unit"]) for entry in table[isa]["entries"]] == [
        (1, model["summary"]["fastest_unit"]["1"]), (32, model["summary"]["fastest_unit"]["32"])]
    assert lean.serving_unit(1, model["param_count"], isa=isa, table=table) == model["summary"]["fastest_unit"]["1"]


@pytest.mark.parametrize("arguments", [["--batches=0"], ["--batches=a"], ["--models=mlp 9-9"], ["--rounds=0"],
                                       ["--peer_python=/nonexistent/python"], ["--write_dispatch=/nonexistent/t.json"],
                                       ["--no_onnx", "--json=/nonexistent/r.json"]])
def test_the_benchmark_refuses_bad_flags_with_exit_2(arguments):
    completed = subprocess.run([sys.executable, "-m", "bench.int8_lean", "--quick", *arguments], cwd=REPO_ROOT,
                               capture_output=True, text=True)
    assert completed.returncode == 2
    assert "error:" in completed.stderr.strip().splitlines()[-1]
