"""Rate limiters for the replay node: when may an actor insert and the learner sample.

Both limiters are stateless predicates over the replay's running counts (`inserts`: items ever
inserted, `samples`: items ever sampled, a batch of `[K, B]` counting `K * B`), as Reverb's
rate limiters are; the `ReplayServer` owns the counts and calls these under its lock.
numpy only: no jax import, so Ray worker processes that host the replay start fast.
"""

import math
import numbers

from qrl.errors import QrlInputError


def _check_min_size(min_size) -> int:
    if isinstance(min_size, bool) or not isinstance(min_size, numbers.Integral) or min_size < 1:
        raise QrlInputError(f"rate limiter min_size must be an integer >= 1, got {min_size!r}")
    return int(min_size)


def _is_finite_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


class MinSize:
    """Samples are allowed once `min_size` items were inserted; inserts never block."""

    def __init__(self, min_size: int):
        self.min_size = _check_min_size(min_size)

    def can_insert(self, inserts: int, samples: int) -> bool:
        """Whether one more item may be inserted now: always."""
        return True

    def insert_allowance(self, inserts: int, samples: int, requested: int) -> int:
        """How many of the next `requested` items may be inserted now: all of them."""
        return max(int(requested), 0)

    def can_sample(self, inserts: int, samples: int, num_items: int) -> bool:
        """Whether a sample of `num_items` items may proceed now."""
        return inserts >= self.min_size

    def __repr__(self) -> str:
        return f"MinSize({self.min_size})"


class SampleToInsertRatio:
    """Reverb's `SampleToInsertRatio`, counted in items.

    With `diff = inserts * samples_per_insert - samples` and the window
    `[min_diff, max_diff] = samples_per_insert * min_size -/+ error_buffer`:
    one more item may be inserted iff `inserts < min_size` or `diff + samples_per_insert <=
    max_diff`; a sample of `n` items may proceed iff `inserts >= min_size` and
    `diff - n >= min_diff`. So after the first `min_size` inserts the learner samples
    `samples_per_insert` items per inserted item on average, never drifting more than
    `error_buffer` sampled items either way. `default_error_buffer` picks a buffer wide
    enough that neither side can block the other forever.
    """

    def __init__(self, samples_per_insert: float, min_size_to_sample: int, error_buffer: float):
        if not (_is_finite_number(samples_per_insert) and samples_per_insert > 0):
            raise QrlInputError(f"samples_per_insert must be a finite number > 0, got {samples_per_insert!r}")
        if not (_is_finite_number(error_buffer) and error_buffer >= 0):
            raise QrlInputError(f"error_buffer must be a finite number >= 0, got {error_buffer!r}")
        self.samples_per_insert = float(samples_per_insert)
        self.min_size = _check_min_size(min_size_to_sample)
        self.error_buffer = float(error_buffer)
        offset = self.samples_per_insert * self.min_size
        self.min_diff = offset - self.error_buffer
        self.max_diff = offset + self.error_buffer

    def _diff(self, inserts: int, samples: int) -> float:
        return inserts * self.samples_per_insert - samples

    def can_insert(self, inserts: int, samples: int) -> bool:
        """Whether one more item may be inserted now."""
        return inserts < self.min_size or self._diff(inserts, samples) + self.samples_per_insert <= self.max_diff

    def insert_allowance(self, inserts: int, samples: int, requested: int) -> int:
        """How many of the next `requested` items may be inserted now, one after the other
        (item `j` is checked with `can_insert(inserts + j, samples)`)."""
        requested = max(int(requested), 0)
        free = self.min_size - inserts
        by_ratio = math.floor((self.max_diff + samples) / self.samples_per_insert) - inserts
        count = min(max(free, by_ratio, 0), requested)
        # The closed form can be off by one from float rounding; the predicate is the truth.
        while count > 0 and not self.can_insert(inserts + count - 1, samples):
            count -= 1
        while count < requested and self.can_insert(inserts + count, samples):
            count += 1
        return count

    def can_sample(self, inserts: int, samples: int, num_items: int) -> bool:
        """Whether a sample of `num_items` items may proceed now."""
        return inserts >= self.min_size and self._diff(inserts, samples) - num_items >= self.min_diff

    def __repr__(self) -> str:
        return (f"SampleToInsertRatio(samples_per_insert={self.samples_per_insert}, "
                f"min_size_to_sample={self.min_size}, error_buffer={self.error_buffer})")


def default_error_buffer(
    samples_per_insert: float, min_size: int, batch_items: int, chunk_items: int, tolerance: float = 0.1
) -> float:
    """An error buffer for `SampleToInsertRatio` that cannot deadlock:
    `max(min_size * samples_per_insert * tolerance, batch_items + chunk_items * samples_per_insert)`.

    The first term is Acme's rule (a tolerance of 10% of the samples owed to the first
    `min_size` items). The second keeps the limiter live: a sample of `batch_items` is blocked
    only while `diff < min_diff + batch_items`, and then `diff + chunk_items * samples_per_insert
    < max_diff` whenever the window `max_diff - min_diff = 2 * error_buffer` is at least
    `batch_items + chunk_items * samples_per_insert`, so a whole insert chunk fits (and vice
    versa, a blocked insert leaves room for a whole sample). Taking the full sum rather than
    half of it also lets the first sample proceed right at `min_size` (it needs
    `batch_items <= error_buffer`) and leaves slack for several actors' chunks interleaving.
    """
    return float(max(min_size * samples_per_insert * tolerance, batch_items + chunk_items * samples_per_insert))
