"""Discovery against every simulator preset, hand-built sysfs trees and broken hosts."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuk8s import sim
from gpuk8s.core.model import Gpu, NodeInventory, SriovState
from gpuk8s.discovery import discover, link_groups, metax, nvidia
from gpuk8s.discovery.tools import default_runner, run_tool, runner_for

MXSMI = "opt/mxdriver/bin/mx-smi"


@pytest.fixture(autouse=True)
def _fast_python3(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake tools are ``#!/usr/bin/env python3`` scripts: resolve python3 to this
    interpreter's directory first (skips slow shims such as pyenv's)."""
    monkeypatch.setenv("PATH", f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}")


def make(tmp_path: Path, preset: str, **kwargs: object) -> str:
    root = str(tmp_path / preset)
    sim.create(root, preset, **kwargs)  # type: ignore[arg-type]
    return root


def switches(inv: NodeInventory) -> list[str | None]:
    return [g.pcie_switch for g in inv.gpus]


# --------------------------------------------------------------------------- presets


def test_c500_8(tmp_path: Path) -> None:
    inv = discover(make(tmp_path, "c500-8"))
    assert inv.backend == "metax"
    assert inv.problems == ()
    assert len(inv.gpus) == 8
    assert {g.product for g in inv.gpus} == {"C500"}
    assert {g.family for g in inv.gpus} == {"MXC"}
    assert {g.device_id for g in inv.gpus} == {0x4001}
    assert [g.pci_address for g in inv.gpus] == [
        "0000:03:00.0", "0000:04:00.0", "0000:05:00.0", "0000:06:00.0",
        "0000:83:00.0", "0000:84:00.0", "0000:85:00.0", "0000:86:00.0",
    ]
    assert switches(inv) == ["0000:01:00.0"] * 4 + ["0000:81:00.0"] * 4
    assert [g.numa_node for g in inv.gpus] == [0] * 4 + [1] * 4
    assert [g.link_group for g in inv.gpus] == [0] * 4 + [1] * 4
    expected_links = {frozenset((a, b)) for grp in (range(4), range(4, 8))
                      for a in grp for b in grp if a < b}
    assert inv.links == expected_links
    assert {g.memory_mib for g in inv.gpus} == {65536}
    assert {g.memory_label for g in inv.gpus} == {"64GB"}
    assert [g.device_nodes for g in inv.gpus] == [
        (f"/dev/dri/card{i + 1}", f"/dev/dri/renderD{128 + i}") for i in range(8)
    ]
    assert all(g.driver_bound and g.fault is None for g in inv.gpus)
    assert {g.sriov.state for g in inv.gpus} == {SriovState.OFF}
    assert {(g.sriov.total_vfs, g.sriov.num_vfs) for g in inv.gpus} == {(8, 0)}
    assert inv.driver.loaded and inv.driver.version == "2.32.0.6"
    assert inv.driver.version_parts == (2, 32, 0)
    assert (inv.sdk.version, inv.sdk.path) == ("2.32.0.6", "/opt/maca")
    assert inv.control_devices == ("/dev/mxcd",)
    serials = [g.serial for g in inv.gpus]
    uuids = [g.uuid for g in inv.gpus]
    assert all(serials) and len(set(serials)) == 8
    assert all(u and u.startswith("GPU-") for u in uuids) and len(set(uuids)) == 8


def test_serials_are_deterministic(tmp_path: Path) -> None:
    a = discover(make(tmp_path / "a", "c500-8"))
    b = discover(make(tmp_path / "b", "c500-8"))
    c = discover(make(tmp_path, "c550-8"))
    assert [g.serial for g in a.gpus] == [g.serial for g in b.gpus]
    assert [g.uuid for g in a.gpus] == [g.uuid for g in b.gpus]
    assert not {g.uuid for g in a.gpus} & {g.uuid for g in c.gpus}


