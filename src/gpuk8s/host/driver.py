"""Kernel driver (+ driver user space) install, load and verify: the one procedure.

Called by the Ansible module ``gpu_driver``, the operator's ``driver-manager`` and the CLI.

A *payload* is what gets installed: a directory laid out like the host (``opt/mxdriver``,
``lib/modules/...``), a ``.deb``, an ``.rpm`` or the vendor's ``.run`` installer.

* ``decide`` is the deploy-policy table (pure): ``Never`` touches nothing; ``IfNotPresent``
  installs only where no driver is loaded (an existing driver is left alone, whatever its
  version); ``Always`` converges to the wanted version (install + reload unless that
  version is both installed and running).
* ``converge`` runs it. First the checks, before anything on the host changes: the
  payload holds the wanted version (``opt/mxdriver/Version.txt``, required), its kernel
  module is there for the kernel release the node runs (``lib/modules/<release>/``) and
  was built for it (``vermagic``, read from the module's ELF ``.modinfo``), ``depmod``
  can run, and no process holds the GPU devices open. Then it records what runs now
  (``TRANSACTION``), installs while the running driver runs on, runs ``depmod`` for the
  running release (as kmod's ``modprobe`` finds modules only through ``modules.dep``),
  asks kmod which file it would load (``check_resolved``: the payload's, of the wanted
  ``.modinfo`` version, no other one ranked with it), and only then unloads, loads, reads
  the running version back, and commits. Directory payloads (and, under a root other than ``/``,
  packages, unpacked and checked before the unload) are copied file by file with a backup
  and a journal (``host.files``): any failure — or a crash, found by ``recover`` at the
  next start — restores the previous files, ``modules.dep`` and ownership record, unloads
  whatever new module got loaded and loads the previous driver again. On ``/``, deb / rpm
  / run payloads go through the package manager / installer (their own transaction; their
  content is checked only after loading); a failure there still reloads the previous
  module.
* ``record_owner`` writes ``discovery.metax.OWNER_RECORD``: labels then say
  ``gpu.driver.mode=cloud`` while that driver runs.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field, replace
from typing import Callable

from ..core.errors import ConfigError, GpuK8sError
from ..discovery import discover, kmodule
from ..discovery.metax import DRIVER_VERSION_FILE, OWNER_RECORD, read_version_file
from ..discovery.tools import Runner, default_runner, host_path
from . import files

POLICIES = ("IfNotPresent", "Always", "Never")
KINDS = ("dir", "deb", "rpm", "run")
# What a GPU process holds open (REFERENCE §A: /dev/mxcd, /dev/dri/*; NVIDIA: /dev/nvidia*).
GPU_DEVICE_PREFIXES = ("/dev/dri/", "/dev/mxcd", "/dev/mxnd", "/dev/mxgd", "/dev/nvidia")
STATE_DIR = "/var/lib/gpuk8s"  # journal and backup of an install in progress
JOURNAL = STATE_DIR + "/driver-install.json"  # the file journal (host.files)
BACKUP = STATE_DIR + "/driver-backup"
# what ran before the install in progress (module, version, ownership record); its
# "committed" flag is the commit point: without it, recovery rolls everything back
TRANSACTION = STATE_DIR + "/driver-transaction.json"
STAGING_PREFIX = ".gpuk8s-driver-"  # packages unpacked under STATE_DIR
DEFAULT_LOAD = ("modprobe", "{module}")
DEFAULT_UNLOAD = ("modprobe", "-r", "{module}")
# kmod's own lookup of the file it would load, on the target root (loaded or not:
# `modprobe -n -v` prints nothing for a module that is loaded, --show-depends always)
RESOLVE_ARGS = ("--show-depends", "-d", "{host_root}", "-S", "{kernel_release}", "{module}")
DEFAULT_RESOLVE = ("modprobe", *RESOLVE_ARGS)
# depmod for the running release; under a root other than / with that root as base dir
DEFAULT_DEPMOD = ("depmod", "-a", "{kernel_release}")
DEFAULT_DEPMOD_UNDER = ("depmod", "-a", "-b", "{host_root}", "{kernel_release}")
VERSION_RE = re.compile(r"^[0-9A-Za-z][0-9A-Za-z.+_~-]*$")


class DriverError(GpuK8sError):
    """Installing, loading or unloading the driver failed; the message says what to do."""

    outcome: Outcome | None = None  # set by ``converge``: the state before, the steps done


class PayloadError(DriverError):
    """The payload is unusable (missing, wrong version inside); nothing was changed."""


class GpuBusyError(DriverError):
    """Processes use the GPUs: the driver cannot be unloaded now; nothing was changed."""


@dataclass(frozen=True)
class DriverState:
    loaded: bool
    loaded_version: str | None  # the running module's version (/sys/module/<mod>/version)
    installed_version: str | None  # on disk (/opt/mxdriver/Version.txt)
    sdk_version: str | None
    mode: str = "native"  # gpu.driver.mode: cloud while driver-manager's driver runs

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

    @property
    def changes(self) -> bool:
        return self.install or self.load


def same_version(a: str | None, b: str | None) -> bool:
    return a is not None and b is not None and a.strip().lstrip("v") == b.strip().lstrip("v")


def check_version(name: str, value: str | None) -> None:
    if value is not None and not VERSION_RE.match(value):
        raise ConfigError(f"{name} {value!r} is not a version string (e.g. '2.33.0.6')")


def check_policy(policy: str) -> None:
    if policy not in POLICIES:
        raise ConfigError(f"deploy_policy {policy!r}: choose one of {', '.join(POLICIES)}")


def decide(policy: str, wanted: str | None, state: DriverState) -> Decision:
    """The deploy-policy table (module doc). Pure."""
    check_policy(policy)
    if policy == "Never":
        return Decision(False, False, "deploy_policy Never: the host's driver is left alone")
    if not wanted:
        raise ConfigError(f"version is required with deploy_policy {policy} (e.g. '2.33.0.6')")
    check_version("version", wanted)
    if policy == "IfNotPresent" and state.loaded:
        running = state.loaded_version or "unknown version"
        return Decision(False, False, f"a driver is loaded ({running}): IfNotPresent leaves it "
                                      "alone")
    if same_version(state.installed_version, wanted):
        if state.loaded and same_version(state.loaded_version, wanted):
            return Decision(False, False, f"{wanted} installed and loaded")
        now = (state.loaded_version or "unknown") if state.loaded else "not loaded"
        return Decision(False, True, f"{wanted} installed but the running driver is {now}")
    was = state.installed_version or "nothing"
    return Decision(True, True, f"installed {was}, wanted {wanted}")


def read_state(root: str, runner: Runner | None = None) -> DriverState:
    inventory = discover(root, runner=runner)
    return DriverState(
        loaded=inventory.driver.loaded,
        loaded_version=inventory.driver.version,
        installed_version=read_version_file(host_path(root, DRIVER_VERSION_FILE)),
        sdk_version=inventory.sdk.version,
        mode=str(inventory.driver.mode),
    )


# ----------------------------------------------------------------------------- payloads


def payload_kind(path: str, kind: str = "auto") -> str:
    if not os.path.exists(path):
        raise PayloadError(f"payload {path} does not exist")
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


def payload_version(path: str, kind: str) -> str | None:
    """The driver version a directory payload holds (its ``opt/mxdriver/Version.txt``);
    None for packages (checked after loading instead)."""
    if kind != "dir":
        return None
    return read_version_file(os.path.join(path, DRIVER_VERSION_FILE.lstrip("/")))


def check_payload(path: str, kind: str, wanted: str) -> None:
    """Refuse a payload that holds another version than ``wanted`` (nothing touched)."""
    inside = payload_version(path, kind)
    if inside is not None and not same_version(inside, wanted):
        raise PayloadError(
            f"payload {path} holds driver {inside} (opt/mxdriver/Version.txt), not the wanted "
            f"{wanted}: fix the payload (or the version asked for); nothing was changed"
        )


def check_tree(tree: str, wanted: str, module: str, root: str, source: str) -> str:
    """Check a host-layout payload tree before anything is touched: its
    ``opt/mxdriver/Version.txt`` says ``wanted``; it holds kernel module ``module`` under
    ``lib/modules/<release>/`` (``release``: the kernel the host under ``root`` runs) and
    every module there was built for that release (``vermagic``). Returns the module's
    path in the tree; PayloadError naming what is wrong otherwise (nothing was changed)."""
    release = kmodule.kernel_release(root)
    osrelease = host_path(root, kmodule.OSRELEASE)
    runs = f"this node runs kernel {release}" + (
        "" if os.path.isfile(osrelease) else f" (uname -r here: no {osrelease})")
    if payload_version(tree, "dir") is None:
        raise PayloadError(f"payload {source} has no opt/mxdriver/Version.txt: not a driver "
                           "payload (or a broken one); nothing was changed")
    check_payload(tree, "dir", wanted)
    found = kmodule.modules_in(tree)
    name = module.replace("-", "_")
    ours = [(r, rel) for r, rel in found if kmodule.module_name(rel) == name]
    if not any(r == release for r, _ in ours):
        where = ", ".join(f"{rel} (kernel {r})" for r, rel in ours)
        held = f"holds {module} only for another kernel: {where}" if ours else \
            f"holds no {module} kernel module (lib/modules/{release}/.../{module}.ko)"
        raise PayloadError(f"payload {source} {held}, and {runs}: use the payload built for "
                           "this kernel; nothing was changed")
    for r, rel in found:
        if r != release:
            continue
        try:
            built = kmodule.built_for(os.path.join(tree, rel))
        except kmodule.ModuleFormatError as err:
            raise PayloadError(f"payload {source}: {err}; nothing was changed") from err
        if built != release:
            raise PayloadError(
                f"payload {source}: {rel} was built for kernel {built} (its vermagic), but "
                f"{runs}: the kernel would refuse it (Invalid module format); use the payload "
                "built for this kernel; nothing was changed"
            )
    rel = next(rel for r, rel in ours if r == release)
    inside = module_version(os.path.join(tree, rel))
    if not same_version(inside, wanted):
        raise PayloadError(
            f"payload {source}: {rel} is driver {inside or 'of no version'} (its .modinfo "
            f"version), but its opt/mxdriver/Version.txt says {wanted}: a broken payload; "
            "nothing was changed")
    return rel


def module_version(path: str) -> str | None:
    """The ``version`` of a module's ``.modinfo`` (what the kernel shows in
    /sys/module/<name>/version once it is loaded); None when it has none."""
    found = kmodule.modinfo(path).get("version")
    return found[0] if found else None


def install_commands(kind: str, payload: str, root: str,
                     run_args: tuple[str, ...] = ()) -> list[list[str]]:
    """argv lists that install a package payload onto ``root`` (``/``: package manager /
    vendor installer) or unpack it into ``root`` (any other directory: files only)."""
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


def expand(argv: list[str] | tuple[str, ...], **values: str) -> list[str]:
    """``{host_root}`` / ``{payload}`` / ``{module}`` / ... placeholders in a command."""
    out = []
    for item in argv:
        for key, value in values.items():
            item = item.replace("{" + key + "}", value)
        out.append(item)
    return out


# ------------------------------------------------------------------------ GPU processes


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


# --------------------------------------------------------------------------- procedure


@dataclass(frozen=True)
class InstallRequest:
    """What to converge to and how (the options of ``gpu_driver`` / driver-manager)."""

    policy: str = "IfNotPresent"
    version: str | None = None
    payload: str | None = None
    payload_kind: str = "auto"
    run_args: tuple[str, ...] = ()
    install_command: tuple[str, ...] | None = None
    module: str = "metax"
    load_command: tuple[str, ...] = DEFAULT_LOAD
    unload_command: tuple[str, ...] = DEFAULT_UNLOAD
    # None: DEFAULT_DEPMOD on /, DEFAULT_DEPMOD_UNDER elsewhere
    depmod_command: tuple[str, ...] | None = None
    # kmod's lookup (resolve_argv); None: the load command's program asked with
    # RESOLVE_ARGS when the load command is `PROGRAM... {module}`, else DEFAULT_RESOLVE
    resolve_command: tuple[str, ...] | None = None
    force: bool = False
    sdk_version: str | None = None
    owner: str | None = None  # record ownership (driver-manager: "driver-manager")

    def check(self) -> None:
        check_policy(self.policy)
        check_version("version", self.version)
        check_version("sdk_version", self.sdk_version)


@dataclass
class Outcome:
    """Result of ``converge`` (also on failure, through ``DriverError.outcome``)."""

    before: DriverState
    after: DriverState
    decision: Decision
    kind: str | None = None
    actions: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return self.decision.changes


def plan(root: str, request: InstallRequest, runner: Runner | None = None
         ) -> tuple[DriverState, Decision, str | None]:
    """(state, decision, payload kind) without changing anything (check mode)."""
    request.check()
    before = read_state(root, runner)
    decision = decide(request.policy, request.version, before)
    kind = None
    if decision.install:
        if not request.payload:
            raise ConfigError(f"payload is required to install {request.version} "
                              f"(deploy_policy {request.policy})")
        kind = payload_kind(request.payload, request.payload_kind)
        if kind == "dir" and not request.install_command:
            module = check_tree(request.payload, str(request.version), request.module, root,
                                request.payload)
            _check_resolve_command(root, request)
            check_compression(root, request, runner or default_runner, module,
                              request.payload)
            check_rivals(root, request, runner or default_runner, module)
        else:  # the install command's / package's own layout: the version when it says
            check_payload(request.payload, kind, str(request.version))
        _check_command(depmod_argv(root, request, "-"), "depmod",
                       "install kmod, or set the depmod command")
    if decision.changes:
        _check_resolve_command(root, request)
    return before, decision, kind


# what kmod must be built with to read a compressed module (`kmod -V`: +XZ -ZLIB ...)
COMPRESSION_FEATURES = {".xz": "XZ", ".zst": "ZSTD", ".gz": "ZLIB"}


def kmod_features(root: str, request: InstallRequest, runner: Runner) -> dict[str, bool]:
    """The features the node's kmod was built with (``-V`` of the lookup's program, e.g.
    ``+ZSTD +XZ -ZLIB``); empty when it does not say."""
    argv = resolve_argv(root, request, "-")
    program = argv[:next((i for i, a in enumerate(argv) if a.startswith("-")), len(argv))]
    try:
        rc, out, _ = runner([*program, "-V"])
    except OSError:
        return {}
    words = out.split() if rc == 0 else []
    return {w[1:]: w[0] == "+" for w in words if w[:1] in "+-" and len(w) > 1}


def check_compression(root: str, request: InstallRequest, runner: Runner, ours: str,
                      source: str) -> None:
    """The payload's module is compressed only as the node's kmod reads (nothing changed
    otherwise: kmod could not load it)."""
    suffix = os.path.splitext(ours)[1]
    feature = COMPRESSION_FEATURES.get(suffix)
    if feature is None:
        return
    if kmod_features(root, request, runner).get(feature) is False:
        raise PayloadError(
            f"payload {source}: {ours} is {suffix[1:]}-compressed, and this node's kmod "
            f"was built without {feature} (`kmod -V` says -{feature}): it cannot load the "
            f"module; ship it as .ko or in a compression kmod reads; nothing was changed")


def _check_resolve_command(root: str, request: InstallRequest) -> None:
    _check_command(resolve_argv(root, request, "-"), "module lookup",
                   "install kmod, or set the resolve command")


def check_rivals(root: str, request: InstallRequest, runner: Runner, ours: str) -> None:
    """Before anything changes (check mode too): no other file of the module ranks with
    the payload's ``ours`` (``same_priority``), and the file kmod's lookup finds now is
    not one it ranks above ours (a DKMS build under updates/). PayloadError otherwise."""
    tied = same_priority(root, request.module, ours)
    if tied:
        raise PayloadError(f"{tied_message(request, tied[0], ours, None)}; nothing was changed")
    try:
        now = resolve(root, request, runner)
    except DriverError:
        return  # kmod finds none now (no driver, or no depmod run): nothing ranks above
    if now != os.path.normpath(ours) and _in_updates(now) and not _in_updates(ours):
        raise PayloadError(
            f"kmod loads /{now} now, under updates/, which it searches before the "
            f"payload's /{ours}: {left_behind_hint(request)}; nothing was changed")



def depmod_argv(root: str, request: InstallRequest, release: str) -> list[str]:
    default = DEFAULT_DEPMOD if os.path.realpath(root) == "/" else DEFAULT_DEPMOD_UNDER
    return expand(request.depmod_command or default, host_root=root, kernel_release=release,
                  module=request.module)


def resolve_argv(root: str, request: InstallRequest, release: str) -> list[str]:
    """kmod's lookup of the file ``modprobe`` would load for the module, on ``root``."""
    argv = request.resolve_command
    if argv is None:
        load = request.load_command
        argv = (*load[:-1], *RESOLVE_ARGS) if len(load) > 1 and load[-1] == "{module}" \
            else DEFAULT_RESOLVE
    return expand(argv, host_root=root, kernel_release=release, module=request.module)


