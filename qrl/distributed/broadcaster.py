"""The broadcaster node: holds the latest published weight blob for actors to pull.

Kept apart from `qrl.distributed.weights` (which quantizes with JAX) so that its Ray process
starts without importing JAX.
"""

import os
import threading
from typing import Optional

from qrl.distributed.counting import process_cpu_seconds


class Broadcaster:
    """Passive node holding the latest published weight blob (thread-safe).

    Versions must increase; `pull(known_version)` answers only with a newer version.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._version = -1
        self._blob: Optional[bytes] = None
        self._publishes = 0
        self._pulls = 0
        self._bytes_last = 0
        self._bytes_total = 0

    def publish(self, version: int, blob: bytes) -> None:
        """Replaces the held blob; `version` must exceed every earlier one (ValueError)."""
        blob = bytes(blob)
        with self._lock:
            if int(version) <= self._version:
                raise ValueError(f"weight version {version} is not newer than {self._version}")
            self._version, self._blob = int(version), blob
            self._publishes += 1
            self._bytes_last = len(blob)
            self._bytes_total += len(blob)

    def pull(self, known_version: int = -1) -> Optional[tuple[int, bytes]]:
        """`(version, blob)` if a version newer than `known_version` was published, else None."""
        with self._lock:
            self._pulls += 1
            if self._blob is None or self._version <= known_version:
                return None
            return self._version, self._blob

    def stats(self) -> dict:
        with self._lock:
            return {"publishes": self._publishes, "pulls": self._pulls, "bytes_last": self._bytes_last,
                    "bytes_total": self._bytes_total, "version": self._version,
                    "process_cpu_seconds": process_cpu_seconds()}

    def pid(self) -> int:
        return os.getpid()

    def run(self) -> None:
        """Passive node: nothing to loop over."""

    def stop(self) -> None:
        """Passive node: nothing to stop."""
