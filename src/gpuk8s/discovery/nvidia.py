"""NVIDIA backend: PCI vendor 0x10de from sysfs, enriched by ``nvidia-smi`` when present.

Naming (our choice, stable): ``product`` is the short model (``H100``, ``A100``), from
the PCI device-id table or else the first word of nvidia-smi's name after ``NVIDIA``;
``family`` is ``NVIDIA-<architecture>`` (``NVIDIA-Hopper``), ``NVIDIA`` when unknown.
NVLink pairs come from ``nvidia-smi topo -m`` (``NV<n>`` cells), or where nvidia-smi does
not answer from NVML (``nvmlDeviceGetP2PStatus`` over NVLink, each pair of GPUs), and count
as ``MX`` links in the model. Device nodes are ``/dev/nvidia<minor>`` (minor from
``/proc/driver/nvidia/gpus/<bdf>/information``). The CUDA version the driver supports
comes from NVML (``nvmlSystemGetCudaDriverVersion_v2``, else the original call, through
``ctypes``, the host's
``libnvidia-ml.so.1`` loaded by its full path under the root), and so does each GPU's CUDA
compute capability (``nvmlDeviceGetCudaComputeCapability``; where NVML cannot say, from
``nvidia-smi --query-gpu=pci.bus_id,compute_cap``, a field nvidia-smi has since driver
510, asked in a call of its own so that an older nvidia-smi still answers the main query).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..core.cdi import DriverFiles
from ..core.cuda import CudaVersion
from ..core.model import NVIDIA_VENDOR_ID, DriverInfo, Gpu, NodeInventory, SdkInfo
from ..core.telemetry import MIB, GpuProcess, GpuSample, NodeTelemetry, percent_to_ratio
from . import libraries, sysfs
from .kmodule import kernel_release
from .metax import parse_topo_matrix
from .tools import Runner, find_tool, host_path, is_elf, run_tool

VENDOR = "nvidia"
DRIVER_NAMES = frozenset({"nvidia"})
MODULE_DIR = "/sys/module/nvidia"
NVSMI_CANDIDATES = ("/usr/bin/nvidia-smi", "/usr/local/nvidia/bin/nvidia-smi")
CONTROL_DEVICES = (
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
)
QUERY_FIELDS = ("index", "pci.bus_id", "name", "memory.total", "serial", "uuid")
LOAD_FIELDS = ("pci.bus_id", "utilization.gpu", "memory.used", "memory.total",
               "temperature.gpu", "power.draw", "ecc.errors.corrected.volatile.total",
               "ecc.errors.uncorrected.volatile.total")
APP_FIELDS = ("gpu_bus_id", "pid", "used_memory", "process_name")
NVML_SONAME = "libnvidia-ml.so.1"
NVML_LIB_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/local/nvidia/lib64",
    "/usr/lib",
)

# PCI device id -> product (a few data-centre parts; others fall back to nvidia-smi)
DEVICE_IDS: dict[int, str] = {
    0x2330: "H100",
    0x2331: "H100",
    0x2324: "H800",
    0x2335: "H200",
    0x20B0: "A100",
    0x20B2: "A100",
    0x20B5: "A100",
    0x20F1: "A100",
    0x20F3: "A800",
    0x26B5: "L40",
    0x26B9: "L40S",
    0x27B8: "L4",
    0x1DB4: "V100",
    0x1DB5: "V100",
    0x1DB6: "V100",
    0x1EB8: "T4",
    0x15F7: "P100",
    0x15F8: "P100",
    0x15F9: "P100",
}
ARCHITECTURES = (
    ("B", "Blackwell"),
    ("H", "Hopper"),
    ("L", "Ada"),
    ("A", "Ampere"),
    ("T4", "Turing"),
    ("V", "Volta"),
    ("P", "Pascal"),
)


def family_for(product: str) -> str:
    for prefix, arch in ARCHITECTURES:
        if product.startswith(prefix):
            return f"NVIDIA-{arch}"
    return "NVIDIA"


def is_gpu(device: sysfs.PciDevice) -> bool:
    # NVSwitches share the vendor id but are bridges (class 0x0680): skip them
    return device.vendor_id == NVIDIA_VENDOR_ID and not device.is_virtfn and (
        device.base_class == 0x03
    )


def normalise_bus_id(bus_id: str) -> str:
    """``00000000:18:00.0`` (nvidia-smi) -> ``0000:18:00.0`` (sysfs)."""
    bus_id = bus_id.strip().lower()
    domain, _, rest = bus_id.partition(":")
    return f"{int(domain or '0', 16):04x}:{rest}"


def parse_query(text: str) -> dict[str, dict[str, str]]:
    """``--query-gpu=index,pci.bus_id,...`` CSV -> address -> field -> value."""
    rows: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(QUERY_FIELDS) or not cells[1]:
            continue
        row = dict(zip(QUERY_FIELDS, cells))
        try:
            rows[normalise_bus_id(row["pci.bus_id"])] = row
        except ValueError:
            continue
    return rows


def device_minor(root: str, address: str) -> int | None:
    text = sysfs.read_text(host_path(root, f"/proc/driver/nvidia/gpus/{address}/information"))
    match = re.search(r"Device Minor:\s*(\d+)", text or "")
    return int(match.group(1)) if match else None


def unreachable(stderr: str) -> dict[str, str]:
    """GPUs nvidia-smi could not open, from its stderr lines
    ``Unable to determine the device handle for GPU<bdf>: <why>``."""
    result: dict[str, str] = {}
    for line in stderr.splitlines():
        match = re.search(r"for GPU\s*([0-9a-fA-F]+:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]):\s*(.*)",
                          line)
        if match:
            result[normalise_bus_id(match.group(1))] = match.group(2).strip() or "unreachable"
    return result


def query(root: str, runner: Runner | None) -> tuple[dict[str, dict[str, str]], dict[str, str],
                                                    str | None]:
    """(rows by address, unreachable GPUs by address, problem)."""
    tool = find_tool(root, "nvidia-smi", NVSMI_CANDIDATES)
    if tool is None:
        return {}, {}, ("nvidia-smi not found: no serials (name, memory, UUID and NVLink "
                        "pairs from NVML where it answers)")
    result = run_tool(runner, [tool, f"--query-gpu={','.join(QUERY_FIELDS)}",
                               "--format=csv,noheader,nounits"])
    rows = parse_query(result.stdout)
    bad = unreachable(result.stderr)
    if not result.ok and not rows:
        return {}, bad, result.problem
    return rows, bad, None


def nvml_library_path(root: str) -> str | None:
    """``libnvidia-ml.so.1`` under ``root``; None when root is ``/`` (the loader's own
    search finds it) or when there is none."""
    if os.path.realpath(root) == "/":
        return None
    for directory in NVML_LIB_DIRS:
        path = host_path(root, f"{directory}/{NVML_SONAME}")
        if os.path.isfile(path):
            return path
    return None


def _unload(lib: ctypes.CDLL) -> None:
    """dlclose the library again: a later ``CDLL("libnvidia-ml.so.1")`` by soname in this
    process (pynvml, for another host root) must not be handed this root's copy."""
    import _ctypes

    close = getattr(_ctypes, "dlclose", None)
    if close is not None:
        with contextlib.suppress(OSError):
            close(lib._handle)


