"""Shared libraries on a host: an ELF file's ``DT_SONAME`` and the entries of the dynamic
loader's cache (``/etc/ld.so.cache``), read from the files themselves (no ``ldconfig``,
no ``readelf``: the root may be a container's or a simulator's).

Stdlib only, Python 3.8+.
"""

from __future__ import annotations

import struct

_PT_LOAD, _PT_DYNAMIC = 1, 2
_DT_NULL, _DT_STRTAB, _DT_SONAME = 0, 5, 14
_CACHE_OLD = b"ld.so-1.7.0"
_CACHE_NEW = b"glibc-ld.so.cache1.1"


def elf_soname(path: str) -> str | None:
    """The ``DT_SONAME`` of a 64-bit little-endian ELF shared object (what ``readelf -d``
    shows as ``Library soname``); None when the file is not one or has no soname."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(4 * 1024 * 1024)
    except OSError:
        return None
    if data[:4] != b"\x7fELF" or len(data) < 64 or data[4] != 2 or data[5] != 1:
        return None
    phoff, = struct.unpack_from("<Q", data, 32)
    phentsize, phnum = struct.unpack_from("<HH", data, 54)
    loads: list[tuple[int, int, int]] = []  # (vaddr, offset, filesz)
    dynamic: tuple[int, int] | None = None
    for i in range(phnum):
        start = phoff + i * phentsize
        if start + 56 > len(data):
            return None
        kind, _flags, offset, vaddr, _paddr, filesz = struct.unpack_from("<IIQQQQ", data, start)
        if kind == _PT_LOAD:
            loads.append((vaddr, offset, filesz))
        elif kind == _PT_DYNAMIC:
            dynamic = (offset, filesz)
    if dynamic is None:
        return None

    def file_offset(vaddr: int) -> int | None:
        for base, offset, size in loads:
            if base <= vaddr < base + size:
                return offset + vaddr - base
        return None

    strtab = soname = None
    offset, size = dynamic
    for entry in range(offset, min(offset + size, len(data) - 15), 16):
        tag, value = struct.unpack_from("<qQ", data, entry)
        if tag == _DT_NULL:
            break
        if tag == _DT_STRTAB:
            strtab = file_offset(value)
        elif tag == _DT_SONAME:
            soname = value
    if strtab is None or soname is None or strtab + soname >= len(data):
        return None
    end = data.find(b"\0", strtab + soname)
    return data[strtab + soname:end].decode("utf-8", "replace") if end > 0 else None


def ldcache_entries(path: str) -> list[tuple[str, str]]:
    """(library name, path) of every entry of an ld.so cache (glibc's new format, alone
    or after the old one); [] when unreadable."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError:
        return []
    base = 0
    if data.startswith(_CACHE_OLD):
        nlibs, = struct.unpack_from("<I", data, len(_CACHE_OLD) + 1)  # after magic + pad
        base = len(_CACHE_OLD) + 1 + 4 + nlibs * 12
        base += -base % 8
    if data[base:base + len(_CACHE_NEW)] != _CACHE_NEW:
        return []
    nlibs, = struct.unpack_from("<I", data, base + 20)
    entries = []
    start = base + 48  # header: magic+version (20), nlibs, len_strings, flags, ext, unused
    for i in range(nlibs):
        at = start + i * 24  # flags, key, value, osversion (int32 each), hwcap (uint64)
        if at + 24 > len(data):
            break
        _flags, key, value = struct.unpack_from("<iII", data, at)
        entries.append((_cstr(data, base + key), _cstr(data, base + value)))
    return entries


def _cstr(data: bytes, offset: int) -> str:
    end = data.find(b"\0", offset)
    return data[offset:end if end >= 0 else len(data)].decode("utf-8", "replace")
