"""What gpu-dra publishes: a node's GPUs as DRA devices in ResourceSlices (resource.k8s.io/v1).

One device per allocatable unit (``core.topology.units_for_inventory``: a GPU, or a VF
when VFs are configured), with the attributes of SPEC §14 under the driver's domain
(``gpu.metax-tech.com``) and Kubernetes' standard ``resource.kubernetes.io/pcieRoot`` and
``pciBusID``; capacity ``memory``.

Device names outlive a discovery pass (a claim is allocated by name, and may be prepared
by a plugin restarted after a GPU left the bus, when discovery has renumbered the GPUs
above it), so they are built from the card's PCI address, never from its index:
``gpu-0000-3b-00-0`` (``gpu_device_name``), ``gpu-0000-3b-00-0-vf-2`` for its VF 2, and
``group4-0000-3b-00-0-<8 hex>`` for a 4-GPU group device whose first member is that card
(the hex digits: a digest of every member's address, ``group_device_name``). The
``index`` attribute shows the index for people. Releases before these names built them
from indexes (``gpu-<index>``, ``group-<i>-<j>...``): ``legacy_device_gpus`` reads them.

Two optional shapes, each needing a feature gate that is alpha (off) in Kubernetes 1.35 and
beta (on) from 1.36:

* **Group devices** (``DRAPartitionableDevices``): a link-complete 2-, 4- or 8-GPU set
  (every pair joined by MetaXLink / NVLink) as one device ``group<k>-...``. A counter
  set ``gpus`` (in a slice of its own: the API allows counters or devices per slice) has
  one counter per GPU (named as the GPU's device); each GPU device consumes its GPU's
  counter and a group device its members', so a GPU is never handed out twice. Groups
  are the aligned 2- and 4-blocks of each link group in index order and the whole group
  when its size is 2, 4 or 8, so that pairs do not straddle quads (SPEC §3 rule 3). A
  node with no group device (no links, VFs, sGPU, groups off) publishes no counters
  either. Off unless asked for (``group_devices_wanted``).
* **sGPU** (``DRAConsumableCapacity``; the node's ``gpuk8s.io/sharing-mode`` is ``sgpu``):
  each GPU device allows multiple allocations and offers consumable ``vcore`` (percent,
  1-100), ``vmemory`` (MiB steps) and ``shares`` (16 slots, one per allocation), the
  accounting ``core.sharing.fits`` applies for gpu-aware. A claim without capacity
  requests takes the defaults: all of ``vcore`` and ``vmemory``, the GPU exclusively.

Unhealthy devices carry a ``NoSchedule`` taint (``DRADeviceTaints``) or are left out.

Device order inside a slice is the order the scheduler's first-fit allocator tries
(``steering_order``); ``node_slices`` is what gpu-dra publishes and ``gpuk8s dra slices``
prints. Pure: stdlib only, Python 3.8+.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError
from .model import Gpu, LinkKind, NodeInventory
from .sharing import DEFAULT_SLOTS, FULL_CORE, MODE_EXCLUSIVE, MODE_SGPU
from .topology import Topology, Unit, units_for_inventory

DRIVER = "gpu.metax-tech.com"
API_VERSION = "resource.k8s.io/v1"
STANDARD = "resource.kubernetes.io/"
PCIE_ROOT = STANDARD + "pcieRoot"
PCI_BUS_ID = STANDARD + "pciBusID"

TYPE_GPU = "gpu"
TYPE_VF = "vf"
TYPE_GROUP = "group"
GROUP_SIZES = (2, 4, 8)
COUNTER_SET = "gpus"
MAX_COUNTERS = 32  # per counter set (ResourceSliceMaxCountersPerCounterSet)
MAX_DEVICES = 64  # per slice when devices consume counters or carry taints
UNHEALTHY_TAINT = DRIVER + "/unhealthy"
UNHEALTHY_MODES = ("taint", "remove")
GROUP_DEVICE_MODES = ("auto", "on", "off")
# kube-scheduler's DRA allocator before Kubernetes 1.36.3 keeps the counters of a device it
# rejected on a constraint (kubernetes/kubernetes#140436, fixed by #140431; no 1.35 release
# has the fix): with group devices published, a claim with matchAttribute that meets a
# partly used link group first never gets the whole group behind it
GROUPS_SAFE_FROM = (1, 36, 3)
# and they do not scale: measured with the real kube-scheduler 1.35.4 (issue 51,
# benchmarks/dra.py), DRA claims schedule at 1.7 pods/s on 200 nodes and 0.17 on 500 with
# group devices published, against 52.8 and 20.6 with GPUs only (the allocator brings every
# node's sharedCounters slice into every node's Filter). On 1.37.2 one small run each gave
# 0.45 times the GPUs-only rate at 200 nodes and 0.77 at 500 (docs/benchmarks.md): not yet
# repeated, so ``auto`` keeps them off everywhere; the first release measured at >= half
# the GPUs-only rate at 200 and 500 nodes, repeatedly, goes here.
GROUPS_SCALE_FROM: tuple[int, int, int] | None = None
GROUPS_SCALE_WHY = (
    "with group devices kube-scheduler 1.35.4 scheduled DRA claims at 1.7 pods/s on 200 "
    "nodes and 0.17 on 500, against 52.8 and 20.6 without them; 1.37.2 at 0.45 and 0.77 "
    "times the GPUs-only rate in one small run each, not yet repeated (docs/dra.md, Flags)"
)
DRA_SHARING_MODES = (MODE_EXCLUSIVE, MODE_SGPU)

# attribute and capacity names (the driver's domain is implied)
ATTRIBUTE_NAMES = (
    "type", "productName", "uuid", "serial", "index", "driverVersion", "sdkVersion",
    "linkGroup", "pcieSwitch", "numaNode", "parentIndex", "vfIndex", "groupSize", "members",
    PCIE_ROOT, PCI_BUS_ID,
)  # fmt: skip
CAPACITY_MEMORY = "memory"
CAPACITY_VCORE = "vcore"
CAPACITY_VMEMORY = "vmemory"
CAPACITY_SHARES = "shares"

SELF = int(LinkKind.SELF)
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class DraError(ConfigError):
    """Slices cannot be built as asked (the message names the option)."""


@dataclass(frozen=True)
class DraDevice:
    """One device of the node's pool."""

    name: str
    type: str  # TYPE_GPU | TYPE_VF | TYPE_GROUP
    units: tuple[Unit, ...]  # what a claim of it gets (one unit; a group's members)
    attributes: dict[str, dict[str, Any]] = field(default_factory=dict)
    capacity: dict[str, dict[str, Any]] = field(default_factory=dict)
    counters: tuple[str, ...] = ()  # counters of COUNTER_SET it consumes (1 each)
    shared: bool = False  # allowMultipleAllocations (sGPU)

    @property
    def gpus(self) -> tuple[int, ...]:
        return tuple(sorted({u.gpu for u in self.units}))

    def to_api(self, taint: str | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "attributes": dict(self.attributes)}
        if self.capacity:
            out["capacity"] = dict(self.capacity)
        if self.counters:
            out["consumesCounters"] = [{
                "counterSet": COUNTER_SET,
                "counters": {c: {"value": "1"} for c in self.counters},
            }]
        if self.shared:
            out["allowMultipleAllocations"] = True
        if taint is not None:
            out["taints"] = [{"key": UNHEALTHY_TAINT, "value": _taint_value(taint),
                              "effect": "NoSchedule"}]
        return out


