"""Host operations (gpuk8s.host): journalled installs, crash recovery, ownership, SDK
install / rollback, and the decision tables of the operator scheme (SDK image by product
and OS, vfnum validation)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuk8s import sim
from gpuk8s.ansible.harness import run_module
from gpuk8s.core.errors import ConfigError
from gpuk8s.core.payloads import NodePlatform, parse_sdk_image, select_sdk_image
from gpuk8s.core.vfconfig import allowed_vfnums, check_node, parse_node_vfnums
from gpuk8s.discovery import discover, metax
from gpuk8s.discovery.tools import default_runner
from gpuk8s.host import driver as drv
from gpuk8s.host import files, sdk
from gpuk8s.host.readiness import clear_readiness, read_readiness, write_readiness

from .simdriver import LOAD, RELEASE, UNLOAD, driver_payload, modprobe_log, module_path

OLD, NEW = "2.32.0.6", "2.33.0.6"


@pytest.fixture(autouse=True)
def fast_fake_tools(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}")


def request(root: Path, bundle: Path, **kw: object) -> drv.InstallRequest:
    base: dict[str, object] = dict(
        policy="Always", version=NEW, payload=str(bundle), load_command=LOAD,
        unload_command=UNLOAD,
    )
    base.update(kw)
    return drv.InstallRequest(**base)  # type: ignore[arg-type]


def payload(tmp_path: Path, version: str = NEW) -> Path:
    return driver_payload(tmp_path / f"payload-{version}", version)


def two_trees(tmp_path: Path, root_name: str) -> tuple[Path, Path]:
    """(root, src): ``src`` replaces root's ``a/keep.txt`` and adds ``a/new/file``."""
    root, src = tmp_path / root_name, tmp_path / "src"
    (root / "a").mkdir(parents=True)
    (root / "a/keep.txt").write_text("old")
    (src / "a/new").mkdir(parents=True)
    (src / "a/keep.txt").write_text("new")
    (src / "a/new/file").write_text("x")
    return root, src


def test_install_tree_rolls_back_replaced_and_created_files(tmp_path: Path) -> None:
    root, src = two_trees(tmp_path, "root")
    journal, backup = str(tmp_path / "j.json"), str(tmp_path / "backup")
    files.install_tree(str(src), str(root), journal, backup)
    assert (root / "a/keep.txt").read_text() == "new" and (root / "a/new/file").exists()
    files.rollback(journal, str(root))
    assert (root / "a/keep.txt").read_text() == "old"
    assert not (root / "a/new").exists() and not os.path.exists(journal)
    assert not os.path.exists(backup)


def installed_tree(tmp_path: Path, backup_inside: bool = True) -> tuple[Path, Path, Path]:
    """A tree installed through the mount point ``pod/host`` (a symlink to ``host``),
    then that mount point gone: (host, journal, backup as the writer named it)."""
    host, src = two_trees(tmp_path, "host")
    (tmp_path / "pod").mkdir()
    mount = tmp_path / "pod/host"
    mount.symlink_to(host)
    journal = host / "var/lib/gpuk8s/driver-install.json"
    backup = mount / "var/lib/gpuk8s/driver-backup" if backup_inside else \
        tmp_path / "pod/backup"
    files.install_tree(str(src), str(mount), str(mount / journal.relative_to(host)),
                       str(backup))
    return host, journal, backup


def test_a_journal_is_replayed_from_another_mount_point(tmp_path: Path) -> None:
    host, journal, _ = installed_tree(tmp_path)
    written = json.loads(journal.read_text())
    assert written["backup"] == "var/lib/gpuk8s/driver-backup"  # relative to the root
    assert written["created"] == ["a/new/file"] and written["replaced"] == ["a/keep.txt"]
    (tmp_path / "pod/host").unlink()
    assert files.rollback(str(journal), str(host)) is not None
    assert (host / "a/keep.txt").read_text() == "old" and not (host / "a/new").exists()
    assert sorted(str(p.relative_to(host)) for p in host.rglob("*")) == [
        "a", "a/keep.txt", "var", "var/lib", "var/lib/gpuk8s"]


