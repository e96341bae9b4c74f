"""One stable name per GPU, end to end, in one process (tests/e2e/test_stable_gpu_ids.py
runs the same story on the lab).

A simulated c500-8 node in sGPU mode: shares booked on GPUs 5 and 6, every other GPU
full. GPU 3 leaves the bus (``sim fail --mode remove``) and discovery renumbers the GPUs
above it, so the cards that were 5 and 6 are now 4 and 5. gpu-aware's bookings, a share
it places anew, gpu-device's ``Allocate`` and gpu-exporter's per-GPU attribution must all
stay on the same physical cards (by UUID), and healing GPU 3 brings everything back as
it was.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuk8s import sim
from gpuk8s.core.model import NodeInventory
from gpuk8s.core.sharing import (
    ASSIGNED_ANNOTATION,
    MODE_SGPU,
    Assignment,
    ShareRequest,
    parse_assignment,
)
from gpuk8s.discovery import discover
from gpuk8s.services.deviceplugin.nodestate import published_annotations
from gpuk8s.services.deviceplugin.sharing import SharedDevices, replica_id
from gpuk8s.services.exporter import main as exporter_main
from gpuk8s.services.exporter.metrics import registry_for
from gpuk8s.services.exporter.pods import PodDirectory, index_pods
from gpuk8s.services.extender.logic import Extender
from gpuk8s.services.extender.share import Ledger, SharedNodes, Sharing
from gpuk8s.services.extender.weights import Weights, WeightSource
from gpuk8s.services.extender.wire import NodeView, node_item
from gpuk8s.services.node.devices import DeviceSet

from .test_deviceplugin_sharing import Pods
from .test_exporter import PodResourcesServer, _write_proc
from .test_extender_share import Api, bind, node, pod

NODE = "gpu-node-1"
SGPU = "metax-tech.com/sgpu"
UID = {"a": "11111111-2222-3333-4444-555555555555", "b": "66666666-7777-8888-9999-000000000000"}
CID = {name: (name * 64)[:64] for name in UID}
CORE = {"a": 50, "b": 30}  # pod a: half of GPU 5; pod b: 30 % of GPU 6


def share(core: int) -> ShareRequest:
    return ShareRequest(MODE_SGPU, 1, core, 0, container="main")


def booked(inventory: NodeInventory, index: int, core: int) -> Assignment:
    """What gpu-aware's bind writes for ``core`` percent of GPU ``index``."""
    return Assignment(NODE, (index,), share(core), (inventory.gpu(index).stable_id,))


def pod_json(name: str, assignment: Assignment) -> dict[str, Any]:
    return {"metadata": {"uid": UID[name], "namespace": "team", "name": name,
                         "annotations": {ASSIGNED_ANNOTATION: assignment.to_json()}},
            "spec": {"nodeName": NODE},
            "status": {"containerStatuses": [{"name": "main",
                                              "containerID": f"containerd://{CID[name]}"}]}}


