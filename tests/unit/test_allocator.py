"""Allocator: SPEC §3 examples, exact optimality against brute force, errors."""

from __future__ import annotations

import itertools
import random

import pytest

from gpuk8s.core.allocator import allocate, best_set, objective_key
from gpuk8s.core.errors import AllocationError
from gpuk8s.core.model import LinkKind
from gpuk8s.core.topology import Topology, Unit, units_for_inventory

from . import topologies


def brute_force(topo: Topology, free: list[int], size: int, must: list[int] = ()) -> list[int]:
    others = [u for u in free if u not in must]
    best = None
    for extra in itertools.combinations(others, size - len(must)):
        chosen = sorted([*must, *extra])
        key = objective_key(topo, chosen, free)
        if best is None or key < best[0]:
            best = (key, chosen)
    assert best is not None
    return best[1]


def ids(topo: Topology, positions: list[int]) -> list[str]:
    return [topo.units[p].id for p in positions]


# -- SPEC §3 examples -------------------------------------------------------------
def test_spec_example_four_goes_to_the_whole_group() -> None:
    topo = Topology.from_inventory(topologies.c500_8())
    # GPUs "1 and 2" of the SPEC (indices 0 and 1 here) are taken.
    available = ids(topo, [2, 3, 4, 5, 6, 7])
    result = allocate(topo, available, 4)
    assert result.devices == tuple(ids(topo, [4, 5, 6, 7]))
    assert result.worst is LinkKind.MX


def test_spec_example_two_keeps_the_other_group_whole() -> None:
    topo = Topology.from_inventory(topologies.c500_8())
    available = ids(topo, [2, 3, 4, 5, 6, 7])
    result = allocate(topo, available, 2)
    assert result.devices == tuple(ids(topo, [2, 3]))
    assert "MetaXLink" in result.explain


def test_metaxlink_beats_pcie_switch() -> None:
    # Four GPUs on one switch without links, four on another switch fully linked.
    inv = topologies.build(
        8,
        switch_of=[0, 0, 0, 0, 1, 1, 1, 1],
        numa_of=[0] * 8,
        link_groups=[[4, 5, 6, 7]],
    )
    topo = Topology.from_inventory(inv)
    result = allocate(topo, [u.id for u in topo.units], 3)
    assert result.devices == tuple(ids(topo, [4, 5, 6]))
    assert result.worst is LinkKind.MX


def test_single_device_fills_a_broken_group_first() -> None:
    topo = Topology.from_inventory(topologies.c500_8())
    available = ids(topo, [3, 4, 5, 6, 7])  # group A has one free GPU left
    assert allocate(topo, available, 1).devices == tuple(ids(topo, [3]))


def test_must_include_is_honoured() -> None:
    topo = Topology.from_inventory(topologies.c500_8())
    all_ids = [u.id for u in topo.units]
    result = allocate(topo, all_ids, 2, must_include=ids(topo, [5]))
    assert ids(topo, [5])[0] in result.devices
    assert result.worst is LinkKind.MX
    assert set(result.devices) <= set(ids(topo, [4, 5, 6, 7]))


def test_vfs_pack_onto_one_gpu() -> None:
    inv = topologies.c500_8(vfs=4)
    topo = Topology.from_inventory(inv, units_for_inventory(inv))
    assert len(topo) == 32
    result = allocate(topo, [u.id for u in topo.units], 3)
    gpus = {topo.units[topo.position[d]].gpu for d in result.devices}
    assert gpus == {0}
    assert result.worst is LinkKind.SELF


def test_vf_inherits_parent_place() -> None:
    inv = topologies.c500_8(vfs=2)
    topo = Topology.from_inventory(inv, units_for_inventory(inv))
    # GPU0 and GPU4 keep one VF each: a 2-VF request on different GPUs must still
    # prefer a MetaXLink pair, which GPU0's VF with GPU1's VF is, not GPU0 + GPU4.
    free = [u.id for u in topo.units if u.gpu in (1,) and u.vf == 0] + [
        u.id for u in topo.units if u.gpu in (0, 4) and u.vf == 1
    ]
    result = allocate(topo, free, 2)
    gpus = sorted(topo.units[topo.position[d]].gpu for d in result.devices)
    assert gpus == [0, 1]