def test_an_old_journal_with_absolute_paths_is_translated_or_refused(tmp_path: Path) -> None:
    """Format 1 (no "format"): absolute root and backup as the writer saw them. A backup
    inside that root is found under the reader's root; one outside it cannot be, and
    the rollback refuses with every file as it is and the journal kept."""
    host, journal, backup = installed_tree(tmp_path)
    old = {**json.loads(journal.read_text()), "root": str(tmp_path / "pod/host"),
           "backup": str(backup)}
    del old["format"]
    journal.write_text(json.dumps(old))
    (tmp_path / "pod/host").unlink()
    files.rollback(str(journal), str(host))
    assert (host / "a/keep.txt").read_text() == "old" and not (host / "a/new").exists()
    assert not journal.exists() and not (host / "var/lib/gpuk8s/driver-backup").exists()

    outside = tmp_path / "outside"
    outside.mkdir()
    host, journal, backup = installed_tree(outside, backup_inside=False)
    assert json.loads(journal.read_text())["backup"] == str(backup)  # absolute: outside
    (outside / "pod/host").unlink()
    old = {**json.loads(journal.read_text()), "root": str(outside / "pod/host")}
    del old["format"]
    journal.write_text(json.dumps(old))
    with pytest.raises(files.HostFileError, match="outside that tree: it cannot be replayed"):
        files.rollback(str(journal), str(host))
    assert (host / "a/keep.txt").read_text() == "new" and journal.exists()


def test_a_journal_whose_backup_is_gone_is_refused(tmp_path: Path) -> None:
    host, journal, backup = installed_tree(tmp_path, backup_inside=False)
    shutil.rmtree(backup)
    with pytest.raises(files.HostFileError, match="the backup of 1 replaced file"):
        files.rollback(str(journal), str(host))
    assert (host / "a/keep.txt").read_text() == "new" and (host / "a/new/file").exists()
    assert journal.exists()


# A driver-manager process killed with SIGKILL at a point of an upgrade; the copy point
# is reached inside its own process (shutil.copy2 of the temp file, before the rename),
# the load point in its load command, which loads and then waits to be killed.
KILLED_RUN = """
import shutil, sys, time
ready, point = sys.argv[1], sys.argv[2]
copy = shutil.copy2

def copy2(src, dst, **kw):
    out = copy(src, dst, **kw)
    if point == "copy" and dst.endswith("libmxsml.so.gpuk8s-new"):
        open(ready, "w").close()
        time.sleep(600)
    return out

shutil.copy2 = copy2
from gpuk8s.services.drivermanager.main import main
sys.exit(main(sys.argv[3:]))
"""


def driver_manager_args(root: Path, payload_dir: Path, policy: str, load: str) -> list[str]:
    return ["--payload", "driver", "--deploy-policy", policy, "--driver-version", NEW,
            "--payload-image", "reg/driver-image:x", "--payload-dir", str(payload_dir),
            "--no-api", "--once", "--host-root", str(root), "--log-dir", "",
            "--load-command", load,
            "--unload-command", f"{sys.executable} {{host_root}}/usr/sbin/modprobe -r {{module}}",
            "--depmod-command", f"{tool('depmod')} -a -b {{host_root}} {{kernel_release}}"]


