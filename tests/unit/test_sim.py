"""The simulator: tree shape, device nodes, fake tools, CLI, safety."""

from __future__ import annotations

import json
import os
import runpy
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gpuk8s import sim
from gpuk8s.core.errors import ConfigError
from gpuk8s.discovery import discover
from gpuk8s.sim import kobject
from gpuk8s.sim.cli import main as sim_main

PRESET_NAMES = ["c500-8", "c550-8", "mixed-16", "n260-2", "c500-8-vf4", "nodriver-8",
                "nogpu", "nvidia-8", "nvidia-8-nodriver", "a100-8", "v100-8", "t4-2", "p100-4"]


@pytest.fixture(autouse=True)
def _fast_python3(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}")


def test_preset_names_are_the_contract() -> None:
    assert sorted(sim.PRESETS) == sorted(PRESET_NAMES)
    assert all(isinstance(d, str) and d for d in sim.PRESETS.values())


@pytest.mark.parametrize("preset", PRESET_NAMES)
def test_every_preset_creates_a_discoverable_tree(tmp_path: Path, preset: str) -> None:
    root = str(tmp_path / preset)
    sim.create(root, preset)
    inv = discover(root)
    expected = {"c500-8": 8, "c550-8": 8, "mixed-16": 16, "n260-2": 2, "c500-8-vf4": 8,
                "nodriver-8": 8, "nogpu": 0, "nvidia-8": 8, "nvidia-8-nodriver": 8,
                "a100-8": 8, "v100-8": 8, "t4-2": 2, "p100-4": 4}[preset]
    assert len(inv.gpus) == expected
    assert sim.state(root)["preset"] == preset


def test_sysfs_links_are_relative_like_the_kernel(tmp_path: Path) -> None:
    root = tmp_path / "n"
    sim.create(str(root), "c500-8-vf4")
    bus = root / "sys/bus/pci/devices/0000:03:00.0"
    target = os.readlink(bus)
    assert target == ("../../../devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/"
                      "0000:03:00.0")
    assert os.readlink(bus / "driver") == "../../../../../../bus/pci/drivers/METAX"
    assert (root / "sys/module/metax/drivers/pci:METAX/0000:03:00.0/drm/card1").is_dir()
    assert os.readlink(bus / "virtfn0") == "../0000:03:00.1"
    vf = root / "sys/bus/pci/devices/0000:03:00.1"
    assert os.path.realpath(vf / "physfn") == os.path.realpath(bus)
    assert (vf / "device").read_text() == "0x4011\n"
    assert (bus / "sriov_totalvfs").read_text() == "8\n"
    assert (bus / "sriov_numvfs").read_text() == "4\n"
    assert (bus / "class").read_text() == "0x038000\n"
    assert (root / "sys/module/metax/version").read_text() == "2.32.0.6\n"
    assert (root / "opt/maca/Version.txt").read_text().split(":")[1].strip() == "2.32.0.6"


def test_n260_has_no_sriov_files(tmp_path: Path) -> None:
    root = tmp_path / "n"
    sim.create(str(root), "n260-2")
    assert not (root / "sys/bus/pci/devices/0000:03:00.0/sriov_totalvfs").exists()
    with pytest.raises(ConfigError, match="no SR-IOV"):
        sim.create(str(tmp_path / "m"), "n260-2", vfnum=4)


def test_tree_is_relocatable(tmp_path: Path) -> None:
    first = tmp_path / "a"
    sim.create(str(first), "c500-8")
    before = discover(str(first))
    shutil.copytree(first, tmp_path / "b", symlinks=True)
    shutil.rmtree(first)
    assert discover(str(tmp_path / "b")) == before


def test_device_nodes_as_files(tmp_path: Path) -> None:
    root = tmp_path / "n"
    sim.create(str(root), "c500-8")
    assert (root / "dev/mxcd").is_file()
    assert (root / "dev/dri/card0").read_text() == "226:0\n"  # the BMC's VGA
    assert (root / "dev/dri/card8").read_text() == "226:8\n"
    assert (root / "dev/dri/renderD135").read_text() == "226:135\n"
    assert (root / "dev/mxcd").read_text() == "511:0\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")
