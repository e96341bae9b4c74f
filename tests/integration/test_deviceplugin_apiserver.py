"""Node annotations against a real kube-apiserver (the ``apiserver`` fixture of
tests/integration/conftest.py: etcd + kube-apiserver, RBAC on).

The plugin runs as the fixture's ``gpu-device`` user, which may only ``get`` and
``patch`` nodes (the chart's RBAC need); the test checks that the device plugin's
``KubernetesNodePatcher`` writes the annotations, leaves other annotations alone, and
sends nothing when nothing changed (the Node's resourceVersion stays put).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from gpuk8s import sim
from gpuk8s.core.devicelist import DEVICES_ANNOTATION, parse_device_list
from gpuk8s.core.scoring import LOSSES_ANNOTATION, SCORES_ANNOTATION, parse_table
from gpuk8s.discovery import discover
from gpuk8s.services.deviceplugin.main import DevicePluginApp, PluginConfig
from gpuk8s.services.deviceplugin.server import wait_until
from gpuk8s.services.kube import PermanentApiError, api_client
from gpuk8s.services.node.nodeclient import KubernetesNodePatcher
from tests.unit.kubelet_harness import FakeKubelet

pytestmark = [
    pytest.mark.integration,
    # the throwaway apiserver serves a self-signed certificate
    pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning"),
]


@pytest.fixture
def node_name(apiserver: Any) -> Iterator[str]:
    """A Node of its own on the shared API server, with somebody else's annotation."""
    name = f"gpu-node-{uuid.uuid4().hex[:8]}"
    core = apiserver.core()
    core.create_node({"metadata": {"name": name, "annotations": {"example.com/keep": "me"}}})
    yield name
    core.delete_node(name)


def _node(apiserver: Any, name: str) -> tuple[dict[str, str], str]:
    obj = apiserver.core().read_node(name)
    return dict(obj.metadata.annotations or {}), str(obj.metadata.resource_version)


def test_annotations_on_a_real_node(
    apiserver: Any,
    node_name: str,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the simulator's fake vendor tools run with this interpreter
    monkeypatch.setenv("PATH", f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}")
    root = str(tmp_path_factory.mktemp("sim") / "c500")
    sim.create(root, "c500-8")
    inv = discover(root)
    plugin = apiserver.kubeconfig("gpu-device")
    patcher = KubernetesNodePatcher(plugin)
    # the plugin's user may patch nodes but not, say, delete them
    with pytest.raises(PermanentApiError, match="403"):
        from kubernetes import client

        try:
            client.CoreV1Api(api_client(plugin)).delete_node(node_name)
        except Exception as err:
            from gpuk8s.services.kube import classify

            raise classify(err, "delete node") from err

    with tempfile.TemporaryDirectory(prefix="dpa-") as plugin_dir:
        pr_socket = os.path.join(plugin_dir, "pr.sock")
        kubelet = FakeKubelet(plugin_dir, pr_socket).start()
        cfg = PluginConfig(
            host_root=root, plugin_dir=plugin_dir, healthy_interval=0,
            watch_interval=0.1, node_name=node_name, pod_resources_socket=pr_socket,
            node_state_interval=0.5,
        )  # fmt: skip
        app = DevicePluginApp(cfg, inv, patcher=patcher)
        app.start()
        try:
            assert wait_until(lambda: DEVICES_ANNOTATION in _node(apiserver, node_name)[0], 60)
            annotations, rv = _node(apiserver, node_name)
            assert annotations["example.com/keep"] == "me"
            entries = parse_device_list(annotations[DEVICES_ANNOTATION])
            assert [e.id for e in entries] == [g.pci_address for g in inv.gpus]
            assert set(parse_table(annotations[SCORES_ANNOTATION])) == set(range(1, 9))
            assert set(parse_table(annotations[LOSSES_ANNOTATION])) == set(range(1, 9))

            time.sleep(2.0)  # four sync periods with nothing new
            assert _node(apiserver, node_name)[1] == rv, "unchanged state must not be patched"

            ids = [g.pci_address for g in inv.gpus]
            kubelet.set_pod("default", "job", {"metax-tech.com/gpu": ids[4:8]})
            assert wait_until(
                lambda: sum(
                    e.allocated
                    for e in parse_device_list(_node(apiserver, node_name)[0][DEVICES_ANNOTATION])
                ) == 4,
                60,
            )  # fmt: skip
            annotations, _ = _node(apiserver, node_name)
            assert set(parse_table(annotations[SCORES_ANNOTATION])) == {1, 2, 3, 4}
            assert annotations["example.com/keep"] == "me"
        finally:
            app.stop()
            kubelet.stop()
