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
   ``--handler`` (optionally the default runtime) and containerd is restarted once; where
   it has CDI (containerd >= 2.0), its CRI must say so (``enable_cdi``);
3. ``runtime.ready`` is marked true once containerd's CRI shows it serves 2 (the handler
   with the wrapper, or CDI), read back over its socket every pass, never assumed (it does
   not wait for the driver: SPEC §12 orders container-runtime before driver-manager).

An edited containerd config is first proven by a private containerd of the node's own
binary (``proof``): refused there, the file is not touched. A restart that fails
(containerd ignores SIGHUP, does not come back, or comes back without its CRI or the
handler) puts the config back as it was, restarts containerd onto it again where it was
restarted onto the edit, waits for its CRI, and only then reports ``failed`` with the
reason; the same edit is not tried again until containerd (its pid) or its config changes,
so a broken node is never restarted in a loop. A node without a containerd config gets a
minimal one of ours (removed at uninstall); on containerd 2.x a CRI drop-in gets a drop-in
of ours (``containerd.configure``). With ``--restart-mode none`` the edit stays and
the state is ``pending`` until someone restarts containerd.

``uninstall`` undoes 1-3. The wrapper file itself is removed only when no running
container's shim still refers to it (they call it again to stop the container).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import logging
import os
import re
import zipfile
from collections.abc import Callable, Mapping
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
from ...host.serving import peer_pid_or_zero
from ..nodeagent import Report, Reporter
from . import containerd, docker, proof
from .containerd import Configured, RuntimeConfigError

log = logging.getLogger("gpuk8s.container-runtime")

WRAPPER_NAME = "gpuk8s-oci-runtime"
STATE_NAME = "state.json"
# in the install directory when the agent made it: uninstall removes the directory only then
# (one that was there before, a pod's mount point or a directory the node's installer left,
# is emptied and stays)
CREATED_NAME = ".created-by-gpuk8s"
RUNC_CANDIDATES = ("/usr/sbin/runc", "/usr/bin/runc", "/usr/local/sbin/runc",
                   "/usr/local/bin/runc")
TASKS_DIR = "/run/containerd/io.containerd.runtime.v2.task"
# Packed into the wrapper: stdlib-only packages (Python 3.8+).
WRAPPER_PACKAGES = ("core", "discovery", "host")
RESTART_TIMEOUT = 60.0  # for the runtime to come back serving the new config


class RestartPending(GpuK8sError):
    """The config is edited; the runtime has not been restarted onto it (restart mode none)."""


