"""Dataset writers: D4RL HDF5 (atomic) and Minari (offline) round trips in qrl's step-array format."""

import os

import numpy as np
import pytest

from qrl.datasets import d4rl, from_qlearning, minari_io
from qrl.datasets.writers import write_d4rl_hdf5
from qrl.errors import QrlInputError

STEP_KEYS = ("observations", "actions", "rewards", "terminals", "timeouts", "next_observations")
DATASET_ID = "qrl/halfcheetah/tiny-v0"


def step_arrays():
    """Three episodes: steps 0-2 (terminal at 2), 3-6 (timeout at 6), 7-8 (unfinished)."""
    rng = np.random.default_rng(0)
    episodes = [(3, "terminal"), (4, "timeout"), (2, None)]
    parts = {key: [] for key in STEP_KEYS}
    for length, end in episodes:
        sequence = rng.normal(size=(length + 1, 3)).astype(np.float32)  # T observations + final
        parts["observations"].append(sequence[:-1])
        parts["next_observations"].append(sequence[1:])
        parts["actions"].append(rng.uniform(-1, 1, size=(length, 2)).astype(np.float32))
        parts["rewards"].append(rng.normal(size=length).astype(np.float32))
        flags = np.zeros(length, bool), np.zeros(length, bool)
        if end == "terminal":
            flags[0][-1] = True
        elif end == "timeout":
            flags[1][-1] = True
        parts["terminals"].append(flags[0])
        parts["timeouts"].append(flags[1])
    return {key: np.concatenate(values) for key, values in parts.items()}


METADATA = {"ref_min_score": -280.178953, "ref_max_score": 12135.0, "algorithm_name": "sac",
            "author": "qrl tests", "policy": "medium", "seed": 3}


def assert_same_steps(expected, actual):
    for key in STEP_KEYS:
        assert actual[key].dtype == expected[key].dtype, key
        np.testing.assert_array_equal(actual[key], expected[key], err_msg=key)


def test_d4rl_hdf5_round_trip_is_exact(tmp_path):
    arrays = step_arrays()
    path = write_d4rl_hdf5(tmp_path / "tiny.hdf5", arrays, {"env_id": "gym:HalfCheetah-v5", "seed": 3,
                                                            "ref_max_score": 12135.0})
    assert sorted(os.listdir(tmp_path)) == ["tiny.hdf5"]  # no temporary file left behind
    loaded = d4rl.read_hdf5(path)
    assert_same_steps(arrays, loaded)
    assert d4rl.metadata_value(loaded["metadata"], "env_id") == "gym:HalfCheetah-v5"
    assert d4rl.metadata_value(loaded["metadata"], "seed") == 3
    assert d4rl.metadata_value(loaded["metadata"], "ref_max_score") == 12135.0


def test_d4rl_hdf5_writer_casts_and_validates(tmp_path):
    arrays = {key: value for key, value in step_arrays().items() if key != "next_observations"}
    arrays["observations"] = arrays["observations"].astype(np.float64)
    arrays["terminals"] = arrays["terminals"].astype(np.int64)
    loaded = d4rl.read_hdf5(write_d4rl_hdf5(tmp_path / "cast.hdf5", arrays, {}))
    assert loaded["observations"].dtype == np.float32 and loaded["terminals"].dtype == bool
    assert "next_observations" not in loaded
    bad = dict(arrays, rewards=arrays["rewards"][:-1])
    with pytest.raises(QrlInputError, match="rows"):
        write_d4rl_hdf5(tmp_path / "bad.hdf5", bad, {})
    assert not (tmp_path / "bad.hdf5").exists()


