"""The Ray backend: each node a Ray actor process. The only module in qrl that imports Ray.

Without an address it starts a local Ray (dashboard off, token authentication on, logical CPUs
enough for every node's request) and shuts it down at the end, taking every worker process with
it. Its node address is `bind_address` (default 127.0.0.1), and in Ray 2.60 every server listens
on the node address: the GCS, the raylet's node manager and object manager, the core-worker gRPC
server of the driver and of each worker, the runtime-env agent, the dashboard agent and the
autoscaler's metrics export. Left to itself, `ray.init` swaps a loopback node address for the
machine's external one and those servers listen on `*` (see `_keep_loopback_node_address`).

With `address` ("host:port" of a running cluster's GCS, or "auto") it joins that cluster, and
at the end kills the actors it made and disconnects; the driver advertises `bind_address` unless
it is loopback (then Ray picks the address the cluster reaches it at).

Nodes' own output goes to Ray's session logs (/tmp/ray/session_latest/logs), not the driver's
terminal: a node's failure reaches the driver as one line (see `supervise`). Worker processes
find the code through PYTHONPATH set to this checkout's root (on a multi-machine cluster the
checkout must sit at the same path on every node). Threaded actors (`max_concurrency`) let a
node serve calls — stop, stats, a blocked replay sample — while its `run()` loops.
"""

import ipaddress
import logging
import os
import signal
import threading
from typing import Any, Optional

import ray
import ray._private.ray_constants
import ray.exceptions

from qrl.distributed.launching import (
    DEFAULT_BIND_ADDRESS, DIED, FAILED, FINISHED, RUNNING, NodeFailure, NodeSpec, check_bind_address, check_reachable,
    describe_error,
)
from qrl.errors import QrlInputError

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
READY_TIMEOUT_SECONDS = 300.0
# Ray's own switch between a loopback-only node and a cluster node: off, `ray.init` keeps a
# loopback node address instead of swapping it for the machine's external one. Child processes
# read it from their environment; the driver's already-imported Ray reads the constant.
LOOPBACK_NODE_ENV_VAR = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
# A local Ray authenticates its clients with a token (its default); the notice it logs about that
# default on every start is dropped, so a refused or failed run prints one line.
AUTH_NOTICE_LOGGER = "ray._private.authentication.authentication_token_setup"
AUTH_NOTICE_START = "Token authentication is enabled for this Ray cluster"


class RayFuture:
    def __init__(self, ref: "ray.ObjectRef"):
        self._ref = ref

    def done(self) -> bool:
        ready, _ = ray.wait([self._ref], timeout=0)
        return bool(ready)

    def result(self, timeout: Optional[float] = None) -> Any:
        return ray.get(self._ref, timeout=timeout)


class RayHandle:
    """A node living in a Ray actor; picklable, so nodes hand it to each other."""

    def __init__(self, actor: Any):
        self.actor = actor

    def call(self, method: str, *args, **kwargs) -> Any:
        return ray.get(getattr(self.actor, method).remote(*args, **kwargs))

    def call_async(self, method: str, *args, **kwargs) -> RayFuture:
        return RayFuture(getattr(self.actor, method).remote(*args, **kwargs))

    def notify(self, method: str, *args, **kwargs) -> None:
        getattr(self.actor, method).remote(*args, **kwargs)


class RayTask(RayFuture):
    """A function running as one Ray task (`RayBackend.submit`)."""

    @property
    def ref(self) -> "ray.ObjectRef":
        return self._ref

    def outcome(self) -> tuple:
        """`(None, status)` when the function returned (its return value when that is a short
        status string, else "done"); `(reason, "failed")` otherwise, the reason one line: what it
        raised (`Type: message`), or that its worker process died."""
        try:
            value = ray.get(self._ref)
        except ray.exceptions.RayTaskError as error:
            return _last_line(error), "failed"
        except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError, ray.exceptions.RayActorError):
            return "its worker process died", "failed"
        except ray.exceptions.TaskCancelledError:
            return "cancelled", "failed"
        except ray.exceptions.RayError as error:
            return f"{type(error).__name__}: {_last_line(error)}", "failed"
        return None, value if isinstance(value, str) else "done"

    def cancel(self) -> None:
        try:
            ray.cancel(self._ref, force=True)
        except Exception:  # already finished or gone
            pass


