"""Capacity: one GPU as sharing sees it, what its pods hold, and whether a share fits.

=====================  =============================================================
``GpuCapacity``        a GPU's index, memory, health, share slots
``GpuUsage``           compute percent, memory and shares its pods hold
``fits``               why a share does not fit on a GPU (None: it fits)
``leftover``           what is left of the GPU after a share (best fit: least first)
``free_percent``       GPU index -> percent that shares may still take
=====================  =============================================================

Example: a 64 GiB GPU holding one 60 % share: ``fits`` of a further 50 % share is
``"40 percent compute left, the pod needs 50 percent"``; of 40 % it is None.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Mapping, Sequence

from .names import DEFAULT_SLOTS, FULL_CORE
from .request import ShareRequest


@dataclass(frozen=True)
class GpuCapacity:
    """One physical GPU as sharing sees it."""

    index: int  # ``gpu`` in the device-list annotation
    memory_mib: int | None  # None: not known (memory requests cannot be placed)
    healthy: bool = True
    free_whole: bool = True  # not held by a whole-GPU (exclusive-resource) container
    slots: int = DEFAULT_SLOTS


@dataclass
class GpuUsage:
    """What the pods placed on one GPU hold."""

    core: int = 0
    memory_mib: int = 0
    shares: int = 0
    exclusive: bool = False

    def add(self, share: ShareRequest, sign: int = 1) -> None:
        self.core += sign * share.core
        self.memory_mib += sign * share.memory_mib
        self.shares += sign
        if share.exclusive:
            self.exclusive = sign > 0

    @property
    def empty(self) -> bool:
        return self.shares <= 0


def fits(cap: GpuCapacity, use: GpuUsage | None, share: ShareRequest) -> str | None:
    """Why ``share`` does not fit on the GPU, or None when it does.

    The reason reaches kube-scheduler (extender FailedNodes, bind errors), which passes
    it to its event recorder as a *format string*: it never contains ``%`` (a ``50%``
    became ``50%!,(MISSING)`` in the pod's FailedScheduling event)."""
    use = use or GpuUsage()
    if not cap.healthy:
        return "unhealthy"
    if not cap.free_whole:
        return "held whole by a container"
    if use.exclusive:
        return "held exclusively by a pod"
    if share.exclusive and not use.empty:
        return f"shared by {use.shares} pod(s); the pod needs it exclusively"
    if use.shares >= cap.slots:
        return f"all {cap.slots} share slots taken"
    if use.core + share.core > FULL_CORE:
        return (
            f"{FULL_CORE - use.core} percent compute left, the pod needs {share.core} percent"
        )
    if share.memory_mib:
        if cap.memory_mib is None:
            return "GPU memory unknown (no gpu.memory label); memory requests cannot be placed"
        left = cap.memory_mib - use.memory_mib
        if share.memory_mib > left:
            return f"{max(left, 0)} MiB memory left, the pod needs {share.memory_mib} MiB"
    return None


def leftover(cap: GpuCapacity, use: GpuUsage | None, share: ShareRequest) -> Fraction:
    """What is left of the GPU after ``share``, as a fraction of a GPU (best fit: the
    smaller the better): the compute left, or the memory left when that is tighter."""
    use = use or GpuUsage()
    core_left = Fraction(FULL_CORE - use.core - share.core, FULL_CORE)
    if cap.memory_mib:
        mem_left = Fraction(cap.memory_mib - use.memory_mib - share.memory_mib, cap.memory_mib)
        return min(core_left, mem_left) if share.memory_mib or use.memory_mib else core_left
    return core_left



def free_percent(caps: Sequence[GpuCapacity], usage: Mapping[int, GpuUsage]) -> dict[int, int]:
    """GPU index -> percent of it that shares may still take (usable GPUs only)."""
    out: dict[int, int] = {}
    for cap in caps:
        use = usage.get(cap.index)
        if cap.healthy and cap.free_whole and not (use is not None and use.exclusive):
            out[cap.index] = FULL_CORE - (use.core if use is not None else 0)
    return out

