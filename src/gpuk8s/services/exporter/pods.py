"""Container ID -> (namespace, pod, container) for the pods on this node, and the GPUs
each pod on shared GPUs was assigned (``gpuk8s.io/sharing.assigned``, ``core.sharing``).

From the API server: ``list pods`` with ``fieldSelector=spec.nodeName=<node>``; each
running container's ``status.containerStatuses[].containerID`` (``containerd://<id>``)
and the pod's UID; the assignment annotation of pods on shared GPUs. In a pod the call
is made with ``kube.InClusterReader`` (stdlib: the official client alone would take half
the exporter's memory budget); with
``--kubeconfig`` through the official client. Refreshed when a process names a
container not seen yet, at most once per ``min_refresh`` seconds, and every ``max_age``
seconds anyway.
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
    SharingError,
    parse_assignment,
)
from ...core.telemetry import ContainerRef
from .. import kube

log = logging.getLogger("gpuk8s.exporter.pods")

PodKey = tuple[str, str]  # (namespace, pod)


class PodIndex(NamedTuple):
    """The node's pods: container ID -> container, pod UID -> its containers, and
    (namespace, pod) -> the GPU indexes of its sharing assignment."""

    by_id: dict[str, ContainerRef]
    by_uid: dict[str, list[ContainerRef]]
    assigned: Mapping[PodKey, tuple[int, ...]] = MappingProxyType({})


class PodLister(Protocol):
    def __call__(self) -> PodIndex: ...


def index_pods(pods: list[dict[str, Any]]) -> PodIndex:
    """Index pods in their JSON form (``metadata``, ``status.containerStatuses``)."""
    by_id: dict[str, ContainerRef] = {}
    by_uid: dict[str, list[ContainerRef]] = {}
    assigned: dict[PodKey, tuple[int, ...]] = {}
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        if not meta.get("uid"):
            continue
        raw = (meta.get("annotations") or {}).get(ASSIGNED_ANNOTATION)
        try:
            assignment = parse_assignment(raw if isinstance(raw, str) else None)
        except SharingError as err:
            log.warning("pod assignment unreadable", extra={
                "pod": f"{meta.get('namespace', '')}/{meta.get('name', '')}", "error": str(err)})
            assignment = None
        if assignment is not None:
            assigned[(str(meta.get("namespace", "")), str(meta.get("name", "")))] = \
                assignment.gpus
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
    return PodIndex(by_id, by_uid, assigned)


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

    from kubernetes import client

    api_client = kube.api_client(kubeconfig)
    api = client.CoreV1Api(api_client)

    def list_pods() -> PodIndex:
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
        self._index = PodIndex({}, {}, {})
        self._loaded_at: float | None = None
        self._lock = threading.Lock()
        self.failing = False
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
        except GpuK8sError as err:
            if not self.failing:
                log.warning("cannot list the node's pods; keeping the last known",
                            extra={"error": str(err)})
            self.failing = True

    def resolve(self, pod_uid: str, container_id: str) -> ContainerRef | None:
        with self._lock:
            self._refresh(force=False)
            found = self._lookup(pod_uid, container_id)
            if found is None:
                self._refresh(force=True)  # a container started since the last list
                found = self._lookup(pod_uid, container_id)
            return found

    def assignments(self, pods: Iterable[PodKey]) -> dict[PodKey, tuple[int, ...]]:
        """The assigned GPUs of ``pods`` (pods on shared GPUs), relisting once (at most
        every ``min_refresh`` seconds) when one of them is not known yet."""
        wanted = set(pods)
        with self._lock:
            self._refresh(force=False)
            if not wanted <= set(self._index.assigned):
                self._refresh(force=True)  # a pod bound since the last list
            return {key: gpus for key, gpus in self._index.assigned.items() if key in wanted}

    def _lookup(self, pod_uid: str, container_id: str) -> ContainerRef | None:
        by_id, by_uid, _ = self._index
        if container_id in by_id:
            return by_id[container_id]
        refs = by_uid.get(pod_uid, [])
        return refs[0] if len(refs) == 1 else None
