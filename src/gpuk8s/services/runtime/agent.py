"""container-runtime on one node: the CDI spec, the runtime wrapper, ``runtime.ready``.

Each pass:

1. the node's CDI spec (``core.cdi.build_spec``: every device with its nodes, the control
   devices, the host SDK mounted read-only and its environment; on NVIDIA nodes the
   driver's libraries, programs, firmware and IPC sockets with the hooks that make the
   libraries found, ``core.cdi.driver_edits``) is written to ``<cdi dir>/<kind>.json``
   (``metax-tech.com-gpu.json``, ``nvidia.com-gpu.json``) when it changed, after our own
   strict check (``core.cdi.parse_spec``); no GPU device yet (driver not loaded) -> no
   spec. The hooks run this agent's wrapper (``hook`` subcommand), installed for them in
   either mode, or nvidia-container-toolkit's ``nvidia-cdi-hook`` where it is installed;
2. where the runtime lacks CDI (containerd < 2.0 without ``enable_cdi``), the wrapper
   (``host.ociwrapper`` packed into one executable zip run by the host's python3) and its
   config are installed under ``--install-dir``, registered as containerd runtime handler
   ``--handler`` (optionally the default runtime) and containerd is restarted once;
3. ``runtime.ready`` is marked true once 2 is done (it does not wait for the driver:
   SPEC §12 orders container-runtime before driver-manager).

``uninstall`` undoes 1-3. The wrapper file itself is removed only when no running
container's shim still refers to it (they call it again to stop the container).
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...core.cdi import (
    DEFAULT_KIND,
    DEFAULT_SDK_PATHS,
    ContainerEdits,
    SdkSource,
    build_spec,
    driver_edits,
    parse_spec,
)
from ...core.errors import GpuK8sError
from ...discovery import discover, nvidia
from ...discovery.tools import host_path
from ...host import files, ociwrapper
from ...host.ociwrapper import CONFIG_NAME
from ...host.readiness import clear_readiness, write_readiness
from ..nodeagent import Report, Reporter
from . import containerd

log = logging.getLogger("gpuk8s.container-runtime")

WRAPPER_NAME = "gpuk8s-oci-runtime"
STATE_NAME = "state.json"
RUNC_CANDIDATES = ("/usr/sbin/runc", "/usr/bin/runc", "/usr/local/sbin/runc",
                   "/usr/local/bin/runc")
TASKS_DIR = "/run/containerd/io.containerd.runtime.v2.task"
# Packed into the wrapper: stdlib-only packages (Python 3.8+).
WRAPPER_PACKAGES = ("core", "discovery", "host")


def spec_filename(kind: str) -> str:
    return kind.replace("/", "-") + ".json"


def spec_text(spec: dict[str, Any]) -> str:
    """The spec file's content as written (compared byte for byte before a write)."""
    return json.dumps(spec, indent=2, sort_keys=True) + "\n"


def wrapper_zip(python: str) -> bytes:
    """The wrapper as one executable zip: ``#!<python>``, gpuk8s' stdlib packages, and a
    ``__main__`` calling ``gpuk8s.host.ociwrapper.main``. The same sources give the same
    bytes (fixed timestamps), so an unchanged wrapper is not rewritten."""
    sources = {"__main__.py": b"import sys\nfrom gpuk8s.host.ociwrapper import main\n"
                              b"sys.exit(main())\n"}
    for name, data in package_sources(Path(__file__).resolve().parents[2]).items():
        sources[f"gpuk8s/{name}"] = data
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in sources.items():
            archive.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), data,
                             zipfile.ZIP_DEFLATED)
    return f"#!{python}\n".encode() + buffer.getvalue()


def package_sources(package: Path) -> dict[str, bytes]:
    """``__init__.py`` and the ``WRAPPER_PACKAGES``' modules (path under the package ->
    bytes), read from the package's directory or, when it runs from a zip (an Ansible
    module's AnsiballZ payload: the modules it imports), from that zip. (importlib.resources
    would follow a module spec that aliasing importers, e.g. Ansible's module_utils, may
    replace.)"""
    wanted = re.compile(r"^(__init__\.py|(" + "|".join(WRAPPER_PACKAGES) + r")/[^/]+\.py)$")
    if package.is_dir():
        return {p.relative_to(package).as_posix(): p.read_bytes()
                for p in sorted(package.rglob("*.py"))
                if wanted.match(p.relative_to(package).as_posix())}
    archive_path = package
    while not archive_path.is_file() and archive_path != archive_path.parent:
        archive_path = archive_path.parent
    prefix = package.relative_to(archive_path).as_posix() + "/"
    with zipfile.ZipFile(archive_path) as archive:
        return {n[len(prefix):]: archive.read(n) for n in sorted(archive.namelist())
                if n.startswith(prefix) and wanted.match(n[len(prefix):])}


