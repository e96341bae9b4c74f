"""MPS control daemons per GPU (host/mps.py, `gpuk8s serve mps`) against the simulator's
``nvidia-cuda-mps-control`` stand-in: real daemon processes, pid files, the control
socket and ``quit``, as the product runs them on a node."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from gpuk8s import sim
from gpuk8s.core.errors import ConfigError
from gpuk8s.core.sharing import SHARING_MODE_LABEL
from gpuk8s.host.mps import (
    PID_FILE,
    MpsDaemons,
    MpsSettings,
    pipe_directory,
    sharing_mode,
)
from gpuk8s.services.mps.main import MpsAgent, main
from gpuk8s.sim import tree

pytestmark = pytest.mark.usefixtures("fast_python3")


@pytest.fixture()
def mps_dir() -> Iterator[str]:
    # short: control socket paths are limited to 107 bytes (as on a node)
    directory = tempfile.mkdtemp(prefix="mps", dir="/tmp")
    yield directory
    # never leave a daemon behind: kill those still named in a pid file of this test
    for pid_file in Path(directory).glob(f"*/pipe/{PID_FILE}"):
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pid_file.read_text().strip()), signal.SIGKILL)
    shutil.rmtree(directory, ignore_errors=True)


def uuids(root: str, count: int = 2) -> list[str]:
    return [g["uuid"] for g in sim.state(root)["gpus"][:count]]


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def gone(pid: int) -> bool:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return True
        if stat.rpartition(")")[2].split()[0] in ("Z", "X"):
            return True
        time.sleep(0.02)
    return False


def test_one_daemon_per_gpu_with_the_contract_environment(nvidia_sim_root: str,
                                                          mps_dir: str) -> None:
    daemons = MpsDaemons(MpsSettings(nvidia_sim_root, mps_dir, active_thread_percentage=40))
    wanted = uuids(nvidia_sim_root)
    result = daemons.reconcile(wanted)
    assert result.failed == {}
    assert result.started == wanted and sorted(result.running) == sorted(wanted)
    assert len(set(result.running.values())) == 2
    for uuid, pid in result.running.items():
        pipe = Path(mps_dir, uuid, "pipe")
        assert pipe == Path(pipe_directory(mps_dir, uuid))
        assert (pipe / PID_FILE).read_text().strip() == str(pid)
        assert (pipe / "control").is_socket()
        env = environ(pid)
        assert env["CUDA_VISIBLE_DEVICES"] == uuid
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == f"{mps_dir}/{uuid}/pipe"
        assert env["CUDA_MPS_LOG_DIRECTORY"] == f"{mps_dir}/{uuid}/log"
        # the default share was sent to this GPU's daemon through its own pipe directory
        rc, out, _ = daemons.control(uuid, "get_default_active_thread_percentage\n")
        assert (rc, out.strip()) == (0, "40.0")
    state = json.loads(Path(mps_dir, "daemons.json").read_text())
    assert {u: r["pid"] for u, r in state["daemons"].items()} == result.running


def test_a_restarted_agent_adopts_restarts_the_dead_and_stops_what_is_unwanted(
        nvidia_sim_root: str, mps_dir: str) -> None:
    wanted = uuids(nvidia_sim_root, 3)
    first = MpsDaemons(MpsSettings(nvidia_sim_root, mps_dir)).reconcile(wanted)
    killed = wanted[1]
    os.kill(first.running[killed], signal.SIGKILL)
    assert gone(first.running[killed])

    again = MpsDaemons(MpsSettings(nvidia_sim_root, mps_dir))  # a new agent process
    second = again.reconcile(wanted[:2])
    assert second.adopted == [wanted[0]]
    assert second.running[wanted[0]] == first.running[wanted[0]]  # not a second daemon
    assert second.restarted == [killed] and second.started == []
    assert second.running[killed] != first.running[killed]
    assert second.stopped == [wanted[2]]  # recorded by the first agent, no longer wanted
    assert gone(first.running[wanted[2]])
    assert not Path(mps_dir, wanted[2], "pipe", PID_FILE).exists()

    third = again.reconcile(wanted[:2])  # steady state: nothing to do
    assert (third.started, third.restarted, third.adopted, third.stopped) == ([], [], [], [])

    off = again.reconcile([])
    assert sorted(off.stopped) == sorted(wanted[:2])
    assert all(gone(pid) for pid in second.running.values())
    assert json.loads(Path(mps_dir, "daemons.json").read_text()) == {"daemons": {}}


def test_a_missing_tool_is_reported_per_gpu(tmp_path: Path, mps_dir: str) -> None:
    root = tmp_path / "bare"
    root.mkdir()
    result = MpsDaemons(MpsSettings(str(root), mps_dir)).reconcile(["GPU-1234"])
    assert result.running == {}
    assert "nvidia-cuda-mps-control not found" in result.failed["GPU-1234"]


def test_bad_settings_and_labels_are_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"active thread percentage: 0 must be 1\.\.100"):
        MpsSettings(active_thread_percentage=0)
    with pytest.raises(ConfigError, match="mps dir"):
        MpsSettings(mps_dir="relative/dir")
    with pytest.raises(ConfigError, match="Unix socket path limit"):
        MpsSettings(mps_dir="/" + "d" * 60)
    assert sharing_mode({}) == ("exclusive", None)
    assert sharing_mode({SHARING_MODE_LABEL: "mps"}) == ("mps", None)
    mode, why = sharing_mode({SHARING_MODE_LABEL: "turbo"})
    assert mode == "exclusive" and why is not None and "exclusive, sgpu, vcuda, mps" in why


class FakeNode:
    def __init__(self, labels: dict[str, str]) -> None:
        self.labels = labels

    def node(self) -> Mapping[str, Any]:
        return {"metadata": {"name": "gpu-1", "labels": dict(self.labels)}}

    def annotate(self, changes: Mapping[str, str | None]) -> None:
        raise AssertionError("the MPS agent writes nothing to its Node")

    def event(self, reason: str, message: str, warning: bool) -> None:
        raise AssertionError("no events")


def test_the_agent_follows_the_node_label(nvidia_sim_root: str, mps_dir: str) -> None:
    node = FakeNode({"kubernetes.io/hostname": "gpu-1"})
    agent = MpsAgent(MpsDaemons(MpsSettings(nvidia_sim_root, mps_dir)), node, None)
    assert agent.one_pass().running == {}  # no label: exclusive, no daemon
    assert agent.ready()[0] is True
    node.labels[SHARING_MODE_LABEL] = "mps"
    on = agent.one_pass()
    assert sorted(on.running) == sorted(uuids(nvidia_sim_root, 8)) and on.failed == {}
    sim.fail(nvidia_sim_root, 7, "remove")  # a GPU leaves the bus: its daemon stops
    try:
        fewer = agent.one_pass()
        assert fewer.stopped == [uuids(nvidia_sim_root, 8)[7]] and len(fewer.running) == 7
    finally:
        sim.heal(nvidia_sim_root, 7)
    node.labels[SHARING_MODE_LABEL] = "vcuda"  # the admin changed the mode away
    off = agent.one_pass()
    assert off.running == {} and len(off.stopped) == 7
    assert all(gone(pid) for pid in on.running.values())


def test_serve_once_and_the_health_endpoints(nvidia_sim_root: str, mps_dir: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--host-root", nvidia_sim_root, "--mps-dir", mps_dir, "--sharing-mode", "mps",
                 "--once", "--active-thread-percentage", "25", "--log-dir", ""]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["mode"] == "mps" and printed["running"] == 8
    assert main(["--host-root", nvidia_sim_root, "--mps-dir", mps_dir, "--sharing-mode",
                 "exclusive", "--once", "--log-dir", ""]) == 0
    assert json.loads(capsys.readouterr().out)["running"] == 0
    assert main(["--host-root", nvidia_sim_root, "--once", "--log-dir", ""]) == 2
    assert "--node-name: required" in capsys.readouterr().err


def test_readiness_reports_failures(tmp_path: Path, mps_dir: str) -> None:
    root = tmp_path / "bare"
    root.mkdir()
    daemons = MpsDaemons(MpsSettings(str(root), mps_dir))
    agent = MpsAgent(daemons, None, "mps")
    assert agent.ready() == (False, {"reason": "no pass yet"})
    agent.one_pass()  # no GPU under this root: nothing wanted, nothing failed
    assert agent.ready()[0] is True
    agent.last = daemons.reconcile(["GPU-1"])  # no nvidia-cuda-mps-control under this root
    ok, body = agent.ready()
    assert not ok and "GPU-1" in body["failed"]


def test_health_server_answers(nvidia_sim_root: str, mps_dir: str) -> None:
    from gpuk8s.services.healthserver import serve_health

    agent = MpsAgent(MpsDaemons(MpsSettings(nvidia_sim_root, mps_dir)), None, "exclusive")
    server = serve_health(0, {"/readyz": agent.ready})
    port = server.server_address[1]
    try:
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5)
        assert err.value.code == 503
        agent.one_pass()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:
            assert json.loads(resp.read())["mode"] == "exclusive"
    finally:
        server.shutdown()


def test_stopping_quits_the_daemons_only_when_the_mode_changed_away(
        nvidia_sim_root: str, mps_dir: str) -> None:
    node = FakeNode({SHARING_MODE_LABEL: "mps"})
    agent = MpsAgent(MpsDaemons(MpsSettings(nvidia_sim_root, mps_dir)), node, None)
    running = agent.one_pass().running
    assert len(running) == 8
    assert agent.at_exit() is None  # an upgrade or restart: the daemons stay for the next pod
    assert all(not gone_now(pid) for pid in running.values())
    del node.labels[SHARING_MODE_LABEL]  # the label went away: the pod is being removed
    result = agent.at_exit()
    assert result is not None and sorted(result.stopped) == sorted(running)
    assert all(gone(pid) for pid in running.values())


def test_a_driver_too_old_for_mps_starts_nothing(nvidia_sim_root: str, mps_dir: str) -> None:
    state = sim.state(nvidia_sim_root)
    state["driver"]["cuda"] = "11.4"
    tree.save_state(nvidia_sim_root, state)
    try:
        # a fresh process, as on a node: NVML (soname libnvidia-ml.so.1) loaded by an
        # earlier test of this process from another simulated root would answer instead
        proc = subprocess.run(
            [sys.executable, "-c", "import sys; from gpuk8s.cli import main; sys.exit(main())",
             "serve", "mps", "--host-root", nvidia_sim_root,
             "--mps-dir", mps_dir, "--sharing-mode", "mps", "--once", "--log-dir", ""],
            capture_output=True, text=True, timeout=120, check=False,
        )
        assert proc.returncode == 1, proc.stderr  # --once with failures
        summary = json.loads(proc.stdout.strip().splitlines()[0])
        assert summary["running"] == 0 and len(summary["failed"]) == 8
        assert all("CUDA >= 11.5; this one supports 11.4" in why
                   for why in summary["failed"].values())
        assert not list(Path(mps_dir).glob(f"*/pipe/{PID_FILE}"))  # no daemon started
    finally:
        state["driver"]["cuda"] = "12.4"
        tree.save_state(nvidia_sim_root, state)


def gone_now(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] in ("Z", "X")


def test_under_a_mounted_host_the_daemon_finds_the_drivers_libraries(nvidia_sim_root: str,
                                                                       mps_dir: str) -> None:
    """gpu-mps reads the host at /host: the host's daemon needs libcuda.so.1 by soname (the
    real one exited 244 without it in a pod-like namespace, as the simulator's now does).
    A driver sharing its directory with the host's libc (the simulator's .run layout) is
    linked into <mps dir>/driver-lib; a driver directory of its own goes on
    LD_LIBRARY_PATH as it is (/usr/local/nvidia/lib64, as on the H100 machine)."""
    daemons = MpsDaemons(MpsSettings(nvidia_sim_root, mps_dir))
    (uuid,) = uuids(nvidia_sim_root, 1)
    result = daemons.reconcile([uuid])
    assert result.failed == {} and result.started == [uuid]
    env = environ(result.running[uuid])
    assert env["LD_LIBRARY_PATH"].split(":")[0] == f"{mps_dir}/driver-lib"
    assert env["PATH"].split(":")[0] == f"{nvidia_sim_root}/usr/bin"
    farm = Path(mps_dir, "driver-lib")
    assert os.readlink(farm / "libcuda.so.1") == (
        f"{nvidia_sim_root}/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15")
    assert not any(p.name.startswith("libc.") for p in farm.iterdir())  # the driver's only
    assert daemons.reconcile([]).stopped == [uuid]


def test_a_driver_directory_of_its_own_goes_on_the_library_path(tmp_path: Path,
                                                                mps_dir: str) -> None:
    root = str(tmp_path / "node")
    sim.create(root, "nvidia-8")
    lib = "usr/lib/x86_64-linux-gnu"
    own = Path(root, "usr/local/nvidia/lib64")
    own.mkdir(parents=True)
    for entry in sorted(Path(root, lib).iterdir()):
        if "nvidia" in entry.name or "cuda" in entry.name or "nvcuvid" in entry.name:
            shutil.move(str(entry), own / entry.name)
    daemons = MpsDaemons(MpsSettings(root, mps_dir))
    (uuid,) = uuids(root, 1)
    assert daemons.env(uuid)["LD_LIBRARY_PATH"].split(":")[0] == str(own)
    assert not Path(mps_dir, "driver-lib").exists()
    result = daemons.reconcile([uuid])
    assert result.failed == {} and result.started == [uuid]
    assert daemons.reconcile([]).stopped == [uuid]
