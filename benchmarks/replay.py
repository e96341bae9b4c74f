#!/usr/bin/env python3
"""The openb trace through the lab's real kube-scheduler and gpu-aware: fill, churn, faults.

``benchmarks/packing.py`` places the trace's pods by calling the product's code in one
process. This replays the same pods through the parts a user runs: the API server, a
real kube-scheduler (the lab's binary, v1.35), gpu-aware over HTTP (this checkout's
``gpuk8s serve extender``, its filter / prioritize / bind verbs) and the watches, on fake
nodes (``lab/fake_nodes.py``: Node objects kept Ready, publishing the product's own
annotations). Needs the lab (``lab/up``), as root, under the lab lock.

Nodes: one per line of the node list, named as the trace names it; 8-GPU nodes are the
simulator's ``c500-8`` (two MetaXLink groups of four), 2-GPU nodes ``n260-2`` (a PCIe
pair), 4- and 1-GPU nodes the shapes ``packing.py`` uses (SPEC has no such preset: four
linked GPUs, one GPU); the trace's CPU and memory; every node in the ``vcuda`` sharing
mode (label ``gpuk8s.io/sharing-mode``, allocatable ``tencent.com/vcuda-core`` = 100 per
GPU, as gpu-device advertises it), GPU-dense nodes (fewer than
``--taint-cores-per-gpu`` cores per GPU) tainted ``metax-tech.com/gpu=present:
PreferNoSchedule`` as ``docs/extender.md`` recommends and ``packing.py`` models.

Pods: the trace shuffled and resampled with the seed exactly as ``packing.workload``
does; a fractional pod asks ``tencent.com/vcuda-core`` = its milli-GPUs / 10, a whole-GPU
pod 100 per GPU, a GPU-less pod only CPU and memory. The fake nodes have no kubelet: the
harness plays its part for the GPU pods -- once a pod is bound it hands the device
plugin's own ``Allocate`` code (``deviceplugin.sharing.SharedDevices``, one per node) the
number of device ids the kubelet would, which marks the pod ``allocated`` through the API.

Phases (``--phases``):

``fill``
    FGD's protocol: pods are created in arrival order, at most ``--window`` waiting for a
    decision at a time (1: each pod is placed or fails before the next one arrives); a
    pod the scheduler finds unschedulable at its first attempt (PodScheduled=False,
    reason Unschedulable) counts as failed and is deleted; pods never leave; the fill
    stops when the arrived GPU requests reach 100 % of capacity. Printed side by side with
    ``packing.py``'s in-process figure for the same trace and seed: allocation, failed
    pods by GPU count, multi-GPU pods inside one link group, pods/s, and gpu-aware's
    filter / prioritize / bind p50 / p99 (interpolated in its /metrics histogram).
``churn``
    ``--churn`` cycles, ``--churn-parallel`` at a time on distinct nodes: a placed GPU pod
    P is picked at random; a pod Q of P's shape pinned to P's node arrives; if Q waits
    (Unschedulable), P is deleted and the time from P's deletion (the DELETED event) to
    Q's bind is measured ("release to bind"; HAMi's users wait minutes for this). Q stays.
``faults``
    each under background load (arrivals and deletions), with its recovery time: gpu-aware
    SIGKILLed and restarted (GPU pods wait, GPU-less pods keep scheduling; time until it
    serves again and until the first GPU pod is bound); the lab's kubelet restarted (the
    fake nodes have none: the real node's, until it is Ready with its GPUs allocatable
    again, while the replay goes on); a fake node deleted with pods on it (until the pod
    GC removed them and gpu-aware's ledger dropped them); a pod deleted between its bind
    and Allocate (until a pod of the same size is bound on that node).

After each phase a checker compares gpu-aware's ledger (``GET /debug/ledger``), the
device plugin's view (what Allocate handed out, per pod) and the API (the pods'
``gpuk8s.io/sharing.assigned`` annotations): stale and missing bookings, and GPUs booked
beyond 100 %.

    flock /tmp/gpuk8s-lab.lock .venv/bin/python benchmarks/replay.py      (default trace)
    benchmarks/replay.py --lab-lock /tmp/gpuk8s-lab.lock                  (takes the lock
        itself after the in-process figure)

Everything it created (nodes, namespace, processes) is removed at the end.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import fcntl
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
LAB = REPO / "lab"
sys.path.insert(0, str(LAB))
sys.path.insert(0, str(REPO / "benchmarks"))
import fake_nodes  # noqa: E402  (lab/fake_nodes.py: the API client, node objects, heartbeat)
import packing  # noqa: E402  (benchmarks/packing.py: trace, workload, node shapes, figure)
from scheduling import cache_bin, cpu_seconds, versions  # noqa: E402
from stats import Buckets, histogram_quantile, percentile  # noqa: E402

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

KUBECONFIG = "/etc/kubernetes/admin.conf"
NS = "gpuk8s-replay"
SCHEDULER_NAME = "gpuk8s-replay"
RUN_LABEL = "lab.gpuk8s.io/replay"  # on the replay's nodes and pods
HOLD_LABEL = "lab.gpuk8s.io/hold-allocate"  # the fake kubelet leaves such a pod alone
GPU_TAINT = {"key": "metax-tech.com/gpu", "value": "present", "effect": "PreferNoSchedule"}
BUSYBOX = "127.0.0.1:5000/gpuk8s/lab-busybox:1.0"
ROLE_DEFAULTS = REPO / "roles" / "gpu_aware" / "defaults" / "main.yml"
LOCK = "/tmp/gpuk8s-lab.lock"
LAB_RUN = Path(os.environ.get("GPUK8S_LAB_STATE", "/var/lib/gpuk8s-lab")) / "run"  # pid files
LEASE = "gpu-aware"  # with --replicas 2: the replicas' Lease in the replay namespace
RESERVED = Path("/tmp/gpuk8s-lab.reserved")
MILLI = packing.MILLI
PHASES = ("fill", "churn", "faults")
FAULTS = ("extender-kill", "kubelet-restart", "node-delete", "delete-before-allocate")
LEADER_FAULTS = ("leader-loss",)  # with --replicas 2
PREFIX = {"fill": "f", "churn": "c", "fault": "x", "load": "l"}  # of the pods' names
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
            "schedulerName": SCHEDULER_NAME,
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
        with self.cond:
            return self.cond.wait_for(predicate, timeout)

    def close(self) -> None:
        self.stop.set()


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


def scheduler_config(path: Path, extender_url: str) -> None:
    """The configuration the gpu_aware role writes (extender with bind, node cache, the
    role's managedResources, the ``packing`` profile) for a second scheduler of ours."""
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


# ----------------------------------------------------------------------------- the run
@dataclass
class Options:
    data: Path = packing.DATA
    seed: int = 42
    every: int = 1  # keep every Nth node of the trace
    window: int = 1
    phases: tuple[str, ...] = PHASES
    churn: int = 1000
    churn_parallel: int = 16
    faults: tuple[str, ...] = FAULTS
    taint_cores_per_gpu: float = packing.TAINT_CORES_PER_GPU
    extender_port: int = 18090
    replicas: int = 1  # gpu-aware replicas; more than one elect a leader
    fill_timeout: float = 1800.0
    max_pods: int | None = None  # stop the fill earlier (tests)
    keep: bool = False


@dataclass
class FillResult:
    pods: int = 0
    arrived_milli: int = 0
    allocated_milli: int = 0
    capacity_milli: int = 0
    placed: int = 0
    failed: dict[int, int] = field(default_factory=dict)
    inside: list[int] = field(default_factory=lambda: [0, 0])
    seconds: float = 0.0
    scheduler_errors: int = 0
    retried_before_delete: int = 0
    latency: dict[str, dict[str, float | None]] = field(default_factory=dict)
    cpu_s: dict[str, float] = field(default_factory=dict)  # process -> CPU seconds spent

    @property
    def allocation(self) -> float:
        return 100 * self.allocated_milli / max(self.capacity_milli, 1)

    @property
    def rate(self) -> float:
        return self.pods / max(self.seconds, 1e-9)


@dataclass
class ChurnResult:
    cycles: int = 0
    measured: int = 0  # Q waited, P was deleted, Q was bound
    fit_at_once: int = 0  # Q was bound before any release
    stuck: list[str] = field(default_factory=list)  # Q not bound within the timeout
    latencies_s: list[float] = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class FaultResult:
    """One fault: ``ok`` when the expected behaviour happened (times are reported apart)."""

    name: str
    recovery_s: float | None = None
    details: dict[str, Any] = field(default_factory=dict)
    ok: bool = False


@dataclass
class Report:
    options: dict[str, Any]
    nodes: int = 0
    gpus: int = 0
    fill: FillResult | None = None
    churn: ChurnResult | None = None
    faults: list[FaultResult] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    placed_or_failed_once: bool = True
    packing_row: dict[str, Any] | None = None
    packing_seconds: float = 0.0
    setup_seconds: float = 0.0
    total_seconds: float = 0.0
    work: str = ""


class Replay:
    """One run on the lab: set up, phases, clean up (``run``)."""

    def __init__(self, options: Options, work: Path) -> None:
        self.o = options
        self.work = work
        self.api = fake_nodes.Api(KUBECONFIG)
        self.run_id = f"r{os.getpid()}"
        specs, self.trace = packing.load(options.data)
        self.specs = specs[:: options.every]
        self.capacity = sum(s.gpus for s in self.specs)
        self.order = packing.workload(self.trace, self.capacity, options.seed)
        self.shapes = shapes()
        self.shape_of = {node_name(s): self.shapes[s.gpus] for s in self.specs}
        self.cluster = Cluster(self.api)
        self.kubelet = FakeKubelet(self.api, self.cluster, self.shape_of)
        self.extenders = [
            Extender(work, options.extender_port + i, elect=options.replicas > 1)
            for i in range(options.replicas)
        ]
        self.proxy: LeaderProxy | None = None
        self.procs: list[subprocess.Popen[bytes]] = []
        self.scheduler: subprocess.Popen[bytes] | None = None
        self.deleter = ThreadPoolExecutor(4, thread_name_prefix="replay-delete")
        self.rng = random.Random(options.seed)
        self.placed: dict[str, tuple[str, packing.PodSpec]] = {}  # GPU pod name -> (node, spec)
        self.specs_by_pod: dict[str, packing.PodSpec] = {}
        self.next_arrival = 0
        self.counter = 0
        self.report = Report(options=_jsonable(asdict(options)), work=str(work))

    # -- set-up -----------------------------------------------------------------------
    def setup(self) -> None:
        t0 = now()
        self._delete_namespace()
        status, body = self.api.request(
            "POST",
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
        )
        if status not in (201, 409):
            raise SystemExit(f"namespace {NS}: HTTP {status}: {body}")
        heartbeat = open(self.work / "heartbeat.log", "wb")  # noqa: SIM115 (as the process)
        self.procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    str(LAB / "fake_nodes.py"),
                    "heartbeat",
                    "--interval",
                    str(HEARTBEAT_S),
                ],
                stdout=heartbeat,
                stderr=subprocess.STDOUT,
            )
        )
        objects = [
            node_object(s, self.shapes[s.gpus], self.run_id, self.o.taint_cores_per_gpu)
            for s in self.specs
        ]
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda n: fake_nodes.register(self.api, n), objects))
        self.report.nodes, self.report.gpus = len(objects), self.capacity
        print(
            f"fake nodes: {len(objects)} ({self.capacity} GPUs, vcuda) in {now() - t0:.1f}s",
            flush=True,
        )
        for _ in range(120):  # pods need the default ServiceAccount
            path = f"/api/v1/namespaces/{NS}/serviceaccounts/default"
            if self.api.request("GET", path)[0] == 200:
                break
            time.sleep(0.5)
        self.cluster.start()
        for extender in self.extenders:
            extender.start()
        for extender in self.extenders:
            extender.wait_ready(120)
        url = self.extenders[0].url
        if len(self.extenders) > 1:
            self.proxy = LeaderProxy(self.api, self.extenders, self.o.extender_port + 10)
            deadline = now() + 60
            while not self.proxy.holder() and now() < deadline:
                time.sleep(0.2)
            if not self.proxy.holder():
                raise SystemExit(f"no gpu-aware replica took the Lease {NS}/{LEASE}")
            url = self.proxy.url
        config = self.work / "scheduler.json"
        scheduler_config(config, url)
        log = open(self.work / "kube-scheduler.log", "wb")  # noqa: SIM115 (as the process)
        self.scheduler = subprocess.Popen(
            [cache_bin("kube-scheduler"), f"--config={config}", "--secure-port=0", "--v=1"],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.procs.append(self.scheduler)
        self.report.setup_seconds = now() - t0
        print(f"set-up: {self.report.setup_seconds:.1f}s (logs: {self.work})", flush=True)

    def cleanup(self) -> None:
        self.cluster.close()
        for proc in reversed(self.procs):
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        if self.proxy is not None:
            self.proxy.close()
        for extender in self.extenders:
            extender.stop()
        self.kubelet.close()
        self.deleter.shutdown(wait=True)
        if self.o.keep:
            return
        self._delete_namespace()
        status, body = self.api.request("GET", f"/api/v1/nodes?labelSelector={RUN_LABEL}")
        items = (body or {}).get("items", []) if status == 200 else []
        names = [n["metadata"]["name"] for n in items]
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda n: fake_nodes.delete_node(self.api, n), names))
        print(f"cleaned up: namespace {NS}, {len(names)} fake nodes", flush=True)

    def _delete_namespace(self) -> None:
        self.api.request("DELETE", f"/api/v1/namespaces/{NS}/pods?gracePeriodSeconds=0")
        self.api.request("DELETE", f"/api/v1/namespaces/{NS}")
        for _ in range(240):
            if self.api.request("GET", f"/api/v1/namespaces/{NS}")[0] == 404:
                return
            time.sleep(0.5)
        raise SystemExit(f"namespace {NS} still there after 120 s")

    # -- pods -------------------------------------------------------------------------
    def create(
        self,
        spec: packing.PodSpec,
        phase: str,
        node: str | None = None,
        labels: dict[str, str] | None = None,
    ) -> str:
        self.counter += 1
        name = f"{PREFIX[phase]}{self.counter:06d}"
        self.specs_by_pod[name] = spec
        status, body = self.api.request(
            "POST",
            f"/api/v1/namespaces/{NS}/pods",
            pod_object(name, spec, self.run_id, phase, node, labels),
        )
        if status != 201:
            raise SystemExit(f"pod {name}: HTTP {status}: {str(body)[:300]}")
        return name

    def delete(self, name: str) -> None:
        self.api.request("DELETE", f"/api/v1/namespaces/{NS}/pods/{name}?gracePeriodSeconds=0")

    def _decided(self, name: str) -> bool:
        return name in self.cluster.bound_at or name in self.cluster.unschedulable_at

    def _arrival(self) -> packing.PodSpec:
        """The next pod of the seed's sequence (resampled further when it runs out)."""
        if self.next_arrival >= len(self.order):
            self.order.append(self.trace[self.rng.randrange(len(self.trace))])
        spec = self.order[self.next_arrival]
        self.next_arrival += 1
        return spec

    # -- fill -------------------------------------------------------------------------
    def fill(self) -> FillResult:
        result = FillResult(capacity_milli=self.capacity * MILLI)
        before = self.metrics()
        cpu_before = self.cpu()
        cluster = self.cluster
        names: list[str] = []
        deleted: set[str] = set()
        inflight: list[str] = []

        def on_event(kind: str, pod: dict[str, Any]) -> None:  # fail once: delete at once
            name = pod["metadata"]["name"]
            if (
                kind != "DELETED"
                and name in cluster.unschedulable_at
                and name not in cluster.bound_at
                and name not in deleted
                and pod["metadata"]["labels"].get("phase") == "fill"
            ):
                deleted.add(name)
                self.deleter.submit(self.delete, name)

        cluster.listeners.append(on_event)
        t0 = now()
        try:
            while result.arrived_milli < result.capacity_milli:
                if self.o.max_pods is not None and len(names) >= self.o.max_pods:
                    break
                if not cluster.wait(
                    lambda: sum(1 for n in inflight if not self._decided(n)) < self.o.window,
                    self.o.fill_timeout,
                ):
                    raise SystemExit("fill: no scheduling decision within the timeout")
                inflight[:] = [n for n in inflight if not self._decided(n)]
                spec = self._arrival()
                name = self.create(spec, "fill")
                names.append(name)
                inflight.append(name)
                result.arrived_milli += spec.requested
                if len(names) % 500 == 0:
                    print(f"  fill: {len(names)} pods, {now() - t0:.0f}s", flush=True)
            if not cluster.wait(lambda: all(map(self._decided, names)), self.o.fill_timeout):
                raise SystemExit("fill: pods left without a decision")
            last = max(
                min(cluster.bound_at.get(n, 1e18), cluster.unschedulable_at.get(n, 1e18))
                for n in names
            )
        finally:
            cluster.listeners.remove(on_event)
        result.seconds = last - t0
        result.pods = len(names)
        result.latency = latency_figures(before, self.metrics())
        cpu_after = self.cpu()
        result.cpu_s = {k: cpu_after[k] - cpu_before.get(k, 0.0) for k in cpu_after}
        for name in names:
            spec = self.specs_by_pod[name]
            if name in cluster.bound_at and (
                name not in cluster.unschedulable_at
                or cluster.bound_at[name] < cluster.unschedulable_at[name]
            ):
                result.placed += 1
                result.allocated_milli += spec.requested
                pod = cluster.pods.get(name)
                if spec.gpus and pod is not None:
                    self.placed[name] = (pod["spec"]["nodeName"], spec)
                    a = assignment_of(pod)
                    if spec.gpus >= 2 and a is not None:
                        result.inside[0] += self.shape_of[a.node].inside_one_group(a.gpus)
                        result.inside[1] += 1
            else:
                result.failed[spec.gpus] = result.failed.get(spec.gpus, 0) + 1
                result.retried_before_delete += cluster.retries[name] > 0
        result.scheduler_errors = sum(cluster.scheduler_errors[n] for n in names)
        # FGD's protocol: a pod decided once (bound, or Unschedulable and deleted) and a
        # failed one never bound afterwards
        self.report.placed_or_failed_once = all(
            not (
                n in cluster.unschedulable_at
                and n in cluster.bound_at
                and cluster.bound_at[n] > cluster.unschedulable_at[n]
            )
            for n in names
        )
        return result

    # -- churn ------------------------------------------------------------------------
    def churn(self, cycles: int, parallel: int, timeout: float = 60.0) -> ChurnResult:
        result = ChurnResult()
        lock = threading.Lock()
        busy: set[str] = set()
        done = [0]
        t0 = now()

        def pick() -> tuple[str, str, packing.PodSpec] | None:
            with lock:
                names = [n for n, (node, _) in self.placed.items() if node not in busy]
                if not names:
                    return None
                name = names[self.rng.randrange(len(names))]
                node, spec = self.placed.pop(name)
                busy.add(node)
                return name, node, spec

        def cycle() -> None:
            picked = pick()
            if picked is None:
                return
            victim, node, spec = picked
            try:
                with lock:
                    probe = self.create(spec, "churn", node=node)
                decided = self.cluster.wait(lambda: self._decided(probe), timeout)
                if decided and probe in self.cluster.bound_at:
                    with lock:
                        result.fit_at_once += 1
                    self.delete(victim)
                else:
                    self.delete(victim)
                    self.cluster.wait(lambda: victim in self.cluster.gone_at, timeout)
                    bound = self.cluster.wait(lambda: probe in self.cluster.bound_at, timeout)
                    with lock:
                        if bound and victim in self.cluster.gone_at:
                            result.measured += 1
                            result.latencies_s.append(
                                self.cluster.bound_at[probe] - self.cluster.gone_at[victim]
                            )
                        else:
                            result.stuck.append(probe)
                with lock:
                    if probe in self.cluster.bound_at:
                        self.placed[probe] = (node, spec)
            finally:
                with lock:
                    busy.discard(node)
                    done[0] += 1
                    if done[0] % 200 == 0:
                        print(f"  churn: {done[0]} cycles, {now() - t0:.0f}s", flush=True)

        with ThreadPoolExecutor(parallel, thread_name_prefix="churn") as pool:
            list(pool.map(lambda _: cycle(), range(cycles)))
        result.cycles = done[0]
        result.seconds = now() - t0
        return result

    # -- faults -----------------------------------------------------------------------
    @contextlib.contextmanager
    def load(self, rate: float = 4.0) -> Iterator[dict[str, int]]:
        """Background load for the faults: arrivals of the sequence (a pod that finds no
        room is deleted) and deletions of random placed GPU pods, ``rate`` of each per
        second."""
        stop = threading.Event()
        counts = {"created": 0, "deleted": 0}

        def run() -> None:
            while not stop.wait(1.0 / rate):
                with contextlib.suppress(Exception):
                    name = self.create(self._arrival(), "load")
                    counts["created"] += 1
                    with self.cluster.cond:
                        names = list(self.placed)
                    if names:
                        victim = names[self.rng.randrange(len(names))]
                        self.placed.pop(victim, None)
                        self.delete(victim)
                        counts["deleted"] += 1
                    self.deleter.submit(self._settle_load_pod, name)

        thread = threading.Thread(target=run, name="replay-load", daemon=True)
        thread.start()
        try:
            yield counts
        finally:
            stop.set()
            thread.join()

    def _settle_load_pod(self, name: str) -> None:
        if self.cluster.wait(lambda: self._decided(name), 120):
            if name in self.cluster.unschedulable_at and name not in self.cluster.bound_at:
                self.delete(name)
            elif name in self.cluster.bound_at:
                pod = self.cluster.pods.get(name)
                spec = self.specs_by_pod[name]
                if pod is not None and spec.gpus:
                    self.placed[name] = (pod["spec"]["nodeName"], spec)

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far of the processes the replay drives (where the time goes)."""
        pids: dict[str, list[int]] = {
            "gpu-aware": [e.proc.pid for e in self.extenders if e.proc is not None],
            "kube-scheduler": [self.scheduler.pid] if self.scheduler is not None else [],
            "harness": [os.getpid()],
        }
        for daemon in ("kube-apiserver", "etcd"):
            with contextlib.suppress(OSError, ValueError):
                pids[daemon] = [int((LAB_RUN / f"{daemon}.pid").read_text().split()[0])]
        return {name: sum(map(cpu_seconds, found)) for name, found in pids.items()}

    def leader(self) -> Extender:
        """The replica kube-scheduler reaches (the only one, or the Lease holder)."""
        if self.proxy is not None and self.proxy.leader is not None:
            return self.proxy.leader
        return self.extenders[0]

    def metrics(self) -> str:
        """Every replica's /metrics, one after the other (histograms add up)."""
        return "\n".join(e.get("/metrics").decode() for e in self.extenders if e.ready())

    def _small_gpu_pod(self) -> packing.PodSpec:
        return packing.PodSpec("probe-gpu", 1000, 1024, 1, 100)  # vcuda-core 10

    def _cpu_pod(self) -> packing.PodSpec:
        return packing.PodSpec("probe-cpu", 100, 64, 0, 0)

    def fault_extender_kill(self, down_s: float = 5.0) -> FaultResult:
        fault = FaultResult("gpu-aware SIGKILL + restart")
        extender = self.leader()
        t_kill = extender.kill()
        gpu = [self.create(self._small_gpu_pod(), "fault") for _ in range(5)]
        cpu = [self.create(self._cpu_pod(), "fault") for _ in range(5)]
        cpu_bound = self.cluster.wait(lambda: all(n in self.cluster.bound_at for n in cpu), 30)
        rest = down_s - (now() - t_kill)
        if rest > 0:
            time.sleep(rest)
        gpu_bound_while_down = sum(1 for n in gpu if n in self.cluster.bound_at)
        t_start = extender.start()
        t_ready = extender.wait_ready(60)
        all_bound = self.cluster.wait(lambda: all(n in self.cluster.bound_at for n in gpu), 120)
        first = min(
            (self.cluster.bound_at[n] for n in gpu if n in self.cluster.bound_at), default=None
        )
        fault.recovery_s = t_ready - t_start
        fault.details = {
            "down_s": round(t_start - t_kill, 2),
            "gpu_pods_bound_while_down": gpu_bound_while_down,
            "cpu_pods_bound_while_down": sum(
                1 for n in cpu if n in self.cluster.bound_at and self.cluster.bound_at[n] < t_start
            ),
            "serving_after_restart_s": round(t_ready - t_start, 2),
            "first_gpu_bind_after_restart_s": None if first is None else round(first - t_start, 2),
            "gpu_pods_bound_after_restart": sum(1 for n in gpu if n in self.cluster.bound_at),
        }
        fault.details["target_serving_within_10_s"] = t_ready - t_start <= 10
        fault.ok = bool(cpu_bound and all_bound and gpu_bound_while_down == 0)
        for name in gpu + cpu:
            self.delete(name)
        return fault

    def fault_leader_loss(self, timeout: float = 90.0) -> FaultResult:
        """The leading replica SIGKILLed and not restarted (its node lost): the other
        takes the Lease once it expired and books from then on."""
        fault = FaultResult("gpu-aware leader lost (2 replicas)")
        assert self.proxy is not None, "leader-loss needs --replicas 2"
        old = self.leader()
        t_kill = old.kill()
        gpu = [self.create(self._small_gpu_pod(), "fault") for _ in range(5)]
        deadline = now() + timeout
        while now() < deadline and self.proxy.holder() in ("", old.identity):
            time.sleep(0.1)
        t_lease = now() if self.proxy.holder() not in ("", old.identity) else None
        bound = self.cluster.wait(lambda: all(n in self.cluster.bound_at for n in gpu), timeout)
        first = min((self.cluster.bound_at[n] for n in gpu if n in self.cluster.bound_at),
                    default=None)  # fmt: skip
        fault.recovery_s = None if first is None else first - t_kill
        fault.details = {
            "new_leader": self.proxy.holder(),
            "lease_taken_after_s": None if t_lease is None else round(t_lease - t_kill, 2),
            "first_gpu_bind_after_kill_s": None if first is None else round(first - t_kill, 2),
            "gpu_pods_bound": sum(1 for n in gpu if n in self.cluster.bound_at),
        }
        fault.ok = bool(bound and t_lease is not None)
        old.start()  # back as the standby
        old.wait_ready(60)
        for name in gpu:
            self.delete(name)
        return fault

    def fault_kubelet_restart(self) -> FaultResult:
        fault = FaultResult("kubelet restart (the lab's real node)")
        node = _real_node(self.api)
        if node is None:
            fault.details = {"error": "no real (non-fake) node in the lab"}
            return fault
        gpu_resources = _gpu_allocatable(self.api, node)
        before_bound = len(self.cluster.bound_at)
        t0 = now()
        subprocess.run(
            [str(LAB / "ctl"), "restart", "kubelet"], check=True, stdout=subprocess.DEVNULL
        )
        t_cmd = now()

        def back() -> bool:
            return (
                _node_ready_since(self.api, node, t0)
                and _gpu_allocatable(self.api, node) == gpu_resources
            )

        deadline = now() + 180
        while now() < deadline and not back():
            time.sleep(0.5)
        recovered = back()
        fault.recovery_s = now() - t0 if recovered else None
        fault.details = {
            "node": node,
            "restart_command_s": round(t_cmd - t0, 2),
            "gpu_allocatable": gpu_resources,
            "fake_node_binds_meanwhile": len(self.cluster.bound_at) - before_bound,
        }
        fault.ok = recovered
        return fault

    def fault_node_delete(self, timeout: float = 180.0) -> FaultResult:
        fault = FaultResult("fake node deleted with pods on it")
        per_node: collections.Counter[str] = collections.Counter(n for n, _ in self.placed.values())
        if not per_node:
            fault.details = {"error": "no placed GPU pod"}
            return fault
        node = per_node.most_common(1)[0][0]
        with self.cluster.cond:
            on_node = {
                p["metadata"]["uid"]: n
                for n, p in self.cluster.pods.items()
                if p["spec"].get("nodeName") == node
            }
        for name in [n for n, (nd, _) in self.placed.items() if nd == node]:
            self.placed.pop(name, None)
        t0 = now()
        fake_nodes.delete_node(self.api, node)

        def cleared() -> bool:
            ledger = self.leader().ledger().get("assignments", {})
            with self.cluster.cond:
                left = [n for n in on_node.values() if n in self.cluster.pods]
            return not left and not any(uid in ledger for uid in on_node)

        deadline = now() + timeout
        while now() < deadline and not cleared():
            time.sleep(0.5)
        done = cleared()
        fault.recovery_s = now() - t0 if done else None
        fault.details = {"node": node, "pods_on_it": len(on_node)}
        fault.ok = done
        self.shape_of.pop(node, None)
        return fault

    def fault_delete_before_allocate(self, timeout: float = 60.0) -> FaultResult:
        """A pod bound but not allocated yet is deleted; a pod of the same size pinned to
        the same node must then be bound (not wait for the deleted pod's Allocate), and
        the device plugin must hand it its own GPUs."""
        fault = FaultResult("pod deleted between bind and Allocate")
        # vcuda-core 1: room for two on the node the first goes to, however full it is
        spec = packing.PodSpec("probe-hold", 100, 64, 1, 10)
        held = self.create(spec, "fault", labels={HOLD_LABEL: "true"})
        if not self.cluster.wait(lambda: held in self.cluster.bound_at, timeout):
            fault.details = {"error": "the held pod was not bound"}
            self.delete(held)
            return fault
        node = self.cluster.pods[held]["spec"]["nodeName"]
        second = self.create(spec, "fault", node=node)
        time.sleep(1.0)  # the second pod's bind now waits for the held pod's Allocate
        waited = second not in self.cluster.bound_at
        t0 = now()
        self.delete(held)
        bound = self.cluster.wait(lambda: second in self.cluster.bound_at, timeout)
        t_bound = self.cluster.bound_at.get(second)
        allocated = self.cluster.wait(
            lambda: (
                (
                    self.cluster.pods.get(second, {}).get("metadata", {}).get("annotations") or {}
                ).get(PHASE_ANNOTATION)
                == PHASE_ALLOCATED
            ),
            timeout,
        )
        pod = self.cluster.pods.get(second)
        a = assignment_of(pod) if pod else None

        def device_gpus() -> tuple[int, ...] | None:
            return {name: gpus for name, _, gpus in self.kubelet.view().values()}.get(second)

        # the phase annotation is written inside Allocate; the fake kubelet records what
        # Allocate returned only after it returns, so the watch can show "allocated" first
        deadline = now() + timeout
        while allocated and device_gpus() is None and now() < deadline:
            time.sleep(0.05)
        got = device_gpus()
        own = a is not None and got == tuple(sorted(a.gpus))
        fault.recovery_s = (t_bound - t0) if bound and t_bound is not None else None
        fault.details = {
            "node": node,
            "second_waited_for_the_held_pod": waited,
            "second_turned_away": second in self.cluster.unschedulable_at,
            "second_bound": bound,
            "second_allocated_its_own_gpus": own,
            "second_allocated": allocated,
            "assigned_gpus": None if a is None else sorted(a.gpus),
            "device_plugin_gpus": got,
        }
        fault.ok = bool(waited and bound and allocated and own)
        self.delete(second)
        return fault

    def faults(self, names: Sequence[str]) -> list[FaultResult]:
        """Each fault under load; the check after it once the load stopped."""
        out = []
        for name in names:
            fn = {
                "extender-kill": self.fault_extender_kill,
                "kubelet-restart": self.fault_kubelet_restart,
                "node-delete": self.fault_node_delete,
                "delete-before-allocate": self.fault_delete_before_allocate,
                "leader-loss": self.fault_leader_loss,
            }[name]
            with self.load() as counts:
                result = fn()
            result.details["background_load"] = dict(counts)
            out.append(result)
            print(
                f"  fault: {result.name}: recovery {_s(result.recovery_s)}, "
                f"{'ok' if result.ok else 'FAILED'} {result.details}",
                flush=True,
            )
            self.report.checks.append(self.check(f"after {name}"))
        return out

    # -- checks and the whole run -------------------------------------------------------
    def check(self, phase: str) -> Check:
        result = check(phase, self.api, self.extenders, self.kubelet)
        print("  " + result.line(), flush=True)
        return result

    def run(self) -> Report:
        t0 = now()
        note = packing.model_note(self.o.data)
        if note:
            print(note, flush=True)
        try:
            self.setup()
            if "fill" in self.o.phases:
                self.report.fill = self.fill()
                f = self.report.fill
                print(
                    f"fill: {f.pods} pods in {f.seconds:.0f}s ({f.rate:.1f} pods/s), "
                    f"allocated {f.allocation:.2f} %",
                    flush=True,
                )
                self.report.checks.append(self.check("after fill"))
            if "churn" in self.o.phases and self.o.churn:
                self.report.churn = self.churn(self.o.churn, self.o.churn_parallel)
                c = self.report.churn
                print(
                    f"churn: {c.cycles} cycles in {c.seconds:.0f}s, {c.measured} measured",
                    flush=True,
                )
                self.report.checks.append(self.check("after churn"))
            if "faults" in self.o.phases and self.o.faults:
                self.report.faults = self.faults(self.o.faults)
        finally:
            self.cleanup()
            self.report.total_seconds = now() - t0
        return self.report


