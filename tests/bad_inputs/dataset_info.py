"""Bad inputs to launch.dataset_info: missing, damaged or malformed D4RL files and Minari directories."""

import json
import os

import numpy as np

from tests.bad_input import Case


def _case(name, fragment, *args, setup=None):
    return Case("launch.dataset_info", name, tuple(args), fragment, setup)


def _steps(steps=6):
    rng = np.random.default_rng(0)
    timeouts = np.zeros(steps, bool)
    timeouts[-1] = True
    return {"observations": rng.normal(size=(steps, 3)).astype(np.float32),
            "actions": rng.uniform(-1, 1, size=(steps, 2)).astype(np.float32),
            "rewards": rng.normal(size=steps).astype(np.float32),
            "terminals": np.zeros(steps, bool), "timeouts": timeouts}


def _raw_hdf5(**changes):
    """A setup writing `d.hdf5` with h5py directly: `_steps()` with `changes` (None drops a key)."""

    def setup(tmp):
        import h5py

        arrays = {**_steps(), **changes}
        with h5py.File(tmp / "d.hdf5", "w") as handle:
            for key, values in arrays.items():
                if values is not None:
                    handle.create_dataset(key, data=values)

    return setup


def _valid_hdf5(tmp):
    from qrl.datasets.writers import write_d4rl_hdf5

    write_d4rl_hdf5(tmp / "d.hdf5", _steps(), {"env_id": "gym:HalfCheetah-v5"})


def _truncated(tmp):
    _valid_hdf5(tmp)
    data = (tmp / "d.hdf5").read_bytes()
    (tmp / "d.hdf5").write_bytes(data[:len(data) // 2])


def _zeroed_heap(tmp):
    """Zeroes the global heap collection that holds the env_id string (HDF5 loops on it)."""
    _valid_hdf5(tmp)
    data = bytearray((tmp / "d.hdf5").read_bytes())
    collection = data.index(b"GCOL")
    data[collection + 8:collection + 64] = bytes(56)
    (tmp / "d.hdf5").write_bytes(bytes(data))


def _minari(change):
    """A setup writing a Minari dataset at `m`, then applying `change(directory)`."""

    def setup(tmp):
        from qrl.datasets import minari_io

        arrays = _steps()  # one episode; its final observation is a last extra row
        arrays["next_observations"] = np.concatenate([arrays["observations"][1:], np.ones((1, 3), np.float32)])
        directory = minari_io.write_minari(arrays, tmp / "root", "qrl/test/tiny-v0", "gym:HalfCheetah-v5", {})
        os.rename(directory, tmp / "m")
        change(str(tmp / "m"))

    return setup


def _no_episodes(directory):
    import h5py

    with h5py.File(os.path.join(directory, "data", "main_data.hdf5"), "w"):
        pass


def _dict_observations(directory):
    import h5py

    with h5py.File(os.path.join(directory, "data", "main_data.hdf5"), "a") as handle:
        del handle["episode_0/observations"]
        handle.create_group("episode_0/observations").create_dataset("position", data=np.zeros((7, 3)))


def _metadata(update):
    def change(directory):
        path = os.path.join(directory, "data", "metadata.json")
        with open(path) as handle:
            metadata = json.load(handle)
        update(metadata)
        with open(path, "w") as handle:
            json.dump(metadata, handle)

    return change


def _not_json(directory):
    with open(os.path.join(directory, "data", "metadata.json"), "w") as handle:
        handle.write("{not json")


def _text(tmp):
    (tmp / "d.hdf5").write_text("observations,actions\n1,2\n")


_D = "--dataset={tmp}/d.hdf5"
_M = "--dataset={tmp}/m"

CASES = [
    _case("missing-flag", "--dataset is required"),
    _case("missing-file", "no such dataset file", "--dataset={tmp}/nothing.hdf5"),
    _case("not-hdf5", "not an HDF5 file", _D, setup=_text),
    _case("truncated-hdf5", "d.hdf5", _D, setup=_truncated),
    _case("zeroed-hdf5", "corrupt HDF5 file", _D, setup=_zeroed_heap),
    _case("missing-key", "missing dataset key(s) actions", _D, setup=_raw_hdf5(actions=None)),
    _case("nan-values", "NaN", _D, setup=_raw_hdf5(rewards=np.array([0, 1, np.nan, 0, 0, 0], np.float32))),
    _case("length-mismatch", "rows", _D, setup=_raw_hdf5(actions=np.zeros((4, 2), np.float32))),
    _case("empty-dataset", "no steps", _D, setup=_raw_hdf5(**{key: value[:0] for key, value in _steps().items()})),
    _case("max-episode-steps-zero", "--max_episode_steps", _D, "--max_episode_steps=0", setup=_valid_hdf5),
    _case("directory-not-minari", "not a Minari dataset", "--dataset={tmp}"),
    _case("minari-no-episodes", "holds no episodes", _M, setup=_minari(_no_episodes)),
    _case("minari-dict-observations", "dict or tuple space", _M, setup=_minari(_dict_observations)),
    _case("minari-metadata-not-json", "not readable JSON", _M, setup=_minari(_not_json)),
    _case("minari-arrow-format", "hdf5 format only", _M,
          setup=_minari(_metadata(lambda metadata: metadata.update(data_format="arrow")))),
]
