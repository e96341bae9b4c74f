"""The CDI spec's ``createContainer`` hooks for NVIDIA driver libraries, run by the OCI
runtime (runc) as ``gpuk8s-oci-runtime hook <command> ...``, with the arguments of
nvidia-container-toolkit's ``nvidia-cdi-hook`` (so a spec may name either program):

* ``create-symlinks --link TARGET::LINK ...``: symlinks in the container (the soname links
  ``libcuda.so.1 -> libcuda.so.<version>`` and the ``.so`` links a host has);
* ``enable-cuda-compat --host-driver-version VERSION``: where the image carries CUDA's
  forward-compatibility libraries (``/usr/local/cuda/compat/libcuda.so.<version>``, one of
  them) that should win over the host's driver (see below), their folder
  goes first into the container's ``/etc/ld.so.conf.d`` (``00-compat-gpuk8s.conf``, read
  before ``00-gpuk8s-nvidia.conf``), so the ld.so cache that ``update-ldcache`` then builds
  hands out the image's ``libcuda.so.1``; otherwise it does nothing. The decision is
  nvidia-cdi-hook's (toolkit v1.18+): where the library carries the CUDA ELF note
  (``.note.cuda.fwd_compatibility``: JSON naming the CUDA version and the host driver
  branches it supports), the host's branch must be listed and the compat library newer
  than the host's driver (or, given only ``--host-cuda-version``, its CUDA version
  newer); without the note, a higher major version than the host driver's;
* ``update-ldcache --folder DIR ...``: adds the folders to the container's
  ``/etc/ld.so.conf.d`` and rebuilds its ``/etc/ld.so.cache`` with the host's ``ldconfig
  -r`` (which chroots into the container's root), so ``dlopen("libcuda.so.1")`` finds the
  mounted libraries whatever the image's distribution.

createContainer hooks run in the container's mount namespace before ``pivot_root``: the
container's root is the bundle's ``root.path``, with its mounts in place. Everything is
written from a child process chrooted into that root, so a symlink planted in the image
(``/usr/lib/x86_64-linux-gnu -> /etc``) cannot lead a write out of the container.

Stdlib only, Python 3.8+ (packed into the runtime wrapper).
"""

from __future__ import annotations

import glob
import json
import os
import struct
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import NamedTuple

CONF_NAME = "/etc/ld.so.conf.d/00-gpuk8s-nvidia.conf"
# sorts before CONF_NAME: ldconfig reads the folders in that order, the first one of a
# soname wins
COMPAT_CONF_NAME = "/etc/ld.so.conf.d/00-compat-gpuk8s.conf"
COMPAT_DIR = "/usr/local/cuda/compat"  # where CUDA images keep the forward-compat libraries
COMMANDS = ("create-symlinks", "enable-cuda-compat", "update-ldcache")
LDCONFIG_CANDIDATES = ("/sbin/ldconfig.real", "/sbin/ldconfig", "/usr/sbin/ldconfig")


class HookError(Exception):
    """The hook cannot do its work; the container must not start half-equipped."""


def container_root(state: dict[str, object]) -> str:
    """The container's root directory from the OCI state on stdin (bundle + config)."""
    bundle = state.get("bundle")
    if not isinstance(bundle, str) or not bundle:
        raise HookError("the OCI state on stdin names no bundle")
    with open(os.path.join(bundle, "config.json"), encoding="utf-8") as handle:
        config = json.load(handle)
    root = ((config.get("root") or {}).get("path")) or "rootfs"
    path = root if os.path.isabs(root) else os.path.join(bundle, root)
    if os.path.realpath(path) == "/":
        raise HookError("the container's root is the host's /: refusing to edit it")
    return path


def in_root(root: str, work: Callable[[], None]) -> None:
    """Run ``work`` in a child process chrooted into ``root``."""
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 0
        try:
            os.chroot(root)
            os.chdir("/")
            work()
        except BaseException as err:  # reported through the exit status
            sys.stderr.write(f"gpuk8s cdi hook: {err}\n")
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        return
    raise HookError(f"editing the container's root {root} failed")


def make_links(links: Sequence[tuple[str, str]]) -> None:
    """Create each ``link -> target`` (inside a chroot); an existing link is replaced, an
    existing file is left alone (the image's own copy wins)."""
    for target, link in links:
        if not link.startswith("/"):
            raise HookError(f"--link {target}::{link}: the link must be an absolute path")
        if os.path.lexists(link):
            if not os.path.islink(link) or os.readlink(link) == target:
                continue
            os.unlink(link)
        os.makedirs(os.path.dirname(link), exist_ok=True)
        os.symlink(target, link)


