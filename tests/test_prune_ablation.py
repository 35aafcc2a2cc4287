"""The pruning ablations: arms planned from the flags, run as studies, and compared with the single
shot cell by cell (`launch.prune_ablation`, `pruning.ablation_report`)."""

import json

import numpy as np
import pytest

from launch import launcher, prune_ablation
from pruning import ablation_report
from qrl.errors import QrlInputError


def test_plan_arms_puts_the_baseline_first_and_adds_rounds_on_its_data():
    arms = prune_ablation.plan_arms("64x1,256x1,256x4", "10", "256x1")
    assert list(arms) == ["score256x1", "score64x1", "score256x4", "rounds10"]
    assert arms["score256x4"] == {"prune_batch_size": 256, "prune_batches": 4, "iterations": 1}
    assert arms["rounds10"] == {"prune_batch_size": 256, "prune_batches": 1, "iterations": 10}
    with pytest.raises(QrlInputError, match="must be one of --scoring"):
        prune_ablation.plan_arms("64x1", "", "256x1")


def _mask(*kept):
    return {"actor": {"kernel": np.array(kept, np.uint8)}}


def test_ablation_rows_pair_seeds_with_the_baseline_by_hand():
    cells = [
        {"arm": "base", "task": "t", "algo": "bc", "pruner": "snip", "seed": 0, "score": 10.0, "masks": _mask(1, 1, 0, 0)},
        {"arm": "base", "task": "t", "algo": "bc", "pruner": "snip", "seed": 1, "score": 20.0, "masks": _mask(1, 0, 1, 0)},
        {"arm": "big", "task": "t", "algo": "bc", "pruner": "snip", "seed": 0, "score": 13.0, "masks": _mask(1, 0, 1, 0)},
        {"arm": "big", "task": "t", "algo": "bc", "pruner": "snip", "seed": 1, "score": 24.0, "masks": _mask(1, 0, 1, 0)},
    ]
    base, big = ablation_report.ablation_rows(cells, "base")
    assert base["arm"] == "base" and base["difference_mean"] == 0.0
    assert big["scores"] == [13.0, 24.0] and big["score_mean"] == 18.5 and big["score_std"] == 5.5
    assert big["difference_mean"] == 3.5  # (13 - 10 + 24 - 20) / 2
    assert big["difference_interval"] == [3.0, 4.0]  # resampling two paired differences, 3 and 4
    # Seed 0: kept {0, 2} vs {0, 1} -> 1/3; seed 1: identical -> 1.
    assert big["overlap_with_baseline"]["actor"] == pytest.approx((1 / 3 + 1) / 2)
    assert ablation_report.verdict(big) == "beats single shot"
    table = ablation_report.ablation_markdown([base, big], "base")
    assert "| t | bc | snip | big | 2 | 18.5 ± 5.5 | +3.5 [+3.0, +4.0] | actor 0.67 | beats single shot |" in table
    assert "| t | bc | snip | base | 2 | 15.0 ± 5.0 | — | — | baseline |" in table


def test_tiny_ablation_runs_every_arm_and_reports(swingup_dataset, tmp_path):
    arms = prune_ablation.plan_arms("16x1,64x1,16x4", "3", "16x1")
    options = prune_ablation.make_arm_options(
        str(tmp_path / "ablation"), swingup_dataset, "bc", "snip,grasp", 0.9, "0,1", 20, 0, 1, arms,
        sets=["bc.hidden_sizes=16-16", "bc.batch_size=16"], configs_per_program=8)
    outcome = prune_ablation.run_ablation(options, progress=False, log=lambda line: None)
    assert outcome["failed"] == []
    summary = json.loads((tmp_path / "ablation" / "ablation.json").read_text())
    assert summary["arms"] == ["score16x1", "score64x1", "score16x4", "rounds3"]
    rows = {(row["pruner"], row["arm"]): row for row in summary["rows"]}
    assert len(rows) == 8 and all(row["seeds"] == [0, 1] for row in rows.values())
    assert rows[("snip", "score16x1")]["difference_mean"] == 0.0
    for pruner in ("snip", "grasp"):
        assert rows[(pruner, "rounds3")]["overlap_with_baseline"]["actor"] < 1.0  # re-scoring picks other weights
    report = (tmp_path / "ablation" / "ablation.md").read_text()
    assert "| pendulum-swingup | bc | grasp | rounds3 | 2 |" in report
    assert (tmp_path / "ablation" / "score16x1" / "cells" / "pendulum-swingup" / "bc" / "none" / "s0" / "seed0"
            / "results.json").is_file()
    assert not (tmp_path / "ablation" / "score64x1" / "cells" / "pendulum-swingup" / "bc" / "none").exists()


def test_arms_through_local_processes_give_the_in_process_rows(swingup_dataset, tmp_path):
    arms = prune_ablation.plan_arms("16x1", "2", "16x1")
    settings = dict(sets=["bc.hidden_sizes=16-16", "bc.batch_size=16"])
    rows = {}
    for name, launch in (("in_process", launcher.LaunchOptions()), ("processes", launcher.make_options("local", 2))):
        options = prune_ablation.make_arm_options(str(tmp_path / name), swingup_dataset, "bc", "snip", 0.9, "0,1", 20,
                                                  0, 1, arms, **settings)
        outcome = prune_ablation.run_ablation(options, progress=False, log=lambda line: None, launch_options=launch)
        assert outcome["failed"] == []
        rows[name] = json.loads((tmp_path / name / "ablation.json").read_text())["rows"]
        assert (tmp_path / name / "rounds2" / "cells" / "pendulum-swingup" / "bc" / "snip" / "s0.9" / "seed1"
                / "results.json").is_file()
    assert [row["arm"] for row in rows["processes"]] == ["score16x1", "rounds2"]
    for mine, theirs in zip(rows["processes"], rows["in_process"]):
        assert mine["seeds"] == theirs["seeds"] == [0, 1]
        assert mine["overlap_with_baseline"] == theirs["overlap_with_baseline"]
        np.testing.assert_allclose(mine["score_mean"], theirs["score_mean"], rtol=1e-4)
