"""Hand-built inventories with the shapes of the simulator presets.

The core tests use these so they do not depend on discovery; tests in
test_presets.py check that the simulator + discovery produce the same shapes.
"""

from __future__ import annotations

import random

from gpuk8s.core.model import DriverInfo, Gpu, NodeInventory, Sriov, SriovState


def _links(groups: list[list[int]]) -> frozenset[frozenset[int]]:
    return frozenset(
        frozenset((a, b)) for g in groups for i, a in enumerate(g) for b in g[i + 1 :]
    )


def build(
    n: int,
    *,
    switch_of: list[int],
    numa_of: list[int | None],
    link_groups: list[list[int]],
    product: str = "C500",
    vfs: int = 0,
    vendor: str = "metax",
    links: list[tuple[int, int]] | None = None,
) -> NodeInventory:
    """``link_groups``: GPUs linked all-to-all; ``links``: more single links (partial
    meshes); a GPU's ``link_group`` is its first group."""
    group_of: dict[int, int] = {}
    for gid, g in enumerate(link_groups):
        for i in g:
            group_of.setdefault(i, gid)
    gpus = []
    for i in range(n):
        bus = 0x10 + i
        sriov = Sriov(
            state=SriovState.ON if vfs else SriovState.OFF,
            total_vfs=8,
            num_vfs=vfs,
            vf_addresses=tuple(f"0000:{bus:02x}:00.{v + 1}" for v in range(vfs)),
        )
        gpus.append(
            Gpu(
                index=i,
                pci_address=f"0000:{bus:02x}:00.0",
                vendor=vendor,
                vendor_id=0x9999,
                device_id=0x4001,
                product=product,
                family="MXC",
                memory_mib=65536,
                numa_node=numa_of[i],
                pcie_switch=f"0000:0{switch_of[i]}:00.0",
                link_group=group_of.get(i),
                sriov=sriov,
                driver_bound=True,
            )
        )
    return NodeInventory(
        backend=vendor,
        gpus=tuple(gpus),
        driver=DriverInfo(loaded=True, version="2.32.0.6"),
        links=_links(link_groups) | frozenset(frozenset(p) for p in links or ()),
    )


def c500_8(vfs: int = 0) -> NodeInventory:
    return build(
        8,
        switch_of=[0, 0, 0, 0, 1, 1, 1, 1],
        numa_of=[0, 0, 0, 0, 1, 1, 1, 1],
        link_groups=[[0, 1, 2, 3], [4, 5, 6, 7]],
        vfs=vfs,
    )


def c550_8() -> NodeInventory:
    return build(
        8,
        switch_of=[0, 0, 0, 0, 1, 1, 1, 1],
        numa_of=[0, 0, 0, 0, 1, 1, 1, 1],
        link_groups=[list(range(8))],
        product="C550",
    )


def mixed_16() -> NodeInventory:
    return build(
        16,
        switch_of=[i // 4 for i in range(16)],
        numa_of=[i // 8 for i in range(16)],
        link_groups=[list(range(8)), list(range(8, 16))],
    )


def pcie_only_8() -> NodeInventory:
    """No links at all: switches and NUMA nodes only (N260-like, scaled up)."""
    return build(
        8,
        switch_of=[0, 0, 1, 1, 2, 2, 3, 3],
        numa_of=[0, 0, 0, 0, 1, 1, 1, 1],
        link_groups=[],
        product="N260",
    )


# -- partial meshes: link groups overlap (not hierarchical) ------------------------------
def dgx1_cube_mesh(vfs: int = 0) -> NodeInventory:
    """DGX-1 hybrid cube mesh: two fully linked quads plus links 0-4, 1-5, 2-6, 3-7;
    PCIe switches per pair, NUMA node per quad."""
    return build(
        8,
        switch_of=[0, 0, 1, 1, 2, 2, 3, 3],
        numa_of=[0, 0, 0, 0, 1, 1, 1, 1],
        link_groups=[[0, 1, 2, 3], [4, 5, 6, 7]],
        links=[(i, i + 4) for i in range(4)],
        vfs=vfs,
        vendor="nvidia",
        product="V100",
    )


def nvlink_ring(n: int = 8, per_switch: int = 4, vfs: int = 0) -> NodeInventory:
    """GPU i linked to i-1 and i+1 (mod n); switches of ``per_switch``, two NUMA nodes."""
    return build(
        n,
        switch_of=[i // per_switch for i in range(n)],
        numa_of=[0 if i < n // 2 else 1 for i in range(n)],
        link_groups=[],
        links=[(i, (i + 1) % n) for i in range(n)],
        vfs=vfs,
    )


def straddling_groups() -> NodeInventory:
    """MetaXLink groups {0,1}, {2,3,4,5}, {6,7} over PCIe switches {0-3}, {4-7}: the middle
    group straddles the two switches."""
    return build(
        8,
        switch_of=[0, 0, 0, 0, 1, 1, 1, 1],
        numa_of=[0, 0, 0, 0, 1, 1, 1, 1],
        link_groups=[[0, 1], [2, 3, 4, 5], [6, 7]],
    )


def c500_8_cross_link() -> NodeInventory:
    """c500-8 with one extra MetaXLink between the groups (GPU 0 - GPU 4)."""
    return build(
        8,
        switch_of=[0, 0, 0, 0, 1, 1, 1, 1],
        numa_of=[0, 0, 0, 0, 1, 1, 1, 1],
        link_groups=[[0, 1, 2, 3], [4, 5, 6, 7]],
        links=[(0, 4)],
    )


def double_cube_mesh(vfs: int = 0) -> NodeInventory:
    """Two DGX-1 cube meshes side by side (16 GPUs; with 4 VFs: 64 devices)."""
    links = [(b + i, b + i + 4) for b in (0, 8) for i in range(4)]
    return build(
        16,
        switch_of=[i // 2 for i in range(16)],
        numa_of=[i // 8 for i in range(16)],
        link_groups=[[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]],
        links=links,
        vfs=vfs,
    )


def random_mesh(n: int = 32, p: float = 0.2, seed: int = 1, vfs: int = 0) -> NodeInventory:
    """``n`` GPUs, each pair linked with probability ``p`` (a fixed draw per ``seed``);
    PCIe switches of 4, two NUMA nodes. Link groups are the maximal cliques of a random
    graph: many, overlapping, of 2-4 GPUs."""
    rng = random.Random(seed)
    pairs = [(a, b) for a in range(n) for b in range(a + 1, n)]
    return build(
        n,
        switch_of=[i // 4 for i in range(n)],
        numa_of=[0 if i < n // 2 else 1 for i in range(n)],
        link_groups=[],
        links=[pair for pair in pairs if rng.random() < p],
        vfs=vfs,
    )


PARTIAL_MESHES = {
    "dgx1-cube-mesh": dgx1_cube_mesh,
    "nvlink-ring-8": nvlink_ring,
    "straddling-groups": straddling_groups,
    "c500-8-cross-link": c500_8_cross_link,
}
