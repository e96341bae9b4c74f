"""gpu-aware's replicas in both charts (issue 25): two by default, electing the one that
books shared GPUs on a Lease; the Service selects the leader's pod; one replica renders
no election at all."""

from __future__ import annotations

from typing import Any

import pytest

from gpuk8s.services.extender.leader import DEFAULT_LEASE, LEADER_LABEL

from .test_charts import EXT, OP, OP_MIN, container, objs, render_error

CHARTS = [(EXT, {"deployExtenderGPUAware": True}), (OP, {**OP_MIN, "deployExtenderGPUAware": True})]


def _lease_rules(role: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in role["rules"] if "coordination.k8s.io" in r["apiGroups"]]


@pytest.mark.parametrize(("chart", "values"), CHARTS, ids=["extensions", "operator"])
def test_two_replicas_elect_a_leader_by_default(chart: Any, values: dict[str, Any]) -> None:
    rendered = objs(chart, values)
    dep = rendered.get("Deployment", "gpu-aware")
    assert dep["spec"]["replicas"] == 2
    c = container(dep)
    assert "--leader-elect" in c["args"]
    env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in c["env"]}
    assert env["POD_NAME"] == "metadata.name" and env["POD_NAMESPACE"] == "metadata.namespace"
    # kube-scheduler reaches the leader only
    svc = rendered.get("Service", "gpu-aware")
    assert svc["spec"]["selector"][LEADER_LABEL] == "true"
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert {k: v for k, v in svc["spec"]["selector"].items() if k != LEADER_LABEL}.items() <= (
        pod_labels.items()
    )
    # the Lease the elector uses, nothing more
    rules = _lease_rules(rendered.get("Role", "gpu-aware"))
    assert {(v, tuple(r.get("resourceNames", ()))) for r in rules for v in r["verbs"]} == {
        ("create", ()),
        ("get", (DEFAULT_LEASE,)),
        ("update", (DEFAULT_LEASE,)),
    }
    # spread over the control-plane nodes, preferred (single-node clusters work)
    anti = dep["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    term = anti["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"


@pytest.mark.parametrize(("chart", "values"), CHARTS, ids=["extensions", "operator"])
def test_one_replica_has_no_election(chart: Any, values: dict[str, Any]) -> None:
    rendered = objs(chart, {**values, "gpuAware": {"replicas": 1}})
    dep = rendered.get("Deployment", "gpu-aware")
    assert dep["spec"]["replicas"] == 1
    assert "--leader-elect" not in container(dep)["args"]
    assert LEADER_LABEL not in rendered.get("Service", "gpu-aware")["spec"]["selector"]
    assert not _lease_rules(rendered.get("Role", "gpu-aware"))
    assert "podAntiAffinity" not in dep["spec"]["template"]["spec"]["affinity"]


@pytest.mark.parametrize("bad", [0, -1, "two", 17])
def test_replicas_are_checked_at_template_time(bad: Any) -> None:
    err = render_error(EXT, {"deployExtenderGPUAware": True, "gpuAware": {"replicas": bad}})
    assert "replicas" in err