def test_device_nodes_as_char_devices(tmp_path: Path) -> None:
    root = tmp_path / "n"
    try:
        sim.create(str(root), "c500-8-vf4", device_nodes="char")
    except PermissionError:
        pytest.skip("no CAP_MKNOD here")
    seen: set[tuple[int, int]] = set()
    for rel, expected in (("dev/mxcd", (511, 0)), ("dev/dri/card1", (226, 1)),
                          ("dev/dri/renderD128", (226, 128)), ("dev/dri/card0", (226, 0)),
                          ("dev/dri/card40", (226, 40)), ("dev/dri/renderD167", (226, 167))):
        st = os.lstat(root / rel)
        assert stat.S_ISCHR(st.st_mode), rel
        assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == expected
        seen.add(expected)
    nodes = list((root / "dev/dri").iterdir())
    numbers = {(os.major(n.lstat().st_rdev), os.minor(n.lstat().st_rdev)) for n in nodes}
    assert len(numbers) == len(nodes)  # minors unique
    assert discover(str(root)).gpus[0].device_nodes == ("/dev/dri/card1", "/dev/dri/renderD128")


def test_nvidia_device_nodes(tmp_path: Path) -> None:
    root = tmp_path / "n"
    sim.create(str(root), "nvidia-8")
    assert (root / "dev/nvidia7").read_text() == "195:7\n"
    assert (root / "dev/nvidiactl").read_text() == "195:255\n"
    info = (root / "proc/driver/nvidia/gpus/0000:86:00.0/information").read_text()
    assert "Device Minor: \t 7" in info


def test_nodriver_has_no_driver_artifacts(tmp_path: Path) -> None:
    root = tmp_path / "n"
    sim.create(str(root), "nodriver-8")
    assert not (root / "sys/module/metax").exists()
    assert not (root / "dev/mxcd").exists()
    assert not (root / "opt/mxdriver/bin/mx-smi").exists()
    assert not (root / "sys/bus/pci/devices/0000:03:00.0/driver").exists()
    assert (root / "sys/bus/pci/devices/0000:03:00.0/vendor").read_text() == "0x9999\n"


def test_create_refuses_to_clobber(tmp_path: Path) -> None:
    other = tmp_path / "data"
    other.mkdir()
    (other / "precious").write_text("x")
    with pytest.raises(ConfigError, match="not empty"):
        sim.create(str(other), "c500-8")
    with pytest.raises(ConfigError, match="not a simulated root"):
        sim.create(str(other), "c500-8", force=True)
    assert (other / "precious").exists()
    with pytest.raises(ConfigError, match="unknown preset"):
        sim.create(str(tmp_path / "x"), "c999-8")
    with pytest.raises(ConfigError, match="over /"):
        sim.create("/", "c500-8", force=True)


def test_force_replaces_a_simulated_root(tmp_path: Path) -> None:
    root = str(tmp_path / "n")
    sim.create(root, "c500-8")
    sim.create(root, "n260-2", force=True)
    assert len(discover(root).gpus) == 2
    assert not os.path.lexists(os.path.join(root, "sys/bus/pci/devices/0000:83:00.0"))


def test_fail_rejects_bad_input(tmp_path: Path) -> None:
    root = str(tmp_path / "n")
    sim.create(root, "n260-2")
    with pytest.raises(ConfigError, match="no GPU 5"):
        sim.fail(root, 5)
    with pytest.raises(ConfigError, match="unknown fail mode"):
        sim.fail(root, 0, "explode")
    with pytest.raises(ConfigError, match="not a simulated root"):
        sim.fail(str(tmp_path), 0)


def _mx_smi(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(root / "opt/mxdriver/bin/mx-smi"), *args], capture_output=True,
                          text=True, check=False)


def test_fake_mx_smi_real_format(tmp_path: Path) -> None:
    root = tmp_path / "n"
    sim.create(str(root), "c500-8")
    for args in ([], ["-L"], ["--show-memory"], ["--show-hwinfo"], ["--show-sn"],
                 ["--show-version"], ["--show-unavailable-reason"], ["topo", "-m"]):
        proc = _mx_smi(root, *args)
        assert proc.returncode == 0, args
        assert "=== MetaX System Management Interface Log ===" in proc.stdout
        assert "Attached GPUs                                     : 8" in proc.stdout
    mem = _mx_smi(root, "--show-memory").stdout
    assert "GPU#7  MXC500  0000:86:00.0" in mem
    assert "        vram total                                : 67108864 KB" in mem
    topo = _mx_smi(root, "topo", "-m").stdout.splitlines()
    row0 = next(line for line in topo if line.startswith("GPU0 "))
    assert row0.split()[1:9] == ["X", "MX", "MX", "MX", "SYS", "SYS", "SYS", "SYS"]
    assert _mx_smi(root, "--bogus").returncode == 2
    os.unlink(root / "var/lib/gpuk8s-sim/state.json")
    assert _mx_smi(root, "-L").returncode != 0


