"""gpu_pod_eviction: which pods are GPU pods, and the 429 / 404 / wait loop."""

from __future__ import annotations

from typing import Any

import pytest

from gpuk8s.ansible import eviction as ev


def pod(name: str, resources: dict[str, Any] | None = None, *, owner: str | None = None,
        phase: str = "Running", mirror: bool = False, init: bool = False) -> dict[str, Any]:
    container = {"name": "c", "resources": resources or {}}
    meta: dict[str, Any] = {"name": name, "namespace": "ml", "uid": f"uid-{name}"}
    if owner:
        meta["ownerReferences"] = [{"kind": owner, "name": "x"}]
    if mirror:
        meta["annotations"] = {"kubernetes.io/config.mirror": "abc"}
    spec = {"initContainers" if init else "containers": [container]}
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


GPU = {"limits": {"metax-tech.com/gpu": "2"}}


def test_gpu_pods_selection() -> None:
    pods = [
        pod("train", GPU),
        pod("web", {"limits": {"cpu": "1"}}),
        pod("plugin", GPU, owner="DaemonSet"),
        pod("done", GPU, phase="Succeeded"),
        pod("static", GPU, mirror=True),
        pod("init-gpu", {"requests": {"metax-tech.com/gpu": "1"}}, init=True),
        pod("job", GPU, owner="Job"),
    ]
    assert [p.name for p in ev.gpu_pods(pods)] == ["init-gpu", "job", "train"]
    assert ev.gpu_pods(pods, ["nvidia.com/"]) == []


class FakeCluster:
    """Pods that go away when evicted; a PDB refuses the first ``refusals`` evictions."""

    def __init__(self, pods: list[ev.PodRef], refusals: int = 0) -> None:
        self.alive = {p: p.uid for p in pods}
        self.refusals = refusals
        self.now = 0.0
        self.calls: list[str] = []

    def evict(self, pod: ev.PodRef) -> tuple[int, str]:
        self.calls.append(str(pod))
        if pod not in self.alive:
            return 404, "not found"
        if self.refusals > 0:
            self.refusals -= 1
            return 429, "Cannot evict pod as it would violate the pod's disruption budget."
        del self.alive[pod]
        return 201, ""

    def current(self, pod: ev.PodRef) -> str | None:
        return self.alive.get(pod)

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_retries_on_429_then_succeeds() -> None:
    pods = ev.gpu_pods([pod("a", GPU), pod("b", GPU)])
    cluster = FakeCluster(pods, refusals=3)
    log = ev.evict_all(pods, cluster.evict, cluster.current, timeout=60,
                       clock=lambda: cluster.now, sleep=cluster.sleep)
    assert cluster.alive == {}
    assert sorted(line for line in log if line.startswith("evicted")) == [
        "evicted ml/a", "evicted ml/b"]
    assert cluster.now == 10.0  # two 5 s waits while the budget refused


def test_times_out_naming_the_blocked_pods() -> None:
    pods = ev.gpu_pods([pod("a", GPU)])
    cluster = FakeCluster(pods, refusals=1000)
    with pytest.raises(ev.EvictionError, match=r"ml/a: Cannot evict pod"):
        ev.evict_all(pods, cluster.evict, cluster.current, timeout=30,
                     clock=lambda: cluster.now, sleep=cluster.sleep)
    assert cluster.alive  # nothing was deleted behind the budget's back


def test_already_gone_and_replaced_pods_count_as_done() -> None:
    pods = ev.gpu_pods([pod("a", GPU)])
    cluster = FakeCluster([])
    assert ev.evict_all(pods, cluster.evict, cluster.current, timeout=5,
                        clock=lambda: cluster.now, sleep=cluster.sleep) == ["ml/a already gone"]
    replaced = FakeCluster(pods)
    replaced.evict = lambda p: (201, "")  # type: ignore[method-assign]
    replaced.alive[pods[0]] = "another-uid"  # the controller made a new pod with that name
    ev.evict_all(pods, replaced.evict, replaced.current, timeout=5,
                 clock=lambda: replaced.now, sleep=replaced.sleep)


def test_other_errors_stop_at_once() -> None:
    pods = ev.gpu_pods([pod("a", GPU)])
    with pytest.raises(ev.EvictionError, match="HTTP 403"):
        ev.evict_all(pods, lambda p: (403, "forbidden"), lambda p: p.uid, timeout=5,
                     sleep=lambda s: None)


# ------------------------------------------------------------- kubectl drain's refusals


def managed(obj: dict[str, Any], kind: str = "ReplicaSet") -> dict[str, Any]:
    obj["metadata"]["ownerReferences"] = [{"kind": kind, "name": "x", "controller": True}]
    return obj


def with_emptydir(obj: dict[str, Any]) -> dict[str, Any]:
    obj["spec"]["volumes"] = [{"name": "scratch", "emptyDir": {}}]
    return obj


def test_unmanaged_and_emptydir_pods_are_refused_like_kubectl_drain() -> None:
    pods = [managed(pod("train", GPU)), pod("bare", GPU), with_emptydir(managed(pod("cache", GPU))),
            pod("web", {"limits": {"cpu": "1"}})]  # not a GPU pod: none of our business
    selection = ev.select(pods)
    assert [p.name for p in selection.pods] == ["bare", "cache", "train"]
    with pytest.raises(ev.EvictionError) as err:
        selection.check()
    text = str(err.value)
    assert "nothing was evicted" in text
    assert "declare no controller: ml/bare" in text and "force: true" in text
    assert "local storage (emptyDir): ml/cache" in text and "delete_emptydir_data: true" in text
    assert "ml/train" not in text


def test_force_and_delete_emptydir_data_allow_them_with_a_warning() -> None:
    pods = [pod("bare", GPU), with_emptydir(managed(pod("cache", GPU)))]
    only_force = ev.select(pods, force=True)
    with pytest.raises(ev.EvictionError, match="emptyDir"):
        only_force.check()
    both = ev.select(pods, force=True, delete_emptydir_data=True)
    both.check()
    assert [p.name for p in both.pods] == ["bare", "cache"]
    assert both.warnings == (
        "deleting Pods that declare no controller: ml/bare (force)",
        "deleting Pods with local storage (emptyDir): ml/cache (their emptyDir data is lost)",
    )


def test_a_pod_already_terminating_is_waited_for_not_refused() -> None:
    leaving = pod("bare", GPU)
    leaving["metadata"]["deletionTimestamp"] = "2026-11-24T01:00:00Z"
    selection = ev.select([leaving, with_emptydir(pod("cache", GPU))])
    assert [p.name for p in selection.pods] == ["bare", "cache"]
    assert "ml/bare" not in " ".join(selection.refused) and "ml/cache" in selection.refused[0]


def test_controller_needs_the_controller_flag() -> None:
    """An owner that is not the controller (e.g. a garbage-collection owner) recreates
    nothing: kubectl drain treats such a pod as unmanaged."""
    obj = pod("owned", GPU)
    obj["metadata"]["ownerReferences"] = [{"kind": "ConfigMap", "name": "x"}]
    assert ev.select([obj]).refused
    assert not ev.select([managed(pod("rs", GPU))]).refused
