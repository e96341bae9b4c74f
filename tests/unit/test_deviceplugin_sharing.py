"""Device plugin GPU sharing: replica ids, Allocate mapped to the pod's assignment."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from gpuk8s import sim
from gpuk8s.core.errors import AllocationError, ConfigError
from gpuk8s.core.model import NodeInventory
from gpuk8s.core.sharing import (
    ASSIGNED_ANNOTATION,
    BIND_TIME_ANNOTATION,
    MODE_MPS,
    MODE_SGPU,
    PHASE_ALLOCATED,
    PHASE_ALLOCATING,
    PHASE_ANNOTATION,
    Assignment,
    ShareRequest,
    mps_pipe_dir,
)
from gpuk8s.discovery import discover
from gpuk8s.services.deviceplugin.main import PluginConfig
from gpuk8s.services.deviceplugin.sharing import SharedDevices, replica_id
from gpuk8s.services.node.devices import DeviceSet, UnknownDeviceError

pytestmark = pytest.mark.usefixtures("fast_python3")


@pytest.fixture(scope="module")
def inventories(tmp_path_factory: pytest.TempPathFactory) -> dict[str, NodeInventory]:
    out = {}
    for preset in ("c500-8", "nvidia-8"):
        root = str(tmp_path_factory.mktemp("sim") / preset)
        sim.create(root, preset)
        out[preset] = discover(root)
    return out


def asks(share: ShareRequest) -> dict[str, str]:
    """The container limits that ask for ``share``."""
    if share.mode == MODE_SGPU:
        return {"metax-tech.com/sgpu": str(share.gpus), "metax-tech.com/vcore": str(share.core),
                "metax-tech.com/vmemory": f"{share.memory_mib}Mi"}
    return {"nvidia.com/mps-core": str(share.core),
            "nvidia.com/mps-memory": f"{share.memory_mib}Mi"}


class Pods:
    """The node's pods as the API would list them (records the phase patches)."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []

    def add(self, name: str, assignment: Assignment, when: int,
            spec: dict[str, Any] | None = None) -> None:
        """A bound pod waiting for Allocate; ``spec``: its own (default: one container
        asking for exactly the assignment's share)."""
        self.items.append(
            {
                "metadata": {
                    "name": name,
                    "namespace": "default",
                    "annotations": {
                        ASSIGNED_ANNOTATION: assignment.to_json(),
                        BIND_TIME_ANNOTATION: str(when),
                        PHASE_ANNOTATION: PHASE_ALLOCATING,
                    },
                },
                "spec": spec if spec is not None else {"containers": [
                    {"name": "main", "resources": {"limits": asks(assignment.share)}}]},
            }
        )

    def pods(self) -> list[dict[str, Any]]:
        return self.items

    def mark_allocated(self, namespace: str, name: str) -> None:
        for pod in self.items:
            if pod["metadata"]["name"] == name:
                pod["metadata"]["annotations"][PHASE_ANNOTATION] = PHASE_ALLOCATED


def test_replicas_follow_gpu_health(inventories: dict[str, NodeInventory]) -> None:
    devices = DeviceSet(inventories["c500-8"], "metax-tech.com/gpu")
    shared = SharedDevices(devices, MODE_SGPU, "n1", Pods())
    assert shared.resource_name == "metax-tech.com/sgpu"
    _, views = shared.snapshot()
    assert len(views) == 8 * 16
    first = devices.units[0].id
    assert views[0].id == replica_id(first, 0) == f"{first}::0"
    devices.update_health({0: "ECC"})
    _, views = shared.snapshot()
    assert [v.healthy for v in views[:17]] == [False] * 16 + [True]


def test_allocate_maps_ids_to_the_assigned_gpu(inventories: dict[str, NodeInventory]) -> None:
    inventory = inventories["c500-8"]
    devices = DeviceSet(inventory, "metax-tech.com/gpu")
    pods = Pods()
    shared = SharedDevices(devices, MODE_SGPU, "n1", pods)
    pods.add("late", Assignment("n1", (5,), ShareRequest(MODE_SGPU, 1, 50, 4096)), 200)
    pods.add("early", Assignment("n1", (2,), ShareRequest(MODE_SGPU, 1, 30, 0)), 100)
    pods.add("other-node", Assignment("n2", (1,), ShareRequest(MODE_SGPU, 1, 30, 0)), 50)
    # refused by the kubelet at admission (a failed Allocate, say): still "allocating",
    # but it holds nothing, and its assignment must not be handed to the next pod
    pods.add("failed", Assignment("n1", (6,), ShareRequest(MODE_SGPU, 1, 90, 0)), 10)
    pods.items[-1]["status"] = {"phase": "Failed"}
    any_id = [replica_id(devices.units[7].id, 3)]  # the kubelet's pick says nothing
    spec = shared.container_spec(any_id)
    gpu2 = inventory.gpu(2)
    assert {host for _, host, _ in spec.devices} >= set(gpu2.device_nodes)
    assert not set(inventory.gpu(7).device_nodes) & {host for _, host, _ in spec.devices}
    assert spec.envs["METAX_SGPU_COMPUTE"] == "30"
    assert spec.envs["GPUK8S_DEVICE_IDS"] == gpu2.pci_address
    assert pods.items[1]["metadata"]["annotations"][PHASE_ANNOTATION] == PHASE_ALLOCATED
    assert pods.items[3]["metadata"]["annotations"][PHASE_ANNOTATION] == PHASE_ALLOCATING
    spec = shared.container_spec(any_id)  # next: the later pod
    assert spec.envs["METAX_SGPU_MEMORY_MIB"] == "4096"
    with pytest.raises(AllocationError, match=r"no pod on n1 waits for 1 metax-tech.com/sgpu"):
        shared.container_spec(any_id)
    with pytest.raises(UnknownDeviceError):
        shared.container_spec(["bogus::1"])


