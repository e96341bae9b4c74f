"""gpu-dra on the lab's real kubelet, scheduler and container runtime (issue 24).

The lab node is put in DRA mode (label gpuk8s.io/allocation-mode=dra: gpu-device leaves it,
gpu-dra arrives), the chart is installed from the checkout with gpuDra.enabled, and every
test checks what the container really sees: its /dev/dri and its environment. The kubelet
hands the claims' CDI device ids to the runtime in the CRI field CDIDevices, which only a
CDI-capable runtime applies (containerd >= 2.0; on 1.6 the containers start without their
GPUs: docs/dra.md, "Runtimes"), so the module runs the lab node on containerd 2.x
(`lab/up --containerd 2`) and gives the lab back on the generation it found.

Order matters inside this module (one install shared by the tests, torn down at the end).
It is installed with the chart's defaults first (``gpuDra.groupDevices: auto``: no group
devices and no group classes on any release measured so far -- on 1.35.4 they
slow the scheduler and it mis-allocates matchAttribute claims beside them, docs/dra.md
"Flags"); the group-device tests then turn them on (``groupDevices: true``, which also
brings the group-2|4|8 classes), as an administrator of such a cluster would.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuk8s.core.dra import GROUPS_SAFE_FROM, group_devices_wanted, kube_version

from .conftest import (
    BUSYBOX,
    LAB,
    REGISTRY,
    REPO,
    SIM_ROOT,
    apply,
    containerd_generation,
    kubectl,
    kubectl_json,
    pod_phase,
    requires_paths,
    run,
    wait_until,
)
from .test_gpu_stack import cards_in, gpuk8s, helm, sim_state
from .test_operator import lab_up

pytestmark = [pytest.mark.e2e, requires_paths("charts/metax-gpu-extensions")]

NS = "metax-gpu-extensions"
RELEASE = "e2e-dra"
DRIVER = "gpu.metax-tech.com"
MODE_LABEL = "gpuk8s.io/allocation-mode"
SHARING_LABEL = "gpuk8s.io/sharing-mode"
HEALTHY_INTERVAL = 5
PODS = "e2e-dra-pods"
CDI_DIR = Path("/var/run/cdi")


def slices(node: str) -> list[dict[str, Any]]:
    items = kubectl_json("get", "resourceslices", "--field-selector",
                         f"spec.nodeName={node},spec.driver={DRIVER}")["items"]
    return list(items)


def devices(node: str) -> dict[str, dict[str, Any]]:
    found = slices(node)
    if not found:
        return {}
    top = max(s["spec"]["pool"]["generation"] for s in found)
    return {d["name"]: d for s in found if s["spec"]["pool"]["generation"] == top
            for d in s["spec"].get("devices") or []}


def device_of(node: str, *gpus: int) -> str:
    """The published name of GPU ``gpus[0]``'s device (one index given) or of the group
    device of exactly ``gpus`` (several), found by the attributes that show indexes:
    names are built from PCI addresses (docs/dra.md, Device names)."""
    want = {"type": {"string": "gpu"}, "index": {"int": gpus[0]}} if len(gpus) == 1 else \
        {"type": {"string": "group"}, "members": {"string": ",".join(map(str, gpus))}}
    published = devices(node)
    for name, device in published.items():
        if all(device["attributes"].get(k) == v for k, v in want.items()):
            return name
    raise AssertionError(f"no device of GPUs {gpus} published: {sorted(published)}")


def dra_pod() -> str:
    out = kubectl("-n", NS, "get", "pods", "-l", "app.kubernetes.io/component=gpu-dra",
                  "-o", "jsonpath={.items[*].metadata.name}")
    return out.strip()


def restart_gpu_dra(node: str, want: int) -> None:
    """gpu-dra reads the node's sharing mode and VFs at start: a new pod republishes."""
    old = dra_pod()
    kubectl("-n", NS, "delete", "pod", old, "--wait=true", "--timeout=60s")
    wait_replaced(old, node, want, 120)


