"""The MXMACA SDK on a host (``/opt/maca``): which image a node needs, and an atomic,
rollback-able install from a staged copy of that image's ``/opt/maca``.

Layout written here: every SDK version in its own directory under ``/opt/.gpuk8s-maca/``
and ``/opt/maca`` a relative symlink to the one in use. Switching is one ``rename`` of a
symlink (readers see the old or the new tree, never a half-copied one); the previous
version stays for ``rollback_sdk``; older ones are pruned. An ``/opt/maca`` that is a real
directory was installed by the administrator: it is left alone (``SdkState.native``).
"""

from __future__ import annotations

import os
import platform
import shutil
from dataclasses import dataclass

from ..core.payloads import NodePlatform
from ..discovery.metax import read_version_file
from ..discovery.sysfs import read_text
from ..discovery.tools import host_path
from . import files
from .driver import PayloadError, same_version

SDK_PATH = "/opt/maca"
STORE = "/opt/.gpuk8s-maca"  # one directory per installed version
KEEP = 2  # the version in use and the previous one


@dataclass(frozen=True)
class SdkState:
    version: str | None  # of /opt/maca/Version.txt
    managed: bool  # /opt/maca is our symlink into STORE
    native: bool  # /opt/maca is a directory installed by someone else
    previous: str | None = None  # a version kept for rollback


def os_release(root: str) -> dict[str, str]:
    """The fields of the node's ``/etc/os-release`` (``ID``, ``VERSION_ID``, ``ID_LIKE`` ...)."""
    fields: dict[str, str] = {}
    for line in (read_text(host_path(root, "/etc/os-release")) or "").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            fields[key.strip()] = value.strip().strip('"')
    return fields


def node_platform(root: str, product: str) -> NodePlatform:
    """The node's product, OS (``/etc/os-release`` ID, VERSION_ID) and architecture."""
    fields = os_release(root)
    return NodePlatform(product=product, os=fields.get("ID", "unknown"),
                        os_version=fields.get("VERSION_ID", ""), arch=platform.machine())


def _store(root: str) -> str:
    return host_path(root, STORE)


def read_sdk(root: str) -> SdkState:
    link = host_path(root, SDK_PATH)
    version = read_version_file(os.path.join(link, "Version.txt"))
    if os.path.islink(link):
        target = os.readlink(link)
        managed = target.startswith(os.path.basename(STORE) + "/")
        current = os.path.basename(target)
        others = [v for v in _versions(root) if v != current]
        return SdkState(version, managed, not managed, others[-1] if others else None)
    return SdkState(version, False, os.path.isdir(link))


def _versions(root: str) -> list[str]:
    try:
        entries = sorted(os.listdir(_store(root)), key=lambda v: os.path.getmtime(
            os.path.join(_store(root), v)))
    except OSError:
        return []
    return [e for e in entries if not e.startswith(".")]


def _switch(root: str, version: str) -> None:
    files.atomic_symlink(f"{os.path.basename(STORE)}/{version}", host_path(root, SDK_PATH))


def install_sdk(root: str, staged: str, want_version: str | None = None,
                want_source: str = "the wanted version") -> tuple[bool, str]:
    """Install the SDK tree ``staged`` (an image's ``/opt/maca``) as ``/opt/maca``.

    Returns (changed, version). PayloadError (nothing changed) when the payload has no
    ``Version.txt`` or another version than ``want_version`` (``want_source`` says where
    that version comes from), or when ``/opt/maca`` is an administrator's directory.
    """
    version = read_version_file(os.path.join(staged, "Version.txt"))
    if not version:
        raise PayloadError(f"SDK payload {staged} has no Version.txt: not an MXMACA tree")
    if want_version and not same_version(version, want_version):
        raise PayloadError(f"SDK payload holds SDK {version} (its Version.txt), not "
                           f"{want_version} ({want_source}): fix the payload; nothing was "
                           "changed")
    if "/" in version or version.startswith("."):
        raise PayloadError(f"SDK payload version {version!r} is not usable as a directory name")
    state = read_sdk(root)
    if state.native:
        raise PayloadError(f"{SDK_PATH} on this node is a directory the administrator installed "
                           f"(SDK {state.version or 'unknown'}): left alone")
    if state.managed and same_version(state.version, version):
        return False, version
    store = _store(root)
    final = os.path.join(store, version)
    incoming = os.path.join(store, f".incoming-{os.getpid()}")
    try:
        os.makedirs(store, exist_ok=True)
        for name in os.listdir(store):  # copies a killed process left half-way
            if name.startswith(".incoming-"):
                files.remove(os.path.join(store, name))
        shutil.copytree(staged, incoming, symlinks=True)
        files.remove(final)
        os.rename(incoming, final)
        _switch(root, version)
    except (OSError, shutil.Error) as err:
        files.remove(incoming)
        raise files.HostFileError(f"installing SDK {version} into {final} failed: {err}") from err
    _prune(root, version)
    return True, version


def _prune(root: str, current: str) -> None:
    versions = [v for v in _versions(root) if v != current]
    for old in versions[: max(0, len(versions) - (KEEP - 1))]:
        files.remove(os.path.join(_store(root), old))


def rollback_sdk(root: str) -> str | None:
    """Point ``/opt/maca`` back at the previous version; returns it (None: there is none)."""
    state = read_sdk(root)
    if not state.managed or state.previous is None:
        return None
    _switch(root, state.previous)
    return state.previous
