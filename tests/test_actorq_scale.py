"""ActorQ's scale model (`qrl.distributed.scale`, `launch.actorq_scale`) on hand-computed cases."""

import json
import os

import pytest

from qrl.distributed import scale
from qrl.errors import QrlInputError
from tests.test_cli import assert_input_error, run_module


def profile(rate_limiter="min_size", items=16.0, t_a=0.001, t_u=0.010, service=0.0, evaluator=0.0, precision="fp32"):
    return scale.Profile(actor_precision=precision, actor_step_seconds=t_a, learner_update_seconds=t_u,
                         service_cpu_per_step=service, evaluator_cores=evaluator, batch_size=256,
                         rate_limiter=rate_limiter, items_per_update=items)


def test_fair_shares_fill_the_small_demands_first():
    assert scale._fair_shares(2.0, [0.3, 1.0, 1.0, 1.0]) == pytest.approx([0.3, 1.7 / 3, 1.7 / 3, 1.7 / 3])
    assert scale._fair_shares(4.0, [0.5, 1.0]) == pytest.approx([0.5, 1.0])  # room to spare
    assert scale.actors_per_machine(5, 2) == [3, 2]


def test_one_actor_on_two_cores_is_actor_bound():
    # 1000 steps/s feed 1000 / 16 = 62.5 updates/s of 10 ms: the learner needs 0.625 of a core.
    predicted = scale.predict(profile(), 1, cores=2.0)
    assert predicted["actor_steps_per_second"] == pytest.approx(1000.0, rel=1e-3)
    assert predicted["learner_steps_per_second"] == pytest.approx(62.5, rel=1e-3)
    assert predicted["bound"] == "actors" and predicted["learner_share"] == pytest.approx(0.625, rel=1e-3)


def test_four_actors_on_two_cores_share_them_with_the_learner():
    # Five busy single-threaded processes on 2 cores: 0.4 of a core each. Actors: 4 x 0.4 / 1 ms;
    # the learner manages 0.4 / 10 ms = 40 updates/s of the 100 the data allows (min_size: no throttle).
    predicted = scale.predict(profile(), 4, cores=2.0)
    assert predicted["actor_steps_per_second"] == pytest.approx(1600.0, rel=1e-3)
    assert predicted["learner_steps_per_second"] == pytest.approx(40.0, rel=1e-3)
    assert predicted["bound"] == "learner"


def test_samples_per_insert_limiter_slows_the_actors_to_the_learner():
    # One update per 8 inserted items; the learner tops out at one core: 100 updates/s, so the
    # limiter holds the actors at 800 steps/s (0.2 of a core each), leaving 0.2 cores idle.
    predicted = scale.predict(profile("samples_per_insert", items=8.0), 4, cores=2.0)
    assert predicted["learner_steps_per_second"] == pytest.approx(100.0, rel=0.02)
    assert predicted["actor_steps_per_second"] == pytest.approx(800.0, rel=0.02)
    assert predicted["bound"] == "learner"


def test_actors_on_a_second_machine_have_its_cores_to_themselves():
    # Machine 0: learner + 2 actors on 2 cores (learner demand 1, actors 1 each: 2/3 each);
    # machine 1: 2 actors, a core each. Services and evaluator share machine 0.
    predicted = scale.predict(profile(t_u=0.1), 4, machines=2, cores=2.0)
    assert predicted["actors_per_machine"] == [2, 2]
    assert predicted["actor_shares"] == pytest.approx([2 / 3, 1.0], rel=1e-3)
    assert predicted["actor_steps_per_second"] == pytest.approx((2 * 2 / 3 + 2) / 0.001, rel=1e-3)
    assert predicted["learner_steps_per_second"] == pytest.approx((2 / 3) / 0.1, rel=1e-3)


def test_speedup_is_the_ratio_of_learner_steps():
    fp32, int8 = profile(t_a=0.002), profile(t_a=0.001, precision="int8")
    result = scale.speedup(fp32, int8, 1, cores=2.0)
    assert result["learner_speedup"] == pytest.approx(2.0, rel=1e-3)  # both actor-bound
    capped = scale.speedup(fp32, int8, 1, cores=2.0, learner_update_seconds=0.03)
    # int8: 1000/16 = 62.5 updates/s wanted, 1 / 30 ms = 33.3 possible; fp32: 31.25 wanted and possible.
    assert capped["learner_speedup"] == pytest.approx((1 / 0.03) / 31.25, rel=1e-3)


