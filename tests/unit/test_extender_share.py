"""gpu-aware's GPU sharing: the ledger, placement, filter/prioritize and bind (the API
is an in-memory stand-in here; tests/integration/test_sharing_apiserver.py runs it
against a real kube-apiserver)."""

from __future__ import annotations

import json
import math
import threading
import time
from typing import Any

import msgspec
import pytest

from gpuk8s import sim
from gpuk8s.core.sharing import (
    ASSIGNED_ANNOTATION,
    MODE_SGPU,
    SHARING_MODE_LABEL,
    Assignment,
    ShareRequest,
    parse_assignment,
    poisson_tail,
)
from gpuk8s.discovery import discover
from gpuk8s.services.deviceplugin.nodestate import published_annotations
from gpuk8s.services.extender.logic import Extender
from gpuk8s.services.extender.share import (
    PENDING_TTL_S,
    ArrivalMix,
    Ledger,
    SharedNodes,
    Sharing,
    _Homes,
)
from gpuk8s.services.extender.weights import Weights, WeightSource
from gpuk8s.services.extender.wire import NodeView, node_item
from gpuk8s.services.node.devices import DeviceSet

HALF = ShareRequest(MODE_SGPU, 1, 50, 0)


def n260_annotations(directory: Any) -> dict[str, str]:
    """What gpu-device publishes for a simulated n260-2 node made in ``directory``."""
    root = str(directory / "n260")
    sim.create(root, "n260-2")
    return published_annotations(DeviceSet(discover(root), "metax-tech.com/gpu"), set())


@pytest.fixture(scope="module")
def annotations(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return n260_annotations(tmp_path_factory.mktemp("sim"))


def node(name: str, annotations: dict[str, str], mode: str | None = "sgpu") -> dict[str, Any]:
    labels = {SHARING_MODE_LABEL: mode} if mode else {}
    labels["metax-tech.com/gpu.memory"] = "64GB"
    return {"metadata": {"name": name, "annotations": annotations, "labels": labels}}


def pod(name: str, vcore: str = "50", vmemory: str | None = None) -> dict[str, Any]:
    limits = {"metax-tech.com/sgpu": "1", "metax-tech.com/vcore": vcore}
    if vmemory:
        limits["metax-tech.com/vmemory"] = vmemory
    return {
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}",
                     "resourceVersion": "1"},
        "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]},
    }


class Conflict(RuntimeError):
    """What the kubernetes client raises for a refused write (409)."""

    status = 409