def resolve(root: str, request: InstallRequest, runner: Runner) -> str:
    """The file kmod loads for the module on ``root`` now (its own lookup through
    ``modules.dep``: ``updates/`` first, e.g. a DKMS build), relative to ``root``."""
    argv = resolve_argv(root, request, kmodule.kernel_release(root))
    try:
        rc, out, err = runner(argv)
    except OSError as exc:
        raise DriverError(f"module lookup `{' '.join(argv)}` could not run: {exc}") from exc
    name = request.module.replace("-", "_")
    found = [line.split()[1] for line in out.splitlines()
             if line.startswith("insmod ") and len(line.split()) > 1
             and kmodule.module_name(line.split()[1]) == name]
    if rc != 0 or not found:
        raise DriverError(f"kmod does not find module {request.module} on {root} "
                          f"(`{' '.join(argv)}` exited with {rc}: "
                          f"{(err or out).strip()[-300:] or 'no insmod line'})")
    path = os.path.normpath(found[-1])
    for base in sorted({os.path.realpath(root), os.path.normpath(root)} - {"/"}):
        if path.startswith(base + os.sep):  # printed under -d ROOT
            return path[len(base):].lstrip("/")
    return path.lstrip("/")


def _in_updates(rel: str) -> bool:
    """``lib/modules/<release>/updates/...``: what depmod's default search order puts
    first ("updates", then "built-in": every other directory)."""
    return os.path.normpath(rel).split(os.sep)[3:4] == ["updates"]


