"""Fragmentation-aware ranking for gpu-aware (prioritize).

Three pieces, fed by the same watches as the node cache and the bound-pod tracker:

* ``RunningPods`` -- every bound, unfinished pod (pod watch): its CPU and memory
  requests summed per node, and the *pod mix*: GPUs requested per pod shape (GPUs,
  CPU, memory) of the GPU pods, blended with a configurable prior
  (``core.scoring.mix_with_prior``). The mix is re-taken only when the pods it was
  taken from drifted by ``MIX_DRIFT`` of its weight, so rankings stay cached.
* ``NodeRooms`` -- per node the published device list (layout and free devices) and
  the allocatable CPU and memory (node watch, or the Node objects of the request).
* ``Ranker`` -- for a pod of shape (k, cpu, memory) and a node: the allocator's set of
  k free devices gives ``score`` and the node's room after the placement; the loss is
  ``core.scoring.placement_loss``. Raw priorities are kept per (weights, shape, mix)
  and recomputed only for nodes that changed since (node or pod events).

Memory is bounded by the cluster: one small record per bound pod and per node, one
per distinct device layout, and at most ``MAX_TABLES`` cached rankings.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import filterfalse, repeat
from typing import Any

import msgspec

from ...core.allocator import BestSets
from ...core.devicelist import DEVICES_ANNOTATION, parse_device_list
from ...core.errors import ConfigError, GpuK8sError
from ...core.scoring import (
    DEFAULT_MIX_SHAPES,
    DEFAULT_PRIOR,
    DEFAULT_PRIOR_GPUS,
    LOSS_POINTS_PER_GPU,
    LinkGroups,
    NodeRoom,
    PodMix,
    PodShape,
    fragmentation,
    mix_with_prior,
    placement_loss,
    score_of,
    topology_from_devices,
)
from ...core.topology import Topology
from .demand import decode_pod, pod_totals, quantity_of
from .notify import Notifier, Touch
from .views import BadRequest, NodeItem, NodeView, PodView, node_item

MISSING = float("-inf")  # "no data for this node": scores 0
MIX_DRIFT = 1.0  # re-take the mix after the pods moved this share of its weight
MAX_TABLES = 128  # cached rankings (weights x pod shape)
MAX_LAYOUTS = 1024  # distinct device layouts (topologies) kept
MAX_MEMO = 200_000  # (layout, free devices, k) placements remembered


# -- pods -----------------------------------------------------------------------------
def view_shape(view: PodView) -> PodShape:
    """(GPUs, CPU millicores, memory MiB) of a pod (``demand.pod_totals``, the one
    implementation of the scheduler's request rules); a GPU request the extender cannot
    read counts as none."""
    return pod_totals(view, lenient=True)


def pod_resources(pod: Mapping[str, Any]) -> tuple[int, int]:
    """(CPU millicores, memory MiB) the scheduler reserves for a Pod given as a decoded
    JSON object (tests, the packing benchmark)."""
    _, cpu, mem = pod_shape(pod)
    return cpu, mem


def pod_shape(pod: Mapping[str, Any]) -> PodShape:
    """``view_shape`` of a Pod given as a decoded JSON object; (0, 0, 0) when it is not
    a Pod at all."""
    try:
        return view_shape(decode_pod(pod))
    except BadRequest:
        return (0, 0, 0)


def parse_prior(text: str) -> dict[int, float]:
    """``--pod-mix-prior``: ``"1=1,2=1,4=1,8=1"`` (request size = share of GPUs)."""
    prior: dict[int, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        size, sep, share = item.partition("=")
        try:
            k, weight = int(size), float(share)
        except ValueError:
            k, weight = 0, -1.0
        if not sep or k < 1 or not weight >= 0 or weight == float("inf"):
            raise ConfigError(
                f"--pod-mix-prior: {item[:40]!r} is not SIZE=SHARE with SIZE a GPU count "
                "≥ 1 and SHARE a number ≥ 0 (e.g. 1=1,2=1,4=1,8=1)"
            )
        prior[k] = prior.get(k, 0.0) + weight
    return prior


# -- pods -----------------------------------------------------------------------------
class RunningPods(Notifier):
    """Bound, unfinished pods: CPU/memory requested per node, and the learned pod mix."""

    def __init__(
        self,
        prior: Mapping[int, float] = DEFAULT_PRIOR,
        prior_gpus: float = DEFAULT_PRIOR_GPUS,
        shapes: int = DEFAULT_MIX_SHAPES,
    ) -> None:
        super().__init__()
        self.prior = dict(prior)
        self.prior_gpus = prior_gpus
        self.shapes = shapes
        self._pods: dict[str, tuple[str, PodShape]] = {}
        self._per_node: dict[str, tuple[int, int]] = {}
        self._gpus: dict[PodShape, int] = {}  # GPUs requested per shape (GPU pods)
        self._lock = threading.Lock()
        self._synced = threading.Event()
        self._mix: tuple[int, PodMix] | None = None
        self._versions = 0  # mixes taken so far (a new mix is a new version, always)
        self._drift = 0.0  # GPUs added or removed since the mix was taken
        self._weight_at_mix = 0.0

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    def _add(self, uid: str, node: str, shape: PodShape, sign: int) -> None:
        cpu, mem = self._per_node.get(node, (0, 0))
        cpu, mem = cpu + sign * shape[1], mem + sign * shape[2]
        if cpu or mem or sign > 0:
            self._per_node[node] = (cpu, mem)
        else:
            self._per_node.pop(node, None)
        k = shape[0]
        if k > 0:
            left = self._gpus.get(shape, 0) + sign * k
            if left > 0:
                self._gpus[shape] = left
            else:
                self._gpus.pop(shape, None)
            self._drift += k

    def set(self, uid: str, node: str | None, shape: PodShape) -> None:
        """Record a pod (or forget it: ``node`` None when unbound or finished)."""
        with self._lock:
            old = self._pods.pop(uid, None)
            if old is not None:
                self._add(uid, old[0], old[1], -1)
            if node:
                self._pods[uid] = (node, shape)
                self._add(uid, node, shape, +1)
        if old is not None and old[0] != node:
            self._notify(old[0])
        if node and old != (node, shape):
            self._notify(node)

    def forget(self, uid: str) -> None:
        self.set(uid, None, (0, 0, 0))

    def replace(self, pods: Iterable[tuple[str, str | None, PodShape]]) -> None:
        """The full list (after a list call)."""
        with self._lock:
            self._pods, self._per_node, self._gpus = {}, {}, {}
            for uid, node, shape in pods:
                if node:
                    self._pods[uid] = (node, shape)
                    self._add(uid, node, shape, +1)
            self._mix = None
        self._notify(None)
        self._synced.set()

    def requested(self, node: str) -> tuple[int, int]:
        """(CPU millicores, memory MiB) requested by the pods bound to ``node``."""
        return self._per_node.get(node, (0, 0))

    def mix(self) -> tuple[int, PodMix]:
        """(version, mix): re-taken after the pods drifted by ``MIX_DRIFT`` of its weight."""
        current = self._mix
        if current is not None and self._drift <= MIX_DRIFT * self._weight_at_mix:
            return current
        with self._lock:
            if self._mix is None or self._drift > MIX_DRIFT * self._weight_at_mix:
                self._versions += 1
                observed = {s: float(g) for s, g in self._gpus.items()}
                self._mix = (
                    self._versions,
                    mix_with_prior(observed, self.prior, self.prior_gpus, self.shapes),
                )
                self._weight_at_mix = sum(observed.values()) + self.prior_gpus
                self._drift = 0.0
            return self._mix

    def __len__(self) -> int:
        return len(self._pods)


def view_running_fields(view: PodView) -> tuple[str, str | None, PodShape]:
    """(uid, node or None, shape) of a pod from the API; unbound and finished pods hold
    nothing."""
    uid = (view.metadata.uid if view.metadata is not None else None) or ""
    node = view.spec.nodeName if view.spec is not None else None
    phase = view.status.phase if view.status is not None else None
    if not node or phase in ("Succeeded", "Failed"):
        return uid, None, (0, 0, 0)
    return uid, node, view_shape(view)


def running_fields(obj: Mapping[str, Any]) -> tuple[str, str | None, PodShape]:
    """``view_running_fields`` of a Pod given as a decoded JSON object."""
    try:
        view = decode_pod(obj)
    except BadRequest:
        return "", None, (0, 0, 0)
    return view_running_fields(view)


# -- nodes ----------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Layout:
    """One device layout (topology) shared by every node that has it."""

    topology: Topology
    groups: LinkGroups


@dataclass(frozen=True, eq=False)
class NodeRoomInfo:
    """A node as the ranker sees it: layout, free device positions, what they allow,
    allocatable CPU / memory (None: not known)."""

    layout: Layout
    free: tuple[int, ...]
    usable: tuple[int, ...]
    cpu_milli: int | None
    memory_mib: int | None

    @property
    def capacity(self) -> tuple[int, int | None, int | None]:
        return len(self.layout.topology), self.cpu_milli, self.memory_mib


# status.allocatable cpu and memory as JSON text (b"": not given)
Allocatable = tuple[bytes, bytes]
NO_ALLOCATABLE: Allocatable = (b"", b"")


def _allocatable(raw: Allocatable) -> tuple[int | None, int | None]:
    cpu, mem = quantity_of(raw[0]), quantity_of(raw[1])
    return (
        int(cpu * 1000) if cpu is not None else None,
        int(mem / 2**20) if mem is not None else None,
    )


# what a node's entry was built from: devices annotation, allocatable CPU and memory (raw)
_Seen = tuple[str | None, bytes, bytes]
# (name, device-list annotation or None, allocatable) of one node
RoomFields = tuple[str, str | None, Allocatable]


class NodeRooms(Notifier):
    """Node name -> ``NodeRoomInfo`` from the device-list annotation and the Node's
    allocatable resources; placements per (layout, free devices, k) memoised."""

    def __init__(self) -> None:
        super().__init__()
        self._nodes: dict[str, NodeRoomInfo] = {}
        self._seen: dict[str, _Seen] = {}
        # name -> the raw JSON text its entry was built from (``observe_item``)
        self._raw: dict[str, tuple[bytes, ...]] = {}
        self._layouts: dict[tuple[tuple[Any, ...], ...], Layout] = {}
        self._parsed: dict[str, tuple[Layout, tuple[int, ...], tuple[int, ...]] | None] = {}
        # keyed by the Layout itself (identity), never its id(): a Layout dropped with
        # ``_layouts`` may give its id to a new one of another topology
        self._after: dict[tuple[Layout, tuple[int, ...], int], tuple[int, tuple[int, ...]]] = {}
        self._sets = BestSets()  # the searches, shared by layouts of one shape
        self._lock = threading.Lock()

    def _parse(self, devices: str) -> tuple[Layout, tuple[int, ...], tuple[int, ...]] | None:
        hit = self._parsed.get(devices, False)
        if hit is not False:
            return hit  # type: ignore[return-value]
        try:
            entries = parse_device_list(devices)
        except GpuK8sError:
            entries = []
        result = None
        if entries:
            signature = tuple((e.id, e.gpu, e.vf, e.numa, e.group, e.switch) for e in entries)
            layout = self._layouts.get(signature)
            if layout is None:
                topology = topology_from_devices(entries)
                layout = Layout(topology, LinkGroups(topology))
                if len(self._layouts) >= MAX_LAYOUTS:
                    self._layouts.clear()
                self._layouts[signature] = layout
            free = tuple(i for i, e in enumerate(entries) if e.free)
            result = (layout, free, layout.groups.usable(free))
        if len(self._parsed) >= MAX_LAYOUTS * 16:
            self._parsed.clear()  # bounded: device lists come and go
        self._parsed[devices] = result
        return result

    def _entry(
        self, devices: str | None, allocatable: Allocatable
    ) -> tuple[_Seen, NodeRoomInfo | None]:
        seen: _Seen = (devices, *allocatable)
        parsed = self._parse(devices) if isinstance(devices, str) else None
        if parsed is None:
            return seen, None
        return seen, NodeRoomInfo(parsed[0], parsed[1], parsed[2], *_allocatable(allocatable))

    def observe(
        self, name: str, devices: str | None, allocatable: Allocatable = NO_ALLOCATABLE
    ) -> None:
        """Take the node's device list (its device-list annotation) and allocatable CPU
        and memory (JSON text, as in the Node); a no-op when neither changed."""
        if self._seen.get(name) == (devices, *allocatable):
            return
        seen, info = self._entry(devices, allocatable)
        with self._lock:
            self._raw.pop(name, None)
            self._seen[name] = seen
            if info is None:
                self._nodes.pop(name, None)
            else:
                self._nodes[name] = info
        self._notify(name)

    def observe_item(self, item: NodeItem) -> None:
        """``observe`` of a node as the extender decoded it (the request's Node objects
        or the node watch), keyed on the JSON text of its device-list annotation and
        allocatable resources as sent: an unchanged node costs a bytes comparison, its
        annotation is neither decoded nor parsed again."""
        # all three annotations: an unusable one takes the node's room away
        raw = (*map(bytes, item.raws), bytes(item.allocatable[0]), bytes(item.allocatable[1]))
        if self._raw.get(item.name) == raw:
            return
        self.observe(*item_room_fields(item))
        with self._lock:
            self._raw[item.name] = raw

    def forget(self, name: str) -> None:
        with self._lock:
            self._raw.pop(name, None)
            self._seen.pop(name, None)
            self._nodes.pop(name, None)
        self._notify(name)

    def replace(self, nodes: Iterable[RoomFields]) -> None:
        """The full list (after a list call): drops nodes not in it."""
        fresh: dict[str, NodeRoomInfo] = {}
        seen: dict[str, _Seen] = {}
        for name, devices, allocatable in nodes:
            seen[name], info = self._entry(devices, allocatable)
            if info is not None:
                fresh[name] = info
        with self._lock:
            self._nodes, self._seen, self._raw = fresh, seen, {}
        self._notify(None)

    def get(self, name: str) -> NodeRoomInfo | None:
        return self._nodes.get(name)

    def after(self, info: NodeRoomInfo, k: int) -> tuple[int, tuple[int, ...]]:
        """(score, usable after) when the allocator takes k of the node's free devices."""
        key = (info.layout, info.free, k)
        hit = self._after.get(key)
        if hit is None:
            chosen, objective = self._sets(info.layout.topology, info.free, k)
            taken = set(chosen)
            left = [u for u in info.free if u not in taken]
            hit = (score_of(objective[0], k), info.layout.groups.usable(left))
            if len(self._after) >= MAX_MEMO:
                self._after.clear()
            self._after[key] = hit
        return hit

    def __len__(self) -> int:
        return len(self._nodes)


class FreeRoom:
    """A node's free CPU millicores and memory MiB (allocatable minus the bound pods'
    requests; None where allocatable is not known), the room GPU sharing weighs; a
    version that moves whenever any node's free room may have changed, and the nodes
    whose room changed (``listen``): all read the same ``rooms`` and ``running``, so a
    caller wires one object (``share.RoomView``)."""

    def __init__(self, rooms: NodeRooms, running: RunningPods | None) -> None:
        self._rooms = rooms
        self._running = running

    def __call__(self, name: str) -> tuple[int | None, int | None]:
        info = self._rooms.get(name)
        if info is None:
            return None, None
        cpu, memory = self._running.requested(name) if self._running is not None else (0, 0)
        return (
            None if info.cpu_milli is None else info.cpu_milli - cpu,
            None if info.memory_mib is None else info.memory_mib - memory,
        )

    def version(self) -> int:
        changes = self._rooms.changes
        return changes if self._running is None else changes + self._running.changes

    def listen(self, callback: Touch) -> None:
        """``callback(name)`` when a node's room may have changed, ``callback(None)``
        when any may have; called before ``version`` moves."""
        self._rooms.listen(callback)
        if self._running is not None:
            self._running.listen(callback)


def item_room_fields(item: NodeItem) -> RoomFields:
    """(name, device list, allocatable) of a node as the extender decoded it (request
    or node watch), for ``NodeRooms``. A node with an unusable GPU annotation has no
    device list here, as filter excludes it (``NodeItem.annotations``): it scores 0."""
    annotations, problem = item.annotations()
    return (
        item.name,
        None if problem is not None else annotations.get(DEVICES_ANNOTATION),
        (bytes(item.allocatable[0]), bytes(item.allocatable[1])),
    )


def node_room_fields(obj: Mapping[str, Any]) -> RoomFields:
    """``item_room_fields`` of a Node given as a decoded JSON object (tests, the packing
    benchmark); a malformed object has no room."""
    try:
        view = msgspec.json.decode(json.dumps(obj).encode(), type=NodeView)
    except (msgspec.DecodeError, TypeError, ValueError):
        meta = obj.get("metadata") if isinstance(obj, Mapping) else None
        name = meta.get("name") if isinstance(meta, Mapping) else None
        return (name if isinstance(name, str) else "", None, NO_ALLOCATABLE)
    return item_room_fields(node_item(view))


# -- ranking --------------------------------------------------------------------------
class Ranker:
    """Raw priorities ``scoreWeight·score − lossWeight·LOSS_POINTS_PER_GPU·loss`` per
    node for a pod shape, cached per (weights, shape, mix version) and refreshed for the
    nodes that changed."""

    def __init__(self, rooms: NodeRooms, pods: RunningPods | None) -> None:
        self.rooms = rooms
        self.pods = pods
        self._prior_only = (1, mix_with_prior({}))
        # (weights, shape) -> (node -> raw, node state -> raw): nodes in the same state
        # (layout, free devices, CPU and memory) share one computation
        self._tables: dict[
            tuple[float, float, PodShape], tuple[dict[str, float], dict[Any, float]]
        ] = {}
        self._before: dict[str, tuple[Any, float]] = {}  # node -> (key, fragmentation)
        self._version = 0
        self._lock = threading.Lock()
        rooms.listen(self._changed)
        if pods is not None:
            pods.listen(self._changed)

    def _changed(self, name: str | None) -> None:
        with self._lock:
            if name is None:
                self._tables = {}
                self._before = {}
            else:
                for table, _ in self._tables.values():
                    table.pop(name, None)
                self._before.pop(name, None)

    def mix(self) -> tuple[int, PodMix]:
        return self.pods.mix() if self.pods is not None else self._prior_only

    def raw(self, weights: tuple[float, float], shape: PodShape, names: list[str]) -> list[float]:
        """Raw priority per name (request order), ``MISSING`` where the node has no
        usable device list or too few free devices."""
        version, mix = self.mix()
        with self._lock:
            if version != self._version:
                self._version = version
                self._tables = {}
                self._before = {}
            key = (weights[0], weights[1], shape)
            entry = self._tables.get(key)
            if entry is None:
                if len(self._tables) >= MAX_TABLES:
                    self._tables = {}
                entry = self._tables[key] = ({}, {})
            table = entry[0]
            try:  # the usual case: every node known for this shape (one C-level pass)
                return list(map(table.__getitem__, names))
            except KeyError:
                pass
            todo = list(filterfalse(table.__contains__, names))
            self._fill(entry, todo, weights, shape, mix)
            return list(map(table.get, names, repeat(MISSING)))

    def _fill(
        self,
        entry: tuple[dict[str, float], dict[Any, float]],
        names: list[str],
        weights: tuple[float, float],
        shape: PodShape,
        mix: PodMix,
    ) -> None:
        table, by_state = entry
        k, cpu, mem = shape
        sw, lw = weights
        lw_points = lw * LOSS_POINTS_PER_GPU
        rooms, pods, before_cache = self.rooms, self.pods, self._before
        known = pods is not None and pods.synced
        for name in names:
            info = rooms.get(name)
            if info is None or len(info.free) < k:
                table[name] = MISSING
                continue
            if known:
                assert pods is not None
                used_cpu, used_mem = pods.requested(name)
                cpu_free = None if info.cpu_milli is None else max(0, info.cpu_milli - used_cpu)
                mem_free = None if info.memory_mib is None else max(0, info.memory_mib - used_mem)
            else:
                cpu_free = mem_free = None  # nothing known about what runs there
            state = (info.layout, info.free, info.cpu_milli, info.memory_mib, cpu_free, mem_free)
            value = by_state.get(state)
            if value is None:
                before = NodeRoom(info.usable, cpu_free, mem_free)
                cached = before_cache.get(name)
                if cached is not None and cached[0] == state:
                    base = cached[1]
                else:
                    base = fragmentation(before, mix)
                    before_cache[name] = (state, base)
                score, after_usable = rooms.after(info, k)
                after = NodeRoom(
                    after_usable,
                    None if cpu_free is None else max(0, cpu_free - cpu),
                    None if mem_free is None else max(0, mem_free - mem),
                )
                loss = placement_loss(before, after, mix, info.capacity, base)
                value = by_state[state] = round(sw * score - lw_points * loss, 9)
            table[name] = value


def rank_scores(raw: list[float], top: int = 10) -> list[int]:
    """Extender scores by rank: the best distinct raw value gets ``top``, the next
    ``top − 1``, ... down to 1 for the rest; ``MISSING`` gets 0. Equal raw values share
    a score, near-equal ones do not collapse as a linear spread would make them."""
    return list(map(rank_map(raw, top).__getitem__, raw))


def rank_map(raw: Iterable[float], top: int = 10) -> dict[float, int]:
    """Raw value -> its score by ``rank_scores``' rule (a dict, so that a caller can map
    the values straight to pre-encoded answers)."""
    distinct = sorted(set(raw) - {MISSING}, reverse=True)
    score = {MISSING: 0}
    for position, value in enumerate(distinct):
        score[value] = max(top - position, 1)
    return score
