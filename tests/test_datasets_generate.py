"""Dataset generation from a SAC run: medium choice, replay refill, the step log, levels, resume."""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from agents import sac
from qrl import offpolicy
from qrl.datasets import collect, d4rl, files, generate
from qrl.errors import QrlInputError
from qrl.replay import Transition, UniformReplay

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV_ID = "gym:Hopper-v5"  # terminations early in training, time limits later
SAC_SETTINGS = {"hidden_sizes": "32-32", "batch_size": 32, "learning_starts": 100}


def checkpoints(*returns):
    return [{"step": 100 * (index + 1), "return_mean": value} for index, value in enumerate(returns)]


def test_choose_medium_is_a_third_of_the_way_from_random_to_expert():
    # random 0, expert 300 -> target 100: the checkpoint returning 90 is closest.
    chosen = generate.choose_medium(checkpoints(10, 90, 150, 300), 0.0, 300.0)
    assert chosen["step"] == 200
    # Measured from random: random -300, expert 600 -> target 0.
    assert generate.choose_medium(checkpoints(-250, 20, -10, 600), -300.0, 600.0)["step"] == 300
    # The final checkpoint is the expert, never the medium, even when it is closest.
    assert generate.choose_medium(checkpoints(500, 100), 0.0, 300.0)["step"] == 100
    # Ties go to the earlier checkpoint; another fraction moves the target.
    assert generate.choose_medium(checkpoints(80, 120, 300), 0.0, 300.0)["step"] == 100
    assert generate.choose_medium(checkpoints(80, 140, 300), 0.0, 300.0, fraction=0.5)["step"] == 200
    with pytest.raises(QrlInputError, match="two checkpoints"):
        generate.choose_medium(checkpoints(300), 0.0, 300.0)


def step_arrays():
    """Five steps: an episode of 2 ending in a terminal, then one of 3 ending in a timeout."""
    return {
        "observations": np.arange(5, dtype=np.float32)[:, None],
        "actions": np.full((5, 1), 0.5, np.float32),
        "rewards": np.array([1.0, 2.0, 3.0, 4.0, 5.0], np.float32),
        "terminals": np.array([0, 1, 0, 0, 0], bool),
        "timeouts": np.array([0, 0, 0, 0, 1], bool),
        "next_observations": np.arange(1, 6, dtype=np.float32)[:, None] * 10,
    }


def test_steps_to_transitions_matches_hand_computed_n_step_targets():
    one = generate.steps_to_transitions(step_arrays(), n_step=1, gamma=0.9)
    np.testing.assert_allclose(one.reward, [1, 2, 3, 4, 5])
    np.testing.assert_allclose(one.discount, [0.9, 0.0, 0.9, 0.9, 0.9])  # terminal cuts, timeout bootstraps
    np.testing.assert_array_equal(one.next_observation[:, 0], [10, 20, 30, 40, 50])
    two = generate.steps_to_transitions(step_arrays(), n_step=2, gamma=0.9)
    # episode 1: (1 + 0.9*2, discount 0) then the tail (2, 0); episode 2: (3 + 0.9*4, 0.81), (4 + 0.9*5, 0.81), (5, 0.9)
    np.testing.assert_allclose(two.reward, [2.8, 2.0, 6.6, 8.5, 5.0], rtol=1e-6)
    np.testing.assert_allclose(two.discount, [0.0, 0.0, 0.81, 0.81, 0.9], rtol=1e-6)
    np.testing.assert_array_equal(two.observation[:, 0], [0, 1, 2, 3, 4])
    np.testing.assert_array_equal(two.next_observation[:, 0], [20, 20, 40, 50, 50])


