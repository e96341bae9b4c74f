"""`gpuk8s serve dra-plugin`: gpu-dra, the DRA driver ``gpu.metax-tech.com`` (DaemonSet).

Discovers the node's GPUs under the host root, publishes them as ResourceSlices
(``core.dra``), keeps their health current (``node.health``, the loop gpu-device runs),
serves the kubelet's DRA plugin API on a unix socket and registers it with the kubelet's
plugin watcher, and prepares allocated claims as CDI devices. Flags: ``--help`` and
docs/dra.md.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from http.server import ThreadingHTTPServer
from types import FrameType
from typing import Any

import grpc

from ...core.dra import (
    DRA_SHARING_MODES,
    DRIVER,
    GROUP_DEVICE_MODES,
    UNHEALTHY_MODES,
    PoolOptions,
    group_devices_wanted,
    pool_devices,
)
from ...core.errors import ConfigError, GpuK8sError
from ...core.model import NodeInventory
from ...core.sharing import MODE_EXCLUSIVE, SHARING_MODE_LABEL, check_mode
from ..flags import add_health_port_argument, add_kubeconfig_argument, add_log_arguments
from ..healthserver import serve_health
from ..logging_setup import LogOptions, configure_logging
from ..node.devices import VISIBLE_DEVICES_MODES, AllocateOptions, DeviceSet
from ..node.health import HealthCheck, HealthMonitor, liveness
from .driver import DEFAULT_CDI_DIR, ClaimSource, Driver, KubeClaims
from .grpcapi import HEALTHY, UNHEALTHY, DraServicer, drahealth
from .metrics import DraMetrics
from .publisher import KubeSlices, SliceApi, SlicePublisher
from .server import DEFAULT_PLUGIN_DIR, DEFAULT_REGISTRY_DIR, DraServer, ServerOptions
from .state import Checkpoint

log = logging.getLogger("gpuk8s.dra")


@dataclass(frozen=True)
class DraConfig:
    host_root: str = "/"
    node_name: str = ""
    kubeconfig: str = ""
    plugin_dir: str = DEFAULT_PLUGIN_DIR
    registry_dir: str = DEFAULT_REGISTRY_DIR
    cdi_dir: str = DEFAULT_CDI_DIR
    pool: PoolOptions = field(default_factory=PoolOptions)
    allocate: AllocateOptions = field(default_factory=AllocateOptions)
    healthy_interval: float = 5.0
    removal_poll: float = 0.5
    watch_interval: float = 0.5
    resync_interval: float = 60.0
    health_port: int = 0
    metrics_port: int = 0

    def __post_init__(self) -> None:
        if not self.node_name:
            raise ConfigError("node-name: required (the pool and the slices are the node's; "
                              "$NODE_NAME in the DaemonSet)")
        if self.healthy_interval < 0:
            raise ConfigError(f"healthy-interval: {self.healthy_interval!r} must be >= 0 "
                              "seconds (0 disables)")
        for name in ("removal_poll", "watch_interval", "resync_interval"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name.replace('_', '-')}: must be a positive number of "
                                  "seconds")
        for name in ("health_port", "metrics_port"):
            if not 0 <= getattr(self, name) <= 65535:
                raise ConfigError(f"{name.replace('_', '-')}: {getattr(self, name)} is not in "
                                  "0..65535")
        for name in ("plugin_dir", "registry_dir", "cdi_dir"):
            if not getattr(self, name).startswith("/"):
                raise ConfigError(f"{name.replace('_', '-')}: {getattr(self, name)!r} must be an "
                                  "absolute path")


def build_parser() -> argparse.ArgumentParser:
    env = os.environ
    p = argparse.ArgumentParser(prog="gpuk8s serve dra-plugin",
                                description=f"DRA driver {DRIVER} for MetaX (and NVIDIA) GPUs.")
    p.add_argument("--host-root", default=env.get("HOST_ROOT", "/"),
                   help="where the host's / is mounted (default /; /host in the DaemonSet)")
    p.add_argument("--node-name", default=env.get("NODE_NAME", ""),
                   help="this node (default $NODE_NAME): the pool's name")
    add_kubeconfig_argument(p, used_for="the node and its ResourceSlices")
    p.add_argument("--plugin-dir", default=DEFAULT_PLUGIN_DIR,
                   help=f"the plugin's socket and checkpoint directory (default "
                        f"{DEFAULT_PLUGIN_DIR})")
    p.add_argument("--registry-dir", default=DEFAULT_REGISTRY_DIR,
                   help=f"the kubelet's plugin registry (default {DEFAULT_REGISTRY_DIR})")
    p.add_argument("--cdi-dir", default=env.get("CDI_DIR", DEFAULT_CDI_DIR),
                   help=f"where claims' CDI specs are written (default {DEFAULT_CDI_DIR})")
    p.add_argument("--sharing-mode", default=env.get("SHARING_MODE", "auto"),
                   help="exclusive (whole GPUs and group devices), sgpu (GPUs shared by "
                        "consumable vcore/vmemory) or auto: the node's "
                        f"{SHARING_MODE_LABEL} label (default auto)")
    p.add_argument("--group-devices", choices=GROUP_DEVICE_MODES,
                   default=env.get("GROUP_DEVICES", "auto"),
                   help="publish link-complete 2/4/8-GPU group devices (needs the "
                        "DRAPartitionableDevices feature gate): on, off, or auto: on only "
                        "where the API server's release was measured to schedule them at "
                        "scale, none yet (default auto; docs/dra.md, Flags)")
    p.add_argument("--unhealthy-devices", choices=UNHEALTHY_MODES, default="taint",
                   help="taint unhealthy devices NoSchedule (needs DRADeviceTaints) or "
                        "remove them from the slice (default taint; falls back to remove "
                        "when the API server drops taints)")
    p.add_argument("--healthy-interval", type=float,
                   default=float(env.get("HEALTHY_INTERVAL", "5")),
                   help="seconds between health checks; 0 disables them (default 5)")
    p.add_argument("--removal-poll", type=float, default=0.5,
                   help="seconds between cheap sysfs presence checks (default 0.5)")
    p.add_argument("--watch-interval", type=float, default=0.5,
                   help="seconds between checks that our sockets still exist (default 0.5)")
    p.add_argument("--resync-interval", type=float, default=60.0,
                   help="seconds between full ResourceSlice syncs (default 60)")
    p.add_argument("--device-path-prefix", default=env.get("DEVICE_PATH_PREFIX", ""),
                   help="prefix of the host paths in CDI specs (empty on real nodes, the "
                        "simulator root in the lab)")
    p.add_argument("--visible-devices", default="auto", choices=VISIBLE_DEVICES_MODES,
                   help="value of MACA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES (as gpu-device)")
    p.add_argument("--mount-sdk", action="store_true",
                   default=env.get("MOUNT_SDK", "") in ("1", "true"),
                   help="mount the host SDK and driver paths read-only into claims' containers")
    p.add_argument("--sdk-path", action="append", default=None,
                   help="path to mount with --mount-sdk (repeatable)")
    add_health_port_argument(p, serves="/healthz, /readyz (registered and published) and "
                             "/metrics")
    p.add_argument("--metrics-port", type=int, default=int(env.get("METRICS_PORT", "0")),
                   help="a separate /metrics port; 0: none (default 0)")
    add_log_arguments(p)
    return p


def config_from_args(args: argparse.Namespace, sharing: str) -> DraConfig:
    return DraConfig(
        host_root=args.host_root, node_name=args.node_name, kubeconfig=args.kubeconfig or "",
        plugin_dir=args.plugin_dir, registry_dir=args.registry_dir, cdi_dir=args.cdi_dir,
        pool=PoolOptions(sharing=sharing, groups=args.group_devices != "off",
                         unhealthy=args.unhealthy_devices),
        allocate=AllocateOptions(device_path_prefix=args.device_path_prefix,
                                 visible_devices=args.visible_devices, mount_sdk=args.mount_sdk,
                                 sdk_paths=tuple(args.sdk_path) if args.sdk_path else None),
        healthy_interval=args.healthy_interval, removal_poll=args.removal_poll,
        watch_interval=args.watch_interval, resync_interval=args.resync_interval,
        health_port=args.health_port, metrics_port=args.metrics_port,
    )


def resolve_sharing(value: str, labels: Mapping[str, str] | None) -> str:
    """``--sharing-mode``: a DRA mode, or ``auto`` read from the node's label."""
    if value != "auto":
        if value not in DRA_SHARING_MODES:
            raise ConfigError(f"sharing-mode: {value!r} is not one of "
                              f"{', '.join(DRA_SHARING_MODES)}, auto")
        return value
    mode = check_mode((labels or {}).get(SHARING_MODE_LABEL))
    if mode not in DRA_SHARING_MODES:
        raise ConfigError(f"node label {SHARING_MODE_LABEL}={mode}: gpu-dra serves "
                          f"{', '.join(DRA_SHARING_MODES)} (vcuda and mps need gpu-device)")
    return mode


