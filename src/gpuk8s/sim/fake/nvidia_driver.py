"""NVIDIA's Linux driver as the simulator lays it out: the files of a ``.run --dkms``
install (Ubuntu, x86_64), the build environment it needs, and the kernel module's
load / unload in the simulated tree.

**Standalone** (stdlib only): ``gpuk8s.sim`` copies it into every simulated root
(``var/lib/gpuk8s-sim/lib/gpuk8s_sim_nvidia.py``) and into the fake installer, where the
stand-ins (``NVIDIA-Linux-x86_64-<v>.run``, ``dkms``, ``apt-get``) import it without gpuk8s.

What a real install leaves, and real programs can judge (``readelf``, ``ldconfig``,
``dlopen``), is reproduced:

* libraries ``/usr/lib/x86_64-linux-gnu/lib*.so.<version>``: ELF shared objects with their
  real ``DT_SONAME`` (``libcuda.so.1``, ``libnvidia-nvvm.so.4`` ...), the soname and
  ``.so`` symlinks the installer makes; ``libnvidia-ml.so.<version>`` is the simulator's
  working NVML (``fake/nvml.c``) when a C compiler built it;
* ``/usr/bin/nvidia-smi`` (the stand-in), ``nvidia-debugdump``, ``nvidia-persistenced``,
  ``nvidia-cuda-mps-control``, ``nvidia-cuda-mps-server``, ``nvidia-installer`` and
  ``nvidia-uninstall``; GSP firmware ``/lib/firmware/nvidia/<version>/gsp_*.bin``;
* the DKMS tree (``/usr/src/nvidia-<version>/dkms.conf``) and the modules DKMS builds into
  ``/lib/modules/<kernel>/updates/dkms/`` (text stand-ins carrying ``vermagic=<kernel>``);
* ``/run/nvidia-persistenced/socket`` (a socket node) once the driver is loaded.

The driver binds a GPU only when its branch supports the GPU (``min_driver`` of the GPU's
product in the state): an H100 with a 470 driver stays unbound, and nvidia-smi then finds
no device, as on a real node.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import struct
from typing import Any

try:  # inside the gpuk8s package
    from .. import tree
except ImportError:  # copied into a simulated root or the fake installer
    import gpuk8s_sim_tree as tree  # type: ignore[import-not-found,no-redef]

# The newest CUDA each simulated driver branch supports (nvidia-smi's "CUDA Version"; NVIDIA's
# CUDA toolkit release notes, table 3).
DRIVER_CUDAS = {
    "550.54.15": "12.4",
    "535.183.01": "12.2",
    "515.65.01": "11.7",
    "470.256.02": "11.4",
}
LIB_DIR = "usr/lib/x86_64-linux-gnu"
# (file stem, DT_SONAME (None: the versioned name itself), development link)
LIBRARIES: tuple[tuple[str, str | None, str | None], ...] = (
    ("libcuda", "libcuda.so.1", "libcuda.so"),
    ("libcudadebugger", "libcudadebugger.so.1", None),
    ("libnvidia-ml", "libnvidia-ml.so.1", "libnvidia-ml.so"),
    ("libnvidia-ptxjitcompiler", "libnvidia-ptxjitcompiler.so.1", "libnvidia-ptxjitcompiler.so"),
    ("libnvidia-nvvm", "libnvidia-nvvm.so.4", "libnvidia-nvvm.so"),
    ("libnvidia-cfg", "libnvidia-cfg.so.1", "libnvidia-cfg.so"),
    ("libnvidia-opencl", "libnvidia-opencl.so.1", None),
    ("libnvidia-allocator", "libnvidia-allocator.so.1", "libnvidia-allocator.so"),
    ("libnvidia-gpucomp", None, None),
    ("libnvcuvid", "libnvcuvid.so.1", "libnvcuvid.so"),
    ("libnvidia-encode", "libnvidia-encode.so.1", "libnvidia-encode.so"),
)
BIN_DIR = "usr/bin"
TOOLS = ("nvidia-smi", "nvidia-cuda-mps-control")  # stand-ins with their own source
STUBS = ("nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-server")
FIRMWARE = ("gsp_ga10x.bin", "gsp_tu10x.bin")
MODULES = ("nvidia", "nvidia-uvm", "nvidia-modeset", "nvidia-drm", "nvidia-peermem")
DKMS_MODULE_DIR = "updates/dkms"  # under lib/modules/<kernel>/
PLAIN_MODULE_DIR = "kernel/drivers/video"  # without --dkms
PERSISTENCED_SOCKET = "run/nvidia-persistenced/socket"
# What the installer installed (the real one keeps /var/log/nvidia-installer.log and a
# backup under /var/lib/nvidia; this file is the simulator's record of the same).
MANIFEST = "var/lib/nvidia/installed.json"
GCC_VERSION = "gcc (Ubuntu 11.4.0-1ubuntu1~22.04) 11.4.0"
DKMS_VERSION = "dkms-2.8.7"


class DriverError(Exception):
    """What the real program would refuse; the message is the one it prints."""


def _p(root: str, rel: str) -> str:
    return os.path.join(root, rel.lstrip("/"))


def kernel_release(root: str) -> str:
    """``uname -r`` of the simulated node (its ``/proc/sys/kernel/osrelease``)."""
    return tree.kernel_release(root)


# ----------------------------------------------------------------------------- ELF


def elf_shared_object(soname: str) -> bytes:
    """A minimal x86-64 ELF shared object whose dynamic section names ``soname``: enough for
    ``readelf -d``, ``ldconfig`` and ``dlopen`` (no code, one null symbol, a SysV hash)."""
    strtab = b"\0" + soname.encode() + b"\0"
    strtab += b"\0" * (-len(strtab) % 8)
    ehsize, phentsize, phnum = 64, 56, 3
    hash_off = ehsize + phentsize * phnum
    hashtab = struct.pack("<4I", 1, 1, 0, 0)  # nbucket, nchain, bucket[0], chain[0]
    sym_off = hash_off + len(hashtab)
    symtab = b"\0" * 24
    str_off = sym_off + len(symtab)
    dyn_off = str_off + len(strtab)
    # DT_SONAME, DT_HASH, DT_STRTAB, DT_SYMTAB, DT_STRSZ, DT_SYMENT, DT_NULL
    dyn = b"".join(struct.pack("<qQ", tag, value) for tag, value in (
        (14, 1), (4, hash_off), (5, str_off), (6, sym_off), (10, len(strtab)), (11, 24), (0, 0)))
    total = dyn_off + len(dyn)
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + b"\0" * 8  # 64-bit, little endian, SysV
    header = ident + struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, ehsize, 0, 0, ehsize,
                                 phentsize, phnum, 64, 0, 0)  # ET_DYN, EM_X86_64
    phdrs = struct.pack("<IIQQQQQQ", 1, 6, 0, 0, 0, total, total, 0x1000)  # PT_LOAD rw
    phdrs += struct.pack("<IIQQQQQQ", 2, 6, dyn_off, dyn_off, dyn_off, len(dyn), len(dyn), 8)
    phdrs += struct.pack("<IIQQQQQQ", 0x6474E551, 6, 0, 0, 0, 0, 0, 16)  # PT_GNU_STACK rw
    return header + phdrs + hashtab + symtab + strtab + dyn


def module_text(name: str, version: str, kernel: str) -> str:
    """A simulated ``.ko``: its modinfo strings (the kernel-side simulator reads
    ``vermagic`` and ``version``)."""
    return (f"\x7fELF (simulated kernel module)\x00name={name}\x00version={version}\x00"
            f"vermagic={kernel} SMP mod_unload modversions\x00license=Dual MIT/GPL\x00")


def module_info(path: str) -> dict[str, str]:
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError:
        return {}
    found = {}
    for field in data.split(b"\x00"):
        key, sep, value = field.decode("utf-8", "replace").partition("=")
        if sep and key in ("name", "version", "vermagic"):
            found[key] = value
    return found


# ------------------------------------------------------------------ file helpers


def _write(root: str, rel: str, data: bytes | str, mode: int = 0o644,
           created: list[str] | None = None) -> None:
    path = _p(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as handle:
        handle.write(data.encode() if isinstance(data, str) else data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)
    if created is not None and rel not in created:
        created.append(rel)


def _link(root: str, rel: str, target: str, created: list[str]) -> None:
    path = _p(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if os.path.lexists(path):
        os.unlink(path)
    os.symlink(target, path)
    if rel not in created:
        created.append(rel)


def stub_tool(name: str, version: str) -> str:
    return (f"#!/bin/sh\n# simulated {name} (gpuk8s simulator), driver {version}\n"
            f"case \"$1\" in --version|-v) echo \"{name}:  version {version}\" ;; "
            f"*) echo \"{name}: simulated; no operation\" ;; esac\n")


# ------------------------------------------------------------------ build environment

PACKAGES = ("gcc", "make", "dkms", "build-essential")


def package_files(name: str, kernel: str) -> dict[str, tuple[str, int]]:
    """The files a package puts on the node (path -> (content, mode)); {} when unknown.
    ``linux-headers-<kernel>`` exists for the running kernel only."""
    if name == "gcc":
        return {"usr/bin/gcc": (f"#!/bin/sh\necho '{GCC_VERSION}'\n", 0o755),
                "usr/bin/cc": (f"#!/bin/sh\necho '{GCC_VERSION}'\n", 0o755)}
    if name == "make":
        return {"usr/bin/make": ("#!/bin/sh\necho 'GNU Make 4.3'\n", 0o755)}
    if name == "dkms":
        from_fake = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dkms.py")
        text = _read_text(from_fake) or _read_text(os.path.join(
            os.path.dirname(os.path.abspath(__file__)), "gpuk8s_sim_dkms.py"))
        return {"usr/sbin/dkms": (text or "", 0o755)}
    if name == "build-essential":
        return {**package_files("gcc", kernel), **package_files("make", kernel)}
    if name == f"linux-headers-{kernel}":
        base = f"usr/src/linux-headers-{kernel}"
        return {f"{base}/Makefile": (f"# kernel {kernel} build tree (simulated)\n", 0o644),
                f"{base}/include/generated/utsrelease.h":
                    (f'#define UTS_RELEASE "{kernel}"\n', 0o644)}
    return {}


def install_package(root: str, name: str) -> bool:
    """Put package ``name``'s files on the node; False when no such package exists."""
    kernel = kernel_release(root)
    files = package_files(name, kernel)
    if not files:
        return False
    for rel, (text, mode) in files.items():
        _write(root, rel, text, mode)
    if name == f"linux-headers-{kernel}":
        _link(root, f"lib/modules/{kernel}/build", f"/usr/src/linux-headers-{kernel}", [])
    return True


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError:
        return None


