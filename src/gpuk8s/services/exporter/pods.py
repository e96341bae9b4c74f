"""Container ID -> (namespace, pod, container) for the pods on this node, and the GPUs
each pod on shared GPUs was assigned (``gpuk8s.io/sharing.assigned``, ``core.sharing``).

From the API server: ``list pods`` with ``fieldSelector=spec.nodeName=<node>``; each
running container's ``status.containerStatuses[].containerID`` (``containerd://<id>``)
and the pod's UID; the assignment annotation of pods on shared GPUs. In a pod the call
is made with ``kube.InClusterReader`` (stdlib: the official client alone would take half
the exporter's memory budget); with
``--kubeconfig`` through the official client, imported at the first list (so is the
credentials' lookup: without any, the lists fail and are counted, the GPU metrics go on).
Refreshed when a process names a container not seen yet, or a pod on shared GPUs was not
in the last list, at most once per ``min_refresh`` seconds, and every ``max_age`` seconds
anyway: a pod listed with a missing or unreadable assignment waits for that period (it is
reported, not relisted at every sample).
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple, Protocol

from ...core.effective import pod_requests
from ...core.errors import GpuK8sError
from ...core.sharing import (
    ASSIGNED_ANNOTATION,
    GPU_RESOURCES,
    Assignment,
    SharingError,
    parse_assignment,
)
from ...core.telemetry import ContainerRef
from .. import kube

log = logging.getLogger("gpuk8s.exporter.pods")

PodKey = tuple[str, str]  # (namespace, pod)


class PodIndex(NamedTuple):
    """The node's pods: container ID -> container, pod UID -> its containers,
    (namespace, pod) -> its sharing assignment (GPUs by stable id), the pods whose
    assignment annotation cannot be read (-> why), and every pod listed."""

    by_id: dict[str, ContainerRef]
    by_uid: dict[str, list[ContainerRef]]
    assigned: Mapping[PodKey, Assignment] = MappingProxyType({})
    unreadable: Mapping[PodKey, str] = MappingProxyType({})
    listed: frozenset[PodKey] = frozenset()


class Assignments(NamedTuple):
    """What the node's pod list says of some pods on shared GPUs: their assignments
    (``Assignment.current`` finds the GPUs in this discovery pass); those whose
    assignment cannot be read (-> why); those listed without one
    (a pod not in the last list is in none of them: the list failed, or it is new)."""

    assigned: dict[PodKey, Assignment]
    unreadable: dict[PodKey, str]
    missing: tuple[PodKey, ...]


class PodLister(Protocol):
    def __call__(self) -> PodIndex: ...


def index_pods(pods: list[dict[str, Any]]) -> PodIndex:
    """Index pods in their JSON form (``metadata``, ``status.containerStatuses``)."""
    by_id: dict[str, ContainerRef] = {}
    by_uid: dict[str, list[ContainerRef]] = {}
    assigned: dict[PodKey, Assignment] = {}
    unreadable: dict[PodKey, str] = {}
    listed: set[PodKey] = set()
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        if not meta.get("uid"):
            continue
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        listed.add(key)
        raw = (meta.get("annotations") or {}).get(ASSIGNED_ANNOTATION)
        try:
            assignment = parse_assignment(raw if isinstance(raw, str) else None)
        except SharingError as err:
            unreadable[key] = str(err)
            assignment = None
        if assignment is not None:
            assigned[key] = assignment
        refs = by_uid.setdefault(str(meta["uid"]).lower(), [])
        statuses = [*(status.get("containerStatuses") or []),
                    *(status.get("initContainerStatuses") or [])]
        # a process known only by its pod goes to the one container asking for GPUs
        # (app, init or sidecar), if the pod has one
        holders = pod_requests(pod, GPU_RESOURCES).holders(GPU_RESOURCES)
        for cs in statuses:
            ref = ContainerRef(meta.get("namespace", ""), meta.get("name", ""), cs.get("name", ""))
            if not holders or ref.container in holders:
                refs.append(ref)
            raw = cs.get("containerID") or ""
            if raw:
                by_id[raw.split("://", 1)[-1].lower()] = ref
    return PodIndex(by_id, by_uid, assigned, unreadable, frozenset(listed))


def in_cluster_lister(node_name: str, reader: kube.InClusterReader,
                      timeout: float = 10.0) -> PodLister:
    selector = urllib.parse.quote(f"spec.nodeName={node_name}", safe="")

    def list_in_cluster() -> PodIndex:
        data = reader.get_json(f"/api/v1/pods?fieldSelector={selector}", timeout)
        return index_pods(list(data.get("items") or []))

    return list_in_cluster


def kubernetes_lister(node_name: str, kubeconfig: str | None = None,
                      timeout: float = 10.0) -> PodLister:
    if not kubeconfig and kube.in_cluster():
        return in_cluster_lister(node_name, kube.InClusterReader(), timeout)
    made: list[tuple[Any, Any]] = []  # the client, built at the first list

    def list_pods() -> PodIndex:
        if not made:
            from kubernetes import client

            api_client = kube.api_client(kubeconfig)  # ConfigError: no credentials
            made.append((api_client, client.CoreV1Api(api_client)))
        api_client, api = made[0]
        try:
            result = api.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={node_name}", _request_timeout=timeout
            )
        except Exception as err:
            raise kube.classify(err, f"list pods on {node_name}") from err
        return index_pods(api_client.sanitize_for_serialization(list(result.items or [])))

    return list_pods


class PodDirectory:
    """Cached ``PodLister`` answers; never raises (keeps the last good index)."""

    def __init__(self, lister: PodLister, *, min_refresh: float = 5.0, max_age: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.lister = lister
        self.min_refresh = min_refresh
        self.max_age = max_age
        self.clock = clock
        self._index = PodIndex({}, {})
        self._loaded_at: float | None = None
        self._lock = threading.Lock()
        self.failing = False
        self.error: str | None = None  # why the last list failed (None: it answered)
        self.refreshes = 0

    def _refresh(self, force: bool) -> None:
        now = self.clock()
        age = None if self._loaded_at is None else now - self._loaded_at
        if age is not None and (age < self.min_refresh or (not force and age < self.max_age)):
            return
        self._loaded_at = now
        try:
            self._index = PodIndex(*self.lister())
            self.refreshes += 1
            if self.failing:
                log.info("pod list answers again")
            self.failing = False
            self.error = None
        except GpuK8sError as err:
            # logged by the sampler, once, as a sample problem
            self.failing = True
            self.error = f"cannot list the node's pods, keeping the last known: {err}"

    def resolve(self, pod_uid: str, container_id: str) -> ContainerRef | None:
        with self._lock:
            self._refresh(force=False)
            found = self._lookup(pod_uid, container_id)
            if found is None:
                self._refresh(force=True)  # a container started since the last list
                found = self._lookup(pod_uid, container_id)
            return found

    def assignments(self, pods: Iterable[PodKey]) -> Assignments:
        """The assignments of ``pods`` (pods on shared GPUs), relisting once (at most
        every ``min_refresh`` seconds) when one of them was not in the last list; one
        listed without a readable assignment waits for the next periodic list."""
        wanted = set(pods)
        with self._lock:
            self._refresh(force=False)
            if not wanted <= self._index.listed | set(self._index.assigned):
                self._refresh(force=True)  # a pod bound since the last list
            index = self._index
            return Assignments(
                {key: a for key, a in index.assigned.items() if key in wanted},
                {key: why for key, why in index.unreadable.items() if key in wanted},
                tuple(sorted(key for key in wanted & index.listed
                             if key not in index.assigned and key not in index.unreadable)),
            )

    def _lookup(self, pod_uid: str, container_id: str) -> ContainerRef | None:
        by_id, by_uid = self._index.by_id, self._index.by_uid
        if container_id in by_id:
            return by_id[container_id]
        refs = by_uid.get(pod_uid, [])
        return refs[0] if len(refs) == 1 else None
