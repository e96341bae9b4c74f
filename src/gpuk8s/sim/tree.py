"""Writes (and rewrites) a simulated host tree from a state dict (see presets.py).

This module plays the simulated node's kernel and udev: it creates sysfs entries,
driver bindings, DRM directories and /dev nodes, loads/unloads the ``metax`` module
and creates SR-IOV VFs. It is **standalone** (stdlib only, no package imports) because
``create`` copies it into the root (``var/lib/gpuk8s-sim/lib/gpuk8s_sim_tree.py``),
where the stand-in tools (``mx-smi vm``, ``modprobe``) import it without gpuk8s.

Symlinks are relative, like the kernel's, so a tree stays valid when moved or
bind-mounted elsewhere (e.g. at /host in a container).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
from typing import Any

if __package__:  # gpuk8s.sim.tree
    from ..discovery import kmodule
else:  # the copy inside a simulated root imports its sibling copy (``KMODULE_NAME``)
    import gpuk8s_kmodule as kmodule  # type: ignore[import-not-found,no-redef]

STATE_FILE = "var/lib/gpuk8s-sim/state.json"
LIB_DIR = "var/lib/gpuk8s-sim/lib"
LIB_NAME = "gpuk8s_sim_tree"
METAX_DRIVER = "METAX"  # PCI driver name; sysfs shows /sys/module/metax/drivers/pci:METAX
MXSMI_PATH = "opt/mxdriver/bin/mx-smi"
NVSMI_PATH = "usr/bin/nvidia-smi"
MPS_CONTROL_PATH = "usr/bin/nvidia-cuda-mps-control"
KMOD_PATH = "usr/bin/kmod"  # the stand-in; modprobe and depmod link to it, as on Debian
MODPROBE_PATH = "usr/sbin/modprobe"
NVML_LIB_PATH = "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
NVML_TABLE = "var/lib/gpuk8s-sim/nvml.txt"
KMODULE_NAME = "gpuk8s_kmodule"  # gpuk8s.discovery.kmodule, copied next to this file in a root
DEPMOD_PATH = "usr/sbin/depmod"
KERNEL_RELEASE = "5.15.0-91-generic"  # a new root's (proc/sys/kernel/osrelease)
KERNEL_LOG = "var/lib/gpuk8s-sim/kernel.log"  # what the simulated kernel says (dmesg)

DRI_MAJOR = 226  # as on Linux
MXCD_MAJOR = 511  # made up (dynamic char major range)
NVIDIA_MAJOR = 195  # as on Linux
NVIDIA_UVM_MAJOR = 510  # made up (dynamic)
RENDER_BASE = 128


class SimError(Exception):
    """An operation the simulated kernel refuses (message as the real tool prints it)."""


def _p(root: str, rel: str) -> str:
    return os.path.join(root, rel)


def write_file(path: str, text: str, mode: int | None = None) -> None:
    write_bytes(path, text.encode("utf-8"), mode)


def write_bytes(path: str, data: bytes, mode: int | None = None) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as handle:
        handle.write(data)
    if mode is not None:
        os.chmod(tmp, mode)
    os.replace(tmp, path)


def symlink(path: str, target: str) -> None:
    """Relative symlink ``path`` -> ``target`` (both absolute), replacing what is there."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if os.path.lexists(path):
        os.unlink(path)
    os.symlink(os.path.relpath(target, os.path.dirname(path)), path)


def remove(path: str) -> None:
    if os.path.islink(path) or os.path.isfile(path):
        os.unlink(path)
    elif os.path.isdir(path):
        shutil.rmtree(path)


def load_state(root: str) -> dict[str, Any]:
    with open(_p(root, STATE_FILE), encoding="utf-8") as handle:
        state: dict[str, Any] = json.load(handle)
    return state


