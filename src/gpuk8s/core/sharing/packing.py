"""Packing math: how much free GPU capacity a node strands against a request mix.

=====================  =============================================================
``ShareMix``           the request classes (GPUs, percent, CPU, memory) with weights,
                       and the LP packing prices of its fractional sizes
``Room``               a node's free CPU and memory, and what the pod asks of both
``node_fragmentation`` free GPU capacity no class of the mix can use (Gandiva/FGD)
``whole_homes``        per whole-GPU class: how many of its pods the node can still take
                       (``class_homes`` for one class, ``wholly_free`` GPUs)
``whole_scarcity``     per whole-GPU class whose homes run out: a weight factor
``filled``, ``fill_stranded``, ``fill_taken``: the node filled with each class alone
``cpu_balance``, ``spare_cpu``, ``gpus_per_core``: free CPU against free GPUs
=====================  =============================================================

Example: with the mix ``{(1, 50, 0, 0): 1.0}`` (half-GPU pods only) a node whose GPUs
have 100 and 30 percent free strands the 30: ``node_fragmentation([100, 30], NO_ROOM,
mix) == 30.0``.
"""

from __future__ import annotations

import copy
import math
from bisect import bisect_right
from typing import Mapping, NamedTuple, Sequence, Tuple

from ..binpack import NO_PRICES, Prices, bin_prices
from .names import FULL_CORE

# the request mix when nothing has been seen yet: percent of a GPU -> weight
DEFAULT_SHARE_MIX: tuple[tuple[int, float], ...] = ((25, 1.0), (50, 1.0), (100, 1.0))
MIX_CLASSES = 64  # request classes kept in a ShareMix (the heaviest)
# share sizes (percent) the mix's LP packing prices, the heaviest: the LP's time grows
# steeply with them (24 sizes: under 0.1 s at worst, 32: seconds -- too long for a call
# kube-scheduler waits on); a size left out is worth nothing in it
PRICED_SIZES = 24
BALANCE_MIN_FREE = 5  # percent: a node keeping less GPU capacity has no CPU balance
# in ``cpu_balance``, a core short of what a node's free GPUs need counts this many
# cores in excess: a core short strands GPU capacity, a core in excess only CPU
BALANCE_SHORT = 4.0
# a request class: (GPUs, percent of each GPU -- 100 for whole GPUs --, CPU millicores,
# memory MiB)
ShareClass = Tuple[int, int, int, int]


class Room(NamedTuple):
    """A node's free CPU millicores and memory MiB (None: not known, limits nothing)
    and what the pod to place asks of both."""

    cpu: int | None = None
    memory: int | None = None
    pod_cpu: int = 0
    pod_memory: int = 0

    def after(self) -> Room:
        """The node's room once the pod runs there."""
        return Room(
            None if self.cpu is None else self.cpu - self.pod_cpu,
            None if self.memory is None else self.memory - self.pod_memory,
        )


NO_ROOM = Room()  # nothing known about CPU or memory: they limit nothing


