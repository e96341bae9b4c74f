"""The GPU Operator scheme on a bare lab node (issue 10): real kubelet, containerd 1.6,
scheduler, registry; the node's GPUs come from the simulator's `nodriver-8` preset, whose
stand-in modprobe / mx-smi make an installed payload appear, so driver-manager runs its
real install procedure against the simulated host tree.

The module switches the lab to `nodriver-8` (lab/up --preset) and back to `c500-8` at the
end; an extensions-scheme release found installed (lab/install) is uninstalled first and
installed again afterwards, so the lab is left as it was. Order matters (one install).
The component images must be this checkout's (lab/up from it, as scripts/test does): other
checkouts push the same tags.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuk8s.host.serving import socket_peer_pid
from gpuk8s.services.runtime import containerd
from gpuk8s.services.runtime.agent import TASKS_DIR, WRAPPER_NAME

from .conftest import (
    BUSYBOX,
    HELM,
    KUBECONFIG,
    LAB,
    REPO,
    SIM_ROOT,
    STATE,
    apply,
    containerd_generation,
    kubectl,
    kubectl_json,
    pod_phase,
    requires_paths,
    run,
    tool,
    wait_until,
)
from .test_gpu_stack import gpu

pytestmark = [pytest.mark.e2e, requires_paths("charts/metax-operator", "lab/supervise")]

NS = "metax-operator"
EXT_NS = "metax-gpu-extensions"
P = "metax-tech.com/"
DRIVER, SDK, BAD_DRIVER = "2.33.0.6", "2.33.0.4", "2.34.0.1"
CONTAINERD_CONFIG = STATE / "containerd" / "config.toml"
CDI_SPEC = Path("/etc/cdi/metax-tech.com-gpu.json")
CONTAINERD_SOCKET = "/run/containerd/containerd.sock"
WRAPPER = f"/usr/local/gpuk8s/bin/{WRAPPER_NAME}"
INVENTORY = str(REPO / "inventories" / "lab")


def helm(*args: str, check: bool = True, timeout: float = 600) -> str:
    return run(HELM, "--kubeconfig", KUBECONFIG, *args, check=check, timeout=timeout).stdout


def lab_up(preset: str, containerd: str = "1.6") -> None:
    """The lab on ``preset``; containerd 1.6 by default: this module tests the runtime
    wrapper, which only a containerd without CDI needs (tests/e2e/test_containerd2.py
    runs the scheme on 2.x)."""
    run(str(LAB / "up"), "--preset", preset, "--containerd", containerd, "--skip-images",
        timeout=900)


def playbook(name: str, *extra: str) -> str:
    from .conftest import helm_for_ansible

    env = {**os.environ, "GPUK8S_HELM": helm_for_ansible()}
    return run(tool("ansible-playbook"), "-i", INVENTORY, str(REPO / "playbooks" / name),
               *extra, timeout=900, cwd=str(REPO), env=env).stdout


def releases(namespace: str) -> list[str]:
    # deployed only: a release the session set aside (uninstalled, history kept) is not
    # ours to remove (helm 4 lists it too); uninstalling it would lose its history
    out = helm("list", "--deployed", "-q", "-n", namespace, check=False)
    return [line for line in out.split() if line]


def labels(node: str) -> dict[str, str]:
    return dict(kubectl_json("get", "node", node)["metadata"].get("labels") or {})


def ours(mapping: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in mapping.items() if k.startswith(P)}


def node_events(node: str, reason: str) -> list[str]:
    events = kubectl_json("get", "events", "-n", "default", "--field-selector",
                          f"involvedObject.name={node},reason={reason}")["items"]
    return [e["message"] for e in events]


def operator_status() -> dict:
    import yaml

    cm = kubectl_json("get", "configmap", "operator-status", "-n", NS)
    return {k: yaml.safe_load(v) for k, v in cm["data"].items()}


def fresh_bare_node() -> None:
    """A bare node again: the simulator root recreated from nodriver-8."""
    lab_up("c500-8")
    lab_up("nodriver-8")


@contextlib.contextmanager
def bare_operator_node(lab: dict[str, str], containerd: str) -> Iterator[dict[str, str]]:
    """The lab as a bare node (nodriver-8) on containerd ``containerd`` for the operator
    scheme; afterwards the lab as it was (c500-8, its containerd, the extensions scheme
    installed again if it was)."""
    had_extensions = bool(releases(EXT_NS))
    for release in releases(EXT_NS):
        helm("uninstall", release, "-n", EXT_NS, "--wait", "--timeout", "5m")
    wait_until("extensions pods gone",
               lambda: kubectl("get", "pods", "-n", EXT_NS, "-o", "name", check=False) == "",
               120)
    original_config = CONTAINERD_CONFIG.read_text()
    generation = containerd_generation()
    lab_up("nodriver-8", containerd)
    try:
        yield {**lab, "containerd_config": original_config}
    finally:
        # each step on its own: a failed uninstall must not keep the lab on nodriver-8
        try:
            if releases(NS):
                playbook("uninstall.yml", "-e", "gpuk8s_scheme=operator")
        finally:
            for release in releases(NS):  # the playbook failed: at least take the release away
                helm("uninstall", release, "-n", NS, "--no-hooks", "--wait", check=False)
            lab_up("c500-8", generation)
            if had_extensions:
                run(str(LAB / "install"), "-e", "gpu_artifacts_charts_force=true", timeout=900)


@pytest.fixture(scope="module")
def operator_lab(lab: dict[str, str]) -> Iterator[dict[str, str]]:
    with bare_operator_node(lab, "1.6") as node:
        yield node


def test_1_install_playbook_gives_a_bare_node_its_driver_sdk_and_gpus(
    operator_lab: dict[str, str],
) -> None:
    node = operator_lab["node"]
    assert not (SIM_ROOT / "opt/mxdriver").exists()  # bare: no driver, no SDK
    before = socket_peer_pid(CONTAINERD_SOCKET)  # seen from outside, as root
    assert containerd.not_served(containerd.cri_config(CONTAINERD_SOCKET), "metax", None,
                                 True) is None
    # force: the registry may hold an older chart of the same version (another checkout)
    run(str(LAB / "install"), "-e", "gpuk8s_scheme=operator",
        "-e", "gpu_artifacts_charts_force=true", timeout=900)
    returned = time.monotonic()
    wait_until("allocatable 8", lambda: gpu(node) == 8, 180)
    assert time.monotonic() - returned < 180
    got = labels(node)
    for key in ("driver.ready", "maca.ready", "runtime.ready", "gpu.installed"):
        assert got[P + key] == "true", key
    assert got[P + "gpu.driver.mode"] == "cloud"  # installed by driver-manager
    assert (got[P + "gpu.driver.major"], got[P + "gpu.driver.minor"]) == ("2", "33")
    assert (SIM_ROOT / "opt/mxdriver/Version.txt").read_text().strip() == f"Version:{DRIVER}"
    assert json.loads((SIM_ROOT / "var/lib/gpuk8s/driver-owner.json").read_text())[
        "version"] == DRIVER
    assert (SIM_ROOT / "opt/maca").is_symlink()
    assert (SIM_ROOT / "opt/maca/Version.txt").read_text().strip() == f"Version:{SDK}"
    # the CDI spec is valid for the reference CDI library
    check = run(str(LAB / "tools.sh"), "cdi", timeout=900).stdout.strip()
    assert "valid" in run(check, "validate", str(CDI_SPEC)).stdout
    assert len(json.loads(CDI_SPEC.read_text())["devices"]) == 9
    # containerd got the runtime handler, as its default runtime
    config = CONTAINERD_CONFIG.read_text()
    assert 'default_runtime_name = "metax"' in config and "gpuk8s-oci-runtime" in config
    # ... and containerd really restarted onto it (issue 28 item 0): a new process serves
    # the socket, and its CRI serves the handler with the wrapper, as the default runtime
    assert socket_peer_pid(CONTAINERD_SOCKET) != before
    assert containerd.not_served(containerd.cri_config(CONTAINERD_SOCKET), "metax", WRAPPER,
                                 True) is None
    wait_until("status says ready",
               lambda: operator_status()["summary"] == "1/1 GPU node(s) ready", 60)
    assert operator_status()["nodes"][node]["state"] == "ready"


def gpu_pod_sees_the_sdk_its_devices_and_env(namespace: str) -> str:
    """A busybox pod with 2 GPUs: its /opt/maca, /dev and env as the scheme promises; the
    container's id (running: the test deletes it)."""
    script = ("cat /opt/maca/Version.txt; ls /opt/maca/lib; ls /dev/dri; ls /dev/mxcd; "
              "env | sort; sleep 3600")
    apply({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "plain", "namespace": namespace},
        "spec": {"restartPolicy": "Never", "containers": [{
            "name": "app", "image": BUSYBOX, "command": ["sh", "-c", script],
            "resources": {"limits": {"metax-tech.com/gpu": 2}}}]},
    })
    wait_until("pod running", lambda: pod_phase(namespace, "plain") == "Running", 120)
    logs = wait_until("pod output", lambda: (
        out if "MACA_VISIBLE_DEVICES" in (out := kubectl("logs", "-n", namespace, "plain"))
        else ""), 60)
    assert f"Version:{SDK}" in logs and "libmcruntime.so" in logs
    dri = [w for w in logs.split() if w.startswith(("card", "renderD"))]
    assert len([d for d in dri if d.startswith("card")]) == 2, logs
    assert len([d for d in dri if d.startswith("renderD")]) == 2, logs
    assert "/dev/mxcd" in logs
    assert "MACA_VISIBLE_DEVICES=0,1" in logs and "MACA_PATH=/opt/maca" in logs
    assert "LD_LIBRARY_PATH=/opt/maca/lib" in logs
    status = kubectl_json("get", "pod", "plain", "-n", namespace)["status"]
    return str(status["containerStatuses"][0]["containerID"].split("://", 1)[1])


