"""MetaX backend: device-id table, the ``metax`` kernel module, ``mx-smi``, ``/opt/maca``.

mx-smi output (every subcommand) starts with a banner whose header line is
``=== MetaX System Management Interface Log ===``; per-GPU queries then print one
section per GPU::

    GPU#0  MXC500  0000:03:00.0
        Memory
            vram total                                : 67108864 KB

and ``topo -m`` prints a matrix (``GPU0  X  MX  SYS ...``) where a cell containing
``MX`` is a MetaXLink edge. Load (``telemetry``) comes from ``--show-memory`` (exact
KB), ``dmon ... --format csv -c 1`` (utilisation %, hotspot °C, board power W: a header
row, a units row, one row per GPU), ``--show-process`` (a ``GPU PID NAME MiB`` table)
and ``--count-ecc``. Moffett AI ships an unrelated tool also called ``mx-smi``;
output without the MetaX header is rejected.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Collection
from dataclasses import dataclass, field, replace

from ..core.model import (
    METAX_VENDOR_ID,
    DriverInfo,
    DriverMode,
    Gpu,
    NodeInventory,
    SdkInfo,
    Sriov,
)
from ..core.telemetry import MIB, GpuProcess, GpuSample, NodeTelemetry, percent_to_ratio
from . import sysfs
from .tools import Runner, find_tool, host_path, run_tool

VENDOR = "metax"
DRIVER_NAMES = frozenset({"metax"})  # compared case-insensitively (pci:METAX)
MODULE_DIR = "/sys/module/metax"
HEADER = "MetaX System Management Interface Log"

# PCI device id -> (product, family). REFERENCE §A (vllm_mxext gpu_families).
DEVICE_IDS: dict[int, tuple[str, str]] = {
    0x4001: ("C500", "MXC"),
    0x4000: ("C550", "MXC"),
    0x4081: ("C280", "MXC"),
    0x4083: ("N260", "MXN"),
}

# what discover() asks mx-smi, one run each (in this order); callers may ask for fewer
QUERIES = ("hwinfo", "memory", "health", "links")
MXSMI_CANDIDATES = (
    "/opt/mxdriver/bin/mx-smi",
    "/opt/maca/bin/mx-smi",
    "/usr/bin/mx-smi",
    "/usr/local/bin/mx-smi",
)
SDK_CANDIDATES = ("/opt/maca", "/opt/mxn100")
DRIVER_VERSION_FILE = "/opt/mxdriver/Version.txt"
# Written by the operator's driver-manager when it installed the running driver
# (gpuk8s.host.driver.record_owner): the driver is then `cloud`, else `native`.
OWNER_RECORD = "/var/lib/gpuk8s/driver-owner.json"
CONTROL_DEVICES = ("/dev/mxcd", "/dev/mxnd", "/dev/mxgd")
# values of "Unavailable Reason" that mean the GPU is fine
HEALTHY_REASONS = frozenset({"", "n/a", "na", "none", "-", "null", "available", "normal"})

_SECTION_RE = re.compile(
    r"^GPU#(\d+)\s+(.*?)\s*([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s*$"
)
_FIELD_RE = re.compile(r"^\s+(\S.*?)\s*:\s(.*)$")
_PROCESS_RE = re.compile(r"^(\d+)\s+(\d+)\s+(.+?)\s+(\d+)$")
_NUMBER_RE = re.compile(r"[-+]?\d+(\.\d+)?")
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # terminal styling a tool prints
DMON_ARGS = ("dmon", "--show-temperature", "--show-board-power", "--show-usage", "--show-memory",
             "--total-memory", "--show-bdf", "--format", "csv", "-c", "1")


def product_for(device_id: int) -> tuple[str, str]:
    """(product, family) for a PCI device id; unknown ids still get a product name."""
    return DEVICE_IDS.get(device_id, (f"unknown-0x{device_id:04x}", ""))


def is_gpu(device: sysfs.PciDevice) -> bool:
    """A MetaX physical function that is a GPU (display / 3D / accelerator class)."""
    return (
        device.vendor_id == METAX_VENDOR_ID
        and not device.is_virtfn
        and (device.base_class in (0x03, 0x12) or device.device_id in DEVICE_IDS)
    )


# ---------------------------------------------------------------------------- mx-smi


@dataclass
class Section:
    """One ``GPU#n  NAME  BDF`` block of mx-smi output."""

    smi_index: int
    name: str
    address: str
    fields: dict[str, str] = field(default_factory=dict)  # lower-cased key -> value


