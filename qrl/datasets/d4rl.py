"""D4RL's HDF5 dataset format, read without d4rl (which needs the retired mujoco-py).

A D4RL file holds step-aligned arrays over N steps: `observations [N, D]`, `actions [N, A]`,
`rewards [N]`, `terminals [N]` and `timeouts [N]` (True where an episode was truncated), and
optionally `next_observations [N, D]`, `infos/*` and `metadata/*`. `read_hdf5` validates and
loads them (the file is opened read-only); `qlearning_arrays` is D4RL's `qlearning_dataset`
with its exact semantics; `episode_returns` splits the steps into episodes.
"""

import contextlib
import os
from typing import Any, Optional

import numpy as np

from qrl.errors import QrlInputError

REQUIRED_KEYS = ("observations", "actions", "rewards", "terminals")
FLOAT_KEYS = ("observations", "actions", "rewards", "next_observations")
FLAG_KEYS = ("terminals", "timeouts")
DEFAULT_MAX_EPISODE_STEPS = 1000  # D4RL's locomotion time limit, used when a file has no timeouts


def _fail(path: str, problem: str) -> QrlInputError:
    return QrlInputError(f"{path}: {problem}")


def _read_group(group) -> dict:
    """A group's datasets (recursively) as numpy arrays / python scalars."""
    import h5py

    values = {}
    for key, item in group.items():
        if isinstance(item, h5py.Group):
            values[key] = _read_group(item)
        else:
            _check_global_heap(item)
            values[key] = item[()]
    for key, value in group.attrs.items():
        values.setdefault(key, value)
    return values


GLOBAL_HEAP_MIN_SIZE = 4096  # HDF5's smallest global heap collection (H5HG_MINSIZE)


