"""GPU sharing: resource families, per-GPU accounting, the pod annotation protocol.

One module for everything the scheduler extender (``gpu-aware``), the device plugin
(``gpu-device``), the node agent and the labeller agree on; stdlib only, Python 3.8+.

Modes (node label ``gpuk8s.io/sharing-mode``; one mode per node, hence per GPU):

=============  ==================================================================
``exclusive``  the default (label absent): whole GPUs only (``metax-tech.com/gpu``,
               ``nvidia.com/gpu``)
``sgpu``       MetaX sGPU: ``metax-tech.com/sgpu`` / ``vcore`` / ``vmemory``
``vcuda``      NVIDIA vGPU quotas: ``tencent.com/vcuda-core`` / ``vcuda-memory``
``mps``        NVIDIA MPS: ``nvidia.com/mps-core`` / ``nvidia.com/mps-memory``
=============  ==================================================================

Resources (container ``resources.limits``; requests default to limits):

``metax-tech.com/sgpu``
    number of shared GPUs (1 to ``MAX_SHARED_GPUS``); required with ``vcore`` or
    ``vmemory``: it is the resource the device plugin serves, and the kubelet calls
    ``Allocate`` only for it. The share below applies to each of them.
``metax-tech.com/vcore``
    percent of one GPU's compute, 0 to 100 (default 0: best effort, nothing reserved);
    100 = the GPU exclusively (nobody else may share it).
``metax-tech.com/vmemory``
    GPU memory per GPU (grammar below: ``8`` = 8 GiB, ``2048Mi`` = 2 GiB); default 0
    (nothing reserved).
``tencent.com/vcuda-core``
    1 to 99: that percent of one GPU; a multiple of 100: that many whole GPUs (placed
    by the topology allocator as in SPEC §3); anything else above 100 is refused.
``tencent.com/vcuda-memory``
    GPU memory per GPU in units of 256 MiB (GPU-Manager's unit: ``16`` = 4 GiB; grammar
    below); ignored for whole GPUs.
``nvidia.com/mps-core``
    percent of one GPU's compute per process, 1 to 100; required (also with
    ``mps-memory``): it is the resource the device plugin serves, and the kubelet calls
    ``Allocate`` only for a positive count, so 0 would give the container no GPU.
``nvidia.com/mps-memory``
    pinned device memory limit, as ``vmemory`` (``8`` = 8 GiB).

GPU memory quantities (``memory_mib``; every memory field above). The value is a
Kubernetes quantity, read exactly as the API server reads it, so ``1000``, ``1e3`` and
``1k`` are the same number, 1000, and ``0.5`` and ``500m`` are both one half. Its unit:

* with a binary suffix (``Ki``, ``Mi``, ``Gi``, ``Ti``, ``Pi``, ``Ei``) the quantity is
  bytes: ``2048Mi`` = ``2Gi`` = 2 GiB;
* otherwise -- a plain number, an exponent (``e3``) or a decimal suffix (``k``, ``M``,
  ``G``, ``m``...) -- the number counts the field's unit: GiB for ``vmemory`` and
  ``mps-memory`` (``REFERENCE``: MetaX's ``MemoryFactor=1024``, HAMi's reading), 256 MiB
  for ``vcuda-memory``. So ``1k`` = ``1e3`` = ``1000`` = 1000 GiB, ``0.5`` = 512 MiB,
  and ``8G`` is 8 x 10^9 GiB (refused: more than ``MAX_MEMORY_MIB``), not 8 GB.

The result is MiB, rounded up. The API server accepts only whole numbers for extended
resources, so ``0.5`` or ``500m`` reach gpu-aware only from other clients; the rule is
the same for them.

One container per pod may ask for a sharing family -- an app container, an init
container or a sidecar (the device plugin maps one Allocate call to the pod; the
pod's effective request, ``core.effective``, is then that container's); a pod may
not mix families, nor mix them with whole GPUs (``WHOLE_GPU_RESOURCES``).

Pod annotations (the protocol, HAMi-like):

``gpuk8s.io/sharing.assigned``
    written by the extender's ``bind`` verb *before* the binding; JSON
    ``{"node": str, "mode": str, "gpus": [int, ...], "core": int, "memoryMiB": int,
    "whole": bool, "container": str}``: GPU indexes (``gpu`` of the device-list
    annotation), compute percent and memory MiB taken on *each* of them.
``gpuk8s.io/sharing.bind-time``
    nanoseconds since the epoch (decimal string) when the extender bound the pod.
``gpuk8s.io/sharing.phase``
    ``allocating`` (set with the assignment), then ``allocated`` once the device
    plugin's ``Allocate`` has mapped the kubelet's device ids to it. The kubelet's
    ``Allocate`` names only a number of ids (``allocate_ids``), not the pod; the plugin
    serves the live ``allocating`` pod on its node whose mode and number of ids match,
    oldest bind-time first. So that this match is never ambiguous, the extender binds
    a pod only while no other pod on that node waits for ``Allocate`` with the same
    mode and number of ids (HAMi locks the whole node for the same reason).

Accounting: a pod holds its share from the moment the assignment is written until it
finishes (``Succeeded``/``Failed``) or is deleted; a restarted extender rebuilds the
per-GPU usage from these annotations (``usage_from_assignments``).
"""

from __future__ import annotations

import copy
import json
import math
import re
from bisect import bisect_right
from dataclasses import dataclass
from fractions import Fraction
from typing import Mapping, NamedTuple, Sequence, Tuple

from .binpack import NO_PRICES, Prices, bin_prices
from .effective import container_asks, containers_of
from .errors import ConfigError
from .quantity import QuantityError, parse_quantity

# -- names --------------------------------------------------------------------------
SHARING_MODE_LABEL = "gpuk8s.io/sharing-mode"
MODE_EXCLUSIVE = "exclusive"
MODE_SGPU = "sgpu"
MODE_VCUDA = "vcuda"
MODE_MPS = "mps"
SHARING_MODES = (MODE_EXCLUSIVE, MODE_SGPU, MODE_VCUDA, MODE_MPS)
DEFAULT_SHARING_MODE = MODE_EXCLUSIVE

