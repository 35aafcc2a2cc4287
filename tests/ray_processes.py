"""Test helpers for Ray runs: find the processes a test started (raylet, GCS, agents, workers) by
a marker in their environment, assert none is left behind, and start a multi-node Ray cluster on
127.0.0.1 (a head and more nodes, each its own raylet) as a user would with `ray start`."""

import contextlib
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from typing import Iterator, Optional, Sequence

import psutil

from qrl.distributed.ray_launcher import LOOPBACK_NODE_ENV_VAR

RUN_MARKER = "QRL_TEST_RAY_RUN"  # set in the driver's environment; every Ray process it starts inherits it


def run_processes(run_id: str) -> list[psutil.Process]:
    """Live processes started under `run_id`: the driver's environment (and so every Ray process
    under it — raylet, GCS, agents, workers) carries `RUN_MARKER=run_id`."""
    found = []
    for process in psutil.process_iter(["name", "cmdline"]):
        try:
            if process.environ().get(RUN_MARKER) == run_id and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def kill_marked(run_id: str) -> None:
    """Kills the run's marked processes and their children (Ray's agents start with an
    environment of their own, without the marker, under a marked raylet)."""
    marked = run_processes(run_id)
    tree = {process.pid: process for process in marked}
    for process in marked:
        try:
            tree.update({child.pid: child for child in process.children(recursive=True)})
        except psutil.NoSuchProcess:
            continue
    for process in tree.values():
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass


def assert_no_orphans(run_id: str, grace: float = 15.0) -> None:
    deadline = time.monotonic() + grace
    left = run_processes(run_id)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = run_processes(run_id)
    assert not left, f"processes left behind: {[(p.pid, p.info['name']) for p in left]}"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def raylets(run_id: str) -> set[int]:
    return {process.pid for process in run_processes(run_id) if "raylet" in (process.info["name"] or "")}


def marked_env(run_id: str, repo: str, **extra: str) -> dict:
    """This process's environment with the checkout on PYTHONPATH and the run's marker."""
    return {**os.environ, "PYTHONPATH": repo, RUN_MARKER: run_id, **extra}


@contextlib.contextmanager
def loopback_cluster(run_id: str, repo: str, node_cpus: Sequence[int] = (2, 2),
                     worker_resources: Optional[str] = None) -> Iterator[tuple[str, dict, list[int]]]:
    """A Ray cluster of `len(node_cpus)` nodes on 127.0.0.1 — the head and each further node a
    separate `ray start` (its own raylet) — token-authenticated as Ray >= 2.59 sets up clusters.

    Yields `(address, env, raylet pids in start order)`; `env` is what a driver joining it needs
    (the token and the marker). `worker_resources` (Ray's JSON) goes to every non-head node. At
    exit every process of the cluster is stopped and Ray's address file (which a bare `ray.init()`
    would join) is put back as it was.
    """
    address_file = os.path.join(tempfile.gettempdir(), "ray", "ray_current_cluster")  # `ray start` writes it
    previous = open(address_file, encoding="utf-8").read() if os.path.exists(address_file) else None
    port = free_port()
    env = marked_env(run_id, repo, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
    # A local RayBackend earlier in this process set Ray's loopback-only switch, under which
    # `ray start --address` refuses to add a node: a cluster must not inherit it.
    env.pop(LOOPBACK_NODE_ENV_VAR, None)
    ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")
    common = ["--node-ip-address=127.0.0.1", "--disable-usage-stats"]
    started: list[int] = []
    try:
        for index, cpus in enumerate(node_cpus):
            where = ["--head", f"--port={port}", "--include-dashboard=false"] if index == 0 else [
                f"--address=127.0.0.1:{port}", *([f"--resources={worker_resources}"] if worker_resources else [])]
            subprocess.run([ray_cli, "start", *where, f"--num-cpus={cpus}", *common], env=env, check=True,
                           capture_output=True, timeout=120)
            (new,) = raylets(run_id) - set(started)
            started.append(new)
        yield f"127.0.0.1:{port}", env, started
    finally:
        kill_marked(run_id)
        if previous is None:
            with contextlib.suppress(FileNotFoundError):
                os.remove(address_file)
        else:
            with open(address_file, "w", encoding="utf-8") as handle:
                handle.write(previous)
