"""launch.train --resume continues a killed or shorter run; launch.ptq refuses an unfinished run."""

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.test_cli import REPO, assert_input_error, run_module

DQN = ("--agent=dqn", "--env=gym:CartPole-v1", "--seed=0", "--set=learning_starts=200", "--set=train_freq=16",
       "--set=gradient_steps=4", "--eval_episodes=1", "--progress=false")


def _read_json(path):
    with open(path) as file:
        return json.load(file)


def _metric_steps(workdir):
    with open(os.path.join(workdir, "metrics.csv"), newline="") as file:
        return [int(row["step"]) for row in csv.DictReader(file)]


def _listing(directory):
    return sorted(os.path.relpath(os.path.join(root, name), directory)
                  for root, dirs, files in os.walk(directory) for name in dirs + files)


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    """A finished dqn run of 1000 steps with checkpoints at 500 and 1000."""
    workdir = str(tmp_path_factory.mktemp("resume") / "dqn")
    completed = run_module("launch.train", *DQN, "--steps=1000", "--checkpoint_every=500", "--eval_every=500",
                           f"--workdir={workdir}")
    assert completed.returncode == 0, completed.stderr
    return workdir


def test_resume_extends_a_finished_run(short_run, tmp_path):
    workdir = str(tmp_path / "dqn")
    shutil.copytree(short_run, workdir)

    completed = run_module("launch.train", *DQN, "--steps=2000", "--checkpoint_every=500", "--eval_every=500",
                           f"--workdir={workdir}", "--resume")

    assert completed.returncode == 0, completed.stderr
    results = _read_json(os.path.join(workdir, "results.json"))
    assert results["env_steps"] == 2000 and results["resumed_from_step"] == 1000
    assert results["config"]["steps"] == 2000
    assert [record["env_steps"] for record in results["evaluations"]] == [500, 1000, 1500, 2000]
    steps = _metric_steps(workdir)
    assert steps == sorted(steps) and steps[-1] == 2000 and 1000 in steps and 1500 in steps
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints")))[-1] == "2000"
    assert _read_json(os.path.join(workdir, "config.json"))["steps"] == 2000


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--steps=1000"], "is finished (1000 steps)"),
        (["--steps=2000", "--seed=1"], "seed (0 -> 1)"),
        (["--steps=2000", "--set=learning_rate=0.5"], "agent_config.learning_rate"),
        (["--steps=2000", "--env=gym:Acrobot-v1"], "env ('gym:CartPole-v1' -> 'gym:Acrobot-v1')"),
        (["--steps=2000", "--overwrite"], "exclude each other"),
    ],
)
def test_resume_refusals_write_nothing(short_run, args, fragment):
    before = _listing(short_run)
    argv = [arg for arg in DQN if not any(arg.startswith(given.split("=")[0] + "=") for given in args)]
    assert_input_error(run_module("launch.train", *argv, *args, f"--workdir={short_run}", "--resume"), fragment)
    assert _listing(short_run) == before


def test_resume_needs_a_run(tmp_path):
    assert_input_error(run_module("launch.train", *DQN, "--steps=100", f"--workdir={tmp_path / 'absent'}", "--resume"),
                       "does not exist")
    (tmp_path / "notes.md").write_text("mine")
    assert_input_error(run_module("launch.train", *DQN, "--steps=100", f"--workdir={tmp_path}", "--resume"),
                       "holds no qrl run")
    assert os.listdir(tmp_path) == ["notes.md"]


def test_resume_of_an_on_device_run_is_refused(tmp_path):
    assert_input_error(run_module("launch.train", "--agent=ppo", "--env=gymnax:CartPole-v1", "--steps=100",
                                  f"--workdir={tmp_path / 'run'}", "--resume"), "on device")
    assert not os.path.exists(tmp_path / "run")