def wait_replaced(old: str, node: str, want: int, timeout: float) -> None:
    """A gpu-dra pod other than ``old`` Ready, and ``want`` devices of ``node`` published."""
    wait_until("a new gpu-dra pod Ready", lambda: dra_ready() and dra_pod() != old, timeout)
    wait_until(f"{want} devices published", lambda: len(devices(node)) == want, 60)


def dra_ready() -> bool:
    pods = kubectl_json("-n", NS, "get", "pods", "-l",
                        "app.kubernetes.io/component=gpu-dra")["items"]
    return bool(pods) and all(
        c.get("ready") for p in pods for c in (p.get("status") or {}).get("containerStatuses")
        or [{}])


@pytest.fixture(scope="module")
def dra(lab: dict[str, str]) -> Iterator[dict[str, str]]:
    node = lab["node"]
    generation = containerd_generation()
    if generation != "2":
        lab_up("c500-8", "2")
    try:
        yield from installed(node, lab)
    finally:
        if generation != "2":
            lab_up("c500-8", generation)


def installed(node: str, lab: dict[str, str]) -> Iterator[dict[str, str]]:
    kubectl("label", "node", node, f"{MODE_LABEL}=dra", "--overwrite")
    helm("upgrade", "--install", RELEASE, str(REPO / "charts" / "metax-gpu-extensions"),
         "-n", NS, "--create-namespace", "--wait", "--timeout", "5m",
         "--set", f"registry={REGISTRY}/gpuk8s", "--set", f"hostPaths.root={SIM_ROOT}",
         "--set", "hostPaths.extraReadPaths={/var/lib/gpuk8s-sim}",
         "--set", "gpuDra.enabled=true",
         "--set", f"gpuDra.healthyInterval={HEALTHY_INTERVAL}")
    kubectl("create", "namespace", PODS, check=False)
    wait_until("default sa", lambda: kubectl("-n", PODS, "get", "sa", "default", check=False),
               30)
    try:
        wait_until("gpu-dra Ready", dra_ready, 180)
        want = 14 if groups_by_default() else 8  # 8 GPUs (+ 6 group devices)
        wait_until(f"{want} devices published", lambda: len(devices(node)) == want, 60)
        yield lab
    finally:
        kubectl("delete", "namespace", PODS, "--wait=true", "--timeout=180s", check=False,
                timeout=240)
        helm("uninstall", RELEASE, "-n", NS, "--wait", "--timeout", "3m")
        kubectl("label", "node", node, f"{MODE_LABEL}-", f"{SHARING_LABEL}-", check=False)
        # the kubelet withdraws an unregistered driver's slices after a while: not now
        kubectl("delete", "resourceslices", "--field-selector", f"spec.driver={DRIVER}",
                check=False)


def claim_template(name: str, requests: list[dict[str, Any]],
                   constraints: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    devices_spec: dict[str, Any] = {"requests": requests}
    if constraints:
        devices_spec["constraints"] = constraints
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": PODS},
            "spec": {"spec": {"devices": devices_spec}}}


def request(cls: str = DRIVER, count: int = 1, cel: str | None = None,
            **extra: Any) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": cls, "count": count, **extra}
    if cel:
        exactly["selectors"] = [{"cel": {"expression": cel}}]
    return {"name": "gpus", "exactly": exactly}


def claim_pod(name: str, template: str | None = None,
              limits: dict[str, str] | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": BUSYBOX,
                                 "command": ["sh", "-c", "sleep 3600"]}
    spec: dict[str, Any] = {"terminationGracePeriodSeconds": 1, "containers": [container]}
    if template:
        spec["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": template}]
        container["resources"] = {"claims": [{"name": "gpus"}]}
    if limits:
        container["resources"] = {"limits": limits}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": PODS},
            "spec": spec}


def run_claim(name: str, requests: list[dict[str, Any]],
              constraints: list[dict[str, Any]] | None = None, wait: bool = True) -> None:
    apply(claim_template(name, requests, constraints))
    apply(claim_pod(name, name))
    if wait:
        wait_running(name)