@pytest.mark.parametrize("capacity, count", [(8, 5), (8, 8), (5, 12)])
def test_replay_add_batch_equals_one_add_per_row(capacity, count):
    rng = np.random.default_rng(0)
    rows = Transition(rng.normal(size=(count, 3)).astype(np.float32), rng.normal(size=(count, 2)).astype(np.float32),
                      rng.normal(size=count).astype(np.float32), rng.uniform(size=count).astype(np.float32),
                      rng.normal(size=(count, 3)).astype(np.float32))
    one_by_one, batched = UniformReplay(capacity), UniformReplay(capacity)
    for first in range(0, count, 3):  # several batches, so the ring position carries over
        for index in range(first, min(first + 3, count)):
            one_by_one.add(Transition(*(getattr(rows, name)[index] for name in
                                        ("observation", "action", "reward", "discount", "next_observation"))))
        batched.add_batch(Transition(*(getattr(rows, name)[first:first + 3] for name in
                                       ("observation", "action", "reward", "discount", "next_observation"))))
    assert len(one_by_one) == len(batched) == min(capacity, count)
    assert one_by_one._next == batched._next
    for name in one_by_one._storage:
        np.testing.assert_array_equal(one_by_one._storage[name], batched._storage[name])
    overflow = UniformReplay(capacity)
    overflow.add_batch(rows)
    assert len(overflow) == min(capacity, count) and overflow._next == batched._next
    for name in overflow._storage:
        np.testing.assert_array_equal(overflow._storage[name], batched._storage[name])


def behavior_run(workdir, steps=400, **options):
    config = sac.config_for(ENV_ID, SAC_SETTINGS)
    return generate.BehaviorRun(sac.AGENT, config, ENV_ID, steps, seed=1, workdir=str(workdir),
                                checkpoint_every=100, eval_episodes=2, reference_episodes=3, **options)


def assert_contiguous_episodes(arrays, complete=True):
    """Each episode's next_observations are its observations shifted by one; `complete`: the
    last row ends an episode."""
    ends = np.flatnonzero(arrays["terminals"] | arrays["timeouts"])
    if complete:
        assert ends[-1] == len(arrays["rewards"]) - 1
    starts = np.concatenate([[0], ends[:-1] + 1])
    for start, end in zip(starts, ends):
        np.testing.assert_array_equal(arrays["next_observations"][start:end], arrays["observations"][start + 1:end + 1])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run = behavior_run(tmp_path_factory.mktemp("behavior"))
    run.train(progress=False)
    return run


def test_training_record_checkpoints_log_and_references(trained):
    record = trained.record
    assert record["done"] and [c["step"] for c in record["checkpoints"]] == [100, 200, 300, 400]
    assert record["resumed_at"] == []
    for name in ("random", "expert"):
        assert record["references"][name]["episodes"] == 3 and np.isfinite(record["references"][name]["return_mean"])
    assert record["references"]["expert"]["step"] == 400 and record["references"]["random"]["step"] == 0
    logged = trained.logged_steps(400)
    assert len(logged["rewards"]) == 400 and logged["terminals"].any()  # hopper falls early in training
    assert_contiguous_episodes(logged, complete=False)
    for key in logged:
        np.testing.assert_array_equal(trained.logged_steps(200)[key], logged[key][:200])
    # Saved policies differ from the initialization once training has updated them.
    initial, final = jax.tree.leaves(trained.policy_params(0)), jax.tree.leaves(trained.policy_params(400))
    assert len(initial) == len(final) and not all(np.array_equal(a, b) for a, b in zip(initial, final))


