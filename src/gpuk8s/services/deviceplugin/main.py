"""`gpuk8s serve device-plugin`: the gpu-device DaemonSet's process.

Discovers the node's GPUs under the host root, advertises them to the kubelet as
``metax-tech.com/gpu`` (one device per GPU, or per VF), keeps their health current,
answers GetPreferredAllocation with the topology-aware allocator, and publishes the
node annotations the scheduler extender reads. Flags are listed by ``--help`` and in
docs/deviceplugin.md.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from http.server import ThreadingHTTPServer
from types import FrameType
from typing import Any

from ...core.cdi import cdi_names_accepted
from ...core.errors import ConfigError, GpuK8sError
from ...core.model import NodeInventory
from ...core.sharing import (
    COUNTED_RESOURCE,
    MODE_EXCLUSIVE,
    SHARING_MODE_LABEL,
    SHARING_MODES,
    check_mode,
)
from ..flags import add_health_port_argument, add_kubeconfig_argument, add_log_arguments
from ..healthserver import serve_health
from ..logging_setup import LogOptions, configure_logging
from ..node.devices import (
    DEFAULT_RESOURCE,
    VISIBLE_DEVICES_MODES,
    AllocateOptions,
    DeviceSet,
)
from ..node.health import HealthCheck, HealthMonitor, liveness
from ..node.nodeclient import KubernetesNodePatcher, NodePatcher
from ..node.podresources import DEFAULT_POD_RESOURCES_SOCKET, PodResourcesClient
from .grpcapi import DevicePluginServicer
from .metrics import PluginMetrics
from .nodestate import NodeStatePublisher
from .server import DEFAULT_PLUGIN_DIR, PluginServer, ServerOptions
from .sharing import KubePendingPods, PendingPods, SharedDevices

log = logging.getLogger("gpuk8s.deviceplugin")

RESOURCE_RE = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+"
    r"/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
SOCKET_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*\.sock$")


@dataclass(frozen=True)
class PluginConfig:
    """Everything the plugin needs, validated (see ``from_args``)."""

    host_root: str = "/"
    plugin_dir: str = DEFAULT_PLUGIN_DIR
    resource_name: str = ""  # "": by backend (metax-tech.com/gpu, nvidia.com/gpu)
    socket_name: str = ""  # "": derived from the resource name
    healthy_interval: float = 5.0
    removal_poll: float = 0.5
    watch_interval: float = 0.5
    register_timeout: float = 5.0
    retry_initial: float = 0.5
    retry_max: float = 30.0
    allocate: AllocateOptions = field(default_factory=AllocateOptions)
    pod_resources_socket: str = DEFAULT_POD_RESOURCES_SOCKET
    node_name: str = ""  # "": node annotations are not published
    kubeconfig: str = ""  # "": in-cluster configuration
    node_state_interval: float = 10.0
    metrics_port: int = 0  # 0: no metrics endpoint
    metrics_address: str = "0.0.0.0"
    health_port: int = 0  # 0: no /healthz, /readyz
    sharing_mode: str = MODE_EXCLUSIVE  # core.sharing: sgpu/vcuda/mps serve replica ids

    def __post_init__(self) -> None:
        if self.healthy_interval < 0:
            raise ConfigError(
                f"healthy-interval: {self.healthy_interval!r} must be ≥ 0 seconds (0 disables)"
            )
        for name in (
            "removal_poll",
            "watch_interval",
            "register_timeout",
            "retry_initial",
            "retry_max",
            "node_state_interval",
        ):
            if getattr(self, name) <= 0:
                flag = name.replace("_", "-")
                raise ConfigError(f"{flag}: must be a positive number of seconds")
        if self.resource_name and not RESOURCE_RE.match(self.resource_name):
            raise ConfigError(
                f"resource-name: {self.resource_name!r} is not a qualified extended resource "
                "name like metax-tech.com/gpu (domain/name)"
            )
        if self.socket_name and not SOCKET_RE.match(self.socket_name):
            raise ConfigError(
                f"socket-name: {self.socket_name!r} must be a plain file name ending in .sock"
            )
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"metrics-port: {self.metrics_port} is not in 0..65535")
        if not 0 <= self.health_port <= 65535:
            raise ConfigError(f"health-port: {self.health_port} is not in 0..65535")
        if self.sharing_mode not in SHARING_MODES:
            raise ConfigError(
                f"sharing-mode: {self.sharing_mode!r} is not one of {', '.join(SHARING_MODES)}"
            )
        if self.sharing_mode != MODE_EXCLUSIVE and not self.node_name:
            raise ConfigError(
                f"sharing-mode {self.sharing_mode}: needs --node-name (Allocate reads the "
                "GPU assignment from the pod)"
            )

    def resource_for(self, inventory: NodeInventory) -> str:
        if self.sharing_mode != MODE_EXCLUSIVE:
            return COUNTED_RESOURCE[self.sharing_mode]
        if self.resource_name:
            return self.resource_name
        return DEFAULT_RESOURCE.get(inventory.backend, DEFAULT_RESOURCE["metax"])

    def socket_for(self, resource: str) -> str:
        return self.socket_name or resource.replace("/", "-") + ".sock"


def build_parser() -> argparse.ArgumentParser:
    env = os.environ
    p = argparse.ArgumentParser(
        prog="gpuk8s serve device-plugin",
        description="Kubernetes device plugin for MetaX (and NVIDIA) GPUs.",
    )
    p.add_argument(
        "--host-root",
        default=env.get("HOST_ROOT", "/"),
        help="where the host's / is mounted (default /; /host in the DaemonSet)",
    )
    p.add_argument(
        "--plugin-dir",
        default=DEFAULT_PLUGIN_DIR,
        help=f"kubelet device plugin directory (default {DEFAULT_PLUGIN_DIR})",
    )
    p.add_argument(
        "--resource-name",
        default=env.get("RESOURCE_NAME", ""),
        help="extended resource (default metax-tech.com/gpu; nvidia.com/gpu on NVIDIA nodes)",
    )
    p.add_argument(
        "--socket-name",
        default="",
        help="socket file in the plugin dir (default <resource with / as ->.sock)",
    )
    p.add_argument(
        "--healthy-interval",
        type=float,
        default=float(env.get("HEALTHY_INTERVAL", "5")),
        help="seconds between health checks; 0 disables them (default 5)",
    )
    p.add_argument(
        "--removal-poll",
        type=float,
        default=0.5,
        help="seconds between cheap sysfs presence checks (default 0.5)",
    )
    p.add_argument(
        "--watch-interval",
        type=float,
        default=0.5,
        help="seconds between checks for a kubelet restart (default 0.5)",
    )
    p.add_argument(
        "--device-path-prefix",
        default=env.get("DEVICE_PATH_PREFIX", ""),
        help="prefix put before root-relative paths (/dev/dri/card1, /opt/maca) "
        "in Allocate host paths; empty on real nodes, the simulator root "
        "in the lab",
    )
    p.add_argument(
        "--visible-devices",
        default="auto",
        choices=VISIBLE_DEVICES_MODES,
        help="value of MACA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES: container "
        "indices 0..k-1, host indices, uuids, or none (auto: container for "
        "MetaX, uuid for NVIDIA)",
    )
    p.add_argument(
        "--mount-sdk",
        action="store_true",
        default=env.get("MOUNT_SDK", "") in ("1", "true"),
        help="operator scheme: mount the SDK and driver paths read-only",
    )
    p.add_argument(
        "--sdk-path",
        action="append",
        default=None,
        help="path to mount with --mount-sdk (repeatable; default /opt/maca and /opt/mxdriver)",
    )
    p.add_argument(
        "--cdi",
        nargs="?",
        const="on",
        default={"1": "on", "true": "on"}.get(env.get("CDI", ""), env.get("CDI") or "off"),
        choices=("off", "on", "auto"),
        help="answer Allocate with CDI device names: on, off (device nodes + mounts + env), "
        "auto (only where the node's kubelet and container runtime accept them, read from "
        "its Node status.nodeInfo; needs --node-name)",
    )
    p.add_argument(
        "--cdi-annotation",
        action="store_true",
        default=env.get("CDI_ANNOTATION", "") in ("1", "true"),
        help="without CDI names: also set annotation cdi.k8s.io/gpuk8s to the container's CDI "
        "device names, for the operator scheme's runtime wrapper (SDK injection)",
    )
    p.add_argument(
        "--cdi-kind",
        default="",
        help="CDI kind for --cdi (default: the resource name, metax-tech.com/gpu)",
    )
    p.add_argument(
        "--pod-resources-socket",
        default=DEFAULT_POD_RESOURCES_SOCKET,
        help=f"kubelet PodResources socket (default {DEFAULT_POD_RESOURCES_SOCKET})",
    )
    p.add_argument(
        "--node-name",
        default=env.get("NODE_NAME", ""),
        help="this node (default $NODE_NAME); empty: no node annotations",
    )
    add_kubeconfig_argument(p, used_for="the node patches")
    p.add_argument(
        "--node-state-interval",
        type=float,
        default=10.0,
        help="seconds between allocation reads / annotation syncs (default 10)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=int(env.get("METRICS_PORT", "0")),
        help="Prometheus /metrics port; 0 disables (default 0)",
    )
    p.add_argument("--metrics-address", default="0.0.0.0")
    add_health_port_argument(p, serves="GET /healthz (liveness: the health loop and the gRPC "
                             "server run) and /readyz (registered with the kubelet)")
    p.add_argument(
        "--sharing-mode",
        default=env.get("SHARING_MODE", MODE_EXCLUSIVE),
        help="GPU sharing mode of this node: exclusive (whole GPUs, default), sgpu, vcuda or "
        "mps (serve that mode's counted resource as replica ids; Allocate maps them to the "
        "GPUs gpu-aware wrote on the pod), or auto: read at start from the node's "
        "gpuk8s.io/sharing-mode label (needs --node-name; a new mode needs a restart)",
    )
    add_log_arguments(p)
    return p


def config_from_args(args: argparse.Namespace) -> PluginConfig:
    return PluginConfig(
        host_root=args.host_root,
        plugin_dir=args.plugin_dir,
        resource_name=args.resource_name,
        socket_name=args.socket_name,
        healthy_interval=args.healthy_interval,
        removal_poll=args.removal_poll,
        watch_interval=args.watch_interval,
        allocate=AllocateOptions(
            device_path_prefix=args.device_path_prefix,
            visible_devices=args.visible_devices,
            mount_sdk=args.mount_sdk,
            sdk_paths=tuple(args.sdk_path) if args.sdk_path else None,
            cdi=args.cdi == "on",
            cdi_kind=args.cdi_kind,
            cdi_annotation=args.cdi_annotation,
        ),
        pod_resources_socket=args.pod_resources_socket,
        node_name=args.node_name,
        kubeconfig=args.kubeconfig or "",
        node_state_interval=args.node_state_interval,
        metrics_port=args.metrics_port,
        metrics_address=args.metrics_address,
        health_port=args.health_port,
        sharing_mode=MODE_EXCLUSIVE if args.sharing_mode == "auto" else args.sharing_mode,
    )


def resolve_sharing(config: PluginConfig, labels: Mapping[str, str] | None = None) -> PluginConfig:
    """``--sharing-mode auto``: the mode from the node's ``gpuk8s.io/sharing-mode`` label."""
    if labels is None:
        if not config.node_name:
            raise ConfigError("needs --node-name (NODE_NAME) to read the node's sharing mode")
        from kubernetes import client

        from ..kube import api_client, classify

        try:
            node = client.CoreV1Api(api_client(config.kubeconfig or None)).read_node(
                config.node_name
            )
        except Exception as err:
            raise classify(err, f"read node {config.node_name}") from err
        labels = (node.metadata.labels if node.metadata is not None else None) or {}
    mode = check_mode(labels.get(SHARING_MODE_LABEL))
    log.info("GPU sharing mode", extra={"mode": mode, "label": SHARING_MODE_LABEL})
    return replace(config, sharing_mode=mode)


