"""metax-docker against a real dockerd (Debian's docker.io 20.10), as installed from its
``.run`` installer (built by package/metax_docker.py) and run by Python 3.8 when it is there.

The dockerd is private to this module: its own containerd (config, root, state and socket
in a temp dir; the lab's /run/containerd/containerd.sock is never used — dockerd would pick
it up by itself, hence ``--containerd``), its own data root, exec root, pid file and socket,
``--bridge=none --iptables=false``; stopped and removed afterwards. Images are imported
from busybox-static root filesystems (nothing is pulled): one without ``/opt/maca``, one
with its own. The host is a simulator root with real char device nodes and a fake SDK
tree. Needs root, dockerd/containerd/docker (``apt-get install docker.io``) and busybox.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpuk8s import sim
from gpuk8s.core.model import NodeInventory
from gpuk8s.discovery import discover
from gpuk8s.metax_docker import dockerargs as da
from gpuk8s.metax_docker.main import PROBE_LABEL

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "package/metax_docker.py"
VERSION = "1.2.3"
DOCKER = "/usr/bin/docker"  # Debian's client (the one of docker.io), not another on PATH
BUSYBOX = "/bin/busybox"
PY38 = "/root/.pyenv/versions/3.8.18/bin/python"
APPLETS = ("sh", "cat", "ls", "env", "test", "sleep", "stat", "echo", "touch", "true")
PLAIN, WITH_SDK = "metax-docker-test/plain:1", "metax-docker-test/sdk:1"
# facts a container prints about itself, one per line
PROBE = (
    'for f in /dev/mxcd /dev/dri/*; do [ -e "$f" ] && stat -c "dev %n %t:%T" "$f"; done; '
    'echo "visible ${MACA_VISIBLE_DEVICES-unset}"; echo "maca_path ${MACA_PATH-unset}"; '
    'echo "sdk $(cat /opt/maca/lib/marker 2>/dev/null || echo none)"; '
    "test -d /opt/mxdriver/bin && echo mxdriver; "
    "touch /opt/maca/lib/w 2>/dev/null && echo sdk-writable || echo sdk-read-only"
)


def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    kw.setdefault("timeout", 180)
    return subprocess.run(cmd, capture_output=True, text=True, check=False, **kw)


def ok(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    proc = run(cmd, **kw)
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout}\n{proc.stderr}"
    return proc


# -- the installers ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def installers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """metax-docker_VERSION.tar built by package/metax_docker.py, unpacked."""
    out = tmp_path_factory.mktemp("metax-docker-dist")
    tar = ok([sys.executable, str(BUILD), VERSION, "--out", str(out)]).stdout.strip()
    assert tar == str(out / f"metax-docker_{VERSION}.tar")
    with tarfile.open(tar) as archive:
        names = archive.getnames()
        archive.extractall(out / "x", filter="data")
    assert names == [f"metax-docker_{VERSION}.aarch64.run", f"metax-docker_{VERSION}.x86_64.run"]
    return out / "x"


def installer(installers: Path) -> str:
    return str(installers / f"metax-docker_{VERSION}.{os.uname().machine}.run")


def host_python() -> str:
    """A Python without gpuk8s installed: 3.8 (the oldest supported) where there is one."""
    for python in (PY38, "/usr/bin/python3"):
        if os.access(python, os.X_OK):
            return python
    return sys.executable


@pytest.fixture(scope="module")
def metax_docker(installers: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    prefix = tmp_path_factory.mktemp("prefix")
    ok([installer(installers), "install", "--prefix", str(prefix), "--python", host_python()])
    return str(prefix / "bin/metax-docker")


def test_build_is_reproducible(installers: Path, tmp_path: Path) -> None:
    again = ok([sys.executable, str(BUILD), VERSION, "--out", str(tmp_path)])
    first = installers.parent / f"metax-docker_{VERSION}.tar"
    assert Path(again.stdout.strip()).read_bytes() == first.read_bytes()


def test_installer_install_and_uninstall_are_idempotent(installers: Path, tmp_path: Path) -> None:
    run_file, prefix = installer(installers), str(tmp_path / "p")
    target = tmp_path / "p/bin/metax-docker"
    steps = [
        (["install", "--check"], "changed: would install", False),
        (["install"], "changed: installed", True),
        (["install", "--check"], "ok: metax-docker 1.2.3 is installed", True),
        (["install"], "ok: metax-docker 1.2.3 is installed", True),
        (["uninstall", "--check"], "changed: would remove", True),
        (["uninstall"], "changed: removed", False),
        (["uninstall"], "ok: metax-docker is not installed", False),
    ]
    for args, said, present in steps:
        proc = ok([run_file, *args, "--prefix", prefix, "--python", host_python()])
        assert proc.stdout.startswith(said), (args, proc.stdout)
        assert target.exists() == present, args
    ok([run_file, "install", f"--prefix={prefix}", "--python", host_python()])
    assert os.access(target, os.X_OK)
    assert target.read_bytes().startswith(f"#!{host_python()}\n".encode())
    # a different interpreter is a change
    proc = ok([run_file, "install", "--prefix", prefix, "--python", sys.executable])
    assert proc.stdout.startswith("changed: installed")


def test_installer_refusals(installers: Path, tmp_path: Path) -> None:
    run_file = installer(installers)
    other = "aarch64" if os.uname().machine != "aarch64" else "x86_64"
    proc = run([str(installers / f"metax-docker_{VERSION}.{other}.run"), "install",
                "--prefix", str(tmp_path)])
    assert proc.returncode == 1 and f"this installer is for {other}" in proc.stderr
    foreign = tmp_path / "bin/metax-docker"
    foreign.parent.mkdir()
    foreign.write_text("#!/bin/sh\necho mine\n")
    proc = run([run_file, "uninstall", "--prefix", str(tmp_path)])
    assert proc.returncode == 1 and "not a metax-docker zipapp; left alone" in proc.stderr
    assert foreign.exists()
    for args, needle in ((["install", "--bogus"], "unknown option --bogus"),
                         (["install", "--prefix", "rel"], "absolute path"),
                         (["frob"], "unknown command frob")):
        proc = run([run_file, *args])
        assert proc.returncode == 2 and needle in proc.stderr, args
    assert "payload ok" in ok([run_file, "verify"]).stderr
    assert ok([run_file, "version"]).stdout.strip() == VERSION


def test_installed_zipapp_needs_no_gpuk8s(metax_docker: str) -> None:
    python = host_python()
    assert python != sys.executable, "no Python without gpuk8s to prove the point"
    assert run([python, "-I", "-c", "import gpuk8s"]).returncode != 0
    # no docker needed for a bad --gpus: the zipapp's own code answers
    proc = run([metax_docker, "run", "--gpus", "[]", "img"], env={**os.environ, "PATH": ""})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (
        "metax-docker: --gpus []: the list is empty; name GPUs by id or serial number\n")


# -- a private dockerd ------------------------------------------------------------------------
@dataclass
class Dockerd:
    base: Path
    env: dict[str, str]

    def docker(self, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        return run([DOCKER, *args], env=self.env, **kw)


def _wait(what: str, check: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what} did not come up"
        time.sleep(0.1)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def dockerd() -> Iterator[Dockerd]:
    for program in ("dockerd", "containerd", DOCKER, BUSYBOX):
        if not shutil.which(program):
            pytest.skip(f"{program} not installed (scripts/prereqs integration installs it)")
    if os.geteuid() != 0:
        pytest.skip("dockerd needs root")
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
    (base / "daemon.json").write_text("{}\n")
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
        _wait("containerd", lambda: (ctd / "containerd.sock").exists())
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
            assert procs[-1].poll() is None, (base / "dockerd.log").read_text()[-3000:]
            return daemon.docker("version", timeout=10).returncode == 0

        _wait("dockerd", answers)
        yield daemon
    finally:
        if procs[1:]:
            ids = run([DOCKER, "ps", "-aq"], env=env, timeout=30).stdout.split()
            if ids:
                run([DOCKER, "rm", "-f", "-v", *ids], env=env, timeout=60)
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


def _rootfs(sdk: bool) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:

        def entry(name: str, kind: bytes = tarfile.DIRTYPE, data: bytes = b"",
                  link: str = "") -> None:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.linkname, info.size = kind, 0o755, link, len(data)
            tar.addfile(info, io.BytesIO(data) if data else None)

        for name in ("bin", "dev", "proc", "sys", "etc", "tmp"):
            entry(name)
        entry("bin/busybox", tarfile.REGTYPE, Path(BUSYBOX).read_bytes())
        for applet in APPLETS:
            entry(f"bin/{applet}", tarfile.SYMTYPE, link="busybox")
        if sdk:
            for name in ("opt", "opt/maca", "opt/maca/lib"):
                entry(name)
            entry("opt/maca/lib/marker", tarfile.REGTYPE, b"image-sdk\n")
    return buf.getvalue()


@pytest.fixture(scope="module")
def images(dockerd: Dockerd) -> None:
    for ref, sdk in ((PLAIN, False), (WITH_SDK, True)):
        proc = subprocess.run([DOCKER, "import", "-", ref], input=_rootfs(sdk),
                              capture_output=True, env=dockerd.env, timeout=120, check=False)
        assert proc.returncode == 0, proc.stderr


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A simulated C500 x8 host: char device nodes, an SDK with a marker, an other SDK."""
    root = tmp_path_factory.mktemp("mdhost") / "node"
    sim.create(str(root), "c500-8", device_nodes="char")
    (root / "opt/maca/lib/marker").write_text("host-sdk\n")
    other = root.parent / "maca-other/lib"
    other.mkdir(parents=True)
    (other / "marker").write_text("other-sdk\n")
    return root


