"""Payload images of the operator scheme (SPEC §5, §12): driver and MXMACA SDK images.

SDK images are ``<name>:<tag>`` with an explicit tag, e.g.
``maca-c500:2.18.0.3-ubuntu18.04-amd64``: the name says the product line
(MXC500 -> ``maca-c500``, MXN100 -> ``maca-n100``), the tag ``<version>-<os><osversion>-<arch>``.
``select_sdk_image`` picks one for a node from its product, OS and architecture. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import ConfigError

# SDK image per product: the product's own image when listed, else its line's (the C-series
# "Xiyun" cards share the C500 SDK, the N-series the N100 one; SPEC §12).
SDK_LINE = {"C500": "maca-c500", "C550": "maca-c500", "C588": "maca-c500", "C600": "maca-c500",
            "C280": "maca-c500", "N100": "maca-n100", "N260": "maca-n100"}
ARCH_ALIASES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
_TAG_RE = re.compile(r"^(?P<version>[0-9][0-9A-Za-z.+_]*)-(?P<os>[a-z]+)(?P<osver>[0-9][0-9.]*)"
                     r"-(?P<arch>[a-z0-9_]+)$")
_REF_RE = re.compile(r"^(?:(?P<registry>[^/]+(?:/[^/:]+)*)/)?(?P<name>[a-z0-9._-]+)"
                     r":(?P<tag>[A-Za-z0-9_][A-Za-z0-9._-]{0,127})$")


@dataclass(frozen=True)
class SdkImage:
    ref: str  # as given (registry/name:tag)
    name: str  # last path element, e.g. maca-c500
    tag: str
    version: str | None = None
    os: str | None = None  # e.g. ubuntu
    os_version: str | None = None  # e.g. 18.04
    arch: str | None = None  # amd64 / arm64


def parse_sdk_image(ref: str) -> SdkImage:
    match = _REF_RE.match(ref.strip())
    if not match:
        raise ConfigError(f"maca.payload.images: {ref!r} is not name:tag with an explicit tag "
                          "(e.g. maca-c500:2.18.0.3-ubuntu18.04-amd64)")
    tag = match.group("tag")
    parts = _TAG_RE.match(tag)
    if not parts:
        return SdkImage(ref, match.group("name"), tag)
    return SdkImage(ref, match.group("name"), tag, parts.group("version"), parts.group("os"),
                    parts.group("osver"), ARCH_ALIASES.get(parts.group("arch"),
                                                           parts.group("arch")))


@dataclass(frozen=True)
class NodePlatform:
    product: str  # e.g. C500
    os: str  # /etc/os-release ID, e.g. ubuntu
    os_version: str  # VERSION_ID, e.g. 22.04
    arch: str  # amd64 / arm64


def sdk_names_for(product: str) -> tuple[str, ...]:
    """Image names to look for, best first: ``maca-<product>`` then the product line's."""
    own = f"maca-{product.lower()}"
    line = SDK_LINE.get(product.upper())
    return (own,) if line is None or line == own else (own, line)


def select_sdk_image(images: Sequence[str], node: NodePlatform) -> SdkImage:
    """The SDK image for ``node``: right product name, same architecture (when the tag says),
    then the same OS and version, else the same OS (newest version not above the node's),
    else an image whose tag names no OS. ConfigError naming what was looked for otherwise."""
    parsed = [parse_sdk_image(ref) for ref in images]
    names = sdk_names_for(node.product)
    arch = ARCH_ALIASES.get(node.arch, node.arch)
    for name in names:
        candidates = [i for i in parsed if i.name == name and i.arch in (None, arch)]
        if not candidates:
            continue
        exact = [i for i in candidates if i.os == node.os and i.os_version == node.os_version]
        if exact:
            return exact[-1]
        same_os = [i for i in candidates if i.os == node.os]
        older = [i for i in same_os if _vkey(i.os_version) <= _vkey(node.os_version)]
        if older:
            return max(older, key=lambda i: _vkey(i.os_version))
        generic = [i for i in candidates if i.os is None]
        if generic:
            return generic[-1]
    listed = ", ".join(images) or "none"
    raise ConfigError(
        f"no SDK image for this node ({node.product}, {node.os} {node.os_version}, {arch}) in "
        f"maca.payload.images ({listed}): add {names[-1]}:<version>-{node.os}{node.os_version}-"
        f"{arch}"
    )


def _vkey(version: str | None) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version or ""))