class ShareMix:
    """The request mix that fragmentation is measured against: request classes
    ``(GPUs, percent, CPU millicores)`` with weights (the ``MIX_CLASSES`` heaviest).

    ``prices``: the fewest-GPUs packing of the mix's fractional shares as the
    configuration LP finds it (``core.binpack.bin_prices``; a class of ``k`` GPUs counts
    ``k`` shares of its percent; the ``PRICED_SIZES`` heaviest sizes): what one GPU's
    worth each share size is in a packing of the mix as tight as the LP allows.
    ``Prices.waste`` says what a placement loses for good against that packing.

    Precomputed per CPU threshold (the classes' distinct CPU requests), so that
    ``node_fragmentation`` costs one bisection plus one step per GPU: the weight of the
    classes a node's free CPU cannot feed, per free percent of a GPU the weight of the
    fractional classes that ask for more, and per whole-GPU count its weight. Memory,
    rarely short, is checked per class from the largest request down."""

    def __init__(
        self,
        weights: Mapping[ShareClass, float],
        limit: int = MIX_CLASSES,
        cpu_per_gpu: float | None = None,
    ) -> None:
        # CPU millicores per GPU that the arriving GPU pods ask for (``cpu_balance``;
        # None: not known, no balance term)
        self.cpu_per_gpu = cpu_per_gpu
        ranked = sorted(
            ((w, c) for c, w in weights.items() if w > 0 and c[0] > 0 and 0 < c[1] <= FULL_CORE),
            key=lambda item: (-item[0], item[1]),
        )[:limit]
        total = sum(w for w, _ in ranked)
        self.classes: tuple[tuple[ShareClass, float], ...] = tuple(
            (c, w / total) for w, c in ranked
        )
        self.sizes: tuple[int, ...] = tuple(
            sorted({c[0] for c, _ in self.classes if c[1] >= FULL_CORE})
        )
        # thresholds: CPU values at which the set of classes a node can feed changes
        self.cpus: tuple[int, ...] = tuple(sorted({max(c[2], 0) for c, _ in self.classes}))
        # every CPU and memory value a class asks (``room_key``)
        self.cpu_points: tuple[int, ...] = tuple(
            sorted({*self.cpus, *(c[2] for c, _ in self.classes)}))
        self.memory_points: tuple[int, ...] = tuple(sorted({c[3] for c, _ in self.classes}))
        self._tables([w for _, w in self.classes], 1.0)
        # whole-GPU classes (index in ``classes``) and, per one, the whole-GPU classes of
        # its GPU count whose pods fit only where it fits too (as much CPU and memory or
        # more: their homes are among its homes), itself included (``whole_scarcity``)
        self.wholes: tuple[int, ...] = tuple(
            at for at, (c, _) in enumerate(self.classes) if c[1] >= FULL_CORE
        )
        self.nests: tuple[tuple[int, ...], ...] = tuple(
            tuple(
                j
                for j in self.wholes
                if self.classes[j][0][0] == self.classes[i][0][0]
                and self.classes[j][0][2] >= self.classes[i][0][2]
                and self.classes[j][0][3] >= self.classes[i][0][3]
            )
            for i in self.wholes
        )
        self.nest_weights: tuple[float, ...] = tuple(
            sum(self.classes[j][1] for j in nest) for nest in self.nests
        )
        # per whole-GPU class: the nests it is in (positions in ``wholes``)
        self.within: tuple[tuple[int, ...], ...] = tuple(
            tuple(n for n, nest in enumerate(self.nests) if i in nest) for i in self.wholes
        )
        # GPUs per pod of the mix (a share counts its percent)
        self.per_pod = sum(w * k * pct / FULL_CORE for (k, pct, _, _), w in self.classes)

        demand: dict[int, float] = {}
        for (k, pct, _, _), w in self.classes:
            if pct < FULL_CORE:
                demand[pct] = demand.get(pct, 0.0) + w * k
        priced = sorted(demand.items(), key=lambda item: (-item[1], item[0]))[:PRICED_SIZES]
        self.prices: Prices = bin_prices(dict(priced), FULL_CORE) if priced else NO_PRICES

    def __bool__(self) -> bool:
        return bool(self.classes)

    def room_key(self, cpu: int | None, memory: int | None) -> tuple[int | None, int | None]:
        """Where free ``cpu`` and ``memory`` (None: not known) fall among the values
        the classes ask: ``node_fragmentation`` compares the room with those values
        only, so rooms with one key give it the same answer (the weights do not
        count: a ``scaled`` mix has the same key)."""
        return (None if cpu is None else bisect_right(self.cpu_points, cpu),
                None if memory is None else bisect_right(self.memory_points, memory))

    def _tables(self, weights: Sequence[float], total: float) -> None:
        """The per-threshold tables for the classes weighted by ``weights`` (in the
        order of ``classes``; ``total``: their sum)."""
        self.starved: list[float] = []  # per threshold: weight of classes needing more CPU
        self.partial: list[list[float]] = []  # per threshold, per free %: weight stranded
        self.whole: list[tuple[float, ...]] = []  # per threshold, per size in ``sizes``
        by_cpu = sorted(
            ((c, w) for (c, _), w in zip(self.classes, weights)), key=lambda item: item[0][2]
        )
        per = [0.0] * (FULL_CORE + 1)
        whole = dict.fromkeys(self.sizes, 0.0)
        fed = 0.0
        at = 0
        for cpu in self.cpus:
            while at < len(by_cpu) and by_cpu[at][0][2] <= cpu:
                (k, pct, _, _), w = by_cpu[at]
                if pct < FULL_CORE:
                    for free in range(pct):
                        per[free] += w
                else:
                    whole[k] += w
                fed += w
                at += 1
            self.starved.append(max(0.0, total - fed))
            self.partial.append(list(per))
            self.whole.append(tuple(whole[k] for k in self.sizes))
        # (memory, CPU, GPUs, percent, weight), the largest memory first
        self.by_memory: tuple[tuple[int, int, int, int, float], ...] = tuple(
            sorted(((c[3], c[2], c[0], c[1], w) for (c, _), w in zip(self.classes, weights)),
                   reverse=True)
        )

    def scaled(self, factors: Mapping[ShareClass, float]) -> ShareMix:
        """This mix with the weight of each class in ``factors`` (a ``whole_scarcity``
        result) multiplied by its factor where fragmentation is measured
        (``node_fragmentation``); the classes, their shares and the prices stay.
        ``self`` when no factor differs from 1."""
        if all(f == 1.0 for f in factors.values()):
            return self
        out = copy.copy(self)
        weights = [w * factors.get(c, 1.0) for c, w in self.classes]
        out._tables(weights, sum(weights))
        return out


