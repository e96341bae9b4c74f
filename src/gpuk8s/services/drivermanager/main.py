"""`gpuk8s serve driver-manager`: the operator's driver + SDK agent on one node.

    gpuk8s serve driver-manager --payload driver --deploy-policy IfNotPresent \\
        --driver-version 2.33.0.6 --payload-image REG/driver-image:2.33.0.6 [options]
    gpuk8s serve driver-manager --payload maca --payload-image REG/maca-c500:TAG ... [options]

One container per job (SPEC §5: containers ``driver`` and ``maca``). See ``agent.py`` for
what a pass does and the payload volume layout. Exit codes: 0 stopped by a signal (or
``--once`` and the node is ready), 1 ``--once`` and not ready, 2 bad configuration.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from ...core.errors import ConfigError, GpuK8sError
from ...core.payloads import parse_sdk_image
from ...discovery.tools import runner_for
from ...host import driver as drv
from ...host.readiness import STATUS_DIR, clear_readiness
from ..flags import add_health_port_argument, add_kubeconfig_argument, add_log_arguments
from ..kube import api_client
from ..logging_setup import LogOptions, configure_logging
from ..nodeagent import (
    KubeNodeApi,
    Reporter,
    serve_until_stopped,
    uninstalling,
)
from .agent import DriverAgent, MacaAgent, PayloadSource

log = logging.getLogger("gpuk8s.driver-manager")


def build_parser() -> argparse.ArgumentParser:
    env = os.environ
    p = argparse.ArgumentParser(
        prog="gpuk8s serve driver-manager",
        description="driver-manager: install the GPU driver (container driver) or the MXMACA "
        "SDK (container maca) on this node from payload images, apply its VF count",
    )
    p.add_argument("--payload", required=True, choices=("driver", "maca"),
                   help="which job this container does")
    p.add_argument("--node-name", default=env.get("NODE_NAME", ""),
                   help="this node (default $NODE_NAME)")
    p.add_argument("--namespace", default=env.get("POD_NAMESPACE", ""),
                   help="namespace of this pod and its Events (default $POD_NAMESPACE)")
    p.add_argument("--pod-name", default=env.get("POD_NAME", ""),
                   help="this pod, to read why a payload container has not delivered "
                   "(default $POD_NAME)")
    p.add_argument("--host-root", default="/host", help="where the host's / is mounted")
    p.add_argument("--status-dir", default=STATUS_DIR,
                   help="readiness markers under the host root (default /run/metax)")
    p.add_argument("--payload-dir", default="/payload",
                   help="the volume the payload containers copy their images into")
    p.add_argument("--payload-image", action="append", default=[],
                   help="payload image reference (driver: one; maca: repeatable)")
    p.add_argument("--deploy-policy", default="IfNotPresent", choices=drv.POLICIES,
                   help="driver: IfNotPresent (only where no driver is loaded), Always "
                   "(install / upgrade to --driver-version), Never")
    p.add_argument("--driver-version", default="",
                   help="driver: the wanted version (the payload image's tag)")
    p.add_argument("--module-name", default="metax", help="driver: kernel module")
    p.add_argument("--load-command", default="chroot {host_root} modprobe {module}",
                   help="driver: command that loads the module (placeholders {host_root}, "
                   "{module})")
    p.add_argument("--unload-command", default="chroot {host_root} modprobe -r {module}",
                   help="driver: command that unloads the module")
    p.add_argument("--depmod-command", default="chroot {host_root} depmod -a {kernel_release}",
                   help="driver: command that indexes the installed module for the running "
                   "kernel (placeholders {host_root}, {kernel_release}, {module})")
    p.add_argument("--vf-command", default="",
                   help="driver: program setting a GPU's VF count instead of writing "
                   "sriov_numvfs ({address}, {index}, {vfnum}, {host_root})")
    p.add_argument("--no-vfnum", action="store_true",
                   help="driver: do not manage VF counts")
    p.add_argument("--interval", type=float, default=10.0,
                   help="seconds between passes (default 10)")
    p.add_argument("--payload-grace", type=float, default=180.0,
                   help="seconds to wait for a payload copy before reporting failure")
    add_health_port_argument(p, serves="GET /healthz, /livez")
    add_kubeconfig_argument(p, used_for="the node's reports and VF counts")
    p.add_argument("--no-api", action="store_true",
                   help="do not talk to the API server (no reports, no vfnum); tests, Ansible")
    p.add_argument("--once", action="store_true", help="one pass, then exit")
    add_log_arguments(p)
    return p


def _validate(args: argparse.Namespace) -> None:
    if not os.path.isdir(args.host_root):
        raise ConfigError(f"--host-root: {args.host_root!r} is not a directory")
    if not args.no_api and not args.node_name:
        raise ConfigError("--node-name: required (or set NODE_NAME), unless --no-api")
    if not args.interval > 0:
        raise ConfigError(f"--interval: {args.interval} must be a positive number of seconds")
    if args.payload == "driver":
        if args.deploy_policy != "Never" and not args.driver_version:
            raise ConfigError(f"--driver-version: required with --deploy-policy "
                              f"{args.deploy_policy} (the driver payload image's tag)")
        drv.check_version("--driver-version", args.driver_version or None)
        if len(args.payload_image) > 1:
            raise ConfigError("--payload-image: the driver job takes one image")
    else:
        if not args.payload_image:
            raise ConfigError("--payload-image: the maca job needs at least one SDK image "
                              "(chart option maca.payload.images)")
        for ref in args.payload_image:
            parse_sdk_image(ref)


def build_agent(args: argparse.Namespace, api: KubeNodeApi | None) -> DriverAgent | MacaAgent:
    pod_status = None
    if api is not None and args.pod_name:
        pod_name = args.pod_name

        def pod_status() -> object:
            return api.pod_status(pod_name)

    if args.payload == "driver":
        reporter = Reporter(api, "driver-manager.driver", "Driver")
        request = drv.InstallRequest(
            policy=args.deploy_policy, version=args.driver_version or None,
            module=args.module_name, load_command=tuple(args.load_command.split()),
            unload_command=tuple(args.unload_command.split()),
            depmod_command=tuple(args.depmod_command.split()), owner="driver-manager",
        )
        payload = None
        if args.deploy_policy != "Never":
            image = args.payload_image[0] if args.payload_image else args.driver_version
            payload = PayloadSource(args.payload_dir, image, "driver-payload", pod_status)
        return DriverAgent(
            root=args.host_root, request=request, reporter=reporter,
            runner=runner_for(args.host_root), payload=payload,
            node=None if (api is None or args.no_vfnum) else api.node,
            gate=None if api is None else api.node,
            vf_command=tuple(args.vf_command.split()) or None,
            payload_grace=args.payload_grace,
        )
    reporter = Reporter(api, "driver-manager.maca", "Maca")
    return MacaAgent(
        root=args.host_root, images=args.payload_image, reporter=reporter,
        payload=PayloadSource(args.payload_dir, "", "", pod_status),
        status_dir=args.status_dir, payload_grace=args.payload_grace,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    component = f"driver-manager-{args.payload}"
    try:
        configure_logging(LogOptions.from_args(args), component="driver-manager")
        _validate(args)
        api = None
        if not args.no_api:
            api = KubeNodeApi(api_client(args.kubeconfig), args.node_name, component,
                              args.namespace)
        agent = build_agent(args, api)
    except GpuK8sError as err:
        print(f"gpuk8s serve driver-manager: error: {err}", file=sys.stderr)
        return 2
    if args.once:
        report = agent.one_pass()
        print(report.to_json())
        return 0 if report.state in ("ready", "disabled") else 1
    log.info("starting", extra={"job": args.payload, "node": args.node_name,
                                "policy": args.deploy_policy, "images": args.payload_image})

    serve_until_stopped(agent.one_pass, args.interval, args.health_port, component,
                        max(300.0, 10 * args.interval))
    if uninstalling(api):
        # helm uninstall: take back what this agent published (the driver and the SDK stay
        # on the host: running workloads use them; see docs/operator.md)
        if args.payload == "maca":
            clear_readiness(args.host_root, "maca.ready", args.status_dir)
        agent.reporter.clear()
        log.info("uninstall: readiness marker and state annotation removed")
    log.info("stopped")
    return 0
