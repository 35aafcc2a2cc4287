"""Writes step arrays in D4RL's HDF5 layout, atomically, so `d4rl.read_hdf5` reads them back exactly.

    write_d4rl_hdf5("halfcheetah-mine-v0.hdf5", arrays, {"env_id": "gym:HalfCheetah-v5"})

Float arrays are stored as float32, `terminals`/`timeouts` as bool; `metadata` values (scalars
or strings) become `metadata/<key>` datasets. The file is written to a temporary sibling and
renamed into place, so a reader never sees half a file.
"""

import os
import uuid
from typing import Any, Optional

import numpy as np

from qrl.datasets import d4rl
from qrl.errors import QrlInputError

STEP_KEYS = ("observations", "actions", "rewards", "terminals", "timeouts", "next_observations")


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
    temp_path = os.path.join(directory, f".{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")
    try:
        os.makedirs(directory, exist_ok=True)
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
