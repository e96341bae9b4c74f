"""Helm charts: render with `helm template` over many value combinations and assert on the
parsed objects; `helm lint --strict`; every rendered object validated against the
Kubernetes OpenAPI schemas (kubernetes-validate, strict, and kubeconform when built).

helm comes from $GPUK8S_HELM, else `lab/tools.sh helm` (builds it from Go modules once),
else PATH. Without helm the module is skipped locally and fails under CI.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuk8s.services.extender.leader import LEADER_LABEL

REPO = Path(__file__).resolve().parents[2]
CHARTS = REPO / "charts"
EXT = CHARTS / "metax-gpu-extensions"
OP = CHARTS / "metax-operator"
NS = "gpu-ns"
REL = "rel"
sys.path.insert(0, str(REPO / "lab"))
import versions as lab_versions  # noqa: E402  (lab/versions.py)

sys.path.remove(str(REPO / "lab"))
# the checkout's default lab release (lab/versions.env KUBE_VERSION, not a running lab's:
# the same renders on every machine); its minor's schemas are used below. The other
# releases the lab builds: test_charts_kube_releases.py
LAB_RELEASE = lab_versions.read()["KUBE_VERSION"]
KUBE_VERSION = LAB_RELEASE.lstrip("v").rsplit(".", 1)[0] + ".0"
P = "metax-tech.com/"

# minimal values each chart needs to render
OP_MIN = {"driver": {"payload": {"version": "2.0.0"}}}
# Under every render's values: the address of kube-scheduler's host, which helm install
# finds by lookup in a cluster and helm template must be told (gpu-aware's NetworkPolicy
# fails closed without it); a test of that case passes controlPlaneCIDRs: [] itself.
SCHEDULER_HOST = "192.0.2.10/32"
CLUSTER = {"gpuAware": {"networkPolicy": {"controlPlaneCIDRs": [SCHEDULER_HOST]}}}


# -- locating tools -----------------------------------------------------------------
def _missing(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (required in CI)")
    pytest.skip(reason)


@cache
def _helm_path() -> str | None:
    env = os.environ.get("GPUK8S_HELM")
    if env:
        return env
    tools = REPO / "lab" / "tools.sh"
    if tools.exists():
        proc = subprocess.run(
            ["bash", str(tools), "helm"], capture_output=True, text=True, check=False
        )
        path = proc.stdout.strip()
        if proc.returncode == 0 and path and os.access(path, os.X_OK):
            return path
    return shutil.which("helm")


def helm_bin() -> str:
    path = _helm_path()
    if not path:
        _missing("no helm: set GPUK8S_HELM or make `lab/tools.sh helm` work")
    assert path
    return path


@cache
def _kubeconform_path() -> str | None:
    env = os.environ.get("GPUK8S_KUBECONFORM")
    if env:
        return env
    cache_dir = Path(os.environ.get("GPUK8S_CACHE", "/var/cache/gpuk8s")) / "bin"
    for found in sorted(cache_dir.glob("kubeconform-*/kubeconform"), reverse=True):
        if os.access(found, os.X_OK):
            return str(found)
    return shutil.which("kubeconform")


# -- rendering ------------------------------------------------------------------------
def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def run_helm(
    args: list[str], values: dict[str, Any] | None = None
) -> subprocess.CompletedProcess[str]:
    cmd = [helm_bin(), *args]
    stdin = None
    if values is not None:
        cmd += ["-f", "-"]
        stdin = yaml.safe_dump(values)
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, check=False)


@cache
def _render_cached(chart: str, values_json: str, kube_version: str) -> tuple[int, str, str]:
    proc = run_helm(
        ["template", REL, chart, "-n", NS, "--kube-version", kube_version],
        json.loads(values_json),
    )
    return proc.returncode, proc.stdout, proc.stderr


def render_raw(
    chart: Path, values: dict[str, Any] | None = None, kube_version: str = KUBE_VERSION
) -> tuple[int, str, str]:
    merged = _deep_merge(CLUSTER, values or {})
    return _render_cached(str(chart), json.dumps(merged, sort_keys=True), kube_version)


def render(chart: Path, values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    rc, out, err = render_raw(chart, values)
    assert rc == 0, f"helm template failed: {err}"
    docs = [d for d in yaml.safe_load_all(out) if d]
    assert docs, "rendered nothing"
    return docs


def render_error(chart: Path, values: dict[str, Any]) -> str:
    rc, _out, err = render_raw(chart, values)
    assert rc != 0, f"expected helm template to fail for {values}"
    return err


class Objects:
    """Rendered objects with lookups by kind and name."""

    def __init__(self, docs: list[dict[str, Any]]) -> None:
        self.docs = docs

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [d for d in self.docs if d["kind"] == kind]

    def get(self, kind: str, name: str) -> dict[str, Any]:
        found = [d for d in self.of(kind) if d["metadata"]["name"] == name]
        assert len(found) == 1, f"{kind}/{name}: found {len(found)}"
        return found[0]

    def has(self, kind: str, name: str) -> bool:
        return any(d["metadata"]["name"] == name for d in self.of(kind))

    def workloads(self) -> list[dict[str, Any]]:
        return [d for d in self.docs if d["kind"] in ("DaemonSet", "Deployment")]

    def pod_specs(self) -> Iterable[tuple[str, dict[str, Any]]]:
        for w in self.workloads():
            yield f"{w['kind']}/{w['metadata']['name']}", w["spec"]["template"]["spec"]
        for pod in self.of("Pod"):
            yield f"Pod/{pod['metadata']['name']}", pod["spec"]


def objs(chart: Path, values: dict[str, Any] | None = None) -> Objects:
    return Objects(render(chart, values))


def container(workload: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    containers = workload["spec"]["template"]["spec"]["containers"]
    if name is None and len(containers) == 1:
        return containers[0]  # type: ignore[no-any-return]
    name = name or workload["metadata"]["name"]
    found = [c for c in containers if c["name"] == name]
    assert len(found) == 1, f"no container {name} in {workload['metadata']['name']}"
    return found[0]


def flags(c: dict[str, Any]) -> dict[str, str]:
    """--key=value flags of a container's args."""
    out: dict[str, str] = {}
    for arg in c["args"]:
        if arg.startswith("--") and "=" in arg:
            key, value = arg[2:].split("=", 1)
            out[key] = value
    return out


def mounts(workload: dict[str, Any], cname: str | None = None) -> dict[str, dict[str, Any]]:
    c = container(workload, cname)
    return {m["mountPath"]: m for m in c.get("volumeMounts", [])}


def volumes(workload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in workload["spec"]["template"]["spec"].get("volumes", [])}


def required_node_labels(workload: dict[str, Any], operator: str = "In") -> dict[str, list[str]]:
    """The node labels a workload requires (``In``), or those it stays off (``NotIn``)."""
    affinity = workload["spec"]["template"]["spec"].get("affinity", {})
    terms = (
        affinity.get("nodeAffinity", {})
        .get("requiredDuringSchedulingIgnoredDuringExecution", {})
        .get("nodeSelectorTerms", [])
    )
    assert len(terms) <= 1
    out: dict[str, list[str]] = {}
    for term in terms:
        for expr in term["matchExpressions"]:
            assert expr["operator"] in ("In", "NotIn")
            if expr["operator"] == operator:
                out[expr["key"]] = expr["values"]
    return out


# value combinations rendered by the broad tests (chart, values)
COMBOS: list[tuple[str, Path, dict[str, Any]]] = [
    ("ext-defaults", EXT, {}),
    ("ext-aware", EXT, {"deployExtenderGPUAware": True}),
    (
        "ext-everything",
        EXT,
        {
            "registry": "harbor.example.com:5000/metax/",
            "pullPolicy": "Never",
            "imageTag": "1.2.3",
            "imagePullSecrets": ["pull-a", "pull-b"],
            "deployExtenderGPUAware": True,
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gpu"}],
            "hostPaths": {
                "root": "/srv/sim/node1",
                "devicePlugins": "/data/kubelet/device-plugins",
                "podResources": "/data/kubelet/pod-resources",
            },
            "log": {"dir": "", "level": "warning", "format": "text"},
            "gpuDevice": {
                "healthyInterval": 0,
                "imageTag": "9.9.9",
                "log": {"dir": "/var/log/dp", "level": "debug"},
                "resources": {"limits": {"memory": "256Mi"}},
                "extraArgs": ["--node-state-interval=5"],
            },
            "gpuLabel": {"interval": 15, "log": {"format": "json", "maxAge": "4w2d"}},
            "gpuAware": {"scoreWeight": 3, "lossWeight": "0.5", "log": {"dir": "/var/log/x"},
                         "networkPolicy": {"controlPlaneCIDRs": ["192.0.2.0/24"]}},
            "gpuMps": {"activeThreadPercentage": 30, "interval": 5,
                       "log": {"level": "debug"}, "extraArgs": ["--sharing-mode=auto"]},
            "resourceDescriptors": {"enabled": True},
        },
    ),
    ("op-min", OP, OP_MIN),
    (
        "op-never",
        OP,
        {"driver": {"deployPolicy": "Never"}, "deployExtenderGPUAware": True},
    ),
    (
        "op-everything",
        OP,
        {
            "registry": "registry.local/cloud",
            "pullPolicy": "Always",
            "deployExtenderGPUAware": True,
            "log": {"level": "error"},
            "driver": {
                "deployPolicy": "Always",
                "payload": {"name": "mx-driver", "version": "2.31.0.6", "registry": "drv.local/x"},
                "log": {"format": "text"},
                "imageTag": "7",
            },
            "maca": {
                "payload": {
                    "images": [
                        "maca-c500:2.18.0.3-ubuntu18.04-amd64",
                        "maca-c550:2.18.0.3-ubuntu22.04-amd64",
                    ]
                },
                "log": {"dir": "/var/log/maca", "level": "debug"},
            },
            "runtime": {"log": {"rotationTime": "12h"}},
            "operatorController": {"log": {"dir": ""}, "imageTag": "8.0.0"},
            "gpuMps": {"enabled": False},
            "resourceDescriptors": {"enabled": True, "namespace": "platform-public", "items": [
                {"customName": "gpu-manager", "keyName": "vcuda-core",
                 "key": "tencent.com/vcuda-core", "dataType": "integer", "defaultValue": "50",
                 "descriptionZh": "GPU 虚拟核数", "descriptionEn": "GPU vcore count",
                 "limits": "required", "requests": "fromLimits"}]},
        },
    ),
]
COMBO_IDS = [c[0] for c in COMBOS]


@pytest.fixture(params=COMBOS, ids=COMBO_IDS)
def combo(request: pytest.FixtureRequest) -> tuple[str, Path, dict[str, Any], Objects]:
    name, chart, values = request.param
    return name, chart, values, objs(chart, values)


# -- lint ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "chart,values",
    [
        (EXT, {}),
        (EXT, {"deployExtenderGPUAware": True}),
        (OP, OP_MIN),
        (OP, {"driver": {"deployPolicy": "Never"}}),
    ],
    ids=["ext", "ext-aware", "op", "op-never"],
)
def test_helm_lint_strict(chart: Path, values: dict[str, Any]) -> None:
    proc = run_helm(["lint", "--strict", str(chart)], values)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout
    assert "[WARNING]" not in proc.stdout and "[ERROR]" not in proc.stdout, proc.stdout


def test_helm_lint_library_chart() -> None:
    proc = run_helm(["lint", "--strict", str(CHARTS / "gpuk8s-common")])
    assert proc.returncode == 0 and "0 chart(s) failed" in proc.stdout, proc.stdout + proc.stderr
    assert "library" in (CHARTS / "gpuk8s-common" / "Chart.yaml").read_text()


def test_helm_lint_fails_on_bad_values() -> None:
    """Lint is a real check: a wrong enum makes it fail."""
    proc = run_helm(["lint", "--strict", str(EXT)], {"pullPolicy": "Sometimes"})
    assert proc.returncode != 0
    assert "pullPolicy" in proc.stdout + proc.stderr


