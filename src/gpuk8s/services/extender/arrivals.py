"""The request mix GPU sharing measures placements against (``ArrivalMix``).

FGD (Weng et al., ATC '23) measures fragmentation against the workload that arrives:
the mix is made of the sharing pods ``filter`` was asked to place (placed or not, each
UID once, the latest ``ARRIVALS``), blended with a prior (``MIX_PRIOR``), and re-taken
when ``MIX_DRIFT`` of its pods changed, so placements memoised per mix version stay
valid meanwhile.

Example: ten pods observed asking one GPU at 50 % with 8 cores each make the class
``(1, 50, 8000, 0)`` weigh 10, next to the prior's classes weighing 1 in all
(``MIX_PRIOR`` x 10); the mix's CPU per GPU is 80,000 / 5 = 16,000 millicores.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
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
    version stay valid meanwhile."""

    def __init__(
        self,
        prior: tuple[tuple[int, float], ...] = DEFAULT_SHARE_MIX,
        window: int = ARRIVALS,
    ) -> None:
        self._prior = prior
        self._window = window
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
                old = _drop_oldest(self._seen, self._pods)
                self._total -= 1
                self._drift += 1
                self._gpus -= old[0] * old[1] / FULL_CORE
                self._cpu -= old[2]

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

    def _take(self) -> ShareMix:
        total = self._total
        blend: dict[ShareClass, float] = dict(self._pods)
        prior = sum(w for _, w in self._prior)
        scale = MIX_PRIOR * max(total, 1.0) / prior if prior > 0 else 0.0
        for pct, w in self._prior:
            klass = (1, pct, 0, 0)
            blend[klass] = blend.get(klass, 0.0) + w * scale
        # CPU per GPU of the arrived pods: their CPU over the GPUs they ask for, a class
        # (GPUs, percent, CPU) of n pods asking n x GPUs x percent / 100 GPUs
        cpu = sum(n * c[2] for c, n in self._pods.items())
        gpus = sum(n * c[0] * c[1] / FULL_CORE for c, n in self._pods.items())
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