def _check_global_heap(dataset) -> None:
    """Refuses a variable-length dataset whose global heap collections are damaged. HDF5 loops
    forever decoding a collection whose free-space object has size 0 (zeroed bytes do that), so
    the collections a contiguous dataset's elements point at are walked first, as HDF5 walks
    them. (Chunked or compact variable-length datasets are read unchecked.)"""
    import h5py

    type_id = dataset.id.get_type()
    variable = isinstance(type_id, h5py.h5t.TypeVlenID) or (
        isinstance(type_id, h5py.h5t.TypeStringID) and type_id.is_variable_str())
    offset = dataset.id.get_offset() if variable else None
    if offset is None:
        return
    address_size, length_size = dataset.file.id.get_create_plist().get_sizes()
    base = dataset.file.userblock_size
    element = np.dtype([("length", "<u4"), ("collection", f"<u{address_size}"), ("index", "<u4")])
    path = dataset.file.filename
    with open(path, "rb") as raw:
        stored = _read_at(raw, base + offset, dataset.id.get_storage_size())
        elements = np.frombuffer(stored, dtype=element, count=len(stored) // element.itemsize)
        for collection in np.unique(elements["collection"][elements["length"] > 0]):
            if not _sound_collection(raw, base + int(collection), length_size):
                raise QrlInputError(f"corrupt HDF5 file {path}: {dataset.name} points at a damaged global heap")


def _read_at(raw, offset: int, count: int) -> bytes:
    """Up to `count` bytes of the open file `raw` from `offset`, never past its end (damaged
    sizes can be huge)."""
    size = os.fstat(raw.fileno()).st_size
    raw.seek(min(offset, size))
    return raw.read(max(0, min(count, size - offset)))


def _sound_collection(raw, offset: int, length_size: int) -> bool:
    """Whether the global heap collection at `offset` in the open file `raw` has the `GCOL`
    signature, a plausible size, and objects that tile it exactly."""
    header = _read_at(raw, offset, 8 + length_size)
    size = int.from_bytes(header[8:], "little") if len(header) == 8 + length_size else 0
    if header[:4] != b"GCOL" or size < GLOBAL_HEAP_MIN_SIZE:
        return False
    body = header + _read_at(raw, offset + len(header), size - len(header))
    if len(body) != size:
        return False
    object_header = 8 + length_size
    position = len(header)
    while position + object_header <= size:
        index = int.from_bytes(body[position:position + 2], "little")
        length = int.from_bytes(body[position + 8:position + object_header], "little")
        need = length if index == 0 else object_header + (length + 7) // 8 * 8
        if need < object_header or position + need > size:
            return False
        position += need
    return True


@contextlib.contextmanager
def hdf5_reading(path: str):
    """Opens `path` read-only for the block; any error HDF5 raises inside it (open, key listing,
    dataset or attribute reads) becomes one `QrlInputError` line naming the file. A damaged file
    can fail anywhere in the library and with any exception type, so the block should hold
    reads only; `QrlInputError`s raised in it pass through unchanged."""
    import h5py

    try:
        handle = h5py.File(path, "r")
    except Exception as error:
        raise _fail(path, f"not an HDF5 file or a corrupt one ({_first_line(error)})") from None
    try:
        with handle:
            yield handle
    except QrlInputError:
        raise
    except Exception as error:
        raise QrlInputError(f"corrupt HDF5 file {path}: {type(error).__name__}: {_first_line(error)}") from None


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else "no details"


def read_hdf5(path: str) -> dict[str, Any]:
    """Loads and validates a D4RL HDF5 file: a dict of the step arrays (flags as bool), plus
    `infos` and `metadata` dicts when present. Problems raise one `QrlInputError` line naming
    the file: missing, not HDF5, damaged inside, a missing key, arrays of different lengths, no
    steps, NaN/inf, wrong dtypes or ranks."""
    import h5py

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise _fail(path, "no such file")
    with hdf5_reading(path) as handle:
        missing = [key for key in REQUIRED_KEYS if key not in handle]
        if missing:
            raise _fail(path, f"missing dataset key(s) {', '.join(missing)}; a D4RL file has "
                        f"{', '.join(REQUIRED_KEYS)}, timeouts and optionally next_observations")
        keys = [key for key in (*REQUIRED_KEYS, "timeouts", "next_observations") if key in handle]
        groups = [key for key in keys if not isinstance(handle[key], h5py.Dataset)]
        if groups:
            raise _fail(path, f"{', '.join(groups)} must be dataset(s), not groups")
        arrays = {key: np.asarray(handle[key][()]) for key in keys}
        extras = {group: _read_group(handle[group]) for group in ("infos", "metadata")
                  if group in handle and isinstance(handle[group], h5py.Group)}
        extras["metadata"] = {**extras.get("metadata", {}), **{k: v for k, v in handle.attrs.items()}}
    _validate(path, arrays)
    for key in FLAG_KEYS:
        if key in arrays:
            arrays[key] = arrays[key].astype(bool)
    return {**arrays, **extras}


def _validate(path: str, arrays: dict) -> None:
    steps = len(arrays["rewards"]) if np.ndim(arrays["rewards"]) else 0
    if steps == 0:
        raise _fail(path, "the dataset holds no steps")
    for key, values in arrays.items():
        if values.ndim == 0 or len(values) != steps:
            raise _fail(path, f"{key} has {len(values) if values.ndim else 0} rows but rewards has {steps}")
        expected_rank = 1 if key in ("rewards", *FLAG_KEYS) else 2
        if values.ndim != expected_rank:
            raise _fail(path, f"{key} must be {expected_rank}-D, got shape {values.shape}")
        if key in FLOAT_KEYS:
            if not np.issubdtype(values.dtype, np.floating):
                raise _fail(path, f"{key} must hold floats, got {values.dtype}")
            if not np.all(np.isfinite(values)):
                bad = int(np.argmax(~np.isfinite(values).reshape(steps, -1).all(axis=1)))
                raise _fail(path, f"{key} has NaN or inf values (first at row {bad})")
        elif key in FLAG_KEYS:
            if not (values.dtype == bool or np.issubdtype(values.dtype, np.number)):
                raise _fail(path, f"{key} must hold 0/1 flags, got {values.dtype}")
            if values.dtype != bool and not np.isin(values, (0, 1)).all():
                raise _fail(path, f"{key} must hold 0/1 flags, got other values")
    if "next_observations" in arrays and arrays["next_observations"].shape != arrays["observations"].shape:
        raise _fail(path, f"next_observations has shape {arrays['next_observations'].shape}, "
                    f"observations {arrays['observations'].shape}")


def _episode_ends(arrays: dict, max_episode_steps: int) -> np.ndarray:
    """bool `[N]`: where an episode ends (terminal or timeout; without timeouts, every
    `max_episode_steps` steps since the last end, as D4RL counts)."""
    terminals = arrays["terminals"]
    if "timeouts" in arrays:
        return terminals | arrays["timeouts"]
    ends = np.zeros_like(terminals)
    episode_step = 0
    for index, terminal in enumerate(terminals):
        if terminal or episode_step == max_episode_steps - 1:
            ends[index], episode_step = True, 0
        else:
            episode_step += 1
    return ends


def _final_steps(arrays: dict, terminate_on_end: bool, max_episode_steps: int) -> np.ndarray:
    """bool `[N - 1]`: D4RL's `final_timestep` per step. With `timeouts`, the flags; without,
    D4RL's own step counter, quirks included (it restarts at 0 on a skipped step, at 1 after a
    kept terminal or final step)."""
    if "timeouts" in arrays:
        return arrays["timeouts"][:-1]
    final = np.zeros(len(arrays["rewards"]) - 1, bool)
    episode_step = 0
    for index, terminal in enumerate(arrays["terminals"][:-1]):
        final[index] = episode_step == max_episode_steps - 1
        if final[index] and not terminate_on_end:
            episode_step = 0
            continue
        if terminal or final[index]:
            episode_step = 0
        episode_step += 1
    return final


def qlearning_arrays(arrays: dict, terminate_on_end: bool = False,
                     max_episode_steps: int = DEFAULT_MAX_EPISODE_STEPS) -> dict[str, np.ndarray]:
    """D4RL's `qlearning_dataset`: transitions `(observations, actions, rewards, terminals,
    next_observations)` over steps 0..N-2. `next_observations[i]` is the file's
    `next_observations[i]` if it has them, else `observations[i + 1]`; a step flagged by
    `timeouts` (without timeouts: the `max_episode_steps`-th step of an episode) is dropped
    unless `terminate_on_end`; terminals are kept (learners use them as discounts of 0)."""
    steps = len(arrays["rewards"])
    indices = np.arange(steps - 1)
    if not terminate_on_end:
        indices = indices[~_final_steps(arrays, terminate_on_end, max_episode_steps)]
    if "next_observations" in arrays:
        next_observations = arrays["next_observations"][indices]
    else:
        next_observations = arrays["observations"][indices + 1]
    return {
        "observations": arrays["observations"][indices].astype(np.float32),
        "actions": arrays["actions"][indices].astype(np.float32),
        "rewards": arrays["rewards"][indices].astype(np.float32),
        "terminals": arrays["terminals"][indices].astype(bool),
        "next_observations": next_observations.astype(np.float32),
    }


def episode_returns(arrays: dict, max_episode_steps: int = DEFAULT_MAX_EPISODE_STEPS) -> tuple[np.ndarray, np.ndarray]:
    """Undiscounted returns and lengths of the episodes in the file, in order; steps after the
    last episode end form a final (unfinished) episode."""
    ends = np.flatnonzero(_episode_ends(arrays, max_episode_steps))
    steps = len(arrays["rewards"])
    boundaries = list(ends + 1)
    if not boundaries or boundaries[-1] != steps:
        boundaries.append(steps)
    starts = np.concatenate([[0], boundaries[:-1]])
    cumulative = np.concatenate([[0.0], np.cumsum(arrays["rewards"], dtype=np.float64)])
    boundaries = np.asarray(boundaries)
    return cumulative[boundaries] - cumulative[starts], boundaries - starts


def metadata_value(metadata: Optional[dict], key: str) -> Any:
    """`metadata[key]` as a python value (bytes decoded), or None."""
    if not metadata or key not in metadata:
        return None
    value = metadata[key]
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, np.generic):
        return value.item()
    return value
