"""The request mix GPU sharing measures placements against (``ArrivalMix``).

FGD (Weng et al., ATC '23) measures fragmentation against the workload that arrives:
the mix is made of the sharing pods ``filter`` was asked to place (placed or not, each
UID once, the latest ``ARRIVALS``), blended with a prior (``MIX_PRIOR``), and re-taken
when ``MIX_DRIFT`` of its pods changed, so placements memoised per mix version stay
valid meanwhile.

Where pods also leave, the mix follows what stays: a class weighs its pods times the
share of its placed pods (``placed``) that are still placed (``holding``), so that
long-lived requests, which make up what stays on the GPUs, weigh more than short-lived
ones that arrive as often. Until a placed pod has left this is the arrival mix itself.

Example: ten pods observed asking one GPU at 50 % with 8 cores each make the class
``(1, 50, 8000, 0)`` weigh 10, next to the prior's classes weighing 1 in all
(``MIX_PRIOR`` x 10); the mix's CPU per GPU is 80,000 / 5 = 16,000 millicores. If all
ten were placed and eight of them have left, the class weighs 10 x 2 / 10 = 2.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar

from ...core.sharing import (
    DEFAULT_SHARE_MIX,
    FULL_CORE,
    ShareClass,
    ShareMix,
    ShareRequest,
)

MIX_DRIFT = 0.05  # re-take the request mix after this share of its weight changed
MIX_PRIOR = 0.1  # weight of DEFAULT_SHARE_MIX next to the arrived pods' requests
ARRIVALS = 20_000  # sharing pods remembered for the request mix (the latest)


_K = TypeVar("_K", bound=tuple[Any, ...])


def _drop_oldest(seen: OrderedDict[str, _K], counts: dict[_K, int]) -> _K:
    """Take the oldest pod out of a window (``seen``: UID -> its class) and out of its
    class's count; its class."""
    _, old = seen.popitem(last=False)
    left = counts.get(old, 0) - 1
    if left > 0:
        counts[old] = left
    else:
        counts.pop(old, None)
    return old


