"""Leader election over one ``coordination.k8s.io`` Lease: one replica acts, the others wait.

Used where exactly one replica of a component may act: gpu-aware's shared-GPU bookings
(``services.extender.leader``) and gpu-dra's pending-claim reasons (``services.dra.pending``).

The algorithm is client-go's (kube-scheduler and kube-controller-manager elect the same
way), with its safety margin: the holder renews every ``retry`` seconds and considers
itself leader only until ``renew_deadline`` after the start of its last successful renewal;
a candidate takes the Lease only once it has seen the same record, unchanged, for
``duration`` seconds of its own clock (``duration`` > ``renew_deadline``), and every write
carries the ``resourceVersion`` it read, so two candidates never both win. A stopping
leader gives the Lease up (holder emptied), so the next one takes over at its next try.

The identity is the pod's name (``POD_NAME``): unique among live pods, and the same when
the kubelet restarts the container, so a restarted leader renews its own Lease at once
instead of waiting for it to expire.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from . import kube

log = logging.getLogger("gpuk8s.leader")

API_TIMEOUT_S = (3, 5)  # connect, read: a hung call must not outlive the renew deadline
LEASE_DURATION_S = 15.0  # kube-scheduler's defaults
RENEW_DEADLINE_S = 10.0
RETRY_PERIOD_S = 2.0


class Conflict(Exception):
    """The Lease changed since it was read (HTTP 409), or was created meanwhile."""


class LeaseApi(Protocol):
    """The Lease calls the elector makes (``KubeLeaseApi``; tests pass their own)."""

    def get(self) -> dict[str, Any] | None: ...  # None: no such Lease

    def create(self, lease: dict[str, Any]) -> None: ...  # Conflict when it exists

    def replace(self, lease: dict[str, Any]) -> None: ...  # Conflict on a stale version


def micro_time(wall: float) -> str:
    """A Lease MicroTime (RFC 3339, microseconds, UTC)."""
    return dt.datetime.fromtimestamp(wall, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class Record:
    holder: str
    renew_time: str
    duration_s: float
    transitions: int


def record_of(lease: dict[str, Any]) -> Record:
    spec = lease.get("spec") or {}
    return Record(
        str(spec.get("holderIdentity") or ""),
        str(spec.get("renewTime") or ""),
        float(spec.get("leaseDurationSeconds") or LEASE_DURATION_S),
        int(spec.get("leaseTransitions") or 0),
    )


class Elector:
    """One replica's side of the election; ``run`` loops, ``leading`` answers."""

    def __init__(
        self,
        api: LeaseApi,
        identity: str,
        namespace: str,
        name: str,
        duration: float = LEASE_DURATION_S,
        renew_deadline: float = RENEW_DEADLINE_S,
        retry: float = RETRY_PERIOD_S,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        if not 0 < retry < renew_deadline < duration:
            raise ValueError(
                f"leader election: need 0 < retry ({retry}) < renew deadline "
                f"({renew_deadline}) < lease duration ({duration})"
            )
        self.api = api
        self.identity = identity
        self.namespace = namespace
        self.name = name
        self.duration = duration
        self.renew_deadline = renew_deadline
        self.retry = retry
        self._clock = clock
        self._wall = wall
        self._on_change = on_change
        self._until = 0.0  # leader while clock() < this
        self._observed: Record | None = None
        self._observed_at = 0.0
        self._was_leading = False
        self._lock = threading.Lock()
        self.transitions = 0  # times this replica became leader

    def leading(self, margin: float = 0.0) -> bool:
        """Whether this replica leads, for at least ``margin`` more seconds."""
        return self._clock() + margin < self._until

    def _body(self, holder: str, old: dict[str, Any] | None, rec: Record | None) -> dict[str, Any]:
        stamp = micro_time(self._wall())
        spec: dict[str, Any] = {
            "holderIdentity": holder,
            "leaseDurationSeconds": max(1, int(self.duration)),
            "renewTime": stamp,
            "acquireTime": stamp,
            "leaseTransitions": 0,
        }
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if old is not None and rec is not None:
            metadata["resourceVersion"] = (old.get("metadata") or {}).get("resourceVersion")
            previous = old.get("spec") or {}
            if rec.holder == holder:
                spec["acquireTime"] = previous.get("acquireTime") or stamp
                spec["leaseTransitions"] = rec.transitions
            else:
                spec["leaseTransitions"] = rec.transitions + 1
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": spec,
        }

    def try_once(self) -> bool:
        """One acquire-or-renew attempt; whether this replica leads afterwards."""
        with self._lock:
            started = self._clock()
            lease = self.api.get()
            if lease is None:
                write, body = self.api.create, self._body(self.identity, None, None)
            else:
                rec = record_of(lease)
                if rec != self._observed:
                    self._observed, self._observed_at = rec, started
                held_by_other = rec.holder not in ("", self.identity)
                if held_by_other and started < self._observed_at + rec.duration_s:
                    self._until = 0.0
                    return self._settle()
                write, body = self.api.replace, self._body(self.identity, lease, rec)
            try:
                write(body)
            except Conflict:  # another candidate wrote first
                return self._settle()
            # leading until the deadline, counted from before the write was sent
            self._until = started + self.renew_deadline
            return self._settle()

    def _settle(self) -> bool:
        """Report a change of leadership (``on_change``) and return the current state."""
        now = self.leading()
        if now != self._was_leading:
            self._was_leading = now
            if now:
                self.transitions += 1
            log.info(
                "leader election: %s", "leading" if now else "not leading",
                extra={"identity": self.identity, "lease": f"{self.namespace}/{self.name}"},
            )  # fmt: skip
            if self._on_change is not None:
                try:
                    self._on_change(now)
                except Exception as err:  # a label we could not set must not stop electing
                    log.warning("leader election: change handler failed: %s", err)
        return now

    def run(self, stop: threading.Event) -> None:
        """Acquire and renew every ``retry`` seconds until ``stop``; then give the Lease up."""
        while not stop.is_set():
            try:
                self.try_once()
            except Exception as err:
                log.warning("leader election: %s", str(err)[:300])
                with self._lock:
                    self._settle()  # leadership lapses at its deadline
            stop.wait(self.retry)
        self.release()

    def release(self) -> None:
        """Give the Lease up if this replica holds it (holder emptied): the next candidate
        takes it at its next try instead of after the lease duration."""
        with self._lock:
            if not self.leading():
                return
            self._until = 0.0
            try:
                lease = self.api.get()
                if lease is not None and record_of(lease).holder == self.identity:
                    body = self._body("", lease, record_of(lease))
                    body["spec"]["leaseDurationSeconds"] = 1
                    self.api.replace(body)
            except Exception as err:
                log.warning("leader election: could not give the Lease up: %s", str(err)[:300])
            self._settle()


