"""Offline RL datasets: D4RL's HDF5 format read without d4rl, an on-device `Dataset`, scores.

    arrays = d4rl.read_hdf5("halfcheetah-medium-v2.hdf5")     # validated step arrays
    dataset = from_qlearning(d4rl.qlearning_arrays(arrays))    # D4RL's qlearning_dataset, on device
    batch = sample(dataset, key, 256)                          # inside jit
"""

from qrl.datasets import d4rl
from qrl.datasets.dataset import Dataset, from_qlearning, normalize_observations, sample
from qrl.datasets.scores import D4RL_REFERENCE_RETURNS, d4rl_reference, normalized_score

__all__ = [
    "D4RL_REFERENCE_RETURNS", "Dataset", "d4rl", "d4rl_reference", "from_qlearning", "normalize_observations",
    "normalized_score", "sample",
]
