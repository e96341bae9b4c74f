"""Packing on a production trace: gpu-aware against FGD, BestFit and DotProd, like
against like, with the FGD paper's protocol.

The Alibaba openb trace (``../shared/data/openb`` next to the checkout, or ``$OPENB_DIR``,
or ``--data``: 1,213 GPU nodes, 6,212 GPUs; the pod list ``openb_pod_list_<--trace>.csv``,
8,152 pods in ``default``) replayed as in "Beware of Fragmentation" (Weng et al.,
ATC '23): the pod list is shuffled with each seed (42..51 by default), inflated by
resampling pods of the list until the requested GPUs reach 130 % of the cluster's GPU
capacity, pods never leave, a pod that fits nowhere is skipped. CPU and memory are
honoured. Allocation = GPU requested by the placed pods / capacity (milli-GPUs, as the
paper counts), read when the *arrived* requests reach 100 % and 130 % of capacity, per
seed; the summary gives the mean and the range (min-max) over the seeds.

Sharing policies (the same pods, seeds and node shapes, in one run; every policy shares
GPUs and honours CPU and memory):

* ``gpu-aware-sharing`` -- the product: every node in the ``vcuda`` sharing mode (label
  ``gpuk8s.io/sharing-mode``); a fractional pod asks ``tencent.com/vcuda-core`` = its
  milli-GPUs / 10 (percent, rounded up), a whole-GPU pod ``vcuda-core`` = 100 x its GPUs
  (whole GPUs, topology allocator). The product code path: kube-scheduler's fit on the
  counted resource, the extender's ``filter`` / ``prioritize`` (``Extender.handle``) and
  its ``bind`` verb (``Sharing.bind``: GPU choice, pod annotation, binding) against an
  in-memory pod store, the pod watch feeding the ledger from the annotations. Pods
  without GPUs: the scheduler asks the second extender entry (``prioritize-nogpu``,
  the role's default ``rank_pods_without_gpus``) through ``Extender.handle``, then
  its own scorers break ties; ``--no-rank-nogpu`` leaves them to the scorers alone,
  ``--taint-cores-per-gpu N`` puts the ``PreferNoSchedule`` taint of the whole-GPU
  recipe on nodes with fewer than N cores per GPU (``docs/extender.md``).
* ``fgd``, ``bestfit``, ``dotprod``, ``random`` -- the paper's policies as its simulator
  runs them (``benchmarks/paper_policies.py``: one score plugin, integer scores, ties to
  the first node of a random order drawn per run), written from the paper's description.
  Their 10-seed figures on the openb pod lists are printed beside ours
  (``PAPER_FIGURES``, from the paper's artifact).

Whole-GPU policies (no sharing: a pod asking for part of a GPU takes a whole GPU but
counts its milli-GPUs, as in the paper's metric; labelled "no sharing" in the table):

* ``gpu-aware`` -- the product in the exclusive mode: a model of kube-scheduler (its
  ``NodeResourcesFit`` filter on CPU, memory and GPU count, then the extender's
  ``filter`` and ``prioritize`` through ``Extender.handle`` over its node cache, the node
  watch and the pod watch fed with the same objects the API would send), the scheduler's
  own scorers with the shipped profile breaking the extender's ties, then the allocator
  (``core.allocator.allocate``, the device plugin's choice) picking the GPUs.
* ``gpu-aware-default-profile`` -- the same extender under kube-scheduler's default
  profile: it scores only a sample of the feasible nodes (``percentageOfNodesToScore``
  adaptive, about 40 % here), LeastAllocated, no taint.
* ``bestfit-whole`` -- BestFit's formula (0.5 CPU/128 cores + 0.5 GPUs/8 left) over
  whole GPUs; ``firstfit-whole`` -- the first node in the node list that fits.
* ``pooled`` bounds (no fragmentation): every pod on one node as big as the whole
  cluster, with whole GPUs and with shared GPUs: no policy is expected to do better.

Node shapes (product policies): 8-GPU nodes are the simulator's ``c500-8`` preset (two
PCIe switches of four, MetaXLink inside each four), 4-GPU nodes one linked group of
four, 2-GPU nodes a PCIe-only pair (the ``n260-2`` preset), 1-GPU nodes a single GPU.
Each node publishes what gpu-device publishes (``published_annotations``).

Printed per policy: allocation at arrived 100 % / 130 % (mean and range), the paper's
figure where it has one, failed pods per class (mean per seed: ``none`` without GPUs,
``share`` part of one GPU, else the number of whole GPUs), 2/4/8-GPU pods placed inside
one link group, whole 8-GPU nodes left, the CPU of the decision per GPU pod (mean, p50,
p99; gpu-aware: its filter + prioritize + bind calls for the pod, with each verb's
figures beside; a paper policy: its ``place`` over every node); then gpu-aware-sharing
against each baseline: the difference of the means, the per-seed differences, and
"above" only when the mean lies beyond the other's range.

Run: python benchmarks/packing.py [--trace default] [--seeds 42-51] [--jobs 2] [--quick]
[--json FILE] [--by-shape] [--cpu-scale F] [--nodes-scale N] [--pods N] [--churn
[--lifetimes trace|exp] [--churn-load L] [--churn-span S]]. ``--cpu-scale`` derives a
cluster with every node's CPU times F (``scale_cpu``), ``--nodes-scale`` one with the
nodes N times over (``repeat_nodes``: 4 makes openb's 1,213 nodes 4,852, the pods
resampled to fill them); ``--pods N`` replays only the first N pods of each seed (for
timings on a part of a large run: an allocation mark it does not reach reads 0);
``--churn`` lets pods leave (``churn_workload``, ``churn_replay``: arrivals a fixed gap
apart, each placed pod leaving after its lifetime) and prints the time-weighted
allocation instead.
``--quick`` (2 seeds, every 8th node, for tests) keeps the protocol on a sub-cluster;
``--by-shape`` adds a table of where each policy leaves its capacity: per node shape
(GPUs x cores), the free GPUs and free cores at arrived 100 % (mean per seed).
"""

from __future__ import annotations

import argparse
import csv
import heapq
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from paper_policies import PAPER_POLICIES, PaperScheduler, typical_pods
from stats import percentile, spread

from gpuk8s import sim
from gpuk8s.core.allocator import allocate
from gpuk8s.core.binpack import MAX_CONFIGURATIONS, knapsack, simplex
from gpuk8s.core.model import DriverInfo, Gpu, NodeInventory
from gpuk8s.core.schedconf import NOGPU_VERB, packing_profile
from gpuk8s.core.scoring import LinkGroups
from gpuk8s.core.sharing import (
    ASSIGNED_ANNOTATION,
    MODE_VCUDA,
    PHASE_ALLOCATED,
    PHASE_ANNOTATION,
    SHARING_MODE_LABEL,
)
from gpuk8s.discovery import discover
from gpuk8s.services.deviceplugin.nodestate import published_annotations
from gpuk8s.services.extender.ledger import Ledger, view_assignment
from gpuk8s.services.extender.logic import Extender
from gpuk8s.services.extender.nodes import BoundPods, NodeCache
from gpuk8s.services.extender.packing import (
    FreeRoom,
    NodeRooms,
    RunningPods,
    node_room_fields,
    running_fields,
)
from gpuk8s.services.extender.share import Sharing
from gpuk8s.services.extender.sharednodes import SharedNodes
from gpuk8s.services.extender.weights import Weights, WeightSource
from gpuk8s.services.extender.wire import READ_ANNOTATIONS, NodeView, PodView, node_item
from gpuk8s.services.node.devices import DeviceSet

GPU = "metax-tech.com/gpu"
# the trace lives next to the checkouts (../shared/data/openb), or where OPENB_DIR says
DATA = Path(
    os.environ.get("OPENB_DIR")
    or Path(__file__).resolve().parents[1].parent / "shared" / "data" / "openb"
)
MILLI = 1000
EXTENDER_WEIGHT = 500  # SPEC §7
MAX_NODE_SCORE = 100
MAX_SPEC_CPU = 128_000  # FGD's BestFit normalisation (milli-CPU)
MAX_SPEC_GPU = 8
TAINT_CORES_PER_GPU = 0.0  # GPU-dense nodes get the PreferNoSchedule taint below this
SHARING = "gpu-aware-sharing"
POLICIES = (SHARING, "fgd", "bestfit", "dotprod")
WHOLE_BASELINES = ("bestfit-whole", "firstfit-whole")  # no GPU sharing: a fraction takes a GPU
ALL_POLICIES = ("gpu-aware", SHARING, "gpu-aware-default-profile", *PAPER_POLICIES,
                *WHOLE_BASELINES)
