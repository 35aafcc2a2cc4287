"""Studies on a Ray cluster: the pruning study's cells on a two-node cluster (head and worker,
each its own raylet on 127.0.0.1) give the sequential run's results; a killed worker fails only
its cell and a rerun fills it in; Ctrl-C stops a study on Ray with one line and leaves no Ray
process behind."""

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import numpy as np
import psutil
import pytest

from launch import launcher, prune_study
from tests.ray_processes import assert_no_orphans, loopback_cluster, marked_env, raylets, run_processes
from tests.test_prune_study import TINY, KillOne

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLAN = dict(TINY, seeds="0,1")  # dense, SNIP 90% and GraSP 90% per seed: 6 cells


class OnNode(KillOne):
    """`KillOne` that first notes the Ray node each cell runs on (a file per attempt in `record_dir`)."""

    def __init__(self, record_dir, pruner=None, seed=None):
        super().__init__(pruner, seed)
        self.record_dir = record_dir

    def __call__(self, run, workdir, **options):
        import ray

        node = ray.get_runtime_context().get_node_id()
        with open(os.path.join(self.record_dir, f"{node}.{uuid.uuid4().hex}"), "w", encoding="utf-8"):
            pass
        return super().__call__(run, workdir, **options)


def study_on_cluster(address: str, workdir: str, dataset: str, record_dir: str, kill: bool) -> None:
    """The pruning study of `PLAN` on the cluster at `address` (run in a driver process with the
    cluster's token); prints the outcome as JSON."""
    options = prune_study.make_options(workdir, dataset, **PLAN)
    runner = OnNode(record_dir, "grasp", 1) if kill else OnNode(record_dir)
    outcome = prune_study.run_study(options, runner=runner, progress=False, log=lambda line: None,
                                    launch_options=launcher.make_options("ray", ray_address=address))
    print(json.dumps({"failed": outcome["failed"], "pending": outcome["pending"]}))


def _drive(address: str, env: dict, workdir, dataset: str, record_dir, kill: bool) -> dict:
    arguments = json.dumps([address, str(workdir), dataset, str(record_dir), kill])
    completed = subprocess.run(
        [sys.executable, "-c", "import json, sys; from tests.test_study_ray import study_on_cluster; "
         "study_on_cluster(*json.loads(sys.argv[1]))", arguments],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])


def test_two_node_cluster_gives_the_sequential_results_a_killed_worker_fails_its_cell_and_a_rerun_fills_it(
        swingup_dataset, tmp_path, run_id):
    sequential = prune_study.make_options(str(tmp_path / "one_by_one"), swingup_dataset, **PLAN)
    assert prune_study.run_study(sequential, progress=False, log=lambda line: None)["failed"] == []
    workdir, record_dir = tmp_path / "cluster", tmp_path / "nodes"
    record_dir.mkdir()
    with loopback_cluster(run_id, REPO, node_cpus=(1, 1)) as (address, env, _):
        first = _drive(address, env, workdir, swingup_dataset, record_dir, kill=True)
        killed = "pendulum-swingup bc grasp s0.9 seed 1"
        assert len(first["failed"]) == 1 and first["failed"][0].startswith(f"{killed} ("), first
        assert "its worker process died" in first["failed"][0] and first["pending"] == [killed]
        rerun = _drive(address, env, workdir, swingup_dataset, record_dir, kill=False)
        assert rerun == {"failed": [], "pending": []}
    assert_no_orphans(run_id)
    nodes = {name.split(".")[0] for name in os.listdir(record_dir)}
    assert len(nodes) == 2, "cells ran on both nodes"
    # 6 cells, the killed one twice (its retry), then once more by the rerun; finished cells are skipped.
    assert len(os.listdir(record_dir)) == 6 + 1 + 1
    for cell in prune_study.plan_cells(sequential):
        mine = json.loads((workdir / cell.relative_dir / "results.json").read_text())
        theirs = json.loads((tmp_path / "one_by_one" / cell.relative_dir / "results.json").read_text())
        np.testing.assert_allclose(mine["final_eval"]["returns"], theirs["final_eval"]["returns"], rtol=1e-6)
        assert mine["masks"] == theirs["masks"]
    assert (workdir / "summary.json").is_file() and (workdir / "report.md").is_file()


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _task_processes(run_id: str, label_part: str) -> list[psutil.Process]:
    """Ray workers of the run running a task whose name (the cell's label) contains `label_part`."""
    return [process for process in run_processes(run_id)
            if label_part in " ".join([process.info["name"] or ""] + (process.info["cmdline"] or []))
            and "ray::" in " ".join([process.info["name"] or ""] + (process.info["cmdline"] or []))]


def test_ctrl_c_stops_a_study_on_its_own_ray_with_one_line_and_no_ray_process_left(swingup_dataset, tmp_path, run_id):
    """With a cluster the user started (`ray start`) running beside it, the study starts a Ray of
    its own (a bare `ray.init()` would join the user's), and Ctrl-C stops only that one."""
    workdir, users = tmp_path / "study", uuid.uuid4().hex
    with loopback_cluster(users, REPO, node_cpus=(1,)) as (_, _, user_raylets):
        # A shell's background job starts with SIGINT ignored and its children inherit that; the
        # driver must start with the default disposition, as from a terminal, for Ctrl-C to reach it.
        process = subprocess.Popen(
            [sys.executable, "-m", "launch.prune_study", "--launcher=ray", f"--workdir={workdir}",
             f"--datasets={swingup_dataset}", "--algos=bc", "--pruners=snip", "--sparsities=0,0.9", "--seeds=0,1,2",
             "--steps=1000000", "--eval_every=0", "--eval_episodes=1", "--prune_batch_size=64",
             "--set=bc.hidden_sizes=32-32", "--set=bc.batch_size=32", "--noprogress"],
            cwd=REPO, env=marked_env(run_id, REPO), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            deadline = time.monotonic() + 180
            while not _task_processes(run_id, "pendulum-swingup") and time.monotonic() < deadline:
                if process.poll() is not None:
                    pytest.fail(f"the study ended before a cell started: {process.communicate()[1][-3000:]}")
                time.sleep(0.5)
            assert _task_processes(run_id, "pendulum-swingup"), "no cell started"
            time.sleep(2.0)
            tree = psutil.Process(process.pid).children(recursive=True)
            process.send_signal(signal.SIGINT)
            _, stderr = process.communicate(timeout=120)
        finally:
            if process.poll() is None:
                process.kill()
        lines = [line for line in stderr.splitlines() if line.strip()]
        assert process.returncode == 130, stderr[-3000:]
        assert lines[-1] == "interrupted: pruning study stopped; finished cells are kept and a rerun resumes", stderr
        assert_no_orphans(run_id)
        assert not [child.pid for child in tree if _alive(child)], "processes left behind"
        assert raylets(users) == set(user_raylets), "the user's cluster is untouched"
    assert not list(workdir.glob("cells/**/results.json")), "no cell finished a 1M-update run"


def test_sigterm_stops_a_study_like_ctrl_c(capsys):
    from launch import studies

    def terminated() -> dict:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)
        return {"paths": None, "failed": []}

    previous = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(SystemExit) as exit_info:
            studies.run_and_report(terminated, "QuaRL study")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert exit_info.value.code == 130
    assert capsys.readouterr().err == "interrupted: QuaRL study stopped; finished cells are kept and a rerun resumes\n"