class Node:
    """The node's GPU services in one process over the simulator root: gpu-aware's
    sharing (node view from gpu-device's published annotations, the ledger), and
    gpu-exporter's sampler; gpu-device is made anew per discovery (it discovers once
    at start)."""

    def __init__(self, tmp_path: Path) -> None:
        self.root = str(tmp_path / "node")
        sim.create(self.root, "c500-8")
        self.inventory = discover(self.root)
        self.nodes, self.ledger = SharedNodes(), Ledger()
        self.ledger.replace([])
        self.api = Api(self.ledger)
        self.extender = Extender(WeightSource(None, Weights(1, 1)),
                                 sharing=Sharing(self.nodes, self.ledger, self.api))
        self.publish()
        self.podres = PodResourcesServer(str(tmp_path / "kubelet.sock"))
        self.proc = tmp_path / "proc"
        self.proc.mkdir()
        self.pods: list[dict[str, Any]] = []
        args = exporter_main.build_parser().parse_args([
            "--host-root", self.root, "--proc-dir", str(self.proc), "--node-name", NODE,
            "--pod-resources-socket", self.podres.path, "--port", "0", "--log-dir", "",
        ])
        self.sampler = exporter_main.build_sampler(
            args, pods=PodDirectory(lambda: index_pods(self.pods), min_refresh=0, max_age=0))
        self.sampler.rediscover = 0.0  # every sample discovers again

    def publish(self) -> None:
        """Discover, and let gpu-aware see what gpu-device would publish now."""
        self.inventory = discover(self.root)
        ann = published_annotations(DeviceSet(self.inventory, "metax-tech.com/gpu"), set())
        item = node(NODE, ann, MODE_SGPU)
        self.nodes.replace([node_item(msgspec.json.decode(json.dumps(item), type=NodeView))])

    def uuids(self, indexes: tuple[int, ...] | None) -> tuple[str | None, ...]:
        assert indexes is not None
        return tuple(self.inventory.gpu(i).uuid for i in indexes)

    def booked_by_uuid(self) -> dict[str, int]:
        """gpu-aware's booked percent per physical card (what placement counts)."""
        view = self.nodes.get(NODE)
        assert view is not None
        usage = self.ledger.usage(NODE, index_by_id=view.index_by_id)
        return {str(self.inventory.gpu(i).uuid): u.core for i, u in usage.items()}

    def served(self, assignment: Assignment) -> tuple[str, str]:
        """The card gpu-device's Allocate gives a pod with ``assignment``: (PCI address
        in GPUK8S_DEVICE_IDS, the card's UUID)."""
        devices = DeviceSet(self.inventory, "metax-tech.com/gpu")
        pending = Pods()
        pending.add("p", assignment, 1)
        shared = SharedDevices(devices, MODE_SGPU, NODE, pending)
        spec = shared.container_spec([replica_id(devices.units[0].id, 0)])
        pci = spec.envs["GPUK8S_DEVICE_IDS"]
        uuid = next(g.uuid for g in self.inventory.gpus if g.pci_address == pci)
        return pci, str(uuid)

    def device_ids(self, uuids: list[str]) -> list[str]:
        """gpu-device's device ids (the kubelet's: whole GPU and first share replica)
        of the cards ``uuids``."""
        devices = DeviceSet(self.inventory, "metax-tech.com/gpu")
        index = {g.uuid: g.index for g in self.inventory.gpus}
        units = {u.gpu: u.id for u in devices.units if u.vf is None}
        return [i for u in uuids for i in (units[index[u]], replica_id(units[index[u]], 0))]

    def metered(self) -> dict[str, tuple[str, str, float]]:
        """pod -> (uuid label, kind, memory) of its container series; and per-GPU
        container counts by uuid under the key ``gpu:<uuid>``."""
        self.sampler.sample_once()
        text = generate_latest(registry_for(self.sampler, NODE)).decode()
        out: dict[str, tuple[str, str, float]] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "gpuk8s_container_gpu_memory_used_bytes":
                    out[s.labels["pod"]] = (s.labels["uuid"], s.labels["kind"], s.value)
                elif s.name == "gpuk8s_gpu_containers" and s.value:
                    out["gpu:" + s.labels["uuid"]] = (s.labels["gpu"], s.labels["kind"], s.value)
        return out


@pytest.fixture
def lab(tmp_path: Path) -> Any:
    got = Node(tmp_path)
    try:
        yield got
    finally:
        got.podres.server.stop(0)


