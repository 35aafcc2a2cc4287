"""Workdir ownership: qrl writes only where it may and deletes only what its marker lists."""

import json
import os

import pytest

from qrl import workdirs
from qrl.errors import QrlInputError
from tests.test_cli import assert_input_error, run_module


def _write(path, text="x"):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as file:
        file.write(text)


def _fake_train_outputs(workdir):
    """What a train run leaves: files and directories named in the train kind's outputs."""
    _write(os.path.join(workdir, "config.json"), "{}")
    _write(os.path.join(workdir, "results.json"), "{}")
    _write(os.path.join(workdir, "checkpoints", "100", "state"), "s")
    _write(os.path.join(workdir, "tb", "events"), "e")
    _write(os.path.join(workdir, ".metrics.csv.0123456789abcdef0123456789abcdef.tmp"), "partial")


def test_claim_creates_the_directory_and_writes_the_marker(tmp_path):
    workdir = str(tmp_path / "a" / "b")
    workdirs.claim(workdir, "train")

    with open(os.path.join(workdir, workdirs.MARKER_FILE)) as file:
        marker = json.load(file)
    assert marker["kind"] == "train" and marker["qrl_version"]
    assert marker["created"].endswith("+00:00")
    assert marker["entries"] == sorted(workdirs.RUN_OUTPUTS["train"])
    assert os.listdir(workdir) == [workdirs.MARKER_FILE]


def test_an_empty_existing_directory_is_claimed(tmp_path):
    workdirs.claim(str(tmp_path), "demo")
    assert workdirs.read_marker(str(tmp_path))["kind"] == "demo"