def same_priority(root: str, module: str, ours: str) -> list[str]:
    """Other files of ``module`` for the release of ``ours`` (``lib/modules/<release>/...``)
    that depmod's default search order ranks with it."""
    ours = os.path.normpath(ours)
    top = os.sep.join(ours.split(os.sep)[:3])  # lib/modules/<release>
    name = module.replace("-", "_")
    return [rel for _, rel in kmodule.modules_in(root) if rel.startswith(top + os.sep)
            and kmodule.module_name(rel) == name and rel != ours
            and _in_updates(rel) == _in_updates(ours)]


def left_behind_hint(request: InstallRequest) -> str:
    return (f"another installer left a {request.module} module that kmod prefers (a DKMS "
            "build under updates/, or an older one beside it); remove it (`dkms remove`, or "
            "delete the file) and retry")


def tied_message(request: InstallRequest, tied: str, ours: str, found: str | None) -> str:
    takes = f"it takes /{found} now, maybe the other after the next depmod" if found else \
        "either, by directory order"
    return (f"/{tied} is another {request.module} module beside the payload's /{ours}, as "
            "depmod ranks them (neither under updates/, or both): which one kmod loads "
            f"depends on directory order ({takes}); remove the one left behind and retry")


def check_resolved(root: str, request: InstallRequest, runner: Runner,
                   ours: str | None) -> str:
    """Before the running driver is unloaded: the file kmod will load (``resolve``) is
    ``ours`` (the payload's module, when known) and its ``.modinfo`` version is the wanted
    one. DriverError naming the file kmod prefers otherwise. Returns that file."""
    wanted = str(request.version)
    found = resolve(root, request, runner)
    try:
        version = module_version(host_path(root, found))
    except kmodule.ModuleFormatError as err:
        raise DriverError(f"kmod would load /{found}, which is unreadable: {err}") from err
    if ours is not None and found != os.path.normpath(ours):
        raise DriverError(
            f"kmod would load /{found} (driver {version or 'of no version'}), not the "
            f"payload's /{ours}: {left_behind_hint(request)}. The running driver was not "
            "unloaded")
    tied = same_priority(root, request.module, ours) if ours else []
    if tied:
        raise DriverError(f"{tied_message(request, tied[0], str(ours), found)}. The running "
                          "driver was not unloaded")
    if not same_version(version, wanted):
        raise DriverError(
            f"kmod would load /{found}, which is driver {version or 'of no version'} (its "
            f".modinfo version), not the wanted {wanted}; the running driver was not unloaded")
    return found