def test_fake_mx_smi_pix_and_sys_cells(tmp_path: Path) -> None:
    def matrix(root: Path) -> list[list[str]]:
        return [line.split() for line in _mx_smi(root, "topo", "-m").stdout.splitlines()
                if line.startswith("GPU")]

    sim.create(str(tmp_path / "m"), "mixed-16")
    rows = matrix(tmp_path / "m")
    assert rows[0][1 + 7] == "MX" and rows[0][1 + 8] == "SYS"  # groups 0-7 / 8-15
    assert rows[0][-1] == "0" and rows[15][-1] == "1"  # NUMA affinity column
    sim.create(str(tmp_path / "n"), "n260-2")
    assert matrix(tmp_path / "n")[0][1:3] == ["X", "PIX"]


def test_fake_nvidia_smi(tmp_path: Path) -> None:
    root = tmp_path / "n"
    sim.create(str(root), "nvidia-8")
    tool = str(root / "usr/bin/nvidia-smi")
    out = subprocess.run([tool, "--query-gpu=index,pci.bus_id,memory.total",
                          "--format=csv"], capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    assert lines[0] == "index, pci.bus_id, memory.total [MiB]"
    assert lines[1] == "0, 00000000:03:00.0, 81559 MiB"
    topo = subprocess.run([tool, "topo", "-m"], capture_output=True, text=True,
                          check=True).stdout
    assert topo.splitlines()[1].split("\t")[1:3] == [" X ", "NV18"]


def test_fake_nvidia_smi_loops_as_the_manual_watches_memory(tmp_path: Path) -> None:
    """`nvidia-smi --query-gpu=memory.used --format=csv -l 1` (the accelerator manual's
    002-30) repeats the rows until interrupted; the CSV heading comes once."""
    root = tmp_path / "n"
    sim.create(str(root), "t4-2")
    proc = subprocess.Popen([str(root / "usr/bin/nvidia-smi"), "--query-gpu=memory.used",
                             "--format=csv", "--loop=0.01"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    lines = [proc.stdout.readline().rstrip("\n") for _ in range(1 + 2 * 3)]
    proc.terminate()
    proc.wait(timeout=30)
    assert lines == ["memory.used [MiB]"] + ["0 MiB"] * 6
    argv = ["--query-gpu=memory.used", "--format=csv", "-l", "1"]
    smi = runpy.run_path(str(root / "usr/bin/nvidia-smi"))
    assert smi["loop_seconds"](argv) == (1.0, argv[:2])
    assert smi["loop_seconds"](["-l"]) == (5.0, [])  # nvidia-smi's default period


def test_cli_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = str(tmp_path / "n")
    assert sim_main(["create", "--preset", "c500-8-vf4", "--root", root]) == 0
    assert sim_main(["create", "--preset", "c500-8", "--root", root]) == 2
    assert "not empty" in capsys.readouterr().err
    assert sim_main(["create", "--preset", "c500-8", "--root", root, "--vfnum", "2",
                     "--force"]) == 0
    assert sim_main(["fail", "--root", root, "--gpu", "3", "--mode", "unbind"]) == 0
    assert sim_main(["fail", "--root", root, "--gpu", "4", "--reason", "ras: HBM UE"]) == 0
    capsys.readouterr()
    assert sim_main(["show", "--root", root]) == 0
    text = capsys.readouterr().out
    assert "vfnum 2" in text and "unbound" in text and "fault (ras: HBM UE)" in text
    assert sim_main(["show", "--root", root, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [g["status"] for g in shown["gpus"]][3:5] == ["unbound", "fault"]
    assert sim_main(["vfnum", "--root", root, "--vfnum", "4", "--gpu", "0"]) == 0
    assert [len(g["vfs"]) for g in sim.state(root)["gpus"]][:2] == [4, 2]
    assert sim_main(["sync", "--root", root]) == 0
    assert capsys.readouterr().out == "unchanged\n"
    assert sim_main(["heal", "--root", root, "--all"]) == 0
    assert {g["status"] for g in sim.state(root)["gpus"]} == {"ok"}
    assert sim_main(["fail", "--root", root, "--gpu", "9"]) == 2
    with pytest.raises(SystemExit):
        sim_main(["create", "--preset", "c500-8", "--root", root, "--vfnum", "3"])


def _run(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(path), *args], capture_output=True, text=True, check=False)


def test_modprobe_stand_in_loads_an_installed_driver(tmp_path: Path) -> None:
    root = tmp_path / "n"
    sim.create(str(root), "nodriver-8")
    modprobe = root / "usr/sbin/modprobe"
    proc = _run(modprobe, "metax")
    assert proc.returncode == 1 and "Module metax not found" in proc.stderr
    # a payload installs the module file and the tools; depmod indexes the module; then it
    # is loaded
    ko = root / "lib/modules/5.15.0-91-generic/updates/dkms/metax.ko"
    kobject.write_module(str(ko), "metax", "2.33.1.2", "5.15.0-91-generic")
    tool = root / "opt/mxdriver/bin/mx-smi"
    tool.parent.mkdir(parents=True)
    tool.write_text(sim.tool_source("mx-smi"))
    tool.chmod(0o755)
    proc = _run(modprobe, "metax")
    assert proc.returncode == 1 and "Module metax not found" in proc.stderr  # no depmod yet
    assert _run(root / "usr/sbin/depmod", "-a").returncode == 0
    assert _run(modprobe, "metax", "pri_mem_sz=36").returncode == 0
    inv = discover(str(root))
    assert inv.driver.loaded and inv.driver.version == "2.33.1.2"
    assert all(g.driver_bound for g in inv.gpus)
    assert inv.gpus[0].device_nodes == ("/dev/dri/card1", "/dev/dri/renderD128")
    assert inv.gpus[0].memory_mib == 65536 and len(inv.links) == 12
    assert inv.control_devices == ("/dev/mxcd",)
    assert (root / "sys/module/metax/parameters/pri_mem_sz").read_text() == "36\n"
    assert _run(modprobe, "metax").returncode == 0  # already loaded: no-op
    # in use -> refused; free -> unloaded
    (root / "sys/module/metax/refcnt").write_text("2\n")
    proc = _run(modprobe, "-r", "metax")
    assert proc.returncode == 1 and "in use" in proc.stderr
    (root / "sys/module/metax/refcnt").write_text("0\n")
    assert _run(modprobe, "-r", "metax").returncode == 0
    after = discover(str(root))
    assert not after.driver.loaded and not any(g.driver_bound for g in after.gpus)
    assert not (root / "dev/mxcd").exists() and not (root / "dev/dri/card1").exists()
    assert _run(modprobe, "nvidia").returncode == 1
    log = (root / "var/lib/gpuk8s-sim/modprobe.log").read_text().splitlines()
    assert log == ["load metax 2.33.1.2", "unload metax"]


def test_set_vfnum_and_sync(tmp_path: Path) -> None:
    root = str(tmp_path / "n")
    sim.create(root, "c500-8")
    sim.set_vfnum(root, 2)
    inv = discover(root)
    assert {g.sriov.num_vfs for g in inv.gpus} == {2} and inv.problems == ()
    assert inv.gpus[0].sriov.vf_device_nodes[1] == ("/dev/dri/card10", "/dev/dri/renderD137")
    assert sim.state(root)["vfnum"] == 2
    # what a vfnum module does on a host: write 0, then N, into sysfs
    numvfs = Path(root, "sys/bus/pci/devices/0000:03:00.0/sriov_numvfs")
    numvfs.write_text("0\n")
    numvfs.write_text("8\n")
    stale = discover(root)
    assert any("sriov_numvfs is 8 but 2 virtfn links" in p for p in stale.problems)
    assert sim.sync(root) is True
    inv = discover(root)
    assert inv.problems == ()
    assert inv.gpus[0].sriov.num_vfs == 8 and inv.gpus[1].sriov.num_vfs == 2
    assert sim.sync(root) is False
    sim.set_vfnum(root, 0)
    assert {g.sriov.state.value for g in discover(root).gpus} == {"off"}
    assert not os.path.lexists(os.path.join(root, "sys/bus/pci/devices/0000:03:01.0"))
    with pytest.raises(ConfigError, match="invalid VF number 3"):
        sim.set_vfnum(root, 3)


def test_mx_smi_vm(tmp_path: Path) -> None:
    root = tmp_path / "n"
    sim.create(str(root), "c500-8")
    proc = _mx_smi(root, "vm", "--enable-vf", "4", "-i", "0,5")
    assert proc.returncode == 0, proc.stderr
    assert "Enabled VFs                               : 4" in proc.stdout
    inv = discover(str(root))
    assert [g.sriov.num_vfs for g in inv.gpus] == [4, 0, 0, 0, 0, 4, 0, 0]
    assert _mx_smi(root, "vm", "--disable-vf").returncode == 0
    assert {g.sriov.num_vfs for g in discover(str(root)).gpus} == {0}
    assert _mx_smi(root, "vm", "--enable-vf", "16").returncode == 1
    n260 = tmp_path / "m"
    sim.create(str(n260), "n260-2")
    proc = _mx_smi(n260, "vm", "--enable-vf", "2")
    assert proc.returncode == 1 and "does not support SR-IOV" in proc.stderr
