"""The `gpuk8s` command line, run as a real process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def gpuk8s(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuk8s.cli", *args], capture_output=True, text=True, timeout=60
    )


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("cli") / "node")
    proc = gpuk8s("sim", "create", "--preset", "c500-8", "--root", path)
    assert proc.returncode == 0, proc.stderr
    return path


def test_detect_json(root: str) -> None:
    proc = gpuk8s("detect", "--root", root, "--json")
    data = json.loads(proc.stdout)
    assert data["backend"] == "metax"
    assert len(data["gpus"]) == 8
    assert data["gpus"][0]["device_id"] == "0x4001"


def test_detect_yaml(root: str) -> None:
    import yaml

    data = yaml.safe_load(gpuk8s("detect", "--root", root, "--yaml").stdout)
    assert data["driver"]["version"]


def test_topo_matrix(root: str) -> None:
    out = gpuk8s("topo", "--root", root).stdout
    rows = [line.split() for line in out.splitlines() if line.startswith("GPU")]
    assert rows[0][:9] == ["GPU0", "X", "MX", "MX", "MX", "SYS", "SYS", "SYS", "SYS"]


def test_allocate_spec_example(root: str) -> None:
    proc = gpuk8s("allocate", "--root", root, "--size", "2", "--available", "2,3,4,5,6,7", "--json")
    data = json.loads(proc.stdout)
    detect = json.loads(gpuk8s("detect", "--root", root, "--json").stdout)
    addresses = [g["pci_address"] for g in detect["gpus"]]
    assert data["devices"] == addresses[2:4]
    assert "MetaXLink" in data["explain"]


def test_allocate_errors_are_clear(root: str) -> None:
    proc = gpuk8s("allocate", "--root", root, "--size", "9")
    assert proc.returncode == 2
    assert "only 8 available" in proc.stderr
    proc = gpuk8s("allocate", "--root", root, "--size", "1", "--available", "99")
    assert proc.returncode == 2 and "unknown device '99'" in proc.stderr


def test_labels_json(root: str) -> None:
    labels = json.loads(gpuk8s("labels", "--root", root, "--json").stdout)
    assert labels["metax-tech.com/gpu.product"] == "C500"


def test_sim_fail_is_visible_to_detect(tmp_path: Path) -> None:
    path = str(tmp_path / "n")
    assert gpuk8s("sim", "create", "--preset", "n260-2", "--root", path).returncode == 0
    assert gpuk8s("sim", "fail", "--root", path, "--gpu", "1", "--mode", "remove").returncode == 0
    data = json.loads(gpuk8s("detect", "--root", path, "--json").stdout)
    assert [g["index"] for g in data["gpus"]] == [0]
