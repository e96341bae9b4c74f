"""`gpuk8s serve exporter`: gpu-exporter, the per-node GPU metrics DaemonSet.

Samples the node's GPUs every ``--interval`` seconds (mx-smi on MetaX nodes, NVML on
NVIDIA nodes, nvidia-smi when NVML cannot be loaded), attributes the load to the
containers holding each GPU (kubelet PodResources API + each GPU process's cgroup +
the node's pods from the API server) and serves the last sample on ``/metrics``;
``/healthz`` is the liveness endpoint. Flags: ``--help`` and docs/exporter.md.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

from ...core.errors import ConfigError, GpuK8sError
from ...core.gpuusage import DEFAULT_RESOURCE_KINDS, KINDS
from ...core.model import NodeInventory
from ...core.telemetry import NodeTelemetry
from ..flags import add_kubeconfig_argument, add_log_arguments
from ..logging_setup import LogOptions, configure_logging
from ..node.podresources import DEFAULT_POD_RESOURCES_SOCKET, PodResourcesClient
from .knowngpus import STATE_DIR, STATE_NAME, KnownGpus
from .metrics import registry_for
from .nvml import NvmlReader
from .pods import PodDirectory, kubernetes_lister
from .sampler import Sampler
from .server import ExporterHTTPServer, serve_in_thread

log = logging.getLogger("gpuk8s.exporter")

DEFAULT_PORT = 9400
BACKENDS = ("auto", "mx-smi", "nvml", "nvidia-smi")


def build_parser() -> argparse.ArgumentParser:
    env = os.environ
    p = argparse.ArgumentParser(prog="gpuk8s serve exporter",
                                description="gpu-exporter: GPU metrics for Prometheus")
    p.add_argument("--host-root", default=env.get("HOST_ROOT", "/"),
                   help="where the host's / is mounted (default /; /host in the DaemonSet)")
    p.add_argument("--proc-dir", default=env.get("PROC_DIR", ""),
                   help="the host's /proc (PID -> container); default <host-root>/proc")
    p.add_argument("--port", type=int, default=int(env.get("METRICS_PORT", DEFAULT_PORT)),
                   help=f"listen port (default {DEFAULT_PORT})")
    p.add_argument("--address", default="0.0.0.0", help="listen address (default all)")
    p.add_argument("--interval", type=float, default=float(env.get("SAMPLE_INTERVAL", "10")),
                   help="seconds between samples (default 10)")
    p.add_argument("--backend", default="auto", choices=BACKENDS,
                   help="where the load comes from (auto: mx-smi on MetaX, NVML on NVIDIA "
                   "with nvidia-smi as fallback)")
    p.add_argument("--node-name", default=env.get("NODE_NAME", ""),
                   help="this node (default $NODE_NAME): the node label, and the pods to "
                   "attribute GPU processes to; empty: no per-process attribution")
    add_kubeconfig_argument(p, used_for="listing the node's pods")
    p.add_argument("--pod-resources-socket", default=DEFAULT_POD_RESOURCES_SOCKET,
                   help=f"kubelet PodResources socket (default {DEFAULT_POD_RESOURCES_SOCKET}); "
                   "'' disables per-container metrics")
    p.add_argument("--resource-kind", action="append", default=[], metavar="RESOURCE=KIND",
                   help="GPU kind of an extended resource, KIND one of " + ", ".join(KINDS)
                   + " (repeatable; adds to the built-in table)")
    p.add_argument("--max-container-series", type=int, default=1024,
                   help="at most this many (container, GPU) pairs are exported (default 1024)")
    p.add_argument("--rediscover", type=float, default=60.0,
                   help="seconds between GPU inventory refreshes (default 60)")
    p.add_argument("--state-file", default=None,
                   help="the book of known GPUs (stable gpu labels, lost GPUs), kept where a "
                   "restarted exporter finds it (default <host-root>"
                   f"{STATE_DIR}/{STATE_NAME}; the chart mounts {STATE_DIR} of the host); "
                   "'' keeps it in memory only")
    add_log_arguments(p)
    return p


def resource_kinds(items: Sequence[str]) -> dict[str, str]:
    kinds = dict(DEFAULT_RESOURCE_KINDS)
    for item in items:
        name, sep, kind = item.partition("=")
        if not sep or "/" not in name or kind not in KINDS:
            raise ConfigError(f"--resource-kind: {item!r} must be RESOURCE=KIND with a "
                              f"domain/name resource and KIND one of {', '.join(KINDS)}")
        kinds[name] = kind
    return kinds


def validate(args: argparse.Namespace) -> None:
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port: {args.port} is not in 0..65535")
    if not args.interval > 0:
        raise ConfigError(f"--interval: {args.interval} must be a positive number of seconds")
    if not args.rediscover > 0:
        raise ConfigError(f"--rediscover: {args.rediscover} must be positive")
    if args.max_container_series < 0:
        raise ConfigError("--max-container-series: must be >= 0")
    if not os.path.isdir(args.host_root):
        raise ConfigError(f"--host-root: {args.host_root!r} is not a directory")


def telemetry_source(backend: str, root: str,
                     inventory: NodeInventory | None = None) -> Any:
    """A callable returning ``NodeTelemetry`` for the chosen backend."""
    from ...discovery import telemetry as tool_telemetry

    if backend == "mx-smi":
        return lambda: tool_telemetry(root, "metax")
    if backend == "nvidia-smi":
        return lambda: tool_telemetry(root, "nvidia")
    if backend == "nvml":
        return NvmlReader(root).read
    vendor = inventory.backend if inventory is not None else "none"
    if vendor == "metax":
        return lambda: tool_telemetry(root, "metax")
    if vendor == "nvidia":
        reader = NvmlReader(root)

        def nvml_or_smi() -> NodeTelemetry:
            got = reader.read()
            if got.gpus:
                return got
            fallback = tool_telemetry(root, "nvidia")
            return NodeTelemetry(fallback.backend, fallback.source, fallback.gpus,
                                 fallback.processes, fallback.driver_version,
                                 (*got.problems, *fallback.problems))
        return nvml_or_smi
    return lambda: NodeTelemetry(vendor, "")


def build_sampler(args: argparse.Namespace, *, pods: PodDirectory | None = None) -> Sampler:
    from ...discovery import check_health, discover, sysfs

    root = args.host_root
    first = discover(root)  # its problems: the first sample's ("discovery")
    cached = {"inventory": first}

    def inventory() -> NodeInventory:
        if cached:
            return cached.pop("inventory")
        return discover(root)

    holdings = None
    if args.pod_resources_socket:
        holdings = PodResourcesClient(args.pod_resources_socket).assignments
    if pods is None and args.node_name:
        pods = PodDirectory(kubernetes_lister(args.node_name, args.kubeconfig or None))
    proc_dir = args.proc_dir or os.path.join(root, "proc")
    state_file = args.state_file
    if state_file is None:
        state_file = os.path.join(root, STATE_DIR.lstrip("/"), STATE_NAME)
    return Sampler(
        inventory=inventory,
        telemetry=telemetry_source(args.backend, root, first),
        health=lambda inv: check_health(root, inv),
        holdings=holdings,
        pods=pods,
        proc_dir=proc_dir,
        interval=args.interval,
        rediscover=args.rediscover,
        resource_kinds=resource_kinds(args.resource_kind),
        max_containers=args.max_container_series,
        known=KnownGpus(state_file),
        on_bus=lambda gpu: sysfs.device_present(root, gpu.pci_address),
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        configure_logging(LogOptions.from_args(args), component="gpu-exporter")
        validate(args)
        resource_kinds(args.resource_kind)
        sampler = build_sampler(args)
        registry = registry_for(sampler, args.node_name)
        try:
            server = ExporterHTTPServer((args.address, args.port), registry, sampler,
                                        stale_after=max(3 * args.interval, 30.0))
        except OSError as err:
            raise ConfigError(f"--port: cannot listen on {args.address}:{args.port}: {err}") \
                from err
    except GpuK8sError as err:
        print(f"gpuk8s serve exporter: error: {err}", file=sys.stderr)
        return 2
    done = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: done.set())
                for sig in (signal.SIGTERM, signal.SIGINT)}
    sampler.start()
    serve_in_thread(server)
    log.info("gpu-exporter listening", extra={
        "address": args.address, "port": server.port, "interval": args.interval,
        "host_root": args.host_root, "node": args.node_name, "backend": args.backend})
    try:
        while not done.wait(0.5):
            pass
    finally:
        server.shutdown()
        server.server_close()
        sampler.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    log.info("gpu-exporter stopped")
    return 0
