"""Workdir ownership: a run writes into a directory only when qrl may, and deletes only what it wrote.

When a run claims its workdir, qrl writes a marker file `qrl-workdir.json` into it:

    {"kind": "train", "created": "2026-12-04T16:40:00+00:00", "qrl_version": "0.1.0",
     "entries": ["checkpoints", "config.json", "metrics.csv", ...]}

`entries` are the top-level names that kind of run writes (`RUN_OUTPUTS`). The rules, shared by
every entry point (train, demo, prune_offline, actorq and the studies' cells):

- A new directory, or an existing empty one, is claimed: the marker is written.
- A non-empty directory without the marker was not created by qrl: it is refused, whatever flags.
- A directory with the marker whose listed entries are all absent is claimed again.
- A directory with the marker and some of its entries present holds a run: it is refused unless
  overwriting, and overwriting removes exactly the entries the marker lists (plus qrl's own
  temporary files of them); anything else in the directory (a user's notes, plots) stays.
- A path that is a file, lies under a file or cannot be created is refused before anything is
  written.

Every refusal is a one-line `QrlInputError`.
"""

import datetime
import os
import shutil
from typing import Collection, Optional, Sequence

import qrl
from qrl import io
from qrl.errors import QrlInputError

MARKER_FILE = "qrl-workdir.json"

_TRAIN_OUTPUTS = ("config.json", "metrics.csv", "tb", "checkpoints", "results.json", "ptq")
RUN_OUTPUTS = {
    "train": _TRAIN_OUTPUTS,
    "demo": _TRAIN_OUTPUTS + ("learning_curve.png", "report.md"),
    "prune_offline": (
        "config.json", "masks.msgpack", "metrics.csv", "tb", "checkpoints", "results.json",
        "policy_csr_fp32.msgpack", "policy_csr_int8.msgpack",
    ),
    "actorq": ("config.json", "metrics.csv", "tb", "checkpoints", "results.json", "breakdown.png"),
}



def claim(workdir: str, kind: str, overwrite: bool = False,
          overwritable_kinds: Optional[Collection[str]] = None, hint: str = "pass --overwrite to replace them") -> None:
    """Makes `workdir` this `kind` of run's own, following the module's rules.

    With `overwrite`, a qrl workdir holding a run loses the entries its marker lists; when
    `overwritable_kinds` is given, only a run of one of those kinds may be replaced. `hint` ends
    the refusal of a workdir that holds a run (e.g. which flags would continue or replace it).
    """
    outputs = RUN_OUTPUTS[kind]
    check_path(workdir)
    marker = read_marker(workdir) if os.path.isdir(workdir) else None
    if marker is None and os.path.isdir(workdir) and os.listdir(workdir):
        raise QrlInputError(
            f"{workdir} is not empty and has no {MARKER_FILE}: qrl did not create it and will not write into it; "
            "pick a new or empty directory"
        )
    present = present_outputs(workdir, marker) if marker is not None else []
    if present:
        if not overwrite:
            raise QrlInputError(
                f"{workdir} already holds a qrl {marker['kind']} run ({', '.join(present)}); {hint}"
            )
        if overwritable_kinds is not None and marker["kind"] not in overwritable_kinds:
            raise QrlInputError(
                f"{workdir} holds a qrl {marker['kind']} run, not a {' or '.join(sorted(overwritable_kinds))} run: "
                "it is not replaced; pick another directory"
            )
        remove_outputs(workdir)
    _make_directory(workdir)
    write_marker(workdir, kind, outputs)