def find_program(root: str, *names: str) -> str | None:
    for name in names:
        for directory in ("usr/local/sbin", "usr/local/bin", "usr/sbin", "usr/bin", "sbin", "bin"):
            path = _p(root, f"{directory}/{name}")
            if os.path.isfile(path) and os.access(path, os.X_OK):
                return path
    return None


def headers_present(root: str, kernel: str) -> bool:
    """``/lib/modules/<kernel>/build`` is a directory (its absolute symlink, as the headers
    package makes it, read inside the root)."""
    path = _p(root, f"lib/modules/{kernel}/build")
    if os.path.islink(path) and os.readlink(path).startswith("/"):
        path = _p(root, os.readlink(path))
    return os.path.isdir(path)


# ------------------------------------------------------------------ install / uninstall


def read_manifest(root: str) -> dict[str, Any] | None:
    text = _read_text(_p(root, MANIFEST))
    try:
        data = json.loads(text) if text else None
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def install_user_space(root: str, version: str, nvml: bytes | None, tools: dict[str, str],
                       created: list[str]) -> None:
    """Libraries, symlinks, programs and firmware of driver ``version``."""
    for stem, soname, dev_link in LIBRARIES:
        name = f"{stem}.so.{version}"
        rel = f"{LIB_DIR}/{name}"
        if stem == "libnvidia-ml" and nvml is not None:
            _write(root, rel, nvml, 0o755, created)
        else:
            _write(root, rel, elf_shared_object(soname or name), 0o755, created)
        if soname and soname != name:
            _link(root, f"{LIB_DIR}/{soname}", name, created)
        if dev_link:
            _link(root, f"{LIB_DIR}/{dev_link}", soname or name, created)
    for name in TOOLS:
        if name in tools:
            _write(root, f"{BIN_DIR}/{name}", tools[name], 0o755, created)
    for name in STUBS:
        _write(root, f"{BIN_DIR}/{name}", stub_tool(name, version), 0o755, created)
    for name in FIRMWARE:
        _write(root, f"lib/firmware/nvidia/{version}/{name}",
               f"simulated GSP firmware {name} for driver {version}\n", 0o644, created)


