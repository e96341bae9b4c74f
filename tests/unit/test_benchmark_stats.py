"""benchmarks/stats.py: the one percentile, spread and histogram quantile every
benchmark reports with."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from stats import histogram_quantile, percentile, spread  # benchmarks/stats.py


def test_percentile_is_the_sample_at_rank_q_n() -> None:
    ten = [float(v) for v in range(10, 0, -1)]  # unsorted on purpose
    assert percentile(ten, 0.0) == 1.0
    assert percentile(ten, 0.5) == 6.0  # rank 5 of 0..9
    assert percentile(ten, 0.9) == 10.0
    assert percentile(ten, 0.99) == 10.0  # capped at the last sample
    assert percentile(ten, 1.0) == 10.0
    assert percentile([7.0], 0.99) == 7.0
    hundred = [float(v) for v in range(1, 101)]
    assert percentile(hundred, 0.99) == 100.0 and percentile(hundred, 0.5) == 51.0


def test_percentile_of_nothing_is_none_and_q_is_checked() -> None:
    assert percentile([], 0.5) is None
    for q in (-0.1, 1.5, 99):
        with pytest.raises(ValueError, match=f"q={q} is not in 0..1"):
            percentile([1.0], q)


def test_spread_over_seeds() -> None:
    assert spread([95.0, 94.0, 96.5]) == {"mean": pytest.approx(95.5 - 1 / 3),
                                          "min": 94.0, "max": 96.5}
    with pytest.raises(ValueError, match="spread: no values"):
        spread([])


def test_histogram_quantile_as_prometheus() -> None:
    buckets = [(0.001, 10.0), (0.005, 50.0), (0.01, 90.0), (float("inf"), 100.0)]
    assert histogram_quantile(buckets, 0.5) == pytest.approx(0.005)  # 0.001 + 0.004 x 40/40
    assert histogram_quantile(buckets, 0.3) == pytest.approx(0.003)  # half way in bucket 2
    assert histogram_quantile(buckets, 0.99) == pytest.approx(0.01)  # in +Inf: lower bound
    assert histogram_quantile([], 0.5) is None
    assert histogram_quantile([(float("inf"), 0.0)], 0.5) is None
