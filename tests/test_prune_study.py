"""The pruning study: `launch.prune_study` (cells, resume, failures, bad input) and
`pruning.study_report` (IQM, bootstrap, rows, mask overlap, report)."""

import json
import os
import signal
import re
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from launch import prune_study
from launch.prune_runs import run_prune_offline
from pruning import study_report
from qrl.errors import QrlInputError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = dict(algos="bc", pruners="snip,grasp", sparsities="0,0.9", seeds="0", steps=30, eval_every=0,
            eval_episodes=1, prune_batch_size=64, sets=["bc.hidden_sizes=32-32", "bc.batch_size=32"])


class Counting:
    """A runner that records the cells it runs (by workdir) and delegates to `run_prune_offline`."""

    def __init__(self, fail_pruner=None, error=RuntimeError):
        self.dirs, self.fail_pruner, self.error = [], fail_pruner, error

    def __call__(self, run, workdir, **options):
        self.dirs.append(workdir)
        if run.pruner == self.fail_pruner:
            raise self.error(f"{run.pruner} broke")
        return run_prune_offline(run, workdir, **options)


def test_tiny_study_runs_end_to_end_then_resumes(swingup_dataset, tmp_path):
    workdir = tmp_path / "study"
    options = prune_study.make_options(str(workdir), swingup_dataset, **TINY)
    runner, lines = Counting(), []
    outcome = prune_study.run_study(options, runner=runner, progress=False, log=lines.append)
    assert outcome["failed"] == [] and len(runner.dirs) == 3
    cells = workdir / "cells" / "pendulum-swingup" / "bc"
    for relative in ("none/s0/seed0", "snip/s0.9/seed0", "grasp/s0.9/seed0"):
        assert (cells / relative / "results.json").is_file(), relative
    report = (workdir / "report.md").read_text()
    assert "| pendulum-swingup | bc | dense | 0 | 1 | normalized |" in report
    assert "| pendulum-swingup | bc | snip | 0.9 | 1 | normalized |" in report
    assert "## Policy memory" in report and "csr int8" in report
    assert "| pendulum-swingup | bc | 0.9 | snip vs grasp | actor |" in report
    for name in ("score_vs_sparsity_pendulum-swingup_bc", "layer_kept_pendulum-swingup_bc"):
        assert (workdir / "plots" / f"{name}.png").stat().st_size > 0 and f"plots/{name}.png" in report
    summary = json.loads((workdir / "summary.json").read_text())
    rows = {(row["pruner"], row["sparsity"]): row for row in summary["rows"]}
    assert set(rows) == {("none", 0.0), ("snip", 0.9), ("grasp", 0.9)}
    assert rows[("none", 0.0)]["kept_fraction"] == {"actor": 1.0}
    assert rows[("snip", 0.9)]["kept_fraction"]["actor"] == pytest.approx(0.1, abs=0.01)
    assert rows[("snip", 0.9)]["policy_vs_dense_fp32"]["csr int8"] < 0.2

    again = Counting()
    assert prune_study.run_study(options, runner=again, progress=False, log=lines.append)["failed"] == []
    assert again.dirs == [] and lines[-1].startswith("[3/3]") and "already done" in lines[-1]
    os.remove(cells / "snip/s0.9/seed0/results.json")
    rerun = Counting()
    prune_study.run_study(options, runner=rerun, progress=False, log=lines.append)
    assert rerun.dirs == [str(cells / "snip/s0.9/seed0")] and (cells / "snip/s0.9/seed0/results.json").is_file()

    # A crashing cell is recorded and the study goes on; bad input in a cell stops it.
    os.remove(cells / "grasp/s0.9/seed0/results.json")
    outcome = prune_study.run_study(options, runner=Counting(fail_pruner="grasp"), progress=False, log=lines.append)
    assert len(outcome["failed"]) == 1 and "RuntimeError: grasp broke" in outcome["failed"][0]
    assert "RuntimeError: grasp broke" in (cells / "grasp/s0.9/seed0.error.txt").read_text()
    assert "## Cells without results" in (workdir / "report.md").read_text()
    with pytest.raises(QrlInputError, match="grasp s0.9 seed 0: grasp broke"):
        prune_study.run_study(options, runner=Counting("grasp", QrlInputError), progress=False, log=lines.append)


