"""Pair affinity and link groups of the allocatable devices of one node.

A *unit* is what the kubelet hands out: a whole GPU, or one virtual function of a
GPU. Two units are related by the best link between their GPUs (see ``LinkKind``);
two VFs of one GPU are ``SELF``. A *link group at level L* is a maximal set of units
whose pairs are all at level L or better (DESIGN "Topology model"): a maximal clique
of the graph G_L whose edges are those pairs.

On most real nodes (MetaXLink groups, NVSwitch, PCIe trees) every G_L is a disjoint
union of cliques: the groups are its connected components, they do not overlap, and
groups of successive levels nest into a tree (``hierarchical``). On a partial mesh
(DGX-1 hybrid cube mesh, NVLink rings, MetaXLink groups straddling PCIe switches, an
extra cross link) groups of one level overlap: a GPU of a cube mesh is in its quad and
in a pair with its counterpart in the other quad.

The *cover number* of a set of units at level L is the fewest level-L groups that
together contain the set (``cover_number``): on a hierarchical level it is the number
of groups the set touches.

VFs of one GPU are *twins*: same relation to every other unit. Searches work on
``classes`` (one per GPU) and counts, not on VFs one by one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from .errors import InventoryError
from .model import Gpu, LinkKind, NodeInventory

LEVELS_BEST_FIRST: tuple[LinkKind, ...] = tuple(sorted(LinkKind, reverse=True))
MAX_GROUPS = 10_000  # link groups per level; real topologies have a handful
MAX_COVERS = 20_000  # memoised cover numbers per topology


@dataclass(frozen=True)
class Unit:
    """One allocatable device instance."""

    id: str
    gpu: int  # index of the physical GPU
    vf: int | None = None  # VF number on that GPU, None for the whole GPU


def gpu_pair_level(a: Gpu, b: Gpu, links: frozenset[frozenset[int]]) -> LinkKind:
    if a.index == b.index:
        return LinkKind.SELF
    if frozenset((a.index, b.index)) in links:
        return LinkKind.MX
    if a.pcie_switch is not None and a.pcie_switch == b.pcie_switch:
        return LinkKind.PIX
    if a.numa_node is not None and a.numa_node == b.numa_node:
        return LinkKind.NODE
    return LinkKind.SYS


class Topology:
    """Units of one node with their pair levels and nested link groups.

    Units are ordered as given; that order is the deterministic tie-break
    (lower position wins).
    """

    def __init__(self, units: Sequence[Unit], level_matrix: Sequence[Sequence[int]]):
        n = len(units)
        if len(level_matrix) != n or any(len(row) != n for row in level_matrix):
            raise InventoryError("level matrix does not match the number of units")
        ids = [u.id for u in units]
        if len(set(ids)) != n:
            raise InventoryError("duplicate device ids in topology")
        self.units: tuple[Unit, ...] = tuple(units)
        self.position: dict[str, int] = {uid: i for i, uid in enumerate(ids)}
        self.level: tuple[tuple[int, ...], ...] = tuple(tuple(row) for row in level_matrix)
        # all that the structure below is derived from (the units' GPUs and the levels,
        # not their ids): topologies of one shape get the same answers from the searches
        self.shape: tuple[tuple[int, ...], tuple[tuple[int, ...], ...]] = (
            tuple(u.gpu for u in self.units),
            self.level,
        )
        # component id of every unit at every level: comp[level][unit] -> group number
        self.comp: dict[int, tuple[int, ...]] = {
            int(lv): self._components(int(lv)) for lv in LinkKind
        }
        components: dict[int, tuple[tuple[int, ...], ...]] = {}
        for lv, comp in self.comp.items():
            members: dict[int, list[int]] = {}
            for unit, group in enumerate(comp):
                members.setdefault(group, []).append(unit)
            components[lv] = tuple(tuple(m) for _, m in sorted(members.items()))
        # per level: True when every component is a clique (groups = components)
        self.transitive: dict[int, bool] = {
            lv: self._is_clique_union(lv, groups) for lv, groups in components.items()
        }
        self.hierarchical = all(self.transitive.values())
        self._classes()
        # link groups (maximal cliques) per level, as unit tuples, and per unit the
        # indices of the groups that contain it
        self.groups: dict[int, tuple[tuple[int, ...], ...]] = {}
        self.group_masks: dict[int, tuple[int, ...]] = {}  # the same, as class bitmasks
        self.groups_of: dict[int, tuple[tuple[int, ...], ...]] = {}
        for lv in components:
            if self.transitive[lv]:
                groups = components[lv]
                masks = tuple(self._class_mask(g) for g in groups)
            else:
                masks = tuple(sorted(self._maximal_cliques(lv), key=self._first_unit))
                groups = tuple(self._units_of(mask) for mask in masks)
            self.groups[lv] = groups
            self.group_masks[lv] = masks
            of: list[list[int]] = [[] for _ in range(n)]
            for index, linked in enumerate(groups):
                for unit in linked:
                    of[unit].append(index)
            self.groups_of[lv] = tuple(tuple(x) for x in of)
        # per level and class: the group masks that contain the class
        self.class_groups: dict[int, tuple[tuple[int, ...], ...]] = {
            lv: tuple(
                tuple(mask for mask in masks if mask >> c & 1) for c in range(len(self.classes))
            )
            for lv, masks in self.group_masks.items()
        }
        self._covers = Covers(self)

    # -- construction -------------------------------------------------------
    @classmethod
    def from_inventory(
        cls, inventory: NodeInventory, units: Sequence[Unit] | None = None
    ) -> Topology:
        """Topology of ``units`` (default: one unit per GPU, id = PCI address)."""
        if units is None:
            units = [Unit(id=g.pci_address, gpu=g.index) for g in inventory.gpus]
        by_index = {g.index: g for g in inventory.gpus}
        for u in units:
            if u.gpu not in by_index:
                raise InventoryError(f"device {u.id} refers to unknown GPU {u.gpu}")
        matrix = [
            [
                int(gpu_pair_level(by_index[a.gpu], by_index[b.gpu], inventory.links))
                for b in units
            ]
            for a in units
        ]
        return cls(units, matrix)

    def _components(self, level: int) -> tuple[int, ...]:
        n = len(self.units)
        comp = [-1] * n
        next_id = 0
        for start in range(n):
            if comp[start] != -1:
                continue
            comp[start] = next_id
            stack = [start]
            while stack:
                a = stack.pop()
                row = self.level[a]
                for b in range(n):
                    if comp[b] == -1 and row[b] >= level:
                        comp[b] = next_id
                        stack.append(b)
            next_id += 1
        return tuple(comp)

    def _is_clique_union(self, level: int, components: Sequence[Sequence[int]]) -> bool:
        """True when every component at ``level`` has all its pairs at it or better."""
        for group in components:
            for i, a in enumerate(group):
                row = self.level[a]
                for b in group[i + 1 :]:
                    if row[b] < level:
                        return False
        return True

    def _classes(self) -> None:
        """Twins (the units of one GPU, with one relation to every other unit) form a
        class; searches choose how many units of a class, not which ones."""
        by_gpu: dict[int, list[int]] = {}
        for position, unit in enumerate(self.units):
            by_gpu.setdefault(unit.gpu, []).append(position)
        classes: list[tuple[int, ...]] = []
        for members in by_gpu.values():
            first = members[0]
            twins = all(
                self.level[u][v] == int(LinkKind.SELF)
                and all(
                    self.level[u][w] == self.level[first][w]
                    for w in range(len(self.units))
                    if w not in members
                )
                for u in members
                for v in members
                if u != v
            )
            classes.extend([tuple(members)] if twins else [(m,) for m in members])
        classes.sort()
        self.classes: tuple[tuple[int, ...], ...] = tuple(classes)
        self.class_of: tuple[int, ...] = tuple(
            c for _, c in sorted((u, c) for c, members in enumerate(classes) for u in members)
        )
        # class-level pair levels, and per level the adjacency of each class as a bitmask
        reps = [members[0] for members in classes]
        self.class_level: tuple[tuple[int, ...], ...] = tuple(
            tuple(self.level[a][b] for b in reps) for a in reps
        )
        self.class_adjacent: dict[int, tuple[int, ...]] = {
            int(lv): tuple(
                sum(1 << j for j, level in enumerate(row) if j != i and level >= int(lv))
                for i, row in enumerate(self.class_level)
            )
            for lv in LinkKind
        }

    def _class_mask(self, units: Sequence[int]) -> int:
        mask = 0
        for unit in units:
            mask |= 1 << self.class_of[unit]
        return mask

    def _units_of(self, mask: int) -> tuple[int, ...]:
        return tuple(sorted(u for c, members in enumerate(self.classes) if mask >> c & 1
                            for u in members))

    def _first_unit(self, mask: int) -> int:
        return min(self.classes[c][0] for c in range(len(self.classes)) if mask >> c & 1)

    def _maximal_cliques(self, level: int) -> list[int]:
        """Maximal cliques of G_level over classes, as bitmasks (Bron-Kerbosch with a
        pivot). Topology graphs are unions of a few cliques and matchings: few cliques."""
        adjacent = self.class_adjacent[level]
        found: list[int] = []
        stack = [(0, (1 << len(self.classes)) - 1, 0)]
        while stack:
            clique, candidates, excluded = stack.pop()
            if not candidates and not excluded:
                found.append(clique)
                if len(found) > MAX_GROUPS:
                    raise InventoryError(
                        f"more than {MAX_GROUPS} link groups at level "
                        f"{LinkKind(level).name}: not a GPU topology this allocator supports"
                    )
                continue
            pivot_pool = candidates | excluded
            pivot = max(
                (c for c in range(len(self.classes)) if pivot_pool >> c & 1),
                key=lambda c: bin(candidates & adjacent[c]).count("1"),
            )
            rest = candidates & ~adjacent[pivot]
            while rest:
                low = rest & -rest
                c = low.bit_length() - 1
                stack.append(
                    (clique | low, candidates & adjacent[c], excluded & adjacent[c])
                )
                candidates &= ~low
                excluded |= low
                rest &= ~low
        return found

    def cover_number(self, level: int, members: Iterable[int]) -> int:
        """The fewest level-``level`` link groups that together contain ``members``."""
        return self.cover_classes(level, self._class_mask(list(members)))

    def cover_classes(self, level: int, mask: int) -> int:
        """``cover_number`` of a set of classes given as a bitmask (exact, no budget:
        the allocator counts its own cover steps with a ``Covers`` of its own)."""
        if self._covers.size() >= MAX_COVERS:
            self._covers = Covers(self)  # bounded memo, dropped in well under 1 ms
        return self._covers.exact(level, mask)

    # -- queries ------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.units)

    def positions(self, ids: Iterable[str]) -> list[int]:
        out = []
        for uid in ids:
            try:
                out.append(self.position[uid])
            except KeyError:
                raise InventoryError(f"unknown device id {uid!r}") from None
        return out

    def worst_level(self, members: Sequence[int]) -> int:
        """Worst pair level inside ``members``; SELF for fewer than two units."""
        worst = int(LinkKind.SELF)
        for i, a in enumerate(members):
            row = self.level[a]
            for b in members[i + 1 :]:
                if row[b] < worst:
                    worst = row[b]
        return worst

    def matrix_text(self) -> str:
        """A matrix in the style of ``mx-smi topo -m`` (GPU units only)."""
        names = [f"GPU{u.gpu}" if u.vf is None else f"GPU{u.gpu}v{u.vf}" for u in self.units]
        width = max([6, *(len(n) + 1 for n in names)])
        lines = [" " * width + "".join(n.ljust(width) for n in names)]
        for i, name in enumerate(names):
            cells = []
            for j in range(len(names)):
                cells.append(("X" if i == j else LinkKind(self.level[i][j]).label).ljust(width))
            lines.append(name.ljust(width) + "".join(cells))
        lines.append("")
        lines.append("Legend:")
        lines.append("  X    = Self")
        lines.append("  MX   = Connection traversing MetaXLink (NVLink on NVIDIA nodes)")
        lines.append("  PIX  = Connection traversing a single PCIe switch")
        lines.append("  NODE = Connection within one NUMA node")
        lines.append("  SYS  = Connection traversing the SMP interconnect between NUMA nodes")
        return "\n".join(line.rstrip() for line in lines)


def _popcount(mask: int) -> int:
    return bin(mask).count("1")


popcount: Callable[[int], int] = getattr(int, "bit_count", _popcount)
"""Number of set bits (``int.bit_count`` from Python 3.10)."""


def bits(mask: int) -> Iterator[int]:
    """The positions of the set bits of ``mask``, lowest first."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


