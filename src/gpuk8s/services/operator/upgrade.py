"""The rolling driver / VF upgrade of the operator scheme as a pure state machine.

Each GPU node carries its own upgrade state, so a controller that restarts (or is
replaced) resumes exactly where the last one stopped; nothing lives only in memory:

* label ``metax-tech.com/driver.upgrade-state`` — one of ``STATES``
  (``kubectl get nodes -L metax-tech.com/driver.upgrade-state``);
* annotation ``metax-tech.com/driver.upgrade`` — a JSON ``Record``: the target (driver
  version and / or VF count), whether the node was already cordoned by the admin before
  the upgrade took it, when it started, when it entered its current state, the last
  failure, and the reason of the Event that announced its current state (a controller
  killed between the Node patch and the Event re-creates it: see controller.py).

States (one node)::

    (none|done) --needs work--> upgrade-required --slot free--> cordoned
    cordoned --GPU pods gone--> pods-evicted --driver-manager pod replaced--> upgrading
    upgrading --driver-manager reports the target--> validating
    validating --version + health + allocatable back--> done (uncordoned unless the admin
                                                           had cordoned it)
    any active state --error / timeout--> failed (rollout paused)

``step`` is a pure function of (``NodeFacts``, ``Policy``, now) returning a ``Step``: the
new state and record plus what the controller must do (cordon, uncordon, replace
driver-manager's pod, Event); the controller evicts the GPU pods of every node in
``cordoned`` (``gpuk8s.ansible.eviction``, one round per pass) and puts the outcome into
the next facts. ``admit`` picks which waiting nodes may start, honouring
``maxParallel`` (nodes between cordoned and validating) and ``maxUnavailable`` (GPU nodes
unschedulable or NotReady, whatever the reason, plus nodes in the upgrade). Any node in
``failed`` pauses the rollout: no new node starts until the admin relabels it
``upgrade-required`` (retry) or changes the target.

Failure and cordon, argued: a node fails cordoned when something on the host changed or
may have changed (driver install, load, validation): its GPUs are not known good. A drain
that cannot finish (PDB, refused pods) changed nothing on the host, so the node is
uncordoned again (unless the admin had cordoned it) and marked ``failed``: a healthy node
is never left cordoned, an unhealthy one never uncordoned.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ...core.errors import ConfigError
from ...core.labels import PREFIX, UPGRADE_STATE_LABEL, UPGRADE_STATES
from ...core.model import DriverInfo
from ...host.driver import same_version as _same_version
from ..nodeagent import state_annotation

STATE_LABEL = UPGRADE_STATE_LABEL  # gpu-label leaves it alone (core.labels.FOREIGN_LABELS)
RECORD_ANNOTATION = PREFIX + "driver.upgrade"
AGENT_REPORT = state_annotation("driver-manager.driver")  # driver-manager's report

STATES = UPGRADE_STATES
REQUIRED, CORDONED, EVICTED, UPGRADING, VALIDATING, DONE, FAILED = STATES
ACTIVE = (CORDONED, EVICTED, UPGRADING, VALIDATING)  # counted against maxParallel
GPU_RESOURCE = "metax-tech.com/gpu"
_PERCENT = re.compile(r"^([0-9]{1,3})%$")


@dataclass(frozen=True)
class Policy:
    """Chart option ``driver.upgradePolicy`` (see values.yaml)."""

    max_parallel: int = 1
    max_unavailable: str = "25%"
    drain_timeout: float = 300.0
    upgrade_timeout: float = 600.0  # upgrading + validating
    force: bool = False
    delete_emptydir_data: bool = False
    pod_selector: str = ""

    def check(self) -> None:
        if self.max_parallel < 1:
            raise ConfigError(f"driver.upgradePolicy.maxParallel: {self.max_parallel} must "
                              "be an integer >= 1")
        unavailable_limit(self.max_unavailable, 1)
        if not self.drain_timeout > 0:
            raise ConfigError(f"driver.upgradePolicy.drainTimeoutSeconds: "
                              f"{self.drain_timeout} must be > 0")
        if not self.upgrade_timeout > 0:
            raise ConfigError(f"driver.upgradePolicy.upgradeTimeoutSeconds: "
                              f"{self.upgrade_timeout} must be > 0")


def unavailable_limit(value: str, nodes: int) -> int:
    """``maxUnavailable`` as a node count: an integer, or ``N%`` of the GPU nodes rounded
    up; never below 1 (a rollout that may take no node would never progress)."""
    text = str(value).strip()
    match = _PERCENT.match(text)
    if match:
        percent = int(match.group(1))
        if not 0 < percent <= 100:
            raise ConfigError(f"driver.upgradePolicy.maxUnavailable: {value!r} must be "
                              "1%..100% or an integer >= 1")
        return max(1, math.ceil(nodes * percent / 100))
    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise ConfigError(f"driver.upgradePolicy.maxUnavailable: {value!r} must be an integer "
                      ">= 1 or a percentage such as 25%")


@dataclass(frozen=True)
class Target:
    """What the rollout wants on every node (None: not managed)."""

    version: str | None = None  # driver.payload.version with deployPolicy Always


@dataclass(frozen=True)
class Record:
    """The annotation: what must survive a controller restart."""

    version: str | None = None  # target driver version of this upgrade
    vfnum: int | None = None  # target VF count of this upgrade
    admin_cordoned: bool = False  # the node was unschedulable before we cordoned it
    started: float | None = None  # when it left upgrade-required (epoch seconds)
    since: float | None = None  # when it entered its current state
    message: str = ""  # last failure / progress note
    gpus: int | None = None  # physical GPUs (capacity / VFs per GPU) when it started
    announce: str = ""  # reason of the Event of the transition into the current state

    def to_json(self) -> str:
        body = {"version": self.version, "vfnum": self.vfnum,
                "adminCordoned": self.admin_cordoned, "started": self.started,
                "since": self.since, "message": self.message, "gpus": self.gpus}
        if self.announce:
            body["event"] = self.announce
        return json.dumps(body, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | None) -> Record:
        if not raw:
            return cls()
        try:
            data = json.loads(raw)
        except ValueError:
            return cls(message=f"unreadable {RECORD_ANNOTATION}: {raw[:80]}")
        if not isinstance(data, dict):
            return cls()
        vfnum, gpus = data.get("vfnum"), data.get("gpus")
        return cls(
            version=_str_or_none(data.get("version")),
            vfnum=vfnum if isinstance(vfnum, int) else None,
            admin_cordoned=data.get("adminCordoned") is True,
            started=_float_or_none(data.get("started")),
            since=_float_or_none(data.get("since")),
            message=str(data.get("message") or ""),
            gpus=gpus if isinstance(gpus, int) else None,
            announce=str(data.get("event") or ""),
        )


def _str_or_none(value: Any) -> str | None:
    return str(value) if value not in (None, "") else None


def _float_or_none(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


@dataclass(frozen=True)
class NodeFacts:
    """What the controller read about one GPU node this pass."""

    name: str
    state: str | None  # the label (None: never upgraded)
    record: Record
    unschedulable: bool
    ready: bool  # NodeReady condition
    # driver-manager's report (its state annotation): state, loaded version, wanted version
    agent_state: str | None = None
    agent_message: str = ""
    agent_version: str | None = None
    agent_wanted: str | None = None
    agent_vfnum: int | None = None
    vfnum_desired: int | None = None  # what driver-config asks (validated by the controller)
    vfnum_label: int | None = None  # gpu.vfnum published by gpu-label
    driver_ready: bool = False  # label driver.ready
    version_labels: tuple[str, str, str] | None = None  # gpu.driver.major/minor/patch
    capacity: int = 0  # metax-tech.com/gpu
    allocatable: int = 0
    gpu_pods: int | None = None  # GPU pods still on the node (None: not listed this pass)
    evict_refused: str = ""  # pods drain's rules refuse (force / emptyDir), when listed
    evict_blocked: str = ""  # why evictions were refused (PDB) at the last try


@dataclass(frozen=True)
class Step:
    """What ``step`` decided for one node; the controller carries it out in this order:
    replace the agent pod, then one patch (label, annotation, unschedulable)."""

    state: str | None
    record: Record
    cordon: bool | None = None  # True: cordon, False: uncordon, None: leave
    restart_agent: bool = False  # delete driver-manager's pod (DaemonSet OnDelete)
    clear_report: bool = False  # drop driver-manager's last report (it is of the old run)
    event: tuple[str, str, bool] | None = None  # (reason, message, warning)
    finished: float | None = None  # seconds the upgrade took, when it just ended

    def changed(self, facts: NodeFacts) -> bool:
        return (self.state != facts.state or self.record != facts.record
                or self.cordon is not None)


def wanted_work(facts: NodeFacts, target: Target) -> tuple[str | None, int | None]:
    """(version, vfnum) this node must change to; (None, None): nothing to do.

    A driver upgrade is due where driver-manager reports a loaded driver of another
    version (a node without a driver is installed by driver-manager directly: nothing to
    drain there). A VF change is due where driver-config asks for a VF count the node does
    not have."""
    version = None
    if target.version and facts.agent_version and \
            not _same_version(facts.agent_version, target.version):
        version = target.version
    vfnum = None
    if facts.vfnum_desired is not None and facts.agent_vfnum is not None and \
            facts.vfnum_desired != facts.agent_vfnum:
        vfnum = facts.vfnum_desired
    return version, vfnum


def step(facts: NodeFacts, target: Target, policy: Policy, now: float,
         may_start: bool = False) -> Step:
    """The next step of one node (pure). ``may_start``: ``admit`` gave it a slot. A step
    into another state records in ``Record.announce`` the reason of its Event (none: "")."""
    found = _step(facts, target, policy, now, may_start)
    if found.state == facts.state or found.state is None:
        return found
    return replace(found, record=replace(found.record,
                                         announce=found.event[0] if found.event else ""))


def _step(facts: NodeFacts, target: Target, policy: Policy, now: float,
          may_start: bool) -> Step:
    state, rec = facts.state, facts.record
    if state in (None, "", DONE) or state not in STATES:
        version, vfnum = wanted_work(facts, target)
        if version is None and vfnum is None:
            if state not in (None, "", DONE):  # an unknown value: put it right
                return Step(None, Record())
            return Step(state, rec)
        record = Record(version=version, vfnum=vfnum, since=now,
                        message=_work_text(version, vfnum, facts))
        return Step(REQUIRED, record, event=("DriverUpgradeRequired", record.message, False))
    if state == REQUIRED:
        version, vfnum = wanted_work(facts, target)
        if version is None and vfnum is None:
            return Step(None, Record())  # nothing left to do (target reverted)
        if (version, vfnum) != (rec.version, rec.vfnum):
            rec = replace(rec, version=version, vfnum=vfnum,
                          message=_work_text(version, vfnum, facts))
        if not may_start:
            return Step(REQUIRED, rec)
        gpus = facts.capacity // max(1, facts.agent_vfnum or 0) if facts.capacity else None
        # a retry (record already started once) keeps what it knew of the admin's cordon:
        # the cordon it finds now may be its own, left by the failure
        admin = rec.admin_cordoned if rec.started is not None else facts.unschedulable
        record = replace(rec, admin_cordoned=admin, started=now, since=now,
                         message="cordoned: evicting GPU pods", gpus=gpus)
        return Step(CORDONED, record, cordon=True,
                    event=("DriverUpgradeStarted", f"{_work_text(version, vfnum, facts)}; "
                           f"node cordoned", False))
    if state == FAILED:
        version, vfnum = wanted_work(facts, target)
        if (version, vfnum) != (rec.version, rec.vfnum) and (version or vfnum is not None):
            # the admin changed the target (e.g. a fixed payload version): start again
            record = Record(version=version, vfnum=vfnum, since=now,
                            message=_work_text(version, vfnum, facts),
                            admin_cordoned=rec.admin_cordoned, started=rec.started)
            return Step(REQUIRED, record, event=("DriverUpgradeRequired", record.message, False))
        if version is None and vfnum is None and (rec.version or rec.vfnum is not None):
            # the admin took the failed target back: the node runs what is wanted now
            if not facts.unschedulable:  # a drain failure: nothing to undo
                return Step(DONE, replace(rec, version=None, vfnum=None, since=now,
                                          message="target withdrawn; node unchanged"))
            # we hold the cordon: a fresh driver-manager (the withdrawn payload's pod
            # failed) and validation decide whether the node is healthy again
            record = replace(rec, version=target.version, vfnum=None, started=now, since=now,
                             message="target withdrawn: validating the node as it is")
            return Step(UPGRADING, record, restart_agent=target.version is not None,
                        clear_report=True)
        return Step(FAILED, rec)
    since = rec.since if rec.since is not None else now
    if rec.since is None:
        rec = replace(rec, since=now)
    if not facts.unschedulable and state in ACTIVE:
        # someone uncordoned a node we drain / upgrade: cordon it again
        return Step(state, rec, cordon=True)
    if state == CORDONED:
        if facts.evict_refused:
            return _fail(facts, rec, now, "DriverUpgradeDrainFailed",
                         f"drain refused: {facts.evict_refused}", host_changed=False)
        if facts.gpu_pods == 0:
            return Step(EVICTED, replace(rec, since=now, message="GPU pods evicted"))
        if now - since > policy.drain_timeout:
            why = facts.evict_blocked or "GPU pods did not terminate"
            return _fail(facts, rec, now, "DriverUpgradeDrainFailed",
                         f"drain timed out after {policy.drain_timeout:g}s: {why}; nothing "
                         "was changed on the host", host_changed=False)
        return Step(CORDONED, rec)
    if state == EVICTED:
        return Step(UPGRADING, replace(rec, since=now, message="driver-manager upgrading"),
                    restart_agent=rec.version is not None, clear_report=True)
    if state == UPGRADING:
        started = rec.started if rec.started is not None else since
        if facts.agent_state == "failed" and _report_is_current(facts, rec):
            return _fail(facts, rec, now, "DriverUpgradeFailed",
                         f"driver-manager: {facts.agent_message}", host_changed=True)
        if _agent_reached(facts, rec):
            return Step(VALIDATING, replace(rec, since=now, message="validating"))
        if now - started > policy.upgrade_timeout:
            return _fail(facts, rec, now, "DriverUpgradeFailed",
                         f"driver-manager did not reach the target within "
                         f"{policy.upgrade_timeout:g}s (last report: {facts.agent_state}: "
                         f"{facts.agent_message})", host_changed=True)
        return Step(UPGRADING, rec)
    if state == VALIDATING:
        started = rec.started if rec.started is not None else since
        problems = validation_problems(facts, rec)
        if not problems:
            took = now - started
            text = f"{_done_text(rec)} in {took:.0f}s"
            if rec.admin_cordoned:
                text += "; stays cordoned (it was cordoned before the upgrade)"
            return Step(DONE, replace(rec, since=now, message=text),
                        cordon=None if rec.admin_cordoned else False,
                        event=("DriverUpgradeDone", text, False), finished=took)
        if facts.agent_state == "failed" and _report_is_current(facts, rec):
            return _fail(facts, rec, now, "DriverUpgradeFailed",
                         f"driver-manager: {facts.agent_message}", host_changed=True)
        if now - started > policy.upgrade_timeout:
            return _fail(facts, rec, now, "DriverUpgradeValidationFailed",
                         "validation failed: " + "; ".join(problems), host_changed=True)
        return Step(VALIDATING, replace(rec, message="validating: " + "; ".join(problems)))
    return Step(state, rec)  # pragma: no cover - every state is handled above


def _fail(facts: NodeFacts, rec: Record, now: float, reason: str, message: str,
          host_changed: bool) -> Step:
    text = f"{message}; rollout paused"
    if host_changed:
        text += "; node stays cordoned"
        cordon: bool | None = None
    else:
        cordon = None if rec.admin_cordoned else False
        if cordon is False:
            text += "; node uncordoned (its GPUs were not touched)"
    took = now - rec.started if rec.started is not None else None
    return Step(FAILED, replace(rec, since=now, message=text), cordon=cordon,
                event=(reason, text, True), finished=took)


def _report_is_current(facts: NodeFacts, rec: Record) -> bool:
    """A failure report of the driver-manager that works for this upgrade's target."""
    if rec.version is None:
        return "vfnum" in facts.agent_message
    return facts.agent_wanted is not None and _same_version(facts.agent_wanted, rec.version)


