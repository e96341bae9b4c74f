"""The allocator's partial-mesh search as it was before the step-only budget (commit
b2fb098), frozen as the baseline of benchmarks/allocator.py: a budget of 4,000 steps or
14 ms of the thread's CPU time, whichever ran out first; no greedy floor; the exact cover
numbers (``Topology.cover_classes`` then: plain memoised recursion over the groups,
outside the budget, the memo kept across calls per topology).

Benchmark code only: nothing in the product imports it. What did not change (the
objective's leftovers, the free counts per group) is imported from the allocator.
"""


from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gpuk8s.core.allocator import Key, SearchResult, _free_counts, _leftover
from gpuk8s.core.errors import AllocationError
from gpuk8s.core.model import LinkKind
from gpuk8s.core.topology import Topology

_SELF = int(LinkKind.SELF)
_LEVELS_FINE_FIRST = tuple(range(_SELF, int(LinkKind.SYS), -1))
DEFAULT_STEPS = 4_000
DEFAULT_SECONDS = 0.014
MAX_COVERS = 20_000
_MEMO: dict[int, dict[tuple[int, int], int]] = {}  # id(topology) -> cover numbers


@dataclass(frozen=True)
class Budget:
    steps: int = DEFAULT_STEPS
    seconds: float = DEFAULT_SECONDS
    clock: Callable[[], float] = field(default=time.thread_time, compare=False)


def _cover_classes(topo: Topology, level: int, mask: int) -> int:
    """Topology.cover_classes before: memoised recursion, no budget."""
    if mask == 0:
        return 0
    memo = _MEMO.setdefault(id(topo), {})
    key = (level, mask)
    known = memo.get(key)
    if known is not None:
        return known
    low = (mask & -mask).bit_length() - 1
    best = len(topo.classes)
    for group in topo.group_masks[level]:
        if group >> low & 1:
            best = min(best, 1 + _cover_classes(topo, level, mask & ~group))
    if len(memo) >= MAX_COVERS:
        memo.clear()
    memo[key] = best
    return best


def _cover_number(topo: Topology, level: int, members: list[int]) -> int:
    mask = 0
    for unit in members:
        mask |= 1 << topo.class_of[unit]
    if topo.transitive[level]:
        comp = topo.comp[level]
        return len({comp[u] for u in members})
    return _cover_classes(topo, level, mask)


def _key_before(topo: Topology, members: list[int], free_counts: dict[int, list[int]]) -> Key:
    worst = topo.worst_level(members)
    spans = tuple(_cover_number(topo, lv, members) for lv in range(worst + 1, _SELF + 1))
    return (-worst, spans, _leftover(topo, members, free_counts), tuple(members))


def search(
    topo: Topology,
    free: Sequence[int],
    size: int,
    must: Sequence[int] = (),
    budget: Budget | None = None,
) -> SearchResult:
    """The search before, for partial meshes (the benchmark calls it on those only)."""
    assert not topo.hierarchical
    free_counts = _free_counts(topo, free)
    return _BranchAndBound(topo, free, size, must, free_counts, budget or Budget()).run()


class _Cut(Exception):
    """The budget ran out."""


