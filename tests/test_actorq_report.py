"""ActorQ study report, energy estimate and study orchestration on hand-made results.json dicts."""

import json
import os
import sys
import types

import pytest

from launch import actorq_study
from qrl import workdirs
from qrl.distributed import energy, report
from qrl.errors import QrlInputError
from tests.test_cli import assert_input_error, run_module

CARTPOLE, WALKER = "dmc:cartpole-balance", "dmc:walker-stand"
ACTOR_SECONDS = {"env_step": 40.0, "inference": 30.0, "pull_wait": 1.0, "deserialize": 0.5, "load": 0.5,
                 "insert": 8.0, "other": 20.0, "total": 100.0}
LEARNER_SECONDS = {"sample_wait": 10.0, "update": 25.0, "publish": 5.0, "other": 10.0, "total": 50.0}


def fake_result(env, precision, seed, returns, final, actor_sps, kg_co2, bytes_per_publish, target=800.0):
    """A results.json dict: evaluations every 10 s (learner steps 100 per 10 s), 40 s runs."""
    evaluations = [{"wall_seconds": 10.0 * (i + 1), "learner_steps": 100 * (i + 1), "actor_steps": 1000 * (i + 1),
                    "return_fp32": value, "return_actor": value - 1.0} for i, value in enumerate(returns)]
    return {
        "config": {}, "agent": "d4pg", "env": env, "seed": seed, "actor_precision": precision,
        "comm_precision": precision, "launcher": "inprocess", "num_actors": 2, "stop_reason": "max_seconds",
        "wall_seconds": 40.0, "counts": {"actor_steps": 4000, "learner_steps": 400, "episodes": 4, "pulls": 10},
        "target_return": target, "time_to_target_seconds": None, "actor_steps_to_target": None,
        "learner_steps_to_target": None, "final_return": {"fp32": final, "actor": final - 1.0},
        "evaluations": evaluations,
        "throughput": {"actor_steps_per_second": actor_sps, "per_actor_steps_per_second": [actor_sps / 2] * 2,
                       "learner_steps_per_second": 10.0},
        "breakdown": {"actor": dict(ACTOR_SECONDS), "learner": dict(LEARNER_SECONDS),
                      "replay": {"insert": 1.0, "sample": 2.0}},
        "publish": {"count": 20, "bytes_per_publish": bytes_per_publish, "fp32_bytes": 4000,
                    "ratio_to_fp32": bytes_per_publish / 4000, "encode_seconds_mean": 0.001},
        "cpu_seconds": {"total": 80.0, "by_node": {"learner": 40.0, "actor_0": 20.0, "actor_1": 20.0}},
        "energy": {"method": "cpu_power_model", "cpu_seconds": 80.0, "kwh": kg_co2 / 0.5, "kg_co2": kg_co2,
                   "watts_per_core": 10.0, "carbon_intensity_kg_per_kwh": 0.5, "note": "test model"},
        "restarts": {},
    }


@pytest.fixture
def results():
    """Cartpole: fp32 reaches 800 at 20 s (seed 0) and 30 s (seed 1); int8 at 10 s (seed 0) and
    never (seed 1). Walker: one seed each, no target reached."""
    return [
        fake_result(CARTPOLE, "fp32", 0, [500, 850, 900], 900.0, 1000.0, 0.002, 4000),
        fake_result(CARTPOLE, "fp32", 1, [300, 700, 810], 810.0, 1200.0, 0.002, 4000),
        fake_result(CARTPOLE, "int8", 0, [820, 900, 950], 950.0, 1500.0, 0.001, 1100),
        fake_result(CARTPOLE, "int8", 1, [300, 500, 750], 750.0, 1800.0, 0.001, 1100),
        fake_result(WALKER, "int8", 0, [100, 200], 200.0, 900.0, 0.003, 1100),
        fake_result(WALKER, "fp32", 0, [100, 150], 150.0, 600.0, 0.003, 4000),
    ]


def test_time_to_target_is_the_first_evaluation_reaching_it():
    evaluations = [{"wall_seconds": 5.0, "return_fp32": None, "return_actor": 9.0},
                   {"wall_seconds": 10.0, "return_fp32": 7.0, "return_actor": 3.0},
                   {"wall_seconds": 15.0, "return_fp32": 9.0, "return_actor": 2.0}]
    assert report.time_to_target(evaluations, 7.0) == 10.0
    assert report.time_to_target(evaluations, 8.0) == 15.0
    assert report.time_to_target(evaluations, 9.5) is None
    assert report.time_to_target(evaluations, None) is None
    assert report.time_to_target(evaluations, 9.0, key="return_actor") == 5.0


