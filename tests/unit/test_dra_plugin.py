"""gpu-dra against a kubelet stand-in (real gRPC on unix sockets) and an in-memory API.

The driver runs in-process (``DraApp``) on simulator roots; ``dra_kubelet`` registers it
the way the kubelet's plugin watcher does, calls NodePrepareResources/Unprepare over v1
and v1beta1, watches health, and restarts. What a container would get is read back from
the CDI spec the driver wrote, resolved with ``core.cdi`` (the same rules the runtime
applies).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuk8s import sim
from gpuk8s.core import cdi
from gpuk8s.core.dra import DRIVER, PoolOptions, gpu_device_name, group_device_name
from gpuk8s.core.model import NodeInventory
from gpuk8s.discovery import discover
from gpuk8s.services.dra.driver import CDI_KIND, spec_path
from gpuk8s.services.dra.grpcapi import (
    DRA_V1,
    DRA_V1BETA1,
    HEALTH_V1,
    HEALTH_V1ALPHA1,
    HEALTHY,
    UNHEALTHY,
)
from gpuk8s.services.dra.main import DraApp, DraConfig
from gpuk8s.services.node.devices import AllocateOptions

from .dra_kubelet import FakeDraKubelet, FakeResourceApi

NODE = "node-a"
pytestmark = pytest.mark.usefixtures("fast_python3")


@pytest.fixture(scope="module")
def c500(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, NodeInventory]:
    root = str(tmp_path_factory.mktemp("sim") / "c500")
    sim.create(root, "c500-8")
    return root, discover(root)


@pytest.fixture
def dirs() -> Iterator[dict[str, str]]:
    # unix socket paths are limited to 107 bytes: keep them short
    with tempfile.TemporaryDirectory(prefix="dra-") as base:
        out = {k: os.path.join(base, k) for k in ("plugin", "registry", "cdi")}
        for path in out.values():
            os.makedirs(path)
        yield out


class Node:
    """A running driver with its kubelet and API server."""

    def __init__(self, app: DraApp, kubelet: FakeDraKubelet, api: FakeResourceApi) -> None:
        self.app, self.kubelet, self.api = app, kubelet, api


@pytest.fixture
def nodes() -> Iterator[list[Node]]:
    started: list[Node] = []
    yield started
    for node in started:
        node.app.stop()
        node.kubelet.stop()


def start(nodes: list[Node], root: str, inventory: NodeInventory, dirs: dict[str, str],
          api: FakeResourceApi | None = None, kubelet: FakeDraKubelet | None = None,
          **kw: Any) -> Node:
    api = api or FakeResourceApi()
    base: dict[str, Any] = {
        "host_root": root, "node_name": NODE, "plugin_dir": dirs["plugin"],
        "registry_dir": dirs["registry"], "cdi_dir": dirs["cdi"], "healthy_interval": 0.0,
        "removal_poll": 0.05, "watch_interval": 0.05, "resync_interval": 30.0,
    }
    base.update(kw)
    app = DraApp(DraConfig(**base), inventory, claims=api, slices=api)
    kubelet = kubelet or FakeDraKubelet(dirs["registry"]).start()
    app.start()
    node = Node(app, kubelet, api)
    nodes.append(node)
    return node


def result(device: str, request: str = "gpus", **extra: Any) -> dict[str, Any]:
    return {"request": request, "driver": DRIVER, "pool": NODE, "device": device, **extra}


def gpu(inv: NodeInventory, index: int) -> str:
    """The published device name of GPU ``index`` (built from its PCI address)."""
    return gpu_device_name(inv.gpu(index))


def group(inv: NodeInventory, *members: int) -> str:
    return group_device_name([inv.gpu(i) for i in members])


def container_edits(cdi_dir: str, ids: list[str]) -> cdi.ContainerEdits:
    """What a CDI-capable runtime applies for these device ids (every spec in the dir)."""
    specs = []
    for name in sorted(os.listdir(cdi_dir)):
        if name.endswith(".json"):
            specs.append(cdi.parse_spec(json.loads(Path(cdi_dir, name).read_text()), name))
    return cdi.resolve(specs, ids)


def cdi_ids(response: Any, uid: str) -> list[str]:
    claim = response.claims[uid]
    assert claim.error == ""
    return [i for d in claim.devices for i in d.cdi_device_ids]


# -- registration -------------------------------------------------------------------------


def test_registers_as_dra_plugin_and_the_kubelet_picks_v1(
    c500: tuple[str, NodeInventory], dirs: dict[str, str], nodes: list[Node]
) -> None:
    root, inv = c500
    node = start(nodes, root, inv, dirs)
    [reg] = node.kubelet.wait_registrations(1)
    assert reg.type == "DRAPlugin" and reg.name == DRIVER
    assert reg.socket == os.path.join(dirs["registry"], f"{DRIVER}-reg.sock")
    assert reg.endpoint == os.path.join(dirs["plugin"], "dra.sock")
    assert reg.versions == ["v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth",
                            "v1alpha1.DRAResourceHealth"]
    assert reg.service == DRA_V1 and reg.error == "" and reg.health == HEALTH_V1
    assert node.kubelet.wait_for(lambda: node.app.server.registered.is_set(), 5,
                                 "registration status") is None
    node.api.wait(lambda: node.app.publisher.published_at is not None, 5, "slices")
    ok, body = node.app.readiness()
    assert ok and body["registered"] and body["slicesPublished"]


@pytest.mark.parametrize("kubelet_health", [(HEALTH_V1, HEALTH_V1ALPHA1), (HEALTH_V1ALPHA1,)],
                         ids=["kubelet-1.37-v1", "kubelet-1.35-v1alpha1"])
def test_the_health_stream_answers_on_each_version_the_kubelet_calls(
    c500: tuple[str, NodeInventory], dirs: dict[str, str], nodes: list[Node],
    kubelet_health: tuple[str, ...]
) -> None:
    """The kubelet 1.37 picks DRAResourceHealth v1 (the newest both know), 1.35 calls
    v1alpha1: both get every device of the pool, HEALTHY, on the same stream."""
    root, inv = c500
    kubelet = FakeDraKubelet(dirs["registry"], health_services=kubelet_health).start()
    node = start(nodes, root, inv, dirs, kubelet=kubelet)
    [reg] = node.kubelet.wait_registrations(1)
    assert reg.health == kubelet_health[0]
    node.api.wait(lambda: node.app.publisher.published_at is not None, 5, "slices")
    watch = node.kubelet.watch_health()
    node.kubelet.wait_for(lambda: bool(watch.updates), 5, "first health update")
    assert set(watch.updates[0]) == set(node.api.devices())
    assert set(watch.updates[0].values()) == {HEALTHY}


def test_a_refused_registration_is_not_ready(
    c500: tuple[str, NodeInventory], dirs: dict[str, str], nodes: list[Node]
) -> None:
    root, inv = c500
    kubelet = FakeDraKubelet(dirs["registry"])
    kubelet.refuse_with = "endpoint already registered"
    kubelet.start()
    node = start(nodes, root, inv, dirs, kubelet=kubelet)
    node.kubelet.wait_registrations(1)
    time.sleep(0.1)
    ok, body = node.app.readiness()
    assert not ok and body["lastRegistrationError"] == "endpoint already registered"


def test_socket_removed_is_served_and_registered_again(
    c500: tuple[str, NodeInventory], dirs: dict[str, str], nodes: list[Node]
) -> None:
    root, inv = c500
    node = start(nodes, root, inv, dirs)
    [first] = node.kubelet.wait_registrations(1)
    os.unlink(first.socket)
    regs = node.kubelet.wait_registrations(2)
    assert regs[1].service == DRA_V1 and regs[1].endpoint == first.endpoint


# -- prepare / unprepare -------------------------------------------------------------------


@pytest.mark.parametrize("service", [DRA_V1, DRA_V1BETA1])
def test_prepare_returns_cdi_ids_that_give_the_container_its_gpus(
    c500: tuple[str, NodeInventory], dirs: dict[str, str], nodes: list[Node], service: str
) -> None:
    root, inv = c500
    node = start(nodes, root, inv, dirs)
    node.kubelet.wait_registrations(1)
    node.api.add_claim("team", "train", "uid-1", [result(gpu(inv, 5)), result(gpu(inv, 4))])
    response = node.kubelet.prepare([("team", "uid-1", "train")], service)
    [dev4, _] = sorted(response.claims["uid-1"].devices, key=lambda d: d.device_name)
    assert (dev4.pool_name, dev4.device_name, list(dev4.request_names)) == (
        NODE, gpu(inv, 4), ["gpus"])
    ids = cdi_ids(response, "uid-1")
    assert all(i.startswith(CDI_KIND + "=uid-1-") for i in ids)
    edits = container_edits(dirs["cdi"], ids)
    nodes_seen = sorted(n.path for n in edits.device_nodes)
    want = sorted(["/dev/mxcd", *inv.gpu(4).device_nodes, *inv.gpu(5).device_nodes])
    assert nodes_seen == want
    env = edits.env_map()
    assert env["MACA_VISIBLE_DEVICES"] == "0,1"
    assert env["GPUK8S_DEVICE_IDS"] == f"{inv.gpu(4).pci_address},{inv.gpu(5).pci_address}"
    saved = json.loads(Path(dirs["plugin"], "checkpoint.json").read_text())
    assert saved["claims"]["uid-1"]["gpus"] == [4, 5]


def test_prepare_is_idempotent_and_survives_a_plugin_restart(
    c500: tuple[str, NodeInventory], dirs: dict[str, str], nodes: list[Node]
) -> None:
    root, inv = c500
    api = FakeResourceApi()
    node = start(nodes, root, inv, dirs, api=api)
    node.kubelet.wait_registrations(1)
    api.add_claim("team", "train", "uid-1", [result(gpu(inv, 0))])
    first = node.kubelet.prepare([("team", "uid-1", "train")])
    again = node.kubelet.prepare([("team", "uid-1", "train")])
    assert cdi_ids(first, "uid-1") == cdi_ids(again, "uid-1")
    assert api.claim_reads == 1, "a prepared claim is answered from the checkpoint"
    node.app.stop()
    node.kubelet.stop()
    nodes.remove(node)
    del api.claims[("team", "train")]  # the API server cannot help the new process
    restarted = start(nodes, root, inv, dirs, api=api)
    restarted.kubelet.wait_registrations(1)
    after = restarted.kubelet.prepare([("team", "uid-1", "train")])
    assert cdi_ids(after, "uid-1") == cdi_ids(first, "uid-1")
    assert os.path.exists(spec_path(dirs["cdi"], "uid-1"))
    gone = restarted.kubelet.unprepare([("team", "uid-1", "train")])
    assert gone.claims["uid-1"].error == ""
    assert not os.path.exists(spec_path(dirs["cdi"], "uid-1"))
    assert json.loads(Path(dirs["plugin"], "checkpoint.json").read_text())["claims"] == {}
    twice = restarted.kubelet.unprepare([("team", "uid-1", "train")])
    assert twice.claims["uid-1"].error == "", "unpreparing an unknown claim is not an error"


def test_slices_wiped_by_a_starting_kubelet_come_back(
    c500: tuple[str, NodeInventory], dirs: dict[str, str], nodes: list[Node]
) -> None:
    root, inv = c500
    # resync only every hour: back within a minute is the watch's doing. (It once missed
    # one run in six: the stand-in's watch compared snapshots 50 ms apart, so the last
    # create and the wipe right after it fell between two looks and were "no change";
    # it now follows every write in order, as list-then-watch does on an API server.)
    node = start(nodes, root, inv, dirs, resync_interval=3600.0)
    node.api.wait(lambda: len(node.api.devices()) == 14, 60, "slices")
    node.api.wipe(NODE)
    node.api.wait(lambda: len(node.api.devices()) == 14, 60, "slices back")


def test_a_kubelet_restart_keeps_prepared_claims(
    c500: tuple[str, NodeInventory], dirs: dict[str, str], nodes: list[Node]
) -> None:
    root, inv = c500
    node = start(nodes, root, inv, dirs)
    node.kubelet.wait_registrations(1)
    node.api.add_claim("team", "train", "uid-1", [result(gpu(inv, 2))])
    before = cdi_ids(node.kubelet.prepare([("team", "uid-1", "train")]), "uid-1")
    node.kubelet.restart()
    regs = node.kubelet.wait_registrations(2)
    assert regs[1].socket == regs[0].socket, "the same socket is found again at start"
    after = cdi_ids(node.kubelet.prepare([("team", "uid-1", "train")]), "uid-1")
    assert after == before and node.api.claim_reads == 1


def test_claims_that_cannot_be_prepared_say_why_and_change_nothing(
    c500: tuple[str, NodeInventory], dirs: dict[str, str], nodes: list[Node]
) -> None:
    root, inv = c500
    node = start(nodes, root, inv, dirs)
    node.kubelet.wait_registrations(1)
    api = node.api
    api.add_claim("ns", "recreated", "uid-new", [result(gpu(inv, 0))])
    api.add_claim("ns", "pending", "uid-p", None)
    api.add_claim("ns", "elsewhere", "uid-e", [{**result(gpu(inv, 0)), "pool": "node-b"}])
    api.add_claim("ns", "unknown", "uid-u", [result("tpu-0")])
    response = node.kubelet.prepare([("ns", "uid-old", "recreated"), ("ns", "uid-p", "pending"),
                                     ("ns", "uid-e", "elsewhere"), ("ns", "uid-u", "unknown"),
                                     ("ns", "uid-x", "missing")])
    errors = {uid: c.error for uid, c in response.claims.items()}
    assert "has UID uid-new, the kubelet asked for uid-old" in errors["uid-old"]
    assert "is not allocated" in errors["uid-p"]
    assert f"no device of driver {DRIVER} in pool {NODE}" in errors["uid-e"]
    assert f"device 'tpu-0' of pool {NODE} cannot be prepared: it is not one of this " \
        "node's devices" in errors["uid-u"]
    assert "not found" in errors["uid-x"]
    assert all(not c.devices for c in response.claims.values())
    assert os.listdir(dirs["cdi"]) == []
    assert not os.path.exists(os.path.join(dirs["plugin"], "checkpoint.json"))


def test_a_group_device_gives_all_four_gpus(
    c500: tuple[str, NodeInventory], dirs: dict[str, str], nodes: list[Node]
) -> None:
    root, inv = c500
    node = start(nodes, root, inv, dirs)
    node.kubelet.wait_registrations(1)
    quad = group(inv, 4, 5, 6, 7)
    node.api.add_claim("ns", "quad", "uid-q", [result(quad, request="quad")])
    response = node.kubelet.prepare([("ns", "uid-q", "quad")])
    [device] = response.claims["uid-q"].devices
    assert device.device_name == quad
    edits = container_edits(dirs["cdi"], list(device.cdi_device_ids))
    got = {n.path for n in edits.device_nodes}
    for index in (4, 5, 6, 7):
        assert set(inv.gpu(index).device_nodes) <= got
    assert not set(inv.gpu(0).device_nodes) & got
    assert edits.env_map()["MACA_VISIBLE_DEVICES"] == "0,1,2,3"


def test_sgpu_shares_get_their_limits_and_share_ids(
    c500: tuple[str, NodeInventory], dirs: dict[str, str], nodes: list[Node]
) -> None:
    root, inv = c500
    node = start(nodes, root, inv, dirs, pool=PoolOptions(sharing="sgpu"))
    node.kubelet.wait_registrations(1)
    for uid, core in (("uid-a", "30"), ("uid-b", "70")):
        node.api.add_claim("ns", uid, uid, [result(
            gpu(inv, 3), shareID=f"share-{uid}",
            consumedCapacity={"vcore": core, "vmemory": "8Gi", "shares": "1"})])
    a = node.kubelet.prepare([("ns", "uid-a", "uid-a")])
    b = node.kubelet.prepare([("ns", "uid-b", "uid-b")], DRA_V1BETA1)
    assert a.claims["uid-a"].devices[0].share_id == "share-uid-a"
    env_a = container_edits(dirs["cdi"], cdi_ids(a, "uid-a")).env_map()
    env_b = container_edits(dirs["cdi"], cdi_ids(b, "uid-b")).env_map()
    assert (env_a["METAX_SGPU_COMPUTE"], env_a["METAX_SGPU_MEMORY_MIB"]) == ("30", "8192")
    assert (env_b["METAX_SGPU_COMPUTE"], env_b["METAX_SGPU_MEMORY_MIB"]) == ("70", "8192")
    assert {n.path for n in container_edits(dirs["cdi"], cdi_ids(a, "uid-a")).device_nodes} == \
        {"/dev/mxcd", *inv.gpu(3).device_nodes}


def test_a_device_prepared_for_another_claim_is_refused_naming_both(
    c500: tuple[str, NodeInventory], dirs: dict[str, str], nodes: list[Node]
) -> None:
    """GPU 1 prepared for train: a claim for GPU 1, or for the group holding it, is refused
    with both claims named (nothing written for it), and prepared once train is gone."""
    root, inv = c500
    node = start(nodes, root, inv, dirs)
    node.kubelet.wait_registrations(1)
    node.api.add_claim("team", "train", "uid-t", [result(gpu(inv, 1))])
    assert cdi_ids(node.kubelet.prepare([("team", "uid-t", "train")]), "uid-t")
    for name, uid, device in (("again", "uid-g", gpu(inv, 1)),
                              ("pair", "uid-p", group(inv, 0, 1))):
        node.api.add_claim("lab", name, uid, [result(device)])
        error = node.kubelet.prepare([("lab", uid, name)]).claims[uid].error
        assert f"device {device} of claim lab/{name} (UID {uid}) is already prepared for " \
               f"claim team/train (UID uid-t, device {gpu(inv, 1)})" in error, error
        assert not os.path.exists(spec_path(dirs["cdi"], uid))
    saved = json.loads(Path(dirs["plugin"], "checkpoint.json").read_text())["claims"]
    assert set(saved) == {"uid-t"}
    node.kubelet.unprepare([("team", "uid-t", "train")])
    assert cdi_ids(node.kubelet.prepare([("lab", "uid-p", "pair")]), "uid-p")


def test_a_corrupt_checkpoint_is_kept_aside(
    c500: tuple[str, NodeInventory], dirs: dict[str, str], nodes: list[Node]
) -> None:
    root, inv = c500
    Path(dirs["plugin"], "checkpoint.json").write_text("{not json")
    node = start(nodes, root, inv, dirs)
    assert Path(dirs["plugin"], "checkpoint.json.corrupt").read_text() == "{not json"
    node.kubelet.wait_registrations(1)
    node.api.add_claim("ns", "c", "uid-c", [result(gpu(inv, 1))])
    assert cdi_ids(node.kubelet.prepare([("ns", "uid-c", "c")]), "uid-c")


def test_a_claim_allocated_before_a_loss_gets_its_card_after_a_restart(
    tmp_path: Path, dirs: dict[str, str], nodes: list[Node]
) -> None:
    """Claims allocated while GPU 3 was on the bus, prepared by a plugin started after it
    left (discovery renumbered the GPUs above it): the claim for the card that was GPU 5
    gets that card, now GPU 4; the claim for GPU 3's card is refused, naming its address."""
    root = str(tmp_path / "sim")
    sim.create(root, "c500-8")
    before = discover(root)
    five, three = gpu(before, 5), gpu(before, 3)
    sim.fail(root, 3, "remove")
    after = discover(root)
    assert after.gpu(4).pci_address == before.gpu(5).pci_address  # renumbered
    node = start(nodes, root, after, dirs)
    node.kubelet.wait_registrations(1)
    node.api.add_claim("team", "train", "uid-5", [result(five)])
    node.api.add_claim("team", "lost", "uid-3", [result(three)])
    response = node.kubelet.prepare([("team", "uid-5", "train"), ("team", "uid-3", "lost")])
    edits = container_edits(dirs["cdi"], cdi_ids(response, "uid-5"))
    assert edits.env_map()["GPUK8S_DEVICE_IDS"] == before.gpu(5).pci_address
    assert {n.path for n in edits.device_nodes} == {"/dev/mxcd", *after.gpu(4).device_nodes}
    assert f"device {three!r} of pool {NODE} cannot be prepared: the GPU at PCI address " \
        f"{before.gpu(3).pci_address} is not on this node's bus now" in \
        response.claims["uid-3"].error
    assert not os.path.exists(spec_path(dirs["cdi"], "uid-3"))


