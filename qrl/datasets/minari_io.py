"""Minari datasets, written and read fully offline in qrl's D4RL step-array format.

    write_minari(arrays, root, "qrl/halfcheetah/medium-v0", "gym:HalfCheetah-v5",
                 {"ref_min_score": -280.2, "ref_max_score": 12135.0})
    arrays = read_minari("qrl/halfcheetah/medium-v0", root)   # same keys as d4rl.read_hdf5

Minari stores `<root>/<namespace>/<env>/<name>-vN/data/main_data.hdf5`, one group per episode
whose observations hold the T step observations plus the final next observation. The root is
the explicit `root`, else `MINARI_DATASETS_PATH`; never minari's default `~/.minari`, and
nothing is ever downloaded. Reference returns go in Minari's own `ref_min_score` /
`ref_max_score`; the remaining metadata is kept under `qrl_metadata`.

Datasets are data, never code: reading takes the episodes straight from the HDF5 file and the
metadata as plain JSON, so no environment is built from a stored `env_spec` (whose entry point
could name any callable). Writes are staged in a hidden sibling and renamed into place, and
dataset ids are checked to stay inside the root before anything touches the disk.
"""

import contextlib
import json
import os
import re
import shutil
import warnings
from typing import Any, Optional

import numpy as np

from qrl.datasets import d4rl
from qrl.datasets.writers import _step_arrays, remove_stale_temps
from qrl.io import temp_sibling
from qrl.errors import QrlInputError

ROOT_VARIABLE = "MINARI_DATASETS_PATH"
# Metadata keys that Minari itself defines; anything else goes under `qrl_metadata`.
MINARI_KEYS = ("ref_min_score", "ref_max_score", "algorithm_name", "author", "author_email",
               "code_permalink", "description")
# Minari's id form, narrowed to ASCII: (namespace/)*name-vN; no `.` or `..` component can match.
DATASET_ID = re.compile(r"[A-Za-z0-9_-]+(/[A-Za-z0-9_-]+)*-v[0-9]+")
NAMESPACE_FILE = "namespace_metadata.json"
MAIN_DATA_FILE = "main_data.hdf5"
EPISODE_KEYS = ("observations", "actions", "rewards", "terminations", "truncations")


def resolve_root(root=None) -> str:
    """The datasets root: `root`, else `$MINARI_DATASETS_PATH`, else a `QrlInputError`."""
    if root is None:
        root = os.environ.get(ROOT_VARIABLE)
    if not root:
        raise QrlInputError(f"no Minari datasets root: pass root= or set {ROOT_VARIABLE} "
                            "(qrl never uses ~/.minari and never downloads)")
    return os.path.abspath(os.fspath(root))


@contextlib.contextmanager
def _root_variable(root: str):
    """Points minari's path helpers at `root` for the duration of the block."""
    previous = os.environ.get(ROOT_VARIABLE)
    os.environ[ROOT_VARIABLE] = root
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(ROOT_VARIABLE, None)
        else:
            os.environ[ROOT_VARIABLE] = previous


def local_dataset_ids(root) -> list[str]:
    """Ids of the datasets under `root` (directories holding a `data/` folder), sorted."""
    root = os.fspath(root)
    ids = []
    for directory, subdirectories, _ in os.walk(root):
        subdirectories[:] = [name for name in subdirectories if not name.startswith(".")]
        if "data" in subdirectories and os.path.isfile(os.path.join(directory, "data", "metadata.json")):
            ids.append(os.path.relpath(directory, root).replace(os.sep, "/"))
            subdirectories.remove("data")
    return sorted(ids)


def _episode_slices(arrays: dict) -> list[tuple[int, int]]:
    """[start, stop) of each episode: ends at terminals | timeouts; trailing steps form a last,
    unfinished episode."""
    ends = np.flatnonzero(np.asarray(arrays["terminals"], bool) | np.asarray(arrays["timeouts"], bool))
    steps = len(arrays["rewards"])
    stops = list(ends + 1)
    if not stops or stops[-1] != steps:
        stops.append(steps)
    starts = [0, *stops[:-1]]
    return list(zip(starts, stops))


