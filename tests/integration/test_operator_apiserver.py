"""operator-controller against a real kube-apiserver (admin credentials; the chart's RBAC
is checked by the chart tests): driver-config creation and validation, the desired VF
count on the Node, Events in the namespaces the API requires, the status ConfigMap, and
the uninstall cleanup of labels and annotations."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import yaml

from gpuk8s.services.kube import api_client
from gpuk8s.services.nodeagent import VFNUM_DESIRED
from gpuk8s.services.operator.controller import CONFIG_NAME, STATUS_NAME, Controller
from gpuk8s.services.operator.main import KubeCluster

pytestmark = pytest.mark.integration


@pytest.fixture()
def cluster(apiserver: Any) -> Any:
    from kubernetes import client

    core = apiserver.core()
    namespace = f"op-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    node = f"gpu-{uuid.uuid4().hex[:6]}"
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=node, labels={
        "metax-tech.com/gpu.installed": "true", "metax-tech.com/gpu.product": "C500",
        "metax-tech.com/gpu.sriov": "off", "metax-tech.com/maca.ready": "true",
        "kubernetes.io/os": "linux"}, annotations={"metax-tech.com/gpu.devices": "[]"})))
    yield KubeCluster(api_client(apiserver.kubeconfig("admin")), namespace), core, node
    core.delete_node(node)


def test_driver_config_vfnums_events_and_status_on_a_real_apiserver(cluster: Any) -> None:
    kube, core, node = cluster
    controller = Controller(kube, {"app.kubernetes.io/managed-by": "operator-controller"})
    controller.one_pass()
    cm = core.read_namespaced_config_map(CONFIG_NAME, kube.namespace)
    assert yaml.safe_load(cm.data["node-vfnums"]) == {"nodes": {}}
    core.patch_namespaced_config_map(CONFIG_NAME, kube.namespace, {"data": {
        "node-vfnums": f"nodes: {{{node}: {{vfnum: 4}}}}"}})
    controller.one_pass()
    assert core.read_node(node).metadata.annotations[VFNUM_DESIRED] == "4"
    core.patch_namespaced_config_map(CONFIG_NAME, kube.namespace, {"data": {
        "node-vfnums": f"nodes: {{{node}: {{vfnum: 5}}}}"}})
    status = controller.one_pass()
    assert core.read_node(node).metadata.annotations[VFNUM_DESIRED] == "4"  # kept
    assert any(c["node"] == node for c in status["conditions"])
    # Node Events live in "default" (API rule for cluster-scoped objects)
    node_events = core.list_namespaced_event(
        "default", field_selector=f"involvedObject.name={node},reason=InvalidVfnum").items
    assert node_events and "vfnum 5" in node_events[0].message
    cm_events = core.list_namespaced_event(
        kube.namespace, field_selector=f"involvedObject.name={CONFIG_NAME}").items
    assert cm_events and cm_events[0].type == "Warning"
    saved = core.read_namespaced_config_map(STATUS_NAME, kube.namespace).data
    assert yaml.safe_load(saved["nodes"])[node]["vfnumDesired"] == "4"
    # an admin's edit is never overwritten by the controller
    assert core.read_namespaced_config_map(CONFIG_NAME, kube.namespace).data[
        "node-vfnums"] == f"nodes: {{{node}: {{vfnum: 5}}}}"


def test_uninstall_takes_every_label_and_annotation_of_ours_off_the_nodes(
    cluster: Any,
) -> None:
    kube, core, node = cluster
    Controller(kube).one_pass()  # creates driver-config and operator-status
    core.patch_node(node, {"metadata": {"labels": {"example.com/keep": "yes"},
                                        "annotations": {"example.com/keep": "yes"}}})
    done, left = kube.uninstall(timeout=30)
    assert left == [], left
    meta = core.read_node(node).metadata
    assert not [k for k in meta.labels if k.startswith("metax-tech.com/")]
    assert not [k for k in (meta.annotations or {}) if k.startswith("metax-tech.com/")]
    assert meta.labels["example.com/keep"] == "yes"
    assert meta.annotations["example.com/keep"] == "yes"
    names = [c.metadata.name for c in core.list_namespaced_config_map(kube.namespace).items]
    assert CONFIG_NAME not in names and STATUS_NAME not in names
    assert any("removed from" in line for line in done)


def test_uninstall_lifts_an_unfinished_upgrades_cordon_only_where_the_host_did_not_change(
    cluster: Any,
) -> None:
    from kubernetes import client

    from gpuk8s.services.operator import upgrade

    kube, core, _node = cluster
    record = upgrade.Record(version="2.33.0.6", started=1.0, since=1.0,
                            message="cordoned: evicting GPU pods").to_json()
    admin = upgrade.Record(version="2.33.0.6", admin_cordoned=True, started=1.0).to_json()
    nodes = {f"{state}-{uuid.uuid4().hex[:6]}": (state, rec)
             for state, rec in ((upgrade.EVICTED, record), (upgrade.UPGRADING, record),
                                (upgrade.CORDONED, admin))}
    for name, (state, rec) in nodes.items():
        core.create_node(client.V1Node(
            metadata=client.V1ObjectMeta(name=name, labels={
                "metax-tech.com/gpu.installed": "true", upgrade.STATE_LABEL: state},
                annotations={upgrade.RECORD_ANNOTATION: rec}),
            spec=client.V1NodeSpec(unschedulable=True)))
    try:
        done, left = kube.uninstall(timeout=30)
        assert left == [], left
        got = {name: bool(core.read_node(name).spec.unschedulable) for name in nodes}
        evicted, upgrading, admins = nodes
        assert got == {evicted: False, upgrading: True, admins: True}, got
        assert any("uncordoned 1 node(s)" in line and evicted in line for line in done), done
        assert any(line.startswith(f"warning: node {upgrading} left cordoned") for line in done)
        events = core.list_namespaced_event(
            "default", field_selector=f"involvedObject.name={upgrading}").items
        assert [e.reason for e in events] == ["DriverUpgradeInterrupted"]
        for name in nodes:  # the record went with the decision
            meta = core.read_node(name).metadata
            assert upgrade.RECORD_ANNOTATION not in (meta.annotations or {})
    finally:
        for name in nodes:
            core.delete_node(name)


def test_a_release_confined_to_a_node_group_reads_and_cleans_only_those_nodes(
    cluster: Any,
) -> None:
    """Two schemes side by side (inventories/fleet): the operator release's nodeSelector
    (--node-selector) is the controller's whole world, and its uninstall leaves the other
    scheme's nodes, labels and annotations alone."""
    from kubernetes import client

    kube, core, other = cluster  # a GPU node of the other scheme (no scheme label)
    scheme = "gpuk8s.io/scheme"
    ours = f"op-{uuid.uuid4().hex[:6]}"
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=ours, labels={
        "metax-tech.com/gpu.installed": "true", "metax-tech.com/gpu.product": "C500",
        scheme: "operator"}, annotations={"metax-tech.com/gpu.devices": "[]"})))
    confined = KubeCluster(kube.client, kube.namespace, f"{scheme}=operator")
    try:
        assert [n["metadata"]["name"] for n in confined.gpu_nodes()] == [ours]
        assert {n["metadata"]["name"] for n in kube.gpu_nodes()} >= {ours, other}
        status = Controller(confined).one_pass()
        assert list(status["nodes"]) == [ours] and status["summary"].endswith(
            "/1 GPU node(s) ready"), status
        done, left = confined.uninstall(timeout=30)
        assert left == [], left
        mine, theirs = core.read_node(ours).metadata, core.read_node(other).metadata
        assert not [k for k in mine.labels if k.startswith("metax-tech.com/")]
        assert not [k for k in (mine.annotations or {}) if k.startswith("metax-tech.com/")]
        assert mine.labels[scheme] == "operator"  # the play's, removed by uninstall.yml
        assert theirs.labels["metax-tech.com/gpu.installed"] == "true"
        assert theirs.annotations == {"metax-tech.com/gpu.devices": "[]"}
        assert any("marked 1 GPU node(s)" in line for line in done), done
    finally:
        core.delete_node(ours)


