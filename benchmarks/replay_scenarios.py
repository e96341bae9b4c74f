"""The replay's scenarios (``replay.py`` runs them): set up, fill, churn, faults, clean up.

==========================  ============================================================
``Options``                 what to run (the CLI's flags)
``Replay.fill``             the trace in arrival order until 100 % of GPU capacity asked
``Replay.churn``            a waiting pod of a placed pod's shape, the placed pod deleted:
                            release to bind
``Replay.faults``           each fault under background load, with its recovery time
``Replay.run``              the phases, a check after each, cleanup: a ``Report``
``in_process_figure``       ``packing.py``'s figure for the same trace and seed
==========================  ============================================================

Example: ``Replay(Options(phases=("fill",), max_pods=50), work).run().fill.placed`` is how
many of the first 50 pods were bound (``tests/e2e/test_replay_smoke.py`` runs it so).
"""

from __future__ import annotations

import collections
import contextlib
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from replay_harness import (  # first: it puts lab/ on sys.path
    ALONE_SCHEDULER_NAME,
    FAULTS,
    HEARTBEAT_S,
    HOLD_LABEL,
    KUBECONFIG,
    LAB,
    LAB_RUN,
    LEASE,
    MILLI,
    NS,
    PHASES,
    PREFIX,
    RUN_LABEL,
    SCHEDULER_NAME,
    Check,
    Cluster,
    Extender,
    FakeKubelet,
    LeaderProxy,
    assignment_of,
    check,
    fake_nodes,
    gpu_allocatable,
    jsonable,
    latency_figures,
    node_name,
    node_object,
    node_ready_since,
    now,
    packing,
    pod_object,
    real_node,
    scheduler_config,
    seconds_text,
    shapes,
)
from scheduling import cache_bin, cpu_seconds

from gpuk8s.core.sharing import (
    PHASE_ALLOCATED,
    PHASE_ANNOTATION,
)


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
    alone: int = 0  # the fill's first N pods through kube-scheduler alone first (0: not)
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
    # (pods, seconds): the first pods' decisions, as many as the scheduler-alone pass had
    head: tuple[int, float] = (0, 0.0)

    @property
    def allocation(self) -> float:
        return 100 * self.allocated_milli / max(self.capacity_milli, 1)

    @property
    def rate(self) -> float:
        return self.pods / max(self.seconds, 1e-9)


