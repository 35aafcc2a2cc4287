"""Where a study's cells run: one after another in this process, in N local processes, or as Ray
tasks on a local or remote Ray cluster (`--launcher=local|ray`, `--parallel`, `--ray_address`).

A study hands `run_tasks` a list of `CellTask`s: a module-level function and its (picklable)
arguments, which writes its cell's results under the study's directory atomically, as the
sequential run does. A task that raises, or whose process is killed, fails only itself: it is
retried once (`retries`), then reported as `(task, one-line reason)`; the other tasks go on.
Ctrl-C stops the study: pending tasks are cancelled, running local processes terminated, a local
Ray shut down (no Ray process is left behind).

Ray: without `--ray_address` a local Ray is started for the study on 127.0.0.1 and stopped at the
end (`qrl.distributed.ray_launcher.RayBackend`); with one, the study joins that cluster. Before any
task starts, `check_launch` refuses in one line an unreachable address, resources no node has (a
GPU on a CPU-only cluster) and, on a remote cluster, a study directory the cluster cannot write
(a probe task writes a file there that this process must see).
"""

import dataclasses
import multiprocessing
import multiprocessing.connection
import os
import re
import time
import traceback
import uuid
from typing import Callable, Optional, Sequence

from absl import flags

from qrl.distributed.launching import check_reachable
from qrl.errors import QrlInputError

LAUNCHERS = ("local", "ray")
POLL_SECONDS = 0.5
CELL_FAILURE_PREFIX = re.compile(r"^(?:[\w.]+\.)?CellFailure: ")


@dataclasses.dataclass(frozen=True)
class CellTask:
    """One unit of a study's work: `function(*args)` writes its cells' results and may return a
    short status ("ran", "already done") for the log; `label` names it in reports. `function` must
    be importable by module and name (a worker process imports it)."""

    label: str
    function: Callable[..., None]
    args: tuple = ()
    num_cpus: float = 1.0
    num_gpus: float = 0.0


@dataclasses.dataclass(frozen=True)
class LaunchOptions:
    launcher: str = "local"
    parallel: int = 1
    ray_address: Optional[str] = None
    retries: int = 1


FLAG_HELP = {
    "launcher": "Where cells run: local (in sequence, or --parallel processes) or ray (Ray tasks on a local Ray "
                "started for the study, or the cluster at --ray_address).",
    "parallel": "--launcher=local: cells run in this many processes at once (1: in this process, one after another).",
    "ray_address": "--launcher=ray: host:port of a running Ray cluster's GCS (or 'auto'); none starts a local Ray on "
                   "127.0.0.1.",
}


def define_flags(help_text: Optional[dict] = None) -> None:
    """The launcher flags every study entry point takes; `help_text` replaces `FLAG_HELP`'s entries
    for a study whose cells use them differently."""
    text = {**FLAG_HELP, **(help_text or {})}
    flags.DEFINE_enum("launcher", "local", LAUNCHERS, text["launcher"])
    flags.DEFINE_integer("parallel", 1, text["parallel"])
    flags.DEFINE_string("ray_address", None, text["ray_address"])


def options_from_flags() -> LaunchOptions:
    values = flags.FLAGS
    return make_options(values.launcher, values.parallel, values.ray_address)


def make_options(launcher: str = "local", parallel: int = 1, ray_address: Optional[str] = None,
                 retries: int = 1) -> LaunchOptions:
    if launcher not in LAUNCHERS:
        raise QrlInputError(f"--launcher must be one of {', '.join(LAUNCHERS)}, got {launcher!r}")
    if parallel < 1:
        raise QrlInputError(f"--parallel must be >= 1, got {parallel}")
    if ray_address and launcher != "ray":
        raise QrlInputError("--ray_address needs --launcher=ray")
    if parallel != 1 and launcher != "local":
        raise QrlInputError("--parallel is for --launcher=local (Ray runs as many cells as the cluster has room for)")
    if retries < 0:
        raise QrlInputError(f"retries must be >= 0, got {retries}")
    if ray_address and ray_address != "auto":
        check_reachable(ray_address)
    return LaunchOptions(launcher, parallel, ray_address or None, retries)


class CellFailure(Exception):
    """Raised by a task whose cell failed with a one-line reason of its own (a subprocess's last
    line): reported as that line, without the exception's type."""


