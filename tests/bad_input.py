"""The bad-input harness: one entry point, one bad input, one line on stderr, exit 2, nothing written.

Each entry point's table lives in `tests/bad_inputs/<entry point>.py` as `CASES`, a list of
`Case`; `tests/test_bad_input.py` runs them all. A case runs the entry point in a subprocess
inside a fresh directory `tmp` (its args may say `{tmp}`), after the case's `setup(tmp)` has
laid out whatever the input needs (a file where a directory should be, a crafted dataset, a
finished run). The check: exit status 2, exactly one non-empty stderr line `error: ...` holding
`fragment`, and every path under `tmp` as it was before the run (nothing written, nothing
deleted, no file changed).
"""

import dataclasses
import os
import pathlib
import subprocess
import sys
from typing import Callable, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT_SECONDS = 300


@dataclasses.dataclass(frozen=True)
class Case:
    """One bad input to one entry point (`module`, e.g. "launch.train")."""

    module: str
    name: str
    args: tuple
    fragment: str  # text the one error line must hold
    setup: Optional[Callable[[pathlib.Path], None]] = None
    env: tuple = ()  # extra environment variables, (name, value) pairs; values may say {tmp}

    @property
    def id(self) -> str:
        return f"{self.module.split('.')[-1]}-{self.name}"


def a_file(tmp: pathlib.Path) -> None:
    """Setup for cases whose path is `{tmp}/afile` (a file where a directory should be) or lies under it."""
    (tmp / "afile").write_text("not a directory\n")


def snapshot(root: pathlib.Path) -> dict:
    """Every path under `root` with (kind, size, mtime_ns, mode): what 'nothing changed' compares."""
    state = {}
    for directory, subdirectories, files in os.walk(root):
        for name in subdirectories + files:
            path = os.path.join(directory, name)
            info = os.lstat(path)
            kind = "dir" if os.path.isdir(path) and not os.path.islink(path) else "file"
            size = 0 if kind == "dir" else info.st_size
            mtime = 0 if kind == "dir" else info.st_mtime_ns
            state[os.path.relpath(path, root)] = (kind, size, mtime, info.st_mode)
    return state


def run_case(case: Case, tmp: pathlib.Path) -> subprocess.CompletedProcess:
    """Sets the case up in `tmp`, runs it, and asserts the contract; returns the completed run."""
    if case.setup is not None:
        case.setup(tmp)
    before = snapshot(tmp)
    args = [arg.replace("{tmp}", str(tmp)) for arg in case.args]
    env = {**os.environ, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu"}
    env.update({name: value.replace("{tmp}", str(tmp)) for name, value in case.env})
    completed = subprocess.run(
        [sys.executable, "-m", case.module, *args], cwd=str(tmp), env=env, capture_output=True, text=True,
        timeout=TIMEOUT_SECONDS, stdin=subprocess.DEVNULL,
    )
    lines = [line for line in completed.stderr.splitlines() if line.strip()]
    assert completed.returncode == 2, f"exit {completed.returncode}\n{completed.stderr[-3000:]}"
    assert len(lines) == 1, f"{len(lines)} stderr lines:\n{completed.stderr[-3000:]}"
    assert lines[0].startswith("error: "), lines[0]
    assert case.fragment in lines[0], f"{case.fragment!r} not in {lines[0]!r}"
    after = snapshot(tmp)
    changed = sorted(path for path in set(before) | set(after)
                     if before.get(path) != after.get(path) and not _ignored(path))
    assert not changed, f"the refused run changed {changed}"
    return completed


def _ignored(path: str) -> bool:
    """Files that libraries write in the working directory by themselves (MuJoCo's log)."""
    return os.path.basename(path) == "MUJOCO_LOG.TXT"
