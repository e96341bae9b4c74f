"""One stable name per GPU on the lab's real node (issue 52, item 1): shared pods on GPUs
5 and 6, GPU 3 removed, everything stays on the same physical cards (by UUID), and comes
back unchanged when GPU 3 is healed. tests/unit/test_stable_gpu_ids.py runs the same
story in one process.

Set-up as tests/e2e/test_exporter_sharing.py (the session's one sGPU stack, conftest's
``sgpu_release``, with gpu-exporter; the module's own namespace). The eight pods that hold
the GPUs are *pinned*: created with ``spec.nodeName`` and the annotations gpu-aware's bind
writes (the assignment naming the GPU by the UUID of gpu-device's device list, the bind
time, phase ``allocating``), one at a time (gpu-device's ``Allocate`` tells waiting pods of
one size apart only by bind time), so that the shares sit on GPUs 5 and 6 whatever gpu-aware
would have chosen: pod ``a`` holds 50 % of GPU 5, pod ``b`` 30 % of GPU 6, fillers hold
every other GPU whole. gpu-aware learns them from its pod watch, as it learns the pods of a
restarted replica.

1. Each pod's container got the card its annotation names; the exporter meters ``a``
   and ``b`` on those cards (the ``uuid`` label of their series).
2. ``gpuk8s sim fail --gpu 3 --mode remove``, and gpu-device and gpu-exporter
   restarted (they discover at start; the exporter would within a minute anyway): the
   device list renumbers the GPUs above 3 (the cards of ``a`` and ``b`` are GPUs 4 and
   5 now). The exporter still meters ``a`` and ``b`` on their cards, and a new 40 %
   share placed by the real scheduler and gpu-aware lands on one of the two cards with
   room -- by UUID, and its container gets that card -- never on a card the fillers
   hold.
3. ``gpuk8s sim heal --gpu 3`` and both restarted again: the device list, the
   exporter's series and a newly placed share are as before the loss (test 1 placed
   one there too, and deleted it).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from .conftest import (
    SGPU_RELEASE,
    SIM_ROOT,
    apply,
    kubectl,
    kubectl_json,
    pod_phase,
    requires_paths,
    sgpu_work,
    shared_gpu_pod,
    wait_until,
)
from .test_exporter_sharing import exporter_pod, scrape
from .test_gpu_stack import gpuk8s
from .test_sharing import (
    ASSIGNED,
    DEVICES,
    GPUS,
    NS,
    PHASE,
    assignment,
    gpu_in_container,
)

pytestmark = [
    pytest.mark.e2e,
    requires_paths("charts/metax-gpu-extensions", "playbooks/gpu_aware.yml"),
]

WORK = "e2e-stable-ids"
BIND_TIME = "gpuk8s.io/sharing.bind-time"
GPU_DEVICE = f"app.kubernetes.io/name=gpu-device,app.kubernetes.io/instance={SGPU_RELEASE}"
LOST = 3
SHARES = {"a": (5, 50), "b": (6, 30)}  # pod -> (GPU index before the loss, vcore)
NEW = 40  # vcore of the share placed after the loss: only a's and b's cards have room

state: dict[str, Any] = {}


@pytest.fixture(scope="module")
def stack(sgpu_release: dict[str, str]) -> Iterator[dict[str, str]]:
    with sgpu_work(sgpu_release, WORK) as lab:
        try:
            yield lab
        finally:
            gpuk8s("sim", "heal", "--root", str(SIM_ROOT), "--all")


def device_list(node: str) -> list[dict[str, Any]]:
    """gpu-device's whole-GPU entries of the node's device list, in index order."""
    raw = kubectl_json("get", "node", node)["metadata"]["annotations"][DEVICES]
    return sorted((e for e in json.loads(raw) if e.get("vf") is None), key=lambda e: e["gpu"])


def stable_ids(node: str) -> dict[int, str]:
    """index now -> the GPU's stable id (UUID, else PCI address; core.model.stable_gpu_id)."""
    return {e["gpu"]: e.get("uuid") or e["pci"] for e in device_list(node)}


def pinned_pod(name: str, node: str, index: int, uid: str, vcore: int) -> dict[str, Any]:
    """A pod bound to ``node`` with the annotations gpu-aware's bind writes for
    ``vcore`` percent of GPU ``index`` (stable id ``uid``)."""
    record = {"container": "main", "core": vcore, "gpus": [index], "ids": [uid],
              "memoryMiB": 0, "mode": "sgpu", "node": node, "whole": False}
    return shared_gpu_pod(name, WORK, vcore, node=node, annotations={
        ASSIGNED: json.dumps(record, separators=(",", ":"), sort_keys=True),
        BIND_TIME: str(time.time_ns()), PHASE: "allocating"})


def running(name: str) -> dict[str, Any]:
    wait_until(f"{name} Running", lambda: pod_phase(WORK, name) == "Running", 120,
               interval=0.5)
    return dict(kubectl_json("-n", WORK, "get", "pod", name))