@pytest.fixture(scope="module")
def inventory(host: Path) -> NodeInventory:
    return discover(str(host))


@dataclass
class Wrapper:
    program: str
    env: dict[str, str]

    def __call__(self, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        return run([self.program, *args], env=self.env, **kw)


@pytest.fixture(scope="module")
def md(metax_docker: str, dockerd: Dockerd, images: None, host: Path) -> Wrapper:
    env = {**dockerd.env, "METAX_DOCKER_DOCKER": DOCKER, "METAX_DOCKER_HOST_ROOT": str(host),
           # the simulator's mx-smi is `#!/usr/bin/env python3`: this interpreter, quickly
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return Wrapper(metax_docker, env)


def facts(output: str) -> dict[str, Any]:
    devices: dict[str, tuple[int, int]] = {}
    out: dict[str, Any] = {"dev": devices}
    for line in output.splitlines():
        key, _, value = line.partition(" ")
        if key == "dev":
            path, _, numbers = value.partition(" ")
            major, minor = (int(x, 16) for x in numbers.split(":"))
            devices[path] = (major, minor)
        else:
            out[key] = value or True
    return out


def expected_devices(
    host: Path, inventory: NodeInventory, indices: list[int]
) -> dict[str, tuple[int, int]]:
    paths = ["/dev/mxcd", *(p for i in indices for p in inventory.gpu(i).device_nodes)]
    out = {}
    for path in paths:
        st = os.stat(f"{host}{path}")
        out[path] = (os.major(st.st_rdev), os.minor(st.st_rdev))
    return out


def in_container(md: Wrapper, *wrapper_args: str, image: str = PLAIN) -> dict[str, Any]:
    proc = md("run", "--rm", "--network", "none", *wrapper_args, image, "sh", "-c", PROBE)
    assert proc.returncode == 0, proc.stderr
    return facts(proc.stdout)


# -- each --gpus form ---------------------------------------------------------------------------
def test_gpus_all_image_without_sdk(md: Wrapper, host: Path, inventory: NodeInventory) -> None:
    got = in_container(md, "--gpus=all")
    assert got["dev"] == expected_devices(host, inventory, list(range(8)))
    assert got["visible"] == "0,1,2,3,4,5,6,7"
    assert got["sdk"] == "host-sdk" and got["maca_path"] == "/opt/maca"
    assert got.get("mxdriver") and got.get("sdk-read-only")


def test_gpus_count(md: Wrapper, host: Path, inventory: NodeInventory) -> None:
    got = in_container(md, "--gpus", "2")
    assert got["dev"] == expected_devices(host, inventory, [0, 1])
    assert got["visible"] == "0,1"


def test_gpus_ids_and_serials(md: Wrapper, host: Path, inventory: NodeInventory) -> None:
    got = in_container(md, "--gpus", "[5,2]")
    assert got["dev"] == expected_devices(host, inventory, [2, 5])
    assert got["visible"] == "0,1"
    serials = [inventory.gpu(i).serial or "" for i in (6, 0, 3)]
    assert all(serials)
    got = in_container(md, f"--gpus=[{','.join(serials)}]")
    assert got["dev"] == expected_devices(host, inventory, [0, 3, 6])
    assert got["visible"] == "0,1,2"


def test_image_sdk_wins_unless_forced(md: Wrapper, host: Path, inventory: NodeInventory) -> None:
    got = in_container(md, "--gpus", "1", image=WITH_SDK)
    assert got["sdk"] == "image-sdk" and got["maca_path"] == "unset"
    assert got["dev"] == expected_devices(host, inventory, [0]) and got.get("mxdriver")
    got = in_container(md, "--gpus", "1", "--maca-force", image=WITH_SDK)
    assert got["sdk"] == "host-sdk" and got["maca_path"] == "/opt/maca"


def test_maca_path(md: Wrapper, host: Path) -> None:
    other = str(host.parent / "maca-other")
    got = in_container(md, "--gpus", "[7]", "--maca", other)
    assert got["sdk"] == "other-sdk" and got.get("sdk-read-only")
    # an image's own SDK still wins over --maca, unless forced
    assert in_container(md, "--maca", other, image=WITH_SDK)["sdk"] == "image-sdk"
    got = in_container(md, "--maca", other, "--maca-force", image=WITH_SDK)
    assert got["sdk"] == "other-sdk" and got["dev"] == {}  # no --gpus: the SDK only


def test_create_then_start(md: Wrapper, dockerd: Dockerd) -> None:
    proc = md("container", "create", "--network", "none", "--gpus", "[1]", PLAIN, "sh", "-c",
              "cat /opt/maca/lib/marker; echo $MACA_VISIBLE_DEVICES")
    assert proc.returncode == 0, proc.stderr
    cid = proc.stdout.strip()
    try:
        assert dockerd.docker("start", "-a", cid).stdout.split() == ["host-sdk", "0"]
    finally:
        dockerd.docker("rm", "-f", cid)


# -- pass-through: stdin, exit codes, signals, other commands ------------------------------------
def test_stdin_and_exit_code(md: Wrapper) -> None:
    proc = md("run", "-i", "--rm", "--network", "none", "--gpus", "1", PLAIN, "sh", "-c",
              "cat; exit 7", input="from stdin\n")
    assert proc.returncode == 7
    assert proc.stdout == "from stdin\n"


def test_wrapper_becomes_docker_and_signals_reach_the_container(
    md: Wrapper, dockerd: Dockerd
) -> None:
    name = "md-signal"
    proc = subprocess.Popen(
        [md.program, "run", "--rm", "--network", "none", "--name", name, "--gpus", "1", PLAIN,
         "sh", "-c", "trap 'exit 3' TERM; while true; do sleep 0.1; done"],
        env=md.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        def running() -> bool:
            assert proc.poll() is None, proc.communicate()
            state = dockerd.docker("inspect", "-f", "{{.State.Running}}", name, timeout=10)
            return state.stdout.strip() == "true"

        _wait("the container", running, timeout=120)
        # exec'd, not proxied: the wrapper's process is docker itself
        assert os.readlink(f"/proc/{proc.pid}/exe") == os.path.realpath(DOCKER)
        proc.send_signal(signal.SIGTERM)  # docker run's sig-proxy hands it to the container
        assert proc.wait(timeout=60) == 3
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        dockerd.docker("rm", "-f", name)


def test_other_commands_pass_through(md: Wrapper) -> None:
    name = "md-exec"
    started = md("run", "-d", "--name", name, "--network", "none", "--gpus", "2", PLAIN,
                 "sleep", "300")
    assert started.returncode == 0, started.stderr
    try:
        ps = md("ps", "--filter", f"name={name}", "--format", "{{.Names}} {{.Image}}")
        assert ps.stdout.split() == [name, PLAIN]
        listed = md("images", "--format", "{{.Repository}}:{{.Tag}}").stdout.split()
        assert PLAIN in listed and WITH_SDK in listed
        # exec keeps stdin, the container's env (set by metax-docker run) and exit codes
        proc = md("exec", "-i", name, "sh", "-c", "cat; echo $MACA_VISIBLE_DEVICES; exit 4",
                  input="to exec\n")
        assert proc.returncode == 4
        assert proc.stdout == "to exec\n0,1\n"
        # docker's own errors and statuses, untouched
        proc = md("exec", "no-such-container", "true")
        assert proc.returncode == 1 and "No such container" in proc.stderr
    finally:
        md("rm", "-f", name)


def test_missing_image_is_dockers_error(md: Wrapper) -> None:
    proc = md("run", "--rm", "--network", "none", "--pull", "never", "--gpus", "1",
              "metax-docker-test/nothing:1", "true")
    assert proc.returncode == 125  # docker run's status for a daemon error
    assert "No such image" in proc.stderr


def test_bad_input_creates_nothing(md: Wrapper, dockerd: Dockerd) -> None:
    before = dockerd.docker("ps", "-aq").stdout
    for args, needle in ((["--gpus", "9"], "--gpus 9: this host (root"),
                         (["--gpus", "[C500NOPE]"], "no GPU 'C500NOPE'"),
                         (["--gpus", "[]"], "the list is empty"),
                         (["--gpus", "1", "--maca", "/nonexistent"], "--maca /nonexistent")):
        proc = md("run", "--rm", "--network", "none", *args, PLAIN, "true")
        assert proc.returncode == 2, args
        assert proc.stderr.startswith("metax-docker: ") and needle in proc.stderr, proc.stderr
    assert dockerd.docker("ps", "-aq").stdout == before


def test_probe_containers_are_removed(md: Wrapper, dockerd: Dockerd) -> None:
    in_container(md, "--gpus", "1", image=WITH_SDK)
    left = dockerd.docker("ps", "-aq", "--filter", f"label={PROBE_LABEL}")
    assert left.returncode == 0 and left.stdout == ""


@pytest.mark.parametrize("command", ["run", "create"])
def test_flag_tables_match_dockers_help(command: str) -> None:
    """Every flag the docker clients here list agrees with the tables (value or not)."""
    clients = sorted({DOCKER, *(c for c in [shutil.which("docker")] if c)})
    checked = 0
    for client in clients:
        if not os.access(client, os.X_OK):
            continue
        table = da.help_table(ok([client, command, "--help"]).stdout)
        for flag, takes_value in table.items():
            assert da.RUN_FLAGS(flag) == takes_value, (client, flag)
            checked += 1
    assert checked > 150
