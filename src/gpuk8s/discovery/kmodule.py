"""Linux kernel modules on disk, read as kmod reads them: the ``.modinfo`` strings of a
``.ko`` (an ELF relocatable object), the kernel release a module was built for (the first
word of its ``vermagic``), the kernel release a host runs, and the modules a directory
tree holds under ``lib/modules/<release>/``.

Standalone (stdlib only, no package imports, Python 3.8): the simulator copies this file
into its roots, where the stand-in ``modprobe`` / ``depmod`` use it without gpuk8s.
"""

from __future__ import annotations

import gzip
import lzma
import os
import shutil
import struct
import subprocess

OSRELEASE = "/proc/sys/kernel/osrelease"  # what `uname -r` prints
MODULES_DIR = "/lib/modules"
SUFFIXES = (".ko", ".ko.xz", ".ko.gz", ".ko.zst")
ELF_MAGIC = b"\x7fELF"
ET_REL = 1


class ModuleFormatError(Exception):
    """The file is not a kernel module kmod could read; the message says why."""


def module_name(path: str) -> str:
    """``metax`` for ``.../metax.ko[.xz]`` (kmod: ``-`` and ``_`` are the same)."""
    base = os.path.basename(path)
    for suffix in SUFFIXES:
        if base.endswith(suffix):
            base = base[: -len(suffix)]
            break
    return base.replace("-", "_")


def read_bytes(path: str) -> bytes:
    """The module's ELF bytes (``.ko.xz`` / ``.ko.gz`` decompressed by Python's own codecs,
    ``.ko.zst`` by the ``zstd`` program: the standard library has no zstd)."""
    if path.endswith(".zst"):
        return _unzstd(path)
    try:
        if path.endswith(".xz"):
            with lzma.open(path, "rb") as handle:
                return handle.read()
        if path.endswith(".gz"):
            with gzip.open(path, "rb") as handle:
                return handle.read()
        with open(path, "rb") as handle:
            return handle.read()
    except (OSError, lzma.LZMAError, EOFError) as err:
        raise ModuleFormatError(f"{path}: unreadable: {err}") from err


def _unzstd(path: str) -> bytes:
    program = shutil.which("zstd")
    if program is None:
        raise ModuleFormatError(f"{path}: a zstd-compressed module, and no zstd program here "
                                "to read it with (Python's standard library has no zstd): "
                                "install zstd, or ship the module as .ko or .ko.xz")
    try:
        done = subprocess.run([program, "-q", "-d", "-c", "--", path], capture_output=True,
                              timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ModuleFormatError(f"{path}: zstd could not run: {err}") from err
    if done.returncode != 0:
        said = done.stderr.decode("utf-8", "replace").strip()[-300:]
        raise ModuleFormatError(f"{path}: unreadable: zstd exited with {done.returncode}: "
                                f"{said}")
    return done.stdout


def sections(data: bytes, path: str = "module") -> dict[str, bytes]:
    """Section name -> content of an ELF relocatable object (what libkmod's ELF reader
    checks: magic, class, byte order, type, a section header table inside the file)."""
    if len(data) < 52 or data[:4] != ELF_MAGIC:
        raise ModuleFormatError(f"{path}: not an ELF file")
    klass, order = data[4], data[5]
    if klass not in (1, 2) or order not in (1, 2):
        raise ModuleFormatError(f"{path}: invalid ELF class {klass} / byte order {order}")
    end = "<" if order == 1 else ">"
    if klass == 2:
        header, shdr, want_entsize = end + "HHIQQQIHHHHHH", end + "IIQQQQIIQQ", 64
    else:
        header, shdr, want_entsize = end + "HHIIIIIHHHHHH", end + "IIIIIIIIII", 40
    if len(data) < 16 + struct.calcsize(header):
        raise ModuleFormatError(f"{path}: truncated ELF header")
    (e_type, _machine, _version, _entry, _phoff, shoff, _flags, _ehsize, _phentsize,
     _phnum, shentsize, shnum, shstrndx) = struct.unpack_from(header, data, 16)
    if e_type != ET_REL:
        raise ModuleFormatError(f"{path}: ELF type {e_type}, not a relocatable object "
                                "(a kernel module is ET_REL)")
    if shentsize != want_entsize or shnum == 0 or shstrndx >= shnum \
            or shoff + shnum * shentsize > len(data):
        raise ModuleFormatError(f"{path}: invalid ELF section header table")
    table: list[tuple[int, int, int]] = []
    for index in range(shnum):
        fields = struct.unpack_from(shdr, data, shoff + index * shentsize)
        name, kind, offset, size = fields[0], fields[1], fields[4], fields[5]
        if kind != 8 and offset + size > len(data):  # SHT_NOBITS has no bytes in the file
            raise ModuleFormatError(f"{path}: ELF section {index} lies outside the file")
        table.append((name, offset, 0 if kind == 8 else size))
    _, names_at, names_size = table[shstrndx]
    names = data[names_at:names_at + names_size]
    out: dict[str, bytes] = {}
    for name, offset, size in table[1:]:
        stop = names.find(b"\0", name)
        label = names[name:stop if stop >= 0 else len(names)].decode("ascii", "replace")
        out[label] = data[offset:offset + size]
    return out


def modinfo(path: str) -> dict[str, list[str]]:
    """The ``.modinfo`` of a module: key -> values (``modinfo``'s fields, in order)."""
    found = sections(read_bytes(path), path)
    if ".modinfo" not in found:
        raise ModuleFormatError(f"{path}: no .modinfo section: not a kernel module")
    info: dict[str, list[str]] = {}
    for entry in found[".modinfo"].split(b"\0"):
        key, sep, value = entry.decode("utf-8", "replace").partition("=")
        if sep:
            info.setdefault(key, []).append(value)
    return info


def built_for(path: str) -> str:
    """The kernel release a module was built for (``vermagic``'s first word)."""
    vermagic = (modinfo(path).get("vermagic") or [""])[0].split()
    if not vermagic:
        raise ModuleFormatError(f"{path}: no vermagic in .modinfo: not a kernel module")
    return vermagic[0]


def kernel_release(root: str = "/") -> str:
    """The kernel release the host under ``root`` runs (``uname -r``): its
    ``/proc/sys/kernel/osrelease``; a container shares its host's kernel, so without that
    file (no /proc under ``root``) it is this process's own. The one reader of it (driver
    installs, the NVIDIA checks and driver build, CDI firmware paths, the simulator)."""
    try:
        with open(os.path.join(root, OSRELEASE.lstrip("/")), encoding="utf-8") as handle:
            text = handle.read().strip()
    except OSError:
        text = ""
    return text or os.uname().release


def modules_in(tree: str) -> list[tuple[str, str]]:
    """(kernel release directory, relative path) of every module file under
    ``tree/lib/modules/<release>/``, sorted."""
    base = os.path.join(tree, MODULES_DIR.lstrip("/"))
    found: list[tuple[str, str]] = []
    try:
        releases = sorted(os.listdir(base))
    except OSError:
        return found
    for release in releases:
        top = os.path.join(base, release)
        for current, dirs, names in os.walk(top):
            dirs.sort()
            for name in sorted(names):
                if name.endswith(SUFFIXES):
                    found.append((release, os.path.relpath(os.path.join(current, name), tree)))
    return found