def fake_run(precision, num_actors, actor_sps, learner_sps, agent="d4pg", wall=100.0):
    steps, updates = int(actor_sps * wall), int(learner_sps * wall)
    return {
        "config": {"agent": agent, "env": "dmc:cartpole-balance", "rate_limiter": "min_size", "max_times_sampled": 16,
                   "overrides": {"batch_size": 256}},
        "launcher": "ray", "actor_precision": precision, "num_actors": num_actors, "wall_seconds": wall,
        "counts": {"actor_steps": steps, "learner_steps": updates},
        "throughput": {"actor_steps_per_second": actor_sps, "learner_steps_per_second": learner_sps},
        "breakdown": {"actor": {"total": wall * num_actors, "pull_wait": 0.0},
                      "learner": {"total": wall, "sample_wait": wall - updates * 0.01}},
        "cpu_seconds": {"by_node": {"replay": 0.0, "broadcaster": 0.0, "counter": 0.0, "evaluator": 0.0,
                                    "learner": updates * 0.01, **{f"actor_{i}": wall for i in range(num_actors)}}},
    }


def test_profile_reads_costs_from_results():
    measured = scale.profile_from_results(fake_run("fp32", 1, 1000.0, 62.5), 256)
    assert measured.actor_step_seconds == pytest.approx(0.001) and measured.learner_update_seconds == pytest.approx(0.01)
    assert measured.items_per_update == 16.0 and measured.rate_limiter == "min_size"
    with pytest.raises(QrlInputError, match="--launcher=ray"):
        scale.profile_from_results({**fake_run("fp32", 1, 1000.0, 62.5), "launcher": "inprocess"}, 256)


def _write(path, results):
    os.makedirs(path)
    with open(os.path.join(path, "results.json"), "w") as file:
        json.dump(results, file)
    return str(path)


def test_cli_validates_and_projects(tmp_path):
    fp32 = _write(tmp_path / "fp32", fake_run("fp32", 1, 500.0, 31.25))
    int8 = _write(tmp_path / "int8", fake_run("int8", 1, 1000.0, 62.5))
    measured = _write(tmp_path / "int8x4", fake_run("int8", 4, 1600.0, 40.0))
    completed = run_module("launch.actorq_scale", f"--profile={fp32},{int8}", f"--validate={measured}",
                           "--actors=1,2,4", f"--out={tmp_path / 'out'}")
    assert completed.returncode == 0, completed.stderr
    written = json.loads((tmp_path / "out" / "scale.json").read_text())
    (row,) = written["validation"]
    assert row["actor_steps_per_second_error"] == pytest.approx(0.0, abs=1e-3)
    assert row["learner_steps_per_second_error"] == pytest.approx(0.0, abs=1e-3) and row["bound"] == "learner"
    assert [r["num_actors"] for r in written["projection"]["int8, CPU learner"]] == [1, 2, 4]
    assert (tmp_path / "out" / "projection.png").read_bytes()[:4] == b"\x89PNG"
    assert "x4 (learner-bound)" in completed.stdout


def test_cli_bad_input(tmp_path):
    fp32 = _write(tmp_path / "fp32", fake_run("fp32", 1, 500.0, 31.25))
    assert_input_error(run_module("launch.actorq_scale", f"--out={tmp_path / 'o'}"), "--profile: give the fp32")
    assert_input_error(run_module("launch.actorq_scale", f"--profile={fp32}", f"--out={tmp_path / 'o'}"),
                       "needs an fp32 run and at least one quantized run")
    assert_input_error(run_module("launch.actorq_scale", f"--profile={tmp_path / 'none'}", f"--out={tmp_path / 'o'}"),
                       "holds no ActorQ results.json")
    other = _write(tmp_path / "other", {"config": {"agent": "d4pg"}, "returns": [1.0]})
    assert_input_error(run_module("launch.actorq_scale", f"--profile={fp32},{other}", f"--out={tmp_path / 'o'}"),
                       "is not an ActorQ run's results (KeyError")
    listed = _write(tmp_path / "listed", [1, 2])
    assert_input_error(run_module("launch.actorq_scale", f"--profile={fp32},{listed}", f"--out={tmp_path / 'o'}"),
                       "is not an ActorQ run's results (no config)")
    int8 = _write(tmp_path / "int8", fake_run("int8", 1, 1000.0, 62.5))
    broken = _write(tmp_path / "broken", {**fake_run("int8", 2, 900.0, 50.0), "throughput": None})
    assert_input_error(run_module("launch.actorq_scale", f"--profile={fp32},{int8}", f"--validate={broken}",
                                  f"--out={tmp_path / 'o'}"), "is not an ActorQ run's results (TypeError")
    assert not (tmp_path / "o").exists()