def _check_command(argv: list[str], what: str, hint: str) -> None:
    """The program of ``argv`` exists (checked before the host is touched)."""
    program = argv[0] if argv else ""
    found = os.access(program, os.X_OK) if "/" in program else shutil.which(program) is not None
    if not found:
        raise DriverError(f"{what} command `{' '.join(argv)}`: {program or 'nothing'} not "
                          f"found ({hint}); nothing was changed")


def planned_after(before: DriverState, decision: Decision, request: InstallRequest
                  ) -> DriverState:
    if not decision.changes:
        return before
    return replace(
        before,
        loaded=True,
        loaded_version=request.version,
        installed_version=request.version if decision.install else before.installed_version,
        sdk_version=request.sdk_version or before.sdk_version,
    )


def planned_actions(before: DriverState, decision: Decision) -> list[str]:
    steps = (("install", decision.install), ("unload", before.loaded and decision.changes),
             ("load", decision.changes))
    return [name for name, on in steps if on]


def _run(runner: Runner, argv: list[str], what: str) -> None:
    try:
        rc, out, err = runner(argv)
    except OSError as exc:
        raise DriverError(f"{what} failed: `{' '.join(argv)}` could not run: {exc}") from exc
    if rc != 0:
        raise DriverError(f"{what} failed: `{' '.join(argv)}` exited with {rc}: "
                          f"{(err or out).strip()[-500:]}")