@dataclass(frozen=True)
class Backend:
    """The container runtime whose config gets the wrapper: containerd or dockerd."""

    name: str
    config: str  # its config file (node path)
    socket: str  # its API socket (node path)
    option: str  # the chart option naming the config
    configure: Callable[[str, str, str, bool, Mapping[str, str] | None], Configured]
    unconfigure: Callable[[str, str, str | None], tuple[str, bool]]
    served: Callable[..., Any]  # (socket[, timeout]) -> what it serves
    not_served: Callable[[Any, str, str | None, bool], str | None]
    restart: Callable[[str, str, str], tuple[str, int]]
    new_process: bool  # containerd restarts (a new pid); dockerd reloads in place
    # the text to load on the way back to ``text`` (dockerd: the keys it must unset spelled out)
    loadable: Callable[[str], str] = str


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
    # subpackages too (core/sharing/ is a package of its own)
    packages = "|".join(WRAPPER_PACKAGES)
    wanted = re.compile(r"^(__init__\.py|(" + packages + r")/([^/]+/)*[^/]+\.py)$")
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
    runtime: str = "auto"  # auto | containerd | docker | cdi (native CDI: spec only) | none
    runtime_version: str = ""  # Node status.nodeInfo.containerRuntimeVersion
    containerd_config: str = "/etc/containerd/config.toml"
    containerd_socket: str = "/run/containerd/containerd.sock"
    docker_config: str = ""  # empty: docker nodes are not configured (reported failed)
    docker_socket: str = "/var/run/docker.sock"
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

    def backend(self) -> Backend:
        """Whose config gets the wrapper: dockerd on a docker node, else containerd."""
        s = self.settings
        kind, _version = containerd.parse_runtime_version(s.runtime_version)
        if s.runtime == "docker" or (s.runtime == "auto" and kind == "docker"):
            return Backend(
                "dockerd", s.docker_config, s.docker_socket, "runtime.docker.config",
                lambda text, handler, binary, default, _imports: docker.configure(
                    text, handler, binary, default),
                docker.unconfigure, docker.docker_info, docker.not_served, docker.reload,
                new_process=False, loadable=docker.explicit)
        return Backend(
            "containerd", s.containerd_config, s.containerd_socket,
            "runtime.containerd.config", containerd.configure, containerd.unconfigure,
            containerd.cri_config, containerd.not_served, containerd.restart, new_process=True)

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
            if mode == "wrapper":
                self.ensure_hook()
            else:
                self.check_native()
        except RestartPending as err:
            return Report("pending", str(err), dict(self.details))
        except GpuK8sError as err:
            return Report("failed", str(err), dict(self.details))
        how = (f"runtime handler {s.handler!r} (wrapper {s.install_dir}/bin/{WRAPPER_NAME})"
               if mode == "wrapper" else "the runtime's own CDI support")
        return Report("ready", f"{spec_state}; containers get it through {how}",
                      dict(self.details))

    def _checks_containerd(self) -> bool:
        kind, _version = containerd.parse_runtime_version(self.settings.runtime_version)
        return self.settings.runtime == "containerd" or (
            self.settings.runtime == "auto" and kind == "containerd")

    def socket(self) -> str:
        return self.settings.sys(self.backend().socket)

    def check_native(self) -> None:
        """containerd with CDI of its own: its CRI must really have it on."""
        if not self._checks_containerd():
            return
        if not containerd.cri_cdi_enabled(containerd.cri_config(self.socket())):
            raise RuntimeConfigError(
                "containerd's CRI has CDI off (enable_cdi = false): containers would not get "
                f"their GPUs; set enable_cdi = true in {self.settings.containerd_config} and "
                "restart containerd")

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

    def install_dir(self) -> str:
        """The install directory (as seen here), made and marked ours where it was not."""
        install = self.settings.sys(self.settings.install_dir)
        if not os.path.isdir(install):
            os.makedirs(install)
            files.atomic_write(os.path.join(install, CREATED_NAME), "")
        return install

    def write_wrapper(self) -> str:
        """The wrapper executable (also the CDI hooks' program) in ``<install dir>/bin``;
        that directory."""
        bin_dir = os.path.join(self.install_dir(), "bin")
        os.makedirs(bin_dir, exist_ok=True)
        wrapper = os.path.join(bin_dir, WRAPPER_NAME)
        payload = wrapper_zip(self.settings.host_python)
        if _read_bytes(wrapper) != payload:
            tmp = wrapper + ".new"
            with open(tmp, "wb") as handle:
                handle.write(payload)
            os.chmod(tmp, 0o755)
            os.replace(tmp, wrapper)
        return bin_dir

    def ensure_hook(self) -> None:
        """The wrapper installed and served: installed once, served checked every pass."""
        s = self.settings
        if self._hook_done:
            b = self.backend()
            reason = b.not_served(b.served(self.socket()), s.handler, self.wrapper_path(),
                                  s.set_default)
            if reason is None:
                return
            log.warning("runtime handler lost: installing it again", extra={"reason": reason})
            self._hook_done = False
        self.install_hook()
        self._hook_done = True

    def candidate(self) -> tuple[str, str, bool, Configured]:
        """(config path as seen here, its text now ("" when there is none), whether there is
        none so that we create it, the edit) for the runtime's config: what a pass writes,
        and what the Ansible module shows in check and diff mode. Raises what the edit
        refuses."""
        s = self.settings
        b = self.backend()
        if not os.path.exists(s.sys(s.host_python)):
            raise GpuK8sError(f"{s.host_python} not found on the node: the runtime wrapper needs "
                              "python3 >= 3.8 there (or use a runtime with CDI: containerd >= "
                              "1.7 with enable_cdi, CRI-O)")
        if not b.config:
            raise GpuK8sError(f"the node's container runtime is docker ({s.runtime_version}): "
                              "set the chart option runtime.docker.config (its daemon.json, "
                              "e.g. /etc/docker/daemon.json) to install the wrapper there")
        config_path = s.sys(b.config)
        text = _read(config_path)
        if text is None and b.name == "dockerd" and os.path.isdir(os.path.dirname(config_path)):
            text = ""  # no daemon.json yet: dockerd's defaults
        created = False
        if text is None and b.name == "containerd":
            # no config: containerd runs on its defaults; the handler goes into a minimal
            # config of ours, removed again at uninstall (state.json says we created it)
            if not os.path.isdir(os.path.dirname(config_path)):
                raise GpuK8sError(f"{b.name} config {b.config} not found on the node, nor its "
                                  f"directory (chart option {b.option})")
            text, created = "", True
        if text is None:
            raise GpuK8sError(f"{b.name} config {b.config} not found on the node "
                              f"(chart option {b.option})")
        imported = containerd.resolve_imports(text, b.config, s.sys) \
            if b.name == "containerd" else None
        result = b.configure(text, s.handler, self.wrapper_path(), s.set_default, imported)
        if result.drop_in:  # containerd 2.x: our own drop-in instead of an edit of the file
            result = dataclasses.replace(result, drop_in=os.path.join(
                os.path.dirname(b.config), result.drop_in))
            config_path = s.sys(str(result.drop_in))
            text, created = _read(config_path) or "", True
        return config_path, text, created, result

    def install_hook(self) -> None:
        s = self.settings
        b = self.backend()
        config_path, text, created, result = self.candidate()
        down = ""
        try:
            serving: Any = b.served(self.socket())  # it must answer before any change
        except RuntimeConfigError as err:
            if s.restart_mode != "none":
                raise
            # restart mode none: the administrator starts or restarts it later (a node
            # provisioned before its runtime runs); it loads the config then
            serving, down = None, f"{b.name} is not running ({err}); it loads the handler " \
                                  "when it starts"
        if result.version:
            self.details.update(configVersion=result.version)
        state = files.read_json(self._state_path()) or {}
        digest = hashlib.sha256(result.text.encode()).hexdigest()
        attempt = state.get("attempt") or {}
        if attempt.get("digest") == digest and \
                attempt.get("pid") == peer_pid_or_zero(self.socket()):
            raise RuntimeConfigError(f"{attempt.get('reason')} (not tried again until "
                                     f"{b.name} or its config changes)")
        if b.name == "containerd" and result.changed:
            main = _read(s.sys(b.config)) or "" if result.drop_in else text
            self._prove(main, result.text if not result.drop_in else main,
                        result.text if result.drop_in else None, state, digest)
        self._install_wrapper(result.base_binary)
        if "previousDefault" not in state:
            state["previousDefault"] = result.previous_default
        state.update(handler=s.handler, config=b.config, runtime=b.name)
        if created:  # ours: removed at uninstall while it is as we wrote it
            state["created"] = {"path": result.drop_in or b.config, "sha256": digest}
        files.write_json(self._state_path(), state)
        self.details.update(handler=s.handler, default=s.set_default)
        backup = config_path + ".gpuk8s-backup"
        made_backup = result.changed and not created and not os.path.exists(backup)
        if result.changed:
            if made_backup:
                files.atomic_write(backup, text)
            files.atomic_write(config_path, result.text)
        reason = down if serving is None else \
            b.not_served(serving, s.handler, self.wrapper_path(), s.set_default)
        if reason is None:
            self._forget_attempt()
            return
        before = peer_pid_or_zero(self.socket())
        try:
            done = self._restart_onto(self.wrapper_path(), reason)
        except RestartPending:
            raise
        except RuntimeConfigError as err:
            message = str(err)
            if result.changed:
                message += self._put_back(config_path, None if created else text, before)
                if created:
                    state.pop("created", None)
                if made_backup:
                    files.remove(backup)
            state["attempt"] = {"digest": digest, "reason": message,
                                "pid": peer_pid_or_zero(self.socket())}
            files.write_json(self._state_path(), state)
            raise RuntimeConfigError(message) from err
        self._forget_attempt()
        log.info("runtime configured", extra={"runtime": b.name, "handler": s.handler,
                                              "restart": done})

    def _prove(self, text: str, candidate: str, drop_in: str | None, state: dict[str, Any],
               digest: str) -> None:
        """A private containerd of the node's generation must take ``candidate`` (``proof``);
        refused: recorded as an attempt (not tried again until containerd or the config
        changes) and raised, nothing written."""
        s = self.settings
        proven = proof.prove(self.socket(), text, candidate, os.path.dirname(s.containerd_config),
                             s.sys, s.handler, self.wrapper_path(), s.set_default, drop_in,
                             os.path.join(self.install_dir(), "proof"))
        if proven.failed is None:
            self.details["proof"] = f"skipped: {proven.skipped}" if proven.skipped else \
                f"proven with a private {proven.binary}"
            if proven.skipped:
                log.warning("edit not proven before the restart", extra={
                    "reason": proven.skipped})
            return
        message = f"{s.containerd_config} not changed: {proven.failed}"
        state["attempt"] = {"digest": digest, "reason": message,
                            "pid": peer_pid_or_zero(self.socket())}
        files.write_json(self._state_path(), state)
        raise RuntimeConfigError(message)

    def _install_wrapper(self, base_binary: str | None) -> None:
        s = self.settings
        runc = base_binary or next(
            (p for p in RUNC_CANDIDATES if os.path.exists(s.sys(p))), "runc")
        bin_dir = self.write_wrapper()
        sdk_paths = list(DEFAULT_SDK_PATHS["metax"][:1])
        files.write_json(os.path.join(bin_dir, CONFIG_NAME), {
            "runtime": runc, "specDirs": [s.cdi_dir, "/var/run/cdi"], "sdkPaths": sdk_paths,
        })
        self.details.update(runc=runc)

    def _forget_attempt(self) -> None:
        state = files.read_json(self._state_path()) or {}
        if state.pop("attempt", None) is not None:
            files.write_json(self._state_path(), state)

    def _restart_onto(self, binary: str | None, reason: str) -> str:
        """Restart (containerd) or reload (dockerd) the runtime and wait until it serves the
        handler (``binary`` None: no longer serves it); what was done. ``reason``: why."""
        s = self.settings
        b = self.backend()
        done, old = b.restart(s.restart_mode, self.socket(), s.system_root)
        if s.restart_mode == "none":
            raise RestartPending(f"{done} ({reason})")

        def served() -> str | None:
            pid = peer_pid_or_zero(self.socket())
            if b.new_process and (pid <= 0 or (old > 0 and pid == old)):
                return f"{b.name} (pid {old}) has not been replaced"
            try:
                config = b.served(self.socket(), timeout=2.0)
            except RuntimeConfigError as err:
                return str(err)
            why = b.not_served(config, s.handler, binary, s.set_default)
            if why is None:
                return None
            return f"{why}: does it read {b.config}? (chart option {b.option})"

        containerd.wait_for(f"after {done}, {b.name} serving its new config", served,
                            RESTART_TIMEOUT)
        return f"{done}; now pid {peer_pid_or_zero(self.socket())}"

    def _put_back(self, config_path: str, text: str | None, before: int) -> str:
        """The config as it was before our edit (``text`` None: there was none) and the
        runtime back on it: containerd, if it was restarted onto the edit (its pid is not
        ``before``), is restarted again and must answer on its CRI without the handler.
        What happened, for the report."""
        s = self.settings
        b = self.backend()

        def restore(body: str) -> None:
            if text is None:
                files.remove(config_path)
            else:
                files.atomic_write(config_path, body)

        restore(text or "")

        def answers() -> str | None:
            try:
                b.served(self.socket(), timeout=2.0)
            except RuntimeConfigError as err:
                return str(err)
            return None

        def back(old: int) -> Callable[[], str | None]:
            def check() -> str | None:
                pid = peer_pid_or_zero(self.socket())
                if b.new_process and (pid <= 0 or pid == old):
                    return f"{b.name} (pid {old}) has not been replaced"
                try:
                    config = b.served(self.socket(), timeout=2.0)
                except RuntimeConfigError as err:
                    return str(err)
                return b.not_served(config, s.handler, None, s.set_default)
            return check

        try:
            if not b.new_process:  # dockerd: reload it onto the old file again
                files.atomic_write(config_path, b.loadable(text or ""))
                b.restart(s.restart_mode, self.socket(), s.system_root)
                containerd.wait_for(f"{b.name} back on the previous config", lambda: b.not_served(
                    b.served(self.socket(), timeout=2.0), s.handler, None, s.set_default),
                    RESTART_TIMEOUT)
                restore(text or "")
            else:
                now = peer_pid_or_zero(self.socket())
                if now != before:
                    # restarted onto the edit (or exited on it and not back yet): it runs
                    # the edit until restarted again; wait for a process to signal first
                    containerd.wait_for(f"{b.name} running again", lambda: None if
                                        peer_pid_or_zero(self.socket()) > 0 else
                                        f"nothing serves {b.socket}", RESTART_TIMEOUT)
                    done, old = b.restart(s.restart_mode, self.socket(), s.system_root)
                    containerd.wait_for(f"after {done}, {b.name} back on the previous config",
                                        back(old), RESTART_TIMEOUT)
                    return f"; {b.config} is as it was and {b.name} was restarted onto it " \
                           f"(now pid {peer_pid_or_zero(self.socket())}, its CRI " \
                           "answers)"
            containerd.wait_for(f"{b.name} back on the previous config", answers,
                                RESTART_TIMEOUT)
        except RuntimeConfigError as err:
            restore(text or "")
            return f"; {b.config} is as it was, but {err}"
        return f"; {b.config} is as it was"

    # ------------------------------------------------------------------ uninstall
    def uninstall(self) -> list[str]:
        """Take back everything this agent put on the node; what was done."""
        s = self.settings
        done = []
        if any([files.remove(p) for p in self.spec_paths()]):
            done.append("CDI spec removed")
        b = self.backend()
        config_path, text, after = self.uninstalled()
        keep_wrapper = False
        if text is not None and after != text:
            files.atomic_write(config_path, b.loadable(after or ""))
            try:
                done.append(self._restart_onto(None, "handler removed"))
            except RestartPending as err:
                done.append(str(err))
            except RuntimeConfigError as err:
                # the runtime may still create containers through the wrapper
                keep_wrapper = True
                done.append(f"{err}: the wrapper stays in {s.install_dir}")
            finally:
                if after is None:
                    files.remove(config_path)
                else:
                    files.atomic_write(config_path, after)
        files.remove(config_path + ".gpuk8s-backup")
        if keep_wrapper:
            if clear_readiness(s.host_root, "runtime.ready", s.status_dir):
                done.append("runtime.ready marker removed")
            return done
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
        elif installed(install):
            made = os.path.exists(os.path.join(install, CREATED_NAME))
            for entry in os.listdir(install):
                files.remove(os.path.join(install, entry))
            try:
                if made:  # else there before us (the node's own, a pod's mount point): it stays
                    os.rmdir(install)
                    done.append(f"{s.install_dir} removed")
            except OSError:  # the pod's mount point: the kubelet keeps the dir
                made = False
            if not made:
                done.append(f"{s.install_dir} emptied")
        if clear_readiness(s.host_root, "runtime.ready", s.status_dir):
            done.append("runtime.ready marker removed")
        return done

    def uninstalled(self) -> tuple[str, str | None, str | None]:
        """(config path as seen here, its text now (None: there is none), its text after
        uninstall (None: removed, as we created it)): what ``uninstall`` writes, and what the
        Ansible module shows in check and diff mode."""
        s = self.settings
        b = self.backend()
        state = files.read_json(self._state_path()) or {}
        config_path = s.sys(b.config)
        text = _read(config_path)
        made = state.get("created") or {}
        if made.get("path"):  # a file we created (the config, or our drop-in)
            path = s.sys(made["path"])
            now = _read(path)
            if now is not None and hashlib.sha256(now.encode()).hexdigest() == made["sha256"]:
                return path, now, None  # as we wrote it: removed
            if made["path"] != b.config or now is None:
                return path, now, now
            text = now  # the config, changed since: our part out, theirs stays
        if text is None or not state:
            return config_path, text, text
        backup = _read(config_path + ".gpuk8s-backup")
        if backup is not None and self._untouched_since_install(backup, text):
            return config_path, text, backup  # untouched since we wrote it: byte for byte
        return config_path, text, b.unconfigure(text, s.handler, state.get("previousDefault"))[0]

    def _untouched_since_install(self, backup: str, text: str) -> bool:
        s = self.settings
        try:
            return self.backend().configure(backup, s.handler, self.wrapper_path(),
                                            s.set_default, None).text == text
        except RuntimeConfigError:
            return False


def installed(install: str) -> bool:
    """Whether the install directory (as seen here) holds anything: an empty one that was
    there before is not ours to report or remove."""
    return os.path.isdir(install) and bool(os.listdir(install))


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
