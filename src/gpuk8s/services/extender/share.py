"""GPU sharing in the extender: per-GPU accounting, filter/prioritize, and ``bind``.

Pods that ask for a sharing resource (``core.sharing``: sGPU, vcuda, MPS) are placed
on a node **and** on GPUs by the extender, because kube-scheduler only counts whole
devices:

* ``SharedNodes``: per node, its sharing mode (label ``gpuk8s.io/sharing-mode``), its
  physical GPUs (the whole-GPU entries of the device-list annotation: health, whether
  a whole-GPU container holds one) and their memory (the ``gpu.memory`` label), plus
  the topology of those GPUs for whole-GPU vcuda requests (``core.allocator``).
* ``Ledger``: pod UID -> ``Assignment`` from the pods' ``gpuk8s.io/sharing.assigned``
  annotations (a watch on all pods), plus the extender's own reservations not yet
  seen by the watch. Usage per GPU is summed from it, so a restarted extender rebuilds
  its accounting from the annotations (the watch's first list) before it binds again.
* ``Sharing.bind``: under one lock, choose the GPUs against the ledger and reserve
  them; then write the assignment on the pod (a patch carrying the pod's
  ``resourceVersion``: the API refuses it if the pod changed since it was read) and
  bind it (``pods/binding``). A failure releases the reservation and removes the
  annotation. Concurrent binds therefore never over-commit a GPU within one extender
  (the chart runs one replica). gpu-device's ``Allocate`` learns only a number of
  device ids from the kubelet (``core.sharing.allocate_ids``), so bind waits (up to
  ``BIND_WAIT_S``) while another pod of the same node, mode and number of ids waits
  for ``Allocate`` (the ledger follows the ``phase`` annotation): the plugin then
  always has exactly one pod to match.

Placement follows FGD (Weng et al., ATC '23): the node and GPU where the node's
fragmentation rises least (``core.sharing.node_fragmentation``: the free GPU capacity
that the request mix cannot use, a node's free CPU being a hard limit for each request
class), measured against the mix of the sharing pods that *arrive* (``ArrivalMix``,
the pods seen by ``filter``, placed or not), not only of those that run, each of its
whole-GPU classes weighing more by its shortage across the cluster
(``core.sharing.whole_scarcity``: a class's pods still to come, at the mix's GPUs per
pod, with those of its GPU count that need as much CPU and memory or more, over the
nodes' homes for it -- ``k`` wholly free GPUs and the free CPU and memory to feed
them, ``_Homes`` --; 1 while the homes suffice): FGD's rise sees one node, and without
it 1-GPU pods broke the 8-GPU nodes that 8-GPU pods needed (openb ``multigpu40``:
8-GPU homes ran out at arrived ~88 %). Fractional
shares go first where they lose least against the tightest packing of that mix
(``ShareMix.prices``: the configuration LP of the mix's share sizes, ``core.binpack``;
a share that completes or opens a GPU as that packing would loses nothing, one that
leaves a GPU with room the mix can no longer fill as well loses the difference), node
and GPU alike (``WASTE_RANK``), then by the rise of fragmentation (ties: best fit, then
the link group with the fewest unshared GPUs); whole GPUs (``vcuda-core`` multiples of
100) are chosen among the unshared ones by the topology allocator, and the node by the
same rise. Nodes are ranked by that rise plus ``CPU_BALANCE`` x the node's CPU
imbalance after the pod (``core.sharing.cpu_balance``: how far its free CPU is from
what its free GPU capacity needs at the arriving pods' CPU per GPU, a core short
counting four in excess): on the openb trace the pods that fail at the end are those
that find free GPUs only on nodes whose CPU is spent.

Pods without GPUs reach gpu-aware only through the scheduler's second, prioritize-only
entry (``core.schedconf.NOGPU_VERB``, ``ExtenderSpec.rank_nogpu``); ``raw_nogpu`` ranks
them first by the free GPU capacity their CPU and memory take out of use when the node
is filled with each request class of the mix alone (``core.sharing.fill_stranded``: an
empty 8-GPU node whose cores would fall below what an 8-GPU pod asks loses that class's
whole use), then by the free GPU capacity left per free core
(``core.sharing.gpus_per_core``), the least first: their CPU goes where it strands the
least GPU capacity per core -- nodes whose GPUs are taken, then the CPU-rich ones -- and
GPU-dense nodes keep their cores for GPU pods; among equal or near-equal loads
(``LOAD_RANK``), where their CPU and memory raise the node's fragmentation least (FGD's
measure). No threshold sized for a cluster: the nodes' own free CPU and GPUs and the
arriving pods decide.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

import msgspec

from ...core.allocator import BestSets
from ...core.devicelist import DEVICES_ANNOTATION, parse_device_list
from ...core.errors import GpuK8sError
from ...core.scoring import topology_from_devices
from ...core.sharing import (
    ASSIGNED_ANNOTATION,
    BIND_TIME_ANNOTATION,
    COUNTED_RESOURCE,
    DEFAULT_SHARE_MIX,
    FULL_CORE,
    MODE_EXCLUSIVE,
    PHASE_ALLOCATING,
    PHASE_ANNOTATION,
    SHARING_MODE_LABEL,
    Assignment,
    Filled,
    GpuCapacity,
    GpuUsage,
    Room,
    ShareClass,
    ShareMix,
    ShareRequest,
    SharingError,
    allocate_ids,
    check_mode,
    choose_shared,
    cpu_balance,
    fill_taken,
    filled,
    free_percent,
    gpus_per_core,
    memory_label_mib,
    node_fragmentation,
    parse_assignment,
    whole_homes,
    whole_rise,
    whole_scarcity,
)
from ...core.topology import Topology
from .. import kube
from .demand import pod_demand
from .notify import Notifier, Touch
from .requeue import Requeue
from .views import POD, BadRequest, NodeItem, PodView

log = logging.getLogger("gpuk8s.extender")

# a reservation the watch has not confirmed yet survives a relist this long
PENDING_TTL_S = 120.0
# bind waits this long for another pod of the same node, mode and number of device ids
# to be Allocated (well inside kube-scheduler's 5 s default extender timeout), then
# fails the binding; kube-scheduler retries the pod after its back-off
BIND_WAIT_S = 2.0
# a pod bound this long ago that still waits for Allocate (its kubelet is away, say)
# holds the others back no longer
ALLOCATE_WAIT_S = 300.0
MIX_DRIFT = 0.05  # re-take the request mix after this share of its weight changed
MIX_PRIOR = 0.1  # weight of DEFAULT_SHARE_MIX next to the arrived pods' requests
ARRIVALS = 20_000  # sharing pods remembered for the request mix (the latest)
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
    return SharedNode(item.name, mode, gpus, topology, groups=groups)


@runtime_checkable
class RoomView(Protocol):
    """Nodes' free CPU millicores and memory MiB (``packing.FreeRoom``), a version that
    moves whenever any may have changed, and which node changed (``listen``: called
    before the version moves)."""

    def __call__(self, name: str) -> tuple[int | None, int | None]: ...

    def version(self) -> int: ...

    def listen(self, callback: Touch) -> None: ...


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


class SharedNodes(Notifier):
    """Node name -> ``SharedNode``; re-parsed only when its inputs change (``changes``
    moves and the listeners hear of the node whenever its view changes)."""

    def __init__(self) -> None:
        super().__init__()
        self._nodes: dict[str, tuple[Any, SharedNode]] = {}
        self._lock = threading.Lock()

    def observe(self, item: NodeItem) -> SharedNode:
        key = (bytes(item.raws[0]), bytes(item.labels[0]), bytes(item.labels[1]))
        hit = self._nodes.get(item.name)
        if hit is not None and hit[0] == key:
            return hit[1]
        node = shared_node(item)
        with self._lock:
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
            self._nodes = fresh
            self._notify(None)

    def get(self, name: str) -> SharedNode | None:
        hit = self._nodes.get(name)
        return hit[1] if hit is not None else None

    def all(self) -> list[SharedNode]:
        return [node for _, node in list(self._nodes.values())]


class Ledger:
    """Assignments of live pods (from their annotations) and our own reservations,
    indexed per node (usage of a node costs the pods on it, not all pods)."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        on_free: Callable[[], None] | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._clock = clock
        self._wall = wall  # bind times are wall-clock (the pods' annotation)
        # called (under the ledger's lock) when a pod's share goes away or changes
        self._on_free = on_free
        self._watched: dict[str, Assignment] = {}
        # our reservations: assignment, expiry (``clock``), when reserved (``wall``)
        self._pending: dict[str, tuple[Assignment, float, float]] = {}
        # uid -> bind time (``wall``) of watched pods still waiting for Allocate
        self._awaiting: dict[str, float] = {}
        self._effective: dict[str, Assignment] = {}
        self._by_node: dict[str, dict[str, Assignment]] = {}
        self._versions: dict[str, int] = {}
        self._listeners: list[Touch] = []
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._change = 0  # moves at every update (``wait_for_change``)
        self._synced = threading.Event()

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    def listen(self, callback: Touch) -> None:
        """``callback(node)`` (under the ledger's lock) whenever what the pods hold on
        ``node`` changed (its ``version``), before ``change`` moves."""
        self._listeners.append(callback)

    def _bump(self, node: str) -> None:
        self._versions[node] = self._versions.get(node, 0) + 1
        for callback in self._listeners:
            callback(node)

    def wait_synced(self, timeout: float) -> bool:
        return self._synced.wait(timeout)

    def _refresh(self, uid: str) -> None:
        """Recompute what ``uid`` holds (a reservation wins over what the watch saw)."""
        pending = self._pending.get(uid)
        now = pending[0] if pending is not None else self._watched.get(uid)
        before = self._effective.get(uid)
        if now == before:
            return
        if before is not None:
            on = self._by_node.get(before.node)
            if on is not None:
                on.pop(uid, None)
                if not on:
                    del self._by_node[before.node]
            self._bump(before.node)
            if self._on_free is not None:
                self._on_free()
        if now is None:
            self._effective.pop(uid, None)
        else:
            self._effective[uid] = now
            self._by_node.setdefault(now.node, {})[uid] = now
            self._bump(now.node)

    def _changed_all(self) -> None:
        self._change += 1
        self._changed.notify_all()

    def set(
        self,
        uid: str,
        assignment: Assignment | None,
        deleted: bool = False,
        awaiting: float | None = None,
    ) -> None:
        """What the watch saw for a pod (None: no assignment, or finished); ``awaiting``:
        its bind time while it waits for Allocate (``view_assignment``).

        A reservation of ours stays until the watch shows that very assignment, or the
        pod is deleted: an older event of the pod (seen after we reserved) must not
        free GPUs we just promised."""
        with self._lock:
            pending = self._pending.get(uid)
            if deleted or (pending is not None and pending[0] == assignment):
                self._pending.pop(uid, None)
            if assignment is None:
                self._watched.pop(uid, None)
            else:
                self._watched[uid] = assignment
            if assignment is None or awaiting is None:
                self._awaiting.pop(uid, None)
            else:
                self._awaiting[uid] = awaiting
            self._refresh(uid)
            self._changed_all()

    def replace(
        self, pods: Iterable[tuple[str, Assignment]], awaiting: Mapping[str, float] | None = None
    ) -> None:
        """The full list (``awaiting``: uid -> bind time of those waiting for Allocate);
        reservations not in it yet stay until ``PENDING_TTL_S``."""
        with self._lock:
            self._watched = dict(pods)
            self._awaiting = {
                uid: since for uid, since in (awaiting or {}).items() if uid in self._watched
            }
            now = self._clock()
            self._pending = {
                uid: entry
                for uid, entry in self._pending.items()
                if uid not in self._watched and entry[1] > now
            }
            for uid in set(self._effective) | set(self._watched) | set(self._pending):
                self._refresh(uid)
            self._changed_all()
        self._synced.set()

    def reserve(self, uid: str, assignment: Assignment) -> None:
        """Our choice for a pod we are binding: it waits for Allocate from now on."""
        with self._lock:
            self._pending[uid] = (assignment, self._clock() + PENDING_TTL_S, self._wall())
            self._refresh(uid)
            self._changed_all()

    def release(self, uid: str) -> None:
        with self._lock:
            self._pending.pop(uid, None)
            self._watched.pop(uid, None)
            self._awaiting.pop(uid, None)
            self._refresh(uid)
            self._changed_all()

    def awaiting_allocate(self, node: str, share: ShareRequest, without: str = "") -> bool:
        """Whether a pod on ``node`` (other than ``without``) waits for Allocate with
        ``share``'s mode and number of device ids, bound within ``ALLOCATE_WAIT_S``."""
        ids = allocate_ids(share)
        cutoff = self._wall() - ALLOCATE_WAIT_S
        with self._lock:
            for uid, held in self._by_node.get(node, {}).items():
                if uid == without or held.share.mode != share.mode:
                    continue
                pending = self._pending.get(uid)
                since = pending[2] if pending is not None else self._awaiting.get(uid)
                if since is not None and since > cutoff and allocate_ids(held.share) == ids:
                    return True
        return False

    @property
    def change(self) -> int:
        return self._change

    def wait_for_change(self, change: int, timeout: float) -> bool:
        """Wait until the ledger moved past ``change`` (True) or ``timeout`` passed."""
        with self._changed:
            return self._changed.wait_for(lambda: self._change != change, timeout)

    def assignments(self) -> dict[str, Assignment]:
        with self._lock:
            return dict(self._effective)

    def reserved(self) -> list[str]:
        """UIDs of our reservations the pod watch has not confirmed yet."""
        with self._lock:
            return list(self._pending)

    def get(self, uid: str) -> Assignment | None:
        return self._effective.get(uid)

    def version(self, node: str) -> int:
        """Moves whenever what the pods hold on ``node`` changes."""
        return self._versions.get(node, 0)

    def usage(self, node: str, without: str = "") -> dict[int, GpuUsage]:
        """GPU index -> usage on ``node`` (leaving out the pod ``without``)."""
        per: dict[int, GpuUsage] = {}
        with self._lock:
            pods = list(self._by_node.get(node, {}).items())
        for uid, a in pods:
            if uid != without:
                for index in a.gpus:
                    per.setdefault(index, GpuUsage()).add(a.share)
        return per

    def __len__(self) -> int:
        return len(self._effective)