def test_summary_rows_are_means_over_seeds(results):
    rows = {(row["env"], row["actor_precision"]): row for row in report.summary_table(results)}
    assert list(rows) == [(CARTPOLE, "fp32"), (CARTPOLE, "int8"), (WALKER, "fp32"), (WALKER, "int8")]
    fp32, int8 = rows[(CARTPOLE, "fp32")], rows[(CARTPOLE, "int8")]
    assert fp32["seeds"] == [0, 1] and fp32["target_return"] == 800.0
    assert fp32["final_return_mean"] == pytest.approx(855.0) and fp32["final_return_std"] == pytest.approx(45.0)
    assert int8["final_return_mean"] == pytest.approx(850.0) and int8["final_return_std"] == pytest.approx(100.0)
    assert fp32["time_to_target_mean"] == pytest.approx(25.0) and fp32["seeds_reached_target"] == 2
    assert int8["time_to_target_mean"] == pytest.approx(10.0) and int8["seeds_reached_target"] == 1
    assert fp32["actor_steps_per_second"] == pytest.approx(1100.0)
    assert int8["actor_steps_per_second"] == pytest.approx(1650.0)
    assert int8["learner_steps_per_second"] == pytest.approx(10.0)
    assert int8["bytes_per_publish"] == 1100 and fp32["bytes_per_publish"] == 4000
    assert int8["pull_seconds_per_pull"] == pytest.approx((1.0 + 0.5 + 0.5) / 10)
    assert fp32["kg_co2"] == pytest.approx(0.002) and fp32["kwh"] == pytest.approx(0.004)
    assert int8["actor_breakdown"]["env_step"] == pytest.approx(0.4)
    assert int8["actor_breakdown"]["other"] == pytest.approx(0.2)
    assert int8["learner_breakdown"]["update"] == pytest.approx(0.5)
    assert rows[(WALKER, "int8")]["time_to_target_mean"] is None
    assert rows[(WALKER, "int8")]["seeds_reached_target"] == 0


def test_speedups_pair_seeds_with_the_fp32_rows(results):
    rows = {row["env"]: row for row in report.speedup_table(results)}
    cartpole = rows[CARTPOLE]
    assert cartpole["actor_precision"] == "int8" and cartpole["paired_seeds"] == [0, 1]
    assert cartpole["time_to_target_ratio"] == pytest.approx(20.0 / 10.0)  # seed 0 only: both reached.
    assert cartpole["seeds_both_reached"] == 1
    assert cartpole["actor_steps_per_second_ratio"] == pytest.approx(1650.0 / 1100.0)
    assert cartpole["learner_steps_per_second_ratio"] == pytest.approx(1.0)
    assert cartpole["carbon_ratio"] == pytest.approx(2.0)
    # Seed 0 to target: fp32 0.002 kg × 20/40 s, int8 0.001 kg × 10/40 s.
    assert cartpole["carbon_to_target_ratio"] == pytest.approx((0.002 * 20 / 40) / (0.001 * 10 / 40))
    assert rows[WALKER]["time_to_target_ratio"] is None and rows[WALKER]["actor_steps_per_second_ratio"] == 1.5
    # Intervals need two paired seeds: none for time to target (one seed), one for actor steps/s. Resampling
    # the two seeds gives seed 0 twice (1500/1000), seed 1 twice (1800/1200) or both (3300/2200): all 1.5.
    assert cartpole["time_to_target_ratio_ci"] is None
    assert cartpole["actor_steps_per_second_ratio_ci"] == pytest.approx([1.5, 1.5])
    assert rows[WALKER]["actor_steps_per_second_ratio_ci"] is None  # one seed


