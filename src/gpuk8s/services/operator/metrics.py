"""Prometheus metrics of operator-controller (served at ``/metrics`` on its health port).

One registry per controller (no process-global collectors), so tests and a re-created
controller start clean.
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# an upgrade takes minutes (drain, unload, install, load, validate)
DURATION_BUCKETS = (15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0)


class UpgradeMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.nodes = Gauge("operator_driver_upgrade_nodes",
                           "GPU nodes per driver upgrade state (label "
                           "metax-tech.com/driver.upgrade-state; none: no label)",
                           ["state"], registry=self.registry)
        self.duration = Histogram("operator_driver_upgrade_duration_seconds",
                                  "Seconds from cordon to done / failed, per node upgrade",
                                  ["result"], buckets=DURATION_BUCKETS, registry=self.registry)
        self.paused = Gauge("operator_driver_upgrade_paused",
                            "1 while the rollout is paused by a failed node",
                            registry=self.registry)
        self.limits = Gauge("operator_driver_upgrade_limit",
                            "Rollout limits and current use (maxParallel, maxUnavailable, "
                            "active, unavailable)", ["kind"], registry=self.registry)

    def set_states(self, counts: Mapping[str, int], paused: bool,
                   limits: Mapping[str, int]) -> None:
        for state, count in counts.items():
            self.nodes.labels(state=state).set(count)
        self.paused.set(1 if paused else 0)
        for kind, value in limits.items():
            self.limits.labels(kind=kind).set(value)

    def observe(self, result: str, seconds: float) -> None:
        self.duration.labels(result=result).observe(max(0.0, seconds))

    def render(self) -> tuple[str, bytes]:
        return CONTENT_TYPE_LATEST, generate_latest(self.registry)