def test_c550_8_fully_linked(tmp_path: Path) -> None:
    inv = discover(make(tmp_path, "c550-8"))
    assert inv.problems == ()
    assert [g.product for g in inv.gpus] == ["C550"] * 8
    assert [g.link_group for g in inv.gpus] == [0] * 8
    assert len(inv.links) == 28
    assert switches(inv) == ["0000:01:00.0"] * 4 + ["0000:81:00.0"] * 4
    assert [g.numa_node for g in inv.gpus] == [0] * 4 + [1] * 4


def test_mixed_16(tmp_path: Path) -> None:
    inv = discover(make(tmp_path, "mixed-16"))
    assert inv.problems == ()
    assert len(inv.gpus) == 16
    assert switches(inv) == (["0000:01:00.0"] * 4 + ["0000:11:00.0"] * 4
                             + ["0000:81:00.0"] * 4 + ["0000:91:00.0"] * 4)
    assert [g.numa_node for g in inv.gpus] == [0] * 8 + [1] * 8
    assert [g.link_group for g in inv.gpus] == [0] * 8 + [1] * 8
    assert len(inv.links) == 56
    assert frozenset((7, 8)) not in inv.links
    assert frozenset((3, 4)) in inv.links  # across switches 0 and 1
    assert inv.gpus[15].device_nodes == ("/dev/dri/card16", "/dev/dri/renderD143")


def test_n260_2(tmp_path: Path) -> None:
    inv = discover(make(tmp_path, "n260-2"))
    assert inv.problems == ()
    assert [(g.product, g.family) for g in inv.gpus] == [("N260", "MXN")] * 2
    assert inv.links == frozenset()
    assert [g.link_group for g in inv.gpus] == [None, None]
    assert switches(inv) == ["0000:01:00.0"] * 2
    assert {g.sriov.state for g in inv.gpus} == {SriovState.FORBIDDEN}
    assert {g.sriov.total_vfs for g in inv.gpus} == {0}


def test_c500_8_vf4(tmp_path: Path) -> None:
    inv = discover(make(tmp_path, "c500-8-vf4"))
    assert inv.problems == ()
    assert len(inv.gpus) == 8  # VFs (same vendor id) are not GPUs
    assert {g.sriov.state for g in inv.gpus} == {SriovState.ON}
    assert {(g.sriov.total_vfs, g.sriov.num_vfs) for g in inv.gpus} == {(8, 4)}
    first = inv.gpus[0].sriov
    assert first.vf_addresses == ("0000:03:00.1", "0000:03:00.2", "0000:03:00.3",
                                  "0000:03:00.4")
    # VFs are probed after all PFs: card9.. / renderD136..
    assert first.vf_device_nodes[0] == ("/dev/dri/card9", "/dev/dri/renderD136")
    assert inv.gpus[7].sriov.vf_device_nodes[3] == ("/dev/dri/card40", "/dev/dri/renderD167")
    assert [g.link_group for g in inv.gpus] == [0] * 4 + [1] * 4


@pytest.mark.parametrize("vfnum", [0, 1, 2, 8])
def test_vfnum_override(tmp_path: Path, vfnum: int) -> None:
    inv = discover(make(tmp_path, "c500-8", vfnum=vfnum))
    gpu = inv.gpus[4]
    assert gpu.sriov.num_vfs == vfnum
    assert len(gpu.sriov.vf_addresses) == vfnum
    assert gpu.sriov.state == (SriovState.ON if vfnum else SriovState.OFF)
    if vfnum == 8:  # ARI: the 8th VF lands on device 1 function 0
        assert gpu.sriov.vf_addresses[-1] == "0000:83:01.0"