def test_2_busybox_pod_sees_the_sdk_its_devices_and_env(
    operator_lab: dict[str, str], namespace: str
) -> None:
    cid = gpu_pod_sees_the_sdk_its_devices_and_env(namespace)
    # the container ran through the wrapper: containerd's shim ran it (the bundle's
    # `runtime`), and it wrote the CDI edits into the bundle (containerd never mounts /opt/maca)
    bundle = Path(TASKS_DIR) / "k8s.io" / cid
    assert (bundle / "runtime").read_text().strip() == WRAPPER
    oci = json.loads((bundle / "config.json").read_text())
    assert any(m["destination"] == "/opt/maca" for m in oci["mounts"]), oci["mounts"]
    assert any(a.startswith("cdi.k8s.io/") for a in oci["annotations"])
    kubectl("delete", "pod", "plain", "-n", namespace, "--wait=false")


def test_3_driver_config_vfnum_4_gives_32_and_a_bad_value_is_reported(
    operator_lab: dict[str, str],
) -> None:
    node = operator_lab["node"]
    wanted = json.dumps({"data": {"node-vfnums": f"nodes: {{{node}: {{vfnum: 4}}}}\n"}})
    kubectl("patch", "configmap", "driver-config", "-n", NS, "--type", "merge", "-p", wanted)
    wait_until("capacity 32", lambda: gpu(node, "capacity") == 32, 120)
    wait_until("allocatable 32", lambda: gpu(node) == 32, 60)
    assert labels(node)[P + "gpu.vfnum"] == "4"
    bad = json.dumps({"data": {"node-vfnums": f"nodes: {{{node}: {{vfnum: 3}}}}\n"}})
    kubectl("patch", "configmap", "driver-config", "-n", NS, "--type", "merge", "-p", bad)
    messages = wait_until("InvalidVfnum event", lambda: node_events(node, "InvalidVfnum"), 60)
    assert any(node in m and "vfnum 3" in m for m in messages), messages
    # the status ConfigMap is written at the end of the controller's pass, after the Event
    wait_until("InvalidVfnum condition", lambda: any(
        c["type"] == "InvalidVfnum" and c["node"] == node
        for c in operator_status()["conditions"]), 60)
    assert gpu(node, "capacity") == 32  # the previous setting stays in force


