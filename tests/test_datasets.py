"""D4RL HDF5 reading without d4rl: validation, `qlearning_dataset` semantics against D4RL's own
loop, episode returns, normalized scores, the on-device dataset and `launch.dataset_info`."""

import hashlib
import os
import subprocess
import sys

import h5py
import jax
import numpy as np
import pytest

from qrl.datasets import d4rl, d4rl_reference, from_qlearning, normalized_score, sample
from qrl.errors import QrlInputError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_hdf5(path, **arrays):
    metadata = arrays.pop("metadata", {})
    with h5py.File(path, "w") as handle:
        for key, values in arrays.items():
            handle.create_dataset(key, data=values)
        for key, value in metadata.items():
            handle.create_dataset(f"metadata/{key}", data=value)
    return str(path)


def small_arrays(steps=8, with_timeouts=True):
    """Episodes: steps 0-2 (terminal at 2), 3-5 (timeout at 5), 6-7 (unfinished)."""
    observations = np.arange(steps * 2, dtype=np.float32).reshape(steps, 2)
    arrays = dict(
        observations=observations,
        actions=np.linspace(-1, 1, steps, dtype=np.float32)[:, None],
        rewards=np.arange(1, steps + 1, dtype=np.float32),
        terminals=np.array([0, 0, 1, 0, 0, 0, 0, 0][:steps], bool),
    )
    if with_timeouts:
        arrays["timeouts"] = np.array([0, 0, 0, 0, 0, 1, 0, 0][:steps], bool)
    return arrays


def d4rl_reference_loop(dataset, terminate_on_end, max_episode_steps):
    """D4RL's `qlearning_dataset` loop (d4rl/__init__.py), the specification: kept indices."""
    has_next_obs = "next_observations" in dataset
    use_timeouts = "timeouts" in dataset
    kept, next_observations, episode_step = [], [], 0
    for i in range(dataset["rewards"].shape[0] - 1):
        new_obs = dataset["next_observations"][i] if has_next_obs else dataset["observations"][i + 1]
        done_bool = bool(dataset["terminals"][i])
        final_timestep = dataset["timeouts"][i] if use_timeouts else (episode_step == max_episode_steps - 1)
        if (not terminate_on_end) and final_timestep:
            episode_step = 0
            continue
        if done_bool or final_timestep:
            episode_step = 0
        kept.append(i)
        next_observations.append(new_obs)
        episode_step += 1
    return np.asarray(kept), np.asarray(next_observations)


def test_qlearning_view_by_hand(tmp_path):
    arrays = d4rl.read_hdf5(write_hdf5(tmp_path / "d.hdf5", **small_arrays()))
    view = d4rl.qlearning_arrays(arrays)
    kept = [0, 1, 2, 3, 4, 6]  # step 7 has no successor; step 5 timed out
    np.testing.assert_array_equal(view["observations"], arrays["observations"][kept])
    np.testing.assert_array_equal(view["next_observations"], arrays["observations"][[k + 1 for k in kept]])
    np.testing.assert_array_equal(view["rewards"], [1, 2, 3, 4, 5, 7])
    np.testing.assert_array_equal(view["terminals"], [0, 0, 1, 0, 0, 0])
    kept_all = d4rl.qlearning_arrays(arrays, terminate_on_end=True)
    np.testing.assert_array_equal(kept_all["rewards"], [1, 2, 3, 4, 5, 6, 7])


@pytest.mark.parametrize("with_timeouts", [True, False])
@pytest.mark.parametrize("with_next", [True, False])
@pytest.mark.parametrize("terminate_on_end", [True, False])
def test_qlearning_view_matches_d4rl_loop(tmp_path, with_timeouts, with_next, terminate_on_end):
    rng = np.random.default_rng(0)
    steps = 300
    arrays = dict(
        observations=rng.normal(size=(steps, 3)).astype(np.float32),
        actions=rng.uniform(-1, 1, (steps, 2)).astype(np.float32),
        rewards=rng.normal(size=steps).astype(np.float32),
        terminals=rng.random(steps) < 0.03,
    )
    if with_timeouts:
        arrays["timeouts"] = (rng.random(steps) < 0.05) & ~arrays["terminals"]
    if with_next:
        arrays["next_observations"] = rng.normal(size=(steps, 3)).astype(np.float32)
    loaded = d4rl.read_hdf5(write_hdf5(tmp_path / "d.hdf5", **arrays))
    view = d4rl.qlearning_arrays(loaded, terminate_on_end=terminate_on_end, max_episode_steps=17)
    kept, next_observations = d4rl_reference_loop(arrays, terminate_on_end, 17)
    assert 0 < len(kept) < steps - 1 or terminate_on_end
    np.testing.assert_array_equal(view["observations"], arrays["observations"][kept])
    np.testing.assert_array_equal(view["actions"], arrays["actions"][kept])
    np.testing.assert_array_equal(view["rewards"], arrays["rewards"][kept])
    np.testing.assert_array_equal(view["terminals"], arrays["terminals"][kept])
    np.testing.assert_array_equal(view["next_observations"], next_observations)