@dataclass(frozen=True)
class NvmlInfo:
    """What NVML says about the node: the CUDA version the driver supports and each GPU's
    compute capability by PCI address; ``problem`` says why something is missing."""

    cuda: CudaVersion | None = None
    compute: dict[str, tuple[int, int]] = field(default_factory=dict)
    problem: str | None = None
    # address -> the --query-gpu fields NVML also has (name, memory.total in MiB, uuid), as
    # nvidia-smi prints them: they stand in where nvidia-smi does not answer
    rows: dict[str, dict[str, str]] = field(default_factory=dict)
    # pairs of addresses NVML reports peer to peer over NVLink (``nvmlDeviceGetP2PStatus``)
    nvlink: frozenset[frozenset[str]] = frozenset()


def nvml_info(root: str, addresses: Sequence[str] = (), nvlink: bool = False) -> NvmlInfo:
    """One NVML session: ``nvmlSystemGetCudaDriverVersion_v2`` (``1000 * major + 10 *
    minor``) and, for each PCI address, ``nvmlDeviceGetCudaComputeCapability``; with
    ``nvlink``, also the NVLink pairs among those GPUs (one call per pair)."""
    path = nvml_library_path(root)
    if path is None and os.path.realpath(root) != "/":
        return NvmlInfo(problem=f"{NVML_SONAME} not found under {root}: no CUDA driver version")
    try:
        lib = ctypes.CDLL(path or NVML_SONAME)
    except OSError as err:
        return NvmlInfo(problem=f"cannot load {NVML_SONAME}: {err}")
    value = ctypes.c_int(0)
    compute: dict[str, tuple[int, int]] = {}
    rows: dict[str, dict[str, str]] = {}
    handles: dict[str, ctypes.c_void_p] = {}
    pairs: frozenset[frozenset[str]] = frozenset()
    try:
        rc = lib.nvmlInit_v2()
        if rc != 0:
            return NvmlInfo(problem=f"nvmlInit_v2 failed (NVML error {rc}): no CUDA driver "
                                    "version")
        try:
            rc, call = _cuda_driver_version(lib, value)
            for address in addresses:
                handle = _device_handle(lib, address)
                if handle is None:
                    continue
                found = _compute_capability(lib, handle)
                if found is not None:
                    compute[address] = found
                facts = _device_row(lib, handle)
                if facts:
                    rows[address] = facts
                handles[address] = handle
            if nvlink:
                pairs = _nvlink_pairs(lib, handles)
        finally:
            lib.nvmlShutdown()
    except AttributeError as err:  # an NVML too old for the calls
        return NvmlInfo(compute=compute, rows=rows, nvlink=pairs,
                        problem=f"{NVML_SONAME} lacks {err}: no CUDA driver version")
    finally:
        _unload(lib)
    if rc != 0 or value.value <= 0:
        return NvmlInfo(compute=compute, rows=rows, nvlink=pairs,
                        problem=f"{call} failed (NVML error {rc}): no CUDA driver version")
    return NvmlInfo(CudaVersion(value.value // 1000, (value.value % 1000) // 10), compute,
                    rows=rows, nvlink=pairs)


P2P_CAPS_INDEX_NVLINK = 2  # nvml.h nvmlGpuP2PCapsIndex_t
P2P_STATUS_OK = 0  # nvml.h nvmlGpuP2PStatus_t


def _nvlink_pairs(lib: ctypes.CDLL, handles: dict[str, ctypes.c_void_p]
                  ) -> frozenset[frozenset[str]]:
    """The pairs of GPUs (by address) that NVML says reach each other peer to peer over
    NVLink (directly or through NVSwitch); none where NVML lacks the call."""
    get_status = getattr(lib, "nvmlDeviceGetP2PStatus", None)
    if get_status is None:
        return frozenset()
    status = ctypes.c_int(-1)
    pairs: set[frozenset[str]] = set()
    ordered = sorted(handles.items())
    for at, (first, one) in enumerate(ordered):
        for second, other in ordered[at + 1:]:
            status.value = -1
            if (get_status(one, other, ctypes.c_int(P2P_CAPS_INDEX_NVLINK),
                           ctypes.byref(status)) == 0 and status.value == P2P_STATUS_OK):
                pairs.add(frozenset((first, second)))
    return frozenset(pairs)


class _NvmlMemory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]


