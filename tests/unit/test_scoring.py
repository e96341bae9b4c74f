"""core.scoring: communication scores, link groups, the fragmentation loss, tables."""

from __future__ import annotations

import json

import pytest

from gpuk8s.core.devicelist import DeviceEntry
from gpuk8s.core.scoring import (
    LOSS_LIMIT,
    LOSS_POINTS_PER_GPU,
    LOSSES_ANNOTATION,
    ROOM_WEIGHT,
    SCORES_ANNOTATION,
    SIZE_WEIGHT,
    LinkGroups,
    NodeRoom,
    PodMix,
    fragmentation,
    mix_with_prior,
    parse_table,
    placement_loss,
    tables_as_annotations,
    topology_from_devices,
    topology_tables,
)
from gpuk8s.core.topology import Topology, units_for_inventory

from . import topologies

PRIOR = mix_with_prior({})  # 1, 2, 4 and 8 GPUs, a quarter of the GPUs each


def c500() -> Topology:
    return Topology.from_inventory(topologies.c500_8())


def test_link_groups_are_where_an_empty_node_puts_each_size() -> None:
    groups = LinkGroups(c500())
    # k = 1: any GPU; 2..4: one MetaXLink group of four; 5..8: the whole node
    assert groups.usable(range(8)) == (8, 8, 8, 6, 8, 5, 6, 7, 8)
    # GPUs 0, 1 busy: group A keeps a pair, group B is whole
    assert groups.usable(range(2, 8)) == (6, 6, 6, 3, 4, 5, 6, 0, 0)
    assert groups.inside([4, 5, 6, 7]) and groups.inside(list(range(8)))
    assert not groups.inside([3, 4])
    pair = LinkGroups(Topology.from_inventory(
        topologies.build(2, switch_of=[0, 0], numa_of=[0, 0], link_groups=[])))
    assert pair.usable([0, 1]) == (2, 2, 2) and pair.inside([0, 1])  # a PCIe-only pair


def test_fragmentation_counts_free_gpus_each_shape_cannot_use() -> None:
    groups = LinkGroups(c500())
    assert fragmentation(NodeRoom(groups.usable(range(8))), PRIOR) == 0.0
    # one GPU gone from a fresh node: 1 GPU lost to pairs, 3 to groups of four, all 7
    # to 8-GPU pods
    one_taken = NodeRoom(groups.usable(range(1, 8)))
    assert fragmentation(one_taken, PRIOR) == pytest.approx(0.25 * (0 + 1 + 3 + 7))
    # CPU: a pod of 1 GPU + 12 cores can use one of 8 free GPUs next to 20 free cores
    mix = PodMix.from_gpus({(1, 12_000, 0): 1.0})
    assert fragmentation(NodeRoom(groups.usable(range(8)), 20_000, None), mix) == 7
    assert fragmentation(NodeRoom(groups.usable(range(8)), None, None), mix) == 0
    # memory limits the same way; a size larger than the node uses nothing
    mix = PodMix.from_gpus({(1, 0, 10_000): 1.0, (16, 0, 0): 1.0})
    room = NodeRoom(groups.usable(range(8)), None, 25_000)
    assert fragmentation(room, mix) == pytest.approx(0.5 * (8 - 2) + 0.5 * 8)


def test_the_loss_prefers_small_and_broken_nodes_over_whole_big_ones() -> None:
    """The issue's case: 1 GPU from a free 8-GPU node must cost more than 1 GPU from a
    free 4-GPU node, and a whole group of four from a free 8-GPU node is not free."""
    eight = LinkGroups(c500())
    four = LinkGroups(Topology.from_inventory(
        topologies.build(4, switch_of=[0] * 4, numa_of=[0] * 4, link_groups=[[0, 1, 2, 3]])))

    def loss(groups: LinkGroups, before: range, after: range) -> float:
        return placement_loss(NodeRoom(groups.usable(before)), NodeRoom(groups.usable(after)),
                              PRIOR, (groups.units, None, None))

    one_of_eight = loss(eight, range(8), range(1, 8))
    one_of_four = loss(four, range(4), range(1, 4))
    group_of_eight = loss(eight, range(8), range(4))
    assert one_of_four < one_of_eight
    assert group_of_eight > 0  # the node can no longer host an 8-GPU pod
    # the last free pair of a broken node costs less than breaking a whole group
    assert loss(eight, range(2, 8), range(4, 8)) < loss(eight, range(8), range(2, 8))
    # exact value: fragmentation after − before + the packing terms
    assert one_of_eight == pytest.approx(
        0.25 * (0 + 1 + 3 + 7) + ROOM_WEIGHT * 7 + SIZE_WEIGHT * 8)


