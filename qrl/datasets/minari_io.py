"""Minari datasets, written and read fully offline in qrl's D4RL step-array format.

    write_minari(arrays, root, "qrl/halfcheetah/medium-v0", "gym:HalfCheetah-v5",
                 {"ref_min_score": -280.2, "ref_max_score": 12135.0})
    arrays = read_minari("qrl/halfcheetah/medium-v0", root)   # same keys as d4rl.read_hdf5

Minari stores `<root>/<namespace>/<env>/<name>-vN/data/main_data.hdf5`, one group per episode
whose observations hold the T step observations plus the final next observation. The root is
the explicit `root`, else `MINARI_DATASETS_PATH`; never minari's default `~/.minari`, and
nothing is ever downloaded. Reference returns go in Minari's own `ref_min_score` /
`ref_max_score`; the remaining metadata is kept under `qrl_metadata`.
"""

import contextlib
import json
import os
import shutil
import warnings
from typing import Any, Optional

import numpy as np

from qrl.errors import QrlInputError

ROOT_VARIABLE = "MINARI_DATASETS_PATH"
# Metadata keys that Minari itself defines; anything else goes under `qrl_metadata`.
MINARI_KEYS = ("ref_min_score", "ref_max_score", "algorithm_name", "author", "author_email",
               "code_permalink", "description")


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


def write_minari(arrays: dict, root, dataset_id: str, env_id: str, metadata: Optional[dict] = None):
    """Creates Minari dataset `dataset_id` under `root` (else `$MINARI_DATASETS_PATH`) from D4RL
    step arrays, offline. Episodes split at `terminals | timeouts`; each episode's final
    observation is `next_observations[last]`, or `observations[last + 1]` when the arrays have no
    next_observations. Returns the dataset's directory."""
    import gymnasium as gym
    from minari.data_collector import EpisodeBuffer
    from minari.utils import create_dataset_from_buffers

    from qrl.datasets.writers import _step_arrays
    from qrl.io import to_json_compatible

    root = resolve_root(root)
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
    box = lambda values: gym.spaces.Box(-np.inf, np.inf, shape=values.shape[1:], dtype=np.float32)  # noqa: E731
    minari_fields = {key: metadata.pop(key) for key in MINARI_KEYS if key in metadata}
    if isinstance(minari_fields.get("author"), str):
        minari_fields["author"] = {minari_fields["author"]}
    if isinstance(minari_fields.get("author_email"), str):
        minari_fields["author_email"] = {minari_fields["author_email"]}
    for key in ("ref_min_score", "ref_max_score"):
        if key in minari_fields:
            minari_fields[key] = float(minari_fields[key])
    spec = _env_spec(env_id)
    directory = os.path.join(root, dataset_id)
    existed = os.path.exists(directory)
    with _root_variable(root), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            # env=None: minari would gym.make the env (and roll out a random policy for the
            # reference scores); the spaces are given and the spec/scores are added below.
            dataset = create_dataset_from_buffers(
                dataset_id, buffers, env=None, observation_space=box(observations),
                action_space=box(steps["actions"]),
                **{key: minari_fields[key] for key in ("algorithm_name", "author", "author_email",
                                                       "code_permalink", "description") if key in minari_fields})
        except BaseException as error:
            if not existed:  # leave no half-written dataset behind
                shutil.rmtree(directory, ignore_errors=True)
            if isinstance(error, ValueError):
                raise QrlInputError(f"minari dataset {dataset_id}: {str(error).splitlines()[0]}") from None
            raise
        extra: dict[str, Any] = {"qrl_env_id": env_id,
                                 "qrl_metadata": to_json_compatible(metadata)}
        for key in ("ref_min_score", "ref_max_score"):
            if key in minari_fields:
                extra[key] = minari_fields[key]
        if spec is not None:
            extra["env_spec"] = spec.to_json()
        dataset.storage.update_metadata(extra)
    return directory


def read_minari(dataset_id: str, root=None) -> dict[str, Any]:
    """Reads Minari dataset `dataset_id` from `root` (else `$MINARI_DATASETS_PATH`) as D4RL step
    arrays: observations, actions, rewards (float32), terminals (from terminations), timeouts
    (from truncations), next_observations, and a `metadata` dict (env_id, reference scores,
    Minari's author fields, and what `write_minari` kept). Never downloads."""
    root = resolve_root(root)
    data_path = os.path.join(root, dataset_id, "data")
    if not os.path.isfile(os.path.join(data_path, "metadata.json")):
        local = local_dataset_ids(root) if os.path.isdir(root) else []
        raise QrlInputError(f"no Minari dataset {dataset_id!r} under {root}; local datasets: "
                            f"{', '.join(local) or 'none'}")
    return read_minari_directory(os.path.join(root, dataset_id), dataset_id)


def is_minari_directory(path) -> bool:
    """Whether `path` is one Minari dataset's directory (it holds `data/metadata.json`)."""
    return os.path.isfile(os.path.join(os.fspath(path), "data", "metadata.json"))


def read_minari_directory(directory, dataset_id: Optional[str] = None) -> dict[str, Any]:
    """`read_minari` for a dataset's own directory (`<root>/<id>`), wherever it lies."""
    from minari.dataset.minari_dataset import MinariDataset

    directory = os.fspath(directory)
    data_path = os.path.join(directory, "data")
    if not is_minari_directory(directory):
        raise QrlInputError(f"{directory}: not a Minari dataset directory (no data/metadata.json)")
    with open(os.path.join(data_path, "metadata.json")) as handle:
        raw = json.load(handle)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dataset = MinariDataset(data_path)
    parts: dict[str, list] = {key: [] for key in ("observations", "next_observations", "actions", "rewards",
                                                  "terminals", "timeouts")}
    for episode in dataset.iterate_episodes():
        episode_observations = np.asarray(episode.observations)
        parts["observations"].append(episode_observations[:-1])
        parts["next_observations"].append(episode_observations[1:])
        parts["actions"].append(np.asarray(episode.actions))
        parts["rewards"].append(np.asarray(episode.rewards))
        parts["terminals"].append(np.asarray(episode.terminations))
        parts["timeouts"].append(np.asarray(episode.truncations))
    dataset_id = dataset_id or raw.get("dataset_id") or directory
    if not parts["rewards"]:
        raise QrlInputError(f"Minari dataset {dataset_id!r} in {directory} holds no episodes")
    arrays: dict[str, Any] = {key: np.concatenate(values) for key, values in parts.items()}
    for key in ("observations", "next_observations", "actions", "rewards"):
        arrays[key] = arrays[key].astype(np.float32)
    for key in ("terminals", "timeouts"):
        arrays[key] = arrays[key].astype(bool)
    from qrl.datasets import d4rl

    d4rl._validate(f"minari dataset {dataset_id}", arrays)
    env_id = raw.get("qrl_env_id")
    if env_id is None and raw.get("env_spec"):
        env_id = json.loads(raw["env_spec"]).get("id")
    metadata = {**raw.get("qrl_metadata", {}), "dataset_id": raw.get("dataset_id", dataset_id), "env_id": env_id}
    for key in MINARI_KEYS:
        if key in raw:
            value = raw[key]
            metadata[key] = ", ".join(sorted(value)) if key in ("author", "author_email") else value
    arrays["metadata"] = metadata
    return arrays
