"""What the extender knows about nodes and about pods it still has to account for.

``NodeState`` is a node's GPU annotations parsed once: device counts and the score /
loss tables. ``NodeCache`` holds them for ``nodeCacheCapable: true`` (fed by a node
watch); ``StateMemo`` avoids re-parsing unchanged annotations when full nodes arrive
in every request (``nodeCacheCapable: false``).

``BoundPods`` is the "promised but not yet allocated" accounting. A filter call never
says which node the scheduler picks, so the extender learns placements the only
reliable way: by watching pods that are bound (``spec.nodeName`` set), not finished,
and request GPUs. Devices the kubelet has handed out show up as ``allocated`` in the
node's device list; GPUs requested by bound pods beyond that count are promised:

    promised(node) = max(0, Σ GPU requests of bound, unfinished pods on node
                             − devices marked allocated on node)

so a pod that was just bound and whose container has not started yet still blocks
its GPUs, and the promise disappears once the device plugin publishes the allocation.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii
from typing import Any

from ...core.devicelist import DEVICES_ANNOTATION, parse_device_list
from ...core.errors import GpuK8sError
from ...core.scoring import LOSS_LIMIT, LOSSES_ANNOTATION, SCORES_ANNOTATION, parse_table
from .views import GPU_RESOURCE, NodeItem

log = logging.getLogger("gpuk8s.extender")

# eq=False: identity comparison, so ``None in states`` stays a C-level scan
@dataclass(frozen=True, eq=False)
class NodeState:
    name: str
    total: int  # devices advertised (capacity)
    healthy: int
    allocated: int  # healthy or not, held by a container
    free: int  # healthy and not allocated
    scores: Mapping[int, int]
    losses: Mapping[int, int]
    problem: str | None = None  # why the device list is unusable; None when fine
    broken: bool = False  # a GPU annotation is present but unusable (reported)

    @property
    def has_devices_annotation(self) -> bool:
        return self.problem is None


def problem_state(name: str, problem: str) -> NodeState:
    """A node whose GPU annotations are unusable: filter excludes it with ``problem``
    as the reason, prioritize gives it 0, and the cache reports it."""
    return NodeState(name, 0, 0, 0, 0, {}, {}, problem=problem, broken=True)


def parse_node_state(name: str, annotations: Mapping[str, str]) -> NodeState:
    """A node's annotations parsed; a missing or broken device list is a ``problem``.

    Never raises: whatever the annotations hold, the result is a state (possibly with a
    ``problem``), so one node can never fail a request or a cache (re)list."""
    try:
        return _parse_node_state(name, annotations)
    except Exception as err:  # a reader bug or input nobody anticipated: this node only
        log.warning(
            "node annotations unreadable", extra={"node": name, "error": repr(err)[:200]}
        )
        return problem_state(name, f"unreadable GPU annotations ({type(err).__name__})")


def _parse_node_state(name: str, annotations: Mapping[str, str]) -> NodeState:
    raw = annotations.get(DEVICES_ANNOTATION)
    if raw is None:
        return NodeState(
            name,
            0,
            0,
            0,
            0,
            {},
            {},
            problem=f"no {DEVICES_ANNOTATION} annotation (no gpu-device on this node)",
        )
    try:
        entries = parse_device_list(raw)
    except GpuK8sError as err:
        return problem_state(name, f"unusable device list: {err}")
    healthy = sum(1 for e in entries if e.healthy)
    allocated = sum(1 for e in entries if e.allocated)
    free = sum(1 for e in entries if e.healthy and not e.allocated)
    scores = parse_table(annotations.get(SCORES_ANNOTATION))
    losses = parse_table(annotations.get(LOSSES_ANNOTATION), *LOSS_LIMIT)
    return NodeState(name, len(entries), healthy, allocated, free, scores, losses)


def _key(annotations: Mapping[str, str]) -> tuple[str | None, str | None, str | None]:
    return (
        annotations.get(DEVICES_ANNOTATION),
        annotations.get(SCORES_ANNOTATION),
        annotations.get(LOSSES_ANNOTATION),
    )


class StateMemo:
    """Parsed states by node name, reused while the three annotations are unchanged.

    Keyed by the annotation strings (node watch) or by their JSON text as sent in a
    request (``NodeItem.raws``: an unchanged node is then not even decoded). Bounded in
    entries and in the bytes it keeps; over either bound it starts over."""

    def __init__(self, limit: int = 50_000, max_bytes: int = 256 * 1024 * 1024) -> None:
        self._limit = limit
        self._max_bytes = max_bytes
        self._bytes = 0
        self._memo: dict[str, tuple[tuple[Any, ...], NodeState]] = {}

    def _store(self, name: str, key: tuple[Any, ...], size: int, state: NodeState) -> None:
        if len(self._memo) >= self._limit or self._bytes + size > self._max_bytes:
            self._memo.clear()  # rare: start over, stay bounded
            self._bytes = 0
        self._memo[name] = (key, state)
        self._bytes += size

    def get(self, name: str, annotations: Mapping[str, str]) -> NodeState:
        key = _key(annotations)
        hit = self._memo.get(name)
        if hit is not None and hit[0] == key:
            return hit[1]
        state = parse_node_state(name, annotations)
        self._store(name, key, sum(len(v) for v in key if v), state)
        _report(state)
        return state

    def get_item(self, item: NodeItem) -> NodeState:
        """The state of a node as sent in a request (full-list mode)."""
        hit = self._memo.get(item.name)
        if hit is not None and hit[0] == item.raws:  # Raw compares its bytes
            return hit[1]
        annotations, problem = item.annotations()
        if problem is not None:
            state = problem_state(item.name, problem)
        else:
            state = parse_node_state(item.name, annotations)
        # copies: a Raw points into the request body, which must not stay alive
        key = tuple(raw.copy() for raw in item.raws)
        self._store(item.name, key, sum(len(r) for r in key), state)
        _report(state)
        return state


def _report(state: NodeState) -> None:
    """Log a node whose annotations are unusable, once per change of them."""
    if state.broken:
        log.warning(
            "node excluded: unusable GPU annotations",
            extra={"node": state.name, "problem": (state.problem or "")[:300]},
        )


def unresolvable_reason(state: NodeState, need: int) -> str | None:
    """Why no preemption can make the node fit ``need`` GPUs; None when it could fit."""
    if state.problem is not None:
        return f"gpu-aware: {state.problem}"
    if state.healthy < need:
        return (
            f"gpu-aware: node has {state.total} {GPU_RESOURCE} device(s), "
            f"{state.healthy} healthy; the pod needs {need}"
        )
    return None


def short_reason(state: NodeState, need: int, promised: int = 0) -> str:
    """Why the node's free devices do not cover ``need`` (preemption may help)."""
    free = max(state.free - promised, 0)
    extra = f", {promised} promised to bound pods not started yet" if promised else ""
    return (
        f"gpu-aware: {free} of {state.healthy} healthy {GPU_RESOURCE} device(s) free "
        f"({state.allocated} allocated{extra}); the pod needs {need}"
    )