def save_state(root: str, state: dict[str, Any]) -> None:
    if state["vendor"] == "nvidia":  # what the simulated libnvidia-ml answers from
        write_file(_p(root, NVML_TABLE), nvml_table(state))
    write_file(_p(root, STATE_FILE), json.dumps(state, indent=2, sort_keys=True) + "\n")


# ------------------------------------------------------------------------- GPU load

DEFAULT_LOAD: dict[str, Any] = {
    "utilization": 0,  # percent
    "memory_used_mib": 0,
    "temperature": 36,  # degrees C
    "power": 69.0,  # W
    "ecc_corrected": 0,
    "ecc_uncorrected": 0,
}


def gpu_load(gpu: dict[str, Any]) -> dict[str, Any]:
    """The GPU's load with defaults filled in (states written before loads existed)."""
    return {**DEFAULT_LOAD, **gpu.get("load", {})}


def gpu_processes(state: dict[str, Any], gpu: dict[str, Any]) -> list[dict[str, Any]]:
    """Processes on ``gpu``: ``{pid, gpu, memory_mib, utilization (percent), name}``."""
    return [p for p in state.get("processes", []) if p["gpu"] == gpu["index"]]


def nvml_table(state: dict[str, Any]) -> str:
    """The simulated NVML library's view (sim/fake/nvml.c reads it on every call).

    One record per line, space separated, names last (they contain spaces)::

        driver <version>
        cuda <CUDA driver version as NVML encodes it: 1000 * major + 10 * minor>
        gpu <status> <bus id> <uuid> <total B> <used B> <util %> <mem util %> <temp C>
            <power mW> <ecc corrected> <ecc uncorrected> <compute capability major> <minor>
            <PCI device id, NVML's pciDeviceId> <name>
        proc <gpu position> <pid> <used B> <sm util %> <mps 0|1> <name>
        link <gpu position> <gpu position>

    Only GPUs on the bus appear (``ok`` or ``fault``), in PCI order; a ``proc`` names
    its GPU by position in that list, and so does a ``link`` (an NVLink pair, the same
    pairs ``nvidia-smi topo -m`` prints as ``NV<n>``).
    """
    lines = [f"driver {state['driver']['version'] or ''}"]
    cuda = cuda_version_code(state["driver"].get("cuda"))
    if cuda is not None:
        lines.append(f"cuda {cuda}")
    present = [g for g in state["gpus"] if g["status"] in ("ok", "fault")]
    position = {g["index"]: n for n, g in enumerate(present)}
    for gpu in present:
        load = gpu_load(gpu)
        mib = 1024 * 1024
        lines.append(
            f"gpu {gpu['status']} 0000{gpu['bdf'].upper()} {gpu['uuid']} "
            f"{gpu['memory_mib'] * mib} {int(load['memory_used_mib']) * mib} "
            f"{int(load['utilization'])} 0 {int(load['temperature'])} "
            f"{round(float(load['power']) * 1000)} {int(load['ecc_corrected'])} "
            f"{int(load['ecc_uncorrected'])} {compute_capability(gpu)[0]} "
            f"{compute_capability(gpu)[1]} 0x{gpu['device']:04x}{gpu['vendor']:04x} {gpu['name']}"
        )
    for a, b in state.get("links", []):
        if a in position and b in position:
            lines.append(f"link {position[a]} {position[b]}")
    for proc in state.get("processes", []):
        if proc["gpu"] in position:
            used = int(proc["memory_mib"]) * 1024 * 1024
            lines.append(
                f"proc {position[proc['gpu']]} {proc['pid']} {used} "
                f"{int(proc.get('utilization') or 0)} {1 if proc.get('mps') else 0} "
                f"{proc.get('name') or 'python3'}"
            )
    return "\n".join(lines) + "\n"


def compute_capability(gpu: dict[str, Any]) -> tuple[int, int]:
    """The GPU's CUDA compute capability (``"9.0"`` -> (9, 0)); (0, 0) when the state has
    none (states written before it existed)."""
    major, _, minor = str(gpu.get("compute_capability") or "0.0").partition(".")
    return int(major), int(minor or 0)


