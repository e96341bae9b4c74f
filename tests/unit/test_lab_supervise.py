"""lab/supervise and lab/lib.sh's start_daemon give their daemon every signal at its default,
as systemd starts a service, whatever the shell that started the lab ignored.

Issue 28 item 0: on a fresh machine whose first `lab/up` ran with SIGHUP ignored (nohup, a
job runner), containerd inherited the ignored SIGHUP through lab/supervise (bash cannot
un-ignore it), so the SIGHUP container-runtime sends after editing containerd's config did
nothing: containerd was never restarted and kept serving its old config.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SUPERVISE = REPO / "lab" / "supervise"


def _ignore_sighup() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # what nohup does


def sig_ignored(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return int(line.split()[1], 16)
    raise AssertionError(f"no SigIgn for {pid}")


def children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def wait_for(what: str, check, timeout: float = 20.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout}s"
        time.sleep(0.05)
    return value


def with_lib(tmp_path: Path, script: str) -> str:
    """``script`` after lab/lib.sh, its daemons' pid files and logs under ``tmp_path``."""
    return f'. "{REPO}/lab/lib.sh"; RUN_DIR="{tmp_path}/run"; LOG_DIR="{tmp_path}/log"; ' + script


@pytest.fixture
def supervised() -> Iterator[subprocess.Popen[bytes]]:
    """lab/supervise running `sleep`, started from a parent that ignores SIGHUP."""
    proc = subprocess.Popen([str(SUPERVISE), "sleep", "300"], preexec_fn=_ignore_sighup,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_supervised_daemon_has_every_signal_at_default_and_restarts_on_sighup(
    supervised: subprocess.Popen[bytes],
) -> None:
    first = wait_for("the daemon", lambda: [
        c for c in children(supervised.pid) if Path(f"/proc/{c}/exe").resolve().name == "sleep"])
    [daemon] = first
    assert sig_ignored(daemon) == 0  # nothing ignored: not SIGHUP, not SIGINT/SIGQUIT of `&`
    os.kill(daemon, signal.SIGHUP)  # what container-runtime does to containerd
    new = wait_for("a restarted daemon", lambda: [
        c for c in children(supervised.pid)
        if c != daemon and Path(f"/proc/{c}/exe").resolve().name == "sleep"])
    assert new and daemon not in children(supervised.pid)


def test_start_daemon_resets_ignored_signals(tmp_path: Path) -> None:
    env = {**os.environ, "GPUK8S_LAB_STATE": str(tmp_path / "state")}
    script = with_lib(tmp_path, "start_daemon probe sleep 300")
    subprocess.run(["bash", "-c", script], env=env, preexec_fn=_ignore_sighup, check=True,
                   capture_output=True)
    pid = int((tmp_path / "run/probe.pid").read_text())
    try:
        wait_for("the daemon", lambda: Path(f"/proc/{pid}/exe").resolve().name == "sleep")
        assert sig_ignored(pid) == 0
    finally:
        os.kill(pid, signal.SIGTERM)


def test_start_daemon_restarts_a_daemon_whose_command_or_inputs_changed(tmp_path: Path) -> None:
    """lab/up run again on a running lab applies what it changed (new feature gates, an edited
    kubelet config) and leaves everything else running."""
    env = {**os.environ, "GPUK8S_LAB_STATE": str(tmp_path / "state")}
    config = tmp_path / "config.yaml"
    config.write_text("a: 1\n")

    def start(*argv: str) -> int:
        script = with_lib(tmp_path, f'DAEMON_INPUTS="{config}" start_daemon probe {" ".join(argv)}')
        subprocess.run(["bash", "-c", script], env=env, check=True, capture_output=True)
        return int((tmp_path / "run/probe.pid").read_text())

    pids: list[int] = []
    try:
        pids.append(start("sleep", "300"))
        assert start("sleep", "300") == pids[0], "same command and inputs: left alone"
        pids.append(start("sleep", "301"))
        assert pids[1] != pids[0] and not Path(f"/proc/{pids[0]}").exists()
        config.write_text("a: 2\n")
        pids.append(start("sleep", "301"))
        assert pids[2] != pids[1] and not Path(f"/proc/{pids[1]}").exists()
        assert start("sleep", "301") == pids[2]
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)


