"""Device and SDK injection: one set of container edits, four consumers.

What a container holding some GPUs must get — the device nodes of those GPUs (or VFs),
the vendor's control devices, the host SDK mounted read-only, and the SDK's environment —
is computed here once, as :class:`ContainerEdits`, and rendered for each consumer:

* a CDI spec (``build_spec``), written on each node by container-runtime, read by CDI-aware
  runtimes (containerd >= 1.7, CRI-O, docker >= 25) and by our OCI runtime wrapper;
* an OCI runtime spec edit (``apply_to_oci``), done by that wrapper on runtimes without CDI
  (containerd 1.6, older docker), the way nvidia-container-runtime's CDI mode does;
* ``docker run`` arguments (``docker_args``), used by ``metax-docker``;
* the device plugin's ``Allocate`` answer (``edits_for_units``) when CDI names cannot be used.

On NVIDIA nodes the spec also gives every GPU container the driver's user space
(``driver_edits``), found on the host the way nvidia-container-toolkit's ``nvidia-ctk cdi
generate`` finds it (``discovery.nvidia.driver_files``): the libraries ``*.so.<driver
version>`` of the driver's library directories, its programs, GSP firmware and IPC sockets,
each bind-mounted at its host path, and ``createContainer`` hooks that make the soname
links, put an image's CUDA forward-compatibility libraries first where the host's driver
branch is older, and update the container's ld.so cache (``host.cdihook``, or the
toolkit's own ``nvidia-cdi-hook`` where it is installed, same arguments, no compat hook).

CDI facts (cncf-tags/container-device-interface SPEC.md, REFERENCE §F): kind
``vendor/class``; device names start with a letter or digit and may contain ``_ - . :``;
``containerEdits`` of the spec apply when any of its devices is requested; unknown fields
make a spec invalid. Pure: stdlib only, no I/O (the wrapper passes ``stat``), Python 3.8+.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Tuple

from .errors import ConfigError, InventoryError
from .model import NodeInventory
from .sharing import ASSIGNED_ANNOTATION, MODE_MPS, Assignment, share_env, share_mounts
from .topology import Unit, units_for_inventory

CDI_VERSION = "0.6.0"  # the oldest version that allows every field we write (annotations)
CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"
# The annotation the device plugin sets (and the runtime wrapper reads) on runtimes without
# native CDI; value: comma-separated fully qualified device names.
CDI_ANNOTATION = CDI_ANNOTATION_PREFIX + "gpuk8s"
DEFAULT_KIND = {"metax": "metax-tech.com/gpu", "nvidia": "nvidia.com/gpu"}
VISIBLE_ENV = {"metax": "MACA_VISIBLE_DEVICES", "nvidia": "NVIDIA_VISIBLE_DEVICES"}
DEVICE_PERMISSIONS = "rw"
# MetaX: driver user space and SDK (REFERENCE §A: /opt/mxdriver, /opt/maca).
DEFAULT_SDK_PATHS = {"metax": ("/opt/maca", "/opt/mxdriver"), "nvidia": ()}
MOUNT_OPTIONS = ("ro", "nosuid", "nodev", "rbind")

_VENDOR_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$")
_CLASS_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")
_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_VERSION_RE = re.compile(r"^(0\.[3-9]|1\.[01])\.[0-9]+$")

StatFn = Callable[[str], Tuple[str, int, int]]  # host path -> ("c"|"b", major, minor)


class CdiError(ConfigError):
    """A CDI spec, a device name or an OCI spec edit is invalid; the message says which."""


@dataclass(frozen=True)
class DeviceNode:
    path: str  # inside the container
    host_path: str
    permissions: str = DEVICE_PERMISSIONS


@dataclass(frozen=True)
class Mount:
    host_path: str
    container_path: str
    read_only: bool = True
    options: tuple[str, ...] = ()  # the bind mount's options; () : MOUNT_OPTIONS / rw


HOOK_NAMES = ("prestart", "createRuntime", "createContainer", "startContainer", "poststart",
              "poststop")


@dataclass(frozen=True)
class Hook:
    """An OCI hook (CDI ``containerEdits.hooks``): ``args[0]`` is the program's name."""

    hook_name: str
    path: str
    args: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    timeout: int | None = None


