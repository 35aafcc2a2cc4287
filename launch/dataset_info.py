"""Inspect an offline dataset file: format, environment, transitions, episodes, returns (raw and
normalized), observation and action ranges. Validation errors are one line and exit status 2.

    python -m launch.dataset_info --dataset=data/halfcheetah-medium-v2.hdf5
"""

import os

import numpy as np
from absl import flags

from launch import common
from qrl.datasets import d4rl, d4rl_reference, normalized_score
from qrl.errors import QrlInputError

FLAGS = flags.FLAGS
flags.DEFINE_string("dataset", None, "Path to a D4RL-format HDF5 file.")
flags.DEFINE_integer("max_episode_steps", d4rl.DEFAULT_MAX_EPISODE_STEPS,
                     "Episode length limit for files without timeouts (D4RL's counting).")

REFERENCE_KEYS = ("random_return", "expert_return")  # metadata of datasets qrl generates


def reference_returns(path: str, metadata: dict):
    """(random, expert) returns: from the file's metadata, else D4RL's for its env or file name."""
    values = [d4rl.metadata_value(metadata, key) for key in REFERENCE_KEYS]
    if all(value is not None for value in values):
        return tuple(float(value) for value in values), "the dataset's metadata"
    for name in (d4rl.metadata_value(metadata, "env"), os.path.basename(path)):
        if name and d4rl_reference(str(name)) is not None:
            return d4rl_reference(str(name)), "D4RL's reference scores"
    return None, None


def describe(path: str, max_episode_steps: int = d4rl.DEFAULT_MAX_EPISODE_STEPS) -> str:
    arrays = d4rl.read_hdf5(path)
    metadata = arrays.get("metadata", {})
    transitions = d4rl.qlearning_arrays(arrays, max_episode_steps=max_episode_steps)
    returns, lengths = d4rl.episode_returns(arrays, max_episode_steps)
    reference, source = reference_returns(path, metadata)
    lines = [
        f"dataset      {path}",
        "format       D4RL HDF5" + (" (with next_observations)" if "next_observations" in arrays else ""),
        f"env          {d4rl.metadata_value(metadata, 'env') or 'not recorded'}",
        f"steps        {len(arrays['rewards'])}; q-learning transitions {len(transitions['rewards'])} "
        f"(terminals {int(arrays['terminals'].sum())}, timeouts {int(arrays['timeouts'].sum()) if 'timeouts' in arrays else 'absent'})",
        f"episodes     {len(returns)}; length mean {lengths.mean():.1f}, min {lengths.min()}, max {lengths.max()}",
        f"return       mean {returns.mean():.2f} ± {returns.std():.2f}, min {returns.min():.2f}, max {returns.max():.2f}",
    ]
    if reference is not None:
        scores = normalized_score(returns, reference)
        lines.append(f"normalized   mean {scores.mean():.1f} ± {scores.std():.1f} "
                     f"(random {reference[0]:g}, expert {reference[1]:g}: {source})")
    else:
        lines.append("normalized   no reference returns (not a D4RL task, none in the metadata)")
    for key in ("observations", "actions"):
        values = arrays[key]
        lines.append(f"{key:<12} dim {values.shape[1]}, range [{values.min():.3f}, {values.max():.3f}], "
                     f"per-dim |mean| max {np.abs(values.mean(axis=0)).max():.3f}")
    return "\n".join(lines)


def run() -> None:
    if not FLAGS.dataset:
        raise QrlInputError("--dataset is required")
    print(describe(FLAGS.dataset, FLAGS.max_episode_steps))


if __name__ == "__main__":
    common.run_entry_point(run)
