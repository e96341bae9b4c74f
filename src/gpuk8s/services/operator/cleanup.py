"""`gpuk8s serve node-cleanup`: the GPU Extensions chart's helm pre-delete hook. It stops
the release's node agents (deletes their DaemonSets and waits for their pods) and then
removes every metax-tech.com/ label and annotation from the release's nodes (its
nodeSelector as ``--node-selector``; empty: every node), so `helm uninstall --wait` leaves
no label or annotation of ours behind. The same code as the operator chart's hook
(``KubeCluster.uninstall``), without a controller to stop.

    gpuk8s serve node-cleanup --namespace NS [--node-selector gpuk8s.io/scheme=extensions]
        [--timeout 120]

Exit codes: 0 done, or not finished within --timeout (what is left is printed: a cleanup
that cannot finish must not keep the release from being uninstalled); 2 bad configuration.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from ...core.errors import ConfigError, GpuK8sError
from ..flags import add_kubeconfig_argument, add_log_arguments
from ..kube import api_client
from ..logging_setup import LogOptions, configure_logging
from .main import KubeCluster, check_node_selector

# the GPU Extensions chart's node agents (app.kubernetes.io/name)
EXTENSIONS_AGENTS = ("gpu-device", "gpu-dra", "gpu-exporter", "gpu-label", "gpu-mps")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpuk8s serve node-cleanup",
        description="helm pre-delete hook of the GPU Extensions chart: stop the node agents, "
        "remove every metax-tech.com/ label and annotation from the release's nodes, exit",
    )
    p.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE", ""),
                   help="the release namespace (default $POD_NAMESPACE)")
    p.add_argument("--node-selector", default="",
                   help="label selector of the release's nodes (the chart's nodeSelector; "
                   "default: every node)")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds to wait for the node agents' pods to be gone; then what is "
                   "left is printed and the hook exits 0 (helm goes on)")
    add_kubeconfig_argument(p, used_for="the cluster of the release")
    add_log_arguments(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        configure_logging(LogOptions.from_args(args), component="node-cleanup")
        if not args.namespace:
            raise ConfigError("--namespace: required (or set POD_NAMESPACE)")
        if not args.timeout > 0:
            raise ConfigError(f"--timeout: {args.timeout} must be positive")
        check_node_selector(args.node_selector)
        cluster = KubeCluster(api_client(args.kubeconfig), args.namespace, args.node_selector)
    except GpuK8sError as err:
        print(f"gpuk8s serve node-cleanup: error: {err}", file=sys.stderr)
        return 2
    try:
        done, left = cluster.uninstall(args.timeout, EXTENSIONS_AGENTS, controller=False)
    except GpuK8sError as err:  # the API refused or failed: say so, let helm go on
        done, left = [], [str(err)]
    for line in done:
        print(line)
    for line in left:
        print(f"left: {line}", file=sys.stderr)
    return 0
