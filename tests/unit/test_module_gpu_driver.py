"""gpu_driver: deploy-policy decisions, payloads, and real installs on simulator roots.

The kernel is never touched: the load / unload commands point at
tests/ansible/bin/sim_modprobe.py, which records the load in the simulated /sys.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuk8s import sim
from gpuk8s.ansible.harness import run_module
from gpuk8s.core.errors import ConfigError
from gpuk8s.discovery import discover
from gpuk8s.host import driver as drv

STANDIN = str(Path(__file__).resolve().parents[1] / "ansible" / "bin" / "sim_modprobe.py")
OLD, NEW, SDK = "2.32.0.6", "2.33.0.6", "3.3.0.15"


@pytest.fixture(autouse=True)
def fast_fake_tools(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the simulator's `#!/usr/bin/env python3` tools with this interpreter."""
    monkeypatch.setenv("PATH", f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}")


def state(loaded: str | None, installed: str | None) -> drv.DriverState:
    return drv.DriverState(loaded is not None, loaded, installed, None)


ABSENT, RUNS_NEW, RUNS_OLD = state(None, None), state(NEW, NEW), state(OLD, OLD)
ON_DISK_NEW, ON_DISK_OLD, OLD_RUNS_NEW_ON_DISK = state(None, NEW), state(None, OLD), state(OLD, NEW)


@pytest.mark.parametrize(
    ("policy", "current", "install", "load"),
    [
        # IfNotPresent: only where no driver is loaded; a loaded driver is left alone
        ("IfNotPresent", ABSENT, True, True),
        ("IfNotPresent", RUNS_NEW, False, False),
        ("IfNotPresent", RUNS_OLD, False, False),
        ("IfNotPresent", OLD_RUNS_NEW_ON_DISK, False, False),
        ("IfNotPresent", ON_DISK_NEW, False, True),
        ("IfNotPresent", ON_DISK_OLD, True, True),
        # Always: converge to the wanted version
        ("Always", ABSENT, True, True),
        ("Always", RUNS_NEW, False, False),
        ("Always", RUNS_OLD, True, True),
        ("Always", OLD_RUNS_NEW_ON_DISK, False, True),
        ("Always", ON_DISK_NEW, False, True),
        ("Always", ON_DISK_OLD, True, True),
        # Never: nothing, whatever the host has
        ("Never", ABSENT, False, False),
        ("Never", RUNS_OLD, False, False),
        ("Never", ON_DISK_OLD, False, False),
    ],
)
def test_decide(policy: str, current: drv.DriverState, install: bool, load: bool) -> None:
    decision = drv.decide(policy, NEW, current)
    assert (decision.install, decision.load) == (install, load), decision.reason


def test_decide_needs_a_version_unless_never() -> None:
    with pytest.raises(ConfigError, match="version is required"):
        drv.decide("IfNotPresent", None, state(None, None))
    with pytest.raises(ConfigError, match="deploy_policy"):
        drv.decide("Sometimes", NEW, state(None, None))
    assert not drv.decide("Never", None, state(None, None)).install


def test_payload_kinds_and_commands(tmp_path: Path) -> None:
    for name in ("d.deb", "r.rpm", "i.run", "x.tar"):
        (tmp_path / name).write_text("x")
    assert drv.payload_kind(str(tmp_path)) == "dir"
    assert drv.payload_kind(str(tmp_path / "d.deb")) == "deb"
    assert drv.payload_kind(str(tmp_path / "r.rpm")) == "rpm"
    assert drv.payload_kind(str(tmp_path / "i.run")) == "run"
    assert drv.payload_kind(str(tmp_path / "x.tar"), "run") == "run"
    with pytest.raises(ConfigError, match="cannot tell its kind"):
        drv.payload_kind(str(tmp_path / "x.tar"))
    with pytest.raises(drv.PayloadError, match="does not exist"):
        drv.payload_kind(str(tmp_path / "missing.deb"))
    assert drv.install_commands("deb", "p.deb", "/") == [["dpkg", "-i", "p.deb"]]
    assert drv.install_commands("deb", "p.deb", "/sim") == [["dpkg-deb", "-x", "p.deb", "/sim"]]
    assert drv.install_commands("rpm", "p.rpm", "/")[0][:2] == ["rpm", "-U"]
    assert drv.install_commands("run", "p.run", "/", ("--silent",)) == [["sh", "p.run", "--silent"]]
    assert "--noexec" in drv.install_commands("run", "p.run", "/sim")[0]


