"""GPU sharing (issue 14) on the lab's real node: sGPU pods through the real kube-scheduler,
gpu-aware's filter/prioritize/bind, the real kubelet and gpu-device's Allocate.

Set-up: the session's one sGPU stack (conftest's ``sgpu_release``, shared with
test_exporter_sharing.py, test_stable_gpu_ids.py and test_netpol.py): the node is labelled
``gpuk8s.io/sharing-mode=sgpu`` *before* gpu-device starts (it reads the mode once, at
start), the chart is installed with ``gpuDevice.sharing=true``,
``deployExtenderGPUAware=true`` and gpu-exporter, and playbooks/gpu_aware.yml points
kube-scheduler at gpu-aware with the ``bind`` verb. The module's pods live in its own
namespace, deleted at its end (``sgpu_work``); the stack is undone at the end of the
session, pass or fail (``releases_set_aside`` then gives lab/install's release back).

Only ONE of the 8 simulated GPUs is left to the shared pods, and it is left by *pods*:
seven holders ask ``sgpu: 1, vcore: 100`` (100 % = the GPU exclusively) and go through
the same scheduler, extender and kubelet. That is chosen over failing seven GPUs in the
simulator because it keeps the kubelet's device ids and the extender's choice apart: the
kubelet picks replica ids ``<GPU>::<n>`` among all healthy ones of all 8 GPUs (on the lab:
ids of GPUs 5, 3 and 1 for three pods placed on GPU 7), while the extender puts the
shared pods on the one GPU nobody holds. So the test fails if Allocate handed the
container the GPU of the kubelet's ids instead of the pod's ``gpuk8s.io/sharing.assigned``
annotation (test 5 checks that the ids did name another GPU); with seven GPUs failed the
kubelet could only pick ids of the healthy one and both would agree. It also fails if the
restarted extender did not rebuild its ledger from the annotations: the holders' GPUs
would then look free and the second pod would not land beside the first.
"""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import (
    SGPU,
    SGPU_GPUS,
    SGPU_NS,
    apply,
    kubectl,
    kubectl_json,
    pod_phase,
    requires_paths,
    sgpu_work,
    shared_gpu_pod,
    wait_until,
)
from .test_gpu_stack import sim_state

pytestmark = [
    pytest.mark.e2e,
    requires_paths("charts/metax-gpu-extensions", "playbooks/gpu_aware.yml"),
]

NS = SGPU_NS
WORK = "e2e-sharing"
ASSIGNED = "gpuk8s.io/sharing.assigned"
PHASE = "gpuk8s.io/sharing.phase"
DEVICES = "metax-tech.com/gpu.devices"
GPUS = SGPU_GPUS
CHECKPOINT = Path("/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint")

state: dict[str, Any] = {}  # what earlier tests found (the shared GPU, the kubelet's ids)


@pytest.fixture(scope="module")
def sharing(sgpu_release: dict[str, str]) -> Iterator[dict[str, str]]:
    with sgpu_work(sgpu_release, WORK) as lab:
        yield lab


def shared_pod(name: str, vcore: int) -> dict[str, Any]:
    return shared_gpu_pod(name, WORK, vcore)


def pods() -> list[dict[str, Any]]:
    return list(kubectl_json("-n", WORK, "get", "pods")["items"])


def assignment(pod: dict[str, Any]) -> dict[str, Any] | None:
    raw = (pod["metadata"].get("annotations") or {}).get(ASSIGNED)
    return json.loads(raw) if raw else None


def events_of(name: str) -> str:
    events = kubectl_json("-n", WORK, "get", "events", "--field-selector",
                          f"involvedObject.name={name}")["items"]
    return " | ".join(f"{e['reason']}: {e['message']}" for e in events)


def running(name: str) -> dict[str, Any]:
    try:
        wait_until(f"{name} Running", lambda: pod_phase(WORK, name) == "Running", 60,
                   interval=0.5)
    except AssertionError as err:
        pod = kubectl_json("-n", WORK, "get", "pod", name)
        logs = kubectl("-n", NS, "logs", "-l", "app.kubernetes.io/name=gpu-aware",
                       "--tail=20", check=False)
        raise AssertionError(f"{err}\nstatus: {pod['status']}\nevents: {events_of(name)}"
                             f"\ngpu-aware: {logs}") from None
    return dict(kubectl_json("-n", WORK, "get", "pod", name))


