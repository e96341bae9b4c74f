"""Minimal Linux kernel modules for simulated payloads: real-format ELF64 relocatable
objects (x86-64) that Debian's ``modinfo``, ``depmod`` and ``modprobe`` read like a
vendor's ``metax.ko``, written with ``struct`` (no compiler).

Sections, as in a module built by kbuild: ``.modinfo`` (NUL-separated ``key=value``:
version, license, ..., name, vermagic), ``.gnu.linkonce.this_module`` (``struct module``
with the module's name at offset 24), ``__versions`` (modversions CRCs), ``.symtab`` /
``.strtab`` (no symbols), ``.shstrtab``. There is no code: the module is never loaded
into a kernel (the simulator's ``modprobe`` only records the load).
"""

from __future__ import annotations

import hashlib
import struct

from .tree import layout_crc, vermagic, write_bytes

EM_X86_64 = 62
SHT_PROGBITS, SHT_SYMTAB, SHT_STRTAB = 1, 2, 3
SHF_WRITE, SHF_ALLOC = 1, 2
THIS_MODULE_SIZE = 0x400  # sizeof(struct module) differs per kernel; kmod does not check it
NAME_OFFSET = 24  # struct module: state (4, padded to 8), list_head (16), name[56]
MODULE_NAME_LEN = 56


def modinfo_fields(name: str, version: str, kernel_release: str,
                   license: str = "GPL") -> list[tuple[str, str]]:
    digest = hashlib.sha256(f"{name} {version}".encode()).hexdigest().upper()
    return [
        ("version", version),
        ("license", license),
        ("author", "MetaX (simulated by gpuk8s)"),
        ("description", f"{name} GPU driver (simulated, no code)"),
        ("srcversion", digest[:23]),
        ("depends", ""),
        ("retpoline", "Y"),
        ("name", name),
        ("vermagic", vermagic(kernel_release)),
    ]


def module_bytes(name: str, version: str, kernel_release: str, license: str = "GPL") -> bytes:
    """The ``.ko`` file of module ``name`` ``version`` built for ``kernel_release``."""
    if len(name.encode()) >= MODULE_NAME_LEN:
        raise ValueError(f"module name {name!r} is longer than {MODULE_NAME_LEN - 1} bytes")
    modinfo = b"".join(f"{k}={v}".encode() + b"\0"
                       for k, v in modinfo_fields(name, version, kernel_release, license))
    this_module = bytearray(THIS_MODULE_SIZE)
    this_module[NAME_OFFSET:NAME_OFFSET + len(name)] = name.encode()
    versions = struct.pack("<Q56s", layout_crc(kernel_release), b"module_layout")
    # (name, type, flags, content, align, link, info, entsize); link/info index sections
    plan: list[tuple[str, int, int, bytes, int, int, int, int]] = [
        (".modinfo", SHT_PROGBITS, SHF_ALLOC, modinfo, 8, 0, 0, 0),
        ("__versions", SHT_PROGBITS, SHF_ALLOC, versions, 32, 0, 0, 0),
        (".gnu.linkonce.this_module", SHT_PROGBITS, SHF_WRITE | SHF_ALLOC,
         bytes(this_module), 64, 0, 0, 0),
        (".symtab", SHT_SYMTAB, 0, bytes(24), 8, 5, 1, 24),  # the null symbol only
        (".strtab", SHT_STRTAB, 0, b"\0", 1, 0, 0, 0),
        (".shstrtab", SHT_STRTAB, 0, b"", 1, 0, 0, 0),
    ]
    shstrtab = b"\0" + b"".join(entry[0].encode() + b"\0" for entry in plan)
    body = bytearray(64)  # the ELF header, filled in last
    headers = [bytes(64)]  # section 0: SHN_UNDEF
    for label, kind, flags, content, align, link, info, entsize in plan:
        content = shstrtab if label == ".shstrtab" else content
        body += bytes(-len(body) % align)
        headers.append(struct.pack("<IIQQQQIIQQ", shstrtab.index(b"\0" + label.encode() + b"\0")
                                   + 1, kind, flags, 0, len(body), len(content), link, info,
                                   align, entsize))
        body += content
    body += bytes(-len(body) % 8)
    shoff = len(body)
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)  # 64-bit, LSB, version 1, SYSV
    body[:64] = struct.pack("<16sHHIQQQIHHHHHH", ident, 1, EM_X86_64, 1, 0, 0, shoff, 0, 64,
                            0, 0, 64, len(headers), len(headers) - 1)
    return bytes(body) + b"".join(headers)


def write_module(path: str, name: str, version: str, kernel_release: str) -> None:
    write_bytes(path, module_bytes(name, version, kernel_release))