def wait_running(name: str, timeout: float = 120) -> None:
    """Until the pod runs; else fail with what the pod, its claims and gpu-dra say."""
    try:
        wait_until(f"{name} Running", lambda: pod_phase(PODS, name) == "Running", timeout)
    except AssertionError as err:
        pod = kubectl("-n", PODS, "describe", "pod", name, check=False)
        pod += kubectl("-n", PODS, "get", "events", "--sort-by=.lastTimestamp", check=False)
        claims = kubectl("-n", PODS, "get", "resourceclaims", "-o", "yaml", check=False)
        logs = kubectl("-n", NS, "logs", dra_pod(), "--tail=40", check=False)
        raise AssertionError(f"{err}\n--- pod\n{pod}\n--- claims\n{claims[-6000:]}\n"
                             f"--- gpu-dra\n{logs}") from None


def gpus_seen(pod: str) -> set[int]:
    """GPU indices whose card the container has in /dev/dri."""
    card_of = {g["card"]: g["index"] for g in sim_state()["gpus"]}
    return {card_of[c] for c in cards_in(PODS, pod)}


def env_of(pod: str) -> dict[str, str]:
    out = kubectl("-n", PODS, "exec", pod, "--", "env")
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def delete_pods(*names: str) -> None:
    kubectl("-n", PODS, "delete", "pod", *names, "--wait=true", "--timeout=60s")


def index_is(i: int) -> str:
    return f"device.attributes['{DRIVER}'].index == {i}"


def groups_by_default() -> bool:
    """What ``--group-devices auto`` decides on the lab's Kubernetes."""
    version = kubectl_json("version")["serverVersion"]["gitVersion"]
    return group_devices_wanted("auto", version)[0]


def set_group_devices(node: str, on: bool) -> None:
    """``helm upgrade`` with gpuDra.groupDevices set; the new gpu-dra pod publishes."""
    old = dra_pod()
    helm("upgrade", RELEASE, str(REPO / "charts" / "metax-gpu-extensions"), "-n", NS,
         "--reuse-values", "--wait", "--timeout", "5m",
         "--set", f"gpuDra.groupDevices={'true' if on else 'auto'}")
    wait_replaced(old, node, 14 if on or groups_by_default() else 8, 180)


def test_1_slices_are_what_gpuk8s_dra_slices_prints(dra: dict[str, str]) -> None:
    """With the chart's defaults: what `gpuk8s dra slices` prints for what ``auto`` chose on
    this cluster, and where it chose no group devices, gpu-dra says why."""
    node = dra["node"]
    groups = groups_by_default()
    want = json.loads(gpuk8s("dra", "slices", "--root", str(SIM_ROOT), "--node-name", node,
                             "--json", "--group-devices", "on" if groups else "off"))
    want_devices = {d["name"]: d for s in want for d in s["spec"].get("devices") or []}
    assert set(devices(node)) == set(want_devices)
    five = device_of(node, 5)
    attributes = devices(node)[five]["attributes"]
    assert attributes == want_devices[five]["attributes"]
    assert attributes["linkGroup"] == {"int": 1}
    # named by the card's PCI address, not by its index
    pci = attributes["resource.kubernetes.io/pciBusID"]["string"]
    assert five == "gpu-" + re.sub(r"[:.]", "-", pci), five
    assert kubectl_json("get", "node", node)["status"]["allocatable"].get(
        "metax-tech.com/gpu", "0") == "0", "gpu-device left the node"
    if not groups:
        # the reason for this release: before 1.36.3 the allocator bug, and on every release
        # so far the measured scheduling rate with group devices
        version = kubectl_json("version")["serverVersion"]["gitVersion"]
        logs = kubectl("-n", NS, "logs", dra_pod())
        assert "group devices off (Kubernetes v1." in logs and "pods/s" in logs, logs[-3000:]
        before_fix = (kube_version(version) or (0, 0, 0)) < GROUPS_SAFE_FROM
        assert ("#140436" in logs) == before_fix, logs[-3000:]