def test_nodriver_8(tmp_path: Path) -> None:
    root = make(tmp_path, "nodriver-8")
    inv = discover(root)
    assert inv.backend == "metax"
    assert len(inv.gpus) == 8 and {g.product for g in inv.gpus} == {"C500"}
    assert not inv.driver.loaded and inv.driver.version is None
    assert not any(g.driver_bound for g in inv.gpus)
    assert all(g.device_nodes == () and g.memory_mib is None for g in inv.gpus)
    assert inv.control_devices == ()
    assert inv.links == frozenset()
    text = "\n".join(inv.problems)
    assert "metax kernel module is not loaded" in text
    assert "mx-smi not found" in text
    assert switches(inv) == ["0000:01:00.0"] * 4 + ["0000:81:00.0"] * 4
    assert not os.path.exists(os.path.join(root, MXSMI))


def test_nogpu(tmp_path: Path) -> None:
    inv = discover(make(tmp_path, "nogpu"))
    assert inv.backend == "none"
    assert inv.gpus == () and not inv.has_gpus
    assert inv.problems == ()


def test_nvidia_8(tmp_path: Path) -> None:
    inv = discover(make(tmp_path, "nvidia-8"))
    assert inv.backend == "nvidia"
    assert inv.problems == ()
    assert len(inv.gpus) == 8  # the 4 NVSwitches (vendor 0x10de, class 0x0680) are not GPUs
    assert {(g.product, g.family) for g in inv.gpus} == {("H100", "NVIDIA-Hopper")}
    assert {g.memory_mib for g in inv.gpus} == {81559}
    assert {g.memory_label for g in inv.gpus} == {"80GB"}
    assert len(inv.links) == 28 and [g.link_group for g in inv.gpus] == [0] * 8
    assert switches(inv) == ["0000:01:00.0"] * 4 + ["0000:81:00.0"] * 4
    assert [g.numa_node for g in inv.gpus] == [0] * 4 + [1] * 4
    assert [g.device_nodes for g in inv.gpus] == [(f"/dev/nvidia{i}",) for i in range(8)]
    assert inv.control_devices == ("/dev/nvidiactl", "/dev/nvidia-uvm",
                                   "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
    assert inv.driver.version == "550.54.15" and inv.driver.loaded
    assert all(g.serial and g.uuid and g.uuid.startswith("GPU-") for g in inv.gpus)
    assert all(g.driver_bound for g in inv.gpus)


def test_nvidia_without_nvidia_smi(tmp_path: Path) -> None:
    root = make(tmp_path, "nvidia-8")
    uuids = [g["uuid"] for g in sim.state(root)["gpus"]]
    os.unlink(os.path.join(root, "usr/bin/nvidia-smi"))
    inv = discover(root)
    assert len(inv.gpus) == 8 and inv.gpus[0].product == "H100"
    assert inv.gpus[0].serial is None
    # NVLink all-to-all (NVSwitch) from NVML's peer-to-peer status, as topo -m would say
    assert len(inv.links) == 28 and [g.link_group for g in inv.gpus] == [0] * 8
    # name, memory and UUID from NVML (loaded by its full path under the root)
    assert [g.uuid for g in inv.gpus] == uuids
    assert {(g.name, g.memory_mib) for g in inv.gpus} == {("NVIDIA H100 80GB HBM3", 81559)}
    assert any("nvidia-smi not found" in p for p in inv.problems)


def test_a_pods_nvidia_smi_that_cannot_load_nvml_is_stood_in_for(tmp_path: Path) -> None:
    """A pod reading a host whose driver shares /usr/lib/x86_64-linux-gnu with the host's
    libc: the host's nvidia-smi cannot load libnvidia-ml.so.1 (what the real one printed on
    the H100 machine when the library was out of reach); NVML by full path answers."""
    root = make(tmp_path, "nvidia-8")
    tool = Path(root, "usr/bin/nvidia-smi")
    tool.write_text("#!/bin/sh\necho \"NVIDIA-SMI couldn't find libnvidia-ml.so library in "
                    "your system.\"\nexit 12\n")
    inv = discover(root)
    assert {g.memory_mib for g in inv.gpus} == {81559}
    assert all(g.uuid and g.uuid.startswith("GPU-") for g in inv.gpus)
    assert any("nvidia-smi" in p for p in inv.problems)  # still said


@pytest.mark.parametrize("preset", ["v100-8", "nvidia-8", "t4-2"])
def test_nvlink_pairs_from_nvml_equal_nvidia_smis_where_it_cannot_run(
    tmp_path: Path, preset: str,
) -> None:
    """The same links from NVML's peer-to-peer status over NVLink as from ``nvidia-smi
    topo -m``: two groups of four (V100), all eight (NVSwitch), none (PCIe only). A pod
    whose host driver shares /usr/lib/x86_64-linux-gnu with libc cannot run the host's
    nvidia-smi; without this its multi-GPU pods lost their NVLink placement."""
    root = make(tmp_path, preset)
    with_smi = discover(root)
    tool = Path(root, "usr/bin/nvidia-smi")
    tool.write_text("#!/bin/sh\necho \"NVIDIA-SMI couldn't find libnvidia-ml.so library in "
                    "your system.\"\nexit 12\n")
    without = discover(root)
    assert without.links == with_smi.links
    assert [g.link_group for g in without.gpus] == [g.link_group for g in with_smi.gpus]
    assert len(without.links) == {"v100-8": 12, "nvidia-8": 28, "t4-2": 0}[preset]


def test_inventory_json_ready(tmp_path: Path) -> None:
    d = discover(make(tmp_path, "c500-8-vf4")).to_dict()
    assert d["gpus"][0]["sriov"]["vf_device_nodes"][0] == ["/dev/dri/card9",
                                                          "/dev/dri/renderD136"]
    assert d["gpus"][0]["pcie_switch"] == "0000:01:00.0"


# -------------------------------------------------------------- sysfs shapes by hand


def _pci(root: Path, path: str, vendor: int, device: int, cls: int, numa: int = -1) -> None:
    directory = root / "sys/devices" / path
    directory.mkdir(parents=True)
    (directory / "vendor").write_text(f"0x{vendor:04x}\n")
    (directory / "device").write_text(f"0x{device:04x}\n")
    (directory / "class").write_text(f"0x{cls:06x}\n")
    (directory / "numa_node").write_text(f"{numa}\n")
    link = root / "sys/bus/pci/devices" / directory.name
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(directory, link.parent))