def test_a_non_empty_directory_without_marker_is_refused_and_untouched(tmp_path):
    _write(str(tmp_path / "config.json"), "{}")
    _write(str(tmp_path / "thesis.tex"), "mine")

    for overwrite in (False, True):
        with pytest.raises(QrlInputError, match="is not empty and has no qrl-workdir.json"):
            workdirs.claim(str(tmp_path), "train", overwrite=overwrite)
    assert sorted(os.listdir(tmp_path)) == ["config.json", "thesis.tex"]
    with pytest.raises(QrlInputError, match="will not delete in it"):
        workdirs.remove_outputs(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["config.json", "thesis.tex"]


def test_a_run_is_refused_without_overwrite(tmp_path):
    workdir = str(tmp_path)
    workdirs.claim(workdir, "train")
    _fake_train_outputs(workdir)

    with pytest.raises(QrlInputError, match=r"already holds a qrl train run \(checkpoints, config.json, .*--overwrite"):
        workdirs.claim(workdir, "train")
    assert os.path.exists(os.path.join(workdir, "results.json"))


def test_overwrite_removes_only_the_listed_entries(tmp_path):
    workdir = str(tmp_path)
    workdirs.claim(workdir, "train")
    _fake_train_outputs(workdir)
    _write(os.path.join(workdir, "notes.md"), "mine")
    _write(os.path.join(workdir, "plots", "mine.png"), "mine")

    workdirs.claim(workdir, "train", overwrite=True)

    assert sorted(os.listdir(workdir)) == sorted([workdirs.MARKER_FILE, "notes.md", "plots"])
    assert os.path.exists(os.path.join(workdir, "plots", "mine.png"))


def test_overwrite_may_be_limited_to_some_kinds(tmp_path):
    workdir = str(tmp_path)
    workdirs.claim(workdir, "train")
    _fake_train_outputs(workdir)

    with pytest.raises(QrlInputError, match="holds a qrl train run, not a demo run"):
        workdirs.claim(workdir, "demo", overwrite=True, overwritable_kinds=("demo",))
    assert os.path.exists(os.path.join(workdir, "results.json"))
    assert workdirs.read_marker(workdir)["kind"] == "train"


def test_a_marked_directory_whose_outputs_are_gone_is_claimed_again(tmp_path):
    workdir = str(tmp_path)
    workdirs.claim(workdir, "actorq")
    _write(os.path.join(workdir, "notes.md"), "mine")
    workdirs.claim(workdir, "actorq")
    assert sorted(os.listdir(workdir)) == sorted([workdirs.MARKER_FILE, "notes.md"])


def test_remove_outputs_keeps_the_marker_and_user_files(tmp_path):
    workdir = str(tmp_path)
    workdirs.claim(workdir, "train")
    _fake_train_outputs(workdir)
    _write(os.path.join(workdir, "notes.md"), "mine")

    removed = workdirs.remove_outputs(workdir)

    assert removed == [".metrics.csv.0123456789abcdef0123456789abcdef.tmp", "checkpoints", "config.json",
                       "results.json", "tb"]
    assert sorted(os.listdir(workdir)) == sorted([workdirs.MARKER_FILE, "notes.md"])
    assert workdirs.remove_outputs(str(tmp_path / "absent")) == []


@pytest.mark.parametrize("make", ["file", "under_file"])
def test_a_path_that_is_or_lies_under_a_file_is_refused(tmp_path, make):
    _write(str(tmp_path / "f"), "mine")
    workdir = str(tmp_path / "f") if make == "file" else str(tmp_path / "f" / "run")
    with pytest.raises(QrlInputError, match="not a directory"):
        workdirs.claim(workdir, "train")
    assert os.listdir(tmp_path) == ["f"]


def test_a_path_with_an_overlong_name_is_refused(tmp_path):
    with pytest.raises(QrlInputError, match="cannot create workdir"):
        workdirs.claim(str(tmp_path / ("n" * 300)), "train")
    assert os.listdir(tmp_path) == []


def test_an_unwritable_parent_is_refused(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    os.chmod(locked, 0o500)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("running as a user who may write anywhere")
        with pytest.raises(QrlInputError, match="cannot create workdir"):
            workdirs.claim(str(locked / "run"), "train")
    finally:
        os.chmod(locked, 0o700)


@pytest.mark.parametrize("text", ["not json", '{"kind": "train", "entries": ["../x"]}', '{"entries": []}',
                                  '{"kind": "mine", "entries": []}'])
def test_a_malformed_marker_is_refused(tmp_path, text):
    _write(str(tmp_path / workdirs.MARKER_FILE), text)
    with pytest.raises(QrlInputError, match=workdirs.MARKER_FILE.replace(".", r"\.")):
        workdirs.claim(str(tmp_path), "train", overwrite=True)


def test_an_edited_marker_removes_only_names_its_kind_writes(tmp_path):
    workdir = str(tmp_path)
    workdirs.claim(workdir, "train")
    _fake_train_outputs(workdir)
    _write(os.path.join(workdir, "thesis.tex"), "mine")
    marker = workdirs.read_marker(workdir)
    marker["entries"].append("thesis.tex")
    _write(os.path.join(workdir, workdirs.MARKER_FILE), json.dumps(marker))

    removed = workdirs.remove_outputs(workdir)

    assert "thesis.tex" not in removed and "config.json" in removed
    assert sorted(os.listdir(workdir)) == sorted([workdirs.MARKER_FILE, "thesis.tex"])


def test_require_kind(tmp_path):
    with pytest.raises(QrlInputError, match="does not exist"):
        workdirs.require_kind(str(tmp_path / "absent"), ("train",), "--resume")
    _write(str(tmp_path / "x"), "mine")
    with pytest.raises(QrlInputError, match="holds no qrl run"):
        workdirs.require_kind(str(tmp_path), ("train",), "--resume")
    workdirs.claim(str(tmp_path / "d"), "demo")
    with pytest.raises(QrlInputError, match="holds a qrl demo run, not a train run"):
        workdirs.require_kind(str(tmp_path / "d"), ("train",), "--resume")


# ----- entry points ------------------------------------------------------------------------

TINY_TRAIN = ("--agent=dqn", "--env=gym:CartPole-v1", "--steps=10", "--set=learning_starts=5", "--eval_episodes=1",
              "--progress=false")


def _listing(directory):
    return sorted(os.listdir(directory))


def test_train_refuses_a_foreign_directory_and_a_file(tmp_path):
    foreign = tmp_path / "foreign"
    _write(str(foreign / "data.csv"), "mine")
    assert_input_error(run_module("launch.train", *TINY_TRAIN, f"--workdir={foreign}", "--overwrite"),
                       "has no qrl-workdir.json")
    assert _listing(foreign) == ["data.csv"]
    _write(str(tmp_path / "file"), "mine")
    assert_input_error(run_module("launch.train", *TINY_TRAIN, f"--workdir={tmp_path / 'file' / 'run'}"), "not a directory")
    assert _listing(tmp_path) == ["file", "foreign"]


def test_train_overwrite_keeps_user_files(tmp_path):
    workdir = tmp_path / "run"
    completed = run_module("launch.train", *TINY_TRAIN, f"--workdir={workdir}")
    assert completed.returncode == 0, completed.stderr
    _write(str(workdir / "notes.md"), "mine")
    assert_input_error(run_module("launch.train", *TINY_TRAIN, f"--workdir={workdir}"), "--overwrite")

    completed = run_module("launch.train", *TINY_TRAIN, "--steps=20", f"--workdir={workdir}", "--overwrite")

    assert completed.returncode == 0, completed.stderr
    with open(workdir / "notes.md") as file:
        assert file.read() == "mine"
    with open(workdir / "results.json") as file:
        assert json.load(file)["env_steps"] == 20


def test_demo_replaces_only_its_own_outputs(tmp_path):
    demo = ("--steps=10", "--episodes=1", "--precisions=fp32,int8")
    foreign = tmp_path / "foreign"
    _write(str(foreign / "config.json"), "{}")
    assert_input_error(run_module("launch.demo", *demo, f"--workdir={foreign}"), "has no qrl-workdir.json")
    assert _listing(foreign) == ["config.json"]

    bad = tmp_path / "bad_precisions"
    assert_input_error(run_module("launch.demo", "--steps=10", "--precisions=int1", f"--workdir={bad}"), "bits")
    assert not os.path.exists(bad)

    workdir = tmp_path / "demo"
    for _ in range(2):  # `make demo` twice: the second run replaces the first's outputs
        completed = run_module("launch.demo", *demo, f"--workdir={workdir}")
        assert completed.returncode == 0, completed.stderr
        _write(str(workdir / "notes.md"), "mine")
    assert os.path.isfile(workdir / "report.md") and os.path.isfile(workdir / "ptq" / "results.json")
    with open(workdir / "notes.md") as file:
        assert file.read() == "mine"

    train_run = tmp_path / "train"
    completed = run_module("launch.train", *TINY_TRAIN, f"--workdir={train_run}")
    assert completed.returncode == 0, completed.stderr
    before = _listing(train_run)
    assert_input_error(run_module("launch.demo", *demo, f"--workdir={train_run}"), "not a demo run")
    assert _listing(train_run) == before
