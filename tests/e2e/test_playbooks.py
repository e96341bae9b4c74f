"""Issue 7 tests 1 (install playbook) and 6 (maintenance) on the lab. Test 5 (gpu_aware.yml)
moved to the fleet, where it runs over SSH on both control planes: tests/e2e/test_fleet_sched.py.

The playbooks install from the local registry: the charts are packaged into build/charts
and pushed with the images by push_artifacts.yml, then install.yml deploys the
extensions scheme; uninstall.yml removes it at the end (and must leave nothing behind).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import (
    HELM,
    LAB,
    REPO,
    kubectl,
    kubectl_json,
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
    env = {**os.environ, "GPUK8S_HELM": helm_for_ansible()}
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