def cuda_version_code(version: str | None) -> int | None:
    """``"12.4"`` -> 12040, NVML's encoding of the driver's CUDA version; None when unset."""
    if not version:
        return None
    major, _, minor = str(version).partition(".")
    return int(major) * 1000 + int(minor or 0) * 10


def _driver_name(state: dict[str, Any]) -> str:
    return METAX_DRIVER if state["vendor"] == "metax" else "nvidia"


def assign_cards(state: dict[str, Any]) -> None:
    """DRM minors in probe order: the BMC VGA (card0), every PF, then VFs."""
    if state["vendor"] != "metax":
        return
    card = sum(len(d.get("drm", [])) for d in state["devices"])  # card0: the BMC VGA
    for gpu in state["gpus"]:
        gpu["card"], gpu["render"] = card, RENDER_BASE + card - 1
        card += 1
    for gpu in state["gpus"]:
        for vf in gpu["vfs"]:
            vf["card"], vf["render"] = card, RENDER_BASE + card - 1
            card += 1


def make_vfs(gpu: dict[str, Any], count: int) -> None:
    """``count`` VF records (ARI numbering: offset 1, stride 1)."""
    bus = int(gpu["bdf"][5:7], 16)
    gpu["vfs"] = []
    for v in range(count):
        dev, fn = divmod(1 + v, 8)
        gpu["vfs"].append({"bdf": f"0000:{bus:02x}:{dev:02x}.{fn}"})


def _write_function(root: str, dev: dict[str, Any], driver: str | None) -> str:
    """One PCI function: its sysfs dir, bus link and driver links. Returns its dir."""
    directory = _p(root, f"sys/devices/{dev['path']}")
    os.makedirs(directory, exist_ok=True)
    write_file(f"{directory}/vendor", f"0x{dev['vendor']:04x}\n")
    write_file(f"{directory}/device", f"0x{dev['device']:04x}\n")
    write_file(f"{directory}/class", f"0x{dev['class']:06x}\n")
    write_file(f"{directory}/numa_node", f"{dev['numa']}\n")
    symlink(_p(root, f"sys/bus/pci/devices/{dev['bdf']}"), directory)
    symlink(f"{directory}/subsystem", _p(root, "sys/bus/pci"))
    if driver:
        drv = _p(root, f"sys/bus/pci/drivers/{driver}")
        symlink(f"{directory}/driver", drv)
        symlink(f"{drv}/{dev['bdf']}", directory)
    return directory


def _write_drm(directory: str, card: int, render: int) -> None:
    for name, minor in ((f"card{card}", card), (f"renderD{render}", render)):
        write_file(f"{directory}/drm/{name}/dev", f"{DRI_MAJOR}:{minor}\n")