def test_dense_runs_once_per_seed_and_is_shared_by_every_pruner(tmp_path):
    dataset = tmp_path / "hopper-medium.hdf5"
    dataset.write_bytes(b"")
    options = prune_study.make_options(str(tmp_path / "study"), str(dataset), "bc", "none,snip,grasp", "0.9,0,0.5",
                                       "0,1")
    cells = prune_study.plan_cells(options)
    assert [(cell.pruner, cell.sparsity) for cell in cells if cell.seed == 0] == [
        ("none", 0.0), ("snip", 0.5), ("snip", 0.9), ("grasp", 0.5), ("grasp", 0.9)]
    assert len(cells) == 10 and cells[0].relative_dir == os.path.join("cells", "hopper-medium", "bc", "none", "s0", "seed0")
    split = prune_study.make_options(str(tmp_path / "study"), str(dataset), "bcq", "snip", "0.9", "0",
                                     separate=["vae/encoder", "vae/decoder"])
    assert prune_study.cell_run(prune_study.plan_cells(split)[0], split).settings.separate == ("vae/encoder",
                                                                                               "vae/decoder")
    bad = [
        (dict(algos="cql"), "unknown offline algorithm 'cql'"),
        (dict(pruners="snip,snap"), "unknown pruner 'snap'"),
        (dict(sparsities="0,1"), "sparsity must be in [0, 1), got 1.0"),
        (dict(sparsities="0,half"), "--sparsities takes comma-separated numbers"),
        (dict(seeds="0,x"), "--seeds takes comma-separated integers"),
        (dict(sets=["td3_bc.hidden_sizes=8"]), "not in --agents"),
        (dict(steps=0), "--steps must be >= 1"),
        (dict(scope="layer", separate=["vae/encoder"]), "separate thresholds apply to snip, grasp and magnitude at network"),
        (dict(separate=["vae"]), "separate takes network/module paths like vae/encoder"),
    ]
    for change, message in bad:
        arguments = {"algos": "bc", "pruners": "snip", "sparsities": "0.9", "seeds": "0", **change}
        with pytest.raises(QrlInputError, match=re.escape(message)):
            prune_study.make_options(str(tmp_path / "bad"), str(dataset), **arguments)
    with pytest.raises(QrlInputError, match="no such dataset"):
        prune_study.make_options(str(tmp_path / "bad"), str(tmp_path / "missing.hdf5"), "bc", "snip", "0.9", "0")
    assert not (tmp_path / "bad").exists()


def test_cli_bad_input_is_one_line_and_exit_2_with_nothing_written(tmp_path):
    dataset = tmp_path / "pendulum.hdf5"
    dataset.write_bytes(b"")
    for flags, message in [([f"--datasets={tmp_path / 'missing.hdf5'}"], "no such dataset"),
                           ([f"--datasets={dataset}", "--pruners=snip,snap"], "unknown pruner 'snap'"),
                           ([f"--datasets={dataset}", "--stop_after_minutes=-1"], "--stop_after_minutes must be >= 0"),
                           (["--report_only"], "study.json does not exist (run the study first)")]:
        result = subprocess.run([sys.executable, "-m", "launch.prune_study", f"--workdir={tmp_path / 'study'}", *flags],
                                cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": REPO},
                                timeout=300)
        assert result.returncode == 2, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and message in result.stderr, result.stderr
    assert not (tmp_path / "study").exists()


class Slow(Counting):
    """A runner that takes at least `seconds` per cell."""

    def __init__(self, seconds):
        super().__init__()
        self.seconds = seconds

    def __call__(self, run, workdir, **options):
        time.sleep(self.seconds)
        return super().__call__(run, workdir, **options)


