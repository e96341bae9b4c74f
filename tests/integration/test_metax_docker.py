"""metax-docker against a real dockerd (Debian's docker.io 20.10), as installed from its
``.run`` installer (built by package/metax_docker.py) and run by Python 3.8 when it is there.

The dockerd is private to this module (tests/dockerd.py): its own containerd (config,
root, state and socket in a temp dir; the lab's /run/containerd/containerd.sock is never
used), its own data root, exec root, pid file and socket, ``--bridge=none
--iptables=false``; stopped and removed afterwards. Images are imported from
busybox-static root filesystems (nothing is pulled): one without ``/opt/maca``, one with
its own, one with its own PATH and LD_LIBRARY_PATH. The host is a simulator root with real
char device nodes and a fake SDK tree whose ``/opt/maca/bin/mx-smi`` is a busybox shell
stand-in (the simulator's own mx-smi, in ``/opt/mxdriver/bin``, is a Python script the
busybox images cannot run; discovery on the host uses that one). Needs root,
dockerd/containerd/docker (``apt-get install docker.io``) and busybox.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpuk8s import sim
from gpuk8s.core.model import NodeInventory
from gpuk8s.discovery import discover
from gpuk8s.metax_docker import dockerargs as da
from gpuk8s.metax_docker.docker import PROBE_LABEL
from gpuk8s.metax_docker.plan import ENV_CACHE
from tests.dockerd import (
    DOCKER,
    Dockerd,
    busybox_rootfs,
    private_dockerd_for_test,
    wait_for,
)

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "package/metax_docker.py"
VERSION = "1.2.3"
PY38 = "/root/.pyenv/versions/3.8.18/bin/python"
PLAIN, WITH_SDK = "metax-docker-test/plain:1", "metax-docker-test/sdk:1"
WITH_PATHS = "metax-docker-test/paths:1"  # ENV PATH=/app/bin:/bin, LD_LIBRARY_PATH=/app/lib
# the SDK's mx-smi in the test host: a shell stand-in a busybox image can run
MX_SMI = (b'#!/bin/sh\necho "mx-smi stand-in at $0"; echo "args $*"; '
          b'echo "ld $LD_LIBRARY_PATH"; ls /dev/dri | sed "s/^/dri /"\n')
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
    # the manual's way: mkdir metax-docker; tar -C metax-docker -xvzf metax-docker_<V>.tar
    (out / "x").mkdir()
    listed = ok(["tar", "-C", str(out / "x"), "-xvzf", tar]).stdout.split()
    assert listed == [f"metax-docker_{VERSION}.aarch64.run", f"metax-docker_{VERSION}.x86_64.run"]
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
    # -S -E: no site-packages to load, no PYTHONPATH of the caller's
    assert target.read_bytes().startswith(f"#!{host_python()} -SE\n".encode())
    # a different interpreter is a change
    proc = ok([run_file, "install", "--prefix", prefix, "--python", sys.executable])
    assert proc.stdout.startswith("changed: installed")


def test_plain_tar_unpacks_it_too(installers: Path, tmp_path: Path) -> None:
    tar = installers.parent / f"metax-docker_{VERSION}.tar"
    assert tar.read_bytes()[:2] == b"\x1f\x8b"  # gzip, under the manual's name
    listed = ok(["tar", "-C", str(tmp_path), "-xvf", str(tar)]).stdout.split()
    assert listed == [f"metax-docker_{VERSION}.aarch64.run", f"metax-docker_{VERSION}.x86_64.run"]


def test_installer_with_no_argument_installs(installers: Path, tmp_path: Path) -> None:
    """The manual's `cd metax-docker; sudo ./metax-docker_<V>.<ARCH>.run`: it installs to
    /usr/local/bin (here in a mount namespace of its own, over an empty tmpfs)."""
    out = tmp_path / "installed"
    script = (f'mount -t tmpfs tmpfs /usr/local/bin && cd {installers} && '
              f'./metax-docker_{VERSION}.{os.uname().machine}.run && '
              f'./metax-docker_{VERSION}.{os.uname().machine}.run && '
              f'cp /usr/local/bin/metax-docker {out}')
    proc = ok(["unshare", "--mount", "--propagation", "private", "sh", "-c", script])
    assert proc.stdout.splitlines()[0].startswith(
        f"changed: installed metax-docker {VERSION} at /usr/local/bin/metax-docker (python /")
    assert proc.stdout.splitlines()[1].startswith(f"ok: metax-docker {VERSION} is installed")
    shebang = out.read_bytes().split(b"\n", 1)[0].decode()
    # the interpreter itself, found on PATH (python3 first), not a launcher in front of it
    python = shebang[2:].split()[0]
    assert shebang.endswith(" -SE") and os.access(python, os.X_OK)
    assert Path(python).resolve().read_bytes()[:4] == b"\x7fELF"
    assert not Path("/usr/local/bin/metax-docker").exists() or \
        Path("/usr/local/bin/metax-docker").read_bytes() != out.read_bytes()


def test_installed_file_carries_bytecode_of_its_python(metax_docker: str) -> None:
    with zipfile.ZipFile(metax_docker) as app:
        names = set(app.namelist())
    sources = {n for n in names if n.endswith(".py") and n != "__main__.py"}
    assert sources and {n + "c" for n in sources} <= names
    assert "gpuk8s/metax_docker/plan.pyc" in names


def test_installer_refuses_a_damaged_payload(installers: Path, tmp_path: Path) -> None:
    data = bytearray(Path(installer(installers)).read_bytes())
    data[-3000] ^= 0xFF
    damaged = tmp_path / "damaged.run"
    damaged.write_bytes(bytes(data))
    damaged.chmod(0o755)
    for args in ([], ["install"], ["verify"], ["install", "--check"]):
        proc = run([str(damaged), *args, *(["--prefix", str(tmp_path)] if args[:1] != ["verify"]
                                           else [])])
        assert proc.returncode == 1 and "payload checksum mismatch" in proc.stderr, args
    assert not (tmp_path / "bin").exists()


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
@pytest.fixture(scope="module")
def dockerd() -> Iterator[Dockerd]:
    with private_dockerd_for_test() as daemon:
        yield daemon


@pytest.fixture(scope="module")
def images(dockerd: Dockerd) -> None:
    dockerd.import_image(PLAIN, busybox_rootfs())
    dockerd.import_image(WITH_SDK, busybox_rootfs({"opt/maca/lib/marker": b"image-sdk\n"}))
    dockerd.import_image(WITH_PATHS, busybox_rootfs(dirs=["app/bin", "app/lib"]),
                         ["ENV PATH=/app/bin:/bin", "ENV LD_LIBRARY_PATH=/app/lib"])


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A simulated C500 x8 host: char device nodes, an SDK with a marker, an other SDK."""
    root = tmp_path_factory.mktemp("mdhost") / "node"
    sim.create(str(root), "c500-8", device_nodes="char")
    (root / "opt/maca/lib/marker").write_text("host-sdk\n")
    (root / "opt/maca/bin").mkdir()
    (root / "opt/maca/bin/mx-smi").write_bytes(MX_SMI)
    (root / "opt/maca/bin/mx-smi").chmod(0o755)
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
           ENV_CACHE: str(host.parent / "cache"),
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
    # an explicit --maca is a request: it wins over the image's own SDK, as --maca-force
    got = in_container(md, "--maca", other, image=WITH_SDK)
    assert got["sdk"] == "other-sdk" and got["maca_path"] == "/opt/maca"
    got = in_container(md, "--maca", other, "--maca-force", image=WITH_SDK)
    assert got["sdk"] == "other-sdk" and got["dev"] == {}  # no --gpus: the SDK only