def _env_spec(env_id: str):
    """gymnasium's registered EnvSpec for `env_id` (our `gym:` prefix stripped), or None."""
    import gymnasium as gym

    name = env_id[len("gym:"):] if env_id.startswith("gym:") else env_id
    try:
        return gym.spec(name)
    except Exception:  # not a gymnasium id (dm_control, brax, ...): no spec, spaces only
        return None


def dataset_directory(root: str, dataset_id: str) -> str:
    """`<root>/<dataset_id>` after checking the id: slash-separated names of letters, digits, `_`
    and `-` ending in `-vN` (Minari's form; no `.`/`..`, no absolute path), whose resolved path
    lies inside `root`. Nothing touches the disk before this holds, so an id cannot reach
    outside the datasets root."""
    if not isinstance(dataset_id, str) or not DATASET_ID.fullmatch(dataset_id):
        raise QrlInputError(f"dataset id {dataset_id!r} is not a Minari id like namespace/name-v0 "
                            "(slash-separated names of letters, digits, _ and -)")
    directory = os.path.join(root, *dataset_id.split("/"))
    real_root = os.path.realpath(root)
    if os.path.commonpath([real_root, os.path.realpath(directory)]) != real_root:
        raise QrlInputError(f"dataset id {dataset_id!r} resolves outside the datasets root {root}")
    return directory