def _stage(root: str, request: InstallRequest, kind: str, runner: Runner
           ) -> tuple[str | None, str | None]:
    """Unpack a package payload (root other than /, no install command) into a staging
    directory under STATE_DIR and check it like a directory payload. Returns (staging
    directory, the module's path in it); None for what is not staged / not known (the
    package manager on /, an install command); a directory payload is not staged."""
    if request.install_command:
        return None, None
    if kind == "dir":
        return None, check_tree(str(request.payload), str(request.version), request.module,
                                root, str(request.payload))
    if os.path.realpath(root) == "/":
        return None, None
    os.makedirs(host_path(root, STATE_DIR), exist_ok=True)
    staging = tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=host_path(root, STATE_DIR))
    try:
        for argv in install_commands(kind, str(request.payload), staging, request.run_args):
            _run(runner, argv, "unpacking the payload")
        module = check_tree(staging, str(request.version), request.module, root,
                            f"{request.payload} (unpacked)")
        check_compression(root, request, runner, module, f"{request.payload} (unpacked)")
    except GpuK8sError:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return staging, module


def _install_files(root: str, request: InstallRequest, kind: str, runner: Runner,
                   staged: str | None) -> None:
    payload = str(request.payload)
    journal, backup = host_path(root, JOURNAL), host_path(root, BACKUP)
    if request.install_command:
        _run(runner, expand(request.install_command, payload=payload, host_root=root),
             "install")
    elif kind == "dir" or staged:
        files.install_tree(staged or payload, root, journal, backup)
    else:
        for argv in install_commands(kind, payload, root, request.run_args):
            _run(runner, argv, "install")
    _depmod(root, request, runner)