@dataclass(frozen=True)
class PoolOptions:
    """How a node's pool is shaped (gpu-dra's flags)."""

    sharing: str = MODE_EXCLUSIVE  # exclusive | sgpu (the node's gpuk8s.io/sharing-mode)
    groups: bool = True  # group devices (needs DRAPartitionableDevices)
    unhealthy: str = "taint"  # taint | remove (taints need DRADeviceTaints)

    def __post_init__(self) -> None:
        if self.sharing not in DRA_SHARING_MODES:
            raise DraError(
                f"sharing-mode: {self.sharing!r} is not served by gpu-dra; one of "
                f"{', '.join(DRA_SHARING_MODES)}"
            )
        if self.unhealthy not in UNHEALTHY_MODES:
            raise DraError(
                f"unhealthy-devices: {self.unhealthy!r} is not one of {', '.join(UNHEALTHY_MODES)}"
            )


def kube_version(git_version: str) -> tuple[int, int, int] | None:
    """(major, minor, patch) of a Kubernetes ``gitVersion`` such as ``v1.35.4`` or
    ``v1.36.3-eks-1``; None when it is not one."""
    found = re.match(r"^v?(\d+)\.(\d+)\.(\d+)", git_version.strip())
    return (int(found[1]), int(found[2]), int(found[3])) if found else None