def test_levels_sizes_policies_metadata_and_cache(trained):
    medium = trained.medium_checkpoint()
    assert medium["step"] in (100, 200, 300)
    for level, size in (("random", 250), ("medium", 250), ("expert", 250)):
        arrays = trained.level_arrays(level, size, num_envs=2)
        metadata = arrays["metadata"]
        assert len(arrays["rewards"]) == size
        assert_contiguous_episodes(arrays)
        assert d4rl.metadata_value(metadata, "level") == level
        assert d4rl.metadata_value(metadata, "policy_step") == {"random": 0, "medium": medium["step"],
                                                                "expert": 400}[level]
        assert d4rl.metadata_value(metadata, "ref_max_score") == trained.record["references"]["expert"]["return_mean"]
        assert d4rl.metadata_value(metadata, "ref_min_score") == trained.record["references"]["random"]["return_mean"]
        assert d4rl.metadata_value(metadata, "algorithm_name") == "SAC"
        assert d4rl.metadata_value(metadata, "algorithm_steps") == 400
        assert "gymnasium" in d4rl.metadata_value(metadata, "env_versions")
        assert d4rl.metadata_value(metadata, "env_id") == ENV_ID
    # The levels sample different policies in different envs.
    assert not np.array_equal(trained.level_arrays("random", 250)["actions"], trained.level_arrays("expert", 250)["actions"])
    # The expert level is the final policy's sampled actions, re-collected exactly.
    again, _ = collect.collect_steps(ENV_ID, trained.act, trained.policy_params(400), 250,
                                     d4rl.metadata_value(trained.level_arrays("expert", 250)["metadata"], "collection_seed"),
                                     num_envs=2)
    np.testing.assert_array_equal(again["actions"], trained.level_arrays("expert", 250)["actions"])

    replay = trained.level_arrays("medium-replay", None)
    logged = trained.logged_steps(medium["step"])
    assert len(replay["rewards"]) == medium["step"]
    np.testing.assert_array_equal(replay["observations"], logged["observations"])
    assert replay["terminals"][-1] or replay["timeouts"][-1]
    tail = trained.level_arrays("medium-replay", 60)
    np.testing.assert_array_equal(tail["actions"], logged["actions"][-60:])

    mixed = trained.level_arrays("medium-expert", 301)
    assert len(mixed["rewards"]) == 301
    np.testing.assert_array_equal(mixed["actions"][:150], trained.level_arrays("medium", 150)["actions"])
    np.testing.assert_array_equal(mixed["actions"][150:], trained.level_arrays("expert", 151)["actions"])
    names = sorted(os.listdir(os.path.join(trained.workdir, "levels")))
    assert "medium-expert-301.hdf5" in names and "medium-replay-all.hdf5" in names
    with pytest.raises(QrlInputError, match="unknown level"):
        trained.level_arrays("hard", 10)
    with pytest.raises(QrlInputError, match="needs a size"):
        trained.level_arrays("expert", None)


def test_interrupted_training_resumes_from_its_last_checkpoint(tmp_path, monkeypatch):
    calls = {"evaluations": 0}
    real_average_return = generate.average_return

    def interrupt_third_evaluation(*args, **kwargs):
        calls["evaluations"] += 1
        if calls["evaluations"] == 3:
            raise KeyboardInterrupt
        return real_average_return(*args, **kwargs)

    monkeypatch.setattr(generate, "average_return", interrupt_third_evaluation)
    with pytest.raises(KeyboardInterrupt):
        behavior_run(tmp_path).train(progress=False)
    monkeypatch.setattr(generate, "average_return", real_average_return)
    interrupted = behavior_run(tmp_path)
    assert not interrupted.trained and [c["step"] for c in interrupted.record["checkpoints"]] == [100, 200]

    starts = []
    real_train_host = offpolicy.train_host

    def spy(*args, **kwargs):
        starts.append(kwargs["start"])
        return real_train_host(*args, **kwargs)

    monkeypatch.setattr(generate.offpolicy, "train_host", spy)
    interrupted.train(progress=False)
    start = starts[0]
    assert start.env_steps == 200 and len(start.replay.reward) == 200
    assert [c["step"] for c in interrupted.record["checkpoints"]] == [100, 200, 300, 400]
    assert interrupted.record["resumed_at"] == [200] and interrupted.record["done"]
    logged = interrupted.logged_steps(400)
    assert len(logged["rewards"]) == 400
    assert logged["terminals"][199] or logged["timeouts"][199]  # the env restarted at the resume
    assert_contiguous_episodes(logged, complete=False)
    # Settings are part of the run: another SAC budget in the same workdir is refused.
    with pytest.raises(QrlInputError, match="other settings .*steps"):
        behavior_run(tmp_path, steps=500)


