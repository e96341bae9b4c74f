"""Least privilege, tried on a real kube-apiserver (issue 50): every ServiceAccount of
both charts (every component enabled), every verb it holds on every resource, tried with
its own pod-bound token against its own node's objects and another node's -- a write as a
server-side dry run (dryRun=All), so RBAC *and* the charts' ValidatingAdmissionPolicies
decide, as they would for a real write.

What each cell means: ``yes`` the API server admitted it; ``policy`` RBAC allows it and an
admission policy refused it; ``-`` RBAC refuses it. Node-scoped objects (Node, a Pod bound
to the node, a ResourceSlice of the node, an Event about the Node) are tried on node A,
where the agent's pod runs, and node B; namespaced ones (ConfigMaps, Secrets, Leases,
ResourceClaims) in the release's namespace and another namespace.

The test fails when a node agent (the ServiceAccount of a DaemonSet) can write an object
of another node, change a Pod in any way other than the annotations it owns, or change its
own Node beyond the labels and annotations it owns (a key of its own is tried, and others:
node-role and hostname labels, another component's, a taint, unschedulable); when a
held permission has no row (the rules review finds one the matrix does not try), or a row
says nothing about what the permission is for. It prints the matrix and compares it with
docs/security.md; ``GPUK8S_WRITE_DOCS=1`` writes it there instead.

Beside it: the lab's install (the gpu_chart role's values, no kube-scheduler address)
still renders gpu-aware's NetworkPolicy, which now fails closed, from the control-plane
Node it finds.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "security.md"
BEGIN = "<!-- rbac-matrix: begin (tests/integration/test_rbac_matrix_apiserver.py) -->"
END = "<!-- rbac-matrix: end -->"
OTHER_NS = "matrix-other"
NODE_A, NODE_B = "matrix-node-a", "matrix-node-b"

# every component on: each ServiceAccount and each permission the charts can grant (this
# API server has no control-plane Node: kube-scheduler's host is named)
CHARTS = {
    "metax-gpu-extensions": [
        "--set", "gpuAware.networkPolicy.controlPlaneCIDRs={192.0.2.10/32}",
        "--set", "deployExtenderGPUAware=true", "--set", "gpuAware.replicas=2",
        "--set", "gpuDevice.sharing=true", "--set", "gpuDra.enabled=true",
        "--set", "gpuExporter.enabled=true", "--set", "resourceDescriptors.enabled=true",
    ],
    "metax-operator": [
        "--set", "gpuAware.networkPolicy.controlPlaneCIDRs={192.0.2.10/32}",
        "--set", "driver.payload.version=2.0.0", "--set", "deployExtenderGPUAware=true",
        "--set", "gpuAware.replicas=2", "--set", "gpuDevice.sharing=true",
        "--set", "gpuDra.enabled=true", "--set", "gpuExporter.enabled=true",
        "--set", "resourceDescriptors.enabled=true",
    ],
}
VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
WRITES = frozenset(("create", "update", "patch", "delete", "deletecollection"))
NODE_SCOPED = ("nodes", "nodes/status", "pods", "resourceslices", "events")
# resource -> API group
RESOURCES = {
    "nodes": "", "nodes/status": "", "pods": "", "resourceslices": "resource.k8s.io",
    "events": "", "resourceclaims": "resource.k8s.io", "resourceclaims/status": "resource.k8s.io",
    "leases": "coordination.k8s.io", "configmaps": "", "secrets": "",
    "pods/binding": "", "pods/eviction": "", "daemonsets": "apps", "deployments": "apps",
}
# the verbs a subresource has
SUB_VERBS = {"status": ("get", "update", "patch"), "binding": ("create",), "eviction": ("create",)}
# the Pod annotations each node agent owns, and the value it writes
OWNED_POD_ANNOTATIONS = {"gpu-device": ("gpuk8s.io/sharing.phase", "allocated")}
# a Node key each node agent owns (labels or annotations, key, value): patching it on its own
# Node must be admitted; every key in FOREIGN_NODE_PATCHES refused
OWNED_NODE_KEYS = {
    "gpu-label": ("labels", "metax-tech.com/gpu.installed", "true"),
    "gpu-device": ("annotations", "metax-tech.com/gpu.topology.scores", "{}"),
    "driver-manager": ("annotations", "metax-tech.com/driver-manager.driver.state", "{}"),
    "container-runtime": ("annotations", "metax-tech.com/container-runtime.state", "{}"),
}
# what no node agent may change on any Node (NodeRestriction's rule for the kubelet)
FOREIGN_NODE_PATCHES: dict[str, dict[str, Any]] = {
    "patch label node-role.kubernetes.io/control-plane":
        {"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}},
    "patch label kubernetes.io/hostname": {"metadata": {"labels": {"kubernetes.io/hostname": "x"}}},
    "patch label metax-tech.com/driver.upgrade-state":
        {"metadata": {"labels": {"metax-tech.com/driver.upgrade-state": "upgrading"}}},
    "patch annotation metax-tech.com/maintenance":
        {"metadata": {"annotations": {"metax-tech.com/maintenance": "x"}}},
    "patch taint": {"spec": {"taints": [{"key": "matrix", "effect": "NoSchedule"}]}},
    "patch spec.unschedulable": {"spec": {"unschedulable": True}},
}
# what each permission is for (ServiceAccount, resource) -> why; a held one without an
# entry fails the test
PURPOSE = {
    ("gpu-device", "nodes"): "its node's GPU topology annotations (scores, losses, devices)",
    ("gpu-device", "pods"): "GPU sharing: the pods bound to its node, marked allocated",
    ("gpu-label", "nodes"): "its node's metax-tech.com/, GFD and bare cuda-*-version labels",
    ("gpu-dra", "nodes"): "its node's gpuk8s.io/sharing-mode label",
    ("gpu-dra", "resourceslices"): "publishes its node's devices",
    ("gpu-dra", "resourceclaims"): "the claims the kubelet asks it to prepare",
    ("gpu-mps", "nodes"): "its node's sharing mode",
    ("gpu-dra-pending", "pods"): "pending pods whose claims it judges (reads only)",
    ("gpu-dra-pending", "resourceclaims"): "unallocated claims of gpu-dra's classes (reads only)",
    ("gpu-dra-pending", "resourceslices"): "every node's published devices (reads only)",
    ("gpu-dra-pending", "events"): "one Warning Event per pod, claim and reason, refreshed",
    ("gpu-dra-pending", "leases"): "leader election: one replica judges (its own Lease only)",
    ("gpu-exporter", "pods"): "which pod holds which GPU (metrics labels)",
    ("gpu-aware", "nodes"): "node cache: GPU topology annotations",
    ("gpu-aware", "pods"): "GPUs already requested; sharing: the assignment annotations",
    ("gpu-aware", "configmaps"): "its weights (gpu-aware-plugin)",
    ("gpu-aware", "leases"): "leader election (replicas > 1)",
    ("driver-manager", "nodes"): "its node's driver and maca state annotations",
    ("driver-manager", "pods"): "its own pod's status (image pull errors)",
    ("driver-manager", "events"): "Events about its Node",
    ("container-runtime", "nodes"): "its node's runtime state annotation",
    ("container-runtime", "events"): "Events about its Node",
    ("operator-controller", "nodes"): "cordons, labels and upgrades any GPU node",
    ("operator-controller", "pods"): "drains GPU pods; restarts node agents",
    ("operator-controller", "configmaps"): "driver-config, operator-status",
    ("operator-controller", "events"): "Events about nodes and its objects",
    ("operator-controller", "daemonsets"):
        "driver-manager's template (upgrades); the uninstall hook deletes the agents",
    ("operator-controller", "deployments"): "the uninstall hook deletes operator-controller last",
    ("gpu-extensions-uninstall", "nodes"):
        "uninstall hook: the release's nodes lose their metax-tech.com/ labels and annotations",
    ("gpu-extensions-uninstall", "pods"): "uninstall hook: waits for the node agents' pods",
    ("gpu-extensions-uninstall", "daemonsets"): "uninstall hook: stops the node agents first",
}


def _api(apiserver: Any, name: str, token: str) -> Any:
    from gpuk8s.services.kube import api_client

    return api_client(apiserver.token_kubeconfig(name, token))


def _call(api: Any, method: str, path: str, *, body: Any = None,
          query: list[tuple[str, str]] | None = None,
          content_type: str = "application/json") -> tuple[int, str]:
    """(HTTP status, body) of one request; never raises on an HTTP error."""
    from kubernetes.client.exceptions import ApiException

    request = api.param_serialize(
        method=method, resource_path=path, query_params=query or [], body=body,
        header_params={"Content-Type": content_type, "Accept": "application/json"},
        auth_settings=["BearerToken"])
    try:
        resp = api.call_api(*request[:2], header_params=request[2], body=request[3],
                            post_params=request[4], _request_timeout=30)
        resp.read()
    except ApiException as err:
        return int(err.status), str(err.body)
    return int(resp.status), resp.data.decode()


def _verdict(status: int, text: str) -> str:
    if status < 400 or status in (404, 409):  # authorized; absent, or bound already
        return "yes"
    if status == 403 and "ValidatingAdmissionPolicy" in text:
        return "policy"
    if status == 403:
        return "-"
    # anything else: the row shows it and the test fails, saying why
    return f"HTTP {status}: " + (json.loads(text).get("message", text) if text.startswith("{")
                                 else text)[:300]


class Targets:
    """The objects tried, created as admin: per resource, ('own', 'other') -> (namespace, name)."""

    def __init__(self, ns: str) -> None:
        self.ns = ns

    def path(self, resource: str, where: str, names: dict[str, str]) -> tuple[str, str]:
        """(collection path, object name) of the target in column ``where``."""
        group = RESOURCES[resource]
        base = resource.split("/")[0]
        node = NODE_A if where == "own" else NODE_B
        prefix = "/api/v1" if not group else f"/apis/{group}/v1"
        if base == "nodes":
            return f"{prefix}/nodes", node
        if base == "resourceslices":
            return f"{prefix}/resourceslices", f"slice-{node}"
        if base == "pods":
            return f"{prefix}/namespaces/{self.ns}/pods", f"target-{node}"
        if base == "events":
            return f"{prefix}/namespaces/default/events", f"event-{node}"
        ns = self.ns if where == "own" else OTHER_NS
        return f"{prefix}/namespaces/{ns}/{base}", names.get(base, f"matrix-{base}")


def _patch(api: Any, obj: str, patch: dict[str, Any],
           content_type: str = "application/merge-patch+json") -> str:
    return _verdict(*_call(api, "PATCH", obj, query=[("dryRun", "All")], body=patch,
                           content_type=content_type))


def _body(resource: str, where: str, name: str) -> dict[str, Any]:
    """A valid new object for ``create`` (a generated name beside the target)."""
    node = NODE_A if where == "own" else NODE_B
    meta: dict[str, Any] = {"generateName": f"{name}-"}
    base = resource.split("/")[0]
    if base == "nodes":
        return {"apiVersion": "v1", "kind": "Node", "metadata": meta}
    if base == "pods":
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
                "spec": {"nodeName": node, "serviceAccountName": "matrix-target",
                         "containers": [{"name": "c", "image": "x"}]}}
    if base == "resourceslices":
        return _slice(meta, node)
    if base == "events":
        return _event(meta, node)
    if base == "configmaps":
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta}
    if base == "secrets":
        return {"apiVersion": "v1", "kind": "Secret", "metadata": meta}
    if base == "leases":
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta}
    if base in ("daemonsets", "deployments"):
        return {"apiVersion": "apps/v1", "kind": "DaemonSet" if base == "daemonsets" else
                "Deployment", "metadata": meta, "spec": _workload()}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": meta,
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.metax-tech.com"}}]}}}


def _workload() -> dict[str, Any]:
    labels = {"app": "matrix"}
    return {"selector": {"matchLabels": labels}, "template": {
        "metadata": {"labels": labels},
        "spec": {"serviceAccountName": "matrix-target",
                 "containers": [{"name": "c", "image": "x"}]}}}


def _slice(meta: dict[str, Any], node: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": meta,
            "spec": {"driver": "gpu.metax-tech.com", "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": []}}


def _event(meta: dict[str, Any], node: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Event", "metadata": meta,
            "involvedObject": {"kind": "Node", "name": node, "apiVersion": "v1"},
            "reason": "Matrix", "message": "tried", "type": "Normal",
            "source": {"component": "matrix", "host": node}}


def _try(api: Any, admin: Any, targets: Targets, resource: str, verb: str, where: str,
         names: dict[str, str]) -> str:
    collection, name = targets.path(resource, where, names)
    sub = resource.split("/")[1] if "/" in resource else ""
    obj = f"{collection}/{name}" + (f"/{sub}" if sub else "")
    dry = [("dryRun", "All")]
    one = [("fieldSelector", f"metadata.name={name}")]
    if verb == "get":
        return _verdict(*_call(api, "GET", obj))
    if verb == "list":
        return _verdict(*_call(api, "GET", collection, query=one))
    if verb == "watch":
        return _verdict(*_call(api, "GET", collection,
                               query=[*one, ("watch", "true"), ("timeoutSeconds", "1")]))
    if verb == "create" and sub in ("binding", "eviction"):
        node = NODE_A if where == "own" else NODE_B
        body = ({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                 "target": {"kind": "Node", "name": node}} if sub == "binding" else
                {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name}})
        return _verdict(*_call(api, "POST", obj, query=dry, body=body))
    if verb == "create":
        return _verdict(*_call(api, "POST", collection, query=dry,
                               body=_body(resource, where, name)))
    if verb == "update":
        status, current = _call(admin, "GET", obj)
        assert status == 200, (obj, current)
        changed = json.loads(current)
        changed["metadata"].setdefault("annotations", {})["gpuk8s.io/matrix"] = "x"
        return _verdict(*_call(api, "PUT", obj, query=dry, body=changed))
    if verb == "patch":
        return _patch(api, obj, {"metadata": {"annotations": {"gpuk8s.io/matrix": "x"}}})
    if verb == "delete":
        return _verdict(*_call(api, "DELETE", obj, query=dry))
    return _verdict(*_call(api, "DELETE", collection, query=[*dry, *one]))


def _token(admin_core: Any, ns: str, sa: str) -> str:
    """A token of ``sa`` bound to a pod of it on node A (it carries the node, as the
    kubelet's projected tokens do)."""
    pod = admin_core.create_namespaced_pod(ns, {
        "metadata": {"name": f"{sa}-on-a"},
        "spec": {"nodeName": NODE_A, "serviceAccountName": sa,
                 "containers": [{"name": "c", "image": "x"}]}})
    token = admin_core.create_namespaced_service_account_token(sa, ns, {
        "spec": {"audiences": ["https://kubernetes.default.svc"], "expirationSeconds": 600,
                 "boundObjectRef": {"kind": "Pod", "apiVersion": "v1",
                                    "name": pod.metadata.name, "uid": pod.metadata.uid}}})
    return str(token.status.token)


def _held(api: Any, namespaces: tuple[str, ...]) -> dict[tuple[str, str], set[str]]:
    """(resource, verb) -> resourceNames ('' for any) the rules review finds."""
    held: dict[tuple[str, str], set[str]] = {}
    for ns in namespaces:
        status, text = _call(api, "POST",
                             "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews",
                             body={"apiVersion": "authorization.k8s.io/v1",
                                   "kind": "SelfSubjectRulesReview",
                                   "spec": {"namespace": ns}})
        assert status == 201, text
        for rule in json.loads(text)["status"]["resourceRules"]:
            for resource in rule.get("resources") or []:
                for verb in rule.get("verbs") or []:
                    held.setdefault((resource, verb), set()).update(
                        rule.get("resourceNames") or [""])
    return held


def _named_targets(held: dict[tuple[str, str], set[str]]) -> dict[str, str]:
    """Per resource, the object name a Role limits the ServiceAccount to for the most
    verbs (the matrix tries that object; ``create`` cannot be limited to a name)."""
    out = {}
    for resource in ("configmaps", "secrets", "leases", "daemonsets", "deployments"):
        count: dict[str, int] = {}
        for (res, _verb), names in held.items():
            for name in names - {""} if res == resource else set():
                count[name] = count.get(name, 0) + 1
        if count:
            out[resource] = min(count, key=lambda n: (-count[n], n))
    return out


def _setup_targets(admin: Any, ns: str, names: dict[str, str]) -> None:
    """Create (as admin) every object the matrix tries; present ones are kept."""
    def create(path: str, body: dict[str, Any]) -> None:
        status, text = _call(admin, "POST", path, body=body)
        assert status in (201, 409), (path, text)

    for n in (ns, OTHER_NS):
        create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                      "metadata": {"name": n}})
        create(f"/api/v1/namespaces/{n}/serviceaccounts",
               {"apiVersion": "v1", "kind": "ServiceAccount",
                "metadata": {"name": "matrix-target"}})
    for node in (NODE_A, NODE_B):
        create("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
        create(f"/api/v1/namespaces/{ns}/pods",
               {**_body("pods", "own" if node == NODE_A else "other", ""),
                "metadata": {"name": f"target-{node}",
                             "annotations": {"gpuk8s.io/sharing.phase": "allocating"}}})
        create("/apis/resource.k8s.io/v1/resourceslices",
               _slice({"name": f"slice-{node}"}, node))
        create("/api/v1/namespaces/default/events", _event({"name": f"event-{node}"}, node))
    for resource in ("configmaps", "secrets", "leases", "resourceclaims", "daemonsets",
                     "deployments"):
        for n in (ns, OTHER_NS):
            collection, name = Targets(ns).path(resource, "own" if n == ns else "other", names)
            create(collection, {**_body(resource, "own", name), "metadata": {"name": name}})


def _rows(api: Any, admin: Any, ns: str, sa: str, names: dict[str, str],
          node_agent: bool) -> list[tuple[str, str, str, str]]:
    """(resource, verb, own, other) for every permission ``sa`` holds; ``names``: the
    object names its Roles limit it to, per resource."""
    targets = Targets(ns)
    rows: list[tuple[str, str, str, str]] = []
    for resource in RESOURCES:
        sub = resource.split("/")[1] if "/" in resource else ""
        for verb in SUB_VERBS.get(sub, VERBS):
            own, other = (_try(api, admin, targets, resource, verb, where, names)
                          for where in ("own", "other"))
            if (own, other) != ("-", "-"):
                rows.append((resource, verb, own, other))
    if node_agent and any(r[:2] == ("resourceslices", "create") for r in rows):
        # a slice of one node in the pool of the other (pools are named after their node)
        own, other = (_verdict(*_call(api, "POST", "/apis/resource.k8s.io/v1/resourceslices",
                                      query=[("dryRun", "All")], body={
                                          **_slice({"generateName": "crossed-"}, node),
                                          "spec": {**_slice({}, node)["spec"], "pool": {
                                              "name": pool, "generation": 9,
                                              "resourceSliceCount": 1}}}))
                      for node, pool in ((NODE_A, NODE_B), (NODE_B, NODE_A)))
        rows.append(("resourceslices", "create in the other node's pool", own, other))
    if node_agent and any(r[:2] == ("nodes", "patch") for r in rows):
        # the Node keys: one it owns, then labels, annotations and spec it does not
        field, key, value = OWNED_NODE_KEYS.get(sa, ("annotations", "gpuk8s.io/matrix", "x"))
        for label, patch in ((f"patch {field[:-1]} {key}", {"metadata": {field: {key: value}}}),
                             *FOREIGN_NODE_PATCHES.items()):
            own, other = (_patch(api, "/".join(targets.path("nodes", where, names)), patch)
                          for where in ("own", "other"))
            rows.append(("nodes", label, own, other))
    if node_agent and any(r[:2] == ("pods", "patch") for r in rows):
        # the Pod fields: the annotation it owns, and one it does not (the image)
        key, value = OWNED_POD_ANNOTATIONS.get(sa, ("gpuk8s.io/matrix", "x"))
        for label, patch, kind in (
                (f"patch {key}={value}", {"metadata": {"annotations": {key: value}}},
                 "application/merge-patch+json"),
                # strategic merge: the container list is merged by name, only its image changes
                ("patch spec (image)", {"spec": {"containers": [{"name": "c", "image": "evil"}]}},
                 "application/strategic-merge-patch+json")):
            own, other = (_patch(api, "/".join(targets.path("pods", where, names)), patch, kind)
                          for where in ("own", "other"))
            rows.append(("pods", label, own, other))
    return rows


def _agent_writes(api: Any, sa: str) -> list[str]:
    """The agent's own writer, as its service runs it, on its own Node (a real write): every
    key it can write, set and then removed, must pass the own-node policy."""
    from gpuk8s.core import cuda, labels
    from gpuk8s.core.devicelist import DEVICES_ANNOTATION
    from gpuk8s.core.scoring import tables_as_annotations
    from gpuk8s.services.node.nodeclient import KubernetesNodePatcher
    from gpuk8s.services.nodeagent import KubeNodeApi, state_annotation

    writers: dict[str, Any] = {}
    if sa == "gpu-label":
        from gpuk8s.services.labeller.reconcile import KubeNodeLabelStore

        store = KubeNodeLabelStore(api)
        keys = [*(labels.PREFIX + n for n in labels.LABEL_NAMES), *cuda.BARE_LABELS,
                *labels.GFD_LABELS]

        def write(changes: dict[str, str | None]) -> None:
            store.patch(NODE_A, changes, store.read(NODE_A)[1])
        writers[sa] = (write, keys)
    elif sa == "gpu-device":
        writers[sa] = (lambda changes: KubernetesNodePatcher(api_client=api).patch_annotations(
            NODE_A, changes), [DEVICES_ANNOTATION, *tables_as_annotations({}, {})])
    elif sa in ("driver-manager", "container-runtime"):
        agents = (["driver-manager.driver", "driver-manager.maca"] if sa == "driver-manager"
                  else ["container-runtime"])
        writers[sa] = (KubeNodeApi(api, NODE_A, sa, "default").annotate,
                       [state_annotation(a) for a in agents])
    problems = []
    for write, keys in writers.values():
        for value in ("1", None):
            try:
                write(dict.fromkeys(keys, value))
            except Exception as err:
                problems.append(f"node agent {sa} cannot {'set' if value else 'remove'} "
                                f"the keys it owns on its own Node: {err}")
    return problems


def _markdown(matrix: dict[str, list[tuple[str, str, str, str, str, str]]]) -> str:
    lines = ["| ServiceAccount | resource | verb | own node / namespace | another node / "
             "namespace | for |", "|---|---|---|---|---|---|"]
    for chart, rows in matrix.items():
        lines.append(f"| **{chart}** | | | | | |")
        lines += [f"| {sa} | {res} | {verb} | {own} | {other} | {why} |"
                  for sa, res, verb, own, other, why in rows]
    return "\n".join(lines) + "\n"


def test_rbac_and_admission_matrix(apiserver: Any, helm: Any, charts: dict[str, str]) -> None:
    from kubernetes import client

    from gpuk8s.services.kube import api_client

    admin = api_client(apiserver.kubeconfig("admin"))
    core: Any = client.CoreV1Api(admin)
    apps: Any = client.AppsV1Api(admin)
    matrix: dict[str, list[Any]] = {}
    problems: list[str] = []
    for chart, values in CHARTS.items():
        ns, rel = f"{chart}-matrix", "matrix"
        helm("install", rel, charts[chart], "-n", ns, "--create-namespace", *values)
        try:
            sel = f"app.kubernetes.io/instance={rel}"
            accounts = sorted(str(a.metadata.name) for a in
                              core.list_namespaced_service_account(ns, label_selector=sel).items)
            agents = {d.spec.template.spec.service_account_name
                      for d in apps.list_namespaced_daemon_set(ns, label_selector=sel).items}
            core.create_namespaced_service_account(ns, {"metadata": {"name": "matrix-nobody"}})
            _setup_targets(admin, ns, {})
            baseline = _held(_api(apiserver, f"{ns}-nobody", _token(core, ns, "matrix-nobody")),
                             (ns, "default"))
            rows: list[Any] = []
            for sa in accounts:
                api = _api(apiserver, f"{ns}-{sa}", _token(core, ns, sa))
                held = {k: v for k, v in _held(api, (ns, "default")).items()
                        if k not in baseline}
                first = _named_targets(held)
                _setup_targets(admin, ns, first)
                if sa in agents:  # the policies load within seconds of the install
                    _wait_for_policies(api, ns)
                found = _rows(api, admin, ns, sa, first, sa in agents)
                for resource, verb, own, other in found:
                    why = PURPOSE.get((sa, resource.split("/")[0]), "")
                    rows.append((sa + (" (node agent)" if sa in agents else ""), resource,
                                 verb, own, other, why))
                    problems += _judge(sa, sa in agents, resource, verb, own, other, why)
                if sa in agents:
                    problems += _agent_writes(api, sa)
                tried = {(r, v) for r, v, *_ in found}
                problems += [f"{sa}: holds {v} {r} (rules review), the matrix does not show it"
                             for r, v in held if r in RESOURCES and (r, v) not in tried
                             and v in VERBS]
                problems += [f"{sa}: holds {v} {r}, which the matrix does not try"
                             for r, v in held if r not in RESOURCES]
            matrix[chart] = rows
        finally:
            helm("uninstall", rel, "-n", ns, "--no-hooks", "--wait", "--timeout", "120s")
            for node in (NODE_A, NODE_B):
                _call(admin, "DELETE", f"/api/v1/nodes/{node}")
                _call(admin, "DELETE", f"/apis/resource.k8s.io/v1/resourceslices/slice-{node}")
                _call(admin, "DELETE", f"/api/v1/namespaces/default/events/event-{node}")
    table = _markdown(matrix)
    print("\n" + table)
    out = Path(os.environ.get("GPUK8S_MATRIX_OUT", "/tmp/gpuk8s-rbac-matrix.md"))
    out.write_text(table)
    assert not problems, "\n".join(problems)
    doc = DOC.read_text()
    assert BEGIN in doc and END in doc, f"{DOC} has no matrix markers"
    head, rest = doc.split(BEGIN, 1)
    committed = rest.split(END, 1)
    if os.environ.get("GPUK8S_WRITE_DOCS") == "1":
        DOC.write_text(f"{head}{BEGIN}\n{table}{END}{committed[1]}")
    else:
        assert committed[0].strip() == table.strip(), (
            "docs/security.md's matrix is not what this run found: run this test with "
            "GPUK8S_WRITE_DOCS=1 and commit the change")


def _wait_for_policies(api: Any, ns: str) -> None:
    deadline = time.monotonic() + 30
    while _try(api, api, Targets(ns), "nodes", "patch", "other", {}) == "yes":
        assert time.monotonic() < deadline, "the own-node policy never took effect"
        time.sleep(0.5)


def _judge(sa: str, agent: bool, resource: str, verb: str, own: str, other: str,
           why: str) -> list[str]:
    """What is wrong with one row."""
    found = [f"{sa}: {verb} {resource}: {c}" for c in (own, other) if c.startswith("HTTP")]
    if not why:
        found.append(f"{sa}: {verb} {resource}: no purpose in PURPOSE (what is it for?)")
    if not agent:
        return found
    base = resource.split("/")[0]
    write = verb.split(" ")[0] in WRITES
    if write and base in NODE_SCOPED and other == "yes":
        found.append(f"node agent {sa} may {verb} {resource} of another node")
    if verb.endswith("the other node's pool") and "yes" in (own, other):
        found.append(f"node agent {sa} may {verb} ({resource})")
    if base == "nodes" and verb in FOREIGN_NODE_PATCHES and "yes" in (own, other):
        found.append(f"node agent {sa} may {verb} (a Node key it does not own)")
    node_key = OWNED_NODE_KEYS.get(sa)
    if node_key and verb == f"patch {node_key[0][:-1]} {node_key[1]}" and own != "yes":
        found.append(f"node agent {sa} may not {verb} on its own node: it cannot work")
    if base == "nodes" and write and own == "yes" and not (
            node_key and verb == f"patch {node_key[0][:-1]} {node_key[1]}"):
        found.append(f"node agent {sa} may {verb} {resource} beyond the keys it owns")
    owned = OWNED_POD_ANNOTATIONS.get(sa)
    if base == "pods" and write and own == "yes" and not (
            owned and verb == f"patch {owned[0]}={owned[1]}"):
        found.append(f"node agent {sa} may {verb} {resource} beyond the annotations it owns")
    if owned and verb == f"patch {owned[0]}={owned[1]}" and own != "yes":
        found.append(f"node agent {sa} may not {verb} on its own node: it cannot work")
    return found


def test_the_lab_install_finds_kube_schedulers_host(
    apiserver: Any, helm: Any, charts: dict[str, str], tmp_path: Path
) -> None:
    """The values the gpu_chart role passes on the lab (inventories/lab, lab/install -e
    gpuk8s_deploy_gpu_aware=true) name no kube-scheduler host: the install finds the lab's
    Node (lab/up labels it control-plane; it has an InternalIP and no pod CIDR) and the
    NetworkPolicy admits it; without such a Node the same values are refused, naming the
    value to set."""
    import yaml

    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({  # roles/gpu_chart/vars/main.yml gpu_chart_values
        "registry": "127.0.0.1:5000/gpuk8s", "pullPolicy": "IfNotPresent",
        "hostPaths": {"root": "/var/lib/gpuk8s-lab/simroot",
                      "extraReadPaths": ["/var/lib/gpuk8s-sim"]},
        "deployExtenderGPUAware": True,
        "gpuExporter": {"enabled": False, "port": 9400, "interval": 10}}))
    install = ("install", "lab", charts["metax-gpu-extensions"], "-n", "lab-like",
               "--create-namespace", "-f", str(values), "--dry-run=server")
    refused = helm(*install, check=False)
    assert refused.returncode != 0
    assert "gpuAware.networkPolicy.controlPlaneCIDRs" in refused.stderr
    core = apiserver.core()
    core.create_node({"metadata": {"name": "lab-like", "labels": {
        "node-role.kubernetes.io/control-plane": ""}}})
    try:
        core.patch_node_status("lab-like", {"status": {"addresses": [
            {"type": "InternalIP", "address": "192.0.2.44"}]}})
        out = helm(*install).stdout
        [policy] = [d for d in yaml.safe_load_all(out.split("MANIFEST:")[1].split("NOTES:")[0])
                    if d and d.get("kind") == "NetworkPolicy"]
        extender, _helm_test = policy["spec"]["ingress"]
        assert extender["from"] == [{"ipBlock": {"cidr": "192.0.2.44/32"}}]
    finally:
        core.delete_node("lab-like")
