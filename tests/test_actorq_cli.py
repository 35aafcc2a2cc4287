"""`python -m launch.actorq` end to end: tiny in-process runs (dqn and d4pg, int8 and fp32), a
target-return stop, resume, and bad input (one line, exit 2, no workdir written).

Each subprocess pays a JAX import and compile, so independent runs start together (a few at a
time): the finished runs first, then the resumed run beside every bad-input case.
"""

import concurrent.futures
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.test_cli import assert_input_error

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PARALLEL_RUNS = 3
EVAL = ["--eval_every_seconds=1", "--eval_episodes=2", "--publish_period=20", "--actor_update_period=50",
        "--insert_chunk=32"]
# 256-256: big enough that an int8 blob is < 0.3 of the fp32 one (scales, biases and keys weigh on tiny nets).
DQN = ["--agent=dqn", "--env=gym:CartPole-v1", "--set=learning_starts=64", "--set=batch_size=32", "--set=train_freq=4",
       "--set=gradient_steps=1", "--set=hidden_sizes=256-256", "--set=buffer_size=5000", *EVAL]
# QuaRL's replay regime: only a minimum size, each transition drawn at most 16 times.
DQN_INT8 = [*DQN, "--num_actors=2", "--actor_precision=int8", "--max_eval_episode_steps=100", "--rate_limiter=min_size",
            "--max_times_sampled=16"]
D4PG = ["--agent=d4pg", "--env=dmc:cartpole-balance", "--set=critic_hidden_sizes=32-32", "--set=batch_size=32",
        "--set=learning_starts=64", "--set=buffer_size=5000", "--max_eval_episode_steps=50", *EVAL]
# Episodes capped at 5 steps score exactly 5 on CartPole (no policy topples the pole that fast).
FP32_TARGET = [*DQN, "--num_actors=1", "--actor_precision=fp32", "--max_eval_episode_steps=5", "--target_return=5",
               "--max_seconds=120"]
# QuaRL's preset with smaller networks and replay minimum; the flags given here override it.
D4PG_QUARL = ["--agent=d4pg", "--env=dmc:cartpole-balance", "--preset=quarl", "--set=actor_hidden_sizes=64-64-64",
              "--set=critic_hidden_sizes=32-32-32", "--set=batch_size=32", "--min_replay_size=64", "--num_actors=2",
              "--max_eval_episode_steps=50", "--max_learner_steps=20", *EVAL]
ACTOR_PHASES = {"env_step", "inference", "pull_wait", "deserialize", "load", "insert", "other", "total"}
RAY_PROCESS_NAMES = ("raylet", "gcs_server")


def launch(workdir, *args):
    """Runs `launch.actorq` to the end: (completed process, wall seconds)."""
    env = {**os.environ, "PYTHONPATH": REPO}
    tick = time.monotonic()
    completed = subprocess.run([sys.executable, "-m", "launch.actorq", f"--workdir={workdir}", *args], cwd=REPO,
                               env=env, capture_output=True, text=True, timeout=300)
    return completed, time.monotonic() - tick


def launch_all(jobs: dict) -> dict:
    """`{name: (workdir, args)}` -> `{name: (completed, seconds)}`, PARALLEL_RUNS at a time."""
    with concurrent.futures.ThreadPoolExecutor(PARALLEL_RUNS) as executor:
        futures = {name: executor.submit(launch, workdir, *args) for name, (workdir, args) in jobs.items()}
        return {name: future.result() for name, future in futures.items()}


def read_results(workdir):
    with open(os.path.join(workdir, "results.json")) as file:
        return json.load(file)


def metrics_rows(workdir):
    with open(os.path.join(workdir, "metrics.csv")) as file:
        return list(csv.DictReader(file))


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """Four runs, three at a time: dqn int8 (2 actors) in QuaRL's replay regime, d4pg int8 with its
    actor in ONNX Runtime, dqn fp32 with a target return, d4pg with --preset=quarl (shrunk)."""
    root = tmp_path_factory.mktemp("actorq")
    jobs = {
        "dqn_int8": (str(root / "dqn_int8"), [*DQN_INT8, "--max_learner_steps=60"]),
        "d4pg_int8": (str(root / "d4pg_int8"), [*D4PG, "--num_actors=1", "--actor_precision=int8",
                                                "--actor_int8_scheme=int8", "--actor_runtime=onnx",
                                                "--max_learner_steps=20"]),
        "fp32_target": (str(root / "fp32_target"), FP32_TARGET),
        "d4pg_quarl": (str(root / "d4pg_quarl"), D4PG_QUARL),
    }
    outcomes = launch_all(jobs)
    for name, (completed, _) in outcomes.items():
        assert completed.returncode == 0, f"{name}:\n{completed.stderr[-3000:]}"
    return {name: (jobs[name][0], completed) for name, (completed, _) in outcomes.items()}