def _agent_reached(facts: NodeFacts, rec: Record) -> bool:
    if facts.agent_state != "ready":
        return False
    if rec.version is not None and not (_same_version(facts.agent_version, rec.version) and
                                        _same_version(facts.agent_wanted, rec.version)):
        return False
    return rec.vfnum is None or facts.agent_vfnum == rec.vfnum


def validation_problems(facts: NodeFacts, rec: Record) -> list[str]:
    """Why the node is not validated yet: version, health, allocatable (empty: good)."""
    problems = []
    if not _agent_reached(facts, rec):
        problems.append(f"driver-manager reports {facts.agent_state} "
                        f"(version {facts.agent_version}, vfnum {facts.agent_vfnum})")
    if not facts.driver_ready:
        problems.append("driver.ready is not true")
    if rec.version is not None:
        parts = DriverInfo(loaded=True, version=rec.version).version_parts
        want = tuple(str(p) for p in parts) if parts else None
        if facts.version_labels != want:
            problems.append(f"version labels {'.'.join(facts.version_labels or ('?',))} "
                            f"!= {rec.version}")
    if rec.vfnum is not None and facts.vfnum_label != rec.vfnum:
        problems.append(f"gpu.vfnum label {facts.vfnum_label} != {rec.vfnum}")
    if rec.vfnum is not None and rec.gpus and facts.capacity != rec.gpus * max(1, rec.vfnum):
        problems.append(f"capacity {GPU_RESOURCE} {facts.capacity} != {rec.gpus} GPU(s) x "
                        f"{max(1, rec.vfnum)}")
    if not facts.ready:
        problems.append("node not Ready")
    if facts.capacity <= 0 or facts.allocatable != facts.capacity:
        problems.append(f"allocatable {GPU_RESOURCE} {facts.allocatable}/{facts.capacity} "
                        "(every GPU must be healthy)")
    return problems


