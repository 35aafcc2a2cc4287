"""Dataset files are data: a crafted Minari dataset runs no code, damaged HDF5 files are one
input-error line, dataset ids stay inside their root, and killed writes leave nothing readers
fail on (and are cleaned up by the next write)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from qrl.datasets import d4rl, files, minari_io
from qrl.datasets.writers import remove_stale_temps, temp_sibling, write_d4rl_hdf5
from qrl.errors import QrlInputError
from tests.test_datasets_formats import DATASET_ID, assert_same_steps, step_arrays

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEX = "0123456789abcdef" * 2


def minari_dataset(root, dataset_id=DATASET_ID):
    return minari_io.write_minari(step_arrays(), root, dataset_id, "gym:HalfCheetah-v5", {"seed": 3})


def craft_spec(directory, marker):
    """Rewrites the dataset's metadata the way an attacker would: no stored spaces (so minari
    builds the env from `env_spec`) and an entry point that creates `marker` when called."""
    path = os.path.join(directory, "data", "metadata.json")
    with open(path) as handle:
        metadata = json.load(handle)
    for key in ("observation_space", "action_space", "qrl_env_id"):
        metadata.pop(key)
    metadata["env_spec"] = json.dumps({"id": "Evil-v0", "entry_point": "os:system",
                                       "kwargs": {"command": f"touch {marker}"},
                                       "additional_wrappers": [], "vector_entry_point": None})
    with open(path, "w") as handle:
        json.dump(metadata, handle)


def test_crafted_minari_spec_runs_no_code_and_reads_from_the_data(tmp_path):
    directory, marker = minari_dataset(tmp_path / "root"), tmp_path / "marker"
    craft_spec(directory, marker)
    loaded = files.read_steps(directory)
    assert not marker.exists()
    assert_same_steps(step_arrays(), loaded)
    assert loaded["metadata"]["env_id"] is None  # the spec's id is never taken

    result = subprocess.run([sys.executable, "-m", "launch.dataset_info", f"--dataset={directory}"], cwd=str(tmp_path),
                            env={**os.environ, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu"},
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert f"steps        {len(step_arrays()['rewards'])}" in result.stdout and "env          not recorded" in result.stdout
    assert not marker.exists()

    # The crafted dataset is live: minari's own loader runs the entry point.
    from minari.dataset.minari_dataset import MinariDataset

    with pytest.raises(Exception):
        MinariDataset(os.path.join(directory, "data"))
    assert marker.exists()


def test_minari_layouts_qrl_does_not_read_are_one_line(tmp_path):
    import h5py

    directory = minari_dataset(tmp_path)
    data = os.path.join(directory, "data", "main_data.hdf5")
    with h5py.File(data, "a") as handle:
        del handle["episode_1/observations"]
        handle.create_group("episode_1/observations").create_dataset("position", data=np.zeros((5, 3)))
    with pytest.raises(QrlInputError, match="dict or tuple space") as error:
        minari_io.read_minari_directory(directory)
    assert "\n" not in str(error.value)
    with open(os.path.join(directory, "data", "metadata.json")) as handle:
        metadata = json.load(handle)
    metadata["observation_space"] = json.dumps({"type": "Dict", "subspaces": {}})
    with open(os.path.join(directory, "data", "metadata.json"), "w") as handle:
        json.dump(metadata, handle)
    with pytest.raises(QrlInputError, match="'Dict' is not supported"):
        minari_io.read_minari_directory(directory)


def zeroed_copies(data: bytes, stride: int):
    """`data` with spans of 8 and 64 bytes zeroed at every `stride`-th offset through the file."""
    for span in (8, 64):
        for offset in range(0, len(data), stride):
            damaged = bytearray(data)
            damaged[offset:offset + span] = bytes(len(damaged[offset:offset + span]))
            yield offset, bytes(damaged)


def assert_read_or_input_error(read, where):
    try:
        loaded = read()
    except QrlInputError as error:
        assert "\n" not in str(error), where
        return "refused"
    for key in ("observations", "actions", "rewards", "terminals", "timeouts"):  # timeouts are optional in D4RL
        assert key not in loaded or len(loaded[key]) == len(loaded["rewards"]), where
    assert {"observations", "actions", "rewards", "terminals"} <= set(loaded), where
    assert np.isfinite(loaded["observations"]).all() and np.isfinite(loaded["rewards"]).all(), where
    return "read"


def test_zeroed_bytes_in_a_d4rl_file_read_or_refuse_with_one_line(tmp_path):
    path = write_d4rl_hdf5(tmp_path / "clean.hdf5", step_arrays(), {"env_id": "gym:HalfCheetah-v5", "seed": 3})
    damaged_path = tmp_path / "damaged.hdf5"
    outcomes = set()
    for offset, damaged in zeroed_copies(open(path, "rb").read(), 48):
        damaged_path.write_bytes(damaged)
        outcomes.add(assert_read_or_input_error(lambda: d4rl.read_hdf5(str(damaged_path)), offset))
    assert outcomes == {"read", "refused"}


def test_a_zeroed_global_heap_is_refused_not_looped_on(tmp_path):
    """HDF5 never returns from reading a string whose heap collection's free-space object has
    size 0; the reader checks the collection first."""
    path = write_d4rl_hdf5(tmp_path / "clean.hdf5", step_arrays(), {"env_id": "gym:HalfCheetah-v5"})
    data = bytearray(open(path, "rb").read())
    collection = data.index(b"GCOL")
    free_space = collection + 16 + 16 + 24  # header, then the one 18-byte string's object
    data[free_space:free_space + 16] = bytes(16)
    open(path, "wb").write(bytes(data))
    with pytest.raises(QrlInputError, match=r"^corrupt HDF5 file .*env_id points at a damaged global heap"):
        d4rl.read_hdf5(path)


def test_zeroed_bytes_in_a_minari_file_read_or_refuse_with_one_line(tmp_path):
    directory = minari_dataset(tmp_path)
    data_path = os.path.join(directory, "data", "main_data.hdf5")
    clean = open(data_path, "rb").read()
    outcomes = set()
    for offset, damaged in zeroed_copies(clean, 200):
        with open(data_path, "wb") as handle:
            handle.write(damaged)
        outcomes.add(assert_read_or_input_error(lambda: minari_io.read_minari_directory(directory), offset))
    assert outcomes == {"read", "refused"}


@pytest.mark.parametrize("dataset_id", ["../outside-v0", "qrl/../../outside-v0", "/tmp/outside-v0", "qrl/./x-v0",
                                        "qrl//x-v0", "qrl/x", ".hidden-v0", "qrl\\..\\x-v0"])
def test_dataset_ids_that_could_leave_the_root_are_refused(tmp_path, dataset_id):
    with pytest.raises(QrlInputError, match="not a Minari id"):
        minari_io.write_minari(step_arrays(), tmp_path / "root", dataset_id, "gym:HalfCheetah-v5", {})
    assert not (tmp_path / "root").exists()


def test_a_dataset_id_through_a_link_out_of_the_root_is_refused(tmp_path):
    (tmp_path / "root").mkdir()
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "root" / "qrl")
    with pytest.raises(QrlInputError, match="resolves outside"):
        minari_io.write_minari(step_arrays(), tmp_path / "root", "qrl/x-v0", "gym:HalfCheetah-v5", {})
    assert os.listdir(tmp_path / "elsewhere") == []


def test_a_failed_minari_overwrite_keeps_the_old_dataset(tmp_path, monkeypatch):
    directory = minari_dataset(tmp_path)
    real_create = minari_io._create_dataset

    def create_then_die(root, *args):
        real_create(root, *args)  # the new dataset is complete in the staging directory ...
        raise KeyboardInterrupt  # ... and the write is interrupted before it is renamed in

    monkeypatch.setattr(minari_io, "_create_dataset", create_then_die)
    changed = dict(step_arrays(), rewards=step_arrays()["rewards"] + 1)
    with pytest.raises(KeyboardInterrupt):
        minari_io.write_minari(changed, tmp_path, DATASET_ID, "gym:HalfCheetah-v5", {}, overwrite=True)
    assert_same_steps(step_arrays(), minari_io.read_minari(DATASET_ID, tmp_path))
    assert [name for name in os.listdir(os.path.dirname(directory)) if name.startswith(".")] == []

    monkeypatch.setattr(minari_io, "_create_dataset", real_create)
    minari_io.write_minari(changed, tmp_path, DATASET_ID, "gym:HalfCheetah-v5", {}, overwrite=True)
    assert_same_steps(changed, minari_io.read_minari(DATASET_ID, tmp_path))
    assert minari_io.local_dataset_ids(tmp_path) == [DATASET_ID]


def test_leftovers_of_killed_minari_writes_are_invisible_and_cleaned_by_the_next_write(tmp_path):
    directory = minari_dataset(tmp_path)
    parent, name = os.path.split(directory)
    before = os.listdir(parent)
    staged = os.path.join(parent, f".{name}.{HEX}.tmp", *DATASET_ID.split("/"), "data")
    os.makedirs(staged)
    open(os.path.join(staged, "metadata.json"), "w").write("{")  # half written
    unrelated = [os.path.join(parent, entry) for entry in (f".{name}.notqrl.tmp", f".{name}.{HEX}.tmp.keep", "notes.tmp")]
    for path in unrelated:
        open(path, "w").write("not qrl's\n")
    assert minari_io.local_dataset_ids(tmp_path) == [DATASET_ID]
    assert_same_steps(step_arrays(), files.read_steps(directory))

    minari_io.write_minari(step_arrays(), tmp_path, DATASET_ID, "gym:HalfCheetah-v5", {}, overwrite=True)
    assert sorted(os.listdir(parent)) == sorted([*before, *map(os.path.basename, unrelated)])


def test_a_write_killed_between_its_renames_gets_the_old_dataset_back(tmp_path):
    directory = minari_dataset(tmp_path)
    aside = temp_sibling(directory, "old")
    os.rename(directory, aside)  # killed after moving the old dataset aside
    assert remove_stale_temps(directory) == []
    assert_same_steps(step_arrays(), files.read_steps(directory))
    assert not os.path.exists(aside)


def test_temp_files_of_killed_hdf5_writes_are_removed_by_the_next_write(tmp_path):
    path = tmp_path / "data.hdf5"
    write_d4rl_hdf5(path, step_arrays(), {})
    killed = tmp_path / f".data.hdf5.{HEX}.tmp"
    killed.write_bytes(b"half an hdf5 file")
    kept = [tmp_path / ".data.hdf5.tmp", tmp_path / f".other.hdf5.{HEX}.tmp", tmp_path / f".data.hdf5.{HEX[:-1]}.tmp"]
    for path_kept in kept:
        path_kept.write_bytes(b"not a leftover of this path")
    assert_same_steps(step_arrays(), d4rl.read_hdf5(str(path)))
    write_d4rl_hdf5(path, step_arrays(), {})
    assert sorted(os.listdir(tmp_path)) == sorted(["data.hdf5", *(p.name for p in kept)])
