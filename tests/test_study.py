"""launch.quarl_study end to end on a tiny budget: cells, resume, report; bad input exits 2."""

import json
import os
import shutil
import subprocess

import pytest

from tests.test_cli import assert_input_error, run_module

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--steps=2000", "--set=dqn.learning_starts=500", "--episodes=2", "--precisions=fp32,int8,int4", "--qat_bits=8"]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("study") / "quarl")
    completed = run_module("launch.quarl_study", f"--workdir={workdir}", "--agents=dqn", "--envs=gym:CartPole-v1", *TINY)
    assert completed.returncode == 0, completed.stderr + completed.stdout
    return workdir


def test_study_writes_tables_plots_and_cells(study):
    with open(os.path.join(study, "results.json")) as file:
        results = json.load(file)
    (pair,) = results["pairs"]
    assert pair["agent"] == "dqn" and pair["env"] == "gym:CartPole-v1"
    assert [row["precision"] for row in pair["ptq"]] == ["fp32", "int8", "int4"]
    assert [row["precision"] for row in pair["qat"]] == ["qat8 → int8"]
    assert pair["qat"][0]["quant_delay"] == 384  # half of the 768 updates: (2000 - 500 + 256) // 256 * 128.
    fp32 = pair["ptq"][0]
    assert fp32["relative_error"] == 0.0 and len(fp32["seed_means"]) == 1
    report = open(os.path.join(study, "report.md")).read()
    assert "| dqn | gym:CartPole-v1 |" in report and "E int8" in report and "E qat8 → int8" in report
    for name in ("sweetspot_dqn_gym_CartPole-v1.png", "weights_dqn_gym_CartPole-v1.png"):
        assert os.path.getsize(os.path.join(study, "plots", name)) > 1000
    with open(os.path.join(study, "cells/dqn/gym_CartPole-v1/seed0/qat8/train/results.json")) as file:
        train = json.load(file)
    assert train["qat_bits"] == 8 and train["quant_delay"] == 384


def test_study_skips_finished_cells_and_restarts_unfinished_runs(study):
    qat_train = os.path.join(study, "cells/dqn/gym_CartPole-v1/seed0/qat8/train")
    os.remove(os.path.join(qat_train, "results.json"))  # as if killed before the end.
    shutil.rmtree(os.path.join(study, "cells/dqn/gym_CartPole-v1/seed0/qat8/qat_eval"))
    completed = run_module("launch.quarl_study", f"--workdir={study}", "--agents=dqn", "--envs=gym:CartPole-v1", *TINY)
    assert completed.returncode == 0, completed.stderr
    assert "seed 0 fp32: already done" in completed.stdout
    assert "seed 0 qat8: trained, evaluated" in completed.stdout
    assert os.path.exists(os.path.join(qat_train, "results.json"))


def committed_files(study_dir: str) -> list[str]:
    """The study's files (relative paths) that .gitignore lets a commit keep, were the study under
    results/<group>/<name>/ as the README's studies are."""
    paths = sorted(os.path.relpath(os.path.join(root, name), study_dir)
                   for root, _, names in os.walk(study_dir) for name in names)
    as_committed = [f"results/quarl_study/tiny/{path}" for path in paths]
    checked = subprocess.run(["git", "check-ignore", "--no-index", "--stdin"], cwd=REPO_ROOT, text=True,
                             input="\n".join(as_committed) + "\n", capture_output=True)
    assert checked.returncode in (0, 1), checked.stderr
    ignored = set(checked.stdout.split())
    return [path for path, committed in zip(paths, as_committed) if committed not in ignored]


def test_study_resumes_from_its_committed_files_alone(study, tmp_path):
    kept = committed_files(study)
    cell = "cells/dqn/gym_CartPole-v1/seed0"
    assert f"{cell}/fp32/ptq/results.json" in kept and f"{cell}/qat8/qat_eval/results.json" in kept
    assert f"{cell}/fp32/train/results.json" in kept and "report.md" in kept
    assert not any("/checkpoints/" in path or "/tb/" in path for path in kept)  # checkpoints stay local.
    resumed = str(tmp_path / "quarl")
    for path in kept:
        os.makedirs(os.path.dirname(os.path.join(resumed, path)), exist_ok=True)
        shutil.copy(os.path.join(study, path), os.path.join(resumed, path))
    completed = run_module("launch.quarl_study", f"--workdir={resumed}", "--agents=dqn", "--envs=gym:CartPole-v1", *TINY)
    assert completed.returncode == 0, completed.stderr
    assert "seed 0 fp32: already done" in completed.stdout and "seed 0 qat8: already done" in completed.stdout
    with open(os.path.join(study, "results.json")) as original, open(os.path.join(resumed, "results.json")) as again:
        assert json.load(original)["pairs"] == json.load(again)["pairs"]
    # An evaluation still to do needs the checkpoint the commit left out: the cell trains again.
    os.remove(os.path.join(resumed, cell, "qat8/qat_eval/results.json"))
    completed = run_module("launch.quarl_study", f"--workdir={resumed}", "--agents=dqn", "--envs=gym:CartPole-v1", *TINY)
    assert completed.returncode == 0, completed.stderr
    assert "seed 0 fp32: already done" in completed.stdout and "seed 0 qat8: trained, evaluated" in completed.stdout


