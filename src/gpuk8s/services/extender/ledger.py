"""GPU sharing's accounting: which pod holds which share of which GPU.

``Ledger``: pod UID -> ``Assignment`` from the pods' ``gpuk8s.io/sharing.assigned``
annotations (a watch on all pods, ``view_assignment``), plus the extender's own
reservations not yet seen by the watch (kept ``PENDING_TTL_S``). Usage per GPU is summed
from it per node, so a restarted extender rebuilds its accounting from the annotations
(the watch's first list) before it binds again. It also follows the ``phase``
annotation: a pod bound but not yet Allocated by gpu-device (``awaiting_allocate``,
for at most ``ALLOCATE_WAIT_S``).

Example: after ``ledger.reserve("u1", Assignment("n1", (0,), ShareRequest("sgpu", 1,
50, 0)))``, ``ledger.usage("n1")[0].core == 50``; the watch's event for the annotated
pod confirms the reservation, its deletion frees the share.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping

import msgspec

from ...core.sharing import (
    PHASE_ALLOCATING,
    Assignment,
    GpuUsage,
    ShareRequest,
    SharingError,
    allocate_ids,
    parse_assignment,
    usage_from_assignments,
)
from .notify import Touch
from .views import PodView

log = logging.getLogger("gpuk8s.extender")

# a reservation the watch has not confirmed yet survives a relist this long
PENDING_TTL_S = 120.0


# a pod bound this long ago that still waits for Allocate (its kubelet is away, say)
# holds the others back no longer
ALLOCATE_WAIT_S = 300.0


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

    def usage(
        self, node: str, without: str = "", index_by_id: Mapping[str, int] | None = None
    ) -> dict[int, GpuUsage]:
        """GPU index now -> usage on ``node`` (leaving out the pod ``without``): each
        booking finds its GPUs by stable id in ``index_by_id`` (the node's device list:
        ``SharedNode.index_by_id``), so a GPU leaving the bus moves no booking onto its
        neighbour (``Assignment.current``)."""
        with self._lock:
            held = [a for uid, a in self._by_node.get(node, {}).items() if uid != without]
        now = {node: index_by_id} if index_by_id is not None else None
        return usage_from_assignments(held, now).get(node, {})

    def __len__(self) -> int:
        return len(self._effective)


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
        # not an assignment bind wrote (its Binding sets it with that very node):
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
