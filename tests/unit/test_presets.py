"""Every simulator preset, discovered as a real node would be, through the core:
topology shape, labels, allocation (brute-force checked on the 8-GPU presets)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from gpuk8s import sim
from gpuk8s.core.allocator import allocate, best_set, objective_key
from gpuk8s.core.labels import PREFIX, compute_labels
from gpuk8s.core.model import LinkKind
from gpuk8s.core.topology import Topology, units_for_inventory
from gpuk8s.discovery import discover

# preset -> (GPU count, units, MX groups as sets of GPU indices, product)
EXPECTED = {
    "c500-8": (8, 8, [{0, 1, 2, 3}, {4, 5, 6, 7}], "C500"),
    "c550-8": (8, 8, [set(range(8))], "C550"),
    "mixed-16": (16, 16, [set(range(8)), set(range(8, 16))], "C500"),
    "n260-2": (2, 2, [], "N260"),
    "c500-8-vf4": (8, 32, [{0, 1, 2, 3}, {4, 5, 6, 7}], "C500"),
    "nvidia-8": (8, 8, [set(range(8))], None),
}


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    base = tmp_path_factory.mktemp("presets")
    out = {}
    for name in sim.PRESETS:
        root = base / name
        sim.create(str(root), name)
        out[name] = str(root)
    return out


def test_all_required_presets_exist() -> None:
    assert set(EXPECTED) | {"nodriver-8", "nogpu"} <= set(sim.PRESETS)


@pytest.mark.parametrize("preset", sorted(EXPECTED))
def test_topology_shape(roots: dict[str, str], preset: str) -> None:
    gpus, units, groups, product = EXPECTED[preset]
    inv = discover(roots[preset])
    assert len(inv.gpus) == gpus
    assert len(units_for_inventory(inv)) == units
    found: dict[int, set[int]] = {}
    for g in inv.gpus:
        if g.link_group is not None:
            found.setdefault(g.link_group, set()).add(g.index)
    assert sorted(map(sorted, found.values())) == sorted(map(sorted, groups))
    if product:
        assert {g.product for g in inv.gpus} == {product}
    topo = Topology.from_inventory(inv, units_for_inventory(inv))
    assert topo.hierarchical


def test_c500_switches_pair_with_link_groups(roots: dict[str, str]) -> None:
    inv = discover(roots["c500-8"])
    switches = {g.pcie_switch for g in inv.gpus[:4]}, {g.pcie_switch for g in inv.gpus[4:]}
    assert len(switches[0]) == 1 and len(switches[1]) == 1 and switches[0] != switches[1]


def test_mixed_16_has_four_switches(roots: dict[str, str]) -> None:
    inv = discover(roots["mixed-16"])
    assert len({g.pcie_switch for g in inv.gpus}) == 4
    topo = Topology.from_inventory(inv)
    # GPUs 0 and 4 are on different switches but one MetaXLink group.
    assert topo.level[0][4] == int(LinkKind.MX)
    assert topo.level[0][8] < int(LinkKind.PIX)


@pytest.mark.parametrize("preset", ["c500-8", "c550-8", "nvidia-8"])
def test_allocator_optimal_for_every_state_of_8_gpu_presets(roots, preset) -> None:
    inv = discover(roots[preset])
    topo = Topology.from_inventory(inv)
    for mask in range(1, 256):
        free = [u for u in range(8) if mask >> u & 1]
        for size in range(1, len(free) + 1):
            got, _ = best_set(topo, free, size)
            brute = min(
                (sorted(c) for c in itertools.combinations(free, size)),
                key=lambda c: objective_key(topo, c, free),
            )
            assert got == brute, (preset, free, size)


def test_spec_examples_on_the_simulated_node(roots: dict[str, str]) -> None:
    inv = discover(roots["c500-8"])
    topo = Topology.from_inventory(inv)
    ids = [u.id for u in topo.units]
    assert allocate(topo, ids[2:], 4).devices == tuple(ids[4:8])
    assert allocate(topo, ids[2:], 2).devices == tuple(ids[2:4])


@pytest.mark.parametrize(
    ("preset", "expected"),
    [
        ("c500-8", {"gpu.installed": "true", "driver.ready": "true", "gpu.product": "C500",
                    "gpu.memory": "64GB", "gpu.family": "MXC", "gpu.sriov": "off", "gpu.vfnum": "0",
                    "gpu.driver.mode": "native"}),
        ("c500-8-vf4", {"gpu.sriov": "on", "gpu.vfnum": "4"}),
        ("n260-2", {"gpu.product": "N260", "gpu.sriov": "forbidden", "gpu.vfnum": "0"}),
        ("nodriver-8", {"gpu.installed": "true", "driver.ready": "false"}),
    ],
)
def test_labels_per_preset(roots, preset, expected) -> None:
    labels = compute_labels(discover(roots[preset]))
    for key, value in expected.items():
        assert labels[PREFIX + key] == value, key
    if preset == "nodriver-8":
        assert PREFIX + "gpu.driver.major" not in labels


def test_no_gpu_node(roots: dict[str, str]) -> None:
    inv = discover(roots["nogpu"])
    assert inv.gpus == ()
    assert compute_labels(inv) == {PREFIX + "gpu.installed": "false"}


def test_failed_gpu_is_seen_by_health_check(roots: dict[str, str], tmp_path: Path) -> None:
    from gpuk8s.discovery import check_health

    root = str(tmp_path / "node")
    sim.create(root, "c500-8")
    inv = discover(root)
    assert all(reason is None for reason in check_health(root, inv).values())
    sim.fail(root, 3, "fault")
    health = check_health(root, inv)
    assert health[3] is not None and all(health[i] is None for i in health if i != 3)
    sim.heal(root, 3)
    assert check_health(root, inv)[3] is None
