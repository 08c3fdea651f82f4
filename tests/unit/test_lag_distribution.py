"""The lag's distribution as metrics.csv reports it: median, 90th percentile and the share at the bound."""

from __future__ import annotations

import numpy as np
import pytest

from lockstep.observe.metrics import add_counts, lag_distribution


def test_percentiles_and_the_share_at_the_bound_follow_the_counts():
    # 10 samples: 4 of lag 0, 5 of lag 1, 1 of lag 2 (the bound)
    row = lag_distribution((4, 5, 1), bound=2)
    assert (row["policy_lag_p50"], row["policy_lag_p90"], row["policy_lag_at_bound"]) == (1, 1, pytest.approx(0.1))
    assert [row[f"policy_lag/{k}"] for k in range(3)] == pytest.approx([0.4, 0.5, 0.1])
    assert lag_distribution((4, 5, 1), bound=4)["policy_lag_at_bound"] == 0.0  # the bound was never reached
    assert lag_distribution((1, 0, 0, 9), bound=3)["policy_lag_p50"] == 3


def test_strict_has_no_bound_to_reach_and_an_empty_batch_reports_nothing():
    assert lag_distribution((64,), bound=0) == {"policy_lag_p50": 0, "policy_lag_p90": 0,
                                                "policy_lag_at_bound": None, "policy_lag/0": 1.0}
    assert lag_distribution((), bound=2) == {"policy_lag_p50": None, "policy_lag_p90": None,
                                             "policy_lag_at_bound": None}


def test_histograms_of_different_lengths_add_up():
    assert add_counts(np.array([1, 2]), np.array([0, 0, 5])).tolist() == [1, 2, 5]
    assert add_counts(np.zeros(0, np.int64), np.array([3])).tolist() == [3]