def test_summary_reports_the_actors_policy_and_an_interval_on_time_to_target(results):
    rows = {(row["env"], row["actor_precision"]): row for row in report.summary_table(results)}
    fp32, int8 = rows[(CARTPOLE, "fp32")], rows[(CARTPOLE, "int8")]
    assert fp32["final_return_actor_mean"] == pytest.approx(854.0) and int8["final_return_actor_std"] == pytest.approx(100.0)
    # fp32 reached at 20 s and 30 s: resampled means lie in [20, 30] and both ends have probability 1/4.
    assert fp32["time_to_target_ci"] == pytest.approx([20.0, 30.0])
    assert int8["time_to_target_ci"] is None  # one seed reached
    text = report.summary_markdown([fp32]) + report.speedup_markdown(report.speedup_table(results))
    assert "854.0 ± 45.0" in text and "25.0 [20.0, 30.0] (2/2)" in text and "1.50 [1.50, 1.50]" in text


def test_target_override_and_disagreeing_targets(results):
    rows = {(row["env"], row["actor_precision"]): row for row in report.summary_table(results, target_return=900.0)}
    assert rows[(CARTPOLE, "fp32")]["time_to_target_mean"] == pytest.approx(30.0)  # seed 0 only.
    assert rows[(CARTPOLE, "int8")]["time_to_target_mean"] == pytest.approx(20.0)
    results[1]["target_return"] = 700.0
    with pytest.raises(QrlInputError, match="disagree on target_return"):
        report.summary_table(results)
    with pytest.raises(QrlInputError, match="no results"):
        report.summary_table([])
    with pytest.raises(QrlInputError, match="results.json lacks actor_precision"):
        report.summary_table([{"env": CARTPOLE, "seed": 0}])


def test_runs_without_energy_are_modelled_from_cpu_seconds(results):
    del results[0]["energy"]
    energy_of_run = report.run_energy(results[0])
    assert energy_of_run["method"] == "cpu_power_model"
    assert energy_of_run["kwh"] == pytest.approx(80.0 * energy.DEFAULT_WATTS_PER_CORE / 3.6e6)
    assert "computed by the report" in energy_of_run["note"]


def test_write_report_writes_tables_plots_and_summary(results, tmp_path):
    paths = report.write_report(results, str(tmp_path), missing=["dmc:walker-stand int8 seed 1 (log x.log)"])
    text = (tmp_path / "report.md").read_text()
    assert "| d4pg | dmc:cartpole-balance | int8 | int8 | 0,1 | 850.0 ± 100.0 | 849.0 ± 100.0 | 10.0 (1/2) | 1,650 |" in text
    assert "| d4pg | dmc:cartpole-balance | int8 | int8 | 0,1 | 2.00 (1) | 1.50 [1.50, 1.50] | 1.00 [1.00, 1.00] | 2.00 | 4.00 |" in text
    assert "| 40.0% | 30.0% |" in text  # actor env_step, inference fractions.
    assert "- 6 run(s): test model" in text and "walker-stand int8 seed 1 (log x.log)" in text
    for name in ("return_vs_time", "return_vs_learner_steps", "breakdown"):
        for env in ("d4pg_dmc_cartpole-balance", "d4pg_dmc_walker-stand"):
            png = tmp_path / "plots" / f"{name}_{env}.png"
            assert png.stat().st_size > 1000 and f"(plots/{name}_{env}.png)" in text
            assert paths[f"{name}_{env}"] == str(png)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert len(summary["summary"]) == 4 and len(summary["speedups"]) == 2 and len(summary["runs"]) == 6
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".tmp")]


def test_cpu_power_model_arithmetic():
    model = energy.cpu_power_model(3600.0, watts_per_core=10.0, carbon_intensity=0.5)
    assert model["method"] == "cpu_power_model" and model["cpu_seconds"] == 3600.0
    assert model["kwh"] == pytest.approx(0.01) and model["kg_co2"] == pytest.approx(0.005)
    assert model["watts_per_core"] == 10.0 and model["carbon_intensity_kg_per_kwh"] == 0.5
    default = energy.cpu_power_model(3600.0)
    assert default["kwh"] == pytest.approx(6.25 / 1000) and default["kg_co2"] == pytest.approx(6.25e-3 * 0.475)
    assert "8480+" in default["note"] and "IEA" in default["note"] and "modelled" in default["note"]
    with pytest.raises(QrlInputError, match="cpu_seconds must be a non-negative number"):
        energy.cpu_power_model(-1.0)