def json_member(name: str, reason: str) -> str:
    """``"name":"reason"`` exactly as ``json.dumps`` (ensure_ascii) writes the pair."""
    return encode_basestring_ascii(name) + ":" + encode_basestring_ascii(reason)


@dataclass
class NeedIndex:
    """The cache's nodes sorted by what they can do for one request size, kept up to
    date on every node event, so filter answers with dict lookups (C speed) per node.

    Each node is in at most one of the three, pre-encoded as JSON: ``fits_json`` (free
    >= need, before promises) maps it to its name as a JSON string, ``short_json``
    (healthy enough, too few free) and ``unresolvable_json`` to a ``"name":"reason"``
    object member; a filter answer joins strings instead of encoding names and
    reasons (encoded once per node event, not per call)."""

    fits_json: dict[str, str] = field(default_factory=dict)
    unresolvable_json: dict[str, str] = field(default_factory=dict)
    short_json: dict[str, str] = field(default_factory=dict)

    def place(self, name: str, state: NodeState | None, need: int) -> None:
        # add before remove would leave a name in two maps; readers tolerate "in none"
        self.unresolvable_json.pop(name, None)
        self.short_json.pop(name, None)
        self.fits_json.pop(name, None)
        if state is None:
            return
        reason = unresolvable_reason(state, need)
        if reason is not None:
            self.unresolvable_json[name] = json_member(name, reason)
        elif state.free < need:
            self.short_json[name] = json_member(name, short_reason(state, need))
        else:
            self.fits_json[name] = encode_basestring_ascii(name)