@pytest.mark.parametrize(("device", "gpus", "with_ids"), [
    ("gpu-1", [1], True),  # version 3: index-built names, the cards' ids beside them
    ("group-0-1", [0, 1], False),  # versions 1 and 2: indexes only
])  # fmt: skip
def test_claims_prepared_before_stable_names_are_kept_held_and_unprepared(
    c500: tuple[str, NodeInventory], dirs: dict[str, str], nodes: list[Node],
    device: str, gpus: list[int], with_ids: bool,
) -> None:
    """A checkpoint written by the release before stable device names: after the upgrade
    the kubelet's repeated prepare is answered from it, the GPUs it holds are not
    prepared for another claim, a claim allocated under an index-built name but not yet
    prepared is refused with the reason, and unprepare removes the old claim."""
    root, inv = c500
    old_spec = spec_path(dirs["cdi"], "uid-old")
    Path(old_spec).write_text("{}")
    cdi_id = f"{CDI_KIND}=uid-old-0-{device}"
    claim: dict[str, Any] = {
        "namespace": "team", "name": "old", "gpus": gpus, "cdiSpec": old_spec,
        "devices": [{"requests": ["gpus"], "pool": NODE, "device": device,
                     "cdiDeviceIds": [cdi_id]}]}
    if with_ids:
        claim["ids"] = [inv.gpu(g).stable_id for g in gpus]
    Path(dirs["plugin"], "checkpoint.json").write_text(json.dumps(
        {"format": 1, "version": 3 if with_ids else 2, "claims": {"uid-old": claim}}))
    node = start(nodes, root, inv, dirs)
    node.kubelet.wait_registrations(1)
    again = node.kubelet.prepare([("team", "uid-old", "old")])
    assert [d.device_name for d in again.claims["uid-old"].devices] == [device]
    assert cdi_ids(again, "uid-old") == [cdi_id] and node.api.claim_reads == 0
    node.api.add_claim("lab", "new", "uid-new", [result(gpu(inv, 1))])
    node.api.add_claim("lab", "stale", "uid-s", [result("gpu-2")])  # allocated before
    response = node.kubelet.prepare([("lab", "uid-new", "new"), ("lab", "uid-s", "stale")])
    assert f"is already prepared for claim team/old (UID uid-old, device {device})" in \
        response.claims["uid-new"].error
    assert "device 'gpu-2' of pool node-a cannot be prepared: it names a GPU by index" in \
        response.claims["uid-s"].error
    assert "allocated before gpu-dra was upgraded" in response.claims["uid-s"].error
    assert node.kubelet.unprepare([("team", "uid-old", "old")]).claims["uid-old"].error == ""
    assert not os.path.exists(old_spec)
    assert cdi_ids(node.kubelet.prepare([("lab", "uid-new", "new")]), "uid-new")
    saved = json.loads(Path(dirs["plugin"], "checkpoint.json").read_text())["claims"]
    assert set(saved) == {"uid-new"} and saved["uid-new"]["devices"][0]["device"] == gpu(inv, 1)


