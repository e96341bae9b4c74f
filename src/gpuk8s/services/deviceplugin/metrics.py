"""Prometheus metrics of the device plugin, in a registry of its own (no global state)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import start_http_server

PREFIX = "gpuk8s_deviceplugin"


class PluginMetrics:
    def __init__(self, resource_name: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        labels = ["resource"]
        self.resource_name = resource_name
        self._devices = Gauge(
            f"{PREFIX}_devices",
            "Advertised devices by health (Healthy / Unhealthy)",
            [*labels, "health"],
            registry=self.registry,
        )
        self._allocated = Gauge(
            f"{PREFIX}_allocated_devices",
            "Devices held by containers, from the kubelet PodResources API",
            labels,
            registry=self.registry,
        )
        self._allocations = Counter(
            f"{PREFIX}_allocations",
            "Containers served by Allocate",
            labels,
            registry=self.registry,
        )
        self._allocate_errors = Counter(
            f"{PREFIX}_allocate_errors",
            "Allocate requests rejected (unknown or unhealthy devices)",
            labels,
            registry=self.registry,
        )
        self._registrations = Counter(
            f"{PREFIX}_registrations",
            "Successful registrations with the kubelet",
            labels,
            registry=self.registry,
        )
        self._registration_failures = Counter(
            f"{PREFIX}_registration_failures",
            "Failed attempts to serve or register",
            labels,
            registry=self.registry,
        )
        self._last_health = Gauge(
            f"{PREFIX}_last_health_check_timestamp_seconds",
            "Unix time of the last completed health check",
            labels,
            registry=self.registry,
        )
        self._health_changes = Counter(
            f"{PREFIX}_health_changes",
            "Device health flips (Healthy <-> Unhealthy)",
            labels,
            registry=self.registry,
        )
        self._law = Counter(
            f"{PREFIX}_list_and_watch_updates",
            "ListAndWatch responses sent",
            labels,
            registry=self.registry,
        )
        self._node_patches = Counter(
            f"{PREFIX}_node_patches",
            "Node annotation patches sent to the API server",
            labels,
            registry=self.registry,
        )
        self._search_cut = Counter(
            f"{PREFIX}_preferred_allocation_search_cut",
            "GetPreferredAllocation answers where the search step budget ran out and the "
            "best set found so far was returned",
            labels,
            registry=self.registry,
        )
        r = resource_name
        self.preferred_search_cut = self._search_cut.labels(r)
        self.allocated = self._allocated.labels(r)
        self.allocations = self._allocations.labels(r)
        self.allocate_errors = self._allocate_errors.labels(r)
        self.registrations = self._registrations.labels(r)
        self.registration_failures = self._registration_failures.labels(r)
        self.last_health_check = self._last_health.labels(r)
        self.health_changes = self._health_changes.labels(r)
        self.list_and_watch_sent = self._law.labels(r)
        self.node_patches = self._node_patches.labels(r)

    def set_devices(self, healthy: int, unhealthy: int) -> None:
        self._devices.labels(self.resource_name, "Healthy").set(healthy)
        self._devices.labels(self.resource_name, "Unhealthy").set(unhealthy)

    def text(self) -> str:
        return generate_latest(self.registry).decode()

    def serve(self, port: int, address: str = "0.0.0.0") -> None:
        """Expose ``/metrics`` over HTTP (a daemon thread)."""
        start_http_server(port, addr=address, registry=self.registry)