def check_header(text: str) -> bool:
    return HEADER in text


def parse_sections(text: str) -> dict[str, Section]:
    """Per-GPU sections keyed by PCI address; nested field names flattened."""
    sections: dict[str, Section] = {}
    current: Section | None = None
    for line in text.splitlines():
        match = _SECTION_RE.match(line.strip()) if line[:1] not in (" ", "\t") else None
        if match:
            address = match.group(3).lower()
            current = Section(int(match.group(1)), match.group(2).strip(), address)
            sections[address] = current
            continue
        if current is None:
            continue
        field_match = _FIELD_RE.match(line)
        if field_match:
            key = " ".join(field_match.group(1).lower().split())
            current.fields.setdefault(key, field_match.group(2).strip())
    return sections


def parse_topo_matrix(text: str) -> set[frozenset[int]]:
    """Pairs of tool indices (``GPU<n>`` labels) whose matrix cell marks a link.

    Works for ``mx-smi topo -m`` (``MX``) and ``nvidia-smi topo -m`` (``NV<n>``). The real
    nvidia-smi underlines its heading row with ANSI escapes even when piped
    (``\t\x1b[4mGPU0\tGPU1...\x1b[0m``); they are dropped before parsing.
    """
    columns: list[int] = []
    pairs: set[frozenset[int]] = set()
    for line in ANSI_ESCAPE.sub("", text).splitlines():
        tokens = line.split()
        if not tokens or not re.fullmatch(r"GPU\d+", tokens[0]):
            continue
        if line[:1].isspace():  # the header row is indented: "   GPU0  GPU1 ..."
            columns = [int(t[3:]) for t in tokens if re.fullmatch(r"GPU\d+", t)]
            continue
        if not columns:
            continue
        row = int(tokens[0][3:])
        for col, cell in zip(columns, tokens[1 : 1 + len(columns)]):
            if col != row and (cell.startswith("MX") or re.fullmatch(r"NV\d+", cell)):
                pairs.add(frozenset((row, col)))
    return pairs


def run_mxsmi(tool: str, runner: Runner | None, *args: str) -> tuple[str | None, str | None]:
    """(stdout, problem): stdout only when the run worked and the header is MetaX's."""
    result = run_tool(runner, [tool, *args])
    shown = " ".join(("mx-smi", *args))
    if not result.ok:
        return None, result.problem
    if not check_header(result.stdout):
        return None, (
            f"{tool} is not MetaX's mx-smi: `{shown}` output lacks the header "
            f"'{HEADER}' (Moffett AI ships an unrelated tool of the same name)"
        )
    return result.stdout, None


def _kib(value: str) -> int | None:
    match = re.match(r"(\d+)\s*([KMG]i?B)?", value.strip(), re.IGNORECASE)
    if not match:
        return None
    number = int(match.group(1))
    unit = (match.group(2) or "KB").upper().replace("I", "")
    return number * {"KB": 1, "MB": 1024, "GB": 1024 * 1024}[unit]


def unavailable_reasons(
    root: str, runner: Runner | None = None
) -> tuple[dict[str, str | None], str | None]:
    """``mx-smi --show-unavailable-reason``: address -> reason (None when fine).

    Returns ``({}, problem)`` when the tool is missing or unusable; GPUs the tool does
    not list are absent from the map.
    """
    tool = find_tool(root, "mx-smi", MXSMI_CANDIDATES)
    if tool is None:
        return {}, "mx-smi not found"
    text, problem = run_mxsmi(tool, runner, "--show-unavailable-reason")
    if text is None:
        return {}, problem
    reasons: dict[str, str | None] = {}
    for address, section in parse_sections(text).items():
        raw = next(
            (v for k, v in section.fields.items() if "unavailable" in k or "reason" in k), ""
        )
        reasons[address] = None if raw.strip().lower() in HEALTHY_REASONS else raw.strip()
    return reasons, None


# ------------------------------------------------------------------------ discovery


def read_version_file(path: str) -> str | None:
    """The version in a vendor ``Version.txt``: the first ``key:version`` line's value (the
    vendor's scripts read it with ``cut -d: -f2``), else the first non-empty bare line.
    None when the file is missing, unreadable or empty."""
    text = sysfs.read_text(path)
    if text is None:
        return None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in lines:
        if ":" in line:
            value = line.split(":")[1].strip()
            if value:
                return value
    for line in lines:
        if ":" not in line:
            return line
    return None


