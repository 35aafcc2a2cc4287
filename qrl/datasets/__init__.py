"""Offline RL datasets: D4RL's HDF5 format read without d4rl, Minari datasets from a local root,
an on-device `Dataset`, normalized scores, writers, and step collection from a policy.

    arrays = d4rl.read_hdf5("halfcheetah-medium-v2.hdf5")     # validated step arrays
    arrays = minari_io.read_minari("mujoco/halfcheetah/medium-v0", root)  # the same format
    dataset = from_qlearning(d4rl.qlearning_arrays(arrays))    # D4RL's qlearning_dataset, on device
    batch = sample(dataset, key, 256)                          # inside jit

`minari_io` and `collect` load on first use (minari imports Pillow; collect steps environments).
"""

from qrl.datasets import d4rl, writers
from qrl.datasets.dataset import Dataset, from_qlearning, normalize_observations, sample
from qrl.datasets.scores import D4RL_REFERENCE_RETURNS, d4rl_reference, normalized_score

__all__ = [
    "D4RL_REFERENCE_RETURNS", "Dataset", "d4rl", "d4rl_reference", "from_qlearning", "normalize_observations",
    "normalized_score", "sample", "writers",
]