class ArrivalMix:
    """The request mix that placements are measured against: the requests of the
    sharing pods the extender was asked to place (``filter``), each pod once (by UID),
    the latest ``ARRIVALS`` of them -- pods that found no room included: FGD measures
    fragmentation against the workload that arrives, and a mix of the running pods
    alone forgets exactly the requests that failed -- blended with ``prior`` (weight
    ``MIX_PRIOR``; CPU 0). A class is (GPUs, percent of each, CPU millicores, memory
    MiB) and weighs the number of its pods, as FGD's typical pods do (an 8-GPU pod counts
    as much as a quarter-GPU one: weighing classes by the GPUs they ask let the rare
    large pods decide, and fragmented the GPUs the many small ones use). The mix is
    re-taken when ``MIX_DRIFT`` of its pods changed, so placements memoised per mix
    version stay valid meanwhile."""

    def __init__(
        self,
        prior: tuple[tuple[int, float], ...] = DEFAULT_SHARE_MIX,
        window: int = ARRIVALS,
    ) -> None:
        self._prior = prior
        self._window = window
        self._seen: OrderedDict[str, ShareClass] = OrderedDict()
        self._pods: dict[ShareClass, int] = {}  # class -> pods in the window
        self._total = 0
        self._drift = 0
        self._lock = threading.Lock()
        self._mix: tuple[int, ShareMix] = (1, self._take())

    def observe(self, uid: str, share: ShareRequest, cpu_milli: int, memory_mib: int = 0) -> None:
        """A pod the scheduler asks about (once per UID; the oldest leave the window)."""
        if not uid or uid in self._seen:
            return
        pct = FULL_CORE if share.whole else min(max(share.core, 0), FULL_CORE)
        if pct <= 0:
            return  # best effort: reserves nothing, strands nothing
        klass = (share.gpus, pct, max(cpu_milli, 0), max(memory_mib, 0))
        with self._lock:
            self._seen[uid] = klass
            self._pods[klass] = self._pods.get(klass, 0) + 1
            self._total += 1
            self._drift += 1
            while len(self._seen) > self._window:
                _, old = self._seen.popitem(last=False)
                left = self._pods.get(old, 0) - 1
                if left > 0:
                    self._pods[old] = left
                else:
                    self._pods.pop(old, None)
                self._total -= 1
                self._drift += 1

    def _take(self) -> ShareMix:
        total = self._total
        blend: dict[ShareClass, float] = dict(self._pods)
        prior = sum(w for _, w in self._prior)
        scale = MIX_PRIOR * max(total, 1.0) / prior if prior > 0 else 0.0
        for pct, w in self._prior:
            klass = (1, pct, 0, 0)
            blend[klass] = blend.get(klass, 0.0) + w * scale
        # CPU per GPU of the arrived pods: their CPU over the GPUs they ask for, a class
        # (GPUs, percent, CPU) of n pods asking n x GPUs x percent / 100 GPUs
        cpu = sum(n * c[2] for c, n in self._pods.items())
        gpus = sum(n * c[0] * c[1] / FULL_CORE for c, n in self._pods.items())
        return ShareMix(blend, cpu_per_gpu=cpu / gpus if gpus > 0 else None)

    def mix(self) -> tuple[int, ShareMix]:
        """(version, mix)."""
        if self._drift <= MIX_DRIFT * max(self._total, 1.0):
            return self._mix
        with self._lock:
            if self._drift <= MIX_DRIFT * max(self._total, 1.0):
                return self._mix  # another thread re-took it while this one waited
            self._mix = (self._mix[0] + 1, self._take())
            self._drift = 0
            return self._mix

    def __len__(self) -> int:
        return len(self._seen)


