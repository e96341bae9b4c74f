"""`gpuk8s serve dra-pending`: why a pod's gpu-dra claim stays pending, as an Event on the pod.

Every ``interval`` seconds the replica that holds the Lease (``services.leader``; one
replica acts, any others wait to take over) lists the pending pods, the ResourceClaims and
the driver's ResourceSlices of every node, and judges each claim that a pod has waited on
for more than ``after`` seconds without an allocation with ``core.drapending.unmet``. Each
reason found becomes a Warning Event on the pod (``kubectl describe pod`` shows it), named
after the pod, the claim and the reason: one Event per claim and reason, its ``count`` and
``lastTimestamp`` refreshed at most every ``refresh`` seconds instead of a new Event each
round. The judge needs every node's slices, which a node's gpu-dra does not have; one
component does the work once for the cluster. Flags: ``--help`` and docs/dra.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any, Protocol

from ...core.dra import DRIVER
from ...core.drapending import Unmet, unmet
from ...core.errors import ConfigError, GpuK8sError
from .. import kube
from ..flags import add_health_port_argument, add_kubeconfig_argument, add_log_arguments
from ..healthserver import serve_health
from ..leader import LEASE_DURATION_S, RENEW_DEADLINE_S, RETRY_PERIOD_S, Elector, KubeLeaseApi
from ..logging_setup import LogOptions, configure_logging

log = logging.getLogger("gpuk8s.dra.pending")

COMPONENT = "gpu-dra-pending"
DEFAULT_LEASE = "gpu-dra-pending"
API_TIMEOUT_S = (3, 10)


class PendingApi(Protocol):
    """What the judge reads and writes (``KubePendingApi``; tests may pass their own)."""

    def pending_pods(self) -> list[dict[str, Any]]: ...

    def claims(self) -> list[dict[str, Any]]: ...

    def slices(self) -> list[dict[str, Any]]: ...

    def get_event(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def create_event(self, namespace: str, body: dict[str, Any]) -> None: ...

    def patch_event(self, namespace: str, name: str, patch: dict[str, Any]) -> None: ...


def _stamp(wall: float) -> str:
    return dt.datetime.fromtimestamp(wall, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _age(meta: dict[str, Any], wall: float) -> float:
    created = str(meta.get("creationTimestamp") or "")
    try:
        when = dt.datetime.strptime(created, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    except ValueError:
        return 0.0
    return wall - when.timestamp()


def pod_claim_names(pod: dict[str, Any]) -> list[str]:
    """The ResourceClaims a pod waits on: named in its spec, made from its templates
    (``status.resourceClaimStatuses``), or made for its extended resources."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    names = [str(c["resourceClaimName"]) for c in spec.get("resourceClaims") or []
             if c.get("resourceClaimName")]
    names += [str(c["resourceClaimName"]) for c in status.get("resourceClaimStatuses") or []
              if c.get("resourceClaimName")]
    extended = (status.get("extendedResourceClaimStatus") or {}).get("resourceClaimName")
    if extended:
        names.append(str(extended))
    return list(dict.fromkeys(names))


def event_name(pod: str, claim_uid: str, reason: str) -> str:
    """One Event per pod, claim and reason (stable across rounds and leaders)."""
    digest = hashlib.sha256(f"{claim_uid}/{reason}".encode()).hexdigest()[:12]
    return f"{pod[:200]}.gpudra-{digest}"


@dataclass(frozen=True)
class PendingOptions:
    after: float = 30.0  # seconds a pod waits before its claims are judged
    refresh: float = 300.0  # seconds between refreshes of one Event
    interval: float = 15.0  # seconds between rounds

    def __post_init__(self) -> None:
        for name in ("after", "refresh"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}: {getattr(self, name)!r} must be >= 0 seconds")
        if self.interval <= 0:
            raise ConfigError(f"interval: {self.interval!r} must be > 0 seconds")