def test_rapl_readable_needs_a_readable_counter(tmp_path):
    pattern = str(tmp_path / "intel-rapl*" / "energy_uj")
    assert not energy.rapl_readable(pattern)
    (tmp_path / "intel-rapl:0").mkdir()
    (tmp_path / "intel-rapl:0" / "energy_uj").write_text("not a number\n")
    assert not energy.rapl_readable(pattern)
    (tmp_path / "intel-rapl:1").mkdir()
    (tmp_path / "intel-rapl:1" / "energy_uj").write_text("123456\n")
    assert energy.rapl_readable(pattern)


def test_energy_meter_falls_back_to_the_model_without_rapl(monkeypatch):
    monkeypatch.setattr(energy, "rapl_readable", lambda: False)
    monkeypatch.setattr(energy, "_make_tracker", lambda *args: pytest.fail("codecarbon used without RAPL"))
    meter = energy.EnergyMeter()
    meter.start()
    result = meter.stop(7200.0)
    assert result["method"] == "cpu_power_model" and "not readable" in result["note"]
    assert result["kwh"] == pytest.approx(7200.0 * 6.25 / 3.6e6)


class FakeTracker:
    def __init__(self, mode="intel_rapl", fail_on_stop=False):
        self._hardware = [types.SimpleNamespace(_mode=None), types.SimpleNamespace(_mode=mode)]
        self.fail_on_stop = fail_on_stop
        self.final_emissions_data = None

    def start(self):
        pass

    def stop(self):
        if self.fail_on_stop:
            raise OSError("counter vanished")
        self.final_emissions_data = types.SimpleNamespace(cpu_energy=0.002, energy_consumed=0.003)


def _meter_with(monkeypatch, make_tracker):
    monkeypatch.setattr(energy, "rapl_readable", lambda: True)
    monkeypatch.setattr(energy, "_make_tracker", make_tracker)
    meter = energy.EnergyMeter()
    meter.start()
    return meter.stop(3600.0)


def test_energy_meter_uses_codecarbon_when_it_reads_rapl(monkeypatch):
    result = _meter_with(monkeypatch, lambda *args: FakeTracker())
    assert result["method"] == "codecarbon_rapl" and result["kwh"] == 0.002
    assert result["kg_co2"] == pytest.approx(0.002 * 0.475) and result["codecarbon_total_kwh"] == 0.003
    assert result["model"]["kwh"] == pytest.approx(3600.0 * 6.25 / 3.6e6)


def test_energy_meter_survives_codecarbon_failures(monkeypatch):
    def broken(*args):
        raise RuntimeError("boom")

    result = _meter_with(monkeypatch, broken)
    assert result["method"] == "cpu_power_model" and "codecarbon failed to start (RuntimeError: boom)" in result["note"]
    result = _meter_with(monkeypatch, lambda *args: FakeTracker(fail_on_stop=True))
    assert result["method"] == "cpu_power_model" and "failed to stop (OSError: counter vanished)" in result["note"]
    result = _meter_with(monkeypatch, lambda *args: FakeTracker(mode="cpu_load"))
    assert result["method"] == "cpu_power_model" and "did not select its RAPL" in result["note"]


def test_real_codecarbon_without_rapl_falls_back_and_writes_nothing(monkeypatch, tmp_path):
    """This machine has no RAPL: told otherwise, codecarbon picks another power source and the
    meter falls back; nothing lands in the working directory."""
    pytest.importorskip("codecarbon")
    if energy.rapl_readable():
        pytest.skip("RAPL is readable here")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(energy, "rapl_readable", lambda: True)
    meter = energy.EnergyMeter()
    meter.start()
    result = meter.stop(10.0)
    assert result["method"] == "cpu_power_model" and "did not select its RAPL" in result["note"]
    assert os.listdir(tmp_path) == []


def test_report_precision_order_matches_the_actor_precisions():
    from qrl.distributed import weights

    assert set(report.PRECISION_ORDER) == set(weights.ACTOR_PRECISIONS)


@pytest.mark.parametrize("args,fragment", [
    (["--precisions=fp32,int4"], "unknown actor precision 'int4'"),
    (["--precisions=int8"], "--precisions must include fp32"),
    (["--envs=,"], "--envs is empty"),
    (["--seeds=0,-1"], "--seeds values must be >= 0"),
    ([], "give a stop condition for every cell"),
])
def test_study_bad_input_is_one_line_and_exit_2(tmp_path, args, fragment):
    workdir = tmp_path / "study"
    assert_input_error(run_module("launch.actorq_study", f"--workdir={workdir}", *args), fragment)
    assert not workdir.exists()