def dkms_conf(version: str) -> str:
    lines = ['PACKAGE_NAME="nvidia"', f'PACKAGE_VERSION="{version}"', 'AUTOINSTALL="yes"']
    for n, name in enumerate(MODULES):
        lines += [f'BUILT_MODULE_NAME[{n}]="{name}"',
                  f'DEST_MODULE_LOCATION[{n}]="/kernel/drivers/video"']
    return "\n".join(lines) + "\n"


def build_modules(root: str, version: str, kernel: str, directory: str,
                  created: list[str] | None = None) -> list[str]:
    """The kernel modules of ``version`` built against ``kernel``'s headers, written into
    ``directory`` (relative to the root)."""
    if not headers_present(root, kernel):
        raise DriverError(
            "ERROR: Unable to find the kernel source tree for the currently running kernel.  "
            "Please make sure you have installed the kernel source files for your kernel and "
            "that they are properly configured; on Red Hat Linux systems, for example, be sure "
            "you have the 'kernel-source' or 'kernel-devel' RPM installed.  If you know the "
            "correct kernel source files are installed, you may specify the kernel source path "
            "with the '--kernel-source-path' command line option.")
    out = []
    for name in MODULES:
        rel = f"{directory}/{name}.ko"
        _write(root, rel, module_text(name, version, kernel), 0o644, created)
        out.append(rel)
    return out


