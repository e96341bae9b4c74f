"""NVIDIA load through NVML (``nvidia-ml-py``, module ``pynvml``).

Returns the same ``core.telemetry`` types as discovery's ``nvidia-smi`` parser, plus
what only NVML has: per-process utilisation (``nvmlDeviceGetProcessUtilization``), which
makes the attribution of a shared GPU exact.

Why here and not in ``discovery``: discovery is stdlib-only (Ansible ships it to hosts),
and pynvml is a third-party package; the services layer may import it.

Finding the library: pynvml opens ``libnvidia-ml.so.1`` by soname. When the host is
mounted elsewhere (``/host`` in the DaemonSet) the host's library is loaded by its full
path from the usual directories under that root and handed to pynvml (``_bind``): by
soname, the dynamic loader would hand out whichever copy of that soname the process
loaded first (discovery's, another root's). pynvml keeps one library per process, so
one process reads one host at a time.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

from ...core.telemetry import GpuProcess, GpuSample, NodeTelemetry, percent_to_ratio
from ...discovery.nvidia import NVML_LIB_DIRS, NVML_SONAME, normalise_bus_id
from ...discovery.nvidia import nvml_library_path as library_path

SONAME = NVML_SONAME
LIB_DIRS = NVML_LIB_DIRS


def _bind(pynvml: Any, lib: ctypes.CDLL) -> None:
    """Make ``lib`` the library pynvml calls (its module-level ``nvmlLib``, and the
    function pointers it cached from another one dropped)."""
    current = getattr(pynvml, "nvmlLib", None)
    if current is not None and getattr(current, "_handle", None) == lib._handle:
        return
    pynvml.nvmlLib = lib
    cache = getattr(pynvml, "_nvmlGetFunctionPointer_cache", None)
    if isinstance(cache, dict):
        cache.clear()


class NvmlReader:
    """Reads every GPU NVML can open. ``read`` never raises: failures become problems."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._nvml: Any = None
        self._last_seen: dict[str, int] = {}  # bus id -> last process-utilisation timestamp
        self._error: str | None = None

    def _open(self) -> Any:
        if self._nvml is not None:
            return self._nvml
        import pynvml

        path = library_path(self.root)
        if path is None and os.path.realpath(self.root) != "/":
            raise RuntimeError(f"{SONAME} not found under {self.root} ({', '.join(LIB_DIRS)})")
        if path is not None:
            _bind(pynvml, ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL))
        pynvml.nvmlInit()
        self._nvml = pynvml
        return pynvml

    def read(self) -> NodeTelemetry:
        try:
            nvml = self._open()
        except Exception as err:  # NVMLError, OSError, missing library: report, retry later
            return NodeTelemetry("nvidia", "nvml", problems=(f"NVML unavailable: {err}",))
        problems: list[str] = []
        try:
            driver = _text(nvml.nvmlSystemGetDriverVersion())
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as err:
            return NodeTelemetry("nvidia", "nvml", problems=(f"NVML: {err}",))
        samples: list[GpuSample] = []
        processes: list[GpuProcess] | None = []
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                address = normalise_bus_id(_text(nvml.nvmlDeviceGetPciInfo(handle).busId))
            except nvml.NVMLError as err:
                problems.append(f"NVML GPU {index}: {err}")
                continue
            samples.append(self._sample(nvml, handle, address, problems))
            found = self._processes(nvml, handle, address, problems)
            if found is None:
                processes = None
            elif processes is not None:
                processes.extend(found)
        return NodeTelemetry(
            "nvidia", "nvml",
            gpus=tuple(sorted(samples, key=lambda s: s.address)),
            processes=None if processes is None else tuple(processes),
            driver_version=driver,
            problems=tuple(problems),
        )

    @staticmethod
    def _sample(nvml: Any, handle: Any, address: str, problems: list[str]) -> GpuSample:
        def get(what: str, call: Any, *args: Any) -> Any:
            try:
                return call(handle, *args)
            except nvml.NVMLError as err:
                if not isinstance(err, nvml.NVMLError_NotSupported):
                    problems.append(f"NVML {address} {what}: {err}")
                return None

        util = get("utilization", nvml.nvmlDeviceGetUtilizationRates)
        memory = get("memory", nvml.nvmlDeviceGetMemoryInfo)
        temp = get("temperature", nvml.nvmlDeviceGetTemperature, nvml.NVML_TEMPERATURE_GPU)
        power = get("power", nvml.nvmlDeviceGetPowerUsage)
        corrected = get("ecc", nvml.nvmlDeviceGetTotalEccErrors,
                        nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, nvml.NVML_VOLATILE_ECC)
        uncorrected = get("ecc", nvml.nvmlDeviceGetTotalEccErrors,
                          nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC)
        return GpuSample(
            address=address,
            utilization_ratio=None if util is None else percent_to_ratio(float(util.gpu)),
            memory_used_bytes=None if memory is None else int(memory.used),
            memory_total_bytes=None if memory is None else int(memory.total),
            temperature_celsius=None if temp is None else float(temp),
            power_watts=None if power is None else power / 1000.0,
            ecc_corrected=None if corrected is None else int(corrected),
            ecc_uncorrected=None if uncorrected is None else int(uncorrected),
        )

    def _processes(self, nvml: Any, handle: Any, address: str,
                   problems: list[str]) -> list[GpuProcess] | None:
        try:
            running = list(nvml.nvmlDeviceGetComputeRunningProcesses(handle))
        except nvml.NVMLError as err:
            problems.append(f"NVML {address} processes: {err}")
            return None
        clients: set[int] = set()
        try:  # under MPS the clients (the pods' processes) are listed separately
            seen = {int(p.pid) for p in running}
            listed = list(nvml.nvmlDeviceGetMPSComputeRunningProcesses(handle))
            clients = {int(p.pid) for p in listed}  # also in the compute list (driver 580)
            running += [p for p in listed if int(p.pid) not in seen]
        except nvml.NVMLError as err:
            if not isinstance(err, (nvml.NVMLError_NotSupported,
                                    nvml.NVMLError_FunctionNotFound)):
                problems.append(f"NVML {address} MPS processes: {err}")
        busy: dict[int, float] | None = {}
        try:
            samples = nvml.nvmlDeviceGetProcessUtilization(handle, self._last_seen.get(address, 0))
            for sample in samples:
                assert busy is not None
                busy[int(sample.pid)] = max(busy.get(int(sample.pid), 0.0), float(sample.smUtil))
                self._last_seen[address] = max(self._last_seen.get(address, 0),
                                               int(sample.timeStamp))
        except nvml.NVMLError_NotFound:
            pass  # no sample since the last read: nobody kept the GPU busy
        except nvml.NVMLError as err:
            if not isinstance(err, nvml.NVMLError_NotSupported):
                problems.append(f"NVML {address} process utilisation: {err}")
            busy = None
        # NVML books the SM time of MPS clients to the MPS server's pid (seen with driver
        # 580.159.04 on an H100: server 100 %, two busy clients 0 %): while no client has a
        # sample of its own, a client's share is unknown, not 0 -- attribution estimates it
        unmeasured = bool(clients) and busy is not None and not any(
            busy.get(pid, 0.0) > 0 for pid in clients)
        out = []
        for proc in running:
            used = proc.usedGpuMemory
            pid = int(proc.pid)
            out.append(GpuProcess(
                pid=pid,
                address=address,
                memory_bytes=None if used is None else int(used),
                utilization_ratio=None if busy is None or (unmeasured and pid in clients)
                else percent_to_ratio(busy.get(pid, 0.0)),
            ))
        return out


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
