"""The accelerator manual's CUDA Deployment on the lab (SPEC §14, issue 27 item 4).

The manual's block 002-08 selects nodes with ``nodeAffinity`` on the bare keys
``cuda-major-version`` (In 12) and ``cuda-minor-version`` (Gt 2). A CUDA version is known
only for a node whose NVIDIA driver reports it (NVML); the lab's real node simulates MetaX
C500s, for which gpuk8s publishes no CUDA version (MACA is not CUDA), so it carries no such
label and must not match. The CUDA nodes here are lab fake nodes (``lab/fake-nodes``: Node
objects through the real API, Ready through their Leases, no kubelet) whose labels come
from discovery of simulated NVIDIA roots through ``core.labels`` — the labeller's code —
and are then changed by the labeller service itself (``gpuk8s serve labeller --once``)
against the real kube-apiserver. The real kube-scheduler decides where the manual's pod
goes; the pod never runs (no kubelet on a fake node), its binding is the result.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuk8s import sim
from gpuk8s.sim import tree
from tests.manual import block

from .conftest import (
    BUSYBOX,
    KUBECONFIG,
    LAB,
    kubectl,
    kubectl_json,
    run,
    tool,
    wait_until,
)

pytestmark = pytest.mark.e2e

DATA = Path(__file__).parent / "data" / "manual-002-08-cuda-app.yaml"
PREFIX = "fake-cuda"
H100, A100, C500 = f"{PREFIX}-0000", f"{PREFIX}-0001", f"{PREFIX}-0002"
BARE = ("cuda-major-version", "cuda-minor-version")


def manual_deployment(namespace: str) -> dict[str, Any]:
    """002-08 as printed, plus what the manual leaves out of a Deployment."""
    printed = yaml.safe_load(DATA.read_text())
    obj = copy.deepcopy(printed)
    obj["metadata"]["namespace"] = namespace
    obj["spec"]["selector"] = {"matchLabels": {"app": "cuda-app"}}
    template = obj["spec"]["template"]
    template["metadata"] = {"labels": {"app": "cuda-app"}}
    template["spec"]["terminationGracePeriodSeconds"] = 1
    template["spec"]["containers"] = [{"name": "main", "image": BUSYBOX,
                                       "command": ["sleep", "3600"]}]
    # the printed affinity is untouched
    assert template["spec"]["affinity"] == printed["spec"]["template"]["spec"]["affinity"]
    return obj


def test_the_data_file_is_the_manuals_block() -> None:
    """The block as docs/manual/MANUAL_COMMANDS.md (the repository's copy of the manual's
    commands) has it; tests/unit/test_manual_commands.py keeps that copy equal to
    ../shared/MANUAL_COMMANDS.md where it exists."""
    ours = "".join(line + "\n" for line in DATA.read_text().splitlines()
                   if not line.startswith("#"))
    assert ours == block("002-08").code


def labels(node: str) -> dict[str, str]:
    return dict(kubectl_json("get", "node", node)["metadata"].get("labels") or {})


def serve_labeller_once(node: str, root: str) -> None:
    run(tool("gpuk8s"), "serve", "labeller", "--once", "--node-name", node, "--host-root", root,
        "--kubeconfig", KUBECONFIG, timeout=120,
        env={**os.environ, "PATH": f"{os.path.dirname(tool('gpuk8s'))}:{os.environ['PATH']}"})


def set_driver_cuda(root: str, version: str | None) -> None:
    state = sim.state(root)
    state["driver"]["cuda"] = version
    tree.save_state(root, state)


def bound_node(namespace: str) -> str:
    pods = kubectl_json("-n", namespace, "get", "pods", "-l", "app=cuda-app")["items"]
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    return live[0]["spec"].get("nodeName", "") if len(live) == 1 else ""


def unschedulable(namespace: str) -> str:
    pods = kubectl_json("-n", namespace, "get", "pods", "-l", "app=cuda-app")["items"]
    for pod in pods:
        if pod["metadata"].get("deletionTimestamp"):
            continue
        for cond in pod["status"].get("conditions", []):
            if cond["type"] == "PodScheduled" and cond.get("reason") == "Unschedulable":
                return str(cond.get("message", ""))
    return ""


def delete_pods(namespace: str) -> None:
    kubectl("-n", namespace, "delete", "pods", "-l", "app=cuda-app", "--grace-period=0",
            "--force", "--wait=false", check=False)


@pytest.fixture()
def cuda_nodes() -> Any:
    run(str(LAB / "fake-nodes"), "3", "--variants", "nvidia-8,a100-8,c500-8", "--prefix", PREFIX,
        "--no-taint", timeout=300)
    try:
        yield None
    finally:
        run(str(LAB / "fake-nodes"), "0", check=False, timeout=300)


def test_the_manuals_deployment_schedules_by_the_bare_cuda_labels(
    lab: dict[str, str], namespace: str, cuda_nodes: Any, tmp_path: Path
) -> None:
    # what the nodes publish: the manual's keys beside ours, only where CUDA is known
    h100, a100 = labels(H100), labels(A100)
    assert (h100["cuda-major-version"], h100["cuda-minor-version"]) == ("12", "4")
    assert h100["metax-tech.com/cuda-minor-version"] == "4"
    assert h100["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert h100["nvidia.com/gpu.compute.major"] == "9"
    assert (a100["cuda-major-version"], a100["cuda-minor-version"]) == ("12", "2")
    for name in (C500, lab["node"]):  # MetaX: no CUDA version, no GFD labels
        assert not any(k in BARE or k.startswith("nvidia.com/gpu.") for k in labels(name)), name

    # the manual's Deployment: only the H100 node (CUDA 12.4) has minor > 2
    kubectl("apply", "-f", "-", stdin=json.dumps(manual_deployment(namespace)))
    assert wait_until("cuda-app bound", lambda: bound_node(namespace), 90) == H100

    # the labeller service owns the keys: NVML of the H100 node cannot say its CUDA version
    # any more (driver broken) -> the labels go; the A100 node's driver is upgraded to a
    # CUDA 12.4 one -> it matches now, and the pod, started again, goes there
    h100_root, a100_root = str(tmp_path / "h100"), str(tmp_path / "a100")
    sim.create(h100_root, "nvidia-8")
    sim.create(a100_root, "a100-8")
    set_driver_cuda(h100_root, None)
    set_driver_cuda(a100_root, "12.4")
    serve_labeller_once(H100, h100_root)
    serve_labeller_once(A100, a100_root)
    h100 = labels(H100)
    assert not any(k in h100 for k in (*BARE, "metax-tech.com/cuda-major-version",
                                       "nvidia.com/cuda.runtime.major"))
    assert h100["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"  # what NVML still says
    assert (labels(A100)["cuda-major-version"], labels(A100)["cuda-minor-version"]) == ("12", "4")
    delete_pods(namespace)
    assert wait_until("cuda-app bound again", lambda: bound_node(namespace), 90) == A100

    # no node left with CUDA 12.3+: the manual's pod stays Pending, unschedulable
    set_driver_cuda(a100_root, "12.2")
    serve_labeller_once(A100, a100_root)
    delete_pods(namespace)
    message = wait_until("cuda-app unschedulable", lambda: unschedulable(namespace), 90)
    assert "node affinity" in message or "selector" in message, message
    kubectl("-n", namespace, "delete", "deployment", "cuda-app", "--wait=false", check=False)
    delete_pods(namespace)


def test_a_hand_set_cuda_label_on_a_metax_node_is_left_alone(
    lab: dict[str, str], tmp_path: Path
) -> None:
    """The manual's 002-07 has the administrator label nodes by hand; on a node without an
    NVIDIA driver gpu-label cannot know better and does not remove them."""
    node = lab["node"]
    kubectl("label", "node", node, "cuda-major-version=12", "cuda-minor-version=4", "--overwrite")
    try:
        root = str(tmp_path / "c500")
        sim.create(root, "c500-8")
        proc = subprocess.run(
            [tool("gpuk8s"), "serve", "labeller", "--once", "--dry-run", "--json",
             "--node-name", node, "--host-root", root, "--kubeconfig", KUBECONFIG],
            capture_output=True, text=True, timeout=120, check=False,
            env={**os.environ, "PATH": f"{os.path.dirname(tool('gpuk8s'))}:{os.environ['PATH']}"})
        assert proc.returncode == 0, proc.stderr
        changes = json.loads(proc.stdout)["changes"]
        assert not any(k in BARE for k in changes), changes
    finally:
        kubectl("label", "node", node, "cuda-major-version-", "cuda-minor-version-", check=False)
