"""The pod API GPU sharing's ``bind`` writes through: read, annotate, bind.

``PodApi`` is the protocol (tests give an in-memory one); ``KubePodApi`` speaks to the
API server with the kubernetes client: an annotation patch carries the pod's
``resourceVersion``, so the API refuses it (409) when the pod changed since it was
read.

Example: ``KubePodApi(client).annotate("ml", "p1", "42", {"a": "x", "b": None})`` sets
``a`` and removes ``b`` on pod ml/p1 if its resourceVersion is still 42.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from .. import kube


class PodApi(Protocol):
    """The API calls ``bind`` makes (``KubePodApi``; tests may pass their own)."""

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]: ...

    def annotate(
        self, namespace: str, name: str, resource_version: str, annotations: dict[str, str | None]
    ) -> None: ...

    def bind(self, namespace: str, name: str, uid: str, node: str) -> None: ...


class KubePodApi:
    """``PodApi`` over the kubernetes client (pods get/patch, pods/binding create)."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes import client

        self._core = client.CoreV1Api(api_client)

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        resp: Any = self._core.read_namespaced_pod(name, namespace, _preload_content=False)
        data: dict[str, Any] = json.loads(kube.body(resp))
        return data

    def annotate(
        self, namespace: str, name: str, resource_version: str, annotations: dict[str, str | None]
    ) -> None:
        """Set annotations if the pod is still at ``resource_version`` (409 otherwise)."""
        self._patch_metadata(
            namespace, name, {"resourceVersion": resource_version, "annotations": annotations}
        )

    def touch(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        """Set annotations whatever the pod's version (``requeue.PodToucher``)."""
        self._patch_metadata(namespace, name, {"annotations": annotations})

    def _patch_metadata(self, namespace: str, name: str, metadata: dict[str, Any]) -> None:
        kube.body(
            self._core.patch_namespaced_pod(
                name,
                namespace,
                {"metadata": metadata},
                _content_type="application/merge-patch+json",
                _preload_content=False,
            )
        )

    def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        body: Any = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        kube.body(
            self._core.create_namespaced_pod_binding(name, namespace, body, _preload_content=False)
        )
