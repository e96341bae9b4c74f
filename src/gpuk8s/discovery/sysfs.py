"""PCI devices as the kernel shows them in sysfs, under a host root.

Reads only ``<root>/sys/bus/pci/devices/*`` and what those links resolve to: ids,
class, NUMA node, SR-IOV attributes, ``virtfn*``/``physfn`` links, the ``driver`` link
and the resolved device path (which gives the PCIe hierarchy). Every read tolerates
missing or unreadable files: a field it cannot read stays ``None`` and the reason is
collected in ``PciScan.problems``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from ..core.model import Sriov, SriovState
from .tools import host_path

BDF_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
PCI_DEVICES = "/sys/bus/pci/devices"


@dataclass(frozen=True)
class PciDevice:
    address: str  # BDF, e.g. 0000:03:00.0
    vendor_id: int | None
    device_id: int | None
    class_code: int | None  # 24-bit: base class, subclass, prog-if
    numa_node: int | None
    path: str  # resolved sysfs path (under the root)
    ancestors: tuple[str, ...]  # bridge BDFs from the root port down to the parent
    driver: str | None  # name of the bound driver, None when unbound
    is_virtfn: bool  # a virtual function (has a physfn link)
    sriov: Sriov

    @property
    def base_class(self) -> int | None:
        return None if self.class_code is None else self.class_code >> 16

    @property
    def pcie_switch(self) -> str | None:
        """Upstream port of the switch the device hangs off, None under a root port.

        Path shape: root port / switch upstream / switch downstream / device. The
        device's parent is then a downstream port and its grandparent the upstream
        port, which identifies the switch (all its downstream ports share it).
        """
        if len(self.ancestors) >= 3:
            return self.ancestors[-2]
        return None

    @property
    def pcie_root(self) -> str | None:
        """The PCIe root complex (host bridge) above the device, as sysfs names it
        (``pci0000:00``): the first directory under ``/sys/devices`` on its path, the value
        of Kubernetes' standard DRA attribute ``resource.kubernetes.io/pcieRoot``."""
        parts = self.path.split(os.sep)
        for before, part in zip(parts, parts[1:]):
            if before == "devices" and part.startswith("pci") and not BDF_RE.match(part):
                return part
        return None


@dataclass
class PciScan:
    devices: list[PciDevice] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return None


def read_int(path: str, base: int = 10) -> int | None:
    text = read_text(path)
    if text is None:
        return None
    try:
        return int(text, base)
    except ValueError:
        return None


def _link_name(path: str) -> str | None:
    try:
        return os.path.basename(os.readlink(path))
    except OSError:
        return None


def _ancestors(resolved: str) -> tuple[str, ...]:
    parts = resolved.split(os.sep)
    chain: list[str] = []
    for part in parts[:-1]:
        if part.startswith("pci") and not BDF_RE.match(part):
            chain = []  # a host bridge (pci0000:00) starts the hierarchy
        elif BDF_RE.match(part):
            chain.append(part)
    return tuple(chain)


NUMVFS = "sriov_numvfs"  # the one place that names the attribute (read here, written by host.vf)


def numvfs_path(root: str, address: str) -> str:
    """The ``sriov_numvfs`` attribute of PCI function ``address`` under ``root``."""
    return host_path(root, f"{PCI_DEVICES}/{address}/{NUMVFS}")


def read_numvfs(root: str, address: str) -> int | None:
    """The VF count the kernel reports for ``address`` (None: no SR-IOV / unreadable)."""
    return read_int(numvfs_path(root, address))


def read_sriov(device_dir: str) -> Sriov:
    """SR-IOV state from the generic kernel ABI (``sriov_totalvfs`` and friends)."""
    total = read_int(os.path.join(device_dir, "sriov_totalvfs"))
    if not total:
        return Sriov(state=SriovState.FORBIDDEN)
    num = read_int(os.path.join(device_dir, NUMVFS)) or 0
    vfs: list[tuple[int, str]] = []
    try:
        entries = os.listdir(device_dir)
    except OSError:
        entries = []
    for entry in entries:
        match = re.fullmatch(r"virtfn(\d+)", entry)
        if match:
            target = _link_name(os.path.join(device_dir, entry))
            if target:
                vfs.append((int(match.group(1)), target))
    addresses = tuple(addr for _, addr in sorted(vfs))
    state = SriovState.ON if num > 0 else SriovState.OFF
    return Sriov(state=state, total_vfs=total, num_vfs=num, vf_addresses=addresses)


def read_device(root: str, address: str) -> PciDevice:
    link = host_path(root, f"{PCI_DEVICES}/{address}")
    resolved = os.path.realpath(link)
    return PciDevice(
        address=address,
        vendor_id=read_int(os.path.join(link, "vendor"), 16),
        device_id=read_int(os.path.join(link, "device"), 16),
        class_code=read_int(os.path.join(link, "class"), 16),
        numa_node=_numa(read_int(os.path.join(link, "numa_node"))),
        path=resolved,
        ancestors=_ancestors(resolved),
        driver=_link_name(os.path.join(link, "driver")),
        is_virtfn=os.path.islink(os.path.join(link, "physfn")),
        sriov=read_sriov(link),
    )


def _numa(value: int | None) -> int | None:
    return None if value is None or value < 0 else value


def scan(root: str) -> PciScan:
    """Every PCI device under ``<root>/sys/bus/pci/devices``, sorted by address."""
    result = PciScan()
    base = host_path(root, PCI_DEVICES)
    try:
        names = sorted(os.listdir(base))
    except OSError as err:
        result.problems.append(f"cannot list {PCI_DEVICES}: {err.strerror or err}")
        return result
    for name in names:
        address = name.lower()
        if not BDF_RE.match(address):
            continue
        device = read_device(root, name)
        if device.vendor_id is None or device.class_code is None:
            result.problems.append(f"PCI device {address}: vendor or class unreadable")
        result.devices.append(device)
    return result


def device_present(root: str, address: str) -> bool:
    """Whether the device is still on the bus (its sysfs entry exists)."""
    return os.path.exists(host_path(root, f"{PCI_DEVICES}/{address}"))


def bound_driver(root: str, address: str) -> str | None:
    return _link_name(host_path(root, f"{PCI_DEVICES}/{address}/driver"))


def drm_nodes(directory: str) -> tuple[list[str], list[str]]:
    """``card*`` and ``renderD*`` entries of a sysfs ``drm`` directory."""
    try:
        entries = os.listdir(directory)
    except OSError:
        return [], []
    cards = sorted((e for e in entries if re.fullmatch(r"card\d+", e)), key=_num)
    renders = sorted((e for e in entries if re.fullmatch(r"renderD\d+", e)), key=_num)
    return cards, renders


def _num(name: str) -> int:
    return int(re.sub(r"\D", "", name))
