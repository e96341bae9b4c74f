"""The rolling driver / VF upgrade (services/operator/upgrade.py): the pure state machine,
the rollout limits, and operator-controller driving it over a fake cluster in which
a small harness plays driver-manager, gpu-label and the kubelet on each node; with
``agents=True`` it also plays driver-manager's OnDelete DaemonSet (its pods, their
template hash), for the replacement of out-of-date pods (services/operator/agentroll.py)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest
import yaml

from gpuk8s.ansible.eviction import PodRef
from gpuk8s.core.errors import ConfigError
from gpuk8s.services.nodeagent import state_annotation
from gpuk8s.services.operator import agentroll
from gpuk8s.services.operator import upgrade as up
from gpuk8s.services.operator.controller import Controller

OLD, NEW = "2.32.0.6", "2.33.0.6"
TARGET = up.Target(version=NEW)
POLICY = up.Policy(drain_timeout=60, upgrade_timeout=120)


def facts(state: str | None = None, **kw: Any) -> up.NodeFacts:
    base: dict[str, Any] = dict(
        name="n1", state=state, record=up.Record(), unschedulable=False, ready=True,
        agent_state="ready", agent_version=OLD, agent_wanted=OLD, agent_vfnum=0,
        driver_ready=True, version_labels=("2", "32", "0"), capacity=8, allocatable=8)
    base.update(kw)
    return up.NodeFacts(**base)


def advance(f: up.NodeFacts, s: up.Step) -> up.NodeFacts:
    return replace(f, state=s.state, record=s.record,
                   unschedulable=f.unschedulable if s.cordon is None else s.cordon)


def upgraded(f: up.NodeFacts) -> up.NodeFacts:
    return replace(f, agent_version=NEW, agent_wanted=NEW, version_labels=("2", "33", "0"))


# ----------------------------------------------------------------- state machine
def test_happy_path_walks_every_state_and_uncordons() -> None:
    f = facts()
    s = up.step(f, TARGET, POLICY, 100.0)
    assert s.state == up.REQUIRED and s.cordon is None and s.record.version == NEW
    f = advance(f, s)
    assert up.step(f, TARGET, POLICY, 101.0, may_start=False).state == up.REQUIRED
    s = up.step(f, TARGET, POLICY, 101.0, may_start=True)
    assert s.state == up.CORDONED and s.cordon is True and s.record.started == 101.0
    assert s.record.admin_cordoned is False and s.record.gpus == 8
    f = advance(f, s)
    assert up.step(replace(f, gpu_pods=2), TARGET, POLICY, 110.0).state == up.CORDONED
    s = up.step(replace(f, gpu_pods=0), TARGET, POLICY, 110.0)
    assert s.state == up.EVICTED
    f = advance(f, s)
    s = up.step(f, TARGET, POLICY, 111.0)
    assert s.state == up.UPGRADING and s.restart_agent
    f = advance(f, s)
    # the old agent's report (wanted OLD) and the new one still waiting: no progress
    assert up.step(f, TARGET, POLICY, 112.0).state == up.UPGRADING
    waiting = replace(f, agent_state="pending", agent_wanted=NEW)
    assert up.step(waiting, TARGET, POLICY, 113.0).state == up.UPGRADING
    f = upgraded(replace(f, allocatable=0))  # driver reloaded, gpu-device not healthy yet
    s = up.step(f, TARGET, POLICY, 120.0)
    assert s.state == up.VALIDATING
    f = advance(f, s)
    s = up.step(f, TARGET, POLICY, 121.0)
    assert s.state == up.VALIDATING and s.cordon is None  # never uncordon unhealthy GPUs
    assert "allocatable metax-tech.com/gpu 0/8" in s.record.message
    s = up.step(replace(f, allocatable=8), TARGET, POLICY, 130.0)
    assert s.state == up.DONE and s.cordon is False and s.finished == pytest.approx(29.0)
    assert s.event is not None and s.event[0] == "DriverUpgradeDone"
    f = advance(replace(f, allocatable=8), s)
    assert up.step(f, TARGET, POLICY, 131.0) == up.Step(up.DONE, f.record)  # at rest


def test_admin_cordoned_node_stays_cordoned_after_the_upgrade() -> None:
    f = advance(facts(unschedulable=True), up.step(facts(unschedulable=True), TARGET, POLICY, 0))
    s = up.step(f, TARGET, POLICY, 1.0, may_start=True)
    assert s.record.admin_cordoned is True
    f = upgraded(advance(f, s))
    for state in (up.CORDONED, up.EVICTED, up.UPGRADING, up.VALIDATING):
        s = up.step(replace(f, state=state, gpu_pods=0), TARGET, POLICY, 2.0)
        f = advance(f, s)
    assert f.state == up.DONE and f.unschedulable is True
    assert s.cordon is None and "stays cordoned" in s.record.message


def test_bad_payload_fails_cordoned_with_an_event_naming_the_cause() -> None:
    rec = up.Record(version=NEW, started=0.0, since=0.0)
    f = facts(up.UPGRADING, record=rec, unschedulable=True, agent_state="failed",
              agent_wanted=NEW, agent_message="driver 2.33.0.6 failed to load: modprobe: bad")
    s = up.step(f, TARGET, POLICY, 5.0)
    assert s.state == up.FAILED and s.cordon is None  # stays cordoned
    assert s.event is not None and s.event[2] is True and "failed to load" in s.event[1]
    assert "rollout paused" in s.event[1] and "stays cordoned" in s.event[1]
    # a failure report of the *old* agent (another wanted version) is not this upgrade's
    stale = replace(f, agent_wanted=OLD)
    assert up.step(stale, TARGET, POLICY, 5.0).state == up.UPGRADING
    # failed stays failed (rollout paused) until the target changes or the admin retries
    failed = advance(f, s)
    assert up.step(failed, TARGET, POLICY, 6.0).state == up.FAILED
    assert up.step(failed, up.Target("2.34.0.1"), POLICY, 6.0).state == up.REQUIRED


def test_drain_blocked_by_a_pdb_times_out_and_leaves_the_healthy_node_uncordoned() -> None:
    rec = up.Record(version=NEW, started=0.0, since=0.0)
    f = facts(up.CORDONED, record=rec, unschedulable=True, gpu_pods=1,
              evict_blocked="eviction blocked for 60s (PodDisruptionBudget, HTTP 429): "
                            "ml/train: Cannot evict pod")
    assert up.step(f, TARGET, POLICY, 59.0).state == up.CORDONED
    s = up.step(f, TARGET, POLICY, 61.0)
    assert s.state == up.FAILED and s.cordon is False
    assert s.event is not None and "PodDisruptionBudget" in s.event[1]
    assert "nothing was changed on the host" in s.event[1]
    admin = replace(f, record=replace(rec, admin_cordoned=True))
    assert up.step(admin, TARGET, POLICY, 61.0).cordon is None


def test_drain_refused_by_drain_rules_fails_at_once() -> None:
    f = facts(up.CORDONED, record=up.Record(version=NEW, since=0.0), unschedulable=True,
              gpu_pods=1, evict_refused="Pods that declare no controller: ml/bare")
    s = up.step(f, TARGET, POLICY, 1.0)
    assert s.state == up.FAILED and "ml/bare" in s.record.message and s.cordon is False


def test_validation_timeout_fails_and_keeps_the_node_cordoned() -> None:
    rec = up.Record(version=NEW, started=0.0, since=0.0)
    f = upgraded(facts(up.VALIDATING, record=rec, unschedulable=True, allocatable=6))
    s = up.step(f, TARGET, POLICY, 121.0)
    assert s.state == up.FAILED and s.cordon is None and "6/8" in s.record.message
    wrong_label = replace(f, allocatable=8, version_labels=("2", "32", "0"))
    assert "version labels" in "".join(up.validation_problems(wrong_label, rec))


def test_someone_uncordoning_a_node_under_way_gets_it_cordoned_again() -> None:
    f = facts(up.UPGRADING, record=up.Record(version=NEW, since=0.0), unschedulable=False)
    assert up.step(f, TARGET, POLICY, 1.0).cordon is True


def test_vf_change_goes_through_the_same_states_and_checks_n_times_m() -> None:
    f = facts(vfnum_desired=4, agent_vfnum=0, vfnum_label=0, agent_version=NEW,
              agent_wanted=NEW, version_labels=("2", "33", "0"))
    s = up.step(f, TARGET, POLICY, 0.0)
    assert s.state == up.REQUIRED and s.record.vfnum == 4 and s.record.version is None
    f = advance(f, s)
    f = advance(f, up.step(f, TARGET, POLICY, 1.0, may_start=True))
    f = advance(f, up.step(replace(f, gpu_pods=0), TARGET, POLICY, 2.0))
    s = up.step(f, TARGET, POLICY, 3.0)
    assert s.state == up.UPGRADING and not s.restart_agent  # the driver stays
    f = advance(f, s)
    f = replace(f, agent_vfnum=4, vfnum_label=4)
    f = advance(f, up.step(f, TARGET, POLICY, 4.0))
    assert f.state == up.VALIDATING
    # capacity not yet 8 GPUs x 4 VFs (gpu-device not recreated): not done
    assert up.step(f, TARGET, POLICY, 5.0).state == up.VALIDATING
    s = up.step(replace(f, capacity=32, allocatable=32), TARGET, POLICY, 6.0)
    assert s.state == up.DONE and s.cordon is False


def test_nothing_to_do_and_unknown_labels() -> None:
    assert up.step(facts(agent_version=NEW), TARGET, POLICY, 0.0).state is None
    assert up.step(facts(agent_version=None), TARGET, POLICY, 0.0).state is None  # no driver
    assert up.step(facts(), up.Target(), POLICY, 0.0).state is None  # not Always
    assert up.step(facts("bogus", agent_version=NEW), TARGET, POLICY, 0.0).state is None
    # target reverted while waiting: back to rest
    req = facts(up.REQUIRED, agent_version=NEW, record=up.Record(version=NEW))
    assert up.step(req, TARGET, POLICY, 0.0).state is None


def test_record_round_trip_and_patch() -> None:
    rec = up.Record(version=NEW, vfnum=2, admin_cordoned=True, started=1.5, since=2.0,
                    message="m", gpus=8)
    assert up.Record.from_json(rec.to_json()) == rec
    assert up.Record.from_json("{not json").message.startswith("unreadable")
    body = up.node_patch(up.Step(up.CORDONED, rec, cordon=True))
    assert body["spec"] == {"unschedulable": True}
    assert body["metadata"]["labels"] == {up.STATE_LABEL: up.CORDONED}
    assert json.loads(body["metadata"]["annotations"][up.RECORD_ANNOTATION])["vfnum"] == 2
    cleared = up.node_patch(up.Step(None, up.Record()))
    assert cleared["metadata"] == {"labels": {up.STATE_LABEL: None},
                                   "annotations": {up.RECORD_ANNOTATION: None}}


# ------------------------------------------------------------------ rollout limits
@pytest.mark.parametrize(("value", "nodes", "limit"), [
    ("25%", 50, 13), ("25%", 1, 1), ("100%", 7, 7), ("1%", 10, 1), ("3", 50, 3)])
def test_max_unavailable(value: str, nodes: int, limit: int) -> None:
    assert up.unavailable_limit(value, nodes) == limit


@pytest.mark.parametrize("value", ["0", "0%", "101%", "-1", "x", "2.5"])
def test_bad_max_unavailable_names_the_field(value: str) -> None:
    with pytest.raises(ConfigError, match="maxUnavailable"):
        up.unavailable_limit(value, 10)


def test_bad_policy_names_the_field() -> None:
    with pytest.raises(ConfigError, match="maxParallel"):
        up.Policy(max_parallel=0).check()
    with pytest.raises(ConfigError, match="drainTimeoutSeconds"):
        up.Policy(drain_timeout=0).check()


def test_admit_honours_max_parallel_and_max_unavailable() -> None:
    waiting = [facts(up.REQUIRED, name=f"n{i:02}") for i in range(10)]
    policy = up.Policy(max_parallel=4, max_unavailable="2")
    assert up.admit(waiting, policy) == ["n00", "n01"]  # maxUnavailable binds
    policy = up.Policy(max_parallel=3, max_unavailable="50%")
    assert up.admit(waiting, policy) == ["n00", "n01", "n02"]  # maxParallel binds
    busy = [facts(up.UPGRADING, name="a", unschedulable=True), *waiting]
    assert up.admit(busy, policy) == ["n00", "n01"]
    # an admin-cordoned / NotReady node is already unavailable: it costs no budget
    down = [facts(up.REQUIRED, name="m0", unschedulable=True),
            facts(up.REQUIRED, name="m1", ready=False), *waiting]
    assert up.admit(down, up.Policy(max_parallel=5, max_unavailable="3")) == \
        ["m0", "m1", "n00"]
    # other unavailable nodes (not ours) use the budget up
    others = [facts(None, name=f"x{i}", unschedulable=True) for i in range(3)] + waiting
    assert up.admit(others, up.Policy(max_parallel=5, max_unavailable="3")) == []


def test_a_failed_node_pauses_the_rollout() -> None:
    nodes = [facts(up.FAILED, name="bad", unschedulable=True),
             *(facts(up.REQUIRED, name=f"n{i}") for i in range(3))]
    assert up.admit(nodes, up.Policy(max_parallel=3, max_unavailable="100%")) == []
    assert "bad" in up.budget(nodes, up.Policy()).reason


# ------------------------------------------------- the controller over a fake cluster
class SimCluster:
    """``controller.Cluster`` in memory with merge-patch semantics; ``play`` acts as
    driver-manager (install on ``upgrading``), gpu-label (version labels) and the
    kubelet (evicted pods go away) on every node."""

    def __init__(self, count: int, pods_per_node: int = 1, agents: bool = False) -> None:
        self.nodes: dict[str, dict[str, Any]] = {}
        self.pod_list: list[dict[str, Any]] = []
        # driver-manager's DaemonSet (agents=True): its template hash, its pods
        self.ds: dict[str, Any] | None = None
        self.agents: list[dict[str, Any]] = []
        self.never_ready: set[str] = set()  # template hashes whose pods never get Ready
        self.installs: dict[str, str] = {}  # template hash -> driver version it installs
        self.deleted: list[tuple[str, str | None]] = []  # (node, its upgrade state then)
        self.events: list[tuple[str, str, bool]] = []
        self.event_names: set[str] = set()
        self.blocked: set[str] = set()  # pods a PDB protects
        self.fail_install: set[str] = set()
        self.configmaps: dict[str, Any] = {"driver-config": {"data": {
            "node-vfnums": "nodes: {}\n"}}}
        for i in range(count):
            name = f"gpu-{i:03}"
            self.nodes[name] = {
                "metadata": {"name": name, "labels": {
                    "metax-tech.com/gpu.installed": "true", "metax-tech.com/driver.ready":
                    "true", "metax-tech.com/gpu.driver.major": "2",
                    "metax-tech.com/gpu.driver.minor": "32", "metax-tech.com/gpu.driver.patch":
                    "0", "metax-tech.com/gpu.vfnum": "0"},
                    "annotations": {state_annotation("driver-manager.driver"): json.dumps(
                        {"state": "ready", "version": OLD, "wanted": OLD, "vfnum": 0})}},
                "spec": {},
                "status": {"capacity": {"metax-tech.com/gpu": "8"},
                           "allocatable": {"metax-tech.com/gpu": "8"},
                           "conditions": [{"type": "Ready", "status": "True"}]}}
            for j in range(pods_per_node):
                self.pod_list.append(self._pod(f"job-{i}-{j}", name))
        if agents:
            self.ds = {"spec": {"template": {"metadata": {"annotations": {
                agentroll.TEMPLATE_HASH: "h1"}}}}, "status": {"desiredNumberScheduled": count}}
            self.installs["h1"] = OLD
            for name in self.nodes:
                self._agent(name, "h1", ready=True)

    def _agent(self, node: str, template: str, ready: bool) -> None:
        self.agents.append({"metadata": {"name": f"driver-manager-{node}-{len(self.agents)}",
                                         "annotations": {agentroll.TEMPLATE_HASH: template}},
                            "spec": {"nodeName": node}, "status": {"conditions": [
                                {"type": "Ready", "status": str(ready)}]}})

    def helm_upgrade(self, template: str, installs: str = NEW) -> None:
        """A new driver-manager template (what the chart renders after helm upgrade)."""
        assert self.ds is not None
        self.ds["spec"]["template"]["metadata"]["annotations"][agentroll.TEMPLATE_HASH] = \
            template
        self.installs[template] = installs

    def template(self) -> str:
        assert self.ds is not None
        return str(self.ds["spec"]["template"]["metadata"]["annotations"][
            agentroll.TEMPLATE_HASH])

    def agent_on(self, node: str) -> dict[str, Any] | None:
        return next((a for a in self.agents if a["spec"]["nodeName"] == node), None)

    def agents_unavailable(self, owned: bool = False) -> int:
        """driver-manager pods not Ready / terminating / missing, on nodes outside the
        upgrade (owned=False) or on every node."""
        count = 0
        for name, node in self.nodes.items():
            if not owned and node["metadata"]["labels"].get(up.STATE_LABEL) in \
                    (up.REQUIRED, *up.ACTIVE, up.FAILED):
                continue
            pod = self.agent_on(name)
            if pod is None or agentroll.agent_pod(pod).unavailable:  # type: ignore[union-attr]
                count += 1
        return count

    @staticmethod
    def _pod(name: str, node: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": "ml", "uid": name, "labels": {},
                             "ownerReferences": [{"kind": "ReplicaSet", "controller": True}]},
                "spec": {"nodeName": node, "containers": [{"resources": {"limits": {
                    "metax-tech.com/gpu": "1"}}}]},
                "status": {"phase": "Running"}}

    # Cluster protocol
    def get_configmap(self, name: str) -> Mapping[str, Any] | None:
        return self.configmaps.get(name)

    def create_configmap(self, name: str, data: Mapping[str, str],
                         labels: Mapping[str, str]) -> None:
        self.configmaps[name] = {"data": dict(data)}

    def put_status(self, name: str, data: Mapping[str, str]) -> None:
        self.configmaps[name] = {"data": dict(data)}

    def gpu_nodes(self) -> list[Mapping[str, Any]]:
        return json.loads(json.dumps(list(self.nodes.values())))

    def annotate_node(self, node: str, changes: Mapping[str, str | None]) -> None:
        self.patch_node(node, {"metadata": {"annotations": dict(changes)}})

    def patch_node(self, node: str, body: Mapping[str, Any]) -> None:
        _merge(self.nodes[node], body)

    def pods(self, selector: str) -> list[Mapping[str, Any]]:
        return json.loads(json.dumps(self.agents)) if "driver-manager" in selector else []

    def delete_pod(self, name: str) -> None:
        for pod in self.agents:
            if pod["metadata"]["name"] == name and \
                    "deletionTimestamp" not in pod["metadata"]:
                pod["metadata"]["deletionTimestamp"] = "now"
                node = pod["spec"]["nodeName"]
                self.deleted.append((node, self.nodes[node]["metadata"]["labels"].get(
                    up.STATE_LABEL)))

    def daemonset(self, name: str) -> Mapping[str, Any] | None:
        return self.ds if name == "driver-manager" else None

    def node_pods(self, node: str, selector: str) -> list[Mapping[str, Any]]:
        return [p for p in self.pod_list if p["spec"]["nodeName"] == node]

    def evict(self, pod: PodRef) -> tuple[int, str]:
        if pod.name in self.blocked:
            return 429, "Cannot evict pod as it would violate the pod's disruption budget."
        for p in self.pod_list:
            if p["metadata"]["name"] == pod.name:
                p["metadata"]["deletionTimestamp"] = "now"
        return 201, ""

    def event(self, kind: str, name: str, reason: str, message: str, warning: bool,
              event_name: str | None = None) -> bool:
        if event_name is not None:
            if event_name in self.event_names:
                return False  # the API's 409: an Event of that name exists
            self.event_names.add(event_name)
        self.events.append((name, reason, warning))
        return True

    # the node side
    def play(self) -> None:
        self.pod_list = [p for p in self.pod_list if "deletionTimestamp" not in p["metadata"]]
        if self.ds is not None:
            self._play_daemonset()
        for name, node in self.nodes.items():
            labels = node["metadata"]["labels"]
            if labels.get(up.STATE_LABEL) != up.UPGRADING:
                continue
            key = state_annotation("driver-manager.driver")
            if name in self.fail_install:
                report = {"state": "failed", "version": OLD, "wanted": NEW,
                          "message": "driver 2.33.0.6 did not load; 2.32.0.6 restored"}
            else:
                report = {"state": "ready", "version": NEW, "wanted": NEW, "vfnum": 0}
                labels["metax-tech.com/gpu.driver.minor"] = "33"
            node["metadata"]["annotations"][key] = json.dumps(report)

    def _play_daemonset(self) -> None:
        """The kubelet (a deleted pod goes), the DaemonSet controller (a node without a pod
        gets one from the current template), the kubelet again (a new pod is Ready one
        round later unless its template never gets Ready), and driver-manager on a node
        without a driver (its pod installs the version of its template at once)."""
        self.agents = [a for a in self.agents if "deletionTimestamp" not in a["metadata"]]
        for pod in self.agents:
            if pod["metadata"]["annotations"][agentroll.TEMPLATE_HASH] not in self.never_ready:
                pod["status"]["conditions"][0]["status"] = "True"
        for name, node in self.nodes.items():
            pod = self.agent_on(name)
            if pod is None:
                self._agent(name, self.template(), ready=False)
                continue
            key = state_annotation("driver-manager.driver")
            report = json.loads(node["metadata"]["annotations"].get(key) or "{}")
            if report.get("version") is None and agentroll.agent_pod(pod).ready:  # type: ignore[union-attr]
                version = self.installs[pod["metadata"]["annotations"][agentroll.TEMPLATE_HASH]]
                node["metadata"]["annotations"][key] = json.dumps(
                    {"state": "ready", "version": version, "wanted": version, "vfnum": 0})
                node["metadata"]["labels"].update({
                    "metax-tech.com/driver.ready": "true",
                    "metax-tech.com/gpu.driver.minor": version.split(".")[1]})

    def states(self) -> dict[str, str | None]:
        return {n: v["metadata"]["labels"].get(up.STATE_LABEL) for n, v in self.nodes.items()}

    def cordoned(self) -> list[str]:
        return [n for n, v in self.nodes.items() if v["spec"].get("unschedulable")]


def _merge(target: dict[str, Any], patch: Mapping[str, Any]) -> None:
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, Mapping):
            _merge(target.setdefault(key, {}), value)
        else:
            target[key] = value


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def test_controller_rollout_never_exceeds_the_limits_and_leaves_no_node_cordoned(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)  # every log call really formats its record
    cluster = SimCluster(20)
    cluster.nodes["gpu-007"]["spec"]["unschedulable"] = True  # the admin's
    policy = up.Policy(max_parallel=3, max_unavailable="20%")  # 4 of 20
    controller = Controller(cluster, target=TARGET, policy=policy, clock=Clock())
    seen_parallel = 0
    for _ in range(200):
        controller.one_pass()
        states = cluster.states()
        active = sum(1 for s in states.values() if s in up.ACTIVE)
        assert active <= 3
        assert len(cluster.cordoned()) <= 4
        seen_parallel = max(seen_parallel, active)
        if all(s == up.DONE for s in states.values()):
            break
        cluster.play()
    assert all(s == up.DONE for s in cluster.states().values()), cluster.states()
    assert cluster.cordoned() == ["gpu-007"]  # only the admin's cordon is left
    assert seen_parallel == 3  # the limit was reached, not just respected
    assert not cluster.pod_list  # every GPU pod was evicted
    assert sum(1 for e in cluster.events if e[1] == "DriverUpgradeDone") == 20
    metrics = controller.metrics.render()[1].decode()
    assert 'operator_driver_upgrade_nodes{state="done"} 20.0' in metrics
    assert 'operator_driver_upgrade_duration_seconds_count{result="done"} 20.0' in metrics


def test_controller_failure_pauses_the_rollout_and_a_retry_resumes_it() -> None:
    cluster = SimCluster(4)
    cluster.fail_install.add("gpu-000")
    controller = Controller(cluster, target=TARGET, policy=up.Policy(), clock=Clock())
    for _ in range(20):
        controller.one_pass()
        cluster.play()
    states = cluster.states()
    assert states["gpu-000"] == up.FAILED and "gpu-000" in cluster.cordoned()
    assert set(states.values()) == {up.FAILED, up.REQUIRED}  # nobody else started
    assert ("gpu-000", "DriverUpgradeFailed", True) in cluster.events
    status = cluster.configmaps["operator-status"]["data"]["rollout"]
    assert "did not load" in status and "rollout paused" in status
    assert 'operator_driver_upgrade_paused 1.0' in controller.metrics.render()[1].decode()
    # the admin fixes the node and asks for a retry
    cluster.fail_install.clear()
    cluster.patch_node("gpu-000", {"metadata": {"labels": {up.STATE_LABEL: up.REQUIRED}}})
    for _ in range(60):
        controller.one_pass()
        cluster.play()
    assert set(cluster.states().values()) == {up.DONE} and cluster.cordoned() == []


def test_controller_pdb_blocked_drain_fails_cleanly() -> None:
    cluster = SimCluster(2)
    cluster.blocked.add("job-0-0")
    clock = Clock()
    controller = Controller(cluster, target=TARGET,
                            policy=up.Policy(drain_timeout=5), clock=clock)
    for _ in range(15):
        controller.one_pass()
        cluster.play()
    node = cluster.nodes["gpu-000"]
    assert cluster.states()["gpu-000"] == up.FAILED
    assert not node["spec"].get("unschedulable")  # healthy: uncordoned again
    assert node["metadata"]["labels"]["metax-tech.com/gpu.driver.minor"] == "32"  # untouched
    record = up.Record.from_json(node["metadata"]["annotations"][up.RECORD_ANNOTATION])
    assert "PodDisruptionBudget" in record.message and "ml/job-0-0" in record.message
    assert cluster.states()["gpu-001"] == up.REQUIRED  # paused


@pytest.mark.parametrize("state", [up.REQUIRED, up.CORDONED, up.EVICTED, up.UPGRADING,
                                   up.VALIDATING])
def test_a_new_controller_resumes_from_every_state(state: str) -> None:
    cluster = SimCluster(3)
    clock = Clock()
    controller = Controller(cluster, target=TARGET, policy=up.Policy(max_parallel=1),
                            clock=clock)
    for _ in range(40):
        if state in cluster.states().values():
            break
        controller.one_pass()
        cluster.play()
    assert state in cluster.states().values()
    before = json.loads(json.dumps(cluster.nodes))
    controller = Controller(cluster, target=TARGET, policy=up.Policy(max_parallel=1),
                            clock=clock)  # the old one is gone; nothing carried over
    assert cluster.nodes == before
    for _ in range(60):
        controller.one_pass()
        cluster.play()
    assert set(cluster.states().values()) == {up.DONE} and cluster.cordoned() == []


@pytest.mark.parametrize(("flag", "field"), [
    (["--upgrade-max-unavailable", "0%"], "maxUnavailable"),
    (["--upgrade-max-parallel", "0"], "maxParallel"),
    (["--driver-version", "2.33 bad"], "--driver-version")])
def test_controller_cli_rejects_a_bad_policy_naming_the_field(
        flag: list[str], field: str, capsys: pytest.CaptureFixture[str]) -> None:
    from gpuk8s.services.operator.main import main

    assert main(["--namespace", "ns", "--log-dir", "", *flag]) == 2
    assert field in capsys.readouterr().err


def test_withdrawing_a_failed_target_validates_the_node_before_uncordoning() -> None:
    bad = up.Record(version="2.34.0.1", started=0.0, since=0.0, message="failed")
    failed = facts(up.FAILED, record=bad, unschedulable=True, agent_version=NEW,
                   agent_wanted="2.34.0.1", agent_state="failed",
                   version_labels=("2", "33", "0"))
    s = up.step(failed, TARGET, POLICY, 10.0)  # the admin went back to NEW, which it runs
    assert s.state == up.UPGRADING and s.restart_agent and s.clear_report and s.cordon is None
    f = advance(failed, s)
    assert up.step(replace(f, agent_state=None), TARGET, POLICY, 11.0).state == up.UPGRADING
    f = replace(f, agent_state="ready", agent_wanted=NEW)
    f = advance(f, up.step(f, TARGET, POLICY, 12.0))
    s = up.step(f, TARGET, POLICY, 13.0)
    assert s.state == up.DONE and s.cordon is False
    # a drain failure left the node uncordoned: nothing to undo
    drained = replace(failed, unschedulable=False, agent_state="ready", agent_wanted=NEW)
    s = up.step(drained, TARGET, POLICY, 10.0)
    assert s.state == up.DONE and s.cordon is None


def test_metrics_page_on_the_health_port() -> None:
    import urllib.error
    import urllib.request

    from gpuk8s.services.healthserver import serve_health

    metrics = Controller(SimCluster(0)).metrics
    metrics.set_states(up.counts([up.DONE, None]), False, {"maxParallel": 1})
    metrics.observe("done", 42.0)
    server = serve_health(0, {"/healthz": lambda: (True, {})}, address="127.0.0.1",
                          pages={"/metrics": metrics.render})
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        with urllib.request.urlopen(base + "/metrics", timeout=5) as answer:
            body = answer.read().decode()
            assert answer.headers["Content-Type"].startswith("text/plain")
        assert 'operator_driver_upgrade_nodes{state="done"} 1.0' in body
        assert 'operator_driver_upgrade_nodes{state="none"} 1.0' in body
        assert 'operator_driver_upgrade_duration_seconds_bucket{le="60.0",result="done"} 1.0' \
            in body
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(base + "/nope", timeout=5)
        assert missing.value.code == 404 and b"/metrics" in missing.value.read()
    finally:
        server.shutdown()


# ------------------------------------- driver-manager pods after a helm upgrade (issue 28)
def _pod(node: str, template: str | None = "new", ready: bool = True,
         terminating: bool = False) -> agentroll.AgentPod:
    return agentroll.AgentPod(f"dm-{node}", node, template, ready, terminating)


def test_roll_plan_replaces_out_of_date_pods_within_the_limit() -> None:
    pods = [_pod("a", "old"), _pod("b", "old"), _pod("c", "old"), _pod("d")]
    plan = agentroll.plan("new", pods, desired=4, owned=set(), limit=2)
    assert [p.node for p in plan.replace] == ["a", "b"] and plan.outdated == 3
    assert "1 out-of-date" in plan.waiting and "maxParallel 2" in plan.waiting
    # one still being replaced (terminating): one slot left
    pods = [_pod("a", "old", terminating=True), _pod("b", "old"), _pod("c", "old")]
    assert [p.node for p in agentroll.plan("new", pods, 3, set(), 2).replace] == ["b"]
    # one gone and not yet recreated (2 pods for 3 nodes): it counts as unavailable
    assert agentroll.plan("new", pods[1:], 3, set(), 1).replace == ()
    # a new pod not Ready yet counts; an out-of-date pod that is not Ready anyway is
    # replaced without budget (the new template may be its fix)
    pods = [_pod("a", ready=False), _pod("b", "old", ready=False), _pod("c", "old")]
    plan = agentroll.plan("new", pods, 3, set(), 1)
    assert [p.node for p in plan.replace] == ["b"] and plan.unavailable == 2


def test_roll_plan_leaves_the_upgrade_its_nodes_and_needs_a_template_hash() -> None:
    pods = [_pod("a", "old"), _pod("b", "old", ready=False), _pod("c", "old")]
    plan = agentroll.plan("new", pods, 3, owned={"a", "b"}, limit=1)
    assert [p.node for p in plan.replace] == ["c"]  # b's unready pod is the upgrade's
    assert plan.outdated == 1 and plan.unavailable == 0
    assert agentroll.plan(None, pods, 3, set(), 5).replace == ()  # no hash: no roll
    # a pod from a chart without the annotation is out of date
    assert agentroll.plan("new", [_pod("a", None)], 1, set(), 1).replace


def _driverless(cluster: SimCluster, name: str) -> None:
    node = cluster.nodes[name]["metadata"]
    node["annotations"][state_annotation("driver-manager.driver")] = json.dumps(
        {"state": "disabled", "message": "no driver loaded: deploy_policy Never"})
    for key in ("driver.ready", "gpu.driver.major", "gpu.driver.minor", "gpu.driver.patch"):
        node["labels"].pop(f"metax-tech.com/{key}")


def _roll(cluster: SimCluster, controller: Controller, limit: int,
          passes: int = 80) -> None:
    """Passes until every driver-manager pod runs the current template and no node is in
    the upgrade; the bound holds after every pass."""
    for _ in range(passes):
        controller.one_pass()
        assert cluster.agents_unavailable() <= limit
        assert sum(1 for s in cluster.states().values() if s in up.ACTIVE) <= limit
        current = all(a["metadata"]["annotations"][agentroll.TEMPLATE_HASH] ==
                      cluster.template() for a in cluster.agents)
        if current and len(cluster.agents) == len(cluster.nodes) and \
                cluster.agents_unavailable(owned=True) == 0 and \
                not set(cluster.states().values()) & {up.REQUIRED, *up.ACTIVE}:
            return
        cluster.play()
    raise AssertionError(f"no convergence: {cluster.states()} {cluster.agents}")


def test_a_helm_upgrade_that_changes_no_driver_reaches_every_driver_manager_pod() -> None:
    """maca.payload.images or a log option changed: driver-manager's template changes,
    nothing about the driver. Every pod is replaced, at most maxParallel at a time, with
    no cordon and no upgrade state (before: the OnDelete DaemonSet kept the old pods)."""
    cluster = SimCluster(6, agents=True)
    controller = Controller(cluster, target=up.Target(OLD), policy=up.Policy(max_parallel=2),
                            clock=Clock())
    controller.one_pass()
    assert cluster.deleted == []  # every pod is current: nothing to do
    cluster.helm_upgrade("h2", installs=OLD)
    _roll(cluster, controller, limit=2)
    assert sorted(n for n, _ in cluster.deleted) == sorted(cluster.nodes)  # each once
    assert {state for _, state in cluster.deleted} == {None}
    assert cluster.cordoned() == [] and set(cluster.states().values()) == {None}
    replaced = [e for e in cluster.events if e[1] == "DriverManagerReplaced"]
    assert len(replaced) == 6
    rollout = yaml.safe_load(cluster.configmaps["operator-status"]["data"]["rollout"])
    assert rollout["driverManagerPods"] == {"outdated": 0, "unavailable": 0}


def test_a_driver_upgrade_drains_only_nodes_with_a_loaded_driver() -> None:
    """A new driver version (deployPolicy Always): the nodes with a loaded driver go
    through the rolling upgrade, which replaces their pod after the drain; a node without a
    driver (deployPolicy Never before) gets its new pod directly and installs at once."""
    cluster = SimCluster(4, agents=True)
    _driverless(cluster, "gpu-002")
    controller = Controller(cluster, target=TARGET, policy=up.Policy(max_parallel=1),
                            clock=Clock())
    cluster.helm_upgrade("h2", installs=NEW)
    _roll(cluster, controller, limit=1)
    deleted = dict(cluster.deleted)
    assert deleted.pop("gpu-002") is None  # directly, no drain
    assert set(deleted.values()) == {up.EVICTED}  # the others after their drain
    assert len(cluster.deleted) == 4  # each pod once
    assert cluster.states() == {"gpu-000": up.DONE, "gpu-001": up.DONE, "gpu-002": None,
                                "gpu-003": up.DONE}
    report = json.loads(cluster.nodes["gpu-002"]["metadata"]["annotations"][
        state_annotation("driver-manager.driver")])
    assert report["version"] == NEW and cluster.cordoned() == []


def test_a_template_whose_pods_never_get_ready_stops_after_max_parallel_nodes() -> None:
    cluster = SimCluster(5, agents=True)
    controller = Controller(cluster, target=up.Target(OLD), policy=up.Policy(max_parallel=2),
                            clock=Clock())
    cluster.helm_upgrade("bad", installs=OLD)
    cluster.never_ready.add("bad")  # e.g. a maca payload image that cannot be pulled
    for _ in range(20):
        controller.one_pass()
        cluster.play()
    assert len(cluster.deleted) == 2  # two nodes tried, three keep their working pods
    rollout = yaml.safe_load(cluster.configmaps["operator-status"]["data"]["rollout"])
    assert "3 out-of-date driver-manager pod(s) wait: 2 unavailable" in \
        rollout["driverManagerPods"]["waiting"]
    # the admin fixes the value: the unready new pods are replaced at once, then the rest
    cluster.helm_upgrade("fixed", installs=OLD)
    _roll(cluster, controller, limit=2)
    assert len(cluster.deleted) == 7


# ------------------------------------------- crash between a Node patch and its Event
class Killed(Exception):
    """The process died (SIGKILL) right after a step."""


def test_an_event_lost_to_a_crash_is_recreated_once_by_the_next_controller() -> None:
    """Issue 28 item 8 (found by the kill test): a controller killed between the Node patch
    of a step and its Event lost the Event for good. The next controller's first pass
    re-creates it, under the same name, so it is never recorded twice."""
    cluster = SimCluster(2)
    clock = Clock()

    def die_after(wanted: str) -> Any:
        def after_step(step: str, subject: str) -> None:
            if step == wanted:
                raise Killed(f"{step} {subject}")
        return after_step

    for wanted in (f"node-patched:{up.REQUIRED}", f"node-patched:{up.CORDONED}",
                   f"node-patched:{up.DONE}", "event:DriverUpgradeDone"):
        controller = Controller(cluster, target=TARGET, policy=up.Policy(max_parallel=2),
                                clock=clock, after_step=die_after(wanted))
        with pytest.raises(Killed):
            for _ in range(30):
                controller.one_pass()
                cluster.play()
    controller = Controller(cluster, target=TARGET, policy=up.Policy(max_parallel=2),
                            clock=clock)
    for _ in range(30):
        controller.one_pass()
        cluster.play()
    for _ in range(2):  # restarted twice more: nothing is announced twice
        Controller(cluster, target=TARGET, clock=clock).one_pass()
    assert set(cluster.states().values()) == {up.DONE}
    for node in cluster.nodes:
        reasons = [r for n, r, _ in cluster.events if n == node]
        assert sorted(reasons) == ["DriverUpgradeDone", "DriverUpgradeRequired",
                                   "DriverUpgradeStarted"], (node, reasons)


def test_no_access_to_the_daemonset_stops_only_the_pod_replacement() -> None:
    """A controller whose Role lacks `get` on the DaemonSet (a half-applied upgrade) still
    rolls the driver and writes its status, saying why no pod is replaced."""
    from gpuk8s.core.errors import GpuK8sError

    class Forbidden(SimCluster):
        def daemonset(self, name: str) -> Mapping[str, Any] | None:
            raise GpuK8sError("get daemonset driver-manager: HTTP 403 Forbidden")

    cluster = Forbidden(2, agents=True)
    controller = Controller(cluster, target=TARGET, clock=Clock())
    for _ in range(30):
        controller.one_pass()
        cluster.play()
    assert set(cluster.states().values()) == {up.DONE}
    rollout = yaml.safe_load(cluster.configmaps["operator-status"]["data"]["rollout"])
    assert "403" in rollout["driverManagerPods"]["error"]


def _node_after(step_: up.Step, unschedulable: bool) -> dict[str, Any]:
    """The Node as the controller's patch for ``step_`` leaves it."""
    body = up.node_patch(step_)
    return {"metadata": {"name": "n1", "labels": body["metadata"]["labels"],
                         "annotations": body["metadata"]["annotations"]},
            "spec": {"unschedulable": body.get("spec", {}).get("unschedulable", unschedulable)}}


