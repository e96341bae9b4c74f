"""Kernel driver + SDK install / upgrade (the ``gpu_driver`` module's logic).

A *payload* is what gets installed: a directory laid out like the host (``opt/mxdriver``,
``opt/maca``, ``lib/modules/...``), a ``.deb``, an ``.rpm`` or the vendor's ``.run``
installer. ``decide`` compares what is installed with what is wanted under a deploy
policy; ``install_commands`` says how a payload goes onto a host root; the module runs
the steps. Installing into a root other than ``/`` unpacks the package's files only
(no package database, no maintainer scripts) — documented, not hidden.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ..core.errors import ConfigError, GpuK8sError

POLICIES = ("IfNotPresent", "Always", "Never")
KINDS = ("dir", "deb", "rpm", "run")
DRIVER_VERSION_FILE = "/opt/mxdriver/Version.txt"
# What a GPU process holds open (REFERENCE §A: /dev/mxcd, /dev/dri/*; NVIDIA: /dev/nvidia*).
GPU_DEVICE_PREFIXES = ("/dev/dri/", "/dev/mxcd", "/dev/mxnd", "/dev/mxgd", "/dev/nvidia")


class DriverError(GpuK8sError):
    """Installing, loading or unloading the driver failed; the message says what to do."""


@dataclass(frozen=True)
class DriverState:
    loaded: bool
    loaded_version: str | None  # the running module's version (/sys/module/<mod>/version)
    installed_version: str | None  # on disk (/opt/mxdriver/Version.txt)
    sdk_version: str | None

    def to_dict(self) -> dict[str, object]:
        return {
            "loaded": self.loaded,
            "loaded_version": self.loaded_version,
            "installed_version": self.installed_version,
            "sdk_version": self.sdk_version,
        }


@dataclass(frozen=True)
class Decision:
    install: bool
    load: bool
    reason: str


def same_version(a: str | None, b: str | None) -> bool:
    return a is not None and b is not None and a.strip().lstrip("v") == b.strip().lstrip("v")


def decide(policy: str, wanted: str | None, state: DriverState) -> Decision:
    """What to do: ``IfNotPresent`` installs when the wanted version is not the one
    installed and loaded; ``Always`` reinstalls every time; ``Never`` touches nothing."""
    if policy not in POLICIES:
        raise ConfigError(f"deploy_policy {policy!r}: choose one of {', '.join(POLICIES)}")
    if policy == "Never":
        return Decision(False, False, "deploy_policy Never: the host's driver is left alone")
    if not wanted:
        raise ConfigError(f"version is required with deploy_policy {policy} (e.g. '2.33.0.6')")
    if policy == "Always":
        return Decision(True, True, f"deploy_policy Always: reinstalling {wanted}")
    if not same_version(state.installed_version, wanted):
        was = state.installed_version or "nothing"
        return Decision(True, True, f"installed {was}, wanted {wanted}")
    if not (state.loaded and same_version(state.loaded_version, wanted)):
        running = state.loaded_version if state.loaded else "not loaded"
        return Decision(False, True, f"{wanted} installed but the running driver is {running}")
    return Decision(False, False, f"{wanted} installed and loaded")


def payload_kind(path: str, kind: str = "auto") -> str:
    if not os.path.exists(path):
        raise ConfigError(f"payload {path} does not exist on the host")
    if kind != "auto":
        if kind not in KINDS:
            raise ConfigError(f"payload_kind {kind!r}: choose one of auto, {', '.join(KINDS)}")
        return kind
    if os.path.isdir(path):
        return "dir"
    for suffix in ("deb", "rpm", "run"):
        if path.endswith("." + suffix):
            return suffix
    raise ConfigError(
        f"payload {path}: cannot tell its kind from the name; use a directory, .deb, .rpm or "
        ".run, or set payload_kind"
    )


def install_commands(kind: str, payload: str, root: str,
                     run_args: tuple[str, ...] = ()) -> list[list[str]]:
    """argv lists that install a package payload (``dir`` payloads are copied by the
    caller). On ``/`` the system's package manager / the vendor installer runs; under
    another root the files are unpacked there."""
    real = os.path.realpath(root) == "/"
    if kind == "deb":
        return [["dpkg", "-i", payload]] if real else [["dpkg-deb", "-x", payload, root]]
    if kind == "rpm":
        if real:
            return [["rpm", "-U", "--replacepkgs", "--replacefiles", payload]]
        return [["sh", "-c", 'rpm2cpio "$1" | (cd "$2" && cpio -idmu --quiet)', "rpm-unpack",
                 payload, root]]
    if kind == "run":
        if real:
            return [["sh", payload, *run_args]]
        # makeself archives: unpack without running the embedded installer
        return [["sh", payload, "--noexec", "--target", root]]
    raise ConfigError(f"no install command for payload kind {kind!r}")


def expand(argv: list[str], **values: str) -> list[str]:
    """``{host_root}`` / ``{payload}`` / ``{module}`` placeholders in a command."""
    out = []
    for item in argv:
        for key, value in values.items():
            item = item.replace("{" + key + "}", value)
        out.append(item)
    return out


def read_version_file(path: str) -> str | None:
    """``key:version`` (``Version:2.33.0``) or a bare version, first usable line."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    for line in lines:
        value = line.split(":", 1)[1] if ":" in line else line
        if value.strip():
            return value.strip()
    return None


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    command: str
    device: str


def gpu_processes(root: str) -> list[GpuProcess]:
    """Processes holding a GPU device open (``<root>/proc/<pid>/fd/*``)."""
    proc = os.path.join(root, "proc")
    found: list[GpuProcess] = []
    try:
        pids = sorted(int(p) for p in os.listdir(proc) if p.isdigit())
    except OSError:
        return found
    for pid in pids:
        fd_dir = os.path.join(proc, str(pid), "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if target.startswith(GPU_DEVICE_PREFIXES):
                found.append(GpuProcess(pid, _comm(proc, pid), target))
                break
    return found


def _comm(proc: str, pid: int) -> str:
    try:
        with open(os.path.join(proc, str(pid), "comm"), encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError:
        return "?"


def busy_message(processes: list[GpuProcess]) -> str:
    shown = ", ".join(f"{p.pid} ({p.command}: {p.device})" for p in processes[:10])
    more = f" and {len(processes) - 10} more" if len(processes) > 10 else ""
    return (
        f"refusing to unload the GPU driver: {len(processes)} process(es) use the GPUs: "
        f"{shown}{more}. Drain the node first (playbooks/maintenance.yml), or set force: true"
    )


VERSION_RE = re.compile(r"^[0-9A-Za-z][0-9A-Za-z.+_~-]*$")


def check_version(name: str, value: str | None) -> None:
    if value is not None and not VERSION_RE.match(value):
        raise ConfigError(f"{name} {value!r} is not a version string (e.g. '2.33.0.6')")
