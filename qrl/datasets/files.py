"""Offline datasets by path, whatever their format, and the reference returns that normalize them.

    arrays = read_steps("data/hopper-medium.hdf5")        # D4RL HDF5 file
    arrays = read_steps("data/minari/qrl/hopper/medium-v0")  # a Minari dataset's directory
    reference, source = reference_returns("data/hopper-medium.hdf5", arrays["metadata"])
"""

import os
from typing import Any, Optional

from qrl.datasets import d4rl
from qrl.datasets.scores import d4rl_reference
from qrl.errors import QrlInputError


def dataset_format(path) -> str:
    """"minari" for a Minari dataset directory, "d4rl" for a file (read as D4RL HDF5)."""
    from qrl.datasets import minari_io

    path = os.fspath(path)
    if os.path.isdir(path):
        if minari_io.is_minari_directory(path):
            return "minari"
        raise QrlInputError(f"{path}: a directory but not a Minari dataset (no data/metadata.json)")
    if not os.path.exists(path):
        raise QrlInputError(f"{path}: no such dataset file or directory")
    return "d4rl"


def read_steps(path) -> dict[str, Any]:
    """Validated D4RL step arrays and a `metadata` dict from a D4RL HDF5 file or a Minari directory."""
    if dataset_format(path) == "minari":
        from qrl.datasets import minari_io

        return minari_io.read_minari_directory(path)
    return d4rl.read_hdf5(os.fspath(path))


def env_id(metadata: Optional[dict]) -> Optional[str]:
    """The environment id a dataset names (`env_id`, else D4RL's `env`), or None."""
    for key in ("env_id", "env"):
        value = d4rl.metadata_value(metadata, key)
        if value:
            return str(value)
    return None


def reference_returns(path, metadata: Optional[dict]) -> tuple[Optional[tuple[float, float]], Optional[str]]:
    """((random, expert) returns, where they came from): the dataset's own `ref_min_score` /
    `ref_max_score` (what qrl and Minari store), else D4RL's for its env or file name."""
    values = [d4rl.metadata_value(metadata, key) for key in ("ref_min_score", "ref_max_score")]
    if all(value is not None for value in values):
        return (float(values[0]), float(values[1])), "the dataset's metadata"
    for name in (env_id(metadata), os.path.basename(os.fspath(path))):
        if name and d4rl_reference(name) is not None:
            return d4rl_reference(name), "D4RL's reference scores"
    return None, None