def test_gpu_under_root_port_has_no_switch_and_unknown_id(tmp_path: Path) -> None:
    _pci(tmp_path, "pci0000:00/0000:00:01.0", 0x8086, 0x1, 0x060400)
    _pci(tmp_path, "pci0000:00/0000:00:01.0/0000:01:00.0", 0x9999, 0x4abc, 0x038000)
    _pci(tmp_path, "pci0000:00/0000:00:02.0/0000:02:00.0/0000:03:00.0/0000:04:00.0",
         0x9999, 0x4001, 0x038000, numa=0)
    inv = discover(str(tmp_path))
    assert [g.pci_address for g in inv.gpus] == ["0000:01:00.0", "0000:04:00.0"]
    first, second = inv.gpus
    assert first.product == "unknown-0x4abc" and first.pcie_switch is None
    assert first.numa_node is None  # numa_node -1
    assert second.product == "C500" and second.pcie_switch == "0000:02:00.0"
    assert second.numa_node == 0
    assert first.sriov.state == SriovState.FORBIDDEN


def test_unknown_device_id_in_simulated_node(tmp_path: Path) -> None:
    root = make(tmp_path, "c500-8")
    dev = Path(root, "sys/bus/pci/devices/0000:05:00.0/device")
    dev.write_text("0x40ff\n")
    inv = discover(root)
    assert inv.gpus[2].product == "unknown-0x40ff"
    assert inv.gpus[2].memory_mib == 65536  # mx-smi still knows it


