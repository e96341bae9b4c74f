"""container-runtime on a docker node, judged by a real dockerd (Debian's docker.io 20.10):
the wrapper goes into daemon.json as a runtime, dockerd reloads it on SIGHUP (same pid)
and its API (`docker info`) serves it as the default runtime; dockerd started afresh on
the edited file accepts it (20.10 has no `dockerd --validate`: a real start is the check);
uninstall restores the file byte for byte; a daemon.json the agent cannot edit safely is
left untouched and reported failed.

The dockerd is private (its own containerd, data-root, exec-root, pidfile and sockets under
a temp dir, --bridge=none --iptables=false); the lab's /run/containerd is never used.
Needs root; scripts/prereqs integration installs docker.io and containerd.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuk8s import sim
from gpuk8s.host.readiness import read_readiness
from gpuk8s.host.serving import peer_pid_or_zero
from gpuk8s.services.nodeagent import Reporter
from gpuk8s.services.runtime import containerd, docker
from gpuk8s.services.runtime.agent import WRAPPER_NAME, RuntimeAgent, RuntimeSettings

pytestmark = pytest.mark.integration

WRAPPER = f"/usr/local/gpuk8s/bin/{WRAPPER_NAME}"
ORIGINAL = '{\n    "log-level": "warn",\n    "max-concurrent-downloads": 2\n}\n'


def wait_for(what: str, check: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout}s"
        time.sleep(0.2)
    return value


class DockerNode:
    """A node root with a private containerd and a dockerd reading <root>/etc/docker."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.procs: list[subprocess.Popen[bytes]] = []
        self.daemon_json = base / "etc/docker/daemon.json"
        self.socket = str(base / "var/run/docker.sock")
        ctd = base / "containerd"
        ctd.mkdir()
        (ctd / "config.toml").write_text(
            f'version = 2\nroot = "{ctd}/root"\nstate = "{ctd}/state"\n'
            'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
            f'[grpc]\n  address = "{ctd}/c.sock"\n[ttrpc]\n  address = "{ctd}/c.sock.ttrpc"\n'
            '[debug]\n  address = ""\n[metrics]\n  address = ""\n'
            f'[plugins."io.containerd.internal.v1.opt"]\n  path = "{ctd}/opt"\n')
        with (base / "containerd.log").open("ab") as log:
            self.procs.append(subprocess.Popen(
                ["containerd", "--config", str(ctd / "config.toml")], stdout=log, stderr=log))
        wait_for("containerd", lambda: (ctd / "c.sock").exists())

    def start_dockerd(self) -> int:
        with (self.base / "dockerd.log").open("ab") as log:
            proc = subprocess.Popen(
                ["dockerd", "--config-file", str(self.daemon_json),
                 "--data-root", str(self.base / "data"), "--exec-root", str(self.base / "exec"),
                 "--pidfile", str(self.base / "docker.pid"), "-H", f"unix://{self.socket}",
                 "--containerd", str(self.base / "containerd/c.sock"), "--bridge=none",
                 "--iptables=false", "--ip-forward=false", "--ip-masq=false",
                 "--userland-proxy=false"], stdout=log, stderr=log)
        self.procs.append(proc)

        def answers() -> int:
            assert proc.poll() is None, (self.base / "dockerd.log").read_text()[-3000:]
            try:
                docker.docker_info(self.socket, timeout=2)
            except containerd.RuntimeConfigError:
                return 0
            return proc.pid

        return int(wait_for("dockerd", answers))

    def stop_dockerd(self) -> None:
        proc = self.procs.pop()
        proc.terminate()
        proc.wait(timeout=60)

    def info(self) -> dict[str, Any]:
        return docker.docker_info(self.socket)

    def cli_info(self) -> dict[str, Any]:
        done = subprocess.run(["docker", "-H", f"unix://{self.socket}", "info", "--format",
                               "{{json .}}"], capture_output=True, text=True, check=True,
                              timeout=60, env={**os.environ, "DOCKER_CONFIG": str(self.base)})
        return dict(json.loads(done.stdout))

    def agent(self, tmp_path: Path) -> RuntimeAgent:
        gpu_root = tmp_path / "gpu"
        sim.create(str(gpu_root), "c500-8", device_nodes="char")
        return RuntimeAgent(RuntimeSettings(
            host_root=str(gpu_root), system_root=str(self.base), runtime="auto",
            runtime_version="docker://20.10.24", docker_config="/etc/docker/daemon.json",
            device_path_prefix=str(gpu_root)), Reporter(None, "container-runtime", "Runtime"))


@pytest.fixture
def node() -> Iterator[DockerNode]:
    for program in ("dockerd", "docker", "containerd"):
        assert shutil.which(program), f"{program}: scripts/prereqs integration installs it"
    if os.geteuid() != 0:
        pytest.fail("dockerd needs root (scripts/test runs the tiers as root)")
    base = Path(tempfile.mkdtemp(prefix="dk", dir="/tmp"))  # short: unix socket paths
    for directory in ("etc/docker", "var/run", "usr/bin"):
        (base / directory).mkdir(parents=True)
    (base / "usr/bin/python3").symlink_to(sys.executable)
    made = DockerNode(base)
    try:
        yield made
    finally:
        for proc in reversed(made.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
        for mount in reversed(mounts):
            if mount.startswith(f"{base}/"):
                subprocess.run(["umount", "-l", mount], check=False)
        shutil.rmtree(base, ignore_errors=True)


def test_real_dockerd_serves_the_wrapper_and_uninstall_restores_daemon_json(
    node: DockerNode, tmp_path: Path
) -> None:
    node.daemon_json.write_text(ORIGINAL)
    pid = node.start_dockerd()
    assert "metax" not in node.info()["Runtimes"]
    agent = node.agent(tmp_path)
    assert (agent.mode(), agent.backend().name) == ("wrapper", "dockerd")
    report = agent.one_pass()
    assert report.state == "ready", report.message
    assert read_readiness(agent.settings.host_root) == {"runtime.ready": True}
    info = node.cli_info()  # what `docker info` shows
    assert info["Runtimes"]["metax"]["path"] == WRAPPER and info["DefaultRuntime"] == "metax"
    assert peer_pid_or_zero(node.socket) == pid  # reloaded, not restarted
    edited = json.loads(node.daemon_json.read_text())
    assert edited["log-level"] == "warn" and edited["max-concurrent-downloads"] == 2
    # a dockerd started afresh on the edited file accepts it and serves the runtime
    node.stop_dockerd()
    node.start_dockerd()
    assert docker.not_served(node.info(), "metax", WRAPPER, True) is None
    assert agent.one_pass().state == "ready"
    agent.uninstall()
    assert node.daemon_json.read_text() == ORIGINAL  # byte for byte
    info = node.info()
    assert "metax" not in info["Runtimes"] and info["DefaultRuntime"] == "runc"


def test_an_unsafe_daemon_json_is_left_untouched(node: DockerNode, tmp_path: Path) -> None:
    foreign = '{"runtimes": {"metax": {"path": "/usr/bin/runc"}}}\n'
    node.daemon_json.write_text(foreign)
    pid = node.start_dockerd()
    report = node.agent(tmp_path).one_pass()
    assert report.state == "failed" and "not the wrapper" in report.message, report.message
    assert node.daemon_json.read_text() == foreign
    assert sorted(p.name for p in node.daemon_json.parent.iterdir()) == ["daemon.json"]
    assert peer_pid_or_zero(node.socket) == pid
    assert node.info()["Runtimes"]["metax"]["path"] == "/usr/bin/runc"