# -- errors -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("size", "available", "must", "message"),
    [
        (0, None, [], "positive integer"),
        (9, None, [], "only 8 available"),
        (2, ["0000:10:00.0"], [], "only 1 available"),
        (1, None, ["0000:10:00.0", "0000:11:00.0"], "exceed the request size"),
        (1, ["0000:11:00.0"], ["0000:10:00.0"], "not available"),
        (1, ["nope"], [], "unknown device id 'nope'"),
    ],
)
def test_bad_requests_raise(size, available, must, message) -> None:
    topo = Topology.from_inventory(topologies.c500_8())
    avail = available if available is not None else [u.id for u in topo.units]
    with pytest.raises(AllocationError if "unknown" not in message else Exception) as err:
        allocate(topo, avail, size, must)
    assert message in str(err.value)


# -- optimality against brute force ------------------------------------------------
@pytest.mark.parametrize(
    "inventory",
    [topologies.c500_8(), topologies.c550_8(), topologies.pcie_only_8()],
    ids=["c500-8", "c550-8", "pcie-only-8"],
)
def test_exhaustive_every_available_set_and_size(inventory) -> None:
    topo = Topology.from_inventory(inventory)
    assert topo.hierarchical
    n = len(topo)
    checked = 0
    for mask in range(1, 1 << n):
        free = [u for u in range(n) if mask >> u & 1]
        for size in range(1, len(free) + 1):
            got, _ = best_set(topo, free, size)
            assert got == brute_force(topo, free, size), (free, size)
            checked += 1
    assert checked == n * 2 ** (n - 1)  # every (non-empty set, size) pair was checked


def test_random_states_16_gpus_with_must_include() -> None:
    topo = Topology.from_inventory(topologies.mixed_16())
    rng = random.Random(20261122)
    for _ in range(2000):
        free = sorted(rng.sample(range(16), rng.randint(1, 12)))
        size = rng.randint(1, len(free))
        must = sorted(rng.sample(free, rng.randint(0, min(2, size))))
        got, _ = best_set(topo, free, size, must)
        assert got == brute_force(topo, free, size, must), (free, size, must)


def test_random_states_vfs() -> None:
    inv = topologies.c500_8(vfs=4)
    topo = Topology.from_inventory(inv, units_for_inventory(inv))
    rng = random.Random(7)
    for _ in range(300):
        free = sorted(rng.sample(range(32), rng.randint(1, 18)))
        size = rng.randint(1, min(4, len(free)))
        got, _ = best_set(topo, free, size)
        assert got == brute_force(topo, free, size), (free, size)


def test_non_hierarchical_topology_falls_back_to_exhaustive_search() -> None:
    # A ring of links (0-1, 1-2, 2-3, 3-0) is not a clique: 0 and 2 are not linked.
    units = [Unit(id=f"d{i}", gpu=i) for i in range(4)]
    mx, sys_ = int(LinkKind.MX), int(LinkKind.SYS)
    ring = {(0, 1), (1, 2), (2, 3), (0, 3)}
    matrix = [
        [int(LinkKind.SELF) if a == b else mx if (min(a, b), max(a, b)) in ring else sys_
         for b in range(4)]
        for a in range(4)
    ]
    topo = Topology(units, matrix)
    assert not topo.hierarchical
    for size in range(1, 5):
        got, _ = best_set(topo, [0, 1, 2, 3], size)
        assert got == brute_force(topo, [0, 1, 2, 3], size)
    assert allocate(topo, ["d0", "d1", "d2", "d3"], 2).worst is LinkKind.MX