def test_unreadable_files_give_partial_inventory(tmp_path: Path) -> None:
    root = make(tmp_path, "c500-8")
    vendor = Path(root, "sys/bus/pci/devices/0000:04:00.0/vendor")
    vendor.unlink()
    vendor.mkdir()  # reading a directory fails even as root
    version = Path(root, "sys/module/metax/version")
    version.unlink()
    version.mkdir()
    Path(root, "opt/maca/Version.txt").write_text("garbage without separator\n")
    inv = discover(root)
    assert len(inv.gpus) == 7
    assert inv.driver.loaded and inv.driver.version is None
    assert inv.sdk.version is None and inv.sdk.path == "/opt/maca"
    text = "\n".join(inv.problems)
    assert "0000:04:00.0: vendor or class unreadable" in text
    assert "/sys/module/metax/version unreadable" in text
    assert "no 'key:version' line" in text


def test_missing_sysfs(tmp_path: Path) -> None:
    inv = discover(str(tmp_path))
    assert inv.backend == "none"
    assert any("cannot list /sys/bus/pci/devices" in p for p in inv.problems)


# ----------------------------------------------------------------- broken vendor tool


def _runner(stdout: str = "", rc: int = 0, stderr: str = "", calls: list[list[str]] | None = None):
    def run(argv: list[str]) -> tuple[int, str, str]:
        if calls is not None:
            calls.append(argv)
        return rc, stdout, stderr

    return run


MOFFETT = """\
=================== Moffett System Management Interface ===================
+------------------------------------------------------------------------------+
| MX-SMI 1.3.0                    Driver Version: 1.3.0                        |
| SPU   Name      | Bus-Id          | Temp   Power | Memory-Usage             |
+------------------------------------------------------------------------------+
"""


def test_moffett_mx_smi_is_rejected(tmp_path: Path) -> None:
    root = make(tmp_path, "c500-8")
    calls: list[list[str]] = []
    inv = discover(root, runner=_runner(MOFFETT, calls=calls))
    assert len(inv.gpus) == 8
    assert all(g.memory_mib is None and g.serial is None for g in inv.gpus)
    assert inv.links == frozenset()
    assert any("is not MetaX's mx-smi" in p and "Moffett" in p for p in inv.problems)
    assert len(calls) == 1  # not run again once known to be the wrong tool
    assert calls[0][0] == os.path.join(root, MXSMI)


def test_garbage_mx_smi_output(tmp_path: Path) -> None:
    root = make(tmp_path, "c500-8")
    junk = "MetaX System Management Interface Log\nGPU#zz ???\n\x00\x01 : :\nGPU0 MX\n"
    inv = discover(root, runner=_runner(junk))
    assert len(inv.gpus) == 8
    assert all(g.memory_mib is None and g.uuid is None for g in inv.gpus)
    assert any("listed no GPU" in p for p in inv.problems)


def test_mx_smi_exits_non_zero(tmp_path: Path) -> None:
    root = make(tmp_path, "c500-8")
    inv = discover(root, runner=_runner("", rc=1, stderr="mxsml init failed: -5\n"))
    assert len(inv.gpus) == 8 and inv.gpus[0].memory_mib is None
    assert any("exited with 1: mxsml init failed: -5" in p for p in inv.problems)


def test_queries_choose_the_mx_smi_runs(tmp_path: Path) -> None:
    """A caller asks only for what it needs (metax-docker: sysfs alone, or serial numbers);
    what it did not ask for stays unknown, the rest of the inventory is the same."""
    root = make(tmp_path, "c500-8")
    sim.fail(root, 2, "fault", reason="hang")
    seen: list[list[str]] = []

    def runner(argv: list[str]) -> tuple[int, str, str]:
        seen.append(argv[1:])
        return default_runner(argv)

    full = discover(root, runner=runner)
    assert seen == [["--show-hwinfo"], ["--show-memory"], ["--show-unavailable-reason"],
                    ["topo", "-m"]]
    seen.clear()
    bare = discover(root, runner=runner, queries=())
    assert seen == [] and bare.problems == full.problems
    assert [g.device_nodes for g in bare.gpus] == [g.device_nodes for g in full.gpus]
    assert all(g.serial is None and g.memory_mib is None and g.fault is None for g in bare.gpus)
    assert bare.links == frozenset() and full.links
    serials = discover(root, runner=runner, queries=("hwinfo",))
    assert seen == [["--show-hwinfo"]]
    assert [g.serial for g in serials.gpus] == [g.serial for g in full.gpus]
    seen.clear()
    assert discover(root, runner=runner, queries=("health",)).gpu(2).fault == "hang"
    assert seen == [["--show-unavailable-reason"]]
    with pytest.raises(ValueError, match="unknown mx-smi queries"):
        discover(root, queries=("everything",))