class DraApp:
    """The assembled driver: devices, health loop, claims, slices, sockets, metrics."""

    def __init__(self, config: DraConfig, inventory: NodeInventory, *, claims: ClaimSource,
                 slices: SliceApi, health_check: HealthCheck | None = None,
                 node_uid: str = "") -> None:
        self.config = config
        self.inventory = inventory
        self.metrics = DraMetrics()
        self.devices = DeviceSet(inventory, DRIVER, config.allocate)
        self.checkpoint = Checkpoint(config.plugin_dir)
        self.publisher = SlicePublisher(
            config.node_name, inventory, config.pool, slices,
            unhealthy=self.unhealthy_gpus, metrics=self.metrics,
            interval=config.resync_interval, node_uid=node_uid)
        self.driver = Driver(self.devices, config.pool, config.node_name, claims,
                             self.checkpoint, config.cdi_dir, metrics=self.metrics,
                             on_change=self.publisher.nudge)
        self.publisher.busy = self.driver.busy_gpus
        kwargs = {} if health_check is None else {"check": health_check}
        self.health = HealthMonitor(self.devices, config.host_root, config.healthy_interval,
                                    self.metrics, removal_poll=config.removal_poll,
                                    on_change=lambda ids: self.publisher.nudge(), **kwargs)
        self.server = DraServer(DraServicer(self.driver), self.watch_health,
                                ServerOptions(plugin_dir=config.plugin_dir,
                                              registry_dir=config.registry_dir,
                                              watch_interval=config.watch_interval))
        self.stopping = threading.Event()
        self._server_thread: threading.Thread | None = None
        self._http: list[ThreadingHTTPServer] = []

    def unhealthy_gpus(self) -> dict[int, str]:
        out: dict[int, str] = {}
        for unit in self.devices.units:
            reason = self.devices.reason(unit.id)
            if reason is not None:
                out.setdefault(unit.gpu, reason)
        return out

    # -- DRAResourceHealth --------------------------------------------------------------
    def health_snapshot(self) -> Any:
        sick = self.unhealthy_gpus()
        now = int(time.time())
        timeout = int(max(3 * self.config.healthy_interval, 60))
        response = drahealth.NodeWatchResourcesResponse()
        for device in pool_devices(self.inventory, self.driver.pool):
            bad = any(g in sick for g in device.gpus)
            response.devices.append(drahealth.DeviceHealth(
                device=drahealth.DeviceIdentifier(pool_name=self.config.node_name,
                                                  device_name=device.name),
                health=UNHEALTHY if bad else HEALTHY, last_updated_time=now,
                health_check_timeout_seconds=timeout))
        return response

    def watch_health(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        """Every device's health now, then again on each change (and at least every
        health interval, so the kubelet's timeout never marks them Unknown)."""
        version = self.devices.version
        yield self.health_snapshot()
        period = max(self.config.healthy_interval, 1.0)
        while context.is_active() and not self.stopping.is_set():
            new = self.devices.wait_for_change(version, period)
            if not context.is_active() or self.stopping.is_set():
                return
            version = new
            yield self.health_snapshot()

    # -- probes ------------------------------------------------------------------------------
    def liveness(self) -> tuple[bool, dict[str, Any]]:
        running = self._server_thread is not None and self._server_thread.is_alive()
        return liveness(self.health, {"socket server loop not running": running,
                                      "ResourceSlice publisher not running":
                                          self.publisher.alive()})

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        registered = self.server.registered.is_set()
        published = self.publisher.published_at is not None
        return registered and published, {
            "registered": registered, "registrations": self.server.registrations,
            "lastRegistrationError": self.server.last_status,
            "slicesPublished": published, "generation": self.publisher.generation,
            "problems": self.publisher.problems,
        }

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        def metrics_page() -> tuple[str, bytes]:
            return "text/plain; version=0.0.4", self.metrics.text()

        for port, checks in ((self.config.health_port,
                              {"/healthz": self.liveness, "/readyz": self.readiness}),
                             (self.config.metrics_port, {})):
            if port:
                self._http.append(serve_health(port, checks, name="dra-http",
                                               pages={"/metrics": metrics_page}))
        self.health.start()
        self.publisher.start()
        self._server_thread = threading.Thread(target=self.server.run, name="dra-server",
                                               daemon=True)
        self._server_thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self.stopping.set()
        self.devices.wake()
        self.server.stop()
        self.health.stop()
        self.publisher.stop()
        if self._server_thread is not None:
            self._server_thread.join(timeout)
        for http in self._http:
            http.shutdown()
            http.server_close()


def _read_node(kubeconfig: str, node: str) -> tuple[dict[str, str], str]:
    """(labels, uid) of this node."""
    from kubernetes import client

    from ..kube import api_client, classify

    try:
        obj = client.CoreV1Api(api_client(kubeconfig or None)).read_node(node)
    except Exception as err:
        raise classify(err, f"read node {node}") from err
    meta = obj.metadata
    if meta is None:
        return {}, ""
    return dict(meta.labels or {}), str(meta.uid or "")


def _server_version(client: Any) -> str | None:
    """The API server's ``gitVersion`` (``/version``); None when it cannot be read."""
    from kubernetes.client import VersionApi

    try:
        return str(VersionApi(client).get_code().git_version)
    except Exception as err:  # any failure: auto then keeps group devices off
        log.warning("cannot read the API server's version", extra={"error": str(err)})
        return None


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        configure_logging(LogOptions.from_args(args), component="gpu-dra")
        auto = args.sharing_mode == "auto"
        # the flags first (nothing is read before they are valid), then the node
        config = config_from_args(args, MODE_EXCLUSIVE if auto else
                                  resolve_sharing(args.sharing_mode, None))
        labels, node_uid = _read_node(args.kubeconfig or "", args.node_name)
        if auto:
            config = replace(config, pool=replace(config.pool,
                                                  sharing=resolve_sharing("auto", labels)))
    except GpuK8sError as err:
        print(f"gpuk8s serve dra-plugin: error: {err}", file=sys.stderr)
        return 2
    from ...discovery import discover
    from ..kube import api_client

    inventory = discover(config.host_root)
    for problem in inventory.problems:
        log.warning("discovery problem", extra={"problem": problem})
    try:
        client = api_client(config.kubeconfig or None)
        groups_off = None
        if args.group_devices == "auto":
            groups, groups_off = group_devices_wanted("auto", _server_version(client))
            config = replace(config, pool=replace(config.pool, groups=groups))
        app = DraApp(config, inventory, claims=KubeClaims(client), slices=KubeSlices(client),
                     node_uid=node_uid)
    except GpuK8sError as err:
        log.error("cannot start", extra={"error": str(err)})
        return 2
    if groups_off:
        app.publisher.problem(groups_off)  # logged, and listed by /readyz
    log.info("starting", extra={
        "driver": DRIVER, "node": config.node_name, "devices": len(app.driver.index),
        "backend": inventory.backend, "sharing": config.pool.sharing,
        "group_devices": config.pool.groups, "healthy_interval": config.healthy_interval})
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("signal received, shutting down", extra={"signal": signal.Signals(signum).name})
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    app.start()
    while not stop.wait(1.0):
        pass
    app.stop()
    log.info("stopped (ResourceSlices and prepared claims stay for the next start)")
    return 0

