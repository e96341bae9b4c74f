"""The device plugin against a kubelet-side harness (real gRPC on unix sockets).

The plugin runs in-process (``DevicePluginApp``) on simulator roots; the harness is
the kubelet: it records registrations, keeps ListAndWatch open, calls
GetPreferredAllocation/Allocate, serves PodResources, and restarts.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from gpuk8s import sim
from gpuk8s.core.allocator import allocate
from gpuk8s.core.devicelist import DEVICES_ANNOTATION, parse_device_list
from gpuk8s.core.model import NodeInventory
from gpuk8s.core.scoring import (
    LOSS_LIMIT,
    LOSSES_ANNOTATION,
    SCORES_ANNOTATION,
    parse_table,
    topology_tables,
)
from gpuk8s.discovery import discover
from gpuk8s.services.deviceplugin.main import DevicePluginApp, PluginConfig
from gpuk8s.services.deviceplugin.server import wait_until
from gpuk8s.services.node.devices import AllocateOptions

from .kubelet_harness import FakeKubelet, RecordingNodePatcher

RESOURCE = "metax-tech.com/gpu"
ENDPOINT = "metax-tech.com-gpu.sock"


# the simulator's fake vendor tools run with this interpreter (tests/unit/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_python3")


@pytest.fixture(scope="module")
def c500(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, NodeInventory]:
    root = str(tmp_path_factory.mktemp("sim") / "c500")
    sim.create(root, "c500-8")
    return root, discover(root)


@pytest.fixture(scope="module")
def c500_vf4(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, NodeInventory]:
    root = str(tmp_path_factory.mktemp("sim") / "vf4")
    sim.create(root, "c500-8-vf4")
    return root, discover(root)


@pytest.fixture
def plugin_dir() -> Iterator[str]:
    # unix socket paths are limited to 107 bytes: keep them short
    import tempfile

    with tempfile.TemporaryDirectory(prefix="dp-") as path:
        yield path


def config(root: str, plugin_dir: str, **kw: object) -> PluginConfig:
    base: dict[str, object] = {
        "host_root": root,
        "plugin_dir": plugin_dir,
        "healthy_interval": 0.0,
        "removal_poll": 0.1,
        "watch_interval": 0.05,
        "retry_initial": 0.05,
        "retry_max": 0.5,
        "node_state_interval": 0.5,
    }
    base.update(kw)
    return PluginConfig(**base)  # type: ignore[arg-type]


class Running:
    def __init__(self, app: DevicePluginApp, kubelet: FakeKubelet) -> None:
        self.app = app
        self.kubelet = kubelet


@pytest.fixture
def running(plugin_dir: str) -> Iterator[list[Running]]:
    started: list[Running] = []
    yield started
    for item in started:
        item.app.stop()
        item.kubelet.stop()


def start(
    started: list[Running],
    root: str,
    inventory: NodeInventory,
    plugin_dir: str,
    patcher: RecordingNodePatcher | None = None,
    **kw: object,
) -> Running:
    pr_socket = os.path.join(plugin_dir, "podres", "kubelet.sock")
    os.makedirs(os.path.dirname(pr_socket), exist_ok=True)
    kubelet = FakeKubelet(plugin_dir, pod_resources_socket=pr_socket).start()
    cfg = config(root, plugin_dir, pod_resources_socket=pr_socket, **kw)
    app = DevicePluginApp(cfg, inventory, patcher=patcher)
    app.start()
    item = Running(app, kubelet)
    started.append(item)
    return item


# -- registration and capacity ---------------------------------------------------------


def test_registers_after_serving_and_lists_8_gpus(
    c500: tuple[str, NodeInventory], plugin_dir: str, running: list[Running]
) -> None:
    root, inv = c500
    run = start(running, root, inv, plugin_dir)
    [reg] = run.kubelet.wait_registrations(1)
    assert reg.version == "v1beta1"
    assert reg.resource_name == RESOURCE
    assert reg.endpoint == ENDPOINT
    assert reg.preferred_allocation is True and reg.pre_start_required is False
    assert reg.endpoint_answered, "the plugin must serve before it registers"
    watch = run.kubelet.latest_watch()
    devices = watch.updates[0]
    assert len(devices) == 8
    assert [d[0] for d in devices] == [g.pci_address for g in inv.gpus]
    assert all(d[1] == "Healthy" for d in devices)
    # NUMA topology: the c500-8 preset has two NUMA nodes, four GPUs each
    assert [d[2] for d in devices] == [(g.numa_node,) for g in inv.gpus]
    assert {d[2] for d in devices} == {(0,), (1,)}
    options = run.kubelet.options(ENDPOINT)
    assert options.get_preferred_allocation_available is True


def test_vf4_lists_32_devices_with_vf_ids(
    c500_vf4: tuple[str, NodeInventory], plugin_dir: str, running: list[Running]
) -> None:
    root, inv = c500_vf4
    run = start(running, root, inv, plugin_dir)
    run.kubelet.wait_registrations(1)
    devices = run.kubelet.latest_watch().updates[0]
    assert len(devices) == 32
    vf_ids = [a for g in inv.gpus for a in g.sriov.vf_addresses]
    assert [d[0] for d in devices] == vf_ids
    assert all(len(d[0]) <= 63 for d in devices)
    assert len({d[0] for d in devices}) == 32


def test_device_ids_stable_across_restarts(
    c500: tuple[str, NodeInventory], plugin_dir: str, running: list[Running]
) -> None:
    root, inv = c500
    first = start(running, root, inv, plugin_dir)
    first.kubelet.wait_registrations(1)
    ids_before = [d[0] for d in first.kubelet.latest_watch().updates[0]]
    first.app.stop()
    first.kubelet.stop()
    running.clear()
    again = start(running, root, discover(root), plugin_dir)
    again.kubelet.wait_registrations(1)
    assert [d[0] for d in again.kubelet.latest_watch().updates[0]] == ids_before


# -- health ------------------------------------------------------------------------------


def test_fault_goes_unhealthy_within_interval_and_heals(
    c500: tuple[str, NodeInventory], plugin_dir: str, running: list[Running]
) -> None:
    root, inv = c500
    interval = 2.0
    run = start(running, root, inv, plugin_dir, healthy_interval=interval, removal_poll=5.0)
    run.kubelet.wait_registrations(1)
    watch = run.kubelet.latest_watch()
    victim = inv.gpus[3].pci_address
    try:
        time.sleep(0.3)  # let the first check pass
        baseline = len(watch.updates)
        failed_at = time.monotonic()
        sim.fail(root, 3, "fault")
        idx, seen = run.kubelet.wait_update(
            watch,
            lambda devs: dict((d[0], d[1]) for d in devs)[victim] == "Unhealthy",
            timeout=interval + 30,
            after=baseline,
        )
        latency = seen - failed_at
        # the first check that starts after the failure reports it: at most one
        # interval plus that check's own run time (≈0.5 s; more on a loaded machine)
        check_s = run.app.health.last_check_seconds
        assert latency <= interval + max(1.0, check_s + 0.5), (latency, check_s)
        update = dict((d[0], d[1]) for d in watch.updates[idx])
        assert [k for k, v in update.items() if v == "Unhealthy"] == [victim]
        assert run.app.devices.reason(victim) is not None
        sim.heal(root, 3)
        idx2, _ = run.kubelet.wait_update(
            watch,
            lambda devs: all(d[1] == "Healthy" for d in devs),
            timeout=interval + 30,
            after=idx + 1,
        )
        # exactly one update per change: nothing pushed while nothing changed
        time.sleep(interval * 1.5)
        assert len(watch.updates) == idx2 + 1
    finally:
        sim.heal(root)


def test_gpu_failed_before_start_is_unhealthy_in_the_first_list(
    c500: tuple[str, NodeInventory], plugin_dir: str, running: list[Running]
) -> None:
    root, inv = c500
    sim.fail(root, 6, "unbind")
    try:
        run = start(running, root, inv, plugin_dir, healthy_interval=60.0)
        run.kubelet.wait_registrations(1)
        first = run.kubelet.latest_watch().updates[0]
        assert [d[0] for d in first if d[1] == "Unhealthy"] == [inv.gpus[6].pci_address]
    finally:
        sim.heal(root)


def test_removal_is_seen_before_the_interval(
    c500: tuple[str, NodeInventory], plugin_dir: str, running: list[Running]
) -> None:
    root, inv = c500
    run = start(running, root, inv, plugin_dir, healthy_interval=60.0, removal_poll=0.1)
    run.kubelet.wait_registrations(1)
    watch = run.kubelet.latest_watch()
    victim = inv.gpus[5].pci_address
    try:
        assert wait_until(lambda: run.app.health.checks_done >= 1, 30)
        baseline = len(watch.updates)
        sim.fail(root, 5, "remove")
        # the full check runs only every 60 s: the presence poll must trigger it
        run.kubelet.wait_update(
            watch,
            lambda devs: dict((d[0], d[1]) for d in devs)[victim] == "Unhealthy",
            timeout=30,
            after=baseline,
        )
        # the initial check, then one (or two, if the removal was seen half-done) early ones
        assert run.app.health.checks_done >= 2
    finally:
        sim.heal(root)


def test_interval_zero_sends_no_health_updates(
    c500: tuple[str, NodeInventory], plugin_dir: str, running: list[Running]
) -> None:
    root, inv = c500
    run = start(running, root, inv, plugin_dir, healthy_interval=0.0)
    run.kubelet.wait_registrations(1)
    watch = run.kubelet.latest_watch()
    try:
        sim.fail(root, 0, "fault")
        sim.fail(root, 1, "remove")
        time.sleep(1.5)
        assert len(watch.updates) == 1
        assert all(d[1] == "Healthy" for d in watch.updates[0])
        assert run.app.health.checks_done == 0
    finally:
        sim.heal(root)


# -- kubelet restarts ----------------------------------------------------------------------


def test_fifty_kubelet_restarts_reregister_every_time(
    c500: tuple[str, NodeInventory], plugin_dir: str, running: list[Running]
) -> None:
    root, inv = c500
    run = start(running, root, inv, plugin_dir)
    run.kubelet.wait_registrations(1)
    server = run.app.server
    assert wait_until(lambda: server.registrations == 1, 5)
    for n in range(2, 52):
        run.kubelet.restart()
        regs = run.kubelet.wait_registrations(n, timeout=30)
        assert regs[-1].endpoint_answered
        assert regs[-1].resource_name == RESOURCE
        assert regs[-1].generation == n - 1
        # the plugin saw its Register call succeed before the next restart
        assert wait_until(lambda n=n: server.registrations == n, 5)  # type: ignore[misc]
    # one registration per kubelet instance, no duplicates
    assert [r.generation for r in run.kubelet.registrations] == list(range(51))
    assert server.registrations == 51
    # the last registration is live: the kubelet can allocate
    response = run.kubelet.allocate(ENDPOINT, [inv.gpus[0].pci_address])
    assert len(response.container_responses) == 1


def test_registration_retried_until_kubelet_accepts(
    c500: tuple[str, NodeInventory], plugin_dir: str, running: list[Running]
) -> None:
    root, inv = c500
    pr_socket = os.path.join(plugin_dir, "pr.sock")
    kubelet = FakeKubelet(plugin_dir, pr_socket)
    kubelet.reject_registrations = True
    kubelet.start()
    app = DevicePluginApp(config(root, plugin_dir), inv)
    app.start()
    running.append(Running(app, kubelet))
    assert wait_until(lambda: app.metrics.registration_failures._value.get() >= 2, 30)
    assert kubelet.registrations == [] and not app.server.registered.is_set()
    kubelet.reject_registrations = False
    kubelet.wait_registrations(1)
    assert app.server.registered.wait(5)


# -- allocation -----------------------------------------------------------------------------


def test_preferred_allocation_equals_the_allocator(
    c500: tuple[str, NodeInventory], plugin_dir: str, running: list[Running]
) -> None:
    root, inv = c500
    run = start(running, root, inv, plugin_dir)
    run.kubelet.wait_registrations(1)
    topo = run.app.devices.topology
    ids = [g.pci_address for g in inv.gpus]
    cases = [
        (ids, [], 1),
        (ids, [], 2),
        (ids, [], 4),
        (ids, [], 8),
        (ids[2:], [], 2),  # SPEC §3 example: 1,2 taken -> {3,4}
        (ids[2:], [], 4),  # -> {5,6,7,8}
        (ids, [ids[6]], 3),
        (ids[1:7], [ids[1], ids[6]], 4),
    ]
    for available, must, size in cases:
        got = run.kubelet.preferred(ENDPOINT, available, must, size)
        want = list(allocate(topo, available, size, must).devices)
        assert got == want, (available, must, size)
    assert run.kubelet.preferred(ENDPOINT, ids[2:], [], 2) == ids[2:4]
    assert run.kubelet.preferred(ENDPOINT, ids[2:], [], 4) == ids[4:8]


def test_allocate_returns_device_nodes_and_env(
    c500: tuple[str, NodeInventory], plugin_dir: str, running: list[Running]
) -> None:
    root, inv = c500
    run = start(running, root, inv, plugin_dir)
    run.kubelet.wait_registrations(1)
    g5, g2 = inv.gpus[5], inv.gpus[2]
    response = run.kubelet.allocate(ENDPOINT, [g5.pci_address, g2.pci_address], [g5.pci_address])
    first, second = response.container_responses
    specs = [(d.container_path, d.host_path, d.permissions) for d in first.devices]
    want_paths = ["/dev/mxcd", *g2.device_nodes, *g5.device_nodes]
    assert [s[0] for s in specs] == want_paths
    assert all(s[1] == s[0] and s[2] == "rw" for s in specs)
    assert any(p.startswith("/dev/dri/card") for p in g2.device_nodes)
    assert any(p.startswith("/dev/dri/renderD") for p in g2.device_nodes)
    assert first.envs["MACA_VISIBLE_DEVICES"] == "0,1"
    assert first.envs["GPUK8S_DEVICE_IDS"] == f"{g2.pci_address},{g5.pci_address}"
    assert list(first.mounts) == [] and list(first.cdi_devices) == []
    assert [d.container_path for d in second.devices] == ["/dev/mxcd", *g5.device_nodes]
    assert second.envs["MACA_VISIBLE_DEVICES"] == "0"


def test_allocate_vf_gets_its_own_nodes(
    c500_vf4: tuple[str, NodeInventory], plugin_dir: str, running: list[Running]
) -> None:
    root, inv = c500_vf4
    run = start(running, root, inv, plugin_dir)
    run.kubelet.wait_registrations(1)
    gpu = inv.gpus[1]
    vf_id = gpu.sriov.vf_addresses[2]
    response = run.kubelet.allocate(ENDPOINT, [vf_id])
    paths = [d.container_path for d in response.container_responses[0].devices]
    assert paths == ["/dev/mxcd", *gpu.sriov.vf_device_nodes[2]]
    assert not set(paths) & set(gpu.device_nodes)


def test_allocate_with_prefix_sdk_mounts_and_cdi(
    c500: tuple[str, NodeInventory], plugin_dir: str, running: list[Running]
) -> None:
    root, inv = c500
    opts = AllocateOptions(device_path_prefix=root, mount_sdk=True)
    run = start(running, root, inv, plugin_dir, allocate=opts)
    run.kubelet.wait_registrations(1)
    g0 = inv.gpus[0]
    car = run.kubelet.allocate(ENDPOINT, [g0.pci_address]).container_responses[0]
    for spec in car.devices:
        assert spec.host_path == root + spec.container_path
        assert os.path.lexists(spec.host_path), spec.host_path
    mounts = [(m.container_path, m.host_path, m.read_only) for m in car.mounts]
    assert mounts == [
        ("/opt/maca", root + "/opt/maca", True),
        ("/opt/mxdriver", root + "/opt/mxdriver", True),
    ]
    assert car.envs["MACA_PATH"] == "/opt/maca"
    run.app.stop()
    run.kubelet.stop()
    running.clear()

    cdi = start(running, root, inv, plugin_dir, allocate=AllocateOptions(cdi=True))
    cdi.kubelet.wait_registrations(1)
    car = cdi.kubelet.allocate(ENDPOINT, [g0.pci_address]).container_responses[0]
    assert [c.name for c in car.cdi_devices] == [f"metax-tech.com/gpu={g0.pci_address}"]
    assert list(car.devices) == []


def test_unknown_and_unhealthy_ids_are_rejected(
    c500: tuple[str, NodeInventory], plugin_dir: str, running: list[Running]
) -> None:
    root, inv = c500
    run = start(running, root, inv, plugin_dir)
    run.kubelet.wait_registrations(1)
    with pytest.raises(grpc.RpcError) as err:
        run.kubelet.allocate(ENDPOINT, ["0000:ff:00.0"])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "0000:ff:00.0" in err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        run.kubelet.preferred(ENDPOINT, ["bogus", inv.gpus[0].pci_address], [], 1)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as err:
        run.kubelet.allocate(ENDPOINT, [])
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    # unhealthy: flip GPU 4 through the device set as the health loop would
    run.app.devices.update_health({4: "simulated fault"})
    with pytest.raises(grpc.RpcError) as err:
        run.kubelet.allocate(ENDPOINT, [inv.gpus[4].pci_address])
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "simulated fault" in err.value.details()
    assert run.app.metrics.allocate_errors._value.get() == 3


# -- node state -------------------------------------------------------------------------------


def test_node_annotations_follow_allocations_and_health(
    c500: tuple[str, NodeInventory], plugin_dir: str, running: list[Running]
) -> None:
    root, inv = c500
    patcher = RecordingNodePatcher()
    run = start(running, root, inv, plugin_dir, patcher=patcher, node_name="gpu-node-1")
    run.kubelet.wait_registrations(1)
    assert patcher.wait(lambda: len(patcher.patches) >= 1, 30)
    node, first = patcher.patches[0]
    assert node == "gpu-node-1"
    entries = parse_device_list(first[DEVICES_ANNOTATION])
    assert [e.id for e in entries] == [g.pci_address for g in inv.gpus]
    assert all(e.healthy and not e.allocated for e in entries)
    topo = run.app.devices.topology
    scores, losses = topology_tables(topo, range(8))
    assert parse_table(first[SCORES_ANNOTATION]) == scores
    assert parse_table(first[LOSSES_ANNOTATION], *LOSS_LIMIT) == losses
    # c500-8: MetaXLink groups of four, so 4 GPUs still score as MetaXLink
    assert scores[4] == 100 and scores[8] < 100

    # nothing changed: no further patches across several sync periods
    time.sleep(1.5)
    assert len(patcher.patches) == 1

    ids = [g.pci_address for g in inv.gpus]
    run.kubelet.set_pod("default", "trainer", {RESOURCE: ids[:2], "other.com/x": ["a"]})
    assert patcher.wait(lambda: len(patcher.patches) >= 2, 30)
    entries = parse_device_list(patcher.patches[1][1][DEVICES_ANNOTATION])
    assert [e.id for e in entries if e.allocated] == ids[:2]
    scores, losses = topology_tables(topo, range(2, 8))
    assert parse_table(patcher.patches[1][1][SCORES_ANNOTATION]) == scores
    assert parse_table(patcher.patches[1][1][LOSSES_ANNOTATION], *LOSS_LIMIT) == losses
    assert set(scores) == set(range(1, 7))

    run.app.devices.update_health({7: "simulated fault"})
    run.app.publisher.nudge()  # type: ignore[union-attr]
    assert patcher.wait(lambda: len(patcher.patches) >= 3, 30)
    entries = parse_device_list(patcher.patches[2][1][DEVICES_ANNOTATION])
    assert [e.id for e in entries if not e.healthy] == [ids[7]]
    assert max(parse_table(patcher.patches[2][1][SCORES_ANNOTATION])) == 5

    run.kubelet.remove_pod("default", "trainer")
    assert patcher.wait(lambda: len(patcher.patches) >= 4, 30)
    assert not any(
        e.allocated
        for e in parse_device_list(patcher.annotations["gpu-node-1"][DEVICES_ANNOTATION])
    )


def test_node_annotations_not_patched_when_already_current(
    c500: tuple[str, NodeInventory], plugin_dir: str, running: list[Running]
) -> None:
    root, inv = c500
    patcher = RecordingNodePatcher()
    first = start(running, root, inv, plugin_dir, patcher=patcher, node_name="n1")
    assert patcher.wait(lambda: len(patcher.patches) == 1, 30)
    first.app.stop()
    first.kubelet.stop()
    running.clear()
    # a restarted plugin reads the node first and finds nothing to change
    again = start(running, root, inv, plugin_dir, patcher=patcher, node_name="n1")
    again.kubelet.wait_registrations(1)
    assert patcher.wait(lambda: patcher.gets >= 2, 30)
    time.sleep(1.0)
    assert len(patcher.patches) == 1


def test_failed_patch_is_retried(
    c500: tuple[str, NodeInventory], plugin_dir: str, running: list[Running]
) -> None:
    root, inv = c500
    patcher = RecordingNodePatcher()
    patcher.fail_patches = 2
    start(running, root, inv, plugin_dir, patcher=patcher, node_name="n1")
    assert patcher.wait(lambda: len(patcher.patches) == 1, 30)
    assert patcher.fail_patches == 0
    assert DEVICES_ANNOTATION in patcher.annotations["n1"]


def test_metrics_report_devices_registrations_and_health(
    c500: tuple[str, NodeInventory], plugin_dir: str, running: list[Running]
) -> None:
    root, inv = c500
    run = start(running, root, inv, plugin_dir, healthy_interval=0.5)
    run.kubelet.wait_registrations(1)
    res = 'resource="metax-tech.com/gpu"'
    registered = f"gpuk8s_deviceplugin_registrations_total{{{res}}} 1.0"
    # the kubelet records the request before Register returns to the plugin, which
    # counts it only then
    assert wait_until(lambda: registered in run.app.metrics.text(), 10)
    assert wait_until(lambda: run.app.health.checks_done >= 1, 30)
    run.kubelet.allocate(ENDPOINT, [inv.gpus[0].pci_address])
    text = run.app.metrics.text()
    assert f'gpuk8s_deviceplugin_devices{{health="Healthy",{res}}} 8.0' in text
    assert f'gpuk8s_deviceplugin_devices{{health="Unhealthy",{res}}} 0.0' in text
    assert registered in text
    assert f"gpuk8s_deviceplugin_allocations_total{{{res}}} 1.0" in text
    stamp = [
        line
        for line in text.splitlines()
        if line.startswith("gpuk8s_deviceplugin_last_health_check_timestamp_seconds{")
    ]
    assert stamp and float(stamp[0].split()[-1]) > time.time() - 60


def test_bad_config_is_refused_with_the_field_name(tmp_path: Path) -> None:
    from gpuk8s.core.errors import ConfigError

    with pytest.raises(ConfigError, match="healthy-interval"):
        PluginConfig(healthy_interval=-1)
    with pytest.raises(ConfigError, match="resource-name"):
        PluginConfig(resource_name="gpu")
    with pytest.raises(ConfigError, match="socket-name"):
        PluginConfig(socket_name="../x.sock")
    with pytest.raises(ConfigError, match="health-port"):
        PluginConfig(health_port=70000)
    with pytest.raises(ConfigError, match="visible-devices"):
        AllocateOptions(visible_devices="all")
    with pytest.raises(ConfigError, match="device-path-prefix"):
        AllocateOptions(device_path_prefix="relative/dir")


def test_kubelet_appearing_ends_a_long_back_off(
    c500: tuple[str, NodeInventory], plugin_dir: str, running: list[Running]
) -> None:
    root, inv = c500
    app = DevicePluginApp(config(root, plugin_dir, retry_initial=60.0, retry_max=60.0), inv)
    kubelet = FakeKubelet(plugin_dir)
    running.append(Running(app, kubelet))
    app.start()
    # no kubelet yet: the first attempt fails and a 60 s back-off starts
    assert wait_until(lambda: app.metrics.registration_failures._value.get() == 1, 30)
    kubelet.start()
    # registered long before the back-off would have ended
    kubelet.wait_registrations(1, timeout=20)
    assert app.metrics.registration_failures._value.get() == 1


def test_health_endpoints_follow_registration_and_the_health_loop(
    c500: tuple[str, NodeInventory], plugin_dir: str, running: list[Running]
) -> None:
    """--health-port: /readyz while registered with the kubelet, /healthz while the
    server loop and the health loop run (the chart's probes)."""
    import http.client
    import json
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root, inv = c500
    app = DevicePluginApp(config(root, plugin_dir, healthy_interval=0.5, health_port=port,
                                 retry_initial=0.2, retry_max=0.5), inv)
    kubelet = FakeKubelet(plugin_dir)
    running.append(Running(app, kubelet))

    def get(path: str) -> tuple[int, dict[str, object]]:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", path)
        resp = conn.getresponse()
        body = json.loads(resp.read())
        conn.close()
        return resp.status, body

    app.start()
    assert get("/healthz")[0] == 200
    code, body = get("/readyz")
    assert code == 503 and body["registered"] is False  # no kubelet yet
    kubelet.start()
    kubelet.wait_registrations(1, timeout=20)
    assert wait_until(lambda: get("/readyz")[0] == 200, 20)
    assert get("/nope")[0] == 404
    app.health.stop()  # a dead health loop is a dead plugin
    code, body = get("/healthz")
    assert code == 503 and "health loop not running" in str(body["problems"])
