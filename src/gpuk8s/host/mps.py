"""NVIDIA MPS control daemons, one per GPU, on nodes in sharing mode ``mps``.

Enforcement of ``nvidia.com/mps-core`` / memory limits is NVIDIA's own: a client
process's ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` and ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``
are applied by the MPS server the control daemon spawns. This module only keeps the
daemons: for every GPU (by UUID) one ``nvidia-cuda-mps-control -d`` started with

    CUDA_VISIBLE_DEVICES=<uuid>
    CUDA_MPS_PIPE_DIRECTORY=<mps dir>/<uuid>/pipe   (mounted into client containers)
    CUDA_MPS_LOG_DIRECTORY=<mps dir>/<uuid>/log

and, when configured, ``set_default_active_thread_percentage N`` sent to it. A daemon is
stopped with ``echo quit | nvidia-cuda-mps-control`` (same environment) when its GPU
leaves the wanted set (the node's mode changed away from ``mps``, the GPU is gone).

A daemon is *running* when the pid in ``<pipe>/nvidia-cuda-mps-control.pid`` (written
by the daemon itself) is a live ``nvidia-cuda-mps-control`` process. What this module
started is recorded in ``<mps dir>/daemons.json`` (atomic writes), so a restarted agent
adopts its live daemons instead of starting second ones, restarts those that died, and
still stops daemons of GPUs it no longer wants.

Stdlib only, Python 3.8+ (the ``host`` package is shipped to hosts by Ansible).
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Tuple  # runtime alias: Python 3.8

from ..core.errors import ConfigError, GpuK8sError
from ..core.sharing import (
    DEFAULT_SHARING_MODE,
    MPS_HOST_ROOT,
    SHARING_MODE_LABEL,
    SHARING_MODES,
    SharingError,
    check_mode,
    mps_log_dir,
    mps_pipe_dir,
)
from ..discovery import nvidia
from ..discovery.libraries import elf_soname
from ..discovery.sysfs import read_text
from ..discovery.tools import find_tool, host_path, vendor_library_dirs
from .files import atomic_symlink, read_json, write_json

log = logging.getLogger("gpuk8s.mps")

MPS_DIR = MPS_HOST_ROOT
CONTROL_TOOL = "nvidia-cuda-mps-control"
CONTROL_CANDIDATES = (
    "/usr/bin/nvidia-cuda-mps-control",
    "/usr/local/nvidia/bin/nvidia-cuda-mps-control",
    "/usr/local/cuda/bin/nvidia-cuda-mps-control",
)
PID_FILE = "nvidia-cuda-mps-control.pid"
STATE_FILE = "daemons.json"
_UUID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,95}$")
# A Unix socket path holds at most 107 bytes: <mps dir>/<GPU UUID, 40>/pipe/control
MAX_MPS_DIR = 107 - len("/GPU-00000000-0000-0000-0000-000000000000/pipe/control")

# argv, environment, stdin text, timeout -> (rc, stdout, stderr)
Command = Callable[[List[str], Dict[str, str], str, float], Tuple[int, str, str]]


class MpsError(GpuK8sError):
    """A daemon could not be started or stopped; the message names the GPU."""


def sharing_mode(labels: dict[str, str] | None) -> tuple[str, str | None]:
    """(the node's sharing mode, why its label was ignored) from the node's labels; an
    absent label is ``exclusive``, an unknown value counts as ``exclusive`` too."""
    value = (labels or {}).get(SHARING_MODE_LABEL)
    try:
        return check_mode(value), None
    except SharingError:
        return DEFAULT_SHARING_MODE, (
            f"label {SHARING_MODE_LABEL}={str(value)[:63]!r} is not one of "
            f"{', '.join(SHARING_MODES)}: treated as {DEFAULT_SHARING_MODE}"
        )


def pipe_directory(mps_dir: str, uuid: str) -> str:
    return mps_pipe_dir(uuid, mps_dir)


def log_directory(mps_dir: str, uuid: str) -> str:
    return mps_log_dir(uuid, mps_dir)


def run_command(argv: list[str], env: dict[str, str], stdin: str, timeout: float
                ) -> tuple[int, str, str]:
    """Run a command with ``env`` and ``stdin``; never raises for ordinary failures."""
    try:
        proc = subprocess.run(list(argv), input=stdin, capture_output=True, text=True,
                              env=env, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return 124, "", f"timed out after {timeout:g} s"
    except OSError as err:
        return 127, "", str(err)
    return proc.returncode, proc.stdout, proc.stderr


def _alive(pid: int) -> bool:
    """A live (not zombie) ``nvidia-cuda-mps-control`` process."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as handle:
            state = handle.read().rpartition(")")[2].split()
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            cmdline = handle.read()
    except OSError:
        return False
    if not state or state[0] in ("Z", "X"):
        return False
    return CONTROL_TOOL.encode() in cmdline


@dataclass(frozen=True)
class MpsSettings:
    host_root: str = "/"
    mps_dir: str = MPS_DIR
    # default compute share of every client (set_default_active_thread_percentage);
    # None leaves the daemon's default (100)
    active_thread_percentage: int | None = None
    start_timeout: float = 10.0

    def __post_init__(self) -> None:
        if not os.path.isabs(self.mps_dir):
            raise ConfigError(f"mps dir: {self.mps_dir!r} must be an absolute path")
        if len(self.mps_dir.encode()) > MAX_MPS_DIR:
            raise ConfigError(f"mps dir: {self.mps_dir!r} is longer than {MAX_MPS_DIR} bytes "
                              "(the daemons' control sockets would exceed the Unix socket "
                              "path limit)")
        pct = self.active_thread_percentage
        if pct is not None and not 1 <= pct <= 100:
            raise ConfigError(f"active thread percentage: {pct} must be 1..100")


@dataclass
class PassResult:
    """What one ``reconcile`` did; ``running`` maps UUID -> daemon pid afterwards."""

    running: dict[str, int] = field(default_factory=dict)
    started: list[str] = field(default_factory=list)
    restarted: list[str] = field(default_factory=list)  # recorded as ours, found dead
    adopted: list[str] = field(default_factory=list)  # live, not started by this process
    stopped: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)

    def summary(self) -> dict[str, object]:
        return {"running": len(self.running), "started": self.started,
                "restarted": self.restarted, "adopted": self.adopted,
                "stopped": self.stopped, "failed": self.failed}