@dataclass(frozen=True)
class ContainerEdits:
    """Edits for one container; ``env`` entries are ``NAME=value``."""

    env: tuple[str, ...] = ()
    device_nodes: tuple[DeviceNode, ...] = ()
    mounts: tuple[Mount, ...] = ()
    hooks: tuple[Hook, ...] = ()

    def merged(self, *others: ContainerEdits) -> ContainerEdits:
        """These edits followed by ``others``: a later env value for the same name wins;
        device nodes are unique by container path, mounts by container path (first wins),
        hooks are kept once each, in order."""
        env: dict[str, str] = {}
        nodes: dict[str, DeviceNode] = {}
        mounts: dict[str, Mount] = {}
        hooks: list[Hook] = []
        for edits in (self, *others):
            for item in edits.env:
                name, _, value = item.partition("=")
                env.pop(name, None)
                env[name] = value
            for node in edits.device_nodes:
                nodes.setdefault(node.path, node)
            for mount in edits.mounts:
                mounts.setdefault(mount.container_path, mount)
            hooks.extend(h for h in edits.hooks if h not in hooks)
        return ContainerEdits(
            tuple(f"{k}={v}" for k, v in env.items()), tuple(nodes.values()),
            tuple(mounts.values()), tuple(hooks),
        )

    def env_map(self) -> dict[str, str]:
        return dict(item.partition("=")[::2] for item in self.env)

    def without_paths(self, container_paths: Iterable[str]) -> ContainerEdits:
        """Drop the mounts at (or under) these container paths and the SDK environment that
        points into them: what is left when an image's own ``/opt/maca`` wins."""
        roots = tuple(p.rstrip("/") for p in container_paths)
        if not roots:
            return self

        def under(path: str) -> bool:
            return any(path == r or path.startswith(r + "/") for r in roots)

        mounts = tuple(m for m in self.mounts if not under(m.container_path))
        env = tuple(e for e in self.env if e.partition("=")[0] not in SDK_ENV_NAMES)
        return replace(self, mounts=mounts, env=env)


@dataclass(frozen=True)
class SdkSource:
    """Which host SDK trees a container gets, and where they are on the host.

    ``paths`` are the container paths (and, under ``host_prefix``, the host paths) of
    the SDK and driver user space; empty means no SDK injection.
    """

    paths: tuple[str, ...] = DEFAULT_SDK_PATHS["metax"]
    host_paths: tuple[str, ...] | None = None  # default: host_prefix + path

    def __post_init__(self) -> None:
        for path in (*self.paths, *(self.host_paths or ())):
            if not path.startswith("/"):
                raise CdiError(f"SDK path {path!r} must be absolute")
        if self.host_paths is not None and len(self.host_paths) != len(self.paths):
            raise CdiError("SDK host_paths must name one host path per SDK path")


SDK_ENV_NAMES = ("MACA_PATH", "LD_LIBRARY_PATH")


def sdk_edits(sdk: SdkSource, host_prefix: str = "") -> ContainerEdits:
    """Read-only bind mounts of the SDK trees and the environment that finds them."""
    if not sdk.paths:
        return ContainerEdits()
    hosts = sdk.host_paths or tuple(_host(host_prefix, p) for p in sdk.paths)
    mounts = tuple(Mount(h, p, True) for p, h in zip(sdk.paths, hosts))
    libs = ":".join(f"{p}/lib" for p in sdk.paths)
    env = (f"MACA_PATH={sdk.paths[0]}", f"LD_LIBRARY_PATH={libs}")
    return ContainerEdits(env=env, mounts=mounts)


def _host(prefix: str, path: str) -> str:
    prefix = prefix.rstrip("/")
    return prefix + path if prefix else path


def unit_device_paths(inventory: NodeInventory, unit: Unit) -> tuple[str, ...]:
    """Device nodes of one allocatable unit (the GPU's, or its VF's)."""
    gpu = inventory.gpu(unit.gpu)
    if unit.vf is None:
        return gpu.device_nodes
    nodes = gpu.sriov.vf_device_nodes
    return nodes[unit.vf] if unit.vf < len(nodes) else ()


def unit_edits(inventory: NodeInventory, unit: Unit, host_prefix: str = "") -> ContainerEdits:
    """Per-device edits: the unit's own device nodes."""
    return ContainerEdits(
        device_nodes=tuple(
            DeviceNode(p, _host(host_prefix, p)) for p in unit_device_paths(inventory, unit)
        )
    )


