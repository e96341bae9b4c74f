"""Device plugin building blocks without gRPC: devices, device list, protos."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpuk8s import sim
from gpuk8s.core.devicelist import (
    DEVICES_ANNOTATION,
    DeviceEntry,
    format_device_list,
    parse_device_list,
)
from gpuk8s.core.errors import AllocationError, InventoryError
from gpuk8s.core.model import NodeInventory
from gpuk8s.discovery import discover
from gpuk8s.services.deviceplugin.main import PluginConfig
from gpuk8s.services.node import protos
from gpuk8s.services.node.devices import (
    AllocateOptions,
    DeviceSet,
    UnhealthyDeviceError,
    UnknownDeviceError,
)

# the simulator's fake vendor tools run with this interpreter (tests/unit/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_python3")


@pytest.fixture(scope="module")
def inventories(tmp_path_factory: pytest.TempPathFactory) -> dict[str, NodeInventory]:
    out = {}
    for preset in ("c500-8", "c500-8-vf4", "nvidia-8"):
        root = str(tmp_path_factory.mktemp("sim") / preset)
        sim.create(root, preset)
        out[preset] = discover(root)
    return out


# -- DeviceSet ------------------------------------------------------------------------------


def test_health_version_moves_only_on_flips(inventories: dict[str, NodeInventory]) -> None:
    ds = DeviceSet(inventories["c500-8"], "metax-tech.com/gpu")
    ids = [u.id for u in ds.units]
    v0, views = ds.snapshot()
    assert all(v.healthy for v in views)
    assert ds.update_health(dict.fromkeys(range(8))) == []
    assert ds.version == v0
    assert ds.update_health({2: "ECC"}) == [ids[2]]
    assert ds.version == v0 + 1
    # still unhealthy with another reason: no flip, no new ListAndWatch update
    assert ds.update_health({2: "hang"}) == []
    assert ds.version == v0 + 1 and ds.reason(ids[2]) == "hang"
    # GPUs missing from a result keep their state
    assert ds.update_health({3: None}) == []
    assert ds.reason(ids[2]) == "hang"
    assert ds.update_health({2: None}) == [ids[2]]
    assert ds.version == v0 + 2
    assert ds.healthy_ids() == ids


def test_vfs_share_their_gpu_health(inventories: dict[str, NodeInventory]) -> None:
    ds = DeviceSet(inventories["c500-8-vf4"], "metax-tech.com/gpu")
    assert len(ds) == 32
    flipped = ds.update_health({1: "gone"})
    assert flipped == [u.id for u in ds.units if u.gpu == 1]
    assert len(flipped) == 4
    with pytest.raises(UnhealthyDeviceError, match="gone"):
        ds.container_spec([flipped[0]])


def test_wait_for_change_wakes_on_flip(inventories: dict[str, NodeInventory]) -> None:
    import threading

    ds = DeviceSet(inventories["c500-8"], "metax-tech.com/gpu")
    version = ds.version
    timer = threading.Timer(0.2, lambda: ds.update_health({0: "x"}))
    timer.start()
    assert ds.wait_for_change(version, 30) == version + 1
    assert ds.wait_for_change(version + 1, 0.05) == version + 1


def test_container_spec_variants(inventories: dict[str, NodeInventory]) -> None:
    inv = inventories["c500-8"]
    g1, g6 = inv.gpus[1], inv.gpus[6]
    ids = [g6.pci_address, g1.pci_address]
    plain = DeviceSet(inv, "metax-tech.com/gpu").container_spec(ids)
    assert plain.envs["MACA_VISIBLE_DEVICES"] == "0,1"
    assert [d[0] for d in plain.devices] == ["/dev/mxcd", *g1.device_nodes, *g6.device_nodes]
    host = DeviceSet(inv, "r.io/gpu", AllocateOptions(visible_devices="host")).container_spec(ids)
    assert host.envs["MACA_VISIBLE_DEVICES"] == "1,6"
    uuid = DeviceSet(inv, "r.io/gpu", AllocateOptions(visible_devices="uuid")).container_spec(ids)
    assert uuid.envs["MACA_VISIBLE_DEVICES"] == f"{g1.uuid},{g6.uuid}"
    none = DeviceSet(inv, "r.io/gpu", AllocateOptions(visible_devices="none")).container_spec(ids)
    assert "MACA_VISIBLE_DEVICES" not in none.envs
    pre = DeviceSet(inv, "r.io/gpu", AllocateOptions(device_path_prefix="/var/lab/sim/"))
    spec = pre.container_spec([g1.pci_address])
    assert spec.devices[0] == ("/dev/mxcd", "/var/lab/sim/dev/mxcd", "rw")
    sdk = DeviceSet(inv, "r.io/gpu", AllocateOptions(mount_sdk=True, sdk_paths=("/opt/x",)))
    spec = sdk.container_spec([g1.pci_address])
    assert spec.mounts == [("/opt/x", "/opt/x", True)]
    assert spec.envs["LD_LIBRARY_PATH"] == "/opt/x/lib"
    cdi = DeviceSet(inv, "metax-tech.com/gpu", AllocateOptions(cdi=True, cdi_kind="k.io/c"))
    spec = cdi.container_spec(ids)
    assert spec.cdi_devices == [f"k.io/c={g1.pci_address}", f"k.io/c={g6.pci_address}"]
    assert spec.devices == []
    assert spec.annotations == {}
    # no CDI names: device nodes + env, and the annotation the runtime wrapper resolves
    wrapped = DeviceSet(inv, "metax-tech.com/gpu", AllocateOptions(cdi_annotation=True))
    spec = wrapped.container_spec(ids)
    assert spec.cdi_devices == [] and len(spec.devices) == 5  # mxcd + 2 x (card, renderD)
    assert spec.annotations == {
        "cdi.k8s.io/gpuk8s": f"metax-tech.com/gpu={g1.pci_address},"
                             f"metax-tech.com/gpu={g6.pci_address}"}


def test_unknown_ids_and_empty_requests(inventories: dict[str, NodeInventory]) -> None:
    ds = DeviceSet(inventories["c500-8"], "metax-tech.com/gpu")
    with pytest.raises(UnknownDeviceError, match="nope"):
        ds.container_spec(["nope"])
    with pytest.raises(UnknownDeviceError, match="nope"):
        ds.preferred(["nope"], [], 1)
    with pytest.raises(AllocationError, match="empty"):
        ds.container_spec([])
    ids = [u.id for u in ds.units]
    with pytest.raises(AllocationError, match="only 2 available"):
        ds.preferred(ids[:2], [], 3)


def test_nvidia_node_gets_its_own_resource_and_env(
    inventories: dict[str, NodeInventory],
) -> None:
    inv = inventories["nvidia-8"]
    assert inv.backend == "nvidia"
    resource = PluginConfig().resource_for(inv)
    assert resource == "nvidia.com/gpu"
    assert PluginConfig().socket_for(resource) == "nvidia.com-gpu.sock"
    assert PluginConfig().resource_for(inventories["c500-8"]) == "metax-tech.com/gpu"
    ds = DeviceSet(inv, resource)
    g = inv.gpus[3]
    spec = ds.container_spec([g.pci_address])
    assert spec.envs["NVIDIA_VISIBLE_DEVICES"] == g.uuid
    assert "MACA_VISIBLE_DEVICES" not in spec.envs
    paths = [d[0] for d in spec.devices]
    assert paths == [*inv.control_devices, *g.device_nodes]
    assert g.device_nodes, "the simulator gives NVIDIA GPUs /dev/nvidiaN"


def test_entries_describe_every_unit(inventories: dict[str, NodeInventory]) -> None:
    inv = inventories["c500-8-vf4"]
    ds = DeviceSet(inv, "metax-tech.com/gpu")
    ds.update_health({7: "x"})
    allocated = {ds.units[0].id, ds.units[5].id}
    entries = ds.entries(allocated)
    assert len(entries) == 32
    e5 = entries[5]
    gpu1 = inv.gpus[1]
    assert (e5.id, e5.pci, e5.gpu, e5.vf) == (gpu1.sriov.vf_addresses[1], gpu1.pci_address, 1, 1)
    assert (e5.numa, e5.group, e5.switch) == (gpu1.numa_node, gpu1.link_group, gpu1.pcie_switch)
    assert e5.allocated and e5.healthy and not e5.free
    assert [e.gpu for e in entries if not e.healthy] == [7] * 4
    assert parse_device_list(format_device_list(entries)) == entries


# -- device list annotation -------------------------------------------------------------------


def entry(**kw: object) -> dict[str, object]:
    base: dict[str, object] = {
        "id": "0000:03:00.0", "pci": "0000:03:00.0", "gpu": 0, "vf": None, "product": "C500",
        "numa": 0, "group": 0, "switch": "0000:01:00.0", "healthy": True, "allocated": False,
        "uuid": "GPU-6a7b11c3-f18b-4878-7af9-0ab897f24684",
    }  # fmt: skip
    base.update(kw)
    return base


def test_device_list_format_is_the_documented_one() -> None:
    raw = format_device_list([DeviceEntry(**entry())])  # type: ignore[arg-type]
    assert json.loads(raw) == [entry()]
    assert list(json.loads(raw)[0]) == [
        "id", "pci", "gpu", "vf", "product", "numa", "group", "switch", "healthy", "allocated",
        "uuid",
    ]  # fmt: skip
    assert " " not in raw
    assert DEVICES_ANNOTATION == "metax-tech.com/gpu.devices"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("{", "not JSON"),
        ('{"id": 1}', "JSON array"),
        (json.dumps([1]), "entry 0 is not an object"),
        (json.dumps([{"id": "a"}]), "entry 0 lacks pci"),
        (json.dumps([entry(healthy="yes")]), "entry 0: 'healthy' must be true or false"),
        (json.dumps([entry(), entry(gpu=-1)]), "entry 1: 'gpu' must be a non-negative"),
        (json.dumps([entry(numa="0")]), "'numa' must be a non-negative integer or null"),
        (json.dumps([entry(id="x" * 64)]), "at most 63"),
        (json.dumps([entry(), entry()]), "duplicate device id"),
        (json.dumps([entry(uuid=7)]), "'uuid' must be a non-empty string or null"),
    ],
)
def test_device_list_errors_name_entry_and_key(raw: str, message: str) -> None:
    with pytest.raises(InventoryError, match=message):
        parse_device_list(raw)


def test_device_list_names_gpus_by_uuid_else_pci_and_reads_lists_without_uuid() -> None:
    [new] = parse_device_list(json.dumps([entry(pci="0000:06:00.0", gpu=3)]))
    assert (new.uuid, new.stable_id) == (entry()["uuid"],) * 2
    old = entry(pci="0000:06:00.0", gpu=3)
    del old["uuid"]  # a list written before the key existed
    [parsed] = parse_device_list(json.dumps([old]))
    assert (parsed.uuid, parsed.stable_id, parsed.gpu) == (None, "0000:06:00.0", 3)


def test_device_list_tolerates_absence_and_extra_keys() -> None:
    assert parse_device_list(None) == []
    assert parse_device_list("") == []
    assert parse_device_list("[]") == []
    [parsed] = parse_device_list(json.dumps([entry(future="x", vf=3)]))
    assert parsed.vf == 3 and parsed.free


# -- protos -------------------------------------------------------------------------------------

DEVICE_PLUGIN_FIELDS = {
    "RegisterRequest": {"version": 1, "endpoint": 2, "resource_name": 3, "options": 4},
    "DevicePluginOptions": {"pre_start_required": 1, "get_preferred_allocation_available": 2},
    "ListAndWatchResponse": {"devices": 1},
    "Device": {"ID": 1, "health": 2, "topology": 3},
    "TopologyInfo": {"nodes": 1},
    "NUMANode": {"ID": 1},
    "PreferredAllocationRequest": {"container_requests": 1},
    "ContainerPreferredAllocationRequest": {
        "available_deviceIDs": 1, "must_include_deviceIDs": 2, "allocation_size": 3,
    },
    "PreferredAllocationResponse": {"container_responses": 1},
    "ContainerPreferredAllocationResponse": {"deviceIDs": 1},
    "AllocateRequest": {"container_requests": 1},
    "ContainerAllocateRequest": {"devices_ids": 1},
    "AllocateResponse": {"container_responses": 1},
    "ContainerAllocateResponse": {
        "envs": 1, "mounts": 2, "devices": 3, "annotations": 4, "cdi_devices": 5,
    },
    "Mount": {"container_path": 1, "host_path": 2, "read_only": 3},
    "DeviceSpec": {"container_path": 1, "host_path": 2, "permissions": 3},
    "CDIDevice": {"name": 1},
    "PreStartContainerRequest": {"devices_ids": 1},
}  # fmt: skip

POD_RESOURCES_FIELDS = {
    "ListPodResourcesResponse": {"pod_resources": 1},
    "PodResources": {"name": 1, "namespace": 2, "containers": 3},
    "ContainerResources": {
        "name": 1, "devices": 2, "cpu_ids": 3, "memory": 4, "dynamic_resources": 5,
    },
    "ContainerDevices": {"resource_name": 1, "device_ids": 2, "topology": 3},
    "AllocatableResourcesResponse": {"devices": 1, "cpu_ids": 2, "memory": 3},
}  # fmt: skip


def test_protos_match_the_kubelet_wire_format() -> None:
    dp, pr = protos.load()
    assert dp.DESCRIPTOR.package == "v1beta1"
    assert pr.DESCRIPTOR.package == "v1"
    for module, table in ((dp, DEVICE_PLUGIN_FIELDS), (pr, POD_RESOURCES_FIELDS)):
        for message, fields in table.items():
            descriptor = module.DESCRIPTOR.message_types_by_name[message]
            got = {f.name: f.number for f in descriptor.fields}
            assert {k: got.get(k) for k in fields} == fields, message
    services = {
        s.full_name: [m.name for m in s.methods] for s in dp.DESCRIPTOR.services_by_name.values()
    }
    assert services == {
        "v1beta1.Registration": ["Register"],
        "v1beta1.DevicePlugin": [
            "GetDevicePluginOptions", "ListAndWatch", "GetPreferredAllocation", "Allocate",
            "PreStartContainer",
        ],
    }  # fmt: skip
    law = dp.DESCRIPTOR.services_by_name["DevicePlugin"].methods_by_name["ListAndWatch"]
    assert law.server_streaming
    assert "v1.PodResourcesLister" in {s.full_name for s in pr.DESCRIPTOR.services_by_name.values()}


def test_generate_writes_modules_and_stamp(tmp_path: Path) -> None:
    names = protos.generate(str(tmp_path / "api"))
    assert "deviceplugin_v1beta1_pb2.py" in names and "podresources_v1_pb2.py" in names
    stamp = (tmp_path / "api" / protos.STAMP).read_text().strip()
    assert stamp == protos.source_digest()
    assert not [p for p in os.listdir(tmp_path / "api") if p.startswith(".gen-")]
    assert not protos._stale(str(tmp_path / "api"))
    (tmp_path / "api" / protos.STAMP).write_text("old\n")
    assert protos._stale(str(tmp_path / "api"))


def test_generated_code_is_not_tracked_by_git() -> None:
    ignore = Path(protos.HERE) / ".gitignore"
    assert "/api/" in ignore.read_text().splitlines()
