"""`gpuk8s serve container-runtime`: SDK and device injection on this node.

    gpuk8s serve container-runtime --host-root /host --system-root /host-system \\
        [--containerd-config /etc/containerd/config.toml] [--restart-mode signal] ...

See ``agent.py``. Exit codes: 0 stopped (or ``--once`` ready), 1 ``--once`` not ready,
2 bad configuration.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from ...core.errors import ConfigError, GpuK8sError
from ...host.readiness import STATUS_DIR
from ..flags import add_health_port_argument, add_kubeconfig_argument, add_log_arguments
from ..kube import api_client
from ..logging_setup import LogOptions, configure_logging
from ..nodeagent import (
    KubeNodeApi,
    Reporter,
    serve_until_stopped,
    uninstalling,
)
from .agent import RuntimeAgent, RuntimeSettings
from .containerd import RESTART_MODES

log = logging.getLogger("gpuk8s.container-runtime")


def _bool(value: str) -> bool:
    if value.lower() in ("true", "1", "yes"):
        return True
    if value.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"{value!r}: use true or false")


def build_parser() -> argparse.ArgumentParser:
    env = os.environ
    p = argparse.ArgumentParser(
        prog="gpuk8s serve container-runtime",
        description="container-runtime: write this node's CDI spec (GPU devices, the host "
        "SDK read-only, its environment) and, where the container runtime has no CDI, install "
        "the OCI runtime wrapper as a containerd runtime handler",
    )
    p.add_argument("--node-name", default=env.get("NODE_NAME", ""))
    p.add_argument("--namespace", default=env.get("POD_NAMESPACE", ""))
    p.add_argument("--host-root", default="/host", help="the GPU host tree (discovery)")
    p.add_argument("--system-root", default="/host-system",
                   help="where the node's real / is mounted (runtime config, wrapper, CDI dir)")
    p.add_argument("--device-path-prefix", default="",
                   help="prefix of the spec's host paths (the simulator root in the lab)")
    p.add_argument("--cdi-dir", default="/etc/cdi", help="CDI spec directory on the node")
    p.add_argument("--cdi-kind", default="", help="CDI kind (default metax-tech.com/gpu)")
    p.add_argument("--runtime", default="auto",
                   choices=("auto", "containerd", "docker", "cdi", "none"),
                   help="auto: from the Node's containerRuntimeVersion; cdi/none: spec only")
    p.add_argument("--containerd-config", default="/etc/containerd/config.toml")
    p.add_argument("--containerd-socket", default="/run/containerd/containerd.sock")
    p.add_argument("--docker-config", default="",
                   help="dockerd's daemon.json on docker nodes, e.g. /etc/docker/daemon.json "
                   "(empty: docker nodes are reported failed, not configured)")
    p.add_argument("--docker-socket", default="/var/run/docker.sock")
    p.add_argument("--restart-mode", default="signal", choices=RESTART_MODES,
                   help="how the runtime picks up its changed config: containerd restarts, "
                   "dockerd reloads (default signal: SIGHUP)")
    p.add_argument("--handler", default="metax", help="runtime handler / RuntimeClass name")
    p.add_argument("--set-as-default", type=_bool, default=True,
                   help="make the handler containerd's default runtime (default true)")
    p.add_argument("--install-dir", default="/usr/local/gpuk8s",
                   help="where the wrapper goes on the node")
    p.add_argument("--host-python", default="/usr/bin/python3",
                   help="python3 (>= 3.8) on the node that runs the wrapper")
    p.add_argument("--status-dir", default=STATUS_DIR)
    p.add_argument("--interval", type=float, default=5.0)
    add_health_port_argument(p, serves="GET /healthz, /livez")
    add_kubeconfig_argument(p, used_for="the node's runtime version and reports")
    p.add_argument("--no-api", action="store_true",
                   help="do not talk to the API server (needs --runtime other than auto)")
    p.add_argument("--once", action="store_true", help="one pass, then exit")
    p.add_argument("--uninstall", action="store_true",
                   help="remove the spec, the handler, the wrapper and the marker, then exit")
    add_log_arguments(p)
    return p


def _validate(args: argparse.Namespace) -> None:
    for flag in ("host_root", "system_root"):
        if not os.path.isdir(getattr(args, flag)):
            raise ConfigError(f"--{flag.replace('_', '-')}: {getattr(args, flag)!r} is not a "
                              "directory")
    if not args.no_api and not args.node_name:
        raise ConfigError("--node-name: required (or set NODE_NAME), unless --no-api")
    if args.no_api and args.runtime == "auto":
        raise ConfigError("--runtime auto reads the Node's runtime version: it needs the API "
                          "(choose containerd, cdi or none with --no-api)")
    for flag in ("cdi_dir", "containerd_config", "docker_config", "install_dir", "host_python"):
        if not str(getattr(args, flag)).startswith("/") and (flag, getattr(args, flag)) != (
                "docker_config", ""):
            raise ConfigError(f"--{flag.replace('_', '-')} must be an absolute path")
    if not args.interval > 0:
        raise ConfigError(f"--interval: {args.interval} must be positive")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        configure_logging(LogOptions.from_args(args), component="container-runtime")
        _validate(args)
        api = None
        runtime_version = ""
        if not args.no_api:
            api = KubeNodeApi(api_client(args.kubeconfig), args.node_name, "container-runtime",
                              args.namespace)
            info = (api.node().get("status") or {}).get("nodeInfo") or {}
            runtime_version = str(info.get("containerRuntimeVersion", ""))
        settings = RuntimeSettings(
            host_root=args.host_root, system_root=args.system_root,
            device_path_prefix=args.device_path_prefix.rstrip("/"), cdi_dir=args.cdi_dir,
            cdi_kind=args.cdi_kind, runtime=args.runtime, runtime_version=runtime_version,
            containerd_config=args.containerd_config, containerd_socket=args.containerd_socket,
            docker_config=args.docker_config, docker_socket=args.docker_socket,
            restart_mode=args.restart_mode, handler=args.handler,
            set_default=args.set_as_default, install_dir=args.install_dir.rstrip("/"),
            host_python=args.host_python, status_dir=args.status_dir,
        )
        agent = RuntimeAgent(settings, Reporter(api, "container-runtime", "Runtime"))
    except GpuK8sError as err:
        print(f"gpuk8s serve container-runtime: error: {err}", file=sys.stderr)
        return 2
    if args.uninstall:
        for line in agent.uninstall():
            print(line)
        agent.reporter.clear()
        return 0
    if args.once:
        report = agent.one_pass()
        print(report.to_json())
        return 0 if report.state == "ready" else 1
    log.info("starting", extra={"node": args.node_name, "runtime": runtime_version,
                                "mode": agent.mode()})

    serve_until_stopped(agent.one_pass, args.interval, args.health_port, "container-runtime",
                        max(300.0, 10 * args.interval))
    if uninstalling(api):
        for line in agent.uninstall():
            log.info(line)
        agent.reporter.clear()
    log.info("stopped")
    return 0