def common_edits(
    inventory: NodeInventory, host_prefix: str = "", sdk: SdkSource | None = None
) -> ContainerEdits:
    """Edits every GPU container gets: the control devices (``/dev/mxcd``) and, with ``sdk``,
    the host SDK."""
    nodes = tuple(DeviceNode(p, _host(host_prefix, p)) for p in inventory.control_devices)
    edits = ContainerEdits(device_nodes=nodes)
    return edits.merged(sdk_edits(sdk, host_prefix)) if sdk is not None else edits


def visible_value(
    inventory: NodeInventory, units: Sequence[Unit], mode: str, positions: Mapping[str, int]
) -> str | None:
    """The value of ``MACA_VISIBLE_DEVICES`` / ``NVIDIA_VISIBLE_DEVICES`` for ``units``
    (sorted in host order): ``container`` 0..k-1, ``host`` node-wide positions, ``uuid``
    the GPU's UUID (a VF's id for VFs), ``none`` no variable; ``auto`` = ``uuid`` on NVIDIA,
    ``container`` elsewhere."""
    if mode == "auto":
        mode = "uuid" if inventory.backend == "nvidia" else "container"
    if mode == "none":
        return None
    if mode == "container":
        # only the allocated device nodes exist in the container: runtimes number them
        # 0..k-1 in host order, which is the order of ``units``
        return ",".join(str(i) for i in range(len(units)))
    if mode == "host":
        return ",".join(str(positions[u.id]) for u in units)
    if mode == "uuid":
        values = []
        for unit in units:
            gpu = inventory.gpu(unit.gpu)
            values.append(gpu.uuid if gpu.uuid and unit.vf is None else unit.id)
        return ",".join(values)
    raise ConfigError(f"visible devices mode {mode!r}: choose auto, container, host, uuid or none")


def edits_for_units(
    inventory: NodeInventory,
    units: Sequence[Unit],
    host_prefix: str = "",
    sdk: SdkSource | None = None,
) -> ContainerEdits:
    """Everything a container holding ``units`` needs, without the visible-devices variable
    (which depends on how the caller numbers devices): common edits + each unit's."""
    return common_edits(inventory, host_prefix, sdk).merged(
        *(unit_edits(inventory, u, host_prefix) for u in units)
    )


def shared_edits(
    inventory: NodeInventory,
    assignment: Assignment,
    host_prefix: str = "",
    sdk: SdkSource | None = None,
) -> ContainerEdits:
    """What a container of a shared-GPU pod gets (``core.sharing``): the device nodes of
    the assigned GPUs (``edits_for_units``), the mode's environment (``share_env``) and,
    for MPS, the GPU's MPS pipe directory mounted read-write (clients write to it)."""
    units = []
    for index in assignment.gpus:
        try:
            gpu = inventory.gpu(index)
        except InventoryError:
            raise CdiError(
                f"{ASSIGNED_ANNOTATION}: GPU {index} is not on this node "
                f"(GPUs: {', '.join(str(g.index) for g in inventory.gpus)})"
            ) from None
        units.append(Unit(gpu.pci_address, gpu.index))
    uuids = [inventory.gpu(index).uuid or "" for index in assignment.gpus]
    mps = assignment.share.mode == MODE_MPS
    if mps and not all(uuids):
        raise CdiError("mps: the assigned GPU has no UUID (the MPS pipe directory is per UUID)")
    env = share_env(assignment, uuids if mps else ())
    mounts = tuple(
        Mount(_host(host_prefix, host), container, read_only=False)
        for host, container in share_mounts(assignment, uuids if mps else ())
    )
    own = ContainerEdits(env=tuple(f"{k}={v}" for k, v in env.items()), mounts=mounts)
    return edits_for_units(inventory, units, host_prefix, sdk).merged(own)


# ---------------------------------------------------------------- NVIDIA driver files

# nvidia-container-toolkit's mount options (internal/discover: mounts.go, ipc.go)
DRIVER_MOUNT_OPTIONS = ("ro", "nosuid", "nodev", "rbind", "rprivate")
IPC_MOUNT_OPTIONS = ("nosuid", "nodev", "rbind", "rprivate", "noexec")


