"""The operator scheme's node agents and controller, on simulator roots and fakes:
container-runtime (CDI spec, containerd handler, the OCI wrapper really run on a bundle),
driver-manager (payload -> install -> ownership; bad payloads), operator-controller
(driver-config ownership and validation), and where CDI names may be used."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from gpuk8s import sim
from gpuk8s.core.cdi import cdi_names_accepted, parse_spec
from gpuk8s.discovery import discover
from gpuk8s.discovery.tools import default_runner
from gpuk8s.host import driver as drv
from gpuk8s.host.readiness import read_readiness
from gpuk8s.host.serving import peer_pid_or_zero
from gpuk8s.services.deviceplugin.main import PluginConfig, resolve_cdi
from gpuk8s.services.drivermanager.agent import DriverAgent, PayloadSource
from gpuk8s.services.drivermanager.main import main as driver_manager_main
from gpuk8s.services.node.devices import AllocateOptions
from gpuk8s.services.nodeagent import VFNUM_DESIRED, Reporter
from gpuk8s.services.operator.controller import CONFIG_NAME, STATUS_NAME, Controller
from gpuk8s.services.runtime import containerd
from gpuk8s.services.runtime.agent import WRAPPER_NAME, RuntimeAgent, RuntimeSettings

from .fake_cri import FakeCri, cri_config
from .simdriver import LOAD, UNLOAD

REPO = Path(__file__).resolve().parents[2]
NEW = "2.33.0.6"
LAB_CONFIG = """version = 2
# the admin's comment stays
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.10"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
"""


@pytest.fixture(autouse=True)
def fast_fake_tools(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}")


@pytest.mark.parametrize(
    ("kubelet", "runtime", "accepted"),
    [
        ("v1.35.4", "containerd://1.6.20~ds1", False),  # the lab: wrapper + annotation
        ("v1.35.4", "containerd://1.7.13", False),  # enable_cdi unknown from the Node
        ("v1.35.4", "containerd://2.0.2", True),
        ("v1.29.0", "cri-o://1.29.1", True),
        ("v1.28.3", "containerd://2.0.2", False),  # gate alpha, off by default
        ("v1.27.1", "cri-o://1.28.0", False),
        ("v1.23.17", "docker://20.10.7", False),
        ("", "", False),
    ],
)
def test_cdi_names_only_where_kubelet_and_runtime_accept_them(
    kubelet: str, runtime: str, accepted: bool
) -> None:
    ok, why = cdi_names_accepted(kubelet, runtime)
    assert ok is accepted and why
    node = {"status": {"nodeInfo": {"kubeletVersion": kubelet,
                                    "containerRuntimeVersion": runtime}}}
    config = PluginConfig(host_root="/", node_name="n",
                          allocate=AllocateOptions(cdi=not accepted))
    assert resolve_cdi(config, node).allocate.cdi is accepted


class FakeNode:
    """``NodeApi`` fake: one node's annotations, the Events recorded."""

    def __init__(self) -> None:
        self.annotations: dict[str, str] = {}
        self.labels: dict[str, str] = {}
        self.events: list[tuple[str, str]] = []

    def node(self) -> Mapping[str, Any]:
        return {"metadata": {"name": "gpu-1", "annotations": dict(self.annotations),
                             "labels": dict(self.labels)}}

    def annotate(self, changes: Mapping[str, str | None]) -> None:
        for key, value in changes.items():
            if value is None:
                self.annotations.pop(key, None)
            else:
                self.annotations[key] = value

    def event(self, reason: str, message: str, warning: bool) -> None:
        self.events.append((reason, message))