def test_stop_after_leaves_cells_for_a_rerun_and_report_only_rewrites_the_report(swingup_dataset, tmp_path):
    workdir = tmp_path / "study"
    options = prune_study.make_options(str(workdir), swingup_dataset, **TINY)
    slow, lines = Slow(1.0), []
    outcome = prune_study.run_study(options, runner=slow, progress=False, log=lines.append, stop_after_s=0.5)
    assert len(slow.dirs) == 1 and len(outcome["pending"]) == 2 and outcome["failed"] == []
    assert lines[-1].startswith("stopped after") and "2 of 3 cells left" in lines[-1]
    assert "**Partial: 1 of 3 planned cells have results**" in (workdir / "report.md").read_text()

    os.remove(workdir / "report.md")
    again = prune_study.report_only(str(workdir))
    assert again["pending"] == outcome["pending"] and again["failed"] == []
    assert "**Partial: 1 of 3 planned cells have results**" in (workdir / "report.md").read_text()
    assert json.loads((workdir / "summary.json").read_text())["pending"] == outcome["pending"]

    rest = Counting()
    assert prune_study.run_study(options, runner=rest, progress=False, log=lines.append)["pending"] == []
    assert len(rest.dirs) == 2 and "Partial" not in (workdir / "report.md").read_text()
    (workdir / "study.json").write_text("{}")
    with pytest.raises(QrlInputError, match="is not a study plan"):
        prune_study.report_only(str(workdir))


def test_iqm_and_bootstrap_by_hand():
    assert study_report.iqm([100.0, 1.0, 3.0, 2.0, 4.0]) == 3.0  # cut 1 at each end: mean of 2, 3, 4
    assert study_report.iqm([4.0, 1.0, 3.0, 2.0]) == 2.5
    assert study_report.iqm([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 80.0]) == 4.5  # cut 2: mean of 3..6
    assert study_report.iqm([1.0, 2.0, 10.0]) == pytest.approx(13.0 / 3.0)  # fewer than 4: the mean
    assert study_report.bootstrap_interval([5.0, 5.0, 5.0]) == (5.0, 5.0)
    # Means of two draws from {0, 10}: 0 (1/4), 5 (1/2), 10 (1/4) -> the 2.5% and 97.5% points are 0 and 10.
    assert study_report.bootstrap_interval([0.0, 10.0]) == (0.0, 10.0)
    values = [1.0, 2.0, 3.0, 4.0, 100.0]
    low, high = study_report.bootstrap_interval(values, seed=3)
    assert (low, high) == study_report.bootstrap_interval(values, seed=3) and 1.0 <= low <= 3.0 <= high <= 100.0


def _results(score, kept=None, layers=None, csr_int8=100.0, final_return=-500.0):
    masks = {"actor": None if kept is None else {"kept_fraction": kept, "layers": layers or {}}}
    memory = [{"format": "dense", "precision": "fp32", "bytes": 1000.0},
              {"format": "csr", "precision": "int8", "bytes": csr_int8}]
    return {"normalized_score": None if score is None else {"mean": score, "std": 0.0},
            "final_eval": {"mean": final_return, "std": 0.0}, "masks": masks, "policy_memory": memory}


def _cell(pruner, sparsity, seed, results, task="pendulum", masks=None):
    return {"task": task, "algo": "bc", "pruner": pruner, "sparsity": sparsity, "seed": seed, "results": results,
            "masks": masks or {}}


