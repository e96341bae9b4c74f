"""Prove a containerd config before it replaces the node's: a private containerd of the
node's own generation loads the candidate and must load its CRI plugin and serve the
runtime handler.

The private containerd is the node's own binary: the program of the process serving the
node's socket (``/proc/<pid>/exe``, so the same build even where the file on disk was
replaced; the agent has hostPID). It runs the candidate with only what would touch the
node's containerd moved aside: its root, state, sockets (``[grpc]``/``[ttrpc]``, or the
server plugins of config version 4), debug and metrics addresses, the ``opt`` plugin's
directory and the CRI stream server's port (any free one) go to a directory of its own
(``<install dir>/proof/<pid>`` on the node, which the agent's pod may write), the drop-ins
are imported as copies in containerd's order (ours last), the runtimes'
``base_runtime_spec`` files are read where this process sees them, and NRI (a node-wide
socket) is disabled; every other setting is the candidate's. It must answer CRI ``Status``
(the CRI plugin loaded: ``containerd config dump`` exits 0 even when it does not) with the
handler served; then it is stopped and its directory removed.

A config the private containerd does not take is only blamed on the candidate when the same
containerd does take the original: a node where no private containerd can run (containerd
not running or not visible, a runtime that is not containerd itself, e.g. k3s' embedded
one, or a config the private one cannot run even unedited: a devmapper pool, a port of its
own) is not proven, and says so (``Proof.skipped``); the check after the restart and the
way back (``agent._put_back``) still hold there.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Any

import tomlkit

from ...host.serving import serving_program
from . import containerd

PROOF_DIR = "/run/gpuk8s/proof"
START_TIMEOUT = 30.0
# plugins with a node-wide resource no private copy may take
DISABLED = ("io.containerd.nri.v1.nri",)


@dataclass(frozen=True)
class Proof:
    """``failed``: why the candidate is refused; ``skipped``: why it could not be proven
    (the edit goes ahead, checked after the restart); both None: proven."""

    failed: str | None = None
    skipped: str | None = None
    binary: str = ""


def node_binary(socket_path: str) -> tuple[str, str] | str:
    """(program, its ``--version``) of the containerd serving ``socket_path``, or why none."""
    served = serving_program(socket_path)
    if served is None:
        return f"no containerd process visible on {socket_path}"
    pid, exe = served
    try:
        done = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30,
                              check=False)
    except OSError as err:
        return f"the program of pid {pid} cannot be run here ({err.strerror or err})"
    except subprocess.TimeoutExpired:
        return f"{exe} --version did not answer"
    version = done.stdout.strip()
    if done.returncode != 0 or not version.startswith("containerd "):
        return f"pid {pid} serving {socket_path} is not containerd itself ({version[:80]!r})"
    words = version.split()  # containerd <package> <version> <revision>
    return exe, f"containerd {words[2]}" if len(words) >= 3 else version


def private_config(text: str, base: str, config_dir: str, to_host: Any,
                   drop_in: str | None = None) -> str:
    """``text`` with everything that would touch the node's containerd moved under ``base``
    (a directory as this process sees it); ``config_dir``: the node's config directory
    (relative imports), ``to_host``: a node path as this process sees it."""
    doc: dict[str, Any] = dict(tomlkit.parse(text or "version = 2\n").unwrap())
    version = int(doc.get("version", 1))
    sock = f"{base}/containerd.sock"
    doc.update(root=f"{base}/root", state=f"{base}/state")
    doc.pop("cgroup", None)  # never move the node's containerd cgroup's tasks
    doc["disabled_plugins"] = sorted({*doc.get("disabled_plugins", []), *DISABLED})
    # the drop-ins as copies (their files' paths seen from here too), in containerd's
    # order, ours last
    imported = [dict(tomlkit.parse(text).unwrap()) for text in containerd.resolve_imports(
        tomlkit.dumps({"imports": doc.get("imports", [])}),
        os.path.join(config_dir, "config.toml"), to_host).values()]
    if drop_in is not None:
        imported.append(dict(tomlkit.parse(drop_in).unwrap()))
    doc["imports"] = []
    for number, each in enumerate(imported):
        _seen_from_here(each, to_host)
        path = f"{base}/import-{number:03d}.toml"
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(tomlkit.dumps(each))
        doc["imports"].append(path)
    _seen_from_here(doc, to_host)
    plugins = doc.setdefault("plugins", {})
    servers = {"grpc": sock, "ttrpc": sock + ".ttrpc", "debug": "", "metrics": ""}
    for name, address in servers.items():
        if version >= 4:
            plugins.setdefault(f"io.containerd.server.v1.{name}", {})["address"] = address
        else:
            doc.setdefault(name, {})["address"] = address
    plugins.setdefault("opt" if version == 1 else "io.containerd.internal.v1.opt", {})[
        "path"] = f"{base}/opt"
    plugins.setdefault("cri" if version == 1 else "io.containerd.grpc.v1.cri", {})[
        "stream_server_port"] = "0"
    return tomlkit.dumps(doc)


def _seen_from_here(doc: dict[str, Any], to_host: Any) -> None:
    """The runtimes' ``base_runtime_spec`` files (read when the CRI plugin loads) as this
    process sees them, where they are there (a node path; a path already seen from here
    stays)."""
    for section in (doc.get("plugins") or {}).values():
        runtimes = ((section or {}).get("containerd") or {}).get("runtimes") \
            if isinstance(section, dict) else None
        for runtime in (runtimes or {}).values():
            spec = runtime.get("base_runtime_spec") if isinstance(runtime, dict) else None
            if spec and os.path.isabs(spec) and os.path.exists(to_host(spec)):
                runtime["base_runtime_spec"] = to_host(spec)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _unmount_under(path: str) -> None:
    """Whatever the private containerd mounted under ``path`` (deepest first)."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as handle:
            points = [line.split()[4] for line in handle]
    except OSError:
        return
    for point in sorted((p for p in points if p.startswith(path + "/")), reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def _log_reason(log: str) -> str:
    """The private containerd's own words on why the CRI did not load."""
    lines = [line for line in log.splitlines() if "level=error" in line or
             "failed to load plugin" in line or "level=fatal" in line]
    return lines[-1].strip()[-400:] if lines else (log.strip().splitlines() or ["no log"])[-1]


class Unsafe(Exception):
    """A private containerd on this config would share something with the node's."""


def _own_paths(exe: str, config: str, base: str) -> str | None:
    """None when containerd's own reading of the private config (``config dump``: drop-ins
    merged) keeps its root, state and socket under ``base``; else why not."""
    try:
        done = subprocess.run([exe, "--config", config, "config", "dump"], capture_output=True,
                              text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"containerd config dump failed ({err})"
    if done.returncode != 0:
        return f"containerd config dump exited with {done.returncode}: {done.stderr.strip()[-300:]}"
    for what in ("root", "state", "containerd.sock"):
        if f'"{base}/{what}"' not in done.stdout and f"'{base}/{what}'" not in done.stdout:
            return f"its {what} would not be its own (a drop-in sets it)"
    return None


def run_private(exe: str, text: str, base: str, config_dir: str, to_host: Any, handler: str,
                binary: str | None, set_default: bool, drop_in: str | None = None
                ) -> str | None:
    """Start ``exe`` on ``text`` (private, under ``base``); None when its CRI loaded and
    serves the handler as asked (``binary`` None: any CRI will do), else why not."""
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(base, mode=0o700)
    config = os.path.join(base, "config.toml")
    with open(config, "w", encoding="utf-8") as handle:
        handle.write(private_config(text, base, config_dir, to_host, drop_in))
    log_path = os.path.join(base, "containerd.log")
    sock = os.path.join(base, "containerd.sock")
    guard = _own_paths(exe, config, base)
    if guard is not None:
        shutil.rmtree(base, ignore_errors=True)
        raise Unsafe(guard)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([exe, "--config", config], stdout=log, stderr=log,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    reason: str | None = "not started"
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                reason = f"it exited with {proc.returncode}"
                break
            if os.path.exists(sock):
                try:
                    served = containerd.cri_config(sock, timeout=2.0)
                except containerd.RuntimeConfigError as err:
                    reason = f"its CRI plugin did not load ({err})"
                    if "UNIMPLEMENTED" in str(err):  # serving without the CRI: final
                        break
                else:
                    reason = None if binary is None else containerd.not_served(
                        served, handler, binary, set_default)
                    break
            time.sleep(0.3)
    finally:
        _stop(proc)
        with open(log_path, encoding="utf-8", errors="replace") as handle:
            log_text = handle.read()
        _unmount_under(base)
        shutil.rmtree(base, ignore_errors=True)
    if reason is not None and (proc.returncode or "did not load" in reason):
        reason += f": {_log_reason(log_text)}"
    return reason


def prove(socket_path: str, original: str, candidate: str, config_dir: str, to_host: Any,
          handler: str, binary: str, set_default: bool, drop_in: str | None = None,
          work_dir: str = "") -> Proof:
    """Whether the node's containerd would serve the handler from ``candidate`` (see the
    module doc), with ``drop_in`` (our own, imported last) if given; ``original``: the
    config as it is (the control)."""
    found = node_binary(socket_path)
    if isinstance(found, str):
        return Proof(skipped=found)
    exe, version = found
    parent = work_dir or to_host(PROOF_DIR)
    base = os.path.join(parent, str(os.getpid()))
    try:
        return _prove(exe, version, original, candidate, base, config_dir, to_host, handler,
                      binary, set_default, drop_in)
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(parent)  # when no other proof runs there


def _prove(exe: str, version: str, original: str, candidate: str, base: str,
           config_dir: str, to_host: Any, handler: str, binary: str, set_default: bool,
           drop_in: str | None) -> Proof:
    try:
        why = run_private(exe, candidate, base, config_dir, to_host, handler, binary,
                          set_default, drop_in)
        if why is None:
            return Proof(binary=version)
        control = run_private(exe, original, base, config_dir, to_host, handler, None,
                              set_default)
    except Unsafe as err:
        return Proof(skipped=f"a private {version} cannot run this config apart from the "
                             f"node's: {err}", binary=version)
    except OSError as err:  # its directory cannot be made here
        return Proof(skipped=f"no private {version}: {err.strerror or err} ({base})",
                     binary=version)
    if control is not None:
        return Proof(skipped=f"a private {version} does not run the unedited config either "
                             f"({control})", binary=version)
    return Proof(failed=f"a private {version} on the edited config: {why}", binary=version)