@dataclass(frozen=True)
class DriverFiles:
    """An NVIDIA driver's user space on a host (``discovery.nvidia.driver_files``); paths
    are the host's, relative to its root, and the same inside the container."""

    version: str
    libraries: tuple[str, ...] = ()  # every *.so.<version> of the driver's library dirs
    links: tuple[tuple[str, str], ...] = ()  # (target, link): the soname and .so links
    library_dirs: tuple[str, ...] = ()  # where the libraries are: the ld.so cache's folders
    binaries: tuple[str, ...] = ()  # nvidia-smi, nvidia-debugdump, ...
    firmware: tuple[str, ...] = ()  # /lib/firmware/nvidia/<version>/gsp*.bin
    ipc: tuple[str, ...] = ()  # sockets (persistenced, fabric manager), the MPS pipe dir
    toolkit_hook: str | None = None  # nvidia-container-toolkit's nvidia-cdi-hook, if present
    problems: tuple[str, ...] = ()


def driver_hooks(files: DriverFiles, hook_path: str) -> tuple[Hook, ...]:
    """The ``createContainer`` hooks: soname / ``.so`` links, CUDA forward compatibility,
    then the ld.so cache over the library folders. ``hook_path`` runs them with
    nvidia-cdi-hook's arguments (its own, or gpuk8s' runtime wrapper whose ``hook``
    subcommand takes the same). ``enable-cuda-compat`` only with gpuk8s' wrapper: an
    ``nvidia-cdi-hook`` older than v1.18 has no such command, and a hook that fails stops
    the container."""
    name = hook_path.rsplit("/", 1)[-1]
    toolkit = name == "nvidia-cdi-hook"
    prefix = (name,) if toolkit else (name, "hook")
    hooks = []
    if files.links:
        args = [a for target, link in files.links for a in ("--link", f"{target}::{link}")]
        hooks.append(Hook("createContainer", hook_path, (*prefix, "create-symlinks", *args)))
    if files.library_dirs and files.version and not toolkit:
        hooks.append(Hook("createContainer", hook_path, (
            *prefix, "enable-cuda-compat", "--host-driver-version", files.version)))
    if files.library_dirs:
        args = [a for folder in files.library_dirs for a in ("--folder", folder)]
        hooks.append(Hook("createContainer", hook_path, (*prefix, "update-ldcache", *args)))
    return tuple(hooks)


# the PATH of a container whose image sets none (runc's, containerd's default)
CONTAINER_PATH_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin",
                       "/bin")


def driver_edits(files: DriverFiles, hook_path: str, host_prefix: str = "") -> ContainerEdits:
    """What every container on an NVIDIA node gets of the driver: the files read-only at
    their host paths, the IPC sockets read-write (``noexec``) and the hooks. A program
    outside the default PATH (``/usr/local/nvidia/bin/nvidia-smi``, which only CUDA images
    put on their PATH) is also bound at ``/usr/bin/<name>``, so ``nvidia-smi`` runs in any
    image."""
    mounts = [Mount(_host(host_prefix, p), p, True, DRIVER_MOUNT_OPTIONS)
              for p in (*files.libraries, *files.binaries, *files.firmware)]
    mounts += [Mount(_host(host_prefix, p), f"/usr/bin/{posixpath.basename(p)}", True,
                     DRIVER_MOUNT_OPTIONS)
               for p in files.binaries if posixpath.dirname(p) not in CONTAINER_PATH_DIRS]
    mounts += [Mount(_host(host_prefix, p), p, False, IPC_MOUNT_OPTIONS) for p in files.ipc]
    return ContainerEdits(mounts=tuple(mounts), hooks=driver_hooks(files, hook_path))


# ---------------------------------------------------------------- CDI specs


def check_kind(kind: str) -> tuple[str, str]:
    vendor, sep, cls = kind.partition("/")
    if not sep or not _VENDOR_RE.match(vendor) or not _CLASS_RE.match(cls) or "." not in vendor:
        raise CdiError(
            f"CDI kind {kind!r} must be vendor/class with a DNS-like vendor "
            "(e.g. metax-tech.com/gpu)"
        )
    return vendor, cls


def check_device_name(name: str) -> str:
    if not _NAME_RE.match(name):
        raise CdiError(
            f"CDI device name {name!r}: must start with a letter or digit and contain only "
            "letters, digits, '_', '-', '.', ':'"
        )
    return name


def qualified(kind: str, name: str) -> str:
    return f"{kind}={name}"


