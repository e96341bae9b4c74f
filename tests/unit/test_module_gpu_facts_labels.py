"""gpu_facts and gpu_labels through the AnsibleModule harness on simulator roots."""

from __future__ import annotations

import os
import sys

import pytest

from gpuk8s import sim
from gpuk8s.ansible.harness import run_module


@pytest.fixture(autouse=True)
def fast_fake_tools(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the simulator's `#!/usr/bin/env python3` tools with this interpreter."""
    monkeypatch.setenv("PATH", f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}")


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    base = tmp_path_factory.mktemp("sim")
    out = {}
    for preset in ("c500-8", "nogpu", "nodriver-8"):
        sim.create(str(base / preset), preset)
        out[preset] = str(base / preset)
    return out


def test_facts_of_an_eight_gpu_node(roots: dict[str, str]) -> None:
    result = run_module("gpu_facts", {"host_root": roots["c500-8"]}, check_mode=True)
    assert not result["changed"]
    facts = result["ansible_facts"]["gpuk8s"]
    assert facts["backend"] == "metax" and facts["gpu_count"] == 8
    assert facts["inventory"]["driver"] == {"loaded": True, "version": "2.32.0.6",
                                            "mode": "native", "cuda": None}
    assert facts["labels"]["metax-tech.com/gpu.product"] == "C500"
    assert facts["labels"]["metax-tech.com/gpu.installed"] == "true"
    assert sorted(facts["topology"]["link_groups"].values()) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert facts["topology"]["matrix"].splitlines()[1].split()[:3] == ["GPU0", "X", "MX"]
    assert facts["problems"] == []


def test_facts_without_gpu_or_driver(roots: dict[str, str]) -> None:
    facts = run_module("gpu_facts", {"host_root": roots["nogpu"]})["ansible_facts"]["gpuk8s"]
    assert facts["gpu_count"] == 0
    assert facts["labels"] == {"metax-tech.com/gpu.installed": "false"}
    assert facts["topology"]["matrix"] is None
    facts = run_module("gpu_facts", {"host_root": roots["nodriver-8"],
                                     "topology": False})["ansible_facts"]["gpuk8s"]
    assert facts["labels"]["metax-tech.com/driver.ready"] == "false"
    assert any("not loaded" in p for p in facts["problems"])


def test_labels_patch_against_current_labels(roots: dict[str, str]) -> None:
    current = {
        "kubernetes.io/hostname": "node1",
        "metax-tech.com/gpu.product": "C550",
        "metax-tech.com/stale": "x",
    }
    result = run_module("gpu_labels", {"host_root": roots["c500-8"], "current_labels": current,
                                       "readiness": {"maca.ready": True}}, diff=True)
    assert not result["changed"] and result["needs_update"]
    assert result["patch"]["metax-tech.com/gpu.product"] == "C500"
    assert result["patch"]["metax-tech.com/stale"] is None
    assert "kubernetes.io/hostname" not in result["patch"]
    assert result["labels"]["metax-tech.com/maca.ready"] == "true"
    assert "metax-tech.com/gpu.product=C550" in result["diff"]["before"]
    settled = run_module("gpu_labels", {"host_root": roots["c500-8"],
                                        "current_labels": result["labels"],
                                        "readiness": {"maca.ready": True}})
    assert settled["patch"] == {} and not settled["needs_update"]


def test_labels_driver_mode_and_bad_readiness(roots: dict[str, str]) -> None:
    cloud = run_module("gpu_labels", {"host_root": roots["c500-8"], "driver_mode": "cloud"})
    assert cloud["labels"]["metax-tech.com/gpu.driver.mode"] == "cloud"
    bad = run_module("gpu_labels", {"host_root": roots["c500-8"],
                                    "readiness": {"gpu.ready": True}})
    assert bad["failed"] and "maca.ready, runtime.ready" in bad["msg"]
