"""`gpuk8s top`: node and pod GPU usage in the terminal, from gpu-exporter's metrics.

Sources (first that applies):

* ``--url URL`` (repeatable): scrape exporters directly (``http://node:9400/metrics``);
* ``--prometheus URL``: instant queries of the same metrics on a Prometheus;
* otherwise the API server: every pod labelled ``app.kubernetes.io/name=gpu-exporter``
  is scraped through the pod proxy (``kubectl``'s credentials; no network path to the
  nodes needed).

The aggregation is the recording rules' (monitoring/generate.py): a node's utilisation is
the mean over its GPUs, its memory the sum; a pod's utilisation is the mean over the GPUs
it uses of its containers' summed share, its memory the sum over its containers. A
node's GPUs are every GPU its exporter knows (``gpuk8s_gpu_healthy``): unbound and lost
ones count, and are shown as unhealthy / lost. GPUs are keyed by where they were read
(the URL), node and ``gpu`` label, so several exporters never overwrite each other's
rows; an exporter started without ``--node-name`` is shown under its URL's host:port.

A source that is not a gpu-exporter (an HTTP error, text that is not the Prometheus
format, or no ``gpuk8s_`` metric at all) is an error naming it.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from ...core.errors import ConfigError, GpuK8sError
from .. import kube

WANTED = (
    "gpuk8s_gpu_healthy",
    "gpuk8s_gpu_lost",
    "gpuk8s_gpu_utilization_ratio",
    "gpuk8s_gpu_memory_used_bytes",
    "gpuk8s_gpu_memory_total_bytes",
    "gpuk8s_container_gpu_utilization_ratio",
    "gpuk8s_container_gpu_memory_used_bytes",
    "gpuk8s_container_gpu_devices",
)
EXPORTER_SELECTOR = "app.kubernetes.io/name=gpu-exporter"
GIB = 1024.0**3


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float
    source: str = ""  # the exporter URL it was scraped from ("" for Prometheus, the API)


def parse_exposition(text: str, source: str = "") -> list[Sample]:
    """Samples of the metrics ``top`` needs from a gpu-exporter's text exposition;
    ``GpuK8sError`` naming ``source`` when it is not one."""
    out = []
    exporter = False
    try:
        for family in text_string_to_metric_families(text):
            exporter = exporter or family.name.startswith("gpuk8s_")
            for s in family.samples:
                if s.name in WANTED:
                    out.append(Sample(s.name, dict(s.labels), float(s.value), source))
    except ValueError as err:
        raise GpuK8sError(f"{source or 'the answer'} is not a Prometheus exposition "
                          f"({str(err)[:120]}): not a gpu-exporter") from err
    if not exporter:
        raise GpuK8sError(f"{source or 'the answer'} serves no gpuk8s_* metric: "
                          "not a gpu-exporter")
    return out


def scrape(url: str, timeout: float = 10.0) -> list[Sample]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            text = resp.read(32 * 1024 * 1024).decode("utf-8", "replace")
    except OSError as err:
        raise GpuK8sError(f"cannot scrape {url}: {err}") from err
    samples = parse_exposition(text, url)
    host = urllib.parse.urlsplit(url).netloc
    for s in samples:
        if not s.labels.get("node"):  # an exporter without --node-name: its host:port
            s.labels["node"] = host
    return samples


def from_prometheus(base: str, timeout: float = 10.0) -> list[Sample]:
    out = []
    for name in WANTED:
        query = urllib.parse.urlencode({"query": name})
        url = f"{base.rstrip('/')}/api/v1/query?{query}"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp:
                data = json.load(resp)
        except (OSError, ValueError) as err:
            raise GpuK8sError(f"cannot query {url}: {err}") from err
        if data.get("status") != "success":
            raise GpuK8sError(f"{url}: {data.get('error', 'query failed')}")
        for row in data["data"]["result"]:
            labels = {k: v for k, v in row["metric"].items() if k != "__name__"}
            out.append(Sample(name, labels, float(row["value"][1])))
    return out


def from_apiserver(kubeconfig: str | None, timeout: float = 10.0) -> list[Sample]:
    from kubernetes import client

    api = client.CoreV1Api(kube.api_client(kubeconfig))
    try:
        pods: list[Any] = api.list_pod_for_all_namespaces(label_selector=EXPORTER_SELECTOR,
                                               _request_timeout=timeout).items
    except Exception as err:
        raise kube.classify(err, "list gpu-exporter pods") from err
    out: list[Sample] = []
    for pod in pods:
        if (pod.status.phase or "") != "Running":
            continue
        port = next((p.container_port for c in pod.spec.containers for p in (c.ports or [])
                     if p.name == "metrics"), 9400)
        try:
            text = api.connect_get_namespaced_pod_proxy_with_path(
                f"{pod.metadata.name}:{port}", pod.metadata.namespace, "metrics",
                _request_timeout=timeout)
        except Exception as err:
            raise kube.classify(err, f"scrape {pod.metadata.namespace}/{pod.metadata.name}") \
                from err
        out.extend(parse_exposition(str(text), f"pod {pod.metadata.namespace}/"
                                                f"{pod.metadata.name}"))
    return out


def _matches(labels: dict[str, str], kind: str | None, namespace: str | None,
             node: str | None) -> bool:
    return ((kind is None or labels.get("kind") == kind)
            and (namespace is None or labels.get("namespace", namespace) == namespace)
            and (node is None or labels.get("node") == node))


def node_rows(samples: Iterable[Sample], kind: str | None = None,
              node: str | None = None) -> list[dict[str, Any]]:
    gpus: dict[tuple[str, str, str], dict[str, float]] = {}
    for s in samples:
        if s.name.startswith("gpuk8s_gpu_") and _matches(s.labels, kind, None, node):
            key = (s.labels.get("node", ""), s.source, s.labels.get("gpu", ""))
            gpus.setdefault(key, {})[s.name] = s.value
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for (name, source, _gpu), values in sorted(gpus.items()):
        row = rows.setdefault((name, source), {
            "node": name, "gpus": 0, "unhealthy": 0, "lost": 0, "utilization": [],
            "memory_used_bytes": 0.0, "memory_total_bytes": 0.0})
        row["gpus"] += 1
        row["unhealthy"] += 1 if values.get("gpuk8s_gpu_healthy") == 0 else 0
        row["lost"] += 1 if values.get("gpuk8s_gpu_lost") == 1 else 0
        if "gpuk8s_gpu_utilization_ratio" in values:
            row["utilization"].append(values["gpuk8s_gpu_utilization_ratio"])
        row["memory_used_bytes"] += values.get("gpuk8s_gpu_memory_used_bytes", 0.0)
        row["memory_total_bytes"] += values.get("gpuk8s_gpu_memory_total_bytes", 0.0)
    for row in rows.values():
        utils = row.pop("utilization")
        row["utilization_ratio"] = sum(utils) / len(utils) if utils else None
    return list(rows.values())


def pod_rows(samples: Iterable[Sample], kind: str | None = None, namespace: str | None = None,
             node: str | None = None) -> list[dict[str, Any]]:
    per_gpu: dict[tuple[str, str, str, str, str], dict[str, float]] = {}
    kinds: dict[tuple[str, str, str, str], set[str]] = {}
    for s in samples:
        if not s.name.startswith("gpuk8s_container_") or not _matches(s.labels, kind, namespace,
                                                                        node):
            continue
        key = (s.labels.get("node", ""), s.source, s.labels.get("namespace", ""),
               s.labels.get("pod", ""))
        values = per_gpu.setdefault((*key, s.labels.get("gpu", "")), {})
        values[s.name] = values.get(s.name, 0.0) + s.value  # sum over the pod's containers
        kinds.setdefault(key, set()).add(s.labels.get("kind", ""))
    rows: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for (node_name, source, ns, pod_name, _gpu), values in sorted(per_gpu.items()):
        key = (node_name, source, ns, pod_name)
        row = rows.setdefault(key, {
            "namespace": ns, "pod": pod_name, "node": node_name,
            "kind": ",".join(sorted(kinds[key])), "gpus": 0,
            "utilization": [], "memory_used_bytes": None})
        row["gpus"] += 1
        if "gpuk8s_container_gpu_utilization_ratio" in values:
            row["utilization"].append(values["gpuk8s_container_gpu_utilization_ratio"])
        if "gpuk8s_container_gpu_memory_used_bytes" in values:
            row["memory_used_bytes"] = ((row["memory_used_bytes"] or 0.0)
                                        + values["gpuk8s_container_gpu_memory_used_bytes"])
    for row in rows.values():
        utils = row.pop("utilization")
        row["utilization_ratio"] = sum(utils) / len(utils) if utils else None
    return sorted(rows.values(), key=lambda r: (r["namespace"], r["pod"]))


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value / GIB:.1f}"


def render_nodes(rows: Sequence[dict[str, Any]]) -> str:
    lines = [f"{'NODE':<24} {'GPUS':>4} {'UNHEALTHY':>9} {'LOST':>4} {'UTIL':>5} "
             f"{'MEMORY (GiB)':>16}"]
    for r in rows:
        memory = f"{_gib(r['memory_used_bytes'])}/{_gib(r['memory_total_bytes'])}"
        lines.append(f"{r['node']:<24} {r['gpus']:>4} {r['unhealthy']:>9} {r['lost']:>4} "
                     f"{_pct(r['utilization_ratio']):>5} {memory:>16}")
    return "\n".join(lines)


def render_pods(rows: Sequence[dict[str, Any]]) -> str:
    lines = [f"{'NAMESPACE':<20} {'POD':<32} {'NODE':<16} {'KIND':<6} {'GPUS':>4} {'UTIL':>5} "
             f"{'MEM (GiB)':>9}"]
    for r in rows:
        lines.append(f"{r['namespace']:<20} {r['pod']:<32} {r['node']:<16} {r['kind']:<6} "
                     f"{r['gpus']:>4} {_pct(r['utilization_ratio']):>5} "
                     f"{_gib(r['memory_used_bytes']):>9}")
    return "\n".join(lines)


def collect(urls: Sequence[str], prometheus: str | None, kubeconfig: str | None,
            timeout: float = 10.0) -> list[Sample]:
    if urls and prometheus:
        raise ConfigError("--url and --prometheus exclude each other")
    if urls:
        samples: list[Sample] = []
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ConfigError(f"--url: {url!r} must start with http:// or https://")
            samples.extend(scrape(url if "/metrics" in url else url.rstrip("/") + "/metrics",
                                  timeout))
        return samples
    if prometheus:
        if not prometheus.startswith(("http://", "https://")):
            raise ConfigError(f"--prometheus: {prometheus!r} must start with http:// or https://")
        return from_prometheus(prometheus, timeout)
    return from_apiserver(kubeconfig, timeout)