def test_2_four_gpus_with_matchattribute_wait_for_a_whole_link_group(
    dra: dict[str, str],
) -> None:
    """GPUs 0 and 4 busy: no MetaXLink group has four free, so the claim waits instead of
    straddling; once GPU 0 is released it lands on 0-3, and the container sees exactly
    those four GPUs, numbered 0-3."""
    for i in (0, 4):
        run_claim(f"busy-{i}", [request(cel=index_is(i))])
        assert gpus_seen(f"busy-{i}") == {i}
    run_claim("quad", [request(count=4)], [{"matchAttribute": f"{DRIVER}/linkGroup"}],
              wait=False)
    time.sleep(10)
    assert pod_phase(PODS, "quad") == "Pending"
    events = kubectl("-n", PODS, "get", "events", "--field-selector",
                     "involvedObject.name=quad", "-o", "jsonpath={.items[*].reason}")
    assert "FailedScheduling" in events
    delete_pods("busy-0")
    wait_running("quad", 240)
    assert gpus_seen("quad") == {0, 1, 2, 3}
    env = env_of("quad")
    assert env["MACA_VISIBLE_DEVICES"] == "0,1,2,3"
    assert "mxcd" in kubectl("-n", PODS, "exec", "quad", "--", "ls", "/dev").split()
    delete_pods("quad", "busy-4")


def test_3_a_group_device_claim_gets_a_whole_link_group(dra: dict[str, str]) -> None:
    """Group devices turned on (``groupDevices: true``); they stay on for the tests after."""
    set_group_devices(dra["node"], True)
    run_claim("group", [request(cls="group-4.gpu.metax-tech.com")])
    seen = gpus_seen("group")
    assert seen in ({0, 1, 2, 3}, {4, 5, 6, 7}), seen
    assert env_of("group")["MACA_VISIBLE_DEVICES"] == "0,1,2,3"
    delete_pods("group")


def test_4_legacy_extended_resource_pod_is_served_by_dra(dra: dict[str, str]) -> None:
    apply(claim_pod("legacy", limits={"metax-tech.com/gpu": "2"}))
    wait_running("legacy")
    status = kubectl_json("-n", PODS, "get", "pod", "legacy")["status"]
    assert status["extendedResourceClaimStatus"]["resourceClaimName"]
    assert len(gpus_seen("legacy")) == 2
    assert env_of("legacy")["MACA_VISIBLE_DEVICES"] == "0,1"
    delete_pods("legacy")


def claim_uid(pod: str) -> str:
    name = kubectl_json("-n", PODS, "get", "pod", pod)["status"]["resourceClaimStatuses"][0][
        "resourceClaimName"]
    uid: str = kubectl_json("-n", PODS, "get", "resourceclaim", name)["metadata"]["uid"]
    return uid


def registrations() -> int:
    """How often gpu-dra was told it is registered (its log)."""
    return kubectl("-n", NS, "logs", dra_pod()).count("registered with the kubelet")


def test_5_kubelet_restart_keeps_a_prepared_claim(dra: dict[str, str]) -> None:
    node = dra["node"]
    run_claim("steady", [request(count=2)])
    before = kubectl_json("-n", PODS, "get", "pod", "steady")["status"]["containerStatuses"][0]
    gpus = gpus_seen("steady")
    uid = claim_uid("steady")
    spec = CDI_DIR / f"{DRIVER}-claim_{uid}.json"
    assert spec.exists()
    registered = registrations()
    run(str(LAB / "ctl"), "restart", "kubelet")
    wait_until("node Ready again", lambda: kubectl(
        "get", "node", node, "-o", 'jsonpath={.status.conditions[?(@.type=="Ready")].status}')
        == "True", 120)
    wait_until("the new kubelet registered gpu-dra again",
               lambda: registrations() > registered, 120)
    after = kubectl_json("-n", PODS, "get", "pod", "steady")["status"]["containerStatuses"][0]
    assert after["containerID"] == before["containerID"]
    assert after["restartCount"] == before["restartCount"]
    assert gpus_seen("steady") == gpus
    delete_pods("steady")
    wait_until("claim unprepared: its CDI spec removed", lambda: not spec.exists(), 60)


