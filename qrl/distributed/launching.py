"""Programs of nodes and the launchers' common supervision loop (launchpad's role).

A `Program` lists `NodeSpec`s in creation order; a spec's kwargs may hold `NodeRef(name)`
placeholders, which a backend replaces by handles of nodes created before it. A backend
creates nodes, starts their `run()` and reports whether each run is going, finished, died (its
process vanished) or failed (raised; the status carries the exception). `supervise` starts
everything, polls a stop condition, restarts restartable nodes whose process died, and on any
exit — stop condition, failure, Ctrl-C — stops every node, waits for their runs, gathers their
stats and shuts the backend down, so no node process outlives the program. A node that fails
to start or fails for good ends the program with a one-line `Outcome.error`;
`Outcome.input_error` says whether it was bad input (a `QrlInputError` raised inside the node,
e.g. a corrupt checkpoint to resume from).

`InProcessBackend` runs every node in this process, each `run()` in a thread (launchpad's
`local_mt`); `qrl.distributed.ray_launcher.RayBackend` runs each node as a Ray actor process.
"""

import concurrent.futures
import dataclasses
import ipaddress
import socket
import threading
import time
from typing import Any, Callable, Optional, Protocol

from qrl.distributed.handles import LocalHandle
from qrl.errors import QrlInputError

RUNNING, FINISHED, DIED, FAILED = "running", "finished", "died", "failed"
DEFAULT_BIND_ADDRESS = "127.0.0.1"
CONNECT_TIMEOUT_SECONDS = 3.0


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


def check_bind_address(address: str) -> str:
    """`address` if it is an IP address of this machine that a server can listen on (what
    `--ray_bind_address` takes); else one QrlInputError line. Starts nothing but a probe socket."""
    try:
        parsed = ipaddress.ip_address(str(address).strip())
    except ValueError:
        raise QrlInputError(f"--ray_bind_address must be an IP address of this machine, got {address!r}") from None
    if parsed.is_unspecified or parsed.is_multicast:
        raise QrlInputError(f"--ray_bind_address must be one address of this machine, not {parsed}")
    family = socket.AF_INET6 if parsed.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((str(parsed), 0))
    except OSError as error:
        raise QrlInputError(f"--ray_bind_address {parsed} is not an address of this machine: "
                            f"{error.strerror or error}") from None
    return str(parsed)


@dataclasses.dataclass(frozen=True)
class NodeRef:
    """Stands for the handle of node `name` in another node's kwargs."""

    name: str


@dataclasses.dataclass
class NodeSpec:
    """One node: `factory(**kwargs)` builds it (a class importable by name, so Ray can build it
    in another process); `num_cpus` / `num_gpus` its Ray CPU / GPU request; `concurrency` how many calls it may
    serve at once (its `run` loop counts as one); `restartable` nodes are rebuilt with the same
    kwargs when their process dies."""

    name: str
    factory: Callable[..., Any]
    kwargs: dict
    num_cpus: float = 0.0
    num_gpus: float = 0.0
    resources: dict = dataclasses.field(default_factory=dict)  # custom Ray resources (which nodes may host it)
    concurrency: int = 2
    restartable: bool = False


@dataclasses.dataclass
class Program:
    nodes: list[NodeSpec]

    def names(self) -> list[str]:
        return [node.name for node in self.nodes]


@dataclasses.dataclass
class Outcome:
    """How a supervised program ended."""

    reason: str  # the stop condition's reason, "interrupted", or "failed"
    seconds: float
    stats: dict  # node name -> its stats() (absent when the node could not answer)
    restarts: dict  # node name -> times restarted
    error: Optional[str] = None  # one line: which node failed and how
    final: Any = None  # what `on_stop` returned
    input_error: bool = False  # the failure was a QrlInputError raised inside a node


class Backend(Protocol):
    def create(self, spec: NodeSpec, kwargs: dict) -> Any: ...

    def wait_ready(self, names: list[str]) -> None: ...

    def start_run(self, name: str) -> None: ...

    def status(self, name: str) -> tuple[str, Optional[BaseException]]:
        """The run's state and, when it failed, the exception it raised."""

    def restart(self, name: str) -> Any: ...

    def wait_runs(self, names: list[str], timeout: float) -> None: ...

    def shutdown(self) -> None: ...


def resolve(kwargs: dict, handles: dict) -> dict:
    """`kwargs` with every `NodeRef` replaced by that node's handle."""
    return {key: handles[value.name] if isinstance(value, NodeRef) else value for key, value in kwargs.items()}


