"""The replay node of distributed training: a rate-limited ring buffer, uniform or prioritized.

`ReplayServer` stands in for a Reverb table: actors `insert` chunks of transitions, the learner
`sample`s `[K, B]` batches for `K` fused updates, a rate limiter (`rate_limiters`) decides who
waits. The same class runs in a thread (in-process launcher) or as a Ray actor. numpy only: no
jax import, so the Ray worker process that hosts it starts fast.

Transitions travel as dicts of numpy arrays with a leading item axis `[n, ...]` and the field
names of `qrl.replay.Transition` (`observation, action, reward, discount, next_observation`).

Indices. Every inserted item gets its insert sequence number `s` (0, 1, 2, ...) as its index;
it lives in row `s % capacity`, i.e. the index is `row + generation * capacity` with
`generation = s // capacity`, the number of times the ring had wrapped when it was written.
A row's current item is the latest one written there, so an index is current iff
`inserted - capacity <= s < inserted`; `update_priorities` drops the others (their row was
overwritten after they were sampled) without needing a per-row table.

Consumed items (`max_times_sampled`, QuaRL's and Reverb's regime): an item is removed once it
has been sampled that many times, and a full table removes its oldest item (FIFO) to make room
— so the learner can only consume what the actors produce. Rows are then handed out from a
free list rather than round the ring, and an index is `s * capacity + row`: current iff row
`row` still holds item `s`.
"""

import collections

import os
import threading
import time
from typing import Optional

import numpy as np

from qrl.distributed.counting import process_cpu_seconds
from qrl.errors import QrlInputError


class SumTree:
    """Array-backed binary sum tree over `capacity` non-negative leaf values.

    Leaves are padded to a power of two `L`; node 1 is the root, node `i` has children `2i`
    and `2i + 1`, leaf `r` is node `L + r`. Updates and searches are vectorised over many
    leaves / many targets with numpy, one tree level per step.
    """

    def __init__(self, capacity: int):
        self.capacity = int(capacity)
        self._num_leaves = 1
        while self._num_leaves < self.capacity:
            self._num_leaves *= 2
        self._depth = self._num_leaves.bit_length() - 1
        self._nodes = np.zeros(2 * self._num_leaves, np.float64)

    def total(self) -> float:
        """The sum of all leaves."""
        return float(self._nodes[1])

    def values(self, rows: np.ndarray) -> np.ndarray:
        """Leaf values at `rows` (any shape)."""
        return self._nodes[self._num_leaves + np.asarray(rows)]

    def update(self, rows: np.ndarray, values: np.ndarray) -> None:
        """Sets leaves `rows [m]` to `values [m]` (for a repeated row the last value wins) and
        recomputes their ancestors as sums of their children."""
        nodes = self._num_leaves + np.asarray(rows, np.int64).reshape(-1)
        self._nodes[nodes] = np.asarray(values, np.float64).reshape(-1)
        if nodes.size <= 4:  # a few leaves (one actor step): scalar climbs beat per-level numpy calls
            tree = self._nodes
            for node in nodes.tolist():
                while node > 1:
                    node //= 2
                    tree[node] = tree[2 * node] + tree[2 * node + 1]
            return
        for _ in range(self._depth):
            # Repeated parents are harmless: each copy writes the same sum of updated children.
            nodes = nodes // 2
            self._nodes[nodes] = self._nodes[2 * nodes] + self._nodes[2 * nodes + 1]

    def find(self, targets: np.ndarray) -> np.ndarray:
        """For each target mass `u` in `[0, total)` (any shape), the row `r` whose leaf interval
        `[sum(leaves[:r]), sum(leaves[:r + 1]))` holds it. Never returns a zero-mass leaf while
        the total is positive (a subtree with no mass is never entered, even when float
        rounding pushes `u` past the end)."""
        targets = np.asarray(targets, np.float64)
        remaining = targets.reshape(-1).copy()
        nodes = np.ones(remaining.shape, np.int64)
        for _ in range(self._depth):
            left = self._nodes[2 * nodes]
            right = self._nodes[2 * nodes + 1]
            go_left = (remaining < left) | (right <= 0.0)
            remaining = np.where(go_left, remaining, remaining - left)
            nodes = 2 * nodes + (~go_left)
        return (nodes - self._num_leaves).reshape(targets.shape)


def _check_positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise QrlInputError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