def write_conf(folders: Sequence[str]) -> None:
    """Our folders in ``/etc/ld.so.conf.d`` (inside a chroot), and the include line in
    ``/etc/ld.so.conf`` where an image has none."""
    os.makedirs(os.path.dirname(CONF_NAME), exist_ok=True)
    with open(CONF_NAME, "w", encoding="utf-8") as handle:
        handle.write("".join(f"{f}\n" for f in folders))
    main_conf = "/etc/ld.so.conf"
    text = ""
    if os.path.isfile(main_conf):
        with open(main_conf, encoding="utf-8") as handle:
            text = handle.read()
    if "ld.so.conf.d" not in text:
        with open(main_conf, "a", encoding="utf-8") as handle:
            handle.write(("" if not text or text.endswith("\n") else "\n")
                         + "include /etc/ld.so.conf.d/*.conf\n")


COMPAT_NOTE_SECTION = ".note.cuda.fwd_compatibility"
COMPAT_NOTE_OWNER = "NVIDIA Corporation"
_SHT_NOTE = 7


def _version(text: str) -> tuple[int, int, int] | None:
    """``575.57.08`` -> (575, 57, 8); one to three numeric parts; None otherwise."""
    parts = text.strip().split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        return None
    numbers = [int(p) for p in parts] + [0, 0]
    return numbers[0], numbers[1], numbers[2]


