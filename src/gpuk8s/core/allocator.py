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
one GPU are twins: only how many of them is chosen matters; ``_BranchAndBound``). A set
whose worst level is L lies in a maximal clique of G_L, so criterion 1 is solved without
search: the best level with a clique that can hold the request. A greedy set grown in
that level's roomiest clique (the *floor*) is the first best set; the search then looks
for sets better on criteria 1-2 (ties pruned), then among the sets that tie for the
best criteria 3-4, pruning every partial choice whose lower bounds (cover numbers only
rise as GPUs are added) or leftovers cannot beat the best set found. Cover numbers are
exact minimum clique covers (``topology.Covers``). Both searches give the exact minimum
of ``objective_key``; the tests check it against brute force.

Budget. The partial-mesh search may take at most ``Budget.steps`` steps per call; every
piece of its work is counted, sized by what it costs (a node of the search, a cover
number search's node, a key, a leftover bound, a seed: see ``_BranchAndBound``), so the
steps bound the call's CPU time (``DEFAULT_STEPS`` is tuned for 20 ms at p99 up to 64
devices). When they run out the best set found so far is returned with
``complete=False`` (the device plugin counts these): never worse than the floor, which
is where the search starts. The budget is a count, not a clock: one state gets one
answer on any machine and under any load (the score tables built from the answers do
not flap), and nothing in a call reads a clock. Uncounted: input validation, the free
counts, the floor's growth (polynomial: size x GPUs x groups) and the nested-groups
knapsack (polynomial, no search). A request for every free unit has one feasible set:
it is answered complete, without search.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Tuple  # runtime aliases below: Python 3.8 cannot subscript tuple

from .errors import AllocationError
from .model import LinkKind
from .topology import Covers, Topology, bits, popcount

_SELF = int(LinkKind.SELF)
_LEVELS_FINE_FIRST = tuple(range(_SELF, int(LinkKind.SYS), -1))  # SELF, MX, PIX, NODE

Key = Tuple[int, Tuple[int, ...], Tuple[Tuple[int, ...], ...], Tuple[int, ...]]


# Tuned with benchmarks/allocator.py on the project's 2-core VM: at this budget every
# topology of the benchmark up to 64 devices answers within 20 ms of CPU at p99 with
# margin (docs/allocator.md has the figures).
DEFAULT_STEPS = 3_000
# a seed's growth: (GPU, link group) pairs looked at per step (about the CPU of a step)
_GROW_PER_STEP = 4


@dataclass(frozen=True)
class Budget:
    """How much one call may search, in steps (see the module doc): a count, not a
    time, so that one state gets one answer on any machine and under any load."""

    steps: int = DEFAULT_STEPS


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
    """The chosen positions and their objective key; ``complete``: no budget cut, the set
    is optimal; ``steps``: what the partial-mesh search spent (0 for nested groups). Where
    the budget did not even cover the first set's cover numbers, first-fit clique covers
    (upper bounds) stand in for them in ``key``."""

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


class BestSets:
    """``best_set`` remembered per topology shape (``Topology.shape``), free positions and
    size, so that the nodes of one model share their answers; at most ``limit``
    answers (all forgotten when full)."""

    def __init__(self, limit: int = 8192) -> None:
        self.limit = limit
        self._known: dict[tuple[object, tuple[int, ...], int], tuple[tuple[int, ...], Key]] = {}

    def __call__(self, topo: Topology, free: Sequence[int], size: int) -> tuple[list[int], Key]:
        at = (topo.shape, tuple(free), size)
        hit = self._known.get(at)
        if hit is None:
            chosen, key = best_set(topo, free, size)
            if len(self._known) >= self.limit:
                self._known.clear()
            hit = self._known[at] = (tuple(chosen), key)
        return list(hit[0]), hit[1]


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
    meter = _Meter((budget or Budget()).steps)
    search = _BranchAndBound(topo, free, size, must, free_counts, meter)
    if size == len(free):
        return search.everything()
    return search.run()


def greedy_set(
    topo: Topology, free: Sequence[int], size: int, must: Sequence[int] = ()
) -> tuple[list[int], Key]:
    """The greedy floor of the partial-mesh search and its exact key, without budget
    (tests and benchmarks: a cut answer is never worse than this on rules 1-2)."""
    meter = _Meter(sys.maxsize)
    floor = _BranchAndBound(topo, free, size, must, _free_counts(topo, free), meter)
    floor.greedy()
    assert floor.best is not None
    return floor.best[1], floor.best[0]


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


