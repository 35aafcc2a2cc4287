"""How one node calls another, the same way whether both live in one process or in Ray actors.

A handle offers `call` (blocking, returns the result), `call_async` (returns a `Future` with
`done()` and `result(timeout)`) and `notify` (fire and forget). `LocalHandle` serves the
in-process launcher; the Ray launcher's `RayHandle` lives in `qrl.distributed.ray_launcher`.
"""

import concurrent.futures
from typing import Any, Protocol


class Future(Protocol):
    def done(self) -> bool: ...

    def result(self, timeout: float | None = None) -> Any: ...


class DoneFuture:
    """A future whose result is already known."""

    def __init__(self, value: Any):
        self._value = value

    def done(self) -> bool:
        return True

    def result(self, timeout: float | None = None) -> Any:
        return self._value


class LocalHandle:
    """A node object in this process; `call_async` runs on a shared thread pool."""

    def __init__(self, node: Any, executor: concurrent.futures.Executor):
        self.node = node
        self._executor = executor

    def call(self, method: str, *args, **kwargs) -> Any:
        return getattr(self.node, method)(*args, **kwargs)

    def call_async(self, method: str, *args, **kwargs) -> Future:
        return self._executor.submit(getattr(self.node, method), *args, **kwargs)

    def notify(self, method: str, *args, **kwargs) -> None:
        """Runs the (cheap) method now: in one process a direct call costs less than a hand-off."""
        getattr(self.node, method)(*args, **kwargs)
