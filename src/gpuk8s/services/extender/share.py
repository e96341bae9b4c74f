"""GPU sharing's choice and binding: where a shared pod goes, and ``bind``.

Pods that ask for a sharing resource (``core.sharing``: sGPU, vcuda, MPS) are placed on
a node **and** on GPUs by the extender, because kube-scheduler counts only whole
devices. Map: ``sharednodes`` (a node as sharing sees it), ``ledger`` (who holds what),
``arrivals`` (the request mix), ``podapi`` (the API ``bind`` writes through), and here
``Sharing``: ``filter_parts`` / ``raw`` (filter and prioritize a shared pod,
``_placements`` over the nodes: one answer per node shape and state), ``raw_nogpu``
(pods without GPUs, one value per node state) and ``bind``.

Choice (FGD, Weng et al., ATC '23): the node and GPU where the node's fragmentation
(``core.sharing.node_fragmentation``) rises least against the arriving mix, each
whole-GPU class weighted by its shortage across the cluster (``whole_scarcity``, homes
counted by ``_Homes``); fractional shares first by their waste against the mix's LP
packing (``WASTE_RANK``), whole GPUs among the unshared ones by the topology allocator;
nodes ranked by that rise plus ``CPU_BALANCE`` x the node's CPU imbalance after the
pod. Pods without GPUs go where their CPU and memory strand the least GPU capacity
(``fill_stranded``; then not where they take the last room of the largest pod without
GPUs seen; then ``gpus_per_core``, then the rise: ``LOAD_RANK``; then best fit on CPU).
While the rooms for that largest pod run short (``_short``: no more left than the
observed arrivals expect such pods), every pod -- GPU pods (``NOGPU_ROOM``) and pods
without GPUs alike -- first goes where it takes the fewest of them.

Bind: under one lock choose the GPUs against the ledger and reserve them; then one API
write, the pod's Binding carrying the assignment as annotations (the API server sets them
on the pod with its node, atomically; the Binding's UID must be the pod's): a failure
releases the reservation and leaves the pod as it was. It waits up to
``BIND_WAIT_S`` while another pod of the same node, mode and number of device ids
waits for gpu-device's ``Allocate`` (which learns only that number).

Example (``test_filter_prioritize_bind_best_fit``): on two ``sgpu`` nodes where node
``a`` already holds a 60 % share of one GPU and ``b`` is empty, a pod asking ``sgpu: 1,
vcore: 40`` is kept on both by ``filter_parts``, ranked higher on ``a`` by ``raw`` (it
fills that GPU exactly; ``b`` would open a fresh one), and ``bind`` binds it to ``a``
with ``gpuk8s.io/sharing.assigned`` naming node ``a`` and that GPU.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, runtime_checkable

import msgspec

from ...core.allocator import BestSets
from ...core.sharing import (
    ASSIGNED_ANNOTATION,
    BIND_TIME_ANNOTATION,
    COUNTED_RESOURCE,
    FULL_CORE,
    MODE_EXCLUSIVE,
    PHASE_ALLOCATING,
    PHASE_ANNOTATION,
    SHARING_MODE_LABEL,
    Assignment,
    Candidates,
    Filled,
    Fragmentation,
    GpuCapacity,
    GpuUsage,
    Room,
    ShareClass,
    ShareMix,
    ShareRequest,
    allocate_ids,
    class_homes,
    cpu_balance,
    fill_taken,
    filled,
    free_percent,
    gpus_per_core,
    node_fragmentation,
    shared_candidates,
    weigh_shared,
    whole_rise,
    whole_scarcity,
    wholly_free,
)
from .arrivals import ArrivalMix
from .demand import pod_demand
from .ledger import ALLOCATE_WAIT_S, PENDING_TTL_S, Ledger, view_assignment
from .notify import Touch
from .podapi import KubePodApi, PodApi
from .requeue import Requeue
from .sharednodes import Ids, SharedNode, SharedNodes
from .views import POD, BadRequest

log = logging.getLogger("gpuk8s.extender")

# what the extender's users import from here (the sharing modules' entry points)
__all__ = [
    "ALLOCATE_WAIT_S",
    "PENDING_TTL_S",
    "ArrivalMix",
    "KubePodApi",
    "Ledger",
    "Placement",
    "SharedNodes",
    "Sharing",
    "view_assignment",
]

# bind waits this long for another pod of the same node, mode and number of device ids
# to be Allocated (well inside kube-scheduler's 5 s default extender timeout), then
# fails the binding; kube-scheduler retries the pod after its back-off
BIND_WAIT_S = 2.0
TIE = 1e-3  # weight of "unshared GPUs left on the node" in the best-fit value
# pods without GPUs, after the capacity taken out of use (``fill_stranded``, which
# decides first): -(GPUs per free core, ``gpus_per_core``, in millionths) - the rise of
# fragmentation (percent of a GPU), so the load decides and the rise only among equal or
# near-equal loads (a rise of 50, half a GPU, weighs as much as 0.00005 GPUs per core)
LOAD_RANK = 1e6
# weight of each core of CPU imbalance (``core.sharing.cpu_balance``) next to the rise
# of fragmentation (percent of a GPU): a core in excess counts as 0.5 % of a GPU
# stranded, a core short as 2 % (``BALANCE_SHORT``)
CPU_BALANCE = 0.5
# fractional shares: the waste against the mix's LP packing (``core.sharing.ShareMix``,
# in GPUs) ranks nodes before the rise of fragmentation (percent of a GPU) and the CPU
# balance: a hundred-thousandth of a GPU wasted (1,000) outweighs any rise on a node of
# 8 GPUs (at most 800)
WASTE_RANK = 1e8
MAX_MEMO = 200_000  # placements remembered (per node state and share)
# GPU pods, while the rooms for the largest pod without GPUs seen run short (no more
# left over the nodes than such pods are still expected, ``Sharing._short``): the
# rooms a GPU pod takes rank first, before the waste against the mix's packing
# (``WASTE_RANK`` x at most 8 GPUs) and everything after it
NOGPU_ROOM = 1e12
UNBOUNDED = 1 << 40  # rooms on a node whose CPU and memory are not known


@runtime_checkable
class RoomView(Protocol):
    """Nodes' free CPU millicores and memory MiB (``packing.FreeRoom``), a version that
    moves whenever any may have changed, and which node changed (``listen``: called
    before the version moves)."""

    def __call__(self, name: str) -> tuple[int | None, int | None]: ...

    def version(self) -> int: ...

    def listen(self, callback: Touch) -> None: ...


def _remember(memo: dict[Any, Any], key: Any, value: Any) -> None:
    """``memo[key] = value``, a memo that starts over once it holds ``MAX_MEMO`` entries
    (memory bounded by design; what it held is recomputed on demand)."""
    if len(memo) >= MAX_MEMO:
        memo.clear()
    memo[key] = value


def _holds(room: Room, need: Need) -> bool:
    """Whether a node with ``room`` free (None: not known, limits nothing) has the CPU
    millicores and memory MiB of ``need`` for one more pod."""
    return (room.cpu is None or room.cpu >= need[0]) and (
        room.memory is None or room.memory >= need[1])


def _rooms(room: Room, need: Need) -> int:
    """How many pods asking ``need`` fit in ``room`` side by side (``UNBOUNDED`` where
    neither the room nor the need limits)."""
    counts = [have // want for have, want in ((room.cpu, need[0]), (room.memory, need[1]))
              if have is not None and want > 0]
    return max(min(counts), 0) if counts else UNBOUNDED


class _LargeRooms:
    """The rooms for the largest pod without GPUs seen (``largest``) and the free CPU,
    per node and summed over the nodes (``Sharing._short``); counted again from scratch
    when ``largest`` grows."""

    def __init__(self) -> None:
        self.largest: Need = (0, 0)
        self.rooms = 0
        self.cpu = 0
        self._parts: dict[str, tuple[int, int]] = {}

    def reset(self, largest: Need) -> None:
        self.largest, self.rooms, self.cpu, self._parts = largest, 0, 0, {}

    def count(self, name: str, cpu: int | None, memory: int | None) -> None:
        part = (_rooms(Room(cpu, memory), self.largest), cpu if cpu is not None else 0)
        old = self._parts.get(name, (0, 0))
        self._parts[name] = part
        self.rooms += part[0] - old[0]
        self.cpu += part[1] - old[1]

    def forget(self, name: str) -> None:
        old = self._parts.pop(name, (0, 0))
        self.rooms -= old[0]
        self.cpu -= old[1]


class _Touched:
    """The nodes that may have changed since the last ``take`` (a ``Touch``); its lock
    is taken alone, so a source may touch while holding its own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._names: set[str] | None = None  # None: any node (nothing taken yet)

    def __call__(self, name: str | None) -> None:
        with self._lock:
            if name is None:
                self._names = None
            elif self._names is not None:
                self._names.add(name)

    def take(self) -> set[str] | None:
        """The names touched since the last take (None: any node may have changed)."""
        with self._lock:
            names, self._names = self._names, set()
        return names


