"""The replay's harness on the lab (``replay.py`` runs it): what it puts in the cluster
and what it plays and watches there.

================================  ======================================================
``shapes``, ``node_object``       the fake nodes: the trace's nodes as simulator presets
``pod_object``                    a trace pod as a Pod asking ``tencent.com/vcuda-core``
``Cluster``                       the pod watch: decisions, bindings, deletions
``FakeKubelet``                   the kubelet's part for GPU pods: the device plugin's own
                                  ``Allocate`` (``SharedDevices``) once a pod is bound
``Extender``, ``LeaderProxy``     gpu-aware processes (one or two replicas)
``scheduler_config``              the kube-scheduler configuration naming gpu-aware
``latency_figures``               gpu-aware's p50 / p99 per verb from its ``/metrics``
``check``, ``over_booked``        the checker: ledger, device plugin and API agree
================================  ======================================================

Example: ``node_object(spec, shapes()[8], run, taint_cores_per_gpu=4.0)`` is a Node of the
simulator's c500-8 (two MetaXLink groups of four) in vcuda mode with the trace's CPU and
memory, tainted ``metax-tech.com/gpu=present:PreferNoSchedule`` when GPU-dense.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
LAB = REPO / "lab"
sys.path.insert(0, str(LAB))
sys.path.insert(0, str(REPO / "benchmarks"))
import fake_nodes  # noqa: E402  (lab/fake_nodes.py: the API client, node objects, heartbeat)
import lablock  # noqa: E402  (lab/lablock.py: the lab's one lock, the e2e tier's too)
import packing  # noqa: E402  (benchmarks/packing.py: trace, workload, node shapes, figure)
from scheduling import versions  # noqa: E402
from stats import Buckets, histogram_quantile  # noqa: E402

from gpuk8s.core.schedconf import (  # noqa: E402
    ExtenderSpec,
    ManagedResource,
    api_version_for,
    new_config,
)
from gpuk8s.core.scoring import LinkGroups  # noqa: E402
from gpuk8s.core.sharing import (  # noqa: E402
    ASSIGNED_ANNOTATION,
    MODE_VCUDA,
    PHASE_ALLOCATED,
    PHASE_ALLOCATING,
    PHASE_ANNOTATION,
    SHARING_MODE_LABEL,
    VCUDA_CORE_RESOURCE,
    Assignment,
    SharingError,
    allocate_ids,
    parse_assignment,
)
from gpuk8s.services.deviceplugin.nodestate import published_annotations  # noqa: E402
from gpuk8s.services.deviceplugin.sharing import SharedDevices, replica_id  # noqa: E402
from gpuk8s.services.node.devices import DeviceSet  # noqa: E402

# the lab's; another API server's (e.g. a private one, with a bearer token) by $KUBECONFIG
KUBECONFIG = fake_nodes.KUBECONFIG
NS = "gpuk8s-replay"
SCHEDULER_NAME = "gpuk8s-replay"
ALONE_SCHEDULER_NAME = "gpuk8s-replay-alone"  # the same profile without gpu-aware (--alone)
RUN_LABEL = "lab.gpuk8s.io/replay"  # on the replay's nodes and pods
HOLD_LABEL = "lab.gpuk8s.io/hold-allocate"  # the fake kubelet leaves such a pod alone
GPU_TAINT = {"key": "metax-tech.com/gpu", "value": "present", "effect": "PreferNoSchedule"}
BUSYBOX = "127.0.0.1:5000/gpuk8s/lab-busybox:1.0"
ROLE_DEFAULTS = REPO / "roles" / "gpu_aware" / "defaults" / "main.yml"
LOCK = lablock.lock_path()
LAB_RUN = Path(os.environ.get("GPUK8S_LAB_STATE", "/var/lib/gpuk8s-lab")) / "run"  # pid files
LEASE = "gpu-aware"  # with --replicas 2: the replicas' Lease in the replay namespace
RESERVED = Path("/tmp/gpuk8s-lab.reserved")
MILLI = packing.MILLI
PHASES = ("fill", "churn", "faults")
FAULTS = ("extender-kill", "kubelet-restart", "node-delete", "delete-before-allocate")
LEADER_FAULTS = ("leader-loss",)  # with --replicas 2
PREFIX = {"fill": "f", "alone": "a", "churn": "c", "fault": "x", "load": "l"}  # of the pods' names
# seconds between two renewals of every fake node's Lease. A kubelet renews every 10 s;
# the node controller marks a node unhealthy 50 s after the last renewal
# (--node-monitor-grace-period), which 25 s plus one pass over every node (a few seconds
# under load) stays well inside. Each renewal costs the API server and etcd about 3 ms of
# CPU here, so 1,213 nodes every 10 s would take a third of a core of this 2-core machine
# from what the replay measures; a cluster that size has a control plane of its own.
HEARTBEAT_S = 25


def now() -> float:
    return time.monotonic()


# ----------------------------------------------------------------------------- nodes
@dataclass
class Shape:
    """One node shape: its devices and what a node of it publishes."""

    devices: DeviceSet
    annotations: dict[str, str]
    labels: dict[str, str]
    groups: LinkGroups

    def inside_one_group(self, gpus: Sequence[int]) -> bool:
        units = self.devices.topology.units
        return bool(self.groups.inside([i for i, u in enumerate(units) if u.gpu in gpus]))


def shapes() -> dict[int, Shape]:
    """GPU count -> shape, from the device sets ``packing.py`` places on."""
    from gpuk8s.core.labels import compute_labels

    out = {}
    for gpus, devices in packing.device_sets().items():
        out[gpus] = Shape(
            devices,
            published_annotations(devices, set()),
            compute_labels(devices.inventory),
            LinkGroups(devices.topology),
        )
    return out


def node_name(spec: packing.NodeSpec) -> str:
    return spec.name.lower()


def node_object(
    spec: packing.NodeSpec, shape: Shape, run: str, taint_cores_per_gpu: float
) -> dict[str, Any]:
    """A fake node as gpu-device (vcuda mode) and gpu-label would publish it, with the
    trace's CPU and memory."""
    taints = [fake_nodes.FAKE_TAINT]
    if taint_cores_per_gpu > 0 and spec.cpu < taint_cores_per_gpu * 1000 * spec.gpus:
        taints.append(GPU_TAINT)
    labels = {**shape.labels, SHARING_MODE_LABEL: MODE_VCUDA, RUN_LABEL: run}
    return fake_nodes.build_node(
        node_name(spec),
        labels,
        shape.annotations,
        {VCUDA_CORE_RESOURCE: str(100 * spec.gpus)},
        taints=taints,
        cpu=f"{spec.cpu}m",
        memory=f"{spec.memory}Mi",
        pods="1000",  # the trace has no pod limit per node
    )


