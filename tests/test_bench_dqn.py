"""Smoke test of the DQN throughput benchmark (`bench/dqn_throughput.py --quick`) and its pieces."""

import ast
import json
import os
import subprocess
import sys

import pytest

from bench.dqn_throughput import DEFAULT_PEER_PYTHON, PEER_SCRIPT, first_crossing, qrl_config, summarize

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_KEYS = (
    "learning_rate", "batch_size", "buffer_size", "learning_starts", "gamma", "train_freq", "gradient_steps",
    "exploration_fraction", "exploration_final_eps",
)


def _peer_hyperparameters() -> dict:
    """The peer's `*_HYPERPARAMETERS` dicts, read from its source (sbx is not importable here)."""
    tree = ast.parse(open(PEER_SCRIPT, encoding="utf-8").read())
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and node.targets[0].id.endswith("_HYPERPARAMETERS"):
            name = node.targets[0].id.removesuffix("_HYPERPARAMETERS").lower()
            found[name] = {keyword.arg: ast.literal_eval(keyword.value) for keyword in node.value.keywords}
    return found


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


def test_nature_setting_overrides_the_zoo_preset():
    config = qrl_config("nature")

    assert (config.train_freq, config.gradient_steps, config.batch_size) == (4, 1, 32)
    assert (config.learning_rate, config.learning_rate_schedule, config.max_grad_norm) == (1e-4, "constant", 10.0)
    assert (config.buffer_size, config.learning_starts, config.target_update_period) == (50_000, 1_000, 250)
    assert (config.exploration_fraction, config.exploration_final_eps) == (0.1, 0.05)
    assert config.hidden_sizes == (256, 256) and config.gamma == 0.99 and config.double_q is False
    assert qrl_config("zoo").train_freq == 256 and qrl_config("zoo").double_q is False


@pytest.mark.parametrize("setting", ["zoo", "nature"])
def test_peer_hyperparameters_match_qrl(setting):
    peer, config = _peer_hyperparameters()[setting], qrl_config(setting)

    assert {key: peer[key] for key in SHARED_KEYS} == {key: getattr(config, key) for key in SHARED_KEYS}
    if setting == "nature":  # zoo's interval 10 syncs once per phase instead; see the module docstring.
        assert peer["target_update_interval"] == config.target_update_period * config.train_freq


def test_quick_benchmark_runs_qrl_without_peer(tmp_path):
    json_path = tmp_path / "dqn.json"
    command = [
        sys.executable, "-m", "bench.dqn_throughput", "--setting=all", "--quick", "--eval-episodes=2",
        f"--peer-python={tmp_path / 'missing' / 'python'}", f"--json={json_path}",
    ]
    completed = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)

    assert completed.returncode == 0, completed.stderr[-2000:]
    assert "sbx: skipped" in completed.stdout
    assert "zoo     round 1  qrl  steps/s" in completed.stdout
    assert "nature  round 1  qrl  steps/s" in completed.stdout
    assert "nature: median steps/s: qrl" in completed.stdout
    assert completed.stdout.count("sbx not run, ratio qrl/sbx (target >= 3x): not measured") == 2
    written = json.loads(json_path.read_text())
    settings = written["settings"]
    assert list(settings) == ["zoo", "nature"] and written["machine"]["versions"]["jax"]
    assert [(record["row"], record["column"], record["value"] is None) for record in written["cells"]] == [
        ("zoo", "qrl steps/s", False), ("zoo", "qrl / sbx", True), ("nature", "qrl steps/s", False),
        ("nature", "qrl / sbx", True)]
    for setting, updates in (("zoo", 8 * 128), ("nature", (3000 - 1000) // 4 + 1)):
        (run,) = settings[setting]["runs"]
        assert run["agent"] == "qrl" and run["env_steps"] == 3000 and run["updates"] == updates
        assert run["steps_per_second"] > 0 and run["eval_mean"] > 0


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(DEFAULT_PEER_PYTHON), reason=".venv-bench not created (make bench-deps)")
@pytest.mark.parametrize("setting, sbx_steps, sbx_updates", [("zoo", 3072, 9 * 128), ("nature", 3000, 500)])
def test_quick_benchmark_runs_sbx_peer(tmp_path, setting, sbx_steps, sbx_updates):
    json_path = tmp_path / "dqn.json"
    command = [
        sys.executable, "-m", "bench.dqn_throughput", f"--setting={setting}", "--quick", "--eval-episodes=2",
        f"--json={json_path}",
    ]
    completed = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)

    assert completed.returncode == 0, completed.stderr[-2000:]
    results = json.loads(json_path.read_text())["settings"][setting]
    assert [run["agent"] for run in results["runs"]] == ["qrl", "sbx"]
    sbx_run = results["runs"][1]
    assert (sbx_run["env_steps"], sbx_run["updates"]) == (sbx_steps, sbx_updates)  # whole train_freq rollouts
    assert results["ratio"] > 0