def _work_text(version: str | None, vfnum: int | None, facts: NodeFacts) -> str:
    parts = []
    if version is not None:
        parts.append(f"driver {facts.agent_version} -> {version}")
    if vfnum is not None:
        parts.append(f"vfnum {facts.agent_vfnum} -> {vfnum}")
    return ", ".join(parts) or "nothing"


def _done_text(rec: Record) -> str:
    parts = []
    if rec.version is not None:
        parts.append(f"driver {rec.version}")
    if rec.vfnum is not None:
        parts.append(f"vfnum {rec.vfnum}")
    return "upgraded to " + ", ".join(parts or ["target"])


@dataclass(frozen=True)
class Budget:
    """How many more nodes may start now, and why not when none may."""

    slots: int
    reason: str = ""
    limits: dict[str, int] = field(default_factory=dict)


def budget(nodes: Sequence[NodeFacts], policy: Policy) -> Budget:
    """Free slots under ``maxParallel`` and ``maxUnavailable`` (0 while a node failed)."""
    active = sum(1 for n in nodes if n.state in ACTIVE)
    limit = unavailable_limit(policy.max_unavailable, len(nodes))
    unavailable = sum(1 for n in nodes if is_unavailable(n))
    limits = {"maxParallel": policy.max_parallel, "maxUnavailable": limit,
              "active": active, "unavailable": unavailable}
    failed = [n.name for n in nodes if n.state == FAILED]
    if failed:
        return Budget(0, f"rollout paused: node(s) failed: {', '.join(sorted(failed)[:5])}",
                      limits)
    slots = policy.max_parallel - active
    if slots <= 0:
        return Budget(0, f"maxParallel {policy.max_parallel} nodes upgrading", limits)
    return Budget(slots, "", limits)