def group_devices_wanted(mode: str, git_version: str | None) -> tuple[bool, str | None]:
    """``--group-devices``: (publish group devices?, why not, where ``auto`` said no).
    ``auto`` publishes them only where the cluster's Kubernetes (``git_version``, the API
    server's; None: unknown) both allocates them correctly (``GROUPS_SAFE_FROM``) and was
    measured to schedule with them at scale (``GROUPS_SCALE_FROM``: no release yet, so
    ``auto`` is off everywhere today)."""
    if mode not in GROUP_DEVICE_MODES:
        raise DraError(f"group-devices: {mode!r} is not one of {', '.join(GROUP_DEVICE_MODES)}")
    if mode != "auto":
        return mode == "on", None
    version = kube_version(git_version or "")
    scales = GROUPS_SCALE_FROM is not None and version is not None and \
        version >= GROUPS_SCALE_FROM
    if scales and version is not None and version >= GROUPS_SAFE_FROM:
        return True, None
    seen = f"Kubernetes {git_version}" if version is not None else \
        "the cluster's Kubernetes version could not be read"
    why = [] if scales else [GROUPS_SCALE_WHY]
    if version is None or version < GROUPS_SAFE_FROM:
        safe = ".".join(str(n) for n in GROUPS_SAFE_FROM)
        why.append(f"kube-scheduler before {safe} keeps the counters of a device a constraint "
                   "rejected (kubernetes/kubernetes#140436), so a claim with matchAttribute "
                   "could miss a free link group")
    return False, (f"group devices off ({seen}): {'; and '.join(why)}; --group-devices on "
                   "(chart gpuDra.groupDevices: true) publishes them anyway")


def _str(value: str) -> dict[str, Any]:
    return {"string": value}


def _int(value: int) -> dict[str, Any]:
    return {"int": value}


def _taint_value(reason: str) -> str:
    """A taint value is a label value: at most 63 characters of ``[A-Za-z0-9_.-]``."""
    text = re.sub(r"[^A-Za-z0-9_.-]+", "-", reason).strip("-_.")[:63].rstrip("-_.")
    return text or "unhealthy"


def _slug(pci_address: str) -> str:
    """A PCI address as DNS-label characters: ``0000:3b:00.0`` -> ``0000-3b-00-0``."""
    return re.sub(r"[^a-z0-9]+", "-", pci_address.lower()).strip("-")


def gpu_device_name(gpu: Gpu, vf: int | None = None) -> str:
    """The device name of ``gpu`` (``gpu-<PCI address>``), or of its VF ``vf``
    (``...-vf-<n>``): the same card keeps its name whatever index discovery gives it."""
    name = f"gpu-{_slug(gpu.pci_address)}"
    return name if vf is None else f"{name}-vf-{vf}"