def owner_record(root: str) -> dict[str, str] | None:
    """The driver-manager's ownership record (``OWNER_RECORD``), or None."""
    text = sysfs.read_text(host_path(root, OWNER_RECORD))
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("version"), str):
        return None
    return {str(k): str(v) for k, v in data.items()}


def driver_info(root: str) -> tuple[DriverInfo, list[str]]:
    module = host_path(root, MODULE_DIR)
    if not os.path.isdir(module):
        return DriverInfo(loaded=False), [
            "metax kernel module is not loaded (no /sys/module/metax)"
        ]
    version = sysfs.read_text(os.path.join(module, "version"))
    problems = [] if version else ["metax module loaded but /sys/module/metax/version unreadable"]
    record = owner_record(root)
    # cloud only while the running driver is the one driver-manager installed: an admin who
    # replaced it owns it again
    cloud = record is not None and bool(version) and record["version"] == version
    mode = DriverMode.CLOUD if cloud else DriverMode.NATIVE
    return DriverInfo(loaded=True, version=version or None, mode=mode), problems


def sdk_info(root: str) -> tuple[SdkInfo, list[str]]:
    for path in SDK_CANDIDATES:
        file = host_path(root, f"{path}/Version.txt")
        if not os.path.lexists(file):
            continue
        version = read_version_file(file)
        if version and ":" in (sysfs.read_text(file) or ""):
            return SdkInfo(version=version, path=path), []
        return SdkInfo(path=path), [f"{path}/Version.txt has no 'key:version' line"]
    return SdkInfo(), ["MXMACA SDK not found (no /opt/maca/Version.txt)"]


def drm_device_nodes(root: str, address: str) -> tuple[str, ...]:
    """``/dev/dri/card<N>`` and ``/dev/dri/renderD<N>`` of one PCI function."""
    candidates = (
        f"{MODULE_DIR}/drivers/pci:METAX/{address}/drm",
        f"{MODULE_DIR}/drivers/pci:metax/{address}/drm",
        f"{sysfs.PCI_DEVICES}/{address}/drm",
    )
    for candidate in candidates:
        cards, renders = sysfs.drm_nodes(host_path(root, candidate))
        if cards or renders:
            return tuple(f"/dev/dri/{name}" for name in (*cards, *renders))
    return ()


def control_devices(root: str) -> tuple[str, ...]:
    return tuple(p for p in CONTROL_DEVICES if os.path.lexists(host_path(root, p)))