def test_shares_stay_on_their_cards_when_a_gpu_leaves_the_bus_and_returns(lab: Node) -> None:
    inv = lab.inventory
    card = {"a": str(inv.gpu(5).uuid), "b": str(inv.gpu(6).uuid)}
    # pods a and b hold shares of GPUs 5 and 6; fillers hold every other GPU whole
    mine = {"a": booked(inv, 5, CORE["a"]), "b": booked(inv, 6, CORE["b"])}
    for name, assignment in mine.items():
        lab.ledger.set(UID[name], assignment)
    for gpu in inv.gpus:
        if gpu.index not in (5, 6):
            lab.ledger.set(f"filler-{gpu.index}", booked(inv, gpu.index, 100))
    # what the kubelet and the processes say: replica ids that name GPU 0 (the kubelet
    # picks them at random), the pods' processes on the cards they were assigned
    lab.podres.pods = [("team", n, [("main", SGPU, [f"{inv.gpu(0).pci_address}::{k}"])])
                       for k, n in enumerate(mine)]
    lab.pods = [pod_json(n, a) for n, a in mine.items()]
    for k, name in enumerate(mine, 1):
        _write_proc(lab.proc, 1000 * k, UID[name], CID[name])
    sim.set_load(lab.root, 5, utilization=60, processes=[{"pid": 1000, "memory_mib": 3000}])
    sim.set_load(lab.root, 6, utilization=20, processes=[{"pid": 2000, "memory_mib": 1000}])
    new_share = share(40)

    def state() -> dict[str, Any]:
        """Everything that must name the same cards whatever their indexes."""
        placed = lab.extender.sharing.place(NODE, new_share)  # type: ignore[union-attr]
        return {
            "booked": {u: c for u, c in lab.booked_by_uuid().items() if u in card.values()},
            "new share": lab.uuids(placed.gpus),
            "served a": lab.served(mine["a"])[1],
            "served b": lab.served(mine["b"])[1],
            "device ids": lab.device_ids([card["a"], card["b"]]),
            "metered": lab.metered(),
        }

    before = state()
    assert before["booked"] == {card["a"]: 50, card["b"]: 30}
    # the only cards with room for 40 %: a's (50 % free) and b's (70 % free)
    assert len(before["new share"]) == 1 and before["new share"][0] in card.values()
    target = before["new share"][0]
    assert (before["served a"], before["served b"]) == (card["a"], card["b"])
    assert before["device ids"][:2] == [inv.gpu(5).pci_address, inv.gpu(5).pci_address + "::0"]
    m = before["metered"]
    mib = 2**20
    assert (m["a"], m["b"]) == ((card["a"], "vGPU", 3000 * mib), (card["b"], "vGPU", 1000 * mib))
    assert m["gpu:" + card["a"]][1:] == m["gpu:" + card["b"]][1:] == ("vGPU", 1.0)

    sim.fail(lab.root, 3, "remove")
    lab.publish()
    assert [g.uuid for g in lab.inventory.gpus][4:6] == [card["a"], card["b"]]  # renumbered
    assert state() == before
    # bind places the new share through the extender itself and records the card's id
    lab.api.pods["new"] = pod("new", "40")
    assert bind(lab.extender, lab.api, lab.api.pods["new"], NODE) == ""
    got = parse_assignment(lab.api.pods["new"]["metadata"]["annotations"][ASSIGNED_ANNOTATION])
    assert got is not None and got.ids == before["new share"]
    assert got.gpus == (4 if target == card["a"] else 5,)  # the index for display: now
    assert lab.booked_by_uuid()[target] == before["booked"][target] + 40
    lab.ledger.release("uid-new")

    sim.heal(lab.root, 3)
    lab.publish()
    assert state() == before


def test_an_old_index_only_assignment_is_served_by_its_index(lab: Node) -> None:
    """A record from before ids is read as it was written: by index (documented: after
    a loss it may name the neighbour of the card it meant)."""
    old = Assignment(NODE, (5,), share(50))
    assert "ids" not in json.loads(old.to_json())
    assert lab.served(old)[1] == lab.inventory.gpu(5).uuid
    sim.fail(lab.root, 3, "remove")
    lab.publish()
    assert lab.served(old)[1] == lab.inventory.gpu(5).uuid  # the card now numbered 5
