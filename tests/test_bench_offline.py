"""Smoke tests of the offline benchmarks (`--quick`): each prints its measurements, its target
lines, and writes its JSON."""

import json
import os
import subprocess
import sys

from bench.machine import record

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_bench(*arguments):
    completed = subprocess.run([sys.executable, "-m", *arguments], cwd=REPO_ROOT, capture_output=True, text=True,
                               timeout=300, env={**os.environ, "PYTHONPATH": REPO_ROOT})
    assert completed.returncode == 0, completed.stderr[-3000:]
    return completed.stdout


def test_sampling_bench_compares_a_sample_with_a_bc_update(tmp_path):
    output = run_bench("bench.offline_data", "sampling", "--quick", f"--json={tmp_path / 'sampling.json'}")
    assert "sample / BC update" in output and "(target < 0.05:" in output
    results = json.loads((tmp_path / "sampling.json").read_text())
    assert set(results["per_step_seconds"]) == {"sample", "bc_update", "bc_update_sampling"}
    assert results["sample_over_update"] == results["per_step_seconds"]["sample"] / results["per_step_seconds"]["bc_update"]
    assert results["machine"]["kind"] == record()["kind"] and results["machine"]["threads"] == 1
    ratio = next(cell for cell in results["cells"] if cell["row"] == "sample / BC update")
    assert ratio["value"] == results["sample_over_update"] and ratio["unit"] == "×"


def test_pruning_bench_prints_memory_per_format_and_masked_cost(tmp_path):
    output = run_bench("bench.pruning", "--quick", f"--json={tmp_path / 'pruning.json'}")
    assert "95% sparse int8, best format:" in output and "(target ≤ 1/20:" in output
    assert "masked" in output and "(target ≤ 1.10:" in output
    results = json.loads((tmp_path / "pruning.json").read_text())
    assert [row["sparsity"] for row in results["memory"]] == [0.5, 0.8, 0.9, 0.95, 0.98, 0.99]
    assert len(results["memory"][0]["table"]) == 8
    at_95 = {cell["column"]: cell for cell in results["cells"] if cell["row"] == "sparsity 0.95"}
    assert len(at_95) == 8 and at_95["dense fp32"]["ratio"] == 1.0 and at_95["csr int8"]["ratio"] < 0.1
    assert results["machine"]["kind"] == record()["kind"]


def test_throughput_bench_times_every_offline_agent_and_skips_a_missing_d3rlpy(tmp_path):
    output = run_bench("bench.offline_throughput", "--quick", "--bf16", f"--peer_python={sys.executable}",
                       f"--json={tmp_path / 'throughput.json'}")
    assert "d3rlpy: skipped (ModuleNotFoundError: No module named 'd3rlpy')" in output
    assert "| d3rlpy steps/s (updates alone) | qrl steps/s | qrl / d3rlpy (target ≥ 3×) |" in output
    bcq_bf16 = "BCQ, matmul_dtype=bf16, target_matmul_dtype=bf16"
    assert f"| {bcq_bf16} | VAE 750-750, actor 400-300, critics 400-300, batch 100 | - |" in output
    results = json.loads((tmp_path / "throughput.json").read_text())
    assert [row["name"] for row in results["rows"]] == [
        "BC", "TD3+BC", "TD3+BC, matmul_dtype=bf16", "IQL", "IQL, matmul_dtype=bf16", "BCQ", bcq_bf16]
    assert all(row["qrl_steps_per_second"] > 0 and row["ratio"] is None for row in results["rows"])
    assert results["setup"]["d3rlpy"] is None and results["setup"]["xla_threads"] == 1
    assert [cell["value"] for cell in results["cells"] if cell["column"] == "qrl / d3rlpy"] == [None] * 7
    assert results["machine"]["cpu"] == record()["cpu"]


def test_offline_many_bench_times_one_program_against_sequential_cells(tmp_path):
    output = run_bench("bench.offline_many", "--quick", f"--json={tmp_path / 'many.json'}")
    assert "C=  2: one program" in output and "(goal >= 3x at 8)" in output
    results = json.loads((tmp_path / "many.json").read_text())
    row = results["rows"][0]
    assert row["configurations"] == 2 and row["gain"] == row["sequential_seconds"] / row["one_program_seconds"]
    assert row["max_param_difference"] < 1e-4
    gain = next(cell for cell in results["cells"] if cell["column"] == "gain")
    assert gain["row"] == "2 configurations" and gain["value"] == row["gain"]
    assert results["machine"]["kind"] == record()["kind"] and results["machine"]["threads"] == 1
