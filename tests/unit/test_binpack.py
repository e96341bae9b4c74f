"""core.binpack: the knapsack, the simplex and the fewest-bins configuration LP, checked
against brute force and by LP optimality certificates (primal and dual feasible, equal
objectives)."""

from __future__ import annotations

import itertools
import random

import pytest

from gpuk8s.core.binpack import NO_PRICES, bin_prices, fewest_bins, knapsack, simplex


def _brute_knapsack(sizes: list[int], values: list[float], room: int) -> float:
    best = 0.0
    ranges = [range(room // s + 1) for s in sizes]
    for counts in itertools.product(*ranges):
        if sum(n * s for n, s in zip(counts, sizes, strict=True)) <= room:
            best = max(best, sum(n * v for n, v in zip(counts, values, strict=True)))
    return best


def test_knapsack_against_trying_every_count() -> None:
    rng = random.Random(7)
    for _ in range(60):
        sizes = rng.sample(range(3, 40), rng.randint(1, 3))
        values = [rng.uniform(0, 5) for _ in sizes]
        room = rng.randint(0, 60)
        reach, counts = knapsack(sizes, values, room)
        assert reach[room] == pytest.approx(_brute_knapsack(sizes, values, room))
        assert sum(n * s for n, s in zip(counts, sizes, strict=True)) <= room
        assert sum(n * v for n, v in zip(counts, values, strict=True)) == pytest.approx(reach[room])
        assert all(a <= b + 1e-12 for a, b in itertools.pairwise(reach))  # more room, no less


def test_simplex_small_program_worked_by_hand() -> None:
    # max 3x + 2y, x + y <= 4, x + 3y <= 6: x = 4, y = 0, value 12; prices 3 and 0
    x, prices = simplex([[1, 1], [1, 3]], [3, 2], [4, 6])
    assert x == pytest.approx([4.0, 0.0])
    assert prices == pytest.approx([3.0, 0.0])


def test_simplex_optimality_certificate_on_random_programs() -> None:
    rng = random.Random(11)
    for _ in range(80):
        rows, cols = rng.randint(1, 6), rng.randint(1, 6)
        columns = [[rng.randint(0, 5) for _ in range(rows)] for _ in range(cols)]
        for column in columns:  # every variable limited by some row: bounded
            column[rng.randrange(rows)] += 1
        values = [rng.uniform(-1, 4) for _ in range(cols)]
        limits = [rng.randint(0, 20) for _ in range(rows)]
        x, prices = simplex(columns, values, limits)
        for i in range(rows):  # primal feasible
            assert sum(columns[j][i] * x[j] for j in range(cols)) <= limits[i] + 1e-7
        assert all(v >= -1e-9 for v in x)
        assert all(p >= -1e-9 for p in prices)  # dual feasible
        for j in range(cols):
            assert sum(columns[j][i] * prices[i] for i in range(rows)) >= values[j] - 1e-7
        primal = sum(v * xj for v, xj in zip(values, x, strict=True))
        dual = sum(p * b for p, b in zip(prices, limits, strict=True))
        assert primal == pytest.approx(dual, abs=1e-6)  # equal objectives: both optimal


def test_simplex_refuses_an_unbounded_program() -> None:
    with pytest.raises(ValueError, match="unbounded"):
        simplex([[0]], [1.0], [3])


def _configurations(sizes: list[int], room: int) -> list[tuple[int, ...]]:
    ranges = [range(room // s + 1) for s in sizes]
    return [
        c
        for c in itertools.product(*ranges)
        if 0 < sum(n * s for n, s in zip(c, sizes, strict=True)) <= room
    ]


@pytest.mark.parametrize(
    ("demand", "bins", "price"),
    [
        ({50: 4}, 2.0, {50: 0.5}),
        ({60: 3}, 3.0, {60: 1.0}),
        ({30: 9}, 3.0, {30: 1 / 3}),
        ({47: 10, 65: 10, 32: 10}, 15.0, {47: 0.5}),
        ({70: 2, 40: 2, 30: 2}, 3.0, None),  # 70+30 twice, 40+40
    ],
)
def test_fewest_bins_worked_by_hand(
    demand: dict[int, float], bins: float, price: dict[int, float] | None
) -> None:
    packing = fewest_bins(demand)
    assert sum(b for _, b in packing.bins) == pytest.approx(bins)
    assert sum(d * packing.prices.price[s] for s, d in demand.items()) == pytest.approx(bins)
    for size, value in (price or {}).items():
        assert packing.prices.price[size] == pytest.approx(value)


def test_fewest_bins_certificate_on_random_mixes() -> None:
    """The bins pack the demand, no configuration is worth more than one bin at the
    prices, and the two objectives agree: the LP's optimum, found for every mix."""
    rng = random.Random(3)
    for _ in range(40):
        room = rng.choice([20, 30, 100])
        sizes = sorted(rng.sample(range(1, room + 1), rng.randint(1, 4 if room < 100 else 3)))
        demand = {s: float(rng.randint(1, 30)) for s in sizes}
        packing = fewest_bins(demand, room)
        for s in sizes:  # primal feasible: each size packed at least its demand
            packed = sum(c.get(s, 0) * b for c, b in packing.bins)
            assert packed >= demand[s] - 1e-6
        for c, _ in packing.bins:
            assert sum(n * s for s, n in c.items()) <= room
        if room <= 30 or len(sizes) <= 3:  # dual feasible over every configuration
            for c in _configurations(sizes, room):
                worth = sum(n * packing.prices.price[s] for n, s in zip(c, sizes, strict=True))
                assert worth <= 1 + 1e-6
        bins = sum(b for _, b in packing.bins)
        value = sum(d * packing.prices.price[s] for s, d in demand.items())
        assert bins == pytest.approx(value, rel=1e-6)
        assert packing.prices.reach[room] == pytest.approx(1.0, abs=1e-6)


def test_fewest_bins_leaves_out_what_is_no_item() -> None:
    assert fewest_bins({}).prices == NO_PRICES
    assert fewest_bins({0: 3, 101: 2, 50: 0}).bins == ()
    assert bin_prices({150: 1.0, 25: 4.0}).price == pytest.approx({25: 0.25})


def test_waste_is_zero_inside_an_optimal_configuration_and_positive_outside() -> None:
    # the LP pairs 47 with 47 and 65 with 32
    prices = bin_prices({47: 10, 65: 10, 32: 10})
    assert prices.waste(35, 32) == pytest.approx(0.0)  # 32 beside a 65
    assert prices.waste(53, 47) == pytest.approx(0.0)  # the second 47
    assert prices.waste(53, 32) > 0.1  # 32 beside a 47: 21 units no optimal bin leaves
    assert prices.waste(100, 65) == pytest.approx(0.0)  # opening a bin as planned
    assert prices.waste(20, 32) == 0.0  # does not fit: not a placement
    assert NO_PRICES.waste(100, 50) == 0.0
    for free in range(101):
        for size in (32, 47, 65):
            assert prices.waste(free, size) >= 0.0
