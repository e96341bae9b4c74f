"""A kubelet stand-in for DRA plugins (real gRPC on unix sockets), and a fake API server.

``FakeDraKubelet`` plays the kubelet's part as pkg/kubelet/pluginmanager and
pkg/kubelet/cm/dra (v1.35.4, and v1.37.2 for the health service) do:

* watches the registry directory for sockets (the plugin watcher; at start it walks the
  directory, as a restarted kubelet does), calls ``pluginregistration.Registration/GetInfo``,
  validates it like ``DRAPluginManager.validateSupportedServices`` (type ``DRAPlugin``, the
  newest of ``v1.DRAPlugin``, ``v1beta1.DRAPlugin`` it finds in ``supported_versions``) and
  reports with ``NotifyRegistrationStatus``;
* calls ``NodePrepareResources`` / ``NodeUnprepareResources`` on the plugin's endpoint with
  the service it chose (or one a test names);
* opens ``DRAResourceHealth/NodeWatchResources`` and records each update: of the newest
  health service it knows that the plugin advertises, as 1.37's ``pickHealthService``
  (``health_services``: v1 then v1alpha1 as 1.37; ``(HEALTH_V1ALPHA1,)`` is 1.35, which
  calls v1alpha1 whatever the plugin advertises);
* ``restart()``: forgets every registration and walks the directory again.

``FakeResourceApi`` holds ResourceClaims and ResourceSlices in memory with resource
versions, and can drop the fields of disabled feature gates as the API server does.
"""

from __future__ import annotations

import copy
import os
import stat
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc

from gpuk8s.core.errors import GpuK8sError
from gpuk8s.services.dra.grpcapi import (
    DRA_V1,
    DRA_V1BETA1,
    HEALTH_SERVICES,
    DraPluginStub,
    HealthStub,
    RegistrationStub,
    drahealth,
    reg,
)
from gpuk8s.services.node.grpcapi import unix_target

KUBELET_SERVICES = {"v1.DRAPlugin": DRA_V1, "v1beta1.DRAPlugin": DRA_V1BETA1}


@dataclass
class Registration:
    socket: str
    type: str
    name: str
    endpoint: str
    versions: list[str]
    service: str | None  # the gRPC service chosen, None when refused
    error: str = ""
    at: float = 0.0
    health: str | None = None  # the DRAResourceHealth service chosen, None: not advertised


@dataclass
class HealthWatch:
    updates: list[dict[str, int]] = field(default_factory=list)  # device -> health
    times: list[float] = field(default_factory=list)
    timeouts: list[int] = field(default_factory=list)
    ended: bool = False


