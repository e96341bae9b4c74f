"""Node state for the scheduler extender: allocations in, node annotations out.

Allocations come from the kubelet's PodResources API (``List``); the annotations are

* ``metax-tech.com/gpu.topology.scores`` / ``...losses`` -- ``core.scoring`` tables
  over the *free* devices (healthy and not allocated), and
* ``metax-tech.com/gpu.devices`` -- the device list (``core.devicelist``).

They are patched on the plugin's own Node (JSON merge patch of
``metadata.annotations``; RBAC: ``patch`` and ``get`` on ``nodes``) only when their
value changed: at start the current values are read from the Node, afterwards the
last values sent are remembered. A failed patch is retried at the next tick.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from ...core.devicelist import DEVICES_ANNOTATION, format_device_list
from ...core.errors import GpuK8sError
from ...core.scoring import tables_as_annotations, topology_tables
from ..node.devices import DeviceSet
from ..node.loop import NudgedLoop
from ..node.nodeclient import NodePatcher
from .metrics import PluginMetrics

log = logging.getLogger("gpuk8s.deviceplugin.nodestate")


def published_annotations(devices: DeviceSet, allocated: set[str]) -> dict[str, str]:
    """The node annotations gpu-device publishes: score and loss tables over the free
    (healthy, not allocated) devices, and the device list.

    The one definition of that content; the lab's fake nodes, the extender's tests and
    benchmark build their nodes with it too.
    """
    topo = devices.topology
    healthy = set(devices.healthy_ids())
    free = [topo.position[u] for u in healthy - allocated if u in topo.position]
    scores, losses = topology_tables(topo, free)
    out = tables_as_annotations(scores, losses)
    out[DEVICES_ANNOTATION] = format_device_list(devices.entries(allocated))
    return out


AllocationsSource = Callable[[str], set[str]]


class NodeStatePublisher:
    """Keeps the node annotations in line with health and allocations."""

    def __init__(
        self,
        devices: DeviceSet,
        node_name: str,
        patcher: NodePatcher,
        allocations: AllocationsSource | None,
        metrics: PluginMetrics,
        interval: float = 10.0,
    ) -> None:
        self.devices = devices
        self.node_name = node_name
        self.patcher = patcher
        self.allocations = allocations
        self.metrics = metrics
        self.interval = interval
        self.allocated: set[str] = set()
        self.published: dict[str, str] | None = None
        self.patches = 0
        self._lock = threading.Lock()  # one sync at a time
        self._loop = NudgedLoop(self.sync_once, interval, "nodestate")
        self._pod_resources_failing = False

    def desired(self, allocated: set[str]) -> dict[str, str]:
        return published_annotations(self.devices, allocated)

    def refresh_allocations(self) -> None:
        if self.allocations is None:
            return
        try:
            found = self.allocations(self.devices.resource_name)
        except GpuK8sError as err:
            if not self._pod_resources_failing:
                log.warning(
                    "cannot read allocations; keeping the last known", extra={"error": str(err)}
                )
            self._pod_resources_failing = True
            return
        if self._pod_resources_failing:
            log.info("PodResources API answers again")
        self._pod_resources_failing = False
        known = {u.id for u in self.devices.units}
        self.allocated = found & known
        self.metrics.allocated.set(len(self.allocated))

    def sync_once(self) -> bool:
        """Read allocations, compute the annotations, patch if changed. True if patched."""
        with self._lock:
            self.refresh_allocations()
            want = self.desired(self.allocated)
            if self.published is None:
                try:
                    current = self.patcher.get_annotations(self.node_name)
                    self.published = {k: current[k] for k in want if k in current}
                except GpuK8sError as err:
                    log.warning("cannot read the node; will patch", extra={"error": str(err)})
            if self.published == want:
                return False
            try:
                self.patcher.patch_annotations(self.node_name, want)
            except GpuK8sError as err:
                log.warning("node patch failed; retrying later", extra={"error": str(err)})
                return False
            self.published = dict(want)
            self.patches += 1
            self.metrics.node_patches.inc()
            log.info(
                "node annotations updated",
                extra={"node": self.node_name, "allocated": sorted(self.allocated)},
            )
            return True

    def nudge(self, delay: float = 0.0) -> None:
        """Ask for a sync in ``delay`` seconds (earlier requests win)."""
        self._loop.nudge(delay)

    def run(self, stop: threading.Event) -> None:
        self._loop.run(stop)

    def start(self) -> None:
        self._loop.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._loop.stop(timeout)
