"""Retry of GPU-sharing pods that gpu-aware turned away, once a share is freed.

kube-scheduler retries a pod an extender rejected on the next cluster event (it files it
under the pseudo-plugin "Extender"). When a shared pod is deleted, kube-scheduler and
gpu-aware's pod watch see the deletion at about the same time; if the scheduler asks
first, the ledger still holds the deleted pod's share, the waiting pod is rejected again
and then waits for an unrelated event or the scheduler's 5-minute flush. So gpu-aware
remembers the pods it turned away (bounded, oldest forgotten first) and, whenever its
ledger frees or shrinks a share, sets the annotation ``gpuk8s.io/sharing.requeue`` on
them: a pod update is a cluster event, and kube-scheduler tries the pod again.

A pod turned away by a call that started before the last release is nudged at once (the
call may have read the ledger before the release)."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

from ...core.sharing import REQUEUE_ANNOTATION

log = logging.getLogger(__name__)

MAX_WAITING = 1024  # pods remembered; the oldest is forgotten first
POLL_S = 1.0  # how often the loop looks at ``stopping`` while idle


class PodToucher(Protocol):
    """The one API call the requeue makes (``share.KubePodApi``)."""

    def touch(self, namespace: str, name: str, annotations: dict[str, str]) -> None: ...


class Requeue:
    """Pods turned away (uid -> namespace, name) and the loop that nudges them."""

    def __init__(
        self,
        api: PodToucher | None,
        clock: Callable[[], float] = time.time,
        max_waiting: int = MAX_WAITING,
    ) -> None:
        self._api = api
        self._clock = clock
        self._max = max_waiting
        self._waiting: OrderedDict[str, tuple[str, str]] = OrderedDict()
        self._lock = threading.Lock()
        self._freed = threading.Event()
        self._generation = 0
        self.nudged = 0
        self.failures = 0

    @property
    def generation(self) -> int:
        """Moves at every release; read it before deciding, pass it to ``turned_away``."""
        return self._generation

    def turned_away(self, uid: str, namespace: str, name: str, since: int) -> None:
        """``filter`` found no GPU for the pod (it read the ledger at ``since``)."""
        if not (uid and namespace and name):
            return
        with self._lock:
            self._waiting[uid] = (namespace, name)
            self._waiting.move_to_end(uid)
            while len(self._waiting) > self._max:
                self._waiting.popitem(last=False)
            if since != self._generation:
                self._freed.set()

    def forget(self, uid: str) -> None:
        """The pod was bound (or is gone): nothing to retry."""
        with self._lock:
            self._waiting.pop(uid, None)

    def freed(self) -> None:
        """The ledger freed or shrank a share (``Ledger(on_free=...)``)."""
        with self._lock:
            self._generation += 1
            if self._waiting:
                self._freed.set()

    def waiting(self) -> list[str]:
        with self._lock:
            return list(self._waiting)

    def nudge(self) -> int:
        """Annotate every waiting pod once; returns how many were touched."""
        with self._lock:
            self._freed.clear()
            batch = list(self._waiting.items())
            self._waiting.clear()
        if self._api is None:
            return 0
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self._clock()))
        done = 0
        for uid, (namespace, name) in batch:
            try:
                self._api.touch(namespace, name, {REQUEUE_ANNOTATION: stamp})
                done += 1
            except Exception as err:
                status: Any = getattr(err, "status", None)
                if status != 404:
                    self.failures += 1
                    log.warning(
                        "could not nudge a waiting pod",
                        extra={"pod": f"{namespace}/{name}", "uid": uid, "error": str(err)[:200]},
                    )
        self.nudged += done
        if done:
            log.info("waiting GPU-sharing pods nudged after a release", extra={"pods": done})
        return done

    def run(self, stopping: threading.Event) -> None:
        """The loop (``ExtenderService`` runs it as a thread)."""
        while not stopping.is_set():
            if self._freed.wait(POLL_S):
                self.nudge()
