"""The figures the benchmarks report, computed one way for all of them.

=====================  ==================================================================
``percentile(v, q)``   the sample at rank ``int(q * n)`` of the sorted values (capped at
                       the last): p50 of 1..10 is 6, p99 of 1..10 is 10; ``None`` when
                       there are no values (no samples, no figure: ``null`` in JSON)
``spread(v)``          ``{"mean", "min", "max"}`` of per-seed figures
``histogram_quantile`` Prometheus's ``histogram_quantile`` over cumulative buckets
=====================  ==================================================================

Example: ``percentile([3.0, 1.0, 2.0], 0.5) == 2.0`` and
``spread([95.0, 94.0, 96.5]) == {"mean": 95.1666..., "min": 94.0, "max": 96.5}``.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

# (upper bound, cumulative count) per bucket, sorted by bound; the last bound is +Inf
Buckets = list[tuple[float, float]]


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) as the nearest sample at or above rank ``q * n``."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"percentile: q={q} is not in 0..1")
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def spread(values: Sequence[float]) -> dict[str, float]:
    """Mean, min and max of per-seed values (at least one)."""
    if not values:
        raise ValueError("spread: no values (one per seed expected)")
    return {"mean": statistics.mean(values), "min": min(values), "max": max(values)}


def histogram_quantile(buckets: Buckets, q: float) -> float | None:
    """``histogram_quantile`` as Prometheus computes it (linear inside the bucket);
    ``None`` when the histogram counted nothing."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if upper == float("inf"):
                return lower
            inside = count - below
            return lower + (upper - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = upper, count
    return lower