def tool(name: str) -> str:
    found = shutil.which(name, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")
    assert found, f"{name} not found: install Debian's kmod (scripts/prereqs unit)"
    return found


def kill_at(tmp_path: Path, root: Path, point: str) -> None:
    """Run an upgrade OLD -> NEW in a driver-manager process and SIGKILL it (and its load
    command) at ``point``: "copy" (half-way through the payload copy) or "load" (the new
    module is loaded, nothing committed yet)."""
    payload_dir = tmp_path / "payload"
    driver_payload(payload_dir / "driver", NEW)
    (payload_dir / "driver.complete").write_text("reg/driver-image:x\n")
    ready = tmp_path / f"at-{point}"
    load = f"{sys.executable} {{host_root}}/usr/sbin/modprobe {{module}}"
    if point == "load":
        waits = tmp_path / "load-then-wait"
        # kmod's lookup (the load command's program with --show-depends) goes through
        waits.write_text(f"#!/bin/sh\nr=$1; shift\n"
                         f"[ \"$1\" = --show-depends ] && exec {sys.executable} "
                         f"\"$r/usr/sbin/modprobe\" \"$@\"\n"
                         f"{sys.executable} \"$r/usr/sbin/modprobe\" \"$1\" || exit\n"
                         f"touch {ready}\nexec sleep 600\n")
        waits.chmod(0o755)
        load = f"{waits} {{host_root}} {{module}}"
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_RUN, str(ready), point,
         *driver_manager_args(root, payload_dir, "Always", load)],
        start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, f"the upgrade never reached {point}"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # kill -9: the process and its load command
        proc.wait(30)
    assert proc.returncode == -signal.SIGKILL


