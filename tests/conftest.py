"""Shared test setup: quiet MuJoCo logs, and a pace line per test module.

Each module's first test prints the wall time since the session started and the 1-minute load
average, so a slow CI log shows where the time went and whether something else was using the
cores. When a module ends, processes it started that are still alive (a subprocess whose driver
failed, say) are killed and named, so they cannot slow every later test. `run_id` marks a test's
Ray processes (`tests.ray_processes`); `swingup_dataset` is the pruning and study tests' small
Pendulum dataset (`tests.offline_data`).
"""

import os
import time
import uuid

import psutil
import pytest

from tests.offline_data import write_swingup_dataset
from tests.ray_processes import kill_marked

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

_SESSION_START = time.monotonic()
_current_module = {"name": None}


def _descendants() -> list[psutil.Process]:
    try:
        return psutil.Process().children(recursive=True)
    except psutil.Error:
        return []


def pytest_runtest_logstart(nodeid, location):
    module = nodeid.split("::", 1)[0]
    if module == _current_module["name"]:
        return
    _current_module["name"] = module
    elapsed = time.monotonic() - _SESSION_START
    print(f"[{elapsed:.0f} s, load {os.getloadavg()[0]:.1f}]", end=" ", flush=True)


@pytest.fixture(scope="module", autouse=True)
def _no_processes_left_behind():
    before = {process.pid for process in _descendants()}
    yield
    left = [process for process in _descendants() if process.pid not in before]
    if not left:
        return
    gone, alive = psutil.wait_procs(left, timeout=5.0)
    for process in alive:
        try:
            name = " ".join(process.cmdline()[:4])
            process.kill()
            print(f"\n[killed a process left behind: {process.pid} {name}]", flush=True)
        except psutil.Error:
            continue


@pytest.fixture
def run_id():
    """A marker for a test's Ray processes (`tests.ray_processes`); whatever still carries it at
    teardown is killed, so a failing run never leaves Ray processes competing with the rest of
    the suite for the CPUs."""
    marker = uuid.uuid4().hex
    yield marker
    kill_marked(marker)


@pytest.fixture(scope="session")
def swingup_dataset(tmp_path_factory):
    """1,000 noisy swing-up steps on Pendulum in D4RL format (`tests.offline_data`), made once."""
    return write_swingup_dataset(tmp_path_factory.mktemp("data") / "pendulum-swingup.hdf5", 1000)
