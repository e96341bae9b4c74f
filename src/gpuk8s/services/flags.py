"""The command-line flags every service declares alike, declared here once.

==================  =========  ==============================================================
flag                default    meaning
==================  =========  ==============================================================
``--kubeconfig``    unset      a kubeconfig file; unset: the in-cluster service account in a
                               pod, else ``$KUBECONFIG``, else ``~/.kube/config``
                               (``kube.api_client``)
``--health-port``   ``0``      serve the service's probe endpoints on this port; 0: none
                               (gpu-aware, whose main port answers them too: unset, and
                               0 a free port)
log options         stderr     ``--log-dir``, ``--log-level``, ... (``logging_setup``)
==================  =========  ==============================================================

Example, in a service's ``build_parser``::

    p = argparse.ArgumentParser(prog="gpuk8s serve gpu-mps")
    add_kubeconfig_argument(p, used_for="reading the node")
    add_health_port_argument(p, serves="GET /healthz, /readyz")
    add_log_arguments(p)
"""

from __future__ import annotations

import argparse

from .logging_setup import add_log_arguments

__all__ = ["add_health_port_argument", "add_kubeconfig_argument", "add_log_arguments",
           "port_number"]

KUBECONFIG_FALLBACK = "in a pod the service account, else $KUBECONFIG, else ~/.kube/config"


def add_kubeconfig_argument(parser: argparse.ArgumentParser, *, used_for: str) -> None:
    """``--kubeconfig PATH``, default unset: ``kube.api_client`` picks in-cluster first."""
    parser.add_argument(
        "--kubeconfig", default=None, metavar="PATH",
        help=f"kubeconfig for {used_for} (default: {KUBECONFIG_FALLBACK})",
    )


def port_number(text: str) -> int:
    """An argparse ``type``: a TCP port 0..65535 (0: off), else a usage error naming both."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0..65535)") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not in 0..65535 (0: off)")
    return port


def add_health_port_argument(parser: argparse.ArgumentParser, *, serves: str,
                             unset: str | None = None) -> None:
    """``--health-port PORT``, default 0 (no endpoint); ``serves`` names what it answers.

    A service whose main port already answers the probes (gpu-aware) passes ``unset``:
    the flag then defaults to None (no listener of its own, ``unset`` says what serves
    them instead) and 0 asks the kernel for a free port."""
    if unset is None:
        parser.add_argument(
            "--health-port", type=port_number, default=0, metavar="PORT",
            help=f"serve {serves} on this port (default 0: off)",
        )
        return
    parser.add_argument(
        "--health-port", type=port_number, default=None, metavar="PORT",
        help=f"also serve {serves} on this port, on a listener of its own (default: none; "
             f"{unset}; 0: a free port)",
    )