def test_4_uninstall_leaves_nothing_of_the_operator_behind(operator_lab: dict[str, str]) -> None:
    node = operator_lab["node"]
    before = socket_peer_pid(CONTAINERD_SOCKET)
    playbook("uninstall.yml", "-e", "gpuk8s_scheme=operator")
    assert not releases(NS)
    assert not CDI_SPEC.exists()
    assert CONTAINERD_CONFIG.read_text() == operator_lab["containerd_config"]
    assert socket_peer_pid(CONTAINERD_SOCKET) != before  # restarted onto it
    assert containerd.not_served(containerd.cri_config(CONTAINERD_SOCKET), "metax", None,
                                 True) is None
    # the wrapper goes with the last container created through it (the hook's own pod)
    wait_until("wrapper gone",
               lambda: not any(Path("/usr/local/gpuk8s").glob("**/*")), 120)
    meta = kubectl_json("get", "node", node)["metadata"]
    assert ours(meta.get("labels") or {}) == {}
    assert ours(meta.get("annotations") or {}) == {}
    left = kubectl("get", "pods,configmaps,daemonsets,deployments,jobs", "-n", NS, "-o", "name",
                   check=False)
    assert [x for x in left.split() if "kube-root-ca" not in x] == []
    assert kubectl("get", "runtimeclass", "metax", check=False) == ""
    assert not (SIM_ROOT / "run/metax/runtime.ready").exists()
    # the driver it installed stays loaded (README: why, and how to remove it)
    assert (SIM_ROOT / "sys/module/metax/version").read_text().strip() == DRIVER


