"""check_health sees every simulator fault mode, and heal brings GPUs back."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from gpuk8s import sim
from gpuk8s.discovery import check_health, discover


@pytest.fixture(autouse=True)
def _fast_python3(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}")


@pytest.fixture
def c500(tmp_path: Path) -> str:
    root = str(tmp_path / "node")
    sim.create(root, "c500-8")
    return root


def test_all_healthy(c500: str) -> None:
    inv = discover(c500)
    assert check_health(c500, inv) == dict.fromkeys(range(8))


def test_fault_unbind_remove_then_heal(c500: str) -> None:
    inv = discover(c500)
    sim.fail(c500, 1, "fault", reason="XCORE hang (ras: 0x1f)")
    sim.fail(c500, 2, "unbind")
    sim.fail(c500, 6, "remove")
    health = check_health(c500, inv)
    assert health[1] == "XCORE hang (ras: 0x1f)"
    assert health[2] == "PCI device 0000:05:00.0 is not bound to any driver, not metax"
    assert health[6] == "PCI device 0000:85:00.0 is gone from the bus"
    assert [health[i] for i in (0, 3, 4, 5, 7)] == [None] * 5
    # removal is a hot-unplug: the bus entry and the device directory are gone
    assert not os.path.lexists(os.path.join(c500, "sys/bus/pci/devices/0000:85:00.0"))
    assert len(discover(c500).gpus) == 7

    sim.heal(c500, 2)
    health = check_health(c500, inv)
    assert health[2] is None and health[1] is not None and health[6] is not None
    sim.heal(c500)
    assert check_health(c500, inv) == dict.fromkeys(range(8))
    assert discover(c500) == inv


def test_default_fault_reason(c500: str) -> None:
    inv = discover(c500)
    sim.fail(c500, 0)
    reason = check_health(c500, inv)[0]
    assert reason is not None and "uncorrectable ECC" in reason
    assert discover(c500).gpus[0].fault == reason


def test_health_when_mx_smi_broken(c500: str) -> None:
    inv = discover(c500)
    sim.fail(c500, 3, "unbind")

    def failing(argv: list[str]) -> tuple[int, str, str]:
        return 1, "", "mxsml init failed"

    # a broken tool is not held against the GPUs; sysfs checks still apply
    health = check_health(c500, inv, runner=failing)
    assert health[3] is not None and "not bound" in health[3]
    assert [health[i] for i in (0, 1, 2, 4, 5, 6, 7)] == [None] * 7


def test_gpu_missing_from_mx_smi_output(c500: str) -> None:
    inv = discover(c500)
    text = Path(c500, "opt/mxdriver/bin/mx-smi")
    assert text.exists()

    def partial(argv: list[str]) -> tuple[int, str, str]:
        return 0, (
            "=================== MetaX System Management Interface Log ===================\n"
            "GPU#0  MXC500  0000:03:00.0\n"
            "    Availability\n"
            "        Unavailable Reason                        : N/A\n"
        ), ""

    health = check_health(c500, inv, runner=partial)
    assert health[0] is None
    assert health[1] == "0000:04:00.0 is not reported by the vendor tool"


def test_vf_node_fault(tmp_path: Path) -> None:
    root = str(tmp_path / "vf")
    sim.create(root, "c500-8-vf4")
    inv = discover(root)
    sim.fail(root, 4, "remove")
    assert not os.path.lexists(os.path.join(root, "sys/bus/pci/devices/0000:83:00.1"))
    assert check_health(root, inv)[4] == "PCI device 0000:83:00.0 is gone from the bus"
    sim.heal(root, 4)
    assert check_health(root, inv)[4] is None
    assert discover(root) == inv


def test_nodriver_all_unbound(tmp_path: Path) -> None:
    root = str(tmp_path / "nd")
    sim.create(root, "nodriver-8")
    inv = discover(root)
    health = check_health(root, inv)
    assert len(health) == 8
    assert all(r is not None and "not bound to any driver" in r for r in health.values())


def test_nogpu_health_is_empty(tmp_path: Path) -> None:
    root = str(tmp_path / "ng")
    sim.create(root, "nogpu")
    assert check_health(root, discover(root)) == {}


def test_nvidia_fault_unbind_remove(tmp_path: Path) -> None:
    root = str(tmp_path / "nv")
    sim.create(root, "nvidia-8")
    inv = discover(root)
    assert check_health(root, inv) == dict.fromkeys(range(8))
    sim.fail(root, 0, "fault", reason="GPU is lost")
    sim.fail(root, 3, "unbind")
    sim.fail(root, 7, "remove")
    health = check_health(root, inv)
    assert health[0] == "nvidia-smi: GPU is lost"
    assert health[3] is not None and "not bound" in health[3]
    assert health[7] == "PCI device 0000:86:00.0 is gone from the bus"
    assert [health[i] for i in (1, 2, 4, 5, 6)] == [None] * 5
    # discovery still works while nvidia-smi exits non-zero for the lost GPU
    again = discover(root)
    assert len(again.gpus) == 7 and again.gpus[0].fault == "GPU is lost"
    sim.heal(root)
    assert check_health(root, inv) == dict.fromkeys(range(8))