def _device_handle(lib: ctypes.CDLL, address: str) -> ctypes.c_void_p | None:
    """NVML's handle of the GPU at PCI ``address``; None when NVML has no such GPU or call."""
    handle = ctypes.c_void_p()
    get_handle = getattr(lib, "nvmlDeviceGetHandleByPciBusId_v2", None)
    if get_handle is None or get_handle(address.encode(), ctypes.byref(handle)) != 0:
        return None
    return handle


def _device_row(lib: ctypes.CDLL, handle: ctypes.c_void_p) -> dict[str, str]:
    """Name, total memory (MiB) and UUID of the GPU from NVML, as nvidia-smi's
    ``--query-gpu`` prints them. In a pod reading a host whose driver shares
    ``/usr/lib/x86_64-linux-gnu`` with the host's libc, the host's nvidia-smi cannot load
    ``libnvidia-ml.so.1`` (that directory is never put on its ``LD_LIBRARY_PATH``), while
    NVML, loaded here by its full path, answers."""
    row: dict[str, str] = {}
    for key, call in (("name", "nvmlDeviceGetName"), ("uuid", "nvmlDeviceGetUUID")):
        function = getattr(lib, call, None)
        text = ctypes.create_string_buffer(96)
        if function is not None and function(handle, text, ctypes.c_uint(96)) == 0 and text.value:
            row[key] = text.value.decode(errors="replace")
    memory = _NvmlMemory()
    get_memory = getattr(lib, "nvmlDeviceGetMemoryInfo", None)
    if get_memory is not None and get_memory(handle, ctypes.byref(memory)) == 0 and memory.total:
        row["memory.total"] = str(memory.total // MIB)
    return row


def _cuda_driver_version(lib: ctypes.CDLL, value: ctypes.c_int) -> tuple[int, str]:
    """(NVML return code, the call that gave it). ``_v2`` asks ``libcuda.so.1``, which a
    service whose host is mounted at ``/host`` cannot load by soname: it fails there (NVML
    error 6 with driver 580.159.04 on an H100, where the host itself got 13000); the
    original call answers from NVML itself (13000 in the same place)."""
    calls = [(c, getattr(lib, c, None)) for c in ("nvmlSystemGetCudaDriverVersion_v2",
                                                   "nvmlSystemGetCudaDriverVersion")]
    found = [(c, f) for c, f in calls if f is not None]
    if not found:
        raise AttributeError(calls[0][0])
    rc, call = -1, found[0][0]
    for name, function in found:
        value.value = 0
        rc, call = function(ctypes.byref(value)), name
        if rc == 0 and value.value > 0:
            break
    return rc, call


def _compute_capability(lib: ctypes.CDLL, handle: ctypes.c_void_p) -> tuple[int, int] | None:
    major, minor = ctypes.c_int(0), ctypes.c_int(0)
    get_cc = getattr(lib, "nvmlDeviceGetCudaComputeCapability", None)
    if get_cc is None:
        return None
    if get_cc(handle, ctypes.byref(major), ctypes.byref(minor)) != 0 or major.value <= 0:
        return None
    return major.value, minor.value


def cuda_driver_version(root: str) -> tuple[CudaVersion | None, str | None]:
    """(the CUDA version the driver supports, why it is unknown) from NVML."""
    info = nvml_info(root)
    return info.cuda, info.problem


# Where GFD reads the machine type (its --machine-type-file default)
MACHINE_TYPE_FILE = "/sys/class/dmi/id/product_name"


def machine_type(root: str) -> str | None:
    """The host's DMI product name, the source of GFD's ``gpu.machine``
    (``core.labels.gfd_machine``); None where it cannot be read."""
    return sysfs.read_text(host_path(root, MACHINE_TYPE_FILE))


def parse_compute_caps(text: str) -> dict[str, tuple[int, int]]:
    """``--query-gpu=pci.bus_id,compute_cap`` CSV -> address -> (major, minor)."""
    found: dict[str, tuple[int, int]] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != 2:
            continue
        match = re.match(r"^(\d+)\.(\d+)$", cells[1])
        if not match:
            continue
        try:
            found[normalise_bus_id(cells[0])] = (int(match.group(1)), int(match.group(2)))
        except ValueError:
            continue
    return found


def discover(root: str, devices: list[sysfs.PciDevice], runner: Runner | None = None
             ) -> NodeInventory:
    problems: list[str] = []
    module = host_path(root, MODULE_DIR)
    loaded = os.path.isdir(module)
    version = sysfs.read_text(os.path.join(module, "version")) if loaded else None
    if not loaded:
        problems.append("nvidia kernel module is not loaded (no /sys/module/nvidia)")
    gpus_pci = [d for d in devices if is_gpu(d)]
    rows, bad, problem = query(root, runner)
    if problem:
        problems.append(problem)
    position = {d.address: i for i, d in enumerate(gpus_pci)}
    links: set[frozenset[int]] = set()
    topology = False  # whether nvidia-smi topo -m answered
    tool = find_tool(root, "nvidia-smi", NVSMI_CANDIDATES)
    if tool is not None and rows:
        result = run_tool(runner, [tool, "topo", "-m"])
        topology = result.ok
        if result.ok:
            by_smi = {int(r["index"]): a for a, r in rows.items() if r["index"].isdigit()}
            for pair in parse_topo_matrix(result.stdout):
                addresses = [by_smi.get(i) for i in pair]
                if all(a in position for a in addresses):
                    links.add(frozenset(position[a] for a in addresses if a is not None))
        else:
            problems.append(f"{result.problem}")

    nvml = NvmlInfo()
    if loaded and gpus_pci:
        nvml = nvml_info(root, [d.address for d in gpus_pci], nvlink=not topology)
        if nvml.problem:
            problems.append(nvml.problem)
    if not topology:  # nvidia-smi absent or not answering: NVML's NVLink pairs
        links = {frozenset(position[a] for a in pair) for pair in nvml.nvlink
                 if all(a in position for a in pair)}
    compute = dict(nvml.compute)
    if tool is not None and rows and any(d.address not in compute for d in gpus_pci):
        result = run_tool(runner, [tool, "--query-gpu=pci.bus_id,compute_cap",
                                   "--format=csv,noheader,nounits"])
        compute = {**parse_compute_caps(result.stdout), **compute}

    gpus: list[Gpu] = []
    for index, dev in enumerate(gpus_pci):
        row = {**nvml.rows.get(dev.address, {}), **rows.get(dev.address, {})}
        product = DEVICE_IDS.get(dev.device_id or 0) or _product_from_name(row.get("name"))
        if product is None:
            product = f"unknown-0x{dev.device_id or 0:04x}"
        minor = device_minor(root, dev.address)
        nodes = (f"/dev/nvidia{minor}",) if minor is not None else ()
        bound = (dev.driver or "") in DRIVER_NAMES
        gpus.append(
            Gpu(
                index=index,
                pci_address=dev.address,
                vendor=VENDOR,
                vendor_id=NVIDIA_VENDOR_ID,
                device_id=dev.device_id or 0,
                product=product,
                family=family_for(product),
                memory_mib=_int(row.get("memory.total")),
                serial=_value(row.get("serial")),
                uuid=_value(row.get("uuid")),
                numa_node=dev.numa_node,
                pcie_switch=dev.pcie_switch,
                pcie_root=dev.pcie_root,
                sriov=dev.sriov,
                device_nodes=nodes,
                driver_bound=bound,
                fault=bad.get(dev.address),
                name=_value(row.get("name")),
                compute_capability=compute.get(dev.address),
                pci_class=dev.class_code,
            )
        )
    controls = tuple(p for p in CONTROL_DEVICES if os.path.lexists(host_path(root, p)))
    return NodeInventory(
        backend=VENDOR,
        gpus=tuple(gpus),
        driver=DriverInfo(loaded=loaded, version=version or None, cuda=nvml.cuda),
        sdk=SdkInfo(),
        links=frozenset(links),
        control_devices=controls,
        problems=tuple(problems),
    )


def _product_from_name(name: str | None) -> str | None:
    if not name:
        return None
    words = name.replace("NVIDIA", "").replace("Tesla", "").split()
    return words[0] if words else None


def _value(text: str | None) -> str | None:
    if not text or text.strip().lower() in ("[n/a]", "n/a", "[not supported]"):
        return None
    return text.strip()


def _int(text: str | None) -> int | None:
    try:
        return int(float(text)) if text else None
    except ValueError:
        return None


# ------------------------------------------------------------------------ telemetry


def _rows(text: str, fields: tuple[str, ...]) -> list[dict[str, str]]:
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) == len(fields) and cells[0] and not cells[0].startswith(fields[0]):
            rows.append(dict(zip(fields, cells)))
    return rows


