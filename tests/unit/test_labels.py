"""Node labels: exactly SPEC §4."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuk8s.core.labels import LABEL_NAMES, PREFIX, compute_labels, label_diff, label_value
from gpuk8s.core.model import DriverInfo, DriverMode, NodeInventory

from . import topologies


def test_spec_example_node() -> None:
    inv = topologies.c550_8()
    inv = replace(inv, driver=DriverInfo(loaded=True, version="2.0.0"))
    assert compute_labels(inv) == {
        "metax-tech.com/driver.ready": "true",
        "metax-tech.com/gpu.driver.major": "2",
        "metax-tech.com/gpu.driver.minor": "0",
        "metax-tech.com/gpu.driver.mode": "native",
        "metax-tech.com/gpu.driver.patch": "0",
        "metax-tech.com/gpu.family": "MXC",
        "metax-tech.com/gpu.installed": "true",
        "metax-tech.com/gpu.memory": "64GB",
        "metax-tech.com/gpu.product": "C550",
        "metax-tech.com/gpu.sriov": "off",
        "metax-tech.com/gpu.vfnum": "0",
    }


def test_no_gpu_gives_only_installed_false() -> None:
    labels = compute_labels(NodeInventory(backend="none"))
    assert labels == {"metax-tech.com/gpu.installed": "false"}


def test_vfs_and_cloud_mode_and_readiness() -> None:
    inv = topologies.c500_8(vfs=4)
    inv = replace(inv, driver=DriverInfo(loaded=True, version="2.32.0.6", mode=DriverMode.CLOUD))
    labels = compute_labels(inv, readiness={"maca.ready": True, "runtime.ready": False})
    assert labels[f"{PREFIX}gpu.sriov"] == "on"
    assert labels[f"{PREFIX}gpu.vfnum"] == "4"
    assert labels[f"{PREFIX}gpu.driver.mode"] == "cloud"
    assert labels[f"{PREFIX}gpu.driver.minor"] == "32"
    assert labels[f"{PREFIX}maca.ready"] == "true"
    assert labels[f"{PREFIX}runtime.ready"] == "false"
    assert {k[len(PREFIX):] for k in labels if k.startswith(PREFIX)} <= set(LABEL_NAMES)


def test_driver_not_loaded_is_not_ready_and_has_no_version() -> None:
    inv = replace(topologies.c500_8(), driver=DriverInfo(loaded=False, version=None))
    labels = compute_labels(inv)
    assert labels[f"{PREFIX}driver.ready"] == "false"
    assert f"{PREFIX}gpu.driver.major" not in labels


def test_unbound_gpu_means_driver_not_ready() -> None:
    inv = topologies.c500_8()
    gpus = (replace(inv.gpus[0], driver_bound=False), *inv.gpus[1:])
    assert compute_labels(replace(inv, gpus=gpus))[f"{PREFIX}driver.ready"] == "false"


def test_unknown_readiness_key_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"maca\.ready, runtime\.ready"):
        compute_labels(topologies.c500_8(), readiness={"driver.ready": True})


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        ("C500", "C500"),
        ("unknown-0x4099", "unknown-0x4099"),
        ("MetaX C500 (PCIe)", "MetaX-C500--PCIe"),
        ("-x-", "x"),
        ("a" * 80, "a" * 63),
    ],
)
def test_label_values_are_valid(raw: str, value: str) -> None:
    assert label_value(raw) == value


def test_label_diff_touches_only_our_prefix() -> None:
    current = {
        "kubernetes.io/hostname": "n1",
        f"{PREFIX}gpu.product": "C500",
        f"{PREFIX}gpu.vfnum": "0",
        f"{PREFIX}stale": "x",
    }
    wanted = {f"{PREFIX}gpu.product": "C550", f"{PREFIX}gpu.vfnum": "0"}
    assert label_diff(current, wanted) == {f"{PREFIX}gpu.product": "C550", f"{PREFIX}stale": None}
    with pytest.raises(ValueError, match="outside the managed prefix"):
        label_diff(current, {"other/x": "1"})


def test_label_diff_leaves_operator_controllers_upgrade_state_alone() -> None:
    current = {f"{PREFIX}driver.upgrade-state": "upgrading", f"{PREFIX}gpu.vfnum": "0"}
    assert label_diff(current, {f"{PREFIX}gpu.vfnum": "0"}) == {}
