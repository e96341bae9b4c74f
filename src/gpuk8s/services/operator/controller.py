"""operator-controller: level-triggered reconcile passes over the scheme's objects.

One pass (every ``interval`` seconds, and the whole state is re-read each time, so a
restarted controller simply carries on):

1. **driver-config** — create ConfigMap ``driver-config`` (``node-vfnums: "nodes: {}"``)
   when it is missing; never write it otherwise (an admin's edit is theirs; helm does not
   manage it, so ``helm upgrade`` leaves it alone). Decode and validate ``node-vfnums``
   (``core.vfconfig``) against each GPU node's ``gpu.product`` / ``gpu.sriov`` labels. A
   valid value becomes the node's ``metax-tech.com/vfnum.desired`` annotation, which
   driver-manager applies. Bad YAML, a bad entry or a value the product does not allow ->
   a Warning Event (on the ConfigMap, and on the Node when one is named) and a condition in
   the status object; the node's previous desired value stays in force.
2. **gpu-device restarts** — after driver-manager applied a new VF count on a node
   (``vfnumApplied`` in its state annotation), the node's gpu-device pod is deleted once
   so the DaemonSet recreates it with the new devices (SPEC §6: expected).
3. **rolling upgrade** — driver version (``--driver-version`` with deployPolicy Always)
   and VF count changes go node by node through the state machine of ``upgrade.py``
   (cordon, evict the GPU pods honouring PodDisruptionBudgets, replace driver-manager's
   pod so it runs the new payload, wait for its report, validate, uncordon), within
   ``driver.upgradePolicy``'s maxParallel / maxUnavailable. All state is on the Nodes.
4. **driver-manager pods after a helm upgrade** — driver-manager's DaemonSet is
   ``OnDelete``; a pod whose ``metax-tech.com/template-hash`` differs from its
   DaemonSet's is deleted (so it is recreated from the new template) on nodes outside the
   rolling upgrade, at most maxParallel driver-manager pods unavailable at once
   (``agentroll.py``); nodes in the upgrade get theirs replaced after the drain.
5. **status** — per GPU node: the readiness labels (gating: gpu-label -> container-runtime
   (gpu.installed) -> driver-manager (runtime.ready) -> gpu-device (driver/maca/runtime
   ready); the DaemonSets' node affinity enforces the order, the controller shows where a
   node stands), each agent's state annotation, payload containers that cannot pull.
   Written to ConfigMap ``operator-status`` (``kubectl get cm operator-status -o yaml``);
   a node whose state changes to failed / ready gets an Event.

``Cluster`` is the only thing that talks to the API server (a fake in unit tests).

Crash safety: every pass re-reads everything, and each externally visible step is one
API call whose effect the next pass (of this controller or of a restarted one) reads
back. Events too: an upgrade step's Event is named after the node, its reason and the
time the node entered the state (``upgrade_event_name``), and the reason is in the
node's record; the first pass of a controller re-creates the Event of every node's
current state entered less than ``EVENT_TTL`` ago, so one killed between a Node patch and
its Event loses nothing, and an Event is never recorded twice (the name exists). A
driver-manager pod's replacement is announced before the pod is deleted, under a name
made of the pod's.

``Controller.after_step`` is called right after each such step with its name (one of
``STEPS``, ``node-patched:<state>`` and ``event:<reason>`` with the state / reason) and its
subject (the node; ``namespace/name`` of an evicted pod); ``gpuk8s serve
operator-controller`` makes it kill the process there when ``$GPUK8S_TEST_KILL_AFTER``
names the step (tests/integration/test_operator_kill_apiserver.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import yaml

from ...ansible import eviction
from ...core.errors import GpuK8sError
from ...core.labels import PREFIX
from ...core.vfconfig import VFNUMS_KEY, VfProblem, check_node, parse_node_vfnums
from ..nodeagent import VFNUM_DESIRED, state_annotation
from . import agentroll, upgrade
from .metrics import UpgradeMetrics

log = logging.getLogger("gpuk8s.operator-controller")

CONFIG_NAME = "driver-config"
STATUS_NAME = "operator-status"
AGENTS = ("driver-manager.driver", "driver-manager.maca", "container-runtime")
READY_LABELS = ("driver.ready", "maca.ready", "runtime.ready")
RESTARTED = PREFIX + "gpu-device.restarted-for"  # vfnumApplied we restarted gpu-device for
GPU_DEVICE_SELECTOR = "app.kubernetes.io/name=gpu-device"
DRIVER_MANAGER_SELECTOR = "app.kubernetes.io/name=driver-manager"
DRIVER_MANAGER = "driver-manager"  # its DaemonSet
# nodes whose driver-manager pod the rolling upgrade replaces (after the drain), or which
# wait for the administrator (failed): agentroll leaves them alone
UPGRADE_OWNED = (upgrade.REQUIRED, *upgrade.ACTIVE, upgrade.FAILED)
EVENT_TTL = 3600.0  # kube-apiserver's default --event-ttl: older Events are gone anyway
# externally visible steps (Controller.after_step), besides node-patched:<state> (the one
# Node patch of an upgrade step) and event:<reason>
STEPS = ("configmap-created", "vfnum-desired", "gpu-device-restarted", "pod-evicted",
         "agent-pod-deleted", "agent-pod-rolled", "status-written")
PAYLOAD_CONTAINERS = ("driver-payload", "maca-payload")


class Cluster(Protocol):
    def get_configmap(self, name: str) -> Mapping[str, Any] | None: ...
    def create_configmap(self, name: str, data: Mapping[str, str],
                         labels: Mapping[str, str]) -> None: ...
    def put_status(self, name: str, data: Mapping[str, str]) -> None: ...
    def gpu_nodes(self) -> list[Mapping[str, Any]]: ...
    def annotate_node(self, node: str, changes: Mapping[str, str | None]) -> None: ...
    def pods(self, selector: str) -> list[Mapping[str, Any]]: ...
    def delete_pod(self, name: str) -> None: ...
    def event(self, kind: str, name: str, reason: str, message: str, warning: bool,
              event_name: str | None = None) -> bool | None: ...
    def patch_node(self, node: str, body: Mapping[str, Any]) -> None: ...
    def node_pods(self, node: str, selector: str) -> list[Mapping[str, Any]]: ...
    def evict(self, pod: eviction.PodRef) -> tuple[int, str]: ...
    def daemonset(self, name: str) -> Mapping[str, Any] | None: ...


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return _meta(obj).get("labels") or {}


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return _meta(obj).get("annotations") or {}


def upgrade_event_name(node: str, reason: str, since: float | None) -> str:
    """The name of the Event of an upgrade step: the same for every retry of that step."""
    stamp = round((since or 0.0) * 1000)
    name = f"{node}.{reason.lower()}.{stamp}"
    if len(name) > 253:  # a DNS subdomain
        digest = hashlib.sha256(node.encode()).hexdigest()[:16]
        name = f"gpuk8s-{digest}.{reason.lower()}.{stamp}"
    return name


def agent_state(node: Mapping[str, Any], agent: str) -> dict[str, Any]:
    raw = _annotations(node).get(state_annotation(agent))
    try:
        value = json.loads(raw) if raw else {}
    except ValueError:
        value = {"state": "unknown", "message": f"unreadable state annotation: {str(raw)[:80]}"}
    return value if isinstance(value, dict) else {}


@dataclass
class Controller:
    cluster: Cluster
    labels: Mapping[str, str] = field(default_factory=dict)  # put on what we create
    target: upgrade.Target = field(default_factory=upgrade.Target)
    policy: upgrade.Policy = field(default_factory=upgrade.Policy)
    metrics: UpgradeMetrics = field(default_factory=UpgradeMetrics)
    clock: Callable[[], float] = time.time  # wall clock: the record outlives the process
    after_step: Callable[[str, str], None] = lambda step, subject: None  # module doc
    _node_states: dict[str, str] = field(default_factory=dict)
    _config_errors: str | None = None
    _replayed: bool = False  # the first pass re-created the Events a crash may have lost

    def one_pass(self) -> dict[str, Any]:
        nodes = self.cluster.gpu_nodes()
        conditions = self.reconcile_vfnums(nodes)
        self.restart_gpu_device(nodes)
        rollout, facts = self.rollout(nodes)
        try:
            rollout["driverManagerPods"] = self.roll_agents(facts)
        except GpuK8sError as err:  # e.g. no `get` on the DaemonSet: the rest goes on
            log.warning("cannot replace out-of-date driver-manager pods",
                        extra={"error": str(err)})
            rollout["driverManagerPods"] = {"error": str(err)}
        status = self.status(nodes, conditions)
        status["rollout"] = rollout
        self.cluster.put_status(STATUS_NAME, {
            "nodes": yaml.safe_dump(status["nodes"], sort_keys=True),
            "conditions": yaml.safe_dump(status["conditions"], sort_keys=False),
            "summary": status["summary"],
            "rollout": yaml.safe_dump(rollout, sort_keys=True),
        })
        self.after_step("status-written", STATUS_NAME)
        return status

    # ------------------------------------------------------------ rolling upgrade
    def rollout(self, nodes: Sequence[Mapping[str, Any]]
                ) -> tuple[dict[str, Any], dict[str, upgrade.NodeFacts]]:
        """One step of every node's upgrade state machine (see upgrade.py): first the
        nodes already under way (so a failure this pass pauses the rollout at once), then
        the waiting ones that ``admit`` lets start. Returns the status and the facts as
        they are after this pass."""
        now = self.clock()
        facts: dict[str, upgrade.NodeFacts] = {}
        for node in nodes:
            desired = _annotations(node).get(VFNUM_DESIRED)
            found = upgrade.facts_from_node(
                node, agent_state(node, "driver-manager.driver"),
                int(desired) if desired and desired.isdigit() else None)
            if found.state == upgrade.CORDONED and found.unschedulable:
                found = self._drain(found)
            facts[found.name] = found
        if not self._replayed:
            self._replay_events(facts.values(), now)
            self._replayed = True
        waiting = [f for f in facts.values() if f.state == upgrade.REQUIRED]
        for found in facts.values():
            if found.state != upgrade.REQUIRED:
                facts[found.name] = self._apply(found, upgrade.step(
                    found, self.target, self.policy, now))
        allowed = set(upgrade.admit(list(facts.values()), self.policy))
        for found in waiting:
            facts[found.name] = self._apply(found, upgrade.step(
                found, self.target, self.policy, now, found.name in allowed))
        room = upgrade.budget(list(facts.values()), self.policy)
        counts = upgrade.counts(f.state for f in facts.values())
        self.metrics.set_states(counts, room.reason.startswith("rollout paused"), room.limits)
        out: dict[str, Any] = {"states": {k: v for k, v in counts.items() if v},
                               "limits": room.limits}
        if room.reason:
            out["waiting"] = room.reason
        failed = {f.name: f.record.message for f in facts.values() if f.state == upgrade.FAILED}
        if failed:
            out["failed"] = failed
        return out, facts

    def _replay_events(self, facts: Iterable[upgrade.NodeFacts], now: float) -> None:
        """The Event of each node's current state (see the module doc: crash safety)."""
        for found in facts:
            rec = found.record
            if not rec.announce or rec.since is None or now - rec.since > EVENT_TTL:
                continue
            name = upgrade_event_name(found.name, rec.announce, rec.since)
            if self.cluster.event("Node", found.name, rec.announce, rec.message,
                                  rec.announce.endswith("Failed"), event_name=name) is not False:
                log.info("event re-created", extra={"node": found.name, "reason": rec.announce})
                self.after_step(f"event:{rec.announce}", found.name)

    def _drain(self, found: upgrade.NodeFacts) -> upgrade.NodeFacts:
        """One eviction round on a cordoned node (never blocks: PDB refusals are retried
        next pass until drainTimeoutSeconds, decided by ``upgrade.step``)."""
        try:
            pods = self.cluster.node_pods(found.name, self.policy.pod_selector)
        except GpuK8sError as err:
            log.warning("cannot list the node's pods", extra={"node": found.name,
                                                               "error": str(err)})
            return found  # gpu_pods None: no transition on a guess
        selection = eviction.select(pods, force=self.policy.force,
                                    delete_emptydir_data=self.policy.delete_emptydir_data)
        if selection.refused:
            return replace(found, gpu_pods=len(selection.pods),
                           evict_refused="; ".join(selection.refused))
        if not selection.pods:
            return replace(found, gpu_pods=0)
        blocked: dict[eviction.PodRef, str] = {}
        lines: list[str] = []
        try:
            still = eviction.evict_round(selection.pods, self._evict, blocked, lines)
        except eviction.EvictionError as err:
            return replace(found, gpu_pods=len(selection.pods), evict_blocked=str(err))
        for line in lines:
            log.info(line, extra={"node": found.name})
        why = eviction.timeout_message(still, blocked, self.policy.drain_timeout) \
            if still else ""
        return replace(found, gpu_pods=len(selection.pods), evict_blocked=why)

    def _evict(self, pod: eviction.PodRef) -> tuple[int, str]:
        status, message = self.cluster.evict(pod)
        if status in (200, 201):
            self.after_step("pod-evicted", f"{pod.namespace}/{pod.name}")
        return status, message

    def _apply(self, found: upgrade.NodeFacts, step: upgrade.Step) -> upgrade.NodeFacts:
        """Carry out ``step`` on the cluster; the facts as they are afterwards."""
        if not step.changed(found):
            return found
        try:
            if step.restart_agent:
                for pod in self.cluster.pods(DRIVER_MANAGER_SELECTOR):
                    if (pod.get("spec") or {}).get("nodeName") == found.name:
                        self.cluster.delete_pod(str(_meta(pod).get("name")))
                        self.after_step("agent-pod-deleted", found.name)
            self.cluster.patch_node(found.name, upgrade.node_patch(step))
            self.after_step(f"node-patched:{step.state or 'none'}", found.name)
        except GpuK8sError as err:
            log.warning("upgrade step not recorded; retried next pass",
                        extra={"node": found.name, "state": step.state, "error": str(err)})
            return found
        if step.state != found.state:
            log.info("upgrade state", extra={"node": found.name, "from": found.state,
                                             "to": step.state, "note": step.record.message})
        if step.event is not None:
            reason, message, warning = step.event
            self.cluster.event("Node", found.name, reason, message, warning,
                               event_name=upgrade_event_name(found.name, reason,
                                                             step.record.since))
            self.after_step(f"event:{reason}", found.name)
        if step.finished is not None:
            self.metrics.observe("done" if step.state == upgrade.DONE else "failed",
                                 step.finished)
        unschedulable = found.unschedulable if step.cordon is None else step.cordon
        return replace(found, state=step.state, record=step.record, unschedulable=unschedulable)

    # ------------------------------------------------ driver-manager pods (helm upgrade)
    def roll_agents(self, facts: Mapping[str, upgrade.NodeFacts]) -> dict[str, Any]:
        """Delete out-of-date driver-manager pods outside the upgrade (``agentroll.py``),
        so the DaemonSet recreates them from its current template; what it did / why
        pods wait, for the status."""
        want, desired = agentroll.template_hash(self.cluster.daemonset(DRIVER_MANAGER))
        if want is None:
            return {}
        pods = agentroll.agent_pods(self.cluster.pods(DRIVER_MANAGER_SELECTOR))
        owned = {name for name, f in facts.items() if f.state in UPGRADE_OWNED}
        plan = agentroll.plan(want, pods, desired, owned, self.policy.max_parallel)
        for pod in plan.replace:
            # announced first, named after the pod: a crash before the deletion repeats
            # the announcement under the same name (recorded once)
            self.cluster.event("Node", pod.node, "DriverManagerReplaced",
                               f"driver-manager pod {pod.name} replaced: its template changed "
                               f"(helm upgrade; {agentroll.TEMPLATE_HASH} {pod.template_hash} "
                               f"-> {want}); no drain: the driver and the VFs change only in "
                               "the rolling upgrade", False,
                               event_name=f"{pod.name}.{pod.uid[:8] or 'pod'}.replaced")
            self.after_step("event:DriverManagerReplaced", pod.node)
            self.cluster.delete_pod(pod.name)
            self.after_step("agent-pod-rolled", pod.node)
            log.info("driver-manager pod out of date: replaced", extra={
                "node": pod.node, "pod": pod.name, "from": pod.template_hash, "to": want})
        return plan.report()

    # ----------------------------------------------------------------- vfnums
    def reconcile_vfnums(self, nodes: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        config = self.cluster.get_configmap(CONFIG_NAME)
        if config is None:
            self.cluster.create_configmap(CONFIG_NAME, {VFNUMS_KEY: "nodes: {}\n"}, self.labels)
            self.after_step("configmap-created", CONFIG_NAME)
            log.info("created ConfigMap driver-config")
            return []
        raw = (config.get("data") or {}).get(VFNUMS_KEY, "")
        problems: list[VfProblem]
        try:
            document = yaml.safe_load(raw) if raw else None
            wanted, problems = parse_node_vfnums(document)
        except yaml.YAMLError as err:
            wanted, problems = {}, [VfProblem(None, raw[:200], f"node-vfnums is not valid YAML: "
                                                               f"{str(err).splitlines()[0]}")]
            self._report_config(problems, nodes)
            return _conditions(problems)  # nothing changes while the document is broken
        by_name = {str(_meta(n).get("name")): n for n in nodes}
        for name, vfnum in wanted.items():
            node = by_name.get(name)
            if node is None:
                problems.append(VfProblem(name, vfnum, f"node {name}: no GPU node of that name "
                                                       "(metax-tech.com/gpu.installed=true)"))
                continue
            labels = _labels(node)
            bad = check_node(name, vfnum, labels.get(PREFIX + "gpu.product"),
                             labels.get(PREFIX + "gpu.sriov"))
            if bad is not None:
                problems.append(bad)
                continue
            if _annotations(node).get(VFNUM_DESIRED) != str(vfnum):
                self.cluster.annotate_node(name, {VFNUM_DESIRED: str(vfnum)})
                self.after_step("vfnum-desired", name)
                log.info("vfnum desired", extra={"node": name, "vfnum": vfnum})
        bad_nodes = {p.node for p in problems}
        for name, node in by_name.items():
            # a node the admin took out of the config: its VFs stay as they are
            if name not in wanted and name not in bad_nodes and \
                    VFNUM_DESIRED in _annotations(node):
                self.cluster.annotate_node(name, {VFNUM_DESIRED: None})
        self._report_config(problems, nodes)
        return _conditions(problems)

    def _report_config(self, problems: Sequence[VfProblem],
                       nodes: Sequence[Mapping[str, Any]]) -> None:
        text = "; ".join(p.message for p in problems) or None
        if text == self._config_errors:
            return
        self._config_errors = text
        names = {str(_meta(n).get("name")) for n in nodes}
        for problem in problems:
            message = f"{problem.message}; the previous setting stays in force"
            self.cluster.event("ConfigMap", CONFIG_NAME, "InvalidVfnum", message, True)
            if problem.node and problem.node in names:
                self.cluster.event("Node", problem.node, "InvalidVfnum", message, True)
            log.warning(message)

    # --------------------------------------------------------- gpu-device restart
    def restart_gpu_device(self, nodes: Sequence[Mapping[str, Any]]) -> None:
        pending = {}
        for node in nodes:
            applied = agent_state(node, "driver-manager.driver").get("vfnumApplied")
            name = str(_meta(node).get("name"))
            if applied and _annotations(node).get(RESTARTED) != applied:
                pending[name] = str(applied)
        if not pending:
            return
        for pod in self.cluster.pods(GPU_DEVICE_SELECTOR):
            node_name = (pod.get("spec") or {}).get("nodeName")
            if node_name in pending:
                self.cluster.delete_pod(str(_meta(pod).get("name")))
                self.after_step("gpu-device-restarted", str(node_name))
                self.cluster.event("Node", node_name, "GpuDeviceRestarted",
                                   "gpu-device pod recreated after the VF count changed", False)
        for name, applied in pending.items():
            self.cluster.annotate_node(name, {RESTARTED: applied})

    # ------------------------------------------------------------------- status
    def status(self, nodes: Sequence[Mapping[str, Any]],
               conditions: list[dict[str, Any]]) -> dict[str, Any]:
        payload_errors = self._payload_errors()
        out: dict[str, Any] = {}
        for node in nodes:
            name = str(_meta(node).get("name"))
            labels = _labels(node)
            entry: dict[str, Any] = {
                key: labels.get(PREFIX + key, "unknown") for key in READY_LABELS
            }
            entry["driverMode"] = labels.get(PREFIX + "gpu.driver.mode", "unknown")
            entry["vfnum"] = labels.get(PREFIX + "gpu.vfnum", "unknown")
            if VFNUM_DESIRED in _annotations(node):
                entry["vfnumDesired"] = _annotations(node)[VFNUM_DESIRED]
            allocatable = ((node.get("status") or {}).get("allocatable") or {}).get(
                "metax-tech.com/gpu", "0")
            entry["allocatable"] = str(allocatable)
            if labels.get(upgrade.STATE_LABEL):
                entry["upgrade"] = labels[upgrade.STATE_LABEL]
            messages = []
            state = "ready" if all(entry[k] == "true" for k in READY_LABELS) else "progressing"
            for agent in AGENTS:
                reported = agent_state(node, agent)
                if reported:
                    entry[agent] = {"state": reported.get("state"),
                                    "message": reported.get("message")}
                    if reported.get("state") == "failed":
                        state = "failed"
                        messages.append(f"{agent}: {reported.get('message')}")
            for error in payload_errors.get(name, []):
                state = "failed"
                messages.append(error)
            entry["state"] = state
            if messages:
                entry["message"] = "; ".join(messages)
                conditions.append(_condition("NodeFailed", name, "; ".join(messages)))
            out[name] = entry
            if self._node_states.get(name) != state and state in ("ready", "failed"):
                text = entry.get("message") or "every component of the operator scheme is ready"
                self.cluster.event("Node", name, f"GpuOperator{state.capitalize()}", text,
                                   state == "failed")
            self._node_states[name] = state
        ready = sum(1 for e in out.values() if e["state"] == "ready")
        summary = f"{ready}/{len(out)} GPU node(s) ready"
        return {"nodes": out, "conditions": conditions, "summary": summary}

    def _payload_errors(self) -> dict[str, list[str]]:
        """Per node: payload containers of driver-manager that cannot pull their image."""
        errors: dict[str, list[str]] = {}
        for pod in self.cluster.pods(DRIVER_MANAGER_SELECTOR):
            node = (pod.get("spec") or {}).get("nodeName")
            for entry in (pod.get("status") or {}).get("containerStatuses") or []:
                if entry.get("name") not in PAYLOAD_CONTAINERS:
                    continue
                waiting = (entry.get("state") or {}).get("waiting") or {}
                reason = waiting.get("reason") or ""
                if "Image" in reason or reason == "ErrImagePull":
                    errors.setdefault(str(node), []).append(
                        f"payload image {entry.get('image')}: {reason}: "
                        f"{(waiting.get('message') or '')[:300]}")
        return errors


def _condition(kind: str, node: str | None, message: str) -> dict[str, Any]:
    return {"type": kind, "status": "True", "node": node, "message": message,
            "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def _conditions(problems: Sequence[VfProblem]) -> list[dict[str, Any]]:
    return [dict(_condition("InvalidVfnum", p.node, p.message), value=repr(p.value)[:100])
            for p in problems]