def sim_index_of(uid: str) -> int:
    """The simulator's own number of the card with stable id ``uid`` (it never moves:
    /dev/dri cards in a container map to it)."""
    from .test_gpu_stack import sim_state

    for gpu in sim_state()["gpus"]:
        if uid in (gpu.get("uuid"), gpu.get("bdf")):
            return int(gpu["index"])
    raise AssertionError(f"no simulated GPU with id {uid}")


def metered(node: str) -> dict[str, tuple[str, str]]:
    """pod -> (uuid, gpu) labels of its gpuk8s_container_gpu_devices series, once the
    exporter shows both a and b."""
    exporter = wait_until("gpu-exporter ready", lambda: exporter_pod(node), 120)

    def both() -> dict[str, tuple[str, str]] | None:
        got = {labels["pod"]: (labels["uuid"], labels["gpu"])
               for n, labels, _ in scrape(exporter)
               if n == "gpuk8s_container_gpu_devices" and labels["namespace"] == WORK}
        return got if set(SHARES) <= set(got) else None

    return dict(wait_until("a and b in the exporter's series", both, 90, interval=1))


def rediscover(node: str, want: int) -> None:
    """gpu-device discovers at start, gpu-exporter at start and every minute: new pods
    of both see the renumbered GPUs at once (gpu-device publishes its device list)."""
    old = kubectl("-n", NS, "get", "pods", "-l", GPU_DEVICE, "-o",
                  "jsonpath={.items[*].metadata.name}").split()
    exporter = wait_until("gpu-exporter ready", lambda: exporter_pod(node), 120)
    kubectl("-n", NS, "delete", "pod", *old, exporter["metadata"]["name"], "--wait=true",
            "--timeout=60s")
    wait_until(f"{want} GPUs in gpu-device's device list",
               lambda: len(device_list(node)) == want, 180, interval=1)
    wait_until("a new gpu-exporter pod ready",
               lambda: exporter_pod(node, exporter["metadata"]["name"]), 120)


def place_new(name: str, node: str) -> str:
    """Place a NEW % share through the scheduler; the stable id of the card it got,
    checked against its container's card."""
    apply(shared_gpu_pod(name, WORK, NEW))
    pod = running(name)
    a = assignment(pod)
    assert a is not None and len(a.get("ids") or []) == 1, a
    uid = a["ids"][0]
    assert stable_ids(node)[a["gpus"][0]] == uid, (a, stable_ids(node))
    cards, _named, _env = gpu_in_container(name, node, WORK)
    assert cards == {sim_index_of(uid)}, (name, cards, uid)
    return str(uid)


def test_1_pinned_shares_run_and_are_metered_on_their_cards(stack: dict[str, str]) -> None:
    node = stack["node"]
    ids = stable_ids(node)
    assert sorted(ids) == list(range(GPUS)) and all(u.startswith("GPU-") for u in ids.values())
    pinned = {f"fill-{g}": (g, 100) for g in range(GPUS) if g not in (5, 6)} | SHARES
    for name, (index, vcore) in pinned.items():  # one at a time: see the module doc
        apply(pinned_pod(name, node, index, ids[index], vcore))
        pod = running(name)
        assert pod["metadata"]["annotations"][PHASE] == "allocated", name
        seen_cards, _named, _env = gpu_in_container(name, node, WORK)
        assert seen_cards == {sim_index_of(ids[index])}, (name, seen_cards)
    cards = {name: ids[index] for name, (index, _) in SHARES.items()}
    seen = metered(node)
    assert {name: uid for name, (uid, _gpu) in seen.items() if name in SHARES} == cards, seen
    new = place_new("new-before", node)
    assert new in cards.values(), (new, cards)  # never a filler's card
    kubectl("-n", WORK, "delete", "pod", "new-before", "--wait=true", "--timeout=60s")
    state.update(ids=ids, cards=cards, metered=seen, new=new)


def test_2_after_gpu_3_leaves_the_bus_everything_stays_on_its_card(
    stack: dict[str, str],
) -> None:
    node, cards = stack["node"], state["cards"]
    gpuk8s("sim", "fail", "--root", str(SIM_ROOT), "--gpu", str(LOST), "--mode", "remove")
    rediscover(node, GPUS - 1)
    now = stable_ids(node)
    assert now[4] == cards["a"] and now[5] == cards["b"], now  # renumbered
    assert state["ids"][LOST] not in now.values()
    seen = metered(node)
    assert {n: seen[n] for n in SHARES} == {n: state["metered"][n] for n in SHARES}, seen
    got = place_new("new-after-loss", node)
    assert got in cards.values(), (got, cards)  # never a filler's card
    kubectl("-n", WORK, "delete", "pod", "new-after-loss", "--wait=true", "--timeout=60s")


def test_3_healing_gpu_3_brings_everything_back_unchanged(stack: dict[str, str]) -> None:
    node = stack["node"]
    gpuk8s("sim", "heal", "--root", str(SIM_ROOT), "--gpu", str(LOST))
    rediscover(node, GPUS)
    assert stable_ids(node) == state["ids"]
    seen = metered(node)
    assert {n: seen[n] for n in SHARES} == {n: state["metered"][n] for n in SHARES}, seen
    assert place_new("new-after-heal", node) == state["new"]
