"""Leader election for gpu-aware replicas: one ``coordination.k8s.io`` Lease, one booker.

Shared-GPU bookings (``share.Sharing.bind``) are decided against the replica's own ledger
under an in-process lock: two replicas binding at once could each put a pod on the same
free share of a GPU before either watch shows the other's annotation. So with more than
one replica exactly one may book: the holder of the Lease (``--leader-elect``). The
others answer filter and prioritize from their warm caches and refuse shared-GPU binds
(kube-scheduler retries the pod), and take over when the holder stops renewing.

The election is ``services.leader`` (client-go's algorithm). The leader labels its pod
``LEADER_LABEL=true`` (and removes the label when it stops leading, and at start): the
chart's Service selects that label, so kube-scheduler's calls reach the leader.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from .. import kube
from ..leader import (
    API_TIMEOUT_S,
    LEASE_DURATION_S,
    RENEW_DEADLINE_S,
    RETRY_PERIOD_S,
    Conflict,
    Elector,
    KubeLeaseApi,
    LeaseApi,
    micro_time,
    record_of,
)

__all__ = [
    "API_TIMEOUT_S", "BIND_MARGIN_S", "DEFAULT_LEASE", "LEADER_LABEL", "LEASE_DURATION_S",
    "RENEW_DEADLINE_S", "RETRY_PERIOD_S", "Conflict", "Elector", "KubeLeaseApi",
    "KubePodLabeler", "LeaseApi", "PodLabeler", "gate", "micro_time", "record_of",
]

LEADER_LABEL = "gpuk8s.io/gpu-aware-leader"
DEFAULT_LEASE = "gpu-aware"
# a binding must finish within this margin of the leadership's end (its API write)
BIND_MARGIN_S = 3.0


class PodLabeler(Protocol):
    def label(self, leader: bool) -> None: ...


def gate(elector: Elector, margin: float = BIND_MARGIN_S) -> Callable[[], str]:
    """``Sharing.gate``: "" while this replica may book shared GPUs, else why not."""

    def check() -> str:
        if elector.leading(margin):
            return ""
        return (
            f"gpu-aware: this replica ({elector.identity}) does not hold the Lease "
            f"{elector.namespace}/{elector.name}; only the leader books shared GPUs (retry)"
        )

    return check


class KubePodLabeler:
    """Sets or removes ``LEADER_LABEL`` on this replica's own pod."""

    def __init__(self, api_client: Any, namespace: str, pod: str) -> None:
        from kubernetes import client

        self._core = client.CoreV1Api(api_client)
        self.namespace = namespace
        self.pod = pod

    def label(self, leader: bool) -> None:
        value = "true" if leader else None
        kube.body(
            self._core.patch_namespaced_pod(
                self.pod,
                self.namespace,
                {"metadata": {"labels": {LEADER_LABEL: value}}},
                _content_type="application/merge-patch+json",
                _preload_content=False,
                _request_timeout=API_TIMEOUT_S,
            )
        )