def _float(text: str | None) -> float | None:
    value = _value(text)
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def parse_load(text: str) -> list[GpuSample]:
    """``--query-gpu=<LOAD_FIELDS> --format=csv,noheader,nounits`` -> samples."""
    samples = []
    for row in _rows(text, LOAD_FIELDS):
        try:
            address = normalise_bus_id(row["pci.bus_id"])
        except ValueError:
            continue
        used, total = _float(row["memory.used"]), _float(row["memory.total"])
        ecc_c = _float(row["ecc.errors.corrected.volatile.total"])
        ecc_u = _float(row["ecc.errors.uncorrected.volatile.total"])
        samples.append(GpuSample(
            address=address,
            utilization_ratio=percent_to_ratio(_float(row["utilization.gpu"])),
            memory_used_bytes=None if used is None else int(used) * MIB,
            memory_total_bytes=None if total is None else int(total) * MIB,
            temperature_celsius=_float(row["temperature.gpu"]),
            power_watts=_float(row["power.draw"]),
            ecc_corrected=None if ecc_c is None else int(ecc_c),
            ecc_uncorrected=None if ecc_u is None else int(ecc_u),
        ))
    return samples


def parse_compute_apps(text: str) -> list[GpuProcess]:
    """``--query-compute-apps=<APP_FIELDS> --format=csv,noheader,nounits`` -> processes
    (nvidia-smi has no per-process utilisation here: ``utilization_ratio`` is None)."""
    found = []
    for row in _rows(text, APP_FIELDS):
        used = _float(row["used_memory"])
        try:
            found.append(GpuProcess(
                pid=int(row["pid"]),
                address=normalise_bus_id(row["gpu_bus_id"]),
                memory_bytes=None if used is None else int(used) * MIB,
                name=row["process_name"],
            ))
        except ValueError:
            continue
    return found


