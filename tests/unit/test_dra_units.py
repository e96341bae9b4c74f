"""gpu-dra's building blocks without sockets: slices (``core.dra``), the claim CDI spec,
the vendored protos, the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuk8s import sim
from gpuk8s.core import cdi, dra
from gpuk8s.core.errors import ConfigError
from gpuk8s.core.model import NodeInventory
from gpuk8s.core.topology import Topology, units_for_inventory
from gpuk8s.discovery import discover
from gpuk8s.services.dra.publisher import SlicePublisher
from gpuk8s.services.node import protos

from .dra_kubelet import FakeResourceApi

pytestmark = pytest.mark.usefixtures("fast_python3")


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    out = {}
    for preset in ("c500-8", "c550-8", "c500-8-vf4", "mixed-16", "n260-2", "nvidia-8"):
        root = str(tmp_path_factory.mktemp("sim") / preset)
        sim.create(root, preset)
        out[preset] = root
    return out


def inventory(roots: dict[str, str], preset: str) -> NodeInventory:
    return discover(roots[preset])


def names(devices: list[dra.DraDevice]) -> list[str]:
    return [d.name for d in devices]


def gpu(inv: NodeInventory, index: int, vf: int | None = None) -> str:
    """The device name of GPU ``index`` (or of its VF) now."""
    return dra.gpu_device_name(inv.gpu(index), vf)


def group(inv: NodeInventory, *members: int) -> str:
    return dra.group_device_name([inv.gpu(i) for i in members])


def test_gpu_devices_carry_every_attribute_and_memory(roots: dict[str, str]) -> None:
    inv = inventory(roots, "c500-8")
    devices = dra.unit_devices(inv, dra.PoolOptions())
    assert names(devices) == [gpu(inv, i) for i in range(8)]
    gpu5 = inv.gpu(5)
    assert gpu5.pci_address == "0000:84:00.0" and devices[5].name == "gpu-0000-84-00-0"
    attrs = devices[5].attributes
    assert attrs == {
        "type": {"string": "gpu"}, "productName": {"string": "C500"},
        "uuid": {"string": gpu5.uuid}, "serial": {"string": gpu5.serial},
        "index": {"int": 5}, "driverVersion": {"string": inv.driver.version},
        "sdkVersion": {"string": inv.sdk.version}, "linkGroup": {"int": 1},
        "pcieSwitch": {"string": gpu5.pcie_switch}, "numaNode": {"int": 1},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:80"},
        "resource.kubernetes.io/pciBusID": {"string": gpu5.pci_address},
    }  # fmt: skip
    assert devices[5].capacity == {"memory": {"value": "64Gi"}}
    assert devices[5].counters == ()
    pooled = dra.pool_devices(inv, dra.PoolOptions())
    assert pooled[5].counters == ("gpu-0000-84-00-0",), \
        "beside group devices a GPU consumes its counter, named as its device"


@pytest.mark.parametrize(("preset", "options"), [
    ("n260-2", dra.PoolOptions()),  # no links: no group device, so no counters
    ("c500-8", dra.PoolOptions(groups=False)),
    ("c500-8", dra.PoolOptions(sharing="sgpu")),
    ("c500-8-vf4", dra.PoolOptions()),
])  # fmt: skip
def test_a_pool_without_group_devices_publishes_no_counters(
    roots: dict[str, str], preset: str, options: dra.PoolOptions
) -> None:
    slices = dra.build_slices("n", inventory(roots, preset), options)
    assert [s["metadata"]["name"] for s in slices] == ["n-gpu-metax-tech-com-devices-0"]
    assert all("consumesCounters" not in d for d in slices[0]["spec"]["devices"])
    assert "sharedCounters" not in slices[0]["spec"]


def test_vfs_are_the_devices_when_configured(roots: dict[str, str]) -> None:
    inv = inventory(roots, "c500-8-vf4")
    devices = dra.pool_devices(inv, dra.PoolOptions())
    assert len(devices) == 32 and all(d.type == "vf" for d in devices), "no group of VFs"
    vf = devices[6]  # GPU 1, VF 2
    assert inv.gpu(1).pci_address == "0000:04:00.0" and vf.name == "gpu-0000-04-00-0-vf-2"
    assert vf.attributes["parentIndex"] == {"int": 1} and vf.attributes["vfIndex"] == {"int": 2}
    assert vf.attributes["index"] == {"int": 6}
    assert vf.attributes["resource.kubernetes.io/pciBusID"]["string"] == \
        inv.gpu(1).sriov.vf_addresses[2]
    assert vf.capacity == {"memory": {"value": "16Gi"}}
    assert not vf.counters
    with pytest.raises(dra.DraError, match="VFs cannot be shared"):
        dra.pool_devices(inv, dra.PoolOptions(sharing="sgpu"))


QUADS = [(0, 1), (2, 3), (4, 5), (6, 7), (0, 1, 2, 3), (4, 5, 6, 7)]


@pytest.mark.parametrize(("preset", "groups"), [
    ("c500-8", QUADS),
    ("c550-8", [*QUADS, tuple(range(8))]),
    ("nvidia-8", [*QUADS, tuple(range(8))]),
    ("n260-2", []),
])  # fmt: skip
def test_group_devices_are_link_complete_aligned_blocks(
    roots: dict[str, str], preset: str, groups: list[tuple[int, ...]]
) -> None:
    inv = inventory(roots, preset)
    found = dra.group_devices(inv, dra.PoolOptions())
    assert [d.gpus for d in found] == groups
    assert names(found) == [group(inv, *members) for members in groups]
    for device in found:
        members = device.gpus
        assert all(frozenset((a, b)) in inv.links for a in members for b in members if a < b)
        assert device.counters == tuple(gpu(inv, i) for i in members)
        assert device.attributes["groupSize"] == {"int": len(members)}
        assert device.attributes["members"] == {"string": ",".join(map(str, members))}
    assert not dra.group_devices(inv, dra.PoolOptions(groups=False))
    assert not dra.group_devices(inv, dra.PoolOptions(sharing="sgpu"))


def test_mixed_16_groups_of_eight(roots: dict[str, str]) -> None:
    inv = inventory(roots, "mixed-16")
    found = names(dra.group_devices(inv, dra.PoolOptions()))
    assert group(inv, *range(8)) in found and group(inv, *range(8, 16)) in found
    assert len(found) == len(set(found)) == 8 + 4 + 2


def _cards(devices: list[dra.DraDevice]) -> dict[str, frozenset[str]]:
    """Device name -> the units (PCI addresses of GPUs and VFs) it gives a claim."""
    return {d.name: frozenset(u.id for u in d.units) for d in devices}


@pytest.mark.parametrize(("preset", "removed"), [
    ("c500-8", 3), ("c550-8", 1), ("c500-8-vf4", 3), ("mixed-16", 0),
])  # fmt: skip
def test_device_names_follow_the_card_when_a_gpu_leaves_the_bus_and_comes_back(
    tmp_path: Path, preset: str, removed: int
) -> None:
    """A claim is allocated by device name and may be prepared by a plugin restarted after
    a GPU left the bus, when discovery has renumbered the GPUs above it: every other GPU
    and VF keeps its name, a name never comes to mean other cards (group blocks shift: a
    shifted group gets a new name), and healing gives back the same devices and slices."""
    root = str(tmp_path / preset)
    sim.create(root, preset)
    options = dra.PoolOptions(groups=True)
    before_inv = discover(root)
    before = dra.pool_devices(before_inv, options)
    slices = dra.node_slices("n", before_inv, options)
    gone = before_inv.gpu(removed).pci_address
    sim.fail(root, removed, "remove")
    after_inv = discover(root)
    assert [g.index for g in after_inv.gpus] == list(range(len(before_inv.gpus) - 1))
    after = dra.pool_devices(after_inv, options)
    was, now = _cards(before), _cards(after)
    units_before = {d.name for d in before if d.type != dra.TYPE_GROUP
                    and before_inv.gpu(d.units[0].gpu).pci_address != gone}
    assert {d.name for d in after if d.type != dra.TYPE_GROUP} == units_before
    for name in set(was) & set(now):
        assert was[name] == now[name], f"{name} names other cards after the loss"
    for device in after:  # the index attribute is for display: it moved, the name did not
        if device.type == dra.TYPE_GPU:
            card = after_inv.gpu(device.units[0].gpu)
            assert device.name == dra.gpu_device_name(card)
            assert device.attributes["index"] == {"int": card.index}
    index_then = {g.pci_address: g.index for g in before_inv.gpus}
    assert any(index_then[g.pci_address] != g.index for g in after_inv.gpus), "renumbered"
    if preset == "c500-8":  # the groups without GPU 3 keep their names
        assert set(now) == set(was) - {n for n, c in was.items() if gone in c}
    sim.heal(root, removed)
    healed = discover(root)
    assert _cards(dra.pool_devices(healed, options)) == was
    assert dra.node_slices("n", healed, options) == slices


def test_device_names_are_dns_labels_from_pci_addresses() -> None:
    """Names fit the API's DNS-label rule (63 characters) even with a long PCI domain;
    an index-built name of the releases before is read back; two GPUs that report one
    address are refused rather than published under one name."""
    from dataclasses import replace

    from gpuk8s.core.model import Gpu

    card = Gpu(index=0, pci_address="10000:e1:1f.7", vendor="metax", vendor_id=0x9999,
               device_id=0x4000, product="C500")
    eight = [replace(card, index=i, pci_address=f"10000:e{i}:1f.7") for i in range(8)]
    names = [dra.gpu_device_name(card), dra.gpu_device_name(card, 15),
             dra.group_device_name(eight), dra.counter_name(card)]
    assert names[:2] == ["gpu-10000-e1-1f-7", "gpu-10000-e1-1f-7-vf-15"]
    assert names[2].startswith("group8-10000-e0-1f-7-") and len(names[2]) <= 63
    assert all(dra.DNS_LABEL.match(n) for n in names), names
    assert dra.group_device_name(eight[:2]) != dra.group_device_name([eight[0], eight[2]])
    assert dra.legacy_device_gpus("gpu-3") == ((3,), None)
    assert dra.legacy_device_gpus("gpu-3-vf-1") == ((3,), 1)
    assert dra.legacy_device_gpus("group-4-5-6-7") == ((4, 5, 6, 7), None)
    for name in names:
        assert dra.legacy_device_gpus(name) is None, name
    assert "was upgraded" in dra.missing_device_reason("gpu-3")
    assert "PCI address 10000:e1:1f.7 is not on this node's bus" in \
        dra.missing_device_reason(names[1])
    assert "a GPU of that group" in dra.missing_device_reason(names[2])
    twins = NodeInventory("metax", (card, replace(card, index=1)))
    with pytest.raises(dra.DraError, match="'gpu-10000-e1-1f-7' is not unique"):
        dra.pool_devices(twins, dra.PoolOptions())


def test_slices_hold_counters_apart_and_respect_the_limits(roots: dict[str, str]) -> None:
    inv = inventory(roots, "c500-8")
    slices = dra.build_slices("n1", inv, dra.PoolOptions(), generation=7)
    counters, devices = slices
    assert counters["spec"]["sharedCounters"] == [
        {"name": "gpus", "counters": {gpu(inv, i): {"value": "1"} for i in range(8)}}]
    assert "devices" not in counters["spec"] and "sharedCounters" not in devices["spec"]
    for body in slices:
        assert body["spec"]["pool"] == {"name": "n1", "generation": 7, "resourceSliceCount": 2}
        assert body["spec"]["nodeName"] == "n1" and body["spec"]["driver"] == dra.DRIVER
    vf = dra.build_slices("n1", inventory(roots, "c500-8-vf4"), dra.PoolOptions())
    assert [len(s["spec"]["devices"]) for s in vf] == [32]


def test_unhealthy_devices_are_tainted_or_left_out(roots: dict[str, str]) -> None:
    inv = inventory(roots, "c500-8")
    [_, tainted] = dra.build_slices("n", inv, dra.PoolOptions(), unhealthy={2: "PCIe: gone!"})
    by_name = {d["name"]: d for d in tainted["spec"]["devices"]}
    assert by_name[gpu(inv, 2)]["taints"] == [
        {"key": "gpu.metax-tech.com/unhealthy", "value": "PCIe-gone", "effect": "NoSchedule"}]
    assert "taints" in by_name[group(inv, 2, 3)] and "taints" not in by_name[group(inv, 0, 1)]
    [_, removed] = dra.build_slices("n", inv, dra.PoolOptions(unhealthy="remove"),
                                    unhealthy={2: "gone"})
    left = {d["name"] for d in removed["spec"]["devices"]}
    assert gpu(inv, 2) not in left and group(inv, 0, 1, 2, 3) not in left
    assert gpu(inv, 3) in left


@pytest.mark.parametrize("gates_off", [(), ("DRADeviceTaints",)])
def test_the_publisher_taints_a_faulted_gpu_or_withdraws_it_and_brings_it_back(
    roots: dict[str, str], gates_off: tuple[str, ...]
) -> None:
    """The publisher's decision for GPU 2 faulting and healing: tainted NoSchedule where the
    API server keeps taints; where it drops them (DRADeviceTaints off), the devices holding
    GPU 2 are left out of the slice, with the reason in ``problems``. Healed, GPU 2 is back
    untainted either way; each change is a new pool generation."""
    sick: dict[int, str] = {}
    api = FakeResourceApi(disabled_gates=gates_off)
    inv = inventory(roots, "c500-8")
    two = gpu(inv, 2)
    publisher = SlicePublisher("n", inv, dra.PoolOptions(groups=False), api,
                               unhealthy=lambda: sick)

    def devices() -> dict[str, dict[str, Any]]:
        return {d["name"]: d for s in api.list("n") for d in s["spec"].get("devices") or []}

    assert publisher.sync_once() and not any("taints" in d for d in devices().values())
    sick[2] = "ECC errors"
    assert publisher.sync_once()
    if gates_off:  # written with the taint, read back without it, written again without GPU 2
        assert publisher.generation == 3
        assert two not in devices() and len(devices()) == 7
        assert any("DRADeviceTaints" in p for p in publisher.problems)
    else:
        assert devices()[two]["taints"] == [{"key": "gpu.metax-tech.com/unhealthy",
                                                  "value": "ECC-errors",
                                                  "effect": "NoSchedule"}]
        assert [n for n, d in devices().items() if "taints" in d] == [two]
        assert publisher.problems == [] and publisher.generation == 2
    assert publisher.sync_once() is False, "nothing changed: nothing written"
    faulted = publisher.generation
    del sick[2]
    assert publisher.sync_once() and publisher.generation == faulted + 1
    assert two in devices() and not any("taints" in d for d in devices().values())


def test_sgpu_capacity_follows_gpu_awares_accounting(roots: dict[str, str]) -> None:
    [only] = dra.build_slices("n", inventory(roots, "c500-8"), dra.PoolOptions(sharing="sgpu"))
    gpu = only["spec"]["devices"][0]
    assert gpu["allowMultipleAllocations"] is True
    assert gpu["capacity"]["shares"] == {"value": "16", "requestPolicy": {
        "default": "1", "validValues": ["1"]}}
    assert gpu["capacity"]["vcore"]["requestPolicy"]["default"] == "100"


def test_bad_options_name_the_flag() -> None:
    with pytest.raises(dra.DraError, match="sharing-mode: 'mps' is not served by gpu-dra"):
        dra.PoolOptions(sharing="mps")
    with pytest.raises(dra.DraError, match="unhealthy-devices: 'hide'"):
        dra.PoolOptions(unhealthy="hide")


@pytest.mark.parametrize(("busy", "first"), [
    ((), [0, 1, 2, 3]),
    ((0, 1), [0, 1, 2, 3]),  # the partly used group fills first
    ((5,), [4, 5, 6, 7]),
    ((0, 4, 5), [4, 5, 6, 7]),  # 2 free beat 3 free
])  # fmt: skip
def test_steering_order_is_best_fit_per_link_group(
    roots: dict[str, str], busy: tuple[int, ...], first: list[int]
) -> None:
    inv = inventory(roots, "c500-8")
    topo = Topology.from_inventory(inv, units_for_inventory(inv))
    order = dra.steering_order(topo, dra.pool_devices(inv, dra.PoolOptions()), busy)
    assert names(order[:4]) == [gpu(inv, i) for i in first]
    sizes = [len(d.gpus) for d in order[8:]]
    assert sizes == sorted(sizes) and min(sizes) == 2, "groups after units, smaller first"


def test_claim_spec_is_valid_cdi_with_per_claim_env(roots: dict[str, str]) -> None:
    inv = inventory(roots, "c500-8")
    units = units_for_inventory(inv)
    spec = cdi.build_claim_spec(inv, "gpu.metax-tech.com/claim",
                                [("uid-0-gpu-1", (units[1],))], {"A": "1"}, "/sim")
    parsed = cdi.parse_spec(spec)
    edits = cdi.resolve([parsed], ["gpu.metax-tech.com/claim=uid-0-gpu-1"])
    assert edits.env_map() == {"A": "1"}
    assert {n.host_path for n in edits.device_nodes} == {
        "/sim/dev/mxcd", *("/sim" + p for p in inv.gpu(1).device_nodes)}
    with pytest.raises(cdi.CdiError, match="at least one device"):
        cdi.build_claim_spec(inv, "gpu.metax-tech.com/claim", [], {})


def test_two_specs_of_one_kind_keep_their_own_spec_level_edits() -> None:
    a = cdi.CdiSpec("v.com/c", {"a": cdi.ContainerEdits()}, cdi.ContainerEdits(env=("X=a",)))
    b = cdi.CdiSpec("v.com/c", {"b": cdi.ContainerEdits()}, cdi.ContainerEdits(env=("X=b",)))
    assert cdi.resolve([a, b], ["v.com/c=a"]).env_map() == {"X": "a"}
    assert cdi.resolve([a, b], ["v.com/c=b"]).env_map() == {"X": "b"}
    with pytest.raises(cdi.CdiError, match="defined twice"):
        cdi.resolve([a, a], ["v.com/c=a"])


DRA_FIELDS = {
    "NodePrepareResourcesRequest": {"claims": 1},
    "NodePrepareResourcesResponse": {"claims": 1},
    "NodePrepareResourceResponse": {"devices": 1, "error": 2},
    "Device": {"request_names": 1, "pool_name": 2, "device_name": 3, "cdi_device_ids": 4},
    "NodeUnprepareResourcesRequest": {"claims": 1},
    "NodeUnprepareResourceResponse": {"error": 1},
    "Claim": {"namespace": 1, "uid": 2, "name": 3},
}  # fmt: skip


def test_vendored_protos_match_the_kubelet_wire_format() -> None:
    v1, v1beta1, health, reg = protos.load_modules(
        "dra_v1", "dra_v1beta1", "drahealth_v1alpha1", "pluginregistration_v1")
    assert v1.DESCRIPTOR.package == "k8s.io.kubelet.pkg.apis.dra.v1"
    assert v1beta1.DESCRIPTOR.package == "k8s.io.kubelet.pkg.apis.dra.v1beta1"
    for module in (v1, v1beta1):
        for message, fields in DRA_FIELDS.items():
            descriptor = module.DESCRIPTOR.message_types_by_name[message]
            assert {f.name: f.number for f in descriptor.fields if f.name in fields} == fields
    assert v1.DESCRIPTOR.message_types_by_name["Device"].fields_by_name["share_id"].number == 5
    assert "share_id" not in v1beta1.DESCRIPTOR.message_types_by_name["Device"].fields_by_name
    watch = health.DESCRIPTOR.services_by_name["DRAResourceHealth"].methods_by_name[
        "NodeWatchResources"]
    assert watch.server_streaming and health.DESCRIPTOR.package == "v1alpha1"
    info = reg.DESCRIPTOR.message_types_by_name["PluginInfo"]
    assert {f.name: f.number for f in info.fields} == {
        "type": 1, "name": 2, "endpoint": 3, "supported_versions": 4}
    assert reg.DESCRIPTOR.services_by_name["Registration"].full_name == \
        "pluginregistration.Registration"
    with pytest.raises(protos.ProtoBuildError, match="no such kubelet API: dra_v9"):
        protos.load_modules("dra_v9")


def test_vendored_protos_keep_their_license_header() -> None:
    for name in ("dra_v1", "dra_v1beta1", "drahealth_v1alpha1", "pluginregistration_v1"):
        text = (Path(protos.PROTO_DIR) / f"{name}.proto").read_text()
        assert "Licensed under the Apache License, Version 2.0" in text.split("syntax")[0]
        assert "Vendored from k8s.io/kubelet v0.35.4" in text


class _NoApi:
    """A SliceApi that is never called (``wanted`` only builds)."""

    def list(self, node: str) -> list[dict[str, Any]]:
        raise AssertionError("not called")

    create = update = list  # type: ignore[assignment]

    def delete(self, name: str) -> None:
        raise AssertionError("not called")


def test_cli_prints_the_slices_as_yaml_and_json(roots: dict[str, str]) -> None:
    def run(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "gpuk8s.cli", "dra", "slices", "--root",
                               roots["c500-8"], "--node-name", "gpu-7", *args],
                              capture_output=True, text=True, check=True)
        return done.stdout

    as_json = json.loads(run("--json"))
    as_yaml = yaml.safe_load(run())
    assert as_yaml["kind"] == "List" and as_yaml["items"] == as_json
    inv = inventory(roots, "c500-8")
    # by default what gpu-dra publishes on a fresh node: auto's choice (groups off), devices
    # in the steering order, from the one function the publisher calls
    assert as_json == dra.node_slices("gpu-7", inv, dra.PoolOptions(groups=False))
    assert [len(s["spec"]["devices"]) for s in as_json] == [8]
    assert as_json == json.loads(run("--json", "--group-devices", "auto",
                                     "--kube-version", "v1.37.2"))
    grouped = json.loads(run("--json", "--group-devices", "on"))
    assert grouped == dra.node_slices("gpu-7", inv, dra.PoolOptions())
    assert [len(s["spec"].get("devices") or []) for s in grouped] == [0, 14]
    published = SlicePublisher("gpu-7", inv, dra.PoolOptions(), _NoApi())
    assert published.wanted(1) == grouped, "the plugin publishes what the CLI prints"
    owned = json.loads(run("--json", "--group-devices", "on", "--node-uid", "u-1"))
    assert owned == SlicePublisher("gpu-7", inv, dra.PoolOptions(), _NoApi(),
                                   node_uid="u-1").wanted(1)
    assert {json.dumps(s["metadata"]["ownerReferences"]) for s in owned} == {json.dumps([{
        "apiVersion": "v1", "kind": "Node", "name": "gpu-7", "uid": "u-1",
        "controller": True}])}
    assert all("ownerReferences" not in s["metadata"] for s in grouped)
    bad = subprocess.run([sys.executable, "-m", "gpuk8s.cli", "dra", "slices", "--root",
                          roots["c500-8"]], capture_output=True, text=True)
    assert bad.returncode == 2 and "--node-name" in bad.stderr


@pytest.mark.parametrize("release", ["v1.35.4", "v1.37.2"])
def test_cli_default_is_what_the_plugin_publishes_on_that_release(
    roots: dict[str, str], release: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plugin's side as ``serve dra-plugin`` builds it: its own flag defaults, auto's
    choice for the API server's release, the publisher's ``wanted`` on a fresh node."""
    from dataclasses import replace

    from gpuk8s.services.dra.main import build_parser, config_from_args

    for name in ("GROUP_DEVICES", "SHARING_MODE", "NODE_NAME"):
        monkeypatch.delenv(name, raising=False)
    args = build_parser().parse_args(["--node-name", "gpu-7", "--sharing-mode", "exclusive"])
    config = config_from_args(args, "exclusive")
    groups, why = dra.group_devices_wanted(args.group_devices, release)
    assert groups is False and why, "auto keeps group devices off on both releases today"
    inv, pool = inventory(roots, "c500-8"), replace(config.pool, groups=groups)
    plugin = SlicePublisher("gpu-7", inv, pool, _NoApi()).wanted(1)

    def printed(*extra: str) -> Any:
        return json.loads(subprocess.run(
            [sys.executable, "-m", "gpuk8s.cli", "dra", "slices", "--root", roots["c500-8"],
             "--node-name", "gpu-7", "--json", *extra],
            capture_output=True, text=True, check=True).stdout)

    assert printed("--kube-version", release) == plugin
    assert printed() == plugin, "by default, with no release given"
    names = [d["name"] for d in plugin[0]["spec"]["devices"]]
    assert len(plugin) == 1 and len(names) == 8, "one slice of the 8 GPUs, no counters"
    assert names == [d.name for d in dra.steering_order(
        Topology.from_inventory(inv, units_for_inventory(inv)), dra.pool_devices(inv, pool),
        [])], "in steering order"


