"""gpu-aware's ranking inputs: quantities, pod shapes, running pods and their mix, node
rooms, the cached ranker -- and prioritize fed by the pod watch."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from gpuk8s.core.errors import ConfigError
from gpuk8s.core.model import NodeInventory
from gpuk8s.services.extender import packing
from gpuk8s.services.extender.logic import Extender
from gpuk8s.services.extender.packing import (
    MISSING,
    NO_ALLOCATABLE,
    FreeRoom,
    Layout,
    NodeRoomInfo,
    NodeRooms,
    Ranker,
    RunningPods,
    node_room_fields,
    parse_prior,
    pod_resources,
    pod_shape,
    running_fields,
)
from gpuk8s.services.extender.weights import Weights, WeightSource
from gpuk8s.services.extender.wire import cpu_milli, memory_mib

from . import topologies
from .test_extender import C500, node_annotations

GPU = "metax-tech.com/gpu"
DEVICES = "metax-tech.com/gpu.devices"


def container(cpu: str | None = None, memory: str | None = None, gpus: int = 0,
              **extra: Any) -> dict[str, Any]:
    requests: dict[str, Any] = {}
    if cpu is not None:
        requests["cpu"] = cpu
    if memory is not None:
        requests["memory"] = memory
    resources: dict[str, Any] = {"requests": requests}
    if gpus:
        resources["limits"] = {GPU: str(gpus)}
    return {"name": "c", "resources": resources, **extra}


def pod(*containers: dict[str, Any], node: str | None = None, uid: str = "u",
        init: list[dict[str, Any]] | None = None, phase: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": list(containers)}
    if init:
        spec["initContainers"] = init
    if node:
        spec["nodeName"] = node
    obj: dict[str, Any] = {"metadata": {"uid": uid, "name": uid}, "spec": spec}
    if phase:
        obj["status"] = {"phase": phase}
    return obj


def node_object(name: str, annotations: dict[str, str], cpu: str, memory: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "annotations": annotations},
            "status": {"allocatable": {"cpu": cpu, "memory": memory, GPU: "8"}}}


@pytest.mark.parametrize(("text", "milli"), [
    ("500m", 500), ("1.5", 1500), ("2", 2000), (3, 3000), ("1e3", 1_000_000), ("0.0001", 1),
    ("100u", 1), ("-1", 0), ("lots", 0), (None, 0), (True, 0), ("9" * 80, 0),
])
def test_cpu_quantities(text: Any, milli: int) -> None:
    assert cpu_milli(json.dumps(text).encode()) == milli


@pytest.mark.parametrize(("text", "mib"), [
    ("64Gi", 65536), ("1Mi", 1), ("1M", 1), ("1500Ki", 2), ("1e9", 954), (2**20, 1),
    ("12.5Gi", 12800), ("", 0),
])
def test_memory_quantities(text: Any, mib: int) -> None:
    assert memory_mib(json.dumps(text).encode()) == mib


def test_pod_resources_follow_the_scheduler_rules() -> None:
    assert pod_resources({}) == (0, 0)
    two = pod(container("1", "1Gi", gpus=1), container("500m", "512Mi"))
    assert pod_resources(two) == (1500, 1536)  # containers add up
    assert pod_shape(two) == (1, 1500, 1536)
    big_init = pod(container("1", "1Gi"), init=[container("4", "64Mi")])
    assert pod_resources(big_init) == (4000, 1024)  # an init container alone
    sidecar = pod(container("1", "1Gi"),
                  init=[container("2", "2Gi", restartPolicy="Always"), container("3", "1Gi")])
    assert pod_resources(sidecar) == (5000, 3072)  # sidecar beside the later init
    with_overhead = pod(container("1", "1Gi"))
    with_overhead["spec"]["overhead"] = {"cpu": "250m", "memory": "128Mi"}
    assert pod_resources(with_overhead) == (1250, 1152)
    assert pod_shape(pod(container("1"), container(gpus=1))) == (1, 1000, 0)
    broken = pod(container("1"))
    broken["spec"]["containers"][0]["resources"]["limits"] = {GPU: "half"}
    assert pod_shape(broken) == (0, 1000, 0)  # unreadable GPU request: counts as none


def test_running_fields_drop_unbound_and_finished_pods() -> None:
    assert running_fields(pod(container("2", gpus=2), node="n1")) == ("u", "n1", (2, 2000, 0))
    assert running_fields(pod(container("2"))) == ("u", None, (0, 0, 0))
    assert running_fields(pod(container("2"), node="n1", phase="Succeeded"))[1] is None
    assert running_fields({"metadata": None, "spec": "x"}) == ("", None, (0, 0, 0))


def test_parse_prior() -> None:
    assert parse_prior("1=1,2=1, 4=2,8=0") == {1: 1.0, 2: 1.0, 4: 2.0, 8: 0.0}
    assert parse_prior("") == {}
    for bad in ("1", "0=1", "x=1", "1=-1", "1=inf", "2=nan"):
        with pytest.raises(ConfigError, match="--pod-mix-prior"):
            parse_prior(bad)


def test_running_pods_track_requests_per_node_and_learn_the_mix() -> None:
    running = RunningPods({1: 1.0}, prior_gpus=4.0)
    changed: list[str | None] = []
    running.listen(changed.append)
    version, mix = running.mix()
    assert mix.shapes == ((1, 0, 0),)  # nothing seen yet: the prior alone
    running.replace([("a", "n1", (1, 8000, 1024)), ("b", "n1", (0, 2000, 0)),
                     ("c", None, (8, 1, 1))])
    assert running.synced and len(running) == 2 and changed == [None]
    assert running.requested("n1") == (10_000, 1024)
    version2, mix = running.mix()
    assert version2 == version + 1  # a relist takes the mix again
    assert dict(zip(mix.shapes, mix.shares, strict=True)) == pytest.approx(
        {(1, 8000, 1024): 0.2, (1, 0, 0): 0.8})
    running.set("d", "n2", (8, 64_000, 0))  # 8 GPUs: more than the mix's weight moved
    assert changed[-1] == "n2" and running.requested("n2") == (64_000, 0)
    version3, mix = running.mix()
    assert version3 == version2 + 1 and mix.shapes[0] == (8, 64_000, 0)
    running.set("e", "n2", (1, 1000, 0))  # a small change keeps the mix (and the caches)
    assert running.mix() == (version3, mix)
    running.set("d", "n1", (8, 64_000, 0))  # moved: both nodes change
    assert changed[-2:] == ["n2", "n1"]
    running.forget("d")
    running.forget("e")
    running.forget("nobody")
    assert running.requested("n2") == (0, 0) and running.requested("n1") == (10_000, 1024)


def test_node_rooms_follow_the_device_list_and_allocatable() -> None:
    rooms = NodeRooms()
    changed: list[str | None] = []
    rooms.listen(changed.append)
    fresh = node_object("n1", node_annotations(C500), "64", "256Gi")
    rooms.observe(*node_room_fields(fresh))
    info = rooms.get("n1")
    assert info is not None and info.free == tuple(range(8))
    assert info.usable[4] == 8 and info.capacity == (8, 64_000, 262_144)
    assert rooms.after(info, 4) == (100, (4, 4, 4, 3, 4, 0, 0, 0, 0))
    rooms.observe(*node_room_fields(fresh))  # unchanged: no event
    assert changed == ["n1"]
    busy = node_object("n1", node_annotations(C500, allocated=[0, 1]), "64", "256Gi")
    rooms.observe(*node_room_fields(busy))
    assert rooms.get("n1").free == (2, 3, 4, 5, 6, 7)  # type: ignore[union-attr]
    # the same layout is one topology, whatever the node
    rooms.observe("n2", node_annotations(C500)[DEVICES])
    assert rooms.get("n2").layout is rooms.get("n1").layout  # type: ignore[union-attr]
    assert rooms.get("n2").cpu_milli is None  # type: ignore[union-attr]
    rooms.observe("n2", "[garbage")
    assert rooms.get("n2") is None
    rooms.forget("n1")
    rooms.replace([("n3", node_annotations(C500)[DEVICES], NO_ALLOCATABLE)])
    assert rooms.get("n1") is None and len(rooms) == 1 and changed[-1] is None


def test_free_room_is_allocatable_minus_bound_requests_and_versions_both() -> None:
    rooms, running = NodeRooms(), RunningPods({1: 1.0}, prior_gpus=1.0)
    room = FreeRoom(rooms, running)
    assert room("n1") == (None, None)  # not known
    rooms.observe(*node_room_fields(node_object("n1", node_annotations(C500), "64", "256Gi")))
    rooms.observe("n2", node_annotations(C500)[DEVICES])  # no allocatable
    before = room.version()
    running.set("p", "n1", (1, 10_000, 1024))
    assert room.version() != before  # a bind moves it
    assert room("n1") == (54_000, 261_120) and room("n2") == (None, None)
    before = room.version()
    rooms.observe(*node_room_fields(node_object("n1", node_annotations(C500), "32", "256Gi")))
    assert room.version() != before and room("n1") == (22_000, 261_120)  # so does a node
    alone = FreeRoom(rooms, None)  # no pod watch: allocatable is free
    assert alone("n1") == (32_000, 262_144) and alone.version() == rooms.changes


def test_ranker_recomputes_only_what_events_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    rooms, running = NodeRooms(), RunningPods({1: 1.0}, prior_gpus=1.0)
    ranker = Ranker(rooms, running)
    running.replace([("seen", "elsewhere", (1, 4000, 1024))])  # the mix: 4 cores a GPU
    for name in ("n1", "n2", "n3"):
        rooms.observe(*node_room_fields(node_object(name, node_annotations(C500), "64", "1Ti")))
    calls: list[int] = []
    real = packing.placement_loss

    def counting(*args: Any, **kwargs: Any) -> float:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(packing, "placement_loss", counting)
    shape = (1, 4000, 1024)
    first = ranker.raw((1.0, 1.0), shape, ["n1", "n2", "n3", "ghost"])
    assert first[0] == first[1] == first[2] and first[3] == MISSING
    assert len(calls) == 1  # three nodes in one state: one computation
    assert ranker.raw((1.0, 1.0), shape, ["n1", "n2", "n3"]) == first[:3]
    assert len(calls) == 1  # cached
    running.set("p", "n2", (0, 60_000, 0))  # CPU taken on n2: n2 alone is recomputed
    second = ranker.raw((1.0, 1.0), shape, ["n1", "n2", "n3"])
    assert len(calls) == 2 and second[0] == first[0] and second[1] != first[1]
    busy = node_annotations(C500, allocated=[0])
    rooms.observe(*node_room_fields(node_object("n3", busy, "64", "1Ti")))
    assert ranker.raw((1.0, 1.0), shape, ["n3"]) != first[2:]
    assert ranker.raw((1.0, 1.0), (9, 0, 0), ["n1"]) == [MISSING]  # too few devices


def test_prioritize_sees_running_pods_cpu_and_learns_their_mix() -> None:
    """With the pod watch the extender knows each node's free CPU and the shapes of the
    pods that run: a CPU-hungry pod goes where it does not strand the free GPUs that the
    running pods' shape could use."""
    rooms, running = NodeRooms(), RunningPods({}, prior_gpus=0)
    ext = Extender(WeightSource(None, Weights(1, 1)), rooms=rooms, running=running)
    blind = Extender(WeightSource(None, Weights(1, 1)))  # --no-pod-watch
    broken = node_annotations(C500, allocated=[0])  # 7 free GPUs each
    nodes = [node_object("P", broken, "96", "512Gi"), node_object("Q", broken, "96", "512Gi")]
    # 1-GPU pods with 4 cores run; Q's CPU is mostly taken by a pod without GPUs
    running.replace([("p1", "P", (1, 4000, 0)), ("p2", "P", (0, 2000, 0)),
                     ("q1", "Q", (1, 4000, 0)), ("q2", "Q", (0, 48_000, 0))])
    assert running.mix()[1].shapes == ((1, 4000, 0),)
    request = json.dumps({"Pod": pod(container("40", gpus=1)),
                          "Nodes": {"items": nodes}}).encode()

    def scores(extender: Extender) -> dict[str, int]:
        return {h["Host"]: h["Score"] for h in json.loads(extender.handle("prioritize",
                                                                         request).body)}

    # on Q the pod would leave 4 cores next to 6 free GPUs: 5 of them stranded
    assert scores(ext) == {"P": 10, "Q": 9}
    raw = ext.ranker.raw((1.0, 1.0), (1, 40_000, 0), ["P", "Q"])
    # 5 GPUs stranded on Q, less the room it would not leave (6 GPUs + 4 cores vs 50)
    assert raw[0] - raw[1] == pytest.approx(10 * (5 - 0.02 * (18.5 - 7)))
    assert scores(blind) == {"P": 10, "Q": 10}  # CPU unknown: a tie
    # the 4-core pods finish, 40-core pods of the same kind start: the mix follows
    running.replace([("p2", "P", (0, 2000, 0)), ("q2", "Q", (0, 48_000, 0)),
                     ("x", "P", (1, 40_000, 0))])
    assert running.mix()[1].shapes == ((1, 40_000, 0),)


def test_node_rooms_after_never_answers_for_a_dropped_layout() -> None:
    # a Layout dropped from the bounded caches may leave its id() to a new Layout of
    # another topology (CPython reuses a freed object's memory at once): the placement
    # memo must not answer for the old one
    def alone(inventory: NodeInventory) -> NodeRoomInfo:
        fresh = NodeRooms()
        fresh.observe("n", node_annotations(inventory)[DEVICES])
        info = fresh.get("n")
        assert info is not None
        return info

    c500, pcie = alone(C500), alone(topologies.pcie_only_8())
    assert c500.free == pcie.free  # the same free positions: only the layout differs
    cases = [(model, NodeRooms().after(model, 4)) for model in (c500, pcie)]
    assert cases[0][1] != cases[1][1]
    rooms = NodeRooms()
    for _ in range(50):
        for model, want in cases:
            # a new Layout of the model's topology, dropped after one question
            info = replace(model, layout=Layout(model.layout.topology, model.layout.groups))
            assert rooms.after(info, 4) == want
            del info
