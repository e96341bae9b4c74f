"""Node annotations against a real kube-apiserver (integration tier).

Starts etcd and the lab's kube-apiserver (``lab/tools.sh kube`` output, cached under
/var/cache/gpuk8s/bin) with RBAC on, gives the plugin a user that may only ``get`` and
``patch`` nodes (the chart's RBAC need), and checks that the device plugin's
``KubernetesNodePatcher`` writes the annotations, leaves other annotations alone, and
sends nothing when nothing changed (the Node's resourceVersion stays put). Skips only
when etcd, kube-apiserver or openssl is missing, and says which.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuk8s import sim
from gpuk8s.core.devicelist import DEVICES_ANNOTATION, parse_device_list
from gpuk8s.core.scoring import LOSSES_ANNOTATION, SCORES_ANNOTATION, parse_table
from gpuk8s.discovery import discover
from gpuk8s.services.deviceplugin.main import DevicePluginApp, PluginConfig
from gpuk8s.services.deviceplugin.nodestate import KubernetesNodePatcher
from gpuk8s.services.deviceplugin.server import wait_until
from gpuk8s.services.kube import PermanentApiError, api_client

from .kubelet_harness import FakeKubelet

pytestmark = [
    pytest.mark.integration,
    # the throwaway apiserver serves a self-signed certificate
    pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning"),
]

CACHE_BIN = os.environ.get("GPUK8S_CACHE", "/var/cache/gpuk8s") + "/bin"
NODE = "gpu-node-1"


def _find_apiserver() -> str | None:
    candidates = sorted(glob.glob(f"{CACHE_BIN}/kube-*/kube-apiserver"), reverse=True)
    found = shutil.which("kube-apiserver")
    return candidates[0] if candidates else found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _kubeconfig(path: Path, port: int, token: str) -> str:
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {{server: "https://127.0.0.1:{port}", insecure-skip-tls-verify: true}}
users:
- name: u
  user: {{token: "{token}"}}
contexts:
- name: c
  context: {{cluster: test, user: u}}
current-context: c
"""
    )
    return str(path)


