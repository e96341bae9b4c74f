"""The GPU model: what a node has, independent of how it was discovered.

Pure data, stdlib only. Discovery (``gpuk8s.discovery``) builds these objects from a
host root; everything else (allocator, labels, scoring, services, Ansible modules)
consumes them.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .cuda import CudaVersion
from .errors import InventoryError

METAX_VENDOR_ID = 0x9999
NVIDIA_VENDOR_ID = 0x10DE


class LinkKind(enum.IntEnum):
    """Affinity of a pair of devices, higher is better.

    ``SELF`` is the pair of two virtual functions of one physical GPU; ``MX`` is a
    vendor high-speed link (MetaXLink, or NVLink on NVIDIA nodes); ``PIX`` a shared
    PCIe switch; ``NODE`` the same NUMA node; ``SYS`` anything else.
    """

    SYS = 0
    NODE = 1
    PIX = 2
    MX = 3
    SELF = 4

    @property
    def label(self) -> str:
        return self.name if self is not LinkKind.SELF else "X"


class _StrValue(str, enum.Enum):
    """``enum.StrEnum`` (3.11) for Python 3.8: str() and format() give the value."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class SriovState(_StrValue):
    """SR-IOV state as published in the ``gpu.sriov`` label."""

    ON = "on"  # virtual functions are configured
    OFF = "off"  # capable, but no VF configured
    FORBIDDEN = "forbidden"  # the device (or its driver) cannot do SR-IOV


class DriverMode(_StrValue):
    NATIVE = "native"  # maintained on the host by the administrator
    CLOUD = "cloud"  # installed and managed by a container (operator scheme)


@dataclass(frozen=True)
class Sriov:
    state: SriovState = SriovState.FORBIDDEN
    total_vfs: int = 0
    num_vfs: int = 0
    vf_addresses: tuple[str, ...] = ()
    # device nodes of each VF, parallel to vf_addresses (e.g. ("/dev/dri/card9", ...))
    vf_device_nodes: tuple[tuple[str, ...], ...] = ()


@dataclass(frozen=True)
class Gpu:
    """One physical GPU."""

    index: int
    pci_address: str
    vendor: str  # "metax" | "nvidia"
    vendor_id: int
    device_id: int
    product: str
    family: str = ""
    memory_mib: int | None = None
    serial: str | None = None
    uuid: str | None = None
    numa_node: int | None = None
    pcie_switch: str | None = None  # PCI address of the upstream switch port
    pcie_root: str | None = None  # PCIe root complex, sysfs name (pci0000:00)
    link_group: int | None = None  # MetaXLink / NVLink group id (None: no links)
    sriov: Sriov = field(default_factory=Sriov)
    device_nodes: tuple[str, ...] = ()  # e.g. /dev/dri/card1, /dev/dri/renderD129
    driver_bound: bool = False
    fault: str | None = None  # reason reported by the vendor tool, None when fine
    name: str | None = None  # the vendor tool's full name ("NVIDIA H100 80GB HBM3")
    # NVIDIA: CUDA compute capability (major, minor), e.g. (9, 0) for an H100
    compute_capability: tuple[int, int] | None = None
    # PCI class code (sysfs ``class``, 24 bits): 0x030200 a 3D controller, 0x030000 a VGA
    # controller; None where it could not be read
    pci_class: int | None = None

    @property
    def stable_id(self) -> str:
        """The name that outlives a discovery pass (``stable_gpu_id``)."""
        return stable_gpu_id(self.uuid, self.pci_address)

    @property
    def memory_label(self) -> str | None:
        """Memory as the ``gpu.memory`` label shows it (``64GB``)."""
        if self.memory_mib is None:
            return None
        gib = self.memory_mib / 1024
        return f"{round(gib)}GB"


@dataclass(frozen=True)
class DriverInfo:
    loaded: bool = False
    version: str | None = None
    mode: DriverMode = DriverMode.NATIVE
    cuda: CudaVersion | None = None  # NVIDIA: the newest CUDA the driver supports

    @property
    def version_parts(self) -> tuple[int, int, int] | None:
        """(major, minor, patch) parsed from ``version``; None when unparsable."""
        if not self.version:
            return None
        parts: list[int] = []
        for raw in self.version.replace("-", ".").split(".")[:3]:
            digits = "".join(ch for ch in raw if ch.isdigit())
            if not digits:
                return None
            parts.append(int(digits))
        while len(parts) < 3:
            parts.append(0)
        return parts[0], parts[1], parts[2]


@dataclass(frozen=True)
class SdkInfo:
    version: str | None = None
    path: str | None = None


