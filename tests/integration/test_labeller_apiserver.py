"""gpu-label against a real kube-apiserver (RBAC on): the labeller's user may only get
and patch nodes, exactly what the chart grants. Hosts are simulated (sim presets)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpuk8s import sim
from gpuk8s.core.labels import PREFIX
from gpuk8s.services.kube import PermanentApiError, TemporaryApiError, api_client
from gpuk8s.services.labeller.main import main
from gpuk8s.services.labeller.reconcile import KubeNodeLabelStore

pytestmark = [
    pytest.mark.integration,
    # the test apiserver's certificate is self-signed (kubeconfig: insecure-skip-tls-verify)
    pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning"),
]

OTHER = {"kubernetes.io/hostname": "gpu", "example.com/team": "ml"}


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.fixture(autouse=True)
def _fast_python3(monkeypatch: pytest.MonkeyPatch) -> None:
    # the simulator's fake vendor tools run with this interpreter
    monkeypatch.setenv("PATH", f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}")


@pytest.fixture
def node_name(apiserver: Any) -> str:
    name = f"gpu-{uuid.uuid4().hex[:8]}"
    apiserver.core().create_node(
        {
            "metadata": {
                "name": name,
                "labels": {**OTHER, f"{PREFIX}gpu.product": "C550", f"{PREFIX}retired.label": "x"},
            }
        }
    )
    return name


def labels_of(apiserver: Any, node: str) -> tuple[dict[str, str], str]:
    obj = apiserver.core().read_node(node)
    return dict(obj.metadata.labels or {}), str(obj.metadata.resource_version)


def ours(labels: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in labels.items() if k.startswith(PREFIX)}


def test_once_with_only_get_and_patch_on_nodes(
    apiserver: Any, node_name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = str(tmp_path / "root")
    sim.create(root, "c500-8")
    argv = [
        "--node-name",
        node_name,
        "--host-root",
        root,
        "--kubeconfig",
        apiserver.kubeconfig("gpu-label"),
        "--log-level",
        "error",
    ]

    _, version = labels_of(apiserver, node_name)
    assert main([*argv, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"~ {PREFIX}gpu.product: C550 -> C500" in out and f"- {PREFIX}retired.label" in out
    assert labels_of(apiserver, node_name)[1] == version  # dry run wrote nothing

    assert main([*argv, "--once"]) == 0
    labels, version = labels_of(apiserver, node_name)
    assert {k: labels[k] for k in OTHER} == OTHER
    assert labels[f"{PREFIX}gpu.product"] == "C500"
    assert labels[f"{PREFIX}gpu.installed"] == "true"
    assert f"{PREFIX}retired.label" not in labels

    capsys.readouterr()
    assert main([*argv, "--once"]) == 0
    assert "labels up to date" in capsys.readouterr().out
    assert labels_of(apiserver, node_name)[1] == version  # nothing sent the second time


def test_operator_readiness_and_nogpu(apiserver: Any, node_name: str, tmp_path: Path) -> None:
    root = tmp_path / "root"
    sim.create(str(root), "c500-8")
    (root / "run/metax").mkdir(parents=True)
    (root / "run/metax/maca.ready").write_text("true\n")
    argv = [
        "--once",
        "--node-name",
        node_name,
        "--kubeconfig",
        apiserver.kubeconfig("gpu-label"),
        "--log-level",
        "error",
    ]
    assert main([*argv, "--host-root", str(root)]) == 0
    labels = labels_of(apiserver, node_name)[0]
    assert labels[f"{PREFIX}maca.ready"] == "true" and f"{PREFIX}runtime.ready" not in labels

    nogpu = tmp_path / "nogpu"
    sim.create(str(nogpu), "nogpu")
    assert main([*argv, "--host-root", str(nogpu)]) == 0
    labels = labels_of(apiserver, node_name)[0]
    assert ours(labels) == {f"{PREFIX}gpu.installed": "false"}
    assert {k: labels[k] for k in OTHER} == OTHER


def test_forbidden_and_missing_node_exit_1(
    apiserver: Any, node_name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = str(tmp_path / "root")
    sim.create(root, "n260-2")
    base = ["--once", "--host-root", root, "--log-level", "error"]
    assert (
        main([*base, "--node-name", node_name, "--kubeconfig", apiserver.kubeconfig("nobody")]) == 1
    )
    assert "HTTP 403" in capsys.readouterr().err
    assert (
        main(
            [
                *base,
                "--node-name",
                "no-such-node",
                "--kubeconfig",
                apiserver.kubeconfig("gpu-label"),
            ]
        )
        == 1
    )
    assert "does not exist" in capsys.readouterr().err


def test_stale_resource_version_is_a_temporary_conflict(apiserver: Any, node_name: str) -> None:
    store = KubeNodeLabelStore(api_client(apiserver.kubeconfig("gpu-label")))
    _, version = store.read(node_name)
    store.patch(node_name, {f"{PREFIX}gpu.vfnum": "0"}, version)
    with pytest.raises(TemporaryApiError) as err:
        store.patch(node_name, {f"{PREFIX}gpu.vfnum": "4"}, version)  # stale now
    assert err.value.status == 409
    assert labels_of(apiserver, node_name)[0][f"{PREFIX}gpu.vfnum"] == "0"
    with pytest.raises(PermanentApiError):
        KubeNodeLabelStore(api_client(apiserver.kubeconfig("gpu-label"))).patch(
            node_name, {"NOT a valid key!": "x"}, None
        )


def test_daemon_rechecks_on_sighup_and_follows_a_gpu_fault(
    apiserver: Any, node_name: str, tmp_path: Path
) -> None:
    """The real command in its own process: periodic pass, SIGHUP, SIGTERM."""
    root = str(tmp_path / "root")
    sim.create(root, "c500-8")
    env = {**os.environ, "NODE_NAME": node_name}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpuk8s.cli",
            "serve",
            "labeller",
            "--host-root",
            root,
            "--kubeconfig",
            apiserver.kubeconfig("gpu-label"),
            "--interval",
            "3600",
            "--log-format",
            "text",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(
            lambda: labels_of(apiserver, node_name)[0].get(f"{PREFIX}gpu.product") == "C500",
            60,
            "the first pass",
        )
        assert labels_of(apiserver, node_name)[0][f"{PREFIX}driver.ready"] == "true"
        sim.fail(root, 3, mode="unbind")  # the GPU loses its driver binding
        proc.send_signal(signal.SIGHUP)
        wait_for(
            lambda: labels_of(apiserver, node_name)[0].get(f"{PREFIX}driver.ready") == "false",
            60,
            "driver.ready=false after SIGHUP",
        )
        sim.heal(root, 3)
        proc.send_signal(signal.SIGHUP)
        wait_for(
            lambda: labels_of(apiserver, node_name)[0].get(f"{PREFIX}driver.ready") == "true",
            60,
            "driver.ready=true after healing",
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        output = proc.stdout.read().decode() if proc.stdout else ""
    assert "labeller started" in output and "labeller stopped" in output
    assert "Traceback" not in output
