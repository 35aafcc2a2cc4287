"""ActorQ on Ray: a killed actor process is restarted and the run finishes; when a run ends or
gets Ctrl-C or SIGTERM, no Ray process (raylet, GCS, workers) is left behind and SIGTERM leaves a
final checkpoint; every socket a local Ray listens on is on loopback; a killed learner ends the
run with one line naming its last checkpoint, and resuming from corrupt checkpoints is refused
with one line."""

import glob
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from uuid import uuid4

import psutil
import pytest

from tests.ray_processes import assert_no_orphans, kill_marked, loopback_cluster, marked_env, run_processes

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL_DQN = [
    "--agent=dqn", "--env=gym:CartPole-v1", "--set=hidden_sizes=32-32", "--set=batch_size=32",
    "--set=learning_starts=64", "--set=train_freq=4", "--set=gradient_steps=1", "--set=buffer_size=5000",
    "--eval_every_seconds=1", "--eval_episodes=2", "--actor_update_period=50", "--publish_period=20",
]


def _node_processes(run_id: str, node_class: str) -> list[psutil.Process]:
    marker = f"ray::{node_class}"
    return [p for p in run_processes(run_id) if marker in " ".join([p.info["name"] or ""] + (p.info["cmdline"] or []))]


def _actor_processes(run_id: str) -> list[psutil.Process]:
    return _node_processes(run_id, "Actor")


def _listening_sockets(run_id: str, driver_pid: int) -> list[tuple[int, str, str]]:
    """(pid, process name, "ip:port") of every listening TCP and every bound UDP socket of the run:
    its marked processes and the driver's process tree (Ray's agents start with an environment
    of their own, without the marker)."""
    processes = {process.pid: process for process in run_processes(run_id)}
    driver = psutil.Process(driver_pid)
    processes.update({process.pid: process for process in [driver, *driver.children(recursive=True)]})
    found = []
    for process in processes.values():
        try:
            for connection in process.net_connections(kind="inet"):
                if connection.status in (psutil.CONN_LISTEN, psutil.CONN_NONE) and connection.laddr:
                    found.append((process.pid, process.name(), f"{connection.laddr.ip}:{connection.laddr.port}"))
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return found


def _is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address.rpartition(":")[0])
    return (getattr(ip, "ipv4_mapped", None) or ip).is_loopback


def _latest_checkpoint(workdir) -> int | None:
    steps = [int(os.path.basename(path)) for path in glob.glob(os.path.join(workdir, "checkpoints", "*"))
             if os.path.basename(path).isdigit()]
    return max(steps) if steps else None