def _files(path):
    return sorted(os.path.relpath(os.path.join(folder, name), path)
                  for folder, _, names in os.walk(path) for name in names)


def check_run_directory(workdir, agent, actor_precision):
    for name in ("config.json", "metrics.csv", "results.json", "breakdown.png"):
        assert os.path.isfile(os.path.join(workdir, name)), name
    assert not [name for name in _files(workdir) if os.path.basename(name).startswith(".")
                or name.endswith(".tmp")]
    with open(os.path.join(workdir, "breakdown.png"), "rb") as file:
        assert file.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.listdir(os.path.join(workdir, "checkpoints"))
    with open(os.path.join(workdir, "config.json")) as file:
        config = json.load(file)["actorq"]
    assert config["agent"] == agent and config["actor_precision"] == actor_precision
    rows = metrics_rows(workdir)
    assert rows and {"step", "wall_seconds", "actor_steps", "return_fp32", "return_actor"} <= set(rows[0])

    results = read_results(workdir)
    assert results["agent"] == agent and results["actor_precision"] == actor_precision
    assert results["launcher"] == "inprocess" and results["config"] == config
    counts = results["counts"]
    assert counts["actor_steps"] > 0 and counts["episodes"] >= 0 and counts["learner_steps"] >= 0
    assert len(rows) == len(results["evaluations"]) >= 1
    assert int(rows[-1]["step"]) == results["evaluations"][-1]["learner_steps"]
    for record in results["evaluations"]:
        assert {"wall_seconds", "learner_steps", "actor_steps", "return_fp32", "return_actor"} <= set(record)
    assert results["final_return"] == {"fp32": results["evaluations"][-1]["return_fp32"],
                                       "actor": results["evaluations"][-1]["return_actor"]}
    throughput = results["throughput"]
    assert throughput["actor_steps_per_second"] > 0
    assert len(throughput["per_actor_steps_per_second"]) == results["num_actors"]
    assert throughput["actor_steps_per_second"] == pytest.approx(sum(throughput["per_actor_steps_per_second"]))
    actor = results["breakdown"]["actor"]
    assert ACTOR_PHASES <= set(actor)
    # The phases (with `other`) add up to the actors' total time.
    assert sum(actor[phase] for phase in ACTOR_PHASES - {"total"}) == pytest.approx(actor["total"], rel=1e-6)
    assert actor["env_step"] > 0 and actor["inference"] > 0
    assert {"sample_wait", "update", "publish", "other", "total"} <= set(results["breakdown"]["learner"])
    assert {"insert", "sample"} <= set(results["breakdown"]["replay"])
    publish = results["publish"]
    assert publish["count"] >= 1 and publish["fp32_bytes"] > 0
    assert publish["ratio_to_fp32"] == pytest.approx(publish["bytes_per_publish"] / publish["fp32_bytes"])
    assert results["energy"]["method"] in ("codecarbon", "rapl", "cpu_power_model")
    assert results["cpu_seconds"]["total"] > 0
    assert results["restarts"] == {}
    return results


def test_dqn_int8_run_writes_everything(finished):
    workdir, completed = finished["dqn_int8"]
    results = check_run_directory(workdir, "dqn", "int8")
    assert results["stop_reason"] == "max_learner_steps" and results["counts"]["learner_steps"] >= 60
    assert results["comm_precision"] == "int8" and results["num_actors"] == 2
    assert results["publish"]["ratio_to_fp32"] < 0.3
    assert results["time_to_target_seconds"] is None and results["target_return"] is None
    # QuaRL's regime: no ratio, items drawn at most 16 times (the learner consumed only what actors made).
    assert results["config"]["rate_limiter"] == "min_size" and results["config"]["max_times_sampled"] == 16
    items = results["breakdown"]["replay_items"]
    assert items["sampled"] <= 16 * items["inserted"] and items["size"] <= items["inserted"]
    assert results["breakdown"]["replay"]["insert_wait"] == 0.0  # actors never wait for the learner.
    assert "stopped by max_learner_steps" in completed.stdout