@dataclass
class RuntimeSettings:
    host_root: str  # the GPU host tree (discovery)
    system_root: str  # the real host / (runtime config, wrapper, CDI dir)
    device_path_prefix: str = ""  # in front of root-relative paths in the spec
    cdi_dir: str = "/etc/cdi"
    cdi_kind: str = ""
    runtime: str = "auto"  # auto | containerd | cdi (native CDI: spec only) | none
    runtime_version: str = ""  # Node status.nodeInfo.containerRuntimeVersion
    containerd_config: str = "/etc/containerd/config.toml"
    containerd_socket: str = "/run/containerd/containerd.sock"
    restart_mode: str = "signal"
    handler: str = "metax"
    set_default: bool = True
    install_dir: str = "/usr/local/gpuk8s"
    host_python: str = "/usr/bin/python3"
    status_dir: str = "/run/metax"

    def sys(self, path: str) -> str:
        return host_path(self.system_root, path)


@dataclass
class RuntimeAgent:
    settings: RuntimeSettings
    reporter: Reporter
    _hook_done: bool = False
    details: dict[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------------ decisions
    def mode(self) -> str:
        """``wrapper`` (install the runtime handler) or ``native`` (runtime reads CDI)."""
        s = self.settings
        if s.runtime in ("cdi", "none"):
            return "native"
        kind, version = containerd.parse_runtime_version(s.runtime_version)
        if s.runtime == "containerd" or kind == "containerd":
            if version is not None and version >= (2, 0):
                return "native"
            text = _read(s.sys(s.containerd_config))
            if version is not None and version >= (1, 7) and text and containerd.cdi_enabled(text):
                return "native"
            return "wrapper"
        if kind == "cri-o":
            return "native"
        return "native" if s.runtime == "auto" and kind != "docker" else "wrapper"

    # ---------------------------------------------------------------------- passes
    def one_pass(self) -> Report:
        report = self._pass()
        write_readiness(self.settings.host_root, "runtime.ready", report.state == "ready",
                        self.settings.status_dir)
        self.reporter.publish(report)
        return report

    def _pass(self) -> Report:
        s = self.settings
        mode = self.mode()
        self.details["mode"] = mode
        try:
            spec_state = self.write_spec()
            if mode == "wrapper" and not self._hook_done:
                self.install_hook()
            self._hook_done = True
        except GpuK8sError as err:
            return Report("failed", str(err), dict(self.details))
        how = (f"runtime handler {s.handler!r} (wrapper {s.install_dir}/bin/{WRAPPER_NAME})"
               if mode == "wrapper" else "the runtime's own CDI support")
        return Report("ready", f"{spec_state}; containers get it through {how}",
                      dict(self.details))

    def spec(self) -> dict[str, Any] | None:
        s = self.settings
        inventory = discover(s.host_root)
        if not inventory.has_gpus or not any(g.device_nodes for g in inventory.gpus):
            return None
        paths = tuple(p for p in DEFAULT_SDK_PATHS.get(inventory.backend, ())
                      if os.path.exists(host_path(s.host_root, p)))
        sdk = SdkSource(paths=paths) if paths else None
        kind = s.cdi_kind or DEFAULT_KIND.get(inventory.backend, "")
        extra = ContainerEdits()
        if inventory.backend == "nvidia" and inventory.driver.version:
            found = nvidia.driver_files(s.host_root, inventory.driver.version)
            for problem in found.problems:
                log.warning(problem)
            extra = driver_edits(found, found.toolkit_hook or self.wrapper_path(),
                                 s.device_path_prefix)
            self.details["driverFiles"] = len(extra.mounts)
        spec = build_spec(inventory, kind, s.device_path_prefix, sdk,
                          annotations={"gpuk8s.io/generated-by": "container-runtime"},
                          extra=extra)
        parse_spec(spec, "generated CDI spec")  # never write what we would not read
        return spec

    def spec_path(self, kind: str) -> str:
        s = self.settings
        return os.path.join(s.sys(s.cdi_dir), spec_filename(kind))

    def spec_paths(self) -> list[str]:
        """Every spec file this agent may have written (its kind, or each backend's)."""
        kinds = [self.settings.cdi_kind] if self.settings.cdi_kind else list(DEFAULT_KIND.values())
        return [self.spec_path(k) for k in kinds]

    def write_spec(self) -> str:
        spec = self.spec()
        if spec is None:
            for path in self.spec_paths():
                files.remove(path)
            self.details["devices"] = 0
            return "no GPU device on this node yet (driver not loaded): no CDI spec"
        path = self.spec_path(spec["kind"])
        if any(h.get("path") == self.wrapper_path()
               for h in (spec.get("containerEdits") or {}).get("hooks") or []):
            self.write_wrapper()  # the hooks run it, whatever the mode
        text = spec_text(spec)
        if _read(path) != text:
            files.atomic_write(path, text)
            log.info("CDI spec written", extra={"path": path, "devices": len(spec["devices"])})
        self.details["devices"] = len(spec["devices"]) - 1  # without "all"
        return f"CDI spec {self.settings.cdi_dir}/{os.path.basename(path)} with " \
               f"{self.details['devices']} device(s)"

    # ------------------------------------------------------------------- the hook
    def _state_path(self) -> str:
        return os.path.join(self.settings.sys(self.settings.install_dir), STATE_NAME)

    def wrapper_path(self) -> str:
        return f"{self.settings.install_dir}/bin/{WRAPPER_NAME}"

    def write_wrapper(self) -> str:
        """The wrapper executable (also the CDI hooks' program) in ``<install dir>/bin``;
        that directory."""
        s = self.settings
        bin_dir = os.path.join(s.sys(s.install_dir), "bin")
        os.makedirs(bin_dir, exist_ok=True)
        wrapper = os.path.join(bin_dir, WRAPPER_NAME)
        payload = wrapper_zip(s.host_python)
        if _read_bytes(wrapper) != payload:
            tmp = wrapper + ".new"
            with open(tmp, "wb") as handle:
                handle.write(payload)
            os.chmod(tmp, 0o755)
            os.replace(tmp, wrapper)
        return bin_dir

    def install_hook(self) -> None:
        s = self.settings
        if not os.path.exists(s.sys(s.host_python)):
            raise GpuK8sError(f"{s.host_python} not found on the node: the runtime wrapper needs "
                              "python3 >= 3.8 there (or use a runtime with CDI: containerd >= "
                              "1.7 with enable_cdi, CRI-O)")
        config_path = s.sys(s.containerd_config)
        text = _read(config_path)
        if text is None:
            raise GpuK8sError(f"containerd config {s.containerd_config} not found on the node "
                              "(chart option runtime.containerd.config)")
        result = containerd.configure(text, s.handler, self.wrapper_path(), s.set_default)
        runc = result.base_binary or next(
            (p for p in RUNC_CANDIDATES if os.path.exists(s.sys(p))), "runc")
        bin_dir = self.write_wrapper()
        sdk_paths = list(DEFAULT_SDK_PATHS["metax"][:1])
        files.write_json(os.path.join(bin_dir, CONFIG_NAME), {
            "runtime": runc, "specDirs": [s.cdi_dir, "/var/run/cdi"], "sdkPaths": sdk_paths,
        })
        state = files.read_json(self._state_path()) or {}
        if "previousDefault" not in state:
            state["previousDefault"] = result.previous_default
        state.update(handler=s.handler, config=s.containerd_config)
        files.write_json(self._state_path(), state)
        self.details.update(handler=s.handler, default=s.set_default, runc=runc)
        if result.changed:
            backup = config_path + ".gpuk8s-backup"
            if not os.path.exists(backup):
                files.atomic_write(backup, text)
            files.atomic_write(config_path, result.text)
            done = containerd.restart(s.restart_mode, s.sys(s.containerd_socket), s.system_root)
            log.info("containerd configured", extra={"handler": s.handler, "restart": done})

    # ------------------------------------------------------------------ uninstall
    def uninstall(self) -> list[str]:
        """Take back everything this agent put on the node; what was done."""
        s = self.settings
        done = []
        if any([files.remove(p) for p in self.spec_paths()]):
            done.append("CDI spec removed")
        state = files.read_json(self._state_path()) or {}
        config_path = s.sys(s.containerd_config)
        text = _read(config_path)
        backup = _read(config_path + ".gpuk8s-backup")
        if text is not None and state:
            after, changed = containerd.unconfigure(text, s.handler, state.get("previousDefault"))
            if backup is not None and containerd.configure(
                    backup, s.handler, self.wrapper_path(), s.set_default).text == text:
                after = backup  # untouched since we wrote it: back byte for byte
            if changed:
                files.atomic_write(config_path, after)
                done.append(containerd.restart(s.restart_mode, s.sys(s.containerd_socket),
                                               s.system_root))
        files.remove(config_path + ".gpuk8s-backup")
        users = ociwrapper.users(s.sys(TASKS_DIR), self.wrapper_path())
        install = s.sys(s.install_dir)
        if users:
            # their shims call the wrapper to stop them: the last one removes it (retired)
            config_path = os.path.join(install, "bin", ociwrapper.CONFIG_NAME)
            config = files.read_json(config_path) or {}
            config.update(retired=True, installDir=s.install_dir, tasksDir=TASKS_DIR)
            files.write_json(config_path, config)
            done.append(f"wrapper retired: {len(users)} running container(s) were created "
                        f"through it; the last one to end removes {s.install_dir}")
        else:
            for entry in (os.listdir(install) if os.path.isdir(install) else []):
                files.remove(os.path.join(install, entry))
            try:
                os.rmdir(install)
                done.append(f"{s.install_dir} removed")
            except OSError:  # the pod's mount point: emptied; the kubelet keeps the dir
                done.append(f"{s.install_dir} emptied")
        if clear_readiness(s.host_root, "runtime.ready", s.status_dir):
            done.append("runtime.ready marker removed")
        return done

def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError:
        return None


def _read_bytes(path: str) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return None