def test_gather_rows_by_hand():
    cells = [_cell("snip", 0.9, seed, _results(score, 0.1 + 0.02 * (seed % 2), {"head/kernel": 0.2 + 0.2 * seed},
                                                csr_int8=100.0 + 2 * seed))
             for seed, score in enumerate([30.0, 10.0, 100.0, 20.0])]
    cells += [_cell("none", 0.0, seed, _results(score)) for seed, score in zip([2, 0, 1], [70.0, 50.0, 60.0])]
    cells += [_cell("none", 0.0, 0, _results(None, final_return=-300.0), task="raw"),
              _cell("none", 0.0, 1, _results(None, final_return=-100.0), task="raw")]
    rows = study_report.gather(cells)
    assert [(row["task"], row["pruner"]) for row in rows] == [("pendulum", "none"), ("pendulum", "snip"), ("raw", "none")]
    dense, snip, raw = rows
    assert dense["seeds"] == [0, 1, 2] and dense["scores"] == [50.0, 60.0, 70.0]
    assert dense["score_mean"] == 60.0 and dense["score_std"] == pytest.approx(np.sqrt(200.0 / 3.0))
    assert dense["iqm"] == 60.0 and dense["iqm_note"] == "3 seed(s) < 4: IQM is the mean"
    assert dense["kept_fraction"] == {"actor": 1.0} and dense["layers"] == {"actor": {}}
    assert snip["score_mean"] == 40.0 and snip["score_std"] == pytest.approx(np.sqrt(1250.0))
    assert snip["iqm"] == 25.0 and snip["iqm_note"] is None
    assert snip["iqm_ci"][0] <= 25.0 <= snip["iqm_ci"][1]
    assert snip["kept_fraction"]["actor"] == pytest.approx(0.11) and snip["layers"]["actor"]["head/kernel"] == pytest.approx(0.5)
    assert snip["policy_bytes"] == {"dense fp32": 1000.0, "csr int8": 103.0}
    assert snip["policy_vs_dense_fp32"]["csr int8"] == pytest.approx(0.103)
    assert raw["score_kind"] == "return" and raw["score_mean"] == -200.0 and raw["score_std"] == 100.0
    memory = study_report.memory_table(rows)
    assert memory[1]["bytes"]["csr int8"] == 103.0 and memory[1]["sparsity"] == 0.9
    assert "| pendulum | bc | dense | 0 | 3 | normalized | 60.0 ± 8.2 | 60.0 [" in study_report.score_markdown(rows)
    assert "| pendulum | bc | snip | 0.9 | 1,000 (1.000×) | 103 (0.103×) |" in study_report.memory_markdown(memory)
    with pytest.raises(QrlInputError, match="same seed"):
        study_report.gather(cells + [_cell("none", 0.0, 0, _results(1.0))])


def _stored(*kept):
    return {"torso": {"dense_0": {"kernel": np.asarray(kept, np.uint8).reshape(2, 2)}}}


def test_mask_overlap_table_identical_disjoint_and_partial():
    a, b = _stored(1, 1, 0, 0), _stored(0, 1, 1, 0)
    cells = [
        _cell("snip", 0.5, 0, {}, masks={"actor": a, "critic": a}),
        _cell("grasp", 0.5, 0, {}, masks={"actor": a, "critic": _stored(0, 0, 1, 1)}),
        _cell("random", 0.5, 0, {}, masks={"actor": b}),
        _cell("snip", 0.5, 1, {}, masks={"actor": a}),
        _cell("random", 0.5, 1, {}, masks={"actor": a}),
        _cell("none", 0.0, 0, {}, masks={}),
    ]
    table = {(row["pruner_a"], row["pruner_b"], row["network"]): (row["overlap"], row["seeds"])
             for row in study_report.mask_overlap_table(cells)}
    assert table[("snip", "grasp", "actor")] == (1.0, 1)
    assert table[("snip", "grasp", "critic")] == (0.0, 1)
    assert table[("snip", "random", "actor")] == (pytest.approx((1.0 / 3.0 + 1.0) / 2.0), 2)
    assert table[("grasp", "random", "actor")] == (pytest.approx(1.0 / 3.0), 1)
    assert len(table) == 4


