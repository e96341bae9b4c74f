"""The manual's last check, ``nvidia-smi`` in a container: one container started the way
the kubelet's would be on this node - an OCI bundle whose annotation names CDI devices,
created through gpuk8s' runtime wrapper, which applies the node's CDI spec (device nodes,
driver files, hooks) and hands over to runc - running ``nvidia-smi``.

The container's root is a copy of an image's root filesystem (a directory, or a tar as
``docker export`` / ``ctr`` write it), made fresh for each check because the CDI hooks edit
it; ``extra_mounts`` bind more host paths in (tests: the simulator's state, which a real
node's kernel gives every container anyway). Stdlib only, Python 3.8+.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

from ..core.cdi import CDI_ANNOTATION
from ..core.errors import GpuK8sError
from ..discovery.tools import Runner, ToolResult, run_tool

CHECK_SCRIPT = "nvidia-smi && nvidia-smi -L"
RUNC_CANDIDATES = ("/usr/sbin/runc", "/usr/bin/runc", "/usr/local/sbin/runc", "/usr/local/bin/runc")


class ContainerCheckError(GpuK8sError):
    """The container could not be run, or nvidia-smi in it did not answer as it should."""


@dataclass(frozen=True)
class ContainerResult:
    rc: int
    output: str
    driver_version: str | None
    cuda_version: str | None
    gpus: int  # lines of nvidia-smi -L


def parse_output(rc: int, text: str) -> ContainerResult:
    driver = re.search(r"Driver Version:\s*([0-9.]+)", text)
    cuda = re.search(r"CUDA Version:\s*([0-9.]+)", text)
    count = sum(1 for line in text.splitlines() if re.match(r"^GPU \d+: ", line))
    return ContainerResult(rc, text, driver.group(1) if driver else None,
                           cuda.group(1) if cuda else None, count)


def bundle_config(base: dict[str, object], rootfs: str, devices: Sequence[str],
                  script: str, mounts: Sequence[tuple[str, str]]) -> dict[str, object]:
    """``runc spec``'s default config with our root, command, CDI annotation and mounts."""
    config = dict(base)
    config["root"] = {"path": rootfs, "readonly": False}
    process = dict(config.get("process") or {})  # type: ignore[call-overload]
    process.update(terminal=False, args=["sh", "-c", script])
    config["process"] = process
    config["annotations"] = {CDI_ANNOTATION: ",".join(devices)}
    config["hostname"] = "gpuk8s-nvidia-check"
    extra = [{"destination": dst, "type": "bind", "source": src, "options": ["rbind", "ro"]}
             for src, dst in mounts]
    config["mounts"] = [*(config.get("mounts") or []), *extra]  # type: ignore[misc]
    return config


def run_check(*, wrapper: str, rootfs: str, devices: Sequence[str], runner: Runner | None,
              work_dir: str, runc: str | None = None,
              extra_mounts: Sequence[tuple[str, str]] = (), script: str = CHECK_SCRIPT
              ) -> ContainerResult:
    """Run ``script`` in a container holding ``devices`` (CDI names) and parse what
    nvidia-smi printed. Raises when the container cannot be set up."""
    if not (os.path.isfile(wrapper) and os.access(wrapper, os.X_OK)):
        raise ContainerCheckError(f"the runtime wrapper {wrapper} is not installed: set up the "
                                  "container runtime first")
    runc = runc or next((p for p in RUNC_CANDIDATES if os.access(p, os.X_OK)), None)
    if runc is None:
        raise ContainerCheckError(f"runc not found ({', '.join(RUNC_CANDIDATES)})")
    if not os.path.exists(rootfs):
        raise ContainerCheckError(f"rootfs {rootfs}: no such directory or tar (an image's root "
                                  "filesystem, e.g. `docker export` of a CUDA base image)")
    if os.path.realpath(rootfs) == "/":
        raise ContainerCheckError("rootfs /: the host's own root is not an image's root "
                                  "filesystem")
    made = not os.path.isdir(work_dir)  # ours to remove again: the node left as found
    os.makedirs(work_dir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="nvidia-check-", dir=work_dir)
    name = os.path.basename(work)
    state = os.path.join(work, "runc")
    try:
        root = os.path.join(work, "rootfs")
        if os.path.isdir(rootfs):
            shutil.copytree(rootfs, root, symlinks=True)
        else:
            os.makedirs(root)
            _ok(run_tool(runner, ["tar", "-C", root, "-xf", rootfs]), f"unpacking {rootfs}")
        bundle = os.path.join(work, "bundle")
        os.makedirs(bundle)
        _ok(run_tool(runner, [runc, "spec", "--bundle", bundle]), "runc spec")
        with open(os.path.join(bundle, "config.json"), encoding="utf-8") as handle:
            base = json.load(handle)
        config = bundle_config(base, root, devices, script, extra_mounts)
        with open(os.path.join(bundle, "config.json"), "w", encoding="utf-8") as handle:
            json.dump(config, handle)
        result = run_tool(runner, [wrapper, "--root", state, "run", "--bundle", bundle, name])
        return parse_output(result.rc, result.stdout + result.stderr)
    finally:
        run_tool(runner, [runc, "--root", state, "delete", "-f", name])
        shutil.rmtree(work, ignore_errors=True)
        if made:
            with contextlib.suppress(OSError):  # not empty: another check's work goes on
                os.rmdir(work_dir)


def _ok(result: ToolResult, what: str) -> None:
    if not result.ok:
        raise ContainerCheckError(f"{what} failed: {result.problem}")