def test_mix_blends_the_prior_and_keeps_the_heaviest_shapes() -> None:
    assert PRIOR.shapes == ((1, 0, 0), (2, 0, 0), (4, 0, 0), (8, 0, 0))
    assert PRIOR.shares == (0.25, 0.25, 0.25, 0.25) and PRIOR.cpu_per_gpu == 0.0
    observed = {(1, 12_000, 16_384): 96.0, (8, 88_000, 327_680): 32.0, (0, 4_000, 0): 9.0}
    mix = mix_with_prior(observed, {1: 1.0}, prior_gpus=32.0)
    assert len(mix.shapes) == len(mix.shares)
    weights = dict(zip(mix.shapes, mix.shares))  # noqa: B905 (host Pythons: 3.8)
    assert weights == pytest.approx({(1, 12_000, 16_384): 0.6, (8, 88_000, 327_680): 0.2,
                                     (1, 0, 0): 0.2})
    # CPU per GPU averages over the shapes that say how much CPU they want
    assert mix.cpu_per_gpu == pytest.approx((0.6 * 12_000 + 0.2 * 11_000) / 0.8)
    assert mix_with_prior(observed, {}, 0, limit=1).shapes == ((1, 12_000, 16_384),)
    assert PodMix.from_gpus({}).shapes == ()


def test_tables_score_the_allocators_set_and_publish_the_prior_loss() -> None:
    topo = c500()
    scores, losses = topology_tables(topo, range(8))
    assert scores == {1: 100, 2: 100, 3: 100, 4: 100, 5: 10, 6: 10, 7: 10, 8: 10}
    groups = LinkGroups(topo)
    expected_one = placement_loss(NodeRoom(groups.usable(range(8))),
                                  NodeRoom(groups.usable(range(1, 8))), PRIOR, (8, None, None))
    assert losses[1] == round(LOSS_POINTS_PER_GPU * expected_one)
    assert losses[8] < losses[1]  # an 8-GPU pod on an 8-GPU node wastes nothing
    scores, losses = topology_tables(topo, [2, 3, 4, 5, 6, 7])
    assert set(scores) == set(range(1, 7)) and scores[4] == 100
    assert losses[2] < losses[1]  # the pair {2, 3} completes the broken group


def test_topology_from_the_device_list_matches_discovery() -> None:
    for inventory in (topologies.c500_8(), topologies.c550_8(), topologies.c500_8(vfs=4)):
        units = units_for_inventory(inventory)
        expected = Topology.from_inventory(inventory, units)
        gpus = {g.index: g for g in inventory.gpus}
        entries = [
            DeviceEntry(id=u.id, pci=gpus[u.gpu].pci_address, gpu=u.gpu, vf=u.vf,
                        product=gpus[u.gpu].product, numa=gpus[u.gpu].numa_node,
                        group=gpus[u.gpu].link_group, switch=gpus[u.gpu].pcie_switch,
                        healthy=True, allocated=False)
            for u in units
        ]
        rebuilt = topology_from_devices(entries)
        assert rebuilt.level == expected.level
        assert [u.id for u in rebuilt.units] == [u.id for u in units]


def test_annotations_round_trip() -> None:
    ann = tables_as_annotations({1: 100, 2: 60}, {1: 45, 2: -12})
    assert json.loads(ann[SCORES_ANNOTATION]) == {"1": 100, "2": 60}
    assert parse_table(ann[LOSSES_ANNOTATION], *LOSS_LIMIT) == {1: 45, 2: -12}


def test_parse_table_rejects_garbage() -> None:
    assert parse_table(None) == {}
    assert parse_table("not json") == {}
    assert parse_table("[1, 2]") == {}
    assert parse_table('{"1": "x", "two": 3, "4": true, "5": 7.9}') == {5: 7}
