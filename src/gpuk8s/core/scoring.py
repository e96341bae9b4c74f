"""How good and how costly a placement is, for the scheduler extender (SPEC §5 gpuAware).

Two numbers per node and pod, combined by gpu-aware as
``scoreWeight·score − lossWeight·LOSS_POINTS_PER_GPU·loss``:

* ``score`` (0..100) -- how fast the ``k`` GPUs the allocator would give the pod
  communicate: the worst pair level inside that set, mapped by ``LEVEL_SCORE`` (one
  GPU or MetaXLink 100, PCIe switch 60, NUMA node 30, system 10).
* ``loss`` (in GPUs) -- how much the placement fragments the cluster, in the manner of
  FGD (Weng et al., ATC '23): the *expected number of free GPUs that the pods the
  cluster runs could no longer use*, after the placement minus before it, plus two
  small packing terms (below).

Fragmentation of a node for a pod mix. A mix is a set of pod shapes (GPUs, CPU,
memory) with shares (the share of requested GPUs that pods of that shape ask for, so
one 8-GPU job weighs as much as eight 1-GPU pods). For a shape of ``k`` GPUs, the
free GPUs it can *use* on a node are those it could take ``k`` at a time inside one
link group -- the groups in which an empty node of that layout would place ``k`` GPUs
(``LinkGroups``: MetaXLink groups for k ≤ 4 on a C500 node, the whole node for 8) --
and only as many copies as the node's free CPU and memory can feed. Every other free
GPU is a fragment for that shape::

    usable(shape) = min(Σ_groups ⌊free in group / k⌋·k,
                        k·⌊free CPU / cpu⌋, k·⌊free memory / memory⌋)
    fragmentation(node) = Σ_shapes share · (free GPUs − usable(shape))

So breaking a whole link group, or leaving free GPUs next to too little CPU, raises the
loss; filling GPUs that the mix could not have used anyway (the last free GPU of a
small node) lowers it. The packing terms prefer, among placements that fragment alike,
the node that is left with the least room (``ROOM_WEIGHT`` per GPU-equivalent) and the
smallest adequate node (``SIZE_WEIGHT`` per GPU-equivalent of allocatable capacity); a
GPU-equivalent of CPU or memory is what the mix requests per GPU.

For GPU sharing (fractional GPUs, a later change) a room also needs per-GPU free
capacity: ``NodeRoom.usable`` is the one place that answers "how many GPUs can a pod of
this shape use here", and a shape gains a per-GPU share; ``fragmentation`` stays the same
sum.

``topology_tables`` publishes both numbers per request size as node annotations (the
loss there for the default prior mix, without CPU or memory: the node's own view); the
extender recomputes the loss from the device list with the mix it learned and the node's
free CPU and memory.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Tuple  # runtime alias below: Python 3.8

from .allocator import best_set
from .boundedjson import BoundedJsonError, loads_bounded
from .devicelist import DeviceEntry
from .model import DriverInfo, Gpu, LinkKind, NodeInventory
from .topology import LEVELS_BEST_FIRST, Topology, Unit

LEVEL_SCORE: Mapping[LinkKind, int] = {
    LinkKind.SELF: 100,
    LinkKind.MX: 100,
    LinkKind.PIX: 60,
    LinkKind.NODE: 30,
    LinkKind.SYS: 10,
}

SCORES_ANNOTATION = "metax-tech.com/gpu.topology.scores"
LOSSES_ANNOTATION = "metax-tech.com/gpu.topology.losses"
MAX_TABLE_SIZE = 4096  # request sizes beyond any node's device count are ignored
MAX_TABLE_CHARS = 64 * 1024

# score points one GPU of expected fragmentation costs at equal weights: a whole GPU made
# unusable weighs as much as the step from MetaXLink to links across NUMA nodes
LOSS_POINTS_PER_GPU = 10
# a published loss table holds at most this magnitude (every GPU of the largest table lost)
LOSS_LIMIT = (-LOSS_POINTS_PER_GPU * MAX_TABLE_SIZE, LOSS_POINTS_PER_GPU * MAX_TABLE_SIZE)
ROOM_WEIGHT = 0.02  # GPUs of loss per GPU-equivalent left free on the node
SIZE_WEIGHT = 0.02  # GPUs of loss per GPU-equivalent of the node's capacity

# (GPUs, CPU millicores, memory MiB) of a pod; 0 CPU / memory: not known
PodShape = Tuple[int, int, int]
# The prior mix: share of requested GPUs by request size (equal: no size favoured).
DEFAULT_PRIOR: Mapping[int, float] = {1: 1.0, 2: 1.0, 4: 1.0, 8: 1.0}
DEFAULT_PRIOR_GPUS = 64.0  # how many requested GPUs the prior counts as
DEFAULT_MIX_SHAPES = 48  # shapes kept in a mix (the heaviest by GPUs)


# ----------------------------------------------------------------------------- pod mix
@dataclass(frozen=True)
class PodMix:
    """Pod shapes with their share of the requested GPUs (shares sum to 1)."""

    shapes: tuple[PodShape, ...]
    shares: tuple[float, ...]
    cpu_per_gpu: float = 0.0  # mean CPU millicores requested per GPU (0: unknown)
    memory_per_gpu: float = 0.0  # mean memory MiB requested per GPU (0: unknown)
    # per request size: (k, share of all its shapes, largest CPU, largest memory,
    # ((cpu, memory, share), ...)) -- lets ``fragmentation`` skip the shapes of a size
    # at once when the node's CPU and memory cannot limit any of them
    sizes: tuple[tuple[int, float, int, int, tuple[tuple[int, int, float], ...]], ...] = ()

    @classmethod
    def from_gpus(
        cls, gpus: Mapping[PodShape, float], limit: int = DEFAULT_MIX_SHAPES
    ) -> PodMix:
        """The mix of shapes weighted by the GPUs their pods request (the ``limit``
        heaviest shapes; ties by shape, so the result is deterministic)."""
        ranked = sorted(
            ((w, s) for s, w in gpus.items() if w > 0 and s[0] > 0),
            key=lambda item: (-item[0], item[1]),
        )[:limit]
        total = sum(w for w, _ in ranked)
        if total <= 0:
            return cls((), ())
        shapes = tuple(s for _, s in ranked)
        shares = tuple(w / total for w, _ in ranked)
        grouped: dict[int, list[tuple[int, int, float]]] = {}
        for (k, c, m), share in zip(shapes, shares):
            grouped.setdefault(k, []).append((c, m, share))
        sizes = tuple(
            (
                k,
                sum(x[2] for x in members),
                max(x[0] for x in members),
                max(x[1] for x in members),
                tuple(members),
            )
            for k, members in sorted(grouped.items())
        )
        return cls(
            shapes,
            shares,
            _per_gpu(shapes, shares, 1),
            _per_gpu(shapes, shares, 2),
            sizes,
        )

    def equivalent(self, gpus: int, cpu_milli: int | None, memory_mib: int | None) -> float:
        """GPUs plus CPU and memory counted in the GPUs they would feed."""
        value = float(gpus)
        if cpu_milli is not None and self.cpu_per_gpu > 0:
            value += cpu_milli / self.cpu_per_gpu
        if memory_mib is not None and self.memory_per_gpu > 0:
            value += memory_mib / self.memory_per_gpu
        return value


def _per_gpu(shapes: Sequence[PodShape], shares: Sequence[float], field: int) -> float:
    known = [(share, s[field] / s[0]) for s, share in zip(shapes, shares) if s[field] > 0]
    weight = sum(share for share, _ in known)
    return sum(share * v for share, v in known) / weight if weight > 0 else 0.0


def mix_with_prior(
    observed: Mapping[PodShape, float],
    prior: Mapping[int, float] = DEFAULT_PRIOR,
    prior_gpus: float = DEFAULT_PRIOR_GPUS,
    limit: int = DEFAULT_MIX_SHAPES,
) -> PodMix:
    """``observed`` (GPUs requested per shape) plus the prior, which counts as
    ``prior_gpus`` requested GPUs spread over its request sizes (no CPU/memory)."""
    weights: dict[PodShape, float] = {s: w for s, w in observed.items() if s[0] > 0}
    total = sum(v for v in prior.values() if v > 0)
    if total > 0 and prior_gpus > 0:
        for size, share in prior.items():
            if share > 0 and size > 0:
                shape = (size, 0, 0)
                weights[shape] = weights.get(shape, 0.0) + prior_gpus * share / total
    return PodMix.from_gpus(weights, limit)


# ----------------------------------------------------------------------------- rooms
class LinkGroups:
    """For each request size k, the link groups inside which k units get the best link
    that an empty node of this layout offers for k (its "one link group")."""

    def __init__(self, topo: Topology) -> None:
        self.units = len(topo)
        self._comp = topo.comp
        self.level: list[int] = [int(LinkKind.SELF)] * (self.units + 1)  # by k
        for k in range(1, self.units + 1):
            for level in LEVELS_BEST_FIRST:
                if any(len(g) >= k for g in topo.groups[int(level)]):
                    self.level[k] = int(level)
                    break

    def usable(self, free: Iterable[int]) -> tuple[int, ...]:
        """Index 0: free units; index k (1..units): units a k-unit pod can use inside
        link groups, k at a time."""
        members = list(free)
        out = [len(members)]
        counts: dict[int, list[int]] = {}
        for k in range(1, self.units + 1):
            level = self.level[k]
            per_group = counts.get(level)
            if per_group is None:
                tally: dict[int, int] = {}
                comp = self._comp[level]
                for u in members:
                    tally[comp[u]] = tally.get(comp[u], 0) + 1
                per_group = counts[level] = list(tally.values())
            out.append(sum(c - c % k for c in per_group))
        return tuple(out)

    def inside(self, chosen: Sequence[int]) -> bool:
        """True when ``chosen`` lies in one of its size's link groups."""
        comp = self._comp[self.level[len(chosen)]] if chosen else ()
        return len({comp[u] for u in chosen}) <= 1