@pytest.mark.parametrize("exc", [subprocess.TimeoutExpired(["mx-smi"], 1), OSError("boom")])
def test_runner_raising(tmp_path: Path, exc: Exception) -> None:
    root = make(tmp_path, "c500-8")

    def runner(argv: list[str]) -> tuple[int, str, str]:
        raise exc

    inv = discover(root, runner=runner)
    assert len(inv.gpus) == 8
    assert any("timed out" in p or "could not run: boom" in p for p in inv.problems)


def test_default_runner_timeout_and_missing_program() -> None:
    rc, _, err = default_runner(["sleep", "5"], timeout=0.2)
    assert rc == 124 and "timed out" in err
    result = run_tool(None, ["/nonexistent/mx-smi", "-L"])
    assert result.rc == 127 and not result.ok


def test_slow_mx_smi_times_out(tmp_path: Path) -> None:
    root = make(tmp_path, "c500-8")

    def runner(argv: list[str]) -> tuple[int, str, str]:
        return default_runner(["sleep", "5"], timeout=0.2)

    inv = discover(root, runner=runner)
    assert len(inv.gpus) == 8
    assert any("timed out" in p for p in inv.problems)


def test_mx_smi_located_in_other_places(tmp_path: Path) -> None:
    root = make(tmp_path, "c500-8")
    source = os.path.join(root, MXSMI)
    for place in ("opt/maca/bin/mx-smi", "usr/bin/mx-smi", "usr/local/bin/mx-smi"):
        target = os.path.join(root, place)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.move(source, target)
        calls: list[list[str]] = []
        discover(root, runner=_runner("MetaX System Management Interface Log\n", calls=calls))
        assert calls and {c[0] for c in calls} == {target}
        source = target


def test_non_executable_mx_smi_is_not_used(tmp_path: Path) -> None:
    root = make(tmp_path, "c500-8")
    os.chmod(os.path.join(root, MXSMI), 0o644)
    inv = discover(root)
    assert any("mx-smi not found" in p for p in inv.problems)


def test_mx_smi_numbering_follows_visible_gpus(tmp_path: Path) -> None:
    # with GPU 2 unbound, mx-smi renumbers: its GPU2 is our GPU 3; links must map by BDF
    root = make(tmp_path, "c500-8")
    sim.fail(root, 2, "unbind")
    inv = discover(root)
    assert frozenset((0, 3)) in inv.links and frozenset((3, 4)) not in inv.links
    assert not any(2 in pair for pair in inv.links)
    assert inv.gpus[2].link_group is None and inv.gpus[3].link_group == 0
    assert inv.gpus[3].memory_mib == 65536 and inv.gpus[2].memory_mib is None
    assert not inv.gpus[2].driver_bound and inv.gpus[2].device_nodes == ()


# ------------------------------------------------------------------------- parsers


REAL_TOPO = """\
=================== MetaX System Management Interface Log ===================
Attached GPUs                                     : 8
        GPU0    GPU1    GPU2    GPU3    GPU4    GPU5    GPU6    GPU7
GPU0    X       MX      MX      MX      SYS     SYS     SYS     SYS
GPU1    MX      X       MX      MX      SYS     SYS     SYS     SYS
GPU2    MX      MX      X       MX      SYS     SYS     SYS     SYS
GPU3    MX      MX      MX      X       SYS     SYS     SYS     SYS
GPU4    SYS     SYS     SYS     SYS      X      MX      MX      MX
GPU5    SYS     SYS     SYS     SYS     MX      X       MX      MX
GPU6    SYS     SYS     SYS     SYS     MX      MX      X       MX
GPU7    SYS     SYS     SYS     SYS     MX      MX      MX      X
Legend:
X    = Self
MX   = Connection traversing MetaXLink
"""

