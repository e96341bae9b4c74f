"""Who uses how much of which GPU: node telemetry attributed to containers.

Pure functions, stdlib only (Python 3.8+). Inputs:

* the node's ``NodeInventory`` (GPUs, their VFs and UUIDs) and a ``NodeTelemetry``
  sample (per-GPU load and the processes on each GPU, with host PIDs);
* ``ContainerDevices`` from the kubelet's PodResources API: which container holds which
  device IDs of which resource;
* ``owners``: host PID -> the container the process runs in (from its cgroup), or None
  when that mapping could not be made at all.

Attribution, per GPU *g* and container *c* holding at least one device on *g*:

* memory: the sum of the GPU memory of *c*'s processes on *g* (exact). When *c* is
  *g*'s only holder, processes on *g* that belong to no other known container count as
  *c*'s too (the kubelet gave the GPU to *c* alone). Without a process list or without
  PID ownership, a sole holder gets the GPU's memory in use (approximate: it includes
  the driver's own use) and a shared GPU gets nothing rather than a guess;
* utilisation: the sum of *c*'s processes' utilisation where the backend reports it per
  process (NVML: exact); else, for a sole holder, the GPU's utilisation (exact); else
  (a GPU shared by several containers, mx-smi / nvidia-smi) the GPU's utilisation split
  evenly over the holders that have a process on it, 0 for those that have none:
  an *estimate*, flagged ``utilization_exact=False``. The whole GPU's value is never
  repeated for every pod, so per-pod values add up to at most the GPU's.

Shared GPUs (``core.sharing``: sGPU, vcuda, MPS): the kubelet hands a pod of a sharing
mode replica ids (``<GPU>::<n>``) that it picked at random among every shared GPU of the
node; they do not say which GPU the pod got. The GPU is the one in the pod's
``gpuk8s.io/sharing.assigned`` annotation (written by gpu-aware, served by gpu-device's
``Allocate``): ``assigned`` maps (namespace, pod) to those GPU indexes. A holding of a
mode's counted resource (``core.sharing.COUNTED_RESOURCE``) is attributed to the
assigned GPUs, its ids spread evenly over them; without an assignment its ids name no
GPU and count as unknown devices (never the replica's GPU, which is a guess).

GPU kind (the accelerator suite's pGPU / vGPU / MPS filter): a holding's kind comes from
its resource name (``resource_kinds``); a device ID that is an SR-IOV VF is vGPU. A
GPU's kind is the strongest kind among its holdings (MPS > vGPU > pGPU), vGPU when it
has VFs enabled, else pGPU.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .model import Gpu, NodeInventory
from .sharing import COUNTED_RESOURCE
from .telemetry import ContainerDevices, ContainerRef, GpuSample, NodeTelemetry

PGPU, VGPU, MPS = "pGPU", "vGPU", "MPS"
KINDS = (PGPU, VGPU, MPS)
_RANK = {PGPU: 0, VGPU: 1, MPS: 2}

# resource name -> kind; extended with --resource-kind NAME=KIND
DEFAULT_RESOURCE_KINDS: dict[str, str] = {
    "metax-tech.com/gpu": PGPU,
    "metax-tech.com/sgpu": VGPU,
    "metax-tech.com/vcore": VGPU,
    "metax-tech.com/vmemory": VGPU,
    "nvidia.com/gpu": PGPU,
    "nvidia.com/mps-core": MPS,
    "tencent.com/vcuda-core": VGPU,
    "tencent.com/vcuda-memory": VGPU,
}
# the resources whose device ids are replicas of shared GPUs (the GPU is in the assignment)
SHARED_RESOURCES = frozenset(COUNTED_RESOURCE.values())


@dataclass(frozen=True)
class GpuUsage:
    gpu: Gpu
    kind: str
    sample: GpuSample | None  # None: the vendor tool did not report this GPU
    fault: str | None  # why the GPU is unhealthy; None when healthy
    holders: int  # containers holding a device on it


@dataclass(frozen=True)
class ContainerUsage:
    container: ContainerRef
    gpu: Gpu
    kind: str
    devices: int  # device IDs the container holds on this GPU (several VFs / shares)
    memory_used_bytes: int | None
    utilization_ratio: float | None
    utilization_exact: bool
    memory_exact: bool


@dataclass(frozen=True)
class NodeUsage:
    gpus: tuple[GpuUsage, ...] = ()
    containers: tuple[ContainerUsage, ...] = ()
    dropped_containers: int = 0  # (container, GPU) pairs left out by the cardinality cap
    unknown_devices: tuple[str, ...] = ()  # held device IDs that name no GPU of this node
    problems: tuple[str, ...] = field(default_factory=tuple)


def device_index(inventory: NodeInventory) -> dict[str, int]:
    """Device ID -> GPU index: PCI addresses of GPUs and their VFs, and GPU UUIDs
    (lower case). IDs of other device plugins (``<uuid>::<n>`` replicas) resolve
    through ``gpu_of``."""
    index: dict[str, int] = {}
    for gpu in inventory.gpus:
        index[gpu.pci_address.lower()] = gpu.index
        for vf in gpu.sriov.vf_addresses:
            index[vf.lower()] = gpu.index
        if gpu.uuid:
            index[gpu.uuid.lower()] = gpu.index
    return index


def gpu_of(device_id: str, index: Mapping[str, int]) -> int | None:
    key = device_id.strip().lower()
    if key in index:
        return index[key]
    base = key.split("::", 1)[0]  # time-sliced / MPS replicas: <uuid>::<n>
    return index.get(base)


def holding_kind(resource: str, device_id: str, inventory: NodeInventory,
                 resource_kinds: Mapping[str, str]) -> str:
    kind = resource_kinds.get(resource, PGPU)
    if kind == PGPU:
        key = device_id.strip().lower()
        if any(key == vf.lower() for g in inventory.gpus for vf in g.sriov.vf_addresses):
            return VGPU
    return kind


def attribute(
    inventory: NodeInventory,
    telemetry: NodeTelemetry,
    holdings: Sequence[ContainerDevices],
    owners: Mapping[int, ContainerRef | None] | None,
    health: Mapping[int, str | None],
    *,
    resource_kinds: Mapping[str, str] = DEFAULT_RESOURCE_KINDS,
    max_containers: int = 1024,
    assigned: Mapping[tuple[str, str], Sequence[int]] | None = None,
) -> NodeUsage:
    """Per-GPU and per-(container, GPU) usage; see the module doc for the rules.
    ``assigned``: (namespace, pod) -> GPU indexes of the pods on shared GPUs."""
    index = device_index(inventory)
    present = {gpu.index for gpu in inventory.gpus}
    by_gpu: dict[int, dict[ContainerRef, tuple[str, int]]] = {}
    unknown: list[str] = []

    def hold(position: int, container: ContainerRef, kind: str, count: int) -> None:
        held = by_gpu.setdefault(position, {})
        old_kind, old_count = held.get(container, (PGPU, 0))
        strongest = kind if _RANK[kind] >= _RANK[old_kind] else old_kind
        held[container] = (strongest, old_count + count)

    for holding in holdings:
        if holding.resource in SHARED_RESOURCES:
            ref = holding.container
            targets = sorted(g for g in (assigned or {}).get((ref.namespace, ref.pod), ())
                             if g in present)
            if not targets:
                unknown.extend(holding.device_ids)
                continue
            kind = resource_kinds.get(holding.resource, PGPU)
            share, extra = divmod(len(holding.device_ids), len(targets))
            for n, target in enumerate(targets):
                hold(target, ref, kind, share + (1 if n < extra else 0))
            continue
        for device_id in holding.device_ids:
            found = gpu_of(device_id, index)
            if found is None:
                unknown.append(device_id)
                continue
            kind = holding_kind(holding.resource, device_id, inventory, resource_kinds)
            hold(found, holding.container, kind, 1)

    gpus: list[GpuUsage] = []
    containers: list[ContainerUsage] = []
    for gpu in inventory.gpus:
        held = by_gpu.get(gpu.index, {})
        kind = VGPU if gpu.sriov.num_vfs > 0 else PGPU
        for holder_kind, _ in held.values():
            if _RANK[holder_kind] > _RANK[kind]:
                kind = holder_kind
        sample = telemetry.gpu(gpu.pci_address)
        gpus.append(GpuUsage(gpu, kind, sample, health.get(gpu.index), len(held)))
        containers.extend(_containers_on(gpu, sample, telemetry, held, owners))

    containers.sort(key=lambda c: (c.container, c.gpu.index))
    dropped = max(0, len(containers) - max_containers)
    return NodeUsage(
        gpus=tuple(gpus),
        containers=tuple(containers[:max_containers]),
        dropped_containers=dropped,
        unknown_devices=tuple(sorted(set(unknown))),
    )


def _containers_on(
    gpu: Gpu,
    sample: GpuSample | None,
    telemetry: NodeTelemetry,
    held: Mapping[ContainerRef, tuple[str, int]],
    owners: Mapping[int, ContainerRef | None] | None,
) -> list[ContainerUsage]:
    if not held:
        return []
    sole = len(held) == 1
    procs = None
    if telemetry.processes is not None and owners is not None:
        procs = [p for p in telemetry.processes if p.address == gpu.pci_address]
    mine: dict[ContainerRef, list[int]] = {c: [] for c in held}  # indices into procs
    if procs is not None:
        for n, proc in enumerate(procs):
            owner = owners.get(proc.pid) if owners is not None else None
            if owner in mine:
                mine[owner].append(n)
            elif sole and owner is None:
                # not in any container we know: on a GPU held by one container only
                mine[next(iter(held))].append(n)
    active = [c for c in held if mine[c]]
    gpu_util = sample.utilization_ratio if sample else None
    out: list[ContainerUsage] = []
    for container, (kind, devices) in sorted(held.items()):
        memory: int | None
        util: float | None
        if procs is None:
            memory = sample.memory_used_bytes if (sole and sample) else None
            util = gpu_util if sole else None
            out.append(ContainerUsage(container, gpu, kind, devices, memory, util,
                                      utilization_exact=sole and util is not None,
                                      memory_exact=False))
            continue
        own = [procs[n] for n in mine[container]]
        sizes = [p.memory_bytes for p in own]
        memory = sum(s for s in sizes if s is not None) if all(
            s is not None for s in sizes) else None
        per_process = [p.utilization_ratio for p in own]
        if own and all(u is not None for u in per_process):
            util = min(1.0, sum(u for u in per_process if u is not None))
            exact = True
        elif not own and procs and all(p.utilization_ratio is not None for p in procs):
            util, exact = 0.0, True  # per-process data exists and none of it is ours
        elif sole:
            util, exact = gpu_util, gpu_util is not None
        else:
            util = None if gpu_util is None else (gpu_util / len(active) if own else 0.0)
            exact = False
        out.append(ContainerUsage(container, gpu, kind, devices, memory, util,
                                  utilization_exact=exact, memory_exact=memory is not None))
    return out
