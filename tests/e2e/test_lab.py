"""The lab itself: real components up, node Ready, pods run from locally built images,
the static kube-scheduler, the local registry, simulated device nodes, fake nodes."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import urllib.request
import uuid
from pathlib import Path

import pytest

from .conftest import (
    BUSYBOX,
    FAKE_TOLERATION,
    LAB,
    REGISTRY,
    SIM_ROOT,
    apply,
    kubectl,
    kubectl_json,
    pod_phase,
    run,
    wait_until,
)

pytestmark = pytest.mark.e2e


def busybox_pod(name: str, command: str, **spec: object) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": BUSYBOX, "command": ["sh", "-c", command]}],
            **spec,
        },
    }


def test_status_reports_every_component_healthy(lab: dict[str, str]) -> None:
    proc = run(str(LAB / "status"), check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for component in (
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kubelet",
        "kube-proxy",
        "kube-scheduler",
        "containerd",
        "registry",
    ):
        line = next(ln for ln in proc.stdout.splitlines() if ln.strip().startswith(component + " "))
        assert " ok " in line, line


def test_node_is_ready_at_the_pinned_version(lab: dict[str, str]) -> None:
    node = kubectl_json("get", "node", lab["node"])
    ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"]
    assert ready == "True"
    assert node["status"]["nodeInfo"]["kubeletVersion"] == lab["kube_version"]
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
    server = json.loads(kubectl("version", "-o", "json"))["serverVersion"]["gitVersion"]
    assert server == lab["kube_version"]


def test_scheduler_is_a_static_pod_from_the_kubeadm_manifest(lab: dict[str, str]) -> None:
    manifest = Path("/etc/kubernetes/manifests/kube-scheduler.yaml")
    assert manifest.exists()
    assert "--kubeconfig=/etc/kubernetes/scheduler.conf" in manifest.read_text()
    assert Path("/etc/kubernetes/scheduler.conf").exists()
    pod = kubectl_json("-n", "kube-system", "get", "pod", f"kube-scheduler-{lab['node']}")
    assert pod["metadata"]["annotations"]["kubernetes.io/config.source"] == "file"
    assert pod["status"]["phase"] == "Running"
    assert all(cs["ready"] for cs in pod["status"]["containerStatuses"])
    assert pod["spec"]["containers"][0]["image"].endswith(f"kube-scheduler:{lab['kube_version']}")


def test_pod_from_locally_built_image_runs_and_is_scheduled(namespace: str) -> None:
    token = uuid.uuid4().hex
    apply(
        {
            **busybox_pod("hello", f"echo {token}; sleep 2"),
            "metadata": {"name": "hello", "namespace": namespace},
        }
    )
    wait_until("pod hello Succeeded", lambda: pod_phase(namespace, "hello") == "Succeeded", 120)
    assert token in kubectl("-n", namespace, "logs", "hello")
    pod = kubectl_json("-n", namespace, "get", "pod", "hello")
    # Placed by the real (static-pod) scheduler, networked by the CNI bridge.
    events = kubectl_json(
        "-n", namespace, "get", "events", "--field-selector", "involvedObject.name=hello"
    )
    assert any(e["reason"] == "Scheduled" for e in events["items"])
    assert pod["status"]["podIP"].startswith("10.244.0.")


def test_image_is_pulled_from_the_local_registry(namespace: str) -> None:
    catalog = json.load(urllib.request.urlopen(f"http://{REGISTRY}/v2/_catalog", timeout=5))
    assert "gpuk8s/lab-busybox" in catalog["repositories"]
    pod = busybox_pod("pull", "true")
    pod["metadata"]["namespace"] = namespace
    pod["spec"]["containers"][0]["imagePullPolicy"] = "Always"
    apply(pod)
    wait_until("pod pull Succeeded", lambda: pod_phase(namespace, "pull") == "Succeeded", 120)
    events = kubectl_json(
        "-n", namespace, "get", "events", "--field-selector", "involvedObject.name=pull"
    )
    assert any(e["reason"] == "Pulled" and BUSYBOX in e["message"] for e in events["items"]), events


def test_service_cluster_ip_works_through_kube_proxy(namespace: str) -> None:
    server = busybox_pod(
        "web", "mkdir -p /www && echo lab-ok > /www/index.html && httpd -f -p 8080 -h /www"
    )
    server["metadata"].update({"namespace": namespace})
    apply(server)
    apply(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "web", "namespace": namespace},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
        }
    )
    wait_until("web Running", lambda: pod_phase(namespace, "web") == "Running", 120)
    ip = kubectl("-n", namespace, "get", "svc", "web", "-o", "jsonpath={.spec.clusterIP}")
    # nc, not wget: Debian's static busybox wget crashes (glibc NSS in a static binary).
    request = "printf 'GET / HTTP/1.0\\r\\n\\r\\n'"
    client = busybox_pod(
        "client",
        f"for i in $(seq 1 20); do {request} | nc -w 2 {ip} 80 | grep lab-ok && exit 0; "
        "sleep 1; done; exit 1",
    )
    client["metadata"]["namespace"] = namespace
    apply(client)
    wait_until(
        "client finished", lambda: pod_phase(namespace, "client") in ("Succeeded", "Failed"), 120
    )
    assert pod_phase(namespace, "client") == "Succeeded", kubectl(
        "-n", namespace, "logs", "client", check=False
    )
    assert "lab-ok" in kubectl("-n", namespace, "logs", "client")


def test_simulated_gpus_have_char_device_nodes_a_pod_can_use(namespace: str) -> None:
    cards = sorted((SIM_ROOT / "dev" / "dri").glob("card*"))
    assert len(cards) >= 1, f"no simulated /dev/dri/card* under {SIM_ROOT}"
    assert all(stat.S_ISCHR(os.stat(c).st_mode) for c in cards)
    assert (SIM_ROOT / "usr" / "bin" / "mx-smi").exists() or (SIM_ROOT / "dev" / "mxcd").exists()
    card = cards[0]
    pod = busybox_pod("dev", "ls -l /dev/gpu0")
    pod["metadata"]["namespace"] = namespace
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "card", "mountPath": "/dev/gpu0"}]
    pod["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    pod["spec"]["volumes"] = [
        {"name": "card", "hostPath": {"path": str(card), "type": "CharDevice"}}
    ]
    apply(pod)
    wait_until(
        "pod dev finished", lambda: pod_phase(namespace, "dev") in ("Succeeded", "Failed"), 120
    )
    out = kubectl("-n", namespace, "logs", "dev")
    major, minor = os.major(os.stat(card).st_rdev), os.minor(os.stat(card).st_rdev)
    assert out.startswith("c"), out
    assert f"{major}," in out and f" {minor} " in out, out


@pytest.fixture()
def fake_nodes() -> object:
    run(str(LAB / "fake-nodes"), "4", timeout=300)
    try:
        yield None
    finally:
        run(str(LAB / "fake-nodes"), "0", check=False, timeout=300)


def test_fake_nodes_are_ready_and_the_scheduler_uses_them(
    namespace: str, fake_nodes: object
) -> None:
    nodes = kubectl_json("get", "nodes", "-l", "lab.gpuk8s.io/fake-node=true")["items"]
    assert len(nodes) == 4
    for node in nodes:
        assert node["status"]["capacity"]["metax-tech.com/gpu"] == "8"
        assert "metax-tech.com/gpu.topology.scores" in node["metadata"]["annotations"]
        assert node["metadata"]["labels"]["metax-tech.com/gpu.installed"] == "true"
    # Still Ready after the node monitor grace period: the Lease heartbeat works.
    subprocess.run(["sleep", "45"], check=True)
    for node in kubectl_json("get", "nodes", "-l", "lab.gpuk8s.io/fake-node=true")["items"]:
        ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"]
        assert ready == "True", node["metadata"]["name"]
        assert not any(
            t["key"].startswith("node.kubernetes.io/") for t in node["spec"].get("taints", [])
        )
    # A 7-GPU pod fits only on the variants with 8 allocatable (not on those with 6 or 4
    # free): the real scheduler must respect the fake nodes' allocatable.
    pod = busybox_pod(
        "gpu7",
        "true",
        tolerations=[FAKE_TOLERATION],
        nodeSelector={"lab.gpuk8s.io/fake-node": "true"},
    )
    pod["metadata"]["namespace"] = namespace
    pod["spec"]["containers"][0]["resources"] = {"limits": {"metax-tech.com/gpu": "7"}}
    apply(pod)
    node_name = wait_until(
        "gpu7 bound",
        lambda: kubectl("-n", namespace, "get", "pod", "gpu7", "-o", "jsonpath={.spec.nodeName}"),
        60,
    )
    node = kubectl_json("get", "node", node_name)
    assert int(node["status"]["allocatable"]["metax-tech.com/gpu"]) >= 7
    kubectl("-n", namespace, "delete", "pod", "gpu7", "--grace-period=0", "--force", check=False)
