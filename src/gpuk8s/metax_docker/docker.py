"""The docker CLI as the wrapper uses it for itself: the daemon's version, an image's id and
environment, and whether the image has a path (for ``/opt/maca``).

Every call goes through the docker program the user's command goes to, with the user's
global options (``-H``, ``--context`` ...), so it reaches the same daemon with the same
credentials. Nothing here starts a container.

The two read-only questions asked on every run (the version, the local image) go straight
to the daemon's socket (``GET /version``, ``GET /images/NAME/json``: no docker process to
start) when the CLI would plainly talk to that socket: the program is a docker client
binary, no global option or ``DOCKER_CONTEXT`` / ``DOCKER_TLS_VERIFY`` is given, the
client config names no context, and ``DOCKER_HOST`` is unset or a ``unix://`` socket that
exists. Anything else, or any failure on the socket, goes through the CLI.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import BinaryIO
from urllib.parse import quote

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


DEFAULT_SOCKET = "/var/run/docker.sock"
API_TIMEOUT_S = 10.0


def daemon_socket(program: str, global_args: Sequence[str],
                  env: Mapping[str, str]) -> str | None:
    """The unix socket the docker CLI would use, when that is plain to see; else None."""
    if global_args or env.get("DOCKER_CONTEXT") or env.get("DOCKER_TLS_VERIFY"):
        return None
    host = env.get("DOCKER_HOST") or f"unix://{DEFAULT_SOCKET}"
    if not host.startswith("unix://"):
        return None
    path = host[len("unix://"):]
    binary = shutil.which(program, path=env.get("PATH"))
    try:
        with open(binary or "", "rb") as handle:
            if handle.read(4) != b"\x7fELF":  # a script in front of docker may do anything
                return None
        config_dir = env.get("DOCKER_CONFIG") or os.path.join(env.get("HOME", "/"), ".docker")
        config_file = os.path.join(config_dir, "config.json")
        if os.path.exists(config_file):
            with open(config_file, encoding="utf-8") as handle:
                context = json.load(handle).get("currentContext")
            if context not in (None, "", "default"):
                return None
    except (OSError, ValueError, AttributeError):
        return None
    return path if os.path.exists(path) else None


class ApiError(Exception):
    """The socket did not answer as a docker daemon does: ask the CLI instead."""


def api_request(path: str, method: str, resource: str, body: bytes | None = None
                ) -> tuple[int, bytes, BinaryIO, socket.socket]:
    """Send ``method resource`` (HTTP/1.0: the daemon closes the connection after its
    answer) on the daemon's unix socket: (status, the header lines, the body as a stream,
    the socket to close)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(API_TIMEOUT_S)
        sock.connect(path)
        extra = ""
        if body is not None:
            extra = f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        sock.sendall(f"{method} {resource} HTTP/1.0\r\nHost: docker\r\n"
                     f"User-Agent: metax-docker\r\n{extra}\r\n".encode("ascii") + (body or b""))
        stream = sock.makefile("rb")
        status_line = stream.readline().split()
        head = []
        while True:
            line = stream.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            head.append(line)
    except OSError as err:
        sock.close()
        raise ApiError(str(err)) from None
    if len(status_line) < 2 or not status_line[0].startswith(b"HTTP/") or \
            not status_line[1].isdigit():
        sock.close()
        raise ApiError(f"not an HTTP answer: {status_line!r}")
    return int(status_line[1]), b"".join(head), stream, sock


def api_get(path: str, resource: str, method: str = "GET", body: bytes | None = None
            ) -> tuple[int, bytes]:
    """``method resource`` on the daemon's unix socket: (status, body)."""
    status, head, stream, sock = api_request(path, method, resource, body)
    try:
        data = stream.read()
    except OSError as err:
        raise ApiError(str(err)) from None
    finally:
        stream.close()
        sock.close()
    if b"transfer-encoding: chunked" in head.lower():
        try:
            data = _unchunked(data)
        except ValueError:
            raise ApiError("a broken chunked body") from None
    return status, data


def _unchunked(body: bytes) -> bytes:
    out = []
    while body:
        size_line, _, rest = body.partition(b"\r\n")
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out.append(rest[:size])
        body = rest[size + 2:]
    return b"".join(out)


