"""containerd's side of the runtime wrapper: a runtime handler in its config, and a restart.

``configure`` adds ``[plugins.<cri>.containerd.runtimes.<handler>]`` to the top-level
config (a copy of the default runtime's table, ``options.BinaryName`` = the wrapper,
``container_annotations`` += ``cdi.k8s.io/*``) and, with ``set_default``, points
``default_runtime_name`` at it; ``unconfigure`` takes exactly that back (restoring the
previous default). The file is edited in place with tomlkit, so the administrator's
comments and layout stay. We do not use a drop-in under ``imports``: containerd 1.x
replaces a whole plugin section per imported file (containerd#5837; NVIDIA's toolkit
works around it by copying the entire CRI section into its drop-in, which then shadows
later edits of the main file).

A changed config takes effect when containerd restarts (it does not reload): ``restart``
sends SIGHUP to the process serving the socket (found through the socket's peer
credentials; containerd exits and its service manager restarts it, as NVIDIA's
container toolkit does), or runs ``systemctl restart containerd`` on the host. Running
containers are not affected: their shims keep running.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import struct
import subprocess
import time
from dataclasses import dataclass
from typing import Any

import tomlkit

from ...core.cdi import CDI_ANNOTATION_PREFIX
from ...core.errors import ConfigError, GpuK8sError

ANNOTATIONS = (CDI_ANNOTATION_PREFIX + "*",)
RESTART_MODES = ("signal", "systemd", "none")
_VERSION_RE = re.compile(r"^(?P<kind>[a-z-]+)://v?(?P<major>\d+)\.(?P<minor>\d+)")


class RuntimeConfigError(GpuK8sError):
    """The container runtime's config cannot be changed safely; nothing was written."""


def parse_runtime_version(value: str) -> tuple[str, tuple[int, int] | None]:
    """``containerd://1.6.20~ds1`` -> ("containerd", (1, 6)); unknown -> (kind, None)."""
    match = _VERSION_RE.match(value or "")
    if not match:
        return (value.split("://", 1)[0] if "://" in (value or "") else "unknown"), None
    return match.group("kind"), (int(match.group("major")), int(match.group("minor")))


def _cri_plugin(doc: Any) -> str:
    version = doc.get("version", 1)
    if version == 2:
        return "io.containerd.grpc.v1.cri"
    if version == 3:
        return "io.containerd.cri.v1.runtime"
    raise RuntimeConfigError(
        f"containerd config version {version}: only versions 2 (containerd 1.x) and 3 (2.x) "
        "are supported; run `containerd config migrate` (2.x) or add `version = 2`"
    )


def _table(parent: Any, key: str) -> Any:
    if key not in parent:
        parent[key] = tomlkit.table()
    return parent[key]


@dataclass(frozen=True)
class Configured:
    text: str
    changed: bool
    previous_default: str | None  # default_runtime_name before (to restore)
    base_binary: str | None  # the default runtime's BinaryName (what the wrapper execs)


def configure(text: str, handler: str, binary: str, set_default: bool) -> Configured:
    """``text`` with the runtime handler added (see the module doc). Pure."""
    try:
        doc = tomlkit.parse(text or "version = 2\n")
    except Exception as err:  # tomlkit raises its own parse errors
        raise RuntimeConfigError(f"containerd config does not parse as TOML: {err}") from err
    if "version" not in doc:
        doc["version"] = 2
    cri = _table(_table(doc, "plugins"), _cri_plugin(doc))
    containerd = _table(cri, "containerd")
    runtimes = _table(containerd, "runtimes")
    previous = containerd.get("default_runtime_name")
    base_name = str(previous) if previous and previous != handler else "runc"
    base = runtimes.get(base_name)
    entry = tomlkit.table()
    if base is not None:
        for key, value in base.unwrap().items():
            entry[key] = value
    entry.setdefault("runtime_type", "io.containerd.runc.v2")
    options = entry.get("options") or {}
    base_binary = options.get("BinaryName") or None
    entry["options"] = {**options, "BinaryName": binary}
    annotations = list(entry.get("container_annotations") or [])
    entry["container_annotations"] = annotations + [a for a in ANNOTATIONS if a not in annotations]
    runtimes[handler] = entry
    if set_default:
        containerd["default_runtime_name"] = handler
    after = tomlkit.dumps(doc)
    previous_default = None if previous == handler else (str(previous) if previous else None)
    return Configured(after, after != text, previous_default,
                      str(base_binary) if base_binary else None)


def unconfigure(text: str, handler: str, previous_default: str | None) -> tuple[str, bool]:
    """``text`` without the handler; ``default_runtime_name`` back to ``previous_default``
    when it points at the handler. Pure."""
    try:
        doc = tomlkit.parse(text)
    except Exception as err:
        raise RuntimeConfigError(f"containerd config does not parse as TOML: {err}") from err
    try:
        containerd = doc["plugins"][_cri_plugin(doc)]["containerd"]
    except (KeyError, RuntimeConfigError):
        return text, False
    runtimes = containerd.get("runtimes") or {}
    if handler in runtimes:
        del runtimes[handler]
    if containerd.get("default_runtime_name") == handler:
        if previous_default:
            containerd["default_runtime_name"] = previous_default
        else:
            del containerd["default_runtime_name"]
    after = tomlkit.dumps(doc)
    return after, after != text


def cdi_enabled(text: str) -> bool:
    """Whether the config turns containerd's own CDI support on (``enable_cdi``)."""
    try:
        doc = tomlkit.parse(text)
        cri = doc["plugins"][_cri_plugin(doc)]
    except Exception:
        return False
    return bool(cri.get("enable_cdi", False))


def socket_peer_pid(path: str) -> int:
    """pid of the process serving a unix socket (SO_PEERCRED); 0 when not visible here."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(path)
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, _uid, _gid = struct.unpack("3i", creds)
    return int(pid)


def wait_for_socket(path: str, old_pid: int, timeout: float = 60.0) -> int:
    """Wait until a new process serves ``path``; its pid."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            pid = socket_peer_pid(path)
            if pid and pid != old_pid:
                return pid
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeConfigError(f"containerd did not come back on {path} within {timeout:.0f}s "
                             "after the restart: check its service manager")


def restart(mode: str, socket_path: str, system_root: str) -> str:
    """Make containerd read its config again; says what was done."""
    if mode not in RESTART_MODES:
        raise ConfigError(f"restart mode {mode!r}: choose one of {', '.join(RESTART_MODES)}")
    if mode == "none":
        return "containerd not restarted (--restart-mode none): restart it to apply the config"
    if mode == "systemd":
        argv = ["chroot", system_root, "systemctl", "restart", "containerd"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            raise RuntimeConfigError(f"{' '.join(argv)} exited with {done.returncode}: "
                                     f"{(done.stderr or done.stdout).strip()}")
        return "containerd restarted with systemctl"
    try:
        pid = socket_peer_pid(socket_path)
    except OSError as err:
        raise RuntimeConfigError(f"cannot reach containerd on {socket_path}: {err}") from err
    if pid <= 0:
        raise RuntimeConfigError(
            "containerd's pid is not visible from this pod: the signal restart mode needs "
            "hostPID (the chart sets it), or use --restart-mode systemd"
        )
    os.kill(pid, signal.SIGHUP)
    new = wait_for_socket(socket_path, pid)
    return f"containerd restarted (SIGHUP to pid {pid}; now pid {new})"