class Covers:
    """Exact cover numbers of sets of classes (bitmasks), memoised.

    The cover number of a set at a level is the fewest link groups (maximal cliques of
    G_level) that contain it; as every clique lies in a maximal one, it is the fewest
    cliques of G_level that partition the set: a minimum clique cover. On a level whose
    groups are disjoint (``Topology.transitive``) it is the number of groups the set
    touches. Elsewhere ``fits`` decides "at most t groups" by branch and bound: branch on
    the class with the fewest neighbours in the set (it lies in the fewest groups) over
    the groups that contain it, largest part first, parts inside another part dropped;
    prune with a lower bound (a greedy independent set of G_level: classes no two of
    which share a group) and remember per set the bounds proven so far. ``exact``
    deepens t from the lower bound.

    ``tick`` (optional) is called before each piece of work with its size in steps: a
    set's bounds computed (one step, and one more per 4 classes), a branching (two); the
    allocator counts these as search steps and raises from it when its budget is spent
    (then the memo holds only what was proven: it stays valid).
    """

    def __init__(self, topo: Topology, tick: Callable[[int], None] | None = None) -> None:
        self.topo = topo
        self.tick = tick
        self._exact: dict[tuple[int, int], int] = {}
        self._nodes: dict[tuple[int, int], list[int]] = {}  # see _node

    def size(self) -> int:
        return len(self._exact) + len(self._nodes)

    def exact(self, level: int, mask: int) -> int:
        """The cover number of the classes in ``mask`` at ``level``."""
        if mask == 0:
            return 0
        topo = self.topo
        if topo.transitive[level]:
            comp, classes = topo.comp[level], topo.classes
            return len({comp[classes[c][0]] for c in bits(mask)})
        key = (level, mask)
        known = self._exact.get(key)
        if known is None:
            known = self._node(level, mask)[0]
            while not self.fits(level, mask, known):
                known += 1
            self._exact[key] = known
        return known

    def fits(self, level: int, mask: int, t: int) -> bool:
        """True when at most ``t`` groups of ``level`` contain the classes in ``mask``."""
        if mask == 0 or self.topo.transitive[level]:
            return self.exact(level, mask) <= t
        if t <= 0:
            return False
        key = (level, mask)
        known = self._exact.get(key)
        if known is not None:
            return known <= t
        node = self._node(level, mask)
        if t >= node[1]:
            return True
        if t < node[0]:
            return False
        if self.tick is not None:
            self.tick(2)
        parts: list[int] = []
        for part in sorted(
            {group & mask for group in self.topo.class_groups[level][node[2]]},
            key=lambda m: (-popcount(m), m),
        ):
            if all(part & ~kept for kept in parts):  # not inside a larger part
                parts.append(part)
        for part in parts:
            if self.fits(level, mask & ~part, t - 1):
                node[1] = t
                return True
        node[0] = t + 1
        return False

    def first_fit(self, level: int, mask: int) -> int:
        """An upper bound of the cover number without search: each class, lowest first,
        joins the first clique it is linked to all of, else starts one."""
        if mask == 0 or self.topo.transitive[level]:
            return self.exact(level, mask)
        adjacent = self.topo.class_adjacent[level]
        commons: list[int] = []  # per clique: the classes linked to all its members
        for c in bits(mask):
            for i, common in enumerate(commons):
                if common >> c & 1:
                    commons[i] = common & adjacent[c]
                    break
            else:
                commons.append(adjacent[c])
        return len(commons)

    def _node(self, level: int, mask: int) -> list[int]:
        """[proven lower bound, proven upper bound, pivot] of a set: first a greedy
        independent set (fewest neighbours first) and the number of classes; the pivot
        is the class with the fewest neighbours in the set (it lies in fewest groups)."""
        key = (level, mask)
        node = self._nodes.get(key)
        if node is None:
            if self.tick is not None:
                self.tick(1 + popcount(mask) // 4)
            adjacent = self.topo.class_adjacent[level]
            degrees = []
            rest = mask
            while rest:
                low = rest & -rest
                c = low.bit_length() - 1
                rest ^= low
                degrees.append((popcount(adjacent[c] & mask), c))
            degrees.sort()
            chosen = count = 0
            for _, c in degrees:
                if not adjacent[c] & chosen:
                    chosen |= 1 << c
                    count += 1
            node = [count, len(degrees), degrees[0][1]]
            self._nodes[key] = node
        return node


def units_for_inventory(inventory: NodeInventory) -> list[Unit]:
    """The allocatable units of a node: per VF when VFs are configured, else per GPU.

    Device ids are stable across restarts: the PCI address of the GPU (or of the VF),
    which is at most 12 characters in the common ``0000:bb:dd.f`` form.
    """
    units: list[Unit] = []
    for gpu in inventory.gpus:
        if gpu.sriov.num_vfs > 0:
            addresses = list(gpu.sriov.vf_addresses)
            for vf in range(gpu.sriov.num_vfs):
                uid = addresses[vf] if vf < len(addresses) else f"{gpu.pci_address}-vf{vf}"
                units.append(Unit(id=uid, gpu=gpu.index, vf=vf))
        else:
            units.append(Unit(id=gpu.pci_address, gpu=gpu.index))
    return units