# ----------------------------------------------------------------------------- helpers
def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _jsonable(data: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(data, default=str))


def _real_node(api: fake_nodes.Api) -> str | None:
    status, body = api.request("GET", f"/api/v1/nodes?labelSelector=!{fake_nodes.FAKE_LABEL}")
    items = body.get("items", []) if status == 200 else []
    return items[0]["metadata"]["name"] if items else None


def _node(api: fake_nodes.Api, name: str) -> dict[str, Any]:
    status, body = api.request("GET", f"/api/v1/nodes/{name}")
    return body if status == 200 and isinstance(body, dict) else {}


def _gpu_allocatable(api: fake_nodes.Api, name: str) -> dict[str, str]:
    allocatable = (_node(api, name).get("status") or {}).get("allocatable") or {}
    return {k: v for k, v in allocatable.items() if "/" in k and v != "0"}


def _node_ready_since(api: fake_nodes.Api, name: str, since: float) -> bool:
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


def in_process_figure(o: Options) -> tuple[dict[str, Any], float]:
    """``packing.py``'s sharing row for the same trace, seed and nodes."""
    t0 = now()
    rows = packing.run(
        [o.seed], [packing.SHARING], o.data, o.every, jobs=1, taint=o.taint_cores_per_gpu
    )
    (row,) = [r for r in rows if r["policy"] == packing.SHARING]
    return row, now() - t0