def test_cells_trained_as_one_program_match_cell_by_cell_and_resume(swingup_dataset, tmp_path):
    from launch.prune_runs import read_masks, restore_offline_run, run_prune_offline_many

    plan = dict(TINY, seeds="0,1")
    sequential = prune_study.make_options(str(tmp_path / "one_by_one"), swingup_dataset, **plan)
    assert prune_study.run_study(sequential, progress=False, log=lambda line: None)["failed"] == []
    batched = prune_study.make_options(str(tmp_path / "programs"), swingup_dataset, **plan, configs_per_program=4)
    programs, lines = [], []

    def counting(runs, dirs, **options):
        programs.append(list(dirs))
        return run_prune_offline_many(runs, dirs, **options)

    assert prune_study.run_study(batched, progress=False, log=lines.append, many_runner=counting)["failed"] == []
    assert [len(dirs) for dirs in programs] == [4, 2]  # 6 cells of one task and algorithm, 4 per program
    for cell in prune_study.plan_cells(batched):
        mine, theirs = tmp_path / "programs" / cell.relative_dir, tmp_path / "one_by_one" / cell.relative_dir
        mine_results = json.loads((mine / "results.json").read_text())
        their_results = json.loads((theirs / "results.json").read_text())
        np.testing.assert_allclose(mine_results["final_eval"]["returns"], their_results["final_eval"]["returns"],
                                   rtol=1e-3)
        assert mine_results["masks"] == their_results["masks"] and mine_results["updates"] == 30
        if cell.pruner != "none":
            for a, b in zip(jax.tree.leaves(read_masks(str(mine))), jax.tree.leaves(read_masks(str(theirs)))):
                np.testing.assert_array_equal(a, b)
        assert restore_offline_run(str(mine)).step == 30
    assert (tmp_path / "programs" / "report.md").is_file()

    cells = tmp_path / "programs" / "cells" / "pendulum-swingup" / "bc"
    os.remove(cells / "grasp/s0.9/seed1/results.json")
    programs.clear()
    prune_study.run_study(batched, progress=False, log=lines.append, many_runner=counting)
    assert programs == [[str(cells / "grasp/s0.9/seed1")]]

    def broken(runs, dirs, **options):
        raise RuntimeError("program broke")

    os.remove(cells / "snip/s0.9/seed0/results.json")
    outcome = prune_study.run_study(batched, progress=False, log=lines.append, many_runner=broken)
    assert len(outcome["failed"]) == 1 and "RuntimeError: program broke" in outcome["failed"][0]
    assert "program broke" in (cells / "snip/s0.9/seed0.error.txt").read_text()


def test_verdicts_dense_and_output_layers_by_hand():
    """Dense 50 / 60 / 70 (mean 60, std 8.16): a pruned mean of 52 is within one std, 40 below.
    SNIP keeps 0.30 of the head and 0.05 of the torso, GraSP 0.50 and 0.04: GraSP keeps more of
    the output layer than SNIP and than of its own hidden layers."""
    cells = [_cell("none", 0.0, seed, _results(score)) for seed, score in enumerate([50.0, 60.0, 70.0])]
    layers = {"snip": {"head/kernel": 0.30, "torso/dense_0/kernel": 0.06, "torso/dense_1/kernel": 0.04},
              "grasp": {"head/kernel": 0.50, "torso/dense_0/kernel": 0.05, "torso/dense_1/kernel": 0.03}}
    for pruner, scores in (("snip", [52.0, 52.0]), ("grasp", [40.0, 40.0])):
        cells += [_cell(pruner, 0.95, seed, _results(score, 0.05, layers[pruner])) for seed, score in enumerate(scores)]
    rows = study_report.gather(cells)
    verdicts = {row["pruner"]: row for row in study_report.dense_verdicts(rows)}
    assert verdicts["snip"]["verdict"] == "≈ dense" and verdicts["snip"]["relative"] == pytest.approx(52 / 60)
    assert verdicts["grasp"]["verdict"] == "below dense"
    grid = study_report.score_grid_markdown(rows, list(verdicts.values())).splitlines()
    assert grid[0] == "| task | algo | pruner | 0 | 0.95 |"
    assert grid[2] == "| pendulum | bc | dense | 60.0 ± 8.2 |  |"
    assert grid[3] == "| pendulum | bc | snip |  | 52.0 ± 0.0 (0.87) |"
    assert grid[4] == "| pendulum | bc | grasp |  | 40.0 ± 0.0 (0.67) † |"
    layer_rows = {row["pruner"]: row for row in study_report.final_layer_rows(rows)}
    assert layer_rows["grasp"]["output_kept"] == pytest.approx(0.5)
    assert layer_rows["grasp"]["hidden_kept"] == pytest.approx(0.04)
    assert layer_rows["snip"]["network_kept"] == pytest.approx(0.05)
    (line,) = study_report.final_layer_verdicts(list(layer_rows.values()))
    assert "GraSP keeps 0.500 of the output layer, more than SNIP (0.300); more than of its hidden layers (0.040)" in line
    assert study_report.is_output_layer("vae/encoder/mean/kernel") and not study_report.is_output_layer(
        "vae/decoder/torso/dense_0/kernel")