def test_episode_returns_by_hand(tmp_path):
    arrays = d4rl.read_hdf5(write_hdf5(tmp_path / "d.hdf5", **small_arrays()))
    returns, lengths = d4rl.episode_returns(arrays)
    np.testing.assert_array_equal(returns, [1 + 2 + 3, 4 + 5 + 6, 7 + 8])
    np.testing.assert_array_equal(lengths, [3, 3, 2])
    no_timeouts = d4rl.read_hdf5(write_hdf5(tmp_path / "n.hdf5", **small_arrays(with_timeouts=False)))
    returns, lengths = d4rl.episode_returns(no_timeouts, max_episode_steps=4)
    np.testing.assert_array_equal(lengths, [3, 4, 1])  # terminal at 2, then 4 steps, then the rest


def corrupt(arrays, key, values):
    return {**arrays, key: values}


BAD_FILES = {
    "missing key": (lambda a: {k: v for k, v in a.items() if k != "actions"}, "missing dataset key(s) actions"),
    "length": (lambda a: corrupt(a, "actions", a["actions"][:-1]), "actions has 7 rows but rewards has 8"),
    "nan": (lambda a: corrupt(a, "observations", np.where(np.arange(16).reshape(8, 2) == 9, np.nan, a["observations"])),
            "observations has NaN or inf values (first at row 4)"),
    "inf reward": (lambda a: corrupt(a, "rewards", np.where(np.arange(8) == 2, np.inf, a["rewards"]).astype(np.float32)),
                   "rewards has NaN or inf"),
    "dtype": (lambda a: corrupt(a, "observations", a["observations"].astype(np.int64)), "observations must hold floats"),
    "rank": (lambda a: corrupt(a, "rewards", a["rewards"][:, None]), "rewards must be 1-D"),
    "flags": (lambda a: corrupt(a, "terminals", np.full(8, 2, np.int32)), "terminals must hold 0/1 flags"),
    "empty": (lambda a: {k: v[:0] for k, v in a.items()}, "the dataset holds no steps"),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_invalid_files_are_one_line_errors_and_untouched(tmp_path, name):
    make, message = BAD_FILES[name]
    path = write_hdf5(tmp_path / "bad.hdf5", **make(small_arrays()))
    digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
    with pytest.raises(QrlInputError) as error:
        d4rl.read_hdf5(path)
    assert message in str(error.value) and str(error.value).startswith(path) and "\n" not in str(error.value)
    assert hashlib.sha256(open(path, "rb").read()).hexdigest() == digest


def test_not_hdf5_and_missing_file(tmp_path):
    text = tmp_path / "notes.hdf5"
    text.write_text("not a dataset")
    with pytest.raises(QrlInputError, match="not an HDF5 file"):
        d4rl.read_hdf5(str(text))
    with pytest.raises(QrlInputError, match="no such file"):
        d4rl.read_hdf5(str(tmp_path / "absent.hdf5"))


def test_normalized_score_and_references():
    assert d4rl_reference("halfcheetah-medium-v2") == (-280.178953, 12135.0)
    assert d4rl_reference("gym:Hopper-v5") == (-20.272305, 3234.3)
    assert d4rl_reference("gym:Walker2d-v5") == (1.629008, 4592.3)
    assert d4rl_reference("gym:Pendulum-v1") is None
    np.testing.assert_allclose(normalized_score([-20.272305, 3234.3, 1607.0138], (-20.272305, 3234.3)),
                               [0.0, 100.0, 50.0], atol=1e-6)
    with pytest.raises(QrlInputError):
        normalized_score([1.0], (5.0, 5.0))


def test_device_dataset_statistics_and_sampling_in_jit(tmp_path):
    arrays = d4rl.read_hdf5(write_hdf5(tmp_path / "d.hdf5", **small_arrays()))
    dataset = from_qlearning(d4rl.qlearning_arrays(arrays))
    assert dataset.size == 6
    observations = arrays["observations"][[0, 1, 2, 3, 4, 6]]
    np.testing.assert_allclose(dataset.observation_mean, observations.mean(axis=0), rtol=1e-6)
    np.testing.assert_allclose(dataset.observation_std, observations.std(axis=0), rtol=1e-6)
    np.testing.assert_array_equal(dataset.transitions.discount, [1, 1, 0, 1, 1, 1])
    batch = jax.jit(sample, static_argnums=(2, 3))(dataset, jax.random.PRNGKey(0), 64, 3)
    assert batch.observation.shape == (3, 64, 2) and batch.action.shape == (3, 64, 1)
    # every sampled row is a dataset row, its fields kept together
    rows = {tuple(row) for row in np.asarray(dataset.transitions.observation)}
    assert {tuple(row) for row in np.asarray(batch.observation).reshape(-1, 2)} <= rows
    np.testing.assert_array_equal(np.asarray(batch.next_observation) - np.asarray(batch.observation), 2.0)


def run_info(*flags):
    return subprocess.run([sys.executable, "-m", "launch.dataset_info", *flags], cwd=REPO, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": REPO}, timeout=120)


def test_dataset_info_cli(tmp_path):
    arrays = small_arrays()
    path = write_hdf5(tmp_path / "hopper-medium-v2.hdf5", **arrays)
    result = run_info(f"--dataset={path}")
    assert result.returncode == 0, result.stderr
    assert "episodes     3" in result.stdout and "q-learning transitions 6" in result.stdout
    assert "return       mean 12.00" in result.stdout  # (6 + 15 + 15) / 3
    assert "D4RL's reference scores" in result.stdout
    bad = write_hdf5(tmp_path / "bad.hdf5", **{k: v for k, v in arrays.items() if k != "rewards"})
    result = run_info(f"--dataset={bad}")
    assert result.returncode == 2 and result.stderr.strip().startswith("error:") and "rewards" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