@dataclass(frozen=True)
class NodeInventory:
    """Everything discovery knows about one node's GPUs."""

    backend: str  # "metax" | "nvidia" | "none"
    gpus: tuple[Gpu, ...] = ()
    driver: DriverInfo = field(default_factory=DriverInfo)
    sdk: SdkInfo = field(default_factory=SdkInfo)
    # pairs of GPU indices joined by a vendor link (MetaXLink / NVLink)
    links: frozenset[frozenset[int]] = frozenset()
    control_devices: tuple[str, ...] = ()  # e.g. /dev/mxcd
    problems: tuple[str, ...] = ()  # why the inventory is partial, one line each

    def __post_init__(self) -> None:
        seen: set[int] = set()
        for gpu in self.gpus:
            if gpu.index in seen:
                raise InventoryError(f"duplicate GPU index {gpu.index}")
            seen.add(gpu.index)
        for pair in self.links:
            if len(pair) != 2 or not pair <= seen:
                raise InventoryError(f"link {sorted(pair)} names unknown GPU indices")

    @property
    def has_gpus(self) -> bool:
        return bool(self.gpus)

    def gpu(self, index: int) -> Gpu:
        for gpu in self.gpus:
            if gpu.index == index:
                return gpu
        raise InventoryError(f"no GPU with index {index}")

    def index_by_id(self) -> dict[str, int]:
        """Stable id (UUID and PCI address) -> index now (``index_by_id``)."""
        return index_by_id((g.index, g.uuid, g.pci_address) for g in self.gpus)

    def with_problem(self, problem: str) -> NodeInventory:
        return replace(self, problems=(*self.problems, problem))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view, stable key names (used by `gpuk8s detect --json`)."""
        return {
            "backend": self.backend,
            "driver": {
                "loaded": self.driver.loaded,
                "version": self.driver.version,
                "mode": str(self.driver.mode),
                "cuda": None if self.driver.cuda is None else str(self.driver.cuda),
            },
            "sdk": {"version": self.sdk.version, "path": self.sdk.path},
            "control_devices": list(self.control_devices),
            "links": sorted(sorted(p) for p in self.links),
            "problems": list(self.problems),
            "gpus": [gpu_to_dict(g) for g in self.gpus],
        }


def stable_gpu_id(uuid: str | None, pci_address: str) -> str:
    """What names a physical GPU in records that outlive a discovery pass: its UUID,
    else (no UUID reported) its PCI address. Indexes are for display only: discovery
    numbers GPUs in PCI order, so when one leaves the bus the GPUs above it move down."""
    return uuid or pci_address


def index_by_id(gpus: Iterable[tuple[int, str | None, str]]) -> dict[str, int]:
    """(index, UUID or None, PCI address) of each GPU present -> stable id -> index
    now. Both the UUID and the PCI address are keys, so a record written while a GPU
    reported no UUID still finds it once it does."""
    out: dict[str, int] = {}
    for index, uuid, pci in gpus:
        out.setdefault(pci, index)
        if uuid:
            out[uuid] = index
    return out


def indexes_now(
    ids: Sequence[str], recorded: Sequence[int], index_by_id: Mapping[str, int] | None
) -> tuple[int, ...]:
    """The indexes now of the GPUs a record names by stable ``ids`` (``index_by_id``
    of the current discovery), leaving out a GPU not present now (off the bus). A record
    without ids (written before them), or no map at hand: its ``recorded`` indexes, as
    they are -- after a loss they may name the neighbour of the GPU meant."""
    if not ids or index_by_id is None:
        return tuple(recorded)
    return tuple(index_by_id[i] for i in ids if i in index_by_id)


def gpu_to_dict(gpu: Gpu) -> dict[str, Any]:
    return {
        "index": gpu.index,
        "pci_address": gpu.pci_address,
        "vendor": gpu.vendor,
        "vendor_id": f"0x{gpu.vendor_id:04x}",
        "device_id": f"0x{gpu.device_id:04x}",
        "product": gpu.product,
        "family": gpu.family,
        "memory_mib": gpu.memory_mib,
        "serial": gpu.serial,
        "uuid": gpu.uuid,
        "numa_node": gpu.numa_node,
        "pcie_switch": gpu.pcie_switch,
        "pcie_root": gpu.pcie_root,
        "link_group": gpu.link_group,
        "sriov": {
            "state": str(gpu.sriov.state),
            "total_vfs": gpu.sriov.total_vfs,
            "num_vfs": gpu.sriov.num_vfs,
            "vf_addresses": list(gpu.sriov.vf_addresses),
            "vf_device_nodes": [list(nodes) for nodes in gpu.sriov.vf_device_nodes],
        },
        "device_nodes": list(gpu.device_nodes),
        "driver_bound": gpu.driver_bound,
        "fault": gpu.fault,
        "name": gpu.name,
        "compute_capability": None if gpu.compute_capability is None
        else "{}.{}".format(*gpu.compute_capability),
        "pci_class": None if gpu.pci_class is None else f"0x{gpu.pci_class:06x}",
    }
