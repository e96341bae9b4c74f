"""dockerd's side of the runtime wrapper: a runtime in ``/etc/docker/daemon.json``, a reload,
and proof that dockerd serves it.

``configure`` adds ``"runtimes": {"<handler>": {"path": "<wrapper>"}}`` and, with
``set_default``, ``"default-runtime": "<handler>"``; ``unconfigure`` takes exactly that
back. The document keeps its other keys, their order and its indent. dockerd reloads
both keys on SIGHUP (``runtimes`` and ``default-runtime`` are live-reloadable; systemd's
docker.service does the same with ``systemctl reload docker``): no restart, running
containers are not touched, and the pid stays. A reload changes only the keys the file
sets, so taking the runtime away goes through ``explicit`` (both keys spelled out) before
the file is put back as it was. Whether dockerd serves the runtime is read
back from its API (``GET /info``: ``Runtimes``, ``DefaultRuntime``), never assumed.

Refused (``RuntimeConfigError``, nothing written): a file that is not a JSON object,
``runtimes`` that is not an object, a runtime of the handler's name that is someone else's,
a default runtime with ``runtimeArgs`` (the wrapper would drop them).
"""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Mapping
from typing import Any

from .containerd import Configured, RuntimeConfigError, signal_daemon


def _parse(text: str) -> dict[str, Any]:
    try:
        doc = json.loads(text) if text.strip() else {}
    except ValueError as err:
        raise RuntimeConfigError(f"docker daemon.json is not JSON ({err}); nothing was "
                                 "changed") from err
    if not isinstance(doc, dict):
        raise RuntimeConfigError("docker daemon.json is not a JSON object; nothing was changed")
    return doc


def _indent(text: str) -> int:
    for line in text.splitlines()[1:]:
        stripped = line.lstrip(" ")
        if stripped and len(stripped) < len(line):
            return len(line) - len(stripped)
    return 4


def _dump(doc: Mapping[str, Any], like: str) -> str:
    return json.dumps(doc, indent=_indent(like)) + "\n"


def configure(text: str, handler: str, binary: str, set_default: bool) -> Configured:
    """``text`` (daemon.json) with the wrapper as runtime ``handler``. Pure."""
    doc = _parse(text)
    runtimes = doc.get("runtimes", {})
    if not isinstance(runtimes, dict):
        raise RuntimeConfigError('docker daemon.json: "runtimes" is not an object; nothing was '
                                 "changed")
    existing = runtimes.get(handler)
    if existing is not None and (not isinstance(existing, dict)
                                 or existing.get("path") != binary):
        raise RuntimeConfigError(
            f"docker daemon.json already has a runtime {handler!r} that is not the wrapper "
            f"{binary}: choose another handler name (chart option runtime.handler); nothing "
            "was changed")
    previous = doc.get("default-runtime")
    base = runtimes.get(previous) if previous and previous != handler else None
    if isinstance(base, dict) and base.get("runtimeArgs"):
        raise RuntimeConfigError(
            f"docker's default runtime {previous!r} has runtimeArgs, which the wrapper would "
            "not pass on; nothing was changed")
    base_binary = base.get("path") if isinstance(base, dict) else None
    runtimes = {**runtimes, handler: {"path": binary}}
    doc["runtimes"] = runtimes
    if set_default:
        doc["default-runtime"] = handler
    after = _dump(doc, text) if doc != _parse(text) or not text.strip() else text
    previous_default = None if previous == handler else (str(previous) if previous else None)
    return Configured(after, after != text, previous_default,
                      str(base_binary) if base_binary else None, 0)


def unconfigure(text: str, handler: str, previous_default: str | None) -> tuple[str, bool]:
    """``text`` without the runtime; ``default-runtime`` back to ``previous_default``. Pure."""
    doc = _parse(text)
    runtimes = doc.get("runtimes")
    changed = False
    if isinstance(runtimes, dict) and handler in runtimes:
        del runtimes[handler]
        if not runtimes:
            del doc["runtimes"]
        changed = True
    if doc.get("default-runtime") == handler:
        if previous_default:
            doc["default-runtime"] = previous_default
        else:
            del doc["default-runtime"]
        changed = True
    return (_dump(doc, text), True) if changed else (text, False)


def explicit(text: str) -> str:
    """``text`` with ``runtimes`` and ``default-runtime`` set explicitly (to dockerd's
    defaults where absent): dockerd's reload changes only the keys a file sets, so taking
    our runtime away needs them there; the file as it was is written back after the reload."""
    doc = _parse(text)
    doc.setdefault("runtimes", {})
    doc.setdefault("default-runtime", "runc")
    return _dump(doc, text)


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.path)
        self.sock = sock


def docker_info(socket_path: str, timeout: float = 5.0) -> dict[str, Any]:
    """dockerd's ``GET /info``; ``RuntimeConfigError`` when it does not answer."""
    connection = _UnixConnection(socket_path, timeout)
    try:
        connection.request("GET", "/info")
        response = connection.getresponse()
        body = response.read()
    except OSError as err:
        raise RuntimeConfigError(f"dockerd on {socket_path} does not answer: {err}") from err
    finally:
        connection.close()
    if response.status != 200:
        raise RuntimeConfigError(f"dockerd on {socket_path}: GET /info answered "
                                 f"{response.status}")
    info = json.loads(body)
    if not isinstance(info, dict):
        raise RuntimeConfigError(f"dockerd on {socket_path}: GET /info is not an object")
    return info


def not_served(info: Mapping[str, Any], handler: str, binary: str | None,
               set_default: bool) -> str | None:
    """Why dockerd's ``info`` does not serve the runtime; None when it does (``binary``
    None: the runtime must be gone)."""
    entry = (info.get("Runtimes") or {}).get(handler)
    if binary is None:
        return f"dockerd still serves runtime {handler!r}" if entry else None
    if not entry:
        return f"dockerd does not serve runtime {handler!r}"
    if entry.get("path") != binary:
        return f"dockerd's runtime {handler!r} runs {entry.get('path')!r}, not {binary}"
    if set_default and info.get("DefaultRuntime") != handler:
        return f"dockerd's default runtime is {info.get('DefaultRuntime')!r}, not {handler!r}"
    return None


def reload(mode: str, socket_path: str, system_root: str) -> tuple[str, int]:
    """dockerd reloaded onto daemon.json (``signal_daemon``): its pid stays. dockerd handles
    SIGHUP itself, even when started with it ignored."""
    return signal_daemon(mode, socket_path, system_root, "dockerd", "docker", "reload")
