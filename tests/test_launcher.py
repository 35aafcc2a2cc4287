"""`launch.launcher`: a study's cells in sequence, in local processes or as Ray tasks; a failed or
killed task fails only itself (after one retry), and bad launcher input is refused up front."""

import json
import os
import signal
import subprocess
import sys

import pytest

from launch import launcher
from qrl.errors import QrlInputError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_value(directory: str, name: str, value: int) -> str:
    """A cell: writes `value` to `<directory>/<name>.json`."""
    with open(os.path.join(directory, f"{name}.json"), "w", encoding="utf-8") as handle:
        json.dump({"value": value}, handle)
    return "ran"


def count_attempt(directory: str, name: str) -> int:
    path = os.path.join(directory, f"{name}.attempts")
    attempts = int(open(path).read()) + 1 if os.path.exists(path) else 1
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(str(attempts))
    return attempts


def broken(directory: str, name: str) -> None:
    count_attempt(directory, name)
    raise RuntimeError(f"{name} broke")


def flaky(directory: str, name: str) -> str:
    """Fails on its first attempt only."""
    if count_attempt(directory, name) == 1:
        raise RuntimeError("first attempt")
    return write_value(directory, name, 7)


def declined(directory: str, name: str) -> None:
    """Fails with a reason of its own, as a subprocess cell does (its last log line)."""
    count_attempt(directory, name)
    raise launcher.CellFailure(f"{name}: the dataset has 10 transitions")


def killed(directory: str, name: str) -> None:
    count_attempt(directory, name)
    os.kill(os.getpid(), signal.SIGKILL)


def _tasks(directory: str, with_kill: bool = True) -> list:
    tasks = [launcher.CellTask(f"cell {index}", write_value, (directory, f"cell{index}", index)) for index in range(4)]
    tasks += [launcher.CellTask("broken", broken, (directory, "broken")),
              launcher.CellTask("flaky", flaky, (directory, "flaky")),
              launcher.CellTask("declined", declined, (directory, "declined"))]
    if with_kill:
        tasks.append(launcher.CellTask("killed", killed, (directory, "killed")))
    return tasks


def _check_outcome(directory, failed, killed_reason):
    reasons = {task.label: reason for task, reason in failed}
    assert set(reasons) == {"broken", "declined", "killed"}
    assert reasons["broken"] == "RuntimeError: broken broke"
    assert reasons["declined"] == "declined: the dataset has 10 transitions"  # its own line, no type name
    assert killed_reason in reasons["killed"]
    for index in range(4):
        assert json.loads((directory / f"cell{index}.json").read_text()) == {"value": index}
    assert json.loads((directory / "flaky.json").read_text()) == {"value": 7}
    for name in ("broken", "declined", "flaky", "killed"):
        assert (directory / f"{name}.attempts").read_text() == "2"  # one retry each.


def test_local_processes_fail_only_the_broken_and_killed_cells(tmp_path):
    lines = []
    failed = launcher.run_tasks(_tasks(str(tmp_path)), launcher.make_options("local", parallel=2), str(tmp_path),
                                log=lines.append)
    _check_outcome(tmp_path, failed, "its process exited with status -9")
    assert sum(line.startswith("[") for line in lines) == 8 and any("cell 0: ran" in line for line in lines)


def test_in_process_cells_retry_once_and_bad_input_stops_the_study(tmp_path):
    lines = []
    failed = launcher.run_tasks(_tasks(str(tmp_path), with_kill=False), launcher.make_options(), str(tmp_path),
                                log=lines.append)
    assert [(task.label, reason) for task, reason in failed] == [
        ("broken", "RuntimeError: broken broke"), ("declined", "declined: the dataset has 10 transitions")]
    assert (tmp_path / "broken.attempts").read_text() == "2" and (tmp_path / "flaky.json").is_file()
    assert "flaky: RuntimeError: first attempt; retrying" in lines

    def bad_input():
        raise QrlInputError("bad cell")

    with pytest.raises(QrlInputError, match="bad cell"):
        launcher.run_tasks([launcher.CellTask("bad", bad_input)], launcher.make_options(), str(tmp_path))


def test_no_task_starts_past_the_deadline(tmp_path):
    tasks = _tasks(str(tmp_path), with_kill=False)
    assert launcher.run_tasks(tasks, launcher.make_options("local", parallel=2), str(tmp_path), log=lambda line: None,
                              deadline=0.0) == []
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("arguments, message", [
    (dict(parallel=0), "--parallel must be >= 1"),
    (dict(launcher="slurm"), "--launcher must be one of local, ray"),
    (dict(ray_address="127.0.0.1:1"), "--ray_address needs --launcher=ray"),
    (dict(launcher="ray", parallel=2), "--parallel is for --launcher=local"),
])
def test_bad_launcher_options_are_refused(arguments, message):
    with pytest.raises(QrlInputError, match=message):
        launcher.make_options(**arguments)


def test_ray_tasks_fail_only_their_cells_and_impossible_requests_are_refused_before_any_starts(tmp_path):
    ray_dir = tmp_path / "ray"
    ray_dir.mkdir()
    failed = launcher.run_tasks(_tasks(str(ray_dir)), launcher.make_options("ray"), str(ray_dir), log=lambda line: None)
    _check_outcome(ray_dir, failed, "its worker process died")

    gpu_dir = tmp_path / "gpu"
    gpu_dir.mkdir()
    tasks = [launcher.CellTask("cell 0", write_value, (str(gpu_dir), "cell0", 0)),
             launcher.CellTask("on a gpu", write_value, (str(gpu_dir), "gpu", 1), num_gpus=1.0)]
    with pytest.raises(QrlInputError, match="on a gpu asks for 1 GPU but the Ray cluster has 0"):
        launcher.run_tasks(tasks, launcher.make_options("ray"), str(gpu_dir))
    assert list(gpu_dir.iterdir()) == []


def test_cli_refuses_bad_launcher_flags_with_one_line_and_nothing_written(tmp_path):
    dataset = tmp_path / "pendulum.hdf5"
    dataset.write_bytes(b"")
    for flags, message in [(["--parallel=0"], "--parallel must be >= 1"),
                           (["--launcher=ray", "--ray_address=127.0.0.1:1"], "cannot reach a Ray cluster at 127.0.0.1:1")]:
        result = subprocess.run([sys.executable, "-m", "launch.prune_study", f"--workdir={tmp_path / 'study'}",
                                 f"--datasets={dataset}", *flags], cwd=REPO, capture_output=True, text=True,
                                env={**os.environ, "PYTHONPATH": REPO}, timeout=300)
        assert result.returncode == 2, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and message in result.stderr, result.stderr
    assert not (tmp_path / "study").exists()


def test_the_launch_benchmark_runs_each_arm_on_the_same_cells(tmp_path):
    json_path = tmp_path / "launch.json"
    result = subprocess.run([sys.executable, "-m", "bench.study_launch", "--quick", "--arms=sequential,processes",
                             f"--json={json_path}"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    results = json.loads(json_path.read_text())
    assert set(results["seconds"]) == {"sequential", "processes"} and results["ratio"]["sequential"] == 1.0
    assert {(cell["row"], cell["column"]) for cell in results["cells"]} == {("sequential", "3 cells"),
                                                                            ("processes", "3 cells")}
    assert "sequential / processes" in result.stdout
    bad = subprocess.run([sys.executable, "-m", "bench.study_launch", "--cells=4"], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "--cells must be a positive multiple of 3" in bad.stderr.strip().splitlines()[-1]