class PendingReasons:
    """One round (``tick``) judges the cluster's waiting claims and writes the Events."""

    def __init__(self, api: PendingApi, identity: str, options: PendingOptions,
                 leading: Callable[[], bool] = lambda: True,
                 wall: Callable[[], float] = time.time) -> None:
        self.api = api
        self.identity = identity
        self.options = options
        self._leading = leading
        self._wall = wall
        self._started = wall()
        self._written: dict[tuple[str, str], float] = {}  # (namespace, event) -> wall
        self.last_round: float | None = None  # wall time of the last completed round

    def tick(self) -> list[tuple[str, str, Unmet]]:
        """One round; (namespace, pod, reason) of each Event written or refreshed."""
        now = self._wall()
        if not self._leading():
            self.last_round = now
            return []
        waiting = [p for p in self.api.pending_pods()
                   if _age(p.get("metadata") or {}, now) >= self.options.after and
                   pod_claim_names(p)]
        if not waiting:
            self.last_round = now
            return []
        claims = {(str(c["metadata"].get("namespace")), str(c["metadata"].get("name"))): c
                  for c in self.api.claims()}
        slices = self.api.slices()
        out: list[tuple[str, str, Unmet]] = []
        for pod in waiting:
            meta = pod["metadata"]
            namespace = str(meta.get("namespace") or "default")
            for name in pod_claim_names(pod):
                claim = claims.get((namespace, name))
                if claim is None or (claim.get("status") or {}).get("allocation"):
                    continue
                for why in unmet(claim, slices):
                    if self._write(pod, claim, why, now):
                        out.append((namespace, str(meta.get("name")), why))
        self._forget(now)
        self.last_round = now
        return out

    def liveness(self) -> tuple[bool, dict[str, Any]]:
        """Live while rounds complete: the last within 3 intervals (at least 60 s) or
        none yet for as long since the start."""
        limit = max(3 * self.options.interval, 60.0)
        last = self.last_round if self.last_round is not None else self._started
        age = self._wall() - last
        return age <= limit, {"lastRoundAgeSeconds": round(age, 1), "limitSeconds": limit,
                              "leading": self._leading()}

    def _write(self, pod: dict[str, Any], claim: dict[str, Any], why: Unmet,
               now: float) -> bool:
        meta = pod["metadata"]
        namespace = str(meta.get("namespace") or "default")
        name = event_name(str(meta["name"]), str(claim["metadata"].get("uid") or ""),
                          why.reason)
        last = self._written.get((namespace, name))
        if last is not None and now - last < self.options.refresh:
            return False
        message = f"ResourceClaim {claim['metadata'].get('name')}: {why.message}"
        existing = self.api.get_event(namespace, name)
        if existing is not None:
            seen = _age({"creationTimestamp": existing.get("lastTimestamp")}, now)
            if last is None and seen < self.options.refresh:  # another leader's, fresh
                self._written[(namespace, name)] = now - seen
                return False
            self.api.patch_event(namespace, name, {
                "count": int(existing.get("count") or 1) + 1, "lastTimestamp": _stamp(now),
                "message": message})
        else:
            self.api.create_event(namespace, {
                "apiVersion": "v1", "kind": "Event",
                "metadata": {"name": name, "namespace": namespace},
                "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": namespace,
                                   "name": meta["name"], "uid": meta.get("uid")},
                "reason": why.reason, "message": message, "type": "Warning",
                "source": {"component": COMPONENT},
                "reportingComponent": f"{DRIVER}/{COMPONENT}",
                "reportingInstance": self.identity[:128],
                "firstTimestamp": _stamp(now), "lastTimestamp": _stamp(now), "count": 1})
        self._written[(namespace, name)] = now
        log.info("claim unmet", extra={"pod": f"{namespace}/{meta['name']}",
                                       "reason": why.reason, "message": message})
        return True

    def _forget(self, now: float) -> None:
        """Entries older than the refresh period are refreshed from the API anyway."""
        for key in [k for k, t in self._written.items()
                    if now - t > 2 * self.options.refresh]:
            del self._written[key]

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.tick()
            except Exception as err:  # one failed round must not stop the next
                log.warning("round failed", extra={"error": str(err)[:300]})
            stop.wait(self.options.interval)


