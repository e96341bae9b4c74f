"""GPU sharing's view of a node: mode, physical GPUs, their memory and links.

``shared_node`` reads it from the node's sharing-mode label
(``gpuk8s.io/sharing-mode``), the whole-GPU entries of its device-list annotation
(health; a whole-GPU container holds the GPU when the entry is allocated) and its
``gpu.memory`` label, plus the topology of those GPUs for whole-GPU vcuda requests
(``core.allocator``). ``SharedNodes`` keeps one per node, re-parsed only when those
inputs change, and tells its listeners which node moved.

Example: a node labelled ``gpuk8s.io/sharing-mode: sgpu`` and
``metax-tech.com/gpu.memory: 64GB`` with two healthy free GPUs in its device list is
``SharedNode(name, "sgpu", (GpuCapacity(0, 65536, True, True), GpuCapacity(1, 65536,
True, True)), topology, groups={0: group, 1: group})``; a node with an unknown mode
has ``problem`` set and no GPUs.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ...core.devicelist import DEVICES_ANNOTATION, parse_device_list
from ...core.errors import GpuK8sError
from ...core.model import index_by_id
from ...core.scoring import topology_from_devices
from ...core.sharing import (
    MODE_EXCLUSIVE,
    GpuCapacity,
    SharingError,
    check_mode,
    memory_label_mib,
)
from ...core.topology import Topology
from .notify import Notifier
from .views import NodeItem

MAX_SHAPES = 100_000  # shape ids remembered (node models x health x whole-GPU holds)


@dataclass(frozen=True, eq=False)
class SharedNode:
    """A node as GPU sharing sees it."""

    name: str
    mode: str
    gpus: tuple[GpuCapacity, ...]
    topology: Topology | None = None  # of the whole GPUs, in ``gpus`` order
    problem: str | None = None
    # GPU index -> its link group (MetaXLink/NVLink group, else its PCIe switch)
    groups: Mapping[int, object] = field(default_factory=dict)
    # stable id (UUID and PCI address) -> GPU index now; index -> the GPU's stable id
    # (``core.model.index_by_id``): bookings name GPUs by id, placement by index
    index_by_id: Mapping[str, int] = field(default_factory=dict)
    ids: Mapping[int, str] = field(default_factory=dict)
    # nodes with one shape id have equal mode, problem, GPUs, groups and topology shape
    # (``SharedNodes``: ids are never reused); None: a node of its own
    shape: int | None = None


def shared_node(item: NodeItem) -> SharedNode:
    """A node's sharing view from what the extender decoded (request or watch)."""
    mode_label, memory = item.label_values()
    try:
        mode = check_mode(mode_label)
    except SharingError as err:
        return SharedNode(item.name, MODE_EXCLUSIVE, (), problem=str(err))
    annotations, problem = item.annotations()
    if problem is not None:
        return SharedNode(item.name, mode, (), problem=problem)
    raw = annotations.get(DEVICES_ANNOTATION)
    if raw is None:
        return SharedNode(item.name, mode, (), problem=f"no {DEVICES_ANNOTATION} annotation")
    try:
        entries = [e for e in parse_device_list(raw) if e.vf is None]
        topology = topology_from_devices(entries) if entries else None
    except GpuK8sError as err:
        return SharedNode(item.name, mode, (), problem=f"unusable device list: {err}")
    mib = memory_label_mib(memory)
    gpus = tuple(GpuCapacity(e.gpu, mib, e.healthy, not e.allocated) for e in entries)
    groups = {e.gpu: e.group if e.group is not None else e.switch for e in entries}
    return SharedNode(
        item.name, mode, gpus, topology, groups=groups,
        index_by_id=index_by_id((e.gpu, e.uuid, e.pci) for e in entries),
        ids={e.gpu: e.stable_id for e in entries},
    )


class Ids:
    """A number per distinct key, never reused: after ``limit`` keys the table starts
    over and a key seen before gets a new number (memory bounded; equal numbers still
    mean equal keys). Not locked: the caller holds its own lock."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._ids: dict[Any, int] = {}
        self._next = 0

    def __call__(self, key: Any) -> int:
        got = self._ids.get(key)
        if got is None:
            if len(self._ids) >= self._limit:
                self._ids.clear()
            got = self._ids[key] = self._next
            self._next += 1
        return got


class SharedNodes(Notifier):
    """Node name -> ``SharedNode``; re-parsed only when its inputs change (``changes``
    moves and the listeners hear of the node whenever its view changes)."""

    def __init__(self) -> None:
        super().__init__()
        self._nodes: dict[str, tuple[Any, SharedNode]] = {}
        self._lock = threading.Lock()
        self._shapes = Ids(MAX_SHAPES)  # shape key -> id (``SharedNode.shape``)

    def _shaped(self, node: SharedNode) -> SharedNode:
        """``node`` with its shape id: equal for nodes whose sharing answers only
        their usage and room can tell apart."""
        topology = node.topology.shape if node.topology is not None else None
        key = (node.mode, node.problem, node.gpus, tuple(node.groups.items()), topology)
        return replace(node, shape=self._shapes(key))

    def observe(self, item: NodeItem) -> SharedNode:
        key = (bytes(item.raws[0]), bytes(item.labels[0]), bytes(item.labels[1]))
        hit = self._nodes.get(item.name)
        if hit is not None and hit[0] == key:
            return hit[1]
        parsed = shared_node(item)
        with self._lock:
            node = self._shaped(parsed)
            self._nodes[item.name] = (key, node)
            self._notify(item.name)
        return node

    def forget(self, name: str) -> None:
        with self._lock:
            self._nodes.pop(name, None)
            self._notify(name)

    def replace(self, items: Iterable[NodeItem]) -> None:
        fresh = {}
        for item in items:
            key = (bytes(item.raws[0]), bytes(item.labels[0]), bytes(item.labels[1]))
            fresh[item.name] = (key, shared_node(item))
        with self._lock:
            fresh = {name: (key, self._shaped(node)) for name, (key, node) in fresh.items()}
            self._nodes = fresh
            self._notify(None)

    def get(self, name: str) -> SharedNode | None:
        hit = self._nodes.get(name)
        return hit[1] if hit is not None else None

    def all(self) -> list[SharedNode]:
        return [node for _, node in list(self._nodes.values())]
