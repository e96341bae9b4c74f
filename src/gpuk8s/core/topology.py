"""Pair affinity and link groups of the allocatable devices of one node.

A *unit* is what the kubelet hands out: a whole GPU, or one virtual function of a
GPU. Two units are related by the best link between their GPUs (see ``LinkKind``);
two VFs of one GPU are ``SELF``. A *link group at level L* is a connected component
of the graph whose edges are the pairs at level L or better; groups of successive
levels are therefore nested (every MX group lies inside one PIX group, ...), which
gives the tree the allocator searches.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .errors import InventoryError
from .model import Gpu, LinkKind, NodeInventory

LEVELS_BEST_FIRST: tuple[LinkKind, ...] = tuple(sorted(LinkKind, reverse=True))


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
        # component id of every unit at every level: comp[level][unit] -> group number
        self.comp: dict[int, tuple[int, ...]] = {
            int(lv): self._components(int(lv)) for lv in LinkKind
        }
        self.groups: dict[int, tuple[tuple[int, ...], ...]] = {}
        for lv, comp in self.comp.items():
            members: dict[int, list[int]] = {}
            for unit, group in enumerate(comp):
                members.setdefault(group, []).append(unit)
            self.groups[lv] = tuple(tuple(m) for _, m in sorted(members.items()))
        self.hierarchical = self._check_cliques()

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

    def _check_cliques(self) -> bool:
        """True when every group at level L has all its pairs at L or better.

        Real topologies (MetaXLink groups, NVSwitch, PCIe trees) are like this; a
        partial mesh (e.g. NVLink hybrid cube) is not, and the allocator then falls
        back to exhaustive search.
        """
        for lv, groups in self.groups.items():
            for g in groups:
                for i, a in enumerate(g):
                    row = self.level[a]
                    for b in g[i + 1 :]:
                        if row[b] < lv:
                            return False
        return True

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