# ----------------------------------------------------------------------------- pods
def pod_object(
    name: str,
    spec: packing.PodSpec,
    run: str,
    phase: str,
    node: str | None = None,
    labels: dict[str, str] | None = None,
    scheduler: str = SCHEDULER_NAME,
) -> dict[str, Any]:
    requests = {"cpu": f"{spec.cpu}m", "memory": f"{spec.memory}Mi"}
    resources: dict[str, Any] = {"requests": requests}
    if spec.gpus:
        requests[VCUDA_CORE_RESOURCE] = str(spec.vcuda_core)
        resources["limits"] = {VCUDA_CORE_RESOURCE: str(spec.vcuda_core)}
    selector = {RUN_LABEL: run}
    if node is not None:
        selector["kubernetes.io/hostname"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {"app": "gpuk8s-replay", "phase": phase, **(labels or {})},
            "annotations": {"lab.gpuk8s.io/trace-pod": spec.name},
        },
        "spec": {
            "schedulerName": scheduler,
            "nodeSelector": selector,
            "tolerations": [
                {"key": fake_nodes.FAKE_LABEL, "operator": "Exists", "effect": "NoSchedule"}
            ],
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "main", "image": BUSYBOX, "resources": resources}],
        },
    }


def assignment_of(pod: dict[str, Any]) -> Assignment | None:
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(ASSIGNED_ANNOTATION)
    try:
        return parse_assignment(raw)
    except SharingError:
        return None