def test_d4pg_int8_run_writes_everything(finished):
    workdir, _ = finished["d4pg_int8"]
    results = check_run_directory(workdir, "d4pg", "int8")
    assert results["stop_reason"] == "max_learner_steps" and results["counts"]["learner_steps"] >= 20
    assert results["publish"]["ratio_to_fp32"] < 0.3  # the 300-200 actor
    assert results["actor_int8_scheme"] == "int8"  # a non-default scheme: static per-feature scales
    assert results["actor_runtime"] == "onnx" and results["config"]["actor_runtime"] == "onnx"
    assert set(results["learner_metrics"]) >= {"critic_loss", "actor_loss"}


def test_quarl_preset_fills_what_the_flags_leave_unset(finished):
    workdir, _ = finished["d4pg_quarl"]
    results = check_run_directory(workdir, "d4pg", "int8")
    config = results["config"]
    assert config["preset"] == "quarl" and results["counts"]["learner_steps"] >= 20
    # From the preset (QuaRL's actorQ/d4pg): MinSize limiter, items drawn 16 times, uniform replay of 100k.
    assert (config["rate_limiter"], config["max_times_sampled"], config["replay_capacity"], config["prioritized"]) == (
        "min_size", 16, 100_000, False)
    assert config["actor_int8_scheme"] == "quarl_dyn8" and config["exploration_spacing"] == "linear"
    # Given on the command line: these win over the preset's 2000, 4 actors and period 30.
    assert (config["min_replay_size"], config["num_actors"], config["actor_update_period"]) == (64, 2, 50)
    # QuaRL's sigmas i/N for N=4 start at 0 and end at 0.75; two actors take the ends.
    assert [actor["noise_scale"] for actor in results["actors"]] == [0.0, 0.75]
    overrides = config["overrides"]
    assert overrides["architecture"] == "quarl" and overrides["max_grad_norm"] == 40.0 and overrides["n_step"] == 5
    assert overrides["critic_hidden_sizes"] in ("32-32-32", [32, 32, 32])  # --set wins over the preset's 512-512-256
    assert results["breakdown"]["replay"]["insert_wait"] == 0.0


def test_target_return_stops_an_fp32_run(finished):
    workdir, completed = finished["fp32_target"]
    results = check_run_directory(workdir, "dqn", "fp32")
    assert results["stop_reason"] == "target_return"
    assert results["target_return"] == 5.0
    first = results["evaluations"][0]
    assert first["return_fp32"] == 5.0
    assert results["time_to_target_seconds"] == first["wall_seconds"]
    assert results["actor_steps_to_target"] == first["actor_steps"]
    assert results["learner_steps_to_target"] == first["learner_steps"]
    assert "target reached after" in completed.stdout
    # fp32 actors run the fp32 params: equal returns, publishes as large as fp32.
    assert all(record["return_actor"] == record["return_fp32"] for record in results["evaluations"])
    assert results["comm_precision"] == "fp32"
    assert 0.95 < results["publish"]["ratio_to_fp32"] < 1.1


# ----- resume and bad input -------------------------------------------------------------------

BAD_INPUT = {
    "num_actors": (["--num_actors=0"], "--num_actors must be >= 1"),
    "actor_precision": (["--actor_precision=int4"], "'int4'"),
    "comm_precision": (["--comm_precision=fp64"], "'fp64'"),
    "launcher": (["--launcher=mpi"], "'mpi'"),
    "no_stop_condition": ([], "stop condition"),
    "agent": (["--agent=ppo"], "'ppo'"),
    "env": (["--env=brax:ant"], "brax:ant"),
    "unreachable_ray": (["--launcher=ray", "--ray_address=127.0.0.1:1"], "127.0.0.1:1"),
    "ray_address_without_ray": (["--ray_address=127.0.0.1:1"], "--launcher=ray"),
    "unknown_override": (["--set=unknown_key=1"], "unknown_key"),
}
# Against the finished dqn int8 run: (extra args, fragment of the error line).
RESUME_INPUT = {
    "resume_other_precision": (["--resume", "--actor_precision=fp32"], "actor_precision"),
    "resume_other_override": (["--resume", "--set=hidden_sizes=64-64"], "overrides"),
    "no_resume_or_overwrite": ([], "--resume"),
}


