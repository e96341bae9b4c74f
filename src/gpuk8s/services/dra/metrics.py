"""Prometheus metrics of gpu-dra, in a registry of its own (no global state)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

PREFIX = "gpuk8s_dra"


class DraMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._devices = Gauge(f"{PREFIX}_devices", "Devices of the node's pool by health",
                              ["health"], registry=self.registry)
        self.last_health_check = Gauge(f"{PREFIX}_last_health_check_timestamp_seconds",
                                       "When the last full health check ended",
                                       registry=self.registry)
        self.health_changes = Counter(f"{PREFIX}_health_changes",
                                      "Device health flips (either way)", registry=self.registry)
        self._prepare = Histogram(
            f"{PREFIX}_node_prepare_seconds", "NodePrepareResources time per claim",
            ["result"], registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5))
        self._prepared = Gauge(f"{PREFIX}_prepared_claims", "Claims prepared on this node",
                               registry=self.registry)
        self._publishes = Counter(f"{PREFIX}_slice_publishes",
                                  "ResourceSlice syncs that wrote something, by result",
                                  ["result"], registry=self.registry)

    def set_devices(self, healthy: int, unhealthy: int) -> None:
        self._devices.labels("Healthy").set(healthy)
        self._devices.labels("Unhealthy").set(unhealthy)

    def observe_prepare(self, seconds: float, ok: bool) -> None:
        self._prepare.labels("ok" if ok else "error").observe(seconds)

    def set_prepared(self, claims: int) -> None:
        self._prepared.set(claims)

    def published(self, ok: bool) -> None:
        self._publishes.labels("ok" if ok else "error").inc()

    def text(self) -> bytes:
        return bytes(generate_latest(self.registry))