def telemetry(root: str, runner: Runner | None = None) -> NodeTelemetry:
    """Load of every GPU nvidia-smi can open; never raises (see ``problems``)."""
    module = host_path(root, MODULE_DIR)
    version = sysfs.read_text(os.path.join(module, "version")) or None
    tool = find_tool(root, "nvidia-smi", NVSMI_CANDIDATES)
    if tool is None:
        return NodeTelemetry(VENDOR, "nvidia-smi", driver_version=version,
                             problems=("nvidia-smi not found: no GPU load",))
    problems: list[str] = []
    result = run_tool(runner, [tool, f"--query-gpu={','.join(LOAD_FIELDS)}",
                               "--format=csv,noheader,nounits"])
    samples = parse_load(result.stdout)
    if not result.ok and not samples:
        return NodeTelemetry(VENDOR, "nvidia-smi", driver_version=version,
                             problems=(str(result.problem),))
    apps = run_tool(runner, [tool, f"--query-compute-apps={','.join(APP_FIELDS)}",
                             "--format=csv,noheader,nounits"])
    processes: tuple[GpuProcess, ...] | None = tuple(parse_compute_apps(apps.stdout))
    if not apps.ok and not processes:
        problems.append(f"{apps.problem} (no process list)")
        processes = None
    return NodeTelemetry(VENDOR, "nvidia-smi", gpus=tuple(sorted(samples, key=lambda s: s.address)),
                         processes=processes, driver_version=version, problems=tuple(problems))