@pytest.mark.parametrize(("recorded", "generation"), [
    (["/work/x/lab/supervise", "/usr/bin/containerd", "--config", "c.toml"], "1.6"),
    (["env", "PATH=/var/cache/gpuk8s/bin/containerd-v2.4.2:/usr/bin",
      "/work/x/lab/supervise", "/var/cache/gpuk8s/bin/containerd-v2.4.2/containerd",
      "--config", "c.toml"], "2"),
    (None, "1.6"),  # nothing recorded: a fresh lab gets Debian's
])
def test_the_running_containerd_generation_is_read_from_the_recorded_command(
    tmp_path: Path, recorded: list[str] | None, generation: str
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    if recorded is not None:
        (run / "containerd.cmd").write_bytes(b"".join(p.encode() + b"\0" for p in recorded))
    script = (f'. "{REPO}/lab/lib.sh"; CACHE=/var/cache/gpuk8s; RUN_DIR="{run}"; '
              "containerd_generation")
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == generation


def test_lab_up_refuses_an_unknown_containerd_generation() -> None:
    done = subprocess.run([str(REPO / "lab/up"), "--containerd", "3"], capture_output=True,
                          text=True, check=False)
    assert done.returncode != 0
    assert "--containerd 3: choose 1.6" in done.stderr


def test_drop_chains_removes_matching_chains_and_their_jumps() -> None:
    """lab/lib.sh's drop_chains (lab/down: CNI-* and KUBE-*; a containerd switch: CNI-*)."""
    chain, other = f"GPUK8STEST-{os.getpid()}", f"GPUK8SKEEP-{os.getpid()}"
    rules = [["-N", chain], ["-N", other], ["-A", other, "-j", chain]]
    for rule in rules:
        subprocess.run(["iptables", "-t", "filter", *rule], check=True)
    try:
        subprocess.run(["bash", "-c", f'. "{REPO}/lab/lib.sh"; drop_chains "^GPUK8STEST-"'],
                       check=True)
        listed = subprocess.run(["iptables", "-t", "filter", "-S"], capture_output=True,
                                text=True, check=True).stdout
        assert f"-N {chain}" not in listed and f"-j {chain}" not in listed
        assert f"-N {other}" in listed  # only what matches
    finally:
        subprocess.run(["iptables", "-t", "filter", "-F", other], check=False)
        subprocess.run(["iptables", "-t", "filter", "-X", other], check=False)
        subprocess.run(["iptables", "-t", "filter", "-X", chain], check=False,
                       capture_output=True)


def test_a_stale_pid_file_naming_another_live_process_is_not_the_daemon(tmp_path: Path) -> None:
    """CI, stop 46: the lab's state came from another machine, and etcd's pid file named a pid
    that was alive there as something else; lab/up took it for etcd and timed out waiting for
    it. start_daemon records when its daemon started, so a reused pid is not taken for it:
    lab/up starts the daemon, and stopping it leaves the other process alone."""
    env = {**os.environ, "GPUK8S_LAB_STATE": str(tmp_path / "state")}

    def lab(script: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-c", with_lib(tmp_path, script)], env=env,
                              capture_output=True, text=True, check=False)

    other = subprocess.Popen(["sleep", "300"])
    started: list[int] = []
    try:
        assert lab("start_daemon probe sleep 301").returncode == 0
        started.append(int((tmp_path / "run/probe.pid").read_text()))
        assert lab("daemon_pid probe").stdout.strip() == str(started[0])
        # the state as another machine has it: the pid file names a live stranger
        (tmp_path / "run/probe.pid").write_text(f"{other.pid}\n")
        assert lab("daemon_running probe").returncode != 0
        out = lab("start_daemon probe sleep 301")
        assert out.returncode == 0 and "started probe" in out.stderr, out.stderr
        started.append(int((tmp_path / "run/probe.pid").read_text()))
        assert started[1] not in (other.pid, started[0])
        (tmp_path / "run/probe.pid").write_text(f"{other.pid}\n")
        assert lab("stop_daemon probe").returncode == 0
        assert other.poll() is None, "stop_daemon killed a process it did not start"
        assert not (tmp_path / "run/probe.pid").exists()
        # A pid file written before .start was recorded: the process must run the recorded
        # command (`sleep 301`; the stranger runs `sleep 300`).
        (tmp_path / "run/probe.start").unlink(missing_ok=True)
        (tmp_path / "run/probe.pid").write_text(f"{started[1]}\n")
        assert lab("daemon_pid probe").stdout.strip() == str(started[1])
        (tmp_path / "run/probe.pid").write_text(f"{other.pid}\n")
        assert lab("daemon_running probe").returncode != 0
    finally:
        other.terminate()
        other.wait(timeout=30)
        for pid in started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