# -- slices and health ------------------------------------------------------------------------


def test_slices_are_published_at_start_with_every_device(
    c500: tuple[str, NodeInventory], dirs: dict[str, str], nodes: list[Node]
) -> None:
    root, inv = c500
    # resync only every hour: slices there within a minute were published at start
    node = start(nodes, root, inv, dirs, resync_interval=3600.0)
    node.api.wait(lambda: len(node.api.devices()) == 14, 60, "14 devices")
    devices = node.api.devices()
    assert {gpu(inv, i) for i in range(8)} <= set(devices)
    assert {group(inv, 0, 1, 2, 3), group(inv, 4, 5, 6, 7), group(inv, 0, 1),
            group(inv, 6, 7)} <= set(devices)
    names = sorted(s["metadata"]["name"] for s in node.api.slices.values())
    assert names == [f"{NODE}-gpu-metax-tech-com-counters", f"{NODE}-gpu-metax-tech-com-devices-0"]


def test_unhealthy_gpu_is_tainted_within_the_interval_and_back_on_heal(
    tmp_path: Path, dirs: dict[str, str], nodes: list[Node]
) -> None:
    root = str(tmp_path / "sim")
    sim.create(root, "c500-8")
    inv = discover(root)
    three = gpu(inv, 3)
    node = start(nodes, root, inv, dirs, healthy_interval=1.0)
    node.kubelet.wait_registrations(1)
    node.api.wait(lambda: three in node.api.devices(), 5, "slices")
    watch = node.kubelet.watch_health()
    node.kubelet.wait_for(lambda: bool(watch.updates), 5, "first health update")
    assert set(watch.updates[0].values()) == {HEALTHY}
    assert watch.timeouts[0] >= 60
    sim.fail(root, 3, "fault", "ECC errors")

    def tainted(name: str) -> bool:
        return bool(node.api.devices().get(name, {}).get("taints"))

    # within a few health intervals (1 s), far inside the 60 s a lost stream would take;
    # the bound leaves room for a loaded machine
    node.api.wait(lambda: tainted(three), 15.0, "GPU 3 tainted")
    taint = node.api.devices()[three]["taints"][0]
    assert taint["key"] == f"{DRIVER}/unhealthy" and taint["effect"] == "NoSchedule"
    assert tainted(group(inv, 2, 3)) and tainted(group(inv, 0, 1, 2, 3))
    assert not tainted(gpu(inv, 2))
    node.kubelet.wait_for(lambda: watch.updates[-1].get(three) == UNHEALTHY, 3, "stream")
    node.api.add_claim("ns", "c", "uid-c", [result(three)])
    refused = node.kubelet.prepare([("ns", "uid-c", "c")])
    assert f"{three} is unhealthy" in refused.claims["uid-c"].error
    sim.heal(root, 3)
    node.api.wait(lambda: not tainted(three), 4.0, "GPU 3 healed")
    node.kubelet.wait_for(lambda: watch.updates[-1].get(three) == HEALTHY, 3, "stream heal")


