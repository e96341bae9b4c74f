"""Hand-built inventories with the shapes of the simulator presets.

The core tests use these so they do not depend on discovery; tests in
test_presets.py check that the simulator + discovery produce the same shapes.
"""

from __future__ import annotations

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
) -> NodeInventory:
    group_of = {i: gid for gid, g in enumerate(link_groups) for i in g}
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
        links=_links(link_groups),
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
