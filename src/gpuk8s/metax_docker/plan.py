"""docker's flags for ``run`` / ``create`` with ``--gpus`` / ``--maca`` / ``--maca-force``:
the GPUs' device nodes, ``MACA_VISIBLE_DEVICES``, the host SDK and the environment that
finds it.

What it costs (``benchmarks/metax_docker.py`` measures it against plain ``docker run``):
one ``sysfs`` walk and one run of mx-smi (``--show-unavailable-reason``, the health check;
a second, ``--show-hwinfo``, only when GPUs are named by serial number or UUID, beside it),
while the daemon's version and the local image are read at the same time (on dockerd's
socket where the CLI would plainly use it: ``docker.daemon_socket``; read-only; nothing
that creates anything is asked of docker before the host checks pass). Whether an image
has its own ``/opt/maca`` is looked up once per image id (a probe container, created and
removed, never started) and kept in a cache: an image id names one file system, so the
answer never goes stale.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..core.cdi import (
    DEFAULT_SDK_PATHS,
    VISIBLE_ENV,
    ContainerEdits,
    SdkSource,
    docker_args,
    edits_for_units,
    sdk_edits,
    visible_value,
)
from ..core.model import Gpu, NodeInventory
from ..discovery import check_health, discover
from ..discovery.tools import Runner, host_path
from .docker import Docker, DockerError
from .dockerargs import RunArgs, UsageError
from .early import ENV_ROOT, Background
from .selection import GpuRequest, Selection, parse_request, select, units_of

PROG = "metax-docker"
ENV_PREFIX = "METAX_DOCKER_DEVICE_PATH_PREFIX"
ENV_CACHE = "METAX_DOCKER_CACHE_DIR"
SDK_PATH, *OTHER_SDK_PATHS = DEFAULT_SDK_PATHS["metax"]  # /opt/maca; /opt/mxdriver
RUN_FAILED = 125  # docker run's status when the daemon refuses (no such image ...)
VISIBLE_DEVICES_MODE = "auto"  # the device plugin's default (--visible-devices)
# what docker gives a Linux container whose image sets no PATH
DOCKER_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LIBRARY_PATH = "LD_LIBRARY_PATH"

@dataclass(frozen=True)
class Host:
    root: str = "/"
    prefix: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Host:
        root = env.get(ENV_ROOT) or "/"
        if not root.startswith("/"):
            raise UsageError(f"{ENV_ROOT}={root!r} must be an absolute path")
        prefix = env.get(ENV_PREFIX)
        if prefix is None:
            prefix = "" if os.path.realpath(root) == "/" else root
        if prefix and not prefix.startswith("/"):
            raise UsageError(f"{ENV_PREFIX}={prefix!r} must be an absolute path or empty")
        return cls(root, prefix.rstrip("/"))

    def shown(self, path: str) -> str:
        return path if self.root == "/" else f"{path} (under {self.root})"

    @property
    def where(self) -> str:
        return "this host" if self.root == "/" else f"this host (root {self.root})"


@dataclass(frozen=True)
class HostSdk:
    """The SDK trees a container gets: ``source`` as docker sees them (container path,
    host path with the device path prefix) and ``local``, the same directories as this
    process reads them (under the host root, or the ``--maca`` directory)."""

    source: SdkSource
    local: tuple[str, ...]

    def bin_dirs(self, mounted: Sequence[str]) -> list[str]:
        """``<path>/bin`` inside the container for each mounted tree that has one."""
        return [f"{path}/bin" for path, local in zip(self.source.paths, self.local)
                if path in mounted and os.path.isdir(os.path.join(local, "bin"))]


def sdk_source(host: Host, maca: str | None) -> HostSdk:
    """The host SDK (``--maca PATH`` or ``/opt/maca``) and the driver's user space
    (``/opt/mxdriver``, when the host has it) as read-only mounts at their usual paths."""
    if maca is not None:
        if not maca:
            raise UsageError("--maca needs a directory")
        sdk_local = sdk_host = os.path.abspath(maca)
        if not os.path.isdir(sdk_host):
            raise UsageError(f"--maca {maca}: no such directory")
    else:
        sdk_local = host_path(host.root, SDK_PATH)
        if not os.path.isdir(sdk_local):
            raise UsageError(
                f"no MXMACA SDK at {host.shown(SDK_PATH)} on this host: install it, or name "
                "one with --maca PATH"
            )
        sdk_host = host.prefix + SDK_PATH
    paths, hosts, local = [SDK_PATH], [sdk_host], [sdk_local]
    for path in OTHER_SDK_PATHS:
        if os.path.isdir(host_path(host.root, path)):
            paths.append(path)
            hosts.append(host.prefix + path)
            local.append(host_path(host.root, path))
    return HostSdk(SdkSource(paths=tuple(paths), host_paths=tuple(hosts)), tuple(local))


def container_edits(
    inventory: NodeInventory | None,
    gpus: Sequence[Gpu],
    host: Host,
    sdk: SdkSource,
    image_has_sdk: bool,
) -> ContainerEdits:
    """What the container gets: the GPUs' device nodes and control devices,
    ``MACA_VISIBLE_DEVICES``, and the SDK mounts (minus ``/opt/maca`` when the image's
    own wins) — core.cdi's edits, the same container-runtime and the device plugin use."""
    units = units_of(gpus)
    if inventory is not None and units:
        edits = edits_for_units(inventory, units, host.prefix, sdk)
        # node-wide positions, as gpu-device's topology numbers whole GPUs
        every = units_of(sorted(inventory.gpus, key=lambda g: g.index))
        positions = {u.id: i for i, u in enumerate(every)}
        value = visible_value(inventory, units, VISIBLE_DEVICES_MODE, positions)
        if value is not None:
            edits = edits.merged(ContainerEdits(env=(f"{VISIBLE_ENV['metax']}={value}",)))
    else:
        edits = sdk_edits(sdk, host.prefix)
    return edits.without_paths([SDK_PATH]) if image_has_sdk else edits


