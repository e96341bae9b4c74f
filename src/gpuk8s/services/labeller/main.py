"""`gpuk8s serve labeller`: keep this node's ``metax-tech.com/`` labels true.

    gpuk8s serve labeller --node-name N --host-root /host --interval 60
                          [--once] [--dry-run] [--json] [--kubeconfig PATH]
                          [--status-dir /run/metax] [--health-port 0] [log options]

Exit codes with ``--once``: 0 labels are (or, with ``--dry-run``, would be) correct,
1 the API server refused or could not be reached, 2 bad configuration.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from http.server import ThreadingHTTPServer
from typing import Any

from ...core.errors import ConfigError, GpuK8sError
from ...core.labels import owned_labels
from ..flags import add_health_port_argument, add_kubeconfig_argument, add_log_arguments
from ..healthserver import serve_health as serve_health_endpoint
from ..kube import ApiError, api_client
from ..logging_setup import LogOptions, configure_logging
from .loop import LabellerLoop, LoopStatus
from .reconcile import (
    DEFAULT_STATUS_DIR,
    Discover,
    KubeNodeLabelStore,
    NodeLabelStore,
    ReconcileResult,
    format_diff,
    host_fingerprint,
    node_labels,
    reconcile,
)

log = logging.getLogger("gpuk8s.labeller")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuk8s serve labeller",
        description="gpu-label: write this node's metax-tech.com/ labels (SPEC §4)",
    )
    parser.add_argument(
        "--node-name",
        default=os.environ.get("NODE_NAME", ""),
        help="Kubernetes name of this node (default: $NODE_NAME)",
    )
    parser.add_argument("--host-root", default="/host", help="where the host's / is mounted")
    parser.add_argument(
        "--status-dir",
        default=DEFAULT_STATUS_DIR,
        help="directory (under the host root) of the operator scheme's readiness files "
        "maca.ready / runtime.ready (default /run/metax)",
    )
    parser.add_argument(
        "--interval", type=float, default=60.0, help="seconds between passes (default 60)"
    )
    parser.add_argument(
        "--watch-interval",
        type=float,
        default=2.0,
        help="seconds between cheap checks of the host (readiness markers, driver module, "
        "PCI functions) that start a pass at once when something changed; 0: off (default 2)",
    )
    parser.add_argument(
        "--sharing",
        action="store_true",
        help="gpu-device serves the node in the mode of its gpuk8s.io/sharing-mode label "
        "(the chart's gpuDevice.sharing): GFD's sharing labels follow it (default: whole "
        "GPUs, sharing strategy none)",
    )
    parser.add_argument("--once", action="store_true", help="one pass, then exit")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the label diff, change nothing (implies --once)",
    )
    parser.add_argument("--json", action="store_true", help="with --once: print a JSON result")
    add_kubeconfig_argument(parser, used_for="the node's labels")
    add_health_port_argument(parser, serves="GET /healthz, /readyz")
    add_log_arguments(parser)
    return parser


def _validate(args: argparse.Namespace) -> None:
    if not args.node_name:
        raise ConfigError("--node-name: required (or set NODE_NAME, e.g. from spec.nodeName)")
    if not os.path.isdir(args.host_root):
        raise ConfigError(f"--host-root: {args.host_root!r} is not a directory")
    if not args.interval > 0:
        raise ConfigError(f"--interval: {args.interval} must be a positive number of seconds")
    if args.watch_interval < 0:
        raise ConfigError(f"--watch-interval: {args.watch_interval} must be >= 0 (0: off)")


def _result_json(result: ReconcileResult) -> str:
    return json.dumps(
        {
            "node": result.node,
            "changed": result.changed,
            "applied": result.applied,
            "changes": result.changes,
            "labels": result.wanted,
            "problems": list(result.problems),
        },
        sort_keys=True,
    )


def make_pass(
    store: NodeLabelStore,
    node: str,
    host_root: str,
    discover: Discover,
    status_dir: str = DEFAULT_STATUS_DIR,
    dry_run: bool = False,
    sharing: bool = False,
) -> Callable[[], ReconcileResult]:
    def one_pass() -> ReconcileResult:
        wanted, inventory = node_labels(host_root, discover, status_dir)
        return reconcile(store, node, lambda current: wanted(current, sharing),
                         dry_run=dry_run, problems=inventory.problems,
                         owned=owned_labels(inventory))

    return one_pass


def serve_health(port: int, status: LoopStatus, stale_after: float) -> ThreadingHTTPServer:
    """A liveness endpoint: 200 while the loop keeps attempting passes, else 503."""

    def alive() -> tuple[bool, dict[str, Any]]:
        with status.lock:
            age = time.monotonic() - status.last_attempt
            body: dict[str, Any] = {"passes": status.passes, "lastError": status.last_error}
        if age > stale_after:
            body["reason"] = f"no pass attempted for {age:.0f}s"
        return age <= stale_after, body

    def ready() -> tuple[bool, dict[str, Any]]:
        with status.lock:
            done = status.last_success is not None
        return done, {} if done else {"reason": "no label pass has succeeded yet"}

    return serve_health_endpoint(port, {"/healthz": alive, "/readyz": ready},
                                 name="labeller-health")


def watch_host(loop: LabellerLoop, host_root: str, status_dir: str, every: float) -> None:
    """Wake the loop when ``host_fingerprint`` changes (a daemon thread)."""

    def watch() -> None:
        last = host_fingerprint(host_root, status_dir)
        while not loop.stopped:
            time.sleep(every)
            current = host_fingerprint(host_root, status_dir)
            if current != last:
                last = current
                log.info("host changed: relabelling now")
                loop.wake()

    threading.Thread(target=watch, name="labeller-watch", daemon=True).start()


def main(
    argv: Sequence[str] | None = None,
    *,
    store: NodeLabelStore | None = None,
    discover: Discover | None = None,
) -> int:
    """Entry point of ``gpuk8s serve labeller``; ``store``/``discover`` are for tests."""
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        configure_logging(LogOptions.from_args(args), component="gpu-label")
        _validate(args)
        if discover is None:
            from ...discovery import discover as real_discover

            discover = real_discover
        if store is None:
            store = KubeNodeLabelStore(api_client(args.kubeconfig))
    except GpuK8sError as err:
        print(f"gpuk8s serve labeller: error: {err}", file=sys.stderr)
        return 2
    one_pass = make_pass(
        store, args.node_name, args.host_root, discover, args.status_dir, dry_run=args.dry_run,
        sharing=args.sharing,
    )
    if args.once or args.dry_run:
        try:
            result = one_pass()
        except ApiError as err:
            print(f"gpuk8s serve labeller: error: {err}", file=sys.stderr)
            return 1
        except GpuK8sError as err:
            print(f"gpuk8s serve labeller: error: {err}", file=sys.stderr)
            return 2
        print(_result_json(result) if args.json else format_diff(result))
        return 0

    loop = LabellerLoop(one_pass, args.interval)
    if args.watch_interval > 0:
        watch_host(loop, args.host_root, args.status_dir, args.watch_interval)
    health = None
    if args.health_port:
        health = serve_health(args.health_port, loop.status, 3 * args.interval + 120)
    # set_wakeup_fd writes every signal into the loop's wake-up pipe, whichever thread
    # receives it: that alone makes SIGHUP start a pass, so its handler does nothing.
    previous = {
        signal.SIGHUP: signal.signal(signal.SIGHUP, lambda *_: None),
        signal.SIGTERM: signal.signal(signal.SIGTERM, lambda *_: loop.stop()),
        signal.SIGINT: signal.signal(signal.SIGINT, lambda *_: loop.stop()),
    }
    previous_wakeup = signal.set_wakeup_fd(loop.wakeup_fd)
    log.info(
        "labeller started",
        extra={"node": args.node_name, "host_root": args.host_root, "interval_s": args.interval},
    )
    try:
        loop.run()
    finally:
        signal.set_wakeup_fd(previous_wakeup)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        loop.close()
        if health is not None:
            health.shutdown()
            health.server_close()
    log.info("labeller stopped")
    return 0
