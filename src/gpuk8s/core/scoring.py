"""Per-node score and loss tables for the scheduler extender (DESIGN "Extender scoring").

For every request size ``k`` the node can currently satisfy (1 ≤ k ≤ free units):

* ``score[k]`` (0..100) -- how fast the best set of ``k`` free units communicates:
  the worst pair level inside the set the allocator would choose, mapped by
  ``LEVEL_SCORE`` (one GPU or MetaXLink 100, PCIe switch 60, NUMA node 30,
  system 10). A single unit scores 100.
* ``loss[k]`` (0..100) -- how much that allocation damages what the node can
  still offer: the share of the node's units that stay free but are *stranded*,
  i.e. sit in a link group that was whole (all free) before the allocation and is
  broken after it. Groups are taken at the node's finest level that has groups of
  more than one unit (VFs of one GPU, else MetaXLink groups, else PCIe switches,
  else NUMA nodes).

Sizes the node cannot satisfy are absent from both tables. The extender ranks
nodes with ``scoreWeight·score[k] − lossWeight·loss[k]``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping

from .allocator import best_set
from .boundedjson import BoundedJsonError, loads_bounded
from .model import LinkKind
from .topology import Topology

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


def _grouping_level(topo: Topology) -> int:
    for level in (LinkKind.SELF, LinkKind.MX, LinkKind.PIX, LinkKind.NODE):
        if any(len(g) > 1 for g in topo.groups[int(level)]):
            return int(level)
    return int(LinkKind.SYS)


def stranded_units(topo: Topology, free: Iterable[int], taken: Iterable[int]) -> int:
    """Free units left in groups that ``taken`` breaks (whole before, partial after)."""
    level = _grouping_level(topo)
    free_set = set(free)
    taken_set = set(taken)
    stranded = 0
    for group in topo.groups[level]:
        if len(group) < 2:
            continue
        whole_before = all(u in free_set for u in group)
        hit = any(u in taken_set for u in group)
        if whole_before and hit:
            stranded += sum(1 for u in group if u not in taken_set)
    return stranded


def topology_tables(
    topo: Topology, free: Iterable[int]
) -> tuple[dict[int, int], dict[int, int]]:
    """(scores, losses) keyed by request size, for the free unit positions ``free``."""
    free_list = sorted(set(free))
    total = len(topo)
    scores: dict[int, int] = {}
    losses: dict[int, int] = {}
    for size in range(1, len(free_list) + 1):
        chosen, key = best_set(topo, free_list, size)
        scores[size] = LEVEL_SCORE[LinkKind(-key[0])] if size > 1 else 100
        losses[size] = round(100 * stranded_units(topo, free_list, chosen) / total)
    return scores, losses


def tables_as_annotations(scores: Mapping[int, int], losses: Mapping[int, int]) -> dict[str, str]:
    """The two node annotations, JSON objects with string keys ("1", "2", ...)."""
    return {
        SCORES_ANNOTATION: json.dumps({str(k): v for k, v in sorted(scores.items())}),
        LOSSES_ANNOTATION: json.dumps({str(k): v for k, v in sorted(losses.items())}),
    }


def parse_table(raw: str | None) -> dict[int, int]:
    """Parse one annotation back; malformed input gives an empty table.

    Read defensively (the extender reads every node's value): at most
    ``MAX_TABLE_CHARS`` characters and shallow nesting (``core.boundedjson``); entries
    whose size is not an integer in 1..``MAX_TABLE_SIZE`` or whose value is not a
    finite number are skipped; values are clamped to 0..100.
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
        table[size] = int(min(100, max(0, value)))
    return table
