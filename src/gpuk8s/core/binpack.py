"""The configuration LP of bin packing (Gilmore and Gomory's cutting stock), small and
exact enough for a mix of GPU shares: one implementation for the extender's placement
(``bin_prices``) and the packing benchmark's upper bound.

A *configuration* is a multiset of item sizes that fits one bin (a GPU: 100 percent).
The LP over configurations is solved by column generation: a dense simplex on the
configurations found so far, an unbounded knapsack to price a new one. Item counts are
a few dozen sizes, bins of 100 units: milliseconds.

``bin_prices`` solves the *fewest bins* LP for a demand (the arriving request mix) and
returns its dual prices: the share of a bin that an item of each size is worth when the
mix is packed as tightly as the LP allows. A bin holding items whose prices sum to 1
follows an optimal packing; what it can no longer reach is lost. ``Prices.waste`` is
that loss for putting an item into a bin with given free room (Gupta and Radovanovic,
"Interior-point-based online stochastic bin packing", Oper. Res. 2020, guide online
placement by the same duals).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

EPS = 1e-9
MAX_CONFIGURATIONS = 2000  # column generation stops here (never reached by 100-unit bins)


def knapsack(
    sizes: Sequence[int], values: Sequence[float], room: int
) -> tuple[list[float], list[int]]:
    """Unbounded knapsack: ``best[r]``, the most value that items (any number of each)
    with sizes summing to at most ``r`` hold, for every ``r`` up to ``room``; and how
    many of each make ``best[room]``."""
    best = [0.0] * (room + 1)
    last = [-1] * (room + 1)
    for r in range(1, room + 1):
        best[r], last[r] = best[r - 1], -1
        for i, size in enumerate(sizes):
            if 0 < size <= r and best[r - size] + values[i] > best[r] + 1e-12:
                best[r], last[r] = best[r - size] + values[i], i
    counts = [0] * len(sizes)
    r = room
    while r > 0:
        if last[r] < 0:
            r -= 1
        else:
            counts[last[r]] += 1
            r -= sizes[last[r]]
    return best, counts


def simplex(
    columns: Sequence[Sequence[float]], values: Sequence[float], limits: Sequence[float]
) -> tuple[list[float], list[float]]:
    """max ``values``·x subject to Σ_j ``columns[j][i]``·x_j <= ``limits[i]``, x >= 0, for
    ``limits`` >= 0 (the origin is feasible): (x, the rows' dual prices) at the optimum.
    Dense tableau, Bland's rule (no cycling). ValueError when unbounded."""
    rows, cols = len(limits), len(columns)
    width = cols + rows + 1
    table = [
        [float(columns[j][i]) for j in range(cols)]
        + [1.0 if k == i else 0.0 for k in range(rows)]
        + [float(limits[i])]
        for i in range(rows)
    ]
    cost = [-float(v) for v in values] + [0.0] * (rows + 1)
    basis = [cols + i for i in range(rows)]
    while True:
        enter = next((j for j in range(width - 1) if cost[j] < -EPS), -1)
        if enter < 0:
            x = [0.0] * cols
            for i, var in enumerate(basis):
                if var < cols:
                    x[var] = table[i][-1]
            return x, cost[cols : cols + rows]
        leave, ratio = -1, 0.0
        for i in range(rows):
            a = table[i][enter]
            if a > EPS:
                r = table[i][-1] / a
                if (
                    leave < 0
                    or r < ratio - EPS
                    or (abs(r - ratio) <= EPS and basis[i] < basis[leave])
                ):
                    leave, ratio = i, r
        if leave < 0:
            raise ValueError("linear program unbounded")
        pivot = table[leave]
        scale = pivot[enter]
        pivot[:] = [v / scale for v in pivot]
        for row in (*table[:leave], *table[leave + 1 :], cost):
            f = row[enter]
            if f != 0.0:
                row[:] = [a - f * b for a, b in zip(row, pivot)]
        basis[leave] = enter


class Prices(NamedTuple):
    """Dual prices of the fewest-bins LP: ``price[size]`` (a share of one bin) and
    ``reach[r]``, the most that items of the mix fitting in ``r`` units are worth
    (r = 0..bin)."""

    price: Mapping[int, float]
    reach: tuple[float, ...]

    def waste(self, free: int, size: int) -> float:
        """The share of a bin that putting an item of ``size`` into a bin with ``free``
        units left loses for good against the LP's packing: what the free room could
        still hold, less the item's price and what the room left after it can hold
        (>= 0 up to rounding; 0 where the placement fits an optimal configuration)."""
        if not self.reach or size > free:
            return 0.0
        return max(0.0, self.reach[free] - self.reach[free - size] - self.price.get(size, 0.0))


NO_PRICES = Prices({}, ())


class Packing(NamedTuple):
    """The fewest-bins LP at its optimum: ``prices`` (its dual) and the bins it packs,
    ``(configuration as a count per size, bins)`` -- both for the demand as given."""

    prices: Prices
    bins: tuple[tuple[Mapping[int, int], float], ...]


def fewest_bins(demand: Mapping[int, float], room: int = 100) -> Packing:
    """The fewest bins of ``room`` units that pack every size ``s`` (1..``room``)
    ``demand[s]`` times, fractional bins and counts allowed (the configuration LP), with
    its dual prices. Solved as the dual -- max Σ demand·price subject to the prices of
    every configuration summing to at most 1 -- with configurations added by the
    knapsack while one is worth more than 1; the simplex's row prices of that dual are
    the bins of the primal. Sizes outside 1..``room`` and demands <= 0 are left out."""
    sizes = sorted(s for s, d in demand.items() if d > 0 and 0 < s <= room)
    if not sizes:
        return Packing(NO_PRICES, ())
    total = sum(demand[s] for s in sizes)
    weights = [demand[s] / total for s in sizes]  # scaled for the simplex's tolerances
    configurations: list[list[int]] = []
    for i, s in enumerate(sizes):  # as many of one size as fit
        one = [0] * len(sizes)
        one[i] = room // s
        configurations.append(one)
    while True:
        columns = [[c[i] for c in configurations] for i in range(len(sizes))]
        price, bins = simplex(columns, weights, [1.0] * len(configurations))
        reach, counts = knapsack(sizes, price, room)
        if (
            reach[room] <= 1.0 + EPS
            or counts in configurations
            or len(configurations) >= MAX_CONFIGURATIONS
        ):
            used = tuple(
                ({s: n for s, n in zip(sizes, c) if n}, b * total)
                for c, b in zip(configurations, bins)
                if b > EPS
            )
            return Packing(Prices(dict(zip(sizes, price)), tuple(reach)), used)
        configurations.append(counts)


def bin_prices(demand: Mapping[int, float], room: int = 100) -> Prices:
    """``fewest_bins``' dual prices: the share of a bin an item of each size is worth."""
    return fewest_bins(demand, room).prices
