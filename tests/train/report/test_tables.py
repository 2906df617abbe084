"""The one mean and spread over seeds that every table of the experiments prints."""

from __future__ import annotations

import numpy as np
import pytest

from dualdrop.train.report.tables import mean_std


def test_mean_std_is_the_sample_mean_and_std_of_the_present_values():
    vals = [0.0213, None, 0.0187, 0.0242, 0.0199]
    present = np.array([v for v in vals if v is not None])
    mean, std = mean_std(vals)
    assert mean == pytest.approx(present.mean(), rel=1e-15)
    assert std == pytest.approx(present.std(ddof=1), rel=1e-12)
    assert mean_std(iter(vals)) == (mean, std)  # any iterable, read once


def test_mean_std_of_one_value_has_no_spread_and_of_none_no_mean():
    assert mean_std([0.5]) == (0.5, None)
    assert mean_std([None, None]) == (None, None)
    assert mean_std([]) == (None, None)