def resolve_cdi(config: PluginConfig, node: Mapping[str, Any] | None = None) -> PluginConfig:
    """``--cdi auto``: CDI names only where the node's kubelet and runtime accept them."""
    if node is None:
        if not config.node_name:
            raise ConfigError("needs --node-name (NODE_NAME) to read the node's versions")
        from kubernetes import client

        from ..kube import api_client, classify

        api = api_client(config.kubeconfig or None)
        try:
            node = api.sanitize_for_serialization(
                client.CoreV1Api(api).read_node(config.node_name))
        except Exception as err:
            raise classify(err, f"read node {config.node_name}") from err
    info = ((node or {}).get("status") or {}).get("nodeInfo") or {}
    accepted, why = cdi_names_accepted(str(info.get("kubeletVersion", "")),
                                       str(info.get("containerRuntimeVersion", "")))
    log.info("CDI device names " + ("used" if accepted else "not used"), extra={"why": why})
    return replace(config, allocate=replace(config.allocate, cdi=accepted))


class DevicePluginApp:
    """The assembled plugin: devices, health loop, gRPC server, node state, metrics."""

    def __init__(
        self,
        config: PluginConfig,
        inventory: NodeInventory,
        *,
        patcher: NodePatcher | None = None,
        health_check: HealthCheck | None = None,
        pending_pods: PendingPods | None = None,
    ) -> None:
        self.config = config
        self.inventory = inventory
        resource = config.resource_for(inventory)
        self.metrics = PluginMetrics(resource)
        whole = DEFAULT_RESOURCE.get(inventory.backend, DEFAULT_RESOURCE["metax"])
        self.devices = DeviceSet(
            inventory,
            resource if config.sharing_mode == MODE_EXCLUSIVE else whole,
            config.allocate,
        )
        self.shared: SharedDevices | None = None
        if config.sharing_mode != MODE_EXCLUSIVE:
            if pending_pods is None:
                from ..kube import api_client

                pending_pods = KubePendingPods(
                    config.node_name, api_client(config.kubeconfig or None)
                )
            self.shared = SharedDevices(
                self.devices, config.sharing_mode, config.node_name, pending_pods
            )
        self.publisher: NodeStatePublisher | None = None
        if config.node_name:
            if patcher is None:
                patcher = KubernetesNodePatcher(config.kubeconfig or None)
            self.publisher = NodeStatePublisher(
                self.devices,
                config.node_name,
                patcher,
                PodResourcesClient(config.pod_resources_socket).allocated,
                self.metrics,
                config.node_state_interval,
            )
        kwargs = {} if health_check is None else {"check": health_check}
        self.health = HealthMonitor(
            self.devices,
            config.host_root,
            config.healthy_interval,
            self.metrics,
            removal_poll=config.removal_poll,
            on_change=self._health_changed,
            **kwargs,
        )
        self.server = PluginServer(
            self._make_servicer,
            ServerOptions(
                plugin_dir=config.plugin_dir,
                socket_name=config.socket_for(resource),
                resource_name=resource,
                watch_interval=config.watch_interval,
                register_timeout=config.register_timeout,
                retry_initial=config.retry_initial,
                retry_max=config.retry_max,
            ),
            self.metrics,
            wake_watchers=self.devices.wake,
        )
        self._server_thread: threading.Thread | None = None
        self._health_server: ThreadingHTTPServer | None = None

    def liveness(self) -> tuple[bool, dict[str, Any]]:
        """/healthz: the gRPC server loop and the health loop are running."""
        running = self._server_thread is not None and self._server_thread.is_alive()
        return liveness(self.health, {"plugin server loop not running": running})

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """/readyz: registered with the kubelet (serving the resource)."""
        registered = self.server.registered.is_set()
        return registered, {"registered": registered,
                            "registrations": self.server.registrations}

    def _make_servicer(self, serving_stop: threading.Event) -> DevicePluginServicer:
        return DevicePluginServicer(
            self.shared or self.devices, self.metrics, serving_stop, on_allocate=self._allocated
        )

    def _allocated(self, ids: list[str]) -> None:
        if self.publisher is not None:
            # the kubelet lists the pod's devices once its containers are created
            self.publisher.nudge(1.0)

    def _health_changed(self, ids: list[str]) -> None:
        if self.publisher is not None:
            self.publisher.nudge()

    def start(self) -> None:
        if self.config.metrics_port:
            self.metrics.serve(self.config.metrics_port, self.config.metrics_address)
        if self.config.health_port:
            self._health_server = serve_health(
                self.config.health_port,
                {"/healthz": self.liveness, "/readyz": self.readiness},
                name="deviceplugin-health",
            )
        self.health.start()
        if self.publisher is not None:
            self.publisher.start()
        self._server_thread = threading.Thread(target=self.server.run, name="plugin", daemon=True)
        self._server_thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self.server.stop()
        self.health.stop()
        if self.publisher is not None:
            self.publisher.stop()
        if self._server_thread is not None:
            self._server_thread.join(timeout)
        if self._health_server is not None:
            self._health_server.shutdown()
            self._health_server.server_close()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        configure_logging(LogOptions.from_args(args), component="gpu-device")
        config = config_from_args(args)
    except ConfigError as err:
        print(f"gpuk8s serve device-plugin: error: {err}", file=sys.stderr)
        return 2
    if args.cdi == "auto":
        try:
            config = resolve_cdi(config)
        except GpuK8sError as err:
            print(f"gpuk8s serve device-plugin: error: --cdi auto: {err}", file=sys.stderr)
            return 2
    if args.sharing_mode == "auto":
        try:
            config = resolve_sharing(config)
        except GpuK8sError as err:
            print(f"gpuk8s serve device-plugin: error: --sharing-mode auto: {err}",
                  file=sys.stderr)
            return 2
    from ...discovery import discover

    inventory = discover(config.host_root)
    for problem in inventory.problems:
        log.warning("discovery problem", extra={"problem": problem})
    try:
        app = DevicePluginApp(config, inventory)
    except GpuK8sError as err:
        log.error("cannot start", extra={"error": str(err)})
        return 2
    log.info(
        "starting",
        extra={
            "resource": app.devices.resource_name,
            "devices": len(app.devices),
            "backend": inventory.backend,
            "host_root": config.host_root,
            "plugin_dir": config.plugin_dir,
            "healthy_interval": config.healthy_interval,
        },
    )
    if not len(app.devices):
        log.warning("no GPU found: advertising 0 devices")
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("signal received, shutting down", extra={"signal": signal.Signals(signum).name})
        stop.set()

    def on_hup(signum: int, frame: FrameType | None) -> None:
        log.info("SIGHUP: serving and registering again")
        app.server.request_restart()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGHUP, on_hup)
    app.start()
    while not stop.wait(1.0):
        pass
    app.stop()
    log.info("stopped")
    return 0