NV_TOPO = (
    "\tGPU0\tGPU1\tGPU2\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
    "GPU0\t X \tNV18\tSYS\tPIX\t0-55\t0\t\tN/A\n"
    "GPU1\tNV18\t X \tSYS\tSYS\t0-55\t0\t\tN/A\n"
    "GPU2\tSYS\tSYS\t X \tSYS\t56-111\t1\t\tN/A\n"
    "NIC0\tPIX\tSYS\tSYS\t X \n"
)


# nvidia-smi 580.159.04 on an H100 (the device machine, piped): the heading row is
# underlined with ANSI escapes
REAL_NV_TOPO_1GPU = (
    "\t\x1b[4mGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
    "GPU0\t X \t0-15\t0\t\tN/A\n\nLegend:\n\n  X    = Self\n"
)


def test_parse_topo_matrix_reads_the_real_underlined_heading() -> None:
    underlined = NV_TOPO.replace("\tGPU0", "\t\x1b[4mGPU0", 1).replace(
        "GPU NUMA ID\n", "GPU NUMA ID\x1b[0m\n", 1)
    assert metax.parse_topo_matrix(underlined) == {frozenset((0, 1))}
    assert metax.parse_topo_matrix(REAL_NV_TOPO_1GPU) == set()


def test_parse_topo_matrix() -> None:
    pairs = metax.parse_topo_matrix(REAL_TOPO)
    assert len(pairs) == 12
    assert frozenset((4, 7)) in pairs and frozenset((3, 4)) not in pairs
    assert metax.parse_topo_matrix(NV_TOPO) == {frozenset((0, 1))}
    assert metax.parse_topo_matrix("") == set()


def test_parse_sections_and_memory_units() -> None:
    text = (
        "=================== MetaX System Management Interface Log ===================\n"
        "GPU#0  MXC500  0000:08:00.0\n"
        "    Memory\n"
        "        vram total                                : 64 GB\n"
        "GPU#1  MetaX C500  0000:09:00.0\n"
        "    Memory\n"
        "        vram total                                : 65536 MiB\n"
    )
    sections = metax.parse_sections(text)
    assert sorted(sections) == ["0000:08:00.0", "0000:09:00.0"]
    assert sections["0000:09:00.0"].name == "MetaX C500"
    assert metax._memory_kib(sections["0000:08:00.0"]) == 64 * 1024 * 1024
    assert metax._memory_kib(sections["0000:09:00.0"]) == 64 * 1024 * 1024


def test_nvidia_helpers() -> None:
    assert nvidia.normalise_bus_id("00000000:1A:00.0") == "0000:1a:00.0"
    rows = nvidia.parse_query("0, 00000000:18:00.0, NVIDIA A100-SXM4-80GB, 81920, 1, GPU-x\n")
    assert rows["0000:18:00.0"]["memory.total"] == "81920"
    assert nvidia._product_from_name("NVIDIA A100-SXM4-80GB") == "A100-SXM4-80GB"
    assert nvidia.family_for("A100") == "NVIDIA-Ampere"
    assert nvidia.family_for("H100") == "NVIDIA-Hopper"
    assert nvidia.unreachable(
        "Unable to determine the device handle for GPU00000000:18:00.0: Unknown Error\n"
    ) == {"0000:18:00.0": "Unknown Error"}


def test_link_groups_components() -> None:
    gpus = tuple(
        Gpu(index=i, pci_address=f"0000:0{i}:00.0", vendor="metax", vendor_id=0x9999,
            device_id=0x4001, product="C500")
        for i in range(6)
    )
    links = frozenset({frozenset((4, 5)), frozenset((0, 1)), frozenset((1, 2))})
    assert link_groups(gpus, links) == {0: 0, 1: 0, 2: 0, 4: 1, 5: 1}
    assert link_groups(gpus, frozenset()) == {}