@pytest.fixture
def system_root() -> Iterator[Path]:
    """The node's / for container-runtime: short, for the unix socket paths under it."""
    path = Path(tempfile.mkdtemp(prefix="crt", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def cri(system_root: Path) -> Iterator[FakeCri]:
    """containerd's CRI on the node's socket, serving only runc until a test says more."""
    fake = FakeCri(str(system_root / "run/containerd/containerd.sock"))
    yield fake
    fake.stop()


def runtime_node(tmp_path: Path, system: Path, preset: str = "c500-8",
                 config: str = LAB_CONFIG) -> tuple[RuntimeAgent, Path, Path]:
    """A simulated GPU tree with real char devices (the wrapper stats them, as runc needs;
    mknod: the tests run as root, like scripts/test) and a system root with containerd."""
    gpu_root = tmp_path / "gpu"
    sim.create(str(gpu_root), preset, device_nodes="char")
    (system / "etc/containerd").mkdir(parents=True)
    (system / "etc/containerd/config.toml").write_text(config)
    (system / "usr/bin").mkdir(parents=True)
    (system / "usr/bin/python3").symlink_to(sys.executable)
    settings = RuntimeSettings(
        host_root=str(gpu_root), system_root=str(system), runtime="containerd",
        runtime_version="containerd://1.6.20", restart_mode="none",
        device_path_prefix=str(gpu_root),
    )  # host_python /usr/bin/python3: this machine's, which runs the wrapper below
    return RuntimeAgent(settings, Reporter(FakeNode(), "container-runtime", "Runtime")), \
        gpu_root, system


WRAPPER = f"/usr/local/gpuk8s/bin/{WRAPPER_NAME}"
SERVED = cri_config({"runc": "", "metax": WRAPPER}, default="metax")  # after the restart


def test_container_runtime_installs_spec_handler_wrapper_and_undoes_them(
    tmp_path: Path, system_root: Path, cri: FakeCri
) -> None:
    agent, gpu_root, system = runtime_node(tmp_path, system_root)
    assert agent.mode() == "wrapper"
    report = agent.one_pass()
    # restart mode none: edited, but containerd does not serve it yet -> not ready
    assert report.state == "pending", report.message
    assert "restart it to apply" in report.message and "does not serve" in report.message
    assert read_readiness(str(gpu_root)) == {"runtime.ready": False}
    spec = json.loads((system / "etc/cdi/metax-tech.com-gpu.json").read_text())
    parsed = parse_spec(spec)
    assert len(parsed.devices) == 9  # 8 GPUs + all
    assert any(m.container_path == "/opt/maca" for m in parsed.edits.mounts)
    config = (system / "etc/containerd/config.toml").read_text()
    assert "# the admin's comment stays" in config
    runtimes = containerd.tomlkit.parse(config)["plugins"]["io.containerd.grpc.v1.cri"][
        "containerd"]
    assert runtimes["default_runtime_name"] == "metax"
    handler = runtimes["runtimes"]["metax"]
    assert handler["options"]["BinaryName"] == WRAPPER
    assert handler["options"]["SystemdCgroup"] is False  # copied from the default runtime
    assert "cdi.k8s.io/*" in handler["container_annotations"]
    cri.config = SERVED  # someone restarted containerd: now its CRI serves the handler
    report = agent.one_pass()
    assert report.state == "ready", report.message
    assert read_readiness(str(gpu_root)) == {"runtime.ready": True}
    assert agent.one_pass().state == "ready"  # idempotent
    assert (system / "etc/containerd/config.toml").read_text() == config
    cri.config = cri_config({"runc": ""})  # containerd restarted onto another config
    assert agent.one_pass().state == "pending"  # seen at once, never ready on a memory
    done = agent.uninstall()
    assert (system / "etc/containerd/config.toml").read_text() == LAB_CONFIG
    assert not (system / "etc/cdi/metax-tech.com-gpu.json").exists()
    assert not (system / "usr/local/gpuk8s").exists()
    assert read_readiness(str(gpu_root)) == {}
    assert any("removed" in line for line in done)


def test_wrapper_applies_the_spec_to_a_bundle_and_respects_an_image_sdk(
    tmp_path: Path, system_root: Path, cri: FakeCri
) -> None:
    agent, gpu_root, system = runtime_node(tmp_path, system_root)
    agent.one_pass()
    wrapper = system / "usr/local/gpuk8s/bin" / WRAPPER_NAME
    config = json.loads((wrapper.parent / "oci-runtime.json").read_text())
    fake_runc = tmp_path / "runc"
    fake_runc.write_text("#!/bin/sh\necho runc \"$@\"\n")
    fake_runc.chmod(0o755)
    config.update(runtime=str(fake_runc), specDirs=[str(system / "etc/cdi")])
    (wrapper.parent / "oci-runtime.json").write_text(json.dumps(config))
    gpu = discover(str(gpu_root)).gpus[0]

    def bundle(name: str, image_sdk: bool, env: list[str]) -> Path:
        path = tmp_path / name
        (path / "rootfs/bin").mkdir(parents=True)
        if image_sdk:
            (path / "rootfs/opt/maca").mkdir(parents=True)
            (path / "rootfs/opt/maca/Version.txt").write_text("Version:1.0\n")
        (path / "config.json").write_text(json.dumps({
            "root": {"path": "rootfs"}, "process": {"env": ["PATH=/bin", *env]},
            "annotations": {"cdi.k8s.io/gpuk8s": f"metax-tech.com/gpu={gpu.pci_address}"},
            "mounts": [], "linux": {}}))
        return path

    def create(path: Path) -> dict[str, Any]:
        out = subprocess.run([str(wrapper), "--root", "/run/runc", "create", "--bundle",
                              str(path), "cid"], capture_output=True, text=True, check=False)
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith("runc --root /run/runc create"), out
        result: dict[str, Any] = json.loads((path / "config.json").read_text())
        return result

    plain = create(bundle("plain", False, []))
    mounted = {m["destination"]: m["source"] for m in plain["mounts"]}
    assert mounted["/opt/maca"] == f"{gpu_root}/opt/maca"
    paths = [d["path"] for d in plain["linux"]["devices"]]
    assert "/dev/mxcd" in paths and gpu.device_nodes[0] in paths
    assert "MACA_PATH=/opt/maca" in plain["process"]["env"]
    own = create(bundle("own", True, []))
    assert "/opt/maca" not in {m["destination"] for m in own["mounts"]}
    assert not any(e.startswith("MACA_PATH=") for e in own["process"]["env"])
    forced = create(bundle("forced", True, ["MACA_FORCE=1"]))
    assert "/opt/maca" in {m["destination"] for m in forced["mounts"]}
    # a device no spec defines: the create fails with a message, runc never runs
    bad = bundle("bad", False, [])
    data = json.loads((bad / "config.json").read_text())
    data["annotations"]["cdi.k8s.io/gpuk8s"] = "metax-tech.com/gpu=0000:ff:00.0"
    (bad / "config.json").write_text(json.dumps(data))
    out = subprocess.run([str(wrapper), "create", "--bundle", str(bad), "cid"],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 1 and "unresolvable CDI device" in out.stderr
    assert "runc" not in out.stdout


def driver_payload(directory: Path, version: str = NEW, image: str = "reg/driver-image:x"
                   ) -> None:
    sim.write_payload("driver", version, str(directory / "driver"))
    (directory / "driver.complete").write_text(image + "\n")


def driver_agent(tmp_path: Path, preset: str, policy: str = "IfNotPresent",
                 pod_status: Any = None) -> tuple[DriverAgent, Path, Path, FakeNode]:
    root, payload = tmp_path / "host", tmp_path / "payload"
    sim.create(str(root), preset)
    payload.mkdir()
    api = FakeNode()
    request = drv.InstallRequest(
        policy=policy, version=NEW, owner="driver-manager",
        load_command=LOAD, unload_command=UNLOAD,
    )
    agent = DriverAgent(str(root), request, Reporter(api, "driver-manager.driver", "Driver"),
                        default_runner, PayloadSource(str(payload), "reg/driver-image:x",
                                                      "driver-payload", pod_status),
                        node=api.node, payload_grace=0.0)
    return agent, root, payload, api


def test_driver_manager_installs_on_a_bare_node_and_labels_say_cloud(tmp_path: Path) -> None:
    agent, root, payload, api = driver_agent(tmp_path, "nodriver-8")
    driver_payload(payload)
    report = agent.one_pass()
    assert report.state == "ready", report.message
    inventory = discover(str(root))
    assert inventory.driver.version == NEW and str(inventory.driver.mode) == "cloud"
    assert json.loads(api.annotations["metax-tech.com/driver-manager.driver.state"])["state"] \
        == "ready"
    assert api.events and api.events[-1][0] == "DriverReady"
    assert agent.one_pass().message.endswith("IfNotPresent leaves it alone")


def test_driver_manager_leaves_an_existing_driver_alone(tmp_path: Path) -> None:
    agent, root, _, _ = driver_agent(tmp_path, "c500-8")  # 2.32 loaded, no payload
    report = agent.one_pass()
    assert report.state == "ready" and "leaves it alone" in report.message
    assert str(discover(str(root)).driver.mode) == "native"


@pytest.mark.parametrize("problem", ["wrong-version", "pull-error"])
def test_bad_payload_is_reported_and_nothing_is_installed(tmp_path: Path, problem: str) -> None:
    def pod_status() -> Mapping[str, Any]:
        return {"containerStatuses": [{"name": "driver-payload", "state": {"waiting": {
            "reason": "ErrImagePull", "message": "reg/driver-image:x: not found"}}}]}

    agent, root, payload, api = driver_agent(
        tmp_path, "nodriver-8", pod_status=pod_status if problem == "pull-error" else None)
    if problem == "wrong-version":
        driver_payload(payload, version="2.34.0.1")
    report = agent.one_pass()
    assert report.state == "failed"
    assert ("holds driver 2.34.0.1" if problem == "wrong-version" else "ErrImagePull") \
        in report.message
    assert api.events[-1][0] == "DriverFailed"
    assert not discover(str(root)).driver.loaded
    assert not (root / "opt/mxdriver").exists() and not list(root.glob("lib/modules/*/*/*.ko"))


def test_driver_manager_applies_the_desired_vfnum(tmp_path: Path) -> None:
    agent, root, _, api = driver_agent(tmp_path, "c500-8")
    mxsmi = str(root / "opt/mxdriver/bin/mx-smi")
    agent.vf_command = (mxsmi, "vm", "--enable-vf", "{vfnum}", "-i", "{index}")
    api.annotations[VFNUM_DESIRED] = "4"
    report = agent.one_pass()
    assert report.state == "ready" and report.details["vfnum"] == 4, report.message
    assert "vfnumApplied" in report.details
    assert all(g.sriov.num_vfs == 4 for g in discover(str(root)).gpus)
    api.annotations[VFNUM_DESIRED] = "3"
    assert agent.one_pass().state == "failed"  # refused, nothing written
    assert all(g.sriov.num_vfs == 4 for g in discover(str(root)).gpus)


def test_driver_manager_upgrades_a_loaded_driver_only_when_the_controller_says_upgrading(
        tmp_path: Path) -> None:
    agent, root, payload, api = driver_agent(tmp_path, "c500-8", policy="Always")
    agent.gate = api.node
    driver_payload(payload)
    report = agent.one_pass()  # 2.32 loaded, 2.33 wanted, node not drained
    assert report.state == "pending" and "driver.upgrade-state=none" in report.message
    assert report.details["version"] == "2.32.0.6" and report.details["wanted"] == NEW
    assert discover(str(root)).driver.version == "2.32.0.6"
    api.labels["metax-tech.com/driver.upgrade-state"] = "cordoned"
    assert agent.one_pass().state == "pending"
    api.labels["metax-tech.com/driver.upgrade-state"] = "upgrading"
    report = agent.one_pass()
    assert report.state == "ready" and report.details["version"] == NEW, report.message
    assert discover(str(root)).driver.version == NEW


def test_driver_manager_vf_change_waits_for_upgrading(tmp_path: Path) -> None:
    agent, root, _, api = driver_agent(tmp_path, "c500-8")
    agent.gate = api.node
    agent.vf_command = (str(root / "opt/mxdriver/bin/mx-smi"), "vm", "--enable-vf", "{vfnum}",
                        "-i", "{index}")
    api.annotations[VFNUM_DESIRED] = "2"
    report = agent.one_pass()
    assert report.state == "pending" and "waits for operator-controller" in report.message
    assert all(g.sriov.num_vfs == 0 for g in discover(str(root)).gpus)
    api.labels["metax-tech.com/driver.upgrade-state"] = "upgrading"
    assert agent.one_pass().details["vfnum"] == 2
    assert all(g.sriov.num_vfs == 2 for g in discover(str(root)).gpus)


def test_driver_manager_once_without_api(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                         ) -> None:
    root = tmp_path / "host"
    sim.create(str(root), "c500-8")
    code = driver_manager_main(["--payload", "driver", "--deploy-policy", "Never", "--no-api",
                                "--host-root", str(root), "--once", "--log-dir", ""])
    assert code == 0
    assert json.loads(capsys.readouterr().out)["state"] == "ready"
    assert driver_manager_main(["--payload", "driver", "--no-api", "--host-root", str(root),
                                "--once"]) == 2  # IfNotPresent without --driver-version


class FakeCluster:
    def __init__(self, nodes: list[dict[str, Any]]) -> None:
        self.configmaps: dict[str, dict[str, Any]] = {}
        self.nodes = {n["metadata"]["name"]: n for n in nodes}
        self.events: list[tuple[str, str, str]] = []
        self.deleted: list[str] = []
        self.pod_list: list[dict[str, Any]] = []

    def get_configmap(self, name: str) -> Mapping[str, Any] | None:
        return self.configmaps.get(name)

    def create_configmap(self, name: str, data: Mapping[str, str],
                         labels: Mapping[str, str]) -> None:
        self.configmaps[name] = {"metadata": {"name": name, "labels": dict(labels)},
                                 "data": dict(data)}

    def put_status(self, name: str, data: Mapping[str, str]) -> None:
        self.configmaps[name] = {"data": dict(data)}

    def gpu_nodes(self) -> list[Mapping[str, Any]]:
        return list(self.nodes.values())

    def annotate_node(self, node: str, changes: Mapping[str, str | None]) -> None:
        notes = self.nodes[node]["metadata"].setdefault("annotations", {})
        for key, value in changes.items():
            if value is None:
                notes.pop(key, None)
            else:
                notes[key] = value

    def pods(self, selector: str) -> list[Mapping[str, Any]]:
        return [p for p in self.pod_list if selector.endswith(p["metadata"]["labels"]["app"])]

    def delete_pod(self, name: str) -> None:
        self.deleted.append(name)

    def daemonset(self, name: str) -> Mapping[str, Any] | None:
        return None  # a template without a hash: driver-manager pods are not rolled

    def event(self, kind: str, name: str, reason: str, message: str, warning: bool,
              event_name: str | None = None) -> None:
        self.events.append((kind, name, reason))


def gpu_node(name: str, product: str = "C500", sriov: str = "off") -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {
        "metax-tech.com/gpu.installed": "true", "metax-tech.com/gpu.product": product,
        "metax-tech.com/gpu.sriov": sriov}, "annotations": {}}}


def test_controller_owns_driver_config_and_validates_it() -> None:
    cluster = FakeCluster([gpu_node("a"), gpu_node("n", "N260", "forbidden")])
    controller = Controller(cluster, {"app.kubernetes.io/managed-by": "operator-controller"})
    controller.one_pass()
    assert cluster.configmaps[CONFIG_NAME]["data"] == {"node-vfnums": "nodes: {}\n"}
    edited = "nodes: {a: {vfnum: 4}}\n"
    cluster.configmaps[CONFIG_NAME]["data"]["node-vfnums"] = edited
    controller.one_pass()
    assert cluster.nodes["a"]["metadata"]["annotations"][VFNUM_DESIRED] == "4"
    assert cluster.configmaps[CONFIG_NAME]["data"]["node-vfnums"] == edited  # never rewritten
    # a value the node cannot take: Event + condition naming node and value; 4 stays
    cluster.configmaps[CONFIG_NAME]["data"]["node-vfnums"] = "nodes: {a: {vfnum: 3}, n: {vfnum: 2}}"
    status = controller.one_pass()
    assert cluster.nodes["a"]["metadata"]["annotations"][VFNUM_DESIRED] == "4"
    assert VFNUM_DESIRED not in cluster.nodes["n"]["metadata"]["annotations"]
    bad = {(c["node"], c["value"]) for c in status["conditions"] if c["type"] == "InvalidVfnum"}
    assert bad == {("a", "3"), ("n", "2")}
    assert ("Node", "a", "InvalidVfnum") in cluster.events
    assert ("ConfigMap", CONFIG_NAME, "InvalidVfnum") in cluster.events
    # broken YAML: nothing changes
    cluster.configmaps[CONFIG_NAME]["data"]["node-vfnums"] = "nodes: {a: [vfnum: 8"
    status = controller.one_pass()
    assert cluster.nodes["a"]["metadata"]["annotations"][VFNUM_DESIRED] == "4"
    assert "not valid YAML" in status["conditions"][0]["message"]
    assert "conditions" in cluster.configmaps[STATUS_NAME]["data"]


def test_controller_restarts_gpu_device_once_after_a_vf_change_and_reports() -> None:
    node = gpu_node("a")
    applied = {"state": "ready", "message": "ok", "vfnumApplied": "2026-01-01T00:00:00Z"}
    node["metadata"]["annotations"]["metax-tech.com/driver-manager.driver.state"] = \
        json.dumps(applied)
    cluster = FakeCluster([node])
    cluster.configmaps[CONFIG_NAME] = {"data": {"node-vfnums": "nodes: {}"}}
    cluster.pod_list = [
        {"metadata": {"name": "gpu-device-x", "labels": {"app": "gpu-device"}},
         "spec": {"nodeName": "a"}},
        {"metadata": {"name": "driver-manager-y", "labels": {"app": "driver-manager"}},
         "spec": {"nodeName": "a"}, "status": {"containerStatuses": [
             {"name": "driver-payload", "image": "reg/driver-image:9",
              "state": {"waiting": {"reason": "ImagePullBackOff", "message": "not found"}}}]}},
    ]
    controller = Controller(cluster)
    status = controller.one_pass()
    controller.one_pass()
    assert cluster.deleted == ["gpu-device-x"]
    entry = status["nodes"]["a"]
    assert entry["state"] == "failed" and "ImagePullBackOff" in entry["message"]
    assert ("Node", "a", "GpuOperatorFailed") in cluster.events


def test_services_named_by_the_chart_start(tmp_path: Path) -> None:
    for name in ("driver-manager", "container-runtime", "operator-controller"):
        out = subprocess.run([shutil.which("gpuk8s") or "gpuk8s", "serve", name, "--help"],
                             capture_output=True, text=True, check=False)
        assert out.returncode == 0 and "usage: gpuk8s serve " + name in out.stdout, out.stderr


def test_maca_agent_picks_the_image_asks_for_it_and_installs_it(tmp_path: Path) -> None:
    from gpuk8s.services.drivermanager.agent import MacaAgent

    root, payload = tmp_path / "host", tmp_path / "payload"
    sim.create(str(root), "nodriver-8")  # no SDK; ubuntu 22.04 per the simulator
    payload.mkdir()
    images = ["reg/p/maca-c500:2.33.0.4-ubuntu18.04-amd64",
              "reg/p/maca-c500:2.33.0.4-ubuntu22.04-amd64"]
    api = FakeNode()
    agent = MacaAgent(str(root), images, Reporter(api, "driver-manager.maca", "Maca"),
                      PayloadSource(str(payload), "", "", None), "/run/metax",
                      payload_grace=60.0)
    first = agent.one_pass()
    assert first.state == "pending"
    assert (payload / "maca.want").read_text().strip() == images[1]  # same OS wins
    assert read_readiness(str(root)) == {"maca.ready": False}
    # what the matching payload container does
    sim.write_payload("maca", "2.33.0.4", str(payload / "maca"))
    (payload / "maca.complete").write_text(images[1] + "\n")
    report = agent.one_pass()
    assert report.state == "ready", report.message
    assert read_readiness(str(root)) == {"maca.ready": True}
    assert (root / "opt/maca").is_symlink()
    assert (root / "opt/maca/Version.txt").read_text() == "Version:2.33.0.4\n"
    assert api.events[-1][0] == "MacaReady"


def test_maca_agent_refuses_an_image_holding_another_sdk_than_its_tag(tmp_path: Path) -> None:
    from gpuk8s.services.drivermanager.agent import MacaAgent

    root, payload = tmp_path / "host", tmp_path / "payload"
    sim.create(str(root), "nodriver-8")
    payload.mkdir()
    image = "reg/p/maca-c500:2.33.0.4-ubuntu22.04-amd64"
    api = FakeNode()
    agent = MacaAgent(str(root), [image], Reporter(api, "driver-manager.maca", "Maca"),
                      PayloadSource(str(payload), "", "", None), "/run/metax",
                      payload_grace=60.0)
    sim.write_payload("maca", "2.99.0.1", str(payload / "maca"))
    (payload / "maca.complete").write_text(image + "\n")
    report = agent.one_pass()
    assert report.state == "failed", report.message
    assert "holds SDK 2.99.0.1" in report.message and "2.33.0.4-ubuntu22.04-amd64" in \
        report.message
    assert not (root / "opt/maca").exists() and not (root / "opt/.gpuk8s-maca").exists()
    assert read_readiness(str(root)) == {"maca.ready": False}
    assert api.events[-1][0] == "MacaFailed"


def test_driver_manager_refuses_a_payload_without_version_txt_before_the_unload(
        tmp_path: Path) -> None:
    agent, root, payload, _ = driver_agent(tmp_path, "c500-8", policy="Always")
    driver_payload(payload)
    (payload / "driver/opt/mxdriver/Version.txt").unlink()
    report = agent.one_pass()
    assert report.state == "failed" and "has no opt/mxdriver/Version.txt" in report.message
    assert not (root / "var/lib/gpuk8s-sim/modprobe.log").exists()  # never unloaded
    assert discover(str(root)).driver.version == "2.32.0.6"


def test_liveness_endpoint_of_the_node_agents() -> None:
    import socket
    import urllib.error
    import urllib.request

    from gpuk8s.services.healthserver import serve_health
    from gpuk8s.services.nodeagent import Liveness

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    liveness = Liveness(stale_after=60)
    server = serve_health(port, {"/healthz": liveness.status}, name="test")
    try:
        liveness.beat()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as answer:
            assert answer.status == 200 and json.loads(answer.read())["passes"] == 1
        for path, code in (("/nope", 404), ("/healthz", 503)):
            if code == 503:
                liveness.stale_after = -1  # no pass for longer than allowed
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5)
            assert err.value.code == code
    finally:
        server.shutdown()
        server.server_close()


