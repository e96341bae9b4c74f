"""Host operations (gpuk8s.host): journalled installs, crash recovery, ownership, SDK
install / rollback, and the decision tables of the operator scheme (SDK image by product
and OS, vfnum validation)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from gpuk8s import sim
from gpuk8s.core.errors import ConfigError
from gpuk8s.core.payloads import NodePlatform, parse_sdk_image, select_sdk_image
from gpuk8s.core.vfconfig import allowed_vfnums, check_node, parse_node_vfnums
from gpuk8s.discovery import discover, metax
from gpuk8s.discovery.tools import default_runner
from gpuk8s.host import driver as drv
from gpuk8s.host import files, sdk
from gpuk8s.host.readiness import clear_readiness, read_readiness, write_readiness

STANDIN = str(Path(__file__).resolve().parents[1] / "ansible" / "bin" / "sim_modprobe.py")
OLD, NEW = "2.32.0.6", "2.33.0.6"


@pytest.fixture(autouse=True)
def fast_fake_tools(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}")


def request(root: Path, bundle: Path, **kw: object) -> drv.InstallRequest:
    base: dict[str, object] = dict(
        policy="Always", version=NEW, payload=str(bundle),
        load_command=(sys.executable, STANDIN, "--root", "{host_root}", "{module}"),
        unload_command=(sys.executable, STANDIN, "--root", "{host_root}", "-r", "{module}"),
    )
    base.update(kw)
    return drv.InstallRequest(**base)  # type: ignore[arg-type]


def payload(tmp_path: Path, version: str = NEW) -> Path:
    base = tmp_path / f"payload-{version}"
    (base / "opt/mxdriver/lib").mkdir(parents=True)
    (base / "opt/mxdriver/Version.txt").write_text(f"Version:{version}\n")
    (base / "opt/mxdriver/lib/libmxsml.so").write_bytes(b"new lib")
    ko = base / "lib/modules/6.1.0-sim/updates/metax.ko"
    ko.parent.mkdir(parents=True)
    ko.write_text(f"version={version}\n")
    return base


def test_install_tree_rolls_back_replaced_and_created_files(tmp_path: Path) -> None:
    root, src = tmp_path / "root", tmp_path / "src"
    (root / "a").mkdir(parents=True)
    (root / "a/keep.txt").write_text("old")
    (src / "a/new").mkdir(parents=True)
    (src / "a/keep.txt").write_text("new")
    (src / "a/new/file").write_text("x")
    journal, backup = str(tmp_path / "j.json"), str(tmp_path / "backup")
    files.install_tree(str(src), str(root), journal, backup)
    assert (root / "a/keep.txt").read_text() == "new" and (root / "a/new/file").exists()
    files.rollback(journal)
    assert (root / "a/keep.txt").read_text() == "old"
    assert not (root / "a/new").exists() and not os.path.exists(journal)
    assert not os.path.exists(backup)


def test_crash_during_the_copy_is_rolled_back_by_the_next_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "host"
    sim.create(str(root), "c500-8")
    bundle = payload(tmp_path)
    calls = {"n": 0}
    real = files._copy_entry

    def dies_half_way(src: str, dest: str) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt("process killed")  # not an OSError: nothing catches it
        real(src, dest)

    monkeypatch.setattr(files, "_copy_entry", dies_half_way)
    with pytest.raises(KeyboardInterrupt):
        drv.converge(str(root), request(root, bundle), default_runner)
    monkeypatch.setattr(files, "_copy_entry", real)
    # half-installed: the journal names what to undo
    assert (root / drv.JOURNAL.lstrip("/")).exists()
    done = drv.recover(str(root), request(root, bundle), default_runner)
    assert done and "rolled back" in done
    assert (root / "opt/mxdriver/Version.txt").read_text().strip() == f"Version:{OLD}"
    assert not (root / "lib/modules/6.1.0-sim/updates/metax.ko").exists()
    assert discover(str(root)).driver.version == OLD  # the previous driver runs again
    assert drv.recover(str(root), request(root, bundle), default_runner) is None


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
    assert sdk.install_sdk(str(root), str(second)) == (True, "2.33.0.4")
    state = sdk.read_sdk(str(root))
    assert state.managed and state.version == "2.33.0.4" and state.previous == "2.32.0.4"
    assert metax.sdk_info(str(root))[0].version == "2.33.0.4"
    assert sdk.rollback_sdk(str(root)) == "2.32.0.4"
    assert sdk.read_sdk(str(root)).version == "2.32.0.4"
    with pytest.raises(drv.PayloadError, match="not the wanted"):
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