class NodeRoom(NamedTuple):
    """What a node can still offer. ``usable`` as ``LinkGroups.usable`` returns it;
    CPU and memory free, None when not known (then they limit nothing)."""

    usable: tuple[int, ...]
    cpu_milli: int | None = None
    memory_mib: int | None = None

    @property
    def free(self) -> int:
        return self.usable[0]


def fragmentation(room: NodeRoom, mix: PodMix) -> float:
    """Expected free GPUs the mix cannot use on this node (see the module doc)."""
    usable = room.usable
    free = usable[0]
    if not free:
        return 0.0
    most = len(usable) - 1
    cpu, memory = room.cpu_milli, room.memory_mib
    lost = 0.0
    for k, total, top_cpu, top_memory, members in mix.sizes:
        u = usable[k] if k <= most else 0
        copies = u // k
        if not copies or (
            (cpu is None or cpu >= top_cpu * copies)
            and (memory is None or memory >= top_memory * copies)
        ):
            lost += total * (free - u)  # CPU and memory limit none of these shapes
            continue
        for c, m, share in members:
            n = copies
            if c and cpu is not None and cpu < c * n:
                n = cpu // c
            if m and memory is not None and memory < m * n:
                n = memory // m
            lost += share * (free - n * k)
    return lost


def placement_loss(
    before: NodeRoom,
    after: NodeRoom,
    mix: PodMix,
    capacity: tuple[int, int | None, int | None],
    before_fragmentation: float | None = None,
) -> float:
    """The loss (GPUs) of moving a node from ``before`` to ``after``; ``capacity`` is
    the node's (units, allocatable CPU, allocatable memory) for the size term."""
    base = fragmentation(before, mix) if before_fragmentation is None else before_fragmentation
    return (
        fragmentation(after, mix)
        - base
        + ROOM_WEIGHT * mix.equivalent(after.free, after.cpu_milli, after.memory_mib)
        + SIZE_WEIGHT * mix.equivalent(*capacity)
    )