def restart_with_never(tmp_path: Path, root: Path) -> dict[str, object]:
    """What a restarted driver-manager with deployPolicy Never reports (and recovers)."""
    load = f"{sys.executable} {{host_root}}/usr/sbin/modprobe {{module}}"
    out = subprocess.run(
        [str(Path(sys.executable).parent / "gpuk8s"), "serve", "driver-manager",
         *driver_manager_args(root, tmp_path / "payload", "Never", load)],
        capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    report: dict[str, object] = json.loads(out.stdout)
    return report


def leftovers(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if p.name.endswith(".gpuk8s-new") or p.name.startswith(drv.STAGING_PREFIX))


def test_kill_9_half_way_through_the_copy_is_rolled_back_exactly(tmp_path: Path) -> None:
    root = tmp_path / "host"
    sim.create(str(root), "c500-8")
    ko = module_path(root)
    before = {p: (root / p).read_bytes() for p in ("opt/mxdriver/Version.txt", str(ko))}
    kill_at(tmp_path, root, "copy")
    # half-installed while the old driver runs on: the journal names what to undo
    assert (root / drv.JOURNAL.lstrip("/")).exists() and leftovers(root)
    assert discover(str(root)).driver.version == OLD
    report = restart_with_never(tmp_path, root)
    assert report["state"] == "ready", report
    assert report["version"] == OLD
    assert {p: (root / p).read_bytes() for p in before} == before
    assert leftovers(root) == [] and not (root / "opt/mxdriver/lib").exists()
    assert not (root / drv.BACKUP.lstrip("/")).exists()
    assert not (root / drv.TRANSACTION.lstrip("/")).exists()
    assert modprobe_log(root) == []  # the running driver was never unloaded
    assert drv.recover(str(root), drv.InstallRequest(), default_runner) is None


def test_kill_9_after_loading_the_new_module_restores_the_old_driver_and_mode(
    tmp_path: Path,
) -> None:
    root = tmp_path / "host"
    sim.create(str(root), "c500-8")
    drv.record_owner(str(root), OLD, "driver-manager")  # OLD was driver-manager's: cloud
    kill_at(tmp_path, root, "load")
    assert discover(str(root)).driver.version == NEW  # loaded, never committed
    report = restart_with_never(tmp_path, root)
    assert report["state"] == "ready", report
    assert (report["version"], report["mode"], report["policy"]) == (OLD, "cloud", "Never")
    inventory = discover(str(root))
    assert inventory.driver.version == OLD and str(inventory.driver.mode) == "cloud"
    assert (root / "opt/mxdriver/Version.txt").read_text().strip() == f"Version:{OLD}"
    assert modprobe_log(root) == ["unload metax", f"load metax {NEW}", "unload metax",
                                  f"load metax {OLD}"]
    assert leftovers(root) == [] and not (root / "opt/mxdriver/lib").exists()
    # modules.dep is the old files' again: the old module loads after a reboot too
    assert (root / f"lib/modules/{RELEASE}/modules.dep").read_text() == "extra/metax.ko:\n"


def test_the_maintenance_playbooks_driver_task_rolls_back_a_killed_upgrade_then_installs(
    tmp_path: Path,
) -> None:
    """After an operator uninstall no driver-manager is left to restart on the node;
    playbooks/maintenance.yml's gpu_driver task (what the uninstall warning points to)
    runs the same recovery first: the killed upgrade is rolled back, then the version
    given is installed."""
    root = tmp_path / "host"
    sim.create(str(root), "c500-8")
    assert drv.interrupted(str(root)) is None
    kill_at(tmp_path, root, "load")
    assert (root / drv.JOURNAL.lstrip("/")).exists()
    args = {"host_root": str(root), "load_command": list(LOAD), "unload_command": list(UNLOAD),
            "version": NEW, "payload": str(tmp_path / "payload" / "driver"),
            "deploy_policy": "Always"}
    # the role's plan (check mode): NEW runs, as wanted, but the install never committed;
    # the plan says so, so the node is not skipped as "nothing to do"; nothing changes
    plan = run_module("gpu_driver", args, check_mode=True)
    assert plan["changed"] and plan["actions"][0] == "recover", plan
    assert "interrupted" in plan["recovered"]
    assert discover(str(root)).driver.version == NEW
    assert (root / drv.JOURNAL.lstrip("/")).exists()
    result = run_module("gpu_driver", args)
    assert result["changed"] and not result.get("failed"), result
    assert result["actions"][0] == "recover" and "rolled back" in result["recovered"]
    assert result["before"]["loaded_version"] == OLD  # rolled back before the plan
    assert discover(str(root)).driver.version == NEW
    assert modprobe_log(root) == ["unload metax", f"load metax {NEW}", "unload metax",
                                  f"load metax {OLD}", "unload metax", f"load metax {NEW}"]
    assert leftovers(root) == []
    assert not (root / drv.JOURNAL.lstrip("/")).exists()
    assert not (root / drv.TRANSACTION.lstrip("/")).exists()
    assert drv.interrupted(str(root)) is None
    again = run_module("gpu_driver", args, check_mode=True)
    assert not again["changed"] and again["recovered"] == "" and again["actions"] == []


def test_check_mode_reports_what_recover_would_do_and_nothing_else(tmp_path: Path) -> None:
    """``interrupted`` (check mode) and ``recover`` read the same leftovers: an unreadable
    transaction record with no journal is nothing to recover for either (a plan that
    said otherwise would report a change on every run)."""
    root = tmp_path / "host"
    sim.create(str(root), "c500-8")
    record = root / drv.TRANSACTION.lstrip("/")
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text("{not json")
    assert drv.interrupted(str(root)) is None
    assert drv.recover(str(root), drv.InstallRequest(), default_runner) is None
    (root / drv.STATE_DIR.lstrip("/") / f"{drv.STAGING_PREFIX}x").mkdir()
    assert drv.interrupted(str(root)) == (
        f"what an interrupted driver install left is removed first: {drv.STAGING_PREFIX}x")
    assert drv.recover(str(root), drv.InstallRequest(), default_runner) == (
        f"removed what an interrupted driver install left: {drv.STAGING_PREFIX}x")
    assert drv.interrupted(str(root)) is None


def test_ownership_record_makes_the_driver_cloud_until_someone_replaces_it(
    tmp_path: Path,
) -> None:
    root = tmp_path / "host"
    sim.create(str(root), "nodriver-8")
    assert not discover(str(root)).driver.loaded
    outcome = drv.converge(str(root), request(root, payload(tmp_path), policy="IfNotPresent",
                                              owner="driver-manager"), default_runner)
    assert outcome.actions == ["install", "load"]
    assert outcome.after.mode == "cloud" and outcome.after.loaded_version == NEW
    assert str(discover(str(root)).driver.mode) == "cloud"
    # the admin installs another version with their own tooling: native again
    drv.converge(str(root), request(root, payload(tmp_path, OLD), version=OLD), default_runner)
    assert str(discover(str(root)).driver.mode) == "native"


def test_sdk_install_is_a_symlink_switch_with_rollback(tmp_path: Path) -> None:
    root = tmp_path / "host"
    root.mkdir()
    first, second = tmp_path / "sdk1", tmp_path / "sdk2"
    for tree, version in ((first, "2.32.0.4"), (second, "2.33.0.4")):
        (tree / "lib").mkdir(parents=True)
        (tree / "Version.txt").write_text(f"Version:{version}\n")
    assert sdk.install_sdk(str(root), str(first)) == (True, "2.32.0.4")
    assert sdk.install_sdk(str(root), str(first)) == (False, "2.32.0.4")
    killed = root / "opt/.gpuk8s-maca/.incoming-99999"  # a copy a killed process left
    (killed / "lib").mkdir(parents=True)
    assert sdk.install_sdk(str(root), str(second)) == (True, "2.33.0.4")
    assert not killed.exists()
    state = sdk.read_sdk(str(root))
    assert state.managed and state.version == "2.33.0.4" and state.previous == "2.32.0.4"
    assert metax.sdk_info(str(root))[0].version == "2.33.0.4"
    assert sdk.rollback_sdk(str(root)) == "2.32.0.4"
    assert sdk.read_sdk(str(root)).version == "2.32.0.4"
    with pytest.raises(drv.PayloadError, match=r"holds SDK 2\.33\.0\.4 .*, not 9\.9"):
        sdk.install_sdk(str(root), str(second), want_version="9.9")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(drv.PayloadError, match=r"no Version\.txt"):
        sdk.install_sdk(str(root), str(empty))


def test_an_administrators_sdk_directory_is_left_alone(tmp_path: Path) -> None:
    root = tmp_path / "host"
    sim.create(str(root), "c500-8")  # /opt/maca is a plain directory
    staged = tmp_path / "sdk"
    staged.mkdir()
    (staged / "Version.txt").write_text("Version:9.0\n")
    assert sdk.read_sdk(str(root)).native
    with pytest.raises(drv.PayloadError, match="left alone"):
        sdk.install_sdk(str(root), str(staged))


IMAGES = [
    "maca-c500:2.33.0.4-ubuntu22.04-amd64",
    "maca-c500:2.33.0.4-ubuntu18.04-amd64",
    "maca-c500:2.33.0.4-centos8-amd64",
    "maca-c500:2.33.0.4-ubuntu22.04-arm64",
    "maca-n100:2.33.0.4-ubuntu22.04-amd64",
]


@pytest.mark.parametrize(
    ("product", "os_id", "os_version", "arch", "expected"),
    [
        ("C500", "ubuntu", "22.04", "x86_64", IMAGES[0]),
        ("C500", "ubuntu", "18.04", "x86_64", IMAGES[1]),
        ("C500", "ubuntu", "20.04", "x86_64", IMAGES[1]),  # newest not above the node's
        ("C500", "centos", "8", "x86_64", IMAGES[2]),
        ("C500", "ubuntu", "22.04", "aarch64", IMAGES[3]),
        ("C550", "ubuntu", "22.04", "x86_64", IMAGES[0]),  # C-series share the C500 SDK
        ("N260", "ubuntu", "22.04", "x86_64", IMAGES[4]),
        ("C500", "openeuler", "22.03", "x86_64", None),
        ("C500", "ubuntu", "16.04", "x86_64", None),
        ("H100", "ubuntu", "22.04", "x86_64", None),
    ],
)
def test_sdk_image_by_product_and_os(
    product: str, os_id: str, os_version: str, arch: str, expected: str | None
) -> None:
    node = NodePlatform(product, os_id, os_version, arch)
    if expected is None:
        with pytest.raises(ConfigError, match="no SDK image for this node"):
            select_sdk_image(IMAGES, node)
    else:
        assert select_sdk_image(IMAGES, node).ref == expected


def test_own_product_image_wins_over_the_lines() -> None:
    images = ["maca-c500:1-ubuntu22.04-amd64", "maca-c550:1-ubuntu22.04-amd64"]
    node = NodePlatform("C550", "ubuntu", "22.04", "x86_64")
    assert select_sdk_image(images, node).name == "maca-c550"
    assert parse_sdk_image("reg.example.com/p/maca-c500:2.18.0.3-ubuntu18.04-amd64").os == "ubuntu"
    with pytest.raises(ConfigError, match="explicit tag"):
        parse_sdk_image("maca-c500")


@pytest.mark.parametrize(
    ("document", "wanted", "bad_nodes"),
    [
        ({"nodes": {"a": {"vfnum": 4}, "b": {"vfnum": 0}}}, {"a": 4, "b": 0}, []),
        ({"nodes": {"a": {"vfnum": 3}, "b": {"vfnum": 2}}}, {"b": 2}, ["a"]),
        ({"nodes": {"a": {"vfnum": "4"}}}, {}, ["a"]),
        ({"nodes": {"a": {"vfnum": True}}}, {}, ["a"]),
        ({"nodes": {"a": {"vfnum": 16}}}, {}, ["a"]),
        ({"nodes": {"a": 4}}, {}, ["a"]),
        ({"nodes": {"a": {"vfnum": 2, "extra": 1}}}, {}, ["a"]),
        ({"nodes": ["a"]}, {}, [None]),
        (["nodes"], {}, [None]),
        ({"node": {}}, {}, [None]),
        (None, {}, []),
        ({"nodes": None}, {}, []),
    ],
)
def test_vfnum_document_validation(
    document: object, wanted: dict[str, int], bad_nodes: list[str | None]
) -> None:
    got, problems = parse_node_vfnums(document)
    assert got == wanted
    assert [p.node for p in problems] == bad_nodes
    for problem in problems:
        if problem.node:
            assert problem.node in problem.message


@pytest.mark.parametrize(
    ("product", "sriov", "vfnum", "ok"),
    [
        ("C500", "off", 4, True),
        ("C500", "on", 8, True),
        ("C500", "off", 0, True),
        ("N260", "forbidden", 2, False),
        ("N260", "forbidden", 0, True),
        ("C500", "forbidden", 1, False),
        ("X999", "off", 8, True),  # unknown product: the node agent checks sriov_totalvfs
    ],
)
def test_vfnum_allowed_per_product(product: str, sriov: str, vfnum: int, ok: bool) -> None:
    problem = check_node("gpu-1", vfnum, product, sriov)
    assert (problem is None) is ok
    if problem:
        assert "gpu-1" in problem.message and str(vfnum) in problem.message
    assert 0 in allowed_vfnums(product, sriov)


def test_readiness_markers_round_trip(tmp_path: Path) -> None:
    assert read_readiness(str(tmp_path)) == {}
    assert write_readiness(str(tmp_path), "maca.ready", True)
    assert not write_readiness(str(tmp_path), "maca.ready", True)
    assert write_readiness(str(tmp_path), "runtime.ready", False)
    assert read_readiness(str(tmp_path)) == {"maca.ready": True, "runtime.ready": False}
    assert clear_readiness(str(tmp_path), "maca.ready")
    assert read_readiness(str(tmp_path)) == {"runtime.ready": False}
    with pytest.raises(ConfigError, match="readiness key"):
        write_readiness(str(tmp_path), "driver.ready", True)


# A driver-manager process that SIGKILLs itself before its N-th host-changing call
# (a file written, renamed, removed, a directory made, a program other than the
# read-only mx-smi started): run with N = 1, 2, ... every step of an upgrade is a kill
# point, until the run gets through.
KILLED_AT_STEP = """
import os, shutil, signal, subprocess, sys
from gpuk8s.services.drivermanager.main import main
steps, at = sys.argv[1], int(sys.argv[2])
count = [0]

def changes(name, args):
    if name == "mkdir":
        return not os.path.exists(args[0])
    if name == "Popen":
        return os.path.basename(str(args[0][0])) != "mx-smi"
    return True

def wrap(module, name):
    real = getattr(module, name)

    def call(*args, **kw):
        if not changes(name, args):
            return real(*args, **kw)
        count[0] += 1
        with open(steps, "a") as log:
            log.write(f"{count[0]} {name} {args[0] if args else ''}\\n")
        if count[0] == at:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*args, **kw)

    setattr(module, name, call)

for module, name in ((os, "replace"), (os, "rename"), (os, "unlink"), (os, "rmdir"),
                     (os, "mkdir"), (os, "symlink"), (shutil, "copy2"), (shutil, "rmtree"),
                     (subprocess, "Popen")):
    wrap(module, name)
sys.exit(main(sys.argv[3:]))
"""


def tree_state(root: Path) -> dict[str, object]:
    """Every file's bytes, symlink's target and directory under ``root``, less what is
    written again by design: depmod's index (compared by its modules.dep) and the
    simulator's own logs; ``var/lib/gpuk8s`` itself may stay (empty)."""
    out: dict[str, object] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if rel.startswith(("var/lib/gpuk8s-sim", f"lib/modules/{RELEASE}/modules.")) \
                or rel == "var/lib/gpuk8s":
            continue
        out[rel] = os.readlink(path) if path.is_symlink() else \
            None if path.is_dir() else path.read_bytes()
    out["modules.dep"] = (root / f"lib/modules/{RELEASE}/modules.dep").read_text()
    return out


@pytest.mark.slow
def test_kill_9_at_every_step_then_recovery_from_another_mount_point_restores_exactly(
        tmp_path: Path) -> None:
    """driver-manager upgrades the host's tree through its mount point (``/host`` in the
    pod: here a symlink, gone once the pod is); it is killed before each host-changing
    step in turn; then gpu_driver (Ansible, where the tree is ``/``: here the real path)
    recovers. Before the commit point the tree is exactly what it was, with the old driver
    running; after it, the new one is installed; never a temp file, backup or journal
    left."""
    payload_dir = tmp_path / "payload"
    driver_payload(payload_dir / "driver", NEW)
    (payload_dir / "driver.complete").write_text("reg/driver-image:x\n")
    load = f"{sys.executable} {{host_root}}/usr/sbin/modprobe {{module}}"
    at, outcomes = 0, set()
    while True:
        at += 1
        host, pod = tmp_path / f"host-{at}", tmp_path / f"pod-{at}"
        sim.create(str(host), "c500-8")
        before = tree_state(host)
        pod.mkdir()
        (pod / "host").symlink_to(host)
        steps = tmp_path / f"steps-{at}"
        proc = subprocess.run(
            [sys.executable, "-c", KILLED_AT_STEP, str(steps), str(at),
             *driver_manager_args(pod / "host", payload_dir, "Always", load)],
            capture_output=True, text=True, timeout=120, check=False, start_new_session=True)
        if proc.returncode == 0:  # got through: every step before was a kill point
            break
        assert proc.returncode == -signal.SIGKILL, proc.stderr
        (pod / "host").unlink()  # the pod's mount point is gone
        result = run_module("gpu_driver", {
            "host_root": str(host), "deploy_policy": "Never", "load_command": list(LOAD),
            "unload_command": list(UNLOAD)})
        assert not result.get("failed"), (at, steps.read_text(), result)
        after = tree_state(host)
        left = sorted(p.name for p in (host / "var/lib/gpuk8s").glob("*"))
        if discover(str(host)).driver.version == OLD:
            assert left == [], (at, steps.read_text())
            assert after == before, (at, steps.read_text(), result)
            outcomes.add("rolled back")
        else:  # killed past the commit point: the install is finished, not undone
            assert (host / "opt/mxdriver/Version.txt").read_text().strip() == \
                f"Version:{NEW}", (at, steps.read_text(), result)
            assert left == ["driver-owner.json"], (at, steps.read_text())  # driver-manager's
            outcomes.add("committed")
        shutil.rmtree(host)
    assert at > 10 and outcomes == {"rolled back", "committed"}, (at, outcomes)