def group_device_name(members: Sequence[Gpu]) -> str:
    """``group<k>-<first member's address>-<digest>``: k GPUs, the first in PCI order, and
    8 hex digits of the SHA-256 of every member's address, so that two groups which
    share a first card (after a GPU left the bus, the aligned blocks of a link group move)
    never share a name. At most 28 characters for ``dddd:bb:dd.f`` addresses."""
    addresses = sorted(g.pci_address for g in members)
    digest = hashlib.sha256(",".join(addresses).encode()).hexdigest()[:8]
    return f"group{len(addresses)}-{_slug(addresses[0])}-{digest}"


def counter_name(gpu: Gpu) -> str:
    """The GPU's counter in ``COUNTER_SET``: named as its device."""
    return gpu_device_name(gpu)


_LEGACY_GPU = re.compile(r"^gpu-(\d+)(?:-vf-(\d+))?$")
_LEGACY_GROUP = re.compile(r"^group-(\d+(?:-\d+)+)$")
_GPU_NAME = re.compile(r"^gpu-([0-9a-f]{4,8})-([0-9a-f]{2})-([0-9a-f]{2})-([0-7])(?:-vf-\d+)?$")


def legacy_device_gpus(name: str) -> tuple[tuple[int, ...], int | None] | None:
    """(GPU indexes, VF number or None) of a device name built from indexes by the
    releases before stable names (``gpu-3``, ``gpu-3-vf-1``, ``group-4-5-6-7``); None for
    any other name. Those indexes are the ones of that plugin's discovery."""
    found = _LEGACY_GPU.match(name)
    if found:
        return (int(found[1]),), None if found[2] is None else int(found[2])
    found = _LEGACY_GROUP.match(name)
    if found:
        return tuple(int(i) for i in found[1].split("-")), None
    return None


def missing_device_reason(name: str) -> str:
    """Why a device an allocation names is not in the pool now, for the error."""
    if legacy_device_gpus(name) is not None:
        return ("it names a GPU by index, as gpu-dra did before device names were built "
                "from PCI addresses: the claim was allocated before gpu-dra was upgraded "
                "and is not prepared by this release (indexes move when a GPU leaves the "
                "bus); delete the claim, or the pod of a template's claim, to have it "
                "allocated again")
    found = _GPU_NAME.match(name)
    if found:
        return (f"the GPU at PCI address {found[1]}:{found[2]}:{found[3]}.{found[4]} is "
                "not on this node's bus now (or its VFs changed)")
    if name.startswith("group"):
        return "a GPU of that group is not on this node's bus now (or its link group changed)"
    return "it is not one of this node's devices"


def _common(inventory: NodeInventory, gpu: Gpu) -> dict[str, dict[str, Any]]:
    attrs: dict[str, dict[str, Any]] = {"productName": _str(gpu.product or "unknown")}
    if inventory.driver.version:
        attrs["driverVersion"] = _str(inventory.driver.version)
    if inventory.sdk.version:
        attrs["sdkVersion"] = _str(inventory.sdk.version)
    if gpu.link_group is not None:
        attrs["linkGroup"] = _int(gpu.link_group)
    if gpu.pcie_switch:
        attrs["pcieSwitch"] = _str(gpu.pcie_switch)
    if gpu.numa_node is not None and gpu.numa_node >= 0:
        attrs["numaNode"] = _int(gpu.numa_node)
    if gpu.pcie_root:
        attrs[PCIE_ROOT] = _str(gpu.pcie_root)
    return attrs


def mib_quantity(mib: int) -> str:
    """MiB as the API server writes the quantity back (canonical binary SI: the largest
    suffix that keeps an integer), so a published slice compares equal to what is read."""
    for suffix, factor in (("Pi", 1024**3), ("Ti", 1024**2), ("Gi", 1024)):
        if mib and mib % factor == 0:
            return f"{mib // factor}{suffix}"
    return f"{mib}Mi"


