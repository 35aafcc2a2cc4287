"""Summary statistics over seeds with percentile-bootstrap intervals (numpy, vectorized over
resamples), shared by the studies' reports.

With 3–10 seeds the intervals are wide and only as good as the percentile bootstrap is with so
few values (it under-covers); they say how much a ratio could move, not a significance test.
"""

from typing import Callable, Sequence

import numpy as np

from qrl.errors import QrlInputError

BOOTSTRAP_REPS = 2000
CONFIDENCE = 0.95


def iqm(values: Sequence[float]) -> float:
    """Interquartile mean: mean of the sorted values without `int(n / 4)` at each end (the mean
    when n < 4)."""
    ordered = np.sort(np.asarray(values, float))
    if ordered.size == 0:
        raise QrlInputError("IQM of no values")
    cut = ordered.size // 4
    return float(np.mean(ordered[cut:ordered.size - cut]))


def _iqm_rows(draws: np.ndarray) -> np.ndarray:
    """`iqm` of each row of `draws [R, n]` -> `[R]`."""
    ordered = np.sort(draws, axis=1)
    cut = draws.shape[1] // 4
    return ordered[:, cut:draws.shape[1] - cut].mean(axis=1)


STATISTICS: dict[str, Callable[[np.ndarray], np.ndarray]] = {"iqm": _iqm_rows, "mean": lambda draws: draws.mean(axis=1)}


def _percentiles(samples: np.ndarray, confidence: float) -> tuple[float, float]:
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(samples, [tail, 100 - tail])
    return float(low), float(high)


def bootstrap_interval(values: Sequence[float], reps: int = BOOTSTRAP_REPS, confidence: float = CONFIDENCE,
                       seed: int = 0, statistic: str = "iqm") -> tuple[float, float]:
    """Percentile bootstrap interval of `statistic` (`iqm` or `mean`, `STATISTICS`): `reps`
    resamples of the values with replacement."""
    values = np.asarray(values, float)
    if values.size == 0:
        raise QrlInputError("bootstrap interval of no values")
    draws = values[np.random.default_rng(seed).integers(0, values.size, (reps, values.size))]
    return _percentiles(STATISTICS[statistic](draws), confidence)


def paired_ratio_interval(numerators: Sequence[float], denominators: Sequence[float], reps: int = BOOTSTRAP_REPS,
                          confidence: float = CONFIDENCE, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of `mean(numerators) / mean(denominators)` when value i of each
    comes from the same seed: every resample draws seeds with replacement and keeps each seed's
    pair together. `[n]` and `[n]` -> `(low, high)`."""
    numerators, denominators = np.asarray(numerators, float), np.asarray(denominators, float)
    if numerators.size == 0 or numerators.shape != denominators.shape:
        raise QrlInputError(f"a paired ratio needs equally many values on both sides, got {numerators.size} "
                            f"and {denominators.size}")
    picks = np.random.default_rng(seed).integers(0, numerators.size, (reps, numerators.size))
    return _percentiles(numerators[picks].mean(axis=1) / denominators[picks].mean(axis=1), confidence)
