"""playbooks/nvidia_host.yml over SSH on the fleet's NVIDIA node (gpu-nv: simulated 8x H100,
containerd 2.4.2 in the containerd2 dialect: version 3 with a drop-in, CDI on), as an
administrator runs it from a workstation: ``--check --diff`` first, then the real run, then
the undo (``-e nvidia_host_state=absent``) the same way. Each check run must name exactly the
tasks its real run changes; the test asserts what the node shows, not task output.

containerd 2.x reads CDI itself, so the role writes the CDI spec and the wrapper its hooks run,
registers no runtime handler and leaves containerd's config alone: the config and its drop-ins
are compared byte for byte after the install as well as after the undo. One module-scoped
install; the finalizer runs the undo whatever failed, so the node is left as found."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.ansible.test_ansible_layer import changed_by_host

from .conftest import CACHE, FLEET_MARKS, LAB, REPO, VERSIONS, kubectl_json, run, tool, wait_until

pytestmark = FLEET_MARKS

NODE = "gpu-nv"
SIM = "/var/lib/gpuk8s-lab/simroot"  # gpuk8s_gpu_root in inventories/fleet
SPEC = "/etc/cdi/nvidia.com-gpu.json"
# the wrapper's directory: lab/fleetctl gives gpu-nv an empty /usr/local/gpuk8s of its own
# (an opaque overlay directory that hides the host's), which the undo must leave in place
INSTALL_DIR = "/usr/local/gpuk8s"
WRAPPER_DIR = f"{INSTALL_DIR}/bin"
# every path the role may write on the node (the container check's work directory too)
OURS = (SPEC, WRAPPER_DIR, f"{SIM}/run/metax/runtime.ready", "/var/lib/gpuk8s/nvidia-check")
CDI_CHECK = str(CACHE / "bin" / "cdi-check-v1.1.0" / "gpuk8s-cdi-check")
GPUS = 8  # lab/fleetctl: gpu-nv's preset nvidia-8
RUNTIME_TASK = ("nvidia_host : Containers get the GPUs and CUDA through gpuk8s' CDI spec and "
                "runtime wrapper")
UNDO_TASK = "nvidia_host : Remove the CDI spec, the wrapper and the runtime handler"
# containerd's CRI config as the running containerd serves it, asked over its socket by the
# project's own reader on the node's Python (the node has no crictl)
CRI_CONFIG = (
    "import json; from gpuk8s.services.runtime import containerd as c; "
    "d = c.cri_config('/run/containerd/containerd.sock'); "
    "print(json.dumps({'cdi': c.cri_cdi_enabled(d), 'dirs': d.get('cdiSpecDirs')}))"
)


def node(*command: str, check: bool = True) -> str:
    """A command in gpu-nv's own root (its mount, network and pid namespaces)."""
    return run(str(LAB / "fleetctl"), "exec", NODE, *command, check=check, timeout=120).stdout


def containerd_files() -> dict[str, str]:
    """gpu-nv's containerd config and drop-ins, path -> text, as the node has them."""
    names = node("sh", "-c", "ls -1 /etc/containerd/config.toml /etc/containerd/conf.d/*")
    return {p: node("cat", p) for p in names.split()}


def exists(path: str) -> bool:
    return run(str(LAB / "fleetctl"), "exec", NODE, "test", "-e", path, check=False,
               timeout=60).returncode == 0


def present_of_ours() -> set[str]:
    return {p for p in OURS if exists(p)}


def cri_served() -> dict[str, Any]:
    """What gpu-nv's running containerd serves: its CRI config's CDI settings, the version of
    the program serving the socket, and the kubelet's Ready condition."""
    cri: dict[str, Any] = json.loads(node("env", f"PYTHONPATH={REPO / 'src'}", "/usr/bin/python3",
                                          "-c", CRI_CONFIG))
    cri["version"] = node("sh", "-c", "exe=$(readlink /proc/$(pidof -s containerd)/exe) && "
                                      '"$exe" --version').split()[2]
    ready = next(c for c in kubectl_json("get", "node", NODE)["status"]["conditions"]
                 if c["type"] == "Ready")
    cri["ready"] = ready["status"]
    return cri


def nvidia_playbook(*args: str) -> dict[str, list[str]]:
    """ansible-playbook -i inventories/fleet playbooks/nvidia_host.yml over SSH; the tasks
    that reported changed, per host; timed."""
    start = time.monotonic()
    proc = run(tool("ansible-playbook"), "-i", str(REPO / "inventories" / "fleet"),
               str(REPO / "playbooks" / "nvidia_host.yml"), *args, cwd=str(REPO), timeout=600)
    print(f"\n[fleet] nvidia_host.yml {' '.join(args)} in {time.monotonic() - start:.0f}s",
          file=sys.stderr)
    return changed_by_host(proc.stdout)