@pytest.mark.parametrize("args,fragment", [
    (["--agents=dqn", "--envs=gym:Pendulum-v1"], "unsupported algorithm/environment pair dqn × gym:Pendulum-v1"),
    (["--qat_bits=9"], "--qat_bits values must be in 2..8"),
    (["--qat_bits=1"], "--qat_bits values must be in 2..8"),
    (["--quant_delay_fraction=1.0"], "--quant_delay_fraction must be in [0, 1)"),
    (["--set=learning_rate=1"], "--set expects agent.key=value"),
    (["--set=dqn.no_such_key=1"], "unknown DQN config key"),
    (["--agents=nope"], "unknown agent 'nope'"),
    (["--precisions=int1"], "bits must be in 2..16"),
    (["--seeds=-1"], "--seeds values must be >= 0"),
])
def test_study_bad_input_is_one_line_and_exit_2(tmp_path, args, fragment):
    workdir = str(tmp_path / "study")
    assert_input_error(run_module("launch.quarl_study", f"--workdir={workdir}", "--steps=100", *args), fragment)
    assert not os.path.exists(os.path.join(workdir, "cells"))


def test_study_runs_on_every_environment_family(tmp_path):
    """Atari (CNN), gymnasium MuJoCo, dm_control and brax cells, a few steps each; incompatible
    pairs of the grid are skipped with a line saying why."""
    workdir = str(tmp_path / "families")
    completed = run_module(
        "launch.quarl_study", f"--workdir={workdir}", "--agents=dqn,sac",
        "--envs=atari:Pong,gym:HalfCheetah-v5,dmc:cartpole-balance,brax:halfcheetah", "--skip_incompatible",
        "--steps=200", "--set=dqn.buffer_size=1000", "--set=dqn.learning_starts=1000",
        "--set=sac.learning_starts=100", "--set=sac.batch_size=32", "--set=sac.buffer_size=1000",
        "--episodes=1", "--eval_max_steps=20", "--probe_steps=32", "--precisions=fp32,int8", "--qat_bits=",
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "skipping dqn × brax:halfcheetah" in completed.stdout and "skipping sac × atari:Pong" in completed.stdout
    with open(os.path.join(workdir, "results.json")) as file:
        pairs = {(pair["agent"], pair["env"]): pair for pair in json.load(file)["pairs"]}
    assert set(pairs) == {("dqn", "atari:Pong"), ("sac", "gym:HalfCheetah-v5"), ("sac", "dmc:cartpole-balance"),
                          ("sac", "brax:halfcheetah")}
    for pair in pairs.values():
        assert [row["precision"] for row in pair["ptq"]] == ["fp32", "int8"]
    assert pairs[("dqn", "atari:Pong")]["divergence"] == "categorical"
    assert pairs[("sac", "brax:halfcheetah")]["divergence"] == "deterministic"


def test_lowest_bits_keeps_every_wider_width_within_tolerance():
    from qrl.quant.study_report import lowest_bits, lowest_bits_table

    rows = [{"bits": 8, "relative_error": 0.01}, {"bits": 6, "relative_error": -0.04},
            {"bits": 4, "relative_error": 0.30}, {"bits": 3, "relative_error": 0.02}]
    assert lowest_bits(rows) == 6  # 3 bits is within 5% but 4 bits, wider, is not
    assert lowest_bits([{"bits": 8, "relative_error": 0.2}]) is None
    assert lowest_bits([{"bits": 8, "relative_error": None}]) is None
    pair = {"agent": "dqn", "env": "gym:CartPole-v1", "fp32_return": 500.0, "qat": [],
            "ptq": [{"family": "float", "bits": 16, "relative_error": 0.0},
                    *({"family": "quarl", **row} for row in rows),
                    {"family": "int", "bits": 8, "relative_error": 0.5}]}
    table = lowest_bits_table([pair]).splitlines()
    assert table[0] == "| algorithm | environment | fp32 return | quarl | int | |E| ≤ 5% at 8 bits |"
    assert table[2] == "| dqn | gym:CartPole-v1 | 500.0 | 6 | none | quarl |"
    pair["ptq"] = [row for row in pair["ptq"] if row["family"] != "quarl"]
    assert lowest_bits_table([pair]).splitlines()[2].endswith("| **none** |")


@pytest.mark.parametrize("where", ["--parallel=2", "--launcher=ray"])
def test_study_cells_in_two_processes_or_ray_tasks_give_the_sequential_returns(study, tmp_path, where):
    workdir = str(tmp_path / "parallel")
    completed = run_module("launch.quarl_study", f"--workdir={workdir}", "--agents=dqn", "--envs=gym:CartPole-v1",
                           where, *TINY)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "seed 0 fp32: trained, evaluated" in completed.stdout and "seed 0 qat8: trained, evaluated" in completed.stdout
    with open(os.path.join(study, "results.json")) as one, open(os.path.join(workdir, "results.json")) as two:
        (sequential,), (parallel,) = json.load(one)["pairs"], json.load(two)["pairs"]
    for kind in ("ptq", "qat"):
        assert [row["seed_means"] for row in parallel[kind]] == [row["seed_means"] for row in sequential[kind]]
    assert_input_error(run_module("launch.quarl_study", f"--workdir={tmp_path / 'bad'}", "--parallel=0", *TINY),
                       "--parallel must be >= 1")
    assert not os.path.exists(tmp_path / "bad")