def test_an_uninstall_lifts_the_upgrades_cordon_only_where_the_host_did_not_change() -> None:
    now = 1000.0
    f = facts(up.REQUIRED, record=up.Record(version=NEW))
    s = up.step(f, TARGET, POLICY, now, may_start=True)
    assert s.state == up.CORDONED and s.cordon is True  # the state machine's own cordon
    assert up.cordon_at_uninstall(_node_after(s, True)) == (True, "")
    evicted = replace(s, state=up.EVICTED, cordon=None)
    assert up.cordon_at_uninstall(_node_after(evicted, True)) == (True, "")
    for state in (up.UPGRADING, up.VALIDATING, up.FAILED):
        lift, kept = up.cordon_at_uninstall(_node_after(replace(s, state=state, cordon=None), True))
        assert not lift and f"state {state}" in kept and "kubectl uncordon n1" in kept
    # a failed node relabelled for a retry is still cordoned by the failure
    retry = replace(s, state=up.REQUIRED, cordon=None)
    lift, kept = up.cordon_at_uninstall(_node_after(retry, True))
    assert not lift and "upgrade-required" in kept


def test_an_uninstall_leaves_an_admins_cordon_and_uncordoned_nodes_alone() -> None:
    now = 1000.0
    f = facts(up.REQUIRED, record=up.Record(version=NEW), unschedulable=True)
    s = up.step(f, TARGET, POLICY, now, may_start=True)
    assert s.state == up.CORDONED and s.record.admin_cordoned
    assert up.cordon_at_uninstall(_node_after(s, True)) == (False, "")
    plain: dict[str, Any] = {"metadata": {"name": "n2"}, "spec": {"unschedulable": True}}
    assert up.cordon_at_uninstall(plain) == (False, "")  # never upgraded: not ours
    waiting = replace(s, state=up.REQUIRED, record=up.Record(version=NEW), cordon=None)
    assert up.cordon_at_uninstall(_node_after(waiting, True)) == (False, "")  # not started
    done = replace(s, state=up.DONE, record=replace(s.record, admin_cordoned=False))
    assert up.cordon_at_uninstall(_node_after(done, True)) == (False, "")
    running = replace(s, state=up.UPGRADING, record=replace(s.record, admin_cordoned=False),
                      cordon=None)
    assert up.cordon_at_uninstall(_node_after(running, False)) == (False, "")  # not cordoned
