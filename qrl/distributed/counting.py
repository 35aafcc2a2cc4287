"""The counter node: actor steps, learner steps, episodes (Acme's `Counter`, one per program)."""

import os
import threading
from typing import Any


def process_cpu_seconds() -> float:
    """User + system CPU seconds this process has used (every thread, XLA's included)."""
    times = os.times()
    return float(times.user + times.system)


class Counter:
    """Named counts that any node increments; thread-safe. Numpy only (starts fast in Ray)."""

    def __init__(self, initial: dict | None = None):
        self._lock = threading.Lock()
        self._counts: dict[str, Any] = dict(initial or {})

    def increment(self, **counts) -> dict:
        """Adds each count; returns all counts after the increment."""
        with self._lock:
            for name, value in counts.items():
                self._counts[name] = self._counts.get(name, 0) + value
            return dict(self._counts)

    def set(self, **values) -> None:
        """Sets values outright (e.g. the latest evaluation return)."""
        with self._lock:
            self._counts.update(values)

    def get_counts(self) -> dict:
        with self._lock:
            return dict(self._counts)

    def run(self) -> None:
        """A passive node: nothing to loop over."""

    def stop(self) -> None:
        """A passive node: nothing to stop."""

    def stats(self) -> dict:
        return {"counts": self.get_counts(), "process_cpu_seconds": process_cpu_seconds()}

    def pid(self) -> int:
        return os.getpid()