def test_mps_allocate_mounts_the_pipe_dir(inventories: dict[str, NodeInventory]) -> None:
    inventory = inventories["nvidia-8"]
    devices = DeviceSet(inventory, "nvidia.com/gpu")
    pods = Pods()
    shared = SharedDevices(devices, MODE_MPS, "n1", pods)
    assert shared.resource_name == "nvidia.com/mps-core"
    pods.add("wrong-size", Assignment("n1", (1,), ShareRequest(MODE_MPS, 1, 40, 0)), 1)
    pods.add("mps", Assignment("n1", (3,), ShareRequest(MODE_MPS, 1, 25, 2048)), 2)
    ids = [replica_id(devices.units[0].id, n) for n in range(25)]  # mps-core: 25
    spec = shared.container_spec(ids)
    uuid = inventory.gpu(3).uuid
    assert uuid
    assert spec.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert spec.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=2048M"
    assert spec.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/run/gpuk8s/mps/pipe"
    assert spec.envs["NVIDIA_VISIBLE_DEVICES"] == uuid
    assert ("/run/gpuk8s/mps/pipe", mps_pipe_dir(uuid), False) in spec.mounts


def test_sharing_mode_config(inventories: dict[str, NodeInventory]) -> None:
    with pytest.raises(ConfigError, match=r"sharing-mode.*exclusive, sgpu, vcuda, mps"):
        PluginConfig(sharing_mode="half")
    with pytest.raises(ConfigError, match="needs --node-name"):
        PluginConfig(sharing_mode="mps")
    config = PluginConfig(sharing_mode="vcuda", node_name="n")
    assert config.resource_for(inventories["nvidia-8"]) == "tencent.com/vcuda-core"


def test_sharing_mode_auto_reads_the_node_label() -> None:
    from gpuk8s.services.deviceplugin.main import build_parser, config_from_args, resolve_sharing

    args = build_parser().parse_args(["--sharing-mode", "auto", "--node-name", "n1"])
    config = config_from_args(args)
    assert config.sharing_mode == "exclusive"  # until the label is read
    assert resolve_sharing(config, {"gpuk8s.io/sharing-mode": "mps"}).sharing_mode == "mps"
    assert resolve_sharing(config, {}).sharing_mode == "exclusive"
    with pytest.raises(ConfigError, match=r"gpuk8s.io/sharing-mode.*'half'"):
        resolve_sharing(config, {"gpuk8s.io/sharing-mode": "half"})


def test_allocate_serves_a_share_asked_in_a_sidecar_and_never_more_than_asked(
    inventories: dict[str, NodeInventory],
) -> None:
    """The pod's effective request (core.effective, init and sidecar containers
    included) is the share gpu-device serves: a sidecar's share is served; an assignment
    larger than what the pod asks (written by hand) is not (before: served)."""
    inventory = inventories["c500-8"]
    devices = DeviceSet(inventory, "metax-tech.com/gpu")
    pods = Pods()
    shared = SharedDevices(devices, MODE_SGPU, "n1", pods)
    share = ShareRequest(MODE_SGPU, 1, 30, 0)
    greedy = Assignment("n1", (1,), ShareRequest(MODE_SGPU, 1, 100, 0))
    pods.add("greedy", greedy, 50, spec={"containers": [
        {"name": "main", "resources": {"limits": asks(share)}}]})
    sidecar = {"initContainers": [{"name": "side", "restartPolicy": "Always",
                                   "resources": {"limits": asks(share)}}],
               "containers": [{"name": "main"}]}
    pods.add("side", Assignment("n1", (4,), replace(share, container="side")), 100,
             spec=sidecar)
    spec = shared.container_spec([replica_id(devices.units[0].id, 0)])
    assert spec.envs["METAX_SGPU_COMPUTE"] == "30"
    assert spec.envs["GPUK8S_DEVICE_IDS"] == inventory.gpu(4).pci_address
    assert pods.items[0]["metadata"]["annotations"][PHASE_ANNOTATION] == PHASE_ALLOCATING
    with pytest.raises(AllocationError, match="no pod on n1 waits"):
        shared.container_spec([replica_id(devices.units[0].id, 0)])
