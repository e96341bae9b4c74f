"""Confining a release's node agents to a node group (issue 49): the `nodeSelector` and
`affinity` values of both charts reach every node agent DaemonSet, merged with the
agent's own placement; empty (the default), each agent's placement is what it was.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_charts import (  # noqa: F401 (kubeconform_schemas: a fixture)
    EXT,
    OP,
    OP_MIN,
    _deep_merge,
    assert_kubeconform_accepts,
    kubeconform_schemas,
    render,
    render_error,
)

# every node agent of each chart switched on
ALL_AGENTS: dict[Path, dict[str, Any]] = {
    EXT: {"gpuDra": {"enabled": True}, "gpuExporter": {"enabled": True}},
    OP: _deep_merge(OP_MIN, {"gpuDra": {"enabled": True}, "gpuExporter": {"enabled": True}}),
}
# each chart's node agents (DaemonSets) with every agent on
AGENTS = {
    EXT: {"gpu-label", "metax-gpu-device", "gpu-mps", "metax-gpu-dra", "gpu-exporter"},
    OP: {"gpu-label", "metax-gpu-device", "gpu-mps", "metax-gpu-dra", "gpu-exporter",
         "container-runtime", "driver-manager"},
}
OS = {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}
SCHEME = {"gpuk8s.io/scheme": "extensions"}
USER_TERMS = [
    {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]},
    {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["b"]}],
     "matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n9"]}]},
]
PREFERRED = [{"weight": 5, "preference": {"matchExpressions": [
    {"key": "zone", "operator": "In", "values": ["z1"]}]}}]
ANTI = {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "podAffinityTerm": {
    "topologyKey": "kubernetes.io/hostname",
    "labelSelector": {"matchLabels": {"app": "train"}}}}]}


def daemonsets(chart: Path, extra: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    docs = render(chart, _deep_merge(ALL_AGENTS[chart], extra or {}))
    return {d["metadata"]["name"]: d["spec"]["template"]["spec"]
            for d in docs if d["kind"] == "DaemonSet"}


def own_terms(spec: dict[str, Any]) -> list[dict[str, Any]]:
    aff = spec.get("affinity", {}).get("nodeAffinity", {})
    return aff.get("requiredDuringSchedulingIgnoredDuringExecution", {}).get(
        "nodeSelectorTerms", [])  # type: ignore[no-any-return]


@pytest.mark.parametrize("chart", [EXT, OP], ids=["extensions", "operator"])
def test_default_placement_is_each_agents_own(chart: Path) -> None:
    specs = daemonsets(chart)
    assert set(specs) == AGENTS[chart]
    # gpu-label runs on every Linux node; every other agent requires its labels plus Linux
    assert specs["gpu-label"]["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert "affinity" not in specs["gpu-label"]
    for name, spec in specs.items():
        if name == "gpu-label":
            continue
        assert "nodeSelector" not in spec, name
        terms = own_terms(spec)
        assert len(terms) == 1 and terms[0]["matchExpressions"][0] == OS, name
        assert set(spec["affinity"]) == {"nodeAffinity"}, name


@pytest.mark.parametrize("chart", [EXT, OP], ids=["extensions", "operator"])
def test_node_selector_reaches_every_agent(chart: Path) -> None:
    default = daemonsets(chart)
    specs = daemonsets(chart, {"nodeSelector": SCHEME})
    for name, spec in specs.items():
        assert spec["nodeSelector"] == {"kubernetes.io/os": "linux", **SCHEME}, name
        # the agent's own required labels are untouched
        assert own_terms(spec) == own_terms(default[name]), name


@pytest.mark.parametrize("chart", [EXT, OP], ids=["extensions", "operator"])
def test_node_selector_cannot_drop_linux(chart: Path) -> None:
    specs = daemonsets(chart, {"nodeSelector": {"kubernetes.io/os": "windows"}})
    for name, spec in specs.items():
        assert spec["nodeSelector"] == {"kubernetes.io/os": "linux"}, name


@pytest.mark.parametrize("chart", [EXT, OP], ids=["extensions", "operator"])
def test_affinity_terms_are_anded_with_each_agents_own(chart: Path) -> None:
    default = daemonsets(chart)
    affinity = {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": USER_TERMS},
        "preferredDuringSchedulingIgnoredDuringExecution": PREFERRED,
    }, "podAntiAffinity": ANTI}
    specs = daemonsets(chart, {"affinity": affinity})
    for name, spec in specs.items():
        assert spec["affinity"]["podAntiAffinity"] == ANTI, name
        node = spec["affinity"]["nodeAffinity"]
        assert node["preferredDuringSchedulingIgnoredDuringExecution"] == PREFERRED, name
        terms = node["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        if name == "gpu-label":  # no required labels of its own: the terms as given
            assert terms == USER_TERMS
            assert spec["nodeSelector"] == {"kubernetes.io/os": "linux"}
            continue
        ours = own_terms(default[name])[0]["matchExpressions"]
        assert terms == [
            {**user, "matchExpressions": ours + user["matchExpressions"]} for user in USER_TERMS
        ], name


@pytest.mark.parametrize("chart", [EXT, OP], ids=["extensions", "operator"])
def test_affinity_without_node_terms_keeps_the_agents_own(chart: Path) -> None:
    default = daemonsets(chart)
    specs = daemonsets(chart, {"affinity": {"podAntiAffinity": ANTI}})
    for name, spec in specs.items():
        assert spec["affinity"]["podAntiAffinity"] == ANTI, name
        assert own_terms(spec) == own_terms(default[name]), name


def test_deployments_are_not_confined() -> None:
    values = _deep_merge(ALL_AGENTS[OP], {"nodeSelector": SCHEME, "deployExtenderGPUAware": True})
    docs = render(OP, values)
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    assert deployments
    for d in deployments:
        assert "gpuk8s.io/scheme" not in d["spec"]["template"]["spec"].get("nodeSelector", {})


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"nodeSelector": {"bad key!": "x"}}, "nodeSelector"),
        ({"nodeSelector": {"pool": "no spaces"}}, "nodeSelector"),
        ({"nodeSelector": {"pool": 3}}, "nodeSelector"),
        ({"nodeSelector": ["pool=a"]}, "nodeSelector"),
        ({"affinity": {"nodeAffinty": {}}}, "affinity"),
        ({"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}}},
         "affinity"),
        ({"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchLabels": {"a": "b"}}]}}}}, "affinity"),
    ],
)
@pytest.mark.parametrize("chart", [EXT, OP], ids=["extensions", "operator"])
def test_bad_placement_is_refused_naming_the_field(
    chart: Path, values: dict[str, Any], field: str
) -> None:
    err = render_error(chart, _deep_merge(ALL_AGENTS[chart], values))
    assert f"/{field}" in err, err


@pytest.mark.parametrize("chart", [EXT, OP], ids=["extensions", "operator"])
def test_confined_render_is_valid_kubernetes(
    chart: Path, kubeconform_schemas: Path, tmp_path: Path  # noqa: F811
) -> None:
    # gpu-dra off: kubeconform's schemas of the lab's Kubernetes have no DeviceClass
    agents = _deep_merge(ALL_AGENTS[chart], {"gpuDra": {"enabled": False}})
    values = _deep_merge(agents, {
        "nodeSelector": SCHEME,
        "affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": USER_TERMS},
            "preferredDuringSchedulingIgnoredDuringExecution": PREFERRED,
        }, "podAntiAffinity": ANTI},
    })
    assert_kubeconform_accepts(chart, values, kubeconform_schemas, tmp_path / "out.yaml")