def write_minari(arrays: dict, root, dataset_id: str, env_id: str, metadata: Optional[dict] = None,
                 overwrite: bool = False):
    """Creates Minari dataset `dataset_id` under `root` (else `$MINARI_DATASETS_PATH`) from D4RL
    step arrays, offline. Episodes split at `terminals | timeouts`; each episode's final
    observation is `next_observations[last]`, or `observations[last + 1]` when the arrays have no
    next_observations. The dataset is built in a hidden sibling directory and renamed into
    place, so a killed write leaves no dataset that reads fail on; `overwrite` replaces an
    existing one only once the new one is complete. Returns the dataset's directory."""
    from minari.data_collector import EpisodeBuffer

    root = resolve_root(root)
    directory = dataset_directory(root, dataset_id)
    steps = _step_arrays(arrays, f"minari dataset {dataset_id}")
    metadata = dict(metadata or {})
    observations, count = steps["observations"], len(steps["rewards"])
    buffers = []
    for index, (start, stop) in enumerate(_episode_slices(steps)):
        last = stop - 1
        if "next_observations" in steps and not np.array_equal(steps["next_observations"][start:last],
                                                                observations[start + 1:stop]):
            bad = start + int(np.argmax(~np.all(steps["next_observations"][start:last] == observations[start + 1:stop],
                                                axis=tuple(range(1, observations.ndim)))))
            raise QrlInputError(f"minari dataset {dataset_id}: next_observations[{bad}] differs from observations"
                                f"[{bad + 1}] inside an episode; Minari stores one observation sequence per episode")
        if "next_observations" in steps:
            final = steps["next_observations"][last]
        elif last + 1 < count:
            final = observations[last + 1]
        else:
            raise QrlInputError(f"minari dataset {dataset_id}: the last episode's final observation is unknown "
                                "(the arrays have no next_observations)")
        buffers.append(EpisodeBuffer(
            id=index,
            observations=np.concatenate([observations[start:stop], final[None]]),
            actions=steps["actions"][start:stop],
            rewards=steps["rewards"][start:stop],
            terminations=steps["terminals"][start:stop],
            truncations=steps["timeouts"][start:stop],
            infos={},
        ))
    minari_fields = {key: metadata.pop(key) for key in MINARI_KEYS if key in metadata}
    if isinstance(minari_fields.get("author"), str):
        minari_fields["author"] = {minari_fields["author"]}
    if isinstance(minari_fields.get("author_email"), str):
        minari_fields["author_email"] = {minari_fields["author_email"]}
    for key in ("ref_min_score", "ref_max_score"):
        if key in minari_fields:
            minari_fields[key] = float(minari_fields[key])
    try:
        os.makedirs(os.path.dirname(directory), exist_ok=True)
        remove_stale_temps(directory)
    except OSError as error:
        raise QrlInputError(f"cannot write {directory}: {error.strerror or error}") from None
    if os.path.lexists(directory) and not overwrite:
        raise QrlInputError(f"minari dataset {dataset_id} already exists in {root}; pass overwrite to replace it")
    staging = temp_sibling(directory, "tmp")
    try:
        os.mkdir(staging)
        _create_dataset(staging, dataset_id, buffers, steps, env_id, metadata, minari_fields)
        _replace_directory(os.path.join(staging, *dataset_id.split("/")), directory)
        _adopt_namespace_files(staging, root, dataset_id)
    except OSError as error:
        raise QrlInputError(f"cannot write {directory}: {error.strerror or error}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return directory


def _create_dataset(root: str, dataset_id: str, buffers: list, steps: dict, env_id: str, metadata: dict,
                    minari_fields: dict) -> None:
    """Has minari write the dataset under `root` from its episode buffers, with the spaces given
    (env=None: minari would otherwise build the env) and qrl's metadata added."""
    import gymnasium as gym
    from minari.utils import create_dataset_from_buffers

    from qrl.io import to_json_compatible

    box = lambda values: gym.spaces.Box(-np.inf, np.inf, shape=values.shape[1:], dtype=np.float32)  # noqa: E731
    with _root_variable(root), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            dataset = create_dataset_from_buffers(
                dataset_id, buffers, env=None, observation_space=box(steps["observations"]),
                action_space=box(steps["actions"]),
                **{key: minari_fields[key] for key in ("algorithm_name", "author", "author_email",
                                                       "code_permalink", "description") if key in minari_fields})
        except ValueError as error:
            raise QrlInputError(f"minari dataset {dataset_id}: {str(error).splitlines()[0]}") from None
        extra: dict[str, Any] = {"qrl_env_id": env_id, "qrl_metadata": to_json_compatible(metadata)}
        for key in ("ref_min_score", "ref_max_score"):
            if key in minari_fields:
                extra[key] = minari_fields[key]
        spec = _env_spec(env_id)
        if spec is not None:
            extra["env_spec"] = spec.to_json()
        dataset.storage.update_metadata(extra)


def _replace_directory(new: str, directory: str) -> None:
    """Renames `new` to `directory`; an existing `directory` is renamed aside first, put back if
    the rename fails, and deleted once the new one is in place."""
    if not os.path.lexists(directory):
        os.rename(new, directory)
        return
    aside = temp_sibling(directory, "old")
    os.rename(directory, aside)
    try:
        os.rename(new, directory)
    except BaseException:
        os.rename(aside, directory)
        raise
    shutil.rmtree(aside, ignore_errors=True)


def _adopt_namespace_files(staging: str, root: str, dataset_id: str) -> None:
    """Moves the namespace metadata files minari wrote in `staging` to `root` where `root` has
    none, so minari's namespace listing sees the new dataset's namespaces."""
    parts = dataset_id.split("/")[:-1]
    for depth in range(1, len(parts) + 1):
        source = os.path.join(staging, *parts[:depth], NAMESPACE_FILE)
        target = os.path.join(root, *parts[:depth], NAMESPACE_FILE)
        if os.path.isfile(source) and not os.path.exists(target):
            os.replace(source, target)


def read_minari(dataset_id: str, root=None) -> dict[str, Any]:
    """Reads Minari dataset `dataset_id` from `root` (else `$MINARI_DATASETS_PATH`) as D4RL step
    arrays: observations, actions, rewards (float32), terminals (from terminations), timeouts
    (from truncations), next_observations, and a `metadata` dict (env_id, reference scores,
    Minari's author fields, and what `write_minari` kept). Never downloads."""
    root = resolve_root(root)
    directory = dataset_directory(root, dataset_id)
    if not is_minari_directory(directory):
        local = local_dataset_ids(root) if os.path.isdir(root) else []
        raise QrlInputError(f"no Minari dataset {dataset_id!r} under {root}; local datasets: "
                            f"{', '.join(local) or 'none'}")
    return read_minari_directory(directory, dataset_id)


def is_minari_directory(path) -> bool:
    """Whether `path` is one Minari dataset's directory (it holds `data/metadata.json`)."""
    return os.path.isfile(os.path.join(os.fspath(path), "data", "metadata.json"))


def read_minari_directory(directory, dataset_id: Optional[str] = None) -> dict[str, Any]:
    """`read_minari` for a dataset's own directory (`<root>/<id>`), wherever it lies.

    The episodes are read straight from `data/main_data.hdf5` with h5py and `metadata.json` is
    read as plain JSON: no environment is ever built from the stored `env_spec` (its
    entry point could name any callable), and no stored space is deserialized. Datasets whose
    observations or actions are not flat arrays (dict, tuple, text or JPEG-encoded spaces) or
    that use another storage format are refused with one line."""
    directory = os.fspath(directory)
    if not is_minari_directory(directory):
        raise QrlInputError(f"{directory}: not a Minari dataset directory (no data/metadata.json)")
    raw = _read_metadata(os.path.join(directory, "data", "metadata.json"))
    dataset_id = dataset_id or (raw.get("dataset_id") if isinstance(raw.get("dataset_id"), str) else None) or directory
    where = f"minari dataset {dataset_id}"
    if raw.get("data_format", "hdf5") != "hdf5":
        raise QrlInputError(f"{where}: stored as {raw.get('data_format')!r}; qrl reads Minari's hdf5 format only")
    for key in ("observation_space", "action_space"):
        _check_space_type(where, key, raw.get(key))
    episodes = _read_episodes(os.path.join(directory, "data", MAIN_DATA_FILE), where)
    if not episodes:
        raise QrlInputError(f"Minari dataset {dataset_id!r} in {directory} holds no episodes")
    arrays: dict[str, Any] = {
        "observations": np.concatenate([episode["observations"][:-1] for episode in episodes]),
        "next_observations": np.concatenate([episode["observations"][1:] for episode in episodes]),
        "actions": np.concatenate([episode["actions"] for episode in episodes]),
        "rewards": np.concatenate([episode["rewards"] for episode in episodes]),
        "terminals": np.concatenate([episode["terminations"] for episode in episodes]),
        "timeouts": np.concatenate([episode["truncations"] for episode in episodes]),
    }
    for key in ("observations", "next_observations", "actions", "rewards"):
        arrays[key] = arrays[key].astype(np.float32)
    for key in ("terminals", "timeouts"):
        arrays[key] = arrays[key].astype(bool)
    d4rl._validate(where, arrays)
    qrl_metadata = raw.get("qrl_metadata", {})
    metadata = {**(qrl_metadata if isinstance(qrl_metadata, dict) else {}),
                "dataset_id": raw.get("dataset_id", dataset_id), "env_id": _env_id(raw)}
    for key in MINARI_KEYS:
        if key in raw:
            value = raw[key]
            metadata[key] = ", ".join(sorted(map(str, value))) if isinstance(value, list) else value
    arrays["metadata"] = metadata
    return arrays


def _read_metadata(path: str) -> dict:
    """`metadata.json` as a dict, or one `QrlInputError` line."""
    try:
        with open(path, encoding="utf-8") as handle:
            raw = json.load(handle)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise QrlInputError(f"{path}: not readable JSON ({str(error).splitlines()[0] if str(error) else error})") from None
    if not isinstance(raw, dict):
        raise QrlInputError(f"{path}: not a JSON object")
    return raw


def _check_space_type(where: str, key: str, serialized: Any) -> None:
    """Refuses a stored space that is not a Box (dict, tuple, discrete, text ...). Only its JSON
    `type` is looked at; the space itself is never deserialized. An absent space is fine: the
    shapes come from the data."""
    if serialized is None:
        return
    try:
        space = json.loads(serialized) if isinstance(serialized, str) else serialized
    except (json.JSONDecodeError, RecursionError):
        raise QrlInputError(f"{where}: metadata {key} is not valid JSON") from None
    kind = space.get("type") if isinstance(space, dict) else None
    if kind != "Box":
        raise QrlInputError(f"{where}: {key} of type {kind!r} is not supported; qrl reads flat Box spaces only")


def _env_id(raw: dict) -> Optional[str]:
    """qrl's own `qrl_env_id` string, else None. The stored `env_spec` is never used: its id has
    no qrl family and its entry point could name any callable."""
    env_id = raw.get("qrl_env_id")
    return env_id if isinstance(env_id, str) and env_id else None


def _read_episodes(path: str, where: str) -> list[dict]:
    """The `episode_<i>` groups of a Minari HDF5 file in index order, each as numpy arrays of
    EPISODE_KEYS; observations must hold one row more than the steps. Damaged files and
    layouts qrl does not read (dict/tuple observations stored as groups, encoded images) give
    one `QrlInputError` line."""
    import h5py

    if not os.path.isfile(path):
        raise QrlInputError(f"{where}: no data file {path}")
    episodes = []
    with d4rl.hdf5_reading(path) as handle:
        names = {}
        for name in handle.keys():
            match = re.fullmatch(r"episode_([0-9]+)", name)
            if match is None:
                raise QrlInputError(f"{path}: unexpected entry {name!r} (a Minari file holds episode_<i> groups)")
            names[int(match.group(1))] = name
        if sorted(names) != list(range(len(names))):
            raise QrlInputError(f"{path}: episode groups are not numbered 0..{len(names) - 1}")
        for index in range(len(names)):
            group = handle[names[index]]
            if not isinstance(group, h5py.Group):
                raise QrlInputError(f"{path}: {names[index]} is not a group")
            episode = {}
            for key in EPISODE_KEYS:
                if key not in group:
                    raise QrlInputError(f"{path}: {names[index]} has no {key}")
                item = group[key]
                if not isinstance(item, h5py.Dataset):
                    raise QrlInputError(f"{where}: {names[index]}/{key} is a group (a dict or tuple space); "
                                        "qrl reads flat Box observations and actions only")
                if item.dtype.kind not in "biuf":
                    raise QrlInputError(f"{where}: {names[index]}/{key} holds {item.dtype} values, not numbers "
                                        "(text or encoded images are not supported)")
                episode[key] = np.asarray(item[()])
            _check_episode(where, names[index], episode, episodes[0] if episodes else episode)
            episodes.append(episode)
    return episodes


def _check_episode(where: str, name: str, episode: dict, first: dict) -> None:
    """One episode's arrays line up: 2-D observations (one row more than the steps) and actions,
    1-D rewards and flags of the step count, and feature sizes those of the first episode."""
    ranks = {"observations": 2, "actions": 2, "rewards": 1, "terminations": 1, "truncations": 1}
    for key, rank in ranks.items():
        if episode[key].ndim != rank:
            raise QrlInputError(f"{where}: {name}/{key} must be {rank}-D, got shape {episode[key].shape}")
    steps = len(episode["rewards"])
    rows = {key: steps + (key == "observations") for key in ranks}
    for key, expected in rows.items():
        if len(episode[key]) != expected:
            raise QrlInputError(f"{where}: {name}/{key} has {len(episode[key])} rows, expected {expected} "
                                f"({steps} steps)")
    for key in ("observations", "actions"):
        if episode[key].shape[1:] != first[key].shape[1:]:
            raise QrlInputError(f"{where}: {name}/{key} has shape {episode[key].shape}; the first episode's "
                                f"rows have shape {first[key].shape[1:]}")