class FakeDraKubelet:
    def __init__(self, registry_dir: str, poll: float = 0.02,
                 health_services: tuple[str, ...] = HEALTH_SERVICES) -> None:
        self.registry_dir = registry_dir
        self.poll = poll
        self.health_services = health_services
        self.registrations: list[Registration] = []
        self.known: dict[str, tuple[int, int]] = {}  # socket path -> (inode, ctime)
        self.refuse_with = ""  # non-empty: NotifyRegistrationStatus(false, this)
        self.watches: list[HealthWatch] = []
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._channels: list[grpc.Channel] = []
        self.restarts = 0

    def start(self) -> FakeDraKubelet:
        os.makedirs(self.registry_dir, exist_ok=True)
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        for channel in self._channels:
            channel.close()
        self._channels = []

    def restart(self) -> None:
        self.stop()
        with self._cond:
            self.known = {}
            self.restarts += 1
        self.start()

    # -- plugin watcher ------------------------------------------------------------------
    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                names = os.listdir(self.registry_dir)
            except OSError:
                names = []
            seen = set()
            for name in names:
                path = os.path.join(self.registry_dir, name)
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                if not stat.S_ISSOCK(st.st_mode):
                    continue
                seen.add(path)
                ident = (st.st_ino, st.st_ctime_ns)
                if self.known.get(path) != ident:
                    self.known[path] = ident
                    self._register(path)
            for gone in set(self.known) - seen:
                del self.known[gone]
            self._stop.wait(self.poll)

    def _register(self, path: str) -> None:
        try:
            with grpc.insecure_channel(unix_target(path)) as channel:
                stub = RegistrationStub(channel)
                info = stub.GetInfo(reg.InfoRequest(), timeout=5)
                service = next((KUBELET_SERVICES[v] for v in info.supported_versions
                                if v in KUBELET_SERVICES), None)
                error = self.refuse_with
                if info.type != "DRAPlugin":
                    error = f"unexpected plugin type {info.type}"
                elif service is None:
                    error = f"none of {list(info.supported_versions)} is supported"
                stub.NotifyRegistrationStatus(
                    reg.RegistrationStatus(plugin_registered=not error, error=error), timeout=5)
        except grpc.RpcError:
            self.known.pop(path, None)  # try again at the next poll
            return
        health = next((h for h in self.health_services if h in info.supported_versions), None)
        with self._cond:
            self.registrations.append(Registration(
                path, info.type, info.name, info.endpoint, list(info.supported_versions),
                None if error else service, error, time.monotonic(), health))
            self._cond.notify_all()

    def wait_registrations(self, count: int, timeout: float = 10.0) -> list[Registration]:
        with self._cond:
            if not self._cond.wait_for(lambda: len(self.registrations) >= count, timeout):
                raise AssertionError(f"expected {count} registrations within {timeout}s, got "
                                     f"{len(self.registrations)}")
            return list(self.registrations)

    # -- DRA calls ---------------------------------------------------------------------
    def _plugin(self) -> Registration:
        found = [r for r in self.registrations if r.service]
        if not found:
            raise AssertionError("no plugin registered")
        return found[-1]

    def _stub(self, service: str | None) -> DraPluginStub:
        plugin = self._plugin()
        channel = grpc.insecure_channel(unix_target(plugin.endpoint))
        self._channels.append(channel)
        return DraPluginStub(channel, service or plugin.service or DRA_V1)

    def prepare(self, claims: list[tuple[str, str, str]], service: str | None = None) -> Any:
        """claims: (namespace, uid, name)."""
        stub = self._stub(service)
        m = stub.module
        request = m.NodePrepareResourcesRequest(
            claims=[m.Claim(namespace=ns, uid=uid, name=name) for ns, uid, name in claims])
        return stub.NodePrepareResources(request, timeout=10)

    def unprepare(self, claims: list[tuple[str, str, str]], service: str | None = None) -> Any:
        stub = self._stub(service)
        m = stub.module
        request = m.NodeUnprepareResourcesRequest(
            claims=[m.Claim(namespace=ns, uid=uid, name=name) for ns, uid, name in claims])
        return stub.NodeUnprepareResources(request, timeout=10)

    def watch_health(self) -> HealthWatch:
        plugin = self._plugin()
        if plugin.health is None:
            raise AssertionError(f"the plugin advertises no health service this kubelet "
                                 f"knows ({list(self.health_services)}): {plugin.versions}")
        channel = grpc.insecure_channel(unix_target(plugin.endpoint))
        self._channels.append(channel)
        stream = HealthStub(channel, plugin.health).NodeWatchResources(
            drahealth.NodeWatchResourcesRequest())
        watch = HealthWatch()
        self.watches.append(watch)

        def read() -> None:
            try:
                for response in stream:
                    with self._cond:
                        watch.updates.append({d.device.device_name: d.health
                                              for d in response.devices})
                        watch.timeouts.extend(d.health_check_timeout_seconds
                                              for d in response.devices[:1])
                        watch.times.append(time.monotonic())
                        self._cond.notify_all()
            except grpc.RpcError:
                pass
            finally:
                with self._cond:
                    watch.ended = True
                    self._cond.notify_all()

        threading.Thread(target=read, daemon=True).start()
        return watch

    def wait_for(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        with self._cond:
            if not self._cond.wait_for(predicate, timeout):
                raise AssertionError(f"timed out after {timeout}s waiting for {what}")


# -- the API server side ------------------------------------------------------------------
GATED_DEVICE_FIELDS = {
    "DRAPartitionableDevices": ("consumesCounters",),
    "DRADeviceTaints": ("taints",),
    "DRAConsumableCapacity": ("allowMultipleAllocations",),
}


class NotFound(GpuK8sError):
    pass


class FakeResourceApi:
    """ResourceClaims (``get``) and this driver's ResourceSlices (``SliceApi``).

    Every slice write is an event with its resourceVersion, and ``watch_deleted`` follows
    them the way ``services.listwatch`` follows a real API server: from the version it
    listed at, every event in order (a create and a delete between two looks are two
    events, never "no change"), and a sync asked for after its list."""

    def __init__(self, disabled_gates: tuple[str, ...] = ()) -> None:
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.slices: dict[str, dict[str, Any]] = {}
        self.disabled = disabled_gates
        self.claim_reads = 0
        self.writes: list[tuple[str, str, float]] = []  # (verb, name, monotonic time)
        self.fail_writes = False
        self._version = 0
        self.events: list[tuple[int, str, str, str]] = []  # (version, type, name, node)
        self._lock = threading.Lock()
        self.changed = threading.Condition(self._lock)

    # claims
    def add_claim(self, namespace: str, name: str, uid: str,
                  results: list[Mapping[str, Any]] | None) -> None:
        status = {} if results is None else {"allocation": {"devices": {"results": results}}}
        self.claims[(namespace, name)] = {"metadata": {"namespace": namespace, "name": name,
                                                       "uid": uid}, "status": status}

    def get(self, namespace: str, name: str) -> Mapping[str, Any]:
        self.claim_reads += 1
        try:
            return copy.deepcopy(self.claims[(namespace, name)])
        except KeyError:
            raise NotFound(f"resourceclaim {namespace}/{name} not found") from None

    # slices
    def _store(self, body: dict[str, Any]) -> dict[str, Any]:
        body = copy.deepcopy(body)
        spec = body["spec"]
        if "DRAPartitionableDevices" in self.disabled:
            spec.pop("sharedCounters", None)
        for gate, fields in GATED_DEVICE_FIELDS.items():
            if gate in self.disabled:
                for device in spec.get("devices") or []:
                    for name in fields:
                        device.pop(name, None)
        name = body["metadata"]["name"]
        self._event("MODIFIED" if name in self.slices else "ADDED", body)
        body["metadata"]["resourceVersion"] = str(self._version)
        self.slices[name] = body
        self.changed.notify_all()
        return copy.deepcopy(body)

    def _event(self, kind: str, body: Mapping[str, Any]) -> None:
        """Record a change (the lock held): the next resourceVersion."""
        self._version += 1
        self.events.append((self._version, kind, body["metadata"]["name"],
                            body["spec"].get("nodeName", "")))

    def list(self, node: str) -> list[dict[str, Any]]:
        with self._lock:
            return [copy.deepcopy(s) for s in self.slices.values()
                    if s["spec"].get("nodeName") == node]

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            if self.fail_writes:
                raise GpuK8sError("the API server is away")
            if body["metadata"]["name"] in self.slices:
                raise GpuK8sError("already exists")
            self.writes.append(("create", body["metadata"]["name"], time.monotonic()))
            return self._store(body)

    def update(self, body: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            if self.fail_writes:
                raise GpuK8sError("the API server is away")
            name = body["metadata"]["name"]
            have = self.slices.get(name)
            if have is None or have["metadata"]["resourceVersion"] != \
                    body["metadata"].get("resourceVersion"):
                raise GpuK8sError(f"conflict on {name}")
            self.writes.append(("update", name, time.monotonic()))
            return self._store(body)

    def delete(self, name: str) -> None:
        with self._lock:
            self.writes.append(("delete", name, time.monotonic()))
            gone = self.slices.pop(name, None)
            if gone is not None:
                self._event("DELETED", gone)
            self.changed.notify_all()

    def watch_deleted(self, node: str, on_lost: Callable[[], None],
                      stop: threading.Event) -> None:
        with self._lock:  # the list: the version to watch from
            seen = self._version
        on_lost()
        while not stop.is_set():
            with self._lock:
                if self._version == seen:
                    self.changed.wait(0.05)
                new = [e for e in self.events if e[0] > seen]
                seen = self._version
            if any(kind == "DELETED" and on == node for _, kind, _, on in new):
                on_lost()

    def wipe(self, node: str) -> None:
        """What a starting kubelet does: delete every slice of its node."""
        with self._lock:
            for name in [n for n, s in self.slices.items() if s["spec"].get("nodeName") == node]:
                self._event("DELETED", self.slices.pop(name))
            self.changed.notify_all()

    def devices(self) -> dict[str, dict[str, Any]]:
        """Device name -> device of the highest generation's slices."""
        with self._lock:
            slices = list(self.slices.values())
        if not slices:
            return {}
        top = max(s["spec"]["pool"]["generation"] for s in slices)
        return {d["name"]: d for s in slices if s["spec"]["pool"]["generation"] == top
                for d in s["spec"].get("devices") or []}

    def wait(self, predicate: Callable[[], bool], timeout: float, what: str) -> float:
        """Wait until ``predicate`` (called without the lock) holds; returns when."""
        deadline = time.monotonic() + timeout
        while True:
            if predicate():
                return time.monotonic()
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}")
            with self._lock:
                self.changed.wait(min(left, 0.05))