def test_6_a_failing_gpu_is_tainted_and_comes_back(dra: dict[str, str]) -> None:
    node = dra["node"]

    def tainted(name: str) -> bool:
        return bool(devices(node).get(name, {}).get("taints"))

    six, seven, pair = device_of(node, 6), device_of(node, 7), device_of(node, 6, 7)
    gpuk8s("sim", "fail", "--root", str(SIM_ROOT), "--gpu", "7")
    t0 = time.monotonic()
    try:
        wait_until("GPU 7 tainted", lambda: tainted(seven), HEALTHY_INTERVAL + 2,
                   interval=0.2)
        assert time.monotonic() - t0 <= HEALTHY_INTERVAL + 2
        assert tainted(pair) and not tainted(six)
        run_claim("seven", [request(cel=index_is(7))], wait=False)
        time.sleep(5)
        assert pod_phase(PODS, "seven") == "Pending", "a tainted device is not allocated"
    finally:
        gpuk8s("sim", "heal", "--root", str(SIM_ROOT), "--gpu", "7")
    wait_until("GPU 7 untainted", lambda: not tainted(seven), HEALTHY_INTERVAL + 2,
               interval=0.2)
    wait_running("seven")
    assert gpus_seen("seven") == {7}
    delete_pods("seven")


def test_7_two_sgpu_claims_share_one_gpu(dra: dict[str, str]) -> None:
    node = dra["node"]
    kubectl("label", "node", node, f"{SHARING_LABEL}=sgpu", "--overwrite")
    try:
        restart_gpu_dra(node, 8)
        assert devices(node)[device_of(node, 0)]["allowMultipleAllocations"] is True
        share = {"requests": {"vcore": "50", "vmemory": "8Gi"}}
        run_claim("half-a", [request(cls="sgpu.gpu.metax-tech.com", capacity=share)])
        run_claim("half-b", [request(cls="sgpu.gpu.metax-tech.com", capacity=share)])
        assert gpus_seen("half-a") == gpus_seen("half-b")
        for pod in ("half-a", "half-b"):
            env = env_of(pod)
            assert (env["METAX_SGPU_COMPUTE"], env["METAX_SGPU_MEMORY_MIB"]) == ("50", "8192")
        run_claim("sixty", [request(cls="sgpu.gpu.metax-tech.com",  # both: the claims policy
                                    capacity={"requests": {"vcore": "60", "vmemory": "8Gi"}})])
        assert gpus_seen("sixty") != gpus_seen("half-a"), "50 + 50 + 60 > 100"
        delete_pods("half-a", "half-b", "sixty")
    finally:
        kubectl("label", "node", node, f"{SHARING_LABEL}-")
        restart_gpu_dra(node, 14)


def test_8_a_vf_claim_gets_vfs(dra: dict[str, str]) -> None:
    node = dra["node"]
    gpuk8s("sim", "vfnum", "--root", str(SIM_ROOT), "--vfnum", "4")
    try:
        restart_gpu_dra(node, 32)
        run_claim("vfs", [request(cls="vf.gpu.metax-tech.com", count=2)])
        detected = json.loads(gpuk8s("detect", "--root", str(SIM_ROOT), "--json"))
        vf_cards = {int(m) for g in detected["gpus"]
                    for nodes in g["sriov"]["vf_device_nodes"] for n in nodes
                    for m in re.findall(r"card(\d+)$", n)}
        seen = cards_in(PODS, "vfs")
        assert len(seen) == 2 and seen <= vf_cards, (seen, vf_cards)
        delete_pods("vfs")
    finally:
        gpuk8s("sim", "vfnum", "--root", str(SIM_ROOT), "--vfnum", "0")
        restart_gpu_dra(node, 14)


