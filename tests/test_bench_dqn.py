"""Smoke test of the DQN throughput benchmark (`bench/dqn_throughput.py --quick`) and its pieces."""

import json
import os
import subprocess
import sys

import pytest

from bench.dqn_throughput import DEFAULT_PEER_PYTHON, first_crossing, summarize

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(steps_per_second, agent="qrl"):
    return {"agent": agent, "steps_per_second": steps_per_second}


def test_summary_takes_median_ratio_against_target():
    runs = [_run(3000), _run(900, "sbx"), _run(3300), _run(1100, "sbx")]

    summary, line = summarize(runs, target=3.0)

    assert summary["medians"] == {"qrl": 3150, "sbx": 1000}
    assert summary["ratio"] == pytest.approx(3.15) and summary["passed"] is True
    assert line.endswith("ratio qrl/sbx 3.15x (target >= 3x): PASS")
    assert summarize([_run(2000), _run(1000, "sbx")], target=3.0)[1].endswith("FAIL")


def test_summary_without_peer_reports_not_measured():
    summary, line = summarize([_run(2000)], target=3.0)

    assert summary["ratio"] is None and summary["passed"] is None
    assert line.endswith("not measured")


def test_first_crossing_reads_train_seconds_from_metrics_rows(tmp_path):
    metrics = tmp_path / "metrics.csv"
    metrics.write_text("step,steps_per_second,episode_return\n1000,500.0,\n2000,400.0,120.0\n3000,300.0,480.0\n")

    assert first_crossing(str(metrics), 475.0) == pytest.approx(10.0)
    assert first_crossing(str(metrics), 500.0) is None


def test_quick_benchmark_runs_qrl_without_peer(tmp_path):
    json_path = tmp_path / "dqn.json"
    command = [
        sys.executable, "-m", "bench.dqn_throughput", "--quick", "--eval-episodes=2",
        f"--peer-python={tmp_path / 'missing' / 'python'}", f"--json={json_path}",
    ]
    completed = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)

    assert completed.returncode == 0, completed.stderr[-2000:]
    assert "sbx: skipped" in completed.stdout
    assert "round 1  qrl  steps/s" in completed.stdout
    assert "sbx not run, ratio qrl/sbx (target >= 3x): not measured" in completed.stdout
    results = json.loads(json_path.read_text())
    (run,) = results["runs"]
    assert run["agent"] == "qrl" and run["env_steps"] == 3000 and run["updates"] == 8 * 128
    assert run["steps_per_second"] > 0 and run["eval_mean"] > 0


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(DEFAULT_PEER_PYTHON), reason=".venv-bench not created (make bench-deps)")
def test_quick_benchmark_runs_sbx_peer(tmp_path):
    json_path = tmp_path / "dqn.json"
    command = [sys.executable, "-m", "bench.dqn_throughput", "--quick", "--eval-episodes=2", f"--json={json_path}"]
    completed = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)

    assert completed.returncode == 0, completed.stderr[-2000:]
    results = json.loads(json_path.read_text())
    assert [run["agent"] for run in results["runs"]] == ["qrl", "sbx"]
    assert results["runs"][1]["env_steps"] == 3072  # whole train_freq rollouts
    assert results["ratio"] > 0