def check_path(path: str, flag: str = "--workdir", writable: bool = True) -> str:
    """Refuses, before anything is written, a directory path that is a file, lies under a file,
    or (when `writable`) sits below a directory this process may not create entries in. Returns
    the path's nearest existing ancestor (the path itself when it exists)."""
    if not path:
        raise QrlInputError(f"{flag} is required")
    absolute = os.path.abspath(path)
    if os.path.lexists(absolute) and not os.path.isdir(absolute):
        raise QrlInputError(f"{flag} {path} exists and is not a directory")
    ancestor = absolute
    while not os.path.lexists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        raise QrlInputError(f"{flag} {path} lies under {ancestor}, which is not a directory")
    if writable and not os.access(ancestor, os.W_OK | os.X_OK):
        raise QrlInputError(f"{flag} {path}: directory {ancestor} is not writable")
    return ancestor


def read_marker(workdir: str) -> Optional[dict]:
    """The marker of `workdir`, or None when it has none; a malformed marker is an input error."""
    path = os.path.join(workdir, MARKER_FILE)
    if not os.path.exists(path):
        return None
    marker = io.read_json(path)
    entries = marker.get("entries") if isinstance(marker, dict) else None
    if not isinstance(entries, list) or not all(isinstance(name, str) and _is_plain_name(name) for name in entries) \
            or marker.get("kind") not in RUN_OUTPUTS:
        raise QrlInputError(f"malformed {path}: expected a kind ({', '.join(sorted(RUN_OUTPUTS))}) and a list of "
                            "entry names")
    return marker


def require_kind(workdir: str, kinds: Collection[str], action: str) -> dict:
    """The marker of a qrl workdir of one of `kinds`; otherwise one line saying `action` needs one."""
    check_path(workdir)
    if not os.path.isdir(workdir):
        raise QrlInputError(f"{action}: workdir {workdir} does not exist")
    marker = read_marker(workdir)
    if marker is None:
        raise QrlInputError(f"{action}: {workdir} has no {MARKER_FILE}, so it holds no qrl run")
    if marker["kind"] not in kinds:
        raise QrlInputError(f"{action}: {workdir} holds a qrl {marker['kind']} run, not a {' or '.join(kinds)} run")
    return marker


def present_outputs(workdir: str, marker: dict) -> list[str]:
    """The entries the marker lists that exist in `workdir`, sorted."""
    return sorted(name for name in marker["entries"] if os.path.lexists(os.path.join(workdir, name)))


def remove_outputs(workdir: str) -> list[str]:
    """Deletes qrl's outputs in `workdir` (the marker's entries and their temporary files), keeping the
    marker and every other file; returns the names removed. A directory that is missing, or empty,
    has nothing to remove; a non-empty one without the marker is refused."""
    if not os.path.isdir(workdir):
        check_path(workdir)
        return []
    marker = read_marker(workdir)
    if marker is None:
        if os.listdir(workdir):
            raise QrlInputError(
                f"{workdir} is not empty and has no {MARKER_FILE}: qrl did not create it and will not delete in it"
            )
        return []
    # Only names this kind of run writes: a marker edited to list other files deletes none of them.
    listed = set(marker["entries"]) & set(RUN_OUTPUTS[marker["kind"]])
    removed = []
    for name in sorted(os.listdir(workdir)):
        if name in listed or io.temp_target(name) in listed:
            _remove(os.path.join(workdir, name))
            removed.append(name)
    return removed


def write_marker(workdir: str, kind: str, entries: Sequence[str]) -> None:
    """Writes `workdir`'s marker (atomically) naming `kind` and the `entries` qrl writes there."""
    io.atomic_write_json(os.path.join(workdir, MARKER_FILE), {
        "kind": kind,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "qrl_version": qrl.__version__,
        "entries": sorted(entries),
    })


def _make_directory(workdir: str) -> None:
    try:
        os.makedirs(workdir, exist_ok=True)
    except OSError as error:
        raise QrlInputError(f"cannot create workdir {workdir}: {error.strerror or error}") from error


def _is_plain_name(name: str) -> bool:
    """A top-level entry name: no separators, not `.` or `..`, not the marker itself."""
    return bool(name) and "/" not in name and os.sep not in name and name not in (".", "..", MARKER_FILE)


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.remove(path)