def _joined(*parts: str) -> str:
    """Colon lists joined in order, each entry once, empty entries dropped."""
    seen: list[str] = []
    for part in parts:
        for entry in part.split(":"):
            if entry and entry not in seen:
                seen.append(entry)
    return ":".join(seen)


def with_image_env(edits: ContainerEdits, image_env: Sequence[str],
                   bin_dirs: Sequence[str]) -> ContainerEdits:
    """The edits with the image's search paths kept: ``LD_LIBRARY_PATH`` is the SDK's
    libraries, then the image's own entries; ``PATH`` is the image's (docker's default when
    it sets none), then the mounted trees' ``bin`` directories (``mx-smi`` ...), so the
    image's own programs keep their precedence."""
    image = dict(item.partition("=")[::2] for item in image_env)
    ours = edits.env_map()
    extra = []
    if LIBRARY_PATH in ours:
        extra.append(f"{LIBRARY_PATH}={_joined(ours[LIBRARY_PATH], image.get(LIBRARY_PATH, ''))}")
    if bin_dirs:
        extra.append(f"PATH={_joined(image.get('PATH') or DOCKER_DEFAULT_PATH, *bin_dirs)}")
    return edits.merged(ContainerEdits(env=tuple(extra))) if extra else edits


# -- the cache of "does image ID have a non-empty /opt/maca" -----------------------------------
def cache_dir(env: Mapping[str, str]) -> str | None:
    """``$METAX_DOCKER_CACHE_DIR``, else ``$XDG_CACHE_HOME/metax-docker``, else
    ``~/.cache/metax-docker``; None (no cache) when there is no home."""
    given = env.get(ENV_CACHE)
    if given is not None:
        return given or None
    base = env.get("XDG_CACHE_HOME") or (
        os.path.join(env["HOME"], ".cache") if env.get("HOME") else "")
    return os.path.join(base, "metax-docker") if base else None


def _cache_file(directory: str, image_id: str) -> str | None:
    algorithm, _, digest = image_id.partition(":")
    if not digest or not digest.isalnum() or not algorithm.isalnum():
        return None
    return os.path.join(directory, f"sdk-{algorithm}-{digest}")


def cached_has_sdk(directory: str | None, image_id: str) -> bool | None:
    path = _cache_file(directory, image_id) if directory else None
    if path is None:
        return None
    try:
        with open(path, encoding="ascii") as handle:
            answer = handle.read().strip()
    except (OSError, ValueError):
        return None
    return {"yes": True, "no": False}.get(answer)


