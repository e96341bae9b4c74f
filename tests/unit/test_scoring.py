"""Score/loss tables published for the scheduler extender."""

from __future__ import annotations

import json

from gpuk8s.core.scoring import (
    LOSSES_ANNOTATION,
    SCORES_ANNOTATION,
    parse_table,
    stranded_units,
    tables_as_annotations,
    topology_tables,
)
from gpuk8s.core.topology import Topology

from . import topologies


def test_fresh_c500_node() -> None:
    topo = Topology.from_inventory(topologies.c500_8())
    scores, losses = topology_tables(topo, range(8))
    assert scores == {1: 100, 2: 100, 3: 100, 4: 100, 5: 10, 6: 10, 7: 10, 8: 10}
    # 2 GPUs out of a whole group of 4 strand the other 2: 2/8 of the node.
    assert losses[2] == 25
    assert losses[4] == 0  # a whole group for a 4-GPU request breaks nothing
    assert losses[8] == 0


def test_partly_used_node_prefers_the_broken_group() -> None:
    topo = Topology.from_inventory(topologies.c500_8())
    free = [2, 3, 4, 5, 6, 7]
    scores, losses = topology_tables(topo, free)
    assert set(scores) == set(range(1, 7))  # sizes above the free count are absent
    assert losses[2] == 0  # takes {2,3}: group B stays whole
    assert losses[1] == 0
    assert scores[4] == 100


def test_fully_linked_beats_split_node_for_eight() -> None:
    linked = Topology.from_inventory(topologies.c550_8())
    split = Topology.from_inventory(topologies.c500_8())
    assert topology_tables(linked, range(8))[0][8] > topology_tables(split, range(8))[0][8]


def test_stranded_units_counts_only_whole_groups_broken() -> None:
    topo = Topology.from_inventory(topologies.c500_8())
    assert stranded_units(topo, range(8), [0]) == 3
    assert stranded_units(topo, [1, 2, 3, 4, 5, 6, 7], [1]) == 0  # group A already broken


def test_annotations_round_trip() -> None:
    ann = tables_as_annotations({1: 100, 2: 60}, {1: 0, 2: 25})
    assert json.loads(ann[SCORES_ANNOTATION]) == {"1": 100, "2": 60}
    assert parse_table(ann[LOSSES_ANNOTATION]) == {1: 0, 2: 25}


def test_parse_table_rejects_garbage() -> None:
    assert parse_table(None) == {}
    assert parse_table("not json") == {}
    assert parse_table("[1, 2]") == {}
    assert parse_table('{"1": "x", "two": 3, "4": true, "5": 7.9}') == {5: 7}