def test_a_wrapper_still_in_use_at_uninstall_is_removed_by_its_last_container(
    tmp_path: Path, system_root: Path, cri: FakeCri
) -> None:
    agent, _gpu_root, system = runtime_node(tmp_path, system_root)
    agent.one_pass()
    install = system / "usr/local/gpuk8s"
    wrapper_host_path = agent.wrapper_path()  # what containerd records in each bundle
    tasks = system / "run/containerd/io.containerd.runtime.v2.task/k8s.io"
    for cid in ("c1", "c2"):
        (tasks / cid).mkdir(parents=True)
        (tasks / cid / "runtime").write_text(wrapper_host_path)
    done = agent.uninstall()
    assert any("retired" in line for line in done) and install.exists()
    config_path = install / "bin/oci-runtime.json"
    config = json.loads(config_path.read_text())
    assert config["retired"] is True
    # run it as the host would (paths of this test's system root)
    fake_runc = tmp_path / "runc"
    fake_runc.write_text("#!/bin/sh\nexit 0\n")
    fake_runc.chmod(0o755)
    config.update(runtime=str(fake_runc), installDir=str(install),
                  tasksDir=str(tasks.parent))
    config_path.write_text(json.dumps(config))
    for cid in ("c1", "c2"):
        (tasks / cid / "runtime").write_text(str(install / "bin" / WRAPPER_NAME))
    wrapper = str(install / "bin" / WRAPPER_NAME)
    subprocess.run([wrapper, "delete", "c1"], check=True)
    assert install.exists()  # c2 still needs it
    shutil.rmtree(tasks / "c1")
    subprocess.run([wrapper, "delete", "--force", "c2"], check=True)
    assert not install.exists()