def test_the_manuals_mx_smi_runs(md: Wrapper, inventory: NodeInventory) -> None:
    """`metax-docker run --gpus 2 IMAGE mx-smi`, as docs/metax-docker.md shows it: docker
    finds mx-smi on the container's PATH, which the SDK's bin directory extends."""
    proc = md("run", "--rm", "--network", "none", "--gpus", "2", PLAIN, "mx-smi")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "mx-smi stand-in at /opt/maca/bin/mx-smi"
    assert "ld /opt/maca/lib:/opt/mxdriver/lib" in lines
    assert sorted(line for line in lines if line.startswith("dri ")) == sorted(
        f"dri {os.path.basename(n)}" for i in (0, 1) for n in inventory.gpu(i).device_nodes)


def test_the_images_search_paths_are_extended(md: Wrapper) -> None:
    show = 'echo "path $PATH"; echo "ld $LD_LIBRARY_PATH"'
    proc = md("run", "--rm", "--network", "none", "--gpus", "1", WITH_PATHS, "sh", "-c", show)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "path /app/bin:/bin:/opt/maca/bin:/opt/mxdriver/bin",
        "ld /opt/maca/lib:/opt/mxdriver/lib:/app/lib"]
    # an image without PATH: docker's default, then the SDK's
    proc = md("run", "--rm", "--network", "none", "--gpus", "1", PLAIN, "sh", "-c", show)
    assert proc.stdout.splitlines()[0] == (
        "path /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/opt/maca/bin:"
        "/opt/mxdriver/bin")


