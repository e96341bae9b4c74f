"""gpu-aware's CUDA driver/runtime check (``core/cuda.py``) applied to filter answers.

A pod that states its CUDA runtime (annotation ``gpuk8s.io/cuda-runtime: "12.4"``) is
kept off nodes whose driver supports an older CUDA (labels
``metax-tech.com/cuda-major-version`` / ``cuda-minor-version``, written by gpu-label):
those nodes go to ``FailedAndUnresolvableNodes`` with a reason naming both versions
(preemption cannot upgrade a driver). Nodes without the labels are not checked. A
driver more than one major version ahead is allowed and logged as a warning (the
manual's recommendation). A malformed annotation refuses every node with the reason,
so ``kubectl describe pod`` shows what to fix.

Only pods carrying the annotation pay for this (the filter's fast paths are untouched
otherwise). With full nodes in the request the labels come from them; with the node
cache they come from ``NodeCudaVersions``, fed by the same node watch.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

from ...core.cuda import RUNTIME_ANNOTATION, CudaVersion, check, node_version, parse_version
from ...core.errors import ConfigError
from .demand import Demand
from .views import NodeItem, raw_text

log = logging.getLogger("gpuk8s.extender")

def item_version(item: NodeItem) -> CudaVersion | None:
    """The node's driver CUDA version from its labels; None when unlabelled."""
    return node_version(raw_text(item.cuda[0]), raw_text(item.cuda[1]))


class NodeCudaVersions:
    """Node name -> the driver's CUDA version, for ``nodeCacheCapable: true`` (node watch).
    Only labelled nodes are kept (bounded by the cluster's nodes)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._versions: dict[str, CudaVersion] = {}

    def replace(self, items: Iterable[NodeItem]) -> None:
        fresh = {}
        for item in items:
            version = item_version(item)
            if version is not None:
                fresh[item.name] = version
        with self._lock:
            self._versions = fresh

    def observe(self, item: NodeItem) -> None:
        version = item_version(item)
        with self._lock:
            if version is None:
                self._versions.pop(item.name, None)
            else:
                self._versions[item.name] = version

    def forget(self, name: str) -> None:
        with self._lock:
            self._versions.pop(name, None)

    def get(self, name: str) -> CudaVersion | None:
        return self._versions.get(name)


def runtime_of(demand: Demand) -> tuple[CudaVersion | None, str | None]:
    """(the pod's CUDA runtime, why its annotation is unusable); (None, None) without one."""
    if demand.cuda_runtime is None:
        return None, None
    text = raw_text(demand.cuda_runtime)
    if text is None:
        return None, f"annotation {RUNTIME_ANNOTATION} must be a string such as \"12.4\""
    try:
        return parse_version(text, f"annotation {RUNTIME_ANNOTATION}"), None
    except ConfigError as err:
        return None, str(err)


def refusals(
    demand: Demand,
    names: Iterable[str],
    versions: NodeCudaVersions,
    items: Iterable[NodeItem] | None = None,
    pod_ref: str = "",
) -> dict[str, str]:
    """The nodes of ``names`` the pod's CUDA runtime cannot run on, with the reason
    (for ``FailedAndUnresolvableNodes``); the labels come from ``items`` (full nodes in
    the request) or else from ``versions`` (the node watch)."""
    runtime, problem = runtime_of(demand)
    if runtime is None:
        return {} if problem is None else dict.fromkeys(names, f"gpu-aware: {problem}")
    lookup: Callable[[str], CudaVersion | None] = versions.get
    if items is not None:
        lookup = {item.name: item_version(item) for item in items}.get
    refused: dict[str, str] = {}
    for name in names:
        why, warning = check(lookup(name), runtime)
        if warning is not None:
            log.warning("CUDA version gap", extra={"pod": pod_ref, "node": name,
                                                   "detail": warning})
        if why is not None:
            refused[name] = f"gpu-aware: {why}"
    return refused