def find_module(root: str, kernel: str) -> str | None:
    """The ``nvidia.ko`` modprobe would load for ``kernel`` (DKMS's copy first)."""
    for directory in (DKMS_MODULE_DIR, PLAIN_MODULE_DIR):
        path = _p(root, f"lib/modules/{kernel}/{directory}/nvidia.ko")
        if os.path.isfile(path):
            return path
    return None


def remove_files(root: str, relpaths: list[str]) -> None:
    for rel in sorted(relpaths, key=len, reverse=True):
        path = _p(root, rel)
        if os.path.islink(path) or os.path.isfile(path):
            os.unlink(path)
        elif os.path.isdir(path):
            shutil.rmtree(path)
        parent = os.path.dirname(path)
        while parent.startswith(root.rstrip("/") + "/") and parent != root.rstrip("/"):
            try:
                os.rmdir(parent)  # empty directories the install made
            except OSError:
                break
            parent = os.path.dirname(parent)


# ------------------------------------------------------------------ the kernel side


def supported(gpu: dict[str, Any], version: str) -> bool:
    """Whether driver ``version`` drives this GPU (its product's first driver branch)."""
    try:
        major = int(version.split(".")[0])
    except ValueError:
        return False
    return major >= int(gpu.get("min_driver") or 0)


def start_persistenced(root: str) -> None:
    """What ``nvidia-persistenced`` leaves while it runs: its socket."""
    socket_path = _p(root, PERSISTENCED_SOCKET)
    os.makedirs(os.path.dirname(socket_path), exist_ok=True)
    if not os.path.lexists(socket_path):
        os.mknod(socket_path, 0o777 | stat.S_IFSOCK)


def load(root: str) -> bool:
    """``modprobe nvidia``: load the installed module for the running kernel, bind the GPUs
    the driver supports, create /dev/nvidia* and the persistenced socket. False: loaded."""
    state = tree.load_state(root)
    if state["vendor"] != "nvidia":
        raise DriverError("modprobe: FATAL: Module nvidia not found (no NVIDIA GPU simulated)")
    if state["driver"]["loaded"]:
        return False
    kernel = kernel_release(root)
    path = find_module(root, kernel)
    if path is None:
        raise DriverError(f"modprobe: FATAL: Module nvidia not found in directory "
                          f"/lib/modules/{kernel}")
    info = module_info(path)
    if not info.get("vermagic", "").startswith(kernel + " "):
        raise DriverError("modprobe: ERROR: could not insert 'nvidia': Exec format error "
                          f"(built for {info.get('vermagic', '?').split(' ')[0]}, running "
                          f"{kernel})")
    version = info.get("version") or "unknown"
    state["driver"] = {"loaded": True, "version": version, "cuda": DRIVER_CUDAS.get(version)}
    for gpu in state["gpus"]:
        if gpu["status"] in ("ok", "unbound"):
            gpu["status"] = "ok" if supported(gpu, version) else "unbound"
    tree.write_module(root, state)
    for gpu in state["gpus"]:
        tree.write_gpu(root, state, gpu)
    start_persistenced(root)
    tree.save_state(root, state)
    return True


def unload(root: str) -> bool:
    """``modprobe -r nvidia``: refused while processes use the GPUs. False: not loaded."""
    state = tree.load_state(root)
    if state["vendor"] != "nvidia" or not state["driver"]["loaded"]:
        return False
    if state.get("processes"):
        raise DriverError("modprobe: FATAL: Module nvidia is in use.")
    state["driver"] = {**state["driver"], "loaded": False}
    tree.remove(_p(root, "sys/module/nvidia"))
    tree.remove(_p(root, "sys/bus/pci/drivers/nvidia"))
    tree.remove(_p(root, "proc/driver/nvidia"))
    tree.remove(_p(root, PERSISTENCED_SOCKET))
    for name in os.listdir(_p(root, "dev")) if os.path.isdir(_p(root, "dev")) else []:
        if name.startswith("nvidia"):
            tree.remove(_p(root, f"dev/{name}"))
    for gpu in state["gpus"]:
        tree.write_gpu(root, state, gpu)
    tree.save_state(root, state)
    return True


