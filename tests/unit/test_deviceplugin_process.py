"""`gpuk8s serve device-plugin` as a real process: flags, registration, metrics, SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuk8s import sim
from gpuk8s.services.deviceplugin.server import wait_until

from .kubelet_harness import FakeKubelet


@pytest.fixture(scope="module")
def sim_root(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = str(tmp_path_factory.mktemp("sim") / "c500")
    sim.create(root, "c500-8")
    return root


@pytest.fixture
def plugin_dir() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="dpp-") as path:
        yield path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def env() -> dict[str, str]:
    out = dict(os.environ)
    out["PATH"] = f"{os.path.dirname(sys.executable)}:{out.get('PATH', '')}"
    out.pop("NODE_NAME", None)
    return out


def serve(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "gpuk8s.cli", "serve", "device-plugin", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
    )


def test_sigterm_shuts_down_cleanly(sim_root: str, plugin_dir: str, tmp_path: Path) -> None:
    kubelet = FakeKubelet(plugin_dir).start()
    port = free_port()
    log_dir = tmp_path / "logs"
    proc = serve(
        "--host-root", sim_root,
        "--plugin-dir", plugin_dir,
        "--healthy-interval", "1",
        "--watch-interval", "0.1",
        "--metrics-port", str(port),
        "--metrics-address", "127.0.0.1",
        "--log-dir", str(log_dir),
        "--log-format", "json",
    )  # fmt: skip
    try:
        [reg] = kubelet.wait_registrations(1, timeout=60)
        assert reg.endpoint_answered and reg.resource_name == "metax-tech.com/gpu"
        watch = kubelet.latest_watch(timeout=30)
        assert len(watch.updates[0]) == 8
        sock = os.path.join(plugin_dir, reg.endpoint)
        assert os.path.exists(sock)

        def metrics() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                return str(r.read().decode())

        assert wait_until(
            lambda: (
                "gpuk8s_deviceplugin_last_health_check_timestamp_seconds{" in metrics()
                and 'health="Healthy",resource="metax-tech.com/gpu"} 8.0' in metrics()
            ),
            30,
            step=0.2,
        )
        assert 'gpuk8s_deviceplugin_registrations_total{resource="metax-tech.com/gpu"} 1.0' in (
            metrics()
        )

        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=30)
        took = time.monotonic() - started
        assert rc == 0, proc.stderr.read() if proc.stderr else ""
        assert not os.path.exists(sock), "the plugin must remove its socket"
        assert kubelet.wait(lambda: watch.ended, 10), "ListAndWatch must end on shutdown"
        # structured logs: every stderr line is a JSON object, and the file has them too
        lines = [ln for ln in (proc.stderr.read() if proc.stderr else "").splitlines() if ln]
        records = [json.loads(ln) for ln in lines if ln.startswith("{")]
        assert records and len(records) == len(
            [ln for ln in lines if not ln.startswith(("I1", "W1", "E1"))]  # grpc core chatter
        )
        msgs = [r["msg"] for r in records]
        assert "registered with the kubelet" in msgs
        assert "signal received, shutting down" in msgs and msgs[-1] == "stopped"
        assert (
            next(r for r in records if r["msg"] == "signal received, shutting down")["signal"]
            == "SIGTERM"
        )
        file_lines = (log_dir / "gpu-device.log").read_text().splitlines()
        assert json.loads(file_lines[-1])["msg"] == "stopped"
        assert took < 30
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        kubelet.stop()


def test_waits_for_a_kubelet_that_is_not_there_yet(
    sim_root: str, plugin_dir: str, tmp_path: Path
) -> None:
    log_file = tmp_path / "gpu-device.log"
    proc = serve(
        "--host-root", sim_root, "--plugin-dir", plugin_dir, "--healthy-interval", "0",
        "--watch-interval", "0.1", "--log-format", "text", "--log-dir", str(tmp_path),
    )  # fmt: skip
    kubelet = FakeKubelet(plugin_dir)
    try:
        # the plugin retries with back-off while there is no kubelet
        assert wait_until(
            lambda: log_file.exists() and "serve/register failed, retrying" in log_file.read_text(),
            60,
            step=0.1,
        )
        assert proc.poll() is None
        kubelet.start()
        kubelet.wait_registrations(1, timeout=60)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        text = log_file.read_text()
        assert " WARNING gpuk8s.deviceplugin.server: serve/register failed, retrying" in text
        assert text.index("retrying") < text.index("registered with the kubelet")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        kubelet.stop()


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--healthy-interval", "-2"], "healthy-interval"),
        (["--log-level", "loud"], "log.level"),
        (["--log-max-age", "3m"], "log.maxAge"),
        (["--resource-name", "gpu"], "resource-name"),
        (["--device-path-prefix", "rel"], "device-path-prefix"),
    ],
)
def test_bad_flags_exit_2_naming_the_field(args: list[str], field: str, plugin_dir: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gpuk8s.cli", "serve", "device-plugin",
         "--plugin-dir", plugin_dir, *args],
        capture_output=True,
        text=True,
        env=env(),
        timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert field in proc.stderr
    assert os.listdir(plugin_dir) == [], "a refused start must change nothing"
