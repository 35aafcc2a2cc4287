"""ActorQ on Ray: a killed actor process is restarted and the run finishes; when a run ends or
gets Ctrl-C, no Ray process (raylet, GCS, workers) is left behind."""

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RAY_PROCESS_MARKERS = ("raylet", "gcs_server", "ray::")
SMALL_DQN = [
    "--agent=dqn", "--env=gym:CartPole-v1", "--set=hidden_sizes=32-32", "--set=batch_size=32",
    "--set=learning_starts=64", "--set=train_freq=4", "--set=gradient_steps=1", "--set=buffer_size=5000",
    "--eval_every_seconds=1", "--eval_episodes=2", "--actor_update_period=50", "--publish_period=20",
]


def _ray_processes(since: float) -> list[psutil.Process]:
    """Ray processes created after `since` (this test's runs; other sessions' Ray is left alone)."""
    found = []
    for process in psutil.process_iter(["name", "cmdline", "create_time"]):
        try:
            text = " ".join([process.info["name"] or ""] + (process.info["cmdline"] or []))
            if process.info["create_time"] >= since - 1 and any(marker in text for marker in RAY_PROCESS_MARKERS):
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def _actor_processes(since: float) -> list[psutil.Process]:
    return [p for p in _ray_processes(since) if "ray::Actor" in " ".join([p.info["name"] or ""] + (p.info["cmdline"] or []))]


def _assert_no_orphans(since: float, grace: float = 15.0) -> None:
    deadline = time.monotonic() + grace
    left = _ray_processes(since)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = [p for p in _ray_processes(since) if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, f"processes left behind: {[(p.pid, p.info['name']) for p in left]}"


def _start(workdir, *flags) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": REPO}
    return subprocess.Popen(
        [sys.executable, "-m", "launch.actorq", "--launcher=ray", f"--workdir={workdir}", *SMALL_DQN, *flags],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def _wait_for_actors(since: float, count: int, process: subprocess.Popen, timeout: float = 120.0) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        actors = _actor_processes(since)
        if len(actors) >= count:
            return actors
        if process.poll() is not None:
            pytest.fail(f"the run ended before its actors started:\n{process.stdout.read()}")
        time.sleep(0.5)
    pytest.fail("actor processes did not start")


def test_killed_actor_is_restarted_and_nothing_is_left_behind(tmp_path):
    since = time.time()
    workdir = tmp_path / "run"
    process = _start(workdir, "--num_actors=2", "--max_seconds=20")
    try:
        actors = _wait_for_actors(since, 2, process)
        time.sleep(4.0)  # let the actors act and insert before one dies
        actors[0].send_signal(signal.SIGKILL)
        output, _ = process.communicate(timeout=180)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, output
    results = json.loads((workdir / "results.json").read_text())
    assert sum(results["restarts"].values()) >= 1, results["restarts"]
    assert results["stop_reason"] == "max_seconds"
    assert results["counts"]["learner_steps"] > 0 and results["counts"]["actor_steps"] > 0
    _assert_no_orphans(since)


def test_ctrl_c_stops_every_node(tmp_path):
    since = time.time()
    process = _start(tmp_path / "run", "--num_actors=1", "--max_seconds=300")
    try:
        _wait_for_actors(since, 1, process)
        time.sleep(3.0)
        process.send_signal(signal.SIGINT)
        output, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, output
    assert "interrupted" in output
    _assert_no_orphans(since)
