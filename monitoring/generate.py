#!/usr/bin/env python3
"""Generate gpu-exporter's monitoring artifacts from one definition.

    python monitoring/generate.py            # write them
    python monitoring/generate.py --check    # exit 1 when a committed file is stale

Writes
  monitoring/prometheus/gpuk8s-rules.yml            recording and alerting rules
                                                    (admin-run Prometheus)
  charts/gpuk8s-common/templates/_gpu-exporter-rules.tpl   the same rules for the charts'
                                                    PrometheusRule (helm cannot read files
                                                    outside a chart, so they are rendered in)
  monitoring/grafana/gpuk8s-gpus.json                 Grafana dashboard, built with
                                                    grafana-foundation-sdk (dev extra)

The manual's monitoring views: node level (GPU utilisation %, memory used vs total in
GiB) and pod level (utilisation, memory), filterable by GPU kind (pGPU / vGPU / MPS),
namespace and pod, over ranges from 30 minutes to 7 days.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
RULES_FILE = REPO / "monitoring" / "prometheus" / "gpuk8s-rules.yml"
RULES_TPL = REPO / "charts" / "gpuk8s-common" / "templates" / "_gpu-exporter-rules.tpl"
DASHBOARD_FILE = REPO / "monitoring" / "grafana" / "gpuk8s-gpus.json"

NODE = "node, kind"
POD = "node, namespace, pod, kind"

# record name -> PromQL. Node level per (node, kind); pod level per (node, namespace,
# pod, kind). A pod's utilisation is the mean over the GPUs it uses of its containers'
# summed share of each GPU (one GPU at 40 % -> 0.4; two GPUs at 40 % and 60 % -> 0.5).
# A node's GPUs are counted from gpuk8s_gpu_healthy, which every GPU the exporter knows
# has: unbound GPUs (no load, no memory figures) and lost ones included. Utilisation is
# recorded as a sum and a count per kind too, so that a mean over several kinds (the
# dashboard's per-node panel) is the mean over GPUs, not the mean of the kinds' means.
RECORDING_RULES: list[tuple[str, str]] = [
    ("node_kind:gpuk8s_gpu_utilization_ratio:avg",
     f"avg by ({NODE}) (gpuk8s_gpu_utilization_ratio)"),
    ("node_kind:gpuk8s_gpu_utilization_ratio:sum",
     f"sum by ({NODE}) (gpuk8s_gpu_utilization_ratio)"),
    ("node_kind:gpuk8s_gpu_utilization_ratio:count",
     f"count by ({NODE}) (gpuk8s_gpu_utilization_ratio)"),
    ("node_kind:gpuk8s_gpu_memory_used_bytes:sum",
     f"sum by ({NODE}) (gpuk8s_gpu_memory_used_bytes)"),
    ("node_kind:gpuk8s_gpu_memory_total_bytes:sum",
     f"sum by ({NODE}) (gpuk8s_gpu_memory_total_bytes)"),
    ("node_kind:gpuk8s_gpus:count", f"count by ({NODE}) (gpuk8s_gpu_healthy)"),
    ("node_kind:gpuk8s_gpus_unhealthy:sum", f"sum by ({NODE}) (1 - gpuk8s_gpu_healthy)"),
    ("node_kind:gpuk8s_gpus_lost:sum", f"sum by ({NODE}) (gpuk8s_gpu_lost)"),
    ("node_namespace_pod_kind:gpuk8s_container_gpu_utilization_ratio:avg",
     f"avg by ({POD}) (sum by ({POD}, gpu) (gpuk8s_container_gpu_utilization_ratio))"),
    ("node_namespace_pod_kind:gpuk8s_container_gpu_memory_used_bytes:sum",
     f"sum by ({POD}) (gpuk8s_container_gpu_memory_used_bytes)"),
    ("node_namespace_pod_kind:gpuk8s_container_gpu_devices:sum",
     f"sum by ({POD}) (gpuk8s_container_gpu_devices)"),
]
RULE_GROUP = "gpuk8s-gpu.rules"

# Alerts per GPU, by (node, gpu, uuid): the exporter keeps those labels for the GPU's
# life, `kind` may change as pods come and go. A GPU that left the bus stays in the
# exporter's book (gpuk8s_gpu_lost 1) until it returns or an administrator forgets it,
# so GpuLost does not clear by itself.
GPU_KEY = "node, gpu, uuid"
ALERT_GROUP = "gpuk8s-gpu.alerts"
FORGET = ("kubectl -n <namespace> exec <the node's gpu-exporter pod> -- "
          "gpuk8s exporter forget {{ $labels.gpu }}")
ALERT_RULES: list[dict[str, Any]] = [
    {"alert": "GpuLost",
     "expr": f"max by ({GPU_KEY}) (gpuk8s_gpu_lost) == 1",
     "for": "1m",
     "labels": {"severity": "critical"},
     "annotations": {
         "summary": "GPU {{ $labels.gpu }} ({{ $labels.uuid }}) of {{ $labels.node }} "
                    "left the PCI bus",
         "description": "Lost until it is back on the bus, or an administrator removes "
                        f"it: `{FORGET}` (docs/exporter.md)."}},
    {"alert": "GpuUnhealthy",
     "expr": f"min by ({GPU_KEY}) (gpuk8s_gpu_healthy) == 0 "
             f"unless on ({GPU_KEY}) gpuk8s_gpu_lost == 1",
     "for": "5m",
     "labels": {"severity": "warning"},
     "annotations": {
         "summary": "GPU {{ $labels.gpu }} ({{ $labels.uuid }}) of {{ $labels.node }} "
                    "is unhealthy",
         "description": "On the bus but unhealthy for 5 minutes: no driver bound, or the "
                        "vendor tool reports it unavailable; gpu-device no longer offers it."}},
]

# The accelerator manual's alert (002-32, docs/troubleshooting.md), as printed: Paddle's GPU
# allocator failing on a shared GPU. Its metric is the application's, not gpu-exporter's.
APPLICATION_GROUP = "gpuk8s-applications.alerts"
APPLICATION_ALERTS: list[dict[str, Any]] = [
    {"alert": "GPUAllocConflict",
     "expr": "rate(paddle_gpu_malloc_failed_total[5m]) > 0",
     "labels": {"severity": "critical"},
     "annotations": {"summary": "GPU Memory Allocation Conflict Alert"}},
]


def rules() -> dict[str, Any]:
    return {"groups": [
        {"name": RULE_GROUP,
         "rules": [{"record": name, "expr": expr} for name, expr in RECORDING_RULES]},
        {"name": ALERT_GROUP, "rules": ALERT_RULES},
        {"name": APPLICATION_GROUP, "rules": APPLICATION_ALERTS},
    ]}


class _IndentedDumper(yaml.SafeDumper):
    """Sequences indented under their key (the repository's yamllint style)."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


def _dump(data: Any) -> str:
    return str(yaml.dump(data, Dumper=_IndentedDumper, sort_keys=False, width=120))


def rules_yaml() -> str:
    head = ("---\n# Generated by monitoring/generate.py; do not edit. Recording and alerting\n"
            "# rules for the gpu-exporter metrics (docs/exporter.md). Load with rule_files:\n"
            "# in prometheus.yml; the charts ship the same rules as a PrometheusRule.\n")
    return head + _dump(rules())


def rules_template() -> str:
    # the alerts' {{ $labels.x }} are Prometheus templates: helm must print them as text
    body = (_dump(rules()).replace("{{", "\0open").replace("}}", "\0close")
            .replace("\0open", "{{`{{`}}").replace("\0close", "{{`}}`}}"))
    return ("{{/* Generated by monitoring/generate.py from RECORDING_RULES and ALERT_RULES; do "
            "not edit. */}}\n"
            '{{- define "gpuk8s.gpuExporterRules" -}}\n' + body.rstrip("\n") + "\n{{- end -}}\n")


# ------------------------------------------------------------------ Grafana dashboard
KIND_FILTER = 'kind=~"$kind"'
POD_FILTER = 'kind=~"$kind", node=~"$node", namespace=~"$namespace", pod=~"$pod"'
NODE_FILTER = 'kind=~"$kind", node=~"$node"'
TIME_OPTIONS = ["30m", "1h", "3h", "6h", "12h", "24h", "2d", "7d"]
# the mean over the node's GPUs of the selected kinds (sum / count, never avg of avgs)
NODE_UTILISATION = (
    f"sum by (node) (node_kind:gpuk8s_gpu_utilization_ratio:sum{{{NODE_FILTER}}})"
    f" / sum by (node) (node_kind:gpuk8s_gpu_utilization_ratio:count{{{NODE_FILTER}}})")


def dashboard() -> dict[str, Any]:
    from grafana_foundation_sdk.builders import prometheus, table, timeseries
    from grafana_foundation_sdk.builders.dashboard import (
        Dashboard,
        DatasourceVariable,
        QueryVariable,
        Row,
        TimePicker,
    )
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import (
        DataSourceRef,
        VariableRefresh,
        VariableSort,
    )
    from grafana_foundation_sdk.models.prometheus import PromQueryFormat

    ds = DataSourceRef(type_val="prometheus", uid="${datasource}")

    def variable(name: str, label: str, query: str) -> QueryVariable:
        return (QueryVariable(name).label(label).datasource(ds).query(query)
                .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).sort(VariableSort.ALPHABETICAL_ASC)
                .multi(True).include_all(True).all_value(".*"))

    def query(expr: str, legend: str) -> prometheus.Dataquery:
        return prometheus.Dataquery().expr(expr).legend_format(legend).datasource(ds)

    def series(title: str, unit: str, description: str, *targets: prometheus.Dataquery,
               max_value: float | None = None) -> timeseries.Panel:
        panel = (timeseries.Panel().title(title).description(description).unit(unit)
                 .datasource(ds).min(0).height(8).span(12).fill_opacity(10))
        if max_value is not None:
            panel = panel.max(max_value)
        for target in targets:
            panel = panel.with_target(target)
        return panel

    builder = (
        Dashboard("GPU usage: nodes and pods (gpuk8s)")
        .uid("gpuk8s-gpus")
        .tags(["gpu", "gpuk8s", "metax"])
        .description("Node- and pod-level GPU utilisation and memory from gpu-exporter, "
                     "filterable by GPU kind (pGPU / vGPU / MPS), node, namespace and pod.")
        .time("now-6h", "now")
        .refresh("1m")
        .timepicker(TimePicker().time_options(TIME_OPTIONS)
                    .refresh_intervals(["30s", "1m", "5m", "15m"]))
        .with_variable(DatasourceVariable("datasource").label("Data source").type("prometheus"))
        .with_variable(variable("kind", "GPU kind", "label_values(gpuk8s_gpu_healthy, kind)"))
        .with_variable(variable("node", "Node", "label_values(gpuk8s_gpu_healthy{" + KIND_FILTER
                                + "}, node)"))
        .with_variable(variable("namespace", "Namespace",
                                "label_values(gpuk8s_container_gpu_devices{" + NODE_FILTER
                                + "}, namespace)"))
        .with_variable(variable("pod", "Pod", "label_values(gpuk8s_container_gpu_devices{"
                                + NODE_FILTER + ', namespace=~"$namespace"}, pod)'))
        .with_row(Row("Nodes"))
        .with_panel(series(
            "GPU utilisation per node", "percentunit",
            "Mean utilisation of the node's GPUs of the selected kinds: the sum over its "
            "GPUs divided by their number (GPUs reporting a utilisation; not the mean of "
            "the kinds' means).",
            query(NODE_UTILISATION, "{{node}}"), max_value=1))
        .with_panel(series(
            "GPUs per node: known, unhealthy, lost", "none",
            "Every GPU the node's exporter knows (unbound and lost ones included), those "
            "unhealthy (lost included), and those that left the bus (kept until they "
            "return or are forgotten: docs/exporter.md).",
            query(f"sum by (node) (node_kind:gpuk8s_gpus:count{{{NODE_FILTER}}})",
                  "{{node}} GPUs"),
            query(f"sum by (node) (node_kind:gpuk8s_gpus_unhealthy:sum{{{NODE_FILTER}}})",
                  "{{node}} unhealthy"),
            query(f"sum by (node) (node_kind:gpuk8s_gpus_lost:sum{{{NODE_FILTER}}})",
                  "{{node}} lost")))
        .with_panel(series(
            "GPU memory used vs total per node (GiB)", "bytes",
            "Memory in use on the node's GPUs of the selected kinds, and their total "
            "(binary units: GiB).",
            query(f"sum by (node) (node_kind:gpuk8s_gpu_memory_used_bytes:sum{{{NODE_FILTER}}})",
                  "{{node}} used"),
            query(f"sum by (node) (node_kind:gpuk8s_gpu_memory_total_bytes:sum{{{NODE_FILTER}}})",
                  "{{node}} total")))
        .with_panel(series(
            "GPU utilisation per GPU", "percentunit", "Every GPU of the selected nodes.",
            query(f"gpuk8s_gpu_utilization_ratio{{{NODE_FILTER}}}", "{{node}} GPU{{gpu}}"),
            max_value=1))
        .with_panel(series(
            "GPU memory used per GPU (GiB)", "bytes", "Every GPU of the selected nodes.",
            query(f"gpuk8s_gpu_memory_used_bytes{{{NODE_FILTER}}}",
                  "{{node}} GPU{{gpu}}")))
        .with_row(Row("Pods"))
        .with_panel(series(
            "GPU utilisation per pod", "percentunit",
            "Mean over the pod's GPUs of its share of each GPU's time. On a GPU shared "
            "without per-process utilisation the share is estimated "
            "(gpuk8s_container_gpu_utilization_exact = 0).",
            query("node_namespace_pod_kind:gpuk8s_container_gpu_utilization_ratio:avg"
                  f"{{{POD_FILTER}}}", "{{namespace}}/{{pod}}"), max_value=1))
        .with_panel(series(
            "GPU memory used per pod (GiB)", "bytes",
            "GPU memory held by the pod's processes.",
            query("node_namespace_pod_kind:gpuk8s_container_gpu_memory_used_bytes:sum"
                  f"{{{POD_FILTER}}}", "{{namespace}}/{{pod}}")))
        .with_panel(
            table.Panel().title("GPU pods now").datasource(ds).height(8).span(24)
            .description("Pods holding GPUs, their kind, GPUs, utilisation and memory.")
            .with_target(query("node_namespace_pod_kind:gpuk8s_container_gpu_devices:sum"
                               f"{{{POD_FILTER}}}", "").format(PromQueryFormat.TABLE)
                         .instant())
        )
    )
    encoded = json.dumps(builder.build(), cls=JSONEncoder, sort_keys=True)
    data: dict[str, Any] = json.loads(encoded)
    return data


def dashboard_json() -> str:
    return json.dumps(dashboard(), indent=2, sort_keys=True) + "\n"


def outputs() -> dict[Path, str]:
    return {RULES_FILE: rules_yaml(), RULES_TPL: rules_template(), DASHBOARD_FILE: dashboard_json()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when a file is stale")
    args = parser.parse_args(argv)
    stale = []
    for path, text in outputs().items():
        current = path.read_text() if path.exists() else None
        if current == text:
            continue
        if args.check:
            stale.append(str(path))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print("out of date: " + ", ".join(stale) + " (run python monitoring/generate.py)",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