def view_assignment(view: PodView) -> tuple[str, Assignment | None, float | None]:
    """(uid, the live assignment or None, its bind time in seconds since the epoch while
    it waits for Allocate, else None) of a pod from the API; finished pods and
    unreadable annotations hold nothing (the latter is logged)."""
    meta = view.metadata
    uid = (meta.uid if meta is not None else None) or ""
    phase = view.status.phase if view.status is not None else None
    ann = meta.annotations if meta is not None else None
    if ann is None or not ann.assigned or phase in ("Succeeded", "Failed"):
        return uid, None, None
    try:
        raw = msgspec.json.decode(bytes(ann.assigned))
        assignment = parse_assignment(raw if isinstance(raw, str) else None)
    except (msgspec.DecodeError, SharingError) as err:
        log.warning("pod sharing annotation unreadable", extra={"uid": uid, "error": str(err)})
        return uid, None, None
    bound = view.spec.nodeName if view.spec is not None else None
    if assignment is not None and bound and bound != assignment.node:
        # not an assignment bind wrote (bind annotates, then binds to that very node):
        # it holds nothing anywhere
        log.warning(
            "pod sharing annotation names another node than the pod's; ignored",
            extra={"uid": uid, "node": bound, "assigned": assignment.node},
        )
        return uid, None, None
    return uid, assignment, _awaiting_since(ann.phase, ann.bind_time)