def compat_note(path: str) -> dict[str, object] | None:
    """The JSON of the ELF note CUDA's forward-compatibility ``libcuda.so`` carries in
    section ``.note.cuda.fwd_compatibility`` (owner ``NVIDIA Corporation``; what
    ``readelf -p .note.cuda.fwd_compatibility`` shows), keys lower-cased; None when the
    file has no such note. ``ValueError`` when the file is not ELF or the note is not a
    JSON object."""
    with open(path, "rb") as handle:
        head = handle.read(64)
        if len(head) < 52 or head[:4] != b"\x7fELF" or head[4] not in (1, 2) \
                or head[5] not in (1, 2):
            raise ValueError(f"{path}: not an ELF file")
        wide, order = head[4] == 2, "<" if head[5] == 1 else ">"
        if wide:
            shoff, = struct.unpack_from(order + "Q", head, 40)
            shentsize, shnum, shstrndx = struct.unpack_from(order + "HHH", head, 58)
            layout = order + "IIQQQQIIQQ"
        else:
            shoff, = struct.unpack_from(order + "I", head, 32)
            shentsize, shnum, shstrndx = struct.unpack_from(order + "HHH", head, 46)
            layout = order + "IIIIIIIIII"
        if not shoff or not shnum or shstrndx >= shnum \
                or shentsize < struct.calcsize(layout):
            return None
        handle.seek(shoff)
        table = handle.read(shentsize * shnum)
        if len(table) < shentsize * shnum:
            raise ValueError(f"{path}: truncated section headers")
        # (name, type, offset, size, align) per section
        sections = []
        for i in range(shnum):
            f = struct.unpack_from(layout, table, i * shentsize)
            sections.append((f[0], f[1], f[4], f[5], f[8]))

        def read(offset: int, size: int) -> bytes:
            if size > 1 << 20:
                raise ValueError(f"{path}: section of {size} bytes")
            handle.seek(offset)
            return handle.read(size)

        names = read(sections[shstrndx][2], sections[shstrndx][3])
        for name, kind, offset, size, align in sections:
            if kind != _SHT_NOTE or names[name:names.find(b"\0", name)] != \
                    COMPAT_NOTE_SECTION.encode():
                continue
            data = read(offset, size)
            if len(data) < 12:
                return None
            namesz, descsz, _ = struct.unpack_from(order + "III", data, 0)
            step = align if align in (4, 8) else 4
            padded = (namesz + step - 1) // step * step
            owner = data[12:12 + namesz].rstrip(b"\0").decode("utf-8", "replace")
            if not namesz or not descsz or owner != COMPAT_NOTE_OWNER:
                return None
            desc = data[12 + padded:12 + padded + descsz].strip(b"\0")
            try:
                found = json.loads(desc.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as err:
                raise ValueError(f"{path}: the CUDA compat note is not JSON: {err}") from None
            if not isinstance(found, dict):
                raise ValueError(f"{path}: the CUDA compat note is not a JSON object")
            return {str(k).lower(): v for k, v in found.items()}
    return None


def use_compat(library: str, host_driver: str, host_cuda: str = "") -> bool:
    """Whether the container should take its forward-compatibility ``library``
    (``.../libcuda.so.<version>``) over the host driver's, as nvidia-cdi-hook decides:
    with the CUDA ELF note, the host driver's branch (major version) must be one the
    note lists and the library's version above the host driver's; given no host driver
    version, the note's CUDA version above ``host_cuda``. Without a readable note: never
    when only the CUDA version is known, else when the library's major version is above
    the host driver's."""
    compat = _version(os.path.basename(library)[len("libcuda.so."):])
    host = _version(host_driver) if host_driver else None
    cuda = _version(host_cuda) if host_cuda else None
    try:
        note = compat_note(library)
    except (OSError, ValueError):
        note = None
    if note is not None:
        if compat is None or host is None:
            mine = _version(str(note.get("cuda version", "")))
            return cuda is not None and mine is not None and mine > cuda
        branches = note.get("driver")
        if not isinstance(branches, list) or host[0] not in branches:
            return False
        return compat > host
    if host_cuda or compat is None or host is None:
        return False
    return host[0] < compat[0]


def compat_folder(
    host_driver: str, compat_dir: str = COMPAT_DIR, host_cuda: str = ""
) -> str | None:
    """The folder of the image's CUDA forward-compatibility ``libcuda.so.<version>`` where
    ``use_compat`` says to take it, else None (also with no such library or more than
    one). Paths are the container's (called inside a chroot)."""
    found = [p for p in glob.glob(os.path.join(compat_dir, "libcuda.so.*.*"))
             if os.path.isfile(p)]
    if len(found) != 1 or not use_compat(found[0], host_driver, host_cuda):
        return None
    return os.path.dirname(found[0])


def enable_compat(host_driver: str, compat_dir: str, host_cuda: str = "") -> None:
    """``compat_folder``'s folder into ``COMPAT_CONF_NAME`` (inside a chroot), when there
    is one."""
    folder = compat_folder(host_driver, compat_dir, host_cuda)
    if folder is None:
        return
    os.makedirs(os.path.dirname(COMPAT_CONF_NAME), exist_ok=True)
    with open(COMPAT_CONF_NAME, "w", encoding="utf-8") as handle:
        handle.write(f"{folder}\n")


def ldconfig() -> str:
    for path in LDCONFIG_CANDIDATES:
        if os.access(path, os.X_OK):
            return path
    raise HookError(f"no ldconfig on the host ({', '.join(LDCONFIG_CANDIDATES)})")


class HookArgs(NamedTuple):
    """A hook's command and options (nvidia-cdi-hook's)."""

    command: str
    links: list[tuple[str, str]]
    folders: list[str]
    host_driver: str = ""  # enable-cuda-compat --host-driver-version
    compat_dir: str = COMPAT_DIR  # enable-cuda-compat --cuda-compat-container-root
    host_cuda: str = ""  # enable-cuda-compat --host-cuda-version


def parse(args: Sequence[str]) -> HookArgs:
    """The command and its options from nvidia-cdi-hook's arguments."""
    if not args or args[0] not in COMMANDS:
        raise HookError("usage: hook create-symlinks --link TARGET::LINK ... | "
                        "enable-cuda-compat --host-driver-version VERSION | "
                        "update-ldcache --folder DIR ...")
    command = args[0]
    allowed = {"create-symlinks": ("--link",), "update-ldcache": ("--folder",),
               "enable-cuda-compat": ("--host-driver-version", "--host-cuda-version",
                                      "--cuda-compat-container-root")}[command]
    links: list[tuple[str, str]] = []
    folders: list[str] = []
    host_driver = host_cuda = ""
    compat_dir = COMPAT_DIR
    rest = list(args[1:])
    while rest:
        flag = rest.pop(0)
        value = None
        if "=" in flag:
            flag, value = flag.split("=", 1)
        elif rest:
            value = rest.pop(0)
        if value is None:
            raise HookError(f"{flag} needs a value")
        if flag in ("--container-spec", "--ldconfig-path"):
            continue  # nvidia-cdi-hook's options we do not need: accepted for compatibility
        if flag not in allowed:
            raise HookError(f"unknown option {flag} for {command}")
        if flag == "--link":
            target, sep, link = value.partition("::")
            if not sep or not target or not link:
                raise HookError(f"--link {value}: write TARGET::LINK")
            links.append((target, link))
        elif flag == "--folder":
            if not value.startswith("/"):
                raise HookError(f"--folder {value}: an absolute path")
            folders.append(value)
        elif flag == "--host-driver-version":
            host_driver = value
        elif flag == "--host-cuda-version":
            host_cuda = value
        elif flag == "--cuda-compat-container-root":
            if not value.startswith("/"):
                raise HookError(f"--cuda-compat-container-root {value}: an absolute path")
            compat_dir = value
    return HookArgs(command, links, folders, host_driver, compat_dir, host_cuda)


def main(args: Sequence[str], stdin: str | None = None) -> int:
    try:
        command, links, folders, host_driver, compat_dir, host_cuda = parse(args)
        state = json.loads(sys.stdin.read() if stdin is None else stdin)
        root = container_root(state)
        if command == "create-symlinks":
            in_root(root, lambda: make_links(links))
        elif command == "enable-cuda-compat":
            if host_driver or host_cuda:
                in_root(root, lambda: enable_compat(host_driver, compat_dir, host_cuda))
        elif folders:
            in_root(root, lambda: write_conf(folders))
            done = subprocess.run([ldconfig(), "-r", root], capture_output=True, text=True,
                                  check=False)
            if done.returncode != 0:
                raise HookError(f"ldconfig -r {root}: {done.stderr.strip()}")
    except (HookError, OSError, ValueError) as err:
        sys.stderr.write(f"gpuk8s cdi hook: {err}\n")
        return 1
    return 0
