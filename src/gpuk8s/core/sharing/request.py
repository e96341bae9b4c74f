"""The request grammar: what a container's or a pod's resources ask of each GPU.

=====================  =============================================================
``parse_share``        one container's limits -> ``ShareRequest`` (None: no sharing)
``pod_share``          all containers of a pod (app, init, sidecar): at most one may
                       ask, and not beside whole GPUs (``WHOLE_GPU_RESOURCES``)
``pod_share_json``     the same over a Pod in JSON form
``memory_mib``         a memory quantity -> MiB, rounded up: a binary suffix is bytes
                       (``2048Mi``), otherwise the number counts the field's unit
                       (``MEMORY_UNIT_MIB``: GiB, 256 MiB for vcuda-memory), read as
                       the API server reads it (``1k`` = ``1e3`` = 1000)
``allocate_ids``       how many device ids the kubelet hands ``Allocate`` for a share
=====================  =============================================================

Example: ``parse_share({"tencent.com/vcuda-core": "50", "tencent.com/vcuda-memory": "16"})``
is ``ShareRequest("vcuda", gpus=1, core=50, memory_mib=4096)``, and ``vcuda-core: 200``
asks for two whole GPUs (``whole=True``). docs/sharing.md has the table of resources.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Mapping, Sequence, Tuple

from ..effective import container_asks, containers_of
from ..quantity import QuantityError, parse_quantity
from .names import (
    COUNTED_RESOURCE,
    FAMILIES,
    FAMILY_BY_MODE,
    FULL_CORE,
    GIB_MIB,
    MAX_MEMORY_MIB,
    MAX_SHARED_GPUS,
    MODE_MPS,
    MODE_SGPU,
    MODE_VCUDA,
    MPS_CORE_RESOURCE,
    MPS_MEMORY_RESOURCE,
    SGPU_RESOURCE,
    VCORE_RESOURCE,
    VCUDA_CORE_RESOURCE,
    VCUDA_MEMORY_RESOURCE,
    VCUDA_MEMORY_UNIT_MIB,
    VMEMORY_RESOURCE,
    WHOLE_GPU_RESOURCES,
    SharingError,
)

_FAMILY_OF = {name: f for f in FAMILIES for name in (f.count, f.core, f.memory) if name}
# the unit of a memory quantity without a binary suffix, MiB (``memory_mib``)
MEMORY_UNIT_MIB = {
    VMEMORY_RESOURCE: GIB_MIB,
    MPS_MEMORY_RESOURCE: GIB_MIB,
    VCUDA_MEMORY_RESOURCE: VCUDA_MEMORY_UNIT_MIB,
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
