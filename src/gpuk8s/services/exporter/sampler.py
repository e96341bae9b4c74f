"""The exporter's sampling loop: read the GPUs, the kubelet's allocations and the
processes' owners, attribute, record the GPUs in the book of known GPUs (stable labels,
lost GPUs: ``knowngpus``), and keep the result as an immutable snapshot.

Every problem of a sample has a class (``PROBLEM_CLASSES``), counted per class in
``gpuk8s_exporter_sample_problems`` and logged once, when it first appears.

Scrapes never touch a GPU: they render the last snapshot (``metrics.py``), so a scrape
costs the same whether the vendor tool takes 5 ms or 5 s, and many scrapers cannot
multiply the load on the driver. Samples are taken every ``interval`` seconds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ...core.errors import GpuK8sError
from ...core.gpuusage import DEFAULT_RESOURCE_KINDS, SHARED_RESOURCES, NodeUsage, attribute
from ...core.model import Gpu, NodeInventory
from ...core.telemetry import ContainerDevices, ContainerRef, NodeTelemetry
from .cgroups import container_of
from .knowngpus import KnownGpu, KnownGpus
from .pods import PodDirectory

log = logging.getLogger("gpuk8s.exporter")

Telemetry = Callable[[], NodeTelemetry]
Inventory = Callable[[], NodeInventory]
Health = Callable[[NodeInventory], Mapping[int, str | None]]
Holdings = Callable[[], Sequence[ContainerDevices]]

# The classes of sample problems, each counted in gpuk8s_exporter_sample_problems:
PROBLEM_CLASSES = (
    "telemetry",  # the vendor tool or NVML (no answer, a GPU it does not show)
    "discovery",  # the inventory's problems (every discovery, the first included)
    "allocations",  # the kubelet's PodResources API does not answer
    "pod-list",  # the API server's pod list fails (or there are no credentials)
    "assignment-unreadable",  # a pod's gpuk8s.io/sharing.assigned cannot be read
    "assignment-missing",  # a pod holding shared-GPU ids has no assignment
    "assignment-unknown-gpu",  # an assignment names a GPU this node lacks
    "state",  # the book of known GPUs (its file)
)


@dataclass(frozen=True)
class Snapshot:
    inventory: NodeInventory
    telemetry: NodeTelemetry
    usage: NodeUsage
    taken_at: float  # unix time
    duration: float  # seconds the sample took
    problems: tuple[str, ...] = ()
    known: Mapping[int, KnownGpu] = field(default_factory=dict)  # discovery index -> entry
    lost: tuple[KnownGpu, ...] = ()  # GPUs off the bus, kept until they return or are forgotten
    # per class of PROBLEM_CLASSES: how many of ``problems`` are of it
    problem_counts: Mapping[str, int] = field(default_factory=dict)


@dataclass
class SamplerStats:
    samples: int = 0
    failures: int = 0  # samples that raised (a bug or an unexpected error)
    holdings_failing: bool = False
    extra: dict[str, float] = field(default_factory=dict)


class Sampler:
    def __init__(
        self,
        *,
        inventory: Inventory,
        telemetry: Telemetry,
        health: Health,
        holdings: Holdings | None,
        pods: PodDirectory | None,
        proc_dir: str | None,
        interval: float = 10.0,
        rediscover: float = 60.0,
        resource_kinds: Mapping[str, str] = DEFAULT_RESOURCE_KINDS,
        max_containers: int = 1024,
        known: KnownGpus | None = None,
        on_bus: Callable[[Gpu], bool] = lambda gpu: True,
    ) -> None:
        self.inventory_source = inventory
        self.telemetry_source = telemetry
        self.health_source = health
        self.holdings_source = holdings
        self.pods = pods
        self.proc_dir = proc_dir
        self.interval = interval
        self.rediscover = rediscover
        self.resource_kinds = dict(resource_kinds)
        self.max_containers = max_containers
        self.known = known if known is not None else KnownGpus(None)
        self.on_bus = on_bus
        self.stats = SamplerStats()
        self.snapshot: Snapshot | None = None
        self._inventory: NodeInventory | None = None
        self._inventory_at = 0.0
        self._holdings: Sequence[ContainerDevices] = ()
        self._reported: frozenset[str] = frozenset()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _inventory_now(self, telemetry_addresses: set[str] | None = None) -> NodeInventory:
        now = time.monotonic()
        stale = self._inventory is None or now - self._inventory_at >= self.rediscover
        if not stale and telemetry_addresses is not None and self._inventory is not None:
            known = {g.pci_address for g in self._inventory.gpus}
            stale = not telemetry_addresses <= known  # a GPU appeared (or came back)
        if stale or self._inventory is None:
            self._inventory = self.inventory_source()
            self._inventory_at = now
        return self._inventory

    def _owners(self, telemetry: NodeTelemetry) -> dict[int, ContainerRef | None] | None:
        if telemetry.processes is None or self.proc_dir is None or self.pods is None:
            return None
        owners: dict[int, ContainerRef | None] = {}
        for proc in telemetry.processes:
            found = container_of(self.proc_dir, proc.pid)
            owners[proc.pid] = None if found is None else self.pods.resolve(*found)
        return owners

    def _assigned(self, inventory: NodeInventory, problems: list[tuple[str, str]]
                  ) -> dict[tuple[str, str], tuple[int, ...]]:
        """The assigned GPUs of the pods holding shared-GPU replica ids; what is wrong
        with them goes to ``problems``."""
        pods = {(h.container.namespace, h.container.pod) for h in self._holdings
                if h.resource in SHARED_RESOURCES}
        if not pods or self.pods is None:
            return {}
        found = self.pods.assignments(pods)
        for (namespace, pod), why in sorted(found.unreadable.items()):
            problems.append(("assignment-unreadable",
                             f"pod {namespace}/{pod}: assignment unreadable: {why}"))
        for namespace, pod in found.missing:
            problems.append(("assignment-missing", f"pod {namespace}/{pod} holds shared-GPU "
                             "ids but has no gpuk8s.io/sharing.assigned annotation"))
        # by stable id: a GPU that left the bus renumbers the others, not the pods
        index_by_id = inventory.index_by_id()
        present = {gpu.index for gpu in inventory.gpus}
        out: dict[tuple[str, str], tuple[int, ...]] = {}
        for (namespace, pod), assignment in sorted(found.assigned.items()):
            gpus = out[(namespace, pod)] = assignment.current(index_by_id)
            if assignment.ids:
                lacking = [i for i in assignment.ids if i not in index_by_id]
            else:  # an old record: indexes as written
                lacking = [str(g) for g in gpus if g not in present]
            if lacking:
                problems.append(("assignment-unknown-gpu", f"pod {namespace}/{pod}: assigned "
                                 f"GPU {','.join(lacking)}, which this node lacks "
                                 f"(it has {len(present)})"))
        return out

    def sample_once(self) -> Snapshot:
        started = time.monotonic()
        problems: list[tuple[str, str]] = []
        telemetry = self.telemetry_source()
        problems.extend(("telemetry", p) for p in telemetry.problems)
        inventory = self._inventory_now({g.address for g in telemetry.gpus})
        problems.extend(("discovery", p) for p in inventory.problems)
        health = self.health_source(inventory)
        if self.holdings_source is not None:
            try:
                self._holdings = self.holdings_source()
                if self.stats.holdings_failing:
                    log.info("PodResources API answers again")
                self.stats.holdings_failing = False
            except GpuK8sError as err:
                if not self.stats.holdings_failing:
                    log.warning("cannot read allocations; keeping the last known",
                                extra={"error": str(err)})
                self.stats.holdings_failing = True
                problems.append(("allocations", str(err)))
        owners = self._owners(telemetry)
        assigned = self._assigned(inventory, problems)
        if self.pods is not None and self.pods.error is not None:
            problems.append(("pod-list", self.pods.error))
        usage = attribute(inventory, telemetry, self._holdings, owners, health,
                          resource_kinds=self.resource_kinds, max_containers=self.max_containers,
                          assigned=assigned)
        known, lost, state_problems = self.known.observe(
            [(u.gpu, u.kind) for u in usage.gpus], self.on_bus)
        problems.extend(("state", p) for p in state_problems)
        counts = dict.fromkeys(PROBLEM_CLASSES, 0)
        for kind, _ in problems:
            counts[kind] += 1
        snapshot = Snapshot(inventory, telemetry, usage, time.time(),
                            time.monotonic() - started, tuple(p for _, p in problems),
                            known, tuple(lost), counts)
        self.snapshot = snapshot
        self.stats.samples += 1
        return snapshot

    def report(self, snapshot: Snapshot) -> None:
        """Log each problem of ``snapshot`` that the last reported one did not have: a
        problem is logged once while it lasts, again only after it went away."""
        for problem in snapshot.problems:
            if problem not in self._reported:
                log.warning("sample problem", extra={"problem": problem})
        self._reported = frozenset(snapshot.problems)

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                self.report(self.sample_once())
            except Exception:  # never let a bug stop sampling; the metric shows it
                self.stats.failures += 1
                log.exception("sample failed")
            self._stop.wait(self.interval)

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="gpu-sampler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
