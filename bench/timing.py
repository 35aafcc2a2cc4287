"""Interleaved latency timing shared by the benchmark process and its out-of-process peers.

Candidates are timed round-robin (the starting candidate rotates every round) so that load from
other processes on a shared machine hits every candidate alike. Per candidate and round, one
turn of back-to-back calls gives the mean wall time per call and the mean CPU time the process
spent per call (all its threads; time spent waiting for a core on a loaded machine is not
counted, busy-waiting threads are); the result is the median of each over rounds. Imports
nothing but the standard library, so peers that must not load JAX can use it.
"""

import gc
import statistics
import time
from typing import Callable, Mapping

Call = Callable[[], object]


def _seconds_per_call(call: Call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def interleaved_medians(
    candidates: Mapping[str, Call], rounds: int, round_seconds: float, max_calls: int = 2000
) -> dict[str, dict[str, float]]:
    """`{name: {"wall": s, "cpu": s}}`: median seconds per call over `rounds` round-robin rounds.

    Each call must block until its result is ready. Every candidate is called twice before
    timing starts (compilation, caches); the slowest then sets how many back-to-back calls a
    candidate makes per turn, so one turn lasts about `round_seconds`. The garbage collector
    is paused while timing.
    """
    names = list(candidates)
    for name in names:
        candidates[name]()
    slowest = max(_seconds_per_call(candidates[name]) for name in names)
    calls = int(min(max_calls, max(1, round_seconds / max(slowest, 1e-7))))
    wall = {name: [] for name in names}
    cpu = {name: [] for name in names}
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for round_index in range(rounds):
            shift = round_index % len(names)
            for name in names[shift:] + names[:shift]:
                call = candidates[name]
                cpu_start, wall_start = time.process_time(), time.perf_counter()
                for _ in range(calls):
                    call()
                wall[name].append((time.perf_counter() - wall_start) / calls)
                cpu[name].append((time.process_time() - cpu_start) / calls)
    finally:
        if gc_was_enabled:
            gc.enable()
    return {name: {"wall": statistics.median(wall[name]), "cpu": statistics.median(cpu[name])} for name in names}
