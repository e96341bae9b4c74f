"""The GPU stack on the lab (issue 7, tests 1-7): our images, our chart, the real kubelet.

Order matters inside this module (one install shared by the tests, torn down at the end).
The chart is installed with helm straight from the checkout (test 1 again through the
install playbook when it exists); the lab points the node agents at the simulator root.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator

import pytest

from .conftest import (
    BUSYBOX,
    HELM,
    KUBECONFIG,
    LAB,
    REGISTRY,
    REPO,
    SIM_ROOT,
    apply,
    kubectl,
    kubectl_json,
    pod_phase,
    requires_paths,
    run,
    wait_until,
)

pytestmark = [pytest.mark.e2e, requires_paths("charts/metax-gpu-extensions")]

NS = "metax-gpu-extensions"
RELEASE = "e2e"
RESOURCE = "metax-tech.com/gpu"
IMAGE_REGISTRY = f"{REGISTRY}/gpuk8s"
HEALTHY_INTERVAL = 5
SPEC4_LABELS = (
    "gpu.installed",
    "driver.ready",
    "gpu.driver.major",
    "gpu.driver.minor",
    "gpu.driver.patch",
    "gpu.driver.mode",
    "gpu.family",
    "gpu.memory",
    "gpu.product",
    "gpu.sriov",
    "gpu.vfnum",
)


def gpuk8s(*args: str) -> str:
    venv = run(str(LAB / "pyenv.sh")).stdout.strip()
    return run(f"{venv}/bin/gpuk8s", *args).stdout


def sim_state() -> dict:
    return json.loads(gpuk8s("sim", "show", "--root", str(SIM_ROOT), "--json"))


def helm(*args: str, timeout: float = 600) -> str:
    return run(HELM, "--kubeconfig", KUBECONFIG, *args, timeout=timeout).stdout


def gpu(node: str, field: str = "allocatable") -> int:
    value = kubectl(
        "get", "node", node, "-o", "jsonpath={.status." + field + ".metax-tech\\.com/gpu}"
    )
    return int(value or 0)


@pytest.fixture(scope="module")
def installed(lab: dict[str, str]) -> Iterator[dict[str, str]]:
    """metax-gpu-extensions from the checkout, images from the local registry."""
    helm(
        "upgrade",
        "--install",
        RELEASE,
        str(REPO / "charts" / "metax-gpu-extensions"),
        "-n",
        NS,
        "--create-namespace",
        "--wait",
        "--timeout",
        "5m",
        "--set",
        f"registry={IMAGE_REGISTRY}",
        "--set",
        f"hostPaths.root={SIM_ROOT}",
        "--set",
        f"gpuDevice.healthyInterval={HEALTHY_INTERVAL}",
        "--set",
        f"gpuDevice.extraArgs={{--device-path-prefix={SIM_ROOT}}}",
    )
    try:
        yield lab
    finally:
        run(str(LAB / "fake-nodes"), "0", check=False, timeout=300)
        helm("uninstall", RELEASE, "-n", NS, "--wait", "--timeout", "3m")
        # `helm uninstall --wait` returns once the DaemonSets are gone; their pods are
        # deleted by the garbage collector right after (background cascade): allow that.
        wait_until(
            "nothing left after helm uninstall",
            lambda: kubectl("get", "all", "-n", NS, "-o", "name", check=False).strip() == "",
            60,
        )


def test_1_chart_registers_gpus_and_labels(installed: dict[str, str]) -> None:
    node = installed["node"]
    wait_until("capacity 8", lambda: gpu(node, "capacity") == 8, 120)
    wait_until("allocatable 8", lambda: gpu(node) == 8, 60)
    labels = kubectl_json("get", "node", node)["metadata"]["labels"]
    for key in SPEC4_LABELS:
        assert f"metax-tech.com/{key}" in labels, key
    assert labels["metax-tech.com/gpu.product"] == "C500"
    assert labels["metax-tech.com/gpu.installed"] == "true"
    # Our images, from the local registry, run the DaemonSets.
    for pod in kubectl_json("-n", NS, "get", "pods")["items"]:
        assert pod["spec"]["containers"][0]["image"].startswith(IMAGE_REGISTRY + "/")
        assert pod["status"]["phase"] == "Running"


def gpu_pod(ns: str, name: str, count: int) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "nodeSelector": {"metax-tech.com/gpu.product": "C500"},
            "containers": [
                {
                    "name": "main",
                    "image": BUSYBOX,
                    "command": ["sh", "-c", "env | grep -i visible; ls /dev/dri; sleep 3600"],
                    "resources": {"limits": {RESOURCE: str(count)}},
                }
            ],
        },
    }


def cards_in(ns: str, name: str) -> set[int]:
    out = kubectl("-n", ns, "exec", name, "--", "ls", "/dev/dri")
    return {int(m) for m in re.findall(r"card(\d+)", out)}


@pytest.fixture(scope="module")
def gpu_pods(installed: dict[str, str]) -> Iterator[str]:
    ns = "e2e-gpu"
    kubectl("create", "namespace", ns, check=False)
    wait_until("default sa", lambda: kubectl("-n", ns, "get", "sa", "default", check=False), 30)
    try:
        yield ns
    finally:
        kubectl("delete", "namespace", ns, "--wait=true", "--timeout=120s", check=False)


def test_2_two_gpu_pod_gets_allocator_choice(gpu_pods: str) -> None:
    ns = gpu_pods
    card_of = {g["card"]: g["index"] for g in sim_state()["gpus"]}
    apply(gpu_pod(ns, "first", 2))
    wait_until("first Running", lambda: pod_phase(ns, "first") == "Running", 120)
    first = {card_of[c] for c in cards_in(ns, "first")}
    assert first == {0, 1}, first
    apply(gpu_pod(ns, "second", 2))
    wait_until("second Running", lambda: pod_phase(ns, "second") == "Running", 120)
    second = {card_of[c] for c in cards_in(ns, "second")}
    # SPEC §3 example 2: with 1,2 taken, a request for 2 gets 3,4 (here 0-based: {2,3}).
    assert second == {2, 3}, second
    env = kubectl("-n", ns, "exec", "second", "--", "env")
    assert "MACA_VISIBLE_DEVICES=" in env, env


def test_3_sim_fail_drops_allocatable_and_heal_restores(
    gpu_pods: str, installed: dict[str, str]
) -> None:
    node = installed["node"]
    assert gpu(node) == 8
    gpuk8s("sim", "fail", "--root", str(SIM_ROOT), "--gpu", "7")
    t0 = time.monotonic()
    try:
        wait_until("allocatable 7", lambda: gpu(node) == 7, HEALTHY_INTERVAL + 2, interval=0.2)
        assert time.monotonic() - t0 <= HEALTHY_INTERVAL + 2
        assert gpu(node, "capacity") == 8
    finally:
        gpuk8s("sim", "heal", "--root", str(SIM_ROOT), "--gpu", "7")
    wait_until("allocatable 8", lambda: gpu(node) == 8, HEALTHY_INTERVAL + 2, interval=0.2)


def test_4_kubelet_restart_keeps_pods_and_reregisters(
    gpu_pods: str, installed: dict[str, str]
) -> None:
    node, ns = installed["node"], gpu_pods
    before = kubectl_json("-n", ns, "get", "pod", "first")["status"]["containerStatuses"][0]
    run(str(LAB / "ctl"), "restart", "kubelet")
    wait_until(
        "node Ready again",
        lambda: (
            kubectl(
                "get",
                "node",
                node,
                "-o",
                'jsonpath={.status.conditions[?(@.type=="Ready")].status}',
            )
            == "True"
        ),
        120,
    )
    wait_until("capacity 8 after restart", lambda: gpu(node, "capacity") == 8, 120)
    wait_until("allocatable 8 after restart", lambda: gpu(node) == 8, 60)
    after = kubectl_json("-n", ns, "get", "pod", "first")["status"]["containerStatuses"][0]
    assert after["containerID"] == before["containerID"]
    assert after["restartCount"] == before["restartCount"]
    assert pod_phase(ns, "first") == "Running"