def test_contention_grows_each_actors_step_cost_with_the_actors_on_its_machine():
    contended = scale.Profile(**{**vars(profile(t_a=0.002, t_u=1e-6)), "actor_contention": 0.5})
    assert contended.actor_step_seconds_with(1) == pytest.approx(0.002)
    assert contended.actor_step_seconds_with(4) == pytest.approx(0.002 * (1 + 0.5 * 2))
    # 10 cores: every process gets the core it asks for; two actors at 2 ms x 1.5 = 3 ms per step each.
    predicted = scale.predict(contended, 2, cores=10.0)
    assert predicted["actor_steps_per_second"] == pytest.approx(2 / 0.003, rel=1e-3)
    # Two machines with one actor each: no sharing, no contention.
    assert scale.predict(contended, 2, machines=2, cores=10.0)["actor_steps_per_second"] == pytest.approx(
        2 / 0.002, rel=1e-3)


def test_contention_is_fitted_from_a_run_with_more_actors():
    alone = scale.profile_from_results(fake_run("fp32", 1, 500.0, 31.25), 256)  # 100 CPU-s / 50,000 steps = 2 ms
    four = fake_run("fp32", 4, 800.0, 50.0)  # 400 CPU-s / 80,000 steps = 5 ms: 2.5x over log2 4 = 2 doublings
    assert scale.contention_from_results(alone, four).actor_contention == pytest.approx(0.75)
    faster = fake_run("fp32", 2, 1200.0, 50.0)  # 200 / 120,000 = 1.67 ms: cheaper than alone, floored at 0
    assert scale.contention_from_results(alone, faster).actor_contention == 0.0
    with pytest.raises(QrlInputError, match="two or more actors"):
        scale.contention_from_results(alone, fake_run("fp32", 1, 500.0, 31.25))
    with pytest.raises(QrlInputError, match="cannot calibrate the fp32 profile"):
        scale.contention_from_results(alone, fake_run("int8", 2, 900.0, 50.0))


def test_cli_calibrates_contention_and_projects_with_and_without_it(tmp_path):
    fp32 = _write(tmp_path / "fp32", fake_run("fp32", 1, 500.0, 31.25))
    int8 = _write(tmp_path / "int8", fake_run("int8", 1, 1000.0, 62.5))
    fp32_two = _write(tmp_path / "fp32x2", fake_run("fp32", 2, 2 / 0.003, 40.0))  # 3 ms vs 2 ms: c = 0.5
    int8_two = _write(tmp_path / "int8x2", fake_run("int8", 2, 2 / 0.0012, 40.0))  # 1.2 ms vs 1 ms: c = 0.2
    completed = run_module("launch.actorq_scale", f"--profile={fp32},{int8}", f"--contention={fp32_two},{int8_two}",
                           f"--validate={fp32_two}", "--actors=1,2", f"--out={tmp_path / 'out'}")
    assert completed.returncode == 0, completed.stderr
    written = json.loads((tmp_path / "out" / "scale.json").read_text())
    assert written["profiles"]["fp32"]["actor_contention"] == pytest.approx(0.5, rel=1e-3)
    assert written["profiles"]["int8"]["actor_contention"] == pytest.approx(0.2, rel=1e-3)
    assert written["validation"][0]["actor_contention"] == pytest.approx(0.5, rel=1e-3)
    assert set(written["projection"]) == {"int8, CPU learner, contention", "int8, CPU learner, no contention"}
    assert "fp32: contention c = 0.500" in completed.stdout
    other = _write(tmp_path / "bf16x2", fake_run("bf16", 2, 900.0, 40.0))
    assert_input_error(run_module("launch.actorq_scale", f"--profile={fp32},{int8}", f"--contention={other}",
                                  f"--out={tmp_path / 'o'}"), "--contention: no profile for bf16 actors")
    assert not (tmp_path / "o").exists()