# -- schema validation of every rendered object -----------------------------------------
def test_every_object_validates_against_kubernetes_schemas(combo: Any) -> None:
    kv = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate")
    _name, _chart, _values, rendered = combo
    errors = []
    for doc in rendered.docs:
        try:
            kv.validate(doc, KUBE_VERSION, strict=True)
        except kv.ValidationError as err:
            path = ".".join(str(p) for p in err.path)
            errors.append(f"{doc['kind']}/{doc['metadata']['name']}: {path}: {err.message}")
        except kv.SchemaNotFoundError as err:  # pragma: no cover - a kind we don't know
            errors.append(err.message)
    assert not errors, "\n".join(errors)


def test_schema_validation_can_fail() -> None:
    kv = pytest.importorskip("kubernetes_validate")
    bad = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "x"},
        "spec": {
            "selector": {},
            "template": {"spec": {"containers": [{"name": "c", "imagePullPolicy": 3}]}},
        },
    }
    with pytest.raises(kv.ValidationError):
        kv.validate(bad, KUBE_VERSION, strict=True)


def _refs(node: Any) -> Iterable[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str) and "#/$defs/" in value:
                yield value.split("#/$defs/", 1)[1]
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)


@pytest.fixture(scope="module")
def kubeconform_schemas(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """kubeconform-readable schemas from kubernetes-validate's strict set of KUBE_VERSION's
    minor: each kind we render, made standalone by inlining the definitions it reaches."""
    kv = pytest.importorskip("kubernetes_validate")
    src = Path(kv.__file__).parent / "kubernetes-json-schema" / f"v{KUBE_VERSION}-local-strict"
    defs = json.loads((src / "_definitions.json").read_text())["$defs"]
    out = tmp_path_factory.mktemp("kubeconform-schemas")
    names = {
        "serviceaccount-v1",
        "configmap-v1",
        "service-v1",
        "pod-v1",
        "daemonset-apps-v1",
        "deployment-apps-v1",
        "clusterrole-rbac-v1",
        "clusterrolebinding-rbac-v1",
        "role-rbac-v1",
        "rolebinding-rbac-v1",
        "runtimeclass-node-v1",
        "job-batch-v1",
        "secret-v1",
        "networkpolicy-networking-v1",
    }
    for name in names:
        schema = json.loads((src / f"{name}.json").read_text())
        todo, reached = list(_refs(schema)), set()
        while todo:
            ref = todo.pop()
            if ref not in reached:
                reached.add(ref)
                todo.extend(_refs(defs[ref]))
        schema["$defs"] = {r: defs[r] for r in reached}
        text = json.dumps(schema).replace('"/api/_definitions.json#', '"#')
        (out / f"{name}.json").write_text(text)
    return out


def kubeconform(manifest: Path, schemas: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """`kubeconform -strict` over ``manifest`` with the JSON schemas in the folder ``schemas``."""
    path = _kubeconform_path()
    if not path:
        pytest.skip("kubeconform not built: lab/tools.sh kubeconform")
    location = str(schemas) + "/{{.ResourceKind}}{{.KindSuffix}}.json"
    return subprocess.run(
        [path, "-strict", *flags, "-schema-location", location, str(manifest)],
        capture_output=True,
        text=True,
        check=False,
    )


def assert_kubeconform_accepts(
    chart: Path, values: dict[str, Any], schemas: Path, manifest: Path
) -> str:
    """Render ``chart`` with ``values`` into ``manifest``; kubeconform accepts every object.
    Returns the rendered text."""
    rc, out, err = render_raw(chart, values)
    assert rc == 0, err
    manifest.write_text(out)
    proc = kubeconform(manifest, schemas, "-summary")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Invalid: 0, Errors: 0, Skipped: 0" in proc.stdout, proc.stdout
    return out


@pytest.mark.parametrize("name", ["ext-everything", "op-everything"])
def test_kubeconform_strict(name: str, kubeconform_schemas: Path, tmp_path: Path) -> None:
    _n, chart, values = next(c for c in COMBOS if c[0] == name)
    manifest = tmp_path / "rendered.yaml"
    out = assert_kubeconform_accepts(chart, values, kubeconform_schemas, manifest)
    # and it does catch a broken object
    manifest.write_text(
        out + "\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: x, bogus: 1}\n"
    )
    proc = kubeconform(manifest, kubeconform_schemas)
    assert proc.returncode != 0 and "bogus" in proc.stdout


# -- properties of every combination ------------------------------------------------------
def test_namespaced_objects_live_in_the_release_namespace(combo: Any) -> None:
    _n, _c, _v, rendered = combo
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding"}
    for doc in rendered.docs:
        meta = doc["metadata"]
        if doc["kind"] == "RuntimeClass":  # pods name it: the handler's name, no prefix
            assert "namespace" not in meta and meta["name"] == doc["handler"]
        elif meta.get("namespace") == "default":  # Node Events live there (node-events.yaml)
            assert doc["kind"] in ("Role", "RoleBinding") and meta["name"] == f"{REL}-node-events"
        elif doc["kind"] in cluster_scoped:
            assert "namespace" not in meta
            assert meta["name"].startswith(f"{REL}-")
        elif meta["name"].startswith("cf-crl-"):  # SPEC §11: where the platform reads them
            assert doc["kind"] == "ConfigMap"
            assert meta["namespace"] == _v["resourceDescriptors"].get("namespace", "kube-public")
        else:
            assert meta["namespace"] == NS, f"{doc['kind']}/{meta['name']}"
        assert len(meta["name"]) <= 63
        labels = meta["labels"]
        assert labels["app.kubernetes.io/instance"] == REL
        assert labels["app.kubernetes.io/managed-by"] == "Helm"


def test_workload_selectors_match_pod_labels(combo: Any) -> None:
    _n, _c, _v, rendered = combo
    for w in rendered.workloads():
        selector = w["spec"]["selector"]["matchLabels"]
        pod_labels = w["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= pod_labels.items()
        assert "app.kubernetes.io/version" not in selector  # selectors are immutable
    for svc in rendered.of("Service"):
        selector = dict(svc["spec"]["selector"])
        # gpu-aware with replicas: the elected one labels its own pod at run time
        # (leader.py), and the Service sends kube-scheduler to it alone
        if selector.pop(LEADER_LABEL, None) is not None:
            assert svc["metadata"]["name"] == "gpu-aware"
            assert selector  # still the component's own labels
        target = [
            w
            for w in rendered.workloads()
            if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(target) == 1, (
            f"Service {svc['metadata']['name']} selects {len(target)} workloads"
        )


def test_images_registry_tag_and_pull_policy(combo: Any) -> None:
    _n, chart, values, rendered = combo
    registry = values.get("registry", "cr.metax-tech.com/cloud").rstrip("/")
    app_version = yaml.safe_load((chart / "Chart.yaml").read_text())["appVersion"]
    global_tag = str(values.get("imageTag") or app_version)
    component_values = {
        "gpu-device": "gpuDevice",
        "gpu-label": "gpuLabel",
        "gpu-aware": "gpuAware",
        "gpu-exporter": "gpuExporter",
        "driver-manager": "driver",
        "container-runtime": "runtime",
        "operator-controller": "operatorController",
    }
    pull = values.get("pullPolicy", "IfNotPresent")
    for where, spec in rendered.pod_specs():
        for c in spec["containers"]:
            assert c["imagePullPolicy"] == pull, where
            if "payload" in c["name"]:  # driver/SDK payload images: their own registry
                continue
            repo, tag = c["image"].rsplit(":", 1)
            assert repo.rsplit("/", 1)[0] == registry, where
            component = repo.rsplit("/", 1)[1]
            if where.startswith("Pod/"):
                assert component == "gpu-label"  # the test pod uses the labeller's image
            key = component_values[component]
            own = str(values.get(key, {}).get("imageTag") or "")
            assert tag == (own or global_tag), where
        secrets = [s["name"] for s in spec.get("imagePullSecrets", [])]
        assert secrets == values.get("imagePullSecrets", []), where


def test_least_privilege_security_contexts(combo: Any) -> None:
    """Only the device plugin, the exporter (both open GPU device nodes) and the driver
    installer are privileged; everything else drops every capability, cannot escalate
    and has a read-only root filesystem."""
    _n, _c, _v, rendered = combo
    privileged_ok = {("DaemonSet/metax-gpu-device", "gpu-device"),
                     ("DaemonSet/gpu-mps", "gpu-mps"),  # the MPS daemons open the GPUs
                     ("DaemonSet/driver-manager", "driver"),
                     ("DaemonSet/gpu-exporter", "gpu-exporter")}
    for where, spec in rendered.pod_specs():
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        assert not spec.get("hostNetwork") and not spec.get("hostIPC")
        # container-runtime signals containerd (restartMode signal): it must see its pid
        assert not spec.get("hostPID") or where == "DaemonSet/container-runtime", where
        for c in spec["containers"]:
            sc = c["securityContext"]
            if (where, c["name"]) in privileged_ok:
                assert sc["privileged"] is True
                continue
            if where == "DaemonSet/driver-manager" and "payload" in c["name"]:
                # copies its image's files as they are (cp -a): owners and modes only
                assert sc["capabilities"] == {"drop": ["ALL"],
                                              "add": ["CHOWN", "FOWNER", "DAC_OVERRIDE"]}
                assert sc["allowPrivilegeEscalation"] is False
                assert sc["readOnlyRootFilesystem"] is True
                continue
            assert not sc.get("privileged"), where
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["capabilities"]["drop"] == ["ALL"], where
            assert "add" not in sc["capabilities"], where
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["runAsNonRoot"] == (sc["runAsUser"] != 0), where


def _rules_by_subject(rendered: Objects) -> dict[str, list[dict[str, Any]]]:
    """ServiceAccount name -> every RBAC rule bound to it (cluster and namespace)."""
    roles = {
        (r["kind"], r["metadata"]["name"]): r
        for r in rendered.of("ClusterRole") + rendered.of("Role")
    }
    out: dict[str, list[dict[str, Any]]] = {}
    for b in rendered.of("ClusterRoleBinding") + rendered.of("RoleBinding"):
        role = roles[(b["roleRef"]["kind"], b["roleRef"]["name"])]
        if b["kind"] == "RoleBinding":
            assert (
                role["kind"] == "Role"
                and role["metadata"]["namespace"] == b["metadata"]["namespace"]
            )
        for s in b["subjects"]:
            assert s["kind"] == "ServiceAccount" and s["namespace"] == NS
            assert rendered.has("ServiceAccount", s["name"]), s["name"]
            out.setdefault(s["name"], []).extend(role["rules"])
    return out


def _permissions(rules: list[dict[str, Any]]) -> set[tuple[str, str, str, str]]:
    out = set()
    for r in rules:
        for group in r["apiGroups"]:
            for res in r["resources"]:
                for verb in r["verbs"]:
                    for name in r.get("resourceNames", ["*any*"]):
                        out.add((group, res, verb, name))
    return out


ANY = "*any*"
EXPECTED_PERMISSIONS: dict[str, set[tuple[str, str, str, str]]] = {
    "gpu-device": {("", "nodes", "get", ANY), ("", "nodes", "patch", ANY)},
    "gpu-label": {("", "nodes", "get", ANY), ("", "nodes", "patch", ANY)},
    "gpu-aware": {
        ("", res, verb, ANY) for res in ("nodes", "pods") for verb in ("get", "list", "watch")
    }
    | {("", "configmaps", "get", "gpu-aware-plugin")}
    # GPU sharing: record the chosen GPUs on the pod, then bind it
    | {("", "pods", "patch", ANY), ("", "pods/binding", "create", ANY)}
    # replicas (2 by default) elect the one that books shared GPUs on the Lease gpu-aware
    | {("coordination.k8s.io", "leases", "create", ANY)}
    | {("coordination.k8s.io", "leases", verb, "gpu-aware") for verb in ("get", "update")},
    "driver-manager": {("", "nodes", "get", ANY), ("", "nodes", "patch", ANY),
                       ("", "events", "create", ANY), ("", "pods", "get", ANY)},  # events: default
    "container-runtime": {("", "nodes", "get", ANY), ("", "nodes", "patch", ANY),
                          ("", "events", "create", ANY)},
    "gpu-test": {("", "nodes", "get", ANY), ("", "nodes", "list", ANY)},
    "gpu-exporter": {("", "pods", "list", ANY)},
    "gpu-mps": {("", "nodes", "get", ANY)},
    # the extensions chart's uninstall hook: its node agents stopped, then the release's nodes
    # cleaned (gpuk8s serve node-cleanup)
    "gpu-extensions-uninstall": {("", "nodes", v, ANY) for v in ("get", "list", "patch")}
    | {("", "pods", "list", ANY)}
    | {("apps", "daemonsets", "delete", name) for name in (
        "metax-gpu-device", "metax-gpu-dra", "gpu-exporter", "gpu-label", "gpu-mps")},
}


def test_rbac_is_least_privilege(combo: Any) -> None:
    _n, _c, _v, rendered = combo
    by_subject = _rules_by_subject(rendered)
    for sa, rules in by_subject.items():
        perms = _permissions(rules)
        for group, res, verb, _name in perms:
            assert "*" not in (group, res, verb), f"{sa}: wildcard in {rules}"
            assert res != "secrets", f"{sa} may read secrets"
        if sa in EXPECTED_PERMISSIONS:
            assert perms == EXPECTED_PERMISSIONS[sa], sa
    # every pod's ServiceAccount exists; only those that need the API get a token
    for where, spec in rendered.pod_specs():
        sa = spec["serviceAccountName"]
        assert rendered.has("ServiceAccount", sa), where
        assert sa in by_subject, f"{where}: {sa} is bound to nothing"


def test_operator_controller_rbac() -> None:
    rendered = objs(OP, OP_MIN)
    perms = _permissions(_rules_by_subject(rendered)["operator-controller"])
    assert ("", "nodes", "patch", ANY) in perms  # desired vfnum, uninstall cleanup
    assert ("", "pods", "delete", ANY) in perms  # namespace Role only: gpu-device restart
    cluster = _permissions(rendered.get("ClusterRole", f"{REL}-operator-controller")["rules"])
    assert ("", "pods", "delete", ANY) not in cluster  # never user pods
    assert ("", "configmaps", "create", ANY) in perms  # driver-config when missing
    for verb in ("get", "patch", "delete"):
        assert ("", "configmaps", verb, "driver-config") in perms
    assert ("", "configmaps", "update", ANY) not in perms
    assert ("", "configmaps", "patch", ANY) not in perms
    assert ("apps", "daemonsets", "delete", "metax-gpu-device") in perms  # uninstall hook
    # driver-manager's template hash (its out-of-date pods are replaced): that one only
    assert {p for p in perms if p[:3] == ("apps", "daemonsets", "get")} == {
        ("apps", "daemonsets", "get", "driver-manager")}
    # the hook deletes every node agent DaemonSet the chart can create (each cleans its node
    # on the way out), and only those
    from gpuk8s.services.operator.main import DAEMONSET_NAMES, NODE_AGENTS

    every = objs(OP, {**OP_MIN, "gpuDra": {"enabled": True}, "gpuExporter": {"enabled": True},
                      "gpuMps": {"enabled": True}})
    daemonsets = {d["metadata"]["name"] for d in every.of("DaemonSet")}
    assert {DAEMONSET_NAMES.get(a, a) for a in NODE_AGENTS} == daemonsets
    assert {p[3] for p in perms if p[:3] == ("apps", "daemonsets", "delete")} == daemonsets
    hook = rendered.get("Job", "operator-uninstall")
    assert hook["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
    # it waits for operator-controller's pods to be gone: it must not be one of them
    labels = hook["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/name"] == "operator-uninstall"
    assert container(hook, "uninstall")["args"][:3] == ["serve", "operator-controller",
                                                          "--namespace=$(POD_NAMESPACE)"]


def test_operator_controller_and_its_hook_act_on_the_releases_nodes_only() -> None:
    """nodeSelector confines the release to a node group: the controller and its uninstall
    hook get it as their --node-selector (a scheme beside on other nodes is left alone)."""
    def selectors(rendered: Objects) -> list[str | None]:
        return [flags(container(rendered.get(kind, name), c)).get("node-selector")
                for kind, name, c in (("Deployment", "operator-controller",
                                       "operator-controller"),
                                      ("Job", "operator-uninstall", "uninstall"))]

    assert selectors(objs(OP, OP_MIN)) == [None, None]  # every node, as before
    confined = objs(OP, {**OP_MIN, "nodeSelector": {"gpuk8s.io/scheme": "operator",
                                                    "example.com/pool": "a"}})
    assert selectors(confined) == ["example.com/pool=a,gpuk8s.io/scheme=operator"] * 2


def test_the_extensions_uninstall_hook_stops_every_agent_and_cleans_the_releases_nodes() -> None:
    """helm uninstall of the extensions chart leaves no label or annotation of ours: a
    bounded pre-delete Job (`gpuk8s serve node-cleanup`) deletes every node agent DaemonSet
    the chart can create, then cleans the nodes its nodeSelector selects."""
    from gpuk8s.services.operator.cleanup import EXTENSIONS_AGENTS
    from gpuk8s.services.operator.main import DAEMONSET_NAMES

    every = objs(EXT, {"gpuDra": {"enabled": True}, "gpuExporter": {"enabled": True},
                       "gpuMps": {"enabled": True}, "nodeSelector": {"gpuk8s.io/scheme": "x"}})
    daemonsets = {d["metadata"]["name"] for d in every.of("DaemonSet")}
    assert {DAEMONSET_NAMES.get(a, a) for a in EXTENSIONS_AGENTS} == daemonsets
    hook = every.get("Job", "gpu-extensions-uninstall")
    assert hook["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
    assert 0 < hook["spec"]["activeDeadlineSeconds"] <= 300  # never hangs the uninstall
    c = container(hook, "uninstall")
    assert c["args"][:2] == ["serve", "node-cleanup"]
    f = flags(c)
    assert f["node-selector"] == "gpuk8s.io/scheme=x" and 0 < float(f["timeout"]) < 300
    assert "node-selector" not in flags(container(objs(EXT).get("Job", "gpu-extensions-uninstall"),
                                                  "uninstall"))


def test_host_paths_are_plain_paths_under_the_root(combo: Any) -> None:
    """Every hostPath is an absolute path without quote characters (a value quoted twice
    in a template becomes a path with literal quotes: runc fails to mount it)."""
    _n, _c, _v, rendered = combo
    for where, spec in rendered.pod_specs():
        for volume in spec.get("volumes") or []:
            path = (volume.get("hostPath") or {}).get("path")
            if path is not None:
                assert path.startswith("/") and '"' not in path, (where, volume)
    sim = objs(OP, {**OP_MIN, "hostPaths": {"root": "/srv/sim"}})
    for name in ("driver-manager", "container-runtime"):
        paths = [v["hostPath"]["path"] for v in volumes(sim.get("DaemonSet", name)).values()
                 if "hostPath" in v]
        assert "/srv/sim/run/metax" in paths, (name, paths)


def test_operator_upgrade_policy_reaches_the_controller_and_is_validated() -> None:
    rendered = objs(OP, {"driver": {"deployPolicy": "Always", "payload": {"version": "2.33.0.6"},
                                    "upgradePolicy": {"maxParallel": 3, "maxUnavailable": "40%",
                                                      "drainTimeoutSeconds": 90, "force": True,
                                                      "podSelector": "app in (a,b)"}}})
    f = flags(container(rendered.get("Deployment", "operator-controller")))
    assert f["driver-version"] == "2.33.0.6" and f["driver-deploy-policy"] == "Always"
    assert f["upgrade-max-parallel"] == "3" and f["upgrade-max-unavailable"] == "40%"
    assert f["upgrade-drain-timeout"] == "90" and f["upgrade-timeout"] == "600"
    args = container(rendered.get("Deployment", "operator-controller"))["args"]
    assert f["upgrade-pod-selector"] == "app in (a,b)" and "--upgrade-force" in args
    assert "--upgrade-delete-emptydir-data" not in args
    cluster = _permissions(rendered.get("ClusterRole", f"{REL}-operator-controller")["rules"])
    assert ("", "pods/eviction", "create", ANY) in cluster  # PDB-respecting only
    # it (and its uninstall hook) must run on a single-node cluster whose node it cordoned
    cordoned = {"key": "node.kubernetes.io/unschedulable", "operator": "Exists",
                "effect": "NoSchedule"}
    for kind, name in (("Deployment", "operator-controller"), ("Job", "operator-uninstall")):
        assert cordoned in rendered.get(kind, name)["spec"]["template"]["spec"]["tolerations"]
    default = flags(container(objs(OP, OP_MIN).get("Deployment", "operator-controller")))
    assert default["upgrade-max-parallel"] == "1" and default["upgrade-max-unavailable"] == "25%"
    for bad in ({"maxParallel": 0}, {"maxUnavailable": "0%"}, {"maxUnavailable": "101%"},
                {"drainTimeoutSeconds": 0}, {"surprise": 1}, {"podSelector": "a;rm"}):
        error = render_error(OP, {"driver": {"payload": {"version": "2.0.0"},
                                             "upgradePolicy": bad}})
        assert "upgradePolicy" in error, (bad, error)


def test_node_agents_are_critical_and_tolerate_gpu_taints(combo: Any) -> None:
    _n, _c, values, rendered = combo
    for ds in rendered.of("DaemonSet"):
        spec = ds["spec"]["template"]["spec"]
        assert spec["priorityClassName"] == "system-node-critical"
        keys = {t.get("key") for t in spec["tolerations"]}
        assert {
            "metax-tech.com/gpu",
            "CriticalAddonsOnly",
            "node-role.kubernetes.io/control-plane",
        } <= keys
        for extra in values.get("tolerations", []):
            assert extra in spec["tolerations"]
        env = {e["name"]: e for c in spec["containers"] for e in c.get("env", [])}
        assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


def _effective_log(values: dict[str, Any], key: str) -> dict[str, str]:
    base = {
        "dir": "/var/log/metax",
        "level": "info",
        "format": "json",
        "rotationTime": "1w",
        "maxAge": "26w",
    }
    base.update(values.get("log", {}))
    base.update(values.get(key, {}).get("log", {}))
    return base


LOG_FLAGS = {
    "dir": "log-dir",
    "level": "log-level",
    "format": "log-format",
    "rotationTime": "log-rotation-time",
    "maxAge": "log-max-age",
}


def test_component_log_overrides_global_key_by_key(combo: Any) -> None:
    _n, _c, values, rendered = combo
    containers = {
        ("DaemonSet", "metax-gpu-device", "gpu-device"): "gpuDevice",
        ("DaemonSet", "gpu-label", "gpu-label"): "gpuLabel",
        ("Deployment", "gpu-aware", "gpu-aware"): "gpuAware",
        ("DaemonSet", "driver-manager", "driver"): "driver",
        ("DaemonSet", "driver-manager", "maca"): "maca",
        ("DaemonSet", "container-runtime", "container-runtime"): "runtime",
        ("Deployment", "operator-controller", "operator-controller"): "operatorController",
    }
    seen = 0
    for (kind, wname, cname), key in containers.items():
        if not rendered.has(kind, wname):
            continue
        seen += 1
        w = rendered.get(kind, wname)
        f = flags(container(w, cname))
        want = _effective_log(values, key)
        assert {k: f[flag] for k, flag in LOG_FLAGS.items()} == want, f"{wname}/{cname}"
        # the log dir is a host directory mounted at the same path, or absent
        logs = [
            m for m in container(w, cname).get("volumeMounts", []) if m["name"].startswith("log")
        ]
        if want["dir"]:
            assert [m["mountPath"] for m in logs] == [want["dir"]]
            vol = volumes(w)[logs[0]["name"]]
            assert vol["hostPath"] == {"path": want["dir"], "type": "DirectoryOrCreate"}
        else:
            assert logs == []
    assert seen >= 2


def test_log_override_single_key() -> None:
    """SPEC example: gpuLabel.log.format=text changes only that key of gpu-label."""
    rendered = objs(EXT, {"gpuLabel": {"log": {"format": "text"}}})
    label = flags(container(rendered.get("DaemonSet", "gpu-label")))
    device = flags(container(rendered.get("DaemonSet", "metax-gpu-device"), "gpu-device"))
    assert label["log-format"] == "text" and device["log-format"] == "json"
    assert label["log-dir"] == device["log-dir"] == "/var/log/metax"
    assert label["log-max-age"] == "26w" and label["log-rotation-time"] == "1w"


# -- gpu-device / gpu-label ---------------------------------------------------------------
# What the node agents see of the host, each read-only at /host<path>: never the whole /.
HOST_READ_PATHS = ("/sys", "/dev", "/opt", "/usr/bin", "/usr/local/bin", "/proc/driver",
                   "/run/metax", "/var/lib/gpuk8s")  # the last: driver-owner.json (mode=cloud)
HOST_READ_PATHS_IN_POD = tuple(f"/host{p}" for p in HOST_READ_PATHS)


def assert_reads_only_a_few_host_paths(workload: dict[str, Any], root: str) -> None:
    m, v = mounts(workload), volumes(workload)
    base = root.rstrip("/")
    for path in HOST_READ_PATHS:
        mount = m[f"/host{path}"]
        assert mount["readOnly"] is True, path
        assert v[mount["name"]]["hostPath"]["path"] == base + path
    for name, vol in v.items():
        host = vol.get("hostPath", {}).get("path")
        assert host not in ("/", root), f"{name} mounts the whole host root {host}"
    assert "/host" not in m
def test_gpu_device_daemonset(combo: Any) -> None:
    _name, chart, values, rendered = combo
    ds = rendered.get("DaemonSet", "metax-gpu-device")
    c = container(ds, "gpu-device")
    assert c["args"][:2] == ["serve", "device-plugin"]
    f = flags(c)
    assert f["host-root"] == "/host"
    assert f["healthy-interval"] == str(values.get("gpuDevice", {}).get("healthyInterval", 5))
    for extra in values.get("gpuDevice", {}).get("extraArgs", []):
        assert extra in c["args"]
    hp = {
        "root": "/",
        "devicePlugins": "/var/lib/kubelet/device-plugins",
        "podResources": "/var/lib/kubelet/pod-resources",
        **values.get("hostPaths", {}),
    }
    m = mounts(ds)
    v = volumes(ds)
    assert not m["/var/lib/kubelet/device-plugins"].get("readOnly")
    assert m["/var/lib/kubelet/pod-resources"]["readOnly"] is True
    assert_reads_only_a_few_host_paths(ds, hp["root"])
    if hp["root"].rstrip("/"):  # a simulated host tree: device paths live under it
        assert f["device-path-prefix"] == hp["root"].rstrip("/")
    else:
        assert "device-path-prefix" not in f
    assert (
        v[m["/var/lib/kubelet/device-plugins"]["name"]]["hostPath"]["path"] == hp["devicePlugins"]
    )
    assert v[m["/var/lib/kubelet/pod-resources"]["name"]]["hostPath"]["path"] == hp["podResources"]
    want = {
        P + "gpu.installed": ["true"],
        P + "driver.ready": ["true"],
        "kubernetes.io/os": ["linux"],
    }
    if chart == OP:
        want |= {P + "maca.ready": ["true"], P + "runtime.ready": ["true"]}
        # CDI names only where the node accepts them; else the wrapper's annotation
        assert {"--cdi=auto", "--cdi-annotation"} <= set(c["args"])
    else:
        assert not any(a.startswith("--cdi") for a in c["args"])
    assert required_node_labels(ds) == want
    # default requests reserve what the plugin needs; given values are merged over them
    defaults = {"requests": {"cpu": "20m", "memory": "64Mi"}}
    assert c["resources"] == _deep_merge(defaults, values.get("gpuDevice", {}).get("resources", {}))


def test_gpu_label_daemonset_runs_everywhere(combo: Any) -> None:
    _n, _c, values, rendered = combo
    ds = rendered.get("DaemonSet", "gpu-label")
    spec = ds["spec"]["template"]["spec"]
    # it writes the metax-tech.com/ labels, so it must not wait for any of them
    assert required_node_labels(ds) == {}
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux"}
    c = container(ds)
    assert c["args"][:2] == ["serve", "labeller"]
    f = flags(c)
    assert f["host-root"] == "/host"
    assert f["interval"] == str(values.get("gpuLabel", {}).get("interval", 60))
    assert f["health-port"] == "8081"
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"health": 8081}
    m = mounts(ds)
    assert_reads_only_a_few_host_paths(ds, values.get("hostPaths", {}).get("root", "/"))
    assert set(m) <= set(HOST_READ_PATHS_IN_POD) | {_effective_log(values, "gpuLabel")["dir"]}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}


# -- gpu-aware ------------------------------------------------------------------------------
def test_gpu_aware_only_when_enabled() -> None:
    off = objs(EXT)
    assert not any(d["metadata"]["name"] == "gpu-aware" for d in off.docs)
    assert not any("gpu-aware" in d["metadata"]["name"] for d in off.docs)
    on = objs(EXT, {"deployExtenderGPUAware": True})
    for kind in ("Deployment", "Service", "ServiceAccount", "Role", "RoleBinding"):
        assert on.has(kind, "gpu-aware"), kind
    assert on.has("ConfigMap", "gpu-aware-plugin")
    assert on.has("ClusterRole", f"{REL}-gpu-aware")


@pytest.mark.parametrize(
    "weights,expected",
    [
        ({}, ("1", "1")),
        ({"scoreWeight": 10, "lossWeight": 0}, ("10", "0")),
        ({"scoreWeight": "0.25", "lossWeight": 2.5}, ("0.25", "2.5")),
    ],
)
def test_gpu_aware_deployment_service_and_weights(
    weights: dict[str, Any], expected: tuple[str, str]
) -> None:
    rendered = objs(EXT, {"deployExtenderGPUAware": True, "gpuAware": weights})
    cm = rendered.get("ConfigMap", "gpu-aware-plugin")  # `grep gpu-aware-plugin` finds it
    assert cm["data"] == {"scoreWeight": expected[0], "lossWeight": expected[1]}
    assert cm["metadata"]["annotations"]["metax-tech.com/chart-weights"] == "/".join(expected)
    svc = rendered.get("Service", "gpu-aware")
    assert svc["spec"]["type"] == "ClusterIP"
    assert [(p["port"], p["targetPort"]) for p in svc["spec"]["ports"]] == [
        (8080, "extender"), (8081, "health")]
    dep = rendered.get("Deployment", "gpu-aware")
    c = container(dep)
    assert c["args"][:2] == ["serve", "extender"]
    assert flags(c)["port"] == "8080" and flags(c)["config-dir"] == "/etc/gpu-aware"
    # the node watch that nodeCacheCapable: true (the gpu_aware role's default) needs;
    # RBAC for it: test_rbac_is_least_privilege (get/list/watch on nodes and pods)
    assert "--node-cache" in c["args"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"extender": 8080,
                                                                    "health": 8081}
    m = mounts(dep)["/etc/gpu-aware"]
    assert m["readOnly"] is True
    assert volumes(dep)[m["name"]]["configMap"]["name"] == "gpu-aware-plugin"
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    spec = dep["spec"]["template"]["spec"]
    # control-plane preferred, not required: single-node labs must work
    aff = spec["affinity"]["nodeAffinity"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in aff
    pref = aff["preferredDuringSchedulingIgnoredDuringExecution"][0]["preference"][
        "matchExpressions"
    ]
    assert pref == [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]
    assert any(t.get("key") == "node-role.kubernetes.io/control-plane" for t in spec["tolerations"])


@pytest.mark.parametrize(
    ("chart", "values", "name"),
    [(EXT, {"deployExtenderGPUAware": True}, "gpu-aware"),
     (OP, OP_MIN, "operator-controller")],
    ids=["gpu-aware", "operator-controller"],
)
def test_deployments_run_as_non_root_even_with_host_logs(
    chart: Path, values: dict[str, Any], name: str
) -> None:
    """The host log dir was the only reason for root: an init container with CHOWN and
    FOWNER alone hands the directory's group to 65532 instead."""
    dep = objs(chart, values).get("Deployment", name)
    spec = dep["spec"]["template"]["spec"]
    c = container(dep)
    assert c["securityContext"]["runAsUser"] == 65532
    assert c["securityContext"]["runAsNonRoot"] is True
    [init] = spec["initContainers"]
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN", "FOWNER"]}
    assert init["securityContext"]["allowPrivilegeEscalation"] is False
    assert init["args"][1:] == ["/log", name]
    log_volume = volumes(dep)[init["volumeMounts"][0]["name"]]
    assert log_volume["hostPath"]["path"] == "/var/log/metax"
    assert mounts(dep)["/var/log/metax"]["name"] == init["volumeMounts"][0]["name"]
    key = "gpuAware" if name == "gpu-aware" else "operatorController"
    no_logs = objs(chart, _deep_merge(values, {key: {"log": {"dir": ""}}})).get("Deployment", name)
    assert "initContainers" not in no_logs["spec"]["template"]["spec"]
    assert container(no_logs)["securityContext"]["runAsUser"] == 65532


def test_log_dir_init_container_lets_65532_write(tmp_path: Path) -> None:
    """The init container's script, run here on a directory like the host's: afterwards
    the group of 65532 may create files, and its own old log file is its."""
    import os
    import subprocess

    dep = objs(EXT, {"deployExtenderGPUAware": True}).get("Deployment", "gpu-aware")
    [init] = dep["spec"]["template"]["spec"]["initContainers"]
    d = tmp_path / "log"
    d.mkdir(mode=0o755)
    (d / "gpu-aware.log").write_text("old\n")
    (d / "gpu-device.log").write_text("other\n")
    if os.geteuid() != 0:
        pytest.skip("chown needs root")
    subprocess.run([*init["command"], init["args"][0], str(d), "gpu-aware"], check=True)
    st = d.stat()
    assert st.st_gid == 65532 and st.st_mode & 0o7777 == 0o3775
    assert (d / "gpu-aware.log").stat().st_uid == 65532
    assert (d / "gpu-device.log").stat().st_uid == 0  # another component's file is left alone


# -- operator scheme --------------------------------------------------------------------------
def test_operator_components_and_gating() -> None:
    """SPEC §12 order through node labels: gpu-label (all) -> container-runtime
    (gpu.installed) -> driver-manager (runtime.ready) -> gpu-device (maca + runtime ready)."""
    rendered = objs(OP, OP_MIN)
    rt = rendered.get("DaemonSet", "container-runtime")
    assert required_node_labels(rt) == {
        P + "gpu.installed": ["true"],
        "kubernetes.io/os": ["linux"],
    }
    dm = rendered.get("DaemonSet", "driver-manager")
    assert required_node_labels(dm) == {
        P + "gpu.installed": ["true"],
        P + "runtime.ready": ["true"],
        "kubernetes.io/os": ["linux"],
    }
    assert dm["spec"]["updateStrategy"]["type"] == "OnDelete"
    driver = container(dm, "driver")
    assert driver["args"][:3] == ["serve", "driver-manager", "--payload=driver"]
    f = flags(driver)
    assert f["deploy-policy"] == "IfNotPresent"
    assert f["driver-version"] == "2.0.0"
    assert f["payload-image"] == "cr.metax-tech.com/cloud/driver-image:2.0.0"
    payload = container(dm, "driver-payload")
    assert payload["image"] == "cr.metax-tech.com/cloud/driver-image:2.0.0"
    assert "/payload/driver.complete" in payload["args"][0]
    assert mounts(dm, "driver")["/payload"]["readOnly"] is True
    maca = container(dm, "maca")
    assert maca["args"][:3] == ["serve", "driver-manager", "--payload=maca"]
    assert mounts(dm, "maca")["/host/opt"].get("readOnly") is not True
    for c in (driver, maca, container(rt)):
        assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    rc = container(rt)
    assert rc["args"][:2] == ["serve", "container-runtime"]
    f = flags(rc)
    assert f["containerd-config"] == "/etc/containerd/config.toml"
    assert f["restart-mode"] == "signal" and f["set-as-default"] == "true"
    assert rt["spec"]["template"]["spec"]["hostPID"] is True
    m = mounts(rt)
    assert m["/host-system"]["readOnly"] is True
    for writable in ("/host-system/etc/cdi", "/host-system/etc/containerd",
                     "/host-system/usr/local/gpuk8s"):
        assert m[writable].get("readOnly") is not True
    runtime_class = rendered.get("RuntimeClass", "metax")
    assert runtime_class["handler"] == "metax"
    oc = rendered.get("Deployment", "operator-controller")
    assert container(oc)["args"][:2] == ["serve", "operator-controller"]
    assert container(oc)["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert oc["spec"]["strategy"]["type"] == "Recreate"
    # the chart does not ship driver-config: the controller creates it (and never resets it)
    assert not rendered.has("ConfigMap", "driver-config")
    # the extensions chart has none of these
    ext = objs(EXT)
    for kind, name in [
        ("DaemonSet", "driver-manager"),
        ("DaemonSet", "container-runtime"),
        ("Deployment", "operator-controller"),
        ("RuntimeClass", "metax"),
        ("Job", "operator-uninstall"),
    ]:
        assert not ext.has(kind, name)


def _template_hash(values: dict[str, Any]) -> str:
    dm = objs(OP, _deep_merge(OP_MIN, values)).get("DaemonSet", "driver-manager")
    return str(dm["spec"]["template"]["metadata"]["annotations"][P + "template-hash"])


def test_driver_manager_template_hash_follows_what_its_pods_run() -> None:
    """Issue 28: driver-manager's DaemonSet is OnDelete; operator-controller replaces a pod
    whose metax-tech.com/template-hash differs from the template's. The hash must change
    with every value its pods use, and only with those (a changed controller-only value
    must not restart the node agents)."""
    base = _template_hash({})
    changes = {
        "SDK images": {"maca": {"payload": {"images": ["maca-c500:2.33.0.4-ubuntu22.04-amd64"]}}},
        "driver log level": {"driver": {"log": {"level": "debug"}}},
        "maca log format": {"maca": {"log": {"format": "text"}}},
        "global log dir": {"log": {"dir": "/var/log/gpu"}},
        "deployPolicy": {"driver": {"deployPolicy": "Always"}},
        "driver version": {"driver": {"payload": {"version": "2.1.0"}}},
        "image tag": {"driver": {"imageTag": "9"}},
        "pull policy": {"pullPolicy": "Always"},
        "extra args": {"driver": {"extraArgs": ["--interval=3"]}},
    }
    hashes = {what: _template_hash(v) for what, v in changes.items()}
    assert base not in hashes.values(), hashes
    assert len(set(hashes.values())) == len(hashes), hashes
    for unrelated in ({"driver": {"upgradePolicy": {"maxParallel": 4}}},
                      {"gpuLabel": {"interval": 30}}, {"operatorController": {"imageTag": "9"}}):
        assert _template_hash(unrelated) == base, unrelated
    # the other node agents are rolled by their DaemonSet controller, one node at a time
    for ds in objs(OP, OP_MIN).of("DaemonSet"):
        if ds["metadata"]["name"] != "driver-manager":
            assert ds["spec"]["updateStrategy"] == {
                "type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}, ds


def test_driver_manager_pods_stop_promptly_but_finish_an_install() -> None:
    """A replaced driver-manager pod: the agents finish their pass (SIGTERM ends the loop,
    not the pass), within terminationGracePeriodSeconds; the payload containers (sh as
    pid 1, which ignores SIGTERM without a trap) exit at once."""
    dm = objs(OP, _deep_merge(OP_MIN, {"maca": {"payload": {"images": ["maca-c500:1.0.0.1"]}}}
                              )).get("DaemonSet", "driver-manager")
    assert dm["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 300
    for name in ("driver-payload", "maca-payload-0"):
        script = container(dm, name)["args"][0]
        assert "trap 'exit 0' TERM" in script and "& wait $!" in script, script


def test_operator_runtime_options() -> None:
    rendered = objs(OP, _deep_merge(OP_MIN, {"runtime": {
        "containerd": {"config": "/var/lib/lab/containerd/config.toml"},
        "restartMode": "systemd", "setAsDefault": False, "handler": "gpu"}}))
    rt = rendered.get("DaemonSet", "container-runtime")
    f = flags(container(rt))
    assert f["containerd-config"] == "/var/lib/lab/containerd/config.toml"
    assert f["set-as-default"] == "false" and f["handler"] == "gpu"
    assert not rt["spec"]["template"]["spec"]["hostPID"]  # systemd mode needs no pid
    assert mounts(rt)["/host-system/var/lib/lab/containerd"]
    assert rendered.get("RuntimeClass", "gpu")["handler"] == "gpu"


def test_operator_payload_registries_and_images() -> None:
    _n, _c, values = next(c for c in COMBOS if c[0] == "op-everything")
    rendered = objs(OP, values)
    dm = rendered.get("DaemonSet", "driver-manager")
    assert flags(container(dm, "driver"))["payload-image"] == "drv.local/x/mx-driver:2.31.0.6"
    assert flags(container(dm, "driver"))["deploy-policy"] == "Always"
    maca_images = [
        a.split("=", 1)[1]
        for a in container(dm, "maca")["args"]
        if a.startswith("--payload-image=")
    ]
    assert maca_images == [
        "registry.local/cloud/maca-c500:2.18.0.3-ubuntu18.04-amd64",
        "registry.local/cloud/maca-c550:2.18.0.3-ubuntu22.04-amd64",
    ]
    # driver-manager image (both containers) follows driver.imageTag
    assert container(dm, "maca")["image"] == "registry.local/cloud/driver-manager:7"
    # maca has its own registry option
    other = objs(OP, _deep_merge(values, {"maca": {"payload": {"registry": "sdk.local/m"}}}))
    args = container(other.get("DaemonSet", "driver-manager"), "maca")["args"]
    assert "--payload-image=sdk.local/m/maca-c500:2.18.0.3-ubuntu18.04-amd64" in args
    # one payload container per SDK image, running that image
    other_dm = other.get("DaemonSet", "driver-manager")
    assert container(other_dm, "maca-payload-0")["image"] == \
        "sdk.local/m/maca-c500:2.18.0.3-ubuntu18.04-amd64"
    assert container(other_dm, "maca-payload-1")["image"].endswith(
        "maca-c550:2.18.0.3-ubuntu22.04-amd64")
    assert container(dm, "driver-payload")["image"] == "drv.local/x/mx-driver:2.31.0.6"


def test_operator_deploy_policy_never_needs_no_version() -> None:
    rendered = objs(OP, {"driver": {"deployPolicy": "Never"}})
    f = flags(container(rendered.get("DaemonSet", "driver-manager"), "driver"))
    assert f["deploy-policy"] == "Never"
    assert "payload-image" not in f
    dm = rendered.get("DaemonSet", "driver-manager")
    assert "driver-payload" not in {c["name"] for c in dm["spec"]["template"]["spec"]["containers"]}


# -- the helm test hook ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "chart,values,ready",
    [
        (EXT, {}, "driver.ready"),
        (EXT, {"deployExtenderGPUAware": True}, "driver.ready"),
        (OP, OP_MIN, "driver.ready,maca.ready,runtime.ready"),
    ],
)
def test_helm_test_pod(chart: Path, values: dict[str, Any], ready: str) -> None:
    rendered = objs(chart, values)
    pods = rendered.of("Pod")
    assert len(pods) == 1
    pod = pods[0]
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert pod["spec"]["restartPolicy"] == "Never"
    # its RBAC are test hooks too, created before the pod and removed once it passed
    for kind, name in [
        ("ServiceAccount", "gpu-test"),
        ("ClusterRole", f"{REL}-gpu-test"),
        ("ClusterRoleBinding", f"{REL}-gpu-test"),
    ]:
        ann = rendered.get(kind, name)["metadata"]["annotations"]
        assert ann["helm.sh/hook"] == "test"
        assert int(ann["helm.sh/hook-weight"]) < int(
            pod["metadata"]["annotations"]["helm.sh/hook-weight"]
        )
        assert "hook-succeeded" in ann["helm.sh/hook-delete-policy"]
    c = pod["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["READY_LABELS"] == ready
    assert env["EXTENDER_URL"] == (
        f"gpu-aware.{NS}.svc:8081" if values.get("deployExtenderGPUAware") else ""
    )
    assert c["command"] == ["python3", "-c"]
    compile(c["args"][0], "gpu-test", "exec")  # the embedded check is valid Python


def test_helm_test_script_logic(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the embedded script against fake API answers: it passes on a good node and
    names what is wrong on a bad one."""
    pytest.importorskip("kubernetes")
    from types import SimpleNamespace

    import kubernetes

    script = objs(OP, OP_MIN).of("Pod")[0]["spec"]["containers"][0]["args"][0]

    def run(nodes: list[Any]) -> tuple[int, str]:
        monkeypatch.setattr(kubernetes.config, "load_incluster_config", lambda: None)
        api = SimpleNamespace(list_node=lambda label_selector: SimpleNamespace(items=nodes))
        monkeypatch.setattr(kubernetes.client, "CoreV1Api", lambda: api)
        monkeypatch.setenv("READY_LABELS", "driver.ready,maca.ready,runtime.ready")
        monkeypatch.setenv("EXTENDER_URL", "")
        import contextlib
        import io

        out = io.StringIO()
        code = 0
        with contextlib.redirect_stdout(out):
            try:
                exec(compile(script, "gpu-test", "exec"), {"__name__": "__main__"})
            except SystemExit as exc:
                code = int(exc.code or 0)
        return code, out.getvalue()

    def node(name: str, labels: dict[str, str], gpus: str) -> Any:
        return SimpleNamespace(
            metadata=SimpleNamespace(name=name, labels={P + k: v for k, v in labels.items()}),
            status=SimpleNamespace(allocatable={P + "gpu": gpus}),
        )

    good = {
        "gpu.installed": "true",
        "driver.ready": "true",
        "maca.ready": "true",
        "runtime.ready": "true",
        "gpu.driver.mode": "cloud",
        "gpu.product": "C500",
        "gpu.vfnum": "0",
    }
    assert run([node("n1", good, "8")]) == (0, mock_ok := run([node("n1", good, "8")])[1])
    assert "allocatable metax-tech.com/gpu=8" in mock_ok
    code, out = run([node("n1", {**good, "runtime.ready": "false"}, "0")])
    assert code == 1 and "n1: not ready: runtime.ready" in out
    code, out = run([node("n1", good, "0")])
    assert code == 1 and "no allocatable" in out
    code, out = run([])
    assert code == 1 and "gpu.installed=true" in out


# -- the two charts share their common components -----------------------------------------
def _strip_chart_specifics(doc: dict[str, Any]) -> dict[str, Any]:
    d = copy.deepcopy(doc)
    for meta in (d["metadata"], d.get("spec", {}).get("template", {}).get("metadata", {})):
        for key in ("app.kubernetes.io/part-of", "helm.sh/chart"):
            meta.get("labels", {}).pop(key, None)
    return d


def test_both_charts_render_the_same_common_components() -> None:
    ext = objs(EXT, {"deployExtenderGPUAware": True})
    op = objs(OP, _deep_merge(OP_MIN, {"deployExtenderGPUAware": True}))
    for kind, name in [
        ("DaemonSet", "gpu-label"),
        ("Deployment", "gpu-aware"),
        ("Service", "gpu-aware"),
        ("ConfigMap", "gpu-aware-plugin"),
        ("ClusterRole", f"{REL}-gpu-device"),
    ]:
        assert _strip_chart_specifics(ext.get(kind, name)) == _strip_chart_specifics(
            op.get(kind, name)
        ), name
    # gpu-device differs only in its gating and the CDI flag
    a = _strip_chart_specifics(ext.get("DaemonSet", "metax-gpu-device"))
    b = _strip_chart_specifics(op.get("DaemonSet", "metax-gpu-device"))
    for d in (a, b):
        d["spec"]["template"]["spec"].pop("affinity")
        d["spec"]["template"]["spec"]["containers"][0]["args"] = [
            x for x in d["spec"]["template"]["spec"]["containers"][0]["args"]
            if not x.startswith("--cdi")
        ]
    assert a == b


def _schema_common(schema: dict[str, Any]) -> dict[str, Any]:
    s = copy.deepcopy(schema)
    for key in ("driver", "maca", "runtime", "operatorController"):
        s["properties"].pop(key, None)
    s["required"] = [r for r in s["required"] if r in s["properties"]]
    s["$defs"].pop("optionalRegistry", None)
    s.pop("title")
    s["properties"]["gpuDevice"].pop("description")
    return s


def test_values_and_schema_of_the_two_charts_agree() -> None:
    ev = yaml.safe_load((EXT / "values.yaml").read_text())
    ov = yaml.safe_load((OP / "values.yaml").read_text())
    # the one deliberate difference: gpu-exporter is opt-in in the extensions scheme
    assert (ev["gpuExporter"].pop("enabled"), ov["gpuExporter"].pop("enabled")) == (False, True)
    assert {k: v for k, v in ov.items() if k in ev} == ev
    assert set(ov) - set(ev) == {"driver", "maca", "runtime", "operatorController"}
    es = json.loads((EXT / "values.schema.json").read_text())
    os_ = json.loads((OP / "values.schema.json").read_text())
    assert _schema_common(es) == _schema_common(os_)


# -- values.yaml, schema and defaults (SPEC §5) -------------------------------------------
SPEC_DEFAULTS = {
    "registry": "cr.metax-tech.com/cloud",
    "pullPolicy": "IfNotPresent",
    "deployExtenderGPUAware": False,
    "log": {
        "dir": "/var/log/metax",
        "level": "info",
        "format": "json",
        "rotationTime": "1w",
        "maxAge": "26w",
    },
    "gpuDevice.healthyInterval": 5,
}


def _get(values: dict[str, Any], dotted: str) -> Any:
    cur: Any = values
    for part in dotted.split("."):
        cur = cur[part]
    return cur


@pytest.mark.parametrize("chart", [EXT, OP], ids=["ext", "op"])
def test_spec_defaults(chart: Path) -> None:
    values = yaml.safe_load((chart / "values.yaml").read_text())
    for key, want in SPEC_DEFAULTS.items():
        assert _get(values, key) == want, key
    for comp in ("gpuDevice", "gpuLabel", "gpuAware"):
        assert "log" in values[comp]
    assert {"scoreWeight", "lossWeight"} <= set(values["gpuAware"])
    if chart == OP:
        assert values["driver"]["deployPolicy"] == "IfNotPresent"
        assert values["driver"]["payload"] == {
            "name": "driver-image",
            "version": "",
            "registry": "",
        }
        assert values["maca"]["payload"] == {"images": [], "registry": ""}
        for comp in ("driver", "maca", "runtime"):
            assert values[comp]["log"] == {}


def _leaf_paths(values: dict[str, Any], prefix: str = "") -> Iterable[str]:
    for key, value in values.items():
        path = f"{prefix}{key}"
        if (isinstance(value, dict) and value and key != "log") or path == "log":
            yield from _leaf_paths(value, path + ".")
        else:
            yield path


def _schema_node(schema: dict[str, Any], path: str) -> dict[str, Any]:
    node = schema
    for part in path.split("."):
        if "properties" not in node and node.get("type") == "object":
            return node  # a free-form object (resources): its keys are Kubernetes'
        node = node["properties"][part]
        while "$ref" in node and "properties" not in node:
            ref = node["$ref"].split("/")[-1]
            node = {**schema["$defs"][ref], **{k: v for k, v in node.items() if k != "$ref"}}
    return node


@pytest.mark.parametrize("chart", [EXT, OP], ids=["ext", "op"])
def test_every_container_requests_resources(chart: Path) -> None:
    values = OP_MIN if chart == OP else {}
    rendered = objs(chart, _deep_merge(values, {"deployExtenderGPUAware": True}))
    for where, spec in rendered.pod_specs():
        if where.startswith("Pod/"):
            continue  # the helm test pod: seconds long
        for c in spec["containers"]:
            requests = c.get("resources", {}).get("requests", {})
            assert {"cpu", "memory"} <= set(requests), f"{where}/{c['name']}"


@pytest.mark.parametrize("chart", [EXT, OP], ids=["ext", "op"])
def test_every_value_is_commented_and_in_the_schema(chart: Path) -> None:
    text = (chart / "values.yaml").read_text().splitlines()
    values = yaml.safe_load("\n".join(text))
    schema = json.loads((chart / "values.schema.json").read_text())
    for path in _leaf_paths(values):
        node = _schema_node(schema, path)
        assert node.get("description"), f"{path}: no description in values.schema.json"
    # every key line in values.yaml is preceded by a comment line (the keys inside a
    # free-form Kubernetes object such as resources are Kubernetes', not ours; the keys of
    # a list's entries are documented in the list's own comment and the schema)
    inside: int | None = None
    for i, line in enumerate(text):
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if inside is not None and stripped and indent > inside:
            continue
        entry = stripped.startswith("- ") and ":" in stripped
        inside = indent if stripped == "resources:" or entry else None
        if not stripped or stripped.startswith(("#", "- ")) or stripped == "---":
            continue
        assert ":" in stripped, line
        prev = text[i - 1].strip() if i else ""
        assert prev.startswith("#"), (
            f"values.yaml line {i + 1} ({stripped!r}) has no comment above it"
        )


# -- bad input: clear errors that name the field ------------------------------------------
BAD_VALUES = [
    (EXT, {"pullPolicy": "Sometimes"}, ["/pullPolicy", "IfNotPresent", "Always", "Never"]),
    (EXT, {"log": {"level": "verbose"}}, ["/log/level", "debug", "fatal"]),
    (EXT, {"log": {"format": "xml"}}, ["/log/format", "json", "text"]),
    (EXT, {"log": {"rotationTime": "3m"}}, ["/log/rotationTime"]),
    (EXT, {"log": {"maxAge": "0w"}}, ["/log/maxAge"]),
    (EXT, {"gpuLabel": {"log": {"maxAge": "26 weeks"}}}, ["/gpuLabel/log/maxAge"]),
    (EXT, {"gpuDevice": {"log": {"level": "loud"}}}, ["/gpuDevice/log/level"]),
    (EXT, {"gpuDevice": {"log": {"colour": "red"}}}, ["/gpuDevice/log", "colour"]),
    (EXT, {"gpuDevice": {"healthyInterval": -1}}, ["/gpuDevice/healthyInterval"]),
    (EXT, {"gpuDevice": {"healthyInterval": "often"}}, ["/gpuDevice/healthyInterval"]),
    (EXT, {"deployExtenderGPUAware": "yes"}, ["/deployExtenderGPUAware"]),
    (EXT, {"gpuAware": {"scoreWeight": -1}}, ["/gpuAware/scoreWeight"]),
    (EXT, {"gpuAware": {"scoreWeight": 1e308}}, ["/gpuAware/scoreWeight"]),  # gpu-aware refuses
    (EXT, {"gpuAware": {"lossWeight": "1001"}}, ["/gpuAware/lossWeight"]),
    (EXT, {"registry": ""}, ["/registry"]),
    (EXT, {"registry": "has space/x"}, ["/registry"]),
    (EXT, {"imageTag": "bad tag"}, ["/imageTag"]),
    (EXT, {"hostPaths": {"root": "relative"}}, ["/hostPaths/root"]),
    (EXT, {"log": {"dir": "var/log"}}, ["/log/dir"]),
    # issue 16: never the host's / (nor a system directory) read-write for log files
    (EXT, {"log": {"dir": "/"}}, ["log.dir", "system directory", "/var/log/metax"]),
    (EXT, {"log": {"dir": "//"}}, ["log.dir", "system directory"]),
    (EXT, {"gpuLabel": {"log": {"dir": "/etc/"}}}, ["gpuLabel.log.dir", "system directory"]),
    (OP, _deep_merge(OP_MIN, {"maca": {"log": {"dir": "/usr"}}}), ["maca.log.dir"]),
    # issue 16: a repository path component cannot end with a separator
    (EXT, {"registry": "my.reg/proj-"}, ["/registry"]),
    (EXT, {"registry": "my.reg/proj./x"}, ["/registry"]),
    (EXT, {"registry": "-reg.local/p"}, ["/registry"]),
    (OP, _deep_merge(OP_MIN, {"driver": {"payload": {"registry": "r.local/p_"}}}),
     ["/driver/payload/registry"]),
    (EXT, {"gpuLabel": {"log": {"dir": "logs"}}}, ["/gpuLabel/log/dir"]),
    (EXT, {"gpuDevice": {"healthyIntervall": 5}}, ["healthyIntervall"]),  # typo
    (EXT, {"gpuMps": {"activeThreadPercentage": 101}}, ["/gpuMps/activeThreadPercentage"]),
    (EXT, {"gpuMps": {"interval": 0}}, ["/gpuMps/interval"]),
    (EXT, {"resourceDescriptors": {"namespace": "Kube_Public"}},
     ["/resourceDescriptors/namespace"]),
    (EXT, {"resourceDescriptors": {"items": [{"customName": "x", "keyName": "y", "key": "a/b",
                                              "dataType": "float", "defaultValue": "1",
                                              "descriptionZh": "z", "descriptionEn": "e",
                                              "limits": "optional", "requests": "disabled"}]}},
     ["/resourceDescriptors/items/0/dataType", "integer", "decimal", "string"]),
    (EXT, {"resourceDescriptors": {"items": [{"customName": "x", "keyName": "y", "key": "a/b",
                                              "dataType": "integer", "defaultValue": "1",
                                              "descriptionZh": "z", "descriptionEn": "e",
                                              "limits": "maybe", "requests": "disabled"}]}},
     ["/resourceDescriptors/items/0/limits", "disabled", "required", "optional"]),
    (EXT, {"driver": {"deployPolicy": "Never"}}, ["driver"]),  # operator-only option
    (
        EXT,
        {"deployExtenderGPUAware": True, "gpuAware": {"scoreWeight": 0, "lossWeight": 0}},
        ["gpuAware.scoreWeight and gpuAware.lossWeight are both 0"],
    ),
    (
        OP,
        {},
        [
            "driver.payload.version is required when driver.deployPolicy is IfNotPresent",
            "driver.deployPolicy=Never",
            "cr.metax-tech.com/cloud/driver-image",
        ],
    ),
    (
        OP,
        {"driver": {"deployPolicy": "Always", "payload": {"registry": "r.local/p"}}},
        [
            "driver.payload.version is required when driver.deployPolicy is Always",
            "r.local/p/driver-image",
        ],
    ),
    (
        OP,
        {"driver": {"deployPolicy": "Sometimes"}},
        ["/driver/deployPolicy", "IfNotPresent", "Never"],
    ),
    (
        OP,
        _deep_merge(OP_MIN, {"maca": {"payload": {"images": ["maca-c500"]}}}),
        ["maca.payload.images[0]", "has no tag"],
    ),
    (
        OP,
        _deep_merge(OP_MIN, {"maca": {"payload": {"images": ["maca-c500:"]}}}),
        ["maca.payload.images[0]", "is not an image reference"],
    ),
    (OP, _deep_merge(OP_MIN, {"runtime": {"log": {"format": "yaml"}}}), ["/runtime/log/format"]),
    (
        OP,
        _deep_merge(OP_MIN, {"driver": {"payload": {"version": "2.0 beta"}}}),
        ["/driver/payload/version"],
    ),
]


@pytest.mark.parametrize(
    "registry", ["my.reg/proj", "my.reg:5000/proj_x/y", "10.0.0.1:5000/a__b/c-d", "reg/p/"]
)
def test_good_registries(registry: str) -> None:
    image = container(objs(EXT, {"registry": registry}).get("DaemonSet", "gpu-label"))["image"]
    assert image.startswith(registry.rstrip("/") + "/gpu-label:")


# -- issue 16: quoting, subcharts, names, probes, hooks, the own-node policy ----------------
def test_values_are_data_never_yaml() -> None:
    """`log.dir='/var/log/a #b'` once became /var/log/a: every value is quoted."""
    odd_dir = "/var/log/a #b: c"
    odd_root = "/srv/sim #1"
    rendered = objs(OP, _deep_merge(OP_MIN, {"log": {"dir": odd_dir},
                                            "hostPaths": {"root": odd_root}}))
    seen = 0
    for _where, spec in rendered.pod_specs():
        for c in spec["containers"]:
            f = flags(c)
            if "log-dir" in f:
                seen += 1
                assert f["log-dir"] == odd_dir
    assert seen >= 6
    ds = rendered.get("DaemonSet", "metax-gpu-device")
    assert mounts(ds, "gpu-device")[odd_dir]["name"].startswith("log")
    assert volumes(ds)["log"]["hostPath"]["path"] == odd_dir
    assert flags(container(ds, "gpu-device"))["device-path-prefix"] == odd_root
    assert volumes(ds)["host-sys"]["hostPath"]["path"] == odd_root + "/sys"


def test_global_values_are_accepted_so_the_charts_can_be_subcharts() -> None:
    for chart, values in ((EXT, {}), (OP, OP_MIN)):
        objs(chart, _deep_merge(values, {"global": {"imageRegistry": "x", "any": {"thing": 1}}}))


def test_names_the_manual_finds() -> None:
    """`kubectl get pods | grep metax-gpu-device`, `kubectl get cm | grep gpu-aware-plugin`."""
    rendered = objs(EXT, {"deployExtenderGPUAware": True})
    ds = rendered.get("DaemonSet", "metax-gpu-device")  # pods metax-gpu-device-xxxxx
    # backward compatible: the labels (node_maintenance selects on them) and the
    # ServiceAccount keep the component name
    assert ds["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] == "gpu-device"
    assert ds["spec"]["template"]["spec"]["serviceAccountName"] == "gpu-device"
    assert rendered.has("ConfigMap", "gpu-aware-plugin")
    assert rendered.has("Service", "gpu-aware")  # SPEC §7: the Service keeps its name


def test_gpu_device_probes_its_health_endpoint(combo: Any) -> None:
    _n, _c, _v, rendered = combo
    c = container(rendered.get("DaemonSet", "metax-gpu-device"), "gpu-device")
    assert flags(c)["health-port"] == "8082"
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"health": 8082}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}


def test_helm_test_leaves_nothing_behind_even_when_it_fails() -> None:
    rendered = objs(EXT)
    hooks = [d for d in rendered.docs
             if d["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"]
    assert {d["kind"] for d in hooks} == {"ServiceAccount", "ClusterRole",
                                          "ClusterRoleBinding", "Pod"}
    for d in hooks:
        policy = d["metadata"]["annotations"]["helm.sh/hook-delete-policy"].split(",")
        assert {"before-hook-creation", "hook-succeeded", "hook-failed"} <= set(policy), d["kind"]
    [pod] = [d for d in hooks if d["kind"] == "Pod"]
    assert "hook-failed" in pod["metadata"]["annotations"]["helm.sh/hook-output-log-policy"]


VAP_API = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"


@pytest.mark.parametrize(("chart", "values", "agents"), [
    (EXT, {}, ["gpu-device", "gpu-label"]),
    # issue 28: driver-manager and container-runtime too (one policy, one template)
    (OP, OP_MIN, ["gpu-device", "gpu-label", "driver-manager", "container-runtime"]),
], ids=["ext", "op"])
def test_node_agents_may_patch_only_their_own_node(chart: Path, values: dict[str, Any],
                                                   agents: list[str]) -> None:
    """Rendered only where the cluster serves ValidatingAdmissionPolicy (>= 1.30); every
    ServiceAccount that may patch Nodes is in it except operator-controller's and the
    extensions chart's uninstall hook's (they clean the release's nodes)."""
    proc = run_helm(["template", REL, str(chart), "-n", NS, "--kube-version", KUBE_VERSION,
                     "--api-versions", VAP_API], values)
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d
            and d["metadata"]["name"] == f"{REL}-own-node"]
    [policy] = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
    [binding] = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert binding["spec"] == {"policyName": policy["metadata"]["name"],
                               "validationActions": ["Deny"]}
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    [rule] = spec["matchConstraints"]["resourceRules"]
    assert set(rule["resources"]) == {"nodes", "nodes/status"}
    assert "UPDATE" in rule["operations"]
    [condition] = spec["matchConditions"]
    users = [f"system:serviceaccount:{NS}:{agent}" for agent in agents]
    assert condition["expression"] == f"request.userInfo.username in {json.dumps(users)}".replace(
        ", ", ","
    )
    checks = spec["validations"]
    assert "authentication.kubernetes.io/node-name" in checks[0]["expression"]
    # and only the keys each agent owns (test_node_agents_own_the_node_keys_they_write)
    assert set(_owned_node_keys(spec)) == set(users)
    patchers = {sa for sa, rules in _rules_by_subject(objs(chart, values)).items()
                if ("", "nodes", "patch", ANY) in _permissions(rules)}
    # the controller and the extensions chart's uninstall hook clean any of the release's nodes
    assert patchers - set(agents) <= {"operator-controller", "gpu-extensions-uninstall"}, patchers
    # without the API (older clusters, plain `helm template`) nothing is rendered
    assert not objs(chart, values).of("ValidatingAdmissionPolicy")


def _owned_node_keys(spec: dict[str, Any]) -> dict[str, dict[str, list[str]]]:
    """The own-node policy's table of the Node keys each ServiceAccount owns (a JSON
    object, which is a CEL map literal, indexed by the request's user)."""
    [owned] = [v["expression"] for v in spec["variables"] if v["name"] == "owned"]
    table, end = json.JSONDecoder().raw_decode(owned)
    assert owned[end:] == "[request.userInfo.username]", owned[end:]
    return dict(table)


def test_node_agents_own_the_node_keys_they_write() -> None:
    """Issue 50: the chart's list of the Node labels and annotations each node agent may
    change (gpuk8s.nodeAgentKeys) is exactly what the agents' code writes -- a key the code
    writes and the list lacks would be refused by the API server and break the agent."""
    from gpuk8s.core import cuda, labels
    from gpuk8s.core.devicelist import DEVICES_ANNOTATION
    from gpuk8s.core.scoring import tables_as_annotations
    from gpuk8s.services.nodeagent import state_annotation

    # the agents that report a state annotation (services/nodeagent.Reporter), per service
    src = REPO / "src" / "gpuk8s" / "services"
    reporters = {sa: sorted(state_annotation(name) for path in (src / pkg).glob("*.py")
                            for name in re.findall(r'Reporter\(\w+, "([^"]+)"', path.read_text()))
                 for sa, pkg in (("driver-manager", "drivermanager"),
                                 ("container-runtime", "runtime"))}
    assert reporters["driver-manager"] and reporters["container-runtime"], reporters
    empty: dict[str, list[str]] = {f: [] for f in (
        "labels", "labelPrefixes", "labelExcept", "annotations", "annotationPrefixes",
        "annotationExcept")}
    expected = {
        "gpu-label": {**empty, "labelPrefixes": [labels.PREFIX],
                      "labelExcept": sorted(labels.FOREIGN_LABELS),
                      "labels": sorted((*cuda.BARE_LABELS, *labels.GFD_LABELS))},
        "gpu-device": {**empty, "annotations": sorted(
            (DEVICES_ANNOTATION, *tables_as_annotations({}, {})))},
        **{sa: {**empty, "annotations": keys} for sa, keys in reporters.items()},
    }
    proc = run_helm(["template", REL, str(OP), "-n", NS, "--kube-version", KUBE_VERSION,
                     "--api-versions", VAP_API], OP_MIN)
    assert proc.returncode == 0, proc.stderr
    [policy] = [d for d in yaml.safe_load_all(proc.stdout) if d
                and d["kind"] == "ValidatingAdmissionPolicy"
                and d["metadata"]["name"] == f"{REL}-own-node"]
    found = {user.rsplit(":", 1)[1]: {f: sorted(keys) for f, keys in table.items()}
             for user, table in _owned_node_keys(policy["spec"]).items()}
    assert found == expected


@pytest.mark.parametrize(("chart", "values", "policies"), [
    (EXT, {}, {"own-node-pods": ["gpu-device"]}),
    (OP, OP_MIN, {"own-node-pods": ["gpu-device"],
                  "own-node-events": ["driver-manager", "container-runtime"]}),
], ids=["ext", "op"])
def test_node_agents_may_change_only_their_own_nodes_pods_and_events(
        chart: Path, values: dict[str, Any], policies: dict[str, list[str]]) -> None:
    """Issue 50: gpu-device's pod patch (GPU sharing) and the node agents' Events are
    held to their own node by policies keyed on the token's node, as the Node policy is;
    their effect is tried on a real API server (tests/integration/test_rbac_matrix_apiserver.py)."""
    proc = run_helm(["template", REL, str(chart), "-n", NS, "--kube-version", KUBE_VERSION,
                     "--api-versions", VAP_API], _deep_merge(values, {"gpuDevice": {
                         "sharing": True}}))
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    for name, agents in policies.items():
        [policy] = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"
                    and d["metadata"]["name"] == f"{REL}-{name}"]
        [binding] = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"
                     and d["metadata"]["name"] == f"{REL}-{name}"]
        assert binding["spec"] == {"policyName": f"{REL}-{name}", "validationActions": ["Deny"]}
        spec = policy["spec"]
        assert spec["failurePolicy"] == "Fail"
        [condition] = spec["matchConditions"]
        for agent in agents:
            assert f"system:serviceaccount:{NS}:{agent}" in condition["expression"]
        checks = " ".join(v["expression"] for v in spec["validations"])
        assert "authentication.kubernetes.io/node-name" in checks + json.dumps(
            spec.get("variables"))
    # every node agent that may write Pods or Events is in a policy
    rendered = objs(chart, _deep_merge(values, {"gpuDevice": {"sharing": True}}))
    agents_of = {d["spec"]["template"]["spec"]["serviceAccountName"]
                 for d in rendered.of("DaemonSet")}
    for resource, name in (("pods", "own-node-pods"), ("events", "own-node-events")):
        writers = {sa for sa, rules in _rules_by_subject(rendered).items()
                   if any(p[1] == resource and p[2] in ("create", "patch", "update")
                          for p in _permissions(rules))}
        assert writers & agents_of <= set(policies.get(name, [])), (resource, writers)


@pytest.mark.parametrize("chart,values,needles", BAD_VALUES)
def test_bad_values_fail_with_a_message_naming_the_field(
    chart: Path, values: dict[str, Any], needles: list[str]
) -> None:
    err = render_error(chart, values)
    for needle in needles:
        assert needle in err, f"{needle!r} not in: {err}"


@pytest.mark.parametrize("value", ["1w", "36h", "1w2d", "10d", "26w"])
def test_good_durations(value: str) -> None:
    render(EXT, {"log": {"rotationTime": value, "maxAge": value}})


def test_kubernetes_version_floor() -> None:
    rc, _o, _e = render_raw(EXT, {}, kube_version="1.23.0")
    assert rc == 0
    rc, _o, err = render_raw(EXT, {}, kube_version="1.22.9")
    assert rc != 0 and "1.23" in err


@pytest.mark.parametrize("chart,values", [(EXT, {"deployExtenderGPUAware": True}), (OP, OP_MIN)])
def test_notes_print_the_verification_commands(chart: Path, values: dict[str, Any]) -> None:
    proc = run_helm(["install", REL, str(chart), "-n", NS, "--dry-run=client"],
                    _deep_merge(CLUSTER, values))
    assert proc.returncode == 0, proc.stderr
    notes = proc.stdout.split("NOTES:", 1)[1]
    assert f"helm test {REL} -n {NS} --logs" in notes
    assert f"kubectl get daemonsets,deployments,pods -n {NS}" in notes
    assert f"helm uninstall {REL} -n {NS} --wait" in notes
    if values.get("deployExtenderGPUAware"):
        assert f"kubectl get service gpu-aware -n {NS}" in notes
    if chart == OP:
        assert "driver-config" in notes and "runtime.ready" in notes


def test_extra_read_paths_are_mounted_read_only_under_host() -> None:
    rendered = objs(EXT, {"hostPaths": {"root": "/srv/sim", "extraReadPaths": ["/var/lib/x"]}})
    for name in ("metax-gpu-device", "gpu-label"):
        ds = rendered.get("DaemonSet", name)
        mount = mounts(ds)["/host/var/lib/x"]
        assert mount["readOnly"] is True
        assert volumes(ds)[mount["name"]]["hostPath"]["path"] == "/srv/sim/var/lib/x"
    assert "/hostPaths/extraReadPaths/0" in render_error(
        EXT, {"hostPaths": {"extraReadPaths": ["relative"]}})


# -- GPU sharing (issue 14): gpu-mps and the cf-crl resource descriptors -------------------
@pytest.mark.parametrize("chart,values", [(EXT, {}), (OP, OP_MIN)], ids=["ext", "op"])
def test_gpu_mps_runs_only_on_nodes_labelled_mps(chart: Path, values: dict[str, Any]) -> None:
    rendered = objs(chart, _deep_merge(values, {"gpuMps": {"activeThreadPercentage": 40}}))
    ds = rendered.get("DaemonSet", "gpu-mps")
    assert required_node_labels(ds)["gpuk8s.io/sharing-mode"] == ["mps"]
    c = container(ds, "gpu-mps")
    assert c["args"][:2] == ["serve", "mps"]
    assert flags(c)["mps-dir"] == "/run/gpuk8s/mps"
    assert flags(c)["active-thread-percentage"] == "40"
    assert flags(c)["host-root"] == "/host"
    assert c["image"].rsplit(":", 1)[0].endswith("/gpu-device")  # the same gpuk8s wheel
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    port = flags(c)["health-port"]
    assert {p["containerPort"] for p in c["ports"]} == {int(port)}
    # the pipe directories: a host directory, read-write, at the same path in the pod
    # (the daemons' CUDA_MPS_PIPE_DIRECTORY is what client containers mount)
    mount = mounts(ds, "gpu-mps")["/run/gpuk8s/mps"]
    assert mount["name"] == "mps-dir" and not mount.get("readOnly")
    assert volumes(ds)["mps-dir"]["hostPath"] == {"path": "/run/gpuk8s/mps",
                                                  "type": "DirectoryOrCreate"}
    assert mounts(ds, "gpu-mps")["/host/usr/bin"]["readOnly"] is True  # the MPS tool
    # without a percentage the flag is left out (MPS's default, 100)
    default = container(objs(chart, values).get("DaemonSet", "gpu-mps"), "gpu-mps")
    assert "active-thread-percentage" not in flags(default)
    off = objs(chart, _deep_merge(values, {"gpuMps": {"enabled": False}}))
    assert not off.has("DaemonSet", "gpu-mps") and not off.has("ServiceAccount", "gpu-mps")


# SPEC §13's example, key for key
SPEC_VCUDA_CORE = {
    "key": "tencent.com/vcuda-core", "dataType": "integer", "defaultValue": "20",
    "descriptionEn": "GPU vcore count, 100 virtual cores equal 1 physical GPU core",
    "group": "gpu-manager", "limits": "optional", "requests": "disabled",
}
DESCRIPTOR_KEYS = {"key", "dataType", "defaultValue", "descriptionZh", "descriptionEn", "group",
                   "limits", "requests"}


@pytest.mark.parametrize("chart,values", [(EXT, {}), (OP, OP_MIN)], ids=["ext", "op"])
def test_resource_descriptor_configmaps(chart: Path, values: dict[str, Any]) -> None:
    assert not [d for d in objs(chart, values).of("ConfigMap")
                if d["metadata"]["name"].startswith("cf-crl-")]  # off by default
    rendered = objs(chart, _deep_merge(values, {"resourceDescriptors": {"enabled": True}}))
    maps = {d["metadata"]["name"]: d for d in rendered.of("ConfigMap")
            if d["metadata"]["name"].startswith("cf-crl-")}
    keys = {name: d["data"]["key"] for name, d in maps.items()}
    assert keys == {
        "cf-crl-metax-sgpu": "metax-tech.com/sgpu",
        "cf-crl-metax-vcore": "metax-tech.com/vcore",
        "cf-crl-metax-vmemory": "metax-tech.com/vmemory",
        "cf-crl-gpu-manager-vcuda-core": "tencent.com/vcuda-core",
        "cf-crl-gpu-manager-vcuda-memory": "tencent.com/vcuda-memory",
        "cf-crl-mps-core": "nvidia.com/mps-core",
        "cf-crl-mps-memory": "nvidia.com/mps-memory",
    }
    for name, cm in maps.items():
        meta = cm["metadata"]
        assert meta["namespace"] == "kube-public"
        labels = meta["labels"]
        assert labels["features.alauda.io/type"] == "CustomResourceLimitation"
        assert labels["features.alauda.io/enabled"] == "true"
        assert labels["features.alauda.io/group"] == cm["data"]["group"]
        assert name.startswith(f"cf-crl-{cm['data']['group']}-")
        assert set(cm["data"]) == DESCRIPTOR_KEYS
        assert all(isinstance(v, str) and v for v in cm["data"].values()), name
    core = maps["cf-crl-gpu-manager-vcuda-core"]["data"]
    assert {k: core[k] for k in SPEC_VCUDA_CORE} == SPEC_VCUDA_CORE
    assert core["descriptionZh"]


@pytest.mark.parametrize(("chart", "base"), [(EXT, {}), (OP, OP_MIN)])
def test_gpu_device_sharing_option(chart: Path, base: dict[str, Any]) -> None:
    """GPU sharing (issue 14): off by default (no pod access); on, gpu-device reads its
    node's sharing-mode label and may list and patch pods, nothing more."""
    off = objs(chart, base)
    c = container(off.get("DaemonSet", "metax-gpu-device"), "gpu-device")
    assert "sharing-mode" not in flags(c)
    assert ("", "pods", "list", ANY) not in _permissions(_rules_by_subject(off)["gpu-device"])
    on = objs(chart, {**base, "gpuDevice": {"sharing": True}})
    c = container(on.get("DaemonSet", "metax-gpu-device"), "gpu-device")
    assert flags(c)["sharing-mode"] == "auto"
    assert _permissions(_rules_by_subject(on)["gpu-device"]) == EXPECTED_PERMISSIONS[
        "gpu-device"
    ] | {("", "pods", "list", ANY), ("", "pods", "patch", ANY)}


# -- gpu-dra ---------------------------------------------------------------------------------
DRA_MODE = "gpuk8s.io/allocation-mode"
DRA_CLASSES = ["gpu.metax-tech.com", "vf.gpu.metax-tech.com", "sgpu.gpu.metax-tech.com"]
DRA_GROUP_CLASSES = ["group-2.gpu.metax-tech.com", "group-4.gpu.metax-tech.com",
                     "group-8.gpu.metax-tech.com"]


@pytest.mark.parametrize("chart", [EXT, OP], ids=["ext", "op"])
def test_gpu_device_stays_off_dra_nodes(chart: Path) -> None:
    values = {} if chart == EXT else OP_MIN
    device = objs(chart, values).get("DaemonSet", "metax-gpu-device")
    assert required_node_labels(device, "NotIn") == {DRA_MODE: ["dra"]}
    assert DRA_MODE not in required_node_labels(device)


def test_gpu_dra_is_off_by_default() -> None:
    o = objs(EXT)
    assert not o.has("DaemonSet", "metax-gpu-dra") and not o.of("DeviceClass")
    assert not o.has("ServiceAccount", "gpu-dra")


def test_gpu_dra_daemonset_runs_only_on_dra_nodes_with_its_paths() -> None:
    o = objs(EXT, {"gpuDra": {"enabled": True, "healthyInterval": 3},
                   "hostPaths": {"root": "/srv/sim", "kubeletPlugins": "/data/kubelet/plugins/"}})
    ds = o.get("DaemonSet", "metax-gpu-dra")
    assert required_node_labels(ds) == {
        "kubernetes.io/os": ["linux"], DRA_MODE: ["dra"],
        P + "gpu.installed": ["true"], P + "driver.ready": ["true"]}
    c = container(ds)
    assert c["image"].endswith("/gpu-dra:0.1.0")
    assert c["args"][:2] == ["serve", "dra-plugin"]
    f = flags(c)
    assert f["plugin-dir"] == "/data/kubelet/plugins/gpu.metax-tech.com"
    assert f["registry-dir"] == "/var/lib/kubelet/plugins_registry"
    assert f["cdi-dir"] == "/var/run/cdi"
    assert f["healthy-interval"] == "3" and f["device-path-prefix"] == "/srv/sim"
    assert (f["group-devices"], f["unhealthy-devices"], f["sharing-mode"]) == (
        "auto", "taint", "auto")
    m = mounts(ds)
    # the kubelet dials the socket path gpu-dra registers: the same inside and outside
    assert volumes(ds)[m["/data/kubelet/plugins/gpu.metax-tech.com"]["name"]]["hostPath"][
        "path"] == "/data/kubelet/plugins/gpu.metax-tech.com"
    assert "/var/lib/kubelet/plugins_registry" in m and "/var/run/cdi" in m
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    rules = o.get("ClusterRole", f"{REL}-gpu-dra")["rules"]
    assert rules == [
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"],
         "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]


def test_gpu_dra_device_classes() -> None:
    """GPUs are GPUs (issue 51): the GPU class, and so metax-tech.com/gpu, selects no VF;
    the group classes ship only with group devices on (auto publishes none)."""
    o = objs(EXT, {"gpuDra": {"enabled": True}})
    classes = {d["metadata"]["name"]: d["spec"] for d in o.of("DeviceClass")}
    assert sorted(classes) == sorted(DRA_CLASSES)
    assert classes["gpu.metax-tech.com"]["extendedResourceName"] == "metax-tech.com/gpu"
    assert classes["gpu.metax-tech.com"]["selectors"][0]["cel"]["expression"].endswith(
        ".type == 'gpu'")
    assert [n for n, spec in classes.items() if "extendedResourceName" in spec] == [
        "gpu.metax-tech.com"]
    grouped = objs(EXT, {"gpuDra": {"enabled": True, "groupDevices": True}})
    classes = {d["metadata"]["name"]: d["spec"] for d in grouped.of("DeviceClass")}
    assert sorted(classes) == sorted(DRA_CLASSES + DRA_GROUP_CLASSES)
    assert "groupSize == 4" in classes["group-4.gpu.metax-tech.com"]["selectors"][0]["cel"][
        "expression"]
    plain = objs(EXT, {"gpuDra": {"enabled": True, "extendedResource": False}})
    assert all("extendedResourceName" not in d["spec"] for d in plain.of("DeviceClass"))
    assert not objs(EXT, {"gpuDra": {"enabled": True, "deviceClasses": False}}).of(
        "DeviceClass")


def test_gpu_dra_claims_policy_rules() -> None:
    """The claims policy (its rules are judged by the real API server in
    tests/integration/test_dra_apiserver.py): one per resource, rendered where the cluster
    serves ValidatingAdmissionPolicy, and the group rule only while group devices are off."""
    def policies(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
        proc = run_helm(["template", REL, str(EXT), "-n", NS, "--kube-version", KUBE_VERSION,
                         "--api-versions", VAP_API], values)
        assert proc.returncode == 0, proc.stderr
        return {d["spec"]["matchConstraints"]["resourceRules"][0]["resources"][0]: d["spec"]
                for d in yaml.safe_load_all(proc.stdout)
                if d and d["kind"] == "ValidatingAdmissionPolicy"
                and d["metadata"]["name"].startswith(f"{REL}-dra-claim")}

    auto = policies({"gpuDra": {"enabled": True}})
    assert sorted(auto) == ["resourceclaims", "resourceclaimtemplates"]
    messages = [v["message"] for v in auto["resourceclaims"]["validations"]]
    assert len(messages) == 5 and "group devices are off" in messages[-1]
    assert "object.spec.spec.devices" in auto["resourceclaimtemplates"]["variables"][0][
        "expression"]
    grouped = policies({"gpuDra": {"enabled": True, "groupDevices": True}})
    assert len(grouped["resourceclaims"]["validations"]) == 4
    assert not policies({"gpuDra": {"enabled": True, "deviceClasses": False}})


def test_gpu_dra_values_are_checked() -> None:
    err = render_error(EXT, {"gpuDra": {"enabled": True, "unhealthyDevices": "hide"}})
    assert "unhealthyDevices" in err
    err = render_error(EXT, {"gpuDra": {"enabled": True, "log": {"dir": "var/log"}}})
    assert "/gpuDra/log/dir" in err