def test_runner_for_a_mounted_host_adds_vendor_libraries(tmp_path: Path) -> None:
    root = make(tmp_path, "c500-8")
    probe = Path(root, "opt/mxdriver/bin/show-env")
    probe.write_text("#!/bin/sh\necho \"$LD_LIBRARY_PATH\"\n")
    probe.chmod(0o755)
    rc, out, _ = runner_for(root)([str(probe)])
    assert rc == 0 and out.strip().split(":")[0] == os.path.join(root, "opt/maca/lib")
    assert runner_for("/") is default_runner


def test_the_real_nvidia_smi_outputs_parse() -> None:
    """What nvidia-smi 580.159.04 printed on an H100 (the device machine) for the queries
    discovery and the nvidia-smi telemetry make; the third is under MPS (server + 2 clients)."""
    rows = nvidia.parse_query("0, 00000000:00:06.0, NVIDIA H100 80GB HBM3, 81559, "
                              "1652424049723, GPU-a28c422e-32c8-47ad-846f-d32ecde324c9\n")
    assert rows["0000:00:06.0"]["name"] == "NVIDIA H100 80GB HBM3"
    assert rows["0000:00:06.0"]["memory.total"] == "81559"
    (load,) = nvidia.parse_load("00000000:00:06.0, 0, 0, 81559, 30, 70.98, 0, 0\n")
    assert (load.address, load.utilization_ratio, load.memory_total_bytes, load.power_watts,
            load.ecc_corrected) == ("0000:00:06.0", 0.0, 81559 * 1024 * 1024, 70.98, 0)
    apps = nvidia.parse_compute_apps(
        "00000000:00:06.0, 810, 66, nvidia-cuda-mps-server\n"
        "00000000:00:06.0, 825, 714, /opt/torch/.venv/bin/python3\n"
        "00000000:00:06.0, 824, 370, /opt/torch/.venv/bin/python3\n")
    assert [(p.pid, p.memory_bytes) for p in apps] == [
        (810, 66 * 1024 * 1024), (825, 714 * 1024 * 1024), (824, 370 * 1024 * 1024)]
    assert nvidia.parse_compute_caps("00000000:00:06.0, 9.0\n") == {"0000:00:06.0": (9, 0)}


def test_a_mounted_host_s_tool_is_its_elf_program_not_a_wrapper_script(tmp_path: Path) -> None:
    """Under /host, a wrapper script (/usr/bin/nvidia-smi -> exec /usr/local/nvidia/bin/
    nvidia-smi, as on the H100 machine) would exec a path that is not in the pod; the
    driver's ELF program is taken instead. A script alone is still used (the simulator's)."""
    from gpuk8s.discovery.tools import find_tool

    root = tmp_path / "host"
    script = root / "usr/bin/nvidia-smi"
    script.parent.mkdir(parents=True)
    script.write_text('#!/bin/sh\nexec /usr/local/nvidia/bin/nvidia-smi "$@"\n')
    script.chmod(0o755)
    assert find_tool(str(root), "nvidia-smi", nvidia.NVSMI_CANDIDATES) == str(script)
    real = root / "usr/local/nvidia/bin/nvidia-smi"
    real.parent.mkdir(parents=True)
    shutil.copy("/bin/true", real)
    assert find_tool(str(root), "nvidia-smi", nvidia.NVSMI_CANDIDATES) == str(real)
    # and its runner finds the driver's libnvidia-ml.so.1 beside it
    (root / "usr/local/nvidia/lib64").mkdir()
    rc, out, _ = runner_for(str(root))(["sh", "-c", "echo $LD_LIBRARY_PATH"])
    assert rc == 0 and str(root / "usr/local/nvidia/lib64") in out.strip().split(":")