SGPU_RESOURCE = "metax-tech.com/sgpu"
VCORE_RESOURCE = "metax-tech.com/vcore"
VMEMORY_RESOURCE = "metax-tech.com/vmemory"
VCUDA_CORE_RESOURCE = "tencent.com/vcuda-core"
VCUDA_MEMORY_RESOURCE = "tencent.com/vcuda-memory"
MPS_CORE_RESOURCE = "nvidia.com/mps-core"
MPS_MEMORY_RESOURCE = "nvidia.com/mps-memory"

# whole-GPU resources: a pod asks for these or for a sharing family, never both
WHOLE_GPU_RESOURCES = ("metax-tech.com/gpu", "nvidia.com/gpu")

ASSIGNED_ANNOTATION = "gpuk8s.io/sharing.assigned"
BIND_TIME_ANNOTATION = "gpuk8s.io/sharing.bind-time"
PHASE_ANNOTATION = "gpuk8s.io/sharing.phase"
# set by gpu-aware on a pod it turned away once a share is freed: kube-scheduler retries it
REQUEUE_ANNOTATION = "gpuk8s.io/sharing.requeue"
PHASE_ALLOCATING = "allocating"
PHASE_ALLOCATED = "allocated"

FULL_CORE = 100
VCUDA_MEMORY_UNIT_MIB = 256
GIB_MIB = 1024
# GPU memory per GPU above this (1 PiB) is refused as a mistake (``memory_mib``)
MAX_MEMORY_MIB = 1 << 30
MAX_SHARED_GPUS = 64
# shares one GPU may hold at once (device ids advertised per GPU for the count resources)
DEFAULT_SLOTS = 16
MAX_ASSIGNMENT_CHARS = 4096

# -- MPS paths (contract with the node agent's MPS control daemon) --------------------
MPS_HOST_ROOT = "/run/gpuk8s/mps"
MPS_CONTAINER_PIPE_DIR = "/run/gpuk8s/mps/pipe"
_UUID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}\Z")


def _checked_uuid(uuid: str) -> str:
    if not isinstance(uuid, str) or not _UUID.match(uuid) or ".." in uuid:
        raise SharingError(
            f"GPU UUID: {uuid!r} must be 1-128 characters of letters, digits, '.', '_', ':', '-'"
        )
    return uuid


def mps_pipe_dir(uuid: str, root: str = MPS_HOST_ROOT) -> str:
    """Host directory of the MPS control daemon's pipes for the GPU ``uuid``."""
    return f"{root.rstrip('/')}/{_checked_uuid(uuid)}/pipe"


def mps_log_dir(uuid: str, root: str = MPS_HOST_ROOT) -> str:
    """Host directory of the MPS control daemon's logs for the GPU ``uuid``."""
    return f"{root.rstrip('/')}/{_checked_uuid(uuid)}/log"


# -- families --------------------------------------------------------------------------
@dataclass(frozen=True)
class Family:
    """One sharing mode's resources."""

    mode: str
    core: str  # compute percent resource
    memory: str  # memory resource
    count: str | None = None  # shared-GPU count resource (sGPU only)


FAMILIES: tuple[Family, ...] = (
    Family(MODE_SGPU, VCORE_RESOURCE, VMEMORY_RESOURCE, SGPU_RESOURCE),
    Family(MODE_VCUDA, VCUDA_CORE_RESOURCE, VCUDA_MEMORY_RESOURCE),
    Family(MODE_MPS, MPS_CORE_RESOURCE, MPS_MEMORY_RESOURCE),
)
FAMILY_BY_MODE: dict[str, Family] = {f.mode: f for f in FAMILIES}
SHARING_RESOURCES: tuple[str, ...] = tuple(
    name for f in FAMILIES for name in ((f.count,) if f.count else ()) + (f.core, f.memory)
)
_FAMILY_OF = {name: f for f in FAMILIES for name in (f.count, f.core, f.memory) if name}
# every resource that gives a container GPUs or a share of one
GPU_RESOURCES: tuple[str, ...] = WHOLE_GPU_RESOURCES + SHARING_RESOURCES
# the unit of a memory quantity without a binary suffix, MiB (``memory_mib``)
MEMORY_UNIT_MIB = {
    VMEMORY_RESOURCE: GIB_MIB,
    MPS_MEMORY_RESOURCE: GIB_MIB,
    VCUDA_MEMORY_RESOURCE: VCUDA_MEMORY_UNIT_MIB,
}
# the resources the device plugin advertises as device ids per GPU (kubelet Allocate)
COUNTED_RESOURCE = {
    MODE_SGPU: SGPU_RESOURCE,
    MODE_VCUDA: VCUDA_CORE_RESOURCE,
    MODE_MPS: MPS_CORE_RESOURCE,
}

# what the counted resource of each mode says, for the error when it is missing
_COUNTED_MEANING = {
    MODE_SGPU: f"the number of shared GPUs, 1 to {MAX_SHARED_GPUS}",
    MODE_VCUDA: "1-99 percent of one GPU, or a multiple of 100 for whole GPUs",
    MODE_MPS: "percent of one GPU's compute per process, 1 to 100",
}


# why a zero count of a counted resource is refused (the accelerator manual allows an MPS
# compute limit of 0 %): the kubelet never calls the device plugin for a count of 0
ZERO_COUNT_WHY = (
    "the kubelet calls the device plugin's Allocate only for a positive count of a "
    "resource, so with 0 the container would start without any GPU"
)


class SharingError(ConfigError):
    """A sharing request or annotation that is not valid (names the field)."""