@contextlib.contextmanager
def lab_lock(path: str | None) -> Iterator[None]:
    if path is None:
        yield
        return
    with open(path, "a") as handle:
        print(f"waiting for the lab lock {path} ...", flush=True)
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            if RESERVED.exists():
                raise SystemExit(f"the lab is reserved: {RESERVED.read_text().strip()}")
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# ----------------------------------------------------------------------------- output
def share_text(counts: Sequence[int]) -> str:
    inside, total = counts
    return f"{100 * inside / total:.1f} % ({inside}/{total})" if total else "-"


def failed_text(counts: dict[Any, Any]) -> str:
    return " ".join(f"{k}:{v}" for k, v in sorted((int(k), v) for k, v in counts.items())) or "-"


def render(report: Report) -> str:
    o = report.options
    lines = [
        f"openb replay through the real kube-scheduler {versions()['KUBE_VERSION']} and "
        f"gpu-aware (HTTP), seed {o['seed']}: {report.nodes} fake nodes, {report.gpus} GPUs "
        f"(vcuda sharing), window {o['window']}; set-up {report.setup_seconds:.0f}s, "
        f"total {report.total_seconds:.0f}s"
    ]
    f, row = report.fill, report.packing_row
    if f is not None:
        inside = share_text(f.inside)
        lines += [
            "",
            "| figure | replay (lab: API server, kube-scheduler, gpu-aware) "
            "| packing.py (in-process) |",
            "|---|---|---|",
        ]
        p_alloc = p_failed = p_inside = in_process = "-"
        if row is not None:
            p_alloc = f"{row['alloc100']:.2f} %"
            p_failed = failed_text(row["failed100"])
            p_inside = share_text(row["inside"])
            in_process = f"{report.packing_seconds:.0f} s for the seed (to arrived 130 %)"
        lines += [
            f"| allocated at arrived 100 % | {f.allocation:.2f} % | {p_alloc} |",
            f"| failed pods by GPU count | {failed_text(f.failed)} | {p_failed} |",
            f"| multi-GPU pods inside one link group | {inside} | {p_inside} |",
            f"| pods / s | {f.rate:.1f} ({f.pods} pods in {f.seconds:.0f} s) | {in_process} |",
        ]
        if f.cpu_s and f.pods:
            cpu = ", ".join(f"{k} {1e3 * v / f.pods:.1f}" for k, v in f.cpu_s.items())
            lines.append(f"| CPU ms per pod (this machine: 2 cores, shared) | {cpu} | - |")
        for verb in ("filter", "prioritize", "bind"):
            lat = f.latency.get(verb, {})
            p50, p99 = lat.get("p50_ms"), lat.get("p99_ms")
            text = "-"
            if p50 is not None and p99 is not None:
                text = f"{p50:.1f} / {p99:.1f} ms ({lat['count']:.0f} calls)"
            lines.append(f"| gpu-aware {verb} p50 / p99 | {text} | - |")
        if row is not None:
            lines.append(
                f"\nreplay − in-process: {f.allocation - row['alloc100']:+.2f} points; "
                f"scheduling errors retried {f.scheduler_errors}, failed pods retried before "
                f"their deletion {f.retried_before_delete}; each pod placed or failed once: "
                f"{'yes' if report.placed_or_failed_once else 'NO'}"
            )
    c = report.churn
    if c is not None:
        p50, p99 = percentile(c.latencies_s, 0.5), percentile(c.latencies_s, 0.99)
        lines += [
            "",
            f"churn: {c.cycles} cycles (a GPU pod deleted, a pod of its shape pinned to its "
            f"node arrives) in {c.seconds:.0f}s; {c.measured} waited and were bound after the "
            f"release, {c.fit_at_once} fitted at once, {len(c.stuck)} not bound within 60 s",
            f"  release -> bind of the waiting pod: p50 {_s(p50)}, p99 {_s(p99)}, "
            f"max {_s(max(c.latencies_s) if c.latencies_s else None)}",
        ]
    if report.faults:
        lines += ["", "| fault (under load) | recovery | result | details |", "|---|---|---|---|"]
        for fault in report.faults:
            details = ", ".join(f"{k}={v}" for k, v in fault.details.items())
            lines.append(
                f"| {fault.name} | {_s(fault.recovery_s)} | "
                f"{'ok' if fault.ok else 'FAILED'} | {details} |"
            )
    if report.checks:
        lines += ["", "consistency (gpu-aware's ledger, device plugin, API):"]
        lines += ["  " + check_.line() for check_ in report.checks]
        stale = sum(check_.stale for check_ in report.checks)
        lines.append(f"  stale bookings over all checks: {stale}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--data", default=str(packing.DATA), help="directory of the openb CSV files")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--every", type=int, default=1, help="keep every Nth node (sub-cluster)")
    ap.add_argument(
        "--window",
        type=int,
        default=1,
        help="pods waiting for a decision at a time during the fill (1: FGD's "
        "one pod after the other)",
    )
    ap.add_argument("--phases", default=",".join(PHASES), help="comma list of fill, churn, faults")
    ap.add_argument("--churn", type=int, default=1000, help="churn cycles")
    ap.add_argument("--churn-parallel", type=int, default=16)
    ap.add_argument(
        "--faults",
        default=None,
        help=f"comma list of {', '.join(FAULTS + LEADER_FAULTS)} (default: "
        f"{', '.join(FAULTS)}; with --replicas 2 also {', '.join(LEADER_FAULTS)})",
    )
    ap.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="gpu-aware replicas (2: they elect a leader on a Lease; kube-scheduler reaches "
        "the leader through a local stand-in of the chart's Service)",
    )
    ap.add_argument("--taint-cores-per-gpu", type=float, default=packing.TAINT_CORES_PER_GPU)
    ap.add_argument("--max-pods", type=int, default=None, help="stop the fill after this many")
    ap.add_argument("--extender-port", type=int, default=18090)
    ap.add_argument(
        "--no-in-process",
        action="store_true",
        help="skip packing.py's figure (saves about 2 minutes)",
    )
    ap.add_argument(
        "--lab-lock",
        default=None,
        metavar="PATH",
        help=f"take the lab lock (e.g. {LOCK}) for the lab part only",
    )
    ap.add_argument("--json", default=None, help="also write the report as JSON here")
    ap.add_argument("--keep", action="store_true", help="leave nodes and pods (debugging)")
    args = ap.parse_args(argv)
    phases = tuple(p for p in args.phases.split(",") if p)
    if args.replicas not in (1, 2):
        raise SystemExit(f"--replicas: {args.replicas} must be 1 or 2")
    allowed_faults = FAULTS + (LEADER_FAULTS if args.replicas > 1 else ())
    default = ",".join(allowed_faults)
    faults = tuple(f for f in (args.faults if args.faults is not None else default).split(",") if f)
    for value, allowed, flag in (
        (phases, PHASES, "--phases"),
        (faults, allowed_faults, "--faults"),
    ):
        unknown = sorted(set(value) - set(allowed))
        if unknown:
            raise SystemExit(f"{flag}: unknown {unknown}; use {', '.join(allowed)}")
    if args.window < 1:
        raise SystemExit(f"--window: {args.window} must be 1 or more")
    options = Options(
        data=Path(args.data),
        seed=args.seed,
        every=args.every,
        window=args.window,
        phases=phases,
        churn=args.churn,
        churn_parallel=args.churn_parallel,
        faults=faults,
        taint_cores_per_gpu=args.taint_cores_per_gpu,
        extender_port=args.extender_port,
        replicas=args.replicas,
        max_pods=args.max_pods,
        keep=args.keep,
    )
    row, seconds = (None, 0.0)
    if "fill" in phases and not args.no_in_process and args.max_pods is None:
        print("packing.py in-process figure ...", flush=True)
        row, seconds = in_process_figure(options)
    work = Path(tempfile.mkdtemp(prefix="gpuk8s-replay-"))
    with lab_lock(args.lab_lock):
        report = Replay(options, work).run()
    report.packing_row, report.packing_seconds = row, seconds
    print()
    print(render(report))
    if args.json:
        Path(args.json).write_text(json.dumps(asdict(report), indent=1, default=str))
    failed = any(not c.ok for c in report.checks) or any(not f.ok for f in report.faults)
    return 1 if failed or not report.placed_or_failed_once else 0


if __name__ == "__main__":
    sys.exit(main())