def run_module(module, *flags):
    return subprocess.run([sys.executable, "-m", module, *flags], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": REPO}, timeout=600)


def test_make_dataset_cli_writes_both_formats_from_one_training(tmp_path):
    workdir, out = tmp_path / "behavior", tmp_path / "hopper-medium.hdf5"
    common = [f"--env={ENV_ID}", "--level=medium", "--size=300", f"--workdir={workdir}", "--sac_steps=400",
              "--checkpoint_every=100", "--eval_episodes=1", "--reference_episodes=2", "--num_envs=2", "--seed=2",
              *[f"--set={key}={value}" for key, value in SAC_SETTINGS.items()]]
    first = run_module("launch.make_dataset", *common, f"--out={out}")
    assert first.returncode == 0, first.stderr
    assert "training SAC" in first.stdout and "medium gym:Hopper-v5: 300 transitions" in first.stdout
    second = run_module("launch.make_dataset", *common, "--format=minari", f"--out={tmp_path / 'minari'}")
    assert second.returncode == 0, second.stderr
    assert "training SAC" not in second.stdout and "collecting" not in second.stdout  # all reused
    minari_directory = tmp_path / "minari" / "qrl" / "hopper" / "medium-v0"
    cached = d4rl.read_hdf5(str(workdir / "levels" / "medium-300.hdf5"))
    for loaded in (files.read_steps(out), files.read_steps(minari_directory)):
        for key in collect.STEP_KEYS:
            assert loaded[key].dtype == cached[key].dtype
            np.testing.assert_array_equal(loaded[key], cached[key], err_msg=key)
        assert files.env_id(loaded["metadata"]) == ENV_ID
        assert d4rl.metadata_value(loaded["metadata"], "level") == "medium"
        reference, source = files.reference_returns("x", loaded["metadata"])
        assert source == "the dataset's metadata" and reference[1] == d4rl.metadata_value(cached["metadata"], "ref_max_score")
    for path in (out, minari_directory):
        info = run_module("launch.dataset_info", f"--dataset={path}")
        assert info.returncode == 0, info.stderr
        assert "level medium, generated by SAC (400 steps)" in info.stdout and "the dataset's metadata" in info.stdout
    assert "Minari (qrl/hopper/medium-v0)" in run_module("launch.dataset_info", f"--dataset={minari_directory}").stdout

    bad_inputs = [
        ([*common, f"--out={out}"], "exists; pass --overwrite"),
        ([*common, f"--out={tmp_path / 'other.hdf5'}", "--sac_steps=500"], "other settings (steps)"),
        ([*common[:1], "--level=hard", f"--out={tmp_path / 'x.hdf5'}"], "level"),
        (["--env=gym:CartPole-v1", "--level=random", f"--out={tmp_path / 'x.hdf5'}",
          f"--workdir={tmp_path / 'cartpole'}"], "continuous"),
        ([*common, "--size=0", f"--out={tmp_path / 'x.hdf5'}"], "--size"),
    ]
    for flags, message in bad_inputs:
        result = run_module("launch.make_dataset", *flags)
        assert result.returncode == 2, (flags, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1 and message in result.stderr, result.stderr
    assert not (tmp_path / "x.hdf5").exists() and not (tmp_path / "other.hdf5").exists()


def test_brax_ids_generate_through_the_host_loop(tmp_path):
    """A device-batched env (one brax env stepped from the host) trains, logs and collects alike."""
    env_id = "brax:inverted_pendulum"
    config = sac.config_for(env_id, {**SAC_SETTINGS, "learning_starts": 50})
    run = generate.BehaviorRun(sac.AGENT, config, env_id, 120, seed=0, workdir=str(tmp_path), checkpoint_every=60,
                               eval_episodes=1, reference_episodes=1, env_options={"episode_length": 40})
    record = run.train(progress=False)
    assert [c["step"] for c in record["checkpoints"]] == [60, 120]
    logged = run.logged_steps(120)
    assert len(logged["rewards"]) == 120 and (logged["terminals"] | logged["timeouts"]).any()
    assert_contiguous_episodes(logged, complete=False)
    arrays = run.level_arrays("expert", 90, num_envs=1)  # batch 1 again: no new brax compile
    assert len(arrays["rewards"]) == 90 and arrays["observations"].shape[1] == 4
    assert_contiguous_episodes(arrays)
    lengths = np.diff(np.concatenate([[-1], np.flatnonzero(arrays["terminals"] | arrays["timeouts"])]))
    assert lengths.max() <= 40  # the env's own episode limit
    assert d4rl.metadata_value(arrays["metadata"], "env_id") == env_id
    assert "brax" in d4rl.metadata_value(arrays["metadata"], "env_versions")


def test_random_level_is_written_without_training_and_gets_the_expert_reference_later(tmp_path):
    """`make_dataset --level=random` samples the initialization at once (no SAC training, only
    the random reference, the expert's marked missing); once the run is trained, asking again
    fills the cached level's expert reference, the steps unchanged."""
    workdir, out = tmp_path / "behavior", tmp_path / "hopper-random.hdf5"
    flags = [f"--env={ENV_ID}", "--level=random", "--size=250", f"--workdir={workdir}", "--sac_steps=400",
             "--checkpoint_every=100", "--eval_episodes=2", "--reference_episodes=3", "--num_envs=2", "--seed=1",
             *[f"--set={key}={value}" for key, value in SAC_SETTINGS.items()], "--set=flat_optimizer=true"]
    first = run_module("launch.make_dataset", *flags, f"--out={out}")
    assert first.returncode == 0, first.stderr
    assert "training SAC" not in first.stdout and "expert not measured yet" in first.stdout
    assert "no expert reference yet" in first.stderr
    assert not (workdir / "policies").exists() and not (workdir / "state").exists()
    written = files.read_steps(out)
    assert len(written["rewards"]) == 250
    assert d4rl.metadata_value(written["metadata"], "references_missing") == "expert"
    assert d4rl.metadata_value(written["metadata"], "ref_max_score") is None
    assert d4rl.metadata_value(written["metadata"], "policy_step") == 0
    random_return = d4rl.metadata_value(written["metadata"], "ref_min_score")

    config = sac.config_for(ENV_ID, {**SAC_SETTINGS, "flat_optimizer": True})  # what the CLI's one XLA thread picks
    run = generate.BehaviorRun(sac.AGENT, config, ENV_ID, 400, seed=1, workdir=str(workdir), checkpoint_every=100,
                               eval_episodes=2, reference_episodes=3)
    assert not run.trained and run.record["random_reference"]["return_mean"] == random_return
    run.train(progress=False)
    assert run.record["references"]["random"]["return_mean"] == random_return
    again = run.level_arrays("random", 250, num_envs=2)
    for key in collect.STEP_KEYS:
        np.testing.assert_array_equal(again[key], written[key], err_msg=key)
    assert d4rl.metadata_value(again["metadata"], "ref_max_score") == run.record["references"]["expert"]["return_mean"]
    assert d4rl.metadata_value(again["metadata"], "references_missing") == ""
    rewritten = run_module("launch.make_dataset", *flags, f"--out={out}", "--overwrite")
    assert rewritten.returncode == 0, rewritten.stderr
    assert "no expert reference yet" not in rewritten.stderr
    reference, source = files.reference_returns(out, files.read_steps(out)["metadata"])
    assert source == "the dataset's metadata" and reference == (random_return,
                                                                run.record["references"]["expert"]["return_mean"])


def test_a_bundle_rebuilds_every_level_exactly_without_training(trained, tmp_path):
    """The bundle holds the record, the medium and final policies and the steps up to medium; a
    run on it is trained and collects the same levels as the full workdir, step for step."""
    medium = trained.medium_checkpoint()["step"]
    written = trained.write_bundle(str(tmp_path / "bundle"))
    expected_steps = [os.path.join("steps", f"until_{step:09d}.npz") for step in range(100, medium + 1, 100)]
    assert sorted(written) == sorted(["training.json", *{os.path.join("policies", f"step_{step:09d}.msgpack")
                                                         for step in (medium, 400)}, *expected_steps])
    on_disk = sorted(os.path.relpath(os.path.join(root, name), tmp_path / "bundle")
                     for root, _, names in os.walk(tmp_path / "bundle") for name in names)
    assert on_disk == sorted(written) and not os.path.exists(str(tmp_path / "bundle.partial"))
    rebuilt = behavior_run(tmp_path / "bundle")
    assert rebuilt.trained and rebuilt.record == trained.record
    rebuilt.train(progress=False)  # nothing to train: no state, no new files
    assert not os.path.exists(tmp_path / "bundle" / "state")
    for level, size in (("random", 120), ("medium", 120), ("expert", 120), ("medium-replay", None),
                        ("medium-expert", 121)):  # sizes no other test caches (a cache keeps its num_envs)
        original, again = trained.level_arrays(level, size, num_envs=2), rebuilt.level_arrays(level, size, num_envs=2)
        for key in generate.STEP_KEYS:
            np.testing.assert_array_equal(again[key], original[key], err_msg=f"{level} {key}")
    with pytest.raises(QrlInputError, match="exists"):
        trained.write_bundle(str(tmp_path / "bundle"))
    with pytest.raises(QrlInputError, match="not trained"):
        behavior_run(tmp_path / "untrained").write_bundle(str(tmp_path / "nothing"))
    assert not os.path.exists(tmp_path / "nothing")