class Api:
    """An in-memory pod store with the API server's checks of a Binding."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.pods: dict[str, dict[str, Any]] = {}
        self.fail_bind = False
        self.writes = 0  # pod writes (bindings)
        # changes someone else makes to a pod right after bind has read it, once each
        self.after_read: dict[str, Any] = {}

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        got = json.loads(json.dumps(self.pods[name]))
        change = self.after_read.pop(name, None)
        if change is not None:
            change(self.pods[name])
            meta = self.pods[name]["metadata"]
            meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
        return got

    def bind(self, namespace: str, name: str, uid: str, node: str,
             annotations: dict[str, str] | None = None) -> None:
        """pods/binding as the API server does it: the UID must be the pod's, a bound pod
        is refused (409); node and annotations are set in one write."""
        if self.fail_bind:
            raise RuntimeError("binding refused")
        pod = self.pods[name]
        meta = pod["metadata"]
        if meta["uid"] != uid or pod["spec"].get("nodeName"):
            raise Conflict("409 Conflict")
        meta.setdefault("annotations", {}).update(annotations or {})
        pod["spec"]["nodeName"] = node
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
        self.writes += 1


def over(items: list[dict[str, Any]], **options: Any) -> tuple[Extender, Api, Ledger]:
    """An extender whose sharing sees the node objects ``items`` (``options``: more
    ``Sharing`` arguments), with an empty, synced ledger."""
    shared, ledger = SharedNodes(), Ledger()
    ledger.replace([])
    shared.replace(node_item(msgspec.json.decode(json.dumps(o), type=NodeView)) for o in items)
    api = Api(ledger)
    sharing = Sharing(shared, ledger, api, **options)
    return Extender(WeightSource(None, Weights(1, 1)), sharing=sharing), api, ledger


def setup(annotations: dict[str, str]) -> tuple[Extender, Api, Ledger]:
    return over([node("a", annotations), node("b", annotations), node("x", annotations, None)])


def call(ext: Extender, verb: str, body: Any) -> tuple[int, Any]:
    response = ext.handle(verb, json.dumps(body).encode())
    return response.status, json.loads(response.body)


def bind(
    ext: Extender, api: Api, p: dict[str, Any], node_name: str, allocate: bool = True,
    status: int = 200,
) -> str:
    """The bind verb for ``p`` on a node its filter kept (recorded as a filter call
    records it, without counting the pod in the request mix: these tests place by the
    prior mix); then (``allocate``) the kubelet admits the pod and gpu-device's Allocate
    marks it, as the pod watch reports to the ledger."""
    api.pods[p["metadata"]["name"]] = p
    ext.filtered.record(p["metadata"]["uid"], [node_name])
    got, result = call(ext, "bind", {"PodName": p["metadata"]["name"],
                                     "PodNamespace": "default",
                                     "PodUID": p["metadata"]["uid"], "Node": node_name})
    assert got == status, result
    if allocate and not result["Error"]:
        allocated(api, p["metadata"]["name"])
    return str(result["Error"])


def allocated(api: Api, name: str) -> None:
    meta = api.pods[name]["metadata"]
    api.ledger.set(meta["uid"], parse_assignment(meta["annotations"][ASSIGNED_ANNOTATION]))


def test_filter_prioritize_bind_best_fit(annotations: dict[str, str]) -> None:
    ext, api, ledger = setup(annotations)
    assert bind(ext, api, pod("p1", "60"), "a") == ""
    # a 40 % pod: node a's shared GPU fits it exactly; node b only has fresh GPUs
    items = [node("a", annotations), node("b", annotations), node("x", annotations, None)]
    status, result = call(ext, "filter", {"Pod": pod("p2", "40"), "Nodes": {"items": items}})
    assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["a", "b"]
    assert "sharing mode is 'exclusive'" in result["FailedAndUnresolvableNodes"]["x"]
    status, result = call(ext, "prioritize", {"Pod": pod("p2", "40"),
                                              "Nodes": {"items": items[:2]}})
    assert status == 200
    scores = {h["Host"]: h["Score"] for h in result}
    assert scores["a"] > scores["b"]
    ext.min_score = 10  # --prioritize-min-score: only the best-ranked node is listed
    status, result = call(ext, "prioritize", {"Pod": pod("p2", "40"),
                                              "Nodes": {"items": items[:2]}})
    assert status == 200 and result == [{"Host": "a", "Score": 10}]
    ext.min_score = 0
    assert bind(ext, api, pod("p2", "40"), "a") == ""
    a1 = parse_assignment(api.pods["p1"]["metadata"]["annotations"][ASSIGNED_ANNOTATION])
    a2 = parse_assignment(api.pods["p2"]["metadata"]["annotations"][ASSIGNED_ANNOTATION])
    assert a1 is not None and a2 is not None and a1.gpus == a2.gpus  # the same GPU
    assert api.pods["p2"]["spec"]["nodeName"] == "a"
    assert {i: u.core for i, u in ledger.usage("a").items()} == {a1.gpus[0]: 100}


def test_bad_requests_and_failures_release_the_gpus(annotations: dict[str, str]) -> None:
    ext, api, ledger = setup(annotations)
    status, result = call(ext, "filter", {"Pod": pod("bad", "150"), "Nodes": {"items": []}})
    assert status == 400 and "vcore" in result["Error"] and "0 to 100" in result["Error"]
    # without the counted resource the kubelet would never call Allocate: refused
    alone = pod("alone")
    del alone["spec"]["containers"][0]["resources"]["limits"]["metax-tech.com/sgpu"]
    status, result = call(ext, "filter", {"Pod": alone, "Nodes": {"items": []}})
    assert status == 400 and "['metax-tech.com/sgpu']: required" in result["Error"], result
    assert "required" in bind(ext, api, alone, "a", status=400) and ledger.usage("a") == {}
    api.fail_bind = True
    assert "binding default/p1 to a failed" in bind(ext, api, pod("p1", "100"), "a")
    assert ledger.usage("a") == {} and ASSIGNED_ANNOTATION not in api.pods["p1"]["metadata"].get(
        "annotations", {})
    api.fail_bind = False
    # the pod was replaced (same name, another UID) between read and Binding: the API
    # refuses the Binding (409), the reservation goes, the new pod is left as it was
    api.after_read["p2"] = lambda obj: obj["metadata"].update({"uid": "uid-other"})
    assert "binding default/p2 to a failed: HTTP 409" in bind(ext, api, pod("p2", "100"), "a")
    assert ledger.usage("a") == {} and api.writes == 0
    assert ASSIGNED_ANNOTATION not in (api.pods["p2"]["metadata"].get("annotations") or {})
    assert bind(ext, api, pod("p3", "100"), "a") == ""
    assert bind(ext, api, pod("p4", "100"), "a") == ""
    assert "held exclusively" in bind(ext, api, pod("p5", "10"), "a")


def test_ledger_keeps_reservations_against_stale_events() -> None:
    now = [0.0]
    ledger = Ledger(clock=lambda: now[0])
    ledger.replace([])
    mine = Assignment("n", (0,), HALF)
    ledger.reserve("u1", mine)
    ledger.set("u1", None)  # an event from before our annotation: must not free it
    assert ledger.usage("n")[0].core == 50
    ledger.replace([])  # a relist that does not show it yet: kept within the TTL
    assert ledger.usage("n")[0].core == 50
    ledger.set("u1", mine)  # the watch confirms it
    ledger.set("u1", None)  # the pod finished
    assert ledger.usage("n") == {}
    ledger.reserve("u2", mine)
    now[0] = PENDING_TTL_S + 1
    ledger.replace([])  # never confirmed: forgotten after the TTL
    assert ledger.usage("n") == {}
    ledger.reserve("u3", mine)
    ledger.set("u3", None, deleted=True)
    assert ledger.usage("n") == {}


def test_arrival_mix_counts_each_pod_once_failed_ones_too(annotations: dict[str, str]) -> None:
    arrivals = ArrivalMix(prior=(), window=3)
    start = arrivals.mix()[0]
    for uid in ("u1", "u1", "u2"):
        arrivals.observe(uid, ShareRequest(MODE_SGPU, 1, 30, 0), 2000)
    assert len(arrivals) == 2
    version, mix = arrivals.mix()
    assert version > start and dict(mix.classes) == {(1, 30, 2000, 0): 1.0}
    assert arrivals.mix()[0] == version  # nothing new: same version (memo stays valid)
    for uid in ("u3", "u4", "u5"):  # the window keeps the latest 3
        arrivals.observe(uid, ShareRequest(MODE_SGPU, 1, 0, 0, whole=True), 0)
    arrivals.observe("u6", ShareRequest(MODE_SGPU, 2, 100, 0, whole=True), 0)
    assert len(arrivals) == 3
    # each pod weighs one, as FGD's typical pods: two 1-GPU pods outweigh one 2-GPU pod
    mix = arrivals.mix()[1]
    assert dict(mix.classes) == pytest.approx({(1, 100, 0, 0): 2 / 3, (2, 100, 0, 0): 1 / 3})
    # a pod that fits nowhere is still part of the workload the mix describes
    ext, _, _ = setup(annotations)
    assert ext.sharing is not None
    before = len(ext.sharing.arrivals)
    status, result = call(ext, "filter", {"Pod": pod("big", "100"),
                                          "Nodes": {"items": [node("x", annotations, None)]}})
    assert status == 200 and not result["Nodes"]["items"]
    assert len(ext.sharing.arrivals) == before + 1


Room = dict[str, tuple[int | None, int | None]]


def cpu_fed(
    annotations: dict[str, str], free: Room
) -> tuple[Extender, list[dict[str, Any]], ArrivalMix]:
    """An extender over the nodes of ``free`` (name -> free CPU and memory, read at
    each call) whose arriving pods asked for half a GPU and 8 cores each."""
    items = [node(name, annotations) for name in free]
    arrivals = ArrivalMix(prior=())
    for i in range(20):
        arrivals.observe(f"seen-{i}", HALF, 8000)
    ext, _, _ = over(items, free_room=free.__getitem__, arrivals=arrivals)
    return ext, items, arrivals


def scores_of(ext: Extender, items: list[dict[str, Any]]) -> dict[str, int]:
    """Prioritize scores for a half-GPU pod asking 4 cores."""
    p = pod("p", "50")
    p["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "4"}
    status, result = call(ext, "prioritize", {"Pod": p, "Nodes": {"items": items}})
    assert status == 200
    return {h["Host"]: h["Score"] for h in result}


def test_prioritize_weighs_the_cpu_a_node_keeps(annotations: dict[str, str]) -> None:
    """FGD with CPU as a hard constraint: a node whose CPU left after the pod cannot
    feed the requests that arrive strands its free GPUs, so it ranks lower."""
    # 150 % of GPU left on each needs 24 cores: both are 18 cores off, a over, b under
    free: Room = {"a": (46_000, None), "b": (10_000, None)}
    ext, items, _ = cpu_fed(annotations, free)
    scores = scores_of(ext, items)
    assert scores["a"] > scores["b"]  # b keeps 6 cores: no 8-core pod can use its GPUs
    free["b"] = (46_000, None)
    scores = scores_of(ext, items)
    assert scores["b"] == scores["a"]  # the same room on both: the memo saw the CPU change


def test_prioritize_keeps_cpu_in_step_with_gpus(annotations: dict[str, str]) -> None:
    """Equal fragmentation: the node whose free CPU after the pod stays closest to
    what its free GPU capacity needs (the arriving pods' CPU per GPU) wins; a node
    short of CPU for its GPUs ranks below one as far over (a core short strands GPU
    capacity, a core over only CPU)."""
    free: Room = {"a": (40_000, None), "b": (28_000, None), "c": (16_000, None)}
    ext, items, arrivals = cpu_fed(annotations, free)
    assert arrivals.mix()[1].cpu_per_gpu == pytest.approx(16_000)  # 8 cores per half GPU
    scores = scores_of(ext, items)
    # 150 % of GPU left on each needs 24 cores: b keeps 24, a 36 (12 over), c 12 (12 short)
    assert scores["b"] > scores["a"] > scores["c"]
    free["a"] = free["b"] = free["c"] = (None, None)  # CPU not known: no preference
    scores = scores_of(ext, items)
    assert scores["a"] == scores["b"] == scores["c"]


def test_arrival_mix_cpu_per_gpu_counts_pods_not_weight() -> None:
    arrivals = ArrivalMix(prior=())
    assert arrivals.mix()[1].cpu_per_gpu is None  # nothing arrived yet
    arrivals.observe("half", HALF, 8000)  # 8 cores for half a GPU
    arrivals.observe("two", ShareRequest(MODE_SGPU, 2, 100, 0, whole=True), 8000)
    # 16 cores for 2.5 GPUs
    assert arrivals.mix()[1].cpu_per_gpu == pytest.approx(16_000 / 2.5)


def test_arrival_mix_weighs_classes_by_the_pods_that_stay() -> None:
    """Under churn the mix is what stays placed: each class weighs its arrivals times
    the share of its placed pods still placed; a class never placed takes the share
    over all classes; until a placed pod leaves, the arrivals' counts."""
    there: set[str] = set()
    arrivals = ArrivalMix(prior=(), holding=there.__contains__)
    short, long_ = ShareRequest(MODE_SGPU, 1, 30, 0), ShareRequest(MODE_SGPU, 1, 60, 0)
    for i in range(10):
        for name, share in ((f"s{i}", short), (f"l{i}", long_)):
            arrivals.observe(name, share, 4000)
            arrivals.placed(name)
            there.add(name)
    arrivals.placed("never-seen")  # not an arrival of the window: ignored
    mix = arrivals.mix()[1]
    assert dict(mix.classes) == pytest.approx({(1, 30, 4000, 0): 0.5, (1, 60, 4000, 0): 0.5})
    there -= {f"s{i}" for i in range(8)}  # eight of the short-lived ones left
    there -= {"l0", "l1"}  # two of the long-lived ones
    for i in range(2):  # arrivals re-take the mix; these two find no room (not placed)
        arrivals.observe(f"big{i}", ShareRequest(MODE_SGPU, 2, 100, 0, whole=True), 8000)
    mix = arrivals.mix()[1]
    # short: 10 x 2/10 = 2; long: 10 x 8/10 = 8; never placed: 2 x 10/20 (all classes)
    weights = {(1, 30, 4000, 0): 2.0, (1, 60, 4000, 0): 8.0, (2, 100, 8000, 0): 1.0}
    total = sum(weights.values())
    assert dict(mix.classes) == pytest.approx({k: w / total for k, w in weights.items()})
    # the CPU per GPU of what stays: (2 + 8) x 4 cores + 1 x 8 over 0.6 + 4.8 + 2 GPUs
    assert mix.cpu_per_gpu == pytest.approx(48_000 / 7.4)
    there.clear()  # nothing stays: the arrivals are all the mix can go by
    for i in range(2):
        arrivals.observe(f"late{i}", long_, 4000)
    mix = arrivals.mix()[1]
    weights = {(1, 30, 4000, 0): 10, (1, 60, 4000, 0): 12, (2, 100, 8000, 0): 2}
    assert dict(mix.classes) == pytest.approx({k: w / 24 for k, w in weights.items()})


def test_bound_pods_that_are_deleted_leave_the_mix(annotations: dict[str, str]) -> None:
    """The extender's own binds and the pod watch's deletions are what the mix
    follows: a bound pod counts as staying until the ledger drops it."""
    arrivals = ArrivalMix(prior=())
    ext, api, ledger = over([node("a", annotations), node("b", annotations)], arrivals=arrivals)
    short, long_ = ShareRequest(MODE_SGPU, 1, 30, 0), ShareRequest(MODE_SGPU, 1, 60, 0)
    for name, share, vcore in (("s1", short, "30"), ("s2", short, "30"), ("l1", long_, "60"),
                               ("l2", long_, "60")):
        arrivals.observe(f"uid-{name}", share, 0)
        assert bind(ext, api, pod(name, vcore), "a" if name[0] == "s" else "b") == ""
    mix = arrivals.mix()[1]
    assert dict(mix.classes) == pytest.approx({(1, 30, 0, 0): 0.5, (1, 60, 0, 0): 0.5})
    ledger.set("uid-s1", None, deleted=True)  # the pod watch: one short-lived pod left
    arrivals.observe("uid-next", long_, 0)  # the next arrival re-takes the mix
    mix = arrivals.mix()[1]
    # short: 2 x 1/2 = 1; long: 3 (two placed, both there, and the new one)
    assert dict(mix.classes) == pytest.approx({(1, 30, 0, 0): 0.25, (1, 60, 0, 0): 0.75})


def test_sharing_metrics(annotations: dict[str, str]) -> None:
    from prometheus_client import generate_latest

    ext, api, _ = setup(annotations)
    assert bind(ext, api, pod("m1", "30"), "a") == ""
    text = generate_latest(ext.metrics.registry).decode()
    assert "gpu_aware_shared_gpu_pods 1.0" in text
    assert "gpu_aware_shared_binds 1.0" in text
    assert "gpu_aware_shared_bind_waits 0.0" in text


def limits_pod(name: str, limits: dict[str, str]) -> dict[str, Any]:
    p = pod(name)
    p["spec"]["containers"][0]["resources"]["limits"] = limits
    return p


def assigned(api: Api, name: str) -> Assignment:
    got = parse_assignment(api.pods[name]["metadata"]["annotations"][ASSIGNED_ANNOTATION])
    assert got is not None
    return got


def family_setup(
    root_preset: str, mode: str, tmp_path: Any
) -> tuple[Extender, Api, Ledger, dict[str, Any]]:
    """An extender over one node ``n`` (returned too) of the simulator preset, in
    sharing ``mode``."""
    root = str(tmp_path / "node")
    sim.create(root, root_preset)
    ann = published_annotations(DeviceSet(discover(root), "metax-tech.com/gpu"), set())
    item = node("n", ann, mode)
    return (*over([item]), item)


def test_vcuda_fractions_and_whole_gpus_by_topology(tmp_path: Any) -> None:
    """tencent.com/vcuda-core: 1-99 share one GPU; multiples of 100 take whole, unshared
    GPUs chosen by the topology allocator (c500-8: two MetaXLink groups of four)."""
    ext, api, ledger, n = family_setup("c500-8", "vcuda", tmp_path)
    core, memory = "tencent.com/vcuda-core", "tencent.com/vcuda-memory"
    assert bind(ext, api, limits_pod("f1", {core: "30", memory: "64"}), "n") == ""
    first = assigned(api, "f1")
    assert (first.share.mode, first.share.core, first.share.memory_mib) == ("vcuda", 30, 64 * 256)
    shared_gpu = first.gpus[0]
    # four whole GPUs: one MetaXLink group, the one without the shared GPU
    assert bind(ext, api, limits_pod("w4", {core: "400"}), "n") == ""
    whole = assigned(api, "w4")
    assert whole.share.whole and len(whole.gpus) == 4
    groups = ({0, 1, 2, 3}, {4, 5, 6, 7})
    assert set(whole.gpus) in groups and shared_gpu not in whole.gpus
    # a fraction joins the already-shared GPU (best fit), never a whole-held one
    assert bind(ext, api, limits_pod("f2", {core: "50"}), "n") == ""
    assert assigned(api, "f2").gpus == (shared_gpu,)
    # memory is a hard limit per GPU: 64 GiB label, 16 GiB taken, 56 GiB asked
    assert bind(ext, api, limits_pod("f3", {core: "10", memory: "224"}), "n") == ""
    assert assigned(api, "f3").gpus != (shared_gpu,)
    usage = ledger.usage("n")
    assert usage[shared_gpu].core == 80 and all(u.core <= 100 for u in usage.values())
    for gpu in whole.gpus:
        assert usage[gpu].exclusive and usage[gpu].shares == 1
    # two GPUs are left unshared (8 - 4 whole - 2 shared): three do not fit, two do
    status, result = call(ext, "filter", {"Pod": limits_pod("w3", {core: "300"}),
                                          "Nodes": {"items": [n]}})
    assert status == 200 and not result["Nodes"]["items"]
    assert "2 whole GPU(s) unshared and free; the pod needs 3" in result["FailedNodes"]["n"]
    assert bind(ext, api, limits_pod("w2", {core: "200"}), "n") == ""
    assert not set(assigned(api, "w2").gpus) & (set(whole.gpus) | {shared_gpu})
    assert "0 whole GPU(s)" in bind(ext, api, limits_pod("w1", {core: "100"}), "n")


def test_mps_share_and_memory_limit(tmp_path: Any) -> None:
    """nvidia.com/mps-core + mps-memory on an NVIDIA node in mps mode: per-GPU compute
    and memory accounting; the MPS family on a vcuda node is unresolvable."""
    ext, api, ledger, n = family_setup("nvidia-8", "mps", tmp_path)
    core, memory = "nvidia.com/mps-core", "nvidia.com/mps-memory"
    assert bind(ext, api, limits_pod("m1", {core: "40", memory: "60Gi"}), "n") == ""
    one = assigned(api, "m1")
    assert (one.share.mode, one.share.core, one.share.memory_mib, len(one.gpus)) == (
        "mps", 40, 60 * 1024, 1)
    # 40 % compute left on that GPU but only 4 GiB of its 64: the next one goes elsewhere
    assert bind(ext, api, limits_pod("m2", {core: "40", memory: "8Gi"}), "n") == ""
    assert assigned(api, "m2").gpus != one.gpus
    assert bind(ext, api, limits_pod("m3", {core: "20", memory: "4Gi"}), "n") == ""
    assert assigned(api, "m3").gpus == one.gpus  # fits exactly: best fit
    assert ledger.usage("n")[one.gpus[0]].memory_mib == 64 * 1024
    vcuda = limits_pod("v", {"tencent.com/vcuda-core": "10"})
    status, result = call(ext, "filter", {"Pod": vcuda, "Nodes": {"items": [n]}})
    assert status == 200 and not result["Nodes"]["items"]
    assert "sharing mode is 'mps'" in result["FailedAndUnresolvableNodes"]["n"]


def test_bind_waits_while_a_pod_of_the_same_size_awaits_allocate(
    annotations: dict[str, str],
) -> None:
    """gpu-device's Allocate learns only the number of device ids: while one pod on a
    node waits for it, another of the same mode and number of ids is not bound there
    (bind waits, then fails for kube-scheduler to retry); other sizes, other nodes and
    pods bound longer than ALLOCATE_WAIT_S ago do not hold it back."""
    import threading
    import time

    from gpuk8s.services.extender.share import ALLOCATE_WAIT_S

    ext, api, ledger = setup(annotations)
    assert ext.sharing is not None
    ext.sharing.bind_wait_s = 0.05
    assert bind(ext, api, pod("q1", "30"), "a", allocate=False) == ""
    why = bind(ext, api, pod("q2", "20"), "a", allocate=False)  # also 1 sgpu id
    assert "another pod on a asking for 1 metax-tech.com/sgpu still waits" in why, why
    assert "%" not in why and "q2" in why and ext.sharing.bind_waits == 1
    assert ASSIGNED_ANNOTATION not in api.pods["q2"]["metadata"].get("annotations", {})
    assert sum(u.core for u in ledger.usage("a").values()) == 30  # nothing booked for q2
    assert bind(ext, api, pod("q3", "20"), "b", allocate=False) == ""  # another node
    two = pod("q4", "20")
    two["spec"]["containers"][0]["resources"]["limits"]["metax-tech.com/sgpu"] = "2"
    assert bind(ext, api, two, "a", allocate=False) == ""  # 2 ids: told apart
    # the watch reports q1 allocated (gpu-device marked it): q2 may go
    allocated(api, "q1")
    assert bind(ext, api, pod("q2", "20"), "a", allocate=False) == ""
    # a waiting bind is woken by the Allocate of the pod it waits for
    ext.sharing.bind_wait_s = 10.0
    answers: list[str] = []
    waiter = threading.Thread(
        target=lambda: answers.append(bind(ext, api, pod("q5", "10"), "a", allocate=False))
    )
    started = time.monotonic()
    waiter.start()
    time.sleep(0.2)
    assert not answers  # still waiting for q2
    allocated(api, "q2")
    waiter.join(9)
    assert answers == [""] and time.monotonic() - started < 9  # woken, not bind_wait_s's 10 s
    # after an extender restart the watch reports q5 waiting since its bind time
    meta = api.pods["q5"]["metadata"]
    a5 = parse_assignment(meta["annotations"][ASSIGNED_ANNOTATION])
    assert a5 is not None
    fresh = Ledger()
    fresh.replace([(meta["uid"], a5)], {meta["uid"]: time.time() - 1})
    assert fresh.awaiting_allocate("a", HALF)
    assert not fresh.awaiting_allocate("a", HALF, without=meta["uid"])
    assert not fresh.awaiting_allocate("a", ShareRequest(MODE_SGPU, 2, 50, 0))
    # one bound long ago and never allocated (its kubelet is away) holds nobody back
    fresh.set(meta["uid"], a5, awaiting=time.time() - ALLOCATE_WAIT_S - 1)
    assert not fresh.awaiting_allocate("a", HALF)


def test_view_assignment_reads_the_allocate_phase() -> None:
    from gpuk8s.core.sharing import BIND_TIME_ANNOTATION, PHASE_ANNOTATION
    from gpuk8s.services.extender.share import view_assignment
    from gpuk8s.services.extender.wire import PodView

    def view(phase: str | None, bind_time: str | None) -> tuple[Any, ...]:
        ann = {ASSIGNED_ANNOTATION: Assignment("a", (1,), HALF).to_json()}
        if phase is not None:
            ann[PHASE_ANNOTATION] = phase
        if bind_time is not None:
            ann[BIND_TIME_ANNOTATION] = bind_time
        obj = {"metadata": {"uid": "u", "annotations": ann}, "status": {"phase": "Pending"}}
        return view_assignment(msgspec.json.decode(json.dumps(obj), type=PodView))

    uid, got, since = view("allocating", "1700000000500000000")
    assert (uid, got, since) == ("u", Assignment("a", (1,), HALF), 1700000000.5)
    assert view("allocated", "1700000000500000000")[2] is None
    assert view(None, None)[2] is None
    assert view("allocating", "yesterday")[2] == 0.0  # unreadable: holds nobody back


def test_bind_records_the_choice_on_a_pod_nudged_meanwhile(annotations: dict[str, str]) -> None:
    """The requeue nudge (or any change that is not a GPU choice) between bind's read and
    its write does not stop the choice: the Binding checks the pod's UID and that it is
    unbound, not its version; node and choice are one write."""
    ext, api, _ledger = setup(annotations)
    p = pod("p1", "50")
    api.after_read["p1"] = lambda obj: obj["metadata"].setdefault("annotations", {}).update(
        {"gpuk8s.io/sharing.requeue": "1"})
    assert bind(ext, api, p, "a") == ""
    meta = api.pods["p1"]["metadata"]
    assert ASSIGNED_ANNOTATION in meta["annotations"]
    assert meta["annotations"]["gpuk8s.io/sharing.requeue"] == "1"
    assert api.pods["p1"]["spec"]["nodeName"] == "a"
    assert api.writes == 1


def test_bind_keeps_the_conflict_when_the_pod_was_placed_meanwhile(
    annotations: dict[str, str],
) -> None:
    """A pod that another binder placed (or gave a GPU choice) between the read and the
    write keeps its 409: nothing is booked for it here."""
    ext, api, ledger = setup(annotations)
    p = pod("p1", "50")
    api.after_read["p1"] = lambda obj: obj["spec"].update({"nodeName": "b"})
    error = bind(ext, api, p, "a")
    assert "binding default/p1 to a failed" in error and "409" in error
    assert ASSIGNED_ANNOTATION not in (api.pods["p1"]["metadata"].get("annotations") or {})
    assert ledger.usage("a") == {} or all(u.core == 0 for u in ledger.usage("a").values())


def test_node_cache_is_synced_only_once_the_sharing_view_knows_every_node(
    annotations: dict[str, str],
) -> None:
    """Readiness follows the node cache's sync: a node list fills the sharing view (and
    the other derived views) before the cache says synced, so a bind asked the moment
    gpu-aware is ready never finds its node missing."""
    from gpuk8s.services.extender.nodes import NodeCache
    from gpuk8s.services.extender.watch import node_handlers

    cache = NodeCache()
    seen_synced: list[bool] = []

    class Watching(SharedNodes):
        def replace(self, items: Any) -> None:
            seen_synced.append(cache.synced)
            super().replace(items)

    shared = Watching()
    on_list, _ = node_handlers(cache, shared=shared)
    on_list([msgspec.Raw(json.dumps(node(n, annotations)).encode()) for n in ("a", "b")])
    assert seen_synced == [False]
    assert cache.synced and shared.get("a") is not None and shared.get("b") is not None


def plain_pod(name: str, cpu: str, gpus: int = 0) -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": cpu, "memory": "1Gi"}}
    if gpus:
        resources["limits"] = {"metax-tech.com/gpu": str(gpus)}
    return {"metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
            "spec": {"containers": [{"name": "main", "resources": resources}]}}


def test_pods_without_gpus_take_cpu_where_the_fewest_gpus_need_it(
    annotations: dict[str, str],
) -> None:
    """A pod without GPUs goes first where no GPU is left to feed (its CPU strands
    nothing there, however little of it the node has), then where the most CPU is left
    per free GPU; a GPU-dense node keeps its cores for GPU pods. Not by spare CPU beyond
    the free GPUs' need: "rich" has more of that than "full"."""
    free = {"full": (12_000, 65_536), "rich": (64_000, 65_536), "tight": (20_000, 65_536)}
    arrivals = ArrivalMix()
    ext, api, _ = over([node(n, annotations) for n in free],
                       free_room=lambda name: free[name], arrivals=arrivals)
    for i in range(40):  # the shares that arrive ask 8 cores for half a GPU
        arrivals.observe(f"s{i}", HALF, 8000, 1024)
    for name in ("f1", "f2"):  # both GPUs of "full" taken whole
        assert bind(ext, api, pod(name, "100"), "full") == ""
    nodes = {"items": [node(n, annotations) for n in free]}
    status, result = call(ext, "prioritize-nogpu", {"Pod": plain_pod("p", "4"), "Nodes": nodes})
    assert status == 200
    scores = {h["Host"]: h["Score"] for h in result}
    # after the pod: full 0 GPUs per core; rich 2 GPUs / 60 cores; tight 2 / 16
    assert scores["full"] > scores["rich"] > scores["tight"]


def test_pods_without_gpus_keep_the_cores_a_whole_node_pod_needs(
    annotations: dict[str, str],
) -> None:
    """GPUs per core alone would send the pod to "pair" (2 GPUs over 38 cores left,
    against 1 over 6 on "single"); but "pair" is the only node where a pod of both its
    GPUs and 40 cores fits, and 4 cores less would strand both GPUs for that class. The
    capacity a node filled with each class could no longer use decides first
    (``core.sharing.fill_stranded``); "single" loses none: its one free GPU still gets
    a 4-core pod."""
    free = {"pair": (42_000, 65_536), "single": (10_000, 65_536)}
    arrivals = ArrivalMix()
    ext, api, _ = over([node(n, annotations) for n in free],
                       free_room=lambda name: free[name], arrivals=arrivals)
    for i in range(40):  # most pods ask one GPU and 4 cores, a few both GPUs and 40
        arrivals.observe(f"o{i}", ShareRequest(MODE_SGPU, 1, 100, 0), 4000, 1024)
    for i in range(4):
        arrivals.observe(f"t{i}", ShareRequest(MODE_SGPU, 2, 100, 0), 40_000, 1024)
    assert bind(ext, api, pod("taken", "100"), "single") == ""
    nodes = {"items": [node(n, annotations) for n in free]}
    status, result = call(ext, "prioritize-nogpu", {"Pod": plain_pod("p", "4"), "Nodes": nodes})
    assert status == 200
    scores = {h["Host"]: h["Score"] for h in result}
    assert scores["single"] > scores["pair"]


def test_pods_without_gpus_go_where_their_cpu_strands_no_gpu(
    annotations: dict[str, str],
) -> None:
    """The second extender entry (verb prioritize-nogpu): a pod without GPUs scores best
    where the least free GPU capacity is left per free core after it (the same GPUs on
    each node here: the most CPU first); a node gpu-aware does not know scores 0, and so
    does every node for a pod that asks for GPUs (the main entry ranks it)."""
    free = {"a": (10_000, 65_536), "b": (64_000, 65_536), "c": (40_000, 65_536)}
    arrivals = ArrivalMix()
    ext, _, _ = over([node("a", annotations), node("b", annotations), node("c", annotations)],
                     free_room=lambda name: free[name], arrivals=arrivals)
    for i in range(40):  # the shares that arrive ask 8 cores for half a GPU
        arrivals.observe(f"s{i}", HALF, 8000, 1024)
    # the request's Node objects; "unknown" publishes no device list gpu-aware could use
    nodes = {"items": [node(n, annotations) for n in "abc"] + [node("unknown", {})]}
    status, result = call(ext, "prioritize-nogpu", {"Pod": plain_pod("p", "4"), "Nodes": nodes})
    assert status == 200
    scores = {h["Host"]: h["Score"] for h in result}
    # a: 6 cores left cannot feed an 8-core share: its free GPUs would be stranded
    assert scores["b"] > scores["c"] > scores["a"] > scores["unknown"] == 0
    # a GPU pod on the second entry, a pod without GPUs on the main one: every node 0,
    # answered with an empty list (a node not listed counts as 0)
    status, result = call(ext, "prioritize-nogpu", {"Pod": plain_pod("g", "4", gpus=1),
                                                    "Nodes": nodes})
    assert (status, result) == (200, [])
    status, result = call(ext, "prioritize", {"Pod": plain_pod("p", "4"), "Nodes": nodes})
    assert (status, result) == (200, [])
    off = Extender(WeightSource(None, Weights(1, 1)))
    status, result = call(off, "prioritize-nogpu", {
        "Pod": plain_pod("p", "4"),
        "Nodes": {"items": [node("a", annotations)]}})
    assert (status, result) == (200, [])  # no sharing: every node 0


def test_pods_without_gpus_keep_a_home_for_the_largest_one_seen(
    annotations: dict[str, str],
) -> None:
    """On a cluster short of CPU: once a pod without GPUs asking 32 cores was seen, a
    4-core one goes where the most CPU per free GPU is left (``gpus_per_core``) only if
    that leaves some node with 32 cores; else to the node it does not take below 32
    (b). Among nodes alike in all else the one left with the least CPU ranks first
    (best fit: the holes for large pods stay large)."""
    free = {"a": (34_000, 65_536), "b": (24_000, 65_536), "c": (8_000, 65_536)}
    arrivals = ArrivalMix(prior=())
    for i in range(4):  # shares asking a little CPU: the CPU takes nothing out of use
        arrivals.observe(f"s{i}", HALF, 1000, 1024)
    ext, _, ledger = over([node(n, annotations) for n in "abc"],
                          free_room=lambda name: free[name], arrivals=arrivals)
    sharing = ext.sharing
    assert sharing is not None
    small, large = (4_000, 1_024), (32_000, 1_024)
    first = dict(zip("abc", sharing.raw_nogpu(list("abc"), small), strict=True))
    assert first["a"] > first["b"] > first["c"]  # nothing large seen: the most CPU first
    sharing.raw_nogpu(list("abc"), large)
    then = dict(zip("abc", sharing.raw_nogpu(list("abc"), small), strict=True))
    assert then["b"] > then["a"]  # a is the last node a 32-core pod fits
    free["a"] = (64_000, 65_536)  # now a keeps room for one after the small pod
    assert max(zip(sharing.raw_nogpu(list("abc"), small), "abc", strict=True))[1] == "a"
    # all GPUs booked on a and b: no GPU capacity to strand, both as good but for the CPU
    for n in "ab":
        for gpu in (0, 1):
            ledger.set(f"{n}{gpu}", Assignment(n, (gpu,), ShareRequest(MODE_SGPU, 1, 100, 0)))
    free["a"], free["b"] = (60_000, 65_536), (50_000, 65_536)
    ranks = dict(zip("ab", sharing.raw_nogpu(list("ab"), small), strict=True))
    assert ranks["b"] > ranks["a"]


def _large_seen(annotations: dict[str, str]) -> tuple[Sharing, ArrivalMix, Ledger]:
    """Nodes a (34 cores free: the one room for a 32-core pod) and b (8 cores); four
    half-GPU pods asking 4 cores each and four 32-core pods without GPUs observed."""
    free = {"a": (34_000, 65_536), "b": (8_000, 65_536)}
    arrivals = ArrivalMix(prior=())
    for i in range(4):
        arrivals.observe(f"s{i}", HALF, 4000, 1024)
    ext, _, ledger = over([node(n, annotations) for n in "ab"],
                          free_room=lambda name: free[name], arrivals=arrivals)
    sharing = ext.sharing
    assert sharing is not None
    for i in range(4):
        sharing.raw_nogpu(list("ab"), (32_000, 1_024), f"n{i}")
    return sharing, arrivals, ledger


def test_arrivals_count_large_pods_without_gpus_in_their_window() -> None:
    """``ArrivalMix.large``: the pods without GPUs asking at least the CPU or at least
    the memory given, each UID once, the latest ``window`` of them; beside the GPUs
    and the CPU all pods in the windows ask (a GPU pod's CPU counts too)."""
    arrivals = ArrivalMix(prior=(), window=2)
    arrivals.observe("g", HALF, 4000, 1024)
    arrivals.observe_plain("a", 32_000, 1024)
    arrivals.observe_plain("a", 32_000, 1024)  # the same pod again
    arrivals.observe_plain("b", 2_000, 65_536)
    assert arrivals.large((32_000, 65_536)) == (2, 0.5, 38_000)
    arrivals.observe_plain("c", 1_000, 1024)  # a leaves the window
    assert arrivals.large((32_000, 65_536)) == (1, 0.5, 7_000)
    assert arrivals.large((1_000, 1024)) == (2, 0.5, 7_000)
    arrivals.observe_plain("", 64_000, 1024)  # no UID: not counted
    assert arrivals.large((32_000, 65_536))[0] == 1


def test_gpu_pods_spare_the_last_rooms_of_large_pods_without_gpus(
    annotations: dict[str, str],
) -> None:
    """Node a has the cluster's last room for a 32-core pod without GPUs (34 cores
    free), b 8 cores. While the observed arrivals expect more such pods than rooms are
    left (four 32-core pods among four GPU pods, GPUs free), a half-GPU pod asking 4
    cores goes to b, though a ranks first on the rest (the CPU balance: b's 8 cores
    leave its free GPUs short of the arrivals' 8 cores per GPU); once the arrivals are
    mostly GPU pods (four 32-core pods in 404) the order is a before b again, as
    without the rule."""
    sharing, arrivals, _ = _large_seen(annotations)
    small, large = (4_000, 1_024), (32_000, 1_024)
    sharing.raw_nogpu(list("ab"), large, "n0")  # asked again: one pod, counted once
    assert arrivals.large(large)[0] == 4
    short = dict(zip("ab", sharing.raw(HALF, list("ab"), "g0", small), strict=True))
    assert short["b"] is not None and short["a"] is not None
    assert short["b"] > short["a"]  # a holds the last 32-core room
    for i in range(400):  # four large pods in 404 arrivals: about 2 % of them
        arrivals.observe(f"t{i}", HALF, 4000, 1024)
    plenty = dict(zip("ab", sharing.raw(HALF, list("ab"), "g1", small), strict=True))
    assert plenty["b"] is not None and plenty["a"] is not None
    assert plenty["a"] > plenty["b"]


def test_pods_without_gpus_spare_the_last_rooms_while_they_run_short(
    annotations: dict[str, str],
) -> None:
    """Node a's GPUs are all booked and it has the cluster's last room for a 32-core pod
    (34 cores free); b has two free GPUs and 8 cores. A 4-core pod without GPUs strands
    nothing on a and part of b's GPUs' CPU: it goes to a while rooms are plenty, and to
    b while the observed arrivals expect more 32-core pods than rooms are left."""
    sharing, arrivals, ledger = _large_seen(annotations)
    for gpu in (0, 1):
        ledger.set(f"a{gpu}", Assignment("a", (gpu,), ShareRequest(MODE_SGPU, 1, 100, 0)))
    small = (4_000, 1_024)
    short = dict(zip("ab", sharing.raw_nogpu(list("ab"), small, "p0"), strict=True))
    assert short["b"] > short["a"]  # a holds the last 32-core room
    for i in range(400):  # four large pods in 404 arrivals
        arrivals.observe(f"t{i}", HALF, 4000, 1024)
    plenty = dict(zip("ab", sharing.raw_nogpu(list("ab"), small, "p1"), strict=True))
    assert plenty["a"] > plenty["b"]  # the GPU capacity stranded decides first


def test_prioritize_follows_the_mix_packing_before_fragmentation(
    annotations: dict[str, str],
) -> None:
    """Arriving shares of 32 % (three to a GPU), 20 % and 50 %; on node a a 20 % share
    and a whole-GPU one, on node b a 32 % share and a whole-GPU one. A 50 % pod: FGD's
    rise alone prefers b (18 % left that no class uses, against 30 % on a that the 32 %
    and 50 % classes cannot use), but beside the 32 % share it loses a sixth of a GPU
    against the LP packing of the mix, beside the 20 % one a tenth (a 20 % share still
    fits): a ranks first, and bind books it there."""
    arrivals = ArrivalMix(prior=())
    for i, pct in enumerate((32, 32, 32, 20, 50)):
        arrivals.observe(f"seen-{i}", ShareRequest(MODE_SGPU, 1, pct, 0), 0)
    assert arrivals.mix()[1].prices.price == pytest.approx({20: 0.2, 32: 1 / 3, 50: 0.5})
    ext, api, _ = over([node("a", annotations), node("b", annotations)], arrivals=arrivals)
    for name, where, vcore in (("wa", "a", "100"), ("sa", "a", "20"),
                               ("wb", "b", "100"), ("sb", "b", "32")):
        assert not bind(ext, api, pod(name, vcore), where)
    items = [node("a", annotations), node("b", annotations)]
    status, result = call(ext, "prioritize", {"Pod": pod("half", "50"), "Nodes": {"items": items}})
    assert status == 200
    scores = {h["Host"]: h["Score"] for h in result}
    assert scores["a"] > scores["b"]
    assert ext.sharing is not None
    assert ext.sharing.place("b", HALF).raw < ext.sharing.place("a", HALF).raw


def _factor(chance: float, share: float) -> float:
    """``whole_scarcity``'s factor: the chance over the share, in quarter steps of a
    doubling, where over 1."""
    ratio = chance / share
    return 2.0 ** (round(4 * math.log2(ratio)) / 4) if ratio > 1 else 1.0


def test_breaking_a_scarce_home_costs_a_pod_with_the_chance_it_is_needed(
    annotations: dict[str, str],
) -> None:
    """One in five arriving pods asks 2 whole GPUs, the rest 1: a 1-GPU pod on an empty
    node strands a GPU for the 2-GPU class (FGD's rise, 0.2 x 100). While the homes
    are many against the 2-GPU pods to come, that is all. Once b and c are taken, a is
    the only home left for the 2-GPU pods that its 2 free GPUs draw (Poisson, mean
    2 / 1.2 x 0.2): breaking it costs such a pod with the chance one comes, over the
    class's share (``whole_scarcity``)."""
    arrivals = ArrivalMix(prior=())
    for i in range(10):
        arrivals.observe(f"seen-{i}", ShareRequest(MODE_SGPU, 2 if i < 2 else 1, 100, 0, True), 0)
    ext, api, _ = over(
        [node(n, annotations) for n in ("a", "b", "c")], arrivals=arrivals
    )
    assert ext.sharing is not None
    one = ShareRequest(MODE_SGPU, 1, 100, 0, True)
    # 6 free GPUs, 5 pods to come, 2-GPU ones Poisson with mean 1 for 3 homes
    assert poisson_tail(1.0, 3) < 0.2
    plenty = ext.sharing.place("a", one).raw
    assert plenty == pytest.approx(-0.2 * 100, abs=0.01)
    assert not bind(ext, api, pod("pb", "100"), "b")
    assert not bind(ext, api, pod("pc1", "100"), "c")
    assert not bind(ext, api, pod("pc2", "100"), "c")
    # 3 free GPUs, mean 0.5 for 1 home
    factor = _factor(poisson_tail(3 / 1.2 * 0.2, 1), 0.2)
    assert factor > 1.5
    scarce = ext.sharing.place("a", one).raw
    assert scarce == pytest.approx(-0.2 * 100 * factor, abs=0.01)
    # b's last GPU breaks no home: the same either way
    assert ext.sharing.place("b", one).raw > scarce


class DictRoom:
    """A ``share.RoomView`` over a dict: name -> free CPU millicores and memory MiB."""

    def __init__(self, free: dict[str, tuple[int | None, int | None]]) -> None:
        self.free = free
        self.changes = 0
        self.listeners: list[Any] = []

    def __call__(self, name: str) -> tuple[int | None, int | None]:
        return self.free.get(name, (None, None))

    def version(self) -> int:
        return self.changes

    def listen(self, callback: Any) -> None:
        self.listeners.append(callback)

    def set(self, name: str, room: tuple[int | None, int | None]) -> None:
        self.free[name] = room
        for callback in self.listeners:
            callback(name)
        self.changes += 1


def count_nodes(monkeypatch: pytest.MonkeyPatch, method: str) -> list[str]:
    """The nodes ``Sharing.<method>`` (first argument a node view) is called for, in
    order, from now until the monkeypatch is undone."""
    from gpuk8s.services.extender import share

    called: list[str] = []
    real = getattr(share.Sharing, method)

    def counted(self: Any, view: Any, *rest: Any) -> Any:
        called.append(view.name)
        return real(self, view, *rest)

    monkeypatch.setattr(share.Sharing, method, counted)
    return called


def touch_one(
    rng: Any, step: int, names: list[str], room: DictRoom, ledger: Ledger, sharing: Sharing,
    annotations: dict[str, str], cpus: tuple[int, ...], core: int,
) -> str:
    """One random change to one node -- its room (CPU from ``cpus``), a share of
    ``core`` percent booked or one released, or its view (exclusive or sharing) --
    and the node changed."""
    name = rng.choice(names)
    what = rng.randrange(4)
    if what == 0:
        room.set(name, (rng.choice(cpus), 65_536))
    elif what == 1:
        gpu = rng.randrange(2)
        ledger.set(f"u{step}", Assignment(name, (gpu,), ShareRequest(MODE_SGPU, 1, core, 0)))
    elif what == 2 and ledger.assignments():
        uid = rng.choice(sorted(ledger.assignments()))
        name = ledger.assignments()[uid].node
        ledger.release(uid)
    else:  # the node's view: exclusive, then back to sharing
        mode = rng.choice(("sgpu", None))
        sharing.nodes.observe(node_item(msgspec.json.decode(
            json.dumps(node(name, annotations, mode)), type=NodeView)))
    return name


def test_homes_recount_only_touched_nodes_and_match_a_full_count(
    annotations: dict[str, str],
) -> None:
    """The homes are recounted only for the nodes whose booking, view or room moved
    (``_Touched``), not when whole-GPU classes enter or leave the mix (arrivals of a
    short window); after any run of such changes they equal a count from scratch, and
    an unchanged node is not counted again."""
    import random

    from gpuk8s.services.extender import share

    rng = random.Random(11)
    names = [f"n{i}" for i in range(6)]
    arrivals = ArrivalMix(prior=(), window=12)
    for i in range(10):
        arrivals.observe(f"seen-{i}", ShareRequest(MODE_SGPU, 1 + i % 2, 100, 0, True), 8_000)
    room = DictRoom({n: (64_000, 65_536) for n in names})
    ext, _, ledger = over([node(n, annotations) for n in names], arrivals=arrivals,
                          free_room=room)
    sharing = ext.sharing
    assert sharing is not None
    counted: list[str] = []
    real = share.Sharing._recount

    def recount(self: Any, view: Any) -> bool:
        counted.append(view.name)
        return real(self, view)

    share.Sharing._recount = recount  # type: ignore[method-assign]
    try:
        sharing._scarce_mix()
        assert sorted(counted) == names  # the first count sees every node
        classes = set()
        for step in range(120):
            counted.clear()
            name = touch_one(rng, step, names, room, ledger, sharing, annotations,
                             (4_000, 16_000, 64_000), 100)
            for i in range(rng.randrange(4)):  # whole-GPU classes come and go
                arrivals.observe(f"a{step}-{i}", ShareRequest(
                    MODE_SGPU, rng.choice((1, 2)), 100, 0, True), rng.choice((8_000, 30_000)))
            factors, _ = sharing._scarce_mix()  # (mix version, scarcity factors), mix
            classes.add(sharing._homes.wholes)
            assert set(counted) <= {name}  # only the node touched
            fresh = Sharing(sharing.nodes, ledger, free_room=room, arrivals=arrivals)
            again, _ = fresh._scarce_mix()
            assert sharing._homes.totals == fresh._homes.totals, step
            assert sharing._homes.free == fresh._homes.free, step
            assert again == factors
        assert len(classes) >= 10  # the whole-GPU classes moved, and often
    finally:
        share.Sharing._recount = real  # type: ignore[method-assign]


def test_a_node_is_read_again_only_once_touched_and_answers_as_from_scratch(
    annotations: dict[str, str],
) -> None:
    """``_NodeKeys``: a request (a GPU pod's or one without GPUs) reads a node's free
    room and booked usage again only after the node was touched (its room, booking or
    view moved); after any run of such changes every node's placement and rank equal a
    fresh extender's."""
    import random

    from gpuk8s.services.extender import share

    rng = random.Random(5)
    names = [f"n{i}" for i in range(6)]
    room = DictRoom({n: (64_000, 65_536) for n in names})
    ext, _, ledger = over([node(n, annotations) for n in names], free_room=room)
    sharing = ext.sharing
    assert sharing is not None
    read: list[str] = []
    real = share.Sharing._node_entry

    def entry(self: Any, name: str, epoch: int) -> Any:
        read.append(name)
        return real(self, name, epoch)

    share.Sharing._node_entry = entry  # type: ignore[method-assign]
    try:
        requests = [HALF, ShareRequest(MODE_SGPU, 1, 30, 0), ShareRequest(MODE_SGPU, 1, 100, 0)]
        for share_request in requests:
            sharing.filter_parts(share_request, names, need=(2_000, 1_024))
        assert sorted(read) == names  # each node read once, whatever the request
        for step in range(60):
            read.clear()
            name = touch_one(rng, step, names, room, ledger, sharing, annotations,
                             (1_000, 16_000, 64_000), 40)
            request = rng.choice(requests)
            mixed = sharing._scarce_mix()
            got = sharing._placements(request, names, "", (2_000, 1_024), mixed)
            ranked = sharing.raw_nogpu(names, (3_000, 2_048))
            assert set(read) <= {name}, step  # only the node touched is read again
            fresh = Sharing(sharing.nodes, ledger, free_room=room, arrivals=sharing.arrivals)
            want = fresh._placements(request, names, "", (2_000, 1_024), fresh._scarce_mix())
            assert got == want, step
            assert ranked == fresh.raw_nogpu(names, (3_000, 2_048)), step
    finally:
        share.Sharing._node_entry = real  # type: ignore[method-assign]


def test_homes_kept_by_difference_equal_a_full_recount_at_every_step() -> None:
    """``_Homes`` keeps its totals by difference (a node's old state out, its new one
    in) and a change of the whole-GPU classes counts only the classes new to the mix,
    over the distinct states; after every one of 3,000 random steps -- counts, forgotten
    and kept nodes, classes appearing and leaving -- the totals and the free percent
    equal a recount of every node from scratch (``whole_homes`` over its free
    percents and room)."""
    import random

    from gpuk8s.core.sharing import Room, ShareMix, whole_homes, wholly_free
    from gpuk8s.services.extender import share

    rng = random.Random(53)
    pool = [(k, 100, cpu, memory) for k in (1, 2, 4, 8) for cpu in (0, 4_000, 24_000)
            for memory in (0, 65_536)]
    homes = _Homes()
    nodes: dict[str, tuple[tuple[int, ...], Room]] = {}
    wholes = tuple(rng.sample(pool, 3))
    homes.classes("v0", wholes)
    for step in range(3_000):
        name = f"n{rng.randrange(40)}"
        what = rng.randrange(10)
        if what == 0:  # the mix's whole-GPU classes move: some leave, some come
            offered = list(dict.fromkeys(
                [k for k in wholes if rng.random() < 0.6] + rng.sample(pool, 3)))
            wholes = tuple(rng.sample(offered, rng.randrange(min(len(offered), 5) + 1)))
            homes.classes(f"v{step}", wholes)
        elif what == 1:
            homes.forget(name)
            nodes.pop(name, None)
        elif what == 2:
            keep = {n for n in nodes if rng.random() < 0.9}
            homes.keep(keep)
            nodes = {n: v for n, v in nodes.items() if n in keep}
        else:  # a node counted in a new state (most often one other nodes share)
            free = tuple(rng.choice((0, 30, 100, 100)) for _ in range(rng.choice((1, 2, 8))))
            room = Room(rng.choice((None, 8_000, 32_000)), rng.choice((None, 131_072)))
            full = wholly_free(free)
            homes.count(name, step, sum(free),
                        (full, room.cpu, room.memory) if full else share.NO_HOMES)
            nodes[name] = (free, room)
            assert homes.at(name) == step
        mix = ShareMix({klass: 1.0 for klass in wholes})
        order = tuple(mix.classes[at][0] for at in mix.wholes)
        recount = [whole_homes(free, room, mix) for free, room in nodes.values()]
        want = {klass: sum(h[at] for h in recount) for at, klass in enumerate(order)}
        assert homes.wholes == wholes
        assert homes.totals == [want[klass] for klass in wholes], step
        assert homes.free == sum(sum(free) for free, _ in nodes.values()), step


def test_a_new_whole_gpu_class_is_counted_once_per_node_state(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A whole-GPU class new to the mix is counted over the distinct node states, once
    each, not over the nodes (the code before counted every node again for any change
    of the classes); the classes the mix keeps are not counted again, and a node that
    moves to a state already counted costs no count."""
    from gpuk8s.core.sharing import class_homes
    from gpuk8s.services.extender import share

    calls: list[tuple[Any, ...]] = []

    def counted(*args: Any) -> int:
        calls.append(args)
        return class_homes(*args)

    monkeypatch.setattr(share, "class_homes", counted)
    states = [(8, 64_000, 262_144), (4, 16_000, None), (1, None, None)]
    homes = _Homes()
    one, two = (1, 100, 4_000, 0), (2, 100, 8_000, 0)
    homes.classes("v1", (one,))
    for i in range(1_200):
        homes.count(f"n{i}", 0, 800, states[i % 3])
    homes.count("empty", 0, 30, share.NO_HOMES)
    assert len(calls) == 3  # one count per state and class
    calls.clear()
    homes.classes("v2", (two, one))
    assert sorted(call[-1] for call in calls) == [two] * 3
    assert homes.totals == [400 * (4 + 2 + 0), 400 * (8 + 4 + 1)]
    calls.clear()
    homes.count("n0", 1, 400, states[1])  # to a state counted already
    assert calls == []
    assert homes.totals == [400 * (4 + 2 + 0) - 4 + 2, 400 * (8 + 4 + 1) - 8 + 4]


def test_a_home_whose_cpu_is_taken_is_no_home(annotations: dict[str, str]) -> None:
    """One in five arriving pods asks 2 whole GPUs and 60 cores. While every node has
    the cores, each is a home and a 1-GPU pod on a strands one GPU for them (0.2 x
    100). Once pods without GPUs took the cores of b and c (the room moves), a is the
    only home for the 2-GPU pods that the 6 free GPUs draw (Poisson, mean 6 / 1.2 x
    0.2): breaking it costs more by ``whole_scarcity``'s factor."""
    arrivals = ArrivalMix(prior=())
    for i in range(10):
        arrivals.observe(
            f"seen-{i}", ShareRequest(MODE_SGPU, 2 if i < 2 else 1, 100, 0, True),
            60_000 if i < 2 else 0,
        )
    room = DictRoom(dict.fromkeys("abc", (128_000, None)))
    ext, _, _ = over([node(n, annotations) for n in "abc"], arrivals=arrivals, free_room=room)
    assert ext.sharing is not None
    one = ShareRequest(MODE_SGPU, 1, 100, 0, True)
    plenty = ext.sharing.place("a", one).raw
    room.set("b", (30_000, None))
    room.set("c", (30_000, None))
    factor = _factor(poisson_tail(6 / 1.2 * 0.2, 1), 0.2)
    assert factor > 2
    scarce = ext.sharing.place("a", one).raw
    assert scarce - plenty == pytest.approx(-0.2 * 100 * (factor - 1), abs=0.01)


def test_arrival_mix_is_retaken_once_when_threads_ask_at_once() -> None:
    """Re-taking the mix solves an LP: threads that found it stale while another was
    re-taking it use that one instead of solving again."""

    class Counted(ArrivalMix):
        takes = 0

        def _take(self) -> Any:
            Counted.takes += 1
            time.sleep(0.05)
            return super()._take()

    arrivals = Counted(prior=())
    start = Counted.takes
    for i in range(10):
        arrivals.observe(f"u{i}", HALF, 0)
    threads = [threading.Thread(target=arrivals.mix) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert Counted.takes == start + 1


def test_kept_nodes_are_echoed_byte_for_byte_on_the_sharing_path(
    annotations: dict[str, str],
) -> None:
    """Sharing, and sharing with a CUDA runtime: the kept Node objects are the
    request's own bytes (``wire.node_raws``), never re-encoded."""
    from .test_cuda import echoed, odd_nodes_body

    items = [node("a", annotations), node("x", annotations, None), node("b", annotations)]
    items[2]["metadata"]["labels"].update({"metax-tech.com/cuda-major-version": "11",
                                           "metax-tech.com/cuda-minor-version": "0"})
    ext, _, _ = over(items)
    body, raws = odd_nodes_body(pod("p1"), items)
    response = ext.handle("filter", body)
    assert response.status == 200 and echoed(response.body, [raws[0], raws[2]])
    assert "exclusive" in json.loads(response.body)["FailedAndUnresolvableNodes"]["x"]
    cuda_pod = pod("p2")
    cuda_pod["metadata"]["annotations"] = {"gpuk8s.io/cuda-runtime": "12.4"}
    body, raws = odd_nodes_body(cuda_pod, items)
    response = ext.handle("filter", body)
    assert response.status == 200 and echoed(response.body, [raws[0]])
    assert "CUDA 11.0" in json.loads(response.body)["FailedAndUnresolvableNodes"]["b"]


def test_nodes_of_one_shape_and_state_share_one_placement(annotations: dict[str, str]) -> None:
    """``Sharing._placements``: the nodes of one shape whose usage and room are equal
    are placed once per request and mix; a node whose booking moved is placed again;
    every answer is what ``_place`` gives that node alone."""
    from gpuk8s.core.sharing import Room
    from gpuk8s.services.extender import share

    names = [f"n{i}" for i in range(6)]
    ext, api, _ = over([node(n, annotations) for n in names])
    sharing = ext.sharing
    assert sharing is not None
    assert len({sharing.nodes.get(n).shape for n in names}) == 1  # type: ignore[union-attr]
    placed: list[str] = []
    real = share.Sharing._place
    fit = share.Sharing._fit

    def counted(self: Any, view: Any, *rest: Any) -> Any:
        placed.append(view.name)
        return fit(self, view, *rest)

    share.Sharing._fit = counted  # type: ignore[method-assign]
    try:
        sharing.raw(HALF, names)
        assert placed == ["n0"]  # six nodes, one shape and state: one placement
        assert bind(ext, api, pod("p1", "60"), "n3") == ""
        placed.clear()
        values = sharing.raw(HALF, names)
        # n3's booking moved it to a class of its own; the other five keep their
        # answers (memoised per node)
        assert placed == ["n3"]
    finally:
        share.Sharing._fit = fit  # type: ignore[method-assign]
    mix = sharing._scarce_mix()[1]
    alone = [real(sharing, sharing.nodes.get(n), n, HALF, "", Room(None, None), mix)
             for n in names]
    assert values == [p.raw if p.gpus is not None else None for p in alone]
    assert values[3] != values[0]  # the half-booked GPU ranks otherwise


def test_prioritize_takes_the_filters_placements_while_nothing_moves(
    annotations: dict[str, str],
) -> None:
    """``Sharing.raw`` right after the pod's ``filter_parts`` places no node again; once
    the ledger moves, it places every node afresh; the values are the same either way."""
    from gpuk8s.services.extender import share

    names = ["a", "b", "c"]
    ext, api, _ = over([node(n, annotations) for n in names])
    sharing = ext.sharing
    assert sharing is not None
    placed: list[str] = []
    real = share.Sharing._placements

    def counted(self: Any, request: Any, names: list[str], *rest: Any) -> Any:
        placed.extend(names)
        return real(self, request, names, *rest)

    share.Sharing._placements = counted  # type: ignore[method-assign]
    try:
        sharing.filter_parts(HALF, names, "uid-p2")
        placed.clear()
        first = sharing.raw(HALF, names, "uid-p2")
        assert placed == []  # the filter's answers
        assert sharing.raw(HALF, names, "uid-other") == first and placed == names
        assert bind(ext, api, pod("p1", "60"), "b") == ""
        placed.clear()
        moved = sharing.raw(HALF, names, "uid-p2")
        assert placed == names  # the ledger moved: placed again
    finally:
        share.Sharing._placements = real  # type: ignore[method-assign]
    assert moved[1] != first[1]  # b now holds a 60 % share


def test_pods_without_gpus_rank_nodes_of_one_state_once(
    annotations: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Sharing._nogpu_class_value``: nodes whose free GPUs, CPU and memory are equal
    are filled with the mix once per pod and mix, whatever their names; a node whose
    booking moved is filled again; the ranks are those of an extender that never saw
    the nodes before."""
    from gpuk8s.core.sharing import filled
    from gpuk8s.services.extender import share

    names = [f"n{i}" for i in range(6)]
    free = {n: (32_000, 65_536) for n in names}
    arrivals = ArrivalMix()
    for i in range(10):
        arrivals.observe(f"s{i}", HALF, 8000, 1024)
    ext, api, _ = over([node(n, annotations) for n in names],
                       free_room=lambda name: free[name], arrivals=arrivals)
    sharing = ext.sharing
    assert sharing is not None
    fills: list[tuple[int, ...]] = []
    real = filled

    def counted(gpus: Any, *rest: Any) -> Any:
        fills.append(tuple(gpus))
        return real(gpus, *rest)

    monkeypatch.setattr(share, "filled", counted)
    assert sharing.raw_nogpu(names, (4000, 1024)) == [0.0] * 6
    assert len(fills) == 1  # six nodes, one state: filled once
    assert bind(ext, api, pod("p1", "60"), "n3") == ""
    fills.clear()
    ranked = sharing.raw_nogpu(names, (2000, 512))
    assert fills == [(40, 100)]  # only n3's new state; the others' base is kept
    monkeypatch.undo()
    fresh = share.Sharing(sharing.nodes, sharing.ledger, free_room=lambda name: free[name],
                          arrivals=arrivals)
    assert ranked == fresh.raw_nogpu(names, (2000, 512))
    assert ranked[3] != ranked[0]


def test_a_filter_looks_up_what_all_nodes_share_once(
    annotations: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Sharing._placements``: the pod's own assignment is looked up once per request,
    not once per node, and each node's answer is still what ``place`` gives it alone
    (the node holding the pod's own share placed without it)."""
    names = [f"n{i}" for i in range(6)]
    ext, api, ledger = over([node(n, annotations) for n in names])
    sharing = ext.sharing
    assert sharing is not None
    assert bind(ext, api, pod("p1", "60"), "n2") == ""
    uid = "uid-p1"
    assert ledger.get(uid) is not None and ledger.get(uid).node == "n2"  # type: ignore[union-attr]
    looked: list[str] = []
    real = ledger.get

    def counted(key: str) -> Any:
        looked.append(key)
        return real(key)

    monkeypatch.setattr(ledger, "get", counted)
    keep, failed, unresolvable = sharing.filter_parts(HALF, names, uid)
    assert looked == [uid]  # six nodes, one lookup
    monkeypatch.undo()
    assert keep == names and not failed and not unresolvable
    from gpuk8s.services.extender import share

    alone = [sharing.place(n, HALF, uid) for n in names]
    fresh = share.Sharing(sharing.nodes, ledger, arrivals=sharing.arrivals)
    assert alone == [fresh.place(n, HALF, uid) for n in names]
    assert sharing.raw(HALF, names, uid) == [p.raw for p in alone]
    # n2 without the pod's own share is as empty as the others
    assert alone[2] == alone[0]


def test_homes_are_counted_once_per_node_state(
    annotations: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Sharing._recount``: nodes whose wholly free GPUs, CPU and memory are equal
    count the same homes per whole-GPU class, computed once per class; the scarcity
    mix is the one an extender that counted every node alone gives."""
    from gpuk8s.core.sharing import class_homes
    from gpuk8s.services.extender import share

    names = [f"n{i}" for i in range(6)]
    free = {n: (32_000, 65_536) for n in names}
    arrivals = ArrivalMix()
    for i in range(10):
        arrivals.observe(f"w{i}", ShareRequest(MODE_SGPU, 1, 100, 0), 8000, 1024)
    ext, _, ledger = over([node(n, annotations) for n in names],
                            free_room=lambda name: free[name], arrivals=arrivals)
    sharing = ext.sharing
    assert sharing is not None
    counted: list[tuple[Any, ...]] = []

    def homes(*args: Any) -> int:
        counted.append(args)
        return class_homes(*args)

    monkeypatch.setattr(share, "class_homes", homes)
    mixed = sharing._scarce_mix()
    wholes = sharing._homes.wholes
    assert wholes  # six nodes, one state: counted once per class
    assert sorted(counted) == sorted((2, 32_000, 65_536, klass) for klass in wholes)
    monkeypatch.undo()
    fresh = share.Sharing(sharing.nodes, ledger, free_room=lambda name: free[name],
                          arrivals=arrivals)
    assert fresh._scarce_mix() == mixed


def test_homes_stay_counted_while_the_mix_keeps_its_whole_gpu_classes(
    annotations: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``_Homes``: a node's homes read only the mix's whole-GPU classes, so a new mix
    version with the same classes (fractional arrivals moved it) counts nothing again,
    and one with another whole-GPU class counts only that class, once per node state,
    reading no node again (the code before counted every node); the factors are a
    fresh extender's either way."""
    from gpuk8s.core.sharing import class_homes
    from gpuk8s.services.extender import share

    names = [f"n{i}" for i in range(6)]
    room = DictRoom({n: (8_000 * (1 + i % 3), 65_536) for i, n in enumerate(names)})
    arrivals = ArrivalMix(prior=())
    for i in range(20):
        arrivals.observe(f"w{i}", ShareRequest(MODE_SGPU, 1 + i % 2, 100, 0, True), 8_000)
    ext, _, ledger = over([node(n, annotations) for n in names], arrivals=arrivals,
                          free_room=room)
    sharing = ext.sharing
    assert sharing is not None
    first = sharing._scarce_mix()
    before = sharing._homes.wholes
    counted: list[tuple[Any, ...]] = []

    def homes(*args: Any) -> int:
        counted.append(args)
        return class_homes(*args)

    monkeypatch.setattr(share, "class_homes", homes)
    recounted = count_nodes(monkeypatch, "_recount")
    for i in range(10):  # fractional pods only: the mix moves, its whole classes do not
        arrivals.observe(f"s{i}", ShareRequest(MODE_SGPU, 1, 10 + 5 * i, 0), 1_000)
    moved = sharing._scarce_mix()
    assert moved[0][0] != first[0][0]  # a new mix version
    assert recounted == [] and counted == []
    fresh = Sharing(sharing.nodes, ledger, free_room=room, arrivals=arrivals)
    assert fresh._scarce_mix()[0] == moved[0]
    assert fresh._homes.totals == sharing._homes.totals
    recounted.clear()  # the fresh extender's counts
    counted.clear()
    for i in range(10):  # a whole-GPU class the mix did not have
        arrivals.observe(f"q{i}", ShareRequest(MODE_SGPU, 2, 100, 0, True), 16_000)
    again = sharing._scarce_mix()
    new = [klass for klass in sharing._homes.wholes if klass not in before]
    assert new == [(2, 100, 16_000, 0)]
    assert recounted == []  # no node read again
    assert sorted(counted) == sorted((2, cpu, 65_536, new[0])
                                     for cpu in (8_000, 16_000, 24_000))  # 3 states
    fresh = Sharing(sharing.nodes, ledger, free_room=room, arrivals=arrivals)
    assert fresh._scarce_mix()[0] == again[0]
    assert fresh._homes.totals == sharing._homes.totals


def test_a_node_usage_is_read_once_per_ledger_version(
    annotations: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Sharing._usage``: placing requests of many shapes on unchanged nodes reads each
    node's booked usage from the ledger once (not once per placement), and again once
    after a booking there; every answer stays a fresh extender's."""
    names = [f"n{i}" for i in range(3)]
    ext, api, ledger = over([node(n, annotations) for n in names])
    sharing = ext.sharing
    assert sharing is not None
    assert bind(ext, api, pod("p1", "60"), "n1") == ""
    read: list[str] = []
    real = ledger.usage

    def usage(name: str, *rest: Any, **options: Any) -> Any:
        read.append(name)
        return real(name, *rest, **options)

    monkeypatch.setattr(ledger, "usage", usage)
    requests = [ShareRequest(MODE_SGPU, 1, pct, 0) for pct in (10, 20, 30, 40, 50)]
    for need in ((1_000, 512), (2_000, 1_024), (3_000, 2_048)):
        for request in requests:
            sharing.filter_parts(request, names, need=need)
    assert read and len(read) == len(set(read))  # no node twice (n1 since its booking)
    monkeypatch.undo()
    assert bind(ext, api, pod("p2", "30"), "n2") == ""
    monkeypatch.setattr(ledger, "usage", usage)
    read.clear()
    got = [sharing.place(n, HALF, cpu_milli=1_000) for n in names]
    assert read == ["n2"]
    monkeypatch.undo()
    fresh = Sharing(sharing.nodes, ledger)
    assert got == [fresh.place(n, HALF, cpu_milli=1_000) for n in names]


def test_rooms_that_fall_alike_share_one_fit_and_answer_as_alone(
    annotations: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Sharing._place_shared``: nodes of one shape and usage whose free CPU and memory
    fall alike among the values the mix's classes ask (``ShareMix.room_key``) share one
    ``_fit``, whatever the pod's CPU and memory; on random rooms, pods and bookings
    every answer equals ``_place`` for that node alone (CPU balance included)."""
    import random

    from gpuk8s.core.sharing import Room

    rng = random.Random(3)
    names = [f"n{i}" for i in range(8)]
    arrivals = ArrivalMix(prior=())
    for i in range(12):
        arrivals.observe(f"a{i}", ShareRequest(MODE_SGPU, 1 + i % 2, 100 if i % 3 else 40, 0,
                                               bool(i % 3)), 4_000 * (1 + i % 4), 8_192 * (i % 3))
    free = {n: (rng.randrange(0, 64_000), rng.randrange(0, 65_536)) for n in names}
    room = DictRoom(free)
    ext, api, _ = over([node(n, annotations) for n in names], arrivals=arrivals,
                       free_room=room)
    sharing = ext.sharing
    assert sharing is not None
    fits = count_nodes(monkeypatch, "_fit")
    for name in names:  # every room in one place among the classes' values
        room.set(name, (60_000 + rng.randrange(3_000), 70_000 + rng.randrange(1_000)))
    for cpu in (1_000, 1_200, 1_300):  # and pods whose rooms after fall alike too
        sharing.filter_parts(HALF, names, need=(cpu, 512))
    assert fits == ["n0"]  # one shape, usage and room place: one fit
    requests = [HALF, ShareRequest(MODE_SGPU, 1, 30, 0), ShareRequest(MODE_SGPU, 1, 100, 0, True),
                ShareRequest(MODE_SGPU, 2, 100, 0, True)]
    for step in range(40):
        name = rng.choice(names)
        room.set(name, (rng.randrange(0, 64_000), rng.randrange(0, 65_536)))
        if step % 5 == 4:
            bind(ext, api, pod(f"p{step}", "30"), rng.choice(names))
        request = rng.choice(requests)
        need = (rng.randrange(0, 16_000), rng.randrange(0, 16_384))
        mixed = sharing._scarce_mix()
        got = sharing._placements(request, names, "", need, mixed)
        for n in names:
            cpu, memory = free[n]
            alone = sharing._place(sharing.nodes.get(n), n, request, "",
                                   Room(cpu, memory, *need), mixed[1])
            assert got[n] == alone, (step, n)


def test_a_pods_filter_and_prioritize_parse_its_requests_once(
    annotations: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``demand.PodDemands``: kube-scheduler sends one version of a pod to filter, then to
    prioritize; its requests are parsed once (by UID and resourceVersion), again for a
    new version, and every time for a pod without a resourceVersion; the answers are
    those of an extender that parses every request."""
    from gpuk8s.services.extender import demand

    parsed: list[str] = []
    real = demand.pod_totals

    def counted(view: Any, *rest: Any) -> Any:
        parsed.append(view.metadata.resourceVersion)
        return real(view, *rest)

    monkeypatch.setattr(demand, "pod_totals", counted)

    items = [node("a", annotations), node("b", annotations), node("x", annotations, None)]

    def answers(ext: Extender, p: dict[str, Any]) -> tuple[Any, Any]:
        status, filtered = call(ext, "filter", {"Pod": p, "Nodes": {"items": items}})
        assert status == 200, filtered
        kept = filtered["Nodes"]["items"]
        status, ranked = call(ext, "prioritize", {"Pod": p, "Nodes": {"items": kept}})
        assert status == 200, ranked
        return filtered, ranked

    def made() -> Extender:
        ext, api, _ = setup(annotations)
        assert bind(ext, api, pod("p0", "60"), "a") == ""  # a and b rank apart
        parsed.clear()
        return ext

    ext = made()
    first = pod("p1", "40")
    got = answers(ext, first)
    assert parsed == ["1"]  # the code before: once per request
    second = pod("p1", "100")  # the same pod after a change: a new version
    second["metadata"]["resourceVersion"] = "2"  # two whole GPUs: a has one left
    second["spec"]["containers"][0]["resources"]["limits"]["metax-tech.com/sgpu"] = "2"
    got2 = answers(ext, second)
    assert parsed == ["1", "2"]
    unversioned = pod("p1", "40")
    del unversioned["metadata"]["resourceVersion"]
    got3 = answers(ext, unversioned)
    assert parsed == ["1", "2", None, None]
    assert got2 != got  # another share, another answer
    for p, want in ((first, got), (second, got2), (unversioned, got3)):
        fresh = made()
        fresh.demands = demand.PodDemands(bound=0)  # nothing kept: every request parsed
        assert answers(fresh, p) == want
        assert len(parsed) == 2


def test_each_node_keeps_its_class_placement_when_the_memo_starts_over(
    annotations: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Sharing._placements`` when the class memo starts over within one request
    (``MAX_MEMO``) and after: every node still gets its own class's placement, the
    one a sharing with a memo that never starts over gives it."""
    from gpuk8s.services.extender import share

    names = [f"n{i}" for i in range(8)]
    ext, api, ledger = over([node(n, annotations) for n in names])
    sharing = ext.sharing
    assert sharing is not None
    for at, name in enumerate(names[:4]):  # four booked states and the empty one
        assert bind(ext, api, pod(f"p{at}", str(20 + 10 * at)), name) == ""
    every = [*reversed(names), "gone"]  # one without a view
    want = share.Sharing(sharing.nodes, ledger, arrivals=sharing.arrivals)._placements(
        HALF, every, "uid-p1", (0, 0), sharing._scarce_mix())
    cleared: list[int] = []

    class Memo(dict[Any, Any]):
        def clear(self) -> None:
            cleared.append(len(self))
            super().clear()

    monkeypatch.setattr(share, "MAX_MEMO", 3)
    sharing._by_class = Memo()
    for _ in range(2):  # placed, then (the memo small) placed again in part
        got = sharing._placements(HALF, every, "uid-p1", (0, 0), sharing._scarce_mix())
        assert got == want
    assert len(cleared) >= 2  # it started over within each request
    assert len({p.raw for p in want.values() if p.gpus is not None}) >= 3  # apart
    assert want["gone"].gpus is None


def test_a_kept_frame_is_weighed_again_for_each_mix_and_node_state(
    annotations: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Sharing._frame`` (what ``_fit`` reads that no mix weighs) is kept per shape,
    usage and share, and ``_fragmentation``'s answers per mix version: while the mix
    moves (bursts of arrivals re-take it) and bookings and rooms move, every answer of
    ``_placements`` equals ``_place`` from scratch for that node alone, a frame is made
    far less often than a fit weighs one, and the same node state and request get
    other answers under other mixes (so an answer kept for another mix, or for another
    usage, is caught)."""
    import random

    from gpuk8s.core.sharing import Room

    rng = random.Random(5)
    names = [f"n{i}" for i in range(6)]
    arrivals = ArrivalMix(prior=())
    room = DictRoom({n: (32_000, 65_536) for n in names})
    ext, _, ledger = over([node(n, annotations) for n in names], arrivals=arrivals,
                          free_room=room)
    sharing = ext.sharing
    assert sharing is not None
    frames = count_nodes(monkeypatch, "_frame")
    fits = count_nodes(monkeypatch, "_fit")
    requests = [HALF, ShareRequest(MODE_SGPU, 1, 30, 0), ShareRequest(MODE_SGPU, 1, 70, 0),
                ShareRequest(MODE_SGPU, 1, 100, 0, True),
                ShareRequest(MODE_SGPU, 2, 100, 0, True), ShareRequest(MODE_SGPU, 2, 40, 0)]
    classes = [(1, 20), (1, 30), (1, 50), (1, 70), (1, 100), (2, 100), (2, 40)]
    seen: dict[tuple[Any, ...], set[Any]] = {}
    made = weighed = 0
    for step in range(80):
        k, pct = rng.choice(classes)  # a burst of one class: the mix moves
        for i in range(rng.randrange(1, 8)):
            arrivals.observe(f"a{step}-{i}", ShareRequest(MODE_SGPU, k, pct, 0, pct == 100),
                             rng.choice((0, 4_000, 16_000)))
        name = rng.choice(names)
        if step % 4 == 1:
            ledger.set(f"u{step}", Assignment(name, (rng.randrange(2),),
                                              ShareRequest(MODE_SGPU, 1, rng.choice((20, 50)),
                                                           0)))
        elif step % 4 == 3 and ledger.assignments():
            ledger.release(rng.choice(sorted(ledger.assignments())))
        elif step % 4 == 2:
            room.set(name, (rng.choice((4_000, 32_000)), 65_536))
        request = rng.choice(requests)
        need = (rng.choice((0, 2_000, 8_000)), 0)
        mixed = sharing._scarce_mix()
        frames.clear()
        fits.clear()
        got = sharing._placements(request, names, "", need, mixed)
        made += len(frames)
        weighed += len(fits)
        for n in names:
            alone = sharing._place(sharing.nodes.get(n), n, request, "",
                                   Room(*room(n), *need), mixed[1])
            assert got[n] == alone, (step, n)
            state = (n, ledger.version(n), room(n), request, need)
            seen.setdefault(state, set()).add((mixed[0], got[n]))
    assert weighed > 3 * made  # kept frames weighed again
    # node states answered under several mixes, with other answers
    moved = [s for s, answers in seen.items() if len({a for _, a in answers}) > 1]
    assert len(moved) >= 5, len(moved)