class ArrivalMix:
    """The request mix that placements are measured against: the requests of the
    sharing pods the extender was asked to place (``filter``), each pod once (by UID),
    the latest ``ARRIVALS`` of them -- pods that found no room included: FGD measures
    fragmentation against the workload that arrives, and a mix of the running pods
    alone forgets exactly the requests that failed -- blended with ``prior`` (weight
    ``MIX_PRIOR``; CPU 0). A class is (GPUs, percent of each, CPU millicores, memory
    MiB) and weighs the number of its pods, as FGD's typical pods do (an 8-GPU pod counts
    as much as a quarter-GPU one: weighing classes by the GPUs they ask let the rare
    large pods decide, and fragmented the GPUs the many small ones use). The mix is
    re-taken when ``MIX_DRIFT`` of its pods changed, so placements memoised per mix
    version stay valid meanwhile.

    Under churn the pods that stay placed are not the arrivals: a class that arrives
    often but leaves soon holds few GPUs at any time. Each class is therefore weighed
    by the share of its pods that stay: of its pods in the window that were placed
    (``placed``), those still placed (``holding(uid)``, the extender's ledger) -- the
    standing count over the arrivals, as Little's law has it, from what the extender
    saw leave, no lifetime assumed. A class none of whose pods was placed takes the
    share over all classes. While no placed pod has left (the cluster only fills)
    every share is 1 and the mix is the arrivals'; so it is when none stays."""

    def __init__(
        self,
        prior: tuple[tuple[int, float], ...] = DEFAULT_SHARE_MIX,
        window: int = ARRIVALS,
        holding: Callable[[str], bool] | None = None,
    ) -> None:
        self._prior = prior
        self._window = window
        # whether a placed pod is still placed (None: departures are not followed)
        self._holding = holding
        self._placed: set[str] = set()  # pods of the window that were placed
        self._seen: OrderedDict[str, ShareClass] = OrderedDict()
        self._pods: dict[ShareClass, int] = {}  # class -> pods in the window
        self._total = 0
        self._drift = 0
        self._lock = threading.Lock()
        # the GPUs and CPU millicores the pods in the windows ask (``large``)
        self._gpus = 0.0
        self._cpu = 0
        # pods without GPUs (``observe_plain``): UID -> (CPU millicores, memory MiB), the
        # latest ``window``, and how many ask each
        self._plain: OrderedDict[str, tuple[int, int]] = OrderedDict()
        self._needs: dict[tuple[int, int], int] = {}
        self._mix: tuple[int, ShareMix] = (1, self._take())

    def observe(self, uid: str, share: ShareRequest, cpu_milli: int, memory_mib: int = 0) -> None:
        """A pod the scheduler asks about (once per UID; the oldest leave the window)."""
        if not uid or uid in self._seen:
            return
        pct = FULL_CORE if share.whole else min(max(share.core, 0), FULL_CORE)
        if pct <= 0:
            return  # best effort: reserves nothing, strands nothing
        klass = (share.gpus, pct, max(cpu_milli, 0), max(memory_mib, 0))
        with self._lock:
            self._seen[uid] = klass
            self._pods[klass] = self._pods.get(klass, 0) + 1
            self._total += 1
            self._drift += 1
            self._gpus += klass[0] * klass[1] / FULL_CORE
            self._cpu += klass[2]
            while len(self._seen) > self._window:
                self._placed.discard(next(iter(self._seen)))
                old = _drop_oldest(self._seen, self._pods)
                self._total -= 1
                self._drift += 1
                self._gpus -= old[0] * old[1] / FULL_CORE
                self._cpu -= old[2]

    def placed(self, uid: str) -> None:
        """A pod of the window was placed (bound): from now on it counts as staying
        while ``holding`` says it is placed."""
        with self._lock:
            if uid in self._seen:
                self._placed.add(uid)

    def follow(self, holding: Callable[[str], bool]) -> None:
        """Follow departures from now on: ``holding(uid)`` says whether a placed pod is
        still placed (``Sharing`` passes its ledger)."""
        with self._lock:
            self._holding = holding

    def observe_plain(self, uid: str, cpu_milli: int, memory_mib: int) -> None:
        """A pod without GPUs the scheduler asks about (the second entry; once per UID,
        the latest ``window`` kept). It does not enter the mix (it asks no GPU); it
        counts for ``large``."""
        if not uid or uid in self._plain:
            return
        need = (max(cpu_milli, 0), max(memory_mib, 0))
        with self._lock:
            self._plain[uid] = need
            self._needs[need] = self._needs.get(need, 0) + 1
            self._cpu += need[0]
            while len(self._plain) > self._window:
                self._cpu -= _drop_oldest(self._plain, self._needs)[0]

    def large(self, largest: tuple[int, int]) -> tuple[int, float, int]:
        """(the pods without GPUs observed that ask at least the CPU or at least the
        memory of ``largest``, the GPUs and the CPU millicores all observed pods ask):
        the share of the arriving pods that need a room as large as ``largest``, per GPU
        and per core."""
        with self._lock:
            pods = sum(n for (cpu, memory), n in self._needs.items()
                       if cpu >= largest[0] or memory >= largest[1])
            return pods, self._gpus, self._cpu

    def _staying(self) -> dict[ShareClass, float]:
        """Per class its pods in the window, each class times the share of its placed
        pods still placed (the share over all classes where none was placed); the
        counts themselves while no placed pod has left, or when none stays."""
        holding = self._holding
        if holding is None or not self._placed:
            return dict(self._pods)
        placed: dict[ShareClass, list[int]] = {}  # class -> [placed, still placed]
        for uid in self._placed:
            counts = placed.setdefault(self._seen[uid], [0, 0])
            counts[0] += 1
            counts[1] += holding(uid)
        was = sum(n for n, _ in placed.values())
        stays = sum(n for _, n in placed.values())
        if stays in (was, 0):  # nothing left, or nothing stays: the arrivals say most
            return dict(self._pods)
        overall = stays / was
        return {
            klass: n * (placed[klass][1] / placed[klass][0] if klass in placed else overall)
            for klass, n in self._pods.items()
        }

    def _take(self) -> ShareMix:
        weights = self._staying()
        total = sum(weights.values())
        blend: dict[ShareClass, float] = dict(weights)
        prior = sum(w for _, w in self._prior)
        scale = MIX_PRIOR * max(total, 1.0) / prior if prior > 0 else 0.0
        for pct, w in self._prior:
            klass = (1, pct, 0, 0)
            blend[klass] = blend.get(klass, 0.0) + w * scale
        # CPU per GPU of the pods the mix weighs: their CPU over the GPUs they ask for,
        # a class (GPUs, percent, CPU) of n pods asking n x GPUs x percent / 100 GPUs
        cpu = sum(n * c[2] for c, n in weights.items())
        gpus = sum(n * c[0] * c[1] / FULL_CORE for c, n in weights.items())
        return ShareMix(blend, cpu_per_gpu=cpu / gpus if gpus > 0 else None)

    def mix(self) -> tuple[int, ShareMix]:
        """(version, mix)."""
        if self._drift <= MIX_DRIFT * max(self._total, 1.0):
            return self._mix
        with self._lock:
            if self._drift <= MIX_DRIFT * max(self._total, 1.0):
                return self._mix  # another thread re-took it while this one waited
            self._mix = (self._mix[0] + 1, self._take())
            self._drift = 0
            return self._mix

    def __len__(self) -> int:
        return len(self._seen)
