"""Topology-aware preferred allocation (SPEC §3, DESIGN "Allocation objective").

Link groups are maximal cliques (``core.topology``: a maximal set of units whose pairs
are all at a level or better). Among the feasible sets of ``size`` available units that
contain every must-include unit, the allocator returns the one with the smallest
*objective key*, compared lexicographically:

1. the worst pair level inside the set -- better wins (MetaXLink beats PCIe switch,
   which beats NUMA node, which beats system);
2. for each level finer than that worst level, coarse to fine, the set's *cover
   number*: the fewest link groups of that level that together contain it -- fewer
   wins (keep the set under one link as far as possible; at the finest level, VFs on
   as few GPUs as possible). Where groups do not overlap this is the number of groups
   the set touches;
3. for each level from the finest to the coarsest, the free units left in each link
   group (every maximal clique, overlapping ones included), sorted descending --
   lexicographically larger wins (whole groups stay whole: the remainder is left as
   unfragmented as possible);
4. the positions of the chosen units, sorted -- lower wins (deterministic).

Criterion 2 makes DESIGN's "number of link groups the set spans at its level"
precise: at the set's own worst level the set always lies in one group, so the count
only carries information at the finer levels.

Search. When every level's groups are disjoint cliques (all real MetaXLink/NVSwitch/
PCIe trees, ``Topology.hierarchical``), groups of successive levels nest into a tree
and the worst level of a set is the level of its lowest common group: the search only
visits the groups with the best feasible level and, inside each, solves a knapsack over
its child groups (``_best_in_group``), polynomial in the number of units.

Other topologies (partial meshes) are searched by branch and bound over GPUs (VFs of
one GPU are twins: only how many of them is chosen matters), starting from the best
set inside one maximal clique of the best feasible level -- which already has the
optimal criterion 1 -- and pruning every partial choice whose worst level, cover
numbers or leftovers cannot beat the best set found (each only gets worse as units are
added, so the partial values are lower bounds of the key). Both searches give the exact
minimum of ``objective_key``; the tests check it against brute force.

Budget. A call may take at most ``Budget.steps`` search steps and ``Budget.seconds`` of
its thread's CPU time (``time.thread_time``); when either runs out the best set found
so far is returned with ``complete=False`` (the device plugin counts these). The step
limit makes answers deterministic (the score tables built from them do not flap with
machine load); the CPU-time limit guarantees the 20 ms on a slower machine. CPU time,
not wall time: time spent waiting for a core is not the search's doing, and cutting on
it would only return worse answers on a busy node without answering sooner.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Tuple  # runtime aliases below: Python 3.8 cannot subscript tuple

from .errors import AllocationError
from .model import LinkKind
from .topology import Topology

_SELF = int(LinkKind.SELF)
_LEVELS_FINE_FIRST = tuple(range(_SELF, int(LinkKind.SYS), -1))  # SELF, MX, PIX, NODE

Key = Tuple[int, Tuple[int, ...], Tuple[Tuple[int, ...], ...], Tuple[int, ...]]


# Calibrated on the project's 2-core VM (a slowish core): 4,000 steps of the partial-mesh
# search take about 15-20 ms of CPU there (benchmarks/allocator.py, 64 devices). The CPU
# limit leaves room for one step's overshoot, validation and the explanation within 20 ms.
DEFAULT_STEPS = 4_000
DEFAULT_SECONDS = 0.014


@dataclass(frozen=True)
class Budget:
    """How much one call may search: ``steps`` (deterministic) and ``seconds`` of CPU
    time read from ``clock`` (injectable for tests)."""

    steps: int = DEFAULT_STEPS
    seconds: float = DEFAULT_SECONDS
    clock: Callable[[], float] = field(default=time.thread_time, compare=False)


@dataclass(frozen=True)
class Allocation:
    devices: tuple[str, ...]
    explain: str
    worst: LinkKind
    complete: bool = True  # False: the budget cut the search (best set found so far)

    def to_dict(self) -> dict[str, object]:
        return {
            "devices": list(self.devices),
            "explain": self.explain,
            "worst": self.worst.name,
            "complete": self.complete,
        }


@dataclass(frozen=True)
class SearchResult:
    chosen: list[int]
    key: Key
    complete: bool
    steps: int


def _free_counts(topo: Topology, free: Iterable[int]) -> dict[int, list[int]]:
    """Free units per link group, per level."""
    counts = {lv: [0] * len(topo.groups[lv]) for lv in _LEVELS_FINE_FIRST}
    for u in free:
        for lv in _LEVELS_FINE_FIRST:
            row = counts[lv]
            for g in topo.groups_of[lv][u]:
                row[g] += 1
    return counts


def objective_key(topo: Topology, chosen: Sequence[int], free: Iterable[int]) -> Key:
    """The objective of a candidate set (smaller is better); see the module doc."""
    return _key(topo, sorted(chosen), _free_counts(topo, free))


def _key(topo: Topology, members: list[int], free_counts: dict[int, list[int]]) -> Key:
    worst = topo.worst_level(members)
    spans = tuple(topo.cover_number(lv, members) for lv in range(worst + 1, _SELF + 1))
    return (-worst, spans, _leftover(topo, members, free_counts), tuple(members))


def _leftover(
    topo: Topology, members: Iterable[int], free_counts: dict[int, list[int]]
) -> tuple[tuple[int, ...], ...]:
    out = []
    for lv in _LEVELS_FINE_FIRST:
        counts = list(free_counts[lv])
        of = topo.groups_of[lv]
        for u in members:
            for g in of[u]:
                counts[g] -= 1
        out.append(tuple(sorted(-c for c in counts)))
    return tuple(out)


Partial = Tuple[Tuple[int, ...], Tuple[Tuple[int, ...], ...], Tuple[int, ...]]


def _merge(a: Partial, b: Partial) -> Partial:
    """Combine the partial keys of two disjoint parts of one group."""
    return (
        tuple(x + y for x, y in zip(a[0], b[0])),
        tuple(tuple(sorted(x + y)) for x, y in zip(a[1], b[1])),
        tuple(sorted(a[2] + b[2])),
    )


def _best_in_group(
    topo: Topology,
    members: list[int],
    level: int,
    must: frozenset[int],
    limit: int,
    exact: bool = False,
) -> dict[int, Partial]:
    """Best partial key for every count that the free ``members`` of one group at
    ``level`` can contribute.

    A partial key is (groups touched per finer level, coarse to fine; free units
    left per finer-level group, finest level first, as sorted negated counts;
    chosen positions). Both parts of the objective combine over disjoint parts
    monotonically (a sum, and a multiset union under the sorted-descending order),
    so the best set for a count is made of the best sets of its parts: a knapsack
    over the child groups is exact.
    """
    depth = _SELF - level  # number of finer levels below this group
    n_must = sum(1 for u in members if u in must)
    if depth == 0:  # VFs of one GPU (or one whole GPU): only positions differ
        free = [u for u in members if u not in must]
        pinned = sorted(u for u in members if u in must)
        return {
            c: ((), (), tuple(sorted(pinned + free[: c - len(pinned)])))
            for c in range(n_must, min(len(members), limit) + 1)
        }
    comp = topo.comp[level + 1]
    parts: dict[int, list[int]] = {}
    for u in members:
        parts.setdefault(comp[u], []).append(u)
    singles = sorted(p[0] for p in parts.values() if len(p) == 1)
    groups = [p for p in parts.values() if len(p) > 1]

    options: list[dict[int, Partial]] = []
    if singles:
        # Lone free units are interchangeable apart from their position.
        pinned = [u for u in singles if u in must]
        loose = [u for u in singles if u not in must]
        table: dict[int, Partial] = {}
        for c in range(len(pinned), min(len(singles), limit) + 1):
            left = len(singles) - c
            table[c] = (
                (c,) * depth,
                tuple((-1,) * left + (0,) * c for _ in range(depth)),
                tuple(sorted(pinned + loose[: c - len(pinned)])),
            )
        options.append(table)
    for g in groups:
        child = _best_in_group(topo, g, level + 1, must, limit)
        options.append(
            {
                c: (
                    (1 if c else 0, *p[0]),
                    (*p[1], (-(len(g) - c),)),
                    p[2],
                )
                for c, p in child.items()
            }
        )
    acc: dict[int, Partial] = options[0]
    last = len(options) - 1
    for i, table in enumerate(options[1:], start=1):
        nxt: dict[int, Partial] = {}
        for s, p in acc.items():
            for c, q in table.items():
                if s + c > limit or (exact and i == last and s + c != limit):
                    continue
                merged = _merge(p, q)
                current = nxt.get(s + c)
                if current is None or merged < current:
                    nxt[s + c] = merged
        acc = nxt
    return {c: p for c, p in acc.items() if c >= n_must}


def _validate(
    topo: Topology, available: Sequence[str], size: int, must_include: Sequence[str]
) -> tuple[list[int], list[int]]:
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise AllocationError(f"size must be a positive integer, got {size!r}")
    avail = sorted(set(topo.positions(available)))
    must = sorted(set(topo.positions(must_include)))
    missing = [topo.units[u].id for u in must if u not in set(avail)]
    if missing:
        raise AllocationError(f"must-include devices are not available: {', '.join(missing)}")
    if len(must) > size:
        raise AllocationError(f"{len(must)} must-include devices exceed the request size {size}")
    if size > len(avail):
        raise AllocationError(f"request for {size} devices, only {len(avail)} available")
    return avail, must


def best_set(
    topo: Topology, free: Sequence[int], size: int, must: Sequence[int] = ()
) -> tuple[list[int], Key]:
    """Positions of the optimal set and its key (no validation: internal use)."""
    result = search(topo, free, size, must)
    return result.chosen, result.key


def search(
    topo: Topology,
    free: Sequence[int],
    size: int,
    must: Sequence[int] = (),
    budget: Budget | None = None,
) -> SearchResult:
    """The optimal set (or, when ``budget`` cuts the search, the best one found)."""
    free_counts = _free_counts(topo, free)
    if topo.hierarchical:
        chosen, key = _hierarchical(topo, free, size, frozenset(must), free_counts)
        return SearchResult(chosen, key, True, 0)
    return _BranchAndBound(topo, free, size, must, free_counts, budget or Budget()).run()


def _hierarchical(
    topo: Topology,
    free: Sequence[int],
    size: int,
    must_set: frozenset[int],
    free_counts: dict[int, list[int]],
) -> tuple[list[int], Key]:
    best: tuple[Key, list[int]] | None = None
    for level in range(_SELF, int(LinkKind.SYS) - 1, -1):
        comp = topo.comp[level]
        must_groups = {comp[u] for u in must_set}
        if len(must_groups) > 1:
            continue
        candidates: dict[int, list[int]] = {}
        for u in free:
            if not must_groups or comp[u] in must_groups:
                candidates.setdefault(comp[u], []).append(u)
        roots = [m for m in candidates.values() if len(m) >= size]
        if not roots:
            continue
        for members in roots:
            table = _best_in_group(topo, members, level, must_set, size, exact=True)
            chosen = list(table[size][2])
            key = _key(topo, chosen, free_counts)
            if best is None or key < best[0]:
                best = (key, chosen)
        break
    if best is None:  # pragma: no cover - _validate guarantees feasibility
        raise AllocationError("no feasible set")
    return best[1], best[0]


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
        key = _key(self.topo, chosen, self.free_counts)
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
            cover = self.topo.cover_classes(level, mask)
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
            == tuple(self.topo.cover_classes(lv, mask) for lv in range(worst + 1, _SELF + 1))
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


def allocate(
    topo: Topology,
    available: Sequence[str],
    size: int,
    must_include: Sequence[str] = (),
    *,
    unhealthy: Iterable[str] = (),
    budget: Budget | None = None,
) -> Allocation:
    """Preferred set of ``size`` device ids out of ``available`` (SPEC §3).

    ``unhealthy`` devices are never chosen from ``available``; a must-include device is
    kept even when unhealthy (the kubelet requires it in the answer)."""
    sick = set(unhealthy)
    offered = [d for d in available if d not in sick or d in must_include]
    try:
        avail, must = _validate(topo, offered, size, must_include)
    except AllocationError as err:
        left_out = len(set(available) - set(offered))
        if left_out and "available" in str(err):
            raise AllocationError(f"{err} ({left_out} unhealthy device(s) not used)") from None
        raise
    result = search(topo, avail, size, must, budget)
    return Allocation(
        devices=tuple(topo.units[u].id for u in result.chosen),
        explain=_explain(topo, result.chosen, result.key, avail),
        worst=LinkKind(-result.key[0]),
        complete=result.complete,
    )


_LEVEL_WORDS = {
    LinkKind.SELF: "one GPU",
    LinkKind.MX: "one MetaXLink group",
    LinkKind.PIX: "one PCIe switch",
    LinkKind.NODE: "one NUMA node",
    LinkKind.SYS: "the whole system",
}


def _explain(topo: Topology, chosen: list[int], key: Key, free: Sequence[int]) -> str:
    worst = LinkKind(-key[0])
    gpus = sorted({topo.units[u].gpu for u in chosen})
    left = set(free) - set(chosen)
    level = int(LinkKind.MX)
    per_group = sorted(
        (sum(1 for u in g if u in left) for g in topo.groups[level]), reverse=True
    )
    where = _LEVEL_WORDS[worst] if len(chosen) > 1 else "a single device"
    return (
        f"{len(chosen)} device(s) on GPU {','.join(map(str, gpus))} within {where} "
        f"(worst link {worst.label}); free left per link group: "
        f"{','.join(map(str, per_group))}"
    )