def discover(
    root: str,
    devices: list[sysfs.PciDevice],
    runner: Runner | None = None,
    queries: Collection[str] = QUERIES,
) -> NodeInventory:
    """Inventory of the MetaX GPUs in ``devices`` (link groups are set by the caller).

    ``queries``: which mx-smi runs to make (``QUERIES``; each costs one run of the
    tool): ``hwinfo`` serial numbers and UUIDs, ``memory`` memory sizes, ``health``
    ``Gpu.fault``, ``links`` MetaXLink pairs. What is not queried stays unknown (None /
    empty); the rest (sysfs, device nodes, driver, SDK) is always read.
    """
    unknown = set(queries) - set(QUERIES)
    if unknown:
        raise ValueError(f"unknown mx-smi queries {sorted(unknown)}; allowed: {', '.join(QUERIES)}")
    problems: list[str] = []
    driver, driver_problems = driver_info(root)
    problems += driver_problems
    sdk, sdk_problems = sdk_info(root)
    problems += sdk_problems

    gpus_pci = [d for d in devices if is_gpu(d)]
    memory: dict[str, Section] = {}
    hwinfo: dict[str, Section] = {}
    reasons: dict[str, str | None] = {}
    links: set[frozenset[int]] = set()
    tool = find_tool(root, "mx-smi", MXSMI_CANDIDATES) if queries else None
    if tool is None and queries:
        problems.append("mx-smi not found under /opt/mxdriver/bin, /opt/maca/bin, /usr/bin, "
                        "/usr/local/bin: no memory, serial, uuid or MetaXLink data")
    elif tool is not None:
        # once a run fails (wrong tool, hung, broken install) the others are skipped:
        # a hung tool would otherwise cost one timeout per query
        text: str | None = ""
        if "hwinfo" in queries:
            text = _query(tool, runner, problems, "--show-hwinfo")
            if text is not None:
                hwinfo = parse_sections(text)
                if gpus_pci and not hwinfo:
                    problems.append("`mx-smi --show-hwinfo` listed no GPU")
        if text is not None and "memory" in queries:
            text = _query(tool, runner, problems, "--show-memory")
            if text is not None:
                memory = parse_sections(text)
        if text is not None and "health" in queries:
            reasons, problem = unavailable_reasons(root, runner)
            if problem:
                problems.append(problem)
        if text is not None and "links" in queries:
            text = _query(tool, runner, problems, "topo", "-m")
            if text is not None:
                links = _links_by_address(parse_topo_matrix(text), hwinfo or memory, gpus_pci,
                                          problems)

    gpus: list[Gpu] = []
    for index, dev in enumerate(gpus_pci):
        product, family = product_for(dev.device_id or 0)
        fields = hwinfo[dev.address].fields if dev.address in hwinfo else {}
        mem_kib = _memory_kib(memory.get(dev.address))
        bound = (dev.driver or "").lower() in DRIVER_NAMES
        if dev.driver and not bound:
            problems.append(f"GPU {dev.address} is bound to {dev.driver!r}, not metax")
        if dev.sriov.num_vfs != len(dev.sriov.vf_addresses):
            problems.append(f"GPU {dev.address}: sriov_numvfs is {dev.sriov.num_vfs} but "
                            f"{len(dev.sriov.vf_addresses)} virtfn links exist")
        nodes = drm_device_nodes(root, dev.address)
        if bound and not nodes:
            problems.append(f"GPU {dev.address}: no DRM card/renderD nodes in sysfs")
        for node in nodes:
            if not os.path.lexists(host_path(root, node)):
                problems.append(f"GPU {dev.address}: {node} does not exist")
        gpus.append(
            Gpu(
                index=index,
                pci_address=dev.address,
                vendor=VENDOR,
                vendor_id=METAX_VENDOR_ID,
                device_id=dev.device_id or 0,
                product=product,
                family=family,
                memory_mib=None if mem_kib is None else mem_kib // 1024,
                serial=_field(fields, "serial number", "serial", "sn"),
                uuid=_field(fields, "uuid", "gpu uuid"),
                numa_node=dev.numa_node,
                pcie_switch=dev.pcie_switch,
                pcie_root=dev.pcie_root,
                sriov=_with_vf_nodes(root, dev.sriov),
                device_nodes=nodes,
                driver_bound=bound,
                fault=reasons.get(dev.address),
                pci_class=dev.class_code,
            )
        )
    inventory = NodeInventory(
        backend=VENDOR,
        gpus=tuple(gpus),
        driver=driver,
        sdk=sdk,
        links=frozenset(links),
        control_devices=control_devices(root),
        problems=tuple(problems),
    )
    if gpus and driver.loaded and not inventory.control_devices:
        inventory = inventory.with_problem("/dev/mxcd does not exist")
    return inventory


def _query(tool: str, runner: Runner | None, problems: list[str], *args: str) -> str | None:
    text, problem = run_mxsmi(tool, runner, *args)
    if problem:
        problems.append(problem)
    return text


def _with_vf_nodes(root: str, sriov: Sriov) -> Sriov:
    nodes = tuple(drm_device_nodes(root, address) for address in sriov.vf_addresses)
    return replace(sriov, vf_device_nodes=nodes)


def _field(fields: dict[str, str], *keys: str) -> str | None:
    for key in keys:
        value = fields.get(key)
        if value and value.lower() not in ("n/a", "none", "-"):
            return value
    return None


def _memory_kib(section: Section | None) -> int | None:
    if section is None:
        return None
    for key in ("vram total", "vram total memory", "total"):
        if key in section.fields:
            return _kib(section.fields[key])
    return None


def _links_by_address(
    smi_pairs: set[frozenset[int]],
    sections: dict[str, Section],
    gpus: list[sysfs.PciDevice],
    problems: list[str],
) -> set[frozenset[int]]:
    """Translate mx-smi indices to positions in ``gpus`` (via the BDFs it printed)."""
    by_smi = {s.smi_index: s.address for s in sections.values()}
    position = {d.address: i for i, d in enumerate(gpus)}
    if not by_smi:
        if smi_pairs:
            problems.append("mx-smi GPU numbering unknown: assuming it follows PCI order")
        by_smi = {i: d.address for i, d in enumerate(gpus)}
    result: set[frozenset[int]] = set()
    for pair in smi_pairs:
        addresses = [by_smi.get(i) for i in pair]
        if all(a in position for a in addresses):
            result.add(frozenset(position[a] for a in addresses if a is not None))
    return result



# ------------------------------------------------------------------------ telemetry