def test_minari_round_trip_is_exact(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # proves nothing lands in ~/.minari
    monkeypatch.delenv(minari_io.ROOT_VARIABLE, raising=False)
    arrays = step_arrays()
    root = tmp_path / "minari"
    directory = minari_io.write_minari(arrays, root, DATASET_ID, "gym:HalfCheetah-v5", dict(METADATA))
    assert os.path.isfile(os.path.join(directory, "data", "main_data.hdf5"))
    assert minari_io.ROOT_VARIABLE not in os.environ
    loaded = minari_io.read_minari(DATASET_ID, root)
    assert_same_steps(arrays, loaded)
    metadata = loaded["metadata"]
    assert metadata["env_id"] == "gym:HalfCheetah-v5"
    assert metadata["ref_min_score"] == METADATA["ref_min_score"]
    assert metadata["ref_max_score"] == METADATA["ref_max_score"]
    assert metadata["algorithm_name"] == "sac" and metadata["author"] == "qrl tests"
    assert metadata["policy"] == "medium" and metadata["seed"] == 3
    assert not (tmp_path / "home").exists()

    # minari's own offline loader sees the same episodes and reference scores
    import minari

    monkeypatch.setenv(minari_io.ROOT_VARIABLE, str(root))
    dataset = minari.load_dataset(DATASET_ID)
    assert dataset.total_episodes == 3 and dataset.total_steps == len(arrays["rewards"])
    assert dataset.spec.env_spec.id == "HalfCheetah-v5"
    assert minari.list_local_datasets().keys() == {DATASET_ID}
    assert float(minari.get_normalized_score(dataset, np.array(12135.0))) == pytest.approx(1.0)
    # root from the environment variable
    assert_same_steps(arrays, minari_io.read_minari(DATASET_ID))

    dataset = from_qlearning(d4rl.qlearning_arrays(loaded))
    assert dataset.size == len(arrays["rewards"]) - 1 - 1  # last step and the timeout step dropped


def test_minari_without_next_observations_and_without_env_spec(tmp_path):
    arrays = step_arrays()
    without = {key: value for key, value in arrays.items() if key != "next_observations"}
    with pytest.raises(QrlInputError, match="final observation"):
        minari_io.write_minari(without, tmp_path, "qrl/none/bad-v0", "dmc:cheetah-run", {})
    assert minari_io.local_dataset_ids(tmp_path) == []
    # not a gymnasium id: no env spec, spaces only; still an exact round trip
    minari_io.write_minari(arrays, tmp_path, "qrl/dmc/obs-v0", "dmc:cheetah-run", {})
    loaded = minari_io.read_minari("qrl/dmc/obs-v0", tmp_path)
    assert_same_steps(arrays, loaded)
    assert loaded["metadata"]["env_id"] == "dmc:cheetah-run"
    assert "ref_min_score" not in loaded["metadata"]


def test_minari_rejects_next_observations_it_cannot_store(tmp_path):
    arrays = step_arrays()
    arrays["next_observations"] = arrays["next_observations"].copy()
    arrays["next_observations"][0] += 1.0
    with pytest.raises(QrlInputError, match=r"next_observations\[0\]"):
        minari_io.write_minari(arrays, tmp_path, "qrl/x/bad-v0", "gym:HalfCheetah-v5", {})


def test_minari_errors(tmp_path, monkeypatch):
    monkeypatch.delenv(minari_io.ROOT_VARIABLE, raising=False)
    with pytest.raises(QrlInputError, match=minari_io.ROOT_VARIABLE):
        minari_io.read_minari(DATASET_ID)
    with pytest.raises(QrlInputError, match=minari_io.ROOT_VARIABLE):
        minari_io.write_minari(step_arrays(), None, DATASET_ID, "gym:HalfCheetah-v5", {})
    minari_io.write_minari(step_arrays(), tmp_path, DATASET_ID, "gym:HalfCheetah-v5", {})
    with pytest.raises(QrlInputError) as error:
        minari_io.read_minari("qrl/halfcheetah/missing-v0", tmp_path)
    message = str(error.value)
    assert "\n" not in message and "missing-v0" in message and DATASET_ID in message
    with pytest.raises(QrlInputError, match="already exists"):
        minari_io.write_minari(step_arrays(), tmp_path, DATASET_ID, "gym:HalfCheetah-v5", {})
    assert_same_steps(step_arrays(), minari_io.read_minari(DATASET_ID, tmp_path))  # left intact
