"""The Ray backend: each node a Ray actor process. The only module in qrl that imports Ray.

Without an address it starts a local Ray (dashboard off, head bound to 127.0.0.1, logical CPUs
enough for every node's request) and shuts it down at the end, taking every worker process
with it. With `address` ("host:port" of a running cluster's GCS, or "auto") it joins that
cluster, and at the end kills the actors it made and disconnects. Worker processes find the
code through PYTHONPATH set to this checkout's root (on a multi-machine cluster the checkout
must sit at the same path on every node). Threaded actors (`max_concurrency`) let a node serve
calls — stop, stats, a blocked replay sample — while its `run()` loops.
"""

import os
import socket
from typing import Any, Optional

import ray
import ray.exceptions

from qrl.distributed.launching import DIED, FAILED, FINISHED, RUNNING, NodeSpec
from qrl.errors import QrlInputError

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONNECT_TIMEOUT_SECONDS = 3.0
READY_TIMEOUT_SECONDS = 300.0


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


def check_reachable(address: str) -> None:
    """A `host:port` address must accept a TCP connection within a few seconds."""
    host, separator, port = address.rpartition(":")
    if not separator or not host or not port.isdigit():
        raise QrlInputError(f"--ray_address must be host:port or 'auto', got {address!r}")
    try:
        with socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_SECONDS):
            pass
    except OSError as error:
        raise QrlInputError(f"cannot reach a Ray cluster at {address}: {error.strerror or error}") from None


class RayBackend:
    """Creates nodes as Ray actors; see the module docstring."""

    def __init__(self, address: Optional[str] = None, num_cpus: Optional[float] = None, run_name: str = "qrl"):
        self._started_local = address is None
        if address not in (None, "auto"):
            check_reachable(address)
        python_path = os.pathsep.join(filter(None, [REPO_ROOT, os.environ.get("PYTHONPATH")]))
        runtime_env = {"env_vars": {"PYTHONPATH": python_path}}
        try:
            if self._started_local:
                ray.init(
                    num_cpus=max(int(-(-(num_cpus or 0) // 1)), os.cpu_count() or 1),
                    include_dashboard=False,
                    _node_ip_address="127.0.0.1",
                    runtime_env=runtime_env,
                    log_to_driver=True,
                    configure_logging=False,
                )
            else:
                ray.init(address=address, runtime_env=runtime_env, log_to_driver=True, configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as error:
            ray.shutdown()
            raise QrlInputError(f"cannot join the Ray cluster at {address}: {str(error).splitlines()[0]}") from None
        self._prefix = f"{run_name}-{os.getpid()}"
        self._specs: dict[str, tuple[NodeSpec, dict]] = {}
        self._actors: dict[str, Any] = {}
        self._runs: dict[str, Any] = {}
        self._generation: dict[str, int] = {}

    def create(self, spec: NodeSpec, kwargs: dict) -> RayHandle:
        self._specs[spec.name] = (spec, kwargs)
        generation = self._generation.get(spec.name, -1) + 1
        self._generation[spec.name] = generation
        actor_class = ray.remote(spec.factory).options(
            num_cpus=spec.num_cpus,
            max_concurrency=spec.concurrency,
            max_restarts=0,
            name=f"{self._prefix}-{spec.name}-{generation}",
        )
        actor = actor_class.remote(**kwargs)
        self._actors[spec.name] = actor
        return RayHandle(actor)

    def wait_ready(self, names: list[str]) -> None:
        """Blocks until every named node has been built (its constructor ran)."""
        refs = [self._actors[name].pid.remote() for name in names]
        try:
            ray.get(refs, timeout=READY_TIMEOUT_SECONDS)
        except ray.exceptions.RayError as error:
            raise RuntimeError(f"a node failed to start: {_first_line(error)}") from None

    def pid(self, name: str) -> int:
        return int(ray.get(self._actors[name].pid.remote()))

    def start_run(self, name: str) -> None:
        self._runs[name] = self._actors[name].run.remote()

    def status(self, name: str) -> tuple[str, Optional[str]]:
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
            return FAILED, _first_line(error.cause if error.cause is not None else error)
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


def _first_line(error: Any) -> str:
    text = str(error).strip().splitlines()
    return text[-1] if text else type(error).__name__