def _depmod(root: str, request: InstallRequest, runner: Runner) -> None:
    """``depmod`` for the running kernel: kmod's modprobe finds a module only through
    ``lib/modules/<release>/modules.dep``."""
    _run(runner, depmod_argv(root, request, kmodule.kernel_release(root)), "depmod")


def _load(root: str, request: InstallRequest, runner: Runner) -> None:
    _run(runner, expand(request.load_command, module=request.module, host_root=root),
         "loading the driver")


def _begin(root: str, request: InstallRequest, before: DriverState) -> None:
    """Record what runs now, before the first change (``TRANSACTION``)."""
    files.write_json(host_path(root, TRANSACTION), {
        "module": request.module, "loaded": before.loaded, "version": before.loaded_version,
        "owner": files.read_json(host_path(root, OWNER_RECORD)), "committed": False,
    })


def _commit(root: str, request: InstallRequest) -> None:
    """The install is final: ownership, the commit point, then forget the backup."""
    if request.owner:
        record_owner(root, str(request.version), request.owner)
    else:
        clear_owner(root)  # installed by the admin's own tooling: native again
    path = host_path(root, TRANSACTION)
    record = files.read_json(path)
    files.write_json(path, {**(record if isinstance(record, dict) else {}), "committed": True})
    files.commit(host_path(root, JOURNAL), root)
    files.remove(path)


