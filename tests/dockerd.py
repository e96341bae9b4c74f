"""A private Debian dockerd (``docker.io``) for the tests and benchmarks that need a real one.

``private_dockerd()`` starts a containerd and a dockerd of their own: containerd with its
own config, root, state and socket (never the lab's /run/containerd/containerd.sock, which
dockerd would otherwise pick up by itself), dockerd with its own data root, exec root, pid
file, socket and client config, ``--bridge=none --iptables=false`` (what runs on this
machine), and a ``daemon.json`` with the keys of ``daemon`` (``insecure_registries`` adds
entries). On exit every container is removed, both daemons are stopped and the temp dir
is removed, with what dockerd left under /etc/docker and /var/run/docker on a host
without docker.

``busybox_rootfs()`` is a root filesystem tar of a static busybox (nothing can be pulled
here): ``docker import`` makes an image of it. Needs root, ``dockerd``, ``containerd``,
``/usr/bin/docker`` and ``/bin/busybox`` (``scripts/prereqs integration`` installs
``docker.io`` and ``busybox-static``); ``missing()`` names what is not there.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DOCKER = "/usr/bin/docker"  # Debian's client (the one of docker.io), not another on PATH
BUSYBOX = "/bin/busybox"
APPLETS = ("sh", "cat", "ls", "env", "test", "sleep", "stat", "echo", "touch", "true", "which")


def missing() -> str | None:
    """What this machine lacks for a private dockerd, or None."""
    for program in ("dockerd", "containerd", DOCKER, BUSYBOX):
        if not shutil.which(program):
            return f"{program} not installed (scripts/prereqs integration installs it)"
    if os.geteuid() != 0:
        return "dockerd needs root"
    return None


@dataclass
class Dockerd:
    base: Path
    env: dict[str, str]  # DOCKER_HOST and DOCKER_CONFIG of this daemon, on top of os.environ

    def docker(self, *args: str, timeout: float = 180,
               **kw: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.run([DOCKER, *args], env=self.env, capture_output=True, text=True,
                              check=False, timeout=timeout, **kw)

    def import_image(self, ref: str, rootfs: bytes, changes: Sequence[str] = ()) -> None:
        """``docker import`` of a root filesystem tar; ``changes``: ``--change`` values."""
        flags = [f"--change={c}" for c in changes]
        proc = subprocess.run([DOCKER, "import", *flags, "-", ref], input=rootfs,
                              capture_output=True, env=self.env, timeout=120, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"docker import {ref}: {proc.stderr.decode(errors='replace')}")


def wait_for(what: str, check: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not come up in {timeout:g} s")
        time.sleep(0.1)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def private_dockerd(insecure_registries: Sequence[str] = (),
                   daemon: Mapping[str, Any] | None = None) -> Iterator[Dockerd]:
    """``daemon``: more keys of daemon.json (e.g. a default runtime)."""
    why = missing()
    if why:
        raise RuntimeError(why)
    base = Path(tempfile.mkdtemp(prefix="mdk", dir="/tmp"))  # short: unix socket paths
    ctd = base / "containerd"
    ctd.mkdir()
    (ctd / "config.toml").write_text(
        "version = 2\n"
        f'root = "{ctd}/root"\nstate = "{ctd}/state"\n'
        'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
        f'[grpc]\n  address = "{ctd}/containerd.sock"\n'
        f'[ttrpc]\n  address = "{ctd}/containerd.sock.ttrpc"\n'
        '[debug]\n  address = ""\n[metrics]\n  address = ""\n'
        f'[plugins."io.containerd.internal.v1.opt"]\n  path = "{ctd}/opt"\n'
    )
    daemon_json: dict[str, Any] = dict(daemon or {})
    if insecure_registries:
        daemon_json["insecure-registries"] = list(insecure_registries)
    (base / "daemon.json").write_text(json.dumps(daemon_json) + "\n")
    # dockerd leaves these behind on a host without docker; removed again if it made them
    made_by_us = [p for p in (Path("/etc/docker/key.json"), Path("/var/run/docker/plugins"),
                              Path("/var/run/docker"), Path("/etc/docker")) if not p.exists()]
    env = {**os.environ, "DOCKER_HOST": f"unix://{base}/docker.sock",
           "DOCKER_CONFIG": str(base / "client")}
    env.pop("DOCKER_CONTEXT", None)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with (base / "containerd.log").open("wb") as log:
            procs.append(subprocess.Popen(["containerd", "--config", str(ctd / "config.toml")],
                                          stdout=log, stderr=log))
        wait_for("containerd", lambda: (ctd / "containerd.sock").exists())
        with (base / "dockerd.log").open("wb") as log:
            procs.append(subprocess.Popen(
                ["dockerd", "--data-root", str(base / "data"), "--exec-root", str(base / "exec"),
                 "--pidfile", str(base / "docker.pid"), "-H", env["DOCKER_HOST"],
                 "--containerd", str(ctd / "containerd.sock"),
                 "--config-file", str(base / "daemon.json"), "--bridge=none",
                 "--iptables=false", "--ip-forward=false", "--ip-masq=false",
                 "--userland-proxy=false", "--log-level=warn"],
                stdout=log, stderr=log))
        daemon = Dockerd(base, env)

        def answers() -> bool:
            if procs[-1].poll() is not None:
                raise RuntimeError((base / "dockerd.log").read_text()[-3000:])
            return daemon.docker("version", timeout=10).returncode == 0

        wait_for("dockerd", answers)
        yield daemon
    finally:
        if procs[1:]:
            ids = Dockerd(base, env).docker("ps", "-aq", timeout=30).stdout.split()
            if ids:
                Dockerd(base, env).docker("rm", "-f", "-v", *ids, timeout=60)
        for proc in reversed(procs):
            _stop(proc)
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
        for mount in reversed(mounts):
            if mount.startswith(f"{base}/"):
                subprocess.run(["umount", "-l", mount], check=False)
        shutil.rmtree(base, ignore_errors=True)
        for path in made_by_us:
            with contextlib.suppress(OSError):
                path.unlink() if path.name == "key.json" else path.rmdir()


def busybox_rootfs(files: Mapping[str, bytes] = {}, dirs: Sequence[str] = (),
                   links: Mapping[str, str] = {}) -> bytes:
    """A tar of a root filesystem with a static busybox, its applets ``APPLETS`` in /bin,
    and ``dirs`` (created), ``files`` (path -> content, mode 0755, parents created) and
    ``links`` (path -> symbolic link target)."""
    buf = io.BytesIO()
    made: set[str] = set()
    with tarfile.open(fileobj=buf, mode="w") as tar:

        def entry(name: str, kind: bytes = tarfile.DIRTYPE, data: bytes = b"",
                  link: str = "") -> None:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.linkname, info.size = kind, 0o755, link, len(data)
            tar.addfile(info, io.BytesIO(data) if data else None)

        def directory(name: str) -> None:
            parts = name.strip("/").split("/")
            for i in range(1, len(parts) + 1):
                path = "/".join(parts[:i])
                if path not in made:
                    made.add(path)
                    entry(path)

        for name in ("bin", "dev", "proc", "sys", "etc", "tmp", *dirs):
            directory(name)
        entry("bin/busybox", tarfile.REGTYPE, Path(BUSYBOX).read_bytes())
        for applet in APPLETS:
            entry(f"bin/{applet}", tarfile.SYMTYPE, link="busybox")
        for path, data in sorted(files.items()):
            parent = os.path.dirname(path.strip("/"))
            if parent:
                directory(parent)
            entry(path.strip("/"), tarfile.REGTYPE, data)
        for path, target in sorted(links.items()):
            parent = os.path.dirname(path.strip("/"))
            if parent:
                directory(parent)
            entry(path.strip("/"), tarfile.SYMTYPE, link=target)
    return buf.getvalue()


@contextlib.contextmanager
def private_dockerd_for_test() -> Iterator[Dockerd]:
    """``private_dockerd()`` in a test: skipped, naming what is missing, on a machine without
    what it needs (``scripts/prereqs integration`` installs it)."""
    import pytest

    why = missing()
    if why:
        pytest.skip(why)
    with private_dockerd() as daemon:
        yield daemon