# what a request reads of a node: its view, free CPU and memory, its class (shape,
# booked usage, free CPU and memory), its state (free percent per GPU, free CPU and
# memory), that free percent per GPU, and its shape and usage (``_place_shared``);
# class, state, shape and usage as ids (``_NodeKeys``) or as the keys themselves
_Entry = tuple[SharedNode, int | None, int | None, Any, Any, tuple[int, ...], Any]


class _NodeKeys:
    """Per node, what a request reads of it (an ``_Entry``, class and state as ids),
    kept until the node is touched (its view, ledger or room). The sources touch a node
    after the change they announce (``notify.Notifier``, ``Ledger.listen``), so an
    entry read after a ``begin`` is current unless its node is touched later, and
    then the next ``begin`` drops it; an entry read while another request's ``begin``
    ran is not kept (``epoch``). Ids are never reused: equal ids, equal keys."""

    def __init__(self) -> None:
        self.touched = _Touched()
        self._lock = threading.Lock()
        self._epoch = 0
        self._keys: dict[str, _Entry] = {}
        self._ids = Ids(MAX_MEMO)

    def begin(self) -> int:
        """Drop the touched nodes' entries; the epoch to ``keep`` new ones under."""
        names = self.touched.take()
        with self._lock:
            if names is None:
                self._keys.clear()
                self._epoch += 1
            elif names:
                for name in names:
                    self._keys.pop(name, None)
                self._epoch += 1
            return self._epoch

    @property
    def get(self) -> Callable[[str], _Entry | None]:
        """The kept entry of a node, or None (the dict's own ``get``: one lookup per
        node and request, no Python call around it)."""
        return self._keys.get

    def keep(self, epoch: int, name: str, read: _Entry) -> _Entry:
        """``read`` with its class, state, and shape and usage as ids, kept if nothing
        was dropped since ``epoch``."""
        node, cpu, memory, klass, state, free, base = read
        with self._lock:
            entry = (node, cpu, memory, self._ids(klass), self._ids(state), free,
                     self._ids(base))
            if epoch == self._epoch:
                if len(self._keys) >= MAX_MEMO:
                    self._keys.clear()
                self._keys[name] = entry
        return entry


# what the pod asks besides its share: CPU millicores, memory MiB
Need = tuple[int, int]


@dataclass(frozen=True)
class Placement:
    """Where a share goes on one node, or why it cannot."""

    gpus: tuple[int, ...] | None
    reason: str = ""
    unresolvable: bool = False  # no preemption helps (mode, health, problem)
    raw: float = 0.0  # best fit: higher is better


class _Frame(NamedTuple):
    """What ``Sharing._fit`` reads of a node, its booked usage and a share that no mix
    weighs (``Sharing._frame``): ``failed``, an answer no mix changes, or the node's
    GPUs, the usage (read, never changed), its unshared GPUs, the percent free over its
    GPUs after the share, and either the whole GPUs chosen with their link score or the
    shared candidates with each unshared GPU's group rank (``prefer``)."""

    failed: Placement | None
    caps: tuple[GpuCapacity, ...] = ()
    usage: Mapping[int, GpuUsage] = {}
    unshared: int = 0
    left: int = 0
    whole: tuple[tuple[int, ...], float] | None = None
    shared: tuple[Candidates, dict[int, int]] | None = None


