"""qrl.stats: IQM and percentile-bootstrap intervals on hand-computed cases."""

import numpy as np
import pytest

from qrl import stats
from qrl.errors import QrlInputError


def test_mean_interval_of_two_values_spans_both_resample_extremes():
    # Resamples of (0, 10): both 0 (p 1/4), one each (mean 5, p 1/2), both 10 (p 1/4).
    assert stats.bootstrap_interval([0.0, 10.0], statistic="mean") == (0.0, 10.0)
    assert stats.bootstrap_interval([4.0, 4.0, 4.0], statistic="mean") == (4.0, 4.0)
    low, high = stats.bootstrap_interval(list(np.arange(20.0)), statistic="mean", seed=1)
    assert 6.0 < low < 9.5 < high < 13.0  # mean 9.5, standard error 1.29


def test_paired_ratio_keeps_each_seeds_pair_together():
    # Pairs (1, 1) and (3, 1): resampled ratios of means are 1, 2 (p 1/2) or 3.
    assert stats.paired_ratio_interval([1.0, 3.0], [1.0, 1.0]) == (1.0, 3.0)
    # Every pair has ratio 2, so every resample does; unpaired resampling would not.
    assert stats.paired_ratio_interval([2.0, 20.0, 200.0], [1.0, 10.0, 100.0]) == pytest.approx((2.0, 2.0))
    with pytest.raises(QrlInputError, match="equally many values"):
        stats.paired_ratio_interval([1.0, 2.0], [1.0])
    with pytest.raises(QrlInputError, match="no values"):
        stats.bootstrap_interval([])
