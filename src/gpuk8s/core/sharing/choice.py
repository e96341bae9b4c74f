"""Choice: which GPUs of a node take a fractional share, and at what cost.

=====================  =============================================================
``choose_shared``      the GPUs for a share (``Chosen``): those that fit, least waste
                       against the mix's LP packing, then least fragmentation rise,
                       then best fit, the caller's ``prefer`` rank, the lowest index;
                       ``shared_candidates`` (no mix read) then ``weigh_shared``
``whole_rise``         the fragmentation rise of taking GPUs whole
=====================  =============================================================

Example: GPUs 0 (empty) and 1 (holding 50 %), no mix, a 30 % share: best fit picks the
already shared GPU, ``choose_shared(caps, {1: used50}, share).gpus == [1]``.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Callable, Mapping, NamedTuple, Sequence

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


class Candidates(NamedTuple):
    """``choose_shared``'s part that no mix reads (``shared_candidates``): the GPU
    indexes that can take the share, best fit first (then the caller's ``prefer``
    rank, then the index), and the percent free per usable GPU (read, never changed,
    by ``weigh_shared``); ``ok`` None and why when too few GPUs can take it."""

    ok: tuple[int, ...] | None
    why: str = ""
    free: Mapping[int, int] = {}


# the fragmentation of free percents per GPU and a room against one mix (by default
# ``node_fragmentation`` with that mix; a caller may keep its answers)
Fragmentation = Callable[[Sequence[int], Room], float]


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
    groups -- then the lowest index. In two steps: ``shared_candidates`` (what no mix
    reads) and ``weigh_shared`` (the mix's part)."""
    return weigh_shared(shared_candidates(caps, usage, share, prefer), share, mix, room)


def shared_candidates(
    caps: Sequence[GpuCapacity],
    usage: Mapping[int, GpuUsage],
    share: ShareRequest,
    prefer: Mapping[int, int] | None = None,
) -> Candidates:
    """The GPUs that can take ``share``, best fit first, or why too few can
    (``choose_shared`` without the mix)."""
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
        return Candidates(
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
    return Candidates(tuple(c.index for c in ok), "", free_percent(caps, usage))


def weigh_shared(
    candidates: Candidates,
    share: ShareRequest,
    mix: ShareMix | None = None,
    room: Room = NO_ROOM,
    fragmentation: Fragmentation | None = None,
) -> Chosen:
    """``choose_shared``'s answer from its ``candidates`` and the mix (``fragmentation``:
    ``node_fragmentation`` against ``mix``, or a caller's kept answers of it)."""
    ok = candidates.ok
    if ok is None:
        return Chosen(None, candidates.why)
    if not mix:
        return Chosen(sorted(ok[: share.gpus]))
    frag = fragmentation if fragmentation is not None else _against(mix)
    free = candidates.free
    after_room = room.after()
    before = frag(list(free.values()), room)
    # free percent -> (waste, fragmentation after): the same for equal GPUs
    seen: dict[int, tuple[float, float]] = {}
    scored: list[tuple[float, float, int, int]] = []
    for order, index in enumerate(ok):
        left = free.get(index, 0)
        known = seen.get(left)
        if known is None:
            after = dict(free)
            after[index] = left - share.core
            known = seen[left] = (
                round(mix.prices.waste(left, share.core), 9),
                frag(list(after.values()), after_room),
            )
        scored.append((*known, order, index))
    scored.sort()
    top = scored[: share.gpus]
    chosen = [item[3] for item in top]
    waste = sum(item[0] for item in top)
    if share.gpus > 1:  # several GPUs: the state after all of them
        after = dict(free)
        for index in chosen:
            after[index] -= share.core
        rise = frag(list(after.values()), after_room) - before
    else:
        rise = top[0][1] - before
    return Chosen(sorted(chosen), "", rise, waste)


def _against(mix: ShareMix) -> Fragmentation:
    """``node_fragmentation`` against ``mix``."""
    return lambda free, room: node_fragmentation(free, room, mix)


def whole_rise(
    caps: Sequence[GpuCapacity],
    usage: Mapping[int, GpuUsage],
    chosen: Sequence[int],
    mix: ShareMix,
    room: Room = NO_ROOM,
    fragmentation: Fragmentation | None = None,
) -> float:
    """How much taking the GPUs ``chosen`` whole raises the node's fragmentation
    (``fragmentation``: as in ``weigh_shared``)."""
    frag = fragmentation if fragmentation is not None else _against(mix)
    free = free_percent(caps, usage)
    before = frag(list(free.values()), room)
    for index in chosen:
        free[index] = 0
    return frag(list(free.values()), room.after()) - before
