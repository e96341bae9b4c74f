"""Choice: which GPUs of a node take a fractional share, and at what cost.

=====================  =============================================================
``choose_shared``      the GPUs for a share (``Chosen``): those that fit, least waste
                       against the mix's LP packing, then least fragmentation rise,
                       then best fit, the caller's ``prefer`` rank, the lowest index
``whole_rise``         the fragmentation rise of taking GPUs whole
=====================  =============================================================

Example: GPUs 0 (empty) and 1 (holding 50 %), no mix, a 30 % share: best fit picks the
already shared GPU, ``choose_shared(caps, {1: used50}, share).gpus == [1]``.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Mapping, NamedTuple, Sequence

from .capacity import GpuCapacity, GpuUsage, fits, free_percent, leftover
from .packing import NO_ROOM, Room, ShareMix, node_fragmentation
from .request import ShareRequest


class Chosen(NamedTuple):
    """``choose_shared``'s answer: the GPU indexes (None: the share does not fit), why
    not, the rise of the node's fragmentation, and the share of a GPU the placement
    loses against the mix's LP packing (``ShareMix.prices``); both 0.0 without a mix."""

    gpus: list[int] | None
    why: str = ""
    rise: float = 0.0
    waste: float = 0.0


def choose_shared(
    caps: Sequence[GpuCapacity],
    usage: Mapping[int, GpuUsage],
    share: ShareRequest,
    prefer: Mapping[int, int] | None = None,
    mix: ShareMix | None = None,
    room: Room = NO_ROOM,
) -> Chosen:
    """The GPUs for a fractional share, or why it does not fit.

    With the request ``mix``: first the GPUs where the share loses least against the
    mix's LP packing (``Prices.waste``: 0 where it completes or opens a GPU as a tight
    packing of the mix would), then those after which the node's fragmentation is the
    least (``node_fragmentation``; ``room``: the node's free CPU and memory and the
    pod's requests, so that classes the node can no longer feed count); ties, and
    without a mix: best fit (already-shared GPUs with the least left over first). Then
    the lowest ``prefer`` value -- the caller's topology rank, e.g. how many unshared
    GPUs the GPU's link group still has, so that opening a GPU breaks the fewest whole
    groups -- then the lowest index."""
    ok: list[GpuCapacity] = []
    reasons: dict[str, int] = {}
    for cap in caps:
        why = fits(cap, usage.get(cap.index), share)
        if why is None:
            ok.append(cap)
        else:
            reasons[why] = reasons.get(why, 0) + 1
    if len(ok) < share.gpus:
        detail = "; ".join(f"{n} GPU(s): {why}" for why, n in sorted(reasons.items()))
        return Chosen(
            None,
            f"{len(ok)} of {len(caps)} GPU(s) can take the share, the pod needs "
            f"{share.gpus}" + (f" ({detail})" if detail else ""),
        )

    def best_fit(cap: GpuCapacity) -> tuple[int, Fraction, int, int]:
        use = usage.get(cap.index)
        shared = 0 if use is not None and not use.empty else 1
        rank = prefer.get(cap.index, 0) if prefer else 0
        return shared, leftover(cap, use, share), rank, cap.index

    ok.sort(key=best_fit)
    if not mix:
        return Chosen(sorted(c.index for c in ok[: share.gpus]))
    free = free_percent(caps, usage)
    after_room = room.after()
    before = node_fragmentation(list(free.values()), room, mix)
    # free percent -> (waste, fragmentation after): the same for equal GPUs
    seen: dict[int, tuple[float, float]] = {}
    scored: list[tuple[float, float, int, int]] = []
    for order, cap in enumerate(ok):
        left = free.get(cap.index, 0)
        known = seen.get(left)
        if known is None:
            after = dict(free)
            after[cap.index] = left - share.core
            known = seen[left] = (
                round(mix.prices.waste(left, share.core), 9),
                node_fragmentation(list(after.values()), after_room, mix),
            )
        scored.append((*known, order, cap.index))
    scored.sort()
    top = scored[: share.gpus]
    chosen = [item[3] for item in top]
    waste = sum(item[0] for item in top)
    if share.gpus > 1:  # several GPUs: the state after all of them
        after = dict(free)
        for index in chosen:
            after[index] -= share.core
        rise = node_fragmentation(list(after.values()), after_room, mix) - before
    else:
        rise = top[0][1] - before
    return Chosen(sorted(chosen), "", rise, waste)


def whole_rise(
    caps: Sequence[GpuCapacity],
    usage: Mapping[int, GpuUsage],
    chosen: Sequence[int],
    mix: ShareMix,
    room: Room = NO_ROOM,
) -> float:
    """How much taking the GPUs ``chosen`` whole raises the node's fragmentation."""
    free = free_percent(caps, usage)
    before = node_fragmentation(list(free.values()), room, mix)
    for index in chosen:
        free[index] = 0
    return node_fragmentation(list(free.values()), room.after(), mix) - before