def split_qualified(device: str) -> tuple[str, str]:
    kind, sep, name = device.partition("=")
    if not sep:
        raise CdiError(f"CDI device {device!r} is not fully qualified (vendor.com/class=name)")
    check_kind(kind)
    check_device_name(name)
    return kind, name


def mount_options(mount: Mount) -> list[str]:
    if mount.options:
        return list(mount.options)
    return list(MOUNT_OPTIONS if mount.read_only else ("nosuid", "nodev", "rbind"))


def _edits_to_cdi(edits: ContainerEdits) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if edits.env:
        out["env"] = list(edits.env)
    if edits.device_nodes:
        out["deviceNodes"] = [
            {"path": n.path, "hostPath": n.host_path, "permissions": n.permissions}
            for n in edits.device_nodes
        ]
    if edits.mounts:
        out["mounts"] = [
            {
                "hostPath": m.host_path,
                "containerPath": m.container_path,
                "type": "bind",
                "options": mount_options(m),
            }
            for m in edits.mounts
        ]
    if edits.hooks:
        out["hooks"] = [_hook_to_cdi(h) for h in edits.hooks]
    return out


def _hook_entry(hook: Hook) -> dict[str, Any]:
    """The hook as OCI's ``hooks.<name>[]`` entry (CDI adds ``hookName``)."""
    out: dict[str, Any] = {"path": hook.path}
    if hook.args:
        out["args"] = list(hook.args)
    if hook.env:
        out["env"] = list(hook.env)
    if hook.timeout is not None:
        out["timeout"] = hook.timeout
    return out


def _hook_to_cdi(hook: Hook) -> dict[str, Any]:
    return {"hookName": hook.hook_name, **_hook_entry(hook)}


def build_spec(
    inventory: NodeInventory,
    kind: str | None = None,
    host_prefix: str = "",
    sdk: SdkSource | None = None,
    units: Sequence[Unit] | None = None,
    annotations: Mapping[str, str] | None = None,
    extra: ContainerEdits | None = None,
) -> dict[str, Any]:
    """The node's CDI spec: one device per allocatable unit, named by its device id (the
    id the kubelet knows), plus ``all``; spec-level edits are the common edits (control
    devices, SDK) and ``extra`` (an NVIDIA driver's files: ``driver_edits``). ``units``
    defaults to every unit of the inventory."""

    kind = kind or DEFAULT_KIND.get(inventory.backend, "")
    check_kind(kind)
    units = list(units) if units is not None else units_for_inventory(inventory)
    devices: list[dict[str, Any]] = []
    for unit in units:
        devices.append(
            {
                "name": check_device_name(unit.id),
                "containerEdits": _edits_to_cdi(unit_edits(inventory, unit, host_prefix)),
            }
        )
    if units:
        every = ContainerEdits().merged(*(unit_edits(inventory, u, host_prefix) for u in units))
        devices.append({"name": "all", "containerEdits": _edits_to_cdi(every)})
    spec: dict[str, Any] = {"cdiVersion": CDI_VERSION, "kind": kind}
    if annotations:
        spec["annotations"] = dict(annotations)
    spec["devices"] = devices
    common = _edits_to_cdi(common_edits(inventory, host_prefix, sdk).merged(
        extra or ContainerEdits()))
    if common:
        spec["containerEdits"] = common
    return spec