def _memory(mib: int | None) -> dict[str, dict[str, Any]]:
    return {} if mib is None else {CAPACITY_MEMORY: {"value": mib_quantity(mib)}}


def _sgpu_capacity(mib: int | None) -> dict[str, dict[str, Any]]:
    """Consumable capacity with gpu-aware's sGPU rules (``core.sharing.fits``)."""
    cap: dict[str, dict[str, Any]] = {
        CAPACITY_VCORE: {"value": str(FULL_CORE), "requestPolicy": {
            "default": str(FULL_CORE),
            "validRange": {"min": "1", "max": str(FULL_CORE), "step": "1"}}},
        CAPACITY_SHARES: {"value": str(DEFAULT_SLOTS), "requestPolicy": {
            "default": "1", "validValues": ["1"]}},
    }
    if mib is not None:
        cap[CAPACITY_VMEMORY] = {"value": mib_quantity(mib), "requestPolicy": {
            "default": mib_quantity(mib), "validRange": {"min": "1Mi", "step": "1Mi"}}}
    return cap


def unit_devices(inventory: NodeInventory, options: PoolOptions,
                 counted: bool = False) -> list[DraDevice]:
    """One device per allocatable unit, in unit order; each GPU consumes its counter when
    ``counted`` (the pool has group devices)."""
    units = units_for_inventory(inventory)
    has_vfs = any(u.vf is not None for u in units)
    if options.sharing == MODE_SGPU and has_vfs:
        raise DraError("sharing-mode sgpu: the node has VFs (VFs cannot be shared)")
    counters = counted and options.sharing == MODE_EXCLUSIVE and not has_vfs
    out: list[DraDevice] = []
    for position, unit in enumerate(units):
        gpu = inventory.gpu(unit.gpu)
        attrs = _common(inventory, gpu)
        if unit.vf is None:
            attrs["type"] = _str(TYPE_GPU)
            attrs["index"] = _int(gpu.index)
            if gpu.uuid:
                attrs["uuid"] = _str(gpu.uuid)
            if gpu.serial:
                attrs["serial"] = _str(gpu.serial)
            attrs[PCI_BUS_ID] = _str(gpu.pci_address)
            mib = gpu.memory_mib
        else:
            attrs["type"] = _str(TYPE_VF)
            attrs["index"] = _int(position)
            attrs["parentIndex"] = _int(gpu.index)
            attrs["vfIndex"] = _int(unit.vf)
            if _is_bdf(unit.id):
                attrs[PCI_BUS_ID] = _str(unit.id)
            vfs = max(gpu.sriov.num_vfs, 1)
            mib = None if gpu.memory_mib is None else gpu.memory_mib // vfs
        shared = options.sharing == MODE_SGPU
        out.append(DraDevice(
            name=gpu_device_name(gpu, unit.vf),
            type=TYPE_GPU if unit.vf is None else TYPE_VF,
            units=(unit,),
            attributes=attrs,
            capacity=_sgpu_capacity(mib) if shared else _memory(mib),
            counters=(counter_name(gpu),) if counters else (),
            shared=shared,
        ))
    return out