class KubePendingApi:
    """``PendingApi`` over the official client."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes import client

        self._core = client.CoreV1Api(api_client)
        self._resource = client.ResourceV1Api(api_client)

    @staticmethod
    def _call(what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            resp = fn(*args, _preload_content=False, _request_timeout=API_TIMEOUT_S, **kwargs)
        except Exception as err:
            raise kube.classify(err, what) from err
        data = kube.body(resp)
        return json.loads(data) if data else {}

    def pending_pods(self) -> list[dict[str, Any]]:
        found = self._call("list pods", self._core.list_pod_for_all_namespaces,
                           field_selector="status.phase=Pending")
        return list(found.get("items") or [])

    def claims(self) -> list[dict[str, Any]]:
        found = self._call("list resourceclaims",
                           self._resource.list_resource_claim_for_all_namespaces)
        return list(found.get("items") or [])

    def slices(self) -> list[dict[str, Any]]:
        found = self._call("list resourceslices", self._resource.list_resource_slice,
                           field_selector=f"spec.driver={DRIVER}")
        return list(found.get("items") or [])

    def get_event(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = self._call("get event", self._core.read_namespaced_event,
                                               name, namespace)
        except kube.ApiError as err:
            if err.status == 404:
                return None
            raise
        return found

    def create_event(self, namespace: str, body: dict[str, Any]) -> None:
        self._call("create event", self._core.create_namespaced_event, namespace, body)

    def patch_event(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        self._call("patch event", self._core.patch_namespaced_event, name, namespace, patch)


def build_parser() -> argparse.ArgumentParser:
    env = os.environ
    p = argparse.ArgumentParser(
        prog="gpuk8s serve dra-pending",
        description=f"Says on a pending pod why its {DRIVER} claim cannot be allocated "
                    "(Events; one replica at a time, elected with a Lease).")
    add_kubeconfig_argument(p, used_for="pods, ResourceClaims, ResourceSlices, Events, "
                                        "the Lease")
    p.add_argument("--lease", default=env.get("LEASE", ""),
                   help=f"<namespace>/<name> of the Lease (default $POD_NAMESPACE/"
                        f"{DEFAULT_LEASE})")
    p.add_argument("--identity", default=env.get("POD_NAME", ""),
                   help="this replica's name in the Lease (default $POD_NAME)")
    p.add_argument("--after", type=float, default=30.0,
                   help="seconds a pod waits before its claims are judged (default 30)")
    p.add_argument("--refresh", type=float, default=300.0,
                   help="seconds between refreshes of one Event (default 300)")
    p.add_argument("--interval", type=float, default=15.0,
                   help="seconds between rounds (default 15)")
    add_health_port_argument(p, serves="/healthz (rounds complete) and /readyz")
    add_log_arguments(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        configure_logging(LogOptions.from_args(args), component=COMPONENT)
        options = PendingOptions(after=args.after, refresh=args.refresh,
                                 interval=args.interval)
        namespace_default = os.environ.get("POD_NAMESPACE", "")
        lease = args.lease or (f"{namespace_default}/{DEFAULT_LEASE}"
                               if namespace_default else "")
        namespace, _, name = lease.partition("/")
        if not namespace or not name:
            raise ConfigError(f"lease: <namespace>/<name> (or $POD_NAMESPACE set); got "
                              f"{lease!r}")
        if not args.identity:
            raise ConfigError("identity: required ($POD_NAME in the Deployment)")
        client = kube.api_client(args.kubeconfig or None)
    except GpuK8sError as err:
        print(f"gpuk8s serve dra-pending: error: {err}", file=sys.stderr)
        return 2
    elector = Elector(KubeLeaseApi(client, namespace, name), args.identity, namespace, name,
                      duration=LEASE_DURATION_S, renew_deadline=RENEW_DEADLINE_S,
                      retry=RETRY_PERIOD_S)
    judge = PendingReasons(KubePendingApi(client), args.identity, options,
                           leading=elector.leading)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    threading.Thread(target=elector.run, args=(stop,), name="lease", daemon=True).start()
    http = serve_health(args.health_port, {"/healthz": judge.liveness,
                                           "/readyz": judge.liveness},
                        name="dra-pending-http") if args.health_port else None
    log.info("starting", extra={"lease": lease, "identity": args.identity,
                                "after": options.after, "refresh": options.refresh})
    judge.run(stop)
    elector.release()
    if http is not None:
        http.shutdown()
        http.server_close()
    return 0