def check_build_environment(root: str, dkms: bool) -> None:
    """What the installer needs before it changes anything: ``cc``, the running kernel's
    headers, and ``dkms`` with ``--dkms``."""
    if find_program(root, "cc", "gcc") is None:
        raise DriverError(
            "ERROR: Unable to find the system utility `cc`; please make sure you have the "
            "package 'gcc' installed.  If you do have cc installed, then please check that "
            "`cc` is in your PATH.")
    if not headers_present(root, kernel_release(root)):
        build_modules(root, "", kernel_release(root), "")  # raises the installer's error
    if dkms and find_program(root, "dkms") is None:
        raise DriverError("ERROR: Failed to run `dkms status`: the dkms utility was not found; "
                          "install the 'dkms' package or run without --dkms.")


def install(root: str, version: str, *, nvml: bytes | None, tools: dict[str, str],
            dkms: bool, installer: bytes | None = None) -> dict[str, Any]:
    """Install driver ``version`` the way ``NVIDIA-Linux-x86_64-<version>.run [--dkms]`` does
    (build environment checks first, nothing changed when one fails) and record it in
    ``MANIFEST``. The module is not loaded here (``load``)."""
    check_build_environment(root, dkms)
    kernel = kernel_release(root)
    created: list[str] = []
    install_user_space(root, version, nvml, tools, created)
    if installer is not None:
        _write(root, f"{BIN_DIR}/nvidia-installer", installer, 0o755, created)
        _link(root, f"{BIN_DIR}/nvidia-uninstall", "nvidia-installer", created)
    if dkms:
        _write(root, f"usr/src/nvidia-{version}/dkms.conf", dkms_conf(version), 0o644, created)
        dkms_install(root, version, kernel)
    else:
        build_modules(root, version, kernel, f"lib/modules/{kernel}/{PLAIN_MODULE_DIR}", created)
    manifest = {"version": version, "kernel": kernel, "dkms": dkms, "files": created}
    _write(root, MANIFEST, json.dumps(manifest, indent=2) + "\n")
    return manifest


def uninstall(root: str) -> dict[str, Any] | None:
    """``nvidia-uninstall``: unload the module, remove every file the install made and the
    DKMS module. None when no driver was installed."""
    manifest = read_manifest(root)
    if manifest is None:
        return None
    unload(root)
    if manifest.get("dkms"):
        dkms_remove(root, str(manifest["version"]))
    remove_files(root, list(manifest.get("files") or []))
    tree.remove(_p(root, MANIFEST))
    return manifest


# ------------------------------------------------------------------ DKMS


def dkms_tree(version: str, kernel: str) -> str:
    return f"var/lib/dkms/nvidia/{version}/{kernel}/x86_64/module"


def dkms_install(root: str, version: str, kernel: str) -> list[str]:
    """``dkms install -m nvidia -v <version> -k <kernel>``: build against the kernel's
    headers into DKMS's tree, then copy into ``updates/dkms``."""
    if not os.path.isfile(_p(root, f"usr/src/nvidia-{version}/dkms.conf")):
        raise DriverError(f"Error! Could not find module source directory.\nDirectory: "
                          f"/usr/src/nvidia-{version} does not exist.")
    build_modules(root, version, kernel, dkms_tree(version, kernel))
    return build_modules(root, version, kernel, f"lib/modules/{kernel}/{DKMS_MODULE_DIR}")


def dkms_remove(root: str, version: str) -> bool:
    base = _p(root, f"var/lib/dkms/nvidia/{version}")
    if not os.path.isdir(base):
        return False
    for kernel in os.listdir(base):
        for name in MODULES:
            tree.remove(_p(root, f"lib/modules/{kernel}/{DKMS_MODULE_DIR}/{name}.ko"))
    tree.remove(base)
    tree.remove(_p(root, f"usr/src/nvidia-{version}"))
    return True


def dkms_status(root: str) -> list[str]:
    """``dkms status`` lines (``nvidia/550.54.15, 5.15.0-91-generic, x86_64: installed``)."""
    lines = []
    base = _p(root, "var/lib/dkms/nvidia")
    for version in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        kernels = sorted(os.listdir(os.path.join(base, version)))
        if not kernels:
            lines.append(f"nvidia/{version}: added")
        for kernel in kernels:
            lines.append(f"nvidia/{version}, {kernel}, x86_64: installed")
    return lines