def test_bad_flags_are_refused_before_anything_is_read(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "KUBECONFIG": str(tmp_path / "none")}
    for args, message in (
        (["--node-name", "n1", "--sharing-mode", "mps"],
         "sharing-mode: 'mps' is not one of exclusive, sgpu, auto"),
        (["--sharing-mode", "sgpu"], "node-name: required"),
        (["--node-name", "n1", "--resync-interval", "0"],
         "resync-interval: must be a positive number of seconds"),
    ):
        done = subprocess.run([sys.executable, "-m", "gpuk8s.cli", "serve", "dra-plugin",
                               *args], capture_output=True, text=True, env=env)
        assert done.returncode == 2 and message in done.stderr, done.stderr


def test_the_nodes_sharing_label_picks_the_pool_shape() -> None:
    from gpuk8s.services.dra.main import resolve_sharing

    assert resolve_sharing("auto", {}) == "exclusive"
    assert resolve_sharing("auto", {"gpuk8s.io/sharing-mode": "sgpu"}) == "sgpu"
    with pytest.raises(ConfigError, match="vcuda and mps need gpu-device"):
        resolve_sharing("auto", {"gpuk8s.io/sharing-mode": "mps"})


@pytest.mark.parametrize(("mode", "version", "groups", "said"), [
    ("auto", "v1.35.4", False, "Kubernetes v1.35.4"),  # the lab's: leaks counters, slow
    ("auto", "v1.36.2", False, "kubernetes/kubernetes#140436"),
    ("auto", "v1.36.3", False, "0.17 on 500"),  # fixed allocator, never measured at scale
    ("auto", "v1.37.2", False, "not yet repeated"),
    ("auto", None, False, "could not be read"),
    ("auto", "garbage", False, "could not be read"),
    ("on", "v1.35.4", True, None),  # the administrator's choice
    ("off", "v1.37.2", False, None),
])
def test_group_devices_auto_stays_off_until_measured_to_scale(
    mode: str, version: str | None, groups: bool, said: str | None
) -> None:
    got, why = dra.group_devices_wanted(mode, version)
    assert got is groups
    assert (why is None) == (said is None)
    if said is not None:
        assert why is not None and said in why and "--group-devices on" in why
        assert "1.7 pods/s on 200 nodes" in why
    if version == "v1.36.3":
        assert why is not None and "#140436" not in why, "1.36.3 has the allocator fix"


def test_group_devices_auto_turns_on_where_a_release_is_measured_to_scale(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The switch a measurement would flip: from GROUPS_SCALE_FROM on (and never before
    the allocator fix), ``auto`` publishes them."""
    monkeypatch.setattr(dra, "GROUPS_SCALE_FROM", (1, 37, 2))
    assert dra.group_devices_wanted("auto", "v1.37.2") == (True, None)
    assert dra.group_devices_wanted("auto", "v1.37.1")[0] is False
    monkeypatch.setattr(dra, "GROUPS_SCALE_FROM", (1, 35, 0))
    off, why = dra.group_devices_wanted("auto", "v1.35.4")
    assert off is False and why is not None and "#140436" in why and "pods/s" not in why


def test_group_devices_mode_is_checked() -> None:
    with pytest.raises(dra.DraError, match="group-devices: 'yes' is not one of auto, on, off"):
        dra.group_devices_wanted("yes", "v1.36.3")
    done = subprocess.run([sys.executable, "-m", "gpuk8s.cli", "serve", "dra-plugin",
                           "--node-name", "n1", "--group-devices", "yes"],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "--group-devices" in done.stderr
