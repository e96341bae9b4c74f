"""The OCI runtime wrapper: applies the node's CDI edits to a container's ``config.json``,
then execs the real runtime (runc). For container runtimes without CDI (containerd 1.6),
the way nvidia-container-runtime's CDI mode works.

container-runtime installs it on the host as one executable zip (``gpuk8s-oci-runtime``,
``#!<host python3>``: stdlib only, Python 3.8+) with a JSON config beside it, and registers
it as a containerd runtime handler (``BinaryName``) whose ``container_annotations`` pass
``cdi.k8s.io/*`` through. gpu-device's ``Allocate`` sets ``cdi.k8s.io/gpuk8s`` to the
container's CDI device names; only the kubelet (from the device plugin's answer) sets
container annotations, so a pod cannot ask for devices it was not allocated.

On ``create`` (and ``run``) of a bundle whose config carries such annotations: resolve the
names against the CDI specs in the configured directories (``core.cdi``: strict), drop
the SDK mounts and SDK environment when the image has its own ``/opt/maca`` (unless the
container's environment says ``MACA_FORCE=1``), apply the edits (``core.cdi.apply_to_oci``)
and write ``config.json`` back atomically. Any other command, and containers without the
annotation, go to the runtime untouched. An unresolvable device fails the create with a
message (the container does not start without its GPUs).

``gpuk8s-oci-runtime hook ...`` is not a runtime command: it runs the CDI spec's
``createContainer`` hooks for NVIDIA driver libraries (``host.cdihook``), which the OCI
runtime calls with this program's path.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from ..core.cdi import CdiError, CdiSpec, annotation_devices, apply_to_oci, parse_spec, resolve

CONFIG_NAME = "oci-runtime.json"  # beside the executable
DEFAULTS: dict[str, Any] = {
    "runtime": "runc",
    "specDirs": ["/etc/cdi", "/var/run/cdi"],
    "sdkPaths": ["/opt/maca"],  # the image's own copy of these wins unless forced
    "forceEnv": "MACA_FORCE",
    # set by container-runtime at uninstall while containers created through the wrapper
    # still run: the last of them to be deleted removes installDir
    "retired": False,
    "installDir": "",
    "tasksDir": "/run/containerd/io.containerd.runtime.v2.task",
}
# runc global options that take a value (the bundle flag comes after the subcommand)
_VALUE_OPTIONS = {"--root", "--log", "--log-format", "--criu", "--rootless"}


def load_config(path: str) -> dict[str, Any]:
    config = dict(DEFAULTS)
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return config
    if isinstance(data, dict):
        config.update({k: v for k, v in data.items() if k in DEFAULTS})
    return config


def find_bundle(args: Sequence[str]) -> tuple[str | None, str | None]:
    """(subcommand, bundle dir) of a runc command line; bundle defaults to the cwd."""
    command = None
    bundle = None
    i = 0
    while i < len(args):
        arg = args[i]
        if command is None:
            if arg in _VALUE_OPTIONS:
                i += 2
                continue
            if not arg.startswith("-"):
                command = arg
        else:
            if arg in ("--bundle", "-b") and i + 1 < len(args):
                bundle = args[i + 1]
                i += 2
                continue
            if arg.startswith("--bundle="):
                bundle = arg.split("=", 1)[1]
        i += 1
    if command in ("create", "run") and bundle is None:
        bundle = os.getcwd()
    return command, bundle


def load_specs(directories: Sequence[str]) -> list[CdiSpec]:
    """Every ``.json`` CDI spec in the directories (YAML specs need a parser: skipped)."""
    specs = []
    for directory in directories:
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            continue
        for name in names:
            if not name.endswith(".json"):
                continue
            path = os.path.join(directory, name)
            try:
                with open(path, encoding="utf-8") as handle:
                    specs.append(parse_spec(json.load(handle), path))
            except (OSError, ValueError, CdiError):
                continue  # another vendor's spec we cannot read must not block ours
    return specs


def stat_device(path: str) -> tuple[str, int, int]:
    info = os.stat(path)
    if stat.S_ISCHR(info.st_mode):
        return "c", os.major(info.st_rdev), os.minor(info.st_rdev)
    if stat.S_ISBLK(info.st_mode):
        return "b", os.major(info.st_rdev), os.minor(info.st_rdev)
    return "-", 0, 0


def image_has(rootfs: str, path: str) -> bool:
    """Whether the image's own root filesystem has ``path`` (a non-empty directory)."""
    full = os.path.join(rootfs, path.lstrip("/"))
    try:
        return os.path.isdir(full) and not os.path.islink(full) and bool(os.listdir(full))
    except OSError:
        return False