def _with_curve(results, scores, steps=(1000, 2000, 3000, 4000)):
    results["evaluations"] = [{"steps": step, "mean": -1.0, "normalized_score": {"mean": score, "std": 0.0}}
                              for step, score in zip(steps, scores)]
    return results


def test_learning_curves_and_budget_verdicts_by_hand(tmp_path):
    """Dense curves over 4 evaluations: the second quarter of 4000 steps holds step 2000, the last
    quarter step 4000. Task "flat": seeds end at 60 / 62 / 58 from 58 / 61 / 57 at step 2000:
    gain +1.33 ≤ std 1.63 → flattened. Task "rising": 60 / 62 / 58 from 40 / 41 / 39 → gain +20
    > 1.63 → still rising. Task "falling": from 80 / 81 / 79 → gain −20 → falling. Over 8
    evaluations the windows average: steps 3000–4000 against 7000–8000. The pruned curve on "flat"
    (20 at step 2000, 30 at 4000 on every seed: gain +10 > std 0) is still rising, which its
    "pruned ≈ dense" verdict carries; a cell with one evaluation makes no curve."""
    cells = []
    for task, middle in (("flat", [58.0, 61.0, 57.0]), ("rising", [40.0, 41.0, 39.0]), ("falling", [80.0, 81.0, 79.0])):
        for seed, (half, final) in enumerate(zip(middle, [60.0, 62.0, 58.0])):
            cells.append(_cell("none", 0.0, seed, _with_curve(_results(final), [10.0, half, half, final]), task=task))
    cells += [_cell("snip", 0.95, seed, _with_curve(_results(30.0, 0.05), [5.0, 20.0, 25.0, 30.0]), task="flat")
              for seed in range(3)]
    cells.append(_cell("none", 0.0, 0, _with_curve(_results(1.0), [1.0], steps=(4000,)), task="single"))
    curves = {(curve["task"], curve["pruner"]): curve for curve in study_report.learning_curves(cells)}
    assert set(curves) == {("flat", "none"), ("rising", "none"), ("falling", "none"), ("flat", "snip")}
    flat = curves[("flat", "none")]
    assert flat["steps"] == [1000, 2000, 3000, 4000] and flat["mean"][1] == pytest.approx(176.0 / 3)
    assert flat["std"][-1] == pytest.approx(np.std([60.0, 62.0, 58.0]))
    budgets = study_report.budget_verdicts(list(curves.values()))
    verdicts = {verdict["task"]: verdict for verdict in budgets if verdict["pruner"] == "none"}
    assert set(verdicts) == {"flat", "rising", "falling"} and len(budgets) == 4
    (pruned,) = [verdict for verdict in budgets if verdict["pruner"] == "snip"]
    assert pruned["sparsity"] == 0.95 and pruned["gain"] == pytest.approx(10.0) and pruned["verdict"] == "still rising"
    (versus_dense,) = study_report.dense_verdicts(study_report.gather(cells), budgets)
    assert versus_dense["pruner"] == "snip" and versus_dense["verdict"] == "below dense"
    assert versus_dense["curve"] == "still rising"
    assert study_report.dense_verdicts(study_report.gather(cells))[0]["curve"] is None
    assert verdicts["flat"]["gain"] == pytest.approx(4.0 / 3) and verdicts["flat"]["verdict"] == "flattened"
    assert verdicts["flat"]["middle_steps"] == [2000] and verdicts["flat"]["late_steps"] == [4000]
    assert verdicts["flat"]["budget"] == 4000 and verdicts["flat"]["late_std"] == pytest.approx(np.std([60.0, 62.0, 58.0]))
    assert verdicts["rising"]["gain"] == pytest.approx(20.0) and verdicts["rising"]["verdict"] == "still rising"
    assert verdicts["falling"]["gain"] == pytest.approx(-20.0) and verdicts["falling"]["verdict"] == "falling"
    # One noisy last evaluation does not decide: per seed s, 29+s at steps 3000 and 4000, then 36+s
    # and 26+s at 7000 and 8000 (mean 31+s): gain +2 > std 0.82 → still rising, where the last
    # evaluation alone (26+s, 3 below the second quarter) would have read falling.
    long_steps = tuple(range(1000, 8001, 1000))
    noisy = [_cell("none", 0.0, seed, _with_curve(_results(26.0 + seed), [0.0, 0.0, 29.0 + seed, 29.0 + seed, 0.0,
                                                                          0.0, 36.0 + seed, 26.0 + seed],
                                                  steps=long_steps), task="noisy") for seed in range(3)]
    (long,) = study_report.budget_verdicts(study_report.learning_curves(noisy))
    assert long["middle_steps"] == [3000, 4000] and long["late_steps"] == [7000, 8000]
    assert long["gain"] == pytest.approx(2.0) and long["late_std"] == pytest.approx(np.std([31.0, 32.0, 33.0]))
    assert long["verdict"] == "still rising" and long["final_mean"] == pytest.approx(27.0)
    paths = study_report.write_report(str(tmp_path), cells[:-1], [])
    report = (tmp_path / "report.md").read_text()
    assert "| flat | bc | dense | 0 | 4,000 | 60.0 | 60.0 | +1.3 (2,000 → 4,000) | 1.6 | 3 | flattened |" in report
    assert "| rising | bc | dense | 0 | 4,000 | 60.0 | 60.0 | +20.0 (2,000 → 4,000) | 1.6 | 3 | still rising |" in report
    assert "| flat | bc | snip | 0.95 | 4,000 | 30.0 | 30.0 | +10.0 (2,000 → 4,000) | 0.0 | 3 | still rising |" in report
    assert "| flat | bc | snip | 0.95 | 0.50 | below dense | still rising |" in report
    assert os.path.getsize(paths["learning_curves_flat_bc"]) > 0 and "plots/learning_curves_flat_bc.png" in report
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert {budget["task"]: budget["verdict"] for budget in summary["budgets"]}["falling"] == "falling"