# ------------------------------------------------------------------ driver files (CDI)

# Where nvidia-container-toolkit looks (pkg/lookup/library.go, executable.go, ipc.go,
# driver-nvml.go); the ld.so cache of the root adds any other library directory.
DRIVER_LIB_SEARCH = (
    "/usr/lib64",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu/nvidia/current",
    "/usr/lib/aarch64-linux-gnu/nvidia/current",
    "/lib64",
    "/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/lib/x86_64-linux-gnu/nvidia/current",
    "/lib/aarch64-linux-gnu/nvidia/current",
    "/usr/local/nvidia/lib64",
)
LDCACHE = "/etc/ld.so.cache"
DRIVER_BINARIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
    "nvidia-imex",
    "nvidia-imex-ctl",
)
BINARY_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin",
               "/usr/local/nvidia/bin")
IPC_SOCKETS = ("/nvidia-persistenced/socket", "/nvidia-fabricmanager/socket")
IPC_SOCKET_DIRS = ("/run", "/var/run")
MPS_PIPE_DIR = "/tmp/nvidia-mps"
FIRMWARE_CLASS_PATH = "/sys/module/firmware_class/parameters/path"
CDI_HOOK = "nvidia-cdi-hook"  # nvidia-container-toolkit's hook program


def _real(root: str, path: str) -> str | None:
    """``path`` (absolute, inside the root) with its symlinks resolved inside the root;
    None when it does not exist."""
    base = os.path.realpath(root)
    resolved = os.path.realpath(host_path(root, path))
    if base != "/" and not (resolved == base or resolved.startswith(base + "/")):
        # an absolute link (e.g. /lib/modules/x/build -> /usr/src/...) read inside the root
        link = host_path(root, path)
        if os.path.islink(link) and os.readlink(link).startswith("/"):
            return _real(root, os.readlink(link))
        return None
    if not os.path.exists(resolved):
        return None
    return "/" + os.path.relpath(resolved, base) if base != "/" else resolved