def test_maca_agent_keeps_the_installed_sdk_ready_while_a_new_one_arrives(
        tmp_path: Path) -> None:
    """Issue 28 item 5: a helm upgrade of maca.payload.images replaces driver-manager's pod;
    while the new image's SDK is copied, the SDK installed before stays in use and maca.ready
    stays true (else gpu-device, which needs it, would leave the node meanwhile)."""
    from gpuk8s.services.drivermanager.agent import MacaAgent

    root, payload = tmp_path / "host", tmp_path / "payload"
    sim.create(str(root), "nodriver-8")
    payload.mkdir()
    old = "reg/p/maca-c500:2.33.0.4-ubuntu22.04-amd64"
    sim.write_payload("maca", "2.33.0.4", str(payload / "maca"))
    (payload / "maca.complete").write_text(old + "\n")
    agent = MacaAgent(str(root), [old], Reporter(FakeNode(), "driver-manager.maca", "Maca"),
                      PayloadSource(str(payload), "", "", None), "/run/metax")
    assert agent.one_pass().state == "ready"
    new = "reg/p/maca-c500:2.33.0.5-ubuntu22.04-amd64"
    newer = MacaAgent(str(root), [new], Reporter(FakeNode(), "driver-manager.maca", "Maca"),
                      PayloadSource(str(tmp_path / "empty"), "", "", None), "/run/metax")
    (tmp_path / "empty").mkdir()
    report = newer.one_pass()
    assert report.state == "pending" and new in report.message
    assert read_readiness(str(root)) == {"maca.ready": True}  # 2.33.0.4 is still there
    assert (root / "opt/maca/Version.txt").read_text() == "Version:2.33.0.4\n"


