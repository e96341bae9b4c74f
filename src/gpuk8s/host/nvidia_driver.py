"""The accelerator manual's NVIDIA driver install (002-34 .. 002-39) as one procedure, with
rollback. Beside ``host.driver`` (MetaX payloads): NVIDIA's ``.run`` installer keeps its own
transaction (it uninstalls an older ``.run`` driver first and records what it installed for
``nvidia-uninstall``), so what is ours is the order, the checks and the way back.

* ``plan`` (read-only): the installer file and its version (from NVIDIA's file name
  ``NVIDIA-Linux-<arch>-<version>.run``), the NVIDIA GPUs on the PCI bus (the manual's
  ``lspci | grep -i nvidia``; none: refused), whether ``nvidia-smi`` already answers with
  that version (then nothing to do), and the build prerequisites missing (``gcc``, ``dkms``,
  the running kernel's headers: ``linux-headers-<kernel>`` on Debian/Ubuntu,
  ``kernel-devel-<kernel>`` on EL, as 002-37) with the package manager command that installs
  them.
* ``converge``: installs the missing packages, runs ``<installer> --dkms --silent`` (002-38;
  silent because nobody answers questions), then checks ``nvidia-smi`` (002-39): it must
  answer with the new version and list every NVIDIA GPU on the bus. Any failure from the
  installer on rolls back: ``nvidia-uninstall --silent`` (or ``<installer> --uninstall``),
  then the previous driver's installer when one is given, checked the same way. A journal
  (``/var/lib/gpuk8s/nvidia-driver-install.json``) written before the installer runs lets
  ``recover`` finish that after a crash.

Commands run through a runner (Ansible: ``module.run_command``). Stdlib only, Python 3.8+.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field

from ..core.errors import ConfigError, GpuK8sError
from ..discovery import discover
from ..discovery.kmodule import kernel_release
from ..discovery.tools import Runner, host_path, run_tool
from . import files
from .nvidia_checks import SmiStatus, headers_present, nvidia_smi_status, tool_path
from .sdk import os_release

INSTALLER_RE = re.compile(r"^NVIDIA-Linux-(?:x86_64|aarch64|ppc64le)-([0-9]+(?:\.[0-9]+){1,2})"
                          r"\.run$")
JOURNAL = "/var/lib/gpuk8s/nvidia-driver-install.json"
UNINSTALLER = "nvidia-uninstall"
DEBIAN_LIKE = ("debian", "ubuntu")


class NvidiaDriverError(GpuK8sError):
    """The driver could not be installed; the message says what is missing or what was
    rolled back."""

    def __init__(self, message: str, actions: list[str] | None = None) -> None:
        super().__init__(message)
        self.actions = list(actions or [])  # steps done before the failure


@dataclass(frozen=True)
class DriverRequest:
    installer: str  # the .run on the host (a path inside the root)
    version: str | None = None  # default: from the installer's file name
    dkms: bool = True
    packages: tuple[str, ...] | None = None  # default: by OS (module doc)
    package_command: tuple[str, ...] | None = None  # default: apt-get / yum install -y
    previous_installer: str | None = None  # the driver to go back to on failure

    def wanted(self) -> str:
        match = INSTALLER_RE.match(os.path.basename(self.installer))
        found = match.group(1) if match else None
        if self.version and found and self.version != found:
            raise ConfigError(f"version {self.version!r} does not match the installer "
                              f"{os.path.basename(self.installer)} ({found})")
        version = self.version or found
        if not version:
            raise ConfigError(f"installer {self.installer!r}: not an NVIDIA-Linux-<arch>-"
                              "<version>.run file name; give version")
        return version


@dataclass(frozen=True)
class DriverPlan:
    version: str
    gpus: int
    installed: str | None  # what nvidia-smi reports now
    install: bool
    reason: str
    missing: tuple[str, ...] = ()  # packages to install first
    package_argv: tuple[str, ...] = ()
    actions: tuple[str, ...] = ()


@dataclass
class DriverOutcome:
    plan: DriverPlan
    changed: bool
    actions: list[str] = field(default_factory=list)
    after: str | None = None  # nvidia-smi's driver version afterwards


def required_packages(root: str, dkms: bool) -> tuple[tuple[str, ...], str | None]:
    """(packages the build needs that the host lacks, the running kernel)."""
    kernel = kernel_release(root)
    release = os_release(root)
    family = f"{release.get('ID', '')} {release.get('ID_LIKE', '')}".lower()
    headers = (f"linux-headers-{kernel}" if any(d in family for d in DEBIAN_LIKE)
               else f"kernel-devel-{kernel}")
    missing = []
    if tool_path(root, "cc") is None and tool_path(root, "gcc") is None:
        missing.append("gcc")
    if dkms and tool_path(root, "dkms") is None:
        missing.append("dkms")
    if not headers_present(root, kernel):
        missing.append(headers)
    return tuple(missing), kernel


def package_command(root: str) -> tuple[str, ...]:
    """``apt-get install -y`` on Debian/Ubuntu, else ``yum install -y`` (002-37), found
    under the root."""
    release = os_release(root)
    family = f"{release.get('ID', '')} {release.get('ID_LIKE', '')}".lower()
    names = ("apt-get",) if any(d in family for d in DEBIAN_LIKE) else ("dnf", "yum")
    for name in names:
        tool = tool_path(root, name)
        if tool is not None:
            return (tool, "install", "-y")
    raise NvidiaDriverError(f"no package manager ({' or '.join(names)}) on the node to install "
                            "the driver's build prerequisites")


def plan(root: str, request: DriverRequest, runner: Runner | None,
         require_installer: bool = True) -> DriverPlan:
    """What ``converge`` would do. ``require_installer=False`` plans as if the installer were
    already on the node (check mode, before the task that puts it there ran)."""
    version = request.wanted()
    path = host_path(root, request.installer)
    if require_installer and not os.path.isfile(path):
        raise NvidiaDriverError(f"driver installer {request.installer} not found on the node "
                                "(download it first, manual 002-36)")
    gpus = [g for g in discover(root, runner=runner).gpus if g.vendor == "nvidia"]
    if not gpus:
        raise NvidiaDriverError("no NVIDIA GPU on the PCI bus (lspci | grep -i nvidia finds "
                                "none): refusing to install a driver for nothing")
    smi = nvidia_smi_status(root, runner)
    if smi.ok and smi.driver_version == version and smi.gpus == len(gpus):
        return DriverPlan(version, len(gpus), smi.driver_version, False,
                          f"driver {version} installed: nvidia-smi lists {smi.gpus} GPU(s)")
    missing, _ = required_packages(root, request.dkms)
    if request.packages is not None:
        missing = tuple(p for p in request.packages if p) if missing else ()
    argv = (*(request.package_command or package_command(root)), *missing) if missing else ()
    name = os.path.basename(request.installer)
    actions = ([f"install {' '.join(missing)}"] if missing else []) + [
        f"run {name} {' '.join(installer_args(request))}", "check nvidia-smi"]
    now = smi.driver_version if smi.ok else None
    reason = (f"nvidia-smi reports driver {now}, wanted {version}" if now else
              f"no working driver ({smi.error}), wanted {version}")
    return DriverPlan(version, len(gpus), now, True, reason, missing, argv, tuple(actions))


def installer_args(request: DriverRequest) -> list[str]:
    return (["--dkms"] if request.dkms else []) + ["--silent"]


def _run(runner: Runner | None, argv: list[str], what: str, actions: list[str]) -> None:
    actions.append(what)
    result = run_tool(runner, argv)
    if not result.ok:
        lines = (result.stderr.strip() or result.stdout.strip()).splitlines()
        detail = "; ".join(line for line in lines if "ERROR" in line) or (
            lines[0] if lines else result.problem)
        raise NvidiaDriverError(f"{what} failed (rc {result.rc}): {detail}")


def verify(root: str, version: str, gpus: int, runner: Runner | None) -> SmiStatus:
    """nvidia-smi answers with ``version`` and lists ``gpus`` GPUs, else raises."""
    smi = nvidia_smi_status(root, runner)
    if not smi.ok:
        raise NvidiaDriverError(f"after installing driver {version}: {smi.error}")
    if smi.driver_version != version:
        raise NvidiaDriverError(f"after installing driver {version}: nvidia-smi reports driver "
                                f"{smi.driver_version}")
    if smi.gpus != gpus:
        raise NvidiaDriverError(f"after installing driver {version}: nvidia-smi lists "
                                f"{smi.gpus} of the {gpus} NVIDIA GPU(s) on the bus (is this "
                                "GPU supported by this driver branch?)")
    return smi


def converge(root: str, request: DriverRequest, runner: Runner | None) -> DriverOutcome:
    """Install as planned; on failure roll back (module doc) and raise with what was done."""
    the_plan = plan(root, request, runner)
    outcome = DriverOutcome(the_plan, False)
    if not the_plan.install:
        outcome.after = the_plan.installed
        return outcome
    actions = outcome.actions
    try:
        if the_plan.missing:
            _run(runner, list(the_plan.package_argv), f"install {' '.join(the_plan.missing)}",
                 actions)
            still, _ = required_packages(root, request.dkms)
            if still:
                raise NvidiaDriverError(f"{' '.join(still)} still missing after "
                                        f"`{' '.join(the_plan.package_argv)}`")
    except NvidiaDriverError as err:
        raise NvidiaDriverError(str(err), actions) from err
    path = executable(host_path(root, request.installer))
    files.write_json(host_path(root, JOURNAL), {
        "version": the_plan.version, "previous": the_plan.installed,
        "previousInstaller": request.previous_installer, "installer": request.installer,
        "dkms": request.dkms, "gpus": the_plan.gpus})
    outcome.changed = True
    try:
        _run(runner, [path, *installer_args(request)],
             f"run {os.path.basename(path)} {' '.join(installer_args(request))}", actions)
        actions.append("check nvidia-smi")
        outcome.after = verify(root, the_plan.version, the_plan.gpus, runner).driver_version
    except NvidiaDriverError as err:
        message = rollback(root, request, the_plan.installed, the_plan.gpus, runner, actions)
        raise NvidiaDriverError(f"{err}; {message}", actions) from err
    files.remove(host_path(root, JOURNAL))
    return outcome


def executable(path: str) -> str:
    """``chmod a+x`` (002-38) an installer; its path."""
    mode = os.stat(path).st_mode
    os.chmod(path, mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def rollback(root: str, request: DriverRequest, previous: str | None, gpus: int,
             runner: Runner | None, actions: list[str]) -> str:
    """Take the new driver out and, with a previous installer, put the previous one back.
    Returns what the node has now, in words; the journal goes once that is settled."""
    uninstall = tool_path(root, UNINSTALLER)
    argv = [uninstall, "--silent"] if uninstall else [host_path(root, request.installer),
                                                      "--uninstall", "--silent"]
    try:
        _run(runner, argv, "roll back: " + " ".join([os.path.basename(argv[0]), *argv[1:]]),
             actions)
    except NvidiaDriverError as err:
        return f"rolling back failed too ({err}); the journal {JOURNAL} stays for the next run"
    state = "rolled back: the new driver is uninstalled"
    if previous and request.previous_installer:
        back = host_path(root, request.previous_installer)
        try:
            if not os.path.isfile(back):
                raise NvidiaDriverError(f"previous installer {request.previous_installer} not "
                                        "found on the node")
            executable(back)
            _run(runner, [back, *installer_args(request)],
                 f"roll back: reinstall {os.path.basename(back)}", actions)
            verify(root, previous, gpus, runner)
            state = f"rolled back to driver {previous}"
        except NvidiaDriverError as err:
            state = f"rolled back, but driver {previous} did not come back: {err}"
    elif previous:
        state += (f"; driver {previous} was there before: give previous_installer to have it "
                  "reinstalled")
    files.remove(host_path(root, JOURNAL))
    return state


def recover(root: str, runner: Runner | None) -> str | None:
    """After a crash during ``converge``: keep the new driver if it works, else roll back.
    None when there was nothing to recover."""
    journal = files.read_json(host_path(root, JOURNAL))
    if not isinstance(journal, dict):
        return None
    request = DriverRequest(str(journal.get("installer", "")), str(journal.get("version")),
                            bool(journal.get("dkms", True)),
                            previous_installer=journal.get("previousInstaller"))
    try:
        verify(root, str(journal.get("version")), int(journal.get("gpus") or 0), runner)
    except NvidiaDriverError as err:
        actions: list[str] = []
        return f"an interrupted install of driver {journal.get('version')} ({err}): " + rollback(
            root, request, journal.get("previous"), int(journal.get("gpus") or 0), runner,
            actions)
    files.remove(host_path(root, JOURNAL))
    return f"an interrupted install of driver {journal.get('version')} had completed"
