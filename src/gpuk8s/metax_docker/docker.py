"""The docker CLI as the wrapper uses it for itself: the daemon's version, an image's id and
environment, and whether the image has a path (for ``/opt/maca``).

Every call goes through the docker program the user's command goes to, with the user's
global options (``-H``, ``--context`` ...), so it reaches the same daemon with the same
credentials. Nothing here starts a container.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from ..core.errors import GpuK8sError
from .dockerargs import UsageError

MIN_DOCKER = (19, 3)
PROBE_ENTRYPOINT = "/.metax-docker-probe"  # never started: the probe container only exists
PROBE_LABEL = "com.metax-tech.metax-docker.probe=1"
_MISSING_PATH = ("No such container:path", "Could not find the file")
_NO_IMAGE = ("No such image", "No such object")
# `{{json .Id}} {{json .Config.Env}}` and the container's `{{json .Image}} ...`
IMAGE_FORMAT = "{{json .Id}} {{json .Config.Env}}"
CONTAINER_FORMAT = "{{json .Image}} {{json .Config.Env}}"


class DockerError(GpuK8sError):
    """A docker command the wrapper ran itself failed; exit with its status."""

    def __init__(self, rc: int, message: str = "") -> None:
        super().__init__(message)
        self.rc = rc if rc > 0 else 1


@dataclass(frozen=True)
class Image:
    """What the wrapper needs of an image: its id (content-addressed: the same id is the
    same file system) and its environment (``NAME=value``)."""

    id: str
    env: tuple[str, ...] = ()


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else ""


def _parse_facts(text: str, what: str) -> Image:
    """``"sha256:..." ["A=1",...]`` (or ``null`` for no environment)."""
    ident, _, env = text.strip().partition(" ")
    try:
        image_id = json.loads(ident)
        values = json.loads(env) if env.strip() else None
    except ValueError:
        raise DockerError(1, f"cannot read docker's answer about {what}: {text.strip()!r}"
                          ) from None
    if not isinstance(image_id, str) or not image_id:
        raise DockerError(1, f"docker gave no image id for {what}")
    if not isinstance(values, list):
        values = []
    return Image(image_id, tuple(str(v) for v in values))


class Docker:
    """The docker CLI with the user's global options."""

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

    def local_image(self, image: str) -> Image | None:
        """The image as the daemon has it (``docker image inspect``), None when it has no
        such image (``run`` would pull it)."""
        proc = self._run(["image", "inspect", "--format", IMAGE_FORMAT, image])
        if proc.returncode != 0:
            if any(marker in proc.stderr for marker in _NO_IMAGE):
                return None
            raise DockerError(proc.returncode, _first_line(proc.stderr)
                              or f"docker image inspect {image} failed")
        return _parse_facts(proc.stdout, image)

    def probe(
        self, image: str, path: str | None, create_options: Sequence[str] = (),
        failed_rc: int | None = None, inspect: bool = True,
    ) -> tuple[Image | None, bool | None]:
        """The image (pulled as ``run`` would, with ``create_options`` such as
        ``--platform`` / ``--pull``; None unless ``inspect``) and, when ``path`` is given,
        whether it has that path and, for a directory, something in it.

        ``docker create`` of a container that is never started, ``docker container
        inspect`` of it (with ``inspect``), then the first tar headers of
        ``docker cp -L CONTAINER:PATH -``
        (the daemon stats the path in the image's file system; nothing runs in it and the
        copy is cut after two headers), then ``docker rm``. When the image cannot be had,
        docker has said why on stderr: ``DockerError`` with ``failed_rc`` (125 for ``run``,
        docker run's status for a daemon error) or docker create's status.
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
            facts = None
            if inspect:
                proc = self._run(["container", "inspect", "--format", CONTAINER_FORMAT, cid])
                if proc.returncode != 0:
                    raise DockerError(proc.returncode, _first_line(proc.stderr)
                                      or f"docker container inspect {cid} failed")
                facts = _parse_facts(proc.stdout, image)
            return facts, (self._has_path(cid, path) if path is not None else None)
        finally:
            subprocess.run([*self.base, "rm", "-f", "-v", cid], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, check=False)

    def _has_path(self, cid: str, path: str) -> bool:
        import tarfile  # only here: a probe is rare (the answer is cached per image)

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