def build_claim_spec(
    inventory: NodeInventory,
    kind: str,
    devices: Sequence[tuple[str, Sequence[Unit]]],
    env: Mapping[str, str],
    host_prefix: str = "",
    sdk: SdkSource | None = None,
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A CDI spec for one DRA claim (gpu-dra writes one per prepared claim): a device per
    ``(name, units)`` with the units' device nodes, and spec-level edits (applied once
    when any of them is requested) holding the common edits and the claim's ``env``
    (visible devices, sharing limits)."""
    check_kind(kind)
    out: list[dict[str, Any]] = []
    for name, units in devices:
        edits = ContainerEdits().merged(*(unit_edits(inventory, u, host_prefix) for u in units))
        out.append({"name": check_device_name(name), "containerEdits": _edits_to_cdi(edits)})
    if not out:
        raise CdiError("a claim's CDI spec needs at least one device")
    spec: dict[str, Any] = {"cdiVersion": CDI_VERSION, "kind": kind}
    if annotations:
        spec["annotations"] = dict(annotations)
    spec["devices"] = out
    own = ContainerEdits(env=tuple(f"{k}={v}" for k, v in env.items()))
    common = _edits_to_cdi(common_edits(inventory, host_prefix, sdk).merged(own))
    if common:
        spec["containerEdits"] = common
    return spec


@dataclass(frozen=True)
class CdiSpec:
    kind: str
    devices: Mapping[str, ContainerEdits]
    edits: ContainerEdits = field(default_factory=ContainerEdits)


_SPEC_KEYS = {"cdiVersion", "kind", "annotations", "devices", "containerEdits"}
_DEVICE_KEYS = {"name", "annotations", "containerEdits"}
_EDIT_KEYS = {"env", "deviceNodes", "mounts", "hooks", "additionalGids", "intelRdt", "netDevices"}


def _type(value: Any, want: type, where: str) -> Any:
    if not isinstance(value, want):
        raise CdiError(f"{where}: expected {want.__name__}, got {type(value).__name__}")
    return value


def _parse_edits(raw: Any, where: str) -> ContainerEdits:
    raw = _type(raw, dict, where)
    unknown = set(raw) - _EDIT_KEYS
    if unknown:
        raise CdiError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    unsupported = {k for k in ("additionalGids", "intelRdt", "netDevices") if raw.get(k)}
    if unsupported:
        # valid CDI, but this runtime wrapper applies only what gpuk8s writes
        raise CdiError(f"{where}: {', '.join(sorted(unsupported))} not supported by gpuk8s")
    env = []
    for i, item in enumerate(_type(raw.get("env", []), list, f"{where}.env")):
        if not isinstance(item, str) or not _ENV_RE.match(item):
            raise CdiError(f"{where}.env[{i}]: {item!r} is not NAME=value")
        env.append(item)
    nodes = []
    for i, node in enumerate(_type(raw.get("deviceNodes", []), list, f"{where}.deviceNodes")):
        node = _type(node, dict, f"{where}.deviceNodes[{i}]")
        path = node.get("path")
        if not isinstance(path, str) or not path.startswith("/"):
            raise CdiError(f"{where}.deviceNodes[{i}].path must be an absolute path")
        host = node.get("hostPath") or path
        perms = node.get("permissions") or "rwm"
        if not isinstance(host, str) or not host.startswith("/"):
            raise CdiError(f"{where}.deviceNodes[{i}].hostPath must be an absolute path")
        if not isinstance(perms, str) or not perms or set(perms) - set("rwm"):
            raise CdiError(f"{where}.deviceNodes[{i}].permissions {perms!r}: letters of 'rwm'")
        nodes.append(DeviceNode(path, host, perms))
    mounts = []
    for i, mount in enumerate(_type(raw.get("mounts", []), list, f"{where}.mounts")):
        mount = _type(mount, dict, f"{where}.mounts[{i}]")
        host, ctr = mount.get("hostPath"), mount.get("containerPath")
        if not isinstance(host, str) or not isinstance(ctr, str) or not ctr.startswith("/"):
            raise CdiError(f"{where}.mounts[{i}]: hostPath and an absolute containerPath needed")
        options = mount.get("options") or []
        if not isinstance(options, list) or not all(isinstance(o, str) for o in options):
            raise CdiError(f"{where}.mounts[{i}].options must be a list of strings")
        mount = Mount(host, ctr, "ro" in options)
        if list(options) != mount_options(mount):  # the defaults stay implicit
            mount = replace(mount, options=tuple(options))
        mounts.append(mount)
    hooks = []
    for i, hook in enumerate(_type(raw.get("hooks", []), list, f"{where}.hooks")):
        hooks.append(_parse_hook(_type(hook, dict, f"{where}.hooks[{i}]"), f"{where}.hooks[{i}]"))
    return ContainerEdits(tuple(env), tuple(nodes), tuple(mounts), tuple(hooks))


def _parse_hook(raw: dict[str, Any], where: str) -> Hook:
    unknown = set(raw) - {"hookName", "path", "args", "env", "timeout"}
    if unknown:
        raise CdiError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    name, path = raw.get("hookName"), raw.get("path")
    if name not in HOOK_NAMES:
        raise CdiError(f"{where}.hookName {name!r}: one of {', '.join(HOOK_NAMES)}")
    if not isinstance(path, str) or not path.startswith("/"):
        raise CdiError(f"{where}.path must be an absolute path")
    lists = {}
    for key in ("args", "env"):
        value = raw.get(key) or []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise CdiError(f"{where}.{key} must be a list of strings")
        lists[key] = tuple(value)
    if any(not _ENV_RE.match(e) for e in lists["env"]):
        raise CdiError(f"{where}.env: entries are NAME=value")
    timeout = raw.get("timeout")
    if timeout is not None and (not isinstance(timeout, int) or isinstance(timeout, bool)
                                or timeout <= 0):
        raise CdiError(f"{where}.timeout must be a positive number of seconds")
    return Hook(str(name), path, lists["args"], lists["env"], timeout)


def parse_spec(raw: Any, where: str = "CDI spec") -> CdiSpec:
    """Validate a decoded CDI spec (JSON/YAML object) strictly and return its edits."""
    raw = _type(raw, dict, where)
    unknown = set(raw) - _SPEC_KEYS
    if unknown:
        raise CdiError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    version = raw.get("cdiVersion")
    if not isinstance(version, str) or not _VERSION_RE.match(version):
        raise CdiError(f"{where}: cdiVersion {version!r} is not a supported CDI version")
    kind = raw.get("kind")
    if not isinstance(kind, str):
        raise CdiError(f"{where}: kind missing")
    check_kind(kind)
    devices: dict[str, ContainerEdits] = {}
    for i, dev in enumerate(_type(raw.get("devices"), list, f"{where}.devices")):
        dev = _type(dev, dict, f"{where}.devices[{i}]")
        unknown = set(dev) - _DEVICE_KEYS
        if unknown:
            raise CdiError(f"{where}.devices[{i}]: unknown field(s) {', '.join(sorted(unknown))}")
        name = dev.get("name")
        if not isinstance(name, str):
            raise CdiError(f"{where}.devices[{i}].name missing")
        check_device_name(name)
        if name in devices:
            raise CdiError(f"{where}: device {name!r} defined twice")
        devices[name] = _parse_edits(dev.get("containerEdits", {}), f"{where}.devices[{name}]")
    if not devices:
        raise CdiError(f"{where}: no devices")
    edits = _parse_edits(raw.get("containerEdits", {}), f"{where}.containerEdits")
    return CdiSpec(kind, devices, edits)


def resolve(specs: Iterable[CdiSpec], names: Iterable[str]) -> ContainerEdits:
    """Merged edits for fully qualified device names, as the CDI library injects them: the
    spec-level edits of each spec (file) once when any of its devices is requested, then
    every device's own edits. Specs may share a kind (gpu-dra writes one per claim) but not
    a device name within it (the CDI cache refuses such a conflict)."""
    specs = list(specs)
    owner: dict[tuple[str, str], int] = {}
    for i, spec in enumerate(specs):
        for name in spec.devices:
            if (spec.kind, name) in owner:
                raise CdiError(f"CDI kind {spec.kind}: device {name!r} defined twice")
            owner[(spec.kind, name)] = i
    common: list[ContainerEdits] = []
    own: list[ContainerEdits] = []
    seen: list[int] = []
    for device in names:
        kind, name = split_qualified(device.strip())
        found = owner.get((kind, name))
        if found is None:
            raise CdiError(f"unresolvable CDI device {device}: no spec on this node defines it")
        if found not in seen:
            seen.append(found)
            common.append(specs[found].edits)
        own.append(specs[found].devices[name])
    return ContainerEdits().merged(*common, *own)


def annotation_devices(annotations: Mapping[str, str]) -> list[str]:
    """Device names requested through ``cdi.k8s.io/*`` annotations (comma lists)."""
    names: list[str] = []
    for key in sorted(annotations):
        if key.startswith(CDI_ANNOTATION_PREFIX):
            for item in str(annotations[key]).split(","):
                item = item.strip()
                if item and item not in names:
                    names.append(item)
    return names


# ---------------------------------------------------------------- renderings


def apply_to_oci(config: dict[str, Any], edits: ContainerEdits, stat: StatFn) -> dict[str, Any]:
    """Apply edits to an OCI runtime spec (``config.json``) in place and return it.

    Env entries replace a variable of the same name; a device node already in the spec
    (same container path) is kept; a mount at a container path already mounted is kept
    (the container's own choice wins). Device cgroup rules allow each added node. Hooks are
    appended to ``hooks.<hookName>`` (once each).
    """
    process = config.setdefault("process", {})
    env = list(process.get("env") or [])
    for item in edits.env:
        name = item.partition("=")[0]
        env = [e for e in env if e.partition("=")[0] != name]
        env.append(item)
    process["env"] = env
    linux = config.setdefault("linux", {})
    devices = list(linux.get("devices") or [])
    have = {d.get("path") for d in devices if isinstance(d, dict)}
    resources = linux.setdefault("resources", {})
    rules = list(resources.get("devices") or [])
    for node in edits.device_nodes:
        if node.path in have:
            continue
        kind, major, minor = stat(node.host_path)
        if kind not in ("c", "b"):
            raise CdiError(f"{node.host_path} is not a device node")
        devices.append({"path": node.path, "type": kind, "major": major, "minor": minor,
                        "fileMode": 0o666, "uid": 0, "gid": 0})
        rules.append({"allow": True, "type": kind, "major": major, "minor": minor,
                      "access": node.permissions})
        have.add(node.path)
    linux["devices"] = devices
    resources["devices"] = rules
    mounts = list(config.get("mounts") or [])
    mounted = {m.get("destination") for m in mounts if isinstance(m, dict)}
    for mount in edits.mounts:
        if mount.container_path in mounted:
            continue
        mounts.append({"destination": mount.container_path, "type": "bind",
                       "source": mount.host_path, "options": mount_options(mount)})
        mounted.add(mount.container_path)
    config["mounts"] = mounts
    if edits.hooks:
        hooks = config.setdefault("hooks", {})
        for hook in edits.hooks:
            entry = _hook_entry(hook)
            have_hooks = hooks.setdefault(hook.hook_name, [])
            if entry not in have_hooks:
                have_hooks.append(entry)
    return config


def _csv_field(text: str) -> str:
    """One field of docker's ``--mount`` value, which docker reads as a CSV record."""
    if any(c in text for c in ',"\r\n'):
        return '"' + text.replace('"', '""') + '"'
    return text


def docker_args(edits: ContainerEdits) -> list[str]:
    """``docker run`` / ``docker create`` flags carrying the edits."""
    args: list[str] = []
    for node in edits.device_nodes:
        args += ["--device", f"{node.host_path}:{node.path}:{node.permissions}"]
    for mount in edits.mounts:
        fields = ["type=bind", f"source={mount.host_path}", f"target={mount.container_path}"]
        if mount.read_only:
            fields.append("readonly")
        args += ["--mount", ",".join(_csv_field(f) for f in fields)]
    for item in edits.env:
        args += ["--env", item]
    return args


# ---------------------------------------------------------------- who accepts CDI names

_KUBE_RE = re.compile(r"^v?(\d+)\.(\d+)")
_RUNTIME_RE = re.compile(r"^([a-z-]+)://v?(\d+)\.(\d+)")


def cdi_names_accepted(kubelet_version: str, runtime_version: str) -> tuple[bool, str]:
    """Whether a device plugin may answer ``Allocate`` with CDI device names on a node
    (``status.nodeInfo.kubeletVersion`` / ``containerRuntimeVersion``), and why.

    The kubelet passes ``cdi_devices`` on from 1.29 (gate ``DevicePluginCDIDevices`` beta,
    on by default; alpha and off in 1.28). The runtime must resolve them: containerd from
    2.0 (CDI on by default; 1.7 only with ``enable_cdi``, which the Node does not show:
    treated as no), CRI-O from 1.28. Anything else gets device nodes + mounts + env.
    """
    kube = _KUBE_RE.match(kubelet_version or "")
    if not kube or (int(kube.group(1)), int(kube.group(2))) < (1, 29):
        return False, (f"kubelet {kubelet_version or 'unknown'} does not pass CDI device names "
                       "on by default (needs >= 1.29)")
    runtime = _RUNTIME_RE.match(runtime_version or "")
    if not runtime:
        return False, f"container runtime {runtime_version or 'unknown'}: CDI support unknown"
    kind, version = runtime.group(1), (int(runtime.group(2)), int(runtime.group(3)))
    if (kind == "containerd" and version >= (2, 0)) or (kind == "cri-o" and version >= (1, 28)):
        return True, f"kubelet {kubelet_version} and {runtime_version} accept CDI device names"
    return False, (f"{runtime_version} does not resolve CDI device names by default "
                   "(containerd >= 2.0, or 1.7 with enable_cdi; CRI-O >= 1.28)")
