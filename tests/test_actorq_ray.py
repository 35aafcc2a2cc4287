"""ActorQ on Ray: a killed actor process is restarted and the run finishes; when a run ends or
gets Ctrl-C, no Ray process (raylet, GCS, workers) is left behind."""

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import psutil
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL_DQN = [
    "--agent=dqn", "--env=gym:CartPole-v1", "--set=hidden_sizes=32-32", "--set=batch_size=32",
    "--set=learning_starts=64", "--set=train_freq=4", "--set=gradient_steps=1", "--set=buffer_size=5000",
    "--eval_every_seconds=1", "--eval_episodes=2", "--actor_update_period=50", "--publish_period=20",
]


RUN_MARKER = "QRL_TEST_RAY_RUN"  # set in the driver's environment; every Ray process it starts inherits it


def _run_processes(run_id: str) -> list[psutil.Process]:
    """Live processes started by this test's driver: the driver's environment (and so every Ray
    process under it — raylet, GCS, agents, workers) carries `RUN_MARKER=run_id`."""
    found = []
    for process in psutil.process_iter(["name", "cmdline"]):
        try:
            if process.environ().get(RUN_MARKER) == run_id and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _actor_processes(run_id: str) -> list[psutil.Process]:
    return [p for p in _run_processes(run_id) if "ray::Actor" in " ".join([p.info["name"] or ""] + (p.info["cmdline"] or []))]


def _assert_no_orphans(run_id: str, grace: float = 15.0) -> None:
    deadline = time.monotonic() + grace
    left = _run_processes(run_id)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = _run_processes(run_id)
    assert not left, f"processes left behind: {[(p.pid, p.info['name']) for p in left]}"


@pytest.fixture
def run_id():
    """A marker for this test's processes; whatever still carries it at teardown is killed, so a
    failing run never leaves Ray processes competing with the rest of the suite for the CPUs."""
    marker = uuid.uuid4().hex
    yield marker
    for process in _run_processes(marker):
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass


def _start(run_id: str, workdir, *flags) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": REPO, RUN_MARKER: run_id}
    # A shell's background job starts with SIGINT ignored and its children inherit that; the driver
    # must start with the default disposition, as from a terminal, for Ctrl-C to reach it.
    return subprocess.Popen(
        [sys.executable, "-m", "launch.actorq", "--launcher=ray", f"--workdir={workdir}", *SMALL_DQN, *flags],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def _wait_for_actors(run_id: str, count: int, process: subprocess.Popen, timeout: float = 120.0) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        actors = _actor_processes(run_id)
        if len(actors) >= count:
            return actors
        if process.poll() is not None:
            pytest.fail(f"the run ended before its actors started:\n{process.stdout.read()}")
        time.sleep(0.5)
    pytest.fail("actor processes did not start")


def _communicate(process: subprocess.Popen, timeout: float) -> str:
    """The driver's output once it exits; its output so far in the failure if it does not."""
    try:
        output, _ = process.communicate(timeout=timeout)
        return output
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
        pytest.fail(f"the driver did not exit within {timeout:.0f} s; its output:\n{output[-3000:]}")


def test_killed_actor_is_restarted_and_nothing_is_left_behind(tmp_path, run_id):
    workdir = tmp_path / "run"
    process = _start(run_id, workdir, "--num_actors=2", "--max_seconds=20")
    try:
        actors = _wait_for_actors(run_id, 2, process)
        time.sleep(4.0)  # let the actors act and insert before one dies
        actors[0].send_signal(signal.SIGKILL)
        output = _communicate(process, timeout=180)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, output
    results = json.loads((workdir / "results.json").read_text())
    assert sum(results["restarts"].values()) >= 1, results["restarts"]
    assert results["stop_reason"] == "max_seconds"
    assert results["counts"]["learner_steps"] > 0 and results["counts"]["actor_steps"] > 0
    _assert_no_orphans(run_id)


def test_ctrl_c_stops_every_node(tmp_path, run_id):
    process = _start(run_id, tmp_path / "run", "--num_actors=1", "--max_seconds=300")
    try:
        _wait_for_actors(run_id, 1, process)
        time.sleep(3.0)
        process.send_signal(signal.SIGINT)
        output = _communicate(process, timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, output
    assert "interrupted" in output
    _assert_no_orphans(run_id)