def test_the_extensions_hook_cleans_its_nodes_only_and_touches_no_configmap(
    cluster: Any, apiserver: Any, capsys: pytest.CaptureFixture[str],
) -> None:
    """`gpuk8s serve node-cleanup` (the GPU Extensions chart's pre-delete hook): the nodes
    its selector picks lose every metax-tech.com/ label and annotation (the marker too),
    another scheme's node keeps its own; no controller, so no ConfigMap is deleted."""
    from kubernetes import client

    from gpuk8s.services.operator.cleanup import main as node_cleanup

    kube, core, other = cluster
    ours = f"ext-{uuid.uuid4().hex[:6]}"
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=ours, labels={
        "metax-tech.com/gpu.installed": "true", "metax-tech.com/driver.ready": "true",
        "gpuk8s.io/scheme": "extensions", "example.com/keep": "yes"},
        annotations={"metax-tech.com/gpu.topology": "{}", "example.com/keep": "yes"})))
    Controller(kube).one_pass()  # an operator release's ConfigMaps in the namespace
    try:
        assert node_cleanup(["--namespace", kube.namespace, "--kubeconfig",
                             apiserver.kubeconfig("admin"), "--node-selector",
                             "gpuk8s.io/scheme=extensions", "--timeout", "30"]) == 0
        out = capsys.readouterr()
        assert "left:" not in out.err and "removed from 1 node(s)" in out.out, out
        mine, theirs = core.read_node(ours).metadata, core.read_node(other).metadata
        assert mine.labels == {"gpuk8s.io/scheme": "extensions", "example.com/keep": "yes"}
        assert mine.annotations == {"example.com/keep": "yes"}
        assert theirs.labels["metax-tech.com/gpu.installed"] == "true"
        names = {c.metadata.name for c in core.list_namespaced_config_map(kube.namespace).items}
        assert {CONFIG_NAME, STATUS_NAME} <= names
    finally:
        core.delete_node(ours)