class KillOne:
    """A picklable runner that kills its own process on one (pruner, seed) cell."""

    def __init__(self, pruner, seed):
        self.pruner, self.seed = pruner, seed

    def __call__(self, run, workdir, **options):
        if run.pruner == self.pruner and run.seed == self.seed:
            os.kill(os.getpid(), signal.SIGKILL)
        return run_prune_offline(run, workdir, **options)


def test_local_processes_and_ray_give_the_sequential_results_and_a_killed_worker_fails_only_its_cell(
        swingup_dataset, tmp_path):
    from launch import launcher

    plan = dict(TINY, seeds="0,1")
    sequential = prune_study.make_options(str(tmp_path / "one_by_one"), swingup_dataset, **plan)
    assert prune_study.run_study(sequential, progress=False, log=lambda line: None)["failed"] == []
    for name, launch in (("processes", launcher.make_options("local", parallel=2)), ("ray", launcher.make_options("ray"))):
        options = prune_study.make_options(str(tmp_path / name), swingup_dataset, **plan)
        outcome = prune_study.run_study(options, runner=KillOne("grasp", 1), progress=False, log=lambda line: None,
                                        launch_options=launch)
        assert len(outcome["failed"]) == 1 and outcome["failed"][0].startswith("pendulum-swingup bc grasp s0.9 seed 1 ("), (
            name, outcome["failed"])
        assert outcome["pending"] == [outcome["failed"][0].split(" (")[0]]
        rerun = prune_study.run_study(options, progress=False, log=lambda line: None, launch_options=launch)
        assert rerun["failed"] == [] and rerun["pending"] == []
        for cell in prune_study.plan_cells(options):
            mine = json.loads((tmp_path / name / cell.relative_dir / "results.json").read_text())
            theirs = json.loads((tmp_path / "one_by_one" / cell.relative_dir / "results.json").read_text())
            np.testing.assert_allclose(mine["final_eval"]["returns"], theirs["final_eval"]["returns"], rtol=1e-6)
            assert mine["masks"] == theirs["masks"]
            assert mine["xla_cpu_threads"] == 1, "a fresh worker process sets its one-thread pool before JAX starts"
        assert (tmp_path / name / "summary.json").is_file()