def test_gpu_processes_from_proc(tmp_path: Path) -> None:
    fd = tmp_path / "proc" / "4242" / "fd"
    fd.mkdir(parents=True)
    (tmp_path / "proc" / "4242" / "comm").write_text("python3\n")
    os.symlink("/dev/dri/renderD128", fd / "3")
    other = tmp_path / "proc" / "77" / "fd"
    other.mkdir(parents=True)
    os.symlink("/dev/null", other / "0")
    found = drv.gpu_processes(str(tmp_path))
    assert found == [drv.GpuProcess(4242, "python3", "/dev/dri/renderD128")]
    assert "4242 (python3" in drv.busy_message(found)


def payload(tmp_path: Path, version: str = NEW, ko_version: str | None = NEW) -> Path:
    """A directory payload laid out like the host, as a vendor bundle would be."""
    base = tmp_path / f"payload-{version}"
    (base / "opt/mxdriver/lib").mkdir(parents=True)
    (base / "opt/mxdriver/Version.txt").write_text(f"Version:{version}\n")
    (base / "opt/mxdriver/lib/libmxsml.so").write_bytes(b"\x7fELF stand-in")
    (base / "opt/maca").mkdir(parents=True)
    (base / "opt/maca/Version.txt").write_text(f"Version:{SDK}\n")
    module = base / "lib/modules/6.1.0-sim/updates/metax.ko"
    module.parent.mkdir(parents=True)
    module.write_text(f"version={ko_version}\n" if ko_version else "no version\n")
    return base


def sim_root(tmp_path: Path, preset: str = "c500-8") -> Path:
    root = tmp_path / "host"
    sim.create(str(root), preset)
    return root


def run(root: Path, check: bool = False, **args: Any) -> dict[str, Any]:
    base = {
        "host_root": str(root),
        "load_command": [sys.executable, STANDIN, "--root", "{host_root}", "{module}"],
        "unload_command": [sys.executable, STANDIN, "--root", "{host_root}", "-r", "{module}"],
    }
    return run_module("gpu_driver", {**base, **args}, check_mode=check, diff=True)


def modprobe_log(root: Path) -> list[str]:
    path = root / "var/lib/gpuk8s-sim/modprobe.log"
    return path.read_text().splitlines() if path.exists() else []


def test_upgrade_from_a_directory_payload(tmp_path: Path) -> None:
    root = sim_root(tmp_path)
    bundle = payload(tmp_path)
    left_alone = run(root, version=NEW, payload=str(bundle))  # IfNotPresent: a driver runs
    assert not left_alone["changed"] and "leaves it alone" in left_alone["reason"]
    check = run(root, check=True, version=NEW, payload=str(bundle), deploy_policy="Always")
    assert check["changed"] and check["actions"] == ["unload", "install", "load"]
    assert discover(str(root)).driver.version == OLD and modprobe_log(root) == []
    result = run(root, version=NEW, payload=str(bundle), sdk_version=SDK, deploy_policy="Always")
    assert result["changed"], result
    assert result["before"]["loaded_version"] == OLD
    assert result["after"] == {"loaded": True, "loaded_version": NEW, "installed_version": NEW,
                               "sdk_version": SDK}
    inventory = discover(str(root))
    assert inventory.driver.version == NEW and inventory.sdk.version == SDK
    assert all(g.driver_bound for g in inventory.gpus)
    assert (root / "opt/mxdriver/lib/libmxsml.so").read_bytes() == b"\x7fELF stand-in"
    assert modprobe_log(root) == ["unload metax", f"load metax {NEW}"]
    again = run(root, version=NEW, payload=str(bundle), deploy_policy="Always")
    assert not again["changed"] and again["actions"] == []
    assert modprobe_log(root) == ["unload metax", f"load metax {NEW}"]


