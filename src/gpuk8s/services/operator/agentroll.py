"""Replacing out-of-date driver-manager pods after a ``helm upgrade``, as a pure plan.

driver-manager's DaemonSet is ``OnDelete``: the DaemonSet controller creates a pod from
the current template only where one was deleted. The chart stamps the template with
``metax-tech.com/template-hash`` (sha256 of the rendered pod spec: images, flags, log
options, deploy policy, driver version, SDK images...), which every pod created from it
carries. A pod whose value differs from its DaemonSet's is **out of date**.

Who replaces an out-of-date pod:

* a node the rolling driver upgrade owns (``upgrade-required``, ``cordoned`` ..
  ``validating``, ``failed``) is left to it: it replaces driver-manager's pod after the
  drain (``pods-evicted``), never in the middle of an install, and a failed node is the
  administrator's to retry;
* every other node's pod is deleted **directly**, without a drain. That is safe because
  the new pod cannot touch what running GPU pods use without the drain: driver-manager
  changes a *loaded* driver or a VF count only while its node's upgrade state is
  ``upgrading`` (``drivermanager.agent.DriverAgent._held``); a node without a driver runs
  no GPU pods; a new SDK is switched in beside the old one, which running containers keep
  (``host.sdk``; docs/operator.md argues each case).

Bound, like a DaemonSet's ``RollingUpdate.maxUnavailable`` (and as crash-safe: nothing is
remembered between passes): driver-manager pods unavailable (terminating, not Ready, or
missing: fewer nodes covered than the DaemonSet's ``desiredNumberScheduled``) on nodes
outside the upgrade count against ``limit``; a pod is deleted only while fewer than
``limit`` are. An out-of-date pod that is unavailable anyway is replaced without using
the budget (the new template may be its fix). So a template whose pods never become
Ready stops the roll after ``limit`` nodes.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...core.labels import PREFIX

TEMPLATE_HASH = PREFIX + "template-hash"  # pod template annotation (charts/metax-operator)


@dataclass(frozen=True)
class AgentPod:
    name: str
    node: str
    template_hash: str | None
    ready: bool
    terminating: bool
    uid: str = ""

    @property
    def unavailable(self) -> bool:
        return self.terminating or not self.ready


@dataclass(frozen=True)
class RollPlan:
    replace: tuple[AgentPod, ...]  # delete these pods now (in this order)
    outdated: int  # out-of-date pods outside the upgrade (before this plan)
    unavailable: int  # pods unavailable outside the upgrade (before this plan)
    waiting: str = ""  # why out-of-date pods wait (empty: none waits)

    def report(self) -> dict[str, Any]:
        out: dict[str, Any] = {"outdated": self.outdated, "unavailable": self.unavailable}
        if self.replace:
            out["replacing"] = sorted(p.node for p in self.replace)
        if self.waiting:
            out["waiting"] = self.waiting
        return out


def agent_pod(pod: Mapping[str, Any]) -> AgentPod | None:
    """An ``AgentPod`` from a Pod as the API serves it; None for a pod not yet bound."""
    meta = pod.get("metadata") or {}
    node = (pod.get("spec") or {}).get("nodeName")
    if not node:
        return None
    conditions = (pod.get("status") or {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    return AgentPod(name=str(meta.get("name")), node=str(node),
                    template_hash=(meta.get("annotations") or {}).get(TEMPLATE_HASH),
                    ready=ready, terminating=bool(meta.get("deletionTimestamp")),
                    uid=str(meta.get("uid") or ""))


def agent_pods(pods: Iterable[Mapping[str, Any]]) -> list[AgentPod]:
    return [p for p in (agent_pod(pod) for pod in pods) if p is not None]


def template_hash(daemonset: Mapping[str, Any] | None) -> tuple[str | None, int | None]:
    """(the template's hash, ``status.desiredNumberScheduled``) of a DaemonSet."""
    if not daemonset:
        return None, None
    template = ((daemonset.get("spec") or {}).get("template") or {}).get("metadata") or {}
    desired = (daemonset.get("status") or {}).get("desiredNumberScheduled")
    return ((template.get("annotations") or {}).get(TEMPLATE_HASH),
            desired if isinstance(desired, int) else None)


def plan(want: str | None, pods: Sequence[AgentPod], desired: int | None,
         owned: Collection[str], limit: int) -> RollPlan:
    """Which out-of-date pods to delete now (see the module doc). ``want``: the
    DaemonSet's template hash (None: a template without one, nothing is rolled);
    ``desired``: its ``desiredNumberScheduled`` (None: unknown, missing pods not counted);
    ``owned``: nodes the rolling upgrade owns; ``limit``: at most this many pods
    unavailable outside the upgrade."""
    if want is None:
        return RollPlan((), 0, 0)
    covered = {p.node for p in pods}
    missing = max(0, desired - len(covered)) if desired is not None else 0
    mine = [p for p in pods if p.node not in owned]
    unavailable = sum(1 for p in mine if p.unavailable) + missing
    outdated = sorted((p for p in mine if p.template_hash != want and not p.terminating),
                      key=lambda p: (p.node, p.name))
    chosen = [p for p in outdated if p.unavailable]  # costs no budget
    room = limit - unavailable
    for pod in outdated:
        if room <= 0:
            break
        if not pod.unavailable:
            chosen.append(pod)
            room -= 1
    waiting = ""
    left = len(outdated) - len(chosen)
    if left:
        waiting = (f"{left} out-of-date driver-manager pod(s) wait: {unavailable} "
                   f"unavailable (limit driver.upgradePolicy.maxParallel {limit})")
    return RollPlan(tuple(chosen), len(outdated), unavailable, waiting)
