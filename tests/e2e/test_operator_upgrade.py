"""Day 2 of the operator scheme on the lab's real node (issue 11): rolling driver upgrades.

The `c500-8` preset runs the administrator's driver 2.32.0.6. The operator is installed with
deployPolicy IfNotPresent (that driver is left alone), a GPU workload starts, then:

1. `helm upgrade --set driver.deployPolicy=Always` (payload 2.33.0.6): the node is cordoned,
   the GPU pod evicted, driver-manager's pod replaced, the driver upgraded to 2.33.0.6 by
   the real install procedure on the simulated host tree, validated, uncordoned; the
   workload comes back;
2. a PodDisruptionBudget that forbids the eviction + a new target: the drain times out, the
   node fails (Event naming the budget), is uncordoned, and nothing changed on the host;
3. without the budget, a retry reaches the bad payload (image 2.34.0.1 holds 2.33.0.6):
   state failed, node cordoned, Event naming the cause, host unchanged;
4. the admin withdraws the bad target: the node is validated and uncordoned.

Releases of ours found installed are set aside by the session fixture and given back; the
simulator root is recreated from `c500-8` at the end (lab/up via nodriver-8), so the lab is
left as it was. The component images must be this checkout's (lab/up from it).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import yaml

from .conftest import (
    BUSYBOX,
    LAB,
    REPO,
    SIM_ROOT,
    apply,
    kubectl,
    kubectl_json,
    requires_paths,
    run,
    wait_until,
)
from .test_gpu_stack import gpu
from .test_operator import CONTAINERD_CONFIG, NS, SDK, P, helm, labels, node_events, releases

pytestmark = [pytest.mark.e2e, requires_paths("charts/metax-operator", "lab/supervise")]

WORK = "e2e-upgrade"
STATE_LABEL = P + "driver.upgrade-state"
OLD, NEW, BAD = "2.32.0.6", "2.33.0.6", "2.34.0.1"


def loaded_version() -> str:
    return (SIM_ROOT / "sys/module/metax/version").read_text().strip()


def host_files() -> str:
    return (SIM_ROOT / "opt/mxdriver/Version.txt").read_text().strip()


def upgrade_state(node: str) -> str | None:
    return labels(node).get(STATE_LABEL)


def cordoned(node: str) -> bool:
    return bool(kubectl_json("get", "node", node).get("spec", {}).get("unschedulable"))


def record(node: str) -> dict:
    notes = kubectl_json("get", "node", node)["metadata"].get("annotations") or {}
    return json.loads(notes.get(P + "driver.upgrade") or "{}")


def train_pods() -> list[dict]:
    return [p for p in kubectl_json("get", "pods", "-n", WORK, "-l", "app=train")["items"]
            if not p["metadata"].get("deletionTimestamp")]


def running_train_uid() -> str | None:
    running = [p for p in train_pods() if p["status"].get("phase") == "Running"]
    return running[0]["metadata"]["uid"] if running else None


def set_values(**values: str) -> None:
    args = [a for k, v in values.items() for a in ("--set", f"{k}={v}")]
    # no --wait: driver-manager's DaemonSet is OnDelete, its pods are replaced by the
    # rollout itself (never, when the drain fails)
    helm("upgrade", "up", str(REPO / "charts" / "metax-operator"), "-n", NS, "--reuse-values",
         *args)


@pytest.fixture(scope="module")
def operator_up(lab: dict[str, str], tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[str]:
    node = lab["node"]
    assert loaded_version() == OLD, "the lab must run the c500-8 preset (lab/up)"
    values = tmp_path_factory.mktemp("upgrade") / "values.yaml"
    values.write_text(yaml.safe_dump({
        "registry": "127.0.0.1:5000/gpuk8s",
        "hostPaths": {"root": str(SIM_ROOT), "extraReadPaths": ["/var/lib/gpuk8s-sim"]},
        "driver": {"deployPolicy": "IfNotPresent", "payload": {"version": NEW},
                   "upgradePolicy": {"drainTimeoutSeconds": 20, "upgradeTimeoutSeconds": 120},
                   "extraArgs": ["--load-command={host_root}/usr/sbin/modprobe {module}",
                                 "--unload-command={host_root}/usr/sbin/modprobe -r {module}",
                                 "--depmod-command={host_root}/usr/sbin/depmod -a -b "
                                 "{host_root} {kernel_release}"]},
        "maca": {"payload": {"images": [f"maca-c500:{SDK}-ubuntu22.04-amd64"]}},
        "runtime": {"containerd": {"config": str(CONTAINERD_CONFIG)}},
    }))
    kubectl("create", "namespace", WORK, check=False)
    try:
        helm("install", "up", str(REPO / "charts" / "metax-operator"), "-n", NS,
             "--create-namespace", "--wait", "--timeout", "5m", "-f", str(values))
        yield node
    finally:
        kubectl("delete", "namespace", WORK, "--wait=true", "--timeout=120s", check=False)
        for release in releases(NS):
            helm("uninstall", release, "-n", NS, "--wait", "--timeout", "5m", check=False)
        kubectl("uncordon", node, check=False)  # a failed test may leave it cordoned
        # the driver this test installed goes with the simulator root: recreate c500-8
        run(str(LAB / "up"), "--preset", "nodriver-8", "--skip-images", timeout=900)
        run(str(LAB / "up"), "--preset", "c500-8", "--skip-images", timeout=900)


def test_1_upgrade_2_32_to_2_33_with_a_gpu_pod_running(operator_up: str) -> None:
    node = operator_up
    wait_until("allocatable 8", lambda: gpu(node) == 8, 240)
    assert loaded_version() == OLD and labels(node)[P + "gpu.driver.minor"] == "32"
    apply({"apiVersion": "apps/v1", "kind": "Deployment",
           "metadata": {"name": "train", "namespace": WORK},
           "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "train"}},
                    "template": {"metadata": {"labels": {"app": "train"}}, "spec": {
                        "terminationGracePeriodSeconds": 1,
                        "containers": [{"name": "main", "image": BUSYBOX,
                                        "command": ["sleep", "3600"],
                                        "resources": {"limits": {P + "gpu": 1}}}]}}}})
    before = wait_until("GPU pod running", running_train_uid, 120)
    assert upgrade_state(node) is None  # IfNotPresent: the admin's driver is left alone
    set_values(**{"driver.deployPolicy": "Always"})
    seen: set[str] = set()

    def done() -> bool:
        state = upgrade_state(node)
        if state:
            seen.add(state)
        return state == "done"

    wait_until("upgrade done", done, 300, interval=1)
    assert loaded_version() == NEW and host_files() == f"Version:{NEW}"
    assert not cordoned(node)
    got = labels(node)
    assert (got[P + "gpu.driver.minor"], got[P + "gpu.driver.mode"]) == ("33", "cloud")
    assert "cordoned" in seen or "upgrading" in seen or "validating" in seen, seen
    after = wait_until("GPU pod running again", running_train_uid, 120)
    assert after != before  # evicted and recreated
    assert node_events(node, "DriverUpgradeStarted") and node_events(node, "DriverUpgradeDone")
    pod = kubectl_json("get", "pods", "-n", NS, "-l",
                       "app.kubernetes.io/name=operator-controller")["items"][0]
    metrics = kubectl("get", "--raw", f"/api/v1/namespaces/{NS}/pods/"
                      f"{pod['metadata']['name']}:8094/proxy/metrics")
    assert 'operator_driver_upgrade_nodes{state="done"} 1.0' in metrics
    assert 'operator_driver_upgrade_duration_seconds_count{result="done"} 1.0' in metrics


def test_2_a_pdb_that_blocks_eviction_fails_the_drain_and_changes_nothing(
        operator_up: str) -> None:
    node = operator_up
    uid = wait_until("GPU pod running", running_train_uid, 120)
    apply({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
           "metadata": {"name": "train", "namespace": WORK},
           "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "train"}}}})
    wait_until("PDB observed", lambda: kubectl_json(
        "get", "pdb", "train", "-n", WORK).get("status", {}).get("expectedPods") == 1, 60)
    set_values(**{"driver.payload.version": BAD})
    wait_until("drain failed", lambda: upgrade_state(node) == "failed", 180, interval=1)
    message = record(node)["message"]
    assert "drain timed out" in message and "PodDisruptionBudget" in message, message
    events = node_events(node, "DriverUpgradeDrainFailed")
    assert events and "nothing was changed on the host" in events[-1]
    assert not cordoned(node)  # healthy: not left cordoned
    assert loaded_version() == NEW and host_files() == f"Version:{NEW}"
    assert running_train_uid() == uid  # the workload was never touched
    kubectl("delete", "pdb", "train", "-n", WORK)


def test_3_a_bad_payload_fails_cordoned_with_an_event(operator_up: str) -> None:
    node = operator_up
    kubectl("label", "node", node, f"{STATE_LABEL}=upgrade-required", "--overwrite")
    wait_until("upgrade failed", lambda: (
        upgrade_state(node) == "failed" and "driver-manager" in record(node)["message"]),
        240, interval=1)
    message = record(node)["message"]
    assert f"holds driver {NEW}" in message and "stays cordoned" in message, message
    assert cordoned(node)
    events = node_events(node, "DriverUpgradeFailed")
    assert events and any(f"holds driver {NEW}" in e for e in events), events
    assert loaded_version() == NEW and host_files() == f"Version:{NEW}"  # nothing changed


def test_4_withdrawing_the_bad_target_validates_and_uncordons(operator_up: str) -> None:
    node = operator_up
    set_values(**{"driver.payload.version": NEW})
    wait_until("done again", lambda: upgrade_state(node) == "done", 240, interval=1)
    assert not cordoned(node)
    wait_until("allocatable 8", lambda: gpu(node) == 8, 60)
    wait_until("GPU pod running", running_train_uid, 120)
    assert loaded_version() == NEW