@pytest.mark.parametrize("changes,fragment", [
    ({"max_seconds": -5.0}, "--max_seconds must be > 0"),
    ({"max_learner_steps": 0}, "--max_learner_steps must be >= 1"),
    ({"max_actor_steps": -1}, "--max_actor_steps must be >= 1"),
    ({"run_flags": ["--seed=3"]}, "is set by the study itself"),
    ({"run_flags": ["num_actors=2"]}, "--run_flag takes a launch.actorq flag"),
    ({"agent": "ppo"}, "does not run distributed"),
    ({"envs": "cartpole"}, "must look like family:name"),
    ({"seeds": ""}, "--seeds is empty"),
    ({"workdir": None}, "--workdir is required"),
    ({"max_seconds": None}, "give a stop condition for every cell"),
    ({"parallel": 0}, "--parallel must be >= 1"),
    ({"launcher": "inprocess"}, "--launcher must be one of local, ray"),
    ({"ray_address": "127.0.0.1:6379"}, "--ray_address needs --launcher=ray"),
])
def test_study_options_reject_bad_input(tmp_path, changes, fragment):
    arguments = {"workdir": str(tmp_path / "study"), "agent": "d4pg", "envs": CARTPOLE, "precisions": "fp32,int8",
                 "seeds": "0", "max_seconds": 60.0, **changes}
    with pytest.raises(QrlInputError, match=fragment.replace("+", r"\+")):
        actorq_study.make_options(**arguments)


def _flag(argv, name):
    return next(item.split("=", 1)[1] for item in argv if item.startswith(f"--{name}="))


class FakeRunner:
    """Stands in for `python -m launch.actorq`: writes a synthetic results.json into --workdir;
    the int8 seed-1 cell fails while `fail_int8_seed1` is set."""

    def __init__(self):
        self.calls = []
        self.fail_int8_seed1 = True

    def __call__(self, argv, log_path):
        self.calls.append(list(argv))
        precision, seed, workdir = _flag(argv, "actor_precision"), int(_flag(argv, "seed")), _flag(argv, "workdir")
        marker = workdirs.read_marker(workdir) if os.path.isdir(workdir) else None
        assert marker is None or not workdirs.present_outputs(workdir, marker), "an unfinished cell starts afresh"
        with open(log_path, "a") as log:
            if precision == "int8" and seed == 1 and self.fail_int8_seed1:
                log.write("Traceback ...\nerror: actor crashed\n")
                return 1
        workdirs.claim(workdir, "actorq")
        faster = precision == "int8"
        result = fake_result(_flag(argv, "env"), precision, seed, [500, 850] if faster else [500, 700, 850],
                             850.0, 1500.0 if faster else 1000.0, 0.001, 1100 if faster else 4000)
        with open(os.path.join(workdir, "results.json"), "w") as file:
            json.dump(result, file)
        return 0


