"""gpu_driver: deploy-policy decisions, payloads, and real installs on simulator roots.

The kernel is never touched: the load / unload commands point at the simulator's
modprobe, which records the load in the simulated /sys.
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
from gpuk8s.sim import kobject

from .simdriver import LOAD, RELEASE, UNLOAD, driver_payload, modprobe_log, module_path

OLD, NEW, SDK = "2.32.0.6", "2.33.0.6", "3.3.0.15"
OTHER = "6.1.0-13-amd64"  # a kernel release the simulated node does not run


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


def payload(tmp_path: Path, version: str = NEW, ko_version: str | None = None) -> Path:
    """A directory payload laid out like the host, as a vendor bundle would be."""
    return driver_payload(tmp_path / f"payload-{version}", version, module_version=ko_version,
                          sdk=SDK)


def sim_root(tmp_path: Path, preset: str = "c500-8") -> Path:
    root = tmp_path / "host"
    sim.create(str(root), preset)
    return root


def run(root: Path, check: bool = False, **args: Any) -> dict[str, Any]:
    base = {"host_root": str(root), "load_command": list(LOAD), "unload_command": list(UNLOAD)}
    return run_module("gpu_driver", {**base, **args}, check_mode=check, diff=True)


def test_upgrade_from_a_directory_payload(tmp_path: Path) -> None:
    root = sim_root(tmp_path)
    bundle = payload(tmp_path)
    left_alone = run(root, version=NEW, payload=str(bundle))  # IfNotPresent: a driver runs
    assert not left_alone["changed"] and "leaves it alone" in left_alone["reason"]
    check = run(root, check=True, version=NEW, payload=str(bundle), deploy_policy="Always")
    assert check["changed"] and check["actions"] == ["install", "unload", "load"]
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


def test_a_module_whose_modinfo_version_is_not_the_payloads_is_refused_before_the_unload(
        tmp_path: Path) -> None:
    root = sim_root(tmp_path)
    # the bundle says NEW (Version.txt) but its kernel module is still the old one
    bundle = payload(tmp_path, ko_version=OLD)
    result = run(root, version=NEW, payload=str(bundle), deploy_policy="Always")
    assert result["failed"] and f"extra/metax.ko is driver {OLD} (its .modinfo version), " \
        f"but its opt/mxdriver/Version.txt says {NEW}" in result["msg"], result["msg"]
    assert modprobe_log(root) == []  # never unloaded
    assert (root / "opt/mxdriver/Version.txt").read_text().strip() == f"Version:{OLD}"
    assert not (root / "opt/mxdriver/lib").exists()
    assert discover(str(root)).driver.version == OLD


def test_a_failed_install_leaves_the_running_driver_alone(tmp_path: Path) -> None:
    root = sim_root(tmp_path)
    bundle = payload(tmp_path)
    result = run(root, version=NEW, payload=str(bundle), deploy_policy="Always",
                 install_command=["sh", "-c", "echo disk full >&2; exit 3"])
    assert result["failed"] and "disk full" in result["msg"]
    assert f"the previous driver ({OLD}) runs" in result["msg"]
    assert modprobe_log(root) == [] and discover(str(root)).driver.version == OLD


def test_a_failed_load_reloads_the_previous_driver(tmp_path: Path) -> None:
    root = sim_root(tmp_path)
    bundle = payload(tmp_path)
    result = run(root, version=NEW, payload=str(bundle), deploy_policy="Always",
                 load_command=["sh", "-c", f'grep -q {NEW} "$0/opt/mxdriver/Version.txt" && '
                               f'exit 5; exec "{sys.executable}" "$0/usr/sbin/modprobe" "$1"',
                               "{host_root}", "{module}"],
                 resolve_command=[*LOAD[:2], *drv.RESOLVE_ARGS])  # the new one fails to load
    assert result["failed"] and "previous driver was loaded again" in result["msg"]
    assert modprobe_log(root) == ["unload metax", f"load metax {OLD}"]
    assert discover(str(root)).driver.version == OLD


def leftover(root: Path, rel: str, version: str) -> Path:
    """A module another installer left in the root (``rel`` under lib/modules/RELEASE),
    compressed as its suffix says."""
    path = root / f"lib/modules/{RELEASE}" / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    plain = path.with_name("metax.ko")
    had = plain.read_bytes() if plain.exists() and plain != path else None
    kobject.write_module(str(plain), "metax", version, RELEASE)
    if path != plain:
        data = plain.read_bytes()
        if path.suffix == ".xz":
            import lzma
            path.write_bytes(lzma.compress(data, check=lzma.CHECK_CRC32))
        else:
            subprocess.run(["zstd", "-q", "-f", "-o", str(path), str(plain)], check=True)
        if had is None:
            plain.unlink()
        else:
            plain.write_bytes(had)
    return path


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.is_symlink() and "proc" not in p.parts
            and "sys" not in p.parts}


LEFT = {
    # case: (where the other file is, depmod run since it came, what the refusal says)
    "DKMS, indexed": ("updates/dkms/metax.ko", True,
                      f"kmod loads /lib/modules/{RELEASE}/updates/dkms/metax.ko now, under "
                      "updates/, which it searches before the payload's"),
    "DKMS, not indexed yet": ("updates/dkms/metax.ko", False,
                              f"kmod would load /lib/modules/{RELEASE}/updates/dkms/metax.ko "
                              f"(driver {OLD}), not the payload's"),
    "xz beside": ("extra/metax.ko.xz", False,
                  f"/lib/modules/{RELEASE}/extra/metax.ko.xz is another metax module beside "
                  "the payload's"),
    "zstd in the kernel tree": ("kernel/drivers/gpu/metax.ko.zst", True,
                                f"/lib/modules/{RELEASE}/kernel/drivers/gpu/metax.ko.zst is "
                                "another metax module"),
}


@pytest.mark.parametrize("case", sorted(LEFT))
def test_a_module_another_installer_left_is_found_before_the_unload(
        tmp_path: Path, case: str) -> None:
    """A same-named module kmod prefers (a DKMS build under updates/), or one depmod ranks
    with the payload's (an old compressed one beside it): refused before anything
    changes (check mode says so too) where kmod's lookup on the node as it is, or the
    files, show it; else kmod's lookup after the copy, before the unload, finds it and
    every file is put back. The running driver is never unloaded."""
    rel, indexed, said = LEFT[case]
    root = sim_root(tmp_path)
    leftover(root, rel, OLD)
    if indexed:  # as dkms does after its build
        assert subprocess.run([str(root / "usr/sbin/depmod"), "-a"], check=False).returncode == 0
    before = snapshot(root)
    args = dict(version=NEW, payload=str(payload(tmp_path)), deploy_policy="Always")
    planned = run(root, check=True, **args)
    result = run(root, **args)
    assert result["failed"] and said in result["msg"], result["msg"]
    untouched = "nothing was changed" in result["msg"]
    assert untouched != ("The running driver was not unloaded" in result["msg"])
    assert planned.get("failed", False) == untouched, planned  # check mode predicts it
    assert modprobe_log(root) == [] and discover(str(root)).driver.version == OLD
    after = snapshot(root)
    index = f"lib/modules/{RELEASE}/modules."  # depmod's output, written again

    def kept(files: dict[str, bytes]) -> dict[str, bytes]:
        return {k: v for k, v in files.items() if untouched or not k.startswith(index)}

    assert kept(after) == kept(before)
    assert not (root / "var/lib/gpuk8s/driver-install.json").exists()


def test_a_module_compressed_as_the_nodes_kmod_cannot_read_is_refused(tmp_path: Path) -> None:
    """The simulated node's kmod is Debian 12's (`kmod -V`: +ZSTD +XZ -ZLIB): a .ko.gz
    payload could not be loaded there, and is refused before anything changes."""
    import gzip

    root = sim_root(tmp_path)
    bundle = payload(tmp_path)
    ko = module_path(bundle)
    ko.with_name("metax.ko.gz").write_bytes(gzip.compress(ko.read_bytes()))
    ko.unlink()
    before = snapshot(root)
    result = run(root, version=NEW, payload=str(bundle), deploy_policy="Always")
    assert result["failed"] and "metax.ko.gz is gz-compressed, and this node's kmod was " \
        "built without ZLIB (`kmod -V` says -ZLIB)" in result["msg"], result["msg"]
    assert snapshot(root) == before and modprobe_log(root) == []


def test_a_zstd_compressed_payload_module_is_read_and_loaded(tmp_path: Path) -> None:
    root = sim_root(tmp_path, "nodriver-8")
    bundle = payload(tmp_path)
    subprocess.run(["zstd", "-q", "--rm", str(module_path(bundle))], check=True)
    assert (bundle / f"lib/modules/{RELEASE}/extra/metax.ko.zst").exists()
    result = run(root, version=NEW, payload=str(bundle), deploy_policy="Always")
    assert not result.get("failed") and result["after"]["loaded_version"] == NEW, result


def test_missing_payload_or_version(tmp_path: Path) -> None:
    root = sim_root(tmp_path)
    assert "payload is required" in run(root, version=NEW, deploy_policy="Always")["msg"]
    assert "version is required" in run(root, payload=str(payload(tmp_path)))["msg"]
    wrong = run(root, version=NEW, payload=str(payload(tmp_path, version=OLD)),
                deploy_policy="Always")
    assert wrong["failed"] and f"holds driver {OLD}" in wrong["msg"]
    assert modprobe_log(root) == []  # refused before anything was touched
    assert "not a version" in run(root, version="2.33 beta", payload=str(tmp_path))["msg"]


def deb_of(tree: Path) -> Path:
    """The payload tree ``tree`` as a vendor's .deb (dpkg-deb: Debian's dpkg, essential)."""
    (tree / "DEBIAN").mkdir()
    (tree / "DEBIAN/control").write_text(
        f"Package: metax-driver\nVersion: {NEW}\nArchitecture: all\n"
        "Maintainer: gpuk8s tests <tests@example.invalid>\nDescription: test payload\n"
    )
    deb = tree.parent / f"metax-driver_{NEW}_all.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(tree), str(deb)],
                   check=True, capture_output=True)
    return deb


def test_deb_payload_installs_onto_a_node_without_driver(tmp_path: Path) -> None:
    root = sim_root(tmp_path, "nodriver-8")
    deb = deb_of(payload(tmp_path))
    assert not discover(str(root)).driver.loaded
    result = run(root, version=NEW, payload=str(deb))
    assert result["changed"], result
    assert result["payload_kind"] == "deb" and result["actions"] == ["install", "load"]
    assert result["before"]["loaded"] is False
    assert discover(str(root)).driver.version == NEW
    assert (root / "opt/maca/Version.txt").read_text() == f"Version:{SDK}\n"


def unchanged(root: Path) -> dict[str, bytes]:
    """The driver's files on the host (to show nothing was touched)."""
    return {str(p.relative_to(root)): p.read_bytes()
            for base in ("opt/mxdriver", "lib/modules") for p in sorted((root / base).rglob("*"))
            if p.is_file()}


