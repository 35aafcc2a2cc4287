"""Writes step arrays in D4RL's HDF5 layout, atomically, so `d4rl.read_hdf5` reads them back exactly.

    write_d4rl_hdf5("halfcheetah-mine-v0.hdf5", arrays, {"env_id": "gym:HalfCheetah-v5"})

Float arrays are stored as float32, `terminals`/`timeouts` as bool; `metadata` values (scalars
or strings) become `metadata/<key>` datasets. The file is written to a temporary sibling and
renamed into place, so a reader never sees half a file; the temporary files of killed writes
are removed by the next write to the same path.
"""

import os
import shutil
from typing import Any, Optional

import numpy as np

from qrl.datasets import d4rl
from qrl.errors import QrlInputError
from qrl.io import temp_sibling, temp_target

STEP_KEYS = ("observations", "actions", "rewards", "terminals", "timeouts", "next_observations")


def remove_stale_temps(path: str) -> list[str]:
    """Removes what killed writes to `path` left beside it: files or directories named exactly
    as `temp_sibling` names them for `path`, nothing else. When `path` itself is gone and an
    `old` sibling survived (a write killed between its two renames), the newest `old` sibling
    is renamed back to `path` first. Returns the removed paths."""
    directory, name = os.path.split(os.path.abspath(path))
    try:
        entries = [entry for entry in os.listdir(directory) if temp_target(entry) == name]
    except FileNotFoundError:
        return []
    olds = sorted((entry for entry in entries if entry.endswith(".old")),
                  key=lambda entry: os.lstat(os.path.join(directory, entry)).st_mtime_ns)
    if olds and not os.path.lexists(path):
        os.rename(os.path.join(directory, olds.pop()), path)
        entries = [entry for entry in entries if os.path.lexists(os.path.join(directory, entry))]
    removed = []
    for entry in entries:
        stale = os.path.join(directory, entry)
        if os.path.isdir(stale) and not os.path.islink(stale):
            shutil.rmtree(stale, ignore_errors=True)
        else:
            os.remove(stale)
        removed.append(stale)
    return removed


def _step_arrays(arrays: dict, where: str) -> dict[str, np.ndarray]:
    """The step arrays to store (float32 / bool), validated as `read_hdf5` would."""
    missing = [key for key in (*d4rl.REQUIRED_KEYS, "timeouts") if key not in arrays]
    if missing:
        raise QrlInputError(f"{where}: missing step array(s) {', '.join(missing)}")
    out = {}
    for key in STEP_KEYS:
        if key not in arrays:
            continue
        values = np.asarray(arrays[key])
        if key in d4rl.FLAG_KEYS:
            if values.dtype != bool and not np.isin(values, (0, 1)).all():
                raise QrlInputError(f"{where}: {key} must hold 0/1 flags")
            out[key] = values.astype(bool)
        else:
            out[key] = values.astype(np.float32)
    d4rl._validate(where, out)
    return out


def _metadata_value(key: str, value: Any, where: str) -> Any:
    if isinstance(value, (str, bytes, bool, int, float, np.generic)):
        return value
    array = np.asarray(value)
    if array.dtype.kind in "biuf":
        return array
    raise QrlInputError(f"{where}: metadata {key!r} must be a scalar, string or numeric array, got {type(value).__name__}")


def write_d4rl_hdf5(path, arrays: dict, metadata: Optional[dict] = None) -> str:
    """Writes `arrays` (observations, actions, rewards, terminals, timeouts, optional
    next_observations) and `metadata` (scalars/strings) to `path` in D4RL's layout, atomically.
    Returns the path. Bad inputs or an unwritable location raise `QrlInputError`."""
    import h5py

    path = os.fspath(path)
    steps = _step_arrays(arrays, path)
    values = {key: _metadata_value(key, value, path) for key, value in (metadata or {}).items()}
    directory = os.path.dirname(os.path.abspath(path))
    temp_path = temp_sibling(path)
    try:
        os.makedirs(directory, exist_ok=True)
        remove_stale_temps(path)
        with h5py.File(temp_path, "x") as handle:
            for key, array in steps.items():
                handle.create_dataset(key, data=array)
            for key, value in values.items():
                handle.create_dataset(f"metadata/{key}", data=value)
        with open(temp_path, "rb+") as flushed:
            os.fsync(flushed.fileno())
        os.replace(temp_path, path)
    except BaseException as error:
        try:
            os.remove(temp_path)
        except OSError:
            pass
        if isinstance(error, OSError):
            raise QrlInputError(f"cannot write {path}: {error.strerror or error}") from error
        raise
    return path