def _reason(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text if isinstance(error, CellFailure) else f"{type(error).__name__}: {text}"


def _ray_reason(reason: Optional[str]) -> Optional[str]:
    """A Ray task's one-line reason as `_reason` words it: Ray names the raised type, qualified by
    its module, and a `CellFailure` is reported as its own line."""
    return CELL_FAILURE_PREFIX.sub("", reason) if reason else reason


def _worker_loop(connection) -> None:
    """A local worker process: runs the tasks it is sent until told to stop (None), answering each
    with `("done", status)` or `("failed", one-line reason + traceback)`. Reusing the process keeps
    its imports and compiled programs for the next cell."""
    while True:
        try:
            message = connection.recv()
        except EOFError:
            return
        if message is None:
            return
        function, args = message
        try:
            status = function(*args)
        except BaseException as error:  # noqa: BLE001 - every failure is this cell's, reported as one line.
            connection.send(("failed", _reason(error) + "\n" + traceback.format_exc()))
        else:
            connection.send(("done", status if isinstance(status, str) else "done"))


class _Worker:
    """One spawned worker process and the task it is running."""

    def __init__(self, context):
        self.connection, child = context.Pipe()
        self.process = context.Process(target=_worker_loop, args=(child,), daemon=True)
        self.process.start()
        child.close()
        self.task = None

    def answer(self):
        """`(kind, message)` once the running task ended, else None; a dead process is a failure."""
        if self.connection.poll():
            try:
                return self.connection.recv()
            except EOFError:
                pass
        elif self.process.is_alive():
            return None
        self.process.join(timeout=10)
        return "failed", f"its process exited with status {self.process.exitcode}"

    def stop(self, force: bool) -> None:
        if force:
            self.process.terminate()
        else:
            try:
                self.connection.send(None)
            except (BrokenPipeError, OSError):
                pass
        self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()
        self.connection.close()


def _log_line(finished: int, total: int, task: CellTask, reason: Optional[str], status: str, start: float) -> str:
    return (f"[{finished}/{total}] {task.label}: {'FAILED: ' + reason if reason else status} "
            f"({time.perf_counter() - start:.0f} s)")


class _Tally:
    """A run's bookkeeping: counts finished tasks, collects failures, and puts a failed task back
    at the head of the queue while it has retries left."""

    def __init__(self, total: int, retries: int, log: Callable[[str], None]):
        self.total, self.retries, self.log = total, retries, log
        self.finished, self.failed = 0, []

    def settle(self, task: CellTask, attempt: int, start: float, reason: Optional[str], status: str,
               queue: list) -> None:
        if reason and attempt < self.retries:
            self.log(f"{task.label}: {reason}; retrying")
            queue.insert(0, (task, attempt + 1))
            return
        self.finished += 1
        if reason:
            self.failed.append((task, reason))
        self.log(_log_line(self.finished, self.total, task, reason, status, start))


def _run_sequential(tasks: Sequence[CellTask], options: LaunchOptions, log: Callable[[str], None],
                    deadline: Optional[float]) -> list:
    """In this process, one after another; a QrlInputError (bad input) stops the study."""
    tally, queue = _Tally(len(tasks), options.retries, log), [(task, 0) for task in tasks]
    while queue and not _past(deadline):
        task, attempt = queue.pop(0)
        start = time.perf_counter()
        try:
            result = task.function(*task.args)
        except QrlInputError:
            raise
        except Exception as error:  # noqa: BLE001 - a failure is this task's; the study goes on.
            tally.settle(task, attempt, start, _reason(error), "", queue)
            continue
        tally.settle(task, attempt, start, None, result if isinstance(result, str) else "done", queue)
    return tally.failed


def _run_processes(tasks: Sequence[CellTask], options: LaunchOptions, log: Callable[[str], None],
                   deadline: Optional[float]) -> list:
    """Tasks on `parallel` spawned worker processes, each running one task at a time; a worker
    that dies fails its task and is replaced."""
    context = multiprocessing.get_context("spawn")
    queue = [(task, 0) for task in tasks]
    workers = [_Worker(context) for _ in range(min(options.parallel, len(tasks)))]
    tally, clean = _Tally(len(tasks), options.retries, log), False
    try:
        while True:
            for index, worker in enumerate(workers):
                if worker.task is None and queue and not _past(deadline):
                    task, attempt = queue.pop(0)
                    worker.connection.send((task.function, task.args))
                    worker.task = (task, attempt, time.perf_counter())
                if worker.task is None:
                    continue
                answer = worker.answer()
                if answer is None:
                    continue
                (task, attempt, start), worker.task = worker.task, None
                kind, message = answer
                if not worker.process.is_alive():
                    worker.stop(force=True)
                    workers[index] = _Worker(context)
                tally.settle(task, attempt, start, message.splitlines()[0] if kind == "failed" else None, message, queue)
            busy = any(worker.task is not None for worker in workers)
            if not busy and (not queue or _past(deadline)):
                break
            if busy:
                multiprocessing.connection.wait([handle for worker in workers if worker.task is not None
                                                 for handle in (worker.connection, worker.process.sentinel)],
                                                timeout=POLL_SECONDS)
        clean = True
    finally:
        for worker in workers:
            worker.stop(force=not clean)
    return tally.failed


def _write_probe(path: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("qrl study probe\n")


def check_launch(backend, tasks: Sequence[CellTask], workdir: str, remote: bool) -> None:
    """Refuses, before any task starts, requests no node can meet and (remote clusters) a study
    directory the cluster cannot write."""
    resources = backend.cluster_resources()
    for task in tasks:
        for name, amount in (("CPU", task.num_cpus), ("GPU", task.num_gpus)):
            if amount > resources.get(name, 0.0):
                raise QrlInputError(f"{task.label} asks for {amount:g} {name} but the Ray cluster has "
                                    f"{resources.get(name, 0.0):g}")
    if not remote:
        return
    probe = os.path.join(os.path.abspath(workdir), f".probe-{uuid.uuid4().hex}")
    outcome = backend.submit(_write_probe, probe, num_cpus=0.0, name="qrl-study-probe")
    backend.wait_any([outcome], timeout=120.0)
    reason = outcome.outcome()[0] if outcome.done() else "the probe task did not finish in 120 s"
    seen = os.path.exists(probe)
    if seen:
        os.remove(probe)
    if reason or not seen:
        raise QrlInputError(f"the Ray cluster cannot write the study directory {workdir} where this process sees it "
                            f"({reason or 'its file did not appear here'}): use storage every node shares")


def _run_ray(tasks: Sequence[CellTask], options: LaunchOptions, workdir: str, log: Callable[[str], None],
             deadline: Optional[float]) -> list:
    """Tasks submitted as the cluster's CPUs free up (so none starts past `deadline`)."""
    from qrl.distributed.ray_launcher import RayBackend

    backend = RayBackend(address=options.ray_address, run_name="qrl-study")
    running: dict = {}
    try:
        check_launch(backend, tasks, workdir, remote=options.ray_address is not None)
        tally = _Tally(len(tasks), options.retries, log)

        def submit(task: CellTask, attempt: int) -> None:
            handle = backend.submit(task.function, *task.args, num_cpus=task.num_cpus, num_gpus=task.num_gpus,
                                    name=task.label)
            running[handle] = (task, attempt, time.perf_counter())

        capacity = max(1, int(backend.cluster_resources().get("CPU", 1.0)))
        queue = [(task, 0) for task in tasks]
        while queue or running:
            while queue and len(running) < capacity and not _past(deadline):
                submit(*queue.pop(0))
            if not running:
                break
            for handle in backend.wait_any(list(running), timeout=POLL_SECONDS):
                task, attempt, start = running.pop(handle)
                reason, status = handle.outcome()
                tally.settle(task, attempt, start, _ray_reason(reason), status, queue)
        return tally.failed
    finally:
        for handle in running:
            handle.cancel()
        backend.shutdown()


def run_tasks(tasks: Sequence[CellTask], options: LaunchOptions, workdir: str, log: Callable[[str], None] = print,
              deadline: Optional[float] = None) -> list:
    """Runs `tasks` as `options` says; returns `(task, one-line reason)` for each that failed after
    its retries. No task starts once `time.monotonic()` has passed `deadline`."""
    if not tasks:
        return []
    if options.launcher == "ray":
        return _run_ray(tasks, options, workdir, log, deadline)
    if options.parallel > 1:
        return _run_processes(tasks, options, log, deadline)
    return _run_sequential(tasks, options, log, deadline)


def _past(deadline: Optional[float]) -> bool:
    return deadline is not None and time.monotonic() >= deadline
