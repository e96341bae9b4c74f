"""Which pods hold GPUs on a node, and the eviction loop (``gpu_pod_eviction`` module).

Pods are plain dicts as the API serves them (``metadata``, ``spec``, ``status``).
Eviction semantics follow ``kubectl drain`` (REFERENCE §E): a pod that declares no
controller (nothing would recreate it) is evicted only with ``force``, a pod with
emptyDir data only with ``delete_emptydir_data``; otherwise nothing is evicted and the
refusal names every such pod, as drain does (a pod already being deleted is only waited
for, never refused). Then the Eviction API, so
PodDisruptionBudgets are respected; HTTP 429 means "not now" and is retried every few
seconds until the timeout; 404 means the pod is already gone; then wait until the pod
is gone or replaced (another UID).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Callable, Optional, Tuple  # runtime aliases: Python 3.8

from ..core.errors import GpuK8sError

DEFAULT_PREFIXES = ("metax-tech.com/",)


class EvictionError(GpuK8sError):
    """Pods could not be evicted in time."""


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def requested_resources(pod: Mapping[str, Any]) -> set[str]:
    """Every resource name any (init) container of ``pod`` requests or limits."""
    spec = pod.get("spec") or {}
    names: set[str] = set()
    for key in ("containers", "initContainers"):
        for container in spec.get(key) or []:
            resources = container.get("resources") or {}
            for part in ("limits", "requests"):
                names.update((resources.get(part) or {}).keys())
    return names


def is_daemonset_pod(pod: Mapping[str, Any]) -> bool:
    owners = (pod.get("metadata") or {}).get("ownerReferences") or []
    return any(o.get("kind") == "DaemonSet" for o in owners)


def is_mirror_pod(pod: Mapping[str, Any]) -> bool:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return "kubernetes.io/config.mirror" in annotations


def controller_of(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The ownerReference with ``controller: true`` (what would recreate the pod)."""
    owners = (pod.get("metadata") or {}).get("ownerReferences") or []
    return next((o for o in owners if o.get("controller") is True), None)


def has_emptydir(pod: Mapping[str, Any]) -> bool:
    """Whether the pod keeps data in an emptyDir volume (lost when it is evicted)."""
    return any("emptyDir" in (v or {}) for v in (pod.get("spec") or {}).get("volumes") or [])


def _ref(pod: Mapping[str, Any]) -> PodRef:
    meta = pod.get("metadata") or {}
    return PodRef(meta.get("namespace", "default"), meta.get("name", ""), meta.get("uid", ""))


def _gpu_pod_objects(pods: Iterable[Mapping[str, Any]],
                     prefixes: Sequence[str]) -> list[Mapping[str, Any]]:
    out = []
    for pod in pods:
        phase = (pod.get("status") or {}).get("phase")
        if phase in ("Succeeded", "Failed") or is_daemonset_pod(pod) or is_mirror_pod(pod):
            continue
        if any(r.startswith(tuple(prefixes)) for r in requested_resources(pod)):
            out.append(pod)
    return sorted(out, key=lambda p: (_ref(p).namespace, _ref(p).name))


def gpu_pods(pods: Iterable[Mapping[str, Any]],
             prefixes: Sequence[str] = DEFAULT_PREFIXES) -> list[PodRef]:
    """Pods requesting a resource under one of ``prefixes`` that eviction can stop:
    not finished, not DaemonSet-managed (they would come straight back, like
    ``drain --ignore-daemonsets``), not static (mirror) pods."""
    return [_ref(p) for p in _gpu_pod_objects(pods, prefixes)]


@dataclass(frozen=True)
class Selection:
    """What to evict, what ``kubectl drain`` would refuse, and what it would warn about."""

    pods: tuple[PodRef, ...]
    refused: tuple[str, ...]
    warnings: tuple[str, ...]

    def check(self) -> None:
        """Raise EvictionError naming every refused pod (nothing is evicted then)."""
        if self.refused:
            raise EvictionError(
                "cannot evict, nothing was evicted: " + "; ".join(self.refused)
            )


