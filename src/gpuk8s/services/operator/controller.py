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
3. **status** — per GPU node: the readiness labels (gating: gpu-label -> container-runtime
   (gpu.installed) -> driver-manager (runtime.ready) -> gpu-device (driver/maca/runtime
   ready); the DaemonSets' node affinity enforces the order, the controller shows where a
   node stands), each agent's state annotation, payload containers that cannot pull.
   Written to ConfigMap ``operator-status`` (``kubectl get cm operator-status -o yaml``);
   a node whose state changes to failed / ready gets an Event.

``Cluster`` is the only thing that talks to the API server (a fake in unit tests).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import yaml

from ...core.labels import PREFIX
from ...core.vfconfig import VFNUMS_KEY, VfProblem, check_node, parse_node_vfnums
from ..nodeagent import VFNUM_DESIRED, state_annotation

log = logging.getLogger("gpuk8s.operator-controller")

CONFIG_NAME = "driver-config"
STATUS_NAME = "operator-status"
AGENTS = ("driver-manager.driver", "driver-manager.maca", "container-runtime")
READY_LABELS = ("driver.ready", "maca.ready", "runtime.ready")
RESTARTED = PREFIX + "gpu-device.restarted-for"  # vfnumApplied we restarted gpu-device for
GPU_DEVICE_SELECTOR = "app.kubernetes.io/name=gpu-device"
DRIVER_MANAGER_SELECTOR = "app.kubernetes.io/name=driver-manager"
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
    def event(self, kind: str, name: str, reason: str, message: str, warning: bool) -> None: ...


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return _meta(obj).get("labels") or {}


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return _meta(obj).get("annotations") or {}


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
    _node_states: dict[str, str] = field(default_factory=dict)
    _config_errors: str | None = None

    def one_pass(self) -> dict[str, Any]:
        nodes = self.cluster.gpu_nodes()
        conditions = self.reconcile_vfnums(nodes)
        self.restart_gpu_device(nodes)
        status = self.status(nodes, conditions)
        self.cluster.put_status(STATUS_NAME, {
            "nodes": yaml.safe_dump(status["nodes"], sort_keys=True),
            "conditions": yaml.safe_dump(status["conditions"], sort_keys=False),
            "summary": status["summary"],
        })
        return status

    # ----------------------------------------------------------------- vfnums
    def reconcile_vfnums(self, nodes: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        config = self.cluster.get_configmap(CONFIG_NAME)
        if config is None:
            self.cluster.create_configmap(CONFIG_NAME, {VFNUMS_KEY: "nodes: {}\n"}, self.labels)
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