def _start(run_id: str, workdir, *flags, separate_stderr: bool = False) -> subprocess.Popen:
    env = marked_env(run_id, REPO)
    # A shell's background job starts with SIGINT ignored and its children inherit that; the driver
    # must start with the default disposition, as from a terminal, for Ctrl-C to reach it.
    return subprocess.Popen(
        [sys.executable, "-m", "launch.actorq", "--launcher=ray", f"--workdir={workdir}", *SMALL_DQN, *flags],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE if separate_stderr else subprocess.STDOUT,
        text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
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
    assert_no_orphans(run_id)


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
    assert_no_orphans(run_id)


def test_sigterm_ends_like_ctrl_c_with_a_final_checkpoint_and_every_socket_is_on_loopback(tmp_path, run_id):
    workdir = tmp_path / "run"
    process = _start(run_id, workdir, "--num_actors=1", "--max_seconds=300")
    try:
        _wait_for_actors(run_id, 1, process)
        time.sleep(3.0)
        sockets = _listening_sockets(run_id, process.pid)
        tree = psutil.Process(process.pid).children(recursive=True)  # agents included, marker or not
        process.send_signal(signal.SIGTERM)
        output = _communicate(process, timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    # The driver, GCS, raylet (2), runtime-env agent, autoscaler metrics, each node: the check saw them.
    assert len(sockets) >= 12 and any(name == "ray::RuntimeEnvAgent" for _, name, _ in sockets), sockets
    assert [entry for entry in sockets if not _is_loopback(entry[2])] == [], sockets
    assert process.returncode == 130, output
    assert "interrupted" in output
    assert _latest_checkpoint(workdir) is not None, "no final checkpoint"
    assert_no_orphans(run_id)
    assert not [child.pid for child in tree if _alive(child)], "processes left behind"


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture(scope="module")
def killed_learner_run(tmp_path_factory):
    """A Ray run whose learner process is killed after its first checkpoints: (driver, stdout,
    stderr, workdir)."""
    run_id = uuid4().hex
    workdir = tmp_path_factory.mktemp("killed") / "run"
    process = _start(run_id, workdir, "--num_actors=1", "--max_seconds=300", "--checkpoint_every=20",
                     separate_stderr=True)
    try:
        learner = _node_processes_when_started(run_id, "Learner", process)
        deadline = time.monotonic() + 120
        while _latest_checkpoint(workdir) is None and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.5)
        time.sleep(1.0)  # let an in-flight checkpoint finish before the kill
        learner.send_signal(signal.SIGKILL)
        stdout, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    yield process, stdout, stderr, workdir, run_id
    kill_marked(run_id)


def _node_processes_when_started(run_id: str, node_class: str, process: subprocess.Popen) -> psutil.Process:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        found = _node_processes(run_id, node_class)
        if found:
            return found[0]
        time.sleep(0.5)
    pytest.fail(f"no {node_class} process started")


def test_killed_learner_ends_the_run_with_one_line_and_its_checkpoint_intact(killed_learner_run):
    process, stdout, stderr, workdir, run_id = killed_learner_run
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert process.returncode == 1, stderr
    assert len(lines) == 1, stderr
    step = _latest_checkpoint(workdir)
    assert step is not None
    assert lines[0] == (f"error: the learner process died; last checkpoint at step {step} in "
                        f"{os.path.join(workdir, 'checkpoints')}")
    # orbax renames a step's directory into place once written: a numbered one is whole.
    assert os.path.getsize(os.path.join(workdir, "checkpoints", str(step), "state", "_METADATA")) > 0
    assert_no_orphans(run_id)


def test_resume_from_corrupt_checkpoints_is_one_line_and_exit_2(killed_learner_run, tmp_path, run_id):
    _, _, _, killed, _ = killed_learner_run
    workdir = tmp_path / "run"
    shutil.copytree(killed, workdir)
    metadata = glob.glob(str(workdir / "checkpoints" / "*" / "state" / "_METADATA"))
    assert metadata
    for path in metadata:
        with open(path, "wb") as file:
            file.write(b"\x00garbage\xff" * 4)
    process = _start(run_id, workdir, "--num_actors=1", "--max_seconds=300", "--checkpoint_every=20", "--resume",
                     separate_stderr=True)
    try:
        _, stderr = process.communicate(timeout=180)
    finally:
        if process.poll() is None:
            process.kill()
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert process.returncode == 2, stderr
    assert len(lines) == 1 and lines[0].startswith("error: ") and "checkpoint" in lines[0], stderr
    assert_no_orphans(run_id)


def test_actors_run_on_the_second_node_of_a_two_node_cluster(tmp_path, run_id):
    """A Ray head and a second Ray node (separate processes, the second offering `actor_host`),
    both on 127.0.0.1, token-authenticated as Ray >= 2.59 sets up clusters; ActorQ joins with
    --ray_address, its actors land on the second node, the run finishes, and stopping the cluster
    leaves no process behind."""
    with loopback_cluster(run_id, REPO, node_cpus=(2, 2), worker_resources='{"actor_host": 2}') as (address, env, nodes):
        workdir = tmp_path / "run"
        driver = subprocess.Popen(
            [sys.executable, "-m", "launch.actorq", "--launcher=ray", f"--ray_address={address}",
             "--actor_resources=actor_host:1", "--num_actors=2", "--max_learner_steps=30", f"--workdir={workdir}",
             *SMALL_DQN],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        actors = _wait_for_actors(run_id, 2, driver)
        assert {actor.ppid() for actor in actors} == {nodes[1]}, "every actor runs on the node offering actor_host"
        output = _communicate(driver, 240)
        assert driver.returncode == 0, output[-3000:]
        results = json.loads((workdir / "results.json").read_text())
        assert results["config"]["actor_resources"] == {"actor_host": 1.0} and results["counts"]["learner_steps"] >= 30
        for node_class in ("Actor", "Learner", "ReplayServer", "Broadcaster", "Evaluator", "Counter"):
            assert not _node_processes(run_id, node_class), f"{node_class} left on the cluster after the run"
    assert_no_orphans(run_id)