MAX_INDEXES = 64


class NodeCache:
    """Node name -> ``NodeState`` for ``nodeCacheCapable: true``, fed by a node watch.

    Besides the states it keeps, per request size seen, a ``NeedIndex`` and, per
    (weights, size), the raw priority of every node, all updated incrementally by
    ``upsert``/``delete``; a request then costs a few C-level passes over its names.
    Readers never lock: dicts are replaced on a relist and mutated one key at a time.
    """

    def __init__(self) -> None:
        self._states: dict[str, NodeState] = {}
        self._needs: dict[int, NeedIndex] = {}
        self._synced = threading.Event()
        self._lock = threading.Lock()
        self._memo = StateMemo()
        self._listeners: list[Callable[[str | None], None]] = []
        self._broken: set[str] = set()  # cached nodes with unusable GPU annotations
        self.unreadable = 0  # node objects the watch could not read at all (skipped)

    @property
    def broken(self) -> int:
        """Cached nodes whose GPU annotations are unusable (filter excludes them)."""
        return len(self._broken)

    def skip_unreadable(self, what: str, error: str) -> None:
        """Count and log a node object the watch skipped (no usable name/metadata)."""
        self.unreadable += 1
        log.warning("node object skipped", extra={"object": what[:120], "error": error[:300]})

    def listen(self, callback: Callable[[str | None], None]) -> None:
        """Call ``callback(name)`` after each change to one node, ``callback(None)``
        after a relist (everything may have changed)."""
        self._listeners.append(callback)

    def _notify(self, name: str | None) -> None:
        for callback in self._listeners:
            callback(name)

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    def wait_synced(self, timeout: float) -> bool:
        return self._synced.wait(timeout)

    def _state(self, node: NodeItem | tuple[str, Mapping[str, str]]) -> NodeState:
        if isinstance(node, NodeItem):
            return self._memo.get_item(node)
        return self._memo.get(node[0], node[1])

    def replace(self, nodes: Iterable[NodeItem | tuple[str, Mapping[str, str]]]) -> None:
        """The full list (after a list call): drops nodes not in it. Nodes are given as
        the watch decodes them (``NodeItem``) or as (name, annotations)."""
        fresh: dict[str, NodeState] = {}
        for node in nodes:
            state = self._state(node)
            fresh[state.name] = state
        with self._lock:
            self._broken = {name for name, state in fresh.items() if state.broken}
            self._states = fresh
            self._needs = {}
        self._notify(None)
        self._synced.set()

    def _update(self, name: str, state: NodeState | None) -> None:
        for need, index in self._needs.items():
            index.place(name, state, need)

    def upsert(self, name: str, annotations: Mapping[str, str]) -> None:
        self.upsert_state(self._state((name, annotations)))

    def upsert_item(self, item: NodeItem) -> None:
        self.upsert_state(self._state(item))

    def upsert_state(self, state: NodeState) -> None:
        name = state.name
        with self._lock:
            self._states[name] = state
            if state.broken:
                self._broken.add(name)
            else:
                self._broken.discard(name)
            self._update(name, state)
        self._notify(name)

    def delete(self, name: str) -> None:
        with self._lock:
            self._states.pop(name, None)
            self._broken.discard(name)
            self._update(name, None)
        self._notify(name)

    def get(self, name: str) -> NodeState | None:
        return self._states.get(name)

    def snapshot(self) -> dict[str, NodeState]:
        """The current mapping; callers only read it (updates replace keys atomically)."""
        return self._states

    def need_index(self, need: int) -> NeedIndex:
        index = self._needs.get(need)
        if index is None:
            with self._lock:
                index = self._needs.get(need)
                if index is None:
                    index = NeedIndex()
                    for name, state in self._states.items():
                        index.place(name, state, need)
                    if len(self._needs) >= MAX_INDEXES:
                        self._needs = {}
                    self._needs[need] = index
        return index

    def __len__(self) -> int:
        return len(self._states)