# ----------------------------------------------------------------------------- tables
def topology_tables(
    topo: Topology, free: Iterable[int], mix: PodMix | None = None
) -> tuple[dict[int, int], dict[int, int]]:
    """(scores, losses) keyed by request size, for the free unit positions ``free``.

    Losses are in hundredths of a GPU (``LOSS_POINTS_PER_GPU``), for ``mix`` (default:
    the prior) with CPU and memory not limiting."""
    free_list = sorted(set(free))
    mix = mix if mix is not None else mix_with_prior({})
    groups = LinkGroups(topo)
    before = NodeRoom(groups.usable(free_list))
    base = fragmentation(before, mix)
    scores: dict[int, int] = {}
    losses: dict[int, int] = {}
    for size in range(1, len(free_list) + 1):
        chosen, key = best_set(topo, free_list, size)
        scores[size] = score_of(key[0], size)
        taken = set(chosen)
        after = NodeRoom(groups.usable(u for u in free_list if u not in taken))
        loss = placement_loss(before, after, mix, (len(topo), None, None), base)
        losses[size] = round(LOSS_POINTS_PER_GPU * loss)
    return scores, losses


def score_of(negated_worst: int, size: int) -> int:
    """The score of a set from the first element of its allocator key."""
    return LEVEL_SCORE[LinkKind(-negated_worst)] if size > 1 else 100


