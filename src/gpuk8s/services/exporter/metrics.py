"""Prometheus exposition of the last snapshot (a custom collector: no global registry,
no label sets left behind when a pod goes away).

GPU series carry the GPU's entry in the book of known GPUs (``knowngpus``): its
``gpu`` label is fixed at first sight, so it does not move when another GPU leaves the
bus, and a GPU that left stays as ``gpuk8s_gpu_lost 1`` / ``gpuk8s_gpu_healthy 0`` (with
``gpuk8s_gpu_info``) under its own labels until it returns or is forgotten.

Series per node, the cardinality bound: ``G`` GPUs give ``11·G`` series (nine gauges, one
info series and two ECC counters each; a lost GPU 3), plus 8 for the node (driver info,
the exporter's own); each (container, GPU) pair gives 4 series, and the pairs are
capped by ``--max-container-series`` (default 1024; the kubelet cannot hand out more
device IDs than the node advertises, so the cap only bites with misbehaving plugins).
Processes (PIDs) are never labels. 8 GPUs with 8 pods: 128 series; 64 VFs with 64 pods
(8 GPUs): 352.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from .knowngpus import KnownGpu
from .sampler import PROBLEM_CLASSES, Sampler

GPU_LABELS = ["node", "gpu", "uuid", "kind"]
CONTAINER_LABELS = ["node", "namespace", "pod", "container", "gpu", "uuid", "kind"]

# name, type, help, labels: the table docs/exporter.md shows (tests check they agree)
METRICS: list[tuple[str, str, str, list[str]]] = [
    ("gpuk8s_gpu_utilization_ratio", "gauge",
     "Share of time the GPU was busy, 0..1 (vendor utilisation %/100)", GPU_LABELS),
    ("gpuk8s_gpu_memory_used_bytes", "gauge", "GPU memory in use, bytes", GPU_LABELS),
    ("gpuk8s_gpu_memory_total_bytes", "gauge", "GPU memory size, bytes", GPU_LABELS),
    ("gpuk8s_gpu_temperature_celsius", "gauge", "GPU (hotspot) temperature, degrees Celsius",
     GPU_LABELS),
    ("gpuk8s_gpu_power_watts", "gauge", "Board power draw, watts", GPU_LABELS),
    ("gpuk8s_gpu_healthy", "gauge",
     "1 when the GPU is healthy (on the bus, bound, not reported unavailable), else 0",
     GPU_LABELS),
    ("gpuk8s_gpu_lost", "gauge",
     "1 when the GPU left the bus (kept until it returns or `gpuk8s exporter forget`), else 0",
     GPU_LABELS),
    ("gpuk8s_gpu_ecc_errors_total", "counter",
     "ECC errors since the driver loaded, by type (corrected, uncorrected)",
     [*GPU_LABELS, "type"]),
    ("gpuk8s_gpu_containers", "gauge",
     "Containers holding a device on this GPU (more than 1: the GPU is shared)", GPU_LABELS),
    ("gpuk8s_gpu_info", "gauge", "GPU identity; always 1",
     ["node", "gpu", "uuid", "pci_address", "product", "vendor"]),
    ("gpuk8s_gpu_driver_info", "gauge", "Driver version and where the load comes from; always 1",
     ["node", "vendor", "driver_version", "source"]),
    ("gpuk8s_container_gpu_utilization_ratio", "gauge",
     "Share of the GPU's time this container's processes kept it busy, 0..1",
     CONTAINER_LABELS),
    ("gpuk8s_container_gpu_memory_used_bytes", "gauge",
     "GPU memory used by this container's processes, bytes", CONTAINER_LABELS),
    ("gpuk8s_container_gpu_devices", "gauge",
     "Device IDs (GPU, VF or share) this container holds on the GPU", CONTAINER_LABELS),
    ("gpuk8s_container_gpu_utilization_exact", "gauge",
     "1 when the container's utilisation is measured, 0 when estimated (shared GPU, "
     "no per-process utilisation)", CONTAINER_LABELS),
    ("gpuk8s_exporter_samples_total", "counter", "Samples taken", ["node"]),
    ("gpuk8s_exporter_sample_failures_total", "counter", "Samples that failed outright",
     ["node"]),
    ("gpuk8s_exporter_last_sample_timestamp_seconds", "gauge",
     "Unix time of the snapshot being served", ["node"]),
    ("gpuk8s_exporter_sample_duration_seconds", "gauge", "How long the last sample took",
     ["node"]),
    ("gpuk8s_exporter_sample_problems", "gauge",
     "Problems reported by the last sample, per class (logged once each)", ["node", "class"]),
    ("gpuk8s_exporter_dropped_container_series", "gauge",
     "(container, GPU) pairs left out by --max-container-series", ["node"]),
    ("gpuk8s_exporter_unknown_devices", "gauge",
     "Allocated device IDs that name no GPU of this node", ["node"]),
]


def _family(name: str) -> Any:
    for metric, kind, text, labels in METRICS:
        if metric == name:
            if kind == "counter":
                return CounterMetricFamily(metric.removesuffix("_total"), text, labels=labels)
            return GaugeMetricFamily(metric, text, labels=labels)
    raise KeyError(name)


class SnapshotCollector:
    """Renders ``sampler.snapshot``; nothing when no sample was taken yet."""

    def __init__(self, sampler: Sampler, node: str) -> None:
        self.sampler = sampler
        self.node = node

    def describe(self) -> list[Metric]:
        return []  # unchecked collector: families depend on the snapshot

    def collect(self) -> Iterator[Metric]:
        node = self.node
        stats = self.sampler.stats
        own = {name: _family(name) for name, _, _, _ in METRICS}
        own["gpuk8s_exporter_samples_total"].add_metric([node], stats.samples)
        own["gpuk8s_exporter_sample_failures_total"].add_metric([node], stats.failures)
        snapshot = self.sampler.snapshot
        if snapshot is not None:
            self._fill(own, snapshot, node)
        for family in own.values():
            if family.samples:
                yield family

    @staticmethod
    def _fill(own: dict[str, Any], snapshot: Any, node: str) -> None:
        telemetry = snapshot.telemetry
        backend = snapshot.inventory.backend
        own["gpuk8s_gpu_driver_info"].add_metric(
            [node, backend, telemetry.driver_version or snapshot.inventory.driver.version or "",
             telemetry.source], 1)
        known = snapshot.known
        for usage in snapshot.usage.gpus:
            gpu = usage.gpu
            entry = known.get(gpu.index)
            if entry is None:  # a snapshot made without the book (tests, benchmarks)
                entry = KnownGpu(gpu.index, gpu.pci_address, gpu.uuid or "", gpu.product,
                                 gpu.vendor, usage.kind)
            if entry.lost:
                continue  # off the bus though discovery still lists it: below, as lost
            labels = [node, str(entry.label), entry.uuid, usage.kind]
            own["gpuk8s_gpu_info"].add_metric(
                [node, str(entry.label), entry.uuid, gpu.pci_address, gpu.product, gpu.vendor],
                1)
            own["gpuk8s_gpu_healthy"].add_metric(labels, 0 if usage.fault else 1)
            own["gpuk8s_gpu_lost"].add_metric(labels, 0)
            own["gpuk8s_gpu_containers"].add_metric(labels, usage.holders)
            sample = usage.sample
            if sample is None:
                continue
            for name, value in (
                ("gpuk8s_gpu_utilization_ratio", sample.utilization_ratio),
                ("gpuk8s_gpu_memory_used_bytes", sample.memory_used_bytes),
                ("gpuk8s_gpu_memory_total_bytes", sample.memory_total_bytes),
                ("gpuk8s_gpu_temperature_celsius", sample.temperature_celsius),
                ("gpuk8s_gpu_power_watts", sample.power_watts),
            ):
                if value is not None:
                    own[name].add_metric(labels, value)
            for kind, count in (("corrected", sample.ecc_corrected),
                                ("uncorrected", sample.ecc_uncorrected)):
                if count is not None:
                    own["gpuk8s_gpu_ecc_errors_total"].add_metric([*labels, kind], count)
        for entry in snapshot.lost:
            labels = [node, str(entry.label), entry.uuid, entry.kind]
            own["gpuk8s_gpu_info"].add_metric(
                [node, str(entry.label), entry.uuid, entry.pci_address, entry.product,
                 entry.vendor], 1)
            own["gpuk8s_gpu_healthy"].add_metric(labels, 0)
            own["gpuk8s_gpu_lost"].add_metric(labels, 1)
        for c in snapshot.usage.containers:
            ref = c.container
            entry = known.get(c.gpu.index)
            gpu_label, uuid = ((str(entry.label), entry.uuid) if entry is not None
                               else (str(c.gpu.index), c.gpu.uuid or ""))
            labels = [node, ref.namespace, ref.pod, ref.container, gpu_label, uuid, c.kind]
            own["gpuk8s_container_gpu_devices"].add_metric(labels, c.devices)
            if c.utilization_ratio is not None:
                own["gpuk8s_container_gpu_utilization_ratio"].add_metric(
                    labels, c.utilization_ratio)
                own["gpuk8s_container_gpu_utilization_exact"].add_metric(
                    labels, 1 if c.utilization_exact else 0)
            if c.memory_used_bytes is not None:
                own["gpuk8s_container_gpu_memory_used_bytes"].add_metric(
                    labels, c.memory_used_bytes)
        own["gpuk8s_exporter_last_sample_timestamp_seconds"].add_metric([node], snapshot.taken_at)
        own["gpuk8s_exporter_sample_duration_seconds"].add_metric([node], snapshot.duration)
        for kind in PROBLEM_CLASSES:
            own["gpuk8s_exporter_sample_problems"].add_metric(
                [node, kind], snapshot.problem_counts.get(kind, 0))
        own["gpuk8s_exporter_dropped_container_series"].add_metric(
            [node], snapshot.usage.dropped_containers)
        own["gpuk8s_exporter_unknown_devices"].add_metric(
            [node], len(snapshot.usage.unknown_devices))


def registry_for(sampler: Sampler, node: str) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(sampler, node))
    return registry


class Exposition:
    """The text a scrape gets, rendered once per snapshot: the values only change when a
    sample is taken, so every scrape in between is a copy of bytes (constant time,
    whatever the number of devices or scrapers)."""

    def __init__(self, registry: CollectorRegistry, sampler: Sampler) -> None:
        self.registry = registry
        self.sampler = sampler
        self._key: tuple[int, int, int] | None = None
        self._body = b""
        self._lock = threading.Lock()
        self.renders = 0

    def body(self) -> bytes:
        stats = self.sampler.stats
        key = (id(self.sampler.snapshot), stats.samples, stats.failures)
        with self._lock:
            if key != self._key:
                self._body = generate_latest(self.registry)
                self._key = key
                self.renders += 1
            return self._body