@pytest.fixture(scope="module")
def before(lab: dict[str, str]) -> dict[str, Any]:
    cri = cri_served()
    # the dialect's containerd 2.x serves the socket (not the distribution's 1.6 on PATH)
    assert cri["version"] == VERSIONS["CONTAINERD2_VERSION"] and cri["ready"] == "True", cri
    return {"files": containerd_files(), "ours": present_of_ours(), "cri": cri,
            "install_dir": exists(INSTALL_DIR)}


@pytest.fixture(scope="module")
def installed(before: dict[str, Any]) -> Iterator[dict[str, Any]]:
    state: dict[str, Any] = {"undone": False}
    try:
        state["predicted"] = nvidia_playbook("--check", "--diff")
        state["after_check"] = {"files": containerd_files(), "ours": present_of_ours()}
        state["changed"] = nvidia_playbook("--diff")
        yield state
    finally:
        if not state["undone"]:
            nvidia_playbook("-e", "nvidia_host_state=absent")


def test_1_check_predicts_the_install_and_the_node_serves_the_gpus_through_cdi(
    before: dict[str, Any], installed: dict[str, Any]
) -> None:
    # --check changed nothing, and named exactly the tasks the real run changed
    assert installed["after_check"] == {"files": before["files"], "ours": before["ours"]}
    assert installed["predicted"] == installed["changed"], installed
    assert list(installed["changed"]) == [NODE]
    assert installed["changed"][NODE] == [RUNTIME_TASK]
    # containerd 2.x reads CDI itself: no handler, its config and drop-ins untouched
    assert containerd_files() == before["files"]
    cri = cri_served()
    assert cri == before["cri"] and cri["cdi"] and "/etc/cdi" in cri["dirs"], cri
    assert present_of_ours() - before["ours"] == {SPEC, WRAPPER_DIR, OURS[2]}
    # the spec, judged by the reference CDI library (what containerd 2.x links) on the node:
    # valid, one device per simulated GPU, and injection gives that GPU's device node
    node(CDI_CHECK, "validate", SPEC)
    spec = json.loads(node("cat", SPEC))
    assert spec["kind"] == "nvidia.com/gpu"
    # the GPUs as the node's (simulated) nvidia-smi lists them: index -> PCI address
    listed = dict(line.split(", ") for line in node(
        f"{SIM}/usr/bin/nvidia-smi", "--query-gpu=index,pci.bus_id",
        "--format=csv,noheader").splitlines())
    assert len(listed) == GPUS
    pci = {index: bus[-12:].lower() for index, bus in listed.items()}  # 0000:03:00.0
    assert {d["name"] for d in spec["devices"]} == {*pci.values(), "all"}
    base = {"ociVersion": "1.0.2", "process": {"env": ["PATH=/bin"], "cwd": "/"},
            "root": {"path": "rootfs"}, "mounts": [], "linux": {}}
    injected = json.loads(run(str(LAB / "fleetctl"), "exec", NODE, CDI_CHECK, "inject",
                              "/etc/cdi", f"nvidia.com/gpu={pci['3']}", input=json.dumps(base),
                              timeout=60).stdout)
    devices = {d["path"]: (d["major"], d["minor"]) for d in injected["linux"]["devices"]}
    assert set(devices) == {"/dev/nvidia3", "/dev/nvidiactl", "/dev/nvidia-uvm",
                            "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"}
    # the simulated GPU 3's char device on the node (lab/fleetctl: --device-nodes char)
    number = node("stat", "-c", "%t %T", f"{SIM}/dev/nvidia3").split()
    assert devices["/dev/nvidia3"] == tuple(int(n, 16) for n in number)
    # the wrapper the spec's hooks run is installed, executable by the node's python3
    hooks = {h["path"] for h in spec["containerEdits"].get("hooks", [])}
    for hook in hooks:
        node("test", "-x", hook)
    # a second check predicts nothing
    assert nvidia_playbook("--check") == {}


def test_2_undo_leaves_the_node_as_found(
    before: dict[str, Any], installed: dict[str, Any]
) -> None:
    predicted = nvidia_playbook("--check", "--diff", "-e", "nvidia_host_state=absent")
    assert present_of_ours() - before["ours"] == {SPEC, WRAPPER_DIR, OURS[2]}  # check: nothing
    installed["undone"] = True
    changed = nvidia_playbook("--diff", "-e", "nvidia_host_state=absent")
    assert predicted == changed == {NODE: [UNDO_TASK]}
    assert containerd_files() == before["files"]  # byte for byte, drop-ins included
    assert present_of_ours() == before["ours"]
    assert exists(INSTALL_DIR) == before["install_dir"]
    wait_until("gpu-nv's containerd serving its CRI and the node Ready",
               lambda: cri_served() == before["cri"], 120)
    assert nvidia_playbook("--check", "-e", "nvidia_host_state=absent") == {}