@pytest.fixture(scope="module")
def faulty_host(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A simulated C500 x8 host whose GPU 3 mx-smi reports unavailable."""
    root = tmp_path_factory.mktemp("mdfault") / "node"
    sim.create(str(root), "c500-8", device_nodes="char")
    sim.fail(str(root), 3, "fault", reason="GPU hang detected")
    return root


def test_an_unhealthy_gpu_is_never_handed_out(
    md: Wrapper, faulty_host: Path, dockerd: Dockerd
) -> None:
    on_it = Wrapper(md.program, {**md.env, "METAX_DOCKER_HOST_ROOT": str(faulty_host)})
    inventory = discover(str(faulty_host))
    bdf = inventory.gpu(3).pci_address
    warning = f"metax-docker: warning: GPU 3 ({bdf}) is unhealthy, skipped: GPU hang detected\n"
    for value, indices in (("all", [0, 1, 2, 4, 5, 6, 7]), ("4", [0, 1, 2, 4])):
        proc = on_it("run", "--rm", "--network", "none", "--gpus", value, PLAIN, "sh", "-c",
                     PROBE)
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr == warning
        got = facts(proc.stdout)
        assert got["dev"] == expected_devices(faulty_host, inventory, indices)
        assert got["visible"] == ",".join(str(i) for i in range(len(indices)))
    before = dockerd.docker("ps", "-aq").stdout
    proc = on_it("run", "--rm", "--network", "none", "--gpus", "[3]", PLAIN, "true")
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"metax-docker: GPU 3 ({bdf}) is unhealthy: GPU hang detected")
    assert dockerd.docker("ps", "-aq").stdout == before


def test_the_image_probe_is_kept_per_image_id(md: Wrapper, dockerd: Dockerd) -> None:
    in_container(md, "--gpus", "1", image=WITH_SDK)
    image_id = dockerd.docker("image", "inspect", "--format", "{{.Id}}", WITH_SDK).stdout.strip()
    kept = Path(md.env[ENV_CACHE]) / f"sdk-{image_id.replace(':', '-')}"
    assert kept.read_text() == "yes\n"
    # the answer is used: a wrong one would show (the host's SDK instead of the image's)
    kept.write_text("no\n")
    try:
        assert in_container(md, "--gpus", "1", image=WITH_SDK)["sdk"] == "host-sdk"
    finally:
        kept.write_text("yes\n")
    assert in_container(md, "--gpus", "1", image=WITH_SDK)["sdk"] == "image-sdk"


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

        wait_for("the container", running, timeout=120)
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


def test_bad_input_creates_nothing(md: Wrapper, dockerd: Dockerd, tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-sdk")  # not /nonexistent: a shared machine may have it
    before = dockerd.docker("ps", "-aq").stdout
    for args, needle in ((["--gpus", "9"], "--gpus 9: this host (root"),
                         (["--gpus", "[C500NOPE]"], "no GPU 'C500NOPE'"),
                         (["--gpus", "[]"], "the list is empty"),
                         (["--gpus", "1", "--maca", missing], f"--maca {missing}")):
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


def test_the_daemons_socket_answers_as_the_cli_does(dockerd: Dockerd, images: None) -> None:
    """The read-only questions of every run go to dockerd's socket (no docker process):
    the same answers as the CLI's, for an image by name, by a longer name, and a missing one."""
    from gpuk8s.metax_docker.docker import Docker

    api, cli = Docker(DOCKER, [], dockerd.env), Docker(DOCKER, [])
    assert api.socket == dockerd.env["DOCKER_HOST"][len("unix://"):]
    with pytest.MonkeyPatch.context() as patch:
        for key in ("DOCKER_HOST", "DOCKER_CONFIG"):
            patch.setenv(key, dockerd.env[key])
        assert api.server_version() == cli.server_version()
        for name in (WITH_PATHS, f"docker.io/{WITH_PATHS}", "metax-docker-test/none:1"):
            assert api.local_image(name) == cli.local_image(name), name
        assert api.local_image(WITH_PATHS) is not None
    assert api.socket is not None  # never fell back


@pytest.mark.parametrize("name,rootfs,has_sdk", [
    ("plain", {}, False),
    ("sdk", {"files": {"opt/maca/lib/marker": b"x"}}, True),
    ("bare-mount-point", {"dirs": ["opt/maca"]}, False),
    ("link", {"files": {"opt/maca-3/lib/marker": b"x"}, "links": {"opt/maca": "/opt/maca-3"}},
     True),
    ("relative-link", {"files": {"opt/maca-3/lib/marker": b"x"},
                       "links": {"opt/maca": "maca-3"}}, True),
    ("dangling-link", {"links": {"opt/maca": "/opt/none"}}, False),
])
def test_the_sdk_probe_on_the_socket_answers_as_docker_cp_does(
    dockerd: Dockerd, name: str, rootfs: dict[str, Any], has_sdk: bool
) -> None:
    """Whether an image has its own /opt/maca, asked on dockerd's socket (the first run of
    an image), is what the CLI's create / cp -L / rm probe says; no probe container stays."""
    from gpuk8s.metax_docker.docker import Docker

    ref = f"metax-docker-test/probe-{name}:1"
    dockerd.import_image(ref, busybox_rootfs(**rootfs))
    api = Docker(DOCKER, [], dockerd.env)
    image = api.local_image(ref)
    assert image is not None
    assert api.probe_local(image.id, "/opt/maca") is has_sdk
    with pytest.MonkeyPatch.context() as patch:
        for key in ("DOCKER_HOST", "DOCKER_CONFIG"):
            patch.setenv(key, dockerd.env[key])
        assert Docker(DOCKER, []).probe(image.id, "/opt/maca", inspect=False)[1] is has_sdk
    assert dockerd.docker("ps", "-aq", "--filter", f"label={PROBE_LABEL}").stdout == ""