def remember_has_sdk(directory: str | None, image_id: str, has_sdk: bool) -> None:
    """Best effort: a cache that cannot be written costs a probe next time, nothing else."""
    path = _cache_file(directory, image_id) if directory else None
    if path is None:
        return
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        partial = f"{path}.{os.getpid()}.tmp"
        with open(partial, "w", encoding="ascii") as handle:
            handle.write("yes\n" if has_sdk else "no\n")
        os.replace(partial, path)
    except OSError:
        pass


def choose_gpus(host: Host, request: GpuRequest,
                runner: Runner | None = None) -> tuple[NodeInventory, Selection]:
    """Discovery (sysfs, and mx-smi's ``--show-hwinfo`` only when GPUs are named by serial
    number or UUID, beside the health check), the health check, the selection. ``runner``:
    discovery's (``early.start_health``: the health check already under way)."""
    by_name = any(not name.isdigit() for name in request.names)
    named = Background(lambda: discover(host.root, queries=("hwinfo",), runner=runner)
                       ) if by_name else None
    inventory = discover(host.root, queries=(), runner=runner)
    health = check_health(host.root, inventory, runner) if inventory.backend == "metax" else {}
    if named is not None:
        inventory = named.result()
    return inventory, select(inventory, request, host.where, health)


def wrapper_args(
    run: RunArgs, env: Mapping[str, str], docker: Docker, command: Sequence[str] = ("run",),
    runner: Runner | None = None,
) -> list[str]:
    """The docker flags that replace ``--gpus`` / ``--maca`` / ``--maca-force``.

    Order of judgement: the arguments and the SDK directory; then, side by side, the GPUs
    (discovery and health), docker's version and the image as the daemon has it
    (read-only); the GPUs' verdict first, then docker's; only then anything that may pull
    or create (a probe container)."""
    assert run.image is not None
    options = run.wrapper
    request = parse_request(options.gpus) if options.gpus is not None else None
    host = Host.from_env(env)
    sdk = sdk_source(host, options.maca)
    chosen = (Background(lambda: choose_gpus(host, request, runner))
              if request is not None else None)
    version = Background(docker.check_version)
    # --pull always / --platform: the image run uses may not be the local one
    probe_options = [f"{flag}={value}" for flag in ("--platform", "--pull")
                     if (value := run.option_value(flag)) is not None]
    fresh = any(o.startswith("--platform=") or o == "--pull=always" for o in probe_options)
    image_ref = run.image
    found_local = Background(lambda: docker.local_image(image_ref)) if not fresh else None
    # all of them done before any verdict: no docker call is left running behind an error
    for pending in (chosen, version, found_local):
        if pending is not None:
            pending.wait()
    inventory, selection = chosen.result() if chosen is not None else (None, Selection(()))
    version.result()
    local = found_local.result() if found_local is not None else None
    for warning in selection.warnings:
        print(f"{PROG}: warning: {warning}", file=sys.stderr)
    # an explicit --maca is a request, as --maca-force is: only without both does the
    # image's own /opt/maca win
    look = options.maca is None and not options.maca_force
    directory = cache_dir(env)
    has_sdk = cached_has_sdk(directory, local.id) if look and local is not None else None
    image = local
    if local is not None and look and has_sdk is None:
        has_sdk = docker.probe_local(local.id, SDK_PATH)  # on the daemon's socket, if used
        if has_sdk is not None:
            remember_has_sdk(directory, local.id, has_sdk)
    if local is None or (look and has_sdk is None):
        failed_rc = RUN_FAILED if command[-1] == "run" else None
        target = run.image if local is None else local.id
        # the image by name when it is not here (pulled as run would), else by its id
        pulled, found = docker.probe(target, SDK_PATH if look else None, probe_options,
                                     failed_rc, inspect=local is None)
        image = local or pulled
        if look and found is not None and image is not None:
            has_sdk = found
            remember_has_sdk(directory, image.id, found)
    if image is None:  # pragma: no cover - the probe inspects whenever local is None
        raise DockerError(1, f"docker gave no image id for {run.image}")
    edits = container_edits(inventory, selection.gpus, host, sdk.source, bool(has_sdk))
    mounted = [m.container_path for m in edits.mounts]
    edits = with_image_env(edits, image.env, sdk.bin_dirs(mounted))
    return docker_args(edits)