class ReplayServer:
    """Fixed-capacity ring buffer of transitions behind a rate limiter; thread-safe.

    `prioritized=False`: uniform sampling with replacement over the filled rows, weights all
    ones. `prioritized=True`: proportional prioritized replay (Schaul et al. 2016): item `i` is
    drawn with probability `P(i) = p_i^alpha / sum_j p_j^alpha` (`alpha = priority_exponent`),
    stratified (batch `k` draws one item from each of `B` equal segments of the total mass),
    and weighted by `(N * P(i))^-beta` (`beta = importance_exponent`, `N` = size) divided by
    the largest weight of its batch. If every priority is zero, sampling falls back to uniform.

    `max_times_sampled=N`: each item is removed after its N-th draw (Reverb's table setting);
    draws are then independent (proportional to priority, or uniform over the items left), the
    importance weights use the probabilities at the draw, and a full table evicts its oldest
    item. A sample waits until the table holds the rate limiter's minimum and its items have
    `K * B` draws left between them.

    One lock guards everything; blocked `insert`/`sample` calls wait on one condition, woken by
    every insert, sample and `close`.
    """

    def __init__(
        self,
        capacity: int,
        rate_limiter,
        prioritized: bool = False,
        priority_exponent: float = 0.6,
        importance_exponent: float = 0.4,
        seed: int = 0,
        max_times_sampled: Optional[int] = None,
    ):
        self.capacity = _check_positive_int(capacity, "replay capacity")
        self.max_times_sampled = None if max_times_sampled is None else _check_positive_int(
            max_times_sampled, "max_times_sampled")
        if rate_limiter.min_size > self.capacity:
            raise QrlInputError(
                f"rate limiter min_size {rate_limiter.min_size} exceeds the replay capacity {self.capacity}"
            )
        if not (np.isfinite(priority_exponent) and priority_exponent >= 0):
            raise QrlInputError(f"priority_exponent must be >= 0, got {priority_exponent!r}")
        if not (np.isfinite(importance_exponent) and importance_exponent >= 0):
            raise QrlInputError(f"importance_exponent must be >= 0, got {importance_exponent!r}")
        self.rate_limiter = rate_limiter
        self.prioritized = bool(prioritized)
        self.priority_exponent = float(priority_exponent)
        self.importance_exponent = float(importance_exponent)
        self._rng = np.random.default_rng(seed)
        consuming = self.max_times_sampled is not None
        self._tree = SumTree(self.capacity) if self.prioritized or consuming else None
        self._max_priority = 1.0
        if consuming:  # per row: the item's insert sequence (-1: free) and its draws so far.
            self._row_item = np.full(self.capacity, -1, np.int64)
            self._times_sampled = np.zeros(self.capacity, np.int64)
            self._free_rows = list(range(self.capacity - 1, -1, -1))
            self._fifo: collections.deque = collections.deque()  # (sequence, row), oldest first
            self._draws_left = 0  # draws the held items have left between them
            self._removed = {"sampled_out": 0, "evicted": 0}
        self._storage: Optional[dict] = None
        self._inserted = 0
        self._sampled = 0
        self._closed = False
        self._seconds = {"insert": 0.0, "sample": 0.0, "insert_wait": 0.0, "sample_wait": 0.0}
        self._lock = threading.Lock()
        self._condition = threading.Condition(self._lock)

    # ----------------------------------------------------------------------------- insert

    def _validate_chunk(self, transitions: dict, priorities) -> tuple[dict, Optional[np.ndarray], int]:
        if not isinstance(transitions, dict) or not transitions:
            raise QrlInputError("replay insert expects a non-empty dict of [n, ...] arrays")
        chunk = {name: np.asarray(value) for name, value in transitions.items()}
        lengths = {name: (value.shape[0] if value.ndim else None) for name, value in chunk.items()}
        num_items = next(iter(lengths.values()))
        if num_items is None or any(length != num_items for length in lengths.values()):
            raise QrlInputError(f"replay insert expects arrays with one leading item axis, got lengths {lengths}")
        if priorities is not None:
            priorities = np.asarray(priorities, np.float64)
            if priorities.shape != (num_items,):
                raise QrlInputError(f"replay priorities must have shape ({num_items},), got {priorities.shape}")
            if not np.all(np.isfinite(priorities) & (priorities >= 0)):
                raise QrlInputError("replay priorities must be finite and >= 0")
        return chunk, priorities, num_items

    def _check_matches_storage(self, chunk: dict) -> None:
        """Raises unless the chunk has the stored fields and item shapes; lock held."""
        storage = self._storage
        if storage is None:
            return
        if set(chunk) != set(storage):
            raise QrlInputError(f"replay insert fields {sorted(chunk)} differ from the stored {sorted(storage)}")
        for name, value in chunk.items():
            if value.shape[1:] != storage[name].shape[1:]:
                raise QrlInputError(
                    f"replay insert field {name!r} has item shape {value.shape[1:]}, stored {storage[name].shape[1:]}"
                )

    def insert(self, transitions: dict, priorities: Optional[np.ndarray] = None, timeout: Optional[float] = None) -> int:
        """Inserts the `n` items of `transitions` (dict of `[n, ...]` arrays) in order, as many
        at a time as the rate limiter allows, waiting (up to `timeout` seconds in all; None:
        forever) for room. New items get `priorities [n]` or, if None, the largest priority
        seen so far (1.0 at start). Returns how many were inserted: `n` unless the timeout
        passed or the server was closed first."""
        chunk, priorities, num_items = self._validate_chunk(transitions, priorities)
        deadline = None if timeout is None else time.monotonic() + timeout
        done = 0
        with self._condition:
            while done < num_items and not self._closed:
                allowed = self.rate_limiter.insert_allowance(self._inserted, self._sampled, num_items - done)
                if allowed > 0:
                    self._write(chunk, priorities, done, done + allowed)
                    done += allowed
                    self._condition.notify_all()
                elif not self._wait(deadline, "insert_wait"):
                    break
        return done

    def _write(self, chunk: dict, priorities: Optional[np.ndarray], start: int, stop: int) -> None:
        """Writes items `[start, stop)` of a validated chunk into the ring; lock held."""
        self._check_matches_storage(chunk)
        began = time.perf_counter()
        if self._storage is None:
            self._storage = {
                name: np.zeros((self.capacity,) + value.shape[1:], value.dtype) for name, value in chunk.items()
            }
        if self.max_times_sampled is not None:
            self._write_consumable(chunk, priorities, start, stop)
            self._seconds["insert"] += time.perf_counter() - began
            return
        count = stop - start
        kept = min(count, self.capacity)  # of a chunk longer than the ring only its tail survives
        rows = (self._inserted + count - kept + np.arange(kept)) % self.capacity
        for name, value in chunk.items():
            self._storage[name][rows] = value[stop - kept:stop]
        if self._tree is not None:
            if priorities is None:
                new_priorities = np.full(kept, self._max_priority)
            else:
                new_priorities = priorities[stop - kept:stop]
                self._max_priority = max(self._max_priority, float(priorities[start:stop].max()))
            self._tree.update(rows, new_priorities ** self.priority_exponent)
        self._inserted += count
        self._seconds["insert"] += time.perf_counter() - began

    def _write_consumable(self, chunk: dict, priorities: Optional[np.ndarray], start: int, stop: int) -> None:
        """Items `[start, stop)` into free rows, evicting the oldest held item when none is free;
        lock held."""
        rows = np.empty(stop - start, np.int64)
        for offset in range(stop - start):
            if not self._free_rows:
                self._evict_oldest()
            row = self._free_rows.pop()
            rows[offset] = row
            sequence = self._inserted + offset
            self._row_item[row], self._times_sampled[row] = sequence, 0
            self._fifo.append((sequence, row))
        for name, value in chunk.items():
            self._storage[name][rows] = value[start:stop]
        if self.prioritized:
            if priorities is None:
                leaves = np.full(len(rows), self._max_priority)
            else:
                leaves = priorities[start:stop]
                self._max_priority = max(self._max_priority, float(leaves.max()))
            self._tree.update(rows, leaves ** self.priority_exponent)
        else:
            self._tree.update(rows, np.ones(len(rows)))
        self._draws_left += len(rows) * self.max_times_sampled
        self._inserted += stop - start

    def _evict_oldest(self) -> None:
        """Removes the oldest item still held (FIFO); lock held."""
        while True:
            sequence, row = self._fifo.popleft()
            if self._row_item[row] == sequence:
                self._remove(row)
                self._removed["evicted"] += 1
                return

    def _remove(self, row: int) -> None:
        """Frees `row`: its item can no longer be drawn; lock held."""
        self._draws_left -= self.max_times_sampled - int(self._times_sampled[row])
        self._row_item[row] = -1
        self._tree.update(np.array([row]), np.zeros(1))
        self._free_rows.append(int(row))

    def _held(self) -> int:
        """Items held now; lock held."""
        if self.max_times_sampled is None:
            return min(self._inserted, self.capacity)
        return self.capacity - len(self._free_rows)

    def _wait(self, deadline: Optional[float], kind: str) -> bool:
        """Waits on the condition until notified or `deadline`; False once the deadline passed."""
        remaining = None
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
        began = time.perf_counter()
        self._condition.wait(remaining)
        self._seconds[kind] += time.perf_counter() - began
        return True

    # ----------------------------------------------------------------------------- sample

    def sample(self, batch_size: int, num_batches: int, timeout: Optional[float] = None) -> Optional[dict]:
        """`num_batches` batches of `batch_size` items, waiting (up to `timeout` seconds; None:
        forever) until the rate limiter allows `K * B` more sampled items.

        Returns None on timeout or close, else `{"transitions": dict of [K, B, ...] arrays,
        "indices": int64 [K, B], "weights": float32 [K, B]}` (indices as in the module doc).
        """
        batch_size = _check_positive_int(batch_size, "batch_size")
        num_batches = _check_positive_int(num_batches, "num_batches")
        num_items = batch_size * num_batches
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._condition:
            while not self._closed and not self._can_sample(num_items):
                if not self._wait(deadline, "sample_wait"):
                    return None
            if self._closed:
                return None
            began = time.perf_counter()
            if self.max_times_sampled is None:
                rows, weights = self._draw(num_batches, batch_size)
                generations = (self._inserted - 1 - rows) // self.capacity
                indices = (rows + generations * self.capacity).astype(np.int64)
            else:
                rows, weights, items = self._draw_consuming(num_batches, batch_size)
                indices = items * self.capacity + rows
            transitions = {name: array[rows] for name, array in self._storage.items()}
            self._sampled += num_items
            self._seconds["sample"] += time.perf_counter() - began
            self._condition.notify_all()
        return {"transitions": transitions, "indices": indices, "weights": weights}

    def _can_sample(self, num_items: int) -> bool:
        """The rate limiter's verdict and, for consumed items, a table holding the limiter's
        minimum with `num_items` draws left; lock held."""
        if not self.rate_limiter.can_sample(self._inserted, self._sampled, num_items):
            return False
        if self.max_times_sampled is None:
            return True
        return self._held() >= self.rate_limiter.min_size and self._draws_left >= num_items

    def _draw_consuming(self, num_batches: int, batch_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rows, importance weights and item sequences `[K, B]`, each item drawn at most its
        remaining times: independent draws from the tree, each round keeping as many draws of a
        row as it has left, the rest drawn again; rows drawn out are removed. Lock held."""
        wanted = num_batches * batch_size
        held = self._held()
        rows, probabilities, items = [], [], []
        while wanted > 0:
            total = self._tree.total()
            if total > 0.0:
                drawn = self._tree.find(self._rng.random(wanted) * total)
            else:  # every held priority is zero: uniform over the held items, as the ring does.
                drawn = self._rng.choice(np.flatnonzero(self._row_item >= 0), wanted)
            order = np.argsort(drawn, kind="stable")
            sorted_rows = drawn[order]
            first = np.searchsorted(sorted_rows, sorted_rows, side="left")
            rank = np.empty(wanted, np.int64)
            rank[order] = np.arange(wanted) - first  # how many earlier draws this round hit the same row
            left = np.where(self._row_item[drawn] >= 0, self.max_times_sampled - self._times_sampled[drawn], 0)
            kept = drawn[rank < left]
            rows.append(kept)
            items.append(self._row_item[kept])
            probabilities.append(self._tree.values(kept) / total if total > 0.0 else np.full(len(kept), 1.0 / held))
            unique, counts = np.unique(kept, return_counts=True)
            self._times_sampled[unique] += counts
            self._draws_left -= len(kept)
            for row in unique[self._times_sampled[unique] >= self.max_times_sampled]:
                self._remove(row)  # drawn out: nothing left to subtract from the draws left.
                self._removed["sampled_out"] += 1
            wanted -= len(kept)
        rows = np.concatenate(rows).reshape(num_batches, batch_size)
        items = np.concatenate(items).reshape(rows.shape)
        if not self.prioritized:
            return rows, np.ones(rows.shape, np.float32), items
        weights = (held * np.concatenate(probabilities).reshape(rows.shape)) ** -self.importance_exponent
        return rows, (weights / weights.max(axis=1, keepdims=True)).astype(np.float32), items

    def _draw(self, num_batches: int, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows `[K, B]` and normalised importance weights `[K, B]` float32; lock held."""
        size = min(self._inserted, self.capacity)
        total = self._tree.total() if self._tree is not None else 0.0
        if total <= 0.0:
            rows = self._rng.integers(0, size, size=(num_batches, batch_size))
            return rows, np.ones((num_batches, batch_size), np.float32)
        segment = total / batch_size
        offsets = self._rng.random((num_batches, batch_size))
        targets = (np.arange(batch_size) + offsets) * segment
        rows = self._tree.find(targets)
        probabilities = self._tree.values(rows) / total
        weights = (size * probabilities) ** -self.importance_exponent
        weights = weights / weights.max(axis=1, keepdims=True)
        return rows, weights.astype(np.float32)

    def update_priorities(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        """Sets the priorities of sampled items `indices` (as returned by `sample`, any shape)
        to `priorities` (same shape, finite, >= 0). Indices whose row was overwritten since
        they were sampled are ignored; a no-op for a uniform replay."""
        indices = np.asarray(indices).reshape(-1)
        priorities = np.asarray(priorities, np.float64).reshape(-1)
        if indices.shape != priorities.shape:
            raise QrlInputError(f"update_priorities got {indices.size} indices and {priorities.size} priorities")
        if not np.all(np.isfinite(priorities) & (priorities >= 0)):
            raise QrlInputError("replay priorities must be finite and >= 0")
        if self._tree is None:
            return
        indices = indices.astype(np.int64)
        if self.max_times_sampled is not None:
            self._update_consumable_priorities(indices, priorities)
            return
        with self._condition:
            current = (indices >= self._inserted - self.capacity) & (indices >= 0) & (indices < self._inserted)
            if not current.any():
                return
            fresh = priorities[current]
            self._tree.update(indices[current] % self.capacity, fresh ** self.priority_exponent)
            self._max_priority = max(self._max_priority, float(fresh.max()))

    def _update_consumable_priorities(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        """`update_priorities` for consumed items: indices `s * capacity + row` whose row still
        holds item `s`."""
        rows, items = indices % self.capacity, indices // self.capacity
        with self._condition:
            current = (indices >= 0) & (self._row_item[rows] == items)
            if not current.any():
                return
            fresh = priorities[current]
            self._tree.update(rows[current], fresh ** self.priority_exponent)
            self._max_priority = max(self._max_priority, float(fresh.max()))

    # ----------------------------------------------------------------------------- node

    def size(self) -> int:
        """How many items the replay holds now."""
        with self._lock:
            return self._held()

    def close(self) -> None:
        """Wakes every blocked `insert`/`sample` (they return at once); later calls return
        at once too (`insert` -> 0, `sample` -> None)."""
        with self._condition:
            self._closed = True
            self._condition.notify_all()

    def run(self) -> None:
        """The node loop of a passive server: blocks until `stop()`/`close()`."""
        with self._condition:
            while not self._closed:
                self._condition.wait()

    def stop(self) -> None:
        """Same as `close()`."""
        self.close()

    def stats(self) -> dict:
        """Items inserted/sampled so far, current size, and seconds spent writing (`insert`),
        drawing and gathering (`sample`) and blocked by the rate limiter (`*_wait`)."""
        with self._lock:
            return {
                "inserted": self._inserted,
                "sampled": self._sampled,
                "size": self._held(),
                **({} if self.max_times_sampled is None else {"removed_" + kind: count for kind, count in self._removed.items()}),
                "insert_seconds": self._seconds["insert"],
                "sample_seconds": self._seconds["sample"],
                "insert_wait_seconds": self._seconds["insert_wait"],
                "sample_wait_seconds": self._seconds["sample_wait"],
                "process_cpu_seconds": process_cpu_seconds(),
            }

    def pid(self) -> int:
        return os.getpid()