def select(
    pods: Iterable[Mapping[str, Any]],
    prefixes: Sequence[str] = DEFAULT_PREFIXES,
    *,
    force: bool = False,
    delete_emptydir_data: bool = False,
) -> Selection:
    """The GPU pods to evict under ``kubectl drain``'s rules (see the module docstring)."""
    chosen: list[PodRef] = []
    unmanaged: list[str] = []
    local: list[str] = []
    for pod in _gpu_pod_objects(pods, prefixes):
        ref = _ref(pod)
        chosen.append(ref)
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue  # already being deleted: nothing more is lost, it is only waited for
        if controller_of(pod) is None:
            unmanaged.append(str(ref))
        if has_emptydir(pod):
            local.append(str(ref))
    refused: list[str] = []
    warnings: list[str] = []
    if unmanaged:
        text = "Pods that declare no controller: " + ", ".join(unmanaged)
        if force:
            warnings.append("deleting " + text + " (force)")
        else:
            refused.append(text + " (nothing recreates them; set force: true to evict them)")
    if local:
        text = "Pods with local storage (emptyDir): " + ", ".join(local)
        if delete_emptydir_data:
            warnings.append("deleting " + text + " (their emptyDir data is lost)")
        else:
            refused.append(text + " (their data would be lost; set delete_emptydir_data: "
                           "true to evict them)")
    return Selection(tuple(chosen), tuple(refused), tuple(warnings))


# evict(pod) -> HTTP status (201/200 accepted, 429 blocked by a PDB, 404 gone, other: error)
Evict = Callable[[PodRef], Tuple[int, str]]
# current(pod) -> UID of the pod with that name now, None when it is gone
Current = Callable[[PodRef], Optional[str]]


def evict_all(
    pods: Sequence[PodRef],
    evict: Evict,
    current: Current,
    *,
    timeout: float,
    retry_delay: float = 5.0,
    poll: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> list[str]:
    """Evict every pod and wait until each is gone; returns one log line per event.

    Raises EvictionError naming the pods still there when ``timeout`` runs out.
    """
    deadline = clock() + timeout
    log: list[str] = []
    pending = list(pods)
    blocked: dict[PodRef, str] = {}
    while pending:
        pending = evict_round(pending, evict, blocked, log)
        if pending:
            if clock() >= deadline:
                raise EvictionError(timeout_message(pending, blocked, timeout))
            sleep(retry_delay)
    waiting = list(pods)
    while waiting:
        waiting = [p for p in waiting if current(p) == p.uid]
        if not waiting:
            break
        if clock() >= deadline:
            raise EvictionError(
                f"pods did not terminate within {timeout:g}s: "
                f"{', '.join(str(p) for p in waiting)}"
            )
        sleep(poll)
    return log


def evict_round(pods: Sequence[PodRef], evict: Evict, blocked: dict[PodRef, str],
                log: list[str]) -> list[PodRef]:
    """Ask once for the eviction of each pod; returns those a PodDisruptionBudget refused
    (HTTP 429, the reason kept in ``blocked``). ``evict_all`` loops over it; the
    operator-controller calls it once per pass (it must not block) with its own deadline.
    Raises EvictionError on any other refusal."""
    still: list[PodRef] = []
    for pod in pods:
        status, message = evict(pod)
        if status in (200, 201):
            log.append(f"evicted {pod}")
            blocked.pop(pod, None)
        elif status == 404:
            log.append(f"{pod} already gone")
            blocked.pop(pod, None)
        elif status == 429:
            blocked[pod] = message or "disruption budget"
            still.append(pod)
        else:
            raise EvictionError(f"evicting {pod} failed with HTTP {status}: {message}")
    return still


def timeout_message(pods: Sequence[PodRef], blocked: Mapping[PodRef, str],
                    timeout: float) -> str:
    shown = "; ".join(f"{p}: {blocked.get(p, '?')}" for p in pods)
    return (
        f"eviction blocked for {timeout:g}s (PodDisruptionBudget, HTTP 429): {shown}. "
        "Scale the workload or relax its PodDisruptionBudget, then rerun"
    )
