"""gpu-exporter against a real kube-apiserver: the stdlib in-cluster reader lists the
pods of one node (field selector, TLS with the CA file, bearer token), and the chart's
RBAC lets the exporter do exactly that."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuk8s.core.errors import GpuK8sError
from gpuk8s.core.telemetry import ContainerRef
from gpuk8s.services.exporter.pods import in_cluster_lister
from gpuk8s.services.kube import InClusterReader, PermanentApiError

pytestmark = pytest.mark.integration

CID = "c" * 64


def _secrets(tmp_path: Path, apiserver: Any, token: str) -> str:
    certs = Path(apiserver.workdir) / "certs"
    (tmp_path / "token").write_text(token + "\n")
    (tmp_path / "ca.crt").write_text((certs / "apiserver.crt").read_text())
    return str(tmp_path)


def test_in_cluster_reader_lists_the_pods_of_one_node(apiserver: Any, tmp_path: Path) -> None:
    from kubernetes import client

    core = apiserver.core()
    ns = "exporter-it"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    try:  # no controller-manager here: the ServiceAccount admission needs "default" to exist
        core.create_namespaced_service_account(ns, client.V1ServiceAccount(
            metadata=client.V1ObjectMeta(name="default")))
        for name, node in (("train", "gpu-1"), ("elsewhere", "gpu-2")):
            core.create_namespaced_pod(ns, client.V1Pod(
                metadata=client.V1ObjectMeta(name=name, annotations={
                    "gpuk8s.io/sharing.assigned": json.dumps({
                        "node": node, "mode": "sgpu", "gpus": [5], "core": 50,
                        "memoryMiB": 0, "whole": False, "container": "main"})}),
                spec=client.V1PodSpec(node_name=node, containers=[
                    client.V1Container(name="main", image="busybox")])))
        pod = core.read_namespaced_pod("train", ns)
        core.patch_namespaced_pod_status("train", ns, {"status": {"containerStatuses": [{
            "name": "main", "containerID": f"containerd://{CID}", "image": "busybox",
            "imageID": "", "ready": True, "restartCount": 0}]}})
        reader = InClusterReader(_secrets(tmp_path, apiserver, "admin-token"), "127.0.0.1",
                                 apiserver.port)
        index = in_cluster_lister("gpu-1", reader)()
        assert index.by_id == {CID: ContainerRef(ns, "train", "main")}
        assert list(index.by_uid) == [pod.metadata.uid]  # only gpu-1's pod
        assert {k: a.gpus for k, a in index.assigned.items()} == {(ns, "train"): (5,)}
        assert index.listed == {(ns, "train")} and not index.unreadable
        (tmp_path / "nobody").mkdir()
        nobody = InClusterReader(_secrets(tmp_path / "nobody", apiserver, "nobody-token"),
                                 "127.0.0.1", apiserver.port)
        with pytest.raises(PermanentApiError, match="HTTP 403"):
            in_cluster_lister("gpu-1", nobody)()
        bad_ca = tmp_path / "badca"
        bad_ca.mkdir()
        (bad_ca / "token").write_text("admin-token")
        (bad_ca / "ca.crt").write_text("not a certificate")
        with pytest.raises(GpuK8sError):
            in_cluster_lister("gpu-1", InClusterReader(str(bad_ca), "127.0.0.1",
                                                       apiserver.port))()
    finally:
        core.delete_namespace(ns)