@dataclass(frozen=True)
class ShareRequest:
    """What a pod asks of each GPU it gets."""

    mode: str
    gpus: int  # how many GPUs
    core: int  # compute percent on each, 0..100
    memory_mib: int  # memory on each (0: nothing reserved)
    whole: bool = False  # whole GPUs (vcuda-core multiples of 100): topology allocator
    container: str = ""

    @property
    def exclusive(self) -> bool:
        return self.whole or self.core >= FULL_CORE


def allocate_ids(share: ShareRequest) -> int:
    """How many device ids of the mode's counted resource the kubelet hands the device
    plugin's ``Allocate`` for ``share``: the shared GPUs for sGPU (one id each), else
    the percent (``vcuda-core: 50`` is 50 ids; whole GPUs 100 each)."""
    if share.mode == MODE_SGPU:
        return share.gpus
    if share.whole:
        return share.gpus * FULL_CORE
    return share.core


def _text(value: object, what: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise SharingError(f"{what}: must be a quantity string or integer, got {value!r}")
    return str(value).strip()


def _amount(value: object, what: str) -> Fraction:
    text = _text(value, what)
    try:
        amount = parse_quantity(text)
    except QuantityError as err:
        raise SharingError(f"{what}: {err}") from None
    if amount < 0:
        raise SharingError(f"{what}: must not be negative, got {text!r}")
    return amount


def _percent(value: object, what: str, low: int = 0) -> int:
    amount = _amount(value, what)
    if amount.denominator != 1 or not low <= amount <= FULL_CORE:
        raise SharingError(f"{what}: must be a whole percent {low} to 100, got {value!r}")
    return int(amount)


_BINARY_SUFFIX = re.compile(r"[KMGTPE]i\Z")


def memory_mib(value: object, what: str, unit_mib: int = GIB_MIB) -> int:
    """GPU memory in MiB (rounded up) of a quantity (module doc): bytes with a binary
    suffix, else that many ``unit_mib`` MiB. ``SharingError`` names ``what``."""
    text = _text(value, what)
    amount = _amount(text, what)
    mib = amount / 2**20 if _BINARY_SUFFIX.search(text) else amount * unit_mib
    if mib > MAX_MEMORY_MIB:
        unit = "GiB" if unit_mib == GIB_MIB else f"units of {unit_mib} MiB"
        raise SharingError(
            f"{what}: {text!r} is more than 1 PiB per GPU; a number without a binary suffix "
            f"counts {unit} (8 = 8 {'GiB' if unit_mib == GIB_MIB else 'units'}, 1k = 1000), "
            "bytes need a binary suffix (8Gi, 512Mi)"
        )
    return -(-mib.numerator // mib.denominator)


def parse_share(
    limits: Mapping[str, object], container: str = "", where: str = "resources.limits"
) -> ShareRequest | None:
    """The share one container asks for, from its limits (or requests); None when it
    asks for no sharing resource. ``SharingError`` names the field and what is allowed."""
    asked = {name: limits[name] for name in limits if name in _FAMILY_OF}
    if not asked:
        return None
    families = {_FAMILY_OF[name].mode for name in asked}
    if len(families) > 1:
        raise SharingError(
            f"{where}: mixes sharing families {', '.join(sorted(families))}; "
            "a container asks for one of sgpu, vcuda, mps"
        )
    family = FAMILY_BY_MODE[families.pop()]

    def field_of(name: str) -> str:
        return f"{where}[{name!r}]"

    memory = 0
    if family.memory in asked:
        memory = memory_mib(
            asked[family.memory], field_of(family.memory), MEMORY_UNIT_MIB[family.memory]
        )
    counted = COUNTED_RESOURCE[family.mode]
    if counted not in asked:
        raise SharingError(
            f"{field_of(counted)}: required with {', '.join(sorted(asked))}: "
            f"{_COUNTED_MEANING[family.mode]} (the kubelet calls the device plugin for this "
            "resource only)"
        )
    if family.mode == MODE_SGPU:
        gpus = _whole(asked[SGPU_RESOURCE], field_of(SGPU_RESOURCE))
        if not 1 <= gpus <= MAX_SHARED_GPUS:
            raise SharingError(
                f"{field_of(SGPU_RESOURCE)}: must be 1 to {MAX_SHARED_GPUS}, got {gpus}"
                + (f": {ZERO_COUNT_WHY}" if gpus == 0 else "")
            )
        core = (
            _percent(asked[VCORE_RESOURCE], field_of(VCORE_RESOURCE))
            if VCORE_RESOURCE in asked
            else 0
        )
        return ShareRequest(MODE_SGPU, gpus, core, memory, False, container)
    if family.mode == MODE_VCUDA:
        core = _whole(asked[VCUDA_CORE_RESOURCE], field_of(VCUDA_CORE_RESOURCE))
        if 1 <= core < FULL_CORE:
            return ShareRequest(MODE_VCUDA, 1, core, memory, False, container)
        if core >= FULL_CORE and core % FULL_CORE == 0 and core // FULL_CORE <= MAX_SHARED_GPUS:
            return ShareRequest(MODE_VCUDA, core // FULL_CORE, FULL_CORE, 0, True, container)
        raise SharingError(
            f"{field_of(VCUDA_CORE_RESOURCE)}: must be 1-99 (percent of one GPU) or a "
            f"multiple of 100 up to {MAX_SHARED_GPUS * 100} (whole GPUs), got {core}"
            + (f": {ZERO_COUNT_WHY}" if core == 0 else "")
        )
    value, what = asked[MPS_CORE_RESOURCE], field_of(MPS_CORE_RESOURCE)
    if _amount(value, what) == 0:  # the accelerator manual's "0-100 %" (manual-conformance.md)
        raise SharingError(f"{what}: must be a whole percent 1 to 100, got {value!r}: "
                           f"{ZERO_COUNT_WHY}; for no compute limit ask for 100, MPS's default")
    core = _percent(value, what, low=1)
    return ShareRequest(MODE_MPS, 1, core, memory, False, container)


def _whole(value: object, what: str) -> int:
    amount = _amount(value, what)
    if amount.denominator != 1:
        raise SharingError(f"{what}: must be a whole number, got {value!r}")
    return int(amount)


# (container name, limits, requests, its path for messages, e.g. spec.containers[0])
ContainerAsk = Tuple[str, Mapping[str, object], Mapping[str, object], str]


def pod_share(containers: Sequence[ContainerAsk]) -> ShareRequest | None:
    """The share of a pod from all its containers -- app, init and sidecar (module doc:
    one of them may ask): limits win, requests stand in where no limit is set (extended
    resources: they must be equal). A pod asking for shared GPUs and for whole GPUs
    (``WHOLE_GPU_RESOURCES``) too is refused, whichever family and vendor."""
    found: list[tuple[str, ShareRequest]] = []
    whole: list[str] = []
    for name, limits, requests, path in containers:
        merged = dict(requests)
        merged.update(limits)
        share = parse_share(merged, name, f"{path}.resources.limits")
        if share is not None:
            found.append((path, share))
        for resource in WHOLE_GPU_RESOURCES:
            if resource in merged and _positive(merged[resource]):
                whole.append(f"{path}.resources.limits[{resource!r}]")
    if len(found) > 1:
        raise SharingError(
            f"{' and '.join(p for p, _ in found)} ask for shared GPUs; one container per pod "
            "may (app, init or sidecar container)"
        )
    if found and whole:
        mode = found[0][1].mode
        raise SharingError(
            f"{whole[0]}: whole GPUs, and {found[0][0]} asks for shared GPUs ({mode}); a pod "
            f"asks for whole GPUs ({', '.join(WHOLE_GPU_RESOURCES)}) or for one sharing "
            "family, not both"
        )
    return found[0][1] if found else None


def _positive(value: object) -> bool:
    try:
        return _amount(value, "") > 0
    except SharingError:
        return False  # unreadable: its own check (the GPU count) names it


def pod_share_json(pod: Mapping[str, object]) -> ShareRequest | None:
    """``pod_share`` of a Pod in JSON form (gpu-device, the exporter; gpu-aware reads
    its typed view of the same fields): every container, init and sidecar included."""
    return pod_share(
        [
            (str(c.get("name", "")), _limits(c), container_asks(c), path)
            for _, c, path in containers_of(pod)
        ]
    )


def _limits(container: Mapping[str, object]) -> Mapping[str, object]:
    resources = container.get("resources")
    limits = resources.get("limits") if isinstance(resources, Mapping) else None
    return limits if isinstance(limits, Mapping) else {}


# -- capacity and usage -------------------------------------------------------------------
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


# the request mix when nothing has been seen yet: percent of a GPU -> weight
DEFAULT_SHARE_MIX: tuple[tuple[int, float], ...] = ((25, 1.0), (50, 1.0), (100, 1.0))
MIX_CLASSES = 64  # request classes kept in a ShareMix (the heaviest)
# share sizes (percent) the mix's LP packing prices, the heaviest: the LP's time grows
# steeply with them (24 sizes: under 0.1 s at worst, 32: seconds -- too long for a call
# kube-scheduler waits on); a size left out is worth nothing in it
PRICED_SIZES = 24
BALANCE_MIN_FREE = 5  # percent: a node keeping less GPU capacity has no CPU balance
# in ``cpu_balance``, a core short of what a node's free GPUs need counts this many
# cores in excess: a core short strands GPU capacity, a core in excess only CPU
BALANCE_SHORT = 4.0
# a request class: (GPUs, percent of each GPU -- 100 for whole GPUs --, CPU millicores,
# memory MiB)
ShareClass = Tuple[int, int, int, int]


class Room(NamedTuple):
    """A node's free CPU millicores and memory MiB (None: not known, limits nothing)
    and what the pod to place asks of both."""

    cpu: int | None = None
    memory: int | None = None
    pod_cpu: int = 0
    pod_memory: int = 0

    def after(self) -> Room:
        """The node's room once the pod runs there."""
        return Room(
            None if self.cpu is None else self.cpu - self.pod_cpu,
            None if self.memory is None else self.memory - self.pod_memory,
        )


NO_ROOM = Room()  # nothing known about CPU or memory: they limit nothing


class ShareMix:
    """The request mix that fragmentation is measured against: request classes
    ``(GPUs, percent, CPU millicores)`` with weights (the ``MIX_CLASSES`` heaviest).

    ``prices``: the fewest-GPUs packing of the mix's fractional shares as the
    configuration LP finds it (``core.binpack.bin_prices``; a class of ``k`` GPUs counts
    ``k`` shares of its percent; the ``PRICED_SIZES`` heaviest sizes): what one GPU's
    worth each share size is in a packing of the mix as tight as the LP allows.
    ``Prices.waste`` says what a placement loses for good against that packing.

    Precomputed per CPU threshold (the classes' distinct CPU requests), so that
    ``node_fragmentation`` costs one bisection plus one step per GPU: the weight of the
    classes a node's free CPU cannot feed, per free percent of a GPU the weight of the
    fractional classes that ask for more, and per whole-GPU count its weight. Memory,
    rarely short, is checked per class from the largest request down."""

    def __init__(
        self,
        weights: Mapping[ShareClass, float],
        limit: int = MIX_CLASSES,
        cpu_per_gpu: float | None = None,
    ) -> None:
        # CPU millicores per GPU that the arriving GPU pods ask for (``cpu_balance``;
        # None: not known, no balance term)
        self.cpu_per_gpu = cpu_per_gpu
        ranked = sorted(
            ((w, c) for c, w in weights.items() if w > 0 and c[0] > 0 and 0 < c[1] <= FULL_CORE),
            key=lambda item: (-item[0], item[1]),
        )[:limit]
        total = sum(w for w, _ in ranked)
        self.classes: tuple[tuple[ShareClass, float], ...] = tuple(
            (c, w / total) for w, c in ranked
        )
        self.sizes: tuple[int, ...] = tuple(
            sorted({c[0] for c, _ in self.classes if c[1] >= FULL_CORE})
        )
        # thresholds: CPU values at which the set of classes a node can feed changes
        self.cpus: tuple[int, ...] = tuple(sorted({max(c[2], 0) for c, _ in self.classes}))
        self._tables([w for _, w in self.classes], 1.0)
        # whole-GPU classes (index in ``classes``) and, per one, the whole-GPU classes of
        # its GPU count whose pods fit only where it fits too (as much CPU and memory or
        # more: their homes are among its homes), itself included (``whole_scarcity``)
        self.wholes: tuple[int, ...] = tuple(
            at for at, (c, _) in enumerate(self.classes) if c[1] >= FULL_CORE
        )
        self.nests: tuple[tuple[int, ...], ...] = tuple(
            tuple(
                j
                for j in self.wholes
                if self.classes[j][0][0] == self.classes[i][0][0]
                and self.classes[j][0][2] >= self.classes[i][0][2]
                and self.classes[j][0][3] >= self.classes[i][0][3]
            )
            for i in self.wholes
        )
        self.nest_weights: tuple[float, ...] = tuple(
            sum(self.classes[j][1] for j in nest) for nest in self.nests
        )
        # per whole-GPU class: the nests it is in (positions in ``wholes``)
        self.within: tuple[tuple[int, ...], ...] = tuple(
            tuple(n for n, nest in enumerate(self.nests) if i in nest) for i in self.wholes
        )
        # GPUs per pod of the mix (a share counts its percent)
        self.per_pod = sum(w * k * pct / FULL_CORE for (k, pct, _, _), w in self.classes)

        demand: dict[int, float] = {}
        for (k, pct, _, _), w in self.classes:
            if pct < FULL_CORE:
                demand[pct] = demand.get(pct, 0.0) + w * k
        priced = sorted(demand.items(), key=lambda item: (-item[1], item[0]))[:PRICED_SIZES]
        self.prices: Prices = bin_prices(dict(priced), FULL_CORE) if priced else NO_PRICES

    def __bool__(self) -> bool:
        return bool(self.classes)

    def _tables(self, weights: Sequence[float], total: float) -> None:
        """The per-threshold tables for the classes weighted by ``weights`` (in the
        order of ``classes``; ``total``: their sum)."""
        self.starved: list[float] = []  # per threshold: weight of classes needing more CPU
        self.partial: list[list[float]] = []  # per threshold, per free %: weight stranded
        self.whole: list[tuple[float, ...]] = []  # per threshold, per size in ``sizes``
        by_cpu = sorted(
            ((c, w) for (c, _), w in zip(self.classes, weights)), key=lambda item: item[0][2]
        )
        per = [0.0] * (FULL_CORE + 1)
        whole = dict.fromkeys(self.sizes, 0.0)
        fed = 0.0
        at = 0
        for cpu in self.cpus:
            while at < len(by_cpu) and by_cpu[at][0][2] <= cpu:
                (k, pct, _, _), w = by_cpu[at]
                if pct < FULL_CORE:
                    for free in range(pct):
                        per[free] += w
                else:
                    whole[k] += w
                fed += w
                at += 1
            self.starved.append(max(0.0, total - fed))
            self.partial.append(list(per))
            self.whole.append(tuple(whole[k] for k in self.sizes))
        # (memory, CPU, GPUs, percent, weight), the largest memory first
        self.by_memory: tuple[tuple[int, int, int, int, float], ...] = tuple(
            sorted(((c[3], c[2], c[0], c[1], w) for (c, _), w in zip(self.classes, weights)),
                   reverse=True)
        )

    def scaled(self, factors: Mapping[ShareClass, float]) -> ShareMix:
        """This mix with the weight of each class in ``factors`` (a ``whole_scarcity``
        result) multiplied by its factor where fragmentation is measured
        (``node_fragmentation``); the classes, their shares and the prices stay.
        ``self`` when no factor differs from 1."""
        if all(f == 1.0 for f in factors.values()):
            return self
        out = copy.copy(self)
        weights = [w * factors.get(c, 1.0) for c, w in self.classes]
        out._tables(weights, sum(weights))
        return out


def whole_homes(free: Sequence[int], room: Room, mix: ShareMix) -> tuple[int, ...]:
    """Per whole-GPU class of the mix (``mix.wholes``): how many of its pods the node
    could take at once -- its wholly free GPUs over the class's count, as far as its
    free CPU and memory (``room``; None: not known, limits nothing) feed them."""
    full = sum(1 for f in free if f >= FULL_CORE)
    if not full:
        return (0,) * len(mix.wholes)
    cpu, memory = room.cpu, room.memory
    out = []
    for at in mix.wholes:
        k, _, need_cpu, need_memory = mix.classes[at][0]
        homes = full // k
        if homes and cpu is not None and need_cpu > 0:
            homes = min(homes, max(cpu, 0) // need_cpu)
        if homes and memory is not None and need_memory > 0:
            homes = min(homes, max(memory, 0) // need_memory)
        out.append(homes)
    return tuple(out)


def poisson_tail(mean: float, k: int) -> float:
    """P(X >= ``k``) for X Poisson with ``mean``: summed from ``k`` up where ``k`` is
    above the mean, else one less the sum from ``k - 1`` down, each while its terms
    still count (the pmf falls away from the mean both ways)."""
    if k <= 0:
        return 1.0
    if mean <= 0:
        return 0.0
    if k > mean:  # the upper tail, summed up from k while its terms matter
        n = k
        term = math.exp(-mean + n * math.log(mean) - math.lgamma(n + 1))
        total = 0.0
        while term > 1e-15 * total or total == 0.0:
            total += term
            n += 1
            term *= mean / n
            if term == 0.0:
                break
        return min(1.0, total)
    n = k - 1  # one less the lower tail, summed down from k - 1
    term = math.exp(-mean + n * math.log(mean) - math.lgamma(n + 1))
    total = 0.0
    while n >= 0 and (term > 1e-15 * total or total == 0.0):
        total += term
        term *= n / mean
        n -= 1
        if term == 0.0:
            break
    return max(0.0, 1.0 - total)


def whole_scarcity(homes: Sequence[int], free: int, mix: ShareMix) -> dict[ShareClass, float]:
    """Per whole-GPU class of the mix: how much more than its share of the arrivals a
    home of the class is worth, as a factor over 1 (``ShareMix.scaled``); classes
    whose homes are not at risk are left out. ``homes``: per class of ``mix.wholes``,
    the sum over the nodes of ``whole_homes``; ``free``: the nodes' free GPU capacity
    in percent.

    The pods still to come are those that fill the free capacity at the mix's GPUs per
    pod; how many of them belong to a class is Poisson with the class's share of them
    as its mean (the arrivals are drawn one by one from the mix). FGD's measure weighs
    a class by its share: the chance that the *next* pod is one of it. A home is lost
    for good when any later pod needs it, so breaking one, by its GPUs or by the CPU
    or memory that feeds it, costs a pod of the class with the chance that its pods to
    come need every home left (``poisson_tail``): about nothing while the homes are
    many, one half when they are just enough, nearly one when they are too few. That
    chance over the class's share is the factor, where it is over 1. A class counts
    together with the classes of its GPU count that need at least its CPU and memory
    (its nest, ``mix.nests``): their homes are among its homes. Each class takes the
    largest factor of the nests it is in (``mix.within``). Rounded to quarter steps of
    a doubling, so that it moves (and placements memoised against it change) only when
    the chance does."""
    if not mix.wholes or mix.per_pod <= 0:
        return {}
    to_come = free / FULL_CORE / mix.per_pod
    # per nest: the chance that its pods to come need every home it has left, over its
    # weight in the mix (no home left: nothing to break)
    shorts = [
        poisson_tail(weight * to_come, count) / weight if count and weight > 0 else 0.0
        for weight, count in zip(mix.nest_weights, homes)
    ]
    out: dict[ShareClass, float] = {}
    for at, within in zip(mix.wholes, mix.within):
        short = max(shorts[n] for n in within)
        if short > 1.0:
            factor = 2.0 ** (round(4 * math.log2(short)) / 4)
            if factor != 1.0:
                out[mix.classes[at][0]] = factor
    return out


def node_fragmentation(free: Sequence[int], room: Room, mix: ShareMix) -> float:
    """FGD's fragmentation of a node (Weng et al., ATC '23), in percent of a GPU: for
    each request class of the mix, the free GPU capacity on the node that the class
    cannot use, weighted by the class's share. ``free``: percent free per GPU that a
    share may use (0..100); ``room``: the node's free CPU and memory (None: not known,
    limits nothing).

    A class the free CPU or memory cannot feed can use nothing here (all free capacity
    is a fragment); a fractional class cannot use a GPU with less free than it asks; a
    class of ``k`` whole GPUs cannot use partly taken GPUs, nor any GPU when fewer than
    ``k`` are wholly free."""
    total = sum(free)
    if total <= 0 or not mix.classes:
        return 0.0
    cpu, memory = room.cpu, room.memory
    if cpu is None:
        at = len(mix.cpus) - 1
    else:
        at = bisect_right(mix.cpus, cpu) - 1
        if at < 0:
            return float(total)  # no class can be fed
    partial = mix.partial[at]
    lost = mix.starved[at] * total
    taken = 0
    full = 0
    for f in free:
        if f >= FULL_CORE:
            full += 1
        elif f > 0:
            lost += f * partial[f]
            taken += f
    for k, w in zip(mix.sizes, mix.whole[at]):
        if w:
            lost += w * (total if full < k else taken)
    if memory is not None:  # classes counted as fed above that the memory cannot feed
        for need, c, k, pct, w in mix.by_memory:
            if need <= memory:
                break
            if cpu is not None and c > cpu:
                continue  # already counted as starved
            if pct < FULL_CORE:
                used = sum(f for f in free if 0 < f < pct)
            else:
                used = total if full < k else taken
            lost += w * (total - used)
    return lost


def cpu_balance(free: int, room: Room, cpu_per_gpu: float | None) -> float:
    """How far a node's free CPU is from what its free GPU capacity will need, in
    cores: ``need = cpu_per_gpu x free GPUs``; cores short of ``need`` count
    ``BALANCE_SHORT`` each, cores over it one each (``free``: percent free over its
    GPUs, ``room``: its free CPU; both after the pod). A node left with GPUs but too
    little CPU for them strands the GPUs (the pods that arrive ask about
    ``cpu_per_gpu`` per GPU, many more); one left with much more CPU than its GPUs
    need holds CPU that GPU-dense nodes lack, which costs less: pods without GPUs can
    still use it. 0 when the CPU or the ratio is not known, or the node keeps (almost)
    no GPU capacity."""
    over = spare_cpu(free, room, cpu_per_gpu)
    if over is None or free <= BALANCE_MIN_FREE:
        return 0.0
    return over if over >= 0 else -BALANCE_SHORT * over


def spare_cpu(free: int, room: Room, cpu_per_gpu: float | None) -> float | None:
    """A node's free CPU beyond what its free GPU capacity will need, in cores (negative:
    short): ``room.cpu - cpu_per_gpu x free GPUs`` (``free``: percent free over its
    GPUs). None when the CPU or the ratio is not known."""
    if room.cpu is None or cpu_per_gpu is None:
        return None
    return (room.cpu - cpu_per_gpu * free / FULL_CORE) / 1000


def gpus_per_core(free: int, room: Room) -> float | None:
    """The free GPU capacity a node keeps per free core of CPU, in GPUs per core: what
    each core left there must still feed (``free``: percent free over its GPUs;
    ``room``: its free CPU). 0 when no GPU capacity is free, whatever the CPU; None
    when the CPU is not known. A pod without GPUs taking CPU where this stays lowest
    strands the least GPU capacity per core it takes, with no CPU-per-GPU threshold:
    the nodes' own free CPU and GPUs decide."""
    if room.cpu is None:
        return None
    if free <= 0:
        return 0.0
    return (free / FULL_CORE) / (max(room.cpu, 1) / 1000)


class Filled(NamedTuple):
    """A node filled with each class of a mix alone (``filled``): the free GPU capacity
    left unused, weighted (``fill_stranded``), and what ``fill_taken`` needs to tell how
    much more a pod's CPU and memory would leave unused."""

    lost: float
    pods: tuple[int, ...]  # per class of ``mix.classes``: the pods that fill the node
    # (CPU millicores those pods ask, class), the most first; memory MiB likewise
    cpu_bound: tuple[tuple[int, int], ...] = ()
    memory_bound: tuple[tuple[int, int], ...] = ()


def _each(klass: ShareClass) -> int:
    """Percent of a GPU one pod of the class takes."""
    return klass[0] * FULL_CORE if klass[1] >= FULL_CORE else klass[1]


def _fed(n: int, room: Room, klass: ShareClass) -> int:
    """At most ``n`` pods of the class: as many as the room's CPU and memory feed."""
    if n and room.cpu is not None and klass[2] > 0:
        n = min(n, max(room.cpu, 0) // klass[2])
    if n and room.memory is not None and klass[3] > 0:
        n = min(n, max(room.memory, 0) // klass[3])
    return n


def filled(free: Sequence[int], room: Room, mix: ShareMix) -> Filled:
    """``fill_stranded`` and the pods per class behind it."""
    total = sum(free)
    if total <= 0 or not mix.classes:
        return Filled(0.0, (0,) * len(mix.classes))
    cpu, memory = room.cpu, room.memory
    full = sum(1 for f in free if f >= FULL_CORE)
    slots: dict[int, int] = {}
    lost = 0.0
    pods: list[int] = []
    cpu_bound: list[tuple[int, int]] = []
    memory_bound: list[tuple[int, int]] = []
    for at, (klass, w) in enumerate(mix.classes):
        k, pct, c, m = klass
        if pct >= FULL_CORE:
            n = full // k
        else:
            got = slots.get(pct)
            if got is None:
                got = slots[pct] = sum(f // pct for f in free)
            n = got
        n = _fed(n, room, klass)
        lost += w * (total - n * _each(klass))
        pods.append(n)
        if n and cpu is not None and c > 0:
            cpu_bound.append((n * c, at))
        if n and memory is not None and m > 0:
            memory_bound.append((n * m, at))
    cpu_bound.sort(reverse=True)
    memory_bound.sort(reverse=True)
    return Filled(lost, tuple(pods), tuple(cpu_bound), tuple(memory_bound))


def fill_stranded(free: Sequence[int], room: Room, mix: ShareMix) -> float:
    """The free GPU capacity of a node that pods of one class could not use if the node
    were filled with that class alone, weighted over the mix's classes, in percent of a
    GPU. A class fills as many pods as the fewest of: its GPU slots (a fractional class:
    per GPU, the free percent over what it asks, rounded down; ``k`` whole GPUs: the
    wholly free GPUs over ``k``), the free CPU over its CPU, the free memory over its
    memory (``room``: None limits nothing). Unlike ``node_fragmentation``, which asks only
    whether one more pod fits, this sees CPU that feeds some but not all of the free GPUs:
    an empty 8-GPU node whose cores fall below what one 8-GPU pod asks loses its whole
    use to that class."""
    return filled(free, room, mix).lost


def fill_taken(before: Filled, after: Room, mix: ShareMix) -> float:
    """``fill_stranded`` with the node's room ``after`` a pod minus ``before.lost`` (the
    same free GPUs, ``before`` made with the room before it): the GPU capacity the pod's
    CPU and memory take out of use. Only the classes whose pods need more CPU or memory
    than is left are looked at (usually none), so this costs far less than a second
    ``fill_stranded``."""
    hit: set[int] = set()
    for left, bound in ((after.cpu, before.cpu_bound), (after.memory, before.memory_bound)):
        if left is None:
            continue
        for need, at in bound:
            if need <= max(left, 0):
                break
            hit.add(at)
    taken = 0.0
    for at in sorted(hit):
        klass, w = mix.classes[at]
        had = before.pods[at]
        taken += w * (had - _fed(had, after, klass)) * _each(klass)
    return taken


def free_percent(caps: Sequence[GpuCapacity], usage: Mapping[int, GpuUsage]) -> dict[int, int]:
    """GPU index -> percent of it that shares may still take (usable GPUs only)."""
    out: dict[int, int] = {}
    for cap in caps:
        use = usage.get(cap.index)
        if cap.healthy and cap.free_whole and not (use is not None and use.exclusive):
            out[cap.index] = FULL_CORE - (use.core if use is not None else 0)
    return out


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


def usage_from_assignments(assignments: Sequence[Assignment]) -> dict[str, dict[int, GpuUsage]]:
    """node -> GPU index -> usage, from the assignments of live pods."""
    out: dict[str, dict[int, GpuUsage]] = {}
    for a in assignments:
        per = out.setdefault(a.node, {})
        for index in a.gpus:
            per.setdefault(index, GpuUsage()).add(a.share)
    return out


# -- the pod annotation -------------------------------------------------------------------
@dataclass(frozen=True)
class Assignment:
    """The extender's choice for a pod: node, GPUs, and the share on each."""

    node: str
    gpus: tuple[int, ...]
    share: ShareRequest

    def to_json(self) -> str:
        return json.dumps(
            {
                "node": self.node,
                "mode": self.share.mode,
                "gpus": list(self.gpus),
                "core": self.share.core,
                "memoryMiB": self.share.memory_mib,
                "whole": self.share.whole,
                "container": self.share.container,
            },
            separators=(",", ":"),
            sort_keys=True,
        )


def parse_assignment(raw: str | None) -> Assignment | None:
    """The ``gpuk8s.io/sharing.assigned`` annotation; None when absent; ``SharingError``
    naming the key when malformed."""
    if raw is None or raw == "":
        return None
    what = f"annotation {ASSIGNED_ANNOTATION}"
    if len(raw) > MAX_ASSIGNMENT_CHARS:
        raise SharingError(f"{what}: longer than {MAX_ASSIGNMENT_CHARS} characters")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as err:
        raise SharingError(f"{what}: not JSON ({err})") from None
    if not isinstance(data, dict):
        raise SharingError(f"{what}: must be a JSON object")

    def get(key: str, kind: type, check: str = "") -> object:
        value = data.get(key)
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            raise SharingError(f"{what}: {key!r} must be {check or kind.__name__}, got {value!r}")
        return value

    node = get("node", str, "a node name")
    mode = get("mode", str)
    if mode not in FAMILY_BY_MODE:
        raise SharingError(f"{what}: 'mode' must be one of sgpu, vcuda, mps, got {mode!r}")
    gpus = get("gpus", list, "a list of GPU indexes")
    assert isinstance(gpus, list)
    if (
        not gpus
        or len(gpus) > MAX_SHARED_GPUS
        or any(isinstance(g, bool) or not isinstance(g, int) or g < 0 for g in gpus)
        or len(set(gpus)) != len(gpus)
    ):
        raise SharingError(f"{what}: 'gpus' must be 1-{MAX_SHARED_GPUS} distinct indexes >= 0")
    core = get("core", int, "a percent 0-100")
    memory = get("memoryMiB", int, "MiB >= 0")
    whole = get("whole", bool, "true or false")
    container = data.get("container", "")
    assert isinstance(core, int) and isinstance(memory, int) and isinstance(whole, bool)
    if not 0 <= core <= FULL_CORE or memory < 0 or not isinstance(container, str):
        raise SharingError(f"{what}: 'core' must be 0-100 and 'memoryMiB' >= 0")
    assert isinstance(node, str) and isinstance(mode, str)
    share = ShareRequest(mode, len(gpus), core, memory, whole, container)
    return Assignment(node, tuple(gpus), share)


def check_mode(value: str | None, what: str = SHARING_MODE_LABEL) -> str:
    """A node's sharing mode from its label value (absent: ``exclusive``)."""
    if value is None or value == "":
        return DEFAULT_SHARING_MODE
    if value not in SHARING_MODES:
        raise SharingError(f"{what}: {value!r} is not one of {', '.join(SHARING_MODES)}")
    return value


_MEMORY_LABEL = re.compile(r"([0-9]+(?:\.[0-9]+)?)(GB|GiB|G|MB|MiB|M)\Z")


def memory_label_mib(value: str | None) -> int | None:
    """MiB per GPU from the ``gpu.memory`` node label (``64GB`` = 64 GiB, as the
    labeller writes it from MiB / 1024); None when absent or unreadable."""
    if not value:
        return None
    match = _MEMORY_LABEL.match(value.strip())
    if match is None:
        return None
    amount = Fraction(match.group(1))
    unit = 1024 if match.group(2).startswith("G") else 1
    return int(amount * unit)


# -- what a container gets -----------------------------------------------------------------
def share_env(assignment: Assignment, uuids: Sequence[str] = ()) -> dict[str, str]:
    """Environment for a container of the assigned pod (per mode; see docs/sharing.md,
    "What is enforced, per mode").

    * sgpu: ``METAX_SGPU_COMPUTE`` (percent) and ``METAX_SGPU_MEMORY_MIB``: assumed to be
      what MetaX's sGPU runtime reads (the vendor does not document it publicly); the
      GPUs themselves come as device nodes.
    * vcuda: ``CUDA_DEVICE_SM_LIMIT`` (percent) and ``CUDA_DEVICE_MEMORY_LIMIT_<i>``
      (``<MiB>m``) -- the variables HAMi-core's interception library reads; nothing
      enforces them unless such a library is preloaded in the container.
    * mps: ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``, ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``
      (``<i>=<MiB>M`` per visible device) and ``CUDA_MPS_PIPE_DIRECTORY`` (the pipe
      directory of the GPU's MPS control daemon, mounted at ``MPS_CONTAINER_PIPE_DIR``).
    """
    share = assignment.share
    env: dict[str, str] = {}
    if share.mode == MODE_SGPU:
        env["METAX_SGPU_COMPUTE"] = str(share.core)
        if share.memory_mib:
            env["METAX_SGPU_MEMORY_MIB"] = str(share.memory_mib)
    elif share.mode == MODE_VCUDA and not share.whole:
        env["CUDA_DEVICE_SM_LIMIT"] = str(share.core)
        if share.memory_mib:
            for i in range(len(assignment.gpus)):
                env[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] = f"{share.memory_mib}m"
    elif share.mode == MODE_MPS:
        if len(uuids) != 1:
            raise SharingError(f"mps: one GPU UUID per pod, got {len(uuids)}")
        _checked_uuid(uuids[0])
        env["CUDA_MPS_PIPE_DIRECTORY"] = MPS_CONTAINER_PIPE_DIR
        if share.core:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(share.core)
        if share.memory_mib:
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={share.memory_mib}M"
    return env


def share_mounts(assignment: Assignment, uuids: Sequence[str]) -> list[tuple[str, str]]:
    """(host path, container path) bind mounts: the MPS pipe directory in mps mode."""
    if assignment.share.mode != MODE_MPS:
        return []
    if len(uuids) != 1:
        raise SharingError(f"mps: one GPU UUID per pod, got {len(uuids)}")
    return [(mps_pipe_dir(uuids[0]), MPS_CONTAINER_PIPE_DIR)]