def parse_dmon_csv(text: str) -> dict[int, dict[str, str]]:
    """``dmon ... --format csv``: mx-smi index -> column -> cell.

    The first row whose first cell is ``dev`` names the columns; rows whose first cell
    is not a number (the units row, banners) are skipped.
    """
    header: list[str] = []
    rows: dict[int, dict[str, str]] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.lstrip("#").split(",")]
        if not cells or not cells[0]:
            continue
        if cells[0].lower() == "dev":
            header = [c.lower() for c in cells]
            continue
        if header and cells[0].isdigit():
            rows[int(cells[0])] = dict(zip(header, cells))
    return rows


def parse_process_table(text: str) -> list[tuple[int, int, str, int]]:
    """``--show-process``: (mx-smi GPU index, pid, name, memory MiB) per row."""
    found = []
    for line in text.splitlines():
        row = line.strip().strip("|").strip()
        match = _PROCESS_RE.match(row)
        if match:
            found.append((int(match.group(1)), int(match.group(2)), match.group(3).strip(),
                          int(match.group(4))))
    return found


def _number(text: str | None) -> float | None:
    match = _NUMBER_RE.search(text or "")
    return float(match.group(0)) if match else None


def _count(fields: dict[str, str], *keys: str) -> int | None:
    values = [_number(fields.get(k)) for k in keys]
    known = [v for v in values if v is not None]
    return int(sum(known)) if known else None


def telemetry(root: str, runner: Runner | None = None) -> NodeTelemetry:
    """Load of every GPU mx-smi lists, keyed by PCI address. Never raises: what could
    not be read is ``None`` and explained in ``problems``."""
    driver, _ = driver_info(root)
    tool = find_tool(root, "mx-smi", MXSMI_CANDIDATES)
    if tool is None:
        return NodeTelemetry(VENDOR, "mx-smi", driver_version=driver.version,
                             problems=("mx-smi not found: no GPU load",))
    problems: list[str] = []
    text = _query(tool, runner, problems, "--show-memory")
    if text is None:
        return NodeTelemetry(VENDOR, "mx-smi", driver_version=driver.version,
                             problems=tuple(problems))
    memory = parse_sections(text)
    by_smi = {section.smi_index: address for address, section in memory.items()}
    # dmon's CSV has no MetaX banner to check; --show-memory above vouched for the tool
    result = run_tool(runner, [tool, *DMON_ARGS])
    dmon: dict[str, dict[str, str]] = {}
    if result.ok:
        for index, row in parse_dmon_csv(result.stdout).items():
            address = (row.get("bdfid") or by_smi.get(index) or "").lower()
            if address:
                dmon[address] = row
    else:
        problems.append(f"{result.problem} (no utilisation, temperature or power)")
    ecc: dict[str, Section] = {}
    result = run_tool(runner, [tool, "--count-ecc"])
    if result.ok and check_header(result.stdout):
        ecc = parse_sections(result.stdout)
    else:
        problems.append(f"`mx-smi --count-ecc` unusable: {result.problem or 'no header'}")
    processes: tuple[GpuProcess, ...] | None = None
    text = _query(tool, runner, problems, "--show-process")
    if text is not None:
        found = []
        for smi_index, pid, name, mib in parse_process_table(text):
            gpu_address = by_smi.get(smi_index)
            if gpu_address is None:
                problems.append(f"--show-process names GPU#{smi_index}, which mx-smi did not list")
                continue
            found.append(GpuProcess(pid=pid, address=gpu_address, memory_bytes=mib * MIB,
                                    name=name))
        processes = tuple(found)
    samples = []
    for address, section in sorted(memory.items()):
        row = dmon.get(address, {})
        fields = ecc[address].fields if address in ecc else {}
        used = _used_kib(section)
        total = _memory_kib(section)
        samples.append(GpuSample(
            address=address,
            utilization_ratio=percent_to_ratio(_number(row.get("gpu"))),
            memory_used_bytes=None if used is None else used * 1024,
            memory_total_bytes=None if total is None else total * 1024,
            temperature_celsius=_number(row.get("hottemp")),
            power_watts=_number(row.get("power")),
            ecc_corrected=_count(fields, "sram correctable", "dram correctable"),
            ecc_uncorrected=_count(fields, "sram uncorrectable", "dram uncorrectable"),
        ))
    return NodeTelemetry(VENDOR, "mx-smi", gpus=tuple(samples), processes=processes,
                         driver_version=driver.version, problems=tuple(problems))


def _used_kib(section: Section) -> int | None:
    for key in ("vram used", "vram used memory", "used"):
        if key in section.fields:
            return _kib(section.fields[key])
    return None
