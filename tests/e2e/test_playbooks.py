"""Issue 7 tests 1 (install playbook), 5 (gpu_aware) and 6 (maintenance) on the lab.

The playbooks install from the local registry: the charts are packaged into build/charts
and pushed with the images by push_artifacts.yml, then install.yml deploys the
extensions scheme; uninstall.yml removes it at the end (and must leave nothing behind).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import (
    FAKE_TOLERATION,
    HELM,
    LAB,
    REPO,
    apply,
    kubectl,
    kubectl_json,
    removing_scheduler_backups,
    requires_paths,
    run,
    tool,
    wait_until,
)
from .test_gpu_stack import SPEC4_LABELS, gpu, gpu_pod

DATA = Path(__file__).parent / "data"

pytestmark = [
    pytest.mark.e2e,
    requires_paths(
        "charts/metax-gpu-extensions",
        "playbooks/push_artifacts.yml",
        "playbooks/install.yml",
        "playbooks/uninstall.yml",
        "inventories/lab",
    ),
]
NS = "metax-gpu-extensions"
INVENTORY = str(REPO / "inventories" / "lab")


def helm_for_ansible() -> str:
    """kubernetes.core.helm (6.2, in the `ansible` package) calls `helm list --all`, which
    helm 4 removed: give the playbooks helm 3 unless GPUK8S_HELM already names one."""
    if os.environ.get("GPUK8S_HELM"):
        return os.environ["GPUK8S_HELM"]
    return run(str(LAB / "tools.sh"), "helm3", timeout=900).stdout.strip()


def playbook(name: str, *extra: str) -> str:
    """ansible-playbook NAME on the lab; the kube-scheduler backups a successful run made
    (gpu_aware.yml, uninstall.yml) are removed again."""
    env = {**os.environ, "GPUK8S_HELM": helm_for_ansible()}
    with removing_scheduler_backups():
        return run(
            tool("ansible-playbook"),
            "-i",
            INVENTORY,
            str(REPO / "playbooks" / name),
            *extra,
            timeout=900,
            cwd=str(REPO),
            env=env,
        ).stdout


@pytest.fixture(scope="module")
def installed_by_playbook(lab: dict[str, str]) -> Iterator[dict[str, str]]:
    charts = REPO / "build" / "charts"
    charts.mkdir(parents=True, exist_ok=True)
    for chart in ("metax-gpu-extensions", "metax-operator"):
        if (REPO / "charts" / chart).exists():
            run(HELM, "package", str(REPO / "charts" / chart), "-d", str(charts))
    try:
        playbook("push_artifacts.yml")
        playbook("install.yml")
        yield lab
    finally:
        run(str(LAB / "fake-nodes"), "0", check=False, timeout=300)
        playbook("uninstall.yml")
        left = kubectl(
            "get",
            "daemonset,deployment,service,configmap",
            "-n",
            NS,
            "-o",
            "name",
            "-l",
            "app.kubernetes.io/managed-by=Helm",
            check=False,
        ).strip()
        assert left == "", f"uninstall left: {left}"


def test_1_install_playbook_registers_gpus(installed_by_playbook: dict[str, str]) -> None:
    node = installed_by_playbook["node"]
    wait_until("capacity 8", lambda: gpu(node, "capacity") == 8, 180)
    wait_until("allocatable 8", lambda: gpu(node) == 8, 60)
    labels = kubectl_json("get", "node", node)["metadata"]["labels"]
    for key in SPEC4_LABELS:
        assert f"metax-tech.com/{key}" in labels, key


def curl_filter(url: str, server_name: str, *tls: str) -> subprocess.CompletedProcess[str]:
    """A filter call with curl (its exit status, its HTTP status on stdout): the name the
    certificate holds resolved to the cluster IP in ``url``, as kube-scheduler's
    serverName makes Go verify it."""
    address = url.split("//", 1)[1].split("/", 1)[0]
    host, port = address.rsplit(":", 1)
    return run("curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "10",
               "--resolve", f"{server_name}:{port}:{host}", *tls, "-X", "POST",
               "-H", "Content-Type: application/json", "--data", '{"Pod": {}, "NodeNames": []}',
               f"https://{server_name}:{port}/filter", check=False)


def assert_only_the_scheduler_is_admitted(extender: dict[str, Any], tmp_path: Path) -> None:
    tls = extender["tlsConfig"]
    url, name, ca = extender["urlPrefix"], tls["serverName"], tls["caFile"]
    # kube-scheduler's own files: admitted
    mine = curl_filter(url, name, "--cacert", ca, "--cert", tls["certFile"], "--key",
                       tls["keyFile"])
    assert (mine.returncode, mine.stdout) == (0, "200"), (mine.stdout, mine.stderr)
    # no client certificate: refused in the handshake, nothing answered
    bare = curl_filter(url, name, "--cacert", ca)
    assert bare.returncode != 0 and bare.stdout in ("", "000"), (bare.stdout, bare.stderr)
    # a certificate of another CA: refused the same way
    other = tmp_path / "other"
    other.mkdir()
    run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        "-subj", "/CN=kube-scheduler", "-keyout", str(other / "key.pem"),
        "-out", str(other / "cert.pem"))
    stranger = curl_filter(url, name, "--cacert", ca, "--cert", str(other / "cert.pem"),
                           "--key", str(other / "key.pem"))
    assert stranger.returncode != 0 and stranger.stdout in ("", "000"), (
        stranger.stdout, stranger.stderr)
    # plain HTTP on the TLS port gets no answer either
    plain = run("curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "10",
                url.replace("https://", "http://") + "/filter", check=False)
    assert plain.stdout != "200", plain.stdout


@requires_paths("playbooks/gpu_aware.yml")
def test_5_gpu_aware_places_4_gpu_pod_inside_one_link_group(
    installed_by_playbook: dict[str, str], tmp_path: Path
) -> None:
    manifest = Path("/etc/kubernetes/manifests/kube-scheduler.yaml")
    original = manifest.read_bytes()
    # Of these variants only the last can hold 4 GPUs inside one MetaXLink group.
    run(
        str(LAB / "fake-nodes"),
        "9",
        "--variants",
        "c500-8:used=0+4,c500-8:used=0+1+4+5,c500-8:used=0+1+2+3",
        timeout=300,
    )
    ns = "e2e-aware"
    try:
        playbook("install.yml", "-e", "gpuk8s_deploy_gpu_aware=true")
        playbook("gpu_aware.yml")
        assert "--config=/etc/metax/extender.yaml" in manifest.read_text()
        wait_until(
            "scheduler back with the extender",
            lambda: (
                run("curl", "-fsSk", "https://127.0.0.1:10259/readyz", check=False).returncode == 0
            ),
            180,
        )
        # issue 26: kube-scheduler calls gpu-aware over HTTPS with its client certificate,
        # and gpu-aware refuses any other client
        extender = yaml.safe_load(Path("/etc/metax/extender.yaml").read_text())["extenders"][0]
        assert extender["urlPrefix"].startswith("https://") and extender["enableHTTPS"] is True
        assert extender["tlsConfig"]["certFile"] == "/etc/metax/gpu-aware/client.crt"
        assert_only_the_scheduler_is_admitted(extender, tmp_path)
        kubectl("create", "namespace", ns, check=False)
        wait_until("default sa", lambda: kubectl("-n", ns, "get", "sa", "default", check=False), 30)
        pod = gpu_pod(ns, "four", 4)
        pod["spec"]["nodeSelector"] = {"lab.gpuk8s.io/fake-node": "true"}
        pod["spec"]["tolerations"] = [FAKE_TOLERATION]
        apply(pod)
        node = wait_until(
            "four bound",
            lambda: kubectl("-n", ns, "get", "pod", "four", "-o", "jsonpath={.spec.nodeName}"),
            120,
        )
        variant = kubectl_json("get", "node", node)["metadata"]["labels"]["lab.gpuk8s.io/variant"]
        assert variant == "c500-8.used-0_1_2_3", variant
        # issue 16: a new weight only changes /etc/metax/extender.yaml; the hash annotation
        # makes the kubelet restart kube-scheduler, and the role waits for the new pod
        scheduler = f"kube-scheduler-{installed_by_playbook['node']}"
        before = kubectl_json("-n", "kube-system", "get", "pod", scheduler)["metadata"]
        playbook("gpu_aware.yml", "-e", "gpu_aware_weight=400")
        config = Path("/etc/metax/extender.yaml").read_text()
        assert "weight: 400" in config
        after = kubectl_json("-n", "kube-system", "get", "pod", scheduler)
        hashes = ("kubernetes.io/config.hash", "metax-tech.com/scheduler-extender")
        assert after["metadata"]["annotations"][hashes[0]] != before["annotations"][hashes[0]]
        marker = json.loads(after["metadata"]["annotations"][hashes[1]])
        assert marker["configHash"] == "sha256:" + hashlib.sha256(config.encode()).hexdigest()
        assert any(c["type"] == "Ready" and c["status"] == "True"
                   for c in after["status"]["conditions"])
        # ...and a kubernetes_version the real scheduler image (the lab's) contradicts is refused
        text = manifest.read_bytes()
        refused = run(tool("ansible-playbook"), "-i", INVENTORY,
                      str(REPO / "playbooks" / "gpu_aware.yml"),
                      "-e", "gpu_aware_kubernetes_version=1.23", timeout=900, cwd=str(REPO),
                      env={**os.environ, "GPUK8S_HELM": helm_for_ansible()}, check=False)
        assert refused.returncode != 0
        assert "selects kubescheduler.config.k8s.io/v1beta3" in refused.stdout
        assert manifest.read_bytes() == text
    finally:
        kubectl("delete", "namespace", ns, "--wait=false", check=False)
        playbook("gpu_aware.yml", "-e", "gpu_aware_state=absent")
        run(str(LAB / "fake-nodes"), "0", check=False, timeout=300)
    assert manifest.read_bytes() == original


@requires_paths("playbooks/maintenance.yml")
def test_6_maintenance_cordons_evicts_and_restores(
    installed_by_playbook: dict[str, str], tmp_path: Path
) -> None:
    node = installed_by_playbook["node"]
    ns = "e2e-maintenance"
    kubectl("create", "namespace", ns, check=False)
    wait_until("default sa", lambda: kubectl("-n", ns, "get", "sa", "default", check=False), 30)
    try:
        kubectl("apply", "-f", "-", stdin=json.dumps(gpu_pod(ns, "holds-two", 2)))
        kubectl("-n", ns, "wait", "--for=condition=Ready", "pod/holds-two", "--timeout=120s")
        probe = tmp_path / "probe.json"
        os.environ["GPUK8S_MAINTENANCE_PROBE"] = str(probe)
        try:
            playbook(
                "maintenance.yml",
                "-e", "node_maintenance_action=tasks",
                "-e", f"node_maintenance_action_tasks={DATA / 'maintenance_probe.yml'}",
                # holds-two is a bare pod: like kubectl drain, only evicted with force
                "-e", "node_maintenance_evict_force=true",
            )  # fmt: skip
        finally:
            os.environ.pop("GPUK8S_MAINTENANCE_PROBE", None)
        during = json.loads(probe.read_text())
        # SPEC §9 during the action: cordoned, no metax-tech.com/ label, GPU pods gone.
        assert during["unschedulable"] is True
        assert not [k for k in during["labels"] if k.startswith("metax-tech.com/")]
        assert "holds-two" not in during["pods"]
        assert not [p for p in during["pods"] if p.startswith("metax-gpu-device")]
        # ...and after: uncordoned, labels and allocatable GPUs back.
        obj = kubectl_json("get", "node", node)
        assert not obj["spec"].get("unschedulable", False)
        assert obj["metadata"]["labels"].get("metax-tech.com/gpu.installed") == "true"
        assert "metax-tech.com/maintenance" not in obj["metadata"].get("annotations", {})
        wait_until("allocatable back", lambda: gpu(node) == 8, 120)
    finally:
        kubectl("delete", "namespace", ns, "--wait=false", check=False)