class _Meter:
    """The search steps of one call; raises ``_Cut`` once they pass ``limit``."""

    __slots__ = ("limit", "steps")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.steps = 0

    def tick(self, steps: int = 1) -> None:
        self.steps += steps
        if self.steps > self.limit:
            raise _Cut


class _BranchAndBound:
    """Search over GPUs (classes of twin units) for non-hierarchical topologies.

    Criteria 1 and 2 depend only on *which* GPUs a set touches (its classes, ``mask``),
    criteria 3 and 4 on how many units it takes from each.

    The floor (``greedy``): criterion 1 is solved exactly without search (a set whose
    worst level is L lies in a maximal clique of G_L, so the best level is the best one
    with a clique that can hold the request); inside the roomiest such clique a set is
    grown GPU by GPU (``_grow``). Its key is the first best set; the other cliques of the
    best level are grown the same way next (seeds).

    Phase 1 enumerates masks by branch and bound inside the cliques of the best level
    (every feasible set has it as its worst level): the cover numbers of a partial mask
    only rise as GPUs are added, so a lower bound of them (``apart``; and the fewest
    groups whose free units hold the request) lexicographically larger than the best
    set's drops the mask, and a mask that can hold ``size`` units is not extended (any
    superset touches one more GPU: a larger finest-level cover). It runs twice: first
    for sets strictly better on criteria 1-2 (a bound equal to the best drops the mask
    too), then for the ties, for criteria 3-4 -- so a cut search has spent its steps on
    the criteria that matter most. Phase 2 takes each mask that beats (or, the second
    time, ties) the best and spreads its slack -- the free units it holds beyond
    ``size``, fewer than any of its optional GPUs has -- over its GPUs in every possible
    way, keeping the smallest key.

    Every piece of work is counted by one ``_Meter``, in steps sized by its cost (about
    the same CPU time per step): a node of phase 1 (1), a seed's growth (1 + 2 per GPU
    of its clique + 1 per 4 (GPU, link group) pairs it looks at), a key (1 + 1 per 16
    link groups of the node + 1 per 4 GPUs of the set), a leftover bound (1 + 1 per 16
    link groups + 1 per 4 memberships of the set's GPUs in groups), and the work of the
    exact cover numbers (``Covers``: 1 + 1 per 4 GPUs of a set bounded, 2 per
    branching). Past the budget the search stops
    and the best set found is returned: never worse than the floor, as the floor is
    where the search starts. Only the floor's growth runs outside the budget: it is
    polynomial (size x GPUs x groups bit operations); its exact cover numbers are the
    search's first steps (cut there, first-fit clique covers, upper bounds, stand in).
    """

    def __init__(
        self,
        topo: Topology,
        free: Sequence[int],
        size: int,
        must: Sequence[int],
        free_counts: dict[int, list[int]],
        meter: _Meter,
    ) -> None:
        self.topo = topo
        self.size = size
        self.free_counts = free_counts
        self.meter = meter
        self.covers = Covers(topo, meter.tick)
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
        self.free_mask = sum(1 << c for c, cap in enumerate(self.cap) if cap)
        self.adjacent = topo.class_adjacent
        self.must_mask = sum(1 << c for c, need in enumerate(self.need) if need)
        # per level, fine first: the groups of each class (leftovers per class)
        self.class_groups_of = {
            lv: tuple(topo.groups_of[lv][members[0]] for members in topo.classes)
            for lv in _LEVELS_FINE_FIRST
        }
        # what keys and leftover bounds cost: the link groups of the node, and per class
        # the groups that contain it (memberships)
        self.groups = sum(len(topo.groups[lv]) for lv in _LEVELS_FINE_FIRST)
        self.memberships = [
            sum(len(self.class_groups_of[lv][c]) for lv in _LEVELS_FINE_FIRST)
            for c in range(len(topo.classes))
        ]
        self.best: tuple[Key, list[int]] | None = None
        self.targets: tuple[int, ...] = ()
        self._set_order(set())

    def _set_order(self, first: set[int]) -> None:
        """Branching order: must classes, then ``first`` (the best set's GPUs, so the
        search starts next to it), then the largest free counts, lowest positions."""
        self.order = sorted(
            bits(self.free_mask),
            key=lambda c: (-self.need[c], c not in first, -self.cap[c], self.units[c][0]),
        )

    # -- keys ---------------------------------------------------------------------------
    def _capacity(self, mask: int) -> int:
        return sum(self.cap[c] for c in bits(mask))

    def _worst(self, mask: int) -> int:
        worst = _SELF
        for c in bits(mask):
            worst = self._worst_with(worst, mask, c)
        return worst

    def _worst_with(self, worst: int, mask: int, c: int) -> int:
        """The worst pair level after adding class ``c`` to the classes in ``mask``."""
        rest = mask & ~(1 << c)
        for level in range(worst, -1, -1):
            if rest & ~self.adjacent[level][c] == 0:
                return level
        return 0

    def _spans(self, mask: int, worst: int) -> tuple[int, ...]:
        return tuple(self.covers.exact(lv, mask) for lv in range(worst + 1, _SELF + 1))

    def _key_of(self, counts: dict[int, int], spans: tuple[int, ...], worst: int) -> Key:
        chosen: list[int] = []
        leftover = []
        for lv in _LEVELS_FINE_FIRST:
            left = list(self.free_counts[lv])
            of = self.class_groups_of[lv]
            for c, k in counts.items():
                for g in of[c]:
                    left[g] -= k
            leftover.append(tuple(sorted(-x for x in left)))
        for c, k in counts.items():
            chosen.extend(self.units[c][:k])
        return (-worst, spans, tuple(leftover), tuple(sorted(chosen)))

    def _offer(self, counts: dict[int, int], mask: int, worst: int) -> None:
        self.meter.tick(1 + (self.groups + 4 * len(counts)) // 16)
        key = self._key_of(counts, self._spans(mask, worst), worst)
        if self.best is None or key < self.best[0]:
            self._set_best(key)

    def _set_best(self, key: Key) -> None:
        self.best = (key, list(key[3]))
        self.targets = key[1]  # its cover numbers, what phase 1 has to beat or tie

    def _compare(self, mask: int, worst: int) -> int:
        """Criteria 1-2 of ``mask`` (exact cover numbers, searched only as far as the
        comparison needs) against the best set's: -1 better, 0 tied, 1 worse."""
        assert self.best is not None
        best_key = self.best[0]
        if -worst != best_key[0]:
            return -1 if -worst < best_key[0] else 1
        covers = self.covers
        for i, level in enumerate(range(worst + 1, _SELF + 1)):
            target = best_key[1][i]
            if not covers.fits(level, mask, target):
                return 1
            if covers.fits(level, mask, target - 1):
                return -1
        return 0

    # -- the floor and the seeds: greedy inside one maximal clique of the best level -----
    def _best_level_cliques(self) -> tuple[int, list[int]]:
        """The best feasible worst level and its cliques that can hold the request."""
        for level in range(_SELF, int(LinkKind.SYS) - 1, -1):
            found = [
                group & self.free_mask
                for group in self.topo.group_masks[level]
                if not self.must_mask & ~group and self._capacity(group) >= self.size
            ]
            if found:
                return level, found
        raise AllocationError("no feasible set")  # pragma: no cover - _validate

    def _grow(self, pool: int, level: int, counted: bool = False
              ) -> tuple[dict[int, int], int]:
        """Greedy set inside ``pool`` (a clique of ``level``): its unit counts per class
        and its class mask. GPUs join one at a time: at each finer level, coarse to fine,
        those inside a group already opened there if any; else those with a group that
        fits best what is still needed (the smallest room that holds it, else the
        largest room), which the GPU then opens; last the most free units, the lowest
        position. The groups opened per level bound the set's cover numbers.
        ``counted`` (a seed): its work is charged to the meter, one step per
        ``_GROW_PER_STEP`` (GPU, link group) pairs looked at."""
        levels = range(level + 1, _SELF + 1)
        opened = dict.fromkeys(levels, 0)  # per level: the classes of the groups opened
        room: dict[int, dict[int, int]] = {lv: {} for lv in levels}  # per group: free
        looked = 0  # (GPU, link group) pairs looked at, the work of a growth
        for c in bits(pool):
            for lv in levels:
                per_group = room[lv]
                for g in self.class_groups_of[lv][c]:
                    per_group[g] = per_group.get(g, 0) + self.cap[c]
                looked += len(self.class_groups_of[lv][c])
        mask = capacity = 0
        added: list[int] = []

        def fit(lv: int, c: int, needed: int) -> tuple[tuple[int, int], int]:
            """How well the best group of ``c`` at ``lv`` fits ``needed`` (smaller is
            better), and that group."""
            return min(
                ((0, r) if r >= needed else (1, -r), g)
                for g, r in ((g, room[lv][g]) for g in self.class_groups_of[lv][c])
            )

        def add(c: int) -> None:
            nonlocal mask, capacity
            needed = self.size - capacity
            for lv in levels:
                if not opened[lv] >> c & 1:
                    opened[lv] |= self.topo.group_masks[lv][fit(lv, c, needed)[1]] & pool
                for g in self.class_groups_of[lv][c]:
                    room[lv][g] -= self.cap[c]
            mask |= 1 << c
            capacity += self.cap[c]
            added.append(c)

        for c in bits(self.must_mask):
            add(c)
        while capacity < self.size:
            candidates = pool & ~mask
            for lv in levels:
                if candidates & opened[lv]:
                    candidates &= opened[lv]
                    continue
                needed = self.size - capacity
                fits = {c: fit(lv, c, needed)[0] for c in bits(candidates)}
                looked += sum(len(self.class_groups_of[lv][c]) for c in fits)
                best = min(fits.values())
                candidates = sum(1 << c for c, value in fits.items() if value == best)
            if counted:
                self.meter.tick(looked // _GROW_PER_STEP)
                looked %= _GROW_PER_STEP
            add(min(bits(candidates), key=lambda c: (-self.cap[c], self.units[c][0])))
        counts = {c: self.cap[c] for c in added}
        surplus = capacity - self.size
        for c in reversed(added):  # the last GPUs added give back the surplus
            give = min(surplus, self.cap[c] - max(self.need[c], 1))
            counts[c] -= give
            surplus -= give
        return counts, mask

    def floor(self, counts: dict[int, int], mask: int) -> None:
        """Offer a set that must stand whatever the budget: when its exact cover numbers
        do not fit, first-fit clique covers (upper bounds) stand in for them, and the cut
        goes on up."""
        worst = self._worst(mask)
        try:
            self._offer(counts, mask, worst)
        except _Cut:
            levels = range(worst + 1, _SELF + 1)
            spans = tuple(self.covers.first_fit(lv, mask) for lv in levels)
            key = self._key_of(counts, spans, worst)
            self._set_best(key)
            raise

    def everything(self) -> SearchResult:
        """The answer when the request takes every free unit: the only feasible set, so
        optimal without search (only its key's cover numbers may be cut short)."""
        with contextlib.suppress(_Cut):
            self.floor({c: self.cap[c] for c in bits(self.free_mask)}, self.free_mask)
        assert self.best is not None
        key, chosen = self.best
        return SearchResult(chosen, key, True, self.meter.steps)

    def greedy(self) -> tuple[int, list[int]]:
        """Offer the floor (grown in the roomiest clique of the best level); returns that
        level and its other cliques that can hold the request (the seeds)."""
        level, cliques = self._best_level_cliques()
        roomiest = max(cliques, key=lambda m: (self._capacity(m), -m))
        self.floor(*self._grow(roomiest, level))
        return level, [m for m in cliques if m != roomiest]

    def _seed(self, level: int, cliques: list[int]) -> None:
        for pool in cliques:
            self.meter.tick(1 + 2 * popcount(pool))
            counts, mask = self._grow(pool, level, counted=True)
            worst = self._worst(mask)
            if self._compare(mask, worst) <= 0:
                self._offer(counts, mask, worst)

    # -- phase 1: which GPUs ------------------------------------------------------------
    def run(self) -> SearchResult:
        complete = True
        try:
            level, seeds = self.greedy()
            self._seed(level, seeds)
            self.level = level
            # first the best criteria 1-2 (ties pruned), then the best criteria 3-4 among
            # the sets that reach them (ties explored)
            for strict in (True, False):
                self.strict = strict
                self._phase_one()
        except _Cut:
            complete = False
        assert self.best is not None
        key, chosen = self.best
        return SearchResult(chosen, key, complete, self.meter.steps)

    def _phase_one(self) -> None:
        assert self.best is not None
        self._set_order({self.topo.class_of[u] for u in self.best[1]})
        # per position of the order: the later positions linked to it at the best level
        # (a set stays inside a clique of that level: it is its worst level)
        position = {c: p for p, c in enumerate(self.order)}
        self.linked = [
            sum(1 << position[d] for d in bits(self.adjacent[self.level][c] & self.free_mask))
            & ~((2 << p) - 1)
            for p, c in enumerate(self.order)
        ]
        # per level finer than the best one: the fewest groups whose free units can hold
        # the request, a lower bound of every feasible set's cover number
        below = range(self.level + 1, _SELF + 1)
        self.fewest = tuple(self._fewest_groups(lv) for lv in below)
        self.adjacent_below = tuple(self.adjacent[lv] for lv in below)
        everything = (1 << len(self.order)) - 1
        self._masks(0, 0, (0,) * len(below), everything, sum(self.cap))

    def _fewest_groups(self, level: int) -> int:
        free = sorted((self._capacity(g) for g in self.topo.group_masks[level]), reverse=True)
        held = 0
        for count, room in enumerate(free, start=1):
            held += room
            if held >= self.size:
                return count
        return len(free)  # pragma: no cover - the request fits the free units

    def _masks(
        self, mask: int, capacity: int, apart: tuple[int, ...], allowed: int, room: int
    ) -> None:
        """Phase 1: extend ``mask`` (classes) with classes at the positions ``allowed``
        (of the order: later than any chosen one, linked at the best level to every chosen
        one), which hold ``room`` free units. ``apart`` holds per level finer than the
        best one, coarse first, classes of ``mask`` no two of which share a group there:
        their number is a lower bound of the mask's cover number, kept as classes are
        added.

        Every feasible set has the best level as its worst (no set is better, and it
        lies in a clique of that level), so criteria 1-2 compare on cover numbers only."""
        self.meter.tick()
        # criteria 1-2 by the lower bounds: a bound lexicographically larger than the
        # best set's cover numbers proves every superset worse; equal, not better
        for target, ind, fewest in zip(self.targets, apart, self.fewest):
            bound = popcount(ind)
            if bound < fewest:
                bound = fewest
            if bound != target:
                if bound > target:
                    return
                break
        else:
            if self.strict:
                return
        if capacity >= self.size and mask & self.must_mask == self.must_mask:
            verdict = self._compare(mask, self.level)  # exact cover numbers
            if verdict < 0 or (verdict == 0 and not self.strict):
                self._spread(mask, capacity - self.size, self.level, verdict)
            return  # a superset touches one more GPU: worse by criterion 2
        if capacity + room < self.size:
            return
        low = allowed & -allowed
        p = low.bit_length() - 1
        c = self.order[p]
        rest = allowed ^ low
        bit = 1 << c
        joined = tuple(
            ind if adjacent[c] & ind else ind | bit
            for adjacent, ind in zip(self.adjacent_below, apart)
        )
        apart_from_c = rest & ~self.linked[p]
        self._masks(
            mask | bit,
            capacity + self.cap[c],
            joined,
            rest & self.linked[p],
            room - self.cap[c] - sum(self.cap[self.order[q]] for q in bits(apart_from_c)),
        )
        if not self.need[c]:
            self._masks(mask, capacity, apart, rest, room - self.cap[c])

    # -- phase 2: how many units of each ------------------------------------------------
    def _leftover_bound(self, mask: int) -> tuple[tuple[int, ...], ...]:
        """A lower bound of criterion 3 for any spread over ``mask``: each group keeps at
        most its free units minus what it must give (one unit, or the must-include ones,
        per GPU of the mask in it; and what the rest of the mask cannot supply)."""
        capacity = self._capacity(mask)
        out = []
        for level in _LEVELS_FINE_FIRST:
            counts = self.free_counts[level]
            given: dict[int, list[int]] = {}  # per group touched: [units given, capacity]
            of = self.class_groups_of[level]
            for c in bits(mask):
                for g in of[c]:
                    entry = given.setdefault(g, [0, 0])
                    entry[0] += max(self.need[c], 1)
                    entry[1] += self.cap[c]
            bound = [-count for count in counts]
            for g, (units, in_cap) in given.items():
                bound[g] += max(units, self.size - (capacity - in_cap))
            out.append(tuple(sorted(bound)))
        return tuple(out)

    def _spread(self, mask: int, slack: int, worst: int, verdict: int) -> None:
        best = self.best
        assert best is not None
        if verdict == 0:
            held = sum(self.memberships[c] for c in bits(mask))
            self.meter.tick(1 + (self.groups + 4 * held) // 16)
            if self._leftover_bound(mask) > best[0][2]:
                return  # criteria 1-2 tie the best set; no spread here beats its leftovers
        classes = [c for c in self.order if mask >> c & 1]
        room = [self.cap[c] - max(self.need[c], 1) for c in classes]
        counts = {c: self.cap[c] for c in classes}
        self._spread_from(classes, room, 0, slack, counts, mask, worst)

    def _spread_from(
        self,
        classes: list[int],
        room: list[int],
        i: int,
        slack: int,
        counts: dict[int, int],
        mask: int,
        worst: int,
    ) -> None:
        if slack == 0:
            self._offer(counts, mask, worst)
            return
        if i == len(classes) or sum(room[i:]) < slack:
            return
        c = classes[i]
        for keep in range(min(room[i], slack), -1, -1):
            counts[c] = self.cap[c] - keep
            self._spread_from(classes, room, i + 1, slack - keep, counts, mask, worst)
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