@pytest.fixture(scope="module")
def second_wave(finished, tmp_path_factory):
    """The finished dqn int8 run resumed (on a copy) beside every bad-input case. Also returns
    when it began (for Ray processes) and the first run's results.json bytes and mtime."""
    root = tmp_path_factory.mktemp("bad")
    original, _ = finished["dqn_int8"]
    resumed = str(root / "resumed")
    shutil.copytree(original, resumed)
    results_path = os.path.join(original, "results.json")
    with open(results_path, "rb") as file:
        before = (file.read(), os.stat(results_path).st_mtime_ns)
    # The stop condition is polled, so a run overshoots its max_learner_steps: resume past that.
    resume_steps = read_results(original)["counts"]["learner_steps"] + 60
    jobs = {"resumed": (resumed, [*DQN_INT8, f"--max_learner_steps={resume_steps}", "--resume"])}
    for name, (args, _) in BAD_INPUT.items():
        base = [*DQN, "--max_learner_steps=10"] if name != "no_stop_condition" else list(DQN)
        jobs[name] = (str(root / name / "run"), [*base, *args])
    for name, (args, _) in RESUME_INPUT.items():
        jobs[name] = (original, [*DQN_INT8, "--max_learner_steps=60", *args])
    since = time.time()
    outcomes = launch_all(jobs)
    return {"outcomes": outcomes, "workdirs": {name: workdir for name, (workdir, _) in jobs.items()},
            "since": since, "results_before": before, "original": original, "resumed": resumed,
            "resume_steps": resume_steps}


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_is_one_line_and_writes_nothing(second_wave, case):
    completed, seconds = second_wave["outcomes"][case]
    assert_input_error(completed, BAD_INPUT[case][1])
    if case == "unreachable_ray":
        assert seconds < 20  # a TCP probe, not Ray's own minute of retries
    workdir = second_wave["workdirs"][case]
    assert not os.path.exists(workdir), f"{case} left {_files(workdir)} in its workdir"


def test_unreachable_ray_cluster_starts_no_ray_process(second_wave):
    started = []
    for process in psutil.process_iter(["name", "create_time"]):
        name, created = process.info["name"] or "", process.info["create_time"] or 0.0
        if created >= second_wave["since"] - 1 and any(marker in name for marker in RAY_PROCESS_NAMES):
            started.append((process.pid, name))
    assert not started


@pytest.mark.parametrize("case", list(RESUME_INPUT))
def test_resume_mismatch_and_occupied_workdir_are_refused(second_wave, case):
    completed, _ = second_wave["outcomes"][case]
    assert_input_error(completed, RESUME_INPUT[case][1])
    if case == "resume_other_precision":
        assert "overrides" not in completed.stderr  # only the differing key is named
    results_path = os.path.join(second_wave["original"], "results.json")
    with open(results_path, "rb") as file:
        assert (file.read(), os.stat(results_path).st_mtime_ns) == second_wave["results_before"]


def test_resume_continues_from_the_checkpoint(second_wave, finished):
    completed, _ = second_wave["outcomes"]["resumed"]
    assert completed.returncode == 0, completed.stderr[-3000:]
    first = read_results(finished["dqn_int8"][0])
    workdir = second_wave["resumed"]
    results = read_results(workdir)
    assert results["stop_reason"] == "max_learner_steps"
    assert results["counts"]["learner_steps"] >= second_wave["resume_steps"] > first["counts"]["learner_steps"]
    # The counter restarts from the checkpointed counts.
    assert results["counts"]["actor_steps"] > first["counts"]["actor_steps"]
    assert results["counts"]["episodes"] >= first["counts"]["episodes"]
    assert results["resumed_from"] == first["counts"]["learner_steps"]
    assert results["config"]["max_learner_steps"] == second_wave["resume_steps"]
    # metrics.csv continues: the first run's rows, then the resumed run's at later learner steps.
    rows = metrics_rows(workdir)
    first_rows = len(first["evaluations"])
    assert len(rows) == first_rows + len(results["evaluations"])
    assert all(int(row["step"]) >= first["counts"]["learner_steps"] for row in rows[first_rows:])


def test_sigterm_in_process_ends_like_ctrl_c_with_a_final_checkpoint(tmp_path):
    workdir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": REPO}
    process = subprocess.Popen(
        [sys.executable, "-m", "launch.actorq", f"--workdir={workdir}", *DQN, "--num_actors=1", "--max_seconds=300"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not (workdir / "metrics.csv").exists() and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.5)  # metrics.csv: the run got past its checks and started
        time.sleep(2.0)
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, stderr
    assert "interrupted" in stderr
    assert [path for path in os.listdir(workdir / "checkpoints") if path.isdigit()], "no final checkpoint"