def _so_link(soname: str) -> str:
    """``libcuda.so.1`` -> ``libcuda.so`` (the development link's name)."""
    name = soname
    while not name.endswith(".so") and "." in name:
        name = name.rsplit(".", 1)[0]
    return name if name.endswith(".so") else ""


def driver_library_dirs(root: str, version: str) -> list[str]:
    """Directories holding ``libcuda.so.<version>`` or ``libnvidia-ml.so.<version>`` (the
    search paths first, then the ld.so cache's other directories)."""
    candidates = list(DRIVER_LIB_SEARCH)
    for name, path in libraries.ldcache_entries(host_path(root, LDCACHE)):
        if name.startswith(("libcuda.so", "libnvidia-ml.so")):
            candidates.append(os.path.dirname(path))
    found: list[str] = []
    for directory in candidates:
        real = _real(root, directory)
        if real is None or real in found:
            continue
        if any(os.path.isfile(host_path(root, f"{real}/{lib}.so.{version}"))
               for lib in ("libcuda", "libnvidia-ml")):
            found.append(real)
    return found


def driver_files(root: str, version: str) -> DriverFiles:
    """The user space of driver ``version`` on the host, found as ``nvidia-ctk cdi generate``
    finds it: every ``*.so.<version>`` in the driver's library directories (and their
    ``vdpau/``), with the soname and ``.so`` links the host has for them; the driver's
    programs; GSP firmware ``nvidia/<version>/gsp*.bin`` on the kernel's firmware search
    path; the persistenced / fabric manager sockets and the MPS pipe directory when
    present; the toolkit's ``nvidia-cdi-hook`` when installed."""
    problems: list[str] = []
    dirs = driver_library_dirs(root, version)
    if not dirs:
        problems.append(f"no libcuda.so.{version} / libnvidia-ml.so.{version} in "
                        f"{', '.join(DRIVER_LIB_SEARCH)} or the ld.so cache: no driver "
                        "libraries for containers")
    libs: list[str] = []
    links: list[tuple[str, str]] = []
    for directory in dirs:
        for sub in (directory, f"{directory}/vdpau"):
            try:
                names = sorted(os.listdir(host_path(root, sub)))
            except OSError:
                continue
            for name in names:
                path = f"{sub}/{name}"
                if not name.endswith(f".so.{version}") or not os.path.isfile(
                        host_path(root, path)) or os.path.islink(host_path(root, path)):
                    continue
                libs.append(path)
                links += _library_links(root, sub, name)
    bins = []
    for name in DRIVER_BINARIES:
        real = _driver_program(root, name, dirs)
        if real is not None and real not in bins:
            bins.append(real)
    firmware = _firmware(root, version)
    ipc = []
    for socket_path in IPC_SOCKETS:
        for directory in IPC_SOCKET_DIRS:
            if os.path.exists(host_path(root, directory + socket_path)):
                ipc.append(directory + socket_path)
                break
    if os.path.isdir(host_path(root, MPS_PIPE_DIR)):
        ipc.append(MPS_PIPE_DIR)
    hook = next((f"{d}/{CDI_HOOK}" for d in BINARY_DIRS
                 if os.access(host_path(root, f"{d}/{CDI_HOOK}"), os.X_OK)), None)
    return DriverFiles(version, tuple(libs), tuple(dict.fromkeys(links)), tuple(dirs),
                       tuple(bins), tuple(firmware), tuple(ipc), hook, tuple(problems))