# the records an install writes (files.atomic_write: a killed write leaves a temp file)
RECORDS = (JOURNAL, TRANSACTION, OWNER_RECORD)


def _left_behind(root: str) -> tuple[str, list[str]]:
    """What a process that died during ``converge`` left: ``"committed"`` (past the
    commit point), ``"uncommitted"`` (a transaction record or file journal before it) or
    ``""``; and what is only litter: payload unpack directories, temp files of its
    records, a backup without a journal (all under ``STATE_DIR``). Reads only."""
    state_dir = host_path(root, STATE_DIR)
    temps = tuple(files.temp_prefix(r) for r in RECORDS)
    stale = [n for n in _listdir(state_dir) if n.startswith(STAGING_PREFIX)
             or (n.startswith(temps) and n.split(files.TEMP_MARK)[-1].isdigit())]
    if os.path.lexists(host_path(root, BACKUP)) and \
            not os.path.lexists(host_path(root, JOURNAL)):
        stale.append(os.path.basename(BACKUP))
    record = files.read_json(host_path(root, TRANSACTION))
    if isinstance(record, dict) and record.get("committed"):
        return "committed", stale
    if isinstance(record, dict) or os.path.lexists(host_path(root, JOURNAL)):
        return "uncommitted", stale
    return "", stale


def recover(root: str, request: InstallRequest, runner: Runner) -> str | None:
    """Finish what a process that died during ``converge`` left: before the commit point
    the files, ``modules.dep``, the ownership record and the running module are put back
    as they were (the new module unloaded, the previous one loaded again); after it the
    backup is dropped. Returns what was done, None when nothing was."""
    install, stale = _left_behind(root)
    state_dir = host_path(root, STATE_DIR)
    for name in stale:
        files.remove(os.path.join(state_dir, name))
    if install == "committed":
        files.commit(host_path(root, JOURNAL), root)
        files.remove(host_path(root, TRANSACTION))
        return "finished committing an interrupted driver install"
    if not install:
        return "removed what an interrupted driver install left: " + ", ".join(stale) \
            if stale else None
    return "rolled back an interrupted driver install: " + _roll_back(root, request, runner)


def interrupted(root: str) -> str | None:
    """What ``recover`` would do, read only (check mode); None when it would do nothing."""
    install, stale = _left_behind(root)
    if install == "committed":
        return "a driver install was interrupted after its commit point: it is finished first"
    if install:
        return f"a driver install was interrupted ({JOURNAL}): it is rolled back first"
    return ("what an interrupted driver install left is removed first: " + ", ".join(stale)
            if stale else None)


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def converge(root: str, request: InstallRequest, runner: Runner,
             on_step: Callable[[str], None] | None = None) -> Outcome:
    """Bring the host to ``request`` (see the module doc). Raises ``DriverError`` (with
    ``.outcome``) when it could not; the host is then as it was before."""
    before, decision, kind = plan(root, request, runner)
    outcome = Outcome(before, before, decision, kind)
    if not decision.changes:
        return outcome
    try:
        _converge(root, request, runner, outcome, on_step or (lambda _step: None))
    except DriverError as err:
        err.outcome = outcome
        raise
    return outcome


