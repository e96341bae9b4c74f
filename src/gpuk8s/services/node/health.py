"""Health loop: periodic full checks plus a fast watch for GPUs leaving the bus.

Every ``interval`` seconds the full check (``gpuk8s.discovery.check_health``: PCI
presence, driver binding, the vendor tool's verdict) runs and its result is applied to
the ``DeviceSet``, which wakes ListAndWatch only when a device's health flipped, in
either direction (a GPU that recovers goes back to Healthy).

Between full checks, every ``removal_poll`` seconds the loop stats each GPU's sysfs
directory and driver link; a change triggers a full check at once, so a hot-unplug or
an unbind shows up in well under a second. Why polling and not inotify: sysfs does
not emit inotify events for kernel-side changes (a device that disappears generates
none), and the kernel's uevent netlink socket is only delivered in the host network
namespace and says nothing about simulated roots. A dozen stat() calls twice a second
cost nothing and behave the same on a real host, under ``/host`` in a pod, and on a
simulator root.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from ...core.model import NodeInventory
from ...discovery import check_health, sysfs
from .devices import DeviceSet

log = logging.getLogger("gpuk8s.deviceplugin.health")

HealthCheck = Callable[[str, NodeInventory], Mapping[int, str | None]]


class HealthMetrics(Protocol):
    """What the loop reports (gpu-device's ``PluginMetrics`` has these)."""

    last_health_check: Any
    health_changes: Any

    def set_devices(self, healthy: int, unhealthy: int) -> None: ...


def _default_check(root: str, inventory: NodeInventory) -> Mapping[int, str | None]:
    return check_health(root, inventory)


class HealthMonitor:
    def __init__(
        self,
        devices: DeviceSet,
        root: str,
        interval: float,
        metrics: HealthMetrics,
        *,
        removal_poll: float = 0.5,
        check: HealthCheck = _default_check,
        on_change: Callable[[list[str]], None] | None = None,
    ) -> None:
        self.devices = devices
        self.root = root
        self.interval = interval
        self.removal_poll = removal_poll
        self.metrics = metrics
        self.check = check
        self.on_change = on_change
        self.checks_done = 0
        self.last_check_seconds = 0.0  # duration of the last full check
        self.last_check_at = time.monotonic()  # when the last full check ended (liveness)
        self._next_after_start = 0.0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        healthy = len(devices)
        metrics.set_devices(healthy, 0)

    @property
    def enabled(self) -> bool:
        return self.interval > 0

    def presence(self) -> tuple[tuple[bool, str | None], ...]:
        """(on the bus, bound driver) of every GPU: cheap, stat/readlink only."""
        out = []
        for gpu in self.devices.inventory.gpus:
            present = sysfs.device_present(self.root, gpu.pci_address)
            driver = sysfs.bound_driver(self.root, gpu.pci_address) if present else None
            out.append((present, driver))
        return tuple(out)

    def check_once(self) -> list[str]:
        """Run the full check and apply it; returns the ids whose health flipped."""
        started = time.monotonic()
        try:
            result = self.check(self.root, self.devices.inventory)
        except Exception:  # a broken check must not kill the loop; keep the last state
            log.exception("health check failed; keeping the previous state")
            return []
        finally:
            self.last_check_seconds = time.monotonic() - started
        flipped = self.devices.update_health(result)
        self.checks_done += 1
        self.last_check_at = time.monotonic()
        self.metrics.last_health_check.set(time.time())
        _, views = self.devices.snapshot()
        healthy = sum(1 for v in views if v.healthy)
        self.metrics.set_devices(healthy, len(views) - healthy)
        if flipped:
            self.metrics.health_changes.inc(len(flipped))
            for device_id in flipped:
                reason = self.devices.reason(device_id)
                if reason is None:
                    log.info("device healthy again", extra={"device": device_id})
                else:
                    log.warning("device unhealthy", extra={"device": device_id, "reason": reason})
            if self.on_change is not None:
                self.on_change(flipped)
        return flipped

    def run(self, stop: threading.Event) -> None:
        if not self.enabled:
            log.info("health checks disabled (healthy interval 0): devices stay Healthy")
            return
        seen = self.presence()
        next_full = time.monotonic() if self.checks_done == 0 else self._next_after_start
        while not stop.is_set():
            now = time.monotonic()
            if now >= next_full:
                self.check_once()
                seen = self.presence()
                next_full = time.monotonic() + self.interval
                continue
            stop.wait(max(0.0, min(self.removal_poll, next_full - now)))
            if stop.is_set():
                break
            current = self.presence()
            if current != seen:
                log.info("PCI presence or driver binding changed: checking now")
                next_full = time.monotonic()
            seen = current

    def start(self) -> None:
        """One check now (so the first ListAndWatch already tells the truth), then the
        loop in a thread."""
        if self.enabled:
            self.check_once()
            self._next_after_start = time.monotonic() + self.interval
        self._thread = threading.Thread(
            target=self.run, args=(self._stop,), name="health", daemon=True
        )
        self._thread.start()

    def alive(self, now: float | None = None) -> tuple[bool, str | None]:
        """Liveness: the loop thread runs and, when checking is on, a full check ended
        within three intervals (at least a minute: a slow mx-smi is not a hang)."""
        if self._thread is None or not self._thread.is_alive():
            return (not self.enabled and self._thread is not None), "health loop not running"
        if not self.enabled:
            return True, None
        age = (time.monotonic() if now is None else now) - self.last_check_at
        limit = max(3 * self.interval, 60.0)
        if age > limit:
            return False, f"no health check finished for {age:.0f}s (limit {limit:.0f}s)"
        return True, None

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)


def liveness(health: HealthMonitor, loops: Mapping[str, bool]) -> tuple[bool, dict[str, Any]]:
    """A node plugin's /healthz: every loop runs (``loops``: what to say when one does not
    -> whether it runs) and the health loop is alive."""
    problems = [problem for problem, running in loops.items() if not running]
    ok, reason = health.alive()
    if not ok and reason:
        problems.append(reason)
    return not problems, {"problems": problems, "healthChecks": health.checks_done}
