"""The toolkit driven over SSH against the fleet (inventories/fleet, lab/README.md "Fleet"),
as an administrator runs it from a workstation: what the fleet modules share (the playbook
runner, the node helpers, the variables that point the playbooks at this checkout's
artifacts, cp2's scheduler running for a module) and what an install of the GPU Extensions
scheme on every node must show (``assert_extensions_everywhere``).

That install (conftest's ``fleet_extensions``, made by test_fleet_sched.py's
``extensions_installed``, ONE install for test_fleet_maint.py and test_fleet_sched.py) is the
GPU Extensions scheme under the release name ``e2e-fleet`` (a name the session fixture
``releases_set_aside`` treats as the tier's own), with -e gpuk8s_scheme=extensions: one
scheme on every node. The fleet's nodes are tainted lab.gpuk8s.io/fleet, so the release
tolerates that taint. Images and charts go to their own registry project, so the
single-node tier's stay as lab/up pushed them. The lab node and the extensions nodes
advertise their GPUs, the driverless operator nodes (gpu-op, gpu-op2) have their GPUs found
but none advertised, cp2 none.

No test of its own: install.yml, verify.yml and uninstall.yml over SSH, node by node, are
asserted on the one install of both schemes in tests/e2e/test_fleet_schemes.py."""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from .conftest import (
    CACHE,
    FLEET_MARKS,
    HELM,
    LAB,
    REGISTRY,
    REPO,
    VERSIONS,
    kubectl,
    kubectl_json,
    run,
    standby_scheduler_up,
    tool,
)

pytestmark = FLEET_MARKS

FLEET_NODES = ("cp2", "gpu-ext", "gpu-vf", "gpu-op", "gpu-nv", "gpu-op2")
# inventories/fleet's gpu_operator_nodes: driverless (lab/fleetctl's preset nodriver-8)
OPERATOR_NODES = ("gpu-op", "gpu-op2")
RELEASE = "e2e-fleet"
NAMESPACE = "metax-gpu-extensions"
FLEET_TAINT = {"key": "lab.gpuk8s.io/fleet", "operator": "Exists", "effect": "NoSchedule"}
OUR_LABEL_PREFIXES = ("metax-tech.com/", "gpuk8s.io/")
BUILD = REPO / "build"
# lab/up builds the images in the checkout it runs from; a worktree uses the main checkout's
IMAGES = next(
    (d for d in (BUILD / "images", REPO.parent.parent / "main" / "build" / "images") if d.is_dir()),
    BUILD / "images",
)
HELM3 = str(CACHE / "bin" / f"helm-{VERSIONS['HELM3_VERSION']}" / "helm")  # kubernetes.core.helm
# What lab/install's inventory sets for the lab registry and helm, given on the command line:
# inventories/fleet describes the nodes, not where this checkout's artifacts are.
EXTRA_VARS: dict[str, Any] = {
    "gpuk8s_scheme": "extensions",
    # the API tasks on the controller (this venv has the kubernetes library; the lab node's
    # system Python, found by interpreter discovery over SSH, has not)
    "gpuk8s_api_host": "localhost",
    "gpuk8s_registry": f"{REGISTRY}/e2e-fleet",
    "gpuk8s_helm_binary": HELM3,
    "gpuk8s_images_dir": str(IMAGES),
    "gpuk8s_charts_dir": str(BUILD / "charts"),
    "gpuk8s_host_extra_read_paths": ["/var/lib/gpuk8s-sim"],
    "gpu_artifacts_charts_force": True,
    "gpu_artifacts_images_tls_verify": False,
    "gpu_artifacts_charts_plain_http": True,
    "gpu_extensions_plain_http": True,
    "gpu_extensions_release_name": RELEASE,
    "gpu_extensions_values": {"tolerations": [FLEET_TAINT]},
    # the driverless operator node, the NVIDIA node (outside gpu_nodes) and other sessions'
    # fake nodes are not this install's to verify
    "gpu_extensions_gpu_node_selector": (
        "metax-tech.com/gpu.installed=true,lab.gpuk8s.io/fleet-role notin (operator,nvidia),"
        "lab.gpuk8s.io/fake-node!=true"
    ),
    "gpu_extensions_min_gpu_nodes": 3,
}
# node -> GPUs it advertises under the extensions scheme (lab/fleetctl's presets: c500-8 on
# the lab node and gpu-ext, c500-8-vf4 on gpu-vf: 8 GPUs x 4 VFs)
EXPECTED_GPUS = {"gpu-ext": 8, "gpu-vf": 32}


