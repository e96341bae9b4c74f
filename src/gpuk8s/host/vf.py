"""SR-IOV virtual functions per GPU: plan (pure), apply, read back. The one implementation,
used by the Ansible module ``gpu_vfnum`` and by driver-manager (``driver-config`` vfnum).

The kernel ABI (REFERENCE §A): a physical function exposes ``sriov_totalvfs`` (read only)
and ``sriov_numvfs``; changing a non-zero count needs a write of ``0`` first (the kernel
refuses N -> M with EBUSY). The attribute is read in one place (``discovery.sysfs``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..core.errors import ConfigError, GpuK8sError
from ..core.model import Gpu, NodeInventory
from ..core.vfconfig import ALLOWED_VFNUMS
from ..discovery import discover
from ..discovery.sysfs import numvfs_path, read_numvfs
from ..discovery.tools import Runner
from .driver import expand

ALLOWED = ALLOWED_VFNUMS


class VfError(GpuK8sError):
    """The VF count could not be applied."""


@dataclass(frozen=True)
class VfStep:
    """Write ``value`` to the ``sriov_numvfs`` of GPU ``address``."""

    index: int
    address: str
    value: int


@dataclass(frozen=True)
class VfPlan:
    vfnum: int
    targets: tuple[Gpu, ...]
    steps: tuple[VfStep, ...]
    before: dict[str, int]  # address -> current VF count
    after: dict[str, int]  # address -> VF count once applied

    @property
    def changed(self) -> bool:
        return bool(self.steps)


def select(inventory: NodeInventory, gpus: Sequence[str] | None) -> tuple[Gpu, ...]:
    """GPUs named by PCI address or index (all GPUs when ``gpus`` is empty)."""
    if not inventory.gpus:
        raise ConfigError("this host has no vendor GPU: nothing to set vfnum on")
    if not gpus:
        return tuple(sorted(inventory.gpus, key=lambda g: g.index))
    by_address = {g.pci_address: g for g in inventory.gpus}
    chosen: list[Gpu] = []
    for token in gpus:
        key = str(token).strip().lower()
        if key in by_address:
            chosen.append(by_address[key])
        elif key.isdigit() and any(g.index == int(key) for g in inventory.gpus):
            chosen.append(inventory.gpu(int(key)))
        else:
            known = ", ".join(f"{g.index}={g.pci_address}" for g in inventory.gpus)
            raise ConfigError(f"gpus: {token!r} is not a GPU index or PCI address of this host "
                              f"({known})")
    return tuple(dict.fromkeys(chosen))


def plan(inventory: NodeInventory, vfnum: int, gpus: Sequence[str] | None = None) -> VfPlan:
    """The writes that give every selected GPU ``vfnum`` VFs (ConfigError if impossible)."""
    if vfnum not in ALLOWED:
        raise ConfigError(
            f"vfnum {vfnum} is not allowed: choose one of {', '.join(map(str, ALLOWED))}"
        )
    targets = select(inventory, gpus)
    steps: list[VfStep] = []
    for gpu in targets:
        total = gpu.sriov.total_vfs
        if vfnum > 0 and total == 0:
            raise ConfigError(
                f"vfnum {vfnum}: GPU {gpu.index} ({gpu.pci_address}, {gpu.product}) has no "
                "SR-IOV (sriov_totalvfs is 0 or missing); allowed: 0"
            )
        if vfnum > total:
            allowed = ", ".join(str(v) for v in ALLOWED if v <= total)
            raise ConfigError(
                f"vfnum {vfnum} exceeds sriov_totalvfs {total} of GPU {gpu.index} "
                f"({gpu.pci_address}); allowed: {allowed}"
            )
    for gpu in targets:
        current = gpu.sriov.num_vfs
        if current == vfnum:
            continue
        if current != 0:
            steps.append(VfStep(gpu.index, gpu.pci_address, 0))
        if vfnum != 0:
            steps.append(VfStep(gpu.index, gpu.pci_address, vfnum))
    before = {g.pci_address: g.sriov.num_vfs for g in targets}
    return VfPlan(vfnum, targets, tuple(steps), before, {g.pci_address: vfnum for g in targets})


def write_numvfs(root: str, step: VfStep) -> None:
    path = numvfs_path(root, step.address)
    try:
        # sysfs attribute: one write() of the whole value, no temp file / rename possible
        with open(path, "w", encoding="ascii") as handle:
            handle.write(f"{step.value}\n")
    except OSError as err:
        raise VfError(
            f"writing {step.value} to {path} failed: {err.strerror or err} (is the SR-IOV "
            "driver, e.g. mxgvm, loaded?)"
        ) from err


@dataclass(frozen=True)
class VfResult:
    after: dict[str, int | None]  # address -> VF count read back
    vf_addresses: dict[str, list[str]]  # address -> its VFs' PCI addresses
    warnings: tuple[str, ...] = ()


def apply(root: str, vf_plan: VfPlan, runner: Runner,
          command: Sequence[str] | None = None) -> VfResult:
    """Do the writes (sysfs, or ``command`` with ``{address}``, ``{index}``, ``{vfnum}``,
    ``{host_root}``), then read back; VfError when the kernel did not take the count."""
    for step in vf_plan.steps:
        if command:
            argv = expand(list(command), address=step.address, index=str(step.index),
                          vfnum=str(step.value), host_root=root)
            rc, out, err = runner(argv)
            if rc != 0:
                raise VfError(f"{' '.join(argv)} exited with {rc}: {(err or out).strip()}")
        else:
            write_numvfs(root, step)
    return read_back(root, vf_plan)


def read_back(root: str, vf_plan: VfPlan) -> VfResult:
    seen = {g.pci_address: g for g in discover(root).gpus}
    after = {a: read_numvfs(root, a) for a in vf_plan.after}
    vf_addresses = {a: list(seen[a].sriov.vf_addresses) if a in seen else [] for a in vf_plan.after}
    wrong = {a: n for a, n in after.items() if n != vf_plan.vfnum}
    if wrong:
        raise VfError(
            f"sriov_numvfs reads back {wrong} after writing {vf_plan.vfnum}: the driver rejected "
            "the change (check dmesg)"
        )
    warnings = tuple(
        f"{address}: sriov_numvfs is {vf_plan.vfnum} but {len(addresses)} virtfn link(s) exist"
        for address, addresses in vf_addresses.items() if len(addresses) != vf_plan.vfnum
    )
    return VfResult(dict(after), vf_addresses, warnings)