def _converge(root: str, request: InstallRequest, runner: Runner, outcome: Outcome,
              on_step: Callable[[str], None]) -> None:
    before, decision, kind = outcome.before, outcome.decision, outcome.kind
    wanted = str(request.version)
    if before.loaded:
        busy = gpu_processes(root)
        if busy and not request.force:
            raise GpuBusyError(busy_message(busy))
    staged, module = _stage(root, request, str(kind), runner) if decision.install else \
        (None, None)
    try:
        os.makedirs(host_path(root, STATE_DIR), exist_ok=True)
        _begin(root, request, before)
        try:
            # the files first, while the running driver runs on: kmod's own lookup then
            # says which file it would load, before anything is unloaded
            if decision.install:
                on_step("install")
                _install_files(root, request, str(kind), runner, staged)
                outcome.actions.append("install")
            check_resolved(root, request, runner, module)
            if before.loaded:
                on_step("unload")
                _run(runner, expand(request.unload_command, module=request.module,
                                    host_root=root), "unloading the driver")
                outcome.actions.append("unload")
            on_step("load")
            _load(root, request, runner)
            outcome.actions.append("load")
            after = read_state(root, runner)
            if not same_version(after.loaded_version, wanted):
                raise DriverError(
                    f"after loading, the running driver is {after.loaded_version or 'none'}, "
                    f"wanted {wanted}: the payload does not hold that version, or the kernel "
                    "refused it (check dmesg)"
                )
            if request.sdk_version and not same_version(after.sdk_version,
                                                        request.sdk_version):
                raise DriverError(
                    f"SDK version is {after.sdk_version or 'none'} after installing, wanted "
                    f"{request.sdk_version}: the payload lacks opt/maca/Version.txt or holds "
                    "another SDK"
                )
        except DriverError as err:
            raise type(err)(f"{err}; {_roll_back(root, request, runner)}") from err
        on_step("commit")
        _commit(root, request)
    finally:
        if staged:
            shutil.rmtree(staged, ignore_errors=True)
    outcome.after = read_state(root, runner)


def _roll_back(root: str, request: InstallRequest, runner: Runner) -> str:
    """Undo an install from its records (``TRANSACTION``, the file journal): restore the
    files and ``modules.dep``, unload whatever module runs that did not run before, load
    the previous driver again, restore the ownership record. Idempotent (a crash half-way
    is finished by the next ``recover``); says what happened."""
    record = files.read_json(host_path(root, TRANSACTION))
    known = isinstance(record, dict)
    was_loaded = bool(record.get("loaded")) if isinstance(record, dict) else True
    previous = record.get("version") if isinstance(record, dict) else None
    said: list[str] = []
    if files.rollback(host_path(root, JOURNAL), root) is not None:
        said.append("the previous driver files were restored")
        if _run_quiet(runner, depmod_argv(root, request, kmodule.kernel_release(root))) != 0:
            said.append("depmod failed (run `depmod -a` by hand)")
    else:
        said.append("no file had been changed")
    now = read_state(root, runner)
    if now.loaded and not (was_loaded and (not known or same_version(now.loaded_version,
                                                                      previous))):
        rc = _run_quiet(runner, expand(request.unload_command, module=request.module,
                                       host_root=root))
        said.append(f"driver {now.loaded_version or '?'} unloaded" if rc == 0 else
                    f"unloading driver {now.loaded_version or '?'} failed")
        now = read_state(root, runner)
    if isinstance(record, dict):
        owner = record.get("owner")
        if isinstance(owner, dict):
            files.write_json(host_path(root, OWNER_RECORD), owner)
        else:
            clear_owner(root)
    if not was_loaded:
        said.append("no driver was loaded before" + (", none is loaded now" if not now.loaded
                                                      else ""))
    elif now.loaded:
        said.append(f"the previous driver ({now.loaded_version or 'unknown version'}) runs")
    else:
        rc = _run_quiet(runner, expand(request.load_command, module=request.module,
                                       host_root=root))
        said.append("the previous driver was loaded again" if rc == 0 else
                    "loading the previous driver failed too: the node has no GPU driver now")
    files.remove(host_path(root, TRANSACTION))
    tail = ("" if not was_loaded else ". Fix the cause and retry, or run the maintenance "
            "playbook's rescue steps")
    return "; ".join(said) + tail


def _run_quiet(runner: Runner, argv: list[str]) -> int:
    try:
        return runner(argv)[0]
    except OSError:
        return 127


# --------------------------------------------------------------------------- ownership


def record_owner(root: str, version: str, owner: str) -> None:
    """Mark the running driver as installed by ``owner`` (labels: gpu.driver.mode=cloud)."""
    files.write_json(host_path(root, OWNER_RECORD), {
        "version": version, "owner": owner,
        "installed": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    })


def clear_owner(root: str) -> bool:
    return files.remove(host_path(root, OWNER_RECORD))