def is_unavailable(facts: NodeFacts) -> bool:
    """Counted against maxUnavailable: unschedulable (cordoned by anyone) or NotReady, or
    in the active part of an upgrade."""
    return facts.unschedulable or not facts.ready or facts.state in ACTIVE


def admit(nodes: Sequence[NodeFacts], policy: Policy) -> list[str]:
    """The ``upgrade-required`` nodes that may start now (sorted by name, so passes and
    restarted controllers agree). A node already unavailable (admin-cordoned, NotReady)
    costs no maxUnavailable budget; any other costs one."""
    room = budget(nodes, policy)
    if room.slots <= 0:
        return []
    spare = room.limits["maxUnavailable"] - room.limits["unavailable"]
    chosen: list[str] = []
    waiting = sorted((n for n in nodes if n.state == REQUIRED), key=lambda n: n.name)
    for node in waiting:
        if len(chosen) >= room.slots:
            break
        if is_unavailable(node):
            chosen.append(node.name)
        elif spare > 0:
            spare -= 1
            chosen.append(node.name)
    return chosen


def counts(states: Iterable[str | None]) -> dict[str, int]:
    """Nodes per state (``none`` for nodes without the label), for the gauge."""
    out = {s: 0 for s in (*STATES, "none")}
    for state in states:
        out[state if state in STATES else "none"] += 1
    return out


