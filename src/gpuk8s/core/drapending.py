"""Why a pending ResourceClaim of gpu-dra's classes can never be allocated, in our words.

``unmet(claim, slices)`` judges one unallocated claim (a ``resource.k8s.io/v1``
ResourceClaim as JSON) against every published ResourceSlice of the driver (all nodes'),
and returns the reasons gpu-dra knows for which no node could serve a request of it, now:

* ``GpuDraGroupDevicesOff``: a ``group-N`` class while no node publishes a group device
  of N GPUs (group devices off on this release or node, or no link-complete group of N);
* ``GpuDraNoLinkGroup``: ``count`` GPUs with ``matchAttribute: gpu.metax-tech.com/linkGroup``
  while no node has a link group of that many GPUs;
* ``GpuDraTooManyDevices``: ``count`` devices of a class while no node publishes that many
  (or, with ``matchAttribute`` on another gpu-dra attribute such as ``parentIndex``, no
  node has that many sharing one value of it: VFs of one GPU);
* ``GpuDraShareTooLarge``: a share whose ``vcore`` is above a whole GPU (100) or whose
  ``vmemory`` is above the largest sGPU device's memory.

Each bound is an upper bound on what any node could give (taints, other claims' use,
the request's own selectors only lower it), so a claim named here stays pending whatever
the scheduler does; everything else is left to the scheduler's own message. Pure: no I/O,
the stdlib only (Python >= 3.8).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Mapping, Sequence

from .dra import (
    CAPACITY_VCORE,
    CAPACITY_VMEMORY,
    DRIVER,
    GROUP_SIZES,
    TYPE_GPU,
    TYPE_GROUP,
    TYPE_VF,
)
from .quantity import QuantityError, parse_quantity

REASON_GROUPS_OFF = "GpuDraGroupDevicesOff"
REASON_NO_LINK_GROUP = "GpuDraNoLinkGroup"
REASON_TOO_MANY = "GpuDraTooManyDevices"
REASON_SHARE_TOO_LARGE = "GpuDraShareTooLarge"
REASONS = (REASON_GROUPS_OFF, REASON_NO_LINK_GROUP, REASON_TOO_MANY, REASON_SHARE_TOO_LARGE)

CLASS_GPU = DRIVER
CLASS_VF = "vf." + DRIVER
CLASS_SGPU = "sgpu." + DRIVER
GROUP_CLASSES = {f"group-{n}.{DRIVER}": n for n in GROUP_SIZES}
FULL_VCORE = 100


@dataclass(frozen=True)
class Unmet:
    """One reason a request cannot be served: ``reason`` (an Event reason) and a message
    naming the request, what it asks and what exists."""

    reason: str
    request: str
    message: str


@dataclass(frozen=True)
class _Device:
    pool: str
    type: str
    attributes: Mapping[str, Any]
    capacity: Mapping[str, Any]


def _attr(raw: Mapping[str, Any]) -> Any:
    for kind in ("int", "string", "bool", "version"):
        if kind in raw:
            return raw[kind]
    return None


def devices_of(slices: Sequence[Mapping[str, Any]]) -> list[_Device]:
    """The driver's devices of every pool (attributes unqualified, as published)."""
    out: list[_Device] = []
    for body in slices:
        spec = body.get("spec") or {}
        if spec.get("driver") != DRIVER:
            continue
        pool = str((spec.get("pool") or {}).get("name") or spec.get("nodeName") or "")
        for dev in spec.get("devices") or []:
            attrs = {str(k): _attr(v or {}) for k, v in (dev.get("attributes") or {}).items()}
            out.append(_Device(pool, str(attrs.get("type") or ""), attrs,
                               dict(dev.get("capacity") or {})))
    return out


def _in_class(device: _Device, device_class: str) -> bool:
    if device_class == CLASS_GPU:
        return device.type == TYPE_GPU
    if device_class == CLASS_VF:
        return device.type == TYPE_VF
    if device_class == CLASS_SGPU:
        return device.type == TYPE_GPU and CAPACITY_VCORE in device.capacity
    size = GROUP_CLASSES.get(device_class)
    return size is not None and device.type == TYPE_GROUP and \
        device.attributes.get("groupSize") == size


def _qty(value: Any) -> Fraction | None:
    try:
        return parse_quantity(str(value))
    except QuantityError:
        return None


def _mib(amount: Fraction) -> str:
    return f"{int(amount) // (1024 * 1024)}Mi"


def _local_name(attribute: str) -> str | None:
    """``gpu.metax-tech.com/linkGroup`` -> ``linkGroup``; other domains -> None (those
    attributes are not gpu-dra's to judge)."""
    domain, _, name = attribute.rpartition("/")
    return name if domain == DRIVER and name else None


def _largest_set(devices: Sequence[_Device], attribute: str | None) -> tuple[int, str]:
    """The most devices one pool has, all sharing one value of ``attribute`` (None: any);
    and that pool."""
    sets: dict[tuple[str, Any], int] = {}
    for dev in devices:
        if attribute is None:
            key: tuple[str, Any] = (dev.pool, None)
        elif attribute in dev.attributes:
            key = (dev.pool, dev.attributes[attribute])
        else:
            continue
        sets[key] = sets.get(key, 0) + 1
    if not sets:
        return 0, ""
    (pool, _), best = max(sets.items(), key=lambda kv: (kv[1], kv[0][0]))
    return best, pool