def test_refuses_to_unload_while_gpus_are_busy(tmp_path: Path) -> None:
    root = sim_root(tmp_path)
    fd = root / "proc/31337/fd"
    fd.mkdir(parents=True)
    (root / "proc/31337/comm").write_text("train.py\n")
    os.symlink("/dev/mxcd", fd / "4")
    bundle = payload(tmp_path)
    result = run(root, version=NEW, payload=str(bundle), deploy_policy="Always")
    assert result["failed"] and "31337 (train.py" in result["msg"]
    assert "force" in result["msg"]
    assert discover(str(root)).driver.version == OLD and modprobe_log(root) == []
    assert (root / "opt/mxdriver/Version.txt").read_text().strip() == f"Version:{OLD}"
    forced = run(root, version=NEW, payload=str(bundle), force=True, deploy_policy="Always")
    assert forced["changed"] and discover(str(root)).driver.version == NEW


def test_never_reports_only(tmp_path: Path) -> None:
    root = sim_root(tmp_path)
    result = run(root, deploy_policy="Never")
    assert not result["changed"] and result["before"] == result["after"]
    assert result["before"]["loaded_version"] == OLD


def test_version_mismatch_after_load_fails_and_says_so(tmp_path: Path) -> None:
    root = sim_root(tmp_path)
    # the package claims NEW but its kernel module is still the old one
    bundle = payload(tmp_path, ko_version=OLD)
    result = run(root, version=NEW, payload=str(bundle), deploy_policy="Always")
    assert result["failed"] and f"running driver is {OLD}" in result["msg"]
    # rolled back: the files on disk are the old driver's again, and it runs
    assert (root / "opt/mxdriver/Version.txt").read_text().strip() == f"Version:{OLD}"
    assert not (root / "lib/modules/6.1.0-sim/updates/metax.ko").exists()
    assert discover(str(root)).driver.version == OLD


def test_failed_load_reloads_the_previous_driver(tmp_path: Path) -> None:
    root = sim_root(tmp_path)
    bundle = payload(tmp_path)
    result = run(root, version=NEW, payload=str(bundle), deploy_policy="Always",
                 install_command=["sh", "-c", "echo disk full >&2; exit 3"])
    assert result["failed"] and "previous driver was loaded again" in result["msg"]
    assert discover(str(root)).driver.loaded


def test_missing_payload_or_version(tmp_path: Path) -> None:
    root = sim_root(tmp_path)
    assert "payload is required" in run(root, version=NEW, deploy_policy="Always")["msg"]
    assert "version is required" in run(root, payload=str(payload(tmp_path)))["msg"]
    wrong = run(root, version=NEW, payload=str(payload(tmp_path, version=OLD)),
                deploy_policy="Always")
    assert wrong["failed"] and f"holds driver {OLD}" in wrong["msg"]
    assert modprobe_log(root) == []  # refused before anything was touched
    assert "not a version" in run(root, version="2.33 beta", payload=str(tmp_path))["msg"]


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="dpkg-deb not installed")
def test_deb_payload_installs_onto_a_node_without_driver(tmp_path: Path) -> None:
    root = sim_root(tmp_path, "nodriver-8")
    tree = payload(tmp_path)
    (tree / "DEBIAN").mkdir()
    (tree / "DEBIAN/control").write_text(
        f"Package: metax-driver\nVersion: {NEW}\nArchitecture: all\n"
        "Maintainer: gpuk8s tests <tests@example.invalid>\nDescription: test payload\n"
    )
    deb = tmp_path / f"metax-driver_{NEW}_all.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(tree), str(deb)],
                   check=True, capture_output=True)
    assert not discover(str(root)).driver.loaded
    result = run(root, version=NEW, payload=str(deb))
    assert result["changed"], result
    assert result["payload_kind"] == "deb" and result["actions"] == ["install", "load"]
    assert result["before"]["loaded"] is False
    assert discover(str(root)).driver.version == NEW
    assert (root / "opt/maca/Version.txt").read_text() == f"Version:{SDK}\n"