def wholly_free(free: Sequence[int]) -> int:
    """How many of the GPUs with ``free`` percent free are wholly free."""
    return sum(1 for f in free if f >= FULL_CORE)


def class_homes(full: int, cpu: int | None, memory: int | None, klass: ShareClass) -> int:
    """How many pods of the whole-GPU class ``klass`` a node with ``full`` wholly free
    GPUs could take at once, as far as its free CPU millicores and memory MiB (None:
    not known, limits nothing) feed them."""
    k, _, need_cpu, need_memory = klass
    homes = full // k
    if homes and cpu is not None and need_cpu > 0:
        homes = min(homes, max(cpu, 0) // need_cpu)
    if homes and memory is not None and need_memory > 0:
        homes = min(homes, max(memory, 0) // need_memory)
    return homes


def whole_homes(free: Sequence[int], room: Room, mix: ShareMix) -> tuple[int, ...]:
    """Per whole-GPU class of the mix (``mix.wholes``): how many of its pods the node
    could take at once -- its wholly free GPUs over the class's count, as far as its
    free CPU and memory (``room``; None: not known, limits nothing) feed them
    (``class_homes``)."""
    full = wholly_free(free)
    if not full:
        return (0,) * len(mix.wholes)
    return tuple(class_homes(full, room.cpu, room.memory, mix.classes[at][0])
                 for at in mix.wholes)


def poisson_tail(mean: float, k: int) -> float:
    """P(X >= ``k``) for X Poisson with ``mean``: summed from ``k`` up where ``k`` is
    above the mean, else one less the sum from ``k - 1`` down, each while its terms
    still count (the pmf falls away from the mean both ways)."""
    if k <= 0:
        return 1.0
    if mean <= 0:
        return 0.0
    if k > mean:  # the upper tail, summed up from k while its terms matter
        n = k
        term = math.exp(-mean + n * math.log(mean) - math.lgamma(n + 1))
        total = 0.0
        while term > 1e-15 * total or total == 0.0:
            total += term
            n += 1
            term *= mean / n
            if term == 0.0:
                break
        return min(1.0, total)
    n = k - 1  # one less the lower tail, summed down from k - 1
    term = math.exp(-mean + n * math.log(mean) - math.lgamma(n + 1))
    total = 0.0
    while n >= 0 and (term > 1e-15 * total or total == 0.0):
        total += term
        term *= n / mean
        n -= 1
        if term == 0.0:
            break
    return max(0.0, 1.0 - total)


def whole_scarcity(homes: Sequence[int], free: int, mix: ShareMix) -> dict[ShareClass, float]:
    """Per whole-GPU class of the mix: how much more than its share of the arrivals a
    home of the class is worth, as a factor over 1 (``ShareMix.scaled``); classes
    whose homes are not at risk are left out. ``homes``: per class of ``mix.wholes``,
    the sum over the nodes of ``whole_homes``; ``free``: the nodes' free GPU capacity
    in percent.

    The pods still to come are those that fill the free capacity at the mix's GPUs per
    pod; how many of them belong to a class is Poisson with the class's share of them
    as its mean (the arrivals are drawn one by one from the mix). FGD's measure weighs
    a class by its share: the chance that the *next* pod is one of it. A home is lost
    for good when any later pod needs it, so breaking one, by its GPUs or by the CPU
    or memory that feeds it, costs a pod of the class with the chance that its pods to
    come need every home left (``poisson_tail``): about nothing while the homes are
    many, one half when they are just enough, nearly one when they are too few. That
    chance over the class's share is the factor, where it is over 1. A class counts
    together with the classes of its GPU count that need at least its CPU and memory
    (its nest, ``mix.nests``): their homes are among its homes. Each class takes the
    largest factor of the nests it is in (``mix.within``). Rounded to quarter steps of
    a doubling, so that it moves (and placements memoised against it change) only when
    the chance does."""
    if not mix.wholes or mix.per_pod <= 0:
        return {}
    to_come = free / FULL_CORE / mix.per_pod
    # per nest: the chance that its pods to come need every home it has left, over its
    # weight in the mix (no home left: nothing to break)
    shorts = [
        poisson_tail(weight * to_come, count) / weight if count and weight > 0 else 0.0
        for weight, count in zip(mix.nest_weights, homes)
    ]
    out: dict[ShareClass, float] = {}
    for at, within in zip(mix.wholes, mix.within):
        short = max(shorts[n] for n in within)
        if short > 1.0:
            factor = 2.0 ** (round(4 * math.log2(short)) / 4)
            if factor != 1.0:
                out[mix.classes[at][0]] = factor
    return out


def node_fragmentation(free: Sequence[int], room: Room, mix: ShareMix) -> float:
    """FGD's fragmentation of a node (Weng et al., ATC '23), in percent of a GPU: for
    each request class of the mix, the free GPU capacity on the node that the class
    cannot use, weighted by the class's share. ``free``: percent free per GPU that a
    share may use (0..100); ``room``: the node's free CPU and memory (None: not known,
    limits nothing).

    A class the free CPU or memory cannot feed can use nothing here (all free capacity
    is a fragment); a fractional class cannot use a GPU with less free than it asks; a
    class of ``k`` whole GPUs cannot use partly taken GPUs, nor any GPU when fewer than
    ``k`` are wholly free."""
    total = sum(free)
    if total <= 0 or not mix.classes:
        return 0.0
    cpu, memory = room.cpu, room.memory
    if cpu is None:
        at = len(mix.cpus) - 1
    else:
        at = bisect_right(mix.cpus, cpu) - 1
        if at < 0:
            return float(total)  # no class can be fed
    partial = mix.partial[at]
    lost = mix.starved[at] * total
    taken = 0
    full = 0
    for f in free:
        if f >= FULL_CORE:
            full += 1
        elif f > 0:
            lost += f * partial[f]
            taken += f
    for k, w in zip(mix.sizes, mix.whole[at]):
        if w:
            lost += w * (total if full < k else taken)
    if memory is not None:  # classes counted as fed above that the memory cannot feed
        for need, c, k, pct, w in mix.by_memory:
            if need <= memory:
                break
            if cpu is not None and c > cpu:
                continue  # already counted as starved
            if pct < FULL_CORE:
                used = sum(f for f in free if 0 < f < pct)
            else:
                used = total if full < k else taken
            lost += w * (total - used)
    return lost


def cpu_balance(free: int, room: Room, cpu_per_gpu: float | None) -> float:
    """How far a node's free CPU is from what its free GPU capacity will need, in
    cores: ``need = cpu_per_gpu x free GPUs``; cores short of ``need`` count
    ``BALANCE_SHORT`` each, cores over it one each (``free``: percent free over its
    GPUs, ``room``: its free CPU; both after the pod). A node left with GPUs but too
    little CPU for them strands the GPUs (the pods that arrive ask about
    ``cpu_per_gpu`` per GPU, many more); one left with much more CPU than its GPUs
    need holds CPU that GPU-dense nodes lack, which costs less: pods without GPUs can
    still use it. 0 when the CPU or the ratio is not known, or the node keeps (almost)
    no GPU capacity."""
    over = spare_cpu(free, room, cpu_per_gpu)
    if over is None or free <= BALANCE_MIN_FREE:
        return 0.0
    return over if over >= 0 else -BALANCE_SHORT * over


def spare_cpu(free: int, room: Room, cpu_per_gpu: float | None) -> float | None:
    """A node's free CPU beyond what its free GPU capacity will need, in cores (negative:
    short): ``room.cpu - cpu_per_gpu x free GPUs`` (``free``: percent free over its
    GPUs). None when the CPU or the ratio is not known."""
    if room.cpu is None or cpu_per_gpu is None:
        return None
    return (room.cpu - cpu_per_gpu * free / FULL_CORE) / 1000


def gpus_per_core(free: int, room: Room) -> float | None:
    """The free GPU capacity a node keeps per free core of CPU, in GPUs per core: what
    each core left there must still feed (``free``: percent free over its GPUs;
    ``room``: its free CPU). 0 when no GPU capacity is free, whatever the CPU; None
    when the CPU is not known. A pod without GPUs taking CPU where this stays lowest
    strands the least GPU capacity per core it takes, with no CPU-per-GPU threshold:
    the nodes' own free CPU and GPUs decide."""
    if room.cpu is None:
        return None
    if free <= 0:
        return 0.0
    return (free / FULL_CORE) / (max(room.cpu, 1) / 1000)


class Filled(NamedTuple):
    """A node filled with each class of a mix alone (``filled``): the free GPU capacity
    left unused, weighted (``fill_stranded``), and what ``fill_taken`` needs to tell how
    much more a pod's CPU and memory would leave unused."""

    lost: float
    pods: tuple[int, ...]  # per class of ``mix.classes``: the pods that fill the node
    # (CPU millicores those pods ask, class), the most first; memory MiB likewise
    cpu_bound: tuple[tuple[int, int], ...] = ()
    memory_bound: tuple[tuple[int, int], ...] = ()


def _each(klass: ShareClass) -> int:
    """Percent of a GPU one pod of the class takes."""
    return klass[0] * FULL_CORE if klass[1] >= FULL_CORE else klass[1]


def _fed(n: int, room: Room, klass: ShareClass) -> int:
    """At most ``n`` pods of the class: as many as the room's CPU and memory feed."""
    if n and room.cpu is not None and klass[2] > 0:
        n = min(n, max(room.cpu, 0) // klass[2])
    if n and room.memory is not None and klass[3] > 0:
        n = min(n, max(room.memory, 0) // klass[3])
    return n


def filled(free: Sequence[int], room: Room, mix: ShareMix) -> Filled:
    """``fill_stranded`` and the pods per class behind it."""
    total = sum(free)
    if total <= 0 or not mix.classes:
        return Filled(0.0, (0,) * len(mix.classes))
    cpu, memory = room.cpu, room.memory
    full = sum(1 for f in free if f >= FULL_CORE)
    slots: dict[int, int] = {}
    lost = 0.0
    pods: list[int] = []
    cpu_bound: list[tuple[int, int]] = []
    memory_bound: list[tuple[int, int]] = []
    for at, (klass, w) in enumerate(mix.classes):
        k, pct, c, m = klass
        if pct >= FULL_CORE:
            n = full // k
        else:
            got = slots.get(pct)
            if got is None:
                got = slots[pct] = sum(f // pct for f in free)
            n = got
        n = _fed(n, room, klass)
        lost += w * (total - n * _each(klass))
        pods.append(n)
        if n and cpu is not None and c > 0:
            cpu_bound.append((n * c, at))
        if n and memory is not None and m > 0:
            memory_bound.append((n * m, at))
    cpu_bound.sort(reverse=True)
    memory_bound.sort(reverse=True)
    return Filled(lost, tuple(pods), tuple(cpu_bound), tuple(memory_bound))


def fill_stranded(free: Sequence[int], room: Room, mix: ShareMix) -> float:
    """The free GPU capacity of a node that pods of one class could not use if the node
    were filled with that class alone, weighted over the mix's classes, in percent of a
    GPU. A class fills as many pods as the fewest of: its GPU slots (a fractional class:
    per GPU, the free percent over what it asks, rounded down; ``k`` whole GPUs: the
    wholly free GPUs over ``k``), the free CPU over its CPU, the free memory over its
    memory (``room``: None limits nothing). Unlike ``node_fragmentation``, which asks only
    whether one more pod fits, this sees CPU that feeds some but not all of the free GPUs:
    an empty 8-GPU node whose cores fall below what one 8-GPU pod asks loses its whole
    use to that class."""
    return filled(free, room, mix).lost


def fill_taken(before: Filled, after: Room, mix: ShareMix) -> float:
    """``fill_stranded`` with the node's room ``after`` a pod minus ``before.lost`` (the
    same free GPUs, ``before`` made with the room before it): the GPU capacity the pod's
    CPU and memory take out of use. Only the classes whose pods need more CPU or memory
    than is left are looked at (usually none), so this costs far less than a second
    ``fill_stranded``."""
    hit: set[int] = set()
    for left, bound in ((after.cpu, before.cpu_bound), (after.memory, before.memory_bound)):
        if left is None:
            continue
        for need, at in bound:
            if need <= max(left, 0):
                break
            hit.add(at)
    taken = 0.0
    for at in sorted(hit):
        klass, w = mix.classes[at]
        had = before.pods[at]
        taken += w * (had - _fed(had, after, klass)) * _each(klass)
    return taken