class InProcessBackend:
    """Every node in this process; each `run()` in its own thread."""

    def __init__(self, max_workers: int = 32):
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers, thread_name_prefix="qrl-call")
        self._specs: dict[str, tuple[NodeSpec, dict]] = {}
        self._handles: dict[str, LocalHandle] = {}
        self._threads: dict[str, threading.Thread] = {}
        self._errors: dict[str, BaseException] = {}

    def create(self, spec: NodeSpec, kwargs: dict) -> LocalHandle:
        self._specs[spec.name] = (spec, kwargs)
        handle = LocalHandle(spec.factory(**kwargs), self._executor)
        self._handles[spec.name] = handle
        return handle

    def wait_ready(self, names: list[str]) -> None:
        """Nodes built in this process are ready once created."""

    def start_run(self, name: str) -> None:
        node = self._handles[name].node

        def run():
            try:
                node.run()
            except Exception as error:  # reported through status(); the supervisor decides.
                self._errors[name] = error

        thread = threading.Thread(target=run, name=f"qrl-{name}", daemon=True)
        self._threads[name] = thread
        thread.start()

    def status(self, name: str) -> tuple[str, Optional[BaseException]]:
        if name in self._errors:
            return FAILED, self._errors[name]
        thread = self._threads.get(name)
        return (RUNNING, None) if thread is not None and thread.is_alive() else (FINISHED, None)

    def restart(self, name: str) -> LocalHandle:
        raise RuntimeError("in-process nodes share the launcher's process: they cannot die alone")

    def wait_runs(self, names: list[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for name in names:
            thread = self._threads.get(name)
            if thread is not None:
                thread.join(max(deadline - time.monotonic(), 0.0))

    def shutdown(self) -> None:
        for handle in self._handles.values():
            close = getattr(handle.node, "close", None)
            if close is not None:
                close()
        self._executor.shutdown(wait=False, cancel_futures=True)


def supervise(
    backend: Backend,
    program: Program,
    should_stop: Callable[[dict, float], Optional[str]],
    poll_seconds: float = 0.25,
    stop_order: Optional[list[str]] = None,
    on_stop: Optional[Callable[[dict], Any]] = None,
    on_start: Optional[Callable[[dict], None]] = None,
) -> Outcome:
    """Runs `program` on `backend` until `should_stop(handles, elapsed_seconds)` returns a reason.

    Nodes are stopped in `stop_order` (default: reverse creation order), then `on_stop(handles)`
    runs while every node still answers (final evaluation, checkpoint), then stats are gathered
    and the backend shuts down — also after a failure or Ctrl-C.
    """
    handles: dict[str, Any] = {}
    restarts: dict[str, int] = {}
    reason, failure, final = "failed", None, None
    stats: dict = {}
    start = time.monotonic()
    try:
        try:
            for spec in program.nodes:
                handles[spec.name] = backend.create(spec, resolve(spec.kwargs, handles))
            backend.wait_ready(program.names())
            if on_start is not None:
                on_start(handles)
            for spec in program.nodes:
                backend.start_run(spec.name)
            start = time.monotonic()
            stop_reason = None
            while stop_reason is None:
                time.sleep(poll_seconds)
                for spec in program.nodes:
                    state, detail = backend.status(spec.name)
                    if state == DIED and spec.restartable:
                        handles[spec.name] = backend.restart(spec.name)
                        restarts[spec.name] = restarts.get(spec.name, 0) + 1
                    elif state == DIED:
                        raise NodeFailure(f"the {spec.name} process died")
                    elif state == FAILED:
                        raise NodeFailure(f"node {spec.name} failed: {describe_error(detail)}",
                                          input_error=isinstance(detail, QrlInputError))
                stop_reason = should_stop(handles, time.monotonic() - start)
            reason = stop_reason
        except KeyboardInterrupt:
            reason = "interrupted"
        except NodeFailure as error:
            failure = error
        seconds = time.monotonic() - start
        try:
            if handles:
                final = _stop_all(backend, program, handles, stop_order, on_stop, stats)
        except KeyboardInterrupt:
            reason = "interrupted"
        except NodeFailure as error:
            failure = failure or error
    finally:
        backend.shutdown()
    return Outcome(reason=reason, seconds=seconds, stats=stats, restarts=restarts,
                   error=str(failure) if failure is not None else None, final=final,
                   input_error=bool(failure is not None and failure.input_error))


def describe_error(error: Optional[BaseException]) -> str:
    """One line for an exception a node raised: a QrlInputError's message as it is (it already
    reads as the error), any other `Type: message`."""
    if error is None:
        return "its process exited"
    text = " ".join(str(error).split())
    return text if isinstance(error, QrlInputError) else f"{type(error).__name__}: {text}"


class NodeFailure(RuntimeError):
    """A node that cannot be restarted raised, failed to start or lost its process; the message
    is one line. `input_error`: the node raised a QrlInputError (bad input, not a fault)."""

    def __init__(self, message: str, input_error: bool = False):
        super().__init__(message)
        self.input_error = input_error


def _stop_all(backend, program: Program, handles: dict, stop_order, on_stop, stats: dict) -> Any:
    order = stop_order or list(reversed(program.names()))
    for name in order:
        _quietly(lambda: handles[name].call("stop"))
    backend.wait_runs(order, timeout=30.0)
    final = None
    if on_stop is not None:
        try:
            final = on_stop(handles)
        except Exception as error:  # a node gone: the failure that stopped the run says why.
            raise NodeFailure(f"the final evaluation and checkpoint failed: {describe_error(error)}") from None
    for name in program.names():
        result = _quietly(lambda: handles[name].call("stats"))
        if result is not None:
            stats[name] = result
    return final


def _quietly(call: Callable[[], Any]) -> Any:
    """A call to a node that may already be gone: None instead of an error."""
    try:
        return call()
    except Exception:
        return None