def live(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def scheduled_condition(pod: dict[str, Any]) -> tuple[str, str]:
    """(status, reason) of the pod's PodScheduled condition ("", "" without one)."""
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled":
            return str(c.get("status", "")), str(c.get("reason", ""))
    return "", ""


# ----------------------------------------------------------------------------- the watch
class Cluster:
    """The replay namespace's pods as one watch sees them, with when each was first seen
    bound, first seen Unschedulable and gone (monotonic seconds, at the watch)."""

    def __init__(self, api: fake_nodes.Api) -> None:
        self.api = api
        self.cond = threading.Condition()
        self.pods: dict[str, dict[str, Any]] = {}
        self.bound_at: dict[str, float] = {}
        self.unschedulable_at: dict[str, float] = {}
        self.gone_at: dict[str, float] = {}
        self.scheduler_errors: collections.Counter[str] = collections.Counter()
        self.retries: collections.Counter[str] = collections.Counter()  # Unschedulable again
        self.listeners: list[Callable[[str, dict[str, Any]], None]] = []
        self.stop = threading.Event()
        self.synced = threading.Event()
        self.thread = threading.Thread(target=self._run, name="replay-watch", daemon=True)

    def start(self) -> None:
        self.thread.start()
        if not self.synced.wait(60):
            raise SystemExit("the pod watch did not sync within 60 s")

    def _run(self) -> None:
        base = f"/api/v1/namespaces/{NS}/pods"
        while not self.stop.is_set():
            try:
                status, body = self.api.request("GET", base)
                if status != 200:
                    raise OSError(f"list pods: HTTP {status}")
                version = body["metadata"]["resourceVersion"]
                listed = {p["metadata"]["name"]: p for p in body["items"]}
                with self.cond:
                    for name in [n for n in self.pods if n not in listed]:
                        self._apply("DELETED", self.pods[name])
                    for pod in listed.values():
                        self._apply("MODIFIED", pod)
                self.synced.set()
                while not self.stop.is_set():
                    path = (
                        f"{base}?watch=1&allowWatchBookmarks=true&timeoutSeconds=240"
                        f"&resourceVersion={version}"
                    )
                    gone = False
                    for event in self.api.watch(path):
                        kind, obj = event.get("type"), event.get("object") or {}
                        if kind == "ERROR":
                            gone = True
                            break
                        version = obj.get("metadata", {}).get("resourceVersion", version)
                        if kind in ("ADDED", "MODIFIED", "DELETED"):
                            with self.cond:
                                self._apply(str(kind), obj)
                        if self.stop.is_set():
                            return
                    if gone:
                        break
            except Exception as err:  # relist
                print(f"replay: pod watch: {err}; relisting", file=sys.stderr, flush=True)
                time.sleep(0.5)

    def _apply(self, kind: str, pod: dict[str, Any]) -> None:
        """One event (under ``cond``)."""
        name = pod["metadata"]["name"]
        t = now()
        if kind == "DELETED":
            self.pods.pop(name, None)
            self.gone_at.setdefault(name, t)
        else:
            old = self.pods.get(name)
            self.pods[name] = pod
            if pod["spec"].get("nodeName"):
                self.bound_at.setdefault(name, t)
            else:
                status, reason = scheduled_condition(pod)
                if status == "False" and reason == "Unschedulable":
                    if name in self.unschedulable_at:
                        if (
                            old is not None
                            and old["metadata"].get("resourceVersion")
                            != pod["metadata"].get("resourceVersion")
                            and _condition_time(old) != _condition_time(pod)
                        ):
                            self.retries[name] += 1
                    else:
                        self.unschedulable_at[name] = t
                elif status == "False" and _condition_time(old) != _condition_time(pod):
                    self.scheduler_errors[name] += 1
        for listener in self.listeners:
            listener(kind, pod)
        self.cond.notify_all()

    def wait(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """``predicate()`` once it holds, or at ``timeout``; at once when the watch is closed
        (no event can make it hold then: the clean-up does not wait out the timeouts of the
        load pods still undecided)."""
        with self.cond:
            self.cond.wait_for(lambda: self.stop.is_set() or predicate(), timeout)
            return predicate()

    def close(self) -> None:
        with self.cond:
            self.stop.set()
            self.cond.notify_all()


def _condition_time(pod: dict[str, Any] | None) -> str:
    for c in ((pod or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled":
            return f"{c.get('lastTransitionTime')}|{c.get('message', '')[:80]}"
    return ""


# ----------------------------------------------------------------------------- fake kubelet
class FakeKubelet:
    """The kubelets of the fake nodes, for GPU pods only: a pod bound with the phase
    ``allocating`` gets ``allocate_ids`` replica ids of the node's free ones, and the
    device plugin's own ``SharedDevices.container_spec`` (one per node) picks the pod and
    marks it ``allocated`` through the API. Ids come back when the pod is deleted. What
    each pod got (node, GPUs of its container) is the device plugin's view."""

    def __init__(self, api: fake_nodes.Api, cluster: Cluster, shape_of: dict[str, Shape]):
        self.api = api
        self.cluster = cluster
        self.shape_of = shape_of
        self.lock = threading.Lock()
        self.plugins: dict[str, SharedDevices] = {}
        self.free: dict[str, list[str]] = {}
        self.held: dict[str, tuple[str, str, list[str], tuple[int, ...]]] = {}  # uid ->
        # (pod name, node, replica ids, GPUs of the container)
        self.started: set[str] = set()
        self.errors: list[str] = []
        self.pool = ThreadPoolExecutor(4, thread_name_prefix="fake-kubelet")
        cluster.listeners.append(self._event)

    def _plugin(self, node: str) -> SharedDevices:
        plugin = self.plugins.get(node)
        if plugin is None:
            shape = self.shape_of[node]
            plugin = SharedDevices(shape.devices, MODE_VCUDA, node, _NodePods(self, node))
            self.plugins[node] = plugin
            self.free[node] = [replica_id(u.id, n) for u in plugin.units for n in range(100)]
        return plugin

    def _event(self, kind: str, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        if kind == "DELETED":
            with self.lock:
                held = self.held.pop(uid, None)
                self.started.discard(uid)
                if held is not None:
                    self.free[held[1]].extend(held[2])
            return
        node = pod["spec"].get("nodeName")
        ann = pod["metadata"].get("annotations") or {}
        if (
            not node
            or node not in self.shape_of
            or ann.get(PHASE_ANNOTATION) != PHASE_ALLOCATING
            or (pod["metadata"].get("labels") or {}).get(HOLD_LABEL) == "true"
        ):
            return
        with self.lock:
            if uid in self.started:
                return
            self.started.add(uid)
        self.pool.submit(self._admit, pod)

    def _admit(self, pod: dict[str, Any]) -> None:
        uid, name = pod["metadata"]["uid"], pod["metadata"]["name"]
        node = pod["spec"]["nodeName"]
        assignment = assignment_of(pod)
        if assignment is None:
            return
        count = allocate_ids(assignment.share)
        with self.lock:
            plugin = self._plugin(node)
            free = self.free[node]
            if len(free) < count:
                self.errors.append(f"{name}: {count} ids asked, {len(free)} free on {node}")
                return
            ids, self.free[node] = free[:count], free[count:]
        try:
            spec = plugin.container_spec(ids)
        except Exception as err:
            with self.lock:
                self.free[node].extend(ids)
                self.started.discard(uid)
                self.errors.append(f"{name}: Allocate: {err}")
            return
        units = {u.id: u.gpu for u in plugin.units}
        gpus = tuple(sorted(units[i] for i in spec.envs["GPUK8S_DEVICE_IDS"].split(",")))
        with self.lock:
            if uid in self.started:
                self.held[uid] = (name, node, ids, gpus)
            else:  # deleted meanwhile
                self.free[node].extend(ids)

    def release_hold(self, pod: dict[str, Any]) -> None:
        """Admit a pod held back by its label (as a kubelet finally starting it)."""
        with self.lock:
            self.started.add(pod["metadata"]["uid"])
        self._admit(pod)

    def view(self) -> dict[str, tuple[str, str, tuple[int, ...]]]:
        """uid -> (pod name, node, GPUs its container got)."""
        with self.lock:
            return {uid: (h[0], h[1], h[3]) for uid, h in self.held.items()}

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


class _NodePods:
    """``deviceplugin.sharing.PendingPods`` for one fake node, as ``KubePendingPods``
    does it: the pods bound to the node, listed from the API at each Allocate (a cache
    could still show a pod deleted meanwhile); the phase update goes to the API."""

    def __init__(self, kubelet: FakeKubelet, node: str) -> None:
        self.kubelet = kubelet
        self.node = node

    def pods(self) -> list[dict[str, Any]]:
        status, body = self.kubelet.api.request(
            "GET", f"/api/v1/pods?fieldSelector=spec.nodeName%3D{self.node}"
        )
        if status != 200:
            raise OSError(f"listing the pods of {self.node}: HTTP {status}")
        items: list[dict[str, Any]] = body.get("items") or []
        return items

    def mark_allocated(self, namespace: str, name: str) -> None:
        status, body = self.kubelet.api.request(
            "PATCH",
            f"/api/v1/namespaces/{namespace}/pods/{name}",
            {"metadata": {"annotations": {PHASE_ANNOTATION: PHASE_ALLOCATED}}},
            "application/merge-patch+json",
        )
        if status != 200:
            raise OSError(f"HTTP {status}: {str(body)[:200]}")


# ----------------------------------------------------------------------------- processes
class Extender:
    """This checkout's gpu-aware as a local process (restartable, killable)."""

    def __init__(self, work: Path, port: int, elect: bool = False) -> None:
        self.work = work
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.elect = elect  # --leader-elect on the Lease LEASE, identity ``identity``

    @property
    def identity(self) -> str:
        return f"replica-{self.port}"

    def start(self) -> float:
        """Start it; returns the monotonic time of the start."""
        log = open(self.work / f"gpu-aware-{self.port}.log", "ab")  # noqa: SIM115 (as the process)
        cmd = [
            sys.executable,
            "-m",
            "gpuk8s.cli",
            "serve",
            "extender",
            "--port",
            str(self.port),
            "--address",
            "127.0.0.1",
            "--kubeconfig",
            KUBECONFIG,
            "--node-cache",
            "--log-format",
            "text",
        ]
        if self.elect:
            cmd += ["--leader-elect", "--leader-elect-lease", f"{NS}/{LEASE}"]
            cmd += ["--leader-elect-identity", self.identity]
        t = now()
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        self.starts += 1
        return t

    def kill(self) -> float:
        assert self.proc is not None
        t = now()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        return t

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/readyz", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def wait_ready(self, timeout: float) -> float:
        deadline = now() + timeout
        while now() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise SystemExit(f"gpu-aware exited; log: {self.work / 'gpu-aware.log'}")
            if self.ready() and self.ledger().get("synced"):
                return now()
            time.sleep(0.05)
        raise SystemExit(f"gpu-aware not ready within {timeout}s; log: {self.work}")

    def get(self, path: str) -> bytes:
        with urllib.request.urlopen(self.url + path, timeout=10) as resp:
            data: bytes = resp.read()
            return data

    def ledger(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads(self.get("/debug/ledger"))
            return data
        except (OSError, ValueError):
            return {}

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


class LeaderProxy:
    """What the chart's Service does for several replicas (it selects the pod the leader
    labelled): each new connection goes to the replica holding the Lease, as the Lease
    says (read every 0.2 s); none while nobody holds it."""

    def __init__(self, api: fake_nodes.Api, replicas: Sequence[Extender], port: int) -> None:
        import socketserver

        self.api = api
        self.by_identity = {r.identity: r for r in replicas}
        self.leader: Extender | None = None
        self.stop = threading.Event()
        proxy = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                proxy.splice(self.request)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self.server = Server(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        threading.Thread(target=self._follow, daemon=True).start()

    def _follow(self) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{LEASE}"
        while not self.stop.wait(0.2):
            with contextlib.suppress(Exception):
                status, body = self.api.request("GET", path)
                holder = (body or {}).get("spec", {}).get("holderIdentity") if status == 200 else ""
                self.leader = self.by_identity.get(holder or "")

    def splice(self, client: Any) -> None:
        import socket

        leader = self.leader
        if leader is None:
            return  # no endpoint: the connection is closed
        try:
            upstream = socket.create_connection(("127.0.0.1", leader.port), timeout=5)
        except OSError:
            return
        upstream.settimeout(None)

        def pump(src: Any, dst: Any) -> None:
            with contextlib.suppress(OSError):
                while data := src.recv(65536):
                    dst.sendall(data)
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

        back = threading.Thread(target=pump, args=(upstream, client), daemon=True)
        back.start()
        pump(client, upstream)
        back.join()
        upstream.close()

    def holder(self) -> str:
        return self.leader.identity if self.leader is not None else ""

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


def scheduler_config(path: Path, extender_url: str, extender: bool = True) -> None:
    """The configuration the gpu_aware role writes (extender with bind, node cache, the
    role's managedResources, the ``packing`` profile) for a second scheduler of ours;
    ``extender`` False: the same profile without gpu-aware (``ALONE_SCHEDULER_NAME``), to
    measure kube-scheduler alone on the same nodes and pods."""
    defaults = yaml.safe_load(ROLE_DEFAULTS.read_text())
    spec = ExtenderSpec(
        url_prefix=extender_url,
        weight=int(defaults["gpu_aware_weight"]),
        node_cache_capable=True,
        ignorable=bool(defaults["gpu_aware_ignorable"]),
        bind_verb=str(defaults["gpu_aware_bind_verb"]),
        managed_resources=tuple(
            ManagedResource(r["name"], bool(r["ignored_by_scheduler"]))
            for r in defaults["gpu_aware_managed_resources"]
        ),
        # the second entry, through which gpu-aware ranks pods without GPUs (as packing.py
        # models it by default)
        rank_nogpu=bool(defaults["gpu_aware_rank_pods_without_gpus"]),
    )
    spec.validate()
    cfg = new_config(spec, api_version_for(versions()["KUBE_VERSION"]), KUBECONFIG)
    cfg["profiles"][0]["schedulerName"] = SCHEDULER_NAME
    if not extender:
        del cfg["extenders"]
        cfg["profiles"][0]["schedulerName"] = ALONE_SCHEDULER_NAME
    cfg["leaderElection"] = {"leaderElect": False}
    # the client's rate limit must not be what is measured
    cfg["clientConnection"].update({"qps": 5000, "burst": 10000})
    path.write_text(json.dumps(cfg, indent=2))


# ----------------------------------------------------------------------------- metrics


def histograms(text: str, name: str = "gpu_aware_request_seconds") -> dict[str, Buckets]:
    """verb -> [(upper bound, cumulative count)] of a Prometheus histogram."""
    out: dict[str, Buckets] = {}
    prefix = name + "_bucket{"
    for line in text.splitlines():
        if not line.startswith(prefix):
            continue
        labels, _, value = line[len(prefix) :].partition("} ")
        fields = dict(part.split("=", 1) for part in labels.split(","))
        verb = fields["verb"].strip('"')
        le = fields["le"].strip('"')
        out.setdefault(verb, []).append((float("inf") if le == "+Inf" else float(le), float(value)))
    return {verb: sorted(b) for verb, b in out.items()}


def latency_figures(before: str, after: str) -> dict[str, dict[str, float | None]]:
    """verb -> p50 / p99 (ms) and count, of the requests between two /metrics reads."""
    old, new = histograms(before), histograms(after)
    out = {}
    for verb in ("filter", "prioritize", "bind"):
        prev = dict(old.get(verb, []))
        diff = [(le, count - prev.get(le, 0.0)) for le, count in new.get(verb, [])]
        p50, p99 = histogram_quantile(diff, 0.5), histogram_quantile(diff, 0.99)
        out[verb] = {
            "p50_ms": None if p50 is None else 1e3 * p50,
            "p99_ms": None if p99 is None else 1e3 * p99,
            "count": diff[-1][1] if diff else 0.0,
        }
    return out


# ----------------------------------------------------------------------------- checker
@dataclass
class Check:
    """gpu-aware's ledger and the device plugin's view against the API."""

    phase: str
    api_bookings: int = 0
    ledger_bookings: int = 0
    device_bookings: int = 0
    stale_ledger: list[str] = field(default_factory=list)  # booked, pod gone / not booked
    missing_ledger: list[str] = field(default_factory=list)
    differing_ledger: list[str] = field(default_factory=list)
    stale_device: list[str] = field(default_factory=list)
    differing_device: list[str] = field(default_factory=list)
    over_booked: list[str] = field(default_factory=list)  # node/GPU beyond 100 %
    settle_s: float = 0.0

    @property
    def stale(self) -> int:
        return len(self.stale_ledger) + len(self.stale_device)

    @property
    def ok(self) -> bool:
        return not (
            self.stale_ledger
            or self.missing_ledger
            or self.differing_ledger
            or self.stale_device
            or self.differing_device
            or self.over_booked
        )

    def line(self) -> str:
        verdict = "equal" if self.ok else "DIFFERENT"
        return (
            f"[{self.phase}] API {self.api_bookings} bookings, ledger {self.ledger_bookings}, "
            f"device plugin {self.device_bookings}: {verdict} (settled in {self.settle_s:.1f} s); "
            f"stale ledger {len(self.stale_ledger)}, missing {len(self.missing_ledger)}, "
            f"differing {len(self.differing_ledger)}; stale device {len(self.stale_device)}, "
            f"differing {len(self.differing_device)}; GPUs over 100 %: {len(self.over_booked)}"
        )


def api_bookings(api: fake_nodes.Api) -> dict[str, tuple[str, Assignment, dict[str, Any]]]:
    """uid -> (namespace/name, assignment, pod) of every live pod holding a share."""
    status, body = api.request("GET", "/api/v1/pods")
    if status != 200:
        raise SystemExit(f"listing pods: HTTP {status}")
    out = {}
    for pod in body["items"]:
        a = assignment_of(pod)
        if a is None or not live(pod):
            continue
        bound = pod["spec"].get("nodeName")
        if bound and bound != a.node:
            continue  # not a booking bind wrote (gpu-aware ignores it too)
        meta = pod["metadata"]
        out[meta["uid"]] = (f"{meta['namespace']}/{meta['name']}", a, pod)
    return out


def over_booked(bookings: Sequence[Assignment]) -> list[str]:
    """node/GPU where the bookings sum past one GPU (or a whole GPU is shared)."""
    core: dict[tuple[str, int], int] = collections.Counter()
    whole: collections.Counter[tuple[str, int]] = collections.Counter()
    users: collections.Counter[tuple[str, int]] = collections.Counter()
    for a in bookings:
        for g in a.gpus:
            key = (a.node, g)
            core[key] += 100 if a.share.whole else a.share.core
            users[key] += 1
            whole[key] += a.share.whole
    return sorted(
        f"{n}/{g}" for (n, g), c in core.items() if c > 100 or (whole[(n, g)] and users[(n, g)] > 1)
    )


def check(
    phase: str,
    api: fake_nodes.Api,
    extenders: Sequence[Extender],
    kubelet: FakeKubelet,
    settle: float = 15.0,
) -> Check:
    """Compare until equal or ``settle`` seconds passed (the watches lag the API a
    little); the last comparison is returned."""
    t0 = now()
    while True:
        result = compare(phase, api, extenders, kubelet)
        if result.ok or now() - t0 > settle:
            result.settle_s = now() - t0
            return result
        time.sleep(0.5)


def compare(
    phase: str, api: fake_nodes.Api, extenders: Sequence[Extender], kubelet: FakeKubelet
) -> Check:
    """One comparison; every replica's ledger must equal the API (the ones that do not
    book keep theirs warm for a takeover)."""
    booked = api_bookings(api)
    device = kubelet.view()
    result = Check(phase, len(booked), 0, len(device))
    for extender in extenders:
        ledger = extender.ledger().get("assignments", {})
        result.ledger_bookings = max(result.ledger_bookings, len(ledger))
        for uid, raw in ledger.items():
            if uid not in booked:
                result.stale_ledger.append(uid)
            elif json.loads(booked[uid][1].to_json()) != raw:
                result.differing_ledger.append(booked[uid][0])
        result.missing_ledger += sorted(booked[u][0] for u in booked if u not in ledger)
    for uid, (name, node, gpus) in device.items():
        if uid not in booked:
            result.stale_device.append(f"{NS}/{name}")
        elif (booked[uid][1].node, tuple(sorted(booked[uid][1].gpus))) != (node, gpus):
            result.differing_device.append(f"{NS}/{name}")
    result.over_booked = over_booked([a for _, a, _ in booked.values()])
    return result




# ----------------------------------------------------------------------------- helpers
def seconds_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def jsonable(data: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(data, default=str))


def real_node(api: fake_nodes.Api) -> str | None:
    status, body = api.request("GET", f"/api/v1/nodes?labelSelector=!{fake_nodes.FAKE_LABEL}")
    items = body.get("items", []) if status == 200 else []
    return items[0]["metadata"]["name"] if items else None


def _node(api: fake_nodes.Api, name: str) -> dict[str, Any]:
    status, body = api.request("GET", f"/api/v1/nodes/{name}")
    return body if status == 200 and isinstance(body, dict) else {}


def gpu_allocatable(api: fake_nodes.Api, name: str) -> dict[str, str]:
    allocatable = (_node(api, name).get("status") or {}).get("allocatable") or {}
    return {k: v for k, v in allocatable.items() if "/" in k and v != "0"}


def node_ready_since(api: fake_nodes.Api, name: str, since: float) -> bool:
    """Ready, with a heartbeat posted after ``since`` (monotonic; compared through the
    wall clock)."""
    wall_since = time.time() - (now() - since)
    for c in (_node(api, name).get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            beat = c.get("lastHeartbeatTime", "")
            try:
                stamp = time.mktime(time.strptime(beat, "%Y-%m-%dT%H:%M:%SZ")) - time.timezone
            except ValueError:
                return False
            return bool(c.get("status") == "True" and stamp >= wall_since - 1)
    return False



@contextlib.contextmanager
def lab_lock(path: str | None) -> Iterator[None]:
    """The lab's lock (``lab/lablock.py``) at ``path`` inside the block; none for None."""
    if path is None:
        yield
        return
    with lablock.hold(Path(path), lambda line: print(line, flush=True)):
        if RESERVED.exists():
            raise SystemExit(f"the lab is reserved: {RESERVED.read_text().strip()}")
        yield