def edit_bundle(bundle: str, config: dict[str, Any]) -> list[str]:
    """Apply the CDI edits the bundle's annotations ask for; the device names applied."""
    path = os.path.join(bundle, "config.json")
    with open(path, encoding="utf-8") as handle:
        spec = json.load(handle)
    names = annotation_devices(spec.get("annotations") or {})
    if not names:
        return []
    edits = resolve(load_specs(config["specDirs"]), names)
    root = (spec.get("root") or {}).get("path") or "rootfs"
    rootfs = root if os.path.isabs(root) else os.path.join(bundle, root)
    env = dict(e.partition("=")[::2] for e in (spec.get("process") or {}).get("env") or [])
    forced = env.get(str(config["forceEnv"]), "").lower() in ("1", "true", "yes")
    own = [p for p in config["sdkPaths"] if image_has(rootfs, p)]
    if own and not forced:
        edits = edits.without_paths(own)
    apply_to_oci(spec, edits, stat_device)
    tmp = f"{path}.gpuk8s-tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(spec, handle)
    os.replace(tmp, path)
    return names


def users(tasks_dir: str, wrapper: str, skip: str | None = None) -> list[str]:
    """Ids of containers whose shim runs ``wrapper`` (their bundle's ``runtime`` file)."""
    found: list[str] = []
    try:
        namespaces = os.listdir(tasks_dir)
    except OSError:
        return found
    for namespace in namespaces:
        try:
            ids = os.listdir(os.path.join(tasks_dir, namespace))
        except OSError:
            continue
        for cid in ids:
            try:
                with open(os.path.join(tasks_dir, namespace, cid, "runtime"),
                          encoding="utf-8") as handle:
                    runtime = handle.read().strip()
            except OSError:
                continue
            if runtime == wrapper and cid != skip:
                found.append(cid)
    return found


def retire(config: dict[str, Any], args: Sequence[str], wrapper: str) -> int:
    """``delete`` of a retired wrapper: run it, then remove the wrapper when unused."""
    runtime = str(config["runtime"])
    rc = subprocess.call([runtime, *args])
    positional = [a for a in args if not a.startswith("-")]
    install = str(config["installDir"])
    if rc == 0 and install.startswith("/") and install != "/" and \
            not users(str(config["tasksDir"]), wrapper, positional[-1] if positional else None):
        shutil.rmtree(install, ignore_errors=True)
    return rc


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["hook"]:
        from . import cdihook

        return cdihook.main(args[1:])
    here = os.path.dirname(os.path.realpath(sys.argv[0]))
    config = load_config(os.environ.get("GPUK8S_OCI_RUNTIME_CONFIG")
                         or os.path.join(here, CONFIG_NAME))
    command, bundle = find_bundle(args)
    if command == "delete" and config["retired"]:
        return retire(config, args, os.path.realpath(sys.argv[0]))
    if command in ("create", "run") and bundle:
        try:
            edit_bundle(bundle, config)
        except (CdiError, OSError, ValueError) as err:
            sys.stderr.write(f"gpuk8s-oci-runtime: {err}\n")
            return 1
    runtime = str(config["runtime"])
    try:
        os.execvp(runtime, [runtime, *args])
    except OSError as err:
        sys.stderr.write(f"gpuk8s-oci-runtime: cannot run {runtime}: {err}\n")
        return 127
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