def _is_bdf(text: str) -> bool:
    return re.match(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$", text) is not None


def link_complete_sets(inventory: NodeInventory) -> list[tuple[int, ...]]:
    """The GPU sets published as group devices: for each link group (GPUs whose pairs are
    all joined by a vendor link), the aligned blocks of 2 and 4 in index order and the
    whole group when it has 2, 4 or 8 GPUs. Sorted by size, then first member."""
    by_group: dict[int, list[int]] = {}
    for gpu in inventory.gpus:
        if gpu.link_group is not None:
            by_group.setdefault(gpu.link_group, []).append(gpu.index)
    sets: list[tuple[int, ...]] = []
    for members in by_group.values():
        members = sorted(members)
        if not _linked(inventory, members):
            continue  # a partial mesh: only its complete sub-cliques could be groups
        for size in GROUP_SIZES:
            if size < len(members):
                sets.extend(tuple(members[i:i + size])
                            for i in range(0, len(members) - size + 1, size))
            elif size == len(members):
                sets.append(tuple(members))
    return sorted(set(sets), key=lambda s: (len(s), s))


def _linked(inventory: NodeInventory, members: Sequence[int]) -> bool:
    return all(frozenset((a, b)) in inventory.links
               for i, a in enumerate(members) for b in members[i + 1:])


def group_devices(inventory: NodeInventory, options: PoolOptions) -> list[DraDevice]:
    """Group devices (exclusive mode, whole GPUs, at most MAX_COUNTERS GPUs)."""
    if not options.groups or options.sharing != MODE_EXCLUSIVE:
        return []
    if any(g.sriov.num_vfs > 0 for g in inventory.gpus) or len(inventory.gpus) > MAX_COUNTERS:
        return []
    out: list[DraDevice] = []
    for members in link_complete_sets(inventory):
        gpus = [inventory.gpu(i) for i in members]
        attrs = _common(inventory, gpus[0])
        for key in ("numaNode", "pcieSwitch", PCIE_ROOT):
            if any(_common(inventory, g).get(key) != attrs.get(key) for g in gpus[1:]):
                attrs.pop(key, None)
        attrs["type"] = _str(TYPE_GROUP)
        attrs["groupSize"] = _int(len(members))
        attrs["members"] = _str(",".join(str(i) for i in members))
        memory = [g.memory_mib for g in gpus]
        total = None if any(m is None for m in memory) else sum(m or 0 for m in memory)
        out.append(DraDevice(
            name=group_device_name(gpus),
            type=TYPE_GROUP,
            units=tuple(Unit(g.pci_address, g.index) for g in gpus),
            attributes=attrs,
            capacity=_memory(total),
            counters=tuple(counter_name(g) for g in gpus),
        ))
    return out


def pool_devices(inventory: NodeInventory, options: PoolOptions) -> list[DraDevice]:
    """Every device of the node's pool: units first, then group devices. The units consume
    counters only where there are group devices: a node without links publishes none."""
    groups = group_devices(inventory, options)
    devices = unit_devices(inventory, options, counted=bool(groups)) + groups
    seen: set[str] = set()
    for device in devices:
        if not DNS_LABEL.match(device.name):
            raise DraError(f"device name {device.name!r} is not a DNS label (built from "
                           "the PCI address discovery reported)")
        if device.name in seen:
            raise DraError(f"device name {device.name!r} is not unique in the pool (two "
                           "GPUs report one PCI address)")
        seen.add(device.name)
    return devices


def counter_set(inventory: NodeInventory) -> dict[str, Any]:
    return {"name": COUNTER_SET,
            "counters": {counter_name(g): {"value": "1"} for g in inventory.gpus}}


def steering_order(topology: Topology, devices: Sequence[DraDevice],
                   busy_gpus: Sequence[int] = ()) -> list[DraDevice]:
    """The device order that steers kube-scheduler's first-fit allocator toward SPEC §3's
    choice: best fit at every level. A unit device's key is, for each level from the
    coarsest (NUMA node) to the finest (link group), the free GPUs in its group there and
    the group's number, then its position: the devices of a group stay together, and the
    fullest group that still has free GPUs comes first, so a partly used group fills up
    before a whole one is broken (rule 3). kube-scheduler tries devices in slice order and
    backtracks for ``matchAttribute``, so a claim for k GPUs in one link group lands in
    the fullest link group that still has k free. Group devices follow the same key (of
    their first member), smaller groups first.

    ``busy_gpus``: GPU indices allocated (or unhealthy) now."""
    busy = set(busy_gpus)
    levels = sorted(topology.comp)  # SYS (coarse) ... SELF (fine: one GPU, no fit to weigh)
    free: dict[tuple[int, int], int] = {}  # (level, group) -> free units
    for position, unit in enumerate(topology.units):
        if unit.gpu not in busy:
            for level in levels:
                group = (level, topology.comp[level][position])
                free[group] = free.get(group, 0) + 1

    def key(device: DraDevice) -> tuple[Any, ...]:
        position = topology.position.get(device.units[0].id, 0)
        fit = tuple(
            (free.get((level, topology.comp[level][position]), 0) if level < SELF else 0,
             topology.comp[level][position])
            for level in levels
        )
        size = len(device.units) if device.type == TYPE_GROUP else 0
        return (size, fit, position)

    return sorted(devices, key=key)


def slice_name(node: str, part: str) -> str:
    return f"{node}-{DRIVER.replace('.', '-')}-{part}"


def build_slices(
    node: str,
    inventory: NodeInventory,
    options: PoolOptions,
    *,
    generation: int = 1,
    unhealthy: Mapping[int, str] | None = None,
    order: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """The ResourceSlices of the node's pool (``apiVersion``, ``kind``, ``metadata.name``,
    ``spec``), devices in ``order`` (device names; others after, in pool order).

    ``unhealthy``: GPU index -> reason; the devices holding such a GPU are tainted or
    left out (``options.unhealthy``)."""
    devices = pool_devices(inventory, options)
    if order is not None:
        rank = {name: i for i, name in enumerate(order)}
        devices = sorted(devices, key=lambda d: rank.get(d.name, len(rank)))
    sick = dict(unhealthy or {})
    entries: list[dict[str, Any]] = []
    for device in devices:
        reasons = [sick[g] for g in device.gpus if g in sick]
        if reasons and options.unhealthy == "remove":
            continue
        entries.append(device.to_api(reasons[0] if reasons else None))
    counted = any(d.counters for d in devices)
    chunks = [entries[i:i + MAX_DEVICES] for i in range(0, len(entries), MAX_DEVICES)] or [[]]
    specs: list[tuple[str, dict[str, Any]]] = []
    if counted:
        specs.append(("counters", {"sharedCounters": [counter_set(inventory)]}))
    for i, chunk in enumerate(chunks):
        specs.append((f"devices-{i}", {"devices": chunk} if chunk else {}))
    out = []
    for part, body in specs:
        spec: dict[str, Any] = {
            "driver": DRIVER,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": len(specs)},
            "nodeName": node,
        }
        spec.update(body)
        out.append({"apiVersion": API_VERSION, "kind": "ResourceSlice",
                    "metadata": {"name": slice_name(node, part)}, "spec": spec})
    return out


def node_slices(
    node: str,
    inventory: NodeInventory,
    options: PoolOptions,
    *,
    generation: int = 1,
    unhealthy: Mapping[int, str] | None = None,
    busy: Sequence[int] = (),
    topology: Topology | None = None,
    node_uid: str = "",
) -> list[dict[str, Any]]:
    """What gpu-dra publishes for the node: ``build_slices`` with the devices in
    ``steering_order`` for the GPUs in use (``busy``, GPU indices held by prepared claims)
    and the unhealthy ones. ``topology``: the node's, when the caller keeps it.
    ``node_uid``: the Node object's uid; the slices then belong to it (deleting the Node
    deletes them)."""
    sick = dict(unhealthy or {})
    if topology is None:
        topology = Topology.from_inventory(inventory, units_for_inventory(inventory))
    order = steering_order(topology, pool_devices(inventory, options),
                           sorted(set(busy) | set(sick)))
    slices = build_slices(node, inventory, options, generation=generation, unhealthy=sick,
                          order=[d.name for d in order])
    if node_uid:
        for body in slices:
            body["metadata"]["ownerReferences"] = [{
                "apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid,
                "controller": True}]
    return slices


def device_index(inventory: NodeInventory, options: PoolOptions) -> dict[str, DraDevice]:
    """Device name -> device, for NodePrepareResources."""
    return {d.name: d for d in pool_devices(inventory, options)}