VCUDA_CORE = "tencent.com/vcuda-core"
POOLED = "pooled (no fragmentation)"
POOLED_SHARED = "pooled, shared GPUs (no fragmentation)"
SHARES_PACKED = "shares packed offline (LP bound)"
BOUNDS = (POOLED, POOLED_SHARED, SHARES_PACKED)
LABELS = {
    "gpu-aware": "gpu-aware, whole GPUs (no sharing)",
    "bestfit-whole": "BestFit, whole GPUs (no sharing)",
    "firstfit-whole": "FirstFit, whole GPUs (no sharing)",
    "fgd": "FGD (sharing)",
    "bestfit": "BestFit (sharing)",
    "dotprod": "DotProd (sharing)",
    "random": "Random (sharing)",
}
# The paper's own allocation at arrived 100 % per openb pod list and policy, ten seeds
# (42-51): mean, min, max, from its artifact's expected results
# (hkust-adsl/kubernetes-scheduler-simulator,
# experiments/analysis/expected_results/analysis_allo_discrete.csv, column "100").
PAPER_FIGURES: dict[str, dict[str, tuple[float, float, float]]] = {
    "default": {"random": (86.30, 85.87, 86.79), "dotprod": (90.62, 90.34, 91.00),
                "bestfit": (92.86, 92.64, 93.04), "fgd": (95.23, 95.06, 95.38)},
    "cpu050": {"random": (89.02, 88.69, 89.49), "dotprod": (93.03, 92.64, 93.24),
               "bestfit": (93.56, 93.31, 93.73), "fgd": (95.00, 94.85, 95.17)},
    "cpu100": {"random": (87.44, 86.86, 87.89), "dotprod": (91.73, 91.13, 91.96),
               "bestfit": (93.26, 93.06, 93.45), "fgd": (95.21, 94.97, 95.41)},
    "cpu200": {"random": (83.03, 82.72, 83.59), "dotprod": (87.45, 86.32, 87.98),
               "bestfit": (92.15, 91.83, 92.52), "fgd": (94.82, 94.54, 95.02)},
    "cpu250": {"random": (80.00, 79.53, 80.59), "dotprod": (83.57, 82.68, 83.99),
               "bestfit": (91.21, 90.83, 91.53), "fgd": (93.20, 92.83, 93.82)},
    "gpushare40": {"random": (84.86, 84.28, 85.25), "dotprod": (89.30, 89.09, 89.54),
                   "bestfit": (91.44, 90.95, 91.72), "fgd": (93.96, 93.82, 94.08)},
    "gpushare60": {"random": (82.81, 82.30, 83.23), "dotprod": (86.82, 86.48, 87.20),
                   "bestfit": (89.06, 88.80, 89.33), "fgd": (91.25, 91.04, 91.41)},
    "gpushare80": {"random": (80.62, 80.08, 81.08), "dotprod": (84.14, 83.91, 84.49),
                   "bestfit": (86.66, 86.16, 86.90), "fgd": (89.08, 88.87, 89.22)},
    "gpushare100": {"random": (78.90, 78.62, 79.10), "dotprod": (81.98, 81.40, 82.33),
                    "bestfit": (84.62, 84.35, 85.00), "fgd": (86.64, 86.38, 86.91)},
    "multigpu20": {"random": (86.92, 86.16, 87.89), "dotprod": (91.85, 91.46, 92.43),
                   "bestfit": (93.73, 93.35, 94.12), "fgd": (95.53, 95.32, 95.82)},
    "multigpu30": {"random": (86.63, 86.01, 87.30), "dotprod": (93.11, 92.75, 93.69),
                   "bestfit": (94.57, 94.27, 94.95), "fgd": (96.36, 96.20, 96.47)},
    "multigpu40": {"random": (85.38, 84.44, 86.61), "dotprod": (94.04, 93.53, 94.32),
                   "bestfit": (95.10, 94.64, 95.41), "fgd": (96.91, 96.79, 97.12)},
    "multigpu50": {"random": (81.28, 79.95, 82.56), "dotprod": (94.73, 94.40, 95.06),
                   "bestfit": (95.62, 95.41, 95.90), "fgd": (97.09, 96.87, 97.27)},
}


# ----------------------------------------------------------------------------- input
@dataclass(frozen=True)
class NodeSpec:
    name: str
    cpu: int  # milli-CPU
    memory: int  # MiB
    gpus: int


