"""The pod API GPU sharing's ``bind`` goes through: read, bind with annotations.

``PodApi`` is the protocol (tests give an in-memory one); ``KubePodApi`` speaks to the
API server with the kubernetes client. A Binding's ``metadata.annotations`` are set on
the pod by the API server in the same write as its node (``pods/binding``: the pod's
UID must be the Binding's, and a bound pod is refused, 409), so the GPU choice and the
node reach the pod, its watchers and etcd at once: one write, no pod left annotated
and unbound.

Example: ``KubePodApi(client).bind("ml", "p1", uid, "n1", {"a": "x"})`` binds pod ml/p1
of that UID to node n1 and sets its annotation ``a``.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from .. import kube


class PodApi(Protocol):
    """The API calls ``bind`` makes (``KubePodApi``; tests may pass their own)."""

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]: ...

    def bind(
        self, namespace: str, name: str, uid: str, node: str,
        annotations: dict[str, str] | None = None,
    ) -> None: ...


class KubePodApi:
    """``PodApi`` over the kubernetes client (pods get/patch, pods/binding create)."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes import client

        self._core = client.CoreV1Api(api_client)

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        resp: Any = self._core.read_namespaced_pod(name, namespace, _preload_content=False)
        data: dict[str, Any] = json.loads(kube.body(resp))
        return data

    def touch(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        """Set annotations whatever the pod's version (``requeue.PodToucher``)."""
        kube.body(
            self._core.patch_namespaced_pod(
                name,
                namespace,
                {"metadata": {"annotations": annotations}},
                _content_type="application/merge-patch+json",
                _preload_content=False,
            )
        )

    def bind(
        self, namespace: str, name: str, uid: str, node: str,
        annotations: dict[str, str] | None = None,
    ) -> None:
        """Bind the pod of ``uid`` to ``node``, setting ``annotations`` on it in the same
        write (409 for another UID or a bound pod)."""
        metadata: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid}
        if annotations:
            metadata["annotations"] = dict(annotations)
        body: Any = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": metadata,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        kube.body(
            self._core.create_namespaced_pod_binding(name, namespace, body, _preload_content=False)
        )
