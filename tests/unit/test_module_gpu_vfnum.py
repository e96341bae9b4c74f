"""gpu_vfnum: pure planning, and the module on simulator roots."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuk8s import sim
from gpuk8s.ansible.harness import run_module
from gpuk8s.core.errors import ConfigError
from gpuk8s.core.labels import compute_labels
from gpuk8s.discovery import discover
from gpuk8s.discovery.sysfs import read_numvfs
from gpuk8s.host import vf


@pytest.fixture(autouse=True)
def fast_fake_tools(monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulator's fake mx-smi starts with `#!/usr/bin/env python3`: find this
    interpreter first rather than a slow pyenv shim."""
    monkeypatch.setenv("PATH", f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}")


def sim_root(tmp_path: Path, preset: str, vfnum: int | None = None) -> Path:
    root = tmp_path / f"{preset}-{len(list(tmp_path.iterdir()))}"
    sim.create(str(root), preset, vfnum=vfnum)
    return root


def numvfs(root: Path) -> dict[str, int | None]:
    gpus = discover(str(root)).gpus
    return {g.pci_address: read_numvfs(str(root), g.pci_address) for g in gpus}


def run(root: Path, check: bool = False, **args: Any) -> dict[str, Any]:
    return run_module("gpu_vfnum", {"host_root": str(root), **args}, check_mode=check, diff=True)


def test_plan_writes_zero_before_a_new_count(tmp_path: Path) -> None:
    inventory = discover(str(sim_root(tmp_path, "c500-8-vf4", 4)))
    plan = vf.plan(inventory, 2, ["0"])
    address = inventory.gpu(0).pci_address
    assert [(s.address, s.value) for s in plan.steps] == [(address, 0), (address, 2)]
    assert vf.plan(inventory, 4).steps == ()
    off = vf.plan(inventory, 0, [address])
    assert [s.value for s in off.steps] == [0]


def test_plan_from_zero_writes_once(tmp_path: Path) -> None:
    inventory = discover(str(sim_root(tmp_path, "c500-8")))
    plan = vf.plan(inventory, 8)
    assert len(plan.steps) == 8 and {s.value for s in plan.steps} == {8}


@pytest.mark.parametrize("value", [3, 5, 16, -1])
def test_values_outside_the_allowed_set(tmp_path: Path, value: int) -> None:
    inventory = discover(str(sim_root(tmp_path, "c500-8")))
    with pytest.raises(ConfigError, match="0, 1, 2, 4, 8"):
        vf.plan(inventory, value)


def test_value_above_totalvfs_or_no_sriov(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no SR-IOV"):
        vf.plan(discover(str(sim_root(tmp_path, "n260-2"))), 2)
    assert vf.plan(discover(str(sim_root(tmp_path, "n260-2"))), 0).steps == ()
    with pytest.raises(ConfigError, match="not a GPU index or PCI address"):
        vf.plan(discover(str(sim_root(tmp_path, "c500-8"))), 2, ["9"])
    with pytest.raises(ConfigError, match="no vendor GPU"):
        vf.plan(discover(str(sim_root(tmp_path, "nogpu"))), 0)


def test_module_four_steps_and_labels_follow(tmp_path: Path) -> None:
    root = sim_root(tmp_path, "c500-8")
    original = numvfs(root)
    assert set(original.values()) == {0}
    check = run(root, check=True, vfnum=4)
    assert check["changed"] and numvfs(root) == original
    assert check["after"] == {a: 4 for a in original}
    applied = run(root, vfnum=4)
    assert applied["changed"], applied
    assert set(numvfs(root).values()) == {4}
    assert applied["after"] == {a: 4 for a in original}
    assert compute_labels(discover(str(root)))["metax-tech.com/gpu.vfnum"] == "4"
    assert not run(root, check=True, vfnum=4)["changed"]
    again = run(root, vfnum=4)
    assert not again["changed"] and again["writes"] == []
    change = run(root, vfnum=2, gpus=["1"])
    address = discover(str(root)).gpu(1).pci_address
    assert change["writes"] == [{"address": address, "value": 0},
                                {"address": address, "value": 2}]
    assert numvfs(root)[address] == 2
    assert "sriov_numvfs=2" in change["diff"]["after"]


def test_module_refuses_bad_values_and_writes_nothing(tmp_path: Path) -> None:
    root = sim_root(tmp_path, "c500-8")
    original = numvfs(root)
    result = run(root, vfnum=3)
    assert result["failed"] and "vfnum 3" in result["msg"]
    assert numvfs(root) == original
    result = run(root, vfnum=8, gpus=["0"], command=["false"])
    assert result["failed"] and "exited with 1" in result["msg"]


def test_module_through_a_command(tmp_path: Path) -> None:
    root = sim_root(tmp_path, "c500-8")
    address = discover(str(root)).gpu(0).pci_address
    # a stand-in for `mx-smi vm --enable-vf`: writes the sysfs attribute itself
    command = ["sh", "-c", 'echo "$2" > "$1/sys/bus/pci/devices/$3/sriov_numvfs"', "vf",
               "{host_root}", "{vfnum}", "{address}"]
    result = run(root, vfnum=2, gpus=[address], command=command)
    assert result["changed"] and numvfs(root)[address] == 2