@dataclass(frozen=True)
class PodSpec:
    name: str
    cpu: int
    memory: int
    gpus: int
    milli: int  # per GPU
    duration: int = 0  # seconds the trace's pod lived (deletion - creation; churn runs)

    @property
    def requested(self) -> int:
        """Milli-GPUs the pod asks for (what allocation counts)."""
        return self.gpus * self.milli

    @property
    def vcuda_core(self) -> int:
        """The pod's ``tencent.com/vcuda-core`` in sharing mode (0: no GPU)."""
        if not self.gpus:
            return 0
        if self.gpus == 1 and self.milli < MILLI:
            return max(1, -(-self.milli // 10))
        return 100 * self.gpus


def load(data: Path, trace: str = "default") -> tuple[list[NodeSpec], list[PodSpec]]:
    """The node list and the pod list ``openb_pod_list_<trace>.csv`` of ``data``."""
    with open(data / "openb_node_list_gpu_node.csv", newline="") as handle:
        nodes = [
            NodeSpec(r["sn"], int(r["cpu_milli"]), int(r["memory_mib"]), int(r["gpu"]))
            for r in csv.DictReader(handle)
        ]
    with open(data / f"openb_pod_list_{trace}.csv", newline="") as handle:
        pods = [
            PodSpec(
                r["name"],
                int(r["cpu_milli"]),
                int(r["memory_mib"]),
                int(r["num_gpu"]),
                int(r["gpu_milli"]) if int(r["num_gpu"]) else 0,
                _lifetime(r),
            )
            for r in csv.DictReader(handle)
        ]
    return nodes, pods


def _lifetime(row: dict[str, str]) -> int:
    """Seconds a pod of the trace lived: ``deletion_time - creation_time`` (0 where the
    columns are missing, empty or not after each other)."""
    try:
        return max(0, int(row.get("deletion_time") or 0) - int(row.get("creation_time") or 0))
    except ValueError:
        return 0


def scale_cpu(nodes: Sequence[NodeSpec], scale: float) -> list[NodeSpec]:
    """The nodes with their CPU times ``scale`` (rounded down to a millicore): a cluster
    derived from the trace's, short of CPU below 1."""
    if not 0 < scale <= 1000:
        raise ValueError(f"cpu scale {scale}: a factor above 0 (at most 1000) is allowed")
    return [replace(n, cpu=int(n.cpu * scale)) for n in nodes]


def repeat_nodes(nodes: Sequence[NodeSpec], times: int) -> list[NodeSpec]:
    """The nodes ``times`` over (copy ``c`` > 0 of a node named ``-c<c>`` after it): a
    cluster ``times`` as large with the trace's node mix; the fill protocol then
    resamples the pod list up to its capacity, the same pod mix scaled."""
    if not 1 <= times <= 100:
        raise ValueError(f"nodes scale {times}: a whole number from 1 to 100 is allowed")
    return [n if c == 0 else replace(n, name=f"{n.name}-c{c}")
            for c in range(times) for n in nodes]


def cluster(
    nodes: Sequence[NodeSpec], every: int = 1, cpu_scale: float = 1.0, times: int = 1
) -> list[NodeSpec]:
    """The cluster a run replays: every ``every``-th node of the trace, repeated
    ``times`` (``repeat_nodes``), each node's CPU times ``cpu_scale`` (``scale_cpu``)."""
    return scale_cpu(repeat_nodes(nodes[::every], times), cpu_scale)


def model_note(data: Path, trace: str = "default") -> str:
    """A line to print before the figures when pods of ``openb_pod_list_<trace>.csv``
    name GPU models (``gpu_spec``, the ``gpuspecNN`` lists); "" when none do. ``load``
    drops that column, so these replays let every GPU take every pod, and such a list
    gives the figures of the same pods without it."""
    with open(data / f"openb_pod_list_{trace}.csv", newline="") as handle:
        bound = sum(1 for r in csv.DictReader(handle) if (r.get("gpu_spec") or "").strip())
    if not bound:
        return ""
    return (f"note: {bound} pods of {trace!r} name GPU models (gpu_spec); not modelled "
            "here: every GPU takes every pod")


def save(data: Path, nodes: Sequence[NodeSpec], pods: Sequence[PodSpec],
         trace: str = "default") -> Path:
    """``load``'s inverse: a trace in the openb format (the columns ``load`` reads; the
    model and QoS columns it ignores hold fixed values; a pod's ``duration`` is written as
    its deletion time, created at 0). ``data``."""
    data.mkdir(parents=True, exist_ok=True)
    with open(data / "openb_node_list_gpu_node.csv", "w", newline="") as handle:
        out = csv.writer(handle)
        out.writerow(["sn", "cpu_milli", "memory_mib", "gpu", "model"])
        out.writerows([n.name, n.cpu, n.memory, n.gpus, ""] for n in nodes)
    with open(data / f"openb_pod_list_{trace}.csv", "w", newline="") as handle:
        out = csv.writer(handle)
        out.writerow(["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec",
                      "qos", "pod_phase", "creation_time", "deletion_time", "scheduled_time"])
        out.writerows([p.name, p.cpu, p.memory, p.gpus, p.milli, "", "LS", "Running", 0,
                       p.duration, 0] for p in pods)
    return data


def workload(
    pods: Sequence[PodSpec], capacity: int, seed: int, ratio: float = 1.3
) -> list[PodSpec]:
    """The trace shuffled with ``seed``, then pods resampled from it (with replacement)
    until the requested milli-GPUs reach ``ratio`` × capacity."""
    rng = random.Random(seed)
    order = list(pods)
    rng.shuffle(order)
    total = sum(p.requested for p in order)
    while total < ratio * capacity * MILLI:
        extra = pods[rng.randrange(len(pods))]
        order.append(extra)
        total += extra.requested
    return order


LIFETIMES = ("trace", "exp")
CHURN_STEP = 0.5  # churn runs read the allocation every half capacity of arrived requests


@dataclass(frozen=True)
class Churn:
    """Pods also leave: pods arrive ``gap`` seconds apart until their requests reach
    at least ``span`` x capacity (``workload``); each placed pod leaves its lifetime
    after it arrived (its ``duration`` in the trace, or ``exp``: exponential, mean 1,
    drawn with the seed).
    The gap makes the offered load ``load`` x capacity at the run's end (``churn_gap``)."""

    load: float = 1.3
    span: float = 4.0
    lifetimes: str = "trace"

    def __post_init__(self) -> None:
        if self.lifetimes not in LIFETIMES:
            raise ValueError(f"lifetimes {self.lifetimes!r}: allowed are {', '.join(LIFETIMES)}")
        if not self.load > 0:
            raise ValueError(f"churn load {self.load}: a factor above 0 is allowed")
        if not self.span >= 1:
            raise ValueError(f"churn span {self.span}: at least 1 (arrived 100 %) is allowed")


def churn_workload(
    pods: Sequence[PodSpec], capacity: int, seed: int, churn: Churn
) -> tuple[list[PodSpec], list[float], float]:
    """The pods of a churn run (``workload`` up to ``span`` x capacity: its first pods are
    the fill protocol's), their lifetimes, and the arrival gap (``churn_gap``)."""
    order = workload(pods, capacity, seed, churn.span)
    if churn.lifetimes == "trace":
        lives = [float(p.duration) for p in order]
        if not any(lives):
            raise ValueError("lifetimes 'trace': the pod list has no durations "
                             "(deletion_time - creation_time); allowed: exp")
    else:
        draw = random.Random(seed * 7919 + 1)
        lives = [draw.expovariate(1.0) for _ in order]
    return order, lives, churn_gap(order, lives, capacity * MILLI * churn.load)


def churn_gap(pods: Sequence[PodSpec], lives: Sequence[float], offered: float) -> float:
    """The arrival gap g at which the pods, arriving g apart, would hold ``offered``
    milli-GPUs at the end of the run were none refused, in expectation: g x offered =
    mean over the pods of requested x min(lifetime, horizon), horizon = len(pods) x g.
    (Without the horizon a heavy tail of lifetimes, as openb's, sets a gap at which the
    cluster never fills within the run.) Bisection; the smallest such gap."""
    asks = [(p.requested, life) for p, life in zip(pods, lives, strict=True) if p.requested]
    if not asks or offered <= 0:
        raise ValueError("churn: no GPU pod with a lifetime above 0 to set the arrival gap")
    count = len(pods)

    def excess(gap: float) -> float:
        horizon = count * gap
        held = sum(r * min(life, horizon) for r, life in asks) / count
        return gap * offered - held

    high = sum(r * life for r, life in asks) / count / offered
    if high <= 0:
        raise ValueError("churn: every GPU pod has lifetime 0; allowed: lifetimes above 0")
    low = high * 1e-9
    if excess(low) >= 0:
        return low
    for _ in range(60):
        mid = (low + high) / 2
        if excess(mid) >= 0:
            high = mid
        else:
            low = mid
    return high


# ----------------------------------------------------------------------------- shapes
def _inventory(gpus: int, linked: bool) -> NodeInventory:
    """``gpus`` GPUs under one PCIe switch, all MetaXLinked when ``linked``."""
    items = tuple(
        Gpu(
            index=i,
            pci_address=f"0000:{0x10 + i:02x}:00.0",
            vendor="metax",
            vendor_id=0x9999,
            device_id=0x4001,
            product="C500",
            numa_node=0,
            pcie_switch="0000:01:00.0",
            link_group=0 if linked and gpus > 1 else None,
            driver_bound=True,
        )
        for i in range(gpus)
    )
    links = frozenset(
        frozenset((a, b)) for a in range(gpus) for b in range(a + 1, gpus) if linked
    )
    return NodeInventory("metax", items, DriverInfo(loaded=True, version="2.32.0.6"), links=links)


def device_sets() -> dict[int, DeviceSet]:
    """GPU count -> the device set of that node shape (see the module doc)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = {}
        for gpus, preset in ((8, "c500-8"), (2, "n260-2")):
            root = str(Path(tmp) / preset)
            sim.create(root, preset)
            out[gpus] = DeviceSet(discover(root), GPU)
    out[4] = DeviceSet(_inventory(4, linked=True), GPU)
    out[1] = DeviceSet(_inventory(1, linked=False), GPU)
    return out


class Shape:
    """One node shape: its devices, annotations per allocation (memoised) and groups."""

    def __init__(self, devices: DeviceSet) -> None:
        self.devices = devices
        self.topology = devices.topology
        self.ids = [u.id for u in devices.units]
        self.groups = LinkGroups(self.topology)
        self._annotations: dict[frozenset[str], dict[str, str]] = {}

    def annotations(self, allocated: frozenset[str]) -> dict[str, str]:
        hit = self._annotations.get(allocated)
        if hit is None:
            hit = self._annotations[allocated] = published_annotations(
                self.devices, set(allocated)
            )
        return hit


# ----------------------------------------------------------------------------- state
@dataclass
class SimNode:
    spec: NodeSpec
    shape: Shape
    cpu: int  # free
    memory: int
    free_gpus: int
    allocated: frozenset[str] = frozenset()
    object: dict[str, Any] = field(default_factory=dict)
    core_free: int = 0  # sharing mode: tencent.com/vcuda-core left (the scheduler's count)


# a node as the replay's end figures read it: (GPUs, CPU millicores, free CPU millicores,
# free milli-GPUs)
NodeState = tuple[int, int, int, int]


@dataclass
class Result:
    policy: str
    seed: int
    allocation: dict[str, float] = field(default_factory=dict)  # "100" / "130" -> %
    # mark -> the failed pods' class (``pod_class``: "none", "share", "1".."8") -> n
    failed: dict[str, dict[str, int]] = field(default_factory=dict)
    inside: dict[int, list[int]] = field(default_factory=dict)  # size -> [inside, placed]
    whole8: dict[str, int] = field(default_factory=dict)
    # at arrived 100 %, per node shape ("GPUs x cores"): [nodes, free GPUs, free cores]
    by_shape: dict[str, list[float]] = field(default_factory=dict)
    # CPU time of gpu-aware's verbs per GPU pod (filter, prioritize, bind)
    filter_ms: list[float] = field(default_factory=list)
    prioritize_ms: list[float] = field(default_factory=list)
    bind_ms: list[float] = field(default_factory=list)
    nogpu_ms: list[float] = field(default_factory=list)  # the entry for pods without GPUs
    # CPU time of the policy's decision per GPU pod: gpu-aware's filter + prioritize +
    # bind for that pod; a paper policy's whole ``place`` (its score over every node)
    pod_ms: list[float] = field(default_factory=list)
    # milli-GPUs of the pods reported placed, and what the cluster's own accounting
    # holds for them at the end (sharing policies; None: not audited)
    reported: int = 0
    held: int | None = None
    # churn runs: the time-weighted mean allocation (%) from arrived 100 % to the last
    # arrival, and the pods that left by then
    churn_mean: float | None = None
    departed: int = 0


def node_object(
    node: SimNode, annotations: dict[str, str], labels: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "metadata": {"name": node.spec.name, "annotations": annotations,
                     "labels": labels or {}},
        "status": {
            "allocatable": {
                "cpu": f"{node.spec.cpu}m",
                "memory": f"{node.spec.memory}Mi",
                GPU: str(node.spec.gpus),
            }
        },
    }


def pod_object(
    pod: PodSpec, uid: str, node: str | None = None, sharing: bool = False
) -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": f"{pod.cpu}m", "memory": f"{pod.memory}Mi"}}
    if pod.gpus and sharing:
        resources["requests"][VCUDA_CORE] = str(pod.vcuda_core)
        resources["limits"] = {VCUDA_CORE: str(pod.vcuda_core)}
    elif pod.gpus:
        resources["requests"][GPU] = str(pod.gpus)
        resources["limits"] = {GPU: str(pod.gpus)}
    spec: dict[str, Any] = {"containers": [{"name": "main", "resources": resources}]}
    if node is not None:
        spec["nodeName"] = node
    # a version, as the API server gives every pod (gpu-aware parses a pod version's
    # requests once for its filter and prioritize: ``demand.PodDemands``)
    return {"metadata": {"name": pod.name, "namespace": "openb", "uid": uid,
                         "resourceVersion": "1"}, "spec": spec}


# ----------------------------------------------------------------------------- scheduler model
def fit_strategy(profile: str) -> tuple[bool, dict[str, int]]:
    """(MostAllocated?, resource -> weight) of NodeResourcesFit in ``profile``: the
    shipped one is read from ``core.schedconf.packing_profile`` (what gets written)."""
    if profile != "shipped":
        return False, {"cpu": 1, "memory": 1}  # kube-scheduler's default
    config = packing_profile(GPU)
    (plugin,) = [
        p for p in config["profiles"][0]["pluginConfig"] if p["name"] == "NodeResourcesFit"
    ]
    strategy = plugin["args"]["scoringStrategy"]
    weights = {r["name"]: int(r["weight"]) for r in strategy["resources"]}
    return strategy["type"] == "MostAllocated", weights


def fit_score(node: SimNode, pod: PodSpec, most: bool, weights: dict[str, int]) -> int:
    """NodeResourcesFit scoring as kube-scheduler computes it (an extended resource the
    pod does not request is left out)."""
    total = weight_sum = 0
    for name, free, cap, req in (
        ("cpu", node.cpu, node.spec.cpu, pod.cpu),
        ("memory", node.memory, node.spec.memory, pod.memory),
        (GPU, node.free_gpus, node.spec.gpus, pod.gpus),
    ):
        weight = weights.get(name, 0)
        if not weight or (name == GPU and not req):
            continue
        used = cap - free + req
        total += weight * ((used if most else cap - used) * MAX_NODE_SCORE // cap)
        weight_sum += weight
    return total // weight_sum if weight_sum else 0


def balanced_score(node: SimNode, pod: PodSpec) -> int:
    """NodeResourcesBalancedAllocation: 100·(1 − std of the cpu/memory fractions)."""
    cpu = (node.spec.cpu - node.cpu + pod.cpu) / node.spec.cpu
    mem = (node.spec.memory - node.memory + pod.memory) / node.spec.memory
    return int((1 - abs(cpu - mem) / 2) * MAX_NODE_SCORE)


class Scheduler:
    """kube-scheduler's part: fit filter, node sampling, its own scorers, tie-break."""

    def __init__(
        self, nodes: list[SimNode], rng: random.Random, profile: str, taint: float
    ) -> None:
        self.nodes = nodes
        self.rng = rng
        self.shipped = profile == "shipped"
        self.most, self.weights = fit_strategy(profile)
        self.tainted = [
            self.shipped and taint > 0 and n.spec.cpu < taint * 1000 * n.spec.gpus for n in nodes
        ]
        self.next_start = 0

    def feasible(self, pod: PodSpec, sharing: bool = False) -> list[int]:
        nodes = self.nodes
        if sharing:  # the counted resource: tencent.com/vcuda-core, 100 per GPU
            core = pod.vcuda_core
            fits = [
                i
                for i, n in enumerate(nodes)
                if n.cpu >= pod.cpu and n.memory >= pod.memory and n.core_free >= core
            ]
        else:
            fits = [
                i
                for i, n in enumerate(nodes)
                if n.cpu >= pod.cpu and n.memory >= pod.memory and n.free_gpus >= pod.gpus
            ]
        if self.shipped or not fits:
            return fits
        # the default profile: percentageOfNodesToScore adaptive, from a rotating start
        total = len(nodes)
        want = total if total < 100 else max(100, total * max(5, 50 - total // 125) // 100)
        if len(fits) <= want:
            self.next_start = (self.next_start + total) % total
            return fits
        start = self.next_start
        ordered = [i for i in fits if i >= start] + [i for i in fits if i < start]
        chosen = ordered[:want]
        last = chosen[-1]
        self.next_start = (last + 1) % total
        return chosen

    def pick(
        self,
        pod: PodSpec,
        candidates: list[int],
        extender: dict[str, int] | None,
        sharing: bool = False,
    ) -> int:
        """The winner of extender·weight·10 + plugin scores, random among equals. A
        sharing pod requests ``tencent.com/vcuda-core``, not the GPU resource the
        profile's ``NodeResourcesFit`` weighs: that score leaves it out (no GPUs)."""
        fit_pod = replace(pod, gpus=0) if sharing else pod
        if extender is not None and extender:
            top = max(extender.values())
            candidates = [i for i in candidates if extender[self.nodes[i].spec.name] == top]
        best: list[int] = []
        best_score = -1
        for i in candidates:
            node = self.nodes[i]
            score = (
                fit_score(node, fit_pod, self.most, self.weights)
                + balanced_score(node, pod)
                + (0 if self.tainted[i] else 3 * MAX_NODE_SCORE)
            )
            if score > best_score:
                best, best_score = [i], score
            elif score == best_score:
                best.append(i)
        return best[self.rng.randrange(len(best))] if len(best) > 1 else best[0]


# ----------------------------------------------------------------------------- replay
_NODE_VIEW = msgspec.json.Decoder(NodeView)
_POD_VIEW = msgspec.json.Decoder(PodView)


class PodStore:
    """The API server's pods for the sharing replay (``share.PodApi``): the extender's
    bind writes the annotation and the binding here; the pod watch (the ledger) sees
    each change, as it would through the API."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.pods: dict[str, dict[str, Any]] = {}  # name -> pod (names are unique per uid)

    def add(self, obj: dict[str, Any]) -> None:
        obj["metadata"]["resourceVersion"] = "1"
        self.pods[obj["metadata"]["name"]] = obj

    def drop(self, uid: str) -> None:
        if self.pods.get(uid, {}).get("metadata", {}).get("uid") == uid:
            del self.pods[uid]  # the replay names its sharing pods by their uid
            return
        for name, obj in list(self.pods.items()):
            if obj["metadata"]["uid"] == uid:
                del self.pods[name]

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        return self.pods[name]

    def annotate(
        self, namespace: str, name: str, resource_version: str, annotations: dict[str, str | None]
    ) -> None:
        meta = self.pods[name]["metadata"]
        if resource_version != meta["resourceVersion"]:
            raise RuntimeError("409 Conflict")
        ann = meta.setdefault("annotations", {})
        for key, value in annotations.items():
            if value is None:
                ann.pop(key, None)
            else:
                ann[key] = value
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
        if ASSIGNED_ANNOTATION in ann:  # the pod watch's MODIFIED event
            uid, assignment, since = view_assignment(
                _POD_VIEW.decode(json.dumps(self.pods[name]))
            )
            self.ledger.set(uid, assignment, awaiting=since)

    def allocated(self, name: str) -> None:
        """The kubelet admitted the pod and gpu-device's Allocate marked it."""
        meta = self.pods[name]["metadata"]
        self.annotate("openb", name, meta["resourceVersion"], {PHASE_ANNOTATION: PHASE_ALLOCATED})

    def bind(
        self, namespace: str, name: str, uid: str, node: str,
        annotations: dict[str, str] | None = None,
    ) -> None:
        """pods/binding: the node and the Binding's annotations, one write (one event)."""
        self.pods[name]["spec"]["nodeName"] = node
        if annotations:
            version = self.pods[name]["metadata"]["resourceVersion"]
            self.annotate(namespace, name, version, dict[str, str | None](annotations))
class Runs:
    """A policy's replay over one seed's pods: the fill protocol (``run``) or churn
    (``run_churn``), from the subclass's ``decide`` (a token for a placed pod, None for
    one that fits nowhere), ``release`` (of a token), ``_state`` and ``_audit``."""

    capacity: int
    result: Result

    def decide(self, pod: PodSpec) -> Any:
        raise NotImplementedError

    def release(self, token: Any) -> None:
        raise NotImplementedError

    def _state(self) -> list[NodeState]:
        raise NotImplementedError

    def _audit(self, result: Result) -> Result:
        raise NotImplementedError

    def run(self, pods: Iterable[PodSpec]) -> Result:
        return self._audit(replay(pods, lambda pod: self.decide(pod) is not None,
                                  self.capacity, self.result, self._state))

    def run_churn(self, pods: Sequence[PodSpec], lives: Sequence[float], gap: float) -> Result:
        return self._audit(churn_replay(pods, lives, gap, self.decide, self.release,
                                        self.capacity, self.result, self._state))


class Replay(Runs):
    """One policy over one seed's pod sequence."""

    def __init__(
        self,
        policy: str,
        specs: list[NodeSpec],
        shapes: dict[int, Shape],
        seed: int,
        taint: float,
        nogpu: bool = True,
    ) -> None:
        self.policy = policy
        self.nogpu = nogpu
        self.nodes = [SimNode(s, shapes[s.gpus], s.cpu, s.memory, s.gpus) for s in specs]
        self.by_name = {n.spec.name: n for n in self.nodes}
        self.capacity = sum(s.gpus for s in specs) * MILLI
        self.result = Result(policy, seed)
        self.rng = random.Random(seed * 1_000_003 + len(policy))
        profile = "default" if policy == "gpu-aware-default-profile" else "shipped"
        self.scheduler = Scheduler(self.nodes, self.rng, profile, taint)
        self.extender: Extender | None = None
        self.sharing = policy == SHARING
        self.store: PodStore | None = None
        if policy.startswith("gpu-aware"):
            self._start_extender()
        self.uid = 0
        # placed pods, for churn: uid -> (node index, pod); per node, uid -> its GPU ids
        self.held: dict[str, tuple[int, PodSpec]] = {}
        self.on_node: list[dict[str, frozenset[str]]] = [{} for _ in self.nodes]

    # -- the extender and the watches that feed it ---------------------------------
    def _start_extender(self) -> None:
        self.cache = NodeCache()
        self.bound = BoundPods()
        self.rooms = NodeRooms()
        self.running = RunningPods()
        for node in self.nodes:
            node.object = node_object(node, node.shape.annotations(node.allocated))
        # the node and pod lists, as the watches deliver them after their first list
        self.cache.replace(
            (n.spec.name, {k: n.object["metadata"]["annotations"][k] for k in READ_ANNOTATIONS})
            for n in self.nodes
        )
        self.rooms.replace(node_room_fields(n.object) for n in self.nodes)
        self.bound.replace([])
        self.running.replace([])
        sharing = None
        if self.sharing:
            labels = {SHARING_MODE_LABEL: MODE_VCUDA}
            for node in self.nodes:
                node.object = node_object(node, node.shape.annotations(node.allocated), labels)
                node.core_free = 100 * node.spec.gpus
            shared = SharedNodes()
            shared.replace(node_item(_NODE_VIEW.decode(json.dumps(n.object))) for n in self.nodes)
            self.ledger = Ledger()
            self.ledger.replace([])
            self.store = PodStore(self.ledger)
            sharing = Sharing(
                shared, self.ledger, self.store, free_room=FreeRoom(self.rooms, self.running)
            )
        self.extender = Extender(
            WeightSource(None, Weights(1, 1)),
            cache=self.cache,
            pods=self.bound,
            rooms=self.rooms,
            running=self.running,
            sharing=sharing,
        )

    def _node_event(self, node: SimNode) -> None:
        annotations = node.shape.annotations(node.allocated)
        node.object = node_object(node, annotations)
        self.cache.upsert(node.spec.name, {k: annotations[k] for k in READ_ANNOTATIONS})
        self.rooms.observe(*node_room_fields(node.object))

    def _pod_event(self, obj: dict[str, Any]) -> None:
        uid, name, shape = running_fields(obj)
        self.bound.set(uid, name, shape[0])
        self.running.set(uid, name, shape)

    # -- choosing ---------------------------------------------------------------------
    def _timed(self, verb: str, body: bytes, into: list[float]) -> Any:
        """gpu-aware's answer to ``verb``; its CPU time (ms) appended to ``into``."""
        assert self.extender is not None
        started = time.thread_time()
        answer = self.extender.handle(verb, body)
        into.append((time.thread_time() - started) * 1000)
        return answer

    def choose(self, pod: PodSpec, uid: str) -> int | None:
        candidates = self.scheduler.feasible(pod, self.sharing and pod.gpus > 0)
        if not candidates:
            return None
        if self.policy == "firstfit-whole":
            return candidates[0]
        if self.policy == "bestfit-whole":
            nodes = self.nodes
            return min(
                candidates,
                key=lambda i: 0.5 * (nodes[i].cpu - pod.cpu) / MAX_SPEC_CPU
                + 0.5 * (nodes[i].free_gpus - pod.gpus) / MAX_SPEC_GPU,
            )
        if pod.gpus == 0:  # managedResources: the main entry never sees it
            return self.scheduler.pick(pod, candidates, self.rank_nogpu(pod, uid, candidates))
        assert self.extender is not None
        names = [self.nodes[i].spec.name for i in candidates]
        obj = pod_object(pod, uid, sharing=self.sharing)
        body = json.dumps({"Pod": obj, "NodeNames": names}).encode()
        answer = self._timed("filter", body, self.result.filter_ms)
        kept = json.loads(answer.body)["NodeNames"]
        if not kept:
            return None
        body = json.dumps({"Pod": obj, "NodeNames": kept}).encode()
        answer = self._timed("prioritize", body, self.result.prioritize_ms)
        scores = {h["Host"]: h["Score"] for h in json.loads(answer.body)}
        keep = set(kept)
        return self.scheduler.pick(
            pod,
            [i for i in candidates if self.nodes[i].spec.name in keep],
            scores,
            self.sharing,
        )

    def rank_nogpu(self, pod: PodSpec, uid: str, candidates: list[int]) -> dict[str, int] | None:
        """The second extender entry (``ExtenderSpec.rank_nogpu``): kube-scheduler asks
        it to score a pod without GPUs on every feasible node (None: the entry is not
        configured, the scheduler's own scorers alone place the pod)."""
        if not self.nogpu or self.extender is None:
            return None
        names = [self.nodes[i].spec.name for i in candidates]
        body = json.dumps({"Pod": pod_object(pod, uid), "NodeNames": names}).encode()
        answer = self._timed(NOGPU_VERB, body, self.result.nogpu_ms)
        scores = {h["Host"]: h["Score"] for h in json.loads(answer.body)}
        return {name: scores.get(name, 0) for name in names}

    def bind(self, pod: PodSpec, index: int, uid: str) -> bool:
        """Sharing mode: the extender's bind verb chooses the GPUs and binds the pod."""
        assert self.extender is not None and self.store is not None
        node = self.nodes[index]
        obj = pod_object(pod, uid, sharing=True)
        obj["metadata"]["name"] = uid  # the trace resamples pods: names repeat, uids do not
        self.store.add(obj)
        body = json.dumps(
            {"PodName": uid, "PodNamespace": "openb", "PodUID": uid, "Node": node.spec.name}
        ).encode()
        answer = json.loads(self._timed("bind", body, self.result.bind_ms).body)
        if answer["Error"]:
            self.store.drop(uid)
            return False
        self.store.allocated(uid)
        assignment = self.ledger.get(uid)
        assert assignment is not None
        if pod.gpus >= 2:
            positions = [
                i for i, u in enumerate(node.shape.topology.units) if u.gpu in assignment.gpus
            ]
            counts = self.result.inside.setdefault(pod.gpus, [0, 0])
            counts[0] += node.shape.groups.inside(positions)
            counts[1] += 1
        used = {node.shape.topology.units[i].id for i in range(len(node.shape.ids))
                if node.shape.topology.units[i].gpu in assignment.gpus}
        node.allocated = node.allocated | frozenset(used)  # for "whole 8-GPU nodes left"
        self.held[uid] = (index, pod)
        self.on_node[index][uid] = frozenset(used)
        node.core_free -= pod.vcuda_core
        node.cpu -= pod.cpu
        node.memory -= pod.memory
        self._pod_event(pod_object(pod, uid, node.spec.name, sharing=True))
        return True

    def place(self, pod: PodSpec, index: int, uid: str) -> None:
        node = self.nodes[index]
        free = [d for d in node.shape.ids if d not in node.allocated]
        self.held[uid] = (index, pod)
        if pod.gpus:
            chosen = allocate(node.shape.topology, free, pod.gpus).devices
            self.on_node[index][uid] = frozenset(chosen)
            positions = [node.shape.topology.position[d] for d in chosen]
            if pod.gpus >= 2:
                counts = self.result.inside.setdefault(pod.gpus, [0, 0])
                counts[0] += node.shape.groups.inside(positions)
                counts[1] += 1
            node.allocated = node.allocated | frozenset(chosen)
            node.free_gpus -= pod.gpus
        node.cpu -= pod.cpu
        node.memory -= pod.memory
        if self.extender is not None:
            # the device plugin publishes the allocation; the watches see node and pod
            if pod.gpus:
                self._node_event(node)
            self._pod_event(pod_object(pod, uid, node.spec.name))

    def decide(self, pod: PodSpec) -> str | None:
        """Schedule ``pod``: the uid it was placed under, or None (fits nowhere); the
        CPU of gpu-aware's calls for a GPU pod goes to ``pod_ms``."""
        verbs = (self.result.filter_ms, self.result.prioritize_ms, self.result.bind_ms)
        before = [len(times) for times in verbs]
        self.uid += 1
        uid = f"pod-{self.uid}"
        index = self.choose(pod, uid)
        if index is None:
            placed = False
        elif self.sharing and pod.gpus:
            placed = self.bind(pod, index, uid)
        else:
            self.place(pod, index, uid)
            placed = True
        if pod.gpus:  # gpu-aware's CPU for this pod: its calls' times
            self.result.pod_ms.append(
                sum(sum(times[at:]) for times, at in zip(verbs, before, strict=True))
            )
        return uid if placed else None

    def release(self, uid: str) -> None:
        """The pod ``uid`` ends: its node gets its CPU, memory and GPUs back, and the
        watches see it go (the pod watch's DELETED event; the device plugin republishes
        the node in the whole-GPU mode)."""
        index, pod = self.held.pop(uid)
        node = self.nodes[index]
        self.on_node[index].pop(uid, None)
        node.allocated = frozenset().union(*self.on_node[index].values())
        node.cpu += pod.cpu
        node.memory += pod.memory
        if self.sharing and pod.gpus:
            assert self.store is not None
            node.core_free += pod.vcuda_core
            self.store.drop(uid)
            self.ledger.set(uid, None, deleted=True)
        elif pod.gpus:
            node.free_gpus += pod.gpus
            if self.extender is not None:
                self._node_event(node)
        if self.extender is not None:
            self.bound.forget(uid)
            self.running.forget(uid)

    def _state(self) -> list[NodeState]:
        return [
            (n.spec.gpus, n.spec.cpu, n.cpu,
             n.core_free * MILLI // 100 if self.sharing else n.free_gpus * MILLI)
            for n in self.nodes
        ]

    def _audit(self, result: Result) -> Result:
        if self.sharing:  # the extender's ledger, fed by the pods' annotations
            result.held = sum(
                a.share.core * len(a.gpus) * MILLI // 100
                for a in self.ledger.assignments().values()
            )
        return result



class PaperReplay(Runs):
    """One of the paper's policies (``paper_policies``) over one seed's pod sequence."""

    def __init__(
        self, policy: str, specs: list[NodeSpec], typical: list[Any], seed: int
    ) -> None:
        rng = random.Random(seed * 1_000_003 + len(policy))
        self.scheduler = PaperScheduler(policy, specs, typical, rng)
        self.specs = specs
        self.capacity = sum(s.gpus for s in specs) * MILLI
        self.result = Result(policy, seed)

    def _state(self) -> list[NodeState]:
        return [
            (s.gpus, s.cpu, n.cpu, sum(n.gpus))
            for s, n in zip(self.specs, self.scheduler.nodes, strict=True)
        ]

    def decide(self, pod: PodSpec) -> tuple[int, tuple[int, ...], PodSpec] | None:
        """Schedule ``pod``: (node index, GPUs, pod), or None; the CPU of a GPU pod's
        decision goes to ``pod_ms``."""
        started = time.thread_time()
        where = self.scheduler.place(pod)
        if pod.gpus:
            self.result.pod_ms.append((time.thread_time() - started) * 1000)
        return None if where is None else (*where, pod)

    def release(self, placed: tuple[int, tuple[int, ...], PodSpec]) -> None:
        self.scheduler.release(*placed)

    def _audit(self, result: Result) -> Result:
        result.held = sum(MILLI * len(n.gpus) - sum(n.gpus) for n in self.scheduler.nodes)
        return result



def replay(
    pods: Iterable[PodSpec],
    place: Callable[[PodSpec], bool],
    capacity: int,
    result: Result,
    state: Callable[[], Sequence[NodeState]],
) -> Result:
    """The protocol's loop: each pod placed once or skipped; at arrived 100 % and 130 %
    of ``capacity`` (milli-GPUs) the allocation, the failed pods per class
    (``pod_class``) and the 8-GPU nodes left whole are read into ``result``."""
    marks = [("100", 1.0), ("130", 1.3)]
    arrived = allocated = 0
    failed: dict[str, int] = {}
    for pod in pods:
        arrived += pod.requested
        if place(pod):
            allocated += pod.requested
        else:
            klass = pod_class(pod)
            failed[klass] = failed.get(klass, 0) + 1
        while marks and arrived >= marks[0][1] * capacity:
            mark = marks.pop(0)[0]
            result.allocation[mark] = 100 * allocated / capacity
            result.failed[mark] = dict(failed)
            nodes = state()
            result.whole8[mark] = sum(1 for g, _, _, free in nodes if g == 8 and free == 8 * MILLI)
            if mark == "100":
                result.by_shape = by_shape(nodes)
        if not marks:
            break  # later pods change no figure
    result.reported = allocated
    return result


def churn_replay(
    pods: Sequence[PodSpec],
    lives: Sequence[float],
    gap: float,
    place: Callable[[PodSpec], Any],
    release: Callable[[Any], None],
    capacity: int,
    result: Result,
    state: Callable[[], Sequence[NodeState]],
) -> Result:
    """The churn loop: pod ``i`` arrives at ``i`` x ``gap`` seconds, after every placed
    pod whose lifetime (``lives[i]``, from its arrival) has ended by then has left
    (``release`` of what ``place`` returned; ``place`` returns None for a pod that fits
    nowhere, which is skipped). Read into ``result``: the allocation and failed pods
    per class at every ``CHURN_STEP`` of arrived requests from 100 % of ``capacity``
    (milli-GPUs) on (marks "100", "150", ...), the failed pods after arrived 100 %
    (``failed["churn"]``), the time-weighted mean allocation from arrived 100 % to the
    last arrival (``churn_mean``) and the pods that left."""
    steps = math.floor(sum(p.requested for p in pods) / capacity / CHURN_STEP + 1e-9)
    marks = [k * CHURN_STEP for k in range(int(1 / CHURN_STEP), steps + 1)]
    leaving: list[tuple[float, int, int, Any]] = []  # (end, arrival, requested, token)
    arrived = allocated = 0
    failed: dict[str, int] = {}
    before: dict[str, int] = {}  # failed by arrived 100 %
    area = 0.0
    start: float | None = None
    last = now = 0.0

    def advance(to: float) -> None:
        nonlocal area, last
        if start is not None:
            area += allocated * (to - last)
        last = to

    for i, (pod, life) in enumerate(zip(pods, lives, strict=True)):
        now = i * gap
        while leaving and leaving[0][0] <= now:
            end, _, requested, token = heapq.heappop(leaving)
            advance(end)
            release(token)
            allocated -= requested
            result.departed += 1
        advance(now)
        arrived += pod.requested
        token = place(pod)
        if token is None:
            klass = pod_class(pod)
            failed[klass] = failed.get(klass, 0) + 1
        else:
            allocated += pod.requested
            heapq.heappush(leaving, (now + life, i, pod.requested, token))
        while marks and arrived >= marks[0] * capacity:
            mark = f"{round(100 * marks.pop(0))}"
            result.allocation[mark] = 100 * allocated / capacity
            result.failed[mark] = dict(failed)
            result.whole8[mark] = sum(
                1 for g, _, _, free in state() if g == 8 and free == 8 * MILLI)
            if start is None:
                start = last = now
                result.failed["churn"] = {}
                before = dict(failed)
    if start is not None:
        result.failed["churn"] = {k: n - before.get(k, 0) for k, n in failed.items()
                                  if n > before.get(k, 0)}
        result.churn_mean = (100 * area / (now - start) / capacity if now > start
                             else 100 * allocated / capacity)
    result.reported = allocated
    return result


FAILED_CLASSES = ("none", "share", "1", "2", "4", "8")  # the table's order


def pod_class(pod: PodSpec) -> str:
    """A pod's class for the failure counts: "none" (no GPU), "share" (part of one GPU),
    else its number of whole GPUs."""
    if not pod.gpus:
        return "none"
    return "share" if pod.gpus == 1 and pod.milli < MILLI else str(pod.gpus)


def by_shape(nodes: Sequence[NodeState]) -> dict[str, list[float]]:
    """Per node shape (``"<GPUs>x<cores>"``): [nodes, free GPUs, free cores]."""
    out: dict[str, list[float]] = {}
    for gpus, cpu, free_cpu, free_milli in nodes:
        acc = out.setdefault(f"{gpus}x{cpu // 1000}", [0, 0.0, 0.0])
        acc[0] += 1
        acc[1] += free_milli / MILLI
        acc[2] += free_cpu / 1000
    return out


def pooled(
    specs: list[NodeSpec], pods: Iterable[PodSpec], seed: int, shared: bool = False
) -> Result:
    """Every pod on one node as large as the cluster: no fragmentation at all; with
    ``shared``, GPUs are counted in milli-GPUs (the bound for the sharing mode)."""
    capacity = sum(s.gpus for s in specs) * MILLI
    room = [sum(s.cpu for s in specs), sum(s.memory for s in specs),
            capacity if shared else capacity // MILLI]

    def place(pod: PodSpec) -> bool:
        need = pod.requested if shared else pod.gpus
        if pod.cpu <= room[0] and pod.memory <= room[1] and need <= room[2]:
            room[0] -= pod.cpu
            room[1] -= pod.memory
            room[2] -= need
            return True
        return False

    result = Result(POOLED_SHARED if shared else POOLED, seed)
    return replay(pods, place, capacity, result, lambda: ())


def shares_packed(specs: list[NodeSpec], pods: Iterable[PodSpec], seed: int) -> Result:
    """An upper bound on the allocation at arrived 100 % that no policy, online or
    offline, can pass: the pods that arrived by then, with every whole-GPU pod placed
    (a GPU it takes holds a whole GPU's worth, more than shares can), and the fractional
    pods packed into the GPUs left, as well as the cutting-stock *configuration LP*
    allows (``shares_lp``: any mix of GPUs each holding at most 100 % of shares, at
    most the arrived count of each share size; an LP, so fractional GPUs allowed). CPU,
    memory, nodes and link groups are left out, which can only raise it."""
    capacity = sum(s.gpus for s in specs) * MILLI
    arrived = whole = 0
    shares: dict[int, int] = {}
    for pod in pods:
        if arrived >= capacity:
            break
        arrived += pod.requested
        if pod.gpus == 1 and pod.milli < MILLI:
            shares[pod.milli] = shares.get(pod.milli, 0) + 1
        else:
            whole += pod.requested
    gpus_left = max(0, capacity - whole) // MILLI
    bound = min(capacity, whole + shares_lp(shares, gpus_left))
    result = Result(SHARES_PACKED, seed)
    result.allocation["100"] = 100 * bound / capacity
    return result


def shares_lp(shares: dict[int, int], gpus: int) -> float:
    """The most milli-GPUs of ``shares`` (size -> count, sizes < ``MILLI``) that ``gpus``
    GPUs can hold, as the configuration LP bounds it: column generation (a knapsack
    prices each new configuration), the value returned is the dual objective of the
    last prices with the GPU price recomputed, so it bounds the LP from above whatever
    rounding the simplex did."""
    sizes = sorted(s for s, n in shares.items() if n > 0)
    if not sizes or gpus <= 0:
        return 0.0
    counts = [shares[s] for s in sizes]
    step = MILLI
    for s in sizes:
        step = math.gcd(step, s)
    units, room = [s // step for s in sizes], MILLI // step
    columns = []
    for i, s in enumerate(sizes):  # one configuration per size: as many as fit
        column = [0] * len(sizes)
        column[i] = min(counts[i], MILLI // s)
        columns.append(column)
    while True:
        _, prices = simplex(
            [[*c, 1] for c in columns],
            [float(sum(n * s for n, s in zip(c, sizes, strict=True))) for c in columns],
            [*counts, gpus],
        )
        item, gpu = prices[:-1], prices[-1]
        item = [max(0.0, p) for p in item]
        gains = [max(0.0, s - p) for s, p in zip(sizes, item, strict=True)]
        reach, column = knapsack(units, gains, room)
        value = reach[room]
        bound = sum(n * p for n, p in zip(counts, item, strict=True)) + gpus * value
        if value <= gpu + 1e-6 or column in columns or len(columns) >= MAX_CONFIGURATIONS:
            return min(bound, float(sum(n * s for n, s in zip(counts, sizes, strict=True))))
        columns.append(column)


# ----------------------------------------------------------------------------- driver
_SHAPES: dict[int, Shape] | None = None


def _shapes() -> dict[int, Shape]:
    global _SHAPES  # one per worker process: the annotation memo is reused across seeds
    if _SHAPES is None:
        _SHAPES = {g: Shape(d) for g, d in device_sets().items()}
    return _SHAPES


def run_seed(
    seed: int, policies: Sequence[str], data: str, every: int, taint: float,
    trace: str = "default", nogpu: bool = True, cpu_scale: float = 1.0,
    churn: Churn | None = None, times: int = 1, prefix: int | None = None,
) -> list[Result]:
    specs, pods = load(Path(data), trace)
    specs = cluster(specs, every, cpu_scale, times)
    capacity = sum(s.gpus for s in specs)
    typical = typical_pods(pods)  # FGD's: from the trace's pod list, as the paper
    if churn is not None:  # the same pods, lifetimes and gap for every policy
        order, lives, gap = churn_workload(pods, capacity, seed, churn)
        return [
            (PaperReplay(policy, specs, typical, seed) if policy in PAPER_POLICIES
             else Replay(policy, specs, _shapes(), seed, taint, nogpu)).run_churn(
                 order, lives, gap)
            for policy in policies
        ]
    order = workload(pods, capacity, seed)[:prefix]
    out = [pooled(specs, order, seed)]
    if any(p not in ("gpu-aware", *WHOLE_BASELINES) for p in policies):
        out.append(pooled(specs, order, seed, shared=True))
        out.append(shares_packed(specs, order, seed))
    for policy in policies:
        if policy in PAPER_POLICIES:
            out.append(PaperReplay(policy, specs, typical, seed).run(order))
        else:
            out.append(Replay(policy, specs, _shapes(), seed, taint, nogpu).run(order))
    return out


def summarise(results: list[Result]) -> list[dict[str, Any]]:
    """One row per policy: per-seed allocations and their mean and range, failed pods
    per seed (mean), link groups, whole 8-GPU nodes, prioritize timings."""
    rows = []
    for policy in dict.fromkeys(r.policy for r in results):
        mine = [r for r in results if r.policy == policy]
        row: dict[str, Any] = {"policy": policy, "seeds": [r.seed for r in mine]}
        churned = any(r.churn_mean is not None for r in mine)  # else the fill protocol's
        marks = sorted({m for r in mine for m in r.allocation} if churned else {"100", "130"},
                       key=float)
        row["marks"] = marks
        for mark in marks:
            per_seed = [r.allocation.get(mark, 0.0) for r in mine]
            row[f"alloc{mark}_seeds"] = per_seed
            row[f"alloc{mark}_range"] = spread(per_seed)
            row[f"alloc{mark}"] = row[f"alloc{mark}_range"]["mean"]
            sizes = sorted({k for r in mine for k in r.failed.get(mark, {})})
            row[f"failed{mark}"] = {
                k: sum(r.failed.get(mark, {}).get(k, 0) for r in mine) / len(mine)
                for k in sizes
            }
            row[f"whole8_{mark}"] = statistics.mean(r.whole8.get(mark, 0) for r in mine)
        if churned:
            per_seed = [r.churn_mean or 0.0 for r in mine]
            row["allocchurn_seeds"] = per_seed
            row["allocchurn_range"] = spread(per_seed)
            row["failedchurn"] = {
                k: sum(r.failed.get("churn", {}).get(k, 0) for r in mine) / len(mine)
                for k in sorted({k for r in mine for k in r.failed.get("churn", {})})
            }
            row["departed"] = statistics.mean(r.departed for r in mine)
        shapes: dict[str, list[float]] = {}
        for r in mine:
            for shape, (nodes, gpus, cores) in r.by_shape.items():
                acc = shapes.setdefault(shape, [nodes, 0.0, 0.0])
                acc[1] += gpus / len(mine)
                acc[2] += cores / len(mine)
        row["by_shape"] = shapes
        inside = [0, 0]
        per_size: dict[int, list[int]] = {}
        for r in mine:
            for k, (a, b) in r.inside.items():
                inside[0] += a
                inside[1] += b
                acc = per_size.setdefault(k, [0, 0])
                acc[0] += a
                acc[1] += b
        row["inside"] = inside
        row["inside_by_size"] = per_size
        for verb in ("filter", "prioritize", "bind", "nogpu", "pod"):
            times = [t for r in mine for t in getattr(r, f"{verb}_ms")]
            if times:
                row[f"{verb}_ms_mean"] = statistics.mean(times)
                row[f"{verb}_ms_p50"] = percentile(times, 0.5)
                row[f"{verb}_ms_p99"] = percentile(times, 0.99)
        rows.append(row)
    return rows


def _range(r: dict[str, float]) -> str:
    return f"{r['mean']:.2f} % ({r['min']:.2f}–{r['max']:.2f})"


def failed(counts: dict[Any, float]) -> str:
    """Failed pods per class as ``class:count`` in ``FAILED_CLASSES`` order."""
    order = {k: i for i, k in enumerate(FAILED_CLASSES)}
    ranked = sorted(counts.items(), key=lambda kv: (order.get(str(kv[0]), 99), str(kv[0])))
    return " ".join(f"{k}:{v:g}" for k, v in ranked) or "-"


def _decision(row: dict[str, Any]) -> str:
    if "pod_ms_mean" not in row:
        return "-"
    return f"{row['pod_ms_mean']:.2f} / {row['pod_ms_p50']:.2f} / {row['pod_ms_p99']:.2f}"


def churn_table(rows: list[dict[str, Any]]) -> str:
    """Churn runs as a Markdown table: per policy the time-weighted mean allocation
    after arrived 100 % (mean and range over the seeds), the allocation at each mark
    of arrived requests (mean), failed pods after arrived 100 % and the pods that left
    (mean per seed), the decision CPU per GPU pod."""
    marks = rows[0]["marks"] if rows else []
    lines = [
        "| policy | time-weighted alloc after arrived 100 %, mean (min–max) | alloc at arrived "
        + " / ".join(f"{m} %" for m in marks)
        + " (mean) | failed pods per seed after arrived 100 % (class:count) "
        "| pods that left per seed | decision CPU per GPU pod, mean / p50 / p99 ms |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        at = " / ".join(f"{row[f'alloc{m}']:.2f}" for m in marks)
        lines.append(
            f"| {LABELS.get(row['policy'], row['policy'])} | {_range(row['allocchurn_range'])} "
            f"| {at} | {failed(row['failedchurn'])} | {row['departed']:.0f} "
            f"| {_decision(row)} |"
        )
    return "\n".join(lines)


def table(rows: list[dict[str, Any]], trace: str = "default") -> str:
    """The rows as a Markdown table; the paper's own figures where it has them."""
    paper = PAPER_FIGURES.get(trace, {})
    lines = [
        "| policy | alloc @100 %, mean (min–max) | paper @100 % | alloc @130 % "
        "| failed pods per seed @100 % (class:count) | failed @130 % "
        "| 2/4/8-GPU pods in one link group | whole 8-GPU nodes @100 % "
        "| decision CPU, mean / p50 / p99 ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        a, b = row["inside"]
        inside = f"{100 * a / b:.1f} % ({a}/{b})" if b else "-"
        if row["policy"] in BOUNDS:
            inside = "-"
        timing = "; ".join(
            f"{label} {row[f'{verb}_ms_mean']:.2f} / {row[f'{verb}_ms_p50']:.2f} / "
            f"{row[f'{verb}_ms_p99']:.2f}"
            for verb, label in (
                ("filter", "filter"),
                ("prioritize", "prioritize"),
                ("bind", "bind"),
                ("nogpu", "pods without GPUs"),
                ("pod", "per GPU pod"),
            )
            if f"{verb}_ms_mean" in row
        ) or "-"
        whole = "-" if row["policy"] in BOUNDS else f"{row['whole8_100']:.1f}"
        known = paper.get(row["policy"])
        theirs = _range(dict(zip(("mean", "min", "max"), known, strict=True))) if known else "-"
        later = "-" if row["policy"] == SHARES_PACKED else _range(row["alloc130_range"])
        lines.append(
            f"| {LABELS.get(row['policy'], row['policy'])} | {_range(row['alloc100_range'])} "
            f"| {theirs} | {later} "
            f"| {failed(row['failed100'])} | {failed(row['failed130'])} | {inside} "
            f"| {whole} | {timing} |"
        )
    return "\n".join(lines)


def shape_table(rows: list[dict[str, Any]]) -> str:
    """Per node shape, per policy: the free GPUs and free cores at arrived 100 % (mean
    per seed), where each policy leaves its capacity unused."""
    mine = [row for row in rows if row["policy"] not in BOUNDS and row["by_shape"]]

    def order(shape: str) -> tuple[int, int]:
        gpus, _, cores = shape.partition("x")
        return int(gpus), int(cores)

    shapes = sorted({shape for row in mine for shape in row["by_shape"]}, key=order)
    lines = [
        "| node shape (GPUs x cores), nodes | "
        + " | ".join(f"{LABELS.get(r['policy'], r['policy'])}: free GPUs / cores" for r in mine)
        + " |",
        "|---|" + "---|" * len(mine),
    ]
    for shape in shapes:
        count = next(int(r["by_shape"][shape][0]) for r in mine if shape in r["by_shape"])
        cells = []
        for row in mine:
            _, gpus, cores = row["by_shape"].get(shape, (0, 0.0, 0.0))
            cells.append(f"{gpus:.1f} / {cores:.0f}")
        lines.append(f"| {shape}, {count} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def compare(mine: dict[str, Any], other: dict[str, Any], mark: str = "100") -> str:
    """``mine`` against ``other`` at arrived ``mark`` %: the difference of the means, the
    per-seed differences (same pods, same seeds), and a verdict that says "above" or
    "below" only when the mean lies beyond the other's per-seed range."""
    a, b = mine[f"alloc{mark}_range"], other[f"alloc{mark}_range"]
    diffs = [
        x - y for x, y in zip(mine[f"alloc{mark}_seeds"], other[f"alloc{mark}_seeds"],
                              strict=True)
    ]
    if a["mean"] > b["max"]:
        verdict = "above its range"
    elif a["mean"] < b["min"]:
        verdict = "below its range"
    else:
        verdict = "within its range"
    return (
        f"{a['mean'] - b['mean']:+.2f} points ({verdict}); per seed "
        f"{min(diffs):+.2f} to {max(diffs):+.2f}"
    )


def seeds_arg(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        out += list(range(int(low), int(high or low) + 1))
    return out


def run(
    seeds: Sequence[int],
    policies: Sequence[str] = POLICIES,
    data: Path = DATA,
    every: int = 1,
    jobs: int = 1,
    taint: float = TAINT_CORES_PER_GPU,
    trace: str = "default",
    nogpu: bool = True,
    cpu_scale: float = 1.0,
    churn: Churn | None = None,
    times: int = 1,
    prefix: int | None = None,
) -> list[dict[str, Any]]:
    """Replay every seed with every policy; one summary row per policy. ``cpu_scale``:
    every node's CPU times this (``scale_cpu``); ``churn``: pods also leave
    (``churn_replay``) instead of the fill protocol; ``times``: the nodes repeated
    (``repeat_nodes``); ``prefix``: only the first that many pods of each seed's fill
    protocol (for timings: marks the prefix does not reach read an allocation of 0)."""
    unknown = [p for p in policies if p not in ALL_POLICIES]
    if unknown:
        raise ValueError(f"policies {', '.join(unknown)}: known are {', '.join(ALL_POLICIES)}")
    cluster([], 1, cpu_scale, times)  # a bad factor fails here, before any replay
    if prefix is not None and (prefix < 1 or churn is not None):
        raise ValueError(f"pods {prefix}: a whole number above 0 is allowed, and only "
                         "with the fill protocol (not with churn)")
    args = [(s, tuple(policies), str(data), every, taint, trace, nogpu, cpu_scale, churn,
             times, prefix) for s in seeds]
    if jobs > 1 and len(seeds) > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            chunks = list(pool.map(run_seed, *zip(*args, strict=True)))
    else:
        chunks = [run_seed(*a) for a in args]
    return summarise([r for chunk in chunks for r in chunk])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="42-51", help="e.g. 42-51 or 42,43")
    parser.add_argument("--policies", default=",".join(POLICIES),
                        help=f"comma-separated, of: {', '.join(ALL_POLICIES)}")
    parser.add_argument("--data", default=str(DATA), help="directory of the openb CSV files")
    parser.add_argument("--trace", default="default",
                        help="pod list openb_pod_list_<TRACE>.csv in --data (default, "
                        "gpushare40, multigpu50, cpu200, ...)")
    parser.add_argument("--every", type=int, default=1, help="keep every Nth node (sub-cluster)")
    parser.add_argument("--taint-cores-per-gpu", type=float, default=TAINT_CORES_PER_GPU,
                        help="gpu-aware: PreferNoSchedule taint on nodes with fewer CPU "
                        "cores per GPU (0: none, the default)")
    parser.add_argument("--no-rank-nogpu", action="store_true",
                        help="gpu-aware: without the second extender entry that ranks pods "
                        "without GPUs (the scheduler's scorers place them)")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                        help="processes (one seed each)")
    parser.add_argument("--quick", action="store_true",
                        help="seeds 42,43 on every 8th node: seconds, for tests")
    parser.add_argument("--cpu-scale", type=float, default=1.0,
                        help="every node's CPU times this (0.75: a CPU-short cluster "
                        "derived from the trace's)")
    parser.add_argument("--nodes-scale", type=int, default=1,
                        help="the trace's nodes this many times over (4: openb's 1,213 "
                        "nodes as 4,852, the pods resampled to fill them)")
    parser.add_argument("--pods", type=int, default=None,
                        help="only the first N pods of each seed's fill protocol (for "
                        "timings on a part of the run; marks it does not reach read 0)")
    parser.add_argument("--churn", action="store_true",
                        help="pods also leave (see --lifetimes, --churn-load, --churn-span) "
                        "instead of the fill protocol")
    parser.add_argument("--lifetimes", default="trace", choices=LIFETIMES,
                        help="churn: each pod's lifetime from the trace (deletion_time - "
                        "creation_time) or exponential with mean 1 (exp)")
    parser.add_argument("--churn-load", type=float, default=Churn.load,
                        help="churn: offered load at the run's end, x capacity")
    parser.add_argument("--churn-span", type=float, default=Churn.span,
                        help="churn: pods arrive until their requests reach this x capacity")
    parser.add_argument("--json", default=None, help="also write the rows as JSON here")
    parser.add_argument("--by-shape", action="store_true",
                        help="also print, per node shape, the free GPUs and cores each "
                        "policy leaves at arrived 100 %%")
    args = parser.parse_args(argv)
    seeds = [42, 43] if args.quick else seeds_arg(args.seeds)
    every = 8 if args.quick and args.every == 1 else args.every
    policies = [p for p in args.policies.split(",") if p]
    churn = (Churn(args.churn_load, args.churn_span, args.lifetimes) if args.churn
             else None)
    note = model_note(Path(args.data), args.trace)
    if note:
        print(note, flush=True)
    # the table comes when every seed is done: say that it runs
    print(f"openb trace {args.trace!r}: {len(seeds)} seed(s), {len(policies)} "
          f"policy(ies), {args.jobs} process(es); the table follows when all are done",
          flush=True)
    started = time.perf_counter()
    rows = run(seeds, policies, Path(args.data), every, args.jobs, args.taint_cores_per_gpu,
               args.trace, not args.no_rank_nogpu, args.cpu_scale, churn, args.nodes_scale,
               args.pods)
    elapsed = time.perf_counter() - started
    specs, _ = load(Path(args.data), args.trace)
    specs = cluster(specs, every, args.cpu_scale, args.nodes_scale)
    print(
        f"openb trace {args.trace!r}: {len(specs)} nodes, {sum(s.gpus for s in specs)} GPUs, "
        f"{sum(s.cpu for s in specs) // 1000} cores (CPU x {args.cpu_scale:g}), "
        f"seeds {','.join(map(str, seeds))}, {elapsed:.0f} s ({args.jobs} process(es))"
        + (f", the first {args.pods} pods of each seed" if args.pods is not None else "")
    )
    if churn is not None:
        print(f"churn: lifetimes {churn.lifetimes}, offered load {churn.load:g} x capacity "
              f"at the end, arrivals until at least {churn.span:g} x capacity")
        print(churn_table(rows))
    else:
        print(table(rows, args.trace))
    if args.by_shape:
        print(shape_table(rows))
    by = {row["policy"]: row for row in rows}
    mark, what = ("churn", "time-weighted after arrived 100 %") if churn else ("100",
                                                                              "at arrived 100 %")
    if SHARING in by:
        for other in ("fgd", "bestfit", "dotprod", "random"):
            if other in by:
                print(f"{SHARING} vs {other} {what}: {compare(by[SHARING], by[other], mark)}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