# ----------------------------------------------------------------------------- API side
class KubeLeaseApi:
    """``LeaseApi`` over the kubernetes client (leases get/create/update)."""

    def __init__(self, api_client: Any, namespace: str, name: str) -> None:
        from kubernetes import client

        self._api = client.CoordinationV1Api(api_client)
        self.namespace = namespace
        self.name = name

    def get(self) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            resp: Any = self._api.read_namespaced_lease(
                self.name, self.namespace, _preload_content=False, _request_timeout=API_TIMEOUT_S
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        data: dict[str, Any] = json.loads(kube.body(resp))
        return data

    def create(self, lease: dict[str, Any]) -> None:
        body: Any = lease  # the client takes a plain dict as the body
        self._write(
            lambda: self._api.create_namespaced_lease(
                self.namespace, body, _preload_content=False, _request_timeout=API_TIMEOUT_S
            )
        )

    def replace(self, lease: dict[str, Any]) -> None:
        body: Any = lease
        self._write(
            lambda: self._api.replace_namespaced_lease(
                self.name,
                self.namespace,
                body,
                _preload_content=False,
                _request_timeout=API_TIMEOUT_S,
            )
        )

    @staticmethod
    def _write(call: Callable[[], Any]) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            kube.body(call())
        except ApiException as err:
            if err.status == 409:
                raise Conflict(str(err.reason)) from None
            raise