# a node as its homes see it: its wholly free GPUs, free CPU millicores and memory MiB
# (``core.sharing.class_homes``); every node without a wholly free GPU is ``NO_HOMES``
_HomeState = tuple[int, int | None, int | None]
NO_HOMES: _HomeState = (0, None, None)


class _Homes:
    """Homes per whole-GPU class of the mix (``wholes``, in the mix's order;
    ``core.sharing.class_homes``), summed over the nodes and kept up to date by
    difference. Kept: each node's part (the state of the node it was counted in, its
    percent free, its homes state) and, per distinct homes state, its nodes and its
    homes per class. A node that moves takes its old state's homes out of the totals
    and puts its new state's in; a change of the mix's whole-GPU classes counts the
    classes over the distinct states, never over the nodes (most nodes share a state),
    and reads no node again."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.version: Any = None
        self.wholes: tuple[ShareClass, ...] = ()
        self.totals: list[int] = []
        self.free = 0  # percent free over the nodes counted
        self._parts: dict[str, tuple[Any, int, _HomeState]] = {}
        # per homes state: [its nodes, its homes per class of ``wholes``]
        self._states: dict[_HomeState, list[Any]] = {}

    def classes(self, version: Any, wholes: tuple[ShareClass, ...]) -> None:
        """Follow the mix of ``version``, whose whole-GPU classes are ``wholes``: a
        class new to the mix counted once per distinct state, the others kept."""
        self.version = version
        if wholes == self.wholes:
            return
        was = {klass: at for at, klass in enumerate(self.wholes)}
        # per class: where the state's homes of it are kept already, or -1: count them
        where = [was.get(klass, -1) for klass in wholes]
        totals = [0] * len(wholes)
        for state, kept in self._states.items():
            old = kept[1]
            homes = kept[1] = tuple(
                old[at] if at >= 0 else class_homes(*state, klass) if state[0] else 0
                for at, klass in zip(where, wholes, strict=True))
            times = kept[0]
            totals = [t + h * times for t, h in zip(totals, homes, strict=True)]
        self.wholes, self.totals = wholes, totals

    @staticmethod
    def _homes(state: _HomeState, wholes: tuple[ShareClass, ...]) -> tuple[int, ...]:
        if state[0] == 0:
            return (0,) * len(wholes)
        return tuple(class_homes(*state, klass) for klass in wholes)

    def at(self, name: str) -> Any:
        part = self._parts.get(name)
        return part[0] if part is not None else None

    def count(self, name: str, at: Any, free: int, state: _HomeState) -> None:
        """Node ``name`` counted in the node state ``at``: ``free`` percent free over
        its GPUs, ``state`` for its homes (``NO_HOMES`` without a wholly free GPU)."""
        old = self._parts.get(name)
        self._parts[name] = (at, free, state)
        if old is None:
            self.free += free
            self._move(state, 1)
        else:
            self.free += free - old[1]
            if old[2] != state:
                self._move(old[2], -1)
                self._move(state, 1)

    def _move(self, state: _HomeState, times: int) -> None:
        """One node into (``times`` 1) or out of (-1) ``state``, with its homes."""
        kept = self._states.get(state)
        if kept is None:
            kept = self._states[state] = [0, self._homes(state, self.wholes)]
        kept[0] += times
        if not kept[0]:
            del self._states[state]
        if state[0]:
            self.totals = [t + h * times for t, h in zip(self.totals, kept[1], strict=True)]

    def keep(self, names: set[str]) -> None:
        """Forget the nodes not in ``names``."""
        if len(names) < len(self._parts):
            for name in [n for n in self._parts if n not in names]:
                self.forget(name)

    def forget(self, name: str) -> None:
        part = self._parts.pop(name, None)
        if part is not None:
            self.free -= part[1]
            self._move(part[2], -1)


class Sharing:
    """The extender's GPU-sharing decisions."""

    def __init__(
        self,
        nodes: SharedNodes,
        ledger: Ledger,
        api: PodApi | None = None,
        clock: Callable[[], float] = time.time,
        free_room: Callable[[str], tuple[int | None, int | None]] | None = None,
        arrivals: ArrivalMix | None = None,
        requeue: Requeue | None = None,
    ) -> None:
        self.nodes = nodes
        # pods turned away, nudged when the ledger frees a share (requeue.py)
        self.requeue = requeue if requeue is not None else Requeue(None)
        self.ledger = ledger
        self.api = api
        self._clock = clock
        # a node's free CPU millicores and memory MiB (None: not known, limits nothing);
        # a ``RoomView`` also says when and where it changed, a plain function is taken
        # as changed everywhere at every request
        self._free_room = free_room
        self._room = free_room if isinstance(free_room, RoomView) else None
        self.arrivals = arrivals if arrivals is not None else ArrivalMix()
        # the mix follows what stays: a pod bound here is placed until the ledger
        # no longer holds it (deleted or finished)
        self.arrivals.follow(lambda uid: ledger.get(uid) is not None)
        self._lock = threading.Lock()
        # per request (share, pod CPU and memory, mix version): the class of (node
        # shape, its usage, its free CPU and memory; ``_NodeKeys``' id of it) ->
        # placement, what the nodes of one shape and state share (``_placements``);
        # ``_classes``: the entries over all requests
        self._by_class: dict[tuple[Any, ...], dict[Any, Placement]] = {}
        self._classes = 0
        # (shape and usage id, share, mix version, where the room falls before and
        # after the pod) -> ``_fit``'s answer, shared by rooms that fall alike
        # (``_place_shared``)
        self._by_room: dict[tuple[Any, ...], tuple[Placement, int]] = {}
        # (shape and usage id, share) -> what ``_fit`` reads that no mix weighs
        # (``_frame``), so that a new mix version or room only weighs it again
        self._frames: dict[tuple[Any, ...], _Frame] = {}
        # (mix version, (free percents, where the room falls) -> the fragmentation):
        # ``_fragmentation``'s answers under the latest mix version
        self._frags: tuple[Any, dict[tuple[Any, ...], float]] = (None, {})
        # the latest filter's placements per node and what they depended on (``_state``)
        self._answers: tuple[tuple[Any, ...], dict[str, Placement]] | None = None
        # per node what the ledger books there (``_usage``): ((ledger version, view
        # identity), usage per GPU index, its hashable key, percent free per GPU)
        self._usages: dict[str, tuple[tuple[int, int], dict[int, GpuUsage], tuple[Any, ...],
                                      tuple[int, ...]]] = {}
        # what pods without GPUs share across nodes of one state: (free percent per GPU,
        # free CPU and memory, mix version) -> (the node filled with each class, its
        # fragmentation) before the pod; with the pod's CPU and memory added -> its value
        # (``_nogpu_class``)
        self._nogpu_base: dict[tuple[Any, ...], tuple[Filled, float]] = {}
        self._nogpu_class: dict[tuple[Any, ...], tuple[float, ...]] = {}
        # the largest CPU and the largest memory a pod without GPUs asked (``raw_nogpu``)
        self._nogpu_largest: Need = (0, 0)
        # the rooms for it over the nodes, counted with the homes (``_scarce_mix``)
        self._large = _LargeRooms()
        # the mix with whole-GPU classes weighted by their shortage (``whole_scarcity``):
        # ((ledger change, node views' changes, mix version, room version), (version,
        # scaled mix)); the homes counted for it (``_Homes``)
        self._scarce: tuple[tuple[Any, ...], tuple[Any, ShareMix]] | None = None
        self._homes = _Homes()
        # the nodes whose homes may have moved since the last recount
        self._touched = _Touched()
        # per node its class key until touched (``_placements``); None where the rooms
        # cannot say when they move (a plain function)
        self._keys = _NodeKeys() if self._room is not None or free_room is None else None
        for touched in (self._touched, self._keys.touched if self._keys else None):
            if touched is not None:
                nodes.listen(touched)
                ledger.listen(touched)
                if self._room is not None:
                    self._room.listen(touched)
        # the allocator's best sets, shared by the nodes of one topology
        self._sets = BestSets()
        self.binds = 0
        self.bind_failures = 0
        # binds refused after waiting ``bind_wait_s`` for another pod's Allocate
        self.bind_waits = 0
        self.bind_wait_s = BIND_WAIT_S
        # with several replicas: "" while this one may book (the Lease holder), else why
        # not (``leader.gate``); None: one replica, it always may
        self.gate: Callable[[], str] | None = None

    def place(
        self,
        name: str,
        share: ShareRequest,
        without: str = "",
        cpu_milli: int = 0,
        memory_mib: int = 0,
        mixed: tuple[Any, ShareMix] | None = None,
    ) -> Placement:
        """Where ``share`` goes on node ``name`` for a pod requesting ``cpu_milli`` and
        ``memory_mib`` (``without``: a pod whose own assignment does not count, e.g. on a
        re-bind; ``mixed``: ``_scarce_mix()`` when the caller took it already)."""
        mixed = mixed if mixed is not None else self._scarce_mix()
        return self._placements(share, [name], without, (cpu_milli, memory_mib), mixed)[name]

    def _placements(
        self,
        share: ShareRequest,
        names: list[str],
        without: str,
        need: Need,
        mixed: tuple[Any, ShareMix],
    ) -> dict[str, Placement]:
        """``place`` for each of ``names``, shared by the nodes of one shape
        (``SharedNode.shape``) and state: the same GPUs, usage and room give the same
        answer whatever the node's name, so one lookup per node finds it (what is the
        same for every node -- the request, the mix, the pod's own assignment -- is
        looked up once). A node that holds ``without``'s share, or has no view, is
        placed alone every time."""
        mix_version, mix = mixed
        own = self.ledger.get(without) if without else None
        mine = own.node if own is not None else None
        request = (share, need, mix_version)
        classes = self._by_class.get(request)
        if classes is None:
            classes = self._by_class[request] = {}
            self._classes += 1
        keys = self._keys
        epoch = keys.begin() if keys is not None else 0
        get = keys.get if keys is not None else None
        out: dict[str, Placement] = {}
        for name in names:
            entry = get(name) if get is not None else None
            if entry is not None and name != mine:  # most nodes: one lookup more
                placed = classes.get(entry[3])
                if placed is not None:
                    out[name] = placed
                    continue
            if entry is None:
                entry = self._node_entry(name, epoch)
                if entry is None:
                    out[name] = self._place(None, name, share, without, Room(), mix)
                    continue
            node, cpu, memory, klass = entry[0], entry[1], entry[2], entry[3]
            if name == mine:
                room = Room(cpu, memory, *need)
                out[name] = self._place(node, name, share, without, room, mix)
                continue
            placed = classes.get(klass)
            if placed is None:
                placed = self._place_shared(node, entry[6], share, Room(cpu, memory, *need),
                                            mix_version, mix)
                if self._classes >= MAX_MEMO:
                    self._by_class.clear()
                    classes = self._by_class[request] = {}
                    self._classes = 0
                classes[klass] = placed
                self._classes += 1
            out[name] = placed
        return out

    def _node_entry(self, name: str, epoch: int) -> _Entry | None:
        """What a request reads of node ``name`` (None: no view), read now and kept
        until the node is touched (``_NodeKeys``, under ``epoch``); a node with a
        problem takes no pod, its room is not read."""
        node = self.nodes.get(name)
        if node is None:
            return None
        cpu, memory = (self._free_room(name) if self._free_room is not None
                       and node.problem is None else (None, None))
        shape = node.shape if node.shape is not None else (name, id(node))
        _, usage_key, free = self._usage(node)
        read = (node, cpu, memory, (shape, usage_key, cpu, memory), (free, cpu, memory), free,
                (shape, usage_key))
        return read if self._keys is None else self._keys.keep(epoch, name, read)

    def _usage(
        self, node: SharedNode
    ) -> tuple[dict[int, GpuUsage], tuple[Any, ...], tuple[int, ...]]:
        """What the ledger books on ``node``: usage per GPU index now, the same as a
        hashable key, and percent free per usable GPU (``core.sharing.free_percent``);
        read once per ledger version of the node and view of it (a GPU leaving the bus
        renumbers the others). The usage is shared: its readers do not change it."""
        name = node.name
        version = (self.ledger.version(name), id(node))
        known = self._usages.get(name)
        if known is None or known[0] != version:
            usage = self.ledger.usage(name, index_by_id=node.index_by_id)
            key = tuple((index, u.core, u.memory_mib, u.shares, u.exclusive)
                        for index, u in sorted(usage.items()))
            known = (version, usage, key, tuple(free_percent(node.gpus, usage).values()))
            _remember(self._usages, name, known)
        return known[1], known[2], known[3]

    def _scarce_mix(self) -> tuple[Any, ShareMix]:
        """The arrival mix with each whole-GPU class weighted by its shortage of homes
        across the cluster (``core.sharing.whole_scarcity``), and its version."""
        version, mix = self.arrivals.mix()
        rooms: Any = None
        if self._free_room is not None:
            rooms = self._room.version() if self._room is not None else object()
        key = (self.ledger.change, self.nodes.changes, version, rooms)
        hit = self._scarce
        if hit is not None and hit[0] == key:
            return hit[1]
        homes = self._homes
        with homes.lock:  # requests run in threads: one recount at a time
            touched = self._touched.take()
            if homes.version != version:  # classes new to the mix: counted per node state
                homes.classes(version, tuple(mix.classes[at][0] for at in mix.wholes))
            large = self._large
            if large.largest != self._nogpu_largest:
                large.reset(self._nogpu_largest)
                touched = None
            if touched is None or (self._free_room is not None and self._room is None):
                seen = set()
                large.reset(large.largest)
                for node in self.nodes.all():
                    if self._recount(node):
                        seen.add(node.name)
                    self._count_large(node)
                homes.keep(seen)
            else:  # only the nodes whose ledger, view or room moved
                for name in touched:
                    view = self.nodes.get(name)
                    if view is None or not self._recount(view):
                        homes.forget(name)
                    if view is None:
                        large.forget(name)
                    else:
                        self._count_large(view)
            factors = whole_scarcity(homes.totals, homes.free, mix)
        scaled_version = (version, tuple(sorted(factors.items())))
        if hit is not None and hit[1][0] == scaled_version:
            scaled = hit[1]  # the same factors: the same scaled mix
        else:
            scaled = (scaled_version, mix.scaled(factors))
        self._scarce = (key, scaled)
        return scaled

    def _recount(self, node: SharedNode) -> bool:
        """Count ``node``'s homes again if its state moved since (under the homes'
        lock); False: sharing pods do not go there (problem, exclusive mode)."""
        if node.problem is not None or node.mode == MODE_EXCLUSIVE:
            return False
        name = node.name
        cpu, memory = self._free_room(name) if self._free_room is not None else (None, None)
        at = (id(node), self.ledger.version(name), cpu, memory)
        if self._homes.at(name) != at:
            free = self._usage(node)[2]
            full = wholly_free(free)
            self._homes.count(name, at, sum(free), (full, cpu, memory) if full else NO_HOMES)
        return True

    def _count_large(self, node: SharedNode) -> None:
        """Count ``node``'s rooms for the largest pod without GPUs again (under the
        homes' lock); a node with a problem takes no pod."""
        if node.problem is not None:
            self._large.forget(node.name)
            return
        room = self._free_room(node.name) if self._free_room is not None else (None, None)
        self._large.count(node.name, *room)

    def _short(self) -> Need | None:
        """The largest pod without GPUs seen while its rooms run short, else None: no
        more rooms for it over the nodes (``_LargeRooms``) than pods that need one are
        still expected -- the share of such pods among the observed arrivals
        (``ArrivalMix.large``), per GPU and per core they ask, times the GPUs and the
        CPU still free, the larger of the two (the fill assumption of
        ``whole_scarcity``: pods keep coming while either has room; the smaller, which
        would end the count when the CPU runs out, woke the rule too late on the
        CPU-short cluster, see docs/benchmarks.md)."""
        largest = self._large.largest
        if largest == (0, 0):
            return None
        pods, gpus, cpu = self.arrivals.large(largest)
        if pods == 0:
            return None
        with self._homes.lock:
            rooms, free_cpu = self._large.rooms, self._large.cpu
            free_gpus = self._homes.free / FULL_CORE
        expected = pods * free_gpus / gpus if gpus > 0 else float("inf")
        if cpu > 0:
            expected = max(expected, pods * free_cpu / cpu)
        return largest if rooms <= expected else None

    def _place(
        self,
        node: SharedNode | None,
        name: str,
        share: ShareRequest,
        without: str,
        room: Room,
        mix: ShareMix,
    ) -> Placement:
        return self._balanced(*self._fit(node, name, share, without, room, mix), room, mix)

    def _place_shared(
        self, node: SharedNode, base: Any, share: ShareRequest, room: Room,
        mix_version: Any, mix: ShareMix,
    ) -> Placement:
        """``_place`` for a node whose shape and booked usage have the id ``base``:
        ``_fit`` reads the room only where it falls among the values the mix's classes
        ask (``ShareMix.room_key``, before and after the pod), so nodes of one shape and
        usage whose rooms fall alike share it, whatever the pod's CPU and memory; the
        CPU balance, which reads the room itself, is added per room."""
        after = room.after()
        key = (base, share, mix_version, mix.room_key(room.cpu, room.memory),
               mix.room_key(after.cpu, after.memory))
        fit = self._by_room.get(key)
        if fit is None:
            # what no mix weighs, kept per shape and usage and share: a new mix version
            # or room weighs it again instead of placing the share again
            frame = self._frames.get((base, share))
            if frame is None:
                frame = self._frame(node, node.name, share, "")
                _remember(self._frames, (base, share), frame)
            fit = self._fit(node, node.name, share, "", room, mix, frame,
                            self._fragmentation(mix_version, mix))
            _remember(self._by_room, key, fit)
        return self._balanced(*fit, room, mix)

    def _fragmentation(self, mix_version: Any, mix: ShareMix) -> Fragmentation:
        """``node_fragmentation`` against ``mix`` (of version ``mix_version``), each
        answer kept per free percents and where the room falls among the values the
        mix's classes ask (``ShareMix.room_key``: rooms with one key get one answer),
        while the mix version stays: nodes of many shapes and usages share free
        percents (an empty 8-GPU node) and weigh them alike."""
        kept = self._frags
        if kept[0] != mix_version:
            kept = self._frags = (mix_version, {})
        answers = kept[1]
        room_key = mix.room_key

        def fragmentation(free: Sequence[int], room: Room) -> float:
            key = (tuple(free), room_key(room.cpu, room.memory))
            value = answers.get(key)
            if value is None:
                value = node_fragmentation(free, room, mix)
                _remember(answers, key, value)
            return value

        return fragmentation

    @staticmethod
    def _balanced(placed: Placement, free: int, room: Room, mix: ShareMix) -> Placement:
        """``placed`` with the CPU balance of the node it leaves (``free``: percent
        free over its GPUs after the pod): the node whose free CPU stays in step with
        its free GPU capacity ranks higher."""
        if placed.gpus is None or mix.cpu_per_gpu is None or room.cpu is None:
            return placed
        imbalance = cpu_balance(free, room.after(), mix.cpu_per_gpu)
        return Placement(placed.gpus, placed.reason, placed.unresolvable,
                         round(placed.raw - CPU_BALANCE * imbalance, 9))

    def _fit(self, node: SharedNode | None, name: str, share: ShareRequest, without: str,
             room: Room, mix: ShareMix, frame: _Frame | None = None,
             fragmentation: Fragmentation | None = None) -> tuple[Placement, int]:
        """Where ``share`` goes on ``node`` before the CPU balance (``_balanced``), and
        the percent free over its GPUs after it: the ``_frame`` (what no mix reads;
        ``frame``: one kept for this node's shape, usage and the share) weighed with
        ``mix`` (``fragmentation``: ``node_fragmentation`` against it, or kept answers
        of it)."""
        if frame is None:
            frame = self._frame(node, name, share, without)
        if frame.failed is not None:
            return frame.failed, 0
        if frame.whole is not None:
            gpus, score = frame.whole
            rise = (whole_rise(frame.caps, frame.usage, gpus, mix, room, fragmentation)
                    if mix else 0.0)
            # least rise of fragmentation; then the best-linked set; then the fewest
            # unshared GPUs left (best fit)
            placed = Placement(gpus, raw=-round(rise, 9) + TIE * score / 100
                               - TIE**2 * (frame.unshared - share.gpus))
            return placed, frame.left
        assert frame.shared is not None
        candidates, prefer = frame.shared
        chosen = weigh_shared(candidates, share, mix, room, fragmentation)
        assert chosen.gpus is not None  # the frame has enough candidates
        fresh = sum(1 for i in chosen.gpus if i in prefer)
        # least waste against the mix's LP packing first, then the least rise of the
        # node's fragmentation; then, opening a GPU, the node with the fewest unshared
        # GPUs after it (whole nodes stay whole)
        placed = Placement(
            tuple(chosen.gpus),
            raw=-WASTE_RANK * chosen.waste
            - round(chosen.rise, 9)
            - TIE * (frame.unshared - fresh),
        )
        return placed, frame.left

    def _frame(self, node: SharedNode | None, name: str, share: ShareRequest,
               without: str) -> _Frame:
        """What ``_fit`` reads of ``node``, its booked usage (``without``: that pod's
        share not counted) and ``share`` that no mix weighs: why the share cannot go
        there, or the GPUs it can take (whole: the topology allocator's choice; shared:
        the candidates best fit first, ``core.sharing.shared_candidates``)."""
        if node is None:
            return _Frame(Placement(None, "gpu-aware: node not in the extender's node cache yet"))
        if node.problem is not None:
            return _Frame(Placement(None, f"gpu-aware: {node.problem}", True))
        if node.mode != share.mode:
            return _Frame(Placement(
                None,
                f"gpu-aware: node sharing mode is {node.mode!r} ({SHARING_MODE_LABEL}); "
                f"the pod asks for {share.mode!r}",
                True,
            ))
        healthy = sum(1 for g in node.gpus if g.healthy)
        if healthy < share.gpus:
            return _Frame(Placement(
                None,
                f"gpu-aware: node has {healthy} healthy GPU(s); the pod needs {share.gpus}",
                True,
            ))
        # the node's booked usage as read (``_placements`` passes ``without`` only for
        # the node that holds that pod's share)
        usage = (self.ledger.usage(name, without, node.index_by_id) if without
                 else self._usage(node)[0])
        # unshared GPUs per link group: opening a GPU where few are left keeps whole
        # groups (and nodes) for the multi-GPU pods
        unshared = [
            g.index
            for g in node.gpus
            if g.healthy and g.free_whole and (g.index not in usage or usage[g.index].empty)
        ]
        left = sum(free_percent(node.gpus, usage).values()) - share.core * share.gpus
        if share.whole:
            whole = self._whole_gpus(node, usage, share, self._sets)
            if isinstance(whole, Placement):
                return _Frame(whole)
            return _Frame(None, node.gpus, usage, len(unshared), left, whole=whole)
        per_group: dict[object, int] = {}
        for index in unshared:
            key = node.groups.get(index)
            per_group[key] = per_group.get(key, 0) + 1
        prefer = {i: per_group.get(node.groups.get(i), 0) for i in unshared}
        candidates = shared_candidates(node.gpus, usage, share, prefer)
        if candidates.ok is None:
            return _Frame(Placement(None, f"gpu-aware: {candidates.why}"))
        return _Frame(None, node.gpus, usage, len(unshared), left,
                      shared=(candidates, prefer))

    @staticmethod
    def _whole_gpus(
        node: SharedNode,
        usage: dict[int, GpuUsage],
        share: ShareRequest,
        sets: BestSets,
    ) -> tuple[tuple[int, ...], float] | Placement:
        """The whole GPUs the topology allocator picks for ``share`` and their link
        score, or why it cannot."""
        free = [
            pos
            for pos, g in enumerate(node.gpus)
            if g.healthy and g.free_whole and (usage.get(g.index) is None or usage[g.index].empty)
        ]
        if len(free) < share.gpus or node.topology is None:
            return Placement(
                None,
                f"gpu-aware: {len(free)} whole GPU(s) unshared and free; "
                f"the pod needs {share.gpus}",
            )
        chosen, key = sets(node.topology, free, share.gpus)
        gpus = tuple(sorted(node.gpus[p].index for p in chosen))
        return gpus, float(key[0]) if key else 0.0

    # -- filter / prioritize ----------------------------------------------------
    def filter_parts(
        self, share: ShareRequest, names: list[str], uid: str = "", need: Need = (0, 0)
    ) -> tuple[list[str], dict[str, str], dict[str, str]]:
        """(nodes kept, failed, unresolvable); the pod counts as an arrival of the mix.
        The placements are kept for the pod's prioritize (``raw``) while nothing moves."""
        self.arrivals.observe(uid, share, *need)
        keep: list[str] = []
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        mixed = self._scarce_mix()
        table = self._placements(share, names, uid, need, mixed)
        for name in names:
            placed = table[name]
            if placed.gpus is not None:
                keep.append(name)
            elif placed.unresolvable:
                unresolvable[name] = placed.reason
            else:
                failed[name] = placed.reason
        state = self._state(share, uid, need, mixed[0])
        self._answers = (state, table) if state is not None else None
        return keep, failed, unresolvable

    def raw(
        self, share: ShareRequest, names: list[str], uid: str = "", need: Need = (0, 0)
    ) -> list[float | None]:
        """Placement value per node, higher is better (None where the share does not fit);
        the pod's filter answers where nothing moved since (``_state``)."""
        out: list[float | None] = []
        mixed = self._scarce_mix()
        state = self._state(share, uid, need, mixed[0])
        answers = self._answers
        table = answers[1] if answers is not None and state is not None and (
            answers[0] == state) else {}
        missing = [name for name in names if name not in table]
        if missing:
            table = {**table, **self._placements(share, missing, uid, need, mixed)}
        short = self._short()
        for name in names:
            placed = table[name]
            if placed.gpus is None:
                out.append(None)
            elif short is None:
                out.append(placed.raw)
            else:  # the rooms the pod takes from the largest pods without GPUs
                cpu, memory = (self._free_room(name) if self._free_room is not None
                               else (None, None))
                room = Room(cpu, memory, *need)
                lost = _rooms(room, short) - _rooms(room.after(), short)
                out.append(round(placed.raw - NOGPU_ROOM * lost, 9))
        return out

    def _state(
        self, share: ShareRequest, uid: str, need: Need, mix_version: Any
    ) -> tuple[Any, ...] | None:
        """What every placement of this pod depends on: the request, the ledger, the
        node views, the rooms and the mix (None: the rooms cannot say when they move)."""
        if self._free_room is not None and self._room is None:
            return None
        rooms = self._room.version() if self._room is not None else None
        return (share, uid, need, self.ledger.change, self.nodes.changes, rooms, mix_version)

    def raw_nogpu(self, names: list[str], need: Need, uid: str = "") -> list[float | None]:
        """Placement value per node for a pod without GPUs asking ``need`` (CPU
        millicores, memory MiB), higher is better (only the order counts: the values
        are ranks among ``names``). First the least free GPU capacity its CPU and
        memory take out of use, each request class of the mix filling the node alone
        (``core.sharing.fill_stranded``: an empty 8-GPU node whose cores would fall
        below what an 8-GPU pod asks loses that class's whole use). Then, among nodes
        where that is equal, the least free GPU capacity per free core left after the
        pod (``core.sharing.gpus_per_core``: a node with no free GPU capacity, or with
        much CPU for it, loses the least by feeding the pod; a GPU-dense node whose
        cores its GPUs need, the most), then, among equal or near-equal loads
        (``LOAD_RANK``), the least rise of the node's fragmentation that its CPU and
        memory cause (FGD's measure, which the paper applies to pods without GPUs too).
        Between the first and the second: a node that could hold the largest pod
        without GPUs seen so far (its CPU and its memory, each the largest asked) and
        would not after this pod comes last (on a cluster short of CPU, small pods
        spread over the CPU-rich nodes otherwise leave no node for the large ones); and
        after the last, the node left with the least free CPU (best fit: large holes
        stay large). None for a node gpu-aware has no usable view of. The pod (``uid``)
        counts as an arrival of its size (``ArrivalMix.observe_plain``)."""
        self.arrivals.observe_plain(uid, *need)
        mix_version, mix = self.arrivals.mix()
        with self._lock:
            largest = self._nogpu_largest = (
                max(self._nogpu_largest[0], need[0]), max(self._nogpu_largest[1], need[1]))
        self._scarce_mix()  # the rooms for the largest counted now (``_short``)
        short = self._short() is not None
        keys = self._keys
        epoch = keys.begin() if keys is not None else 0
        get = keys.get if keys is not None else None
        # (minus the capacity taken out of use, minus the load and rise) per node, once
        # per node state; None for a node with no usable view
        values: dict[Any, tuple[float, ...]] = {}
        ranked: list[tuple[float, ...] | None] = []
        for name in names:
            entry = get(name) if get is not None else None
            if entry is None:
                entry = self._node_entry(name, epoch)
            if entry is None or entry[0].problem is not None:
                ranked.append(None)
                continue
            value = values.get(entry[4])
            if value is None:
                value = values[entry[4]] = self._nogpu_class_value(
                    entry[5], entry[1], entry[2], need, mix_version, mix, largest, short)
            ranked.append(value)
        known = sorted({value for value in ranked if value is not None})
        order = {value: float(at) for at, value in enumerate(known)}
        return [None if value is None else order[value] for value in ranked]

    def _nogpu_class_value(
        self,
        free: tuple[int, ...],
        cpu: int | None,
        memory: int | None,
        need: Need,
        mix_version: int,
        mix: ShareMix,
        largest: Need = (0, 0),
        short: bool = False,
    ) -> tuple[float, ...]:
        """``raw_nogpu``'s value from all it reads (the node's free percent per GPU, its free
        CPU and memory, the pod's, the mix, the largest pod without GPUs seen), shared by
        the nodes of one state: most of a cluster's nodes are alike, and a pod without
        GPUs would otherwise fill each of them with every class of the mix again."""
        key = (free, cpu, memory, need, mix_version, largest, short)
        ranked = self._nogpu_class.get(key)
        if ranked is not None:
            return ranked
        room = Room(cpu, memory, *need)
        after = room.after()
        at = (free, cpu, memory, mix_version)
        base = self._nogpu_base.get(at)
        if base is None:
            base = (filled(free, room, mix), node_fragmentation(free, room, mix))
            _remember(self._nogpu_base, at, base)
        fill_before, frag_before = base
        stranded = fill_taken(fill_before, after, mix)
        rise = node_fragmentation(free, after, mix) - frag_before
        load = gpus_per_core(sum(free), after)
        value = -rise if load is None else -round(load, 6) * LOAD_RANK - rise
        left = after.cpu if after.cpu is not None else 0
        if short:  # the rooms it takes from the largest first (``_short``)
            lost = _rooms(room, largest) - _rooms(after, largest)
            ranked = (-float(lost), -round(stranded, 6), round(value, 9), -float(left))
        else:
            breaks = _holds(room, largest) and not _holds(after, largest)
            ranked = (-round(stranded, 6), -float(breaks), round(value, 9), -float(left))
        _remember(self._nogpu_class, key, ranked)
        return ranked

    # -- bind ---------------------------------------------------------------------
    def bind(self, ns: str, name: str, uid: str, node: str) -> tuple[int, str]:
        """Bind pod ``ns/name`` of UID ``uid`` to ``node``: (HTTP status, the
        ExtenderBindingResult ``Error``, "" on success); the pod's demand is computed
        from the pod as the API has it (``demand.pod_demand``). A binding
        kube-scheduler would never ask for is a 4xx and books nothing: a pod that is
        not the one of that UID (404, 409), one already bound (409), one asking for no
        GPUs (400); the caller (``Extender``) has checked that the node passed this
        pod's filter. A failure of ours or of the API is a 200 with the Error
        (kube-scheduler retries the pod)."""
        if self.api is None:
            return 200, "gpu-aware: bind needs API access (the pod watch is off)"
        if not self.ledger.synced:
            return 200, "gpu-aware: GPU sharing accounting not synced with the API server yet"
        try:
            pod = self.api.get_pod(ns, name)
        except Exception as err:
            if getattr(err, "status", None) == 404:
                return 404, f"gpu-aware: no pod {ns}/{name}"
            return 200, f"gpu-aware: cannot read pod {ns}/{name}: {_short(err)}"
        try:
            view = POD.decode(json.dumps(pod).encode())
            demand = pod_demand(view, lenient=True)
        except (msgspec.DecodeError, BadRequest) as err:
            return 400, f"gpu-aware: pod {ns}/{name}: {err}"
        meta = view.metadata
        if meta is None or meta.uid != uid:
            found = meta.uid if meta is not None else None
            return 409, f"gpu-aware: pod {ns}/{name} is not the pod {uid} (its UID: {found})"
        bound = view.spec.nodeName if view.spec is not None else None
        if bound:
            return 409, f"gpu-aware: pod {ns}/{name} is already bound to {bound}"
        share, cpu_milli, memory_mib = demand.share, demand.cpu_milli, demand.memory_mib
        if share is None and not demand.gpus:
            return 400, (
                f"gpu-aware: pod {ns}/{name} asks for no GPUs: gpu-aware binds only the GPU "
                "pods it places (list the GPU resources in the extender's managedResources, "
                "so that kube-scheduler binds the other pods itself)"
            )
        if share is None:  # whole GPUs: bind as the default binder would
            return 200, self._bind_plain(ns, name, uid, node)
        deadline = time.monotonic() + self.bind_wait_s
        while True:
            change = self.ledger.change
            refused = self.gate() if self.gate is not None else ""
            if refused:  # another replica books shared GPUs (leader.py)
                return 200, refused
            with self._lock:  # choose and reserve atomically: no two binds share a choice
                placed = self.place(node, share, uid, cpu_milli, memory_mib)
                if placed.gpus is None:
                    return 200, f"{placed.reason} (pod {ns}/{name} on {node})"
                if not self.ledger.awaiting_allocate(node, share, uid):
                    assignment = Assignment(node, placed.gpus, share,
                                            self._stable_ids(node, placed.gpus))
                    self.ledger.reserve(uid, assignment)
                    break
            left = deadline - time.monotonic()
            if left <= 0:
                self.bind_waits += 1
                return 200, (
                    f"gpu-aware: another pod on {node} asking for {allocate_ids(share)} "
                    f"{COUNTED_RESOURCE[share.mode]} still waits for gpu-device's Allocate, "
                    "which tells such pods apart only by that number; retry "
                    f"(pod {ns}/{name})"
                )
            self.ledger.wait_for_change(change, left)
        annotations = {
            ASSIGNED_ANNOTATION: assignment.to_json(),
            BIND_TIME_ANNOTATION: str(int(self._clock() * 1e9)),
            PHASE_ANNOTATION: PHASE_ALLOCATING,
        }
        try:  # one write: the API server refuses it for another UID or a bound pod (409)
            self.api.bind(ns, name, uid, node, annotations)
        except Exception as err:
            self.ledger.release(uid)
            self.bind_failures += 1
            return 200, f"gpu-aware: binding {ns}/{name} to {node} failed: {_short(err)}"
        self.binds += 1
        self.arrivals.placed(uid)
        self.requeue.forget(uid)
        log.info(
            "pod bound with shared GPUs",
            extra={"pod": f"{ns}/{name}", "node": node, "gpus": list(placed.gpus)},
        )
        return 200, ""

    def _stable_ids(self, node: str, gpus: tuple[int, ...]) -> tuple[str, ...]:
        """The stable ids of ``node``'s GPUs ``gpus`` (indexes now) from its device
        list; () when it names one of them not (an old record's shape, read by index)."""
        view = self.nodes.get(node)
        ids = view.ids if view is not None else {}
        return tuple(ids[i] for i in gpus) if all(i in ids for i in gpus) else ()

    def _bind_plain(self, ns: str, name: str, uid: str, node: str) -> str:
        assert self.api is not None
        try:
            self.api.bind(ns, name, uid, node)
        except Exception as err:
            return f"gpu-aware: binding {ns}/{name} to {node} failed: {_short(err)}"
        return ""


def _short(err: Exception) -> str:
    status = getattr(err, "status", None)
    reason = getattr(err, "reason", None)
    if status is not None:
        return f"HTTP {status} {reason or ''}".strip()
    return f"{type(err).__name__}: {str(err)[:200]}"
