"""GPU load as the vendor tools report it, and who holds which GPU.

Pure data, stdlib only (Python 3.8+). Discovery fills ``NodeTelemetry`` from ``mx-smi``
or ``nvidia-smi`` (``gpuk8s.discovery``), the exporter's NVML reader fills the same
types from ``libnvidia-ml``; ``core.gpuusage`` attributes it to containers.

Units are the Prometheus base units the exporter publishes: bytes, watts, degrees
Celsius, and utilisation as a ratio 0..1 (the vendor tools print percent).
"""

from __future__ import annotations

from dataclasses import dataclass, field

MIB = 1024 * 1024


@dataclass(frozen=True)
class GpuSample:
    """One physical GPU at one moment; ``None`` where the tool gave no value."""

    address: str  # PCI address (sysfs form, ``0000:03:00.0``): the join key with NodeInventory
    utilization_ratio: float | None = None  # 0..1, share of time the GPU was busy
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    temperature_celsius: float | None = None
    power_watts: float | None = None
    ecc_corrected: int | None = None  # error counts since the driver loaded
    ecc_uncorrected: int | None = None


@dataclass(frozen=True)
class GpuProcess:
    """A process with a context on a GPU. ``pid`` is in the host's PID namespace."""

    pid: int
    address: str  # PCI address of the GPU
    memory_bytes: int | None = None
    # share of the GPU's time this process kept it busy, 0..1; None when the backend has
    # no per-process utilisation (mx-smi, nvidia-smi --query-compute-apps)
    utilization_ratio: float | None = None
    name: str = ""


@dataclass(frozen=True)
class NodeTelemetry:
    backend: str  # "metax" | "nvidia" | "none"
    source: str  # "mx-smi" | "nvidia-smi" | "nvml" | ""
    gpus: tuple[GpuSample, ...] = ()
    # None: the process list could not be read (not the same as "no process")
    processes: tuple[GpuProcess, ...] | None = None
    driver_version: str | None = None
    problems: tuple[str, ...] = ()

    def gpu(self, address: str) -> GpuSample | None:
        for sample in self.gpus:
            if sample.address == address:
                return sample
        return None

    @property
    def per_process_utilization(self) -> bool:
        return bool(self.processes) and all(
            p.utilization_ratio is not None for p in self.processes or ()
        )


@dataclass(frozen=True, order=True)
class ContainerRef:
    namespace: str
    pod: str
    container: str


@dataclass(frozen=True)
class ContainerDevices:
    """Devices of one resource held by one container (kubelet PodResources ``List``)."""

    container: ContainerRef
    resource: str
    device_ids: tuple[str, ...] = field(default_factory=tuple)


def percent_to_ratio(value: float | None) -> float | None:
    """Vendor percent (0..100) to a ratio, clamped; None stays None."""
    if value is None:
        return None
    return min(max(value, 0.0), 100.0) / 100.0