def facts_from_node(node: Mapping[str, Any], agent: Mapping[str, Any],
                    vfnum_desired: int | None, gpu_pods: int | None = None,
                    evict_refused: str = "", evict_blocked: str = "") -> NodeFacts:
    """``NodeFacts`` from a Node object as the API serves it and driver-manager's report."""
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    notes = meta.get("annotations") or {}
    status = node.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                for c in status.get("conditions") or [])
    parts = tuple(labels.get(PREFIX + f"gpu.driver.{p}") for p in ("major", "minor", "patch"))
    return NodeFacts(
        name=str(meta.get("name")),
        state=labels.get(STATE_LABEL),
        record=Record.from_json(notes.get(RECORD_ANNOTATION)),
        unschedulable=bool((node.get("spec") or {}).get("unschedulable")),
        ready=ready,
        agent_state=_str_or_none(agent.get("state")),
        agent_message=str(agent.get("message") or ""),
        agent_version=_str_or_none(agent.get("version")),
        agent_wanted=_str_or_none(agent.get("wanted")),
        agent_vfnum=_int_or_none(agent.get("vfnum")),
        vfnum_desired=vfnum_desired,
        vfnum_label=_int_or_none(labels.get(PREFIX + "gpu.vfnum")),
        driver_ready=labels.get(PREFIX + "driver.ready") == "true",
        version_labels=(str(parts[0]), str(parts[1]), str(parts[2]))
        if all(p is not None for p in parts) else None,
        capacity=_int_or_none((status.get("capacity") or {}).get(GPU_RESOURCE)) or 0,
        allocatable=_int_or_none((status.get("allocatable") or {}).get(GPU_RESOURCE)) or 0,
        gpu_pods=gpu_pods, evict_refused=evict_refused, evict_blocked=evict_blocked,
    )


