"""A node plugin's access to its own Node through the API server.

gpu-device patches its Node's annotations with it (``deviceplugin.nodestate``); RBAC
and the chart's ValidatingAdmissionPolicy limit each node's ServiceAccount to its own
Node (docs/charts.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from ...core.errors import GpuK8sError
from .. import kube


class NodeStateError(GpuK8sError):
    """Reading allocations or patching the node failed (temporary: retried)."""


class NodePatcher(Protocol):
    """Where node annotations go. Tests use a recording fake or a real apiserver."""

    def get_annotations(self, node: str) -> dict[str, str]: ...

    def patch_annotations(self, node: str, annotations: Mapping[str, str | None]) -> None: ...


class KubernetesNodePatcher:
    """``NodePatcher`` over the official client (``services.kube.api_client``: an
    explicit kubeconfig, the in-cluster service account, or $KUBECONFIG)."""

    def __init__(self, kubeconfig: str | None = None, api_client: Any = None) -> None:
        from kubernetes import client

        if api_client is None:
            api_client = kube.api_client(kubeconfig)
        self.api = client.CoreV1Api(api_client)

    def get_annotations(self, node: str) -> dict[str, str]:
        try:
            obj = self.api.read_node(node)
        except Exception as err:  # classified: temporary vs permanent ApiError
            raise kube.classify(err, f"read node {node}") from err
        meta = obj.metadata
        return dict(meta.annotations or {}) if meta is not None else {}

    def patch_annotations(self, node: str, annotations: Mapping[str, str | None]) -> None:
        body = {"metadata": {"annotations": dict(annotations)}}
        try:
            self.api.patch_node(node, body, _content_type="application/merge-patch+json")
        except Exception as err:
            raise kube.classify(err, f"patch node {node}") from err