class Docker:
    """The docker CLI with the user's global options (and, for the read-only questions,
    the daemon's socket when the CLI would plainly use it: ``daemon_socket``)."""

    def __init__(self, program: str, global_args: Sequence[str],
                 env: Mapping[str, str] | None = None) -> None:
        self.base = [program, *global_args]
        self.socket = daemon_socket(program, global_args, env) if env is not None else None

    def _api(self, resource: str) -> tuple[int, bytes] | None:
        if self.socket is None:
            return None
        try:
            return api_get(self.socket, resource)
        except ApiError:
            self.socket = None  # from now on, the CLI
            return None

    def _run(self, args: Sequence[str]) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(
                [*self.base, *args], capture_output=True, text=True, check=False,
                stdin=subprocess.DEVNULL,
            )
        except OSError as err:
            raise DockerError(127, f"cannot run {self.base[0]}: {err}") from None

    def server_version(self) -> str:
        answer = self._api("/version")
        if answer is not None and answer[0] == 200:
            try:
                version = json.loads(answer[1]).get("Version")
            except (ValueError, AttributeError):
                version = None
            if isinstance(version, str) and version:
                return version
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
        answer = self._api(f"/images/{quote(image, safe='/:@')}/json")
        if answer is not None and answer[0] == 404:
            return None
        if answer is not None and answer[0] == 200:
            try:
                data = json.loads(answer[1])
                env = (data.get("Config") or {}).get("Env") or []
                return Image(str(data["Id"]), tuple(str(e) for e in env))
            except (ValueError, KeyError, AttributeError, TypeError):
                pass  # not what a daemon answers: the CLI says what is wrong
        proc = self._run(["image", "inspect", "--format", IMAGE_FORMAT, image])
        if proc.returncode != 0:
            if any(marker in proc.stderr for marker in _NO_IMAGE):
                return None
            raise DockerError(proc.returncode, _first_line(proc.stderr)
                              or f"docker image inspect {image} failed")
        return _parse_facts(proc.stdout, image)

    def probe_local(self, image_id: str, path: str) -> bool | None:
        """Whether the local image ``image_id`` has ``path`` and, for a directory, something
        in it, asked on the daemon's socket: create a container (never started), read the
        first tar headers of its archive at ``path`` (a symbolic link followed, as ``docker
        cp -L`` does), remove it. None when the socket is not to be used or did not answer
        as expected: then ``probe`` (the CLI) asks."""
        if self.socket is None:
            return None
        key, _, value = PROBE_LABEL.partition("=")
        spec = {"Image": image_id, "Entrypoint": [PROBE_ENTRYPOINT], "Labels": {key: value},
                "NetworkDisabled": True, "HostConfig": {"NetworkMode": "none"}}
        try:
            status, body = api_get(self.socket, "/containers/create", "POST",
                                   json.dumps(spec).encode())
            if status != 201:
                return None
            cid = str(json.loads(body)["Id"])
        except (ApiError, ValueError, KeyError, TypeError):
            return None
        try:
            return self._archive_has(cid, path)
        except (ApiError, ValueError, KeyError, TypeError, OSError):
            return None
        finally:
            with contextlib.suppress(ApiError):
                api_get(self.socket, f"/containers/{cid}?force=1&v=1", "DELETE")

    def _archive_has(self, cid: str, path: str, hops: int = 8) -> bool | None:
        import base64
        import tarfile

        assert self.socket is not None
        status, head, stream, sock = api_request(
            self.socket, "GET", f"/containers/{cid}/archive?path={quote(path, safe='/')}")
        try:
            if status == 404:
                return False
            if status != 200:
                return None
            for line in head.split(b"\n"):
                if line.lower().startswith(b"x-docker-container-path-stat:"):
                    stat = json.loads(base64.b64decode(line.split(b":", 1)[1].strip()))
                    target = stat.get("linkTarget") or ""
                    if target and hops:  # -L: the link's target, as docker cp -L copies it
                        return self._archive_has(cid, target, hops - 1)
            with tarfile.open(fileobj=stream, mode="r|") as tar:
                first = tar.next()
                # an empty directory (a bare mount point) is no SDK
                return first is not None and (not first.isdir() or tar.next() is not None)
        except tarfile.TarError:
            return None
        finally:
            stream.close()
            sock.close()

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