def index_of_unit(node: str) -> dict[str, int]:
    """Device-list id (PCI address) -> GPU index, from gpu-device's node annotation."""
    raw = kubectl_json("get", "node", node)["metadata"]["annotations"][DEVICES]
    return {e["id"]: e["gpu"] for e in json.loads(raw) if e.get("vf") is None}


def gpu_in_container(
    name: str, node: str, work: str = WORK
) -> tuple[set[int], set[int], dict[str, str]]:
    """(GPUs of the /dev/dri cards, GPUs named by GPUK8S_DEVICE_IDS, the sGPU env) as the
    container of pod ``name`` in namespace ``work`` sees them: what Allocate handed the
    real kubelet."""
    out = kubectl("-n", work, "exec", name, "--", "sh", "-c", "ls /dev/dri; echo ---; env")
    cards_part, _, env_part = out.partition("---")
    card_of = {g["card"]: g["index"] for g in sim_state()["gpus"]}
    cards = {card_of[int(c)] for c in re.findall(r"card(\d+)", cards_part)}
    env = dict(line.split("=", 1) for line in env_part.split() if "=" in line)
    units = index_of_unit(node)
    named = {units[u] for u in env.get("GPUK8S_DEVICE_IDS", "").split(",") if u}
    return cards, named, {k: v for k, v in env.items() if k.startswith(("METAX_", "MACA_"))}


def kubelet_gpus(pod: dict[str, Any], node: str) -> set[int]:
    """GPUs of the replica ids the kubelet gave the pod (its device-manager checkpoint)."""
    data = json.loads(CHECKPOINT.read_text())["Data"]
    units = index_of_unit(node)
    ids = [i for e in data["PodDeviceEntries"]
           if e["PodUID"] == pod["metadata"]["uid"] and e["ResourceName"] == SGPU
           for per_numa in e["DeviceIDs"].values() for i in per_numa]
    assert ids, f"no {SGPU} ids for {pod['metadata']['name']} in {CHECKPOINT}"
    return {units[i.split("::", 1)[0]] for i in ids}


def check_on_shared_gpu(name: str, node: str) -> None:
    """The pod Runs on the one GPU left, its annotation says so, its container got it."""
    pod = running(name)
    a = assignment(pod)
    assert a is not None, f"{name}: no {ASSIGNED} annotation"
    assert (a["node"], a["mode"], a["gpus"], a["core"]) == (node, "sgpu", [state["gpu"]], 50), a
    assert pod["spec"]["nodeName"] == node
    assert pod["metadata"]["annotations"][PHASE] == "allocated"  # Allocate served this pod
    cards, named, env = gpu_in_container(name, node)
    assert cards == {state["gpu"]}, f"{name}: /dev/dri shows GPUs {cards}, assigned {a['gpus']}"
    assert named == {state["gpu"]}, f"{name}: GPUK8S_DEVICE_IDS names {named}"
    assert env.get("METAX_SGPU_COMPUTE") == "50", env
    assert env.get("MACA_VISIBLE_DEVICES") == "0", env
    state.setdefault("kubelet", {})[name] = kubelet_gpus(pod, node)


def core_per_gpu() -> dict[int, int]:
    """vcore held per GPU, summed from the annotations of the live pods."""
    total: dict[int, int] = {}
    for pod in pods():
        a = assignment(pod)
        if a is not None and pod["status"].get("phase") not in ("Succeeded", "Failed"):
            for g in a["gpus"]:
                total[g] = total.get(g, 0) + a["core"]
    return total


def test_1_first_shared_pod_runs_on_the_one_gpu_left(sharing: dict[str, str]) -> None:
    node = sharing["node"]
    for i in range(GPUS - 1):
        apply(shared_pod(f"hold-{i}", 100))
    held: dict[int, str] = {}
    for i in range(GPUS - 1):
        a = assignment(running(f"hold-{i}"))
        assert a is not None and a["core"] == 100 and len(a["gpus"]) == 1, a
        assert a["gpus"][0] not in held, f"GPU {a['gpus'][0]} given twice exclusively"
        held[a["gpus"][0]] = f"hold-{i}"
    for g, name in held.items():  # each holder's container got the GPU its annotation names
        cards, named, _ = gpu_in_container(name, node)
        assert cards == named == {g}, f"{name}: assigned GPU {g}, container sees {cards}/{named}"
    free = set(range(GPUS)) - set(held)
    assert len(free) == 1, free
    state["gpu"] = free.pop()
    apply(shared_pod("first", 50))
    check_on_shared_gpu("first", node)


