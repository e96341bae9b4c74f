"""The rolling driver upgrade of operator-controller against a real kube-apiserver.

What is real: the API server (merge patches of labels, annotations and
``spec.unschedulable``, the Eviction API, Events), operator-controller's ``KubeCluster``
and ``Controller``. What a **test harness plays** (there is no kubelet and no GPU on these
API-only nodes): driver-manager's node-side report (on a node labelled ``upgrading`` it
writes the ``driver-manager.driver`` state annotation saying the new version is loaded,
or a failure for a node chosen to fail), gpu-label (the ``gpu.driver.*`` version labels)
and the kubelet (a pod the Eviction API marked for deletion is deleted for good, as the
kubelet does once its containers stopped).

Proves, over 50 nodes: ``maxParallel`` and ``maxUnavailable`` are never exceeded (checked
after every pass and every harness step) and both are reached; no node ends cordoned after
a successful rollout except the one the admin had cordoned; and a controller killed in
every state (a new ``Controller`` object, nothing carried over) resumes with no state lost.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from gpuk8s.services.kube import api_client
from gpuk8s.services.nodeagent import state_annotation
from gpuk8s.services.operator import upgrade as up
from gpuk8s.services.operator.controller import Controller
from gpuk8s.services.operator.main import KubeCluster

pytestmark = pytest.mark.integration

OLD, NEW = "2.32.0.6", "2.33.0.6"
REPORT = state_annotation("driver-manager.driver")
P = "metax-tech.com/"


class Harness:
    def __init__(self, apiserver: Any, count: int, pods_every: int = 3) -> None:
        from kubernetes import client

        self.client = client
        self.core = apiserver.core()
        self.tag = uuid.uuid4().hex[:6]
        self.namespace = f"up-{self.tag}"
        self.core.create_namespace(client.V1Namespace(
            metadata=client.V1ObjectMeta(name=self.namespace)))
        # no controller-manager here: the namespace's default ServiceAccount by hand
        self.core.create_namespaced_service_account(self.namespace, client.V1ServiceAccount(
            metadata=client.V1ObjectMeta(name="default")))
        self.kube = KubeCluster(api_client(apiserver.kubeconfig("admin")), self.namespace)
        self.names = [f"up-{self.tag}-{i:03}" for i in range(count)]
        self.fail: set[str] = set()
        self.installs = NEW  # the version the harness's driver-manager installs
        for i, name in enumerate(self.names):
            self.core.create_node(client.V1Node(metadata=client.V1ObjectMeta(
                name=name, labels={P + "gpu.installed": "true", P + "driver.ready": "true",
                                   P + "gpu.driver.major": "2", P + "gpu.driver.minor": "32",
                                   P + "gpu.driver.patch": "0", "upgrade-test": self.tag},
                annotations={REPORT: json.dumps({"state": "ready", "version": OLD,
                                                 "wanted": OLD, "vfnum": 0})})))
            self.core.patch_node_status(name, {"status": {
                "capacity": {P + "gpu": "8"}, "allocatable": {P + "gpu": "8"},
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                "message": "harness", "lastHeartbeatTime": _now(),
                                "lastTransitionTime": _now()}]}})
            if i % pods_every == 0:
                self.core.create_namespaced_pod(self.namespace, self._gpu_pod(name))

    def _gpu_pod(self, node: str) -> Any:
        c = self.client
        return c.V1Pod(
            metadata=c.V1ObjectMeta(name=f"job-{node}", owner_references=[c.V1OwnerReference(
                api_version="apps/v1", kind="ReplicaSet", name="train", uid=str(uuid.uuid4()),
                controller=True)]),
            spec=c.V1PodSpec(node_name=node, containers=[c.V1Container(
                name="main", image="lab-busybox", resources=c.V1ResourceRequirements(
                    limits={P + "gpu": "1"}))]))

    def nodes(self) -> list[Any]:
        return self.core.list_node(label_selector=f"upgrade-test={self.tag}").items

    def states(self, nodes: list[Any] | None = None) -> dict[str, str | None]:
        return {n.metadata.name: (n.metadata.labels or {}).get(up.STATE_LABEL)
                for n in (self.nodes() if nodes is None else nodes)}

    def cordoned(self, nodes: list[Any] | None = None) -> list[str]:
        return sorted(n.metadata.name for n in (self.nodes() if nodes is None else nodes)
                      if n.spec.unschedulable)

    def play(self) -> None:
        """One round of the node side: kubelet, driver-manager, gpu-label."""
        for pod in self.core.list_namespaced_pod(self.namespace).items:
            if pod.metadata.deletion_timestamp:
                self.core.delete_namespaced_pod(pod.metadata.name, self.namespace,
                                                grace_period_seconds=0)
        for node in self.nodes():
            name = node.metadata.name
            if (node.metadata.labels or {}).get(up.STATE_LABEL) != up.UPGRADING:
                continue
            if name in self.fail:
                report = {"state": "failed", "version": OLD, "wanted": NEW,
                          "message": f"driver {NEW} did not load (modprobe: Invalid module "
                                     f"format); {OLD} loaded again"}
                labels: dict[str, str] = {}
            else:
                report = {"state": "ready", "version": self.installs,
                          "wanted": self.installs, "vfnum": 0}
                labels = {P + "gpu.driver.minor": self.installs.split(".")[1]}
            self.core.patch_node(name, {"metadata": {"labels": labels, "annotations": {
                REPORT: json.dumps(report)}}})

    def close(self) -> None:
        for name in self.names:
            self.core.delete_node(name)
        self.core.delete_namespace(self.namespace)


def _now() -> str:
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@pytest.fixture()
def harness(apiserver: Any, request: pytest.FixtureRequest) -> Iterator[Harness]:
    h = Harness(apiserver, getattr(request, "param", 50))
    yield h
    h.close()


def _limits_hold(h: Harness, policy: up.Policy, seen: dict[str, int]) -> set[str | None]:
    nodes = h.nodes()
    states = h.states(nodes)
    active = sum(1 for s in states.values() if s in up.ACTIVE)
    cordoned = len(h.cordoned(nodes))
    limit = up.unavailable_limit(policy.max_unavailable, len(states))
    assert active <= policy.max_parallel, states
    assert cordoned <= limit, (cordoned, limit)
    seen["active"] = max(seen.get("active", 0), active)
    seen["unavailable"] = max(seen.get("unavailable", 0), cordoned)
    return set(states.values())


def _roll(h: Harness, controller: Controller, passes: int) -> dict[str, int]:
    """Passes until every node is done; the limits are checked after each pass (only the
    controller cordons nodes or moves their state; the harness writes reports)."""
    seen: dict[str, int] = {}
    for _ in range(passes):
        controller.one_pass()
        if _limits_hold(h, controller.policy, seen) == {up.DONE}:
            break
        h.play()
    return seen


def test_rollout_over_50_nodes_never_exceeds_max_parallel_or_max_unavailable(
        harness: Harness) -> None:
    h = harness
    admin = h.names[17]  # cordoned by the admin before the rollout
    h.core.patch_node(admin, {"spec": {"unschedulable": True}})
    # 1: maxParallel binds (4 < 50% of 50)
    policy = up.Policy(max_parallel=4, max_unavailable="50%")
    controller = Controller(h.kube, target=up.Target(NEW), policy=policy)
    seen = _roll(h, controller, 200)
    assert set(h.states().values()) == {up.DONE}, h.states()
    assert h.cordoned() == [admin]  # nobody else stays cordoned
    assert seen["active"] == 4
    assert not h.core.list_namespaced_pod(h.namespace).items  # GPU pods evicted
    metrics = controller.metrics.render()[1].decode()
    assert 'operator_driver_upgrade_nodes{state="done"} 50.0' in metrics
    # 2: back to the old version; maxUnavailable binds (10% of 50 = 5 < maxParallel 10),
    # the admin's node counts as unavailable throughout
    policy = up.Policy(max_parallel=10, max_unavailable="10%")
    controller = Controller(h.kube, target=up.Target(OLD), policy=policy)
    h.installs = OLD
    for name in h.names:
        h.core.patch_node(name, {"metadata": {"annotations": {REPORT: json.dumps(
            {"state": "ready", "version": NEW, "wanted": NEW, "vfnum": 0})}}})
    seen = _roll(h, controller, 200)
    assert set(h.states().values()) == {up.DONE}, h.states()
    assert h.cordoned() == [admin]
    assert seen["unavailable"] == 5 and seen["active"] <= 5


@pytest.mark.parametrize("harness", [8], indirect=True)
def test_controller_killed_in_every_state_resumes_without_losing_state(
        harness: Harness) -> None:
    h = harness
    h.fail.add(h.names[0])  # its install fails: the failed state is in the loop too
    policy = up.Policy(max_parallel=2, max_unavailable="50%")

    def fresh() -> Controller:
        return Controller(h.kube, target=up.Target(NEW), policy=policy)

    controller = fresh()
    killed: list[str] = []
    for _ in range(60):
        controller.one_pass()
        states = set(h.states().values())
        new = [s for s in up.STATES if s in states and s not in killed]
        if new:
            before = {n.metadata.name: (n.metadata.labels, n.metadata.annotations,
                                        n.spec.unschedulable) for n in h.nodes()}
            controller = fresh()  # the old controller is gone, nothing carried over
            killed.extend(new)
            after = {n.metadata.name: (n.metadata.labels, n.metadata.annotations,
                                       n.spec.unschedulable) for n in h.nodes()}
            assert after == before  # the restart itself changes nothing
        if up.FAILED in states:
            break
        h.play()
    failed = h.names[0]
    assert h.states()[failed] == up.FAILED and failed in h.cordoned()
    events = h.core.list_namespaced_event(
        "default", field_selector=f"involvedObject.name={failed},reason=DriverUpgradeFailed")
    assert events.items and "Invalid module format" in events.items[0].message
    # paused: after more passes, no new node starts while one failed
    started = {n for n, s in h.states().items() if s not in (up.REQUIRED, None)}
    for _ in range(3):
        controller.one_pass()
        h.play()
    assert {n for n, s in h.states().items() if s not in (up.REQUIRED, None)} <= started
    # the admin fixes the payload and retries the node; the rollout completes, with a
    # controller killed again at each state it passes
    h.fail.clear()
    h.core.patch_node(failed, {"metadata": {"labels": {up.STATE_LABEL: up.REQUIRED}}})
    for _ in range(80):
        controller.one_pass()
        states = set(h.states().values())
        if states == {up.DONE}:
            break
        controller = fresh()
        h.play()
    assert set(h.states().values()) == {up.DONE}
    assert h.cordoned() == []
    assert {up.REQUIRED, up.CORDONED, up.EVICTED, up.UPGRADING, up.VALIDATING,
            up.FAILED} <= set(killed)
