"""The node's allocatable devices: identity, health, preferred allocation, Allocate specs.

This object knows the devices; the gRPC servicer (``grpcapi``) is thin glue around it.
It never talks gRPC or Kubernetes and holds no global state: tests drive it directly.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ...core.allocator import Allocation, allocate
from ...core.cdi import (
    CDI_ANNOTATION,
    DEFAULT_SDK_PATHS,
    VISIBLE_ENV,
    ContainerEdits,
    SdkSource,
    edits_for_units,
    qualified,
    sdk_edits,
    visible_value,
)
from ...core.devicelist import MAX_ID_LENGTH, DeviceEntry
from ...core.errors import AllocationError, ConfigError
from ...core.model import Gpu, NodeInventory
from ...core.topology import Topology, Unit, units_for_inventory

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"

VISIBLE_DEVICES_MODES = ("auto", "container", "host", "uuid", "none")
DEFAULT_RESOURCE = {"metax": "metax-tech.com/gpu", "nvidia": "nvidia.com/gpu"}


class UnknownDeviceError(AllocationError):
    """A request names a device id this plugin does not advertise."""


class UnhealthyDeviceError(AllocationError):
    """A request names a device that is currently Unhealthy."""


@dataclass(frozen=True)
class AllocateOptions:
    """How Allocate describes a device to the container runtime.

    ``device_path_prefix`` turns a root-relative path (``/dev/dri/card1`` as
    discovery reports it) into the path on the kubelet's host: ``""`` when the host
    root is the real ``/`` (also in the DaemonSet, where the host is mounted at
    ``/host`` but the kubelet needs ``/dev/...``), the simulator root in the lab.
    It applies to device nodes and to the SDK mounts.
    """

    device_path_prefix: str = ""
    visible_devices: str = "auto"
    mount_sdk: bool = False
    sdk_paths: tuple[str, ...] | None = None  # None: the backend's defaults
    cdi: bool = False
    cdi_kind: str = ""  # "" : the resource name
    cdi_annotation: bool = False  # without CDI names: cdi.k8s.io/gpuk8s for the wrapper

    def __post_init__(self) -> None:
        if self.visible_devices not in VISIBLE_DEVICES_MODES:
            raise ConfigError(
                f"visible-devices: {self.visible_devices!r} is not one of "
                f"{', '.join(VISIBLE_DEVICES_MODES)}"
            )
        if self.device_path_prefix and not self.device_path_prefix.startswith("/"):
            raise ConfigError(
                f"device-path-prefix: {self.device_path_prefix!r} must be an absolute path or empty"
            )
        for path in self.sdk_paths or ():
            if not path.startswith("/"):
                raise ConfigError(f"sdk-path: {path!r} must be an absolute path")


@dataclass
class ContainerSpec:
    """What one container gets (mirrors ContainerAllocateResponse)."""

    envs: dict[str, str] = field(default_factory=dict)
    mounts: list[tuple[str, str, bool]] = field(default_factory=list)  # (ctr, host, ro)
    devices: list[tuple[str, str, str]] = field(default_factory=list)  # (ctr, host, perms)
    cdi_devices: list[str] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)

    def add_edits(self, edits: ContainerEdits) -> None:
        """Device nodes, mounts and environment of ``edits`` (``core.cdi``); env
        already set here wins."""
        for node in edits.device_nodes:
            self.devices.append((node.path, node.host_path, node.permissions))
        for mount in edits.mounts:
            self.mounts.append((mount.container_path, mount.host_path, mount.read_only))
        for name, val in edits.env_map().items():
            self.envs.setdefault(name, val)


@dataclass(frozen=True)
class DeviceView:
    """One device as ListAndWatch advertises it."""

    id: str
    healthy: bool
    numa: int | None


class DeviceSet:
    """Units of one node (GPUs, or VFs when configured) with their current health."""

    def __init__(
        self,
        inventory: NodeInventory,
        resource_name: str,
        options: AllocateOptions | None = None,
    ) -> None:
        self.inventory = inventory
        self.resource_name = resource_name
        self.options = options or AllocateOptions()
        self.units: tuple[Unit, ...] = tuple(units_for_inventory(inventory))
        for unit in self.units:
            if len(unit.id) > MAX_ID_LENGTH:
                raise ConfigError(f"device id {unit.id!r} is longer than {MAX_ID_LENGTH}")
        self.topology = Topology.from_inventory(inventory, self.units)
        self._by_id: dict[str, Unit] = {u.id: u for u in self.units}
        self._gpus: dict[int, Gpu] = {g.index: g for g in inventory.gpus}
        self._reasons: dict[str, str | None] = {u.id: None for u in self.units}
        self._version = 0
        self._cond = threading.Condition()

    # -- identity -----------------------------------------------------------
    def __len__(self) -> int:
        return len(self.units)

    @property
    def backend(self) -> str:
        return self.inventory.backend

    def unit(self, device_id: str) -> Unit:
        try:
            return self._by_id[device_id]
        except KeyError:
            raise UnknownDeviceError(
                f"unknown device id {device_id!r} for {self.resource_name}"
            ) from None

    def gpu_of(self, unit: Unit) -> Gpu:
        return self._gpus[unit.gpu]

    # -- health -------------------------------------------------------------
    @property
    def version(self) -> int:
        with self._cond:
            return self._version

    def update_health(self, gpu_reasons: Mapping[int, str | None]) -> list[str]:
        """Apply a health check result (GPU index -> reason, None = healthy).

        A VF shares the health of its GPU. GPUs absent from the mapping keep their
        state. Returns the ids whose health flipped; the version moves (and watchers
        wake) only when that list is not empty.
        """
        flipped: list[str] = []
        with self._cond:
            for unit in self.units:
                if unit.gpu not in gpu_reasons:
                    continue
                reason = gpu_reasons[unit.gpu]
                before = self._reasons[unit.id]
                if (before is None) != (reason is None):
                    flipped.append(unit.id)
                self._reasons[unit.id] = reason
            if flipped:
                self._version += 1
                self._cond.notify_all()
        return flipped

    def reason(self, device_id: str) -> str | None:
        with self._cond:
            return self._reasons[self.unit(device_id).id]

    def snapshot(self) -> tuple[int, list[DeviceView]]:
        with self._cond:
            views = [
                DeviceView(u.id, self._reasons[u.id] is None, self.gpu_of(u).numa_node)
                for u in self.units
            ]
            return self._version, views

    def wait_for_change(self, version: int, timeout: float) -> int:
        """Block until the version differs from ``version`` or ``timeout`` passes."""
        with self._cond:
            self._cond.wait_for(lambda: self._version != version, timeout=timeout)
            return self._version

    def wake(self) -> None:
        """Wake every watcher without a change (used on shutdown)."""
        with self._cond:
            self._cond.notify_all()

    def healthy_ids(self) -> list[str]:
        with self._cond:
            return [u.id for u in self.units if self._reasons[u.id] is None]

    def entries(self, allocated: set[str]) -> list[DeviceEntry]:
        """The device-list annotation entries (see ``core.devicelist``)."""
        with self._cond:
            reasons = dict(self._reasons)
        out = []
        for unit in self.units:
            gpu = self.gpu_of(unit)
            out.append(
                DeviceEntry(
                    id=unit.id,
                    pci=gpu.pci_address,
                    gpu=gpu.index,
                    vf=unit.vf,
                    product=gpu.product,
                    numa=gpu.numa_node
                    if gpu.numa_node is not None and gpu.numa_node >= 0
                    else None,
                    group=gpu.link_group,
                    switch=gpu.pcie_switch,
                    healthy=reasons[unit.id] is None,
                    allocated=unit.id in allocated,
                    uuid=gpu.uuid,
                )
            )
        return out

    # -- allocation ---------------------------------------------------------
    def preferred(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> Allocation:
        """The allocator's choice of ``size`` ids out of the kubelet's available set.

        Devices that are Unhealthy now are never chosen, even when the kubelet (whose
        view of health may lag) offers them; a must-include one is kept (required)."""
        for device_id in [*available, *must_include]:
            self.unit(device_id)
        with self._cond:
            sick = [u.id for u in self.units if self._reasons[u.id] is not None]
        return allocate(
            self.topology, list(available), size, list(must_include), unhealthy=sick
        )

    def in_host_order(self, units: Sequence[Unit]) -> list[Unit]:
        return sorted(set(units), key=lambda u: self.topology.position[u.id])

    def device_env(self, units: Sequence[Unit]) -> dict[str, str]:
        """What a container holding ``units`` (in host order) learns of them: the vendor's
        visible-devices variable (``options.visible_devices``) and ``GPUK8S_DEVICE_IDS``."""
        env: dict[str, str] = {}
        name = VISIBLE_ENV.get(self.backend)
        value = visible_value(
            self.inventory, units, self.options.visible_devices, self.topology.position
        )
        if name and value is not None:
            env[name] = value
        env["GPUK8S_DEVICE_IDS"] = ",".join(u.id for u in units)
        return env

    def sdk_source(self) -> SdkSource | None:
        """The host SDK to mount (``options.mount_sdk``; the backend's default paths)."""
        opts = self.options
        if not opts.mount_sdk:
            return None
        paths = opts.sdk_paths if opts.sdk_paths is not None else DEFAULT_SDK_PATHS.get(
            self.backend, ())
        return SdkSource(paths=tuple(paths)) if paths else None

    def container_spec(self, device_ids: Sequence[str]) -> ContainerSpec:
        """What the runtime must give a container holding ``device_ids``.

        Raises ``UnknownDeviceError`` / ``UnhealthyDeviceError`` (nothing is
        allocated) for ids that are not advertised or not healthy.
        """
        if not device_ids:
            raise AllocationError("empty device list in an allocate request")
        units = [self.unit(d) for d in device_ids]
        with self._cond:
            sick = [(u.id, self._reasons[u.id]) for u in units if self._reasons[u.id] is not None]
        if sick:
            detail = "; ".join(f"{uid}: {why}" for uid, why in sick)
            raise UnhealthyDeviceError(f"unhealthy device(s) requested: {detail}")
        units = self.in_host_order(units)
        opts = self.options
        spec = ContainerSpec()
        spec.envs.update(self.device_env(units))
        sdk = self.sdk_source()
        if opts.cdi:
            kind = opts.cdi_kind or self.resource_name
            spec.cdi_devices = [qualified(kind, u.id) for u in units]
            edits = sdk_edits(sdk, opts.device_path_prefix) if sdk else ContainerEdits()
        else:
            edits = edits_for_units(self.inventory, units, opts.device_path_prefix, sdk)
            if opts.cdi_annotation:
                kind = opts.cdi_kind or self.resource_name
                spec.annotations[CDI_ANNOTATION] = ",".join(qualified(kind, u.id) for u in units)
        spec.add_edits(edits)
        return spec