def topology_from_devices(entries: Sequence[DeviceEntry]) -> Topology:
    """The topology of a published device list (pair levels from the GPU index,
    MetaXLink group, PCIe switch and NUMA node of each device), units in list order."""
    gpus: dict[int, Gpu] = {}
    for e in entries:
        if e.gpu not in gpus:
            gpus[e.gpu] = Gpu(
                index=e.gpu,
                pci_address=e.pci,
                vendor="",
                vendor_id=0,
                device_id=0,
                product=e.product,
                numa_node=e.numa,
                pcie_switch=e.switch,
                link_group=e.group,
            )
    members: dict[int, list[int]] = {}
    for gpu in gpus.values():
        if gpu.link_group is not None:
            members.setdefault(gpu.link_group, []).append(gpu.index)
    links = frozenset(
        frozenset((a, b)) for g in members.values() for i, a in enumerate(g) for b in g[i + 1 :]
    )
    inventory = NodeInventory(
        backend="devices", gpus=tuple(gpus.values()), driver=DriverInfo(), links=links
    )
    units = [Unit(id=e.id, gpu=e.gpu, vf=e.vf) for e in entries]
    return Topology.from_inventory(inventory, units)


def tables_as_annotations(scores: Mapping[int, int], losses: Mapping[int, int]) -> dict[str, str]:
    """The two node annotations, JSON objects with string keys ("1", "2", ...)."""
    return {
        SCORES_ANNOTATION: json.dumps({str(k): v for k, v in sorted(scores.items())}),
        LOSSES_ANNOTATION: json.dumps({str(k): v for k, v in sorted(losses.items())}),
    }


def parse_table(raw: str | None, low: int = 0, high: int = 100) -> dict[int, int]:
    """Parse one annotation back; malformed input gives an empty table.

    Read defensively (the extender reads every node's value): at most
    ``MAX_TABLE_CHARS`` characters and shallow nesting (``core.boundedjson``); entries
    whose size is not an integer in 1..``MAX_TABLE_SIZE`` or whose value is not a
    finite number are skipped; values are clamped to ``low``..``high`` (scores: 0..100;
    losses, which may be negative: ``LOSS_LIMIT``).
    """
    if not raw:
        return {}
    try:
        data = loads_bounded(raw, max_depth=2, max_chars=MAX_TABLE_CHARS)
    except BoundedJsonError:
        return {}
    if not isinstance(data, dict):
        return {}
    table: dict[int, int] = {}
    for key, value in data.items():
        if not (0 < len(key) <= 6 and key.isascii() and key.isdigit()):
            continue
        size = int(key)
        if not 1 <= size <= MAX_TABLE_SIZE:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if isinstance(value, float) and not math.isfinite(value):
            continue
        table[size] = int(min(high, max(low, value)))
    return table