@pytest.mark.parametrize("where", ["its own directory", "the running kernel's directory"])
def test_a_payload_for_another_kernel_is_refused_before_anything_changes(
    tmp_path: Path, where: str
) -> None:
    root = sim_root(tmp_path)
    bundle = driver_payload(tmp_path / "payload", NEW)
    if where == "its own directory":
        shutil.rmtree(bundle / "lib")
    # built for another kernel, in its own directory or in the running kernel's
    at = module_path(bundle, OTHER if where == "its own directory" else RELEASE)
    kobject.write_module(str(at), "metax", NEW, OTHER)
    files = unchanged(root)
    result = run(root, version=NEW, payload=str(bundle), deploy_policy="Always")
    assert result["failed"]
    assert OTHER in result["msg"] and f"runs kernel {RELEASE}" in result["msg"]
    assert "nothing was changed" in result["msg"]
    assert modprobe_log(root) == [] and unchanged(root) == files
    assert discover(str(root)).driver.version == OLD


def test_the_kernel_release_is_the_nodes_own(tmp_path: Path) -> None:
    """A payload built for the kernel the node ran until its kernel was upgraded."""
    root = sim_root(tmp_path)
    (root / "proc/sys/kernel/osrelease").write_text("5.15.0-100-generic\n")
    bundle = str(payload(tmp_path))
    result = run(root, version=NEW, payload=bundle, deploy_policy="Always")
    assert result["failed"] and f"(kernel {RELEASE})" in result["msg"]
    assert "runs kernel 5.15.0-100-generic" in result["msg"] and modprobe_log(root) == []
    check = run(root, check=True, version=NEW, payload=bundle, deploy_policy="Always")
    assert check["failed"] and "runs kernel 5.15.0-100-generic" in check["msg"]
    # no osrelease under the root (no /proc mounted there): a container shares its host's
    # kernel, so it is this process's own, and the message says where it came from
    (root / "proc/sys/kernel/osrelease").unlink()
    mine = run(root, version=NEW, payload=bundle, deploy_policy="Always")
    assert mine["failed"] and f"runs kernel {os.uname().release} (uname -r here: no" in \
        mine["msg"]