def allocated_health(pod: str) -> dict[str, str]:
    """resourceID -> health of every claim device in the pod's containers'
    ``allocatedResourcesStatus`` (the kubelet writes it from gpu-dra's health stream,
    ResourceHealthStatus gate)."""
    status = kubectl_json("-n", PODS, "get", "pod", pod)["status"]
    return {str(r.get("resourceID")): str(r.get("health"))
            for c in status.get("containerStatuses") or []
            for s in c.get("allocatedResourcesStatus") or []
            if str(s.get("name", "")).startswith("claim:")
            for r in s.get("resources") or []}


def test_9_a_running_pods_faulted_gpu_shows_in_its_allocated_resources_status(
        dra: dict[str, str]) -> None:
    """Issue 51 item 6: the kubelet's own view of a claim's device health. A pod runs on
    GPU 5; after `sim fail` its container's allocatedResourcesStatus says Unhealthy for
    that device (gpu-dra's NodeWatchResources stream, read by the kubelet), and Healthy
    after `sim heal`. Needs a real kubelet with ResourceHealthStatus (lab/versions.env).
    The kubelet names the device by the first CDI device id gpu-dra returned from
    NodePrepareResources (<driver>/claim=<claim uid>-<n>-<device>: docs/dra.md)."""
    node = dra["node"]
    run_claim("five", [request(cel=index_is(5))])
    resource = f"{DRIVER}/claim={claim_uid('five')}-0-{device_of(node, 5)}"

    def health() -> str | None:
        return allocated_health("five").get(resource)

    wait_until("the kubelet reports the claim's device Healthy",
               lambda: health() == "Healthy", 60)
    assert set(allocated_health("five")) == {resource}, allocated_health("five")
    gpuk8s("sim", "fail", "--root", str(SIM_ROOT), "--gpu", "5")
    try:
        wait_until("the kubelet reports the claim's device Unhealthy",
                   lambda: health() == "Unhealthy", HEALTHY_INTERVAL + 30)
        assert pod_phase(PODS, "five") == "Running", "NoSchedule: the running pod stays"
    finally:
        gpuk8s("sim", "heal", "--root", str(SIM_ROOT), "--gpu", "5")
    wait_until("the kubelet reports the claim's device Healthy again",
               lambda: health() == "Healthy", HEALTHY_INTERVAL + 30)
    delete_pods("five")


def test_10_a_claim_no_node_can_serve_gets_an_event_on_its_pod(dra: dict[str, str]) -> None:
    """Issue 51 item 4 on the lab: the chart's gpu-dra-pending (gpuDra.pending, default on)
    writes GpuDraNoLinkGroup on a pod asking for one more linked GPU than the node's
    largest link group (the claims policy lets up to 8 through), and nothing on a pod
    whose claim fits (running or waiting)."""
    node = dra["node"]
    groups: dict[int, int] = {}
    for d in devices(node).values():
        if d["attributes"].get("type", {}).get("string") == "gpu":
            link = int(d["attributes"]["linkGroup"]["int"])
            groups[link] = groups.get(link, 0) + 1
    largest = max(groups.values())
    assert largest < 8, "the lab node's link groups leave room for a claim the policy allows"
    linked = [{"matchAttribute": f"{DRIVER}/linkGroup"}]
    run_claim("too-linked", [request(count=largest + 1)], linked, wait=False)
    # a claim that fits the node gets no reason even while it waits for GPUs the earlier
    # tests' pods hold (pending for capacity is not unsatisfiable)
    run_claim("linked", [request(count=largest)], linked, wait=False)

    def reasons(pod: str) -> set[str]:
        events = kubectl_json("-n", PODS, "get", "events", "--field-selector",
                              f"involvedObject.name={pod}")["items"]
        return {str(e.get("reason")) for e in events}

    # the chart's --after (30 s) and the round (15 s), with room for the leader's Lease
    wait_until("GpuDraNoLinkGroup on too-linked",
               lambda: "GpuDraNoLinkGroup" in reasons("too-linked"), 90)
    assert not {r for r in reasons("linked") if r.startswith("GpuDra")}
    delete_pods("too-linked", "linked")
