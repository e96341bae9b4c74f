"""The baselines of "Beware of Fragmentation" (Weng et al., ATC '23) with GPU sharing, for
``benchmarks/packing.py``: FGD, BestFit, DotProd and Random as the paper defines them and
its simulator (kube-scheduler with one score plugin) runs them, written from that
description, independent of gpu-aware's code.

What every policy gets, as the product does: a fractional pod (``gpu_milli`` < 1000)
shares a GPU with others (each GPU holds 1000 milli-GPUs), a pod of whole GPUs takes
GPUs nobody uses, and CPU and memory are hard limits (kube-scheduler's
``NodeResourcesFit`` filter). A pod is placed in one scheduling cycle, as in the paper's
simulator:

* **filter** -- CPU and memory fit, and the node has one GPU with the fractional pod's
  milli-GPUs left, or as many unused GPUs as the pod asks;
* **score** -- the policy's integer score 0..100 per feasible node (kube-scheduler's
  scores are integers: the quantisation is part of each policy's behaviour);
* **select** -- a node of the highest score; among equals the first in a random order
  of the nodes drawn once per run (the paper's simulator renames the nodes with a
  random prefix, from the run's seed, and its kube-scheduler's ``selectHost`` keeps
  the smallest name among equal scores, "for reproducibility", where the upstream one
  picks uniformly at random -- a detail that decides much: with uniform choice among
  equals, FGD's coarse integer scores spread the pods and it lands near 90 % on the
  default trace instead of the paper's 95 %);
* **reserve** -- the policy's GPU choice on that node.

Policies (the paper's section 6 and its artifact's score plugins):

``fgd``
    Fragmentation Gradient Descent. The *typical pods* are the pod shapes (CPU,
    milli-GPUs per GPU, GPUs) of the trace's pod list, CPU-only pods included, counted
    per pod, the most frequent first until they cover 95 % of the pods, their
    frequencies renormalised. A node's fragmentation is, summed over the typical pods
    with their frequency, the node's free milli-GPUs that pod shape cannot use: all of
    them when the node lacks the CPU or the GPUs for it (and always for a CPU-only
    shape), else those on GPUs with fewer milli-GPUs left than it asks. The score is
    ``int(100 * sigmoid((before - after) / 1000))``; a fractional pod tries every GPU
    that fits and keeps the first of the best.
``bestfit``
    ``int(100 * (1 - 0.5 * cpu_left_after / 128 cores - 0.5 * gpu_left_after / 8000))``
    with ``gpu_left`` the node's free milli-GPUs summed; GPU: the fitting GPU with the
    least left (the first of them).
``dotprod``
    Tetris' dot product of the node's free (CPU, milli-GPUs) and the pod's request, each
    divided by (128 cores, 8000 milli-GPUs): ``int(100 * (1 - dot / 2))``, so the node
    whose free resources align least with the request (the fullest) wins; GPU as
    BestFit.
``random``
    A feasible node uniformly at random; a fitting GPU at random.

Whole GPUs are the first unused ones by index (the paper's simulator has no GPU
topology). Memory is a filter only, as in the paper.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from typing import Protocol

MILLI = 1000
MAX_SPEC_CPU = 128_000  # milli-CPU: the score normalisation of BestFit and DotProd
MAX_SPEC_GPU = 8_000  # milli-GPU
POPULARITY = 0.95  # typical pods cover this share of the trace's pods
PAPER_POLICIES = ("fgd", "bestfit", "dotprod", "random")
MAX_MEMO = 1_000_000  # node states whose fragmentation is remembered


class NodeShape(Protocol):
    @property
    def cpu(self) -> int: ...  # milli-CPU
    @property
    def memory(self) -> int: ...  # MiB
    @property
    def gpus(self) -> int: ...


class Pod(NodeShape, Protocol):
    @property
    def milli(self) -> int: ...  # milli-GPUs on each GPU (0: no GPU)


# a typical pod: (CPU millicores, milli-GPUs per GPU, GPUs)
Typical = tuple[int, int, int]


def typical_pods(
    pods: Iterable[Pod], popularity: float = POPULARITY
) -> list[tuple[Typical, float]]:
    """The trace's most frequent pod shapes covering ``popularity`` of its pods, with
    their frequencies renormalised to sum to 1 (the order: most frequent first, equal
    counts by the larger CPU, milli-GPUs, GPUs first)."""
    counts: dict[Typical, int] = {}
    total = 0
    for pod in pods:
        key = (pod.cpu, pod.milli if pod.gpus else 0, pod.gpus)
        counts[key] = counts.get(key, 0) + 1
        total += 1
    ranked = sorted(counts.items(), key=lambda item: (item[1], item[0]), reverse=True)
    chosen: list[tuple[Typical, int]] = []
    covered = 0
    for key, count in ranked:
        if covered >= popularity * total:
            break
        chosen.append((key, count))
        covered += count
    return [(key, count / covered) for key, count in chosen]


class Fragmentation:
    """FGD's node fragmentation for one set of typical pods, memoised per node state."""

    def __init__(self, typical: Sequence[tuple[Typical, float]]) -> None:
        self.cpu_only = sum(p for (_, milli, gpus), p in typical if not gpus or not milli)
        groups: dict[tuple[int, int], list[tuple[int, float]]] = {}
        for (cpu, milli, gpus), p in typical:
            if gpus and milli:
                groups.setdefault((milli, gpus), []).append((cpu, p))
        # (milli, GPUs, CPU thresholds ascending, weight of the shapes fed at each, total)
        self.groups: list[tuple[int, int, list[int], list[float], float]] = []
        for (milli, gpus), members in sorted(groups.items()):
            members.sort()
            cpus = [c for c, _ in members]
            fed = [0.0]
            for _, p in members:
                fed.append(fed[-1] + p)
            self.groups.append((milli, gpus, cpus, fed, fed[-1]))
        self.millis = sorted({g[0] for g in self.groups})
        self._memo: dict[tuple[int, tuple[int, ...]], float] = {}

    def __call__(self, cpu_left: int, gpus: tuple[int, ...]) -> float:
        """``gpus``: milli-GPUs left per GPU, sorted ascending."""
        key = (cpu_left, gpus)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        total = sum(gpus)
        lost = 0.0
        if total:
            lost = self.cpu_only * total
            at_least: dict[int, int] = {}
            below: dict[int, int] = {}
            for m in self.millis:
                cut = bisect_right(gpus, m - 1)  # GPUs with fewer than m left
                at_least[m] = len(gpus) - cut
                below[m] = sum(gpus[:cut])
            for milli, count, cpus, fed, weight in self.groups:
                if at_least[milli] >= count:
                    w = fed[bisect_right(cpus, cpu_left)]
                    lost += w * below[milli] + (weight - w) * total
                else:
                    lost += weight * total
        if len(self._memo) >= MAX_MEMO:
            self._memo.clear()
        self._memo[key] = lost
        return lost


