"""gpu-exporter in both charts: the DaemonSet, its Service, RBAC, and the Prometheus
Operator objects that appear only when the cluster serves their CRDs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.test_charts import (
    EXT,
    KUBE_VERSION,
    NS,
    OP,
    OP_MIN,
    REL,
    Objects,
    _deep_merge,
    container,
    flags,
    mounts,
    objs,
    render_error,
    required_node_labels,
    run_helm,
    volumes,
)

REPO = Path(__file__).resolve().parents[2]
MONITORING_CRDS = ["monitoring.coreos.com/v1/ServiceMonitor",
                   "monitoring.coreos.com/v1/PrometheusRule"]
ON = {"gpuExporter": {"enabled": True}}


def render_with_crds(chart: Path, values: dict[str, Any], apis: list[str]) -> Objects:
    args = ["template", REL, str(chart), "-n", NS, "--kube-version", KUBE_VERSION]
    for api in apis:
        args += ["--api-versions", api]
    proc = run_helm(args, values)
    assert proc.returncode == 0, proc.stderr
    return Objects([d for d in yaml.safe_load_all(proc.stdout) if d])


def test_off_by_default_in_extensions_on_in_operator() -> None:
    assert not objs(EXT).has("DaemonSet", "gpu-exporter")
    assert objs(EXT, ON).has("DaemonSet", "gpu-exporter")
    assert objs(OP, OP_MIN).has("DaemonSet", "gpu-exporter")
    off = _deep_merge(OP_MIN, {"gpuExporter": {"enabled": False}})
    assert not [d for d in objs(OP, off).docs if "gpu-exporter" in d["metadata"]["name"]]


@pytest.mark.parametrize("chart,values", [(EXT, ON), (OP, OP_MIN)], ids=["ext", "op"])
def test_daemonset_flags_mounts_probes_and_gating(chart: Path, values: dict[str, Any]) -> None:
    values = _deep_merge(values, {
        "hostPaths": {"root": "/srv/sim", "proc": "/host/proc",
                      "podResources": "/data/kubelet/pod-resources"},
        "gpuExporter": {"port": 9500, "interval": 15,
                        "resourceKinds": {"example.com/shared-gpu": "MPS"}},
    })
    rendered = objs(chart, values)
    ds = rendered.get("DaemonSet", "gpu-exporter")
    c = container(ds)
    assert c["args"][:2] == ["serve", "exporter"]
    f = flags(c)
    assert f["host-root"] == "/host" and f["proc-dir"] == "/host-proc"
    assert (f["port"], f["interval"]) == ("9500", "15")
    assert f["resource-kind"] == "example.com/shared-gpu=MPS"
    m = mounts(ds)
    assert m["/host"]["readOnly"] and m["/host-proc"]["readOnly"]
    assert m["/var/lib/kubelet/pod-resources"]["readOnly"]
    # the book of known GPUs: writable, on the node (under hostPaths.root), where a
    # restarted exporter finds it
    assert f["state-file"] == "/var/lib/gpuk8s/exporter/gpus.json"
    assert not m["/var/lib/gpuk8s/exporter"].get("readOnly")
    v = volumes(ds)
    assert v["state"]["hostPath"] == {"path": "/srv/sim/var/lib/gpuk8s/exporter",
                                      "type": "DirectoryOrCreate"}
    assert v["host-root"]["hostPath"]["path"] == "/srv/sim"
    assert v["host-proc"]["hostPath"]["path"] == "/host/proc"
    assert v["pod-resources"]["hostPath"]["path"] == "/data/kubelet/pod-resources"
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["ports"] == [{"name": "metrics", "containerPort": 9500, "protocol": "TCP"}]
    assert required_node_labels(ds) == {
        "kubernetes.io/os": ["linux"],
        "metax-tech.com/gpu.installed": ["true"],
        "metax-tech.com/driver.ready": ["true"],
    }
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    svc = rendered.get("Service", "gpu-exporter")
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["ports"][0]["port"] == 9500
    assert svc["spec"]["selector"] == ds["spec"]["selector"]["matchLabels"]


def test_scrape_annotations_without_the_prometheus_operator() -> None:
    rendered = objs(EXT, ON)
    for obj in (rendered.get("Service", "gpu-exporter"),
                rendered.get("DaemonSet", "gpu-exporter")["spec"]["template"]):
        assert obj["metadata"]["annotations"] == {
            "prometheus.io/scrape": "true", "prometheus.io/port": "9400",
            "prometheus.io/path": "/metrics"}
    assert not rendered.of("ServiceMonitor") and not rendered.of("PrometheusRule")


def test_service_monitor_and_rules_with_the_prometheus_operator() -> None:
    rendered = render_with_crds(EXT, ON, MONITORING_CRDS)
    sm = rendered.get("ServiceMonitor", "gpu-exporter")
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint == {"port": "metrics", "path": "/metrics", "interval": "30s",
                        "honorLabels": True}
    ds = rendered.get("DaemonSet", "gpu-exporter")
    assert sm["spec"]["selector"]["matchLabels"] == ds["spec"]["selector"]["matchLabels"]
    assert "annotations" not in rendered.get("Service", "gpu-exporter")["metadata"]
    rule = rendered.get("PrometheusRule", "gpu-exporter")
    shipped = yaml.safe_load((REPO / "monitoring/prometheus/gpuk8s-rules.yml").read_text())
    assert rule["spec"] == shipped  # the same recording rules as for an admin's Prometheus
    # only the ServiceMonitor CRD: no PrometheusRule; prometheusRule=false: none either
    only_sm = render_with_crds(EXT, ON, MONITORING_CRDS[:1])
    assert only_sm.of("ServiceMonitor") and not only_sm.of("PrometheusRule")
    no_rules = render_with_crds(EXT, _deep_merge(ON, {"gpuExporter": {"prometheusRule": False}}),
                                MONITORING_CRDS)
    assert not no_rules.of("PrometheusRule")


def test_both_charts_render_the_same_exporter() -> None:
    ext = objs(EXT, ON)
    op = objs(OP, OP_MIN)
    for kind, name in [("DaemonSet", "gpu-exporter"), ("Service", "gpu-exporter"),
                       ("ClusterRole", f"{REL}-gpu-exporter")]:
        a, b = ext.get(kind, name), op.get(kind, name)
        for d in (a, b):
            for meta in (d["metadata"], d.get("spec", {}).get("template", {}).get("metadata", {})):
                labels = meta.get("labels", {})
                labels.pop("helm.sh/chart", None)
                labels.pop("app.kubernetes.io/part-of", None)
        assert a == b, name


@pytest.mark.parametrize("values,needles", [
    ({"gpuExporter": {"resourceKinds": {"example.com/x": "GPU"}}},
     ["/gpuExporter/resourceKinds/example.com~1x", "pGPU"]),
    # (helm's validator names the wrong path for propertyNames, but the bad name itself)
    ({"gpuExporter": {"resourceKinds": {"no-slash": "MPS"}}}, ["invalid propertyName 'no-slash'"]),
    ({"gpuExporter": {"port": 0}}, ["/gpuExporter/port"]),
    ({"gpuExporter": {"interval": "often"}}, ["/gpuExporter/interval"]),
    ({"gpuExporter": {"enabled": True, "log": {"dir": "logs"}}}, ["/gpuExporter/log/dir"]),
    ({"hostPaths": {"proc": "proc"}}, ["/hostPaths/proc"]),
])
def test_bad_exporter_values_name_the_field(values: dict[str, Any], needles: list[str]) -> None:
    err = render_error(EXT, values)
    for needle in needles:
        assert needle in err, err
