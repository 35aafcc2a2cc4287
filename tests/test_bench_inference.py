"""Smoke test of the inference latency benchmark (`bench/inference.py --quick`) and its pieces."""

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bench.timing import interleaved_medians

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HAS_ONNX = importlib.util.find_spec("onnxruntime") is not None and importlib.util.find_spec("onnx") is not None
JAX_ROWS = ("jax fp32 ", "jax bf16 ", "jax int8-static ", "jax int8-dynamic ")
ORT_ROWS = ("ort-fp32 *", "ort-int8-dynamic *", "ort-int8-static *", "numpy-fp32 *")


def _mlp_layers(rng):
    sizes = (17, 256, 256, 6)
    return [
        ((rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in)).astype(np.float32),
         rng.standard_normal(fan_out).astype(np.float32))
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:])
    ]


def test_interleaved_medians_calls_every_candidate_alike():
    counts = {"a": 0, "b": 0}

    def make_call(name):
        def call():
            counts[name] += 1

        return call

    medians = interleaved_medians({name: make_call(name) for name in counts}, rounds=4, round_seconds=1e-9)

    assert set(medians) == {"a", "b"}
    assert all(set(times) == {"wall", "cpu"} and min(times.values()) >= 0 for times in medians.values())
    assert counts["a"] == counts["b"] == 1 + 1 + 4  # warm-up, per-call estimate, one call per round


@pytest.mark.skipif(not HAS_ONNX, reason="onnx / onnxruntime not installed")
def test_onnx_graph_matches_numpy_mlp():
    import onnxruntime

    from bench.onnx_peer import build_mlp_graph, numpy_mlp

    rng = np.random.default_rng(0)
    layers = _mlp_layers(rng)
    session = onnxruntime.InferenceSession(
        build_mlp_graph(layers).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    x = rng.standard_normal((5, 17)).astype(np.float32)

    np.testing.assert_allclose(session.run(None, {"x": x})[0], numpy_mlp(layers)(x), rtol=1e-5, atol=1e-5)


def test_quick_benchmark_prints_every_row_and_writes_json(tmp_path):
    json_path = tmp_path / "inference.json"
    command = [sys.executable, "-m", "bench.inference", "--quick", f"--json={json_path}"]
    if not HAS_ONNX:
        command.append("--no_onnx")
    completed = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)

    assert completed.returncode == 0, completed.stderr[-2000:]
    output = completed.stdout
    mlp_table, cnn_table = output.split("Nature CNN")[0], output.split("Nature CNN")[1].split("targets")[0]
    for row in JAX_ROWS:
        assert row in mlp_table and row in cnn_table
    assert "jax fp32 numpy-io" in mlp_table
    assert "batch 1" in mlp_table and "batch 32" in mlp_table and "batch 1" in cnn_table
    assert "MLP int8-static/fp32 at batch 4096 <= 0.65: not measured" in output
    assert "CNN int8-static/fp32 at batch 32 <= 0.5: not measured" in output
    assert "parameter bytes" in output and "  MLP: fp32 287768 (1.00)" in output

    results = json.loads(json_path.read_text())
    assert results["machine"]["kind"].endswith(f"{os.cpu_count()} cores")
    for model in ("mlp", "cnn"):
        latency = results[model]["latency_us"]
        assert set(JAX_ROWS) <= {f"jax {name} " for name in latency}
        assert all(value > 0 for row in latency.values() for value in row.values())
        assert set(results[model]["cpu_us"]) == set(latency)
        sizes = results[model]["param_bytes"]
        assert sizes["int8-static"] < 0.3 * sizes["fp32"] and sizes["bf16"] == sizes["fp32"] // 2
    assert results["mlp"]["max_abs_error_vs_fp32"]["int8-static"]["32"] < 0.1
    cells = {(record["table"], record["row"], record["column"]): record for record in results["cells"]}
    int8 = cells[("MLP latency", "jax int8-static", "batch 32")]
    assert int8["value"] == results["mlp"]["latency_us"]["int8-static"]["32"] and int8["unit"] == "µs"
    assert int8["ratio"] == results["mlp"]["ratio_to_fp32"]["int8-static"]["32"]
    assert cells[("CNN latency", "jax fp32", "batch 1")]["ratio"] == 1.0
    if HAS_ONNX:
        for row in ORT_ROWS:
            assert row in mlp_table
        assert "JAX fp32 / ORT fp32 at batch 1 <= 2.0: " in output
        assert "not measured" not in output.split("JAX fp32 / ORT fp32 at batch 1")[1].splitlines()[0]
        assert set(results["onnx"]["latency_us"]["ort-int8-static"]) == {"1", "32"}
        exported = output.split("exported mlp 256-256 (qrl.deploy ONNX")[1].split("targets")[0]
        for scheme in ("fp32", "int8", "int8-dyn", "quarl_dyn8"):
            assert f"\n{scheme} (p99 b1 " in exported
        assert "exported mlp 256-256 int8/fp32 under ORT at batch 1 <= 1.0: " in output
        assert "not measured" not in output.split("exported mlp 256-256 int8/fp32 under ORT at batch 1")[1].splitlines()[0]
        latency = results["exported"]["latency_us"]["mlp 256-256"]
        assert set(latency) == {"fp32", "int8", "int8-dyn", "quarl_dyn8", "fp32-pruned95", "fp32-pruned95+csr",
                                "fp32-pruned95+ell", "int8-pruned95", "int8-pruned95+csr"}
        assert all(v["1"] > 0 for v in latency.values())
        sizes = results["exported"]["sizes"]["mlp 256-256"]
        assert sizes["int8"]["model_bytes"] < 0.35 * sizes["fp32"]["model_bytes"]
        # 95% of every kernel pruned: kept values plus int64 positions, 12 bytes each, about 0.15× dense fp32.
        assert sizes["fp32-pruned95"]["model_bytes"] < 0.2 * sizes["fp32"]["model_bytes"]
        assert "exported mlp 256-256 fp32-pruned95+csr/fp32 under ORT at batch 1 <= 0.5: " in output
        pruned = results["pruned_jax"]["latency_us"]["mlp 256-256"]
        assert set(pruned) == {"jax dense", "jax bcsr"} and all(v["1"] > 0 for v in pruned.values())