class MpsDaemons:
    """Starts, adopts, restarts and stops the per-GPU control daemons."""

    def __init__(self, settings: MpsSettings, command: Command | None = None,
                 base_env: dict[str, str] | None = None) -> None:
        self.settings = settings
        self.command: Command = command or run_command
        self.base_env = dict(os.environ if base_env is None else base_env)
        self._known: dict[str, int] = {}  # what this process has seen running
        # (tool, driver version) -> the daemons' driver environment (_host_driver_env)
        self._driver_env: dict[tuple[str, str], dict[str, str]] = {}

    # -- paths and state -------------------------------------------------------
    @property
    def state_path(self) -> str:
        return os.path.join(self.settings.mps_dir, STATE_FILE)

    def tool(self) -> str | None:
        return find_tool(self.settings.host_root, CONTROL_TOOL, CONTROL_CANDIDATES)

    def env(self, uuid: str) -> dict[str, str]:
        env = dict(self.base_env)
        for key in [k for k in env if k.startswith("CUDA_MPS_")]:
            del env[key]
        env["CUDA_VISIBLE_DEVICES"] = uuid
        env["CUDA_MPS_PIPE_DIRECTORY"] = pipe_directory(self.settings.mps_dir, uuid)
        env["CUDA_MPS_LOG_DIRECTORY"] = log_directory(self.settings.mps_dir, uuid)
        env.update(self._host_driver_env())
        return env

    def _host_driver_env(self) -> dict[str, str]:
        """With the host mounted elsewhere (``/host`` in gpu-mps' pod) the host's daemon
        cannot load ``libcuda.so.1`` by soname: on a real H100 (driver 580.159.04, kept in
        ``/usr/local/nvidia``) ``nvidia-cuda-mps-control -d`` exited 244 that way, and
        started with the driver's directory under the mounted root on
        ``LD_LIBRARY_PATH``. Directories holding only the driver's libraries go there as
        they are (``discovery.tools.VENDOR_LIB_DIRS``); a driver in a directory shared with
        the host's libc (``/usr/lib/x86_64-linux-gnu``) gets its libraries linked, by
        soname and by name, into ``<mps dir>/driver-lib`` instead. The tool's directory
        goes first on ``PATH``."""
        root = self.settings.host_root
        tool = self.tool()
        if os.path.realpath(root) == "/" or tool is None:
            return {}
        version = (read_text(host_path(root, f"{nvidia.MODULE_DIR}/version")) or "").strip()
        cached = self._driver_env.get((tool, version))
        if cached is not None:  # every control command asks; the driver rarely changes
            return dict(cached)
        env = {"PATH": os.pathsep.join([os.path.dirname(tool),
                                        self.base_env.get("PATH", os.defpath)])}
        dirs = vendor_library_dirs(root)
        complete = True
        shared = [d for d in (nvidia.driver_library_dirs(root, version) if version else [])
                  if host_path(root, d) not in dirs]
        if shared:
            farm = os.path.join(self.settings.mps_dir, "driver-lib")
            try:
                os.makedirs(farm, exist_ok=True)
                for library in nvidia.driver_files(root, version).libraries:
                    if os.path.dirname(library) not in shared:
                        continue
                    target = host_path(root, library)
                    names = {os.path.basename(library), elf_soname(target) or ""} - {""}
                    for link in (os.path.join(farm, n) for n in sorted(names)):
                        if not (os.path.islink(link) and os.readlink(link) == target):
                            atomic_symlink(target, link)
                dirs.append(farm)
            except OSError as err:
                complete = False  # tried again on the next call
                log.warning("cannot link the driver's libraries for the MPS daemons",
                            extra={"dir": farm, "error": str(err)})
        previous = self.base_env.get("LD_LIBRARY_PATH")
        if dirs:
            env["LD_LIBRARY_PATH"] = os.pathsep.join(dirs + ([previous] if previous else []))
        if complete:
            self._driver_env = {(tool, version): dict(env)}
        return env

    def recorded(self) -> dict[str, dict[str, object]]:
        """The daemons a (possibly earlier) agent recorded: UUID -> record."""
        data = read_json(self.state_path)
        daemons = data.get("daemons") if isinstance(data, dict) else None
        if not isinstance(daemons, dict):
            return {}
        return {str(k): v for k, v in daemons.items() if isinstance(v, dict) and _UUID.match(k)}

    def _record(self, running: dict[str, int]) -> None:
        records = {
            uuid: {"pid": pid, "pipe": pipe_directory(self.settings.mps_dir, uuid),
                   "log": log_directory(self.settings.mps_dir, uuid),
                   "activeThreadPercentage": self.settings.active_thread_percentage}
            for uuid, pid in sorted(running.items())
        }
        if records or os.path.exists(self.state_path):
            write_json(self.state_path, {"daemons": records})

    def pid_of(self, uuid: str) -> int | None:
        """The live daemon serving ``uuid``'s pipe directory, else None."""
        path = os.path.join(pipe_directory(self.settings.mps_dir, uuid), PID_FILE)
        try:
            with open(path, encoding="utf-8") as handle:
                pid = int(handle.read().strip() or "0")
        except (OSError, ValueError):
            return None
        return pid if pid > 0 and _alive(pid) else None

    def _present(self) -> list[str]:
        """GPU directories under the mps dir that have a live daemon (found, not recorded)."""
        try:
            names = sorted(os.listdir(self.settings.mps_dir))
        except OSError:
            return []
        return [n for n in names if _UUID.match(n) and self.pid_of(n) is not None]

    # -- operations ----------------------------------------------------------------
    def control(self, uuid: str, commands: str) -> tuple[int, str, str]:
        tool = self.tool()
        if tool is None:
            raise MpsError(f"{CONTROL_TOOL} not found under {self.settings.host_root} "
                           f"({', '.join(CONTROL_CANDIDATES)})")
        return self.command([tool], self.env(uuid), commands, self.settings.start_timeout)

    def start(self, uuid: str) -> int:
        """Start the daemon of ``uuid``; its pid. Raises ``MpsError``."""
        if not _UUID.match(uuid):
            raise MpsError(f"GPU UUID {uuid[:100]!r} is not usable as a directory name")
        tool = self.tool()
        if tool is None:
            raise MpsError(f"{CONTROL_TOOL} not found under {self.settings.host_root} "
                           f"({', '.join(CONTROL_CANDIDATES)})")
        for directory in (pipe_directory(self.settings.mps_dir, uuid),
                          log_directory(self.settings.mps_dir, uuid)):
            try:
                os.makedirs(directory, exist_ok=True)
            except OSError as os_error:
                raise MpsError(f"GPU {uuid}: cannot create {directory}: {os_error}") from None
        rc, out, err = self.command([tool, "-d"], self.env(uuid), "",
                                    self.settings.start_timeout)
        if rc != 0:
            detail = (err.strip() or out.strip() or f"exit status {rc}").splitlines()[0]
            raise MpsError(f"GPU {uuid}: `{CONTROL_TOOL} -d` failed: {detail}")
        pid = self._wait_for_pid(uuid)
        if pid is None:
            raise MpsError(f"GPU {uuid}: {CONTROL_TOOL} started but wrote no live pid file "
                           f"in {pipe_directory(self.settings.mps_dir, uuid)}")
        self._set_percentage(uuid)
        return pid

    def _wait_for_pid(self, uuid: str) -> int | None:
        deadline = time.monotonic() + self.settings.start_timeout
        while True:
            pid = self.pid_of(uuid)
            if pid is not None or time.monotonic() > deadline:
                return pid
            time.sleep(0.02)

    def _set_percentage(self, uuid: str) -> None:
        pct = self.settings.active_thread_percentage
        if pct is None:
            return
        rc, out, err = self.control(uuid, f"set_default_active_thread_percentage {pct}\n")
        if rc != 0:
            raise MpsError(f"GPU {uuid}: set_default_active_thread_percentage {pct} failed: "
                           f"{(err.strip() or out.strip() or f'exit status {rc}')}")

    def stop(self, uuid: str) -> None:
        """``echo quit | nvidia-cuda-mps-control`` for ``uuid``; waits until it is gone."""
        if self.pid_of(uuid) is None:
            return
        rc, out, err = self.control(uuid, "quit\n")
        deadline = time.monotonic() + self.settings.start_timeout
        while self.pid_of(uuid) is not None:
            if time.monotonic() > deadline:
                raise MpsError(f"GPU {uuid}: the MPS control daemon did not quit "
                               f"({(err.strip() or out.strip() or f'exit status {rc}')})")
            time.sleep(0.02)

    def reconcile(self, wanted: Sequence[str]) -> PassResult:
        """Make the running daemons exactly one per UUID in ``wanted``."""
        result = PassResult()
        recorded = self.recorded()
        previous = {u: r.get("pid") for u, r in recorded.items()}
        for uuid in dict.fromkeys(wanted):
            pid = self.pid_of(uuid)
            if pid is not None:
                if self._known.get(uuid) != pid:
                    result.adopted.append(uuid)
                    if recorded.get(uuid, {}).get("activeThreadPercentage") != \
                            self.settings.active_thread_percentage:
                        try:
                            self._set_percentage(uuid)
                        except MpsError as err:
                            result.failed[uuid] = str(err)
                result.running[uuid] = pid
                continue
            try:
                pid = self.start(uuid)
            except MpsError as err:
                result.failed[uuid] = str(err)
                continue
            result.running[uuid] = pid
            was_ours = self._known.get(uuid) is not None or previous.get(uuid) is not None
            (result.restarted if was_ours else result.started).append(uuid)
        for uuid in sorted(set(recorded) | set(self._present())):
            if uuid in result.running or uuid in result.failed:
                continue
            try:
                self.stop(uuid)
                result.stopped.append(uuid)
            except MpsError as stop_error:
                result.failed[uuid] = str(stop_error)
                pid = self.pid_of(uuid)
                if pid is not None:
                    result.running[uuid] = pid  # still there: keep it recorded
        self._known = dict(result.running)
        self._record(result.running)
        return result