@pytest.fixture(scope="module")
def apiserver() -> Iterator[dict[str, str]]:
    apiserver_bin = _find_apiserver()
    missing = [
        name
        for name, path in (
            ("etcd", shutil.which("etcd")),
            (f"kube-apiserver (run lab/tools.sh kube; looked in {CACHE_BIN})", apiserver_bin),
            ("openssl", shutil.which("openssl")),
        )
        if not path
    ]
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")
    assert apiserver_bin is not None
    work = Path(tempfile.mkdtemp(prefix="dp-apiserver-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        etcd_port, peer_port, api_port = _free_port(), _free_port(), _free_port()
        etcd_log = open(work / "etcd.log", "wb")  # noqa: SIM115 - closed with the process
        procs.append(
            subprocess.Popen(
                [
                    "etcd",
                    "--data-dir",
                    str(work / "etcd"),
                    "--listen-client-urls",
                    f"http://127.0.0.1:{etcd_port}",
                    "--advertise-client-urls",
                    f"http://127.0.0.1:{etcd_port}",
                    "--listen-peer-urls",
                    f"http://127.0.0.1:{peer_port}",
                    "--initial-advertise-peer-urls",
                    f"http://127.0.0.1:{peer_port}",
                    "--initial-cluster",
                    f"default=http://127.0.0.1:{peer_port}",
                ],
                stdout=etcd_log,
                stderr=subprocess.STDOUT,
            )
        )
        subprocess.run(
            ["openssl", "genrsa", "-out", str(work / "sa.key"), "2048"],
            check=True, capture_output=True,
        )  # fmt: skip
        subprocess.run(
            ["openssl", "rsa", "-in", str(work / "sa.key"), "-pubout",
             "-out", str(work / "sa.pub")],
            check=True, capture_output=True,
        )  # fmt: skip
        (work / "tokens.csv").write_text(
            "admintoken,admin,1,system:masters\nplugintoken,gpu-device,2,gpuk8s-test\n"
        )
        api_log = open(work / "apiserver.log", "wb")  # noqa: SIM115
        procs.append(
            subprocess.Popen(
                [
                    apiserver_bin,
                    f"--etcd-servers=http://127.0.0.1:{etcd_port}",
                    "--bind-address=127.0.0.1",
                    f"--secure-port={api_port}",
                    f"--cert-dir={work / 'certs'}",
                    f"--token-auth-file={work / 'tokens.csv'}",
                    "--authorization-mode=RBAC",
                    f"--service-account-key-file={work / 'sa.pub'}",
                    f"--service-account-signing-key-file={work / 'sa.key'}",
                    "--service-account-issuer=https://kubernetes.default.svc",
                    "--service-cluster-ip-range=10.96.0.0/16",
                    "--enable-priority-and-fairness=false",
                ],
                stdout=api_log,
                stderr=subprocess.STDOUT,
            )
        )
        admin = _kubeconfig(work / "admin.kubeconfig", api_port, "admintoken")
        plugin = _kubeconfig(work / "plugin.kubeconfig", api_port, "plugintoken")
        from kubernetes import client

        core = client.CoreV1Api(api_client(admin))

        def ready() -> bool:
            if any(p.poll() is not None for p in procs):
                raise AssertionError(
                    "etcd or kube-apiserver exited:\n"
                    + (work / "apiserver.log").read_text(errors="replace")[-3000:]
                )
            try:
                core.list_namespace()
                return True
            except Exception:
                return False

        assert wait_until(ready, 120, step=0.5), "kube-apiserver did not become ready"
        rbac = client.RbacAuthorizationV1Api(api_client(admin))
        rbac.create_cluster_role(
            {
                "metadata": {"name": "gpu-device"},
                "rules": [{"apiGroups": [""], "resources": ["nodes"],
                           "verbs": ["get", "patch"]}],
            }
        )  # fmt: skip
        rbac.create_cluster_role_binding(
            {
                "metadata": {"name": "gpu-device"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": "gpu-device"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                              "name": "gpu-device"}],
            }
        )  # fmt: skip
        core.create_node({"metadata": {"name": NODE, "annotations": {"example.com/keep": "me"}}})
        yield {"admin": admin, "plugin": plugin}
    finally:
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(work, ignore_errors=True)


def _node(admin: str) -> tuple[dict[str, str], str]:
    from kubernetes import client

    obj = client.CoreV1Api(api_client(admin)).read_node(NODE)
    return dict(obj.metadata.annotations or {}), str(obj.metadata.resource_version)


def test_annotations_on_a_real_node(
    apiserver: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    os.environ["PATH"] = f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"
    root = str(tmp_path_factory.mktemp("sim") / "c500")
    sim.create(root, "c500-8")
    inv = discover(root)
    patcher = KubernetesNodePatcher(apiserver["plugin"])
    # the plugin's user may patch nodes but not, say, delete them
    with pytest.raises(PermanentApiError, match="403"):
        from kubernetes import client

        try:
            client.CoreV1Api(api_client(apiserver["plugin"])).delete_node(NODE)
        except Exception as err:
            from gpuk8s.services.kube import classify

            raise classify(err, "delete node") from err

    with tempfile.TemporaryDirectory(prefix="dpa-") as plugin_dir:
        pr_socket = os.path.join(plugin_dir, "pr.sock")
        kubelet = FakeKubelet(plugin_dir, pr_socket).start()
        cfg = PluginConfig(
            host_root=root, plugin_dir=plugin_dir, healthy_interval=0,
            watch_interval=0.1, node_name=NODE, pod_resources_socket=pr_socket,
            node_state_interval=0.5,
        )  # fmt: skip
        app = DevicePluginApp(cfg, inv, patcher=patcher)
        app.start()
        try:
            assert wait_until(lambda: DEVICES_ANNOTATION in _node(apiserver["admin"])[0], 60)
            annotations, rv = _node(apiserver["admin"])
            assert annotations["example.com/keep"] == "me"
            entries = parse_device_list(annotations[DEVICES_ANNOTATION])
            assert [e.id for e in entries] == [g.pci_address for g in inv.gpus]
            assert set(parse_table(annotations[SCORES_ANNOTATION])) == set(range(1, 9))
            assert set(parse_table(annotations[LOSSES_ANNOTATION])) == set(range(1, 9))

            time.sleep(2.0)  # four sync periods with nothing new
            assert _node(apiserver["admin"])[1] == rv, "unchanged state must not be patched"

            ids = [g.pci_address for g in inv.gpus]
            kubelet.set_pod("default", "job", {"metax-tech.com/gpu": ids[4:8]})
            assert wait_until(
                lambda: sum(
                    e.allocated
                    for e in parse_device_list(_node(apiserver["admin"])[0][DEVICES_ANNOTATION])
                ) == 4,
                60,
            )  # fmt: skip
            annotations, _ = _node(apiserver["admin"])
            assert set(parse_table(annotations[SCORES_ANNOTATION])) == {1, 2, 3, 4}
            assert annotations["example.com/keep"] == "me"
        finally:
            app.stop()
            kubelet.stop()