def _awaiting_since(phase: msgspec.Raw, bind_time: msgspec.Raw) -> float | None:
    """The bind time (epoch seconds) of a pod whose phase annotation is ``allocating``;
    0.0 when the bind time is unreadable (it then holds nobody back)."""
    try:
        if not phase or msgspec.json.decode(bytes(phase)) != PHASE_ALLOCATING:
            return None
        raw = msgspec.json.decode(bytes(bind_time)) if bind_time else ""
        return int(raw) / 1e9 if isinstance(raw, str) and raw.isdigit() else 0.0
    except (msgspec.DecodeError, ValueError):
        return None


# tries of the choice's write when the pod changed meanwhile for another reason
_RECORD_ATTEMPTS = 3


class PodApi(Protocol):
    """The API calls ``bind`` makes (``KubePodApi``; tests may pass their own)."""

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]: ...

    def annotate(
        self, namespace: str, name: str, resource_version: str, annotations: dict[str, str | None]
    ) -> None: ...

    def bind(self, namespace: str, name: str, uid: str, node: str) -> None: ...


class KubePodApi:
    """``PodApi`` over the kubernetes client (pods get/patch, pods/binding create)."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes import client

        self._core = client.CoreV1Api(api_client)

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        resp: Any = self._core.read_namespaced_pod(name, namespace, _preload_content=False)
        data: dict[str, Any] = json.loads(kube.body(resp))
        return data

    def annotate(
        self, namespace: str, name: str, resource_version: str, annotations: dict[str, str | None]
    ) -> None:
        """Set annotations if the pod is still at ``resource_version`` (409 otherwise)."""
        self._patch_metadata(
            namespace, name, {"resourceVersion": resource_version, "annotations": annotations}
        )

    def touch(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        """Set annotations whatever the pod's version (``requeue.PodToucher``)."""
        self._patch_metadata(namespace, name, {"annotations": annotations})

    def _patch_metadata(self, namespace: str, name: str, metadata: dict[str, Any]) -> None:
        kube.body(
            self._core.patch_namespaced_pod(
                name,
                namespace,
                {"metadata": metadata},
                _content_type="application/merge-patch+json",
                _preload_content=False,
            )
        )

    def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        body: Any = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        kube.body(
            self._core.create_namespaced_pod_binding(name, namespace, body, _preload_content=False)
        )