def test_a_killed_run_resumes_to_its_total_steps(tmp_path):
    """SIGKILL after the first checkpoint is committed; --resume finishes the run."""
    workdir = str(tmp_path / "killed")
    argv = [*DQN, "--steps=40000", "--checkpoint_every=1000", f"--workdir={workdir}"]
    process = subprocess.Popen([sys.executable, "-m", "launch.train", *argv], cwd=REPO,
                               env={**os.environ, "PYTHONPATH": REPO}, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    first_checkpoint = os.path.join(workdir, "checkpoints", "1000")
    deadline = time.time() + 300
    while not os.path.isdir(first_checkpoint) and process.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert os.path.isdir(first_checkpoint) and not os.path.exists(os.path.join(workdir, "results.json"))

    # ptq refuses the unfinished run, naming its newest checkpoint and --step.
    ptq = ("--precisions=fp32", "--episodes=1", "--calibration_steps=16", "--divergence_steps=16")
    completed = run_module("launch.ptq", f"--workdir={workdir}", *ptq)
    assert_input_error(completed, "is unfinished")
    assert "--step=" in completed.stderr and not os.path.exists(os.path.join(workdir, "ptq"))
    assert_input_error(run_module("launch.ptq", f"--workdir={workdir}", *ptq, "--step=7"), "steps there: [")
    completed = run_module("launch.ptq", f"--workdir={workdir}", *ptq, "--step=1000")
    assert completed.returncode == 0, completed.stderr
    assert _read_json(os.path.join(workdir, "ptq", "results.json"))["run"]["checkpoint_step"] == 1000

    completed = run_module("launch.train", *argv, "--resume")

    assert completed.returncode == 0, completed.stderr
    results = _read_json(os.path.join(workdir, "results.json"))
    assert results["env_steps"] == 40000 and results["resumed_from_step"] >= 1000
    steps = _metric_steps(workdir)
    body = [step for step in steps if step < 40000]  # the last step has a log row and a final-evaluation row
    assert steps[-1] == 40000 and steps == sorted(steps) and len(body) == len(set(body))  # no row twice
    completed = run_module("launch.ptq", f"--workdir={workdir}", *ptq)
    assert completed.returncode == 0, completed.stderr
    sweep = _read_json(os.path.join(workdir, "ptq", "results.json"))
    assert sweep["run"]["checkpoint_step"] == 40000 and sweep["run"]["run_finished"]


@pytest.mark.parametrize("agent, env", [("ppo", "gym:CartPole-v1"), ("td3", "gym:Pendulum-v1")])
def test_other_host_loops_resume(tmp_path, agent, env):
    common = [f"--agent={agent}", f"--env={env}", "--eval_episodes=1", "--progress=false", f"--workdir={tmp_path}"]
    if agent == "td3":
        common += ["--set=learning_starts=100", "--set=batch_size=32"]
    else:
        common += ["--set=num_steps=32", "--set=batch_size=32", "--num_envs=2"]
    completed = run_module("launch.train", *common, "--steps=256", "--checkpoint_every=128")
    assert completed.returncode == 0, completed.stderr

    completed = run_module("launch.train", *common, "--steps=512", "--resume")

    assert completed.returncode == 0, completed.stderr
    results = _read_json(tmp_path / "results.json")
    assert results["env_steps"] == 512 and results["resumed_from_step"] == 256


def test_resume_before_the_first_checkpoint_is_refused(short_run, tmp_path):
    from qrl import workdirs

    workdir = str(tmp_path / "early")
    workdirs.claim(workdir, "train")
    shutil.copy(os.path.join(short_run, "config.json"), workdir)
    before = _listing(workdir)
    assert_input_error(run_module("launch.train", *DQN, "--steps=1000", f"--workdir={workdir}", "--resume"),
                       "stopped before its first checkpoint")
    assert _listing(workdir) == before


def test_a_resumed_monitor_drops_metrics_logged_after_its_checkpoint(tmp_path):
    from qrl.run_monitor import TrainingMonitor

    (tmp_path / "metrics.csv").write_text("step,loss\n1000,1.0\n2000,0.5\n3000,0.25\n")
    monitor = TrainingMonitor("dqn", "gym:CartPole-v1", 5000, 0, str(tmp_path), policy=None, progress=False,
                              start_steps=2000, evaluations=[{"env_steps": 1000, "mean": 9.0}])
    monitor.logger.write(3000, {"loss": 0.1})
    monitor.logger.close()

    assert (tmp_path / "metrics.csv").read_text() == "step,loss\n1000,1.0\n2000,0.5\n3000,0.1\n"
    assert monitor.evaluations == [{"env_steps": 1000, "mean": 9.0}]


def test_a_row_cut_short_by_the_kill_is_dropped(tmp_path):
    from qrl.run_monitor import TrainingMonitor

    (tmp_path / "metrics.csv").write_text("step,loss,episodes\n1000,1.0,3\n2000,0.5,7\n30")
    monitor = TrainingMonitor("dqn", "gym:CartPole-v1", 5000, 0, str(tmp_path), policy=None, progress=False,
                              start_steps=2000)
    monitor.logger.close()

    assert (tmp_path / "metrics.csv").read_text() == "step,loss,episodes\n1000,1.0,3\n2000,0.5,7\n"


def test_resume_continues_a_qat_run_with_its_trained_ranges(tmp_path):
    """A QAT run's moving-average ranges are checkpointed with it: a resumed run keeps tracking
    them (every update moves them once) and `launch.ptq --ranges=trained` serves with them."""
    from launch import runs

    workdir = str(tmp_path / "qat")
    qat = ("--qat_bits=8", "--quant_delay=40")
    completed = run_module("launch.train", *DQN, *qat, "--steps=1000", f"--workdir={workdir}")
    assert completed.returncode == 0, completed.stderr
    first = runs.restore_run(workdir, require_finished=True).state
    assert int(first.updates) == 204 and int(first.quant_ranges["head"]["seen"]) == 204  # (1000-200)//16+1 phases x 4
    completed = run_module("launch.train", *DQN, *qat, "--steps=1500", f"--workdir={workdir}", "--resume")
    assert completed.returncode == 0, completed.stderr
    resumed = runs.restore_run(workdir, require_finished=True).state
    assert int(resumed.updates) > 204 and int(resumed.quant_ranges["head"]["seen"]) == int(resumed.updates)
    completed = run_module("launch.ptq", f"--workdir={workdir}", "--precisions=int8", "--ranges=trained",
                           "--episodes=1", "--calibration_steps=64", "--divergence_steps=64")
    assert completed.returncode == 0, completed.stderr
    rows = _read_json(os.path.join(workdir, "ptq", "results.json"))["results"]
    assert [row["precision"] for row in rows] == ["fp32", "int8"]  # fp32 is the sweep's reference
