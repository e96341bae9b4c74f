"""The GPU Operator scheme on a lab node running containerd 2.x (lab/up --containerd 2:
built from Go modules by lab/tools.sh containerd2), whose CRI injects CDI devices itself.

container-runtime must see that (the Node's containerRuntimeVersion, then the CRI's own
config over the socket), write the CDI spec and leave containerd alone: no runtime handler,
no wrapper, no restart. The pod gets its GPUs and the SDK from containerd's CDI support.
The module switches the lab to containerd 2.x and back to what it ran (the lab's default
is 1.6, on which tests/e2e/test_operator.py tests the wrapper). Order matters.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuk8s.host.serving import socket_peer_pid
from gpuk8s.services.runtime import containerd

from .conftest import (
    LAB,
    SIM_ROOT,
    STATE,
    VERSIONS,
    containerd_generation,
    kubectl,
    kubectl_json,
    requires_paths,
    run,
    wait_until,
)
from .test_gpu_stack import gpu
from .test_operator import (
    CDI_SPEC,
    CONTAINERD_CONFIG,
    CONTAINERD_SOCKET,
    NS,
    P,
    bare_operator_node,
    gpu_pod_sees_the_sdk_its_devices_and_env,
    labels,
    operator_status,
    playbook,
    releases,
)

pytestmark = [pytest.mark.e2e, requires_paths("charts/metax-operator", "lab/supervise")]

CONTAINERD2_CONFIG = STATE / "containerd" / "config-v3.toml"
CONTAINERD2_STATE = Path("/run/gpuk8s-lab/containerd2")
VERSION = VERSIONS["CONTAINERD2_VERSION"]


@pytest.fixture(scope="module")
def node2(lab: dict[str, str]) -> Iterator[dict[str, str]]:
    with bare_operator_node(lab, "2") as node:
        yield {**node, "containerd2_config": CONTAINERD2_CONFIG.read_text()}


def test_1_the_lab_node_runs_containerd_2_with_cdi(node2: dict[str, str]) -> None:
    assert containerd_generation() == "2"
    pid = socket_peer_pid(CONTAINERD_SOCKET)
    exe = os.readlink(f"/proc/{pid}/exe")
    assert exe.endswith(f"/containerd-{VERSION}/containerd"), exe
    info = kubectl_json("get", "node", node2["node"])["status"]["nodeInfo"]
    assert info["containerRuntimeVersion"] == f"containerd://{VERSION.lstrip('v')}"
    served = containerd.cri_config(CONTAINERD_SOCKET)
    assert containerd.cri_cdi_enabled(served)
    assert served["restrictOOMScoreAdj"] is True  # the lab's quirk, kept on 2.x
    assert "/etc/cdi" in served["cdiSpecDirs"]
    # the sandbox image and the static scheduler pod run on it
    pods = kubectl_json("get", "pods", "-n", "kube-system")["items"]
    assert any(p["metadata"]["name"].startswith("kube-scheduler") and
               p["status"]["phase"] == "Running" for p in pods)


def test_2_operator_scheme_uses_containerd_cdi_and_leaves_containerd_alone(
    node2: dict[str, str], namespace: str
) -> None:
    node = node2["node"]
    before = socket_peer_pid(CONTAINERD_SOCKET)
    run(str(LAB / "install"), "-e", "gpuk8s_scheme=operator",
        "-e", "gpu_artifacts_charts_force=true", timeout=900)
    wait_until("allocatable 8", lambda: gpu(node) == 8, 180)
    got = labels(node)
    for key in ("driver.ready", "maca.ready", "runtime.ready", "gpu.installed"):
        assert got[P + key] == "true", key
    state = json.loads(kubectl_json("get", "node", node)["metadata"]["annotations"][
        P + "container-runtime.state"])
    assert state["state"] == "ready" and state["mode"] == "native", state
    assert "the runtime's own CDI support" in state["message"]
    assert CDI_SPEC.exists()
    # containerd untouched: its configs, no handler, no wrapper, no restart
    assert CONTAINERD2_CONFIG.read_text() == node2["containerd2_config"]
    assert CONTAINERD_CONFIG.read_text() == node2["containerd_config"]
    # (the chart's install-dir volume makes the directory; nothing goes into it)
    assert not any(Path("/usr/local/gpuk8s").glob("**/*"))
    assert socket_peer_pid(CONTAINERD_SOCKET) == before
    wait_until("status says ready",
               lambda: operator_status()["summary"] == "1/1 GPU node(s) ready", 60)
    cid = gpu_pod_sees_the_sdk_its_devices_and_env(namespace)
    # containerd's CRI applied the CDI devices itself (no wrapper is installed)
    oci = json.loads((CONTAINERD2_STATE / "io.containerd.runtime.v2.task/k8s.io" / cid /
                      "config.json").read_text())
    assert any(m["destination"] == "/opt/maca" for m in oci["mounts"])
    assert (SIM_ROOT / "opt/maca").exists()
    kubectl("delete", "pod", "plain", "-n", namespace, "--wait=false")


def test_3_uninstall_leaves_containerd_as_it_was(node2: dict[str, str]) -> None:
    before = socket_peer_pid(CONTAINERD_SOCKET)
    playbook("uninstall.yml", "-e", "gpuk8s_scheme=operator")
    assert not releases(NS)
    assert not CDI_SPEC.exists()
    assert CONTAINERD2_CONFIG.read_text() == node2["containerd2_config"]
    assert socket_peer_pid(CONTAINERD_SOCKET) == before  # never restarted
