"""gpu-aware: wire format, filter, prioritize, weights -- driven through Extender.handle.

Node annotations are produced the way the device plugin produces them (core.topology
+ core.scoring + core.devicelist over an inventory with the simulator presets' shapes),
so the extender is tested against real tables, not hand-typed numbers.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuk8s.core.devicelist import DEVICES_ANNOTATION, DeviceEntry, format_device_list
from gpuk8s.core.errors import ConfigError
from gpuk8s.core.model import NodeInventory
from gpuk8s.core.scoring import (
    LOSSES_ANNOTATION,
    SCORES_ANNOTATION,
    NodeRoom,
    fragmentation,
    mix_with_prior,
    placement_loss,
    tables_as_annotations,
    topology_tables,
)
from gpuk8s.core.topology import Topology, units_for_inventory
from gpuk8s.services.extender.logic import Extender
from gpuk8s.services.extender.nodes import BoundPods, NodeCache, parse_node_state
from gpuk8s.services.extender.packing import (
    MISSING,
    NO_ALLOCATABLE,
    NodeRooms,
    Ranker,
    node_room_fields,
    rank_scores,
)
from gpuk8s.services.extender.weights import Weights, WeightSource
from gpuk8s.services.extender.wire import BadRequest, parse_args, pod_request

from . import topologies

GPU = "metax-tech.com/gpu"


# -- helpers shared by the extender tests -------------------------------------------
def node_annotations(
    inventory: NodeInventory,
    allocated: Iterable[int] = (),
    unhealthy: Iterable[int] = (),
) -> dict[str, str]:
    """What gpu-device publishes for ``inventory`` with units at these positions
    allocated / unhealthy (positions in topology order)."""
    units = units_for_inventory(inventory)
    topo = Topology.from_inventory(inventory, units)
    taken, sick = set(allocated), set(unhealthy)
    gpus = {g.index: g for g in inventory.gpus}
    entries = []
    for pos, unit in enumerate(units):
        gpu = gpus[unit.gpu]
        entries.append(DeviceEntry(
            id=unit.id, pci=gpu.pci_address, gpu=gpu.index, vf=unit.vf, product=gpu.product,
            numa=gpu.numa_node, group=gpu.link_group, switch=gpu.pcie_switch,
            healthy=pos not in sick, allocated=pos in taken,
        ))
    free = [p for p in range(len(units)) if p not in taken and p not in sick]
    scores, losses = topology_tables(topo, free)
    out = tables_as_annotations(scores, losses)
    out[DEVICES_ANNOTATION] = format_device_list(entries)
    return out


def node(name: str, annotations: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    """A Node object as the scheduler sends it in Nodes.items."""
    meta: dict[str, Any] = {"name": name, "uid": f"uid-{name}", "labels": {"a": "b"}}
    if annotations is not None:
        meta["annotations"] = annotations
    obj = {"metadata": meta, "spec": {}, "status": {"capacity": {GPU: "8"}}}
    obj.update(extra)
    return obj


def pod(gpus: int | str | None = None, *, uid: str = "pod-uid", kind: str = "limits",
        init: list[int] | None = None) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if gpus is not None:
        resources[kind] = {GPU: gpus if isinstance(gpus, str) else str(gpus)}
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "x", "resources": resources}]}
    if init:
        spec["initContainers"] = [
            {"name": f"init{i}", "resources": {"limits": {GPU: str(n)}}}
            for i, n in enumerate(init)
        ]
    return {"metadata": {"name": "job", "namespace": "ml", "uid": uid}, "spec": spec}


def body(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


def call(ext: Extender, verb: str, payload: Any) -> tuple[int, Any]:
    raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    response = ext.handle(verb, raw)
    return response.status, json.loads(response.body)


def make_extender(tmp_path: Path | None = None, *, score: float = 1, loss: float = 1,
                  cache: NodeCache | None = None, pods: BoundPods | None = None,
                  rooms: NodeRooms | None = None) -> Extender:
    return Extender(WeightSource(None, Weights(score, loss)), cache=cache, pods=pods,
                    rooms=rooms)


class Watched:
    """A node cache and the ranker's node rooms fed with the same node events, as the
    node watch feeds them."""

    def __init__(self) -> None:
        self.cache = NodeCache()
        self.rooms = NodeRooms()

    def replace(self, items: Iterable[tuple[str, dict[str, str]]]) -> None:
        items = list(items)
        self.cache.replace(items)
        self.rooms.replace(
            (name, found.get(DEVICES_ANNOTATION), NO_ALLOCATABLE) for name, found in items
        )

    def upsert(self, name: str, annotations: dict[str, str]) -> None:
        self.cache.upsert(name, annotations)
        self.rooms.observe(name, annotations.get(DEVICES_ANNOTATION))

    def delete(self, name: str) -> None:
        self.cache.delete(name)
        self.rooms.forget(name)


C500 = topologies.c500_8()  # two PCIe switches x 4, MetaXLink inside each four


# -- wire format ----------------------------------------------------------------------
def test_args_use_go_field_names_and_match_case_insensitively() -> None:
    args = parse_args(body(Pod=pod(2), Nodes={"items": [node("a")]}))
    assert args.gpus == 2 and args.pod_ref == "ml/job"
    assert [n.name for n in args.nodes or []] == ["a"]
    lower = parse_args(body(pod=pod(1), nodenames=["a", "b"]))
    assert lower.node_names == ["a", "b"] and lower.nodes is None


@pytest.mark.parametrize(
    ("payload", "needle"),
    [
        ({"Pod": pod(1), "Nodes": {"items": []}, "Extra": 1}, "unknown field 'Extra'"),
        ({"Nodes": {"items": []}}, "Pod: required"),
        ({"Pod": [], "NodeNames": []}, "Pod: must be an object, got array"),
        ({"Pod": pod(1)}, "needs Nodes"),
        ({"Pod": pod(1), "NodeNames": "a"}, "NodeNames: must be an array"),
        ({"Pod": pod(1), "NodeNames": ["a", 3]}, "NodeNames[1]: must be a string"),
        ({"Pod": pod(1), "Nodes": {"items": {}}}, "Nodes.items: must be an array"),
        ({"Pod": pod(1), "Nodes": {"items": [{"metadata": {}}]}},
         "Nodes.items[0].metadata.name"),
        ({"Pod": pod("1.5"), "NodeNames": []}, "cannot be fractional"),
        ({"Pod": pod("500m"), "NodeNames": []}, '"500m" is 0.5, not a whole number'),
        ({"Pod": pod(-1), "NodeNames": []}, "must not be negative"),
        ({"Pod": {"spec": {"containers": "x"}}, "NodeNames": []},
         "Pod.spec.containers: must be an array"),
        ({"Pod": {"spec": {"containers": [{"resources": {"limits": [1]}}]}}, "NodeNames": []},
         "Pod.spec.containers[0].resources.limits: must be an object"),
        ({"Pod": pod(1), "Pod ": 1, "NodeNames": []}, "unknown field"),
    ],
)
def test_bad_args_name_the_field(payload: dict[str, Any], needle: str) -> None:
    with pytest.raises(BadRequest) as err:
        parse_args(json.dumps(payload).encode())
    assert needle in str(err.value)


@pytest.mark.parametrize(
    ("raw", "needle"),
    [(b"{", "not valid JSON"), (b"\xff\xfe", "not valid JSON"),
     (b'{"Pod": {"x": ' + b"[" * 100_000, "nested too deeply"),
     (b'{"Pod": {}, "NodeNames": []' + b"}" * 100_000, "not valid JSON"),
     (b"[" * 100_000, "must be a JSON object"), (b"[]", "must be a JSON object"),
     (b"", "not valid JSON")],
)
def test_undecodable_bodies_are_bad_requests(raw: bytes, needle: str) -> None:
    with pytest.raises(BadRequest) as err:
        parse_args(raw)
    assert needle in str(err.value)


def test_pod_request_follows_the_scheduler_rules() -> None:
    assert pod_request(pod(None)) == 0
    assert pod_request(pod(3, kind="requests")) == 3
    two = pod(2)
    two["spec"]["containers"].append({"name": "b", "resources": {"limits": {GPU: 1}}})
    assert pod_request(two) == 3  # containers add up
    assert pod_request(pod(2, init=[4, 1])) == 4  # an init container alone may need more
    assert pod_request(pod(2, init=[1])) == 2
    sidecar = pod(2, init=[1, 3])
    sidecar["spec"]["initContainers"][0]["restartPolicy"] = "Always"
    # the sidecar (1) runs beside the later init (3) and beside the main container (2)
    assert pod_request(sidecar) == 4
    assert pod_request(pod("2k")) == 2000


# -- filter ---------------------------------------------------------------------------
def test_filter_keeps_fitting_nodes_and_explains_every_rejection() -> None:
    ext = make_extender()
    nodes = [
        node("free", node_annotations(C500)),
        node("busy", node_annotations(C500, allocated=range(6))),
        node("small", node_annotations(topologies.build(
            2, switch_of=[0, 0], numa_of=[0, 0], link_groups=[]))),
        node("sick", node_annotations(C500, unhealthy=range(6))),
        node("plain"),  # no gpu-device
        node("broken", {DEVICES_ANNOTATION: "[{]"}),
    ]
    status, result = call(ext, "filter", {"Pod": pod(4), "Nodes": {"items": nodes}})
    assert status == 200
    assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["free"]
    assert result["Nodes"]["items"][0] == nodes[0]  # echoed unchanged
    assert result["NodeNames"] is None and result["Error"] == ""
    assert set(result["FailedNodes"]) == {"busy"}
    assert "2 of 8 healthy" in result["FailedNodes"]["busy"]
    assert "6 allocated" in result["FailedNodes"]["busy"]
    unres = result["FailedAndUnresolvableNodes"]
    assert set(unres) == {"small", "sick", "plain", "broken"}
    assert "node has 2 metax-tech.com/gpu device(s), 2 healthy; the pod needs 4" in unres["small"]
    assert "8 metax-tech.com/gpu device(s), 2 healthy" in unres["sick"]
    assert "no metax-tech.com/gpu.devices annotation" in unres["plain"]
    assert "unusable device list" in unres["broken"]


def test_pods_without_gpu_request_pass_through_untouched() -> None:
    ext = make_extender()
    nodes = [node("plain"), node("broken", {DEVICES_ANNOTATION: "nope"}), node("gpu",
             node_annotations(C500, allocated=range(8)))]
    status, result = call(ext, "filter", {"Pod": pod(None), "Nodes": {"items": nodes}})
    assert status == 200
    assert result["Nodes"]["items"] == nodes
    assert result["FailedNodes"] == {} and result["FailedAndUnresolvableNodes"] == {}
    status, prio = call(ext, "prioritize", {"Pod": pod(None), "Nodes": {"items": nodes}})
    # every node scores 0: an empty list (kube-scheduler counts a node not listed as 0),
    # not one entry per node for it to decode
    assert (status, prio) == (200, [])


def test_filter_subtracts_gpus_promised_to_bound_pods() -> None:
    pods = BoundPods()
    ext = make_extender(pods=pods)
    annotations = node_annotations(C500, allocated=[0, 1])  # 6 free
    request = {"Pod": pod(4, uid="new"), "Nodes": {"items": [node("n1", annotations)]}}
    assert call(ext, "filter", request)[1]["FailedNodes"] == {}
    # two pods already allocated (the 2 devices) plus one just bound with 3 GPUs
    pods.replace([("a", "n1", 1), ("b", "n1", 1), ("c", "n1", 3), ("d", "other", 8)])
    result = call(ext, "filter", request)[1]
    assert "3 of 8 healthy" in result["FailedNodes"]["n1"]
    assert "3 promised to bound pods" in result["FailedNodes"]["n1"]
    # the kubelet allocated c's devices: the device list now shows 5 allocated
    done = node_annotations(C500, allocated=[0, 1, 2, 3, 4])
    request["Nodes"]["items"] = [node("n1", done)]
    result = call(ext, "filter", request)[1]
    assert "3 of 8 healthy" in result["FailedNodes"]["n1"]
    assert "promised" not in result["FailedNodes"]["n1"]
    pods.forget("c")
    pods.set("a", None, 0)  # a finished
    assert pods.requested("n1") == 1


def test_filter_with_node_cache_uses_node_names() -> None:
    cache = NodeCache()
    ext = make_extender(cache=cache)
    request = {"Pod": pod(2), "NodeNames": ["n1", "n2", "ghost"]}
    status, result = call(ext, "filter", request)
    assert status == 200 and "not synced" in result["Error"]
    cache.replace([("n1", node_annotations(C500)), ("n2", node_annotations(C500, range(7)))])
    status, result = call(ext, "filter", request)
    assert result["NodeNames"] == ["n1"] and result["Nodes"] is None
    assert "1 of 8 healthy" in result["FailedNodes"]["n2"]
    assert "not in the extender's node cache" in result["FailedNodes"]["ghost"]
    cache.upsert("n2", node_annotations(C500))
    cache.delete("n1")
    assert call(ext, "filter", request)[1]["NodeNames"] == ["n2"]


def test_node_names_without_a_cache_is_a_clear_error() -> None:
    status, result = call(make_extender(), "filter", {"Pod": pod(1), "NodeNames": ["a"]})
    assert status == 400 and "--node-cache" in result["Error"]


def test_unknown_verb_is_404() -> None:
    status, result = call(make_extender(), "preempt", {"Pod": pod(1), "NodeNames": []})
    assert status == 404 and "unknown verb" in result["Error"]
    # bind is a verb now (GPU sharing): a filter body is not ExtenderBindingArgs
    status, result = call(make_extender(), "bind", {"Pod": pod(1), "NodeNames": []})
    assert status == 400 and "ExtenderBindingArgs" in result["Error"]


# -- prioritize -----------------------------------------------------------------------
def test_prioritize_prefers_the_node_with_a_whole_link_group() -> None:
    ext = make_extender()
    whole = node_annotations(C500, allocated=[0, 1])  # group {4..7} stays whole
    split = node_annotations(C500, allocated=[0, 4])  # no whole group of 4 left
    status, result = call(ext, "prioritize", {"Pod": pod(4), "Nodes": {"items": [
        node("split", split), node("whole", whole), node("nodata")]}})
    assert status == 200
    scores = {h["Host"]: h["Score"] for h in result}
    assert scores == {"whole": 10, "split": 9, "nodata": 0}
    assert [h["Host"] for h in result] == ["split", "whole", "nodata"]  # request order


def test_prioritize_weights_trade_speed_against_damage() -> None:
    # 2 GPUs: "fresh" takes 2 of a whole MetaXLink group (fast, breaks the group);
    # "leftover" takes a pair left in an already broken group (equally fast, no damage)
    fresh = node_annotations(C500, allocated=[])
    leftover = node_annotations(C500, allocated=[0, 1])
    items = {"Nodes": {"items": [node("fresh", fresh), node("leftover", leftover)]}}
    state_f = parse_node_state("fresh", fresh)
    state_l = parse_node_state("leftover", leftover)
    assert state_f.scores[2] == state_l.scores[2] == 100
    assert state_f.losses[2] > state_l.losses[2]
    scores = {h["Host"]: h["Score"] for h in call(make_extender(score=1, loss=1),
                                                   "prioritize", {"Pod": pod(2), **items})[1]}
    assert scores == {"fresh": 9, "leftover": 10}
    # with lossWeight 0 only speed counts: a tie, both get the top score
    scores = {h["Host"]: h["Score"] for h in call(make_extender(score=1, loss=0),
                                                   "prioritize", {"Pod": pod(2), **items})[1]}
    assert scores == {"fresh": 10, "leftover": 10}


def test_prioritize_min_score_lists_only_the_nodes_scoring_at_least_that() -> None:
    """--prioritize-min-score: the answer leaves out the lower-ranked nodes (the
    scheduler counts them as 0); the nodes it keeps score as they would in the full list,
    in request order; 0 lists every node."""
    items = {"Nodes": {"items": [
        node("split", node_annotations(C500, allocated=[0, 4])),
        node("whole", node_annotations(C500, allocated=[0, 1])),
        node("nodata"),
        node("whole2", node_annotations(C500, allocated=[2, 3])),
    ]}}
    request = {"Pod": pod(4), **items}
    full = call(make_extender(), "prioritize", request)[1]
    assert {h["Host"]: h["Score"] for h in full} == {
        "split": 9, "whole": 10, "nodata": 0, "whole2": 10}
    for floor, expected in ((0, full), (1, [h for h in full if h["Score"] >= 1]),
                            (10, [{"Host": "whole", "Score": 10},
                                  {"Host": "whole2", "Score": 10}])):
        ext = make_extender()
        ext.min_score = floor
        assert call(ext, "prioritize", request)[1] == expected
    # a pod without GPUs scores every node 0: with a floor, nothing is listed
    ext = make_extender()
    ext.min_score = 10
    assert call(ext, "prioritize", {"Pod": pod(0), **items})[1] == []


def test_rank_scores_give_every_distinct_value_its_own_step() -> None:
    assert rank_scores([]) == []
    assert rank_scores([5.0]) == [10]
    # a min-max spread would give 10, 10, 1 here: the two near-equal leaders collapse
    assert rank_scores([100.0, 99.9, -400.0]) == [10, 9, 8]
    assert rank_scores([3.0, MISSING, 3.0, 2.0]) == [10, 0, 10, 9]
    assert rank_scores([float(v) for v in range(12)]) == [1, 1, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]


def test_worked_example_of_the_docs() -> None:
    """The worked example of docs/extender.md ("Prioritize"), through the extender: a
    4-GPU pod, five nodes, the prior mix (no pods running yet), CPU and memory not known."""
    four = topologies.build(4, switch_of=[0] * 4, numa_of=[0] * 4, link_groups=[[0, 1, 2, 3]])
    nodes = [
        node("S", node_annotations(four)),  # 4 linked GPUs, all free
        node("A", node_annotations(C500, allocated=[0, 1])),  # a whole MetaXLink 4 left
        node("F", node_annotations(topologies.c550_8())),  # 8 linked GPUs, all free
        node("E", node_annotations(topologies.pcie_only_8())),  # no links, 2 per switch
        node("B", node_annotations(C500, allocated=[0, 4])),  # both groups already broken
    ]
    rooms = NodeRooms()
    mix = mix_with_prior({})
    table = {}
    for item in nodes:
        name = item["metadata"]["name"]
        rooms.observe(*node_room_fields(item))
        info = rooms.get(name)
        assert info is not None
        score, after = rooms.after(info, 4)
        before_room, after_room = NodeRoom(info.usable), NodeRoom(after)
        table[name] = (
            score,
            round(fragmentation(before_room, mix), 2),
            round(fragmentation(after_room, mix), 2),
            round(placement_loss(before_room, after_room, mix, info.capacity), 2),
        )
    assert table == {
        "S": (100, 1.0, 0.0, -0.92),
        "A": (100, 2.0, 1.0, -0.8),
        "F": (100, 0.0, 1.0, 1.24),
        "E": (30, 0.0, 1.0, 1.24),
        "B": (10, 3.5, 1.0, -2.3),
    }
    request = {"Pod": pod(4), "Nodes": {"items": nodes}}
    expected = {
        (1, 1): {"S": 10, "A": 9, "F": 8, "E": 6, "B": 7},
        (1, 0): {"S": 10, "A": 10, "F": 10, "E": 9, "B": 8},
        (0, 1): {"S": 9, "A": 8, "F": 7, "E": 7, "B": 10},
        (1, 3): {"S": 10, "A": 9, "F": 7, "E": 6, "B": 8},
    }
    for (score_w, loss_w), want in expected.items():
        ext = make_extender(score=score_w, loss=loss_w)
        got = call(ext, "prioritize", request)[1]
        assert {h["Host"]: h["Score"] for h in got} == want, (score_w, loss_w)
        raw = ext.ranker.raw((score_w, loss_w), (4, 0, 0), list(want))
        assert raw == [round(score_w * t[0] - loss_w * 10 * t[3], 9) for t in table.values()]


# -- weights --------------------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _write(path: Path, text: str, bump: int) -> None:
    path.write_text(text)
    stamp = 1_700_000_000 + bump
    os.utime(path, (stamp, stamp))


def test_weights_reload_from_the_configmap_dir_without_restart(tmp_path: Path) -> None:
    clock = Clock()
    _write(tmp_path / "scoreWeight", "2", 0)
    source = WeightSource(str(tmp_path), Weights(1, 1), poll_s=1.0, clock=clock)
    assert source.current() == Weights(2, 1)  # lossWeight absent: the default
    _write(tmp_path / "lossWeight", "0.5\n", 1)
    assert source.current() == Weights(2, 1)  # not polled yet
    clock.now = 1.5
    assert source.current() == Weights(2, 0.5) and source.reloads == 1
    _write(tmp_path / "scoreWeight", "fast please", 2)
    clock.now = 3.0
    assert source.current() == Weights(2, 0.5)  # bad edit: previous weights stay
    assert source.errors == 1 and "scoreWeight" in (source.last_error or "")
    _write(tmp_path / "scoreWeight", "0", 3)
    _write(tmp_path / "lossWeight", "0", 3)
    clock.now = 4.5
    assert source.current() == Weights(2, 0.5) and source.errors == 2  # both zero refused
    _write(tmp_path / "scoreWeight", "3", 4)
    clock.now = 6.0
    assert source.current() == Weights(3, 0)


def test_weights_change_prioritize_live(tmp_path: Path) -> None:
    clock = Clock()
    _write(tmp_path / "scoreWeight", "1", 0)
    _write(tmp_path / "lossWeight", "1", 0)
    ext = Extender(WeightSource(str(tmp_path), clock=clock))
    items = {"Nodes": {"items": [node("fresh", node_annotations(C500)),
                                 node("leftover", node_annotations(C500, allocated=[0, 1]))]}}
    assert call(ext, "prioritize", {"Pod": pod(2), **items})[1][0]["Score"] == 9
    _write(tmp_path / "lossWeight", "0", 1)
    clock.now = 10
    assert call(ext, "prioritize", {"Pod": pod(2), **items})[1][0]["Score"] == 10


@pytest.mark.parametrize(("score", "loss", "needle"), [
    ("-1", "1", "scoreWeight"), ("1", "nan", "lossWeight"), ("x", "1", "not a number"),
    ("0", "0", "at least one"),
])
def test_bad_weights_at_start_are_config_errors(tmp_path: Path, score: str, loss: str,
                                                needle: str) -> None:
    (tmp_path / "scoreWeight").write_text(score)
    (tmp_path / "lossWeight").write_text(loss)
    with pytest.raises(ConfigError) as err:
        WeightSource(str(tmp_path))
    assert needle in str(err.value)


def test_missing_config_dir_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--config-dir"):
        WeightSource(str(tmp_path / "nope"))


# -- node state -------------------------------------------------------------------------
def test_node_state_counts_from_the_device_list() -> None:
    inv = topologies.c500_8(vfs=4)
    state = parse_node_state("n", node_annotations(inv, allocated=[0, 1, 2], unhealthy=[2, 3]))
    assert (state.total, state.healthy, state.allocated, state.free) == (32, 30, 3, 28)
    assert state.scores[28] > 0 and 29 not in state.scores
    assert parse_node_state("n", {SCORES_ANNOTATION: "{}", LOSSES_ANNOTATION: "{}"}).problem


def test_cache_indexes_agree_with_the_plain_computation() -> None:
    """The node cache's incremental indexes (filter) and raw tables (prioritize) give
    the same answers as the per-node computation, through random node events."""
    import random

    rng = random.Random(5)
    shapes = [C500, topologies.c550_8(), topologies.pcie_only_8()]
    variants = [node_annotations(shape, allocated=rng.sample(range(8), rng.randint(0, 6)),
                                 unhealthy=rng.sample(range(8), rng.randint(0, 1)))
                for shape in shapes for _ in range(6)]
    variants += [{}, {DEVICES_ANNOTATION: "broken"}]
    names = [f"n{i}" for i in range(40)]
    watched, pods = Watched(), BoundPods()
    cache = watched.cache
    watched.replace((n, rng.choice(variants)) for n in names[:30])
    pods.replace((f"p{i}", rng.choice(names), rng.randint(1, 4)) for i in range(25))
    fast = Extender(WeightSource(None, Weights(1, 2)), cache=cache, pods=pods,
                    rooms=watched.rooms)
    for step in range(60):
        if step % 3 == 0:
            watched.upsert(rng.choice(names), rng.choice(variants))
        elif step % 7 == 0:
            watched.delete(rng.choice(names))
        elif step % 5 == 0:  # a pod bound, moved or gone: promises change
            pods.set(f"p{rng.randrange(30)}", rng.choice([*names, None]), rng.randint(0, 4))
        elif step % 11 == 0:
            pods.forget(f"p{rng.randrange(30)}")
        need = rng.choice([1, 2, 3, 4, 8])
        offered = rng.sample(names, 25)
        args = parse_args(body(Pod=pod(need), NodeNames=offered))
        keep, failed, unres = fast._filter_cached(offered, need)
        assert (keep, failed, unres) == fast._filter_states(args, need)
        assert set(keep) | set(failed) | set(unres) == set(offered)
        # the encoded answer (pre-encoded members) says what the plain computation says,
        # and is byte for byte json.dumps of the same answer
        plain = fast._filter_result(args, *fast._filter_states(args, need))
        encoded = fast.filter_json(args)
        assert json.loads(encoded) == plain
        assert encoded == json.dumps(fast.filter(args), separators=(",", ":")).encode()
        # prioritize: the ranker's cached priorities against a ranker that starts from
        # nothing over the same nodes
        expected = Ranker(watched.rooms, None).raw((1.0, 2.0), (need, 0, 0), offered)
        assert fast.ranker.raw((1.0, 2.0), (need, 0, 0), offered) == expected
        got = dict(zip(*fast.priorities(args), strict=True))
        assert got == dict(zip(offered, rank_scores(expected), strict=True))


def test_cached_answers_follow_node_and_pod_events() -> None:
    """Nothing precomputed (verdicts, pre-encoded reasons, raw priorities, promised
    GPUs) outlives the event that changes it: each event changes the next answer."""
    cache, pods = Watched(), BoundPods()
    ext = make_extender(cache=cache.cache, pods=pods, rooms=cache.rooms)
    free = node_annotations(C500)
    cache.replace([("n1", free), ("n2", free)])
    pods.replace([])
    request = {"Pod": pod(4), "NodeNames": ["n1", "n2"]}

    def answer() -> tuple[Any, Any]:
        return call(ext, "filter", request)[1], call(ext, "prioritize", request)[1]

    result, prio = answer()
    assert result["NodeNames"] == ["n1", "n2"] and result["FailedNodes"] == {}
    assert prio == [{"Host": "n1", "Score": 10}, {"Host": "n2", "Score": 10}]
    # n2's annotation update (6 of 8 allocated): rejected, with its new counts
    cache.upsert("n2", node_annotations(C500, allocated=range(6)))
    result, prio = answer()
    assert result["NodeNames"] == ["n1"]
    assert "2 of 8 healthy" in result["FailedNodes"]["n2"]
    # another update on n2 (7 allocated): the pre-encoded reason follows
    cache.upsert("n2", node_annotations(C500, allocated=range(7)))
    assert "1 of 8 healthy" in answer()[0]["FailedNodes"]["n2"]
    # n1 split (no whole link group left): its score drops below n2's... after n2 heals
    cache.upsert("n2", node_annotations(C500, allocated=[0, 1]))
    cache.upsert("n1", node_annotations(C500, allocated=[0, 4]))
    result, prio = answer()
    assert result["NodeNames"] == ["n1", "n2"]
    assert prio == [{"Host": "n1", "Score": 9}, {"Host": "n2", "Score": 10}]
    # a pod bound to n2 and not started: its 3 GPUs are promised, n2 (6 free) fails
    pods.set("new", "n2", 1 + 1 + 3)  # the 2 allocated devices' pods plus the new one
    result = answer()[0]
    assert result["NodeNames"] == ["n1"]
    assert "3 promised to bound pods" in result["FailedNodes"]["n2"]
    # the device plugin publishes the allocation: no promise left, 3 free < 4
    cache.upsert("n2", node_annotations(C500, allocated=range(5)))
    result = answer()[0]
    assert "3 of 8 healthy" in result["FailedNodes"]["n2"]
    assert "promised" not in result["FailedNodes"]["n2"]
    cache.upsert("n2", node_annotations(C500, allocated=[0, 1]))
    assert "3 promised" in answer()[0]["FailedNodes"]["n2"]
    # the pod goes away; then a pod relist brings a promise back, a node relist drops n1
    pods.forget("new")
    assert answer()[0]["NodeNames"] == ["n1", "n2"]
    pods.replace([("x", "n1", 2 + 3)])
    result = answer()[0]
    assert result["NodeNames"] == ["n2"] and "promised" in result["FailedNodes"]["n1"]
    cache.replace([("n2", free)])
    result, prio = answer()
    assert result["NodeNames"] == ["n2"]
    assert "not in the extender's node cache" in result["FailedNodes"]["n1"]
    assert prio == [{"Host": "n1", "Score": 0}, {"Host": "n2", "Score": 10}]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=-300, max_value=300) | st.none(), max_size=30))
def test_rank_scores_order_the_values(values: list[int | None]) -> None:
    raw = [MISSING if v is None else float(v) for v in values]
    got = rank_scores(raw)
    distinct = sorted({v for v in values if v is not None}, reverse=True)
    for v, score in zip(values, got, strict=True):
        if v is None:
            assert score == 0
        else:
            assert score == max(10 - distinct.index(v), 1)
    # never inverts an order, and only the top value gets 10
    for a, sa in zip(raw, got, strict=True):
        for b, sb in zip(raw, got, strict=True):
            if a > b:
                assert sa >= sb
    assert (10 in got) == bool(distinct)


def test_need_index_keeps_encoded_names_in_step_with_node_events() -> None:
    """The pre-encoded names a filter answer is joined from follow every node event,
    and encode exactly as json.dumps does (escapes, non-ASCII)."""
    cache = NodeCache()
    odd = 'n"\u00e9'  # not a valid node name, but the answer must still be valid JSON
    cache.replace([("n1", node_annotations(C500)), (odd, node_annotations(C500))])
    ext = make_extender(cache=cache)
    index = cache.need_index(4)
    assert index.fits_json == {"n1": '"n1"', odd: json.dumps(odd)}
    request = body(Pod=pod(4), NodeNames=["n1", odd])
    response = ext.handle("filter", request)
    assert json.loads(response.body)["NodeNames"] == ["n1", odd]
    cache.upsert("n1", node_annotations(C500, allocated=range(6)))  # 2 free < 4
    assert set(index.fits_json) == {odd}
    result = json.loads(ext.handle("filter", request).body)
    assert result["NodeNames"] == [odd] and "2 of 8 healthy" in result["FailedNodes"]["n1"]
    cache.delete(odd)
    assert index.fits_json == {}
    result = json.loads(ext.handle("filter", request).body)
    assert result["NodeNames"] == []
    assert "not in the extender's node cache" in result["FailedNodes"][odd]
    cache.upsert("n1", node_annotations(C500))
    assert index.fits_json == {"n1": '"n1"'}


def test_rooms_skip_unchanged_request_nodes_and_follow_changed_bytes() -> None:
    """nodeCacheCapable: false -- every prioritize observes the request's Node objects:
    a node whose device list and allocatable arrive unchanged (same bytes) is not
    decoded again; any change of those bytes, or of the node by another path, is taken."""
    rooms = NodeRooms()
    events: list[str | None] = []
    rooms.listen(events.append)

    def item(annotations: dict[str, str], cpu: str = "64") -> Any:
        obj = node("n1", annotations, status={"allocatable": {"cpu": cpu, "memory": "1Gi"}})
        return parse_args(body(Pod=pod(1), Nodes={"items": [obj]})).nodes[0]  # type: ignore[index]

    free, busy = node_annotations(C500), node_annotations(C500, allocated=range(6))
    rooms.observe_item(item(free))
    first = rooms.get("n1")
    assert first is not None and len(first.free) == 8 and first.cpu_milli == 64_000
    assert events == ["n1"]
    rooms.observe_item(item(free))  # same bytes, a new request: nothing to do
    assert events == ["n1"] and rooms.get("n1") is first
    rooms.observe_item(item(busy))  # annotation changed
    info = rooms.get("n1")
    assert info is not None and len(info.free) == 2 and events == ["n1", "n1"]
    rooms.observe_item(item(busy, cpu="32"))  # allocatable changed
    info = rooms.get("n1")
    assert info is not None and info.cpu_milli == 32_000 and len(events) == 3
    # the node watch (decoded path) changes the node: the next request's bytes, equal
    # to the last request's, must still be taken again
    rooms.observe("n1", free[DEVICES_ANNOTATION])
    assert len(rooms.get("n1").free) == 8  # type: ignore[union-attr]
    rooms.observe_item(item(busy, cpu="32"))
    assert len(rooms.get("n1").free) == 2  # type: ignore[union-attr]
    rooms.forget("n1")
    rooms.observe_item(item(busy, cpu="32"))
    assert rooms.get("n1") is not None
    rooms.replace([])
    rooms.observe_item(item(busy, cpu="32"))
    assert rooms.get("n1") is not None


def test_full_node_prioritize_follows_the_request_nodes() -> None:
    """The ranker's cached priorities are dropped when a request brings a node with a
    changed device list (nodeCacheCapable: false)."""
    ext = make_extender()
    whole, split = node_annotations(C500, allocated=[0, 1]), node_annotations(C500, [0, 4])
    request = {"Pod": pod(4), "Nodes": {"items": [node("n1", whole), node("n2", split)]}}
    assert call(ext, "prioritize", request)[1] == [
        {"Host": "n1", "Score": 10}, {"Host": "n2", "Score": 9}
    ]
    request["Nodes"]["items"] = [node("n1", split), node("n2", whole)]
    assert call(ext, "prioritize", request)[1] == [
        {"Host": "n1", "Score": 9}, {"Host": "n2", "Score": 10}
    ]
