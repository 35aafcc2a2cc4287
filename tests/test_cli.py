"""Entry points end to end: train -> ptq on a tiny budget, and bad input -> one line, exit 2."""

import glob
import json
import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_module(module, *args, cwd=None):
    env = {**os.environ, "PYTHONPATH": REPO}
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=cwd or REPO, env=env, capture_output=True, text=True, timeout=600
    )


def assert_input_error(completed, fragment):
    assert completed.returncode == 2, completed.stderr
    lines = [line for line in completed.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, completed.stderr
    assert lines[0].startswith("error: ") and fragment in lines[0], lines[0]


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("run") / "dqn")
    completed = run_module(
        "launch.train", "--agent=dqn", "--env=gym:CartPole-v1", "--steps=1500", "--seed=0", f"--workdir={workdir}",
        "--set=learning_starts=500", "--set=train_freq=64", "--set=gradient_steps=8", "--eval_episodes=2",
        "--checkpoint_every=1000",
    )
    assert completed.returncode == 0, completed.stderr
    return workdir


def test_train_writes_the_run_directory(trained_run):
    for name in ("config.json", "metrics.csv", "results.json"):
        assert os.path.isfile(os.path.join(trained_run, name)), name
    assert glob.glob(os.path.join(trained_run, "tb", "events.out.tfevents.*"))
    assert os.path.isdir(os.path.join(trained_run, "checkpoints"))
    with open(os.path.join(trained_run, "results.json")) as file:
        results = json.load(file)
    assert results["env_steps"] == 1500 and results["agent"] == "dqn"
    assert len(results["final_eval"]["returns"]) == 2
    assert results["config"]["agent_config"]["learning_starts"] == 500
    with open(os.path.join(trained_run, "metrics.csv")) as file:
        header = file.readline().strip().split(",")
    assert header[0] == "step" and "epsilon" in header


def test_ptq_writes_results_report_and_plot(trained_run):
    completed = run_module(
        "launch.ptq", f"--workdir={trained_run}", "--precisions=fp32,fp16,bf16,int8,int4,quarl4", "--episodes=2",
        "--calibration_steps=128", "--divergence_steps=128",
    )
    assert completed.returncode == 0, completed.stderr
    out = os.path.join(trained_run, "ptq")
    with open(os.path.join(out, "results.json")) as file:
        sweep = json.load(file)
    rows = {row["precision"]: row for row in sweep["results"]}
    assert list(rows) == ["fp32", "fp16", "bf16", "int8", "int4", "quarl4"]
    assert rows["fp32"]["relative_error"] == 0.0 and rows["fp32"]["kl_divergence"] == 0.0
    assert rows["int8"]["param_bytes"] < 0.3 * rows["fp32"]["param_bytes"]
    assert rows["int4"]["packed_param_bytes"] < rows["int8"]["packed_param_bytes"]
    for row in rows.values():
        assert row["latency_us_batch1"] > 0 and len(row["returns"]) == 2
    with open(os.path.join(out, "report.md")) as file:
        report = file.read()
    assert "| int8 | 8 |" in report and "sweetspot.png" in report
    with open(os.path.join(out, "sweetspot.png"), "rb") as file:
        assert file.read(8) == b"\x89PNG\r\n\x1a\n"
    assert not [name for name in os.listdir(out) if name.startswith(".") or name.endswith(".tmp")]


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--agent=nope"], "unknown agent"),
        (["--env=gym:NoSuchEnv-v0"], "NoSuchEnv"),
        (["--env=mars:rover"], "gym"),
        (["--env=gym:Pendulum-v1"], "discrete"),
        (["--steps=0"], "steps"),
        (["--set=learning_rat=1"], "unknown DQN config key"),
        (["--bogus_flag=1"], "bogus_flag"),
        ([], "--workdir is required"),
    ],
)
def test_train_bad_input(tmp_path, args, fragment):
    workdir_args = [] if args == [] else [f"--workdir={tmp_path / 'w'}"]
    completed = run_module("launch.train", "--steps=10", *workdir_args, *args)
    assert_input_error(completed, fragment)
    assert not os.path.exists(tmp_path / "w" / "results.json")


@pytest.mark.parametrize(
    "precisions, fragment",
    [("int17", "bits must be in 2..16"), ("int1", "bits must be in 2..16"), ("fp8", "unknown precision"),
     ("quarl0", "bits must be in 2..16")],
)
def test_ptq_bad_precisions(trained_run, tmp_path, precisions, fragment):
    completed = run_module("launch.ptq", f"--workdir={trained_run}", f"--precisions={precisions}",
                           f"--out={tmp_path / 'ptq'}")
    assert_input_error(completed, fragment)
    assert not os.path.exists(tmp_path / "ptq")


def test_ptq_on_missing_and_checkpointless_workdirs(trained_run, tmp_path):
    assert_input_error(run_module("launch.ptq", f"--workdir={tmp_path / 'absent'}"), "does not exist")
    assert_input_error(run_module("launch.ptq", f"--workdir={tmp_path}"), "config.json")
    no_checkpoint = tmp_path / "no_checkpoint"
    no_checkpoint.mkdir()
    shutil.copy(os.path.join(trained_run, "config.json"), no_checkpoint / "config.json")
    assert_input_error(run_module("launch.ptq", f"--workdir={no_checkpoint}"), "checkpoint")


def test_ptq_on_corrupt_checkpoint(trained_run, tmp_path):
    corrupt = tmp_path / "corrupt"
    shutil.copytree(trained_run, corrupt)
    shutil.rmtree(corrupt / "ptq", ignore_errors=True)
    for path in glob.glob(str(corrupt / "checkpoints" / "**" / "*"), recursive=True):
        if os.path.isfile(path) and os.path.getsize(path) > 0:
            with open(path, "wb") as file:
                file.write(b"garbage")
    assert_input_error(run_module("launch.ptq", f"--workdir={corrupt}"), "checkpoint")
    assert not os.path.exists(corrupt / "ptq" / "results.json")


def test_train_refuses_to_overwrite_a_run(trained_run):
    assert_input_error(run_module("launch.train", f"--workdir={trained_run}", "--steps=10"), "--overwrite")


def test_train_cli_learns_cartpole(tmp_path):
    """What `launch.train` users run (one XLA thread, flat optimizer), 50k steps, fixed seed."""
    workdir = tmp_path / "learn"
    completed = run_module("launch.train", "--env=gym:CartPole-v1", "--steps=50000", "--seed=0",
                           "--eval_episodes=20", f"--workdir={workdir}")
    assert completed.returncode == 0, completed.stderr
    with open(workdir / "results.json") as file:
        results = json.load(file)
    assert results["config"]["agent_config"]["flat_optimizer"] is True
    assert results["final_eval"]["mean"] >= 475.0, results["final_eval"]


def test_ptq_trained_ranges_need_a_qat_run(trained_run, tmp_path):
    completed = run_module("launch.ptq", f"--workdir={trained_run}", "--precisions=int8", "--ranges=trained",
                           f"--out={tmp_path / 'ptq'}")
    assert_input_error(completed, "--ranges=trained needs a QAT run")
    assert not os.path.exists(tmp_path / "ptq")