def test_2_restarted_extender_rebuilds_its_ledger_from_the_annotations(
    sharing: dict[str, str],
) -> None:
    """Both replicas (the chart's default: 2, electing a leader) are replaced; each new
    one rebuilds its ledger from the annotations, and one of them leads (its pod carries
    the label the Service selects)."""
    selector = "app.kubernetes.io/name=gpu-aware"
    old = kubectl("-n", NS, "get", "pods", "-l", selector, "-o",
                  "jsonpath={.items[*].metadata.name}").split()
    assert len(old) == 2, old
    kubectl("-n", NS, "delete", "pod", *old, "--wait=true", "--timeout=60s")

    def ready_new() -> list[dict[str, Any]] | None:
        found = []
        for pod in kubectl_json("-n", NS, "get", "pods", "-l", selector)["items"]:
            statuses = pod["status"].get("containerStatuses") or []
            if (pod["metadata"]["name"] not in old
                    and pod["metadata"].get("deletionTimestamp") is None
                    and statuses and all(s["ready"] for s in statuses)):
                found.append(dict(pod))
        return found if len(found) == 2 else None

    pods = wait_until("two new gpu-aware pods ready", ready_new, 90, interval=0.5)

    def ledger(pod: dict[str, Any]) -> float:
        # the health port: plain HTTP (the extender port admits only kube-scheduler's TLS)
        url = f"http://{pod['status']['podIP']}:8081/metrics"
        with urllib.request.urlopen(url, timeout=5) as resp:
            text = resp.read().decode()
        found = re.search(r"^gpu_aware_shared_gpu_pods (\S+)$", text, re.M)
        assert found, "gpu_aware_shared_gpu_pods missing from /metrics"
        return float(found.group(1))

    # the 7 holders and the first shared pod, read back from their annotations
    for pod in pods:
        wait_until(f"ledger of 8 pods in {pod['metadata']['name']}",
                   lambda pod=pod: ledger(pod) == GPUS, 30, interval=0.5)
    wait_until("a leader among the new pods", lambda: kubectl(
        "-n", NS, "get", "pods", "-l", f"{selector},gpuk8s.io/gpu-aware-leader=true", "-o",
        "jsonpath={.items[*].metadata.name}").split() in ([p["metadata"]["name"]] for p in pods),
        30, interval=0.5)


def test_3_second_pod_lands_on_the_same_gpu(sharing: dict[str, str]) -> None:
    apply(shared_pod("second", 50))
    check_on_shared_gpu("second", sharing["node"])
    assert core_per_gpu()[state["gpu"]] == 100


def test_4_third_pod_waits_and_nothing_is_double_booked(sharing: dict[str, str]) -> None:
    apply(shared_pod("third", 50))

    def rejected() -> str:
        events = kubectl_json("-n", WORK, "get", "events", "--field-selector",
                              "involvedObject.name=third,reason=FailedScheduling")["items"]
        return " | ".join(e["message"] for e in events)

    why = wait_until("third rejected by the scheduler", rejected, 60, interval=0.5)
    assert "gpu-aware" in why and "compute left" in why, why
    pod = kubectl_json("-n", WORK, "get", "pod", "third")
    assert pod["status"]["phase"] == "Pending"
    assert not pod["spec"].get("nodeName")
    assert assignment(pod) is None
    per_gpu = core_per_gpu()
    assert all(core <= 100 for core in per_gpu.values()), per_gpu
    assert per_gpu == {g: 100 for g in range(GPUS)}, per_gpu


def test_5_deleting_a_pod_lets_the_third_in(sharing: dict[str, str]) -> None:
    """Failed in 2 of 7 lab runs before gpu-aware nudged the pods it turned away
    (requeue.py): the scheduler retried 'third' on the deletion event before gpu-aware's
    pod watch had released the share, and nothing requeued it again within a minute."""
    kubectl("-n", WORK, "delete", "pod", "first", "--wait=true", "--timeout=60s")
    check_on_shared_gpu("third", sharing["node"])
    per_gpu = core_per_gpu()
    assert per_gpu == {g: 100 for g in range(GPUS)}, per_gpu
    # the kubelet's replica ids named another GPU than the annotation: Allocate mapped them
    kubelet = state["kubelet"]
    assert any(gpus != {state["gpu"]} for gpus in kubelet.values()), kubelet
