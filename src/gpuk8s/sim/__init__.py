"""GPU node simulator: writes a realistic host tree under a root directory.

The tree has what discovery reads on a real node (sysfs PCI hierarchy, ``/sys/module``,
DRM nodes, ``/dev`` nodes, ``/opt/maca/Version.txt``) and executable fake vendor tools
(``mx-smi``, ``nvidia-smi``, ``nvidia-cuda-mps-control``) answering from the simulator's
state file
``<root>/var/lib/gpuk8s-sim/state.json``. Faults are injected by changing that state
and the tree, never by telling product code it is simulated.

Fault modes (``fail``): ``fault`` — the vendor tool reports the GPU unavailable with a
reason; ``unbind`` — the driver binding (driver links, DRM dirs) disappears;
``remove`` — the device leaves the bus (sysfs dir and bus link gone, hot-unplug).
``heal`` restores a GPU.

Load (``set_load``): utilisation, memory used, temperature, power and ECC counts per
GPU, and processes (pid, memory, utilisation) on it, as ``mx-smi``, ``nvidia-smi`` and
the simulated ``libnvidia-ml.so.1`` (NVIDIA presets, compiled from ``fake/nvml.c`` when a
C compiler is present) report them. Tests set a load and check every metric against it.

Kernel-side stand-ins (the tree module and ``gpuk8s.discovery.kmodule`` are copied into the
root so these work without gpuk8s installed). The running kernel release is
``/proc/sys/kernel/osrelease``. ``<root>/usr/sbin/depmod`` and ``modprobe`` link to the
stand-in ``<root>/usr/bin/kmod``: depmod writes ``modules.dep`` for a release as kmod's
does; ``modprobe [-r] metax`` finds the module through that ``modules.dep`` only, refuses
what a kernel refuses (not an ELF module, a module built for another release: ``Invalid
module format``, the reason in the simulated kernel log) and loads/unloads it (unload
refused while ``/sys/module/metax/refcnt`` > 0). Modules are real-format ELF objects
(``kobject``) that Debian's kmod reads. ``mx-smi vm --enable-vf N [-i 0,1] |
--disable-vf | --show-vf`` and ``set_vfnum`` create or drop VFs; ``sync`` applies
``sriov_numvfs`` values written into sysfs.

NVIDIA roots carry the driver as a ``.run --dkms`` install leaves it (``fake/nvidia_driver``:
versioned ELF libraries with their soname links, programs, GSP firmware, DKMS modules, the
persistenced socket), a build environment (``gcc``, ``dkms``, the running kernel's headers)
and a package manager stand-in (``apt-get``). ``nvidia-8-nodriver`` starts without driver
and build environment; ``write_payload("nvidia-driver", VERSION, OUT)`` writes the matching
stand-in ``NVIDIA-Linux-x86_64-VERSION.run`` that installs into such a root.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import zipfile
from pathlib import Path
from typing import Any

from ..core.errors import ConfigError
from ..discovery import kmodule
from . import kobject, nvml, tree
from .fake import nvidia_driver
from .presets import PRESET_TABLE, PRESETS, build_state

__all__ = [
    "FAIL_MODES",
    "PRESETS",
    "clear_load",
    "create",
    "fail",
    "heal",
    "is_sim_root",
    "refresh",
    "set_load",
    "set_vfnum",
    "state",
    "sync",
    "tool_source",
    "write_payload",
]

FAIL_MODES = ("fault", "unbind", "remove")
PAYLOAD_KINDS = ("driver", "maca", "nvidia-driver")
OS_RELEASE = 'NAME="Ubuntu"\nVERSION_ID="22.04"\nID=ubuntu\nID_LIKE=debian\n'
DEFAULT_REASON = "GPU hang detected: uncorrectable ECC error (simulated)"


def is_sim_root(root: str) -> bool:
    return os.path.isfile(os.path.join(root, tree.STATE_FILE))


def create(
    root: str,
    preset: str,
    vfnum: int | None = None,
    device_nodes: str = "files",
    *,
    force: bool = False,
) -> None:
    """Write preset ``preset`` under ``root``.

    ``root`` must be missing or empty unless ``force`` (then an existing simulated root
    is replaced; a non-empty directory that is not one is refused).
    """
    if preset not in PRESET_TABLE:
        raise ConfigError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    if device_nodes not in ("files", "char"):
        raise ConfigError("device_nodes must be 'files' or 'char'")
    if os.path.realpath(root) == "/":
        raise ConfigError("refusing to write a simulated node over /")
    if os.path.isdir(root) and os.listdir(root):
        if not force:
            raise ConfigError(f"{root} is not empty (use --force to replace a simulated root)")
        if not is_sim_root(root):
            raise ConfigError(f"{root} is not a simulated root; refusing to delete it")
        shutil.rmtree(root)
    try:
        new_state = build_state(preset, vfnum, device_nodes)
    except ValueError as err:
        raise ConfigError(str(err)) from err
    os.makedirs(root, exist_ok=True)
    tree.write_tree(root, new_state)
    _install_files(root, new_state)


def tool_source(name: str) -> str:
    """Text of a stand-in tool: ``mx-smi``, ``nvidia-smi``, ``nvidia-cuda-mps-control``,
    ``apt-get``, ``dkms`` or ``kmod`` (``modprobe`` and ``depmod``; for test payloads that
    install their own copy)."""
    module = {"mx-smi": "mx_smi.py", "nvidia-smi": "nvidia_smi.py", "kmod": "kmod.py",
              "nvidia-cuda-mps-control": "mps_control.py", "apt-get": "apt_get.py",
              "dkms": "dkms.py"}
    if name not in module:
        raise ConfigError(f"no stand-in for {name!r}; choose one of {', '.join(module)}")
    # a plain path: importlib.resources.files() is 3.9+, and the host-Python tests run the
    # simulator under 3.8
    return (Path(__file__).parent / "fake" / module[name]).read_text("utf-8")


def _install_files(root: str, current: dict[str, Any]) -> None:
    """Files a real node has on disk: vendor tools, SDK, module file; plus the
    simulated kernel library the stand-in tools import."""
    for module, name in ((tree, tree.LIB_NAME), (kmodule, tree.KMODULE_NAME)):
        tree.write_file(os.path.join(root, tree.LIB_DIR, f"{name}.py"),
                        Path(str(module.__file__)).read_text(encoding="utf-8"))
    # the node's OS, as driver-manager reads it to pick an SDK image (SPEC §1: Ubuntu ...)
    tree.write_file(os.path.join(root, "etc/os-release"), OS_RELEASE)
    # the running kernel (`uname -r`; kept: a test may have "upgraded" it) and what its
    # package installs beside its modules, which depmod reads
    osrelease = os.path.join(root, kmodule.OSRELEASE.lstrip("/"))
    if not os.path.isfile(osrelease):
        tree.write_file(osrelease, f"{tree.KERNEL_RELEASE}\n")
    release = tree.kernel_release(root)
    for name in ("modules.order", "modules.builtin", "modules.builtin.modinfo"):
        path = os.path.join(root, f"lib/modules/{release}", name)
        if not os.path.exists(path):
            tree.write_file(path, "")
    driver = current["driver"]
    if current["vendor"] == "metax":
        tree.write_file(os.path.join(root, tree.KMOD_PATH), tool_source("kmod"), 0o755)
        for name in (tree.MODPROBE_PATH, tree.DEPMOD_PATH):
            tree.symlink(os.path.join(root, name), os.path.join(root, tree.KMOD_PATH))
        if driver["loaded"]:
            tree.write_file(os.path.join(root, tree.MXSMI_PATH), tool_source("mx-smi"), 0o755)
            tree.write_file(os.path.join(root, "opt/mxdriver/Version.txt"),
                            f"Version:{driver['version']}\n")
            kobject.write_module(os.path.join(root, f"lib/modules/{release}/extra/metax.ko"),
                                 "metax", driver["version"], release)
    tree.depmod(root, release)
    if current["vendor"] == "metax" and current["sdk"]:
        tree.write_file(os.path.join(root, "opt/maca/Version.txt"), f"Version:{current['sdk']}\n")
        os.makedirs(os.path.join(root, "opt/maca/lib"), exist_ok=True)
    if current["vendor"] == "nvidia":
        _install_nvidia(root, current)


def _install_nvidia(root: str, current: dict[str, Any]) -> None:
    """The stand-ins an NVIDIA root imports, its package manager and, when the preset has a
    driver, the build environment and the driver as ``.run --dkms`` installs it."""
    lib = os.path.join(root, tree.LIB_DIR)
    tree.write_file(os.path.join(lib, "gpuk8s_sim_nvidia.py"),
                    Path(nvidia_driver.__file__).read_text(encoding="utf-8"))
    tree.write_file(os.path.join(lib, "gpuk8s_sim_dkms.py"), tool_source("dkms"))
    tree.write_file(os.path.join(root, "usr/bin/apt-get"), tool_source("apt-get"), 0o755)
    driver = current["driver"]
    if not driver["loaded"]:
        return
    for package in ("build-essential", "dkms", f"linux-headers-{tree.KERNEL_RELEASE}"):
        nvidia_driver.install_package(root, package)
    library, _ = nvml.build()
    nvidia_driver.install(root, driver["version"], nvml=library, tools=_nvidia_tools(),
                          dkms=True)
    nvidia_driver.start_persistenced(root)


def _nvidia_tools() -> dict[str, str]:
    return {name: tool_source(name) for name in nvidia_driver.TOOLS}


def refresh(root: str) -> None:
    """Re-install the stand-in tools and libraries of this gpuk8s into an existing root,
    keeping its state (a long-lived root, like the lab's, gets new tool features)."""
    current = state(root)
    _install_files(root, current)
    tree.save_state(root, current)


def write_payload(kind: str, version: str, out: str,
                  kernel_release: str = tree.KERNEL_RELEASE) -> None:
    """A simulated vendor payload under ``out``, as the operator's payload images carry it.

    ``driver``: a host-layout tree (``opt/mxdriver/Version.txt``, the stand-in ``mx-smi``,
    ``lib/modules/<kernel_release>/extra/metax.ko``: a kernel module in ELF format built
    for that kernel, ``version=<version>``; see ``kobject``), which the simulator's
    ``modprobe`` loads once it is installed on a simulated root running that kernel and
    ``depmod`` has indexed it.
    ``maca``: an SDK tree (``Version.txt``, ``lib/``, ``bin/macainfo``), the content of an
    SDK image's ``/opt/maca``.
    ``nvidia-driver``: ``NVIDIA-Linux-x86_64-<version>.run`` (``write_nvidia_installer``).
    """
    if kind not in PAYLOAD_KINDS:
        raise ConfigError(f"payload kind {kind!r}: choose one of {', '.join(PAYLOAD_KINDS)}")
    if kind == "nvidia-driver":
        write_nvidia_installer(version, out)
        return
    if kind == "driver":
        tree.write_file(os.path.join(out, "opt/mxdriver/Version.txt"), f"Version:{version}\n")
        tree.write_file(os.path.join(out, tree.MXSMI_PATH), tool_source("mx-smi"), 0o755)
        kobject.write_module(os.path.join(out, f"lib/modules/{kernel_release}/extra/metax.ko"),
                             "metax", version, kernel_release)
        return
    tree.write_file(os.path.join(out, "Version.txt"), f"Version:{version}\n")
    tree.write_file(os.path.join(out, "lib/libmcruntime.so"), "\x7fELF (simulated SDK)\n")
    tree.write_file(os.path.join(out, "bin/macainfo"),
                    f"#!/bin/sh\necho \"MXMACA {version} (simulated)\"\n", 0o755)


def write_nvidia_installer(version: str, out: str) -> str:
    """``OUT/NVIDIA-Linux-x86_64-VERSION.run``: the simulator's stand-in for NVIDIA's driver
    installer (``fake/nvidia_run.py``), an executable zip carrying the driver's files.
    Returns its path."""
    if version not in nvidia_driver.DRIVER_CUDAS:
        raise ConfigError(f"NVIDIA driver {version!r}: the simulator knows "
                          f"{', '.join(nvidia_driver.DRIVER_CUDAS)}")
    fake = Path(__file__).parent / "fake"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("__main__.py", (fake / "nvidia_run.py").read_bytes())
        archive.writestr("gpuk8s_sim_nvidia.py", (fake / "nvidia_driver.py").read_bytes())
        archive.writestr("gpuk8s_sim_tree.py", Path(tree.__file__).read_bytes())
        archive.writestr(f"{tree.KMODULE_NAME}.py", Path(str(kmodule.__file__)).read_bytes())
        archive.writestr("payload.json", json.dumps(
            {"version": version, "cuda": nvidia_driver.DRIVER_CUDAS[version]}))
        for name, text in _nvidia_tools().items():
            archive.writestr(f"tools/{name}", text)
        library, _ = nvml.build()
        if library is not None:
            archive.writestr("libnvidia-ml.so", library)
    path = os.path.join(out, f"NVIDIA-Linux-x86_64-{version}.run")
    os.makedirs(out, exist_ok=True)
    with open(path + ".tmp", "wb") as handle:
        handle.write(b"#!/usr/bin/env python3\n" + buffer.getvalue())
    os.chmod(path + ".tmp", 0o644)  # downloaded: the manual's chmod a+x comes next
    os.replace(path + ".tmp", path)
    return path


def set_vfnum(root: str, vfnum: int, gpus: list[int] | None = None) -> None:
    """Configure ``vfnum`` VFs per GPU (all GPUs, or those listed), as the driver would."""
    state(root)
    try:
        tree.set_vfnum(root, vfnum, gpus)
    except tree.SimError as err:
        raise ConfigError(str(err)) from err


def sync(root: str) -> bool:
    """Apply ``sriov_numvfs`` values written into the simulated sysfs (the kernel's job
    on a real node: VFs appear or vanish). True when something changed."""
    state(root)
    try:
        return tree.sync_sriov(root)
    except tree.SimError as err:
        raise ConfigError(str(err)) from err


def state(root: str) -> dict[str, Any]:
    """The simulator state (JSON-ready dict)."""
    if not is_sim_root(root):
        raise ConfigError(f"{root} is not a simulated root (no {tree.STATE_FILE})")
    return tree.load_state(root)


def _gpu(current: dict[str, Any], gpu: int) -> dict[str, Any]:
    entries: list[dict[str, Any]] = current["gpus"]
    for entry in entries:
        if entry["index"] == gpu:
            return entry
    raise ConfigError(f"no GPU {gpu} (this node has {len(current['gpus'])})")


def fail(root: str, gpu: int, mode: str = "fault", reason: str | None = None) -> None:
    """Make GPU ``gpu`` (index in PCI order) fail in ``mode`` (see module doc)."""
    if mode not in FAIL_MODES:
        raise ConfigError(f"unknown fail mode {mode!r}; choose one of {', '.join(FAIL_MODES)}")
    current = state(root)
    entry = _gpu(current, gpu)
    entry["status"] = {"fault": "fault", "unbind": "unbound", "remove": "removed"}[mode]
    entry["reason"] = (reason or DEFAULT_REASON) if mode == "fault" else None
    tree.write_gpu(root, current, entry)
    tree.save_state(root, current)


def heal(root: str, gpu: int | None = None) -> None:
    """Restore GPU ``gpu``, or every GPU when ``gpu`` is None."""
    current = state(root)
    entries = current["gpus"] if gpu is None else [_gpu(current, gpu)]
    for entry in entries:
        entry["status"] = "ok"
        entry["reason"] = None
        tree.write_gpu(root, current, entry)
    tree.save_state(root, current)


LOAD_LIMITS = {"utilization": (0, 100), "temperature": (-40, 150), "power": (0, 5000)}


def set_load(
    root: str,
    gpu: int,
    *,
    utilization: float | None = None,
    memory_used_mib: int | None = None,
    temperature: float | None = None,
    power: float | None = None,
    ecc_corrected: int | None = None,
    ecc_uncorrected: int | None = None,
    processes: list[dict[str, Any]] | None = None,
) -> None:
    """Set GPU ``gpu``'s load; arguments left ``None`` keep their value.

    ``processes`` replaces the GPU's process list: dicts with ``pid`` (host PID),
    ``memory_mib`` and optionally ``utilization`` (percent of the GPU), ``name`` and
    ``mps`` (an MPS client: NVML lists it among the MPS compute processes).
    Memory used defaults to the processes' sum when only processes are given, and may
    not be less than it nor more than the GPU's memory.
    """
    current = state(root)
    entry = _gpu(current, gpu)
    load = tree.gpu_load(entry)
    given = {"utilization": utilization, "temperature": temperature, "power": power}
    for key, value in given.items():
        if value is None:
            continue
        low, high = LOAD_LIMITS[key]
        if not low <= value <= high:
            raise ConfigError(f"{key}: {value} is outside {low}..{high}")
        load[key] = value
    for key, count in (("ecc_corrected", ecc_corrected), ("ecc_uncorrected", ecc_uncorrected)):
        if count is not None:
            if count < 0:
                raise ConfigError(f"{key}: {count} must be >= 0")
            load[key] = count
    others = [p for p in current.get("processes", []) if p["gpu"] != gpu]
    mine = [p for p in current.get("processes", []) if p["gpu"] == gpu]
    if processes is not None:
        mine = [_process(gpu, p) for p in processes]
        pids = [p["pid"] for p in mine]
        if len(set(pids)) != len(pids):
            raise ConfigError(f"processes: a pid appears twice on GPU {gpu}")
    in_use = sum(p["memory_mib"] for p in mine)
    if memory_used_mib is not None:
        load["memory_used_mib"] = memory_used_mib
    elif processes is not None:
        load["memory_used_mib"] = in_use
    used = load["memory_used_mib"]
    if not in_use <= used <= entry["memory_mib"]:
        raise ConfigError(
            f"memory_used_mib: {used} must be between the processes' {in_use} MiB and the "
            f"GPU's {entry['memory_mib']} MiB"
        )
    busy = sum(p["utilization"] for p in mine)
    if busy > load["utilization"]:
        raise ConfigError(
            f"utilization: the processes' {busy} % exceed the GPU's {load['utilization']} %"
        )
    entry["load"] = load
    current["processes"] = sorted(others + mine, key=lambda p: (p["gpu"], p["pid"]))
    tree.save_state(root, current)


def _process(gpu: int, raw: dict[str, Any]) -> dict[str, Any]:
    try:
        pid = int(raw["pid"])
        memory = int(raw.get("memory_mib", 0))
        util = float(raw.get("utilization", 0))
    except (KeyError, TypeError, ValueError) as err:
        raise ConfigError(
            f"process {raw!r}: needs an integer pid, memory_mib (MiB) and optional "
            "utilization (percent)"
        ) from err
    if pid <= 0 or memory < 0 or not 0 <= util <= 100:
        raise ConfigError(f"process {raw!r}: pid > 0, memory_mib >= 0, utilization 0..100")
    return {"pid": pid, "gpu": gpu, "memory_mib": memory, "utilization": util,
            "name": str(raw.get("name") or "python3"), "mps": bool(raw.get("mps", False))}


def clear_load(root: str) -> None:
    """Every GPU idle again: default load, no processes."""
    current = state(root)
    for entry in current["gpus"]:
        entry.pop("load", None)
    current["processes"] = []
    tree.save_state(root, current)