def test_a_payload_without_version_txt_is_refused_before_the_unload(tmp_path: Path) -> None:
    root = sim_root(tmp_path)
    bundle = payload(tmp_path)
    (bundle / "opt/mxdriver/Version.txt").unlink()
    result = run(root, version=NEW, payload=str(bundle), deploy_policy="Always")
    assert result["failed"] and "has no opt/mxdriver/Version.txt" in result["msg"]
    assert modprobe_log(root) == []  # the running driver was never unloaded
    assert discover(str(root)).driver.version == OLD


def test_a_payload_whose_module_is_not_a_module_is_refused(tmp_path: Path) -> None:
    root = sim_root(tmp_path)
    bundle = payload(tmp_path)
    module_path(bundle).write_text(f"version={NEW}\n")
    result = run(root, version=NEW, payload=str(bundle), deploy_policy="Always")
    assert result["failed"] and "not an ELF file" in result["msg"]
    assert modprobe_log(root) == []


def test_depmod_indexes_the_module_for_the_running_kernel(tmp_path: Path) -> None:
    """kmod's modprobe finds the new module only through modules.dep: without the depmod
    step the simulated modprobe (as the real one) says "Module metax not found"."""
    root = sim_root(tmp_path, "nodriver-8")
    bundle = driver_payload(tmp_path / "payload", NEW)
    shutil.rmtree(bundle / "lib")  # the module where a vendor's bundle has it: updates/
    kobject.write_module(str(bundle / f"lib/modules/{RELEASE}/updates/metax.ko"), "metax", NEW,
                         RELEASE)
    result = run(root, version=NEW, payload=str(bundle))
    assert result["changed"] and result["after"]["loaded_version"] == NEW, result
    assert (root / f"lib/modules/{RELEASE}/modules.dep").read_text() == "updates/metax.ko:\n"
    missing = run(sim_root(tmp_path / "other", "nodriver-8"), version=NEW, payload=str(bundle),
                  depmod_command=["no-such-depmod", "{kernel_release}"])
    assert missing["failed"] and "no-such-depmod not found" in missing["msg"]
    assert "nothing was changed" in missing["msg"]


def test_a_package_for_another_kernel_is_refused_before_the_unload(tmp_path: Path) -> None:
    root = sim_root(tmp_path)
    deb = deb_of(driver_payload(tmp_path / "tree", NEW, release=OTHER))
    files = unchanged(root)
    result = run(root, version=NEW, payload=str(deb), deploy_policy="Always")
    assert result["failed"] and "(unpacked)" in result["msg"]
    assert OTHER in result["msg"] and f"runs kernel {RELEASE}" in result["msg"]
    assert modprobe_log(root) == [] and unchanged(root) == files
    assert not list((root / "var/lib/gpuk8s").glob(".gpuk8s-driver-*"))