class RayBackend:
    """Creates nodes as Ray actors; see the module docstring."""

    def __init__(self, address: Optional[str] = None, num_cpus: Optional[float] = None, run_name: str = "qrl",
                 bind_address: str = DEFAULT_BIND_ADDRESS):
        self._started_local = address is None
        if address not in (None, "auto"):
            check_reachable(address)
        check_bind_address(bind_address)
        python_path = os.pathsep.join(filter(None, [REPO_ROOT, os.environ.get("PYTHONPATH")]))
        runtime_env = {"env_vars": {"PYTHONPATH": python_path}}
        loopback = ipaddress.ip_address(bind_address).is_loopback
        node_address = {"_node_ip_address": bind_address} if self._started_local or not loopback else {}
        if self._started_local and loopback:
            _keep_loopback_node_address()
        sigterm_handler = signal.getsignal(signal.SIGTERM)
        try:
            if self._started_local:
                ray.init(
                    # "local": a new Ray of our own even where `ray start` left a cluster (or its
                    # address file) behind, which a bare `ray.init()` would try to join.
                    address="local",
                    num_cpus=max(int(-(-(num_cpus or 0) // 1)), os.cpu_count() or 1),
                    include_dashboard=False,
                    runtime_env=runtime_env,
                    log_to_driver=False,
                    configure_logging=False,
                    **node_address,
                )
            else:
                ray.init(address=address, runtime_env=runtime_env, log_to_driver=False, configure_logging=False,
                         **node_address)
        except (ConnectionError, RuntimeError, ValueError) as error:
            ray.shutdown()
            raise QrlInputError(f"cannot join the Ray cluster at {address}: {str(error).splitlines()[0]}") from None
        finally:
            _restore_sigterm_handler(sigterm_handler)
        self._prefix = f"{run_name}-{os.getpid()}"
        self._specs: dict[str, tuple[NodeSpec, dict]] = {}
        self._actors: dict[str, Any] = {}
        self._runs: dict[str, Any] = {}
        self._generation: dict[str, int] = {}

    def cluster_resources(self) -> dict[str, float]:
        """Every resource of the cluster, summed over its nodes (Ray's counts: CPU, GPU, custom)."""
        return {name: float(amount) for name, amount in ray.cluster_resources().items()}

    def submit(self, function: Any, *args: Any, num_cpus: float = 1.0, num_gpus: float = 0.0,
               name: Optional[str] = None) -> RayTask:
        """Runs the module-level `function(*args)` as a Ray task with that CPU / GPU request, no
        retries (the caller decides)."""
        remote = ray.remote(function).options(num_cpus=num_cpus, num_gpus=num_gpus, max_retries=0,
                                              name=name or getattr(function, "__name__", "task"))
        return RayTask(remote.remote(*args))

    @staticmethod
    def wait_any(tasks: list, timeout: float) -> list:
        """The tasks of `tasks` that are done, waiting up to `timeout` seconds for at least one."""
        if not tasks:
            return []
        ready, _ = ray.wait([task.ref for task in tasks], num_returns=1, timeout=timeout)
        ready = set(ready)
        return [task for task in tasks if task.ref in ready]

    def create(self, spec: NodeSpec, kwargs: dict) -> RayHandle:
        self._specs[spec.name] = (spec, kwargs)
        generation = self._generation.get(spec.name, -1) + 1
        self._generation[spec.name] = generation
        actor_class = ray.remote(spec.factory).options(
            num_cpus=spec.num_cpus,
            num_gpus=spec.num_gpus,
            resources=dict(spec.resources) or None,
            max_concurrency=spec.concurrency,
            max_restarts=0,
            name=f"{self._prefix}-{spec.name}-{generation}",
        )
        actor = actor_class.remote(**kwargs)
        self._actors[spec.name] = actor
        return RayHandle(actor)

    def wait_ready(self, names: list[str]) -> None:
        """Blocks until every named node has been built (its constructor ran); a constructor that
        raised is a one-line NodeFailure (an input error when it raised QrlInputError)."""
        for name in names:
            try:
                ray.get(self._actors[name].pid.remote(), timeout=READY_TIMEOUT_SECONDS)
            except ray.exceptions.GetTimeoutError:
                raise NodeFailure(f"node {name} did not start within {READY_TIMEOUT_SECONDS:.0f} s") from None
            except ray.exceptions.RayError as error:
                cause = _creation_error(error)
                raise NodeFailure(f"node {name} failed to start: {describe_error(cause)}",
                                  input_error=isinstance(cause, QrlInputError)) from None

    def pid(self, name: str) -> int:
        return int(ray.get(self._actors[name].pid.remote()))

    def start_run(self, name: str) -> None:
        self._runs[name] = self._actors[name].run.remote()

    def status(self, name: str) -> tuple[str, Optional[BaseException]]:
        ref = self._runs.get(name)
        if ref is None:
            return RUNNING, None
        ready, _ = ray.wait([ref], timeout=0)
        if not ready:
            return RUNNING, None
        try:
            ray.get(ref)
        except ray.exceptions.ActorDiedError:
            return DIED, None
        except ray.exceptions.RayActorError:
            return DIED, None
        except ray.exceptions.RayTaskError as error:
            return FAILED, error.cause if error.cause is not None else RuntimeError(_last_line(error))
        return FINISHED, None

    def restart(self, name: str) -> RayHandle:
        """Rebuilds a dead node with the kwargs it was first built with and starts its run."""
        spec, kwargs = self._specs[name]
        try:
            ray.kill(self._actors[name], no_restart=True)
        except ray.exceptions.RayError:
            pass
        handle = self.create(spec, kwargs)
        self.wait_ready([name])
        self.start_run(name)
        return handle

    def wait_runs(self, names: list[str], timeout: float) -> None:
        refs = [self._runs[name] for name in names if name in self._runs]
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=timeout)

    def shutdown(self) -> None:
        """Kills every actor this backend made, then stops the local Ray it started (or
        disconnects from the cluster it joined)."""
        if not ray.is_initialized():
            return
        for actor in self._actors.values():
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # already gone
                pass
        ray.shutdown()


class _AuthNoticeFilter(logging.Filter):
    """Drops Ray's notice that token authentication is on (see `AUTH_NOTICE_START`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(AUTH_NOTICE_START)


logging.getLogger(AUTH_NOTICE_LOGGER).addFilter(_AuthNoticeFilter())


def _keep_loopback_node_address() -> None:
    """Makes the local Ray keep 127.0.0.1 as its node address (see `LOOPBACK_NODE_ENV_VAR`)."""
    os.environ[LOOPBACK_NODE_ENV_VAR] = "0"
    ray._private.ray_constants.ENABLE_RAY_CLUSTER = False


def _restore_sigterm_handler(handler: Any) -> None:
    """`ray.init` installs a SIGTERM handler that exits at once (status 15, no final checkpoint);
    the caller's handler — launch.actorq's turns SIGTERM into Ctrl-C's path — comes back."""
    if threading.current_thread() is threading.main_thread() and handler is not None:
        signal.signal(signal.SIGTERM, handler)


def _creation_error(error: BaseException) -> BaseException:
    """The exception a node's constructor raised, rebuilt from Ray's report: an ActorDiedError
    whose text ends with the remote traceback's last line, `module.Type: message`. A
    QrlInputError comes back as one; anything else as a RuntimeError with that line."""
    last = _last_line(error)
    input_error_prefix = f"{QrlInputError.__module__}.{QrlInputError.__qualname__}: "
    if last.startswith(input_error_prefix):
        return QrlInputError(last[len(input_error_prefix):])
    return RuntimeError(last)


def _last_line(error: Any) -> str:
    """The last line of an error's text: for Ray's errors, the remote traceback's `Type: message`."""
    text = str(error).strip().splitlines()
    return text[-1] if text else type(error).__name__