class _BranchAndBound:
    """Exact search over GPUs (classes of twin units) for non-hierarchical topologies.

    Criteria 1 and 2 depend only on *which* GPUs a set touches (its classes, ``mask``),
    criteria 3 and 4 on how many units it takes from each. Phase 1 enumerates masks by
    branch and bound: adding a GPU can only lower the worst level and raise every cover
    number, so a partial mask whose (worst level, cover numbers) is already worse than
    the best set's is dropped, and a mask that can hold ``size`` units is not extended
    (any superset touches one more GPU: a larger finest-level cover). Phase 2 takes each
    mask that ties the best (criteria 1-2) and spreads its slack -- the free units it
    holds beyond ``size``, fewer than any of its optional GPUs has -- over its GPUs in
    every possible way, keeping the smallest key. The first best set comes from one
    maximal clique of the best feasible level, so phase 1 prunes from the start.
    """

    def __init__(
        self,
        topo: Topology,
        free: Sequence[int],
        size: int,
        must: Sequence[int],
        free_counts: dict[int, list[int]],
        budget: Budget,
    ) -> None:
        self.topo = topo
        self.size = size
        self.free_counts = free_counts
        self.budget = budget
        self.deadline = budget.clock() + budget.seconds
        self.steps = 0
        free_set, must_set = set(free), set(must)
        # per class: the units it can give, pinned (must-include) ones first, then by
        # position -- taking k units of a class means these first k
        self.units: list[list[int]] = []
        self.need: list[int] = []
        for members in topo.classes:
            pinned = [u for u in members if u in must_set]
            loose = [u for u in members if u in free_set and u not in must_set]
            self.units.append(pinned + loose)
            self.need.append(len(pinned))
        self.cap = [len(u) for u in self.units]
        self.adjacent = topo.class_adjacent
        self.must_mask = sum(1 << c for c, need in enumerate(self.need) if need)
        self.best: tuple[Key, list[int]] | None = None
        self._set_order(set())

    def _set_order(self, first: set[int]) -> None:
        """Branching order: must classes, then ``first`` (the best set's GPUs, so the
        search starts next to it), then the largest free counts, lowest positions."""
        self.order = sorted(
            (c for c, cap in enumerate(self.cap) if cap),
            key=lambda c: (-self.need[c], c not in first, -self.cap[c], self.units[c][0]),
        )
        self.suffix_cap = [0] * (len(self.order) + 1)
        for i in range(len(self.order) - 1, -1, -1):
            self.suffix_cap[i] = self.suffix_cap[i + 1] + self.cap[self.order[i]]

    # -- helpers ------------------------------------------------------------------------
    def _tick(self) -> None:
        self.steps += 1
        if self.steps > self.budget.steps:
            raise _Cut
        # the clock costs ~1 us, a step 5-50 us: looking at every step bounds the
        # overshoot to one step
        if self.budget.clock() > self.deadline:
            raise _Cut

    def _offer(self, counts: dict[int, int]) -> None:
        chosen: list[int] = []
        for c, k in counts.items():
            chosen.extend(self.units[c][:k])
        chosen.sort()
        key = _key_before(self.topo, chosen, self.free_counts)
        if self.best is None or key < self.best[0]:
            self.best = (key, chosen)

    def _worst_with(self, worst: int, mask: int, c: int) -> int:
        """The worst pair level after adding class ``c`` to the classes in ``mask``."""
        for level in range(worst, -1, -1):
            if mask & ~self.adjacent[level][c] == 0:
                return level
        return 0

    def _prefix_worse(self, mask: int, worst: int) -> bool:
        """True when criteria 1-2 of ``mask`` (a lower bound for its supersets) are
        already worse than the best set's."""
        if self.best is None:
            return False
        best_key = self.best[0]
        if -worst != best_key[0]:
            return -worst > best_key[0]
        for i, level in enumerate(range(worst + 1, _SELF + 1)):
            cover = _cover_classes(self.topo, level, mask)
            if cover != best_key[1][i]:
                return cover > best_key[1][i]
        return False

    # -- the first best set: inside one maximal clique of the best feasible level --------
    def _seed(self) -> None:
        for level in range(_SELF - 1, int(LinkKind.SYS) - 1, -1):
            for group in self.topo.group_masks[level]:
                if self.must_mask & ~group:
                    continue
                classes = [c for c in self.order if group >> c & 1]
                if sum(self.cap[c] for c in classes) >= self.size:
                    self._tick()
                    self._fill(classes)
            if self.best is not None:
                return
        self._fill(self.order)

    def _fill(self, classes: list[int]) -> None:
        """Greedy: must classes, then the largest free counts, lowest positions first."""
        counts = {c: self.need[c] for c in classes if self.need[c]}
        left = self.size - sum(counts.values())
        for c in classes:  # already in that order
            if left <= 0:
                break
            extra = min(self.cap[c] - self.need[c], left)
            if extra:
                counts[c] = self.need[c] + extra
                left -= extra
        if left == 0 and self.must_mask & ~sum(1 << c for c in counts) == 0:
            self._offer(counts)

    # -- phase 1: which GPUs ------------------------------------------------------------
    def run(self) -> SearchResult:
        complete = True
        try:
            self._seed()
            if self.best is not None:
                self._set_order({self.topo.class_of[u] for u in self.best[1]})
            self._masks(0, 0, 0, _SELF)
        except _Cut:
            complete = False
        if self.best is None:  # pragma: no cover - _validate guarantees feasibility
            raise AllocationError("no feasible set within the search budget")
        key, chosen = self.best
        return SearchResult(chosen, key, complete, self.steps)

    def _masks(self, i: int, mask: int, capacity: int, worst: int) -> None:
        self._tick()
        if mask and self._prefix_worse(mask, worst):
            return
        if capacity >= self.size and mask & self.must_mask == self.must_mask:
            self._spread(mask, capacity - self.size, worst)
            return  # a superset touches one more GPU: worse by criterion 2
        if i == len(self.order) or capacity + self.suffix_cap[i] < self.size:
            return
        c = self.order[i]
        new_worst = self._worst_with(worst, mask, c) if mask else worst
        if self.best is None or -new_worst <= self.best[0][0]:
            self._masks(i + 1, mask | 1 << c, capacity + self.cap[c], new_worst)
        if not self.need[c]:
            self._masks(i + 1, mask, capacity, worst)

    # -- phase 2: how many units of each ------------------------------------------------
    def _leftover_bound(self, mask: int) -> tuple[tuple[int, ...], ...]:
        """A lower bound of criterion 3 for any spread over ``mask``: each group keeps at
        most its free units minus what it must give (one unit, or the must-include ones,
        per GPU of the mask in it; and what the rest of the mask cannot supply)."""
        capacity = sum(self.cap[c] for c in range(len(self.cap)) if mask >> c & 1)
        out = []
        for level in _LEVELS_FINE_FIRST:
            counts = self.free_counts[level]
            bound = []
            for g, group in enumerate(self.topo.group_masks[level]):
                inside = mask & group
                if not inside:
                    bound.append(-counts[g])
                    continue
                given = in_cap = 0
                rest = inside
                while rest:
                    low = rest & -rest
                    c = low.bit_length() - 1
                    given += max(self.need[c], 1)
                    in_cap += self.cap[c]
                    rest ^= low
                given = max(given, self.size - (capacity - in_cap))
                bound.append(-(counts[g] - given))
            out.append(tuple(sorted(bound)))
        return tuple(out)

    def _spread(self, mask: int, slack: int, worst: int) -> None:
        best = self.best
        if (
            best is not None
            and best[0][0] == -worst
            and best[0][1]
            == tuple(_cover_classes(self.topo, lv, mask) for lv in range(worst + 1, _SELF + 1))
            and self._leftover_bound(mask) > best[0][2]
        ):
            return  # criteria 1-2 tie the best set, and no spread here beats its leftovers
        classes = [c for c in self.order if mask >> c & 1]
        room = [self.cap[c] - max(self.need[c], 1) for c in classes]
        counts = {c: self.cap[c] for c in classes}
        self._spread_from(classes, room, 0, slack, counts)

    def _spread_from(
        self, classes: list[int], room: list[int], i: int, slack: int, counts: dict[int, int]
    ) -> None:
        if slack == 0:
            self._tick()
            self._offer(counts)
            return
        if i == len(classes) or sum(room[i:]) < slack:
            return
        c = classes[i]
        for keep in range(min(room[i], slack), -1, -1):
            counts[c] = self.cap[c] - keep
            self._spread_from(classes, room, i + 1, slack - keep, counts)
        counts[c] = self.cap[c]
