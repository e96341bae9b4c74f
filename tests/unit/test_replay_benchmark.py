"""benchmarks/replay.py's parts that need no lab: what the fake nodes publish, the pods'
requests, the scheduler configuration, the latency quantiles, the checker's rules and the
fake kubelet driving gpu-device's Allocate code (tests/e2e/test_replay_smoke.py runs the
whole replay on the lab)."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gpuk8s.core.sharing import (
    ASSIGNED_ANNOTATION,
    BIND_TIME_ANNOTATION,
    MODE_VCUDA,
    PHASE_ALLOCATED,
    PHASE_ALLOCATING,
    PHASE_ANNOTATION,
    SHARING_MODE_LABEL,
    VCUDA_CORE_RESOURCE,
    Assignment,
    ShareRequest,
)

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import replay  # noqa: E402  (benchmarks/replay.py)


@pytest.fixture(scope="module")
def shapes() -> dict[int, Any]:
    return replay.shapes()


def test_nodes_publish_what_gpu_device_publishes_in_vcuda_mode(shapes: dict[int, Any]) -> None:
    dense = replay.packing.NodeSpec("OpenB-Node-1", 96_000, 393_216, 8)  # 12 cores per GPU
    roomy = replay.packing.NodeSpec("openb-node-2", 104_000, 524_288, 2)  # 52 per GPU
    node = replay.node_object(dense, shapes[8], "r1", 20)
    assert node["metadata"]["name"] == "openb-node-1"
    assert node["metadata"]["labels"][SHARING_MODE_LABEL] == MODE_VCUDA
    assert node["metadata"]["labels"][replay.RUN_LABEL] == "r1"
    assert node["metadata"]["annotations"] == shapes[8].annotations
    allocatable = node["status"]["allocatable"]
    assert allocatable[VCUDA_CORE_RESOURCE] == "800"
    assert (allocatable["cpu"], allocatable["memory"]) == ("96000m", "393216Mi")
    assert replay.GPU_TAINT in node["spec"]["taints"]
    other = replay.node_object(roomy, shapes[2], "r1", 20)
    assert replay.GPU_TAINT not in other["spec"]["taints"]
    assert replay.GPU_TAINT not in replay.node_object(dense, shapes[8], "r1", 0)["spec"]["taints"]
    # the shapes packing.py places on: c500-8 has two link groups of four
    assert shapes[8].inside_one_group((0, 1, 2, 3)) and not shapes[8].inside_one_group((3, 4))


def test_pods_ask_what_packing_py_asks() -> None:
    fraction = replay.packing.PodSpec("a", 6000, 12288, 1, 460)
    whole = replay.packing.PodSpec("b", 8000, 1024, 4, 1000)
    cpu_only = replay.packing.PodSpec("c", 4000, 0, 0, 0)
    req = replay.pod_object("f1", fraction, "r1", "fill")["spec"]["containers"][0]["resources"]
    assert req["limits"] == {VCUDA_CORE_RESOURCE: "46"}
    assert req["requests"] == {"cpu": "6000m", "memory": "12288Mi", VCUDA_CORE_RESOURCE: "46"}
    pod = replay.pod_object("f2", whole, "r1", "churn", node="n1")
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {VCUDA_CORE_RESOURCE: "400"}
    assert pod["spec"]["nodeSelector"] == {replay.RUN_LABEL: "r1", "kubernetes.io/hostname": "n1"}
    assert pod["spec"]["schedulerName"] == replay.SCHEDULER_NAME
    plain = replay.pod_object("f3", cpu_only, "r1", "fill")["spec"]["containers"][0]["resources"]
    assert "limits" not in plain and VCUDA_CORE_RESOURCE not in plain["requests"]


def test_scheduler_configuration_is_the_roles(tmp_path: Path) -> None:
    import json

    import yaml

    replay.scheduler_config(tmp_path / "s.json", "http://127.0.0.1:1")
    cfg = json.loads((tmp_path / "s.json").read_text())
    role = yaml.safe_load(replay.ROLE_DEFAULTS.read_text())
    assert role["gpu_aware_rank_pods_without_gpus"] is True  # the role's default: two entries
    ext, nogpu = cfg["extenders"]
    assert nogpu["prioritizeVerb"] == "prioritize-nogpu" and nogpu["ignorable"] is True
    assert "managedResources" not in nogpu and "filterVerb" not in nogpu
    assert ext["bindVerb"] == "bind" and ext["nodeCacheCapable"] is True
    assert ext["weight"] == role["gpu_aware_weight"] and ext["ignorable"] is False
    assert [r["name"] for r in ext["managedResources"]] == [
        r["name"] for r in role["gpu_aware_managed_resources"]
    ]
    assert cfg["percentageOfNodesToScore"] == 100
    assert cfg["profiles"][0]["schedulerName"] == replay.SCHEDULER_NAME
    # --alone: the same profile, no extender, a scheduler of its own name
    replay.scheduler_config(tmp_path / "a.json", "http://127.0.0.1:1", extender=False)
    alone = json.loads((tmp_path / "a.json").read_text())
    assert "extenders" not in alone
    assert alone["profiles"][0]["schedulerName"] == "gpuk8s-replay-alone"
    assert {k: v for k, v in alone["profiles"][0].items() if k != "schedulerName"} == {
        k: v for k, v in cfg["profiles"][0].items() if k != "schedulerName"}
    assert alone["percentageOfNodesToScore"] == 100


def test_quantiles_as_prometheus_interpolates() -> None:
    text = "\n".join(
        f'gpu_aware_request_seconds_bucket{{verb="filter",le="{le}"}} {n}'
        for le, n in (("0.001", 10), ("0.005", 50), ("0.01", 90), ("+Inf", 100))
    )
    before = 'gpu_aware_request_seconds_bucket{verb="filter",le="0.001"} 10'
    figures = replay.latency_figures(before, text)
    assert figures["filter"]["count"] == 100
    assert figures["filter"]["p50_ms"] == pytest.approx(5.0)  # 0.001 + 0.004 x 40/40
    assert figures["filter"]["p99_ms"] == pytest.approx(10.0)  # in +Inf: the lower bound
    assert figures["bind"]["p50_ms"] is None


def share(core: int, whole: bool = False, gpus: int = 1) -> ShareRequest:
    return ShareRequest(MODE_VCUDA, gpus, 100 if whole else core, 0, whole=whole)


def test_over_booked_gpus() -> None:
    ok = [Assignment("n", (0,), share(60)), Assignment("n", (0,), share(40)),
          Assignment("n", (1, 2), share(100, True, 2))]  # fmt: skip
    assert replay.over_booked(ok) == []
    assert replay.over_booked([*ok, Assignment("n", (0,), share(1))]) == ["n/0"]
    assert replay.over_booked([*ok, Assignment("n", (2,), share(10))]) == ["n/2"]  # whole


class FakeApi:
    """Pods by name (what a node's pod list answers); patches recorded."""

    def __init__(self) -> None:
        self.patches: list[tuple[str, Any]] = []
        self.pods: dict[str, dict[str, Any]] = {}

    def request(self, method: str, path: str, body: Any = None, kind: str = "") -> Any:
        if method == "GET":
            node = path.rsplit("spec.nodeName%3D", 1)[1]
            return 200, {"items": [p for p in self.pods.values() if p["spec"]["nodeName"] == node]}
        self.patches.append((path, body))
        return 200, {}


def bound_pod(name: str, uid: str, a: Assignment, since: int) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": uid, "namespace": replay.NS, "labels": {},
                     "resourceVersion": "1",
                     "annotations": {ASSIGNED_ANNOTATION: a.to_json(),
                                     PHASE_ANNOTATION: PHASE_ALLOCATING,
                                     BIND_TIME_ANNOTATION: str(since)}},
        # the request the assignment answers (gpu-device serves a pod no more than it asks)
        "spec": {"nodeName": a.node, "containers": [{"name": "main", "resources": {"limits": {
            "tencent.com/vcuda-core": str(a.share.core * a.share.gpus)}}}]},
        "status": {},
    }  # fmt: skip


