"""Issue 7 test 1 (install playbook) on the lab. Tests 5 (gpu_aware.yml) and 6
(maintenance.yml) moved to the fleet, where they run over SSH as an administrator runs them:
tests/e2e/test_fleet_sched.py (both control planes) and test_fleet_maint.py (a GPU node).

The playbooks install from the local registry: the charts are packaged into build/charts
and pushed with the images by push_artifacts.yml, then install.yml deploys the
extensions scheme; uninstall.yml removes it at the end (and must leave nothing behind).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .conftest import (
    HELM,
    REPO,
    kubectl,
    kubectl_json,
    playbook,
    requires_paths,
    run,
    wait_until,
)
from .test_gpu_stack import SPEC4_LABELS, gpu

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