def _judge(name: str, exactly: Mapping[str, Any], matched: Sequence[str],
           devices: Sequence[_Device]) -> Unmet | None:
    device_class = str(exactly.get("deviceClassName") or "")
    if device_class not in (CLASS_GPU, CLASS_VF, CLASS_SGPU) and \
            device_class not in GROUP_CLASSES:
        return None
    mine = [d for d in devices if _in_class(d, device_class)]
    size = GROUP_CLASSES.get(device_class)
    if size is not None and not mine:
        sizes = sorted({int(d.attributes["groupSize"]) for d in devices
                        if d.type == TYPE_GROUP and d.attributes.get("groupSize") is not None})
        have = ("group devices of " + ", ".join(str(s) for s in sizes) + " GPUs") if sizes \
            else "none (group devices are off on this cluster's Kubernetes release or nodes)"
        return Unmet(REASON_GROUPS_OFF, name,
                     f"request {name!r} asks for class {device_class}: no node publishes a "
                     f"group device of {size} GPUs; published: {have}")
    requests = (exactly.get("capacity") or {}).get("requests") or {}
    if device_class == CLASS_SGPU and requests:
        found = _share_too_large(name, requests, mine)
        if found is not None:
            return found
    if str(exactly.get("allocationMode") or "ExactCount") != "ExactCount":
        return None
    count = int(exactly.get("count") or 1)
    what = "VFs" if device_class == CLASS_VF else "GPUs" if size is None else "group devices"
    for attribute in matched:
        best, pool = _largest_set(mine, attribute)
        if best < count:
            where = f" (node {pool})" if pool else ""
            reason = REASON_NO_LINK_GROUP if attribute == "linkGroup" else REASON_TOO_MANY
            return Unmet(reason, name,
                         f"request {name!r} asks for {count} {what} of class {device_class} "
                         f"with the same {DRIVER}/{attribute}; the most any node has is "
                         f"{best}{where}")
    best, pool = _largest_set(mine, None)
    if best < count:
        where = f" (node {pool})" if pool else ""
        return Unmet(REASON_TOO_MANY, name,
                     f"request {name!r} asks for {count} {what} of class {device_class} on "
                     f"one node; the most any node publishes is {best}{where}")
    return None


def _share_too_large(name: str, requests: Mapping[str, Any],
                     mine: Sequence[_Device]) -> Unmet | None:
    vcore = _qty(requests.get(CAPACITY_VCORE)) if CAPACITY_VCORE in requests else None
    if vcore is not None and vcore > FULL_VCORE:
        return Unmet(REASON_SHARE_TOO_LARGE, name,
                     f"request {name!r} asks for vcore {requests[CAPACITY_VCORE]}: a share is "
                     f"at most one whole GPU, vcore {FULL_VCORE}")
    vmemory = _qty(requests.get(CAPACITY_VMEMORY)) if CAPACITY_VMEMORY in requests else None
    sizes = [q for q in (_qty((d.capacity.get(CAPACITY_VMEMORY) or {}).get("value"))
                         for d in mine) if q is not None]
    if vmemory is not None and sizes and vmemory > max(sizes):
        return Unmet(REASON_SHARE_TOO_LARGE, name,
                     f"request {name!r} asks for vmemory {requests[CAPACITY_VMEMORY]}: the "
                     f"largest sGPU device has {_mib(max(sizes))}")
    return None


def _matched(constraints: Sequence[Mapping[str, Any]], name: str) -> list[str]:
    """gpu-dra attributes that ``matchAttribute`` constraints put on request ``name``."""
    out: list[str] = []
    for constraint in constraints:
        local = _local_name(str(constraint.get("matchAttribute") or ""))
        applies = constraint.get("requests") or []
        if local is not None and (not applies or name in applies) and local not in out:
            out.append(local)
    return out


def unmet(claim: Mapping[str, Any], slices: Sequence[Mapping[str, Any]]) -> list[Unmet]:
    """Why ``claim`` cannot be allocated on any node of ``slices``, one ``Unmet`` per
    request gpu-dra can judge (empty: nothing gpu-dra knows; the scheduler decides). A
    ``firstAvailable`` request is unmet only when each of its alternatives is."""
    devices = devices_of(slices)
    spec = (claim.get("spec") or {}).get("devices") or {}
    constraints = spec.get("constraints") or []
    out: list[Unmet] = []
    for request in spec.get("requests") or []:
        name = str(request.get("name") or "")
        if request.get("exactly") is not None:
            found = _judge(name, request["exactly"], _matched(constraints, name), devices)
            if found is not None:
                out.append(found)
            continue
        alternatives = request.get("firstAvailable") or []
        judged = [_judge(f"{name}/{sub.get('name')}", sub,
                         _matched(constraints, name) + _matched(
                             constraints, f"{name}/{sub.get('name')}"), devices)
                  for sub in alternatives]
        found_all = [j for j in judged if j is not None]
        if found_all and len(found_all) == len(judged):
            out.append(Unmet(found_all[0].reason, name, "every alternative is unmet: " +
                             "; ".join(j.message for j in found_all)))
    return out