def test_gated_fields_dropped_by_the_api_server_fall_back(
    tmp_path: Path, dirs: dict[str, str], nodes: list[Node]
) -> None:
    root = str(tmp_path / "sim")
    sim.create(root, "c500-8")
    sim.fail(root, 1, "fault", "broken")
    inv = discover(root)
    api = FakeResourceApi(disabled_gates=("DRAPartitionableDevices", "DRADeviceTaints"))
    node = start(nodes, root, inv, dirs, api=api, healthy_interval=1.0)
    api.wait(lambda: set(api.devices()) == {gpu(inv, i) for i in range(8) if i != 1}, 5,
             "group devices and the unhealthy GPU gone")
    problems = " ".join(node.app.publisher.problems)
    assert "DRAPartitionableDevices" in problems and "DRADeviceTaints" in problems


def test_republishing_orders_devices_for_first_fit(
    c500: tuple[str, NodeInventory], dirs: dict[str, str], nodes: list[Node]
) -> None:
    root, inv = c500
    node = start(nodes, root, inv, dirs)
    node.kubelet.wait_registrations(1)
    node.api.wait(lambda: len(node.api.devices()) == 14, 5, "slices")
    generation = node.app.publisher.generation
    node.api.add_claim("ns", "c", "uid-c", [result(gpu(inv, 5))])
    node.kubelet.prepare([("ns", "uid-c", "c")])

    def order() -> list[str]:
        return [d["name"] for s in node.api.slices.values() for d in s["spec"].get("devices", [])]

    node.api.wait(lambda: order()[:4] == [gpu(inv, i) for i in (4, 5, 6, 7)], 5, "reorder")
    assert node.app.publisher.generation == generation, "a reorder keeps the generation"


def test_sgpu_pool_publishes_consumable_capacity(
    c500: tuple[str, NodeInventory], dirs: dict[str, str], nodes: list[Node]
) -> None:
    root, inv = c500
    node = start(nodes, root, inv, dirs, pool=PoolOptions(sharing="sgpu"),
                 allocate=AllocateOptions())
    node.api.wait(lambda: len(node.api.devices()) == 8, 5, "8 shared GPUs")
    first = node.api.devices()[gpu(inv, 0)]
    assert first["allowMultipleAllocations"] is True
    assert first["capacity"]["vcore"]["requestPolicy"]["validRange"] == {
        "min": "1", "max": "100", "step": "1"}
    assert first["capacity"]["vmemory"]["value"] == "64Gi"
    assert "consumesCounters" not in first
