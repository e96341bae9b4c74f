"""`gpuk8s serve mps`: one NVIDIA MPS control daemon per GPU while the node's sharing
mode is ``mps``.

    gpuk8s serve mps --node-name NODE --host-root /host [--mps-dir /run/gpuk8s/mps]
        [--active-thread-percentage N] [--interval 10] [--health-port 8083]
        [--sharing-mode auto|exclusive|sgpu|vcuda|mps] [--once]

Every pass reads the node's label ``gpuk8s.io/sharing-mode`` (``--sharing-mode auto``;
a fixed mode needs no API server), discovers the GPUs under the host root and
reconciles the daemons (``host/mps.py``): started when missing, restarted when they
died, adopted when a previous agent started them, stopped (``quit``) when the mode is
no longer ``mps`` or the GPU is gone. ``/healthz`` fails when no pass ran for a while;
``/readyz`` is ready when the last pass left every wanted daemon running.

Exit codes: 0 stopped (``--once``: every wanted daemon runs), 1 ``--once`` with
failures, 2 bad configuration.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

from ...core.cuda import CudaVersion
from ...core.errors import ConfigError, GpuK8sError
from ...core.sharing import SHARING_MODES
from ...discovery import discover
from ...host.mps import (
    MPS_DIR,
    MpsDaemons,
    MpsSettings,
    PassResult,
    sharing_mode,
)
from ..flags import add_health_port_argument, add_kubeconfig_argument, add_log_arguments
from ..healthserver import serve_health
from ..kube import api_client
from ..logging_setup import LogOptions, configure_logging
from ..nodeagent import KubeNodeApi, Liveness, NodeApi, run_passes

log = logging.getLogger("gpuk8s.mps")

MIN_DRIVER_CUDA = CudaVersion(11, 5)  # SPEC §13: MPS needs a driver supporting CUDA >= 11.5


class MpsAgent:
    """One pass = read the mode, discover the GPUs, reconcile the daemons."""

    def __init__(self, daemons: MpsDaemons, api: NodeApi | None, fixed_mode: str | None
                 ) -> None:
        self.daemons = daemons
        self.api = api
        self.fixed_mode = fixed_mode
        self.last: PassResult | None = None
        self.last_mode = ""

    def mode(self) -> str:
        if self.fixed_mode is not None:
            return self.fixed_mode
        assert self.api is not None
        labels = (self.api.node().get("metadata") or {}).get("labels") or {}
        mode, problem = sharing_mode(labels)
        if problem:
            log.warning(problem)
        return mode

    def one_pass(self) -> PassResult:
        mode = self.mode()  # an API error fails the pass: daemons stay as they are
        wanted: list[str] = []
        refused: dict[str, str] = {}
        if mode == "mps":
            inventory = discover(self.daemons.settings.host_root)
            if inventory.backend != "nvidia":
                log.warning("sharing mode mps needs NVIDIA GPUs; none found",
                            extra={"backend": inventory.backend})
            wanted = [g.uuid for g in inventory.gpus if g.uuid and not g.fault]
            cuda = inventory.driver.cuda
            if cuda is not None and cuda < MIN_DRIVER_CUDA:  # SPEC §13
                why = (f"MPS needs a driver supporting CUDA >= {MIN_DRIVER_CUDA}; this one "
                       f"supports {cuda}: no daemon started")
                refused, wanted = dict.fromkeys(wanted, why), []
        result = self.daemons.reconcile(wanted)
        result.failed.update(refused)
        changed = result.started or result.restarted or result.stopped or result.adopted
        if changed or result.failed or mode != self.last_mode:
            level = logging.WARNING if result.failed else logging.INFO
            log.log(level, "mps daemons reconciled", extra={"mode": mode, **result.summary()})
        self.last, self.last_mode = result, mode
        return result

    def at_exit(self) -> PassResult | None:
        """Quit the daemons when the node is no longer in mode ``mps`` (the DaemonSet's
        pod is being removed with the label); otherwise (an upgrade, a restart) leave
        them: clients keep working and the next agent adopts them."""
        if self.mode() == "mps":
            return None
        result = self.daemons.reconcile([])
        log.info("not in mode mps any more: daemons quit", extra=result.summary())
        return result

    def ready(self) -> tuple[bool, dict[str, Any]]:
        result = self.last
        if result is None:
            return False, {"reason": "no pass yet"}
        body = {"mode": self.last_mode, "daemons": result.running, "failed": result.failed}
        return not result.failed, body


def build_parser() -> argparse.ArgumentParser:
    env = os.environ
    p = argparse.ArgumentParser(
        prog="gpuk8s serve mps",
        description="keep one NVIDIA MPS control daemon per GPU while the node's "
        "gpuk8s.io/sharing-mode label is mps; stop them when it is not",
    )
    p.add_argument("--node-name", default=env.get("NODE_NAME", ""))
    p.add_argument("--host-root", default="/host", help="the host tree (GPUs, the MPS tool)")
    p.add_argument("--mps-dir", default=MPS_DIR,
                   help="per-GPU pipe and log directories (<dir>/<GPU UUID>/pipe|log)")
    p.add_argument("--active-thread-percentage", type=int, default=None,
                   help="default compute share of MPS clients, 1..100 (default: MPS's 100)")
    p.add_argument("--sharing-mode", default="auto", choices=("auto", *SHARING_MODES),
                   help="auto: from the node label; a fixed mode needs no API server")
    p.add_argument("--interval", type=float, default=10.0)
    add_health_port_argument(p, serves="GET /healthz, /readyz")
    add_kubeconfig_argument(p, used_for="the node's sharing label and reports")
    p.add_argument("--namespace", default=env.get("POD_NAMESPACE", ""))
    p.add_argument("--once", action="store_true", help="one pass, print it, exit")
    add_log_arguments(p)
    return p


def _validate(args: argparse.Namespace) -> None:
    if not os.path.isdir(args.host_root):
        raise ConfigError(f"--host-root: {args.host_root!r} is not a directory")
    if args.sharing_mode == "auto" and not args.node_name:
        raise ConfigError("--node-name: required (or set NODE_NAME) with --sharing-mode auto")
    if not args.interval > 0:
        raise ConfigError(f"--interval: {args.interval} must be positive")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        configure_logging(LogOptions.from_args(args), component="gpu-mps")
        _validate(args)
        settings = MpsSettings(host_root=args.host_root, mps_dir=args.mps_dir,
                               active_thread_percentage=args.active_thread_percentage)
        api = None
        if args.sharing_mode == "auto":
            api = KubeNodeApi(api_client(args.kubeconfig), args.node_name, "gpu-mps",
                              args.namespace)
        fixed = None if args.sharing_mode == "auto" else args.sharing_mode
        agent = MpsAgent(MpsDaemons(settings), api, fixed)
    except GpuK8sError as err:
        print(f"gpuk8s serve mps: error: {err}", file=sys.stderr)
        return 2
    if args.once:
        result = agent.one_pass()
        print(json.dumps({"mode": agent.last_mode, **result.summary(),
                          "daemons": result.running}, sort_keys=True))
        return 1 if result.failed else 0
    liveness = Liveness(max(120.0, 10 * args.interval))
    if args.health_port:
        serve_health(args.health_port, {"/healthz": liveness.status, "/readyz": agent.ready},
                     name="gpu-mps-health")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    log.info("starting", extra={"node": args.node_name, "mode": args.sharing_mode,
                                "mpsDir": args.mps_dir})
    run_passes(agent.one_pass, args.interval, stop, liveness)
    try:
        agent.at_exit()
    except Exception as err:  # the API may be gone already: nothing else to do
        log.warning("cannot check the mode at exit", extra={"error": str(err)})
    log.info("stopped")
    return 0