@dataclass
class AloneResult:
    """The fill's first pods through kube-scheduler alone (the same profile, no gpu-aware),
    on the same nodes, before the fill: what the scheduler, the API server and the
    harness do without the extender."""

    pods: int = 0
    placed: int = 0
    seconds: float = 0.0
    cpu_s: dict[str, float] = field(default_factory=dict)

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
    alone: AloneResult | None = None
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
        self.alone_scheduler: subprocess.Popen[bytes] | None = None
        self.deleter = ThreadPoolExecutor(4, thread_name_prefix="replay-delete")
        self.rng = random.Random(options.seed)
        self.placed: dict[str, tuple[str, packing.PodSpec]] = {}  # GPU pod name -> (node, spec)
        self.specs_by_pod: dict[str, packing.PodSpec] = {}
        self.next_arrival = 0
        self.counter = 0
        self.report = Report(options=jsonable(asdict(options)), work=str(work))

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
        self.scheduler = self.start_scheduler("kube-scheduler", url, extender=True)
        if self.o.alone:
            self.alone_scheduler = self.start_scheduler("kube-scheduler-alone", url, False)
        self.report.setup_seconds = now() - t0
        print(f"set-up: {self.report.setup_seconds:.1f}s (logs: {self.work})", flush=True)

    def start_scheduler(self, name: str, url: str, extender: bool) -> subprocess.Popen[bytes]:
        config = self.work / f"{name}.json"
        scheduler_config(config, url, extender)
        log = open(self.work / f"{name}.log", "wb")  # noqa: SIM115 (as the process)
        proc = subprocess.Popen(
            [cache_bin("kube-scheduler"), f"--config={config}", "--secure-port=0", "--v=1"],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.procs.append(proc)
        return proc

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
            pod_object(name, spec, self.run_id, phase, node, labels,
                   ALONE_SCHEDULER_NAME if phase == "alone" else SCHEDULER_NAME),
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
    def admit(
        self, phase: str, arrivals: Iterator[packing.PodSpec], enough: Callable[[list[str]], bool]
    ) -> tuple[list[str], float, float]:
        """FGD's protocol for ``phase``'s pods: created in arrival order, at most
        ``window`` waiting for a decision; one found Unschedulable at its first attempt is
        deleted at once; until the arrivals end or ``enough(names)`` after a creation.
        Returns the pods, the start and the last decision (monotonic)."""
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
                and pod["metadata"]["labels"].get("phase") == phase
            ):
                deleted.add(name)
                self.deleter.submit(self.delete, name)

        cluster.listeners.append(on_event)
        t0 = now()
        try:
            for spec in arrivals:
                if not cluster.wait(
                    lambda: sum(1 for n in inflight if not self._decided(n)) < self.o.window,
                    self.o.fill_timeout,
                ):
                    raise SystemExit(f"{phase}: no scheduling decision within the timeout")
                inflight[:] = [n for n in inflight if not self._decided(n)]
                name = self.create(spec, phase)
                names.append(name)
                inflight.append(name)
                if len(names) % 500 == 0:
                    print(f"  {phase}: {len(names)} pods, {now() - t0:.0f}s", flush=True)
                if enough(names):
                    break
            if not cluster.wait(lambda: all(map(self._decided, names)), self.o.fill_timeout):
                raise SystemExit(f"{phase}: pods left without a decision")
        finally:
            cluster.listeners.remove(on_event)
        return names, t0, max(map(self.decided_at, names), default=t0)

    def decided_at(self, name: str) -> float:
        return min(self.cluster.bound_at.get(name, 1e18),
                   self.cluster.unschedulable_at.get(name, 1e18))

    def alone(self, pods: int) -> AloneResult:
        """The fill's first ``pods`` pods through kube-scheduler without gpu-aware (its
        own scheduler, the same profile), then deleted: the rate and the CPU per pod of
        the rest of the path on the same nodes, before gpu-aware's fill."""
        assert self.alone_scheduler is not None
        cpu_before = self.cpu(self.alone_scheduler)
        names, t0, last = self.admit("alone", iter(self.order[:pods]), lambda _: False)
        cpu_after = self.cpu(self.alone_scheduler)
        result = AloneResult(len(names), sum(n in self.cluster.bound_at for n in names),
                             last - t0)
        result.cpu_s = {k: cpu_after[k] - cpu_before.get(k, 0.0) for k in cpu_after}
        self.alone_scheduler.terminate()
        self.alone_scheduler.wait(10)
        self.api.request("DELETE", f"/api/v1/namespaces/{NS}/pods?labelSelector=phase%3Dalone"
                         "&gracePeriodSeconds=0")
        if not self.cluster.wait(lambda: all(n in self.cluster.gone_at for n in names), 300):
            raise SystemExit("alone: its pods not gone within 300 s")
        return result

    def fill(self) -> FillResult:
        result = FillResult(capacity_milli=self.capacity * MILLI)
        before = self.metrics()
        cpu_before = self.cpu()
        cluster = self.cluster

        def arrivals() -> Iterator[packing.PodSpec]:
            while result.arrived_milli < result.capacity_milli:
                spec = self._arrival()
                result.arrived_milli += spec.requested
                yield spec

        def enough(names: list[str]) -> bool:
            return self.o.max_pods is not None and len(names) >= self.o.max_pods

        names, t0, last = self.admit("fill", arrivals(), enough)
        result.seconds = last - t0
        result.pods = len(names)
        if self.o.alone:  # the same first pods as kube-scheduler alone had
            head = sorted(map(self.decided_at, names))[: self.o.alone]
            result.head = (len(head), head[-1] - t0 if head else 0.0)
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

    def cpu(self, scheduler: subprocess.Popen[bytes] | None = None) -> dict[str, float]:
        """CPU seconds so far of the processes the replay drives (where the time goes);
        ``scheduler``: the kube-scheduler counted (default gpu-aware's)."""
        scheduler = scheduler or self.scheduler
        pids: dict[str, list[int]] = {
            "gpu-aware": [e.proc.pid for e in self.extenders if e.proc is not None],
            "kube-scheduler": [scheduler.pid] if scheduler is not None else [],
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
        node = real_node(self.api)
        if node is None:
            fault.details = {"error": "no real (non-fake) node in the lab"}
            return fault
        gpu_resources = gpu_allocatable(self.api, node)
        before_bound = len(self.cluster.bound_at)
        t0 = now()
        subprocess.run(
            [str(LAB / "ctl"), "restart", "kubelet"], check=True, stdout=subprocess.DEVNULL
        )
        t_cmd = now()

        def back() -> bool:
            return (
                node_ready_since(self.api, node, t0)
                and gpu_allocatable(self.api, node) == gpu_resources
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
                f"  fault: {result.name}: recovery {seconds_text(result.recovery_s)}, "
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
            if self.o.alone:
                self.report.alone = a = self.alone(self.o.alone)
                print(f"kube-scheduler alone: {a.pods} pods in {a.seconds:.0f}s "
                      f"({a.rate:.1f} pods/s), {a.placed} placed", flush=True)
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




def in_process_figure(o: Options) -> tuple[dict[str, Any], float]:
    """``packing.py``'s sharing row for the same trace, seed and nodes."""
    t0 = now()
    rows = packing.run(
        [o.seed], [packing.SHARING], o.data, o.every, jobs=1, taint=o.taint_cores_per_gpu
    )
    (row,) = [r for r in rows if r["policy"] == packing.SHARING]
    return row, now() - t0

