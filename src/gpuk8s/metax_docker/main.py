"""The wrapper's glue: read the command line, plan docker's, ``exec`` docker.

Environment:

``METAX_DOCKER_DOCKER``              the docker program (default ``docker`` on PATH)
``METAX_DOCKER_HOST_ROOT``           where the host's ``/`` is (default ``/``; the simulator
                                     root in tests and the lab), read by discovery
``METAX_DOCKER_DEVICE_PATH_PREFIX``  put before ``/dev/...`` and ``/opt/...`` in what docker
                                     is told (default: the host root, or empty when it is
                                     ``/``), as the device plugin's ``--device-path-prefix``

Exit status: docker's own (the wrapper becomes docker); 2 for a bad ``--gpus`` / ``--maca``,
a host without GPUs or SDK, or a docker older than 19.03 (then docker runs no container).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
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
from ..core.errors import GpuK8sError
from ..core.model import Gpu, NodeInventory
from ..discovery import discover
from ..discovery.tools import host_path
from .dockerargs import (
    RUN_FLAGS,
    RunArgs,
    UnknownFlagError,
    UsageError,
    chain,
    help_flags,
    mentions_wrapper_flags,
    parse_run,
    split_invocation,
)
from .selection import parse_request, select, units_of

PROG = "metax-docker"
ENV_DOCKER = "METAX_DOCKER_DOCKER"
ENV_ROOT = "METAX_DOCKER_HOST_ROOT"
ENV_PREFIX = "METAX_DOCKER_DEVICE_PATH_PREFIX"
SDK_PATH, *OTHER_SDK_PATHS = DEFAULT_SDK_PATHS["metax"]  # /opt/maca; /opt/mxdriver
MIN_DOCKER = (19, 3)
EXIT_USAGE = 2
RUN_FAILED = 125  # docker run's status when the daemon refuses (no such image ...)
VISIBLE_DEVICES_MODE = "auto"  # the device plugin's default (--visible-devices)
PROBE_ENTRYPOINT = "/.metax-docker-probe"  # never started: the probe container only exists
PROBE_LABEL = "com.metax-tech.metax-docker.probe=1"
_MISSING_PATH = ("No such container:path", "Could not find the file")


class DockerError(GpuK8sError):
    """A docker command the wrapper ran itself failed; exit with its status."""

    def __init__(self, rc: int, message: str = "") -> None:
        super().__init__(message)
        self.rc = rc if rc > 0 else 1


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


def sdk_source(host: Host, maca: str | None) -> SdkSource:
    """The host SDK (``--maca PATH`` or ``/opt/maca``) and the driver's user space
    (``/opt/mxdriver``, when the host has it) as read-only mounts at their usual paths."""
    if maca is not None:
        if not maca:
            raise UsageError("--maca needs a directory")
        sdk_host = os.path.abspath(maca)
        if not os.path.isdir(sdk_host):
            raise UsageError(f"--maca {maca}: no such directory")
    else:
        if not os.path.isdir(host_path(host.root, SDK_PATH)):
            raise UsageError(
                f"no MXMACA SDK at {host.shown(SDK_PATH)} on this host: install it, or name "
                "one with --maca PATH"
            )
        sdk_host = host.prefix + SDK_PATH
    paths, hosts = [SDK_PATH], [sdk_host]
    for path in OTHER_SDK_PATHS:
        if os.path.isdir(host_path(host.root, path)):
            paths.append(path)
            hosts.append(host.prefix + path)
    return SdkSource(paths=tuple(paths), host_paths=tuple(hosts))


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


class Docker:
    """The docker CLI with the user's global options (``-H``, ``--context`` ...)."""

    def __init__(self, program: str, global_args: Sequence[str]) -> None:
        self.base = [program, *global_args]

    def _run(self, args: Sequence[str]) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(
                [*self.base, *args], capture_output=True, text=True, check=False,
                stdin=subprocess.DEVNULL,
            )
        except OSError as err:
            raise DockerError(127, f"cannot run {self.base[0]}: {err}") from None

    def server_version(self) -> str:
        proc = self._run(["version", "--format", "{{.Server.Version}}"])
        if proc.returncode != 0 or not proc.stdout.strip():
            raise DockerError(proc.returncode, _first_line(proc.stderr) or "docker version failed")
        return proc.stdout.strip()

    def check_version(self) -> None:
        version = self.server_version()
        match = re.match(r"(\d+)\.(\d+)", version)
        if match and (int(match.group(1)), int(match.group(2))) < MIN_DOCKER:
            raise UsageError(
                f"docker {version} is too old: metax-docker needs Docker >= "
                f"{MIN_DOCKER[0]}.{MIN_DOCKER[1]:02d}"
            )

    def run_flags_help(self, command: Sequence[str]) -> str:
        return self._run([*command, "--help"]).stdout

    def image_has(self, image: str, path: str, create_options: Sequence[str] = (),
                  failed_rc: int | None = None) -> bool:
        """Whether ``image`` has ``path`` and, for a directory, something in it.

        Cheap and read-only: ``docker create`` (never started; pulls a missing image as
        ``run`` would) and the first tar headers of ``docker cp -L CONTAINER:PATH -``
        (the daemon stats the path in the image's filesystem; nothing is run in it and
        the copy is cut after two headers), then ``docker rm``. When the image cannot be
        had, docker has said why on stderr: ``DockerError`` with ``failed_rc`` (125 for
        ``run``, docker run's status for a daemon error) or docker create's status.
        """
        create = [*self.base, "create", "--network", "none", "--entrypoint", PROBE_ENTRYPOINT,
                  "--label", PROBE_LABEL, *create_options, image]
        try:
            made = subprocess.run(create, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                  text=True, check=False)  # stderr: docker's own (pull progress)
        except OSError as err:
            raise DockerError(127, f"cannot run {self.base[0]}: {err}") from None
        if made.returncode != 0:
            raise DockerError(failed_rc or made.returncode)
        lines = made.stdout.split()
        if not lines:
            raise DockerError(1, f"docker create printed no container id for {image}")
        cid = lines[-1]
        try:
            return self._has_path(cid, path)
        finally:
            subprocess.run([*self.base, "rm", "-f", "-v", cid], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, check=False)

    def _has_path(self, cid: str, path: str) -> bool:
        proc = subprocess.Popen(
            [*self.base, "cp", "-L", f"{cid}:{path}", "-"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
        )
        assert proc.stdout is not None and proc.stderr is not None
        present: bool | None = None
        try:
            with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
                first = tar.next()
                # an empty directory (a bare mount point) is no SDK
                present = first is not None and (not first.isdir() or tar.next() is not None)
        except tarfile.TarError:  # no tar at all: docker says why on stderr
            present = None
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            err = proc.stderr.read().decode(errors="replace")
            proc.stdout.close()
            proc.stderr.close()
        if present is not None:
            return present
        if any(marker in err for marker in _MISSING_PATH):
            return False
        raise DockerError(proc.returncode, f"cannot look for {path} in the image: "
                          f"{_first_line(err) or 'docker cp failed'}")


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else ""


def plan(argv: Sequence[str], env: Mapping[str, str], program: str) -> list[str]:
    """docker's arguments for the wrapper's ``argv`` (unchanged unless ``run`` / ``create``
    uses the wrapper's flags). Raises ``UsageError`` (exit 2) or ``DockerError``."""
    invocation = split_invocation(argv)
    if not invocation.creates_container or not mentions_wrapper_flags(invocation.args):
        return list(argv)
    docker = Docker(program, invocation.global_args)
    try:
        run = parse_run(invocation.args)
    except UnknownFlagError:
        # a flag newer than the tables: docker's own help says whether it takes a value
        newer = help_flags(docker.run_flags_help(invocation.command))
        run = parse_run(invocation.args, chain(RUN_FLAGS, newer))
    prefix = [*invocation.global_args, *invocation.command]
    if not run.wrapper.given:  # the flags belong to the container's command
        return list(argv)
    if run.image is None:  # docker says what is missing
        return [*prefix, *run.rebuild([])]
    return [*prefix, *run.rebuild(wrapper_args(run, env, docker, invocation.command))]


def wrapper_args(
    run: RunArgs, env: Mapping[str, str], docker: Docker, command: Sequence[str] = ("run",)
) -> list[str]:
    """The docker flags that replace ``--gpus`` / ``--maca`` / ``--maca-force``: every check
    on the host first (nothing is asked of docker before they pass), then docker's version
    and the image."""
    assert run.image is not None
    options = run.wrapper
    request = parse_request(options.gpus) if options.gpus is not None else None
    host = Host.from_env(env)
    sdk = sdk_source(host, options.maca)
    inventory = discover(host.root) if request is not None else None
    gpus = select(inventory, request, _where(host)) if inventory is not None and request else []
    docker.check_version()
    image_has_sdk = False
    if not options.maca_force:
        probe = []
        for flag in ("--platform", "--pull"):
            value = run.option_value(flag)
            if value is not None:
                probe.append(f"{flag}={value}")
        failed_rc = RUN_FAILED if command[-1] == "run" else None
        image_has_sdk = docker.image_has(run.image, SDK_PATH, probe, failed_rc)
    edits = container_edits(inventory, gpus, host, sdk, image_has_sdk)
    return docker_args(edits)


def _where(host: Host) -> str:
    return "this host" if host.root == "/" else f"this host (root {host.root})"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    env = os.environ
    program = env.get(ENV_DOCKER) or "docker"
    try:
        final = plan(args, env, program)
    except DockerError as err:
        if str(err):
            print(f"{PROG}: {err}", file=sys.stderr)
        return err.rc
    except GpuK8sError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return EXIT_USAGE
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvp(program, [program, *final])
    except OSError as err:
        print(f"{PROG}: cannot run {program}: {err}", file=sys.stderr)
        return 127
    return 0  # pragma: no cover - execvp does not return