def _node(root: str, state: dict[str, Any], rel: str, major: int, minor: int) -> None:
    """A device node: a regular file, or a real char device (``--device-nodes char``)."""
    path = _p(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if os.path.lexists(path):
        return
    if state["device_nodes"] == "char":
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
        os.chmod(path, 0o666)
    else:
        write_file(path, f"{major}:{minor}\n")


def write_devices(root: str, state: dict[str, Any]) -> None:
    """Non-GPU PCI functions (host bridges, ports, switches, VGA, NIC, disk)."""
    for dev in state["devices"]:
        directory = _write_function(root, dev, dev.get("driver"))
        for name in dev.get("drm", []):
            minor = int(name[4:])
            write_file(f"{directory}/drm/{name}/dev", f"{DRI_MAJOR}:{minor}\n")
            _node(root, state, f"dev/dri/{name}", DRI_MAJOR, minor)
    os.makedirs(_p(root, "sys/bus/pci/drivers"), exist_ok=True)


def write_module(root: str, state: dict[str, Any]) -> None:
    """The loaded kernel module and what udev makes of it (control device nodes)."""
    driver = state["driver"]
    if not driver["loaded"]:
        return
    if state["vendor"] == "metax":
        module = _p(root, "sys/module/metax")
        write_file(f"{module}/version", f"{driver['version']}\n")
        write_file(f"{module}/refcnt", f"{driver.get('refcnt', 0)}\n")
        write_file(f"{module}/initstate", "live\n")
        params = {"pri_mem_sz": "0", "vfnum": str(state["vfnum"]), **driver.get("params", {})}
        for key, value in params.items():
            write_file(f"{module}/parameters/{key}", f"{value}\n")
        drv = _p(root, f"sys/bus/pci/drivers/{METAX_DRIVER}")
        os.makedirs(drv, exist_ok=True)
        symlink(f"{module}/drivers/pci:{METAX_DRIVER}", drv)
        symlink(f"{drv}/module", module)
        _node(root, state, "dev/mxcd", MXCD_MAJOR, 0)
    elif state["vendor"] == "nvidia":
        module = _p(root, "sys/module/nvidia")
        write_file(f"{module}/version", f"{driver['version']}\n")
        drv = _p(root, "sys/bus/pci/drivers/nvidia")
        os.makedirs(drv, exist_ok=True)
        symlink(f"{module}/drivers/pci:nvidia", drv)
        _node(root, state, "dev/nvidiactl", NVIDIA_MAJOR, 255)
        _node(root, state, "dev/nvidia-modeset", NVIDIA_MAJOR, 254)
        _node(root, state, "dev/nvidia-uvm", NVIDIA_UVM_MAJOR, 0)
        _node(root, state, "dev/nvidia-uvm-tools", NVIDIA_UVM_MAJOR, 1)
        write_file(_p(root, "proc/driver/nvidia/version"),
                   f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {driver['version']}\n")


def remove_gpu(root: str, state: dict[str, Any], gpu: dict[str, Any]) -> None:
    """Take a GPU (and its VFs) out of sysfs, as a hot-unplug would."""
    driver = _driver_name(state)
    addresses = [gpu["bdf"], *(vf["bdf"] for vf in gpu.get("vfs", []))]
    # VF dirs left over from an earlier, larger VF count
    parent = os.path.dirname(_p(root, f"sys/devices/{gpu['path']}"))
    if os.path.isdir(parent):
        prefix = gpu["bdf"][:8]
        addresses += [e for e in os.listdir(parent) if e.startswith(prefix)]
    for address in sorted(set(addresses)):
        remove(_p(root, f"sys/bus/pci/devices/{address}"))
        remove(_p(root, f"sys/bus/pci/drivers/{driver}/{address}"))
        remove(os.path.join(parent, address))


def write_gpu(root: str, state: dict[str, Any], gpu: dict[str, Any]) -> None:
    """(Re)write one GPU according to its status: ok/fault, unbound or removed."""
    remove_gpu(root, state, gpu)
    if gpu["status"] == "removed":
        return
    bound = state["driver"]["loaded"] and gpu["status"] != "unbound"
    driver = _driver_name(state) if bound else None
    directory = _write_function(root, gpu, driver)
    if gpu["total_vfs"]:
        vfs = gpu.get("vfs", [])
        write_file(f"{directory}/sriov_totalvfs", f"{gpu['total_vfs']}\n")
        write_file(f"{directory}/sriov_numvfs", f"{len(vfs)}\n")
        write_file(f"{directory}/sriov_offset", "1\n")
        write_file(f"{directory}/sriov_stride", "1\n")
        write_file(f"{directory}/sriov_vf_device", f"{gpu['vf_device']:04x}\n")
        write_file(f"{directory}/sriov_drivers_autoprobe", "1\n")
        parent = os.path.dirname(directory)
        for n, vf in enumerate(vfs):
            vf_dev = {**gpu, "bdf": vf["bdf"], "device": gpu["vf_device"],
                      "path": f"{os.path.dirname(gpu['path'])}/{vf['bdf']}"}
            vf_dir = _write_function(root, vf_dev, driver)
            symlink(f"{vf_dir}/physfn", directory)
            symlink(f"{directory}/virtfn{n}", os.path.join(parent, vf["bdf"]))
            if driver and "card" in vf:
                _write_drm(vf_dir, vf["card"], vf["render"])
                _node(root, state, f"dev/dri/card{vf['card']}", DRI_MAJOR, vf["card"])
                _node(root, state, f"dev/dri/renderD{vf['render']}", DRI_MAJOR, vf["render"])
    if driver and "card" in gpu:
        _write_drm(directory, gpu["card"], gpu["render"])
        _node(root, state, f"dev/dri/card{gpu['card']}", DRI_MAJOR, gpu["card"])
        _node(root, state, f"dev/dri/renderD{gpu['render']}", DRI_MAJOR, gpu["render"])
    if state["vendor"] == "nvidia" and driver:
        minor = gpu["index"]
        _node(root, state, f"dev/nvidia{minor}", NVIDIA_MAJOR, minor)
        write_file(_p(root, f"proc/driver/nvidia/gpus/{gpu['bdf']}/information"),
                   f"Model: \t\t {gpu['name']}\nIRQ:   \t\t 0\nGPU UUID: \t {gpu['uuid']}\n"
                   f"Device Minor: \t {minor}\nBus Location: \t {gpu['bdf']}\n")


def write_tree(root: str, state: dict[str, Any]) -> None:
    write_devices(root, state)
    write_module(root, state)
    for gpu in state["gpus"]:
        write_gpu(root, state, gpu)
    save_state(root, state)


# ------------------------------------------------------- kernel operations (stand-ins)


def kernel_release(root: str) -> str:
    """The simulated node's running kernel (``uname -r``), as product code reads it."""
    return kmodule.kernel_release(root)


def vermagic(release: str) -> str:
    """The simulated kernel's version magic (an Ubuntu SMP kernel's, with modversions)."""
    return f"{release} SMP mod_unload modversions "


def layout_crc(release: str) -> int:
    """The CRC of ``module_layout`` in kernel ``release`` (``__versions`` of its modules):
    a module built for another release disagrees about it, as on a real kernel."""
    return int(hashlib.sha256(release.encode()).hexdigest()[:8], 16)


def _modules_dir(root: str, release: str) -> str:
    return _p(root, f"lib/modules/{release}")


def depmod(root: str, release: str) -> str:
    """What ``depmod`` writes for ``release`` that ``modprobe`` reads: ``modules.dep``
    (``path: dependencies``, paths relative to ``lib/modules/<release>``; dependencies
    from each module's ``depends=``). Returns the file's path."""
    top = _modules_dir(root, release)
    paths: dict[str, str] = {}
    for path in _walk_modules(top, ""):
        name = kmodule.module_name(path)
        # kmod's default search order is "updates" (and everything under it), then
        # "built-in" (every other directory); of two modules of one name at the same
        # priority the one met first in directory (readdir) order wins, as in depmod
        if name not in paths or (_in_updates(path) and not _in_updates(paths[name])):
            paths[name] = path
    lines = []
    for rel in sorted(paths.values()):
        try:
            depends = (kmodule.modinfo(os.path.join(top, rel)).get("depends") or [""])[0]
        except kmodule.ModuleFormatError:
            depends = ""  # depmod lists it all the same; loading it fails
        deps = [paths[d.replace("-", "_")] for d in depends.split(",")
                if d.replace("-", "_") in paths]
        lines.append(f"{rel}: {' '.join(deps)}".rstrip(" ") + "\n")
    path = os.path.join(top, "modules.dep")
    write_file(path, "".join(lines))
    return path


def _in_updates(path: str) -> bool:
    return path == "updates" or path.startswith("updates/")


def _walk_modules(top: str, rel: str) -> list[str]:
    """Module files under ``top/rel``, relative to ``top``, depth first in directory
    order (os.scandir is readdir, the order depmod walks in)."""
    found: list[str] = []
    try:
        entries = list(os.scandir(os.path.join(top, rel)))
    except OSError:
        return found
    for entry in entries:
        path = os.path.join(rel, entry.name) if rel else entry.name
        if entry.is_dir(follow_symlinks=False):
            found.extend(_walk_modules(top, path))
        elif entry.name.endswith(kmodule.SUFFIXES):
            found.append(path)
    return found


def resolve_module(root: str, name: str, release: str | None = None) -> list[str]:
    """``modprobe``'s lookup: the files of module ``name`` and its dependencies (those
    first), from ``lib/modules/<running release>/modules.dep``; never a scan of the
    disk, so a module nobody ran ``depmod`` for is not found."""
    release = release or kernel_release(root)
    top = _modules_dir(root, release)
    wanted = name.replace("-", "_")
    entries: dict[str, list[str]] = {}
    for line in (_read(os.path.join(top, "modules.dep")) or "").splitlines():
        path, sep, deps = line.partition(":")
        if sep:
            entries[kmodule.module_name(path.strip())] = [path.strip(), *deps.split()]
    if wanted not in entries:
        raise SimError(f"modprobe: FATAL: Module {name} not found in directory "
                       f"/lib/modules/{release}")
    path, *deps = entries[wanted]
    return [p if p.startswith("/") else os.path.join(top, p)
            for p in [*reversed(deps), path]]


def _kernel_log(root: str, line: str) -> None:
    os.makedirs(os.path.dirname(_p(root, KERNEL_LOG)), exist_ok=True)
    with open(_p(root, KERNEL_LOG), "a", encoding="utf-8") as handle:
        handle.write(line + "\n")


def insert_module(root: str, path: str) -> dict[str, list[str]]:
    """What the running kernel checks in ``init_module`` before it accepts a file (its
    ``.modinfo`` is returned): an ELF relocatable object, a ``vermagic``, ``module_layout``
    as this kernel has it, the same version magic. A refusal is ``modprobe``'s message
    (``Invalid module format``: ENOEXEC), the reason goes to the kernel log (dmesg)."""
    name = kmodule.module_name(path)
    shown = _p("/", os.path.relpath(path, root)) if path.startswith(root) else path
    refused = SimError(f"modprobe: ERROR: could not insert '{name}': Invalid module format")
    if not os.path.isfile(path):
        raise SimError(f"modprobe: ERROR: could not insert '{name}': No such file or "
                       f"directory ({shown})")
    release = kernel_release(root)
    try:
        found = kmodule.sections(kmodule.read_bytes(path), shown)
        info = kmodule.modinfo(path)
    except kmodule.ModuleFormatError as err:
        _kernel_log(root, f"{name}: {err}")
        raise refused from err
    magic = (info.get("vermagic") or [""])[0]
    if not magic:
        _kernel_log(root, f"{name}: no version magic, refusing to load")
        raise refused
    crcs = found.get("__versions", b"")
    for at in range(0, len(crcs) - 63, 64):
        symbol = crcs[at + 8:at + 64].split(b"\0", 1)[0]
        if symbol == b"module_layout" and \
                int.from_bytes(crcs[at:at + 8], "little") != layout_crc(release):
            _kernel_log(root, f"{name}: disagrees about version of symbol module_layout")
            raise refused
    ours = vermagic(release)
    same = magic == ours if not crcs else magic.split(" ", 1)[-1] == ours.split(" ", 1)[-1]
    if not same:
        _kernel_log(root, f"{name}: version magic '{magic}' should be '{ours}'")
        raise refused
    return info


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError:
        return None


def load_module(root: str, params: dict[str, str] | None = None) -> bool:
    """``modprobe metax``: load the installed module, bind every GPU. False: already live."""
    state = load_state(root)
    if state["vendor"] != "metax":
        raise SimError("modprobe: FATAL: Module metax not found (no MetaX GPU simulated)")
    if state["driver"]["loaded"]:
        return False
    info: dict[str, list[str]] = {}
    for path in resolve_module(root, "metax"):
        info = insert_module(root, path)
    version = (info.get("version") or ["unknown"])[0]
    state["driver"] = {"loaded": True, "version": version, "refcnt": 0,
                       "params": dict(params or {})}
    assign_cards(state)
    write_module(root, state)
    for gpu in state["gpus"]:
        write_gpu(root, state, gpu)
    save_state(root, state)
    return True


def unload_module(root: str) -> bool:
    """``modprobe -r metax``: refused while in use (refcnt > 0). False: not loaded."""
    state = load_state(root)
    if state["vendor"] != "metax" or not state["driver"]["loaded"]:
        return False
    refcnt = _read(_p(root, "sys/module/metax/refcnt"))
    if refcnt and refcnt.isdigit() and int(refcnt) > 0:
        raise SimError("modprobe: FATAL: Module metax is in use.")
    state["driver"] = {**state["driver"], "loaded": False}
    remove(_p(root, "sys/module/metax"))
    remove(_p(root, f"sys/bus/pci/drivers/{METAX_DRIVER}"))
    remove(_p(root, "dev/mxcd"))
    for gpu in state["gpus"]:
        for node in [gpu, *gpu["vfs"]]:
            if "card" in node:
                remove(_p(root, f"dev/dri/card{node['card']}"))
                remove(_p(root, f"dev/dri/renderD{node['render']}"))
        write_gpu(root, state, gpu)
    save_state(root, state)
    return True


def set_vfnum(root: str, vfnum: int, gpus: list[int] | None = None) -> None:
    """Configure ``vfnum`` VFs on the given GPUs (all by default), as the driver would."""
    state = load_state(root)
    chosen = [g for g in state["gpus"] if gpus is None or g["index"] in gpus]
    for gpu in chosen:
        if not gpu["total_vfs"]:
            raise SimError(f"GPU {gpu['index']} ({gpu['bdf']}) does not support SR-IOV")
        if vfnum not in (0, 1, 2, 4, 8) or vfnum > gpu["total_vfs"]:
            raise SimError(f"invalid VF number {vfnum} (1, 2, 4 or 8, at most "
                           f"{gpu['total_vfs']})")
    for gpu in chosen:
        for vf in gpu["vfs"]:  # udev drops the nodes of VFs that go away
            if "card" in vf:
                remove(_p(root, f"dev/dri/card{vf['card']}"))
                remove(_p(root, f"dev/dri/renderD{vf['render']}"))
        make_vfs(gpu, vfnum)
    if gpus is None:
        state["vfnum"] = vfnum
    assign_cards(state)
    if state["driver"]["loaded"]:
        write_file(_p(root, "sys/module/metax/parameters/vfnum"), f"{state['vfnum']}\n")
    for gpu in state["gpus"]:
        write_gpu(root, state, gpu)
    save_state(root, state)


def sync_sriov(root: str) -> bool:
    """Apply ``sriov_numvfs`` values written into sysfs (what the kernel does on write).

    Returns True when something changed.
    """
    state = load_state(root)
    changed = False
    for gpu in state["gpus"]:
        text = _read(_p(root, f"sys/bus/pci/devices/{gpu['bdf']}/sriov_numvfs"))
        if not gpu["total_vfs"] or text is None or not text.isdigit():
            continue
        if int(text) != len(gpu["vfs"]):
            set_vfnum(root, int(text), [gpu["index"]])
            changed = True
    if changed:
        state = load_state(root)
        counts = {len(g["vfs"]) for g in state["gpus"]}
        state["vfnum"] = counts.pop() if len(counts) == 1 else state["vfnum"]
        save_state(root, state)
    return changed
