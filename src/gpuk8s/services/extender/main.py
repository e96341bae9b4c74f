"""`gpuk8s serve extender`: gpu-aware, the topology-aware kube-scheduler extender.

    gpuk8s serve extender --port 8080 [--address 0.0.0.0] [--node-cache]
                          [--tls-cert-file F --tls-key-file F --tls-client-ca-file F]
                          [--health-port 8081]
                          [--no-pod-watch] [--config-dir /etc/gpu-aware]
                          [--score-weight 1] [--loss-weight 1] [--max-body-mib 16]
                          [--request-timeout 10] [--max-connections 64]
                          [--max-connections-per-client 16]
                          [--prioritize-min-score 0]
                          [--pod-mix-prior 1=1,2=1,4=1,8=1] [--pod-mix-prior-gpus 64]
                          [--kubeconfig PATH] [log options]

With the three ``--tls-*`` files the main port speaks HTTPS and admits only clients
with a certificate signed by the client CA (``tls.py``: kube-scheduler's
``tlsConfig``); the files are re-read when they change. ``--health-port`` serves
``/healthz``, ``/readyz`` and ``/metrics`` in plain HTTP on a listener of its own (the
kubelet's probes have no client certificate, and never wait behind the main port's
clients).

``--node-cache`` keeps a watch on nodes so the scheduler can be configured with
``nodeCacheCapable: true``. The bound-pod watch (on unless ``--no-pod-watch``)
subtracts GPUs promised to pods that are bound but not yet allocated, and feeds the
ranking with the CPU and memory in use per node and the pod mix (shapes of the running
GPU pods, blended with ``--pod-mix-prior``).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Sequence

from ...core.errors import ConfigError, GpuK8sError
from ...core.scoring import DEFAULT_PRIOR, DEFAULT_PRIOR_GPUS
from ..flags import add_health_port_argument, add_kubeconfig_argument, add_log_arguments
from ..kube import api_client
from ..logging_setup import LogOptions, configure_logging
from .cuda import NodeCudaVersions
from .leader import (
    DEFAULT_LEASE,
    LEASE_DURATION_S,
    RENEW_DEADLINE_S,
    RETRY_PERIOD_S,
    Elector,
    KubeLeaseApi,
    KubePodLabeler,
    gate,
)
from .ledger import Ledger
from .logic import Extender
from .nodes import BoundPods, NodeCache
from .packing import FreeRoom, NodeRooms, RunningPods, parse_prior
from .podapi import KubePodApi
from .requeue import Requeue
from .server import (
    DEFAULT_MAX_BODY,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_PER_CLIENT,
    DEFAULT_REQUEST_TIMEOUT_S,
    ExtenderHTTPServer,
    register_metrics,
)
from .share import Sharing
from .sharednodes import SharedNodes
from .tls import ServerTls, TlsFiles
from .watch import WatchLoop, ledger_watch_loop, node_watch_loop, pod_watch_loop
from .weights import Weights, WeightSource, parse_weight
from .wire import MAX_EXTENDER_PRIORITY

log = logging.getLogger("gpuk8s.extender")

# the health listener: the kubelet's probes and a Prometheus or two
HEALTH_MAX_CONNECTIONS = 16
HEALTH_MAX_PER_CLIENT = 4


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuk8s serve extender",
        description="gpu-aware: kube-scheduler extender (POST /filter, /prioritize)",
    )
    parser.add_argument("--port", type=int, default=8080, help="listen port (default 8080)")
    parser.add_argument("--address", default="0.0.0.0", help="listen address (default all)")
    parser.add_argument(
        "--node-cache",
        action="store_true",
        help="watch nodes and answer nodeCacheCapable: true requests (NodeNames only)",
    )
    parser.add_argument(
        "--no-pod-watch",
        dest="pod_watch",
        action="store_false",
        help="do not track bound GPU pods (no API access needed without --node-cache; "
        "GPUs promised to bound-but-unstarted pods are then not subtracted; GPU sharing "
        "and the bind verb are then off: bind answers an error)",
    )
    parser.add_argument(
        "--config-dir",
        default=None,
        help="gpu-aware ConfigMap mount with keys scoreWeight / lossWeight (re-read on change)",
    )
    parser.add_argument(
        "--score-weight", default="1", help="scoreWeight when the ConfigMap has none (default 1)"
    )
    parser.add_argument(
        "--loss-weight", default="1", help="lossWeight when the ConfigMap has none (default 1)"
    )
    parser.add_argument(
        "--pod-mix-prior",
        default=",".join(f"{k}={v:g}" for k, v in DEFAULT_PRIOR.items()),
        help="prior pod mix: request size = share of requested GPUs, comma-separated "
        "(default %(default)s: every size alike)",
    )
    parser.add_argument(
        "--pod-mix-prior-gpus",
        default=f"{DEFAULT_PRIOR_GPUS:g}",
        help="how many requested GPUs the prior counts as next to the running pods' "
        "(default %(default)s; 0: learned mix only)",
    )
    parser.add_argument(
        "--max-body-mib",
        type=float,
        default=DEFAULT_MAX_BODY / 2**20,
        help="largest request body accepted, MiB (default 16: about 2,400 full Node "
        "objects with nodeCacheCapable: false; bodies being handled at once hold at most "
        "twice this)",
    )
    parser.add_argument(
        "--request-timeout",
        type=float,
        default=DEFAULT_REQUEST_TIMEOUT_S,
        help="seconds a request may take to arrive, from its first byte, and its answer "
        "to be taken (default 10; kube-scheduler's own extender timeout is 5)",
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        default=DEFAULT_MAX_CONNECTIONS,
        help="connections served at once (default 64); at the cap a new one replaces the "
        "one idle the longest, or gets 503 when all are busy",
    )
    parser.add_argument(
        "--max-connections-per-client",
        type=int,
        default=DEFAULT_MAX_PER_CLIENT,
        help="connections from one client address at once (default 16); past it the "
        "client's own idle connection gives way, or the new one gets 503: one client "
        "cannot take the others' places",
    )
    parser.add_argument(
        "--tls-cert-file",
        default=None,
        help="serve HTTPS with this certificate (PEM; with --tls-key-file and "
        "--tls-client-ca-file: clients must present a certificate that CA signed)",
    )
    parser.add_argument("--tls-key-file", default=None, help="private key of --tls-cert-file")
    parser.add_argument(
        "--tls-client-ca-file",
        default=None,
        help="CA bundle (PEM) that signs the clients' certificates (kube-scheduler's certFile)",
    )
    add_health_port_argument(parser, serves="GET /healthz, /readyz, /metrics in plain HTTP",
                             unset="the main port serves them too")
    parser.add_argument(
        "--prioritize-min-score",
        type=int,
        default=0,
        help="leave the nodes scoring below this (0-10) out of prioritize's answer; the "
        "scheduler counts a node it is not given as 0 (default 0: every node listed; 10: "
        "only the best-ranked nodes, a much shorter answer for the scheduler to decode, "
        "and the same choice whenever the extender's weight x 10 exceeds what the "
        "profile's score plugins can add up to, as SPEC's weight 500 does)",
    )
    parser.add_argument(
        "--leader-elect",
        action="store_true",
        help="several replicas: only the holder of a coordination.k8s.io Lease books shared "
        "GPUs (leader.py); the leader labels its pod gpuk8s.io/gpu-aware-leader=true "
        "(needs POD_NAME and POD_NAMESPACE), which the chart's Service selects",
    )
    parser.add_argument(
        "--leader-elect-lease",
        default=None,
        metavar="NAMESPACE/NAME",
        help="the Lease (default: $POD_NAMESPACE/gpu-aware)",
    )
    parser.add_argument(
        "--leader-elect-identity",
        default=None,
        help="this replica's name in the Lease (default: $POD_NAME, else host name and port)",
    )
    parser.add_argument(
        "--leader-elect-timing",
        default=f"{LEASE_DURATION_S:g},{RENEW_DEADLINE_S:g},{RETRY_PERIOD_S:g}",
        metavar="DURATION,RENEW,RETRY",
        help="lease duration, renew deadline and retry period in seconds "
        "(default %(default)s, kube-scheduler's)",
    )
    add_kubeconfig_argument(parser, used_for="the node cache and bindings")
    add_log_arguments(parser)
    return parser


class ExtenderService:
    """The running pieces: HTTP server (and the health listener) plus the watch
    threads; start() / close()."""

    def __init__(
        self,
        server: ExtenderHTTPServer,
        extender: Extender,
        loops: list[tuple[str, WatchLoop]],
        health: ExtenderHTTPServer | None = None,
        elector: Elector | None = None,
    ) -> None:
        self.server = server
        self.health = health
        self.extender = extender
        self.loops = loops
        self.elector = elector  # --leader-elect
        self.stopping = threading.Event()
        self.threads: list[threading.Thread] = []

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def servers(self) -> list[ExtenderHTTPServer]:
        return [self.server] + ([self.health] if self.health is not None else [])

    def start(self) -> None:
        for name, loop in self.loops:
            thread = threading.Thread(target=loop, args=(self.stopping,), name=name, daemon=True)
            thread.start()
            self.threads.append(thread)
        names = ("gpu-aware-http", "gpu-aware-health")
        for server, name in zip(self.servers, names[: len(self.servers)], strict=True):
            thread = threading.Thread(
                target=server.serve_forever,
                kwargs={"poll_interval": 0.2},
                name=name,
                daemon=True,
            )
            thread.start()
            self.threads.append(thread)

    def close(self) -> None:
        self.stopping.set()
        for server in self.servers:
            server.shutdown()
            server.server_close()
        if self.elector is not None:
            self.elector.release()  # the next replica takes over at its next try


def build_service(
    args: argparse.Namespace,
    *,
    node_watch: WatchLoop | None = None,
    pod_watch: WatchLoop | None = None,
    ledger_watch: WatchLoop | None = None,
) -> ExtenderService:
    """Validate flags and assemble the service; ``ConfigError`` on bad input.

    ``node_watch``/``pod_watch`` replace the real list+watch loops (tests); they are
    built around the service's own cache, so they get it through ``.extender``.
    """
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port: {args.port} must be 0..65535")
    if not 0 < args.max_body_mib <= 1024:
        raise ConfigError(f"--max-body-mib: {args.max_body_mib} must be > 0 and <= 1024")
    if not 0 < args.request_timeout <= 3600:
        raise ConfigError(f"--request-timeout: {args.request_timeout} must be > 0 and <= 3600")
    if not 1 <= args.max_connections <= 10_000:
        raise ConfigError(f"--max-connections: {args.max_connections} must be 1..10000")
    if not 1 <= args.max_connections_per_client <= args.max_connections:
        raise ConfigError(
            f"--max-connections-per-client: {args.max_connections_per_client} must be 1.."
            f"{args.max_connections} (--max-connections)"
        )
    if args.health_port is not None and args.health_port == args.port != 0:
        raise ConfigError(f"--health-port: {args.health_port} is --port too; pick another")
    tls_files = (args.tls_cert_file, args.tls_key_file, args.tls_client_ca_file)
    if any(tls_files) and not all(tls_files):
        raise ConfigError(
            "--tls-cert-file, --tls-key-file and --tls-client-ca-file go together (HTTPS "
            "that admits only clients with a certificate the client CA signed); give all "
            "three, or none for plain HTTP"
        )
    tls = ServerTls(TlsFiles(*tls_files)) if all(tls_files) else None
    if not 0 <= args.prioritize_min_score <= MAX_EXTENDER_PRIORITY:
        raise ConfigError(
            f"--prioritize-min-score: {args.prioritize_min_score} must be "
            f"0..{MAX_EXTENDER_PRIORITY}"
        )
    defaults = Weights(
        parse_weight(args.score_weight, "--score-weight"),
        parse_weight(args.loss_weight, "--loss-weight"),
    )
    weights = WeightSource(args.config_dir, defaults)
    prior = parse_prior(args.pod_mix_prior)
    prior_gpus = parse_weight(args.pod_mix_prior_gpus, "--pod-mix-prior-gpus")
    cache = NodeCache() if args.node_cache else None
    pods = BoundPods() if args.pod_watch else None
    running = RunningPods(prior, prior_gpus) if args.pod_watch else None
    rooms = NodeRooms()
    cuda = NodeCudaVersions()
    needs_api = (cache is not None and node_watch is None) or (
        pods is not None and (pod_watch is None or ledger_watch is None)
    )
    client = api_client(args.kubeconfig) if needs_api else None
    # GPU sharing (bind verb, per-GPU accounting) rides on the pod watch's API access
    shared = SharedNodes()
    pod_api = KubePodApi(client) if client is not None else None
    requeue = Requeue(pod_api) if pods is not None else None
    ledger = Ledger(on_free=requeue.freed) if requeue is not None else None
    sharing = (
        Sharing(
            shared,
            ledger,
            pod_api,
            free_room=FreeRoom(rooms, running),
            requeue=requeue,
        )
        if ledger is not None
        else None
    )
    extender = Extender(
        weights,
        cache=cache,
        pods=pods,
        rooms=rooms,
        running=running,
        cuda=cuda,
        sharing=sharing,
        min_score=args.prioritize_min_score,
    )
    loops: list[tuple[str, WatchLoop]] = []
    if cache is not None:
        node_loop = node_watch or node_watch_loop(client, cache, rooms, shared, cuda)
        loops.append(("node-watch", node_loop))
    if pods is not None:
        loops.append(("pod-watch", pod_watch or pod_watch_loop(client, pods, running)))
    if ledger is not None:
        loops.append(("sharing-watch", ledger_watch or ledger_watch_loop(client, ledger)))
    if requeue is not None:
        loops.append(("sharing-requeue", requeue.run))
    elector = None
    if args.leader_elect:
        if sharing is None or client is None:
            raise ConfigError("--leader-elect: needs the pod watch and API access")
        elector = build_elector(args, client)
        sharing.gate = gate(elector)
        loops.append(("leader-election", elector.run))
    try:
        server = ExtenderHTTPServer(
            (args.address, args.port),
            extender,
            max_body=int(args.max_body_mib * 1024 * 1024),
            request_timeout=args.request_timeout,
            max_connections=args.max_connections,
            max_per_client=args.max_connections_per_client,
            tls=tls,
        )
    except OSError as err:
        raise ConfigError(f"--port: cannot listen on {args.address}:{args.port}: {err}") from err
    register_metrics(extender.metrics.registry, server)
    health = None
    if args.health_port is not None:
        try:
            health = ExtenderHTTPServer(
                (args.address, args.health_port),
                extender,
                max_body=0,
                request_timeout=args.request_timeout,
                max_connections=HEALTH_MAX_CONNECTIONS,
                max_per_client=HEALTH_MAX_PER_CLIENT,
                health_only=True,
                serving=server,  # its /healthz: whether the main port can still serve
            )
        except OSError as err:
            server.server_close()
            raise ConfigError(
                f"--health-port: cannot listen on {args.address}:{args.health_port}: {err}"
            ) from err
    return ExtenderService(server, extender, loops, health, elector)


def build_elector(args: argparse.Namespace, client: object) -> Elector:
    """The ``--leader-elect*`` flags as an ``Elector`` (which labels its pod when it knows
    it: ``POD_NAME`` and ``POD_NAMESPACE``)."""
    pod, pod_ns = os.environ.get("POD_NAME", ""), os.environ.get("POD_NAMESPACE", "")
    lease = args.leader_elect_lease or (f"{pod_ns}/{DEFAULT_LEASE}" if pod_ns else "")
    namespace, _, name = lease.partition("/")
    if not (namespace and name):
        raise ConfigError(
            "--leader-elect-lease: give NAMESPACE/NAME (or set POD_NAMESPACE for "
            f"<namespace>/{DEFAULT_LEASE}); got {lease!r}"
        )
    identity = args.leader_elect_identity or pod or f"{socket.gethostname()}_{args.port}"
    try:
        duration, renew, retry = (float(x) for x in args.leader_elect_timing.split(","))
    except ValueError:
        raise ConfigError(
            f"--leader-elect-timing: {args.leader_elect_timing!r} must be three numbers "
            "DURATION,RENEW,RETRY (seconds)"
        ) from None
    labeler = KubePodLabeler(client, pod_ns, pod) if pod and pod_ns else None
    try:
        elector = Elector(
            KubeLeaseApi(client, namespace, name),
            identity,
            namespace,
            name,
            duration,
            renew,
            retry,
            on_change=labeler.label if labeler is not None else None,
        )
    except ValueError as err:
        raise ConfigError(f"--leader-elect-timing: {err}") from None
    if labeler is not None:
        try:
            labeler.label(False)  # a restarted leader's label: it leads again once elected
        except Exception as err:
            log.warning("leader election: cannot clear this pod's label: %s", str(err)[:200])
    return elector


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``gpuk8s serve extender``."""
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        configure_logging(LogOptions.from_args(args), component="gpu-aware")
        service = build_service(args)
    except GpuK8sError as err:
        print(f"gpuk8s serve extender: error: {err}", file=sys.stderr)
        return 2
    done = threading.Event()
    previous = {
        sig: signal.signal(sig, lambda *_: done.set()) for sig in (signal.SIGTERM, signal.SIGINT)
    }
    service.start()
    log.info(
        "gpu-aware listening",
        extra={
            "address": args.address,
            "port": service.port,
            "tls": service.server.tls is not None,
            "health_port": service.health.port if service.health is not None else None,
            "node_cache": args.node_cache,
            "pod_watch": args.pod_watch,
            "config_dir": args.config_dir,
        },
    )
    try:
        # short waits: Python runs signal handlers in the main thread only between
        # bytecodes, and the signal may land on one of the server's threads
        while not done.wait(0.5):
            pass
    finally:
        service.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    log.info("gpu-aware stopped")
    return 0