# what the pod asks besides its share: CPU millicores, memory MiB
Need = tuple[int, int]
# what a memoised placement depends on: node identity, ledger version of the node,
# mix version, the node's free CPU and memory
_Version = tuple[int, int, object, int | None, int | None]


@dataclass(frozen=True)
class Placement:
    """Where a share goes on one node, or why it cannot."""

    gpus: tuple[int, ...] | None
    reason: str = ""
    unresolvable: bool = False  # no preemption helps (mode, health, problem)
    raw: float = 0.0  # best fit: higher is better


class _Homes:
    """Homes per whole-GPU class of one mix version (``core.sharing.whole_homes``),
    summed over the nodes, with each node's part and the state it was counted in, so
    that a recount adds up only the nodes that changed."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.version: Any = None
        self.totals: list[int] = []
        self.free = 0  # percent free over the nodes counted
        self._parts: dict[str, tuple[Any, int, tuple[int, ...]]] = {}

    def reset(self, version: Any, classes: int) -> None:
        self.version, self.totals, self.free, self._parts = version, [0] * classes, 0, {}

    def at(self, name: str) -> Any:
        part = self._parts.get(name)
        return part[0] if part is not None else None

    def count(self, name: str, at: Any, free: int, homes: tuple[int, ...]) -> None:
        old = self._parts.get(name)
        self._parts[name] = (at, free, homes)
        if old is None:
            self.free += free
            self.totals = [t + h for t, h in zip(self.totals, homes, strict=True)]
        else:  # one pass: the node's old part out, its new part in
            self.free += free - old[1]
            self.totals = [t + h - o for t, h, o in zip(self.totals, homes, old[2], strict=True)]

    def keep(self, names: set[str]) -> None:
        """Forget the nodes not in ``names``."""
        if len(names) < len(self._parts):
            for name in [n for n in self._parts if n not in names]:
                self.forget(name)

    def forget(self, name: str) -> None:
        part = self._parts.pop(name, None)
        if part is not None:
            self.free -= part[1]
            self.totals = [t - h for t, h in zip(self.totals, part[2], strict=True)]


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
        self._lock = threading.Lock()
        # (node, share, pod CPU and memory) -> ((node identity, ledger version, mix
        # version, node's free CPU and memory), placement)
        self._memo: dict[tuple[str, ShareRequest, int, int], tuple[_Version, Placement]] = {}
        # (node, pod CPU and memory) -> (same version, value) for pods without GPUs
        self._nogpu_memo: dict[tuple[str, int, int], tuple[_Version, tuple[float, float]]] = {}
        # per node: (its state, free percent per GPU, the node filled with each class and
        # its fragmentation before a pod without GPUs) -- the same for every such pod
        # until it changes
        self._nogpu_base: dict[str, tuple[_Version, list[int], Filled, float]] = {}
        # the mix with whole-GPU classes weighted by their shortage (``whole_scarcity``):
        # ((ledger change, node views' changes, mix version, room version), (version,
        # scaled mix)); the homes counted for it (``_Homes``); per node ((node
        # identity, ledger version), percent free per GPU), which pods without GPUs
        # read too (``_free_percents``)
        self._scarce: tuple[tuple[Any, ...], tuple[Any, ShareMix]] | None = None
        self._homes = _Homes()
        # the nodes whose homes may have moved since the last recount
        self._touched = _Touched()
        nodes.listen(self._touched)
        ledger.listen(self._touched)
        if self._room is not None:
            self._room.listen(self._touched)
        self._free_of: dict[str, tuple[tuple[int, int], list[int]]] = {}
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
        ``memory_mib`` (memoised per node state and request; ``without``: a pod whose
        own assignment does not count, e.g. on a re-bind; ``mixed``: ``_scarce_mix()``
        when the caller took it once for many nodes)."""
        node = self.nodes.get(name)
        own = self.ledger.get(without) if without else None
        cpu, memory = self._free_room(name) if self._free_room is not None else (None, None)
        room = Room(cpu, memory, cpu_milli, memory_mib)
        mix_version, mix = mixed if mixed is not None else self._scarce_mix()
        if node is None or (own is not None and own.node == name):
            return self._place(node, name, share, without, room, mix)
        key = (name, share, cpu_milli, memory_mib)
        version = (id(node), self.ledger.version(name), mix_version, cpu, memory)
        hit = self._memo.get(key)
        if hit is not None and hit[0] == version:
            return hit[1]
        placed = self._place(node, name, share, without, room, mix)
        if len(self._memo) >= MAX_MEMO:
            self._memo.clear()
        self._memo[key] = (version, placed)
        return placed

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
            if homes.version != version:
                homes.reset(version, len(mix.wholes))
                touched = None
            if touched is None or (self._free_room is not None and self._room is None):
                seen = set()
                for node in self.nodes.all():
                    if self._recount(node, mix):
                        seen.add(node.name)
                homes.keep(seen)
            else:  # only the nodes whose ledger, view or room moved
                for name in touched:
                    view = self.nodes.get(name)
                    if view is None or not self._recount(view, mix):
                        homes.forget(name)
            factors = whole_scarcity(homes.totals, homes.free, mix)
        scaled_version = (version, tuple(sorted(factors.items())))
        if hit is not None and hit[1][0] == scaled_version:
            scaled = hit[1]  # the same factors: the same scaled mix
        else:
            scaled = (scaled_version, mix.scaled(factors))
        self._scarce = (key, scaled)
        return scaled

    def _recount(self, node: SharedNode, mix: ShareMix) -> bool:
        """Count ``node``'s homes again if its state moved since (under the homes'
        lock); False: sharing pods do not go there (problem, exclusive mode)."""
        if node.problem is not None or node.mode == MODE_EXCLUSIVE:
            return False
        name = node.name
        cpu, memory = self._free_room(name) if self._free_room is not None else (None, None)
        at = (id(node), self.ledger.version(name), cpu, memory)
        if self._homes.at(name) != at:
            free = self._free_percents(node)
            self._homes.count(name, at, sum(free), whole_homes(free, Room(cpu, memory), mix))
        return True

    def _free_percents(self, node: SharedNode) -> list[int]:
        """Percent free per usable GPU of ``node`` (``core.sharing.free_percent``),
        cached until the node's view or its ledger version changes."""
        at = (id(node), self.ledger.version(node.name))
        known = self._free_of.get(node.name)
        if known is None or known[0] != at:
            known = (at, list(free_percent(node.gpus, self.ledger.usage(node.name)).values()))
            if len(self._free_of) >= MAX_MEMO:
                self._free_of.clear()
            self._free_of[node.name] = known
        return known[1]

    def _place(
        self,
        node: SharedNode | None,
        name: str,
        share: ShareRequest,
        without: str,
        room: Room,
        mix: ShareMix,
    ) -> Placement:
        if node is None:
            return Placement(None, "gpu-aware: node not in the extender's node cache yet")
        if node.problem is not None:
            return Placement(None, f"gpu-aware: {node.problem}", True)
        if node.mode != share.mode:
            return Placement(
                None,
                f"gpu-aware: node sharing mode is {node.mode!r} ({SHARING_MODE_LABEL}); "
                f"the pod asks for {share.mode!r}",
                True,
            )
        healthy = sum(1 for g in node.gpus if g.healthy)
        if healthy < share.gpus:
            return Placement(
                None,
                f"gpu-aware: node has {healthy} healthy GPU(s); the pod needs {share.gpus}",
                True,
            )
        usage = self.ledger.usage(name, without)
        # unshared GPUs per link group: opening a GPU where few are left keeps whole
        # groups (and nodes) for the multi-GPU pods
        unshared = [
            g.index
            for g in node.gpus
            if g.healthy and g.free_whole and (g.index not in usage or usage[g.index].empty)
        ]
        per_group: dict[object, int] = {}
        for index in unshared:
            key = node.groups.get(index)
            per_group[key] = per_group.get(key, 0) + 1
        if share.whole:
            placed = self._place_whole(node, usage, share, len(unshared), room, mix, self._sets)
        else:
            prefer = {i: per_group.get(node.groups.get(i), 0) for i in unshared}
            chosen = choose_shared(node.gpus, usage, share, prefer, mix, room)
            if chosen.gpus is None:
                return Placement(None, f"gpu-aware: {chosen.why}")
            fresh = sum(1 for i in chosen.gpus if i in prefer)
            # least waste against the mix's LP packing first, then the least rise of
            # the node's fragmentation; then, opening a GPU, the node with the fewest
            # unshared GPUs after it (whole nodes stay whole)
            placed = Placement(
                tuple(chosen.gpus),
                raw=-WASTE_RANK * chosen.waste
                - round(chosen.rise, 9)
                - TIE * (len(unshared) - fresh),
            )
        if placed.gpus is None or mix.cpu_per_gpu is None or room.cpu is None:
            return placed
        # and the node whose free CPU stays in step with its free GPU capacity
        free = sum(free_percent(node.gpus, usage).values()) - share.core * share.gpus
        imbalance = cpu_balance(free, room.after(), mix.cpu_per_gpu)
        return replace(placed, raw=round(placed.raw - CPU_BALANCE * imbalance, 9))

    @staticmethod
    def _place_whole(
        node: SharedNode,
        usage: dict[int, GpuUsage],
        share: ShareRequest,
        unshared: int,
        room: Room,
        mix: ShareMix,
        sets: BestSets,
    ) -> Placement:
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
        score = float(key[0]) if key else 0.0
        rise = whole_rise(node.gpus, usage, gpus, mix, room) if mix else 0.0
        # least rise of fragmentation; then the best-linked set; then the fewest
        # unshared GPUs left (best fit)
        return Placement(
            gpus, raw=-round(rise, 9) + TIE * score / 100 - TIE**2 * (unshared - share.gpus)
        )

    # -- filter / prioritize ----------------------------------------------------
    def filter_parts(
        self, share: ShareRequest, names: list[str], uid: str = "", need: Need = (0, 0)
    ) -> tuple[list[str], dict[str, str], dict[str, str]]:
        """(nodes kept, failed, unresolvable); the pod counts as an arrival of the mix."""
        self.arrivals.observe(uid, share, *need)
        keep: list[str] = []
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        mixed = self._scarce_mix()
        for name in names:
            placed = self.place(name, share, uid, *need, mixed=mixed)
            if placed.gpus is not None:
                keep.append(name)
            elif placed.unresolvable:
                unresolvable[name] = placed.reason
            else:
                failed[name] = placed.reason
        return keep, failed, unresolvable

    def raw(
        self, share: ShareRequest, names: list[str], uid: str = "", need: Need = (0, 0)
    ) -> list[float | None]:
        """Placement value per node, higher is better (None where the share does not fit)."""
        out: list[float | None] = []
        mixed = self._scarce_mix()
        for name in names:
            placed = self.place(name, share, uid, *need, mixed=mixed)
            out.append(placed.raw if placed.gpus is not None else None)
        return out

    def raw_nogpu(self, names: list[str], need: Need) -> list[float | None]:
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
        None for a node gpu-aware has no usable view of."""
        mix_version, mix = self.arrivals.mix()
        keys = [self._nogpu(name, need, mix_version, mix) for name in names]
        known = sorted({key for key in keys if key is not None})
        order = {key: float(at) for at, key in enumerate(known)}
        return [None if key is None else order[key] for key in keys]

    def _nogpu(
        self, name: str, need: Need, mix_version: int, mix: ShareMix
    ) -> tuple[float, float] | None:
        """(minus the capacity taken out of use, minus the load and rise), higher is
        better; None for a node with no usable view."""
        node = self.nodes.get(name)
        if node is None or node.problem is not None:
            return None
        cpu, memory = self._free_room(name) if self._free_room is not None else (None, None)
        key = (name, *need)
        version = (id(node), self.ledger.version(name), mix_version, cpu, memory)
        hit = self._nogpu_memo.get(key)
        if hit is not None and hit[0] == version:
            return hit[1]
        room = Room(cpu, memory, *need)
        after = room.after()
        base = self._nogpu_base.get(name)
        if base is None or base[0] != version:
            free = self._free_percents(node)
            base = (version, free, filled(free, room, mix), node_fragmentation(free, room, mix))
            if len(self._nogpu_base) >= MAX_MEMO:
                self._nogpu_base.clear()
            self._nogpu_base[name] = base
        _, free, fill_before, frag_before = base
        stranded = fill_taken(fill_before, after, mix)
        rise = node_fragmentation(free, after, mix) - frag_before
        load = gpus_per_core(sum(free), after)
        value = -rise if load is None else -round(load, 6) * LOAD_RANK - rise
        ranked = (-round(stranded, 6), round(value, 9))
        if len(self._nogpu_memo) >= MAX_MEMO:
            self._nogpu_memo.clear()
        self._nogpu_memo[key] = (version, ranked)
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
                    assignment = Assignment(node, placed.gpus, share)
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
        annotations: dict[str, str | None] = {
            ASSIGNED_ANNOTATION: assignment.to_json(),
            BIND_TIME_ANNOTATION: str(int(self._clock() * 1e9)),
            PHASE_ANNOTATION: PHASE_ALLOCATING,
        }
        try:
            self._record(ns, name, uid, meta.resourceVersion or "", annotations)
        except Exception as err:
            self.ledger.release(uid)
            self.bind_failures += 1
            return 200, f"gpu-aware: cannot record the GPU choice on {ns}/{name}: {_short(err)}"
        try:
            self.api.bind(ns, name, uid, node)
        except Exception as err:
            self.bind_failures += 1
            self._undo(ns, name, uid)
            return 200, f"gpu-aware: binding {ns}/{name} to {node} failed: {_short(err)}"
        self.binds += 1
        self.requeue.forget(uid)
        log.info(
            "pod bound with shared GPUs",
            extra={"pod": f"{ns}/{name}", "node": node, "gpus": list(placed.gpus)},
        )
        return 200, ""

    def _record(
        self, ns: str, name: str, uid: str, version: str, annotations: dict[str, str | None]
    ) -> None:
        """Write the choice onto the pod if it is still the pod ``bind`` read. A 409 from
        a change that does not concern the choice (the requeue nudge of a pod this
        extender turned away earlier, a label) is retried on the pod's new version; a
        pod that meanwhile got another UID, a node or a choice keeps the 409."""
        assert self.api is not None
        for attempt in range(_RECORD_ATTEMPTS):
            try:
                self.api.annotate(ns, name, version, annotations)
                return
            except Exception as err:
                if getattr(err, "status", None) != 409 or attempt + 1 == _RECORD_ATTEMPTS:
                    raise
                pod = self.api.get_pod(ns, name)
                meta = pod.get("metadata") or {}
                if (meta.get("uid") != uid or (pod.get("spec") or {}).get("nodeName")
                        or ASSIGNED_ANNOTATION in (meta.get("annotations") or {})):
                    raise
                version = str(meta.get("resourceVersion") or "")

    def _bind_plain(self, ns: str, name: str, uid: str, node: str) -> str:
        assert self.api is not None
        try:
            self.api.bind(ns, name, uid, node)
        except Exception as err:
            return f"gpu-aware: binding {ns}/{name} to {node} failed: {_short(err)}"
        return ""

    def _undo(self, ns: str, name: str, uid: str) -> None:
        """Forget a choice whose binding failed (the annotation too, best effort: a
        pod left annotated keeps its GPUs reserved until it is deleted or rebound)."""
        assert self.api is not None
        try:
            pod = self.api.get_pod(ns, name)
            version = str(pod.get("metadata", {}).get("resourceVersion", ""))
            if not pod.get("spec", {}).get("nodeName"):
                self.api.annotate(
                    ns,
                    name,
                    version,
                    {ASSIGNED_ANNOTATION: None, BIND_TIME_ANNOTATION: None, PHASE_ANNOTATION: None},
                )
                self.ledger.release(uid)
        except Exception as err:
            log.warning(
                "could not remove a failed GPU choice",
                extra={"pod": f"{ns}/{name}", "error": _short(err)},
            )


def _short(err: Exception) -> str:
    status = getattr(err, "status", None)
    reason = getattr(err, "reason", None)
    if status is not None:
        return f"HTTP {status} {reason or ''}".strip()
    return f"{type(err).__name__}: {str(err)[:200]}"