class _Node:
    __slots__ = ("cpu", "gpus", "memory", "scores")

    def __init__(self, shape: NodeShape) -> None:
        self.cpu = shape.cpu
        self.memory = shape.memory
        self.gpus = [MILLI] * shape.gpus
        self.scores: dict[Typical, tuple[int, tuple[int, ...]] | None] = {}


def _sigmoid_score(delta: float) -> int:
    """FGD's score of a fragmentation change (the paper's float operations, truncated)."""
    return int(1.0 / (1.0 + math.exp(-delta / 1000.0)) * 100.0)


class PaperScheduler:
    """One of ``PAPER_POLICIES`` over a cluster; ``place`` schedules one pod."""

    def __init__(
        self,
        policy: str,
        nodes: Sequence[NodeShape],
        typical: Sequence[tuple[Typical, float]],
        rng: random.Random,
    ) -> None:
        if policy not in PAPER_POLICIES:
            raise ValueError(f"policy {policy!r}: one of {', '.join(PAPER_POLICIES)}")
        self.policy = policy
        self.nodes = [_Node(n) for n in nodes]
        self.rng = rng
        # the tie-break: the node first in this order among equal scores
        self.rank = list(range(len(self.nodes)))
        rng.shuffle(self.rank)
        self.frag = Fragmentation(typical) if policy == "fgd" else None

    # -- filter ---------------------------------------------------------------------
    @staticmethod
    def _fits(node: _Node, pod: Pod) -> bool:
        if node.cpu < pod.cpu or node.memory < pod.memory:
            return False
        if not pod.gpus:
            return True
        if pod.milli < MILLI:
            return any(g >= pod.milli for g in node.gpus)
        return sum(1 for g in node.gpus if g == MILLI) >= pod.gpus

    # -- GPU choice -----------------------------------------------------------------
    @staticmethod
    def _whole(node: _Node, pod: Pod) -> tuple[int, ...]:
        return tuple([i for i, g in enumerate(node.gpus) if g == MILLI][: pod.gpus])

    def _tightest(self, node: _Node, pod: Pod) -> tuple[int, ...]:
        best = -1
        for i, g in enumerate(node.gpus):
            if g >= pod.milli and (best < 0 or g < node.gpus[best]):
                best = i
        return (best,)

    # -- scores -----------------------------------------------------------------------
    def _score(self, node: _Node, pod: Pod) -> tuple[int, tuple[int, ...]]:
        fractional = bool(pod.gpus) and pod.milli < MILLI
        if self.policy == "fgd":
            return self._fgd(node, pod, fractional)
        gpus = (
            (self._tightest(node, pod) if fractional else self._whole(node, pod))
            if pod.gpus
            else ()
        )
        free_gpu, ask_gpu = sum(node.gpus), pod.gpus * pod.milli
        if self.policy == "bestfit":  # the paper's float operations, in its order
            left = (node.cpu - pod.cpu) / MAX_SPEC_CPU * 0.5
            left += (free_gpu - ask_gpu) / MAX_SPEC_GPU * 0.5
            return int((1.0 - left) * 100.0), gpus
        # dotprod
        dot = (node.cpu / MAX_SPEC_CPU) * (pod.cpu / MAX_SPEC_CPU)
        dot += (free_gpu / MAX_SPEC_GPU) * (ask_gpu / MAX_SPEC_GPU)
        return int(100.0 * (1.0 - dot / 2)), gpus

    def _fgd(self, node: _Node, pod: Pod, fractional: bool) -> tuple[int, tuple[int, ...]]:
        frag = self.frag
        assert frag is not None
        before = frag(node.cpu, tuple(sorted(node.gpus)))
        cpu = node.cpu - pod.cpu
        if fractional:
            best, chosen = -1, -1
            seen: dict[int, int] = {}
            for i, g in enumerate(node.gpus):
                if g < pod.milli:
                    continue
                score = seen.get(g)
                if score is None:
                    after = list(node.gpus)
                    after[i] = g - pod.milli
                    score = seen[g] = _sigmoid_score(before - frag(cpu, tuple(sorted(after))))
                if score > best:
                    best, chosen = score, i
            return best, (chosen,)
        gpus = self._whole(node, pod) if pod.gpus else ()
        after = list(node.gpus)
        for i in gpus:
            after[i] = 0
        return _sigmoid_score(before - frag(cpu, tuple(sorted(after)))), gpus

    # -- one scheduling cycle ---------------------------------------------------------
    def place(self, pod: Pod) -> tuple[int, tuple[int, ...]] | None:
        """Schedule ``pod``: (node index, GPU indexes) it now holds, or None (fits
        nowhere: skipped, as in the paper's protocol)."""
        feasible = [i for i, n in enumerate(self.nodes) if self._fits(n, pod)]
        if not feasible:
            return None
        if self.policy == "random":
            index = feasible[self.rng.randrange(len(feasible))]
            node = self.nodes[index]
            if pod.gpus and pod.milli < MILLI:
                fit = [i for i, g in enumerate(node.gpus) if g >= pod.milli]
                gpus: tuple[int, ...] = (fit[self.rng.randrange(len(fit))],)
            else:
                gpus = self._whole(node, pod) if pod.gpus else ()
            return self._take(index, pod, gpus)
        key = (pod.cpu, pod.milli if pod.gpus else 0, pod.gpus)
        rank = self.rank
        top = first = -1
        chosen: tuple[int, tuple[int, ...]] = (-1, ())
        for index in feasible:
            node = self.nodes[index]
            hit = node.scores.get(key)
            if hit is None:
                hit = node.scores[key] = self._score(node, pod)
            score, gpus = hit
            if score > top or (score == top and rank[index] < first):
                top, first, chosen = score, rank[index], (index, gpus)
        return self._take(chosen[0], pod, chosen[1])

    def release(self, index: int, gpus: tuple[int, ...], pod: Pod) -> None:
        """``pod``, placed on node ``index`` with ``gpus`` by ``place``, ends: the node
        gets its CPU, memory and milli-GPUs back."""
        node = self.nodes[index]
        node.cpu += pod.cpu
        node.memory += pod.memory
        for i in gpus:
            node.gpus[i] += pod.milli
        node.scores = {}

    def _take(self, index: int, pod: Pod, gpus: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
        node = self.nodes[index]
        node.cpu -= pod.cpu
        node.memory -= pod.memory
        for i in gpus:
            node.gpus[i] -= pod.milli
        node.scores = {}
        return index, gpus