def test_fake_kubelet_runs_allocate_and_gives_ids_back(shapes: dict[int, Any]) -> None:
    api = FakeApi()
    cluster = replay.Cluster(api)  # type: ignore[arg-type]
    kubelet = replay.FakeKubelet(api, cluster, {"n1": shapes[8]})  # type: ignore[arg-type]
    a = Assignment("n1", (2,), share(46))
    b = Assignment("n1", (4, 5), share(100, True, 2))
    api.pods = {"p1": bound_pod("p1", "u1", a, 1), "p2": bound_pod("p2", "u2", b, 2)}
    with cluster.cond:
        for pod in api.pods.values():
            cluster._apply("ADDED", pod)
    deadline = time.monotonic() + 10
    while len(kubelet.view()) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert kubelet.view() == {"u1": ("p1", "n1", (2,)), "u2": ("p2", "n1", (4, 5))}, kubelet.errors
    allocated = {"metadata": {"annotations": {PHASE_ANNOTATION: PHASE_ALLOCATED}}}
    marked = {path.rsplit("/", 1)[1] for path, body in api.patches if body == allocated}
    assert marked == {"p1", "p2"}
    assert len(kubelet.free["n1"]) == 800 - 46 - 200
    with cluster.cond:
        cluster._apply("DELETED", api.pods.pop("p1"))
    assert set(kubelet.view()) == {"u2"} and len(kubelet.free["n1"]) == 800 - 200
    assert not kubelet.errors
    kubelet.close()


def test_the_watch_records_decisions_once() -> None:
    cluster = replay.Cluster(FakeApi())  # type: ignore[arg-type]
    pending = {"metadata": {"name": "p", "uid": "u", "resourceVersion": "1"}, "spec": {},
               "status": {"conditions": [{"type": "PodScheduled", "status": "False",
                                          "reason": "Unschedulable",
                                          "lastTransitionTime": "t1"}]}}  # fmt: skip
    with cluster.cond:
        cluster._apply("ADDED", pending)
        first = cluster.unschedulable_at["p"]
        cluster._apply("MODIFIED", {**pending, "spec": {"nodeName": "n"}})
        cluster._apply("DELETED", pending)
    assert cluster.unschedulable_at["p"] == first and "p" in cluster.bound_at
    assert "p" in cluster.gone_at and "p" not in cluster.pods


def test_waiters_return_when_the_watch_is_closed() -> None:
    """The clean-up closes the watch first: a load pod's waiter (its 120 s for a decision
    no event will bring now) returns at once, undecided (the e2e smoke's clean-up waited
    out those timeouts: 111 of its 139 s)."""
    cluster = replay.Cluster(FakeApi())  # type: ignore[arg-type]
    results: list[bool] = []
    waiter = threading.Thread(target=lambda: results.append(cluster.wait(lambda: False, 600)),
                              daemon=True)
    waiter.start()
    cluster.close()
    waiter.join(60)
    assert not waiter.is_alive() and results == [False]
    assert cluster.wait(lambda: True, 600) is True  # what holds still says so