def test_study_runs_cells_reuses_finished_ones_and_survives_failures(tmp_path):
    workdir = str(tmp_path / "study")
    options = actorq_study.make_options(workdir, "d4pg", CARTPOLE, "fp32,int8", "0,1", target_return=800.0,
                                        max_seconds=30.0, run_flags=["--num_actors=2"])
    runner, lines = FakeRunner(), []
    outcome = actorq_study.run_study(options, runner=runner, log=lines.append)
    assert len(runner.calls) == 5  # the failing cell is retried once
    first = runner.calls[0]
    assert first[:3] == [sys.executable, "-m", actorq_study.ACTORQ_MODULE]
    assert first[3:] == ["--agent=d4pg", f"--env={CARTPOLE}", "--actor_precision=fp32", "--comm_precision=fp32",
                         "--seed=0", f"--workdir={workdir}/cells/dmc_cartpole-balance/fp32/seed0",
                         "--launcher=inprocess", "--target_return=800.0", "--max_seconds=30.0", "--num_actors=2"]
    assert "--comm_precision=int8" in runner.calls[1] and "--seed=0" in runner.calls[1]
    assert lines[3] == f"{CARTPOLE} int8 seed 1: error: actor crashed; retrying"
    assert runner.calls[4] == runner.calls[3]
    assert lines[4].startswith(f"[4/4] {CARTPOLE} int8 seed 1: FAILED: error: actor crashed (")
    assert outcome["failed"] == [
        f"{CARTPOLE} int8 seed 1 (error: actor crashed; log {workdir}/cells/dmc_cartpole-balance/int8/seed1.log)"]
    assert open(f"{workdir}/cells/dmc_cartpole-balance/int8/seed1.log").read().count("error: actor crashed") == 2
    text = open(outcome["paths"]["report.md"]).read()
    assert "| d4pg | dmc:cartpole-balance | int8 | int8 | 0 | 850.0 ± 0.0 | 849.0 ± 0.0 | 20.0 (1/1) |" in text
    assert "## Cells without results" in text
    speedup = json.load(open(os.path.join(workdir, "summary.json")))["speedups"][0]
    assert speedup["paired_seeds"] == [0] and speedup["time_to_target_ratio"] == pytest.approx(30.0 / 20.0)

    killed = os.path.join(workdir, "cells/dmc_cartpole-balance/int8/seed1")  # a killed run's leftovers:
    workdirs.claim(killed, "actorq")
    os.makedirs(os.path.join(killed, "checkpoints", "100"))
    with open(os.path.join(killed, "notes.md"), "w") as file:  # and a user's file beside them
        file.write("mine")
    runner.calls.clear()
    runner.fail_int8_seed1 = False
    lines.clear()
    outcome = actorq_study.run_study(options, runner=runner, log=lines.append)
    assert [_flag(argv, "workdir")[-10:] for argv in runner.calls] == ["int8/seed1"]
    assert sum("already done" in line for line in lines) == 3 and outcome["failed"] == []
    summary = json.load(open(os.path.join(workdir, "summary.json")))
    assert [row["seeds"] for row in summary["summary"]] == [[0, 1], [0, 1]]
    assert sorted(os.listdir(killed)) == sorted([workdirs.MARKER_FILE, "notes.md", "results.json"])


def test_cells_in_parallel_processes_give_every_result_and_the_report(tmp_path):
    workdir = str(tmp_path / "study")
    options = actorq_study.make_options(workdir, "d4pg", CARTPOLE, "fp32,int8", "0,1", target_return=800.0,
                                        max_seconds=30.0, parallel=2)
    runner = FakeRunner()
    runner.fail_int8_seed1 = False
    lines = []
    outcome = actorq_study.run_study(options, runner=runner, log=lines.append)
    assert outcome["failed"] == [] and len(lines) == 4 and os.path.isfile(outcome["paths"]["report.md"])
    for cell in actorq_study.plan_cells(options):
        result = json.load(open(os.path.join(workdir, cell.relative_dir, "results.json")))
        assert (result["actor_precision"], result["seed"]) == (cell.precision, cell.seed)
    assert json.load(open(os.path.join(workdir, "study.json")))["parallel"] == 2


def test_ray_study_cells_put_their_nodes_on_the_given_cluster(tmp_path):
    options = actorq_study.make_options(str(tmp_path / "study"), "d4pg", CARTPOLE, "fp32,int8", "0", max_seconds=30.0,
                                        launcher="ray", ray_address="10.0.0.5:6379", ray_bind_address="10.0.0.7")
    (fp32, int8) = actorq_study.plan_cells(options)
    argv = actorq_study.cell_argv(int8, options)
    assert "--launcher=ray" in argv and "--ray_address=10.0.0.5:6379" in argv and "--ray_bind_address=10.0.0.7" in argv
    config = actorq_study.cell_config(fp32, options)
    assert (config.launcher, config.ray_address, config.ray_bind_address) == ("ray", "10.0.0.5:6379", "10.0.0.7")
    local = actorq_study.make_options(str(tmp_path / "local"), "d4pg", CARTPOLE, "fp32", "0", max_seconds=30.0)
    assert "--launcher=inprocess" in actorq_study.cell_argv(actorq_study.plan_cells(local)[0], local)


def test_run_subprocess_logs_output_and_returns_the_status(tmp_path):
    log_path = str(tmp_path / "cell.log")
    status = actorq_study.run_subprocess([sys.executable, "-c", "print('hello'); raise SystemExit(3)"], log_path)
    assert status == 3
    assert open(log_path).read().splitlines()[-1] == "hello"