def _driver_program(root: str, name: str, lib_dirs: Sequence[str]) -> str | None:
    """The driver's program ``name`` to bind into containers: looked for first in the
    ``bin`` beside each driver library directory (``/usr/local/nvidia/lib64`` ->
    ``/usr/local/nvidia/bin``), then in ``BINARY_DIRS``; an ELF executable is taken before a
    script. A host may put a wrapper script on its PATH that execs the driver's real
    program (``/usr/bin/nvidia-smi`` -> ``exec /usr/local/nvidia/bin/nvidia-smi``, seen on a
    GPU machine with driver 580.159.04): bound alone into a container, such a script fails
    with "not found". A script is used only when there is no ELF program of that name."""
    dirs = [f"{os.path.dirname(d.rstrip('/'))}/bin" for d in lib_dirs] + list(BINARY_DIRS)
    script = None
    for directory in dict.fromkeys(dirs):
        path = host_path(root, f"{directory}/{name}")
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            continue
        real = _real(root, f"{directory}/{name}")
        if real is None:
            continue
        if is_elf(host_path(root, real)):
            return real
        script = script or real
    return script


def _library_links(root: str, directory: str, name: str) -> list[tuple[str, str]]:
    """(target, link) pairs for one driver library: its soname link and the ``.so`` link
    where the host has them as symlinks, and always ``libcuda.so`` -> ``libcuda.so.1``."""
    links: list[tuple[str, str]] = []
    soname = libraries.elf_soname(host_path(root, f"{directory}/{name}")) or name
    if soname != name and os.path.islink(host_path(root, f"{directory}/{soname}")):
        links.append((name, f"{directory}/{soname}"))
    dev = _so_link(soname)
    if dev and dev != soname and os.path.islink(host_path(root, f"{directory}/{dev}")):
        links.append((soname, f"{directory}/{dev}"))
    if name.startswith("libcuda.so.") and ("libcuda.so.1", f"{directory}/libcuda.so") not in links:
        links.append(("libcuda.so.1", f"{directory}/libcuda.so"))
    return links


def _firmware(root: str, version: str) -> list[str]:
    release = kernel_release(root)
    custom = (sysfs.read_text(host_path(root, FIRMWARE_CLASS_PATH)) or "").strip()
    dirs = [custom] if custom.startswith("/") else []
    if release:
        dirs += [f"/lib/firmware/updates/{release}", "/lib/firmware/updates",
                 f"/lib/firmware/{release}"]
    dirs.append("/lib/firmware")
    for directory in dirs:
        base = f"{directory.rstrip('/')}/nvidia/{version}"
        try:
            names = sorted(os.listdir(host_path(root, base)))
        except OSError:
            continue
        found = [f"{base}/{n}" for n in names if n.startswith("gsp") and n.endswith(".bin")]
        if found:
            return found
    return []