@pytest.mark.parametrize("version,expected", [
    ("2.99.0.0", "ImagePull"),  # no such image in the registry
    (BAD_DRIVER, f"holds driver {DRIVER}"),  # the image holds another version
])
def test_5_bad_payload_is_reported_and_nothing_is_installed(
    operator_lab: dict[str, str], version: str, expected: str, tmp_path: Path
) -> None:
    import yaml

    node = operator_lab["node"]
    fresh_bare_node()
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({
        "registry": "127.0.0.1:5000/gpuk8s", "hostPaths": {"root": str(SIM_ROOT)},
        "driver": {"payload": {"version": version}, "extraArgs": [
            "--load-command={host_root}/usr/sbin/modprobe {module}",
            "--unload-command={host_root}/usr/sbin/modprobe -r {module}",
            "--depmod-command={host_root}/usr/sbin/depmod -a -b {host_root} {kernel_release}"]},
        "maca": {"payload": {"images": [f"maca-c500:{SDK}-ubuntu22.04-amd64"]}},
        "runtime": {"containerd": {"config": str(CONTAINERD_CONFIG)}},
    }))
    try:
        # no --wait: driver-manager cannot become ready with this payload (that is the
        # case under test); the Event and the status below are what the admin sees
        helm("install", "bad", str(REPO / "charts" / "metax-operator"), "-n", NS,
             "--create-namespace", "-f", str(values))
        # (Events of an earlier case are still there: look for this case's message)
        messages = wait_until("DriverFailed event", lambda: [
            m for m in node_events(node, "DriverFailed") if expected in m and version in m], 240)
        assert messages
        status = wait_until("status failed", lambda: (
            s if (s := operator_status()["nodes"].get(node, {})).get("state") == "failed"
            else None), 60)
        assert expected in status["message"] or "driver-manager.driver" in status["message"]
        assert gpu(node) == 0  # no GPU allocatable (the kubelet keeps an old capacity)
        assert not (SIM_ROOT / "opt/mxdriver").exists()  # nothing half-installed
        assert not (SIM_ROOT / "sys/module/metax").exists()
    finally:
        helm("uninstall", "bad", "-n", NS, "--wait", "--timeout", "5m", check=False)
    assert not CDI_SPEC.exists()
    assert CONTAINERD_CONFIG.read_text() == operator_lab["containerd_config"]