def playbook(name: str, *args: str, extra: dict[str, Any] | None = None,
             base: dict[str, Any] | None = None) -> None:
    """ansible-playbook -i inventories/fleet playbooks/NAME.yml over SSH with ``base``
    (default EXTRA_VARS) and ``extra``; timed."""
    start = time.monotonic()
    run(
        tool("ansible-playbook"),
        "-i",
        str(REPO / "inventories" / "fleet"),
        str(REPO / "playbooks" / f"{name}.yml"),
        "-e",
        json.dumps({**(EXTRA_VARS if base is None else base), **(extra or {})}),
        *args,
        cwd=str(REPO),
        timeout=1200,
    )
    print(f"\n[fleet] {name}.yml in {time.monotonic() - start:.0f}s", file=sys.stderr)


def node_exec(node: str, *command: str) -> str:
    """A command in a fleet node's own root (its mount and network namespaces)."""
    return run(str(LAB / "fleetctl"), "exec", node, *command, timeout=60).stdout


def containerd_config_hash(node: str) -> str:
    """sha256 of the node's containerd config as the node sees it ('' when absent)."""
    out = run(
        str(LAB / "fleetctl"),
        "exec",
        node,
        "cat",
        "/etc/containerd/config.toml",
        check=False,
        timeout=60,
    )
    return hashlib.sha256(out.stdout.encode()).hexdigest() if out.returncode == 0 else ""


def nodes() -> dict[str, dict[str, Any]]:
    return {n["metadata"]["name"]: n for n in kubectl_json("get", "nodes")["items"]}


def our_labels(node: dict[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = node["metadata"].get("labels", {})
    return {k: v for k, v in labels.items() if k.startswith(OUR_LABEL_PREFIXES)}


def restore_labels(before: dict[str, dict[str, str]]) -> None:
    """Our labels on the fleet nodes back to what they were before the module (the
    single-node tier and the next run find the fleet as lab/up left it)."""
    found = nodes()
    for name, labels in before.items():
        now = our_labels(found[name])
        changes = [f"{k}-" for k in now if k not in labels]
        changes += [f"{k}={v}" for k, v in labels.items() if now.get(k) != v]
        if changes:
            kubectl("label", "--overwrite", "node", name, *changes)


def package_charts() -> None:
    (BUILD / "charts").mkdir(parents=True, exist_ok=True)
    for chart in ("metax-gpu-extensions", "metax-operator"):
        run(HELM, "package", str(REPO / "charts" / chart), "-d", str(BUILD / "charts"))


def device_plugin_nodes(release: str, namespace: str) -> set[str]:
    """The nodes the release's gpu-device pods run on."""
    pods = kubectl_json(
        "-n", namespace, "get", "pods", "-l", "app.kubernetes.io/instance=" + release
    )
    return {
        p["spec"].get("nodeName") or ""
        for p in pods["items"]
        if p["metadata"]["labels"].get("app.kubernetes.io/name") == "gpu-device"
    }


def assert_extensions_everywhere(lab_node: str) -> None:
    """What the GPU Extensions scheme on every node (``installed``) shows: every MetaX node
    with a driver advertises its GPUs, the driverless one none, cp2 none."""
    found = nodes()
    expected = {lab_node: 8, **EXPECTED_GPUS}
    for name, gpus in expected.items():
        node = found[name]
        assert node["status"]["allocatable"].get("metax-tech.com/gpu") == str(gpus), name
        labels = node["metadata"]["labels"]
        assert labels["metax-tech.com/gpu.product"] == "C500", name
        assert labels["metax-tech.com/driver.ready"] == "true", name
    assert found["gpu-vf"]["metadata"]["labels"]["metax-tech.com/gpu.sriov"] == "on"
    # the driverless nodes: their GPUs found, none advertised without a driver
    for name in OPERATOR_NODES:
        op = found[name]
        assert op["metadata"]["labels"]["metax-tech.com/gpu.installed"] == "true", name
        assert op["metadata"]["labels"].get("metax-tech.com/driver.ready") != "true", name
        assert op["status"]["allocatable"].get("metax-tech.com/gpu", "0") == "0", name
    # the second control plane has no GPUs
    assert found["cp2"]["status"]["allocatable"].get("metax-tech.com/gpu", "0") == "0"
    assert found["cp2"]["metadata"]["labels"]["metax-tech.com/gpu.installed"] == "false"
    # the release's node agents run on the fleet's GPU nodes (the fleet taint tolerated)
    device_nodes = device_plugin_nodes(RELEASE, NAMESPACE)
    assert set(expected) <= device_nodes, device_nodes
    assert not device_nodes & {"cp2", *OPERATOR_NODES}, device_nodes


@pytest.fixture(scope="module")
def both_schedulers(lab: dict[str, str], standby_scheduler_parked: bool) -> Iterator[None]:
    """cp2's kube-scheduler running for the module (the tier parks it): the playbooks
    configure and restore both control planes."""
    with standby_scheduler_up(lab["node"], standby_scheduler_parked):
        yield
