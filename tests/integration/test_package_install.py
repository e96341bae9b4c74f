"""The packaged charts installed into a real kube-apiserver (the `apiserver` fixture of
tests/integration/conftest.py: etcd + kube-apiserver, RBAC on; no nodes or kubelet, so
pods are not run): the API server accepts every object, the RBAC it creates grants each
component exactly what it needs (checked with SubjectAccessReviews), an upgrade keeps an
administrator's edit of driver-config, a bad value fails before anything is created, and
`helm uninstall --wait` leaves nothing behind, cluster-scoped objects included.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.integration

VERSION = "1.2.3"  # the version the `charts` fixture packages (conftest.py)


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
    sel = f"app.kubernetes.io/instance={release}"
    found = []
    for kind, lister in (
        ("DaemonSet", lambda: apps.list_namespaced_daemon_set(ns, label_selector=sel)),
        ("Deployment", lambda: apps.list_namespaced_deployment(ns, label_selector=sel)),
        ("Service", lambda: core.list_namespaced_service(ns, label_selector=sel)),
        ("ConfigMap", lambda: core.list_namespaced_config_map(ns, label_selector=sel)),
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
                # the apiserver (1.35) serves ValidatingAdmissionPolicy
                f"ValidatingAdmissionPolicy/{rel}-own-node",
                f"ValidatingAdmissionPolicyBinding/{rel}-own-node",
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
        helm("uninstall", rel, "-n", ns, "--wait", "--timeout", "120s")
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
    """The ValidatingAdmissionPolicy on this real kube-apiserver (1.35): a node agent's
    token bound to its pod on node A (the token carries the node, as the kubelet's does)
    patches A, and is denied on B (RBAC alone allows both)."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    from gpuk8s.services.kube import api_client

    ns, rel = f"{chart}-vap", "vap"
    helm("install", rel, charts[chart], "-n", ns, "--create-namespace", *values)
    core, _apps, _rbac, authz = _clients(apiserver)
    a, b = "vap-node-a", "vap-node-b"
    patch = {"metadata": {"labels": {"metax-tech.com/gpu.installed": "true"}}}
    try:
        _node(core, a)
        _node(core, b)
        for agent in agents:
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

            def denied_on_b(api: Any = as_agent) -> bool:  # policies load within seconds
                try:
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
                as_agent.patch_node(b, {"metadata": {"annotations": {
                    f"metax-tech.com/{agent}.state": "{}"}}})
            assert denied.value.status == 403, agent
            assert f"{agent} may change only the Node its pod runs on, not {b}" in \
                denied.value.body
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
    reset nor conflict on them, and `--set gpuAware.scoreWeight=...` must still apply."""
    ns, rel = "metax-gpu-weights", "w"
    chart = charts["metax-gpu-extensions"]
    helm("install", rel, chart, "-n", ns, "--create-namespace", "--set",
         "deployExtenderGPUAware=true")
    core, _apps, _rbac, _authz = _clients(apiserver)
    def weights() -> dict[str, str]:
        return dict(core.read_namespaced_config_map("gpu-aware-plugin", ns).data)

    try:
        # the administrator's edit, by another field manager (as kubectl edit would)
        core.patch_namespaced_config_map("gpu-aware-plugin", ns, {"data": {"lossWeight": "3"}},
                                         field_manager="kubectl-edit")
        helm("upgrade", rel, chart, "-n", ns, "--set", "deployExtenderGPUAware=true",
             "--set", "log.level=debug")
        assert weights() == {"scoreWeight": "1", "lossWeight": "3"}, "the live edit was lost"
        # the chart changes the weight nobody edited: it applies, without a conflict
        helm("upgrade", rel, chart, "-n", ns, "--set", "deployExtenderGPUAware=true",
             "--set", "gpuAware.scoreWeight=5")
        assert weights() == {"scoreWeight": "5", "lossWeight": "3"}
        # ...and never overrides the edited one (nor conflicts with its manager)
        helm("upgrade", rel, chart, "-n", ns, "--set", "deployExtenderGPUAware=true",
             "--set", "gpuAware.scoreWeight=5", "--set", "gpuAware.lossWeight=7")
        assert weights() == {"scoreWeight": "5", "lossWeight": "3"}
    finally:
        helm("uninstall", rel, "-n", ns, "--wait", "--timeout", "120s")
    assert _release_objects(apiserver, rel, ns) == []