class BoundPods:
    """GPU requests of bound, unfinished pods: pod UID -> (node, gpus), summed per node."""

    def __init__(self) -> None:
        self._pods: dict[str, tuple[str, int]] = {}
        self._per_node: dict[str, int] = {}
        self._lock = threading.Lock()
        self._synced = threading.Event()
        self._listeners: list[Callable[[str | None], None]] = []

    def listen(self, callback: Callable[[str | None], None]) -> None:
        """Call ``callback(node)`` after the GPUs requested on ``node`` may have
        changed, ``callback(None)`` after a relist."""
        self._listeners.append(callback)

    def _notify(self, name: str | None) -> None:
        for callback in self._listeners:
            callback(name)

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    def _drop(self, uid: str) -> str | None:
        old = self._pods.pop(uid, None)
        if old is None:
            return None
        node, gpus = old
        left = self._per_node.get(node, 0) - gpus
        if left > 0:
            self._per_node[node] = left
        else:
            self._per_node.pop(node, None)
        return node

    def set(self, uid: str, node: str | None, gpus: int) -> None:
        """Record (or forget, when ``node`` is None or ``gpus`` is 0) one pod."""
        with self._lock:
            old = self._drop(uid)
            if node and gpus > 0:
                self._pods[uid] = (node, gpus)
                self._per_node[node] = self._per_node.get(node, 0) + gpus
        if old is not None:
            self._notify(old)
        if node and gpus > 0 and node != old:
            self._notify(node)

    def forget(self, uid: str) -> None:
        with self._lock:
            old = self._drop(uid)
        if old is not None:
            self._notify(old)

    def replace(self, pods: Iterable[tuple[str, str | None, int]]) -> None:
        """The full list (after a list call), swapped in at once: readers never see a
        half-filled table during a relist."""
        fresh: dict[str, tuple[str, int]] = {}
        per_node: dict[str, int] = {}
        for uid, node, gpus in pods:
            if node and gpus > 0:
                fresh[uid] = (node, gpus)
        for node, gpus in fresh.values():
            per_node[node] = per_node.get(node, 0) + gpus
        with self._lock:
            self._pods, self._per_node = fresh, per_node
        self._notify(None)
        self._synced.set()

    def per_node(self) -> dict[str, int]:
        """Node -> GPUs requested by its bound pods (live mapping, read only)."""
        return self._per_node

    def requested(self, node: str) -> int:
        return self._per_node.get(node, 0)

    def promised(self, state: NodeState) -> int:
        """GPUs bound pods will take on the node beyond what is already allocated."""
        return max(0, self._per_node.get(state.name, 0) - state.allocated)

    def __len__(self) -> int:
        return len(self._pods)


class Promises:
    """Cached nodes whose bound pods request more GPUs than their device list shows
    allocated: node -> promised GPUs (> 0). Kept current from the cache's and the pod
    tracker's change notifications, so filter checks promises only for these nodes
    (one set-membership pass) instead of comparing counts for every offered node."""

    def __init__(self, cache: NodeCache, pods: BoundPods) -> None:
        self._cache = cache
        self._pods = pods
        self._lock = threading.Lock()
        self._dirty: set[str] = set()
        self._all = True  # recompute everything on the next read
        self._nodes: dict[str, int] = {}
        cache.listen(self._touch)
        pods.listen(self._touch)

    def _touch(self, name: str | None) -> None:
        with self._lock:
            if name is None:
                self._all = True
                self._dirty.clear()
            elif not self._all:
                self._dirty.add(name)

    def _promised(self, name: str, states: Mapping[str, NodeState]) -> int:
        state = states.get(name)
        if state is None:
            return 0
        return self._pods.requested(name) - state.allocated

    def current(self) -> dict[str, int]:
        """Node -> promised GPUs, nodes with promises only (read only)."""
        if self._all or self._dirty:
            with self._lock:
                states = self._cache.snapshot()
                if self._all:
                    self._all = False
                    self._dirty.clear()
                    fresh: dict[str, int] = {}
                    for name, requested in list(self._pods.per_node().items()):
                        state = states.get(name)
                        if state is not None and requested > state.allocated:
                            fresh[name] = requested - state.allocated
                    self._nodes = fresh
                else:
                    nodes = self._nodes
                    for name in self._dirty:
                        promised = self._promised(name, states)
                        if promised > 0:
                            nodes[name] = promised
                        else:
                            nodes.pop(name, None)
                    self._dirty.clear()
        return self._nodes