def _int_or_none(value: Any) -> int | None:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return None


def node_patch(step_: Step) -> dict[str, Any]:
    """The one merge patch that records ``step_`` on the Node (label, annotation, cordon
    together: a crash never leaves a cordon without the state that explains it)."""
    state = step_.state if step_.state else None
    body: dict[str, Any] = {"metadata": {
        "labels": {STATE_LABEL: state},
        "annotations": {RECORD_ANNOTATION: step_.record.to_json() if state else None},
    }}
    if step_.clear_report:
        body["metadata"]["annotations"][AGENT_REPORT] = None
    if step_.cordon is not None:
        body["spec"] = {"unschedulable": step_.cordon}
    return body


def cordon_at_uninstall(node: Mapping[str, Any]) -> tuple[bool, str]:
    """What an uninstall does with the cordon of a Node the upgrade may hold, the
    controller gone for good (it cannot finish the upgrade): ``(lift, why_kept)``.

    The upgrade's own cordon is lifted where nothing on the host changed yet
    (``cordoned``, ``pods-evicted``: driver-manager was not replaced); it stays where the
    host changed or may have (``upgrading``, ``validating``, ``failed`` cordoned, or a
    failed node relabelled ``upgrade-required`` for a retry): its GPUs are not known
    good, ``why_kept`` says so. An admin's cordon (the record's ``adminCordoned``) and a
    node the upgrade never cordoned are left as they are, silently."""
    meta = node.get("metadata") or {}
    state = (meta.get("labels") or {}).get(STATE_LABEL)
    rec = Record.from_json((meta.get("annotations") or {}).get(RECORD_ANNOTATION))
    unschedulable = bool((node.get("spec") or {}).get("unschedulable"))
    if not unschedulable or rec.admin_cordoned or state in (None, DONE):
        return False, ""
    if state in (CORDONED, EVICTED):
        return True, ""
    if state == REQUIRED and rec.started is None:
        return False, ""  # not started: the cordon is not the upgrade's
    return False, (f"left cordoned: its driver upgrade stopped in state {state}"
                   + (f" ({rec.message})" if rec.message else "")
                   + "; the host's driver may have changed: check it (mx-smi; "
                   "playbooks/maintenance.yml on this node rolls back an install left "
                   "half-way and installs the version given), then "
                   f"`kubectl uncordon {meta.get('name', '')}`")
