"""The packaged charts installed into a real kube-apiserver (the `apiserver` fixture of
tests/integration/conftest.py: etcd + kube-apiserver, RBAC on; no nodes or kubelet, so
pods are not run): the API server accepts every object, the RBAC it creates grants each
component exactly what it needs (checked with SubjectAccessReviews), an upgrade keeps an
administrator's edit of driver-config, a bad value fails before anything is created, and
`helm uninstall --wait` leaves nothing behind, cluster-scoped objects included.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
VERSION = "1.2.3"  # the version the `charts` fixture packages (conftest.py)
# kube-scheduler's host: this API server has no control-plane Node for the chart to find,
# and gpu-aware's NetworkPolicy fails closed without one
SCHEDULER_HOST = ("--set", "gpuAware.networkPolicy.controlPlaneCIDRs={192.0.2.10/32}")


def _clients(apiserver: Any) -> tuple[Any, Any, Any, Any]:
    from kubernetes import client

    from gpuk8s.services.kube import api_client

    api = api_client(apiserver.kubeconfig("admin"))
    return (
        client.CoreV1Api(api),
        client.AppsV1Api(api),
        client.RbacAuthorizationV1Api(api),
        client.AuthorizationV1Api(api),
    )


def _can(
    authz: Any,
    ns: str,
    sa: str,
    verb: str,
    resource: str,
    *,
    namespace: str | None = None,
    name: str | None = None,
) -> bool:
    attrs: dict[str, Any] = {"verb": verb, "resource": resource}
    if namespace:
        attrs["namespace"] = namespace
    if name:
        attrs["name"] = name
    review = authz.create_subject_access_review(
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {"user": f"system:serviceaccount:{ns}:{sa}", "resourceAttributes": attrs},
        }
    )
    return bool(review.status.allowed)


def _release_objects(apiserver: Any, release: str, ns: str) -> list[str]:
    from kubernetes import client

    from gpuk8s.services.kube import api_client

    core, apps, rbac, _ = _clients(apiserver)
    adm = client.AdmissionregistrationV1Api(api_client(apiserver.kubeconfig("admin")))
    net = client.NetworkingV1Api(api_client(apiserver.kubeconfig("admin")))
    sel = f"app.kubernetes.io/instance={release}"
    found = []
    for kind, lister in (
        ("DaemonSet", lambda: apps.list_namespaced_daemon_set(ns, label_selector=sel)),
        ("Deployment", lambda: apps.list_namespaced_deployment(ns, label_selector=sel)),
        ("Service", lambda: core.list_namespaced_service(ns, label_selector=sel)),
        ("ConfigMap", lambda: core.list_namespaced_config_map(ns, label_selector=sel)),
        ("Secret", lambda: core.list_namespaced_secret(ns, label_selector=sel)),
        ("NetworkPolicy", lambda: net.list_namespaced_network_policy(ns, label_selector=sel)),
        ("ServiceAccount", lambda: core.list_namespaced_service_account(ns, label_selector=sel)),
        ("ClusterRole", lambda: rbac.list_cluster_role(label_selector=sel)),
        ("ClusterRoleBinding", lambda: rbac.list_cluster_role_binding(label_selector=sel)),
        ("Role", lambda: rbac.list_namespaced_role(ns, label_selector=sel)),
        ("ValidatingAdmissionPolicy",
         lambda: adm.list_validating_admission_policy(label_selector=sel)),
        ("ValidatingAdmissionPolicyBinding",
         lambda: adm.list_validating_admission_policy_binding(label_selector=sel)),
    ):
        found += [f"{kind}/{o.metadata.name}" for o in lister().items]
    return sorted(found)


def test_extensions_install_rbac_and_uninstall(
    apiserver: Any, helm: Any, charts: dict[str, str]
) -> None:
    ns, rel = "metax-gpu-extensions", "ext"
    # server-side dry run first: the API server validates every object, creates nothing
    helm(
        "install",
        rel,
        charts["metax-gpu-extensions"],
        "-n",
        ns,
        "--create-namespace",
        "--set",
        "deployExtenderGPUAware=true",
        *SCHEDULER_HOST,
        "--dry-run=server",
    )
    helm(
        "install",
        rel,
        charts["metax-gpu-extensions"],
        "-n",
        ns,
        "--create-namespace",
        "--set",
        "deployExtenderGPUAware=true",
        *SCHEDULER_HOST,
        "--set",
        "registry=reg.local/metax",
    )
    core, apps, _rbac, authz = _clients(apiserver)
    try:
        assert _release_objects(apiserver, rel, ns) == sorted(
            [
                "DaemonSet/metax-gpu-device",
                "DaemonSet/gpu-label",
                "DaemonSet/gpu-mps",  # scheduled only on nodes labelled sharing-mode=mps
                "Deployment/gpu-aware",
                "Service/gpu-aware",
                "ConfigMap/gpu-aware-plugin",
                # TLS between kube-scheduler and gpu-aware, and who may call it
                "NetworkPolicy/gpu-aware",
                "Secret/gpu-aware-ca",
                "Secret/gpu-aware-tls",
                "Secret/gpu-aware-scheduler-client",
                "ServiceAccount/gpu-device",
                "ServiceAccount/gpu-label",
                "ServiceAccount/gpu-aware",
                "ServiceAccount/gpu-mps",
                f"ClusterRole/{rel}-gpu-device",
                f"ClusterRole/{rel}-gpu-label",
                f"ClusterRole/{rel}-gpu-aware",
                f"ClusterRole/{rel}-gpu-mps",
                f"ClusterRoleBinding/{rel}-gpu-device",
                f"ClusterRoleBinding/{rel}-gpu-label",
                f"ClusterRoleBinding/{rel}-gpu-aware",
                f"ClusterRoleBinding/{rel}-gpu-mps",
                "Role/gpu-aware",
                # the pre-delete node cleanup (its Job is a hook: made at uninstall only)
                "ServiceAccount/gpu-extensions-uninstall",
                f"ClusterRole/{rel}-gpu-extensions-uninstall",
                f"ClusterRoleBinding/{rel}-gpu-extensions-uninstall",
                "Role/gpu-extensions-uninstall",
                # the apiserver (>= 1.30) serves ValidatingAdmissionPolicy
                f"ValidatingAdmissionPolicy/{rel}-own-node",
                f"ValidatingAdmissionPolicyBinding/{rel}-own-node",
                # gpu-device: only the sharing annotation of its own node's pods
                f"ValidatingAdmissionPolicy/{rel}-own-node-pods",
                f"ValidatingAdmissionPolicyBinding/{rel}-own-node-pods",
            ]
        )
        ds = apps.read_namespaced_daemon_set("metax-gpu-device", ns)
        assert ds.spec.template.spec.containers[0].image == f"reg.local/metax/gpu-device:{VERSION}"
        svc = core.read_namespaced_service("gpu-aware", ns)
        assert svc.spec.cluster_ip.startswith("10.96.") and svc.spec.ports[0].port == 8080
        assert core.read_namespaced_config_map("gpu-aware-plugin", ns).data == {
            "scoreWeight": "1",
            "lossWeight": "1",
        }
        # the RBAC the API server now enforces: what each component needs, nothing more
        assert _can(authz, ns, "gpu-label", "patch", "nodes")
        assert _can(authz, ns, "gpu-device", "patch", "nodes")
        assert not _can(authz, ns, "gpu-label", "list", "nodes")
        assert _can(authz, ns, "gpu-mps", "get", "nodes")  # its node's sharing-mode label
        assert not _can(authz, ns, "gpu-mps", "patch", "nodes")
        assert not _can(authz, ns, "gpu-label", "get", "secrets", namespace=ns)
        assert _can(authz, ns, "gpu-aware", "watch", "pods")
        assert not _can(authz, ns, "gpu-aware", "patch", "nodes")
        assert _can(
            authz, ns, "gpu-aware", "get", "configmaps", namespace=ns, name="gpu-aware-plugin"
        )
        assert not _can(authz, ns, "gpu-aware", "get", "configmaps", namespace=ns, name="other")
        assert not _can(
            authz, ns, "gpu-aware", "get", "configmaps", namespace="kube-system", name="gpu-aware"
        )
        status = helm("status", rel, "-n", ns).stdout
        assert "helm test ext -n metax-gpu-extensions --logs" in status  # the NOTES
    finally:
        # --no-hooks: the pre-delete node-cleanup hook is a Job, and this tier runs no pods
        helm("uninstall", rel, "-n", ns, "--no-hooks", "--wait", "--timeout", "120s")
    assert _release_objects(apiserver, rel, ns) == []


def test_operator_upgrade_keeps_the_vfnum_edits(
    apiserver: Any, helm: Any, charts: dict[str, str]
) -> None:
    ns, rel = "metax-operator", "op"
    helm(
        "install",
        rel,
        charts["metax-operator"],
        "-n",
        ns,
        "--create-namespace",
        "--set",
        "driver.payload.version=2.0.0",
    )
    core, apps, _rbac, authz = _clients(apiserver)
    try:
        # driver-config is not a chart object: operator-controller creates it (one pass of
        # the controller's own code here; this tier runs no pods)
        assert "driver-config" not in [
            c.metadata.name for c in core.list_namespaced_config_map(ns).items]
        from gpuk8s.services.kube import api_client
        from gpuk8s.services.operator.controller import Controller
        from gpuk8s.services.operator.main import KubeCluster

        Controller(KubeCluster(api_client(apiserver.kubeconfig("admin")), ns)).one_pass()
        cm = core.read_namespaced_config_map("driver-config", ns)
        assert yaml.safe_load(cm.data["node-vfnums"]) == {"nodes": {}}
        for name in ("driver-manager", "container-runtime", "metax-gpu-device", "gpu-label"):
            apps.read_namespaced_daemon_set(name, ns)
        apps.read_namespaced_deployment("operator-controller", ns)
        # an administrator sets VF counts (SPEC §6) ...
        edited = "nodes:\n  sample-node: {vfnum: 4}\n  foo: {vfnum: 2}\n"
        core.patch_namespaced_config_map("driver-config", ns, {"data": {"node-vfnums": edited}})
        # ... and an upgrade that changes other options keeps them
        helm(
            "upgrade",
            rel,
            charts["metax-operator"],
            "-n",
            ns,
            "--set",
            "driver.payload.version=2.1.0",
            "--set",
            "log.level=debug",
        )
        cm = core.read_namespaced_config_map("driver-config", ns)
        assert yaml.safe_load(cm.data["node-vfnums"]) == {
            "nodes": {"sample-node": {"vfnum": 4}, "foo": {"vfnum": 2}}
        }
        dm = apps.read_namespaced_daemon_set("driver-manager", ns)
        driver = next(c for c in dm.spec.template.spec.containers if c.name == "driver")
        assert "--payload-image=cr.metax-tech.com/cloud/driver-image:2.1.0" in driver.args
        assert "--log-level=debug" in driver.args
        # operator-controller never deletes user pods; it patches nodes (desired VFs)
        assert not _can(authz, ns, "operator-controller", "delete", "pods", namespace="default")
        assert _can(authz, ns, "operator-controller", "delete", "pods", namespace=ns)
        assert _can(authz, ns, "operator-controller", "patch", "nodes")
        # gpu-exporter (on by default in the operator scheme) lists pods, nothing more
        apps.read_namespaced_daemon_set("gpu-exporter", ns)
        assert _can(authz, ns, "gpu-exporter", "list", "pods")
        assert not _can(authz, ns, "gpu-exporter", "patch", "nodes")
        assert not _can(authz, ns, "gpu-exporter", "get", "secrets", namespace=ns)
        # node agents: their own Node, Events about it (in default, as the API requires)
        for agent in ("driver-manager", "container-runtime"):
            assert _can(authz, ns, agent, "patch", "nodes")
            assert _can(authz, ns, agent, "create", "events", namespace="default")
            assert not _can(authz, ns, agent, "list", "nodes")
            assert not _can(authz, ns, agent, "get", "secrets", namespace=ns)
        assert _can(authz, ns, "driver-manager", "get", "pods", namespace=ns)
    finally:
        # --no-hooks: the pre-delete cleanup hook is a Job, and this tier runs no pods
        helm("uninstall", rel, "-n", ns, "--no-hooks", "--wait", "--timeout", "120s")
    assert _release_objects(apiserver, rel, ns) == []


def test_bad_values_create_nothing(apiserver: Any, helm: Any, charts: dict[str, str]) -> None:
    ns = "metax-operator-bad"
    proc = helm(
        "install", "bad", charts["metax-operator"], "-n", ns, "--create-namespace", check=False
    )
    assert proc.returncode != 0
    assert "driver.payload.version is required" in proc.stderr
    proc = helm(
        "install",
        "bad",
        charts["metax-gpu-extensions"],
        "-n",
        ns,
        "--create-namespace",
        "--set",
        "log.level=loud",
        check=False,
    )
    assert proc.returncode != 0 and "/log/level" in proc.stderr
    assert helm("list", "-q", "-n", ns).stdout.strip() == ""
    assert _release_objects(apiserver, "bad", ns) == []



def _node(core: Any, name: str) -> None:
    core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})


@pytest.mark.parametrize(("chart", "agents", "values"), [
    ("metax-gpu-extensions", ["gpu-label"], []),
    # issue 28: the operator's driver-manager and container-runtime could label any node
    ("metax-operator", ["driver-manager", "container-runtime"],
     ["--set", "driver.payload.version=2.0.0"]),
], ids=["extensions", "operator"])
def test_node_agents_may_patch_only_their_own_node(
    apiserver: Any, helm: Any, charts: dict[str, str], chart: str, agents: list[str],
    values: list[str],
) -> None:
    """The ValidatingAdmissionPolicy on this real kube-apiserver (>= 1.30): a node agent's
    token bound to its pod on node A (the token carries the node, as the kubelet's does)
    patches a key it owns on A, and is denied on B (RBAC alone allows both) and for a key
    it does not own on A (issue 50: NodeRestriction's rule)."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    from gpuk8s.services.kube import api_client

    ns, rel = f"{chart}-vap", "vap"
    helm("install", rel, charts[chart], "-n", ns, "--create-namespace", *values)
    core, _apps, _rbac, authz = _clients(apiserver)
    a, b = "vap-node-a", "vap-node-b"
    # a key each agent owns (gpuk8s.nodeAgentKeys)
    owned = {"gpu-label": {"labels": {"metax-tech.com/gpu.installed": "true"}},
             "gpu-device": {"annotations": {"metax-tech.com/gpu.devices": "[]"}},
             "driver-manager": {"annotations": {
                 "metax-tech.com/driver-manager.driver.state": "{}"}},
             "container-runtime": {"annotations": {"metax-tech.com/container-runtime.state": "{}"}}}
    try:
        _node(core, a)
        _node(core, b)
        for agent in agents:
            patch = {"metadata": owned[agent]}
            # the agent's pod on node A (no kubelet here: it is only an API object)
            pod = core.create_namespaced_pod(ns, {
                "metadata": {"name": f"{agent}-a"},
                "spec": {"nodeName": a, "serviceAccountName": agent,
                         "containers": [{"name": "c", "image": "x"}]}})
            token = core.create_namespaced_service_account_token(agent, ns, {
                "spec": {"audiences": ["https://kubernetes.default.svc"],
                         "expirationSeconds": 600,
                         "boundObjectRef": {"kind": "Pod", "apiVersion": "v1",
                                            "name": pod.metadata.name,
                                            "uid": pod.metadata.uid}}})
            as_agent = client.CoreV1Api(api_client(apiserver.token_kubeconfig(
                f"{ns}-{agent}", token.status.token)))

            def denied_on_b(api: Any = as_agent, patch: Any = patch) -> bool:
                try:  # policies load within seconds
                    api.patch_node(b, patch, dry_run="All")
                except ApiException as err:
                    return err.status == 403
                return False

            deadline = time.monotonic() + 30
            while not denied_on_b():
                assert time.monotonic() < deadline, "the own-node policy never took effect"
                time.sleep(0.5)
            as_agent.patch_node(a, patch)  # its own node: allowed
            with pytest.raises(ApiException) as denied:
                as_agent.patch_node(b, patch)
            assert denied.value.status == 403, agent
            assert f"{agent} may change only the Node its pod runs on, not {b}" in \
                denied.value.body
            with pytest.raises(ApiException) as denied:  # its own Node, not its key
                as_agent.patch_node(a, {"metadata": {"labels": {
                    "node-role.kubernetes.io/control-plane": ""}}})
            assert denied.value.status == 403, agent
            assert "may not change the Node labels node-role.kubernetes.io/control-plane" in \
                denied.value.body, denied.value.body
            assert not [k for k in core.read_node(b).metadata.labels or {}
                        if k.startswith("metax-tech.com/")]
            assert not (core.read_node(b).metadata.annotations or {})
            # RBAC itself allows both: the policy is what denies
            assert _can(authz, ns, agent, "patch", "nodes", name=b)
    finally:
        for name in (a, b):
            core.delete_node(name)
        # --no-hooks: the operator's pre-delete cleanup hook is a Job, and no pod runs here
        helm("uninstall", rel, "-n", ns, "--no-hooks", "--wait", "--timeout", "120s")
    assert _release_objects(apiserver, rel, ns) == []


def test_upgrade_keeps_live_weights_unless_the_chart_changes_them(
    apiserver: Any, helm: Any, charts: dict[str, str]
) -> None:
    """The manual edits the weights with `kubectl edit cm`; `helm upgrade` must neither
    reset nor conflict on them, and `--set gpuAware.scoreWeight=...` must still apply --
    also to a weight edited live (issue 26: it did nothing and said nothing): a new chart
    value is a new decision, and NOTES.txt says which edit it replaced."""
    ns, rel = "metax-gpu-weights", "w"
    chart = charts["metax-gpu-extensions"]
    helm("install", rel, chart, "-n", ns, "--create-namespace", "--set",
         "deployExtenderGPUAware=true", *SCHEDULER_HOST)
    core, _apps, _rbac, _authz = _clients(apiserver)
    def weights() -> dict[str, str]:
        return dict(core.read_namespaced_config_map("gpu-aware-plugin", ns).data)

    try:
        # the administrator's edit, by another field manager (as kubectl edit would)
        core.patch_namespaced_config_map("gpu-aware-plugin", ns, {"data": {"lossWeight": "3"}},
                                         field_manager="kubectl-edit")
        out = helm("upgrade", rel, chart, "-n", ns, "--set", "deployExtenderGPUAware=true",
                 *SCHEDULER_HOST,
                   "--set", "log.level=debug").stdout
        assert weights() == {"scoreWeight": "1", "lossWeight": "3"}, "the live edit was lost"
        assert "gpuAware.lossWeight: the live edit 3 stays (the chart's 1 is unchanged" in out
        # the chart changes the weight nobody edited: it applies, without a conflict
        helm("upgrade", rel, chart, "-n", ns, "--set", "deployExtenderGPUAware=true",
                 *SCHEDULER_HOST,
             "--set", "gpuAware.scoreWeight=5")
        assert weights() == {"scoreWeight": "5", "lossWeight": "3"}
        # the chart changes the edited one: its new value is what the chart applies. helm 4
        # applies server-side, where the edit's field manager owns the key: the upgrade
        # stops, naming the field and the manager, and changes nothing...
        seven = ("upgrade", rel, chart, "-n", ns, "--set", "deployExtenderGPUAware=true",
                 *SCHEDULER_HOST,
                 "--set", "gpuAware.scoreWeight=5", "--set", "gpuAware.lossWeight=7")
        refused = helm(*seven, check=False)
        assert refused.returncode != 0
        assert 'conflict with "kubectl-edit"' in refused.stderr and ".data.lossWeight" in (
            refused.stderr)
        assert weights() == {"scoreWeight": "5", "lossWeight": "3"}
        # ...until told to take the field over (docs/extender.md); then it applies, and
        # NOTES.txt says which edit it replaced
        out = helm(*seven, "--force-conflicts").stdout
        assert weights() == {"scoreWeight": "5", "lossWeight": "7"}
        assert "gpuAware.lossWeight: the chart's new value 7 replaced the live edit 3" in out
        # the same values again: an edit made since stays
        core.patch_namespaced_config_map("gpu-aware-plugin", ns, {"data": {"lossWeight": "9"}},
                                         field_manager="kubectl-edit")
        helm("upgrade", rel, chart, "-n", ns, "--set", "deployExtenderGPUAware=true",
                 *SCHEDULER_HOST,
             "--set", "gpuAware.scoreWeight=5", "--set", "gpuAware.lossWeight=7")
        assert weights() == {"scoreWeight": "5", "lossWeight": "9"}
    finally:
        # --no-hooks: the pre-delete node-cleanup hook is a Job, and this tier runs no pods
        helm("uninstall", rel, "-n", ns, "--no-hooks", "--wait", "--timeout", "120s")
    assert _release_objects(apiserver, rel, ns) == []
    # helm 3 (what the playbooks' kubernetes.core.helm runs) patches client-side: the new
    # chart value applies at once
    helm3 = _helm_as(apiserver, _helm3())
    helm3("install", rel, chart, "-n", ns, "--set", "deployExtenderGPUAware=true",
          *SCHEDULER_HOST)
    try:
        core.patch_namespaced_config_map("gpu-aware-plugin", ns, {"data": {"lossWeight": "3"}},
                                         field_manager="kubectl-edit")
        out = helm3("upgrade", rel, chart, "-n", ns, "--set", "deployExtenderGPUAware=true",
                 *SCHEDULER_HOST,
                    "--set", "gpuAware.lossWeight=7").stdout
        assert weights() == {"scoreWeight": "1", "lossWeight": "7"}
        assert "gpuAware.lossWeight: the chart's new value 7 replaced the live edit 3" in out
    finally:
        # --no-hooks: the pre-delete node-cleanup hook is a Job, and this tier runs no pods
        helm3("uninstall", rel, "-n", ns, "--no-hooks", "--wait", "--timeout", "120s")


def _helm3() -> str:
    out = subprocess.run(["bash", str(REPO / "lab" / "tools.sh"), "helm3"], capture_output=True,
                         text=True, check=True, timeout=900)
    return out.stdout.strip().splitlines()[-1]


def _helm_as(apiserver: Any, binary: str) -> Any:
    """A runner of ``binary`` as the cluster admin."""
    env = {**os.environ, "KUBECONFIG": apiserver.kubeconfig("admin")}

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([binary, *args], capture_output=True, text=True, check=False,
                              env=env, timeout=300)
        if check:
            assert proc.returncode == 0, f"helm3 {args}\n{proc.stdout}\n{proc.stderr}"
        return proc

    return run


def _secret(core: Any, ns: str, name: str) -> tuple[dict[str, str], dict[str, str]]:
    got = core.read_namespaced_secret(name, ns)
    return dict(got.data), dict(got.metadata.annotations or {})


def _verify(tmp_path: Path, ca: str, cert: str) -> bool:
    """openssl's verdict: ``cert`` (base64 PEM, as in a Secret) chains to ``ca``."""
    import base64

    (tmp_path / "ca.pem").write_bytes(base64.b64decode(ca))
    (tmp_path / "cert.pem").write_bytes(base64.b64decode(cert))
    proc = subprocess.run(["openssl", "verify", "-CAfile", str(tmp_path / "ca.pem"),
                           str(tmp_path / "cert.pem")], capture_output=True, text=True,
                          check=False, timeout=60)
    return proc.returncode == 0


def test_gpu_aware_certificates_are_kept_renewed_and_only_the_control_plane_admitted(
    apiserver: Any, helm: Any, charts: dict[str, str], tmp_path: Path
) -> None:
    """Issue 26: the chart makes gpu-aware's TLS material once, keeps it across upgrades
    (lookup), issues a new certificate when an upgrade comes within renewBeforeDays of its
    expiry (a new CA, and all it signed, likewise), and its NetworkPolicy admits only the
    control-plane nodes it finds to the extender port."""
    ns, rel = "metax-gpu-tls", "t"
    chart = charts["metax-gpu-extensions"]
    core, _apps, _rbac, _authz = _clients(apiserver)
    from kubernetes import client

    net = client.NetworkingV1Api(core.api_client)
    core.create_node({"metadata": {"name": "cp-tls", "labels": {
        "node-role.kubernetes.io/control-plane": ""}},
        "spec": {"podCIDR": "10.244.7.0/24", "podCIDRs": ["10.244.7.0/24"]}})
    core.patch_node_status("cp-tls", {"status": {"addresses": [
        {"type": "InternalIP", "address": "192.0.2.10"}, {"type": "Hostname", "address": "cp"}]}})
    core.create_node({"metadata": {"name": "worker-tls"}})
    on = ("--set", "deployExtenderGPUAware=true")
    helm("install", rel, chart, "-n", ns, "--create-namespace", *on)
    try:
        server, server_notes = _secret(core, ns, "gpu-aware-tls")
        scheduler, _ = _secret(core, ns, "gpu-aware-scheduler-client")
        cas, _ = _secret(core, ns, "gpu-aware-ca")
        assert _verify(tmp_path, scheduler["ca.crt"], server["tls.crt"])
        assert _verify(tmp_path, server["client-ca.crt"], scheduler["tls.crt"])
        # two CAs: gpu-aware's own certificate is no client certificate it accepts
        assert not _verify(tmp_path, server["client-ca.crt"], server["tls.crt"])
        assert int(server_notes["metax-tech.com/not-after"]) > time.time() + 360 * 86400
        policy = net.read_namespaced_network_policy("gpu-aware", ns)
        # the health port: only from the node (the kubelet), which NetworkPolicy always
        # admits, and the release's own helm test pod
        extender, helm_test = policy.spec.ingress
        assert [p.port for p in helm_test.ports] == [8081]
        assert [f.pod_selector.match_labels["app.kubernetes.io/name"]
                for f in helm_test._from] == ["gpu-test"]
        assert [p.port for p in extender.ports] == [8080]
        # the node's address and its host's CNI gateway and tunnel addresses, never the
        # pod CIDR (its pods are not kube-scheduler)
        assert sorted(f.ip_block.cidr for f in extender._from) == [
            "10.244.7.0/32", "10.244.7.1/32", "192.0.2.10/32"]
        # an upgrade keeps everything...
        helm("upgrade", rel, chart, "-n", ns, *on, "--set", "log.level=debug")
        assert _secret(core, ns, "gpu-aware-tls")[0] == server
        assert _secret(core, ns, "gpu-aware-scheduler-client")[0] == scheduler
        # ...until a certificate comes within renewBeforeDays (30) of its expiry: 340 days
        # pass, in the record (the test's edit of helm's annotation stands for the time, so
        # helm 4 takes the field back with --force-conflicts)
        soon = str(int(time.time()) + 20 * 86400)

        def age(name: str, key: str) -> None:
            core.patch_namespaced_secret(name, ns, {"metadata": {"annotations": {key: soon}}})

        age("gpu-aware-scheduler-client", "metax-tech.com/not-after")
        helm("upgrade", rel, chart, "-n", ns, *on, "--force-conflicts")
        renewed, renewed_notes = _secret(core, ns, "gpu-aware-scheduler-client")
        assert renewed["tls.crt"] != scheduler["tls.crt"] and renewed["ca.crt"] == scheduler[
            "ca.crt"]
        assert _verify(tmp_path, server["client-ca.crt"], renewed["tls.crt"])
        assert int(renewed_notes["metax-tech.com/not-after"]) > time.time() + 360 * 86400
        assert _secret(core, ns, "gpu-aware-tls")[0] == server  # its own was not due
        # a CA within renewBeforeDays: a new CA and a new certificate signed by it
        age("gpu-aware-ca", "metax-tech.com/server-ca-not-after")
        helm("upgrade", rel, chart, "-n", ns, *on, "--force-conflicts")
        fresh, _ = _secret(core, ns, "gpu-aware-tls")
        client_side, _ = _secret(core, ns, "gpu-aware-scheduler-client")
        assert _secret(core, ns, "gpu-aware-ca")[0]["server-ca.crt"] != cas["server-ca.crt"]
        assert fresh["tls.crt"] != server["tls.crt"]
        assert _verify(tmp_path, client_side["ca.crt"], fresh["tls.crt"])
        assert not _verify(tmp_path, scheduler["ca.crt"], fresh["tls.crt"])
        # plain HTTP, explicitly: no Secrets, no TLS flags
        helm("upgrade", rel, chart, "-n", ns, *on, "--set", "gpuAware.tls.enabled=false")
        names = [s.metadata.name for s in core.list_namespaced_secret(ns).items]
        assert not [n for n in names if n.startswith("gpu-aware")], names
    finally:
        # --no-hooks: the pre-delete node-cleanup hook is a Job, and this tier runs no pods
        helm("uninstall", rel, "-n", ns, "--no-hooks", "--wait", "--timeout", "120s")
        for name in ("cp-tls", "worker-tls"):
            core.delete_node(name)
    assert _release_objects(apiserver, rel, ns) == []