def _ignore_sighup() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # what nohup does


def test_runtime_ready_only_once_containerd_really_restarted_onto_the_handler(
    tmp_path: Path, system_root: Path
) -> None:
    """Issue 28 item 0: a containerd started with SIGHUP ignored (the lab's first lab/up ran
    under such a parent) never restarted, the first pass failed after 60 s and the second
    one, seeing the config already edited, said ready. Now: failed every pass, the config
    as it was, until a containerd that can restart serves the handler."""
    agent, gpu_root, system = runtime_node(tmp_path, system_root)
    agent.settings.restart_mode = "signal"
    sock = system / "run/containerd/containerd.sock"
    served = tmp_path / "served.json"  # what the fake containerd serves when it starts
    served.write_text(json.dumps(cri_config({"runc": ""})))
    fake = [sys.executable, str(Path(__file__).with_name("fake_cri.py")), str(sock), str(served)]
    config = system / "etc/containerd/config.toml"

    def peer() -> int:
        return peer_pid_or_zero(str(sock))

    def serving(pid: int) -> bool:
        return peer() == pid

    nohup = subprocess.Popen(fake, preexec_fn=_ignore_sighup)
    try:
        wait_for("the fake containerd", lambda: serving(nohup.pid))
        for _ in range(2):
            report = agent.one_pass()
            assert report.state == "failed", report.message
            assert f"containerd (pid {nohup.pid}) ignores SIGHUP" in report.message
            assert read_readiness(str(gpu_root)) == {"runtime.ready": False}
            assert config.read_text() == LAB_CONFIG  # untouched: never restarted onto it
            assert not Path(f"{config}.gpuk8s-backup").exists()
            assert nohup.poll() is None  # the same containerd
    finally:
        nohup.terminate()
        nohup.wait()
    # its service manager runs it again, from the same SIGHUP-ignoring parent: lab/supervise
    # gives it every signal at its default, as systemd does
    supervised = subprocess.Popen([str(REPO / "lab/supervise"), *fake], preexec_fn=_ignore_sighup)
    try:
        first = wait_for("the supervised fake", lambda: next(
            (p for p in _children(supervised.pid) if serving(p)), 0))
        served.write_text(json.dumps(SERVED))  # what it reads when restarted onto the edit
        report = agent.one_pass()  # a new containerd: tried again
        assert report.state == "ready", report.message
        now = peer()
        assert now not in (0, first) and now in _children(supervised.pid)  # really restarted
        assert read_readiness(str(gpu_root)) == {"runtime.ready": True}
        assert "metax" in containerd.tomlkit.parse(config.read_text())["plugins"][
            "io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]
    finally:
        supervised.terminate()
        supervised.wait()


def wait_for(what: str, check: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout}s"
        time.sleep(0.05)
    return value


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


V1_CONFIG = """# version 1 (no `version` key), CRI named by id: what containerd 1.6 loads
[plugins.cri.containerd]
  default_runtime_name = "runc"
"""


@pytest.mark.parametrize(("config", "reason"), [
    # what the old agent wrote into a version-1 file: containerd refuses to start on it
    ('version = 2\n[plugins.cri]\n  sandbox_image = "x"\n', "refuses it"),
    ('[plugins."io.containerd.grpc.v1.cri".containerd]\n', "reads it as version 1"),
    ("version = 7\n", "version 7"),
])
def test_a_config_the_agent_cannot_edit_safely_is_left_untouched_and_failed(
    tmp_path: Path, system_root: Path, cri: FakeCri, config: str, reason: str
) -> None:
    agent, gpu_root, system = runtime_node(tmp_path, system_root, config=config)
    for _ in range(2):
        report = agent.one_pass()
        assert report.state == "failed" and reason in report.message, report.message
        assert "nothing was changed" in report.message
        assert read_readiness(str(gpu_root)) == {"runtime.ready": False}
        assert (system / "etc/containerd/config.toml").read_text() == config
        assert sorted(p.name for p in (system / "etc/containerd").iterdir()) == ["config.toml"]


def test_a_version_1_config_is_edited_as_version_1(
    tmp_path: Path, system_root: Path, cri: FakeCri
) -> None:
    agent, _gpu_root, system = runtime_node(tmp_path, system_root, config=V1_CONFIG)
    assert agent.one_pass().state == "pending"
    text = (system / "etc/containerd/config.toml").read_text()
    assert "version" not in containerd.tomlkit.parse(text)
    assert containerd.tomlkit.parse(text)["plugins"]["cri"]["containerd"]["runtimes"]["metax"]
    cri.config = SERVED
    assert agent.one_pass().state == "ready"
    agent.uninstall()
    assert (system / "etc/containerd/config.toml").read_text() == V1_CONFIG  # byte for byte


@pytest.mark.parametrize(("served", "state"), [
    ({"containerd": {}, "cdiSpecDirs": ["/etc/cdi", "/var/run/cdi"]}, "ready"),  # 2.4
    ({"containerd": {}, "enableCDI": False, "cdiSpecDirs": ["/etc/cdi"]}, "failed"),
])
def test_native_cdi_is_checked_on_containerd_2(
    tmp_path: Path, system_root: Path, cri: FakeCri, served: dict, state: str
) -> None:
    agent, gpu_root, system = runtime_node(tmp_path, system_root)
    agent.settings.runtime, agent.settings.runtime_version = "auto", "containerd://2.4.2"
    assert agent.mode() == "native"
    cri.config = served
    report = agent.one_pass()
    assert report.state == state, report.message
    assert read_readiness(str(gpu_root)) == {"runtime.ready": state == "ready"}
    assert (system / "etc/containerd/config.toml").read_text() == LAB_CONFIG  # never edited
