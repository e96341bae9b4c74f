"""Maintenance over SSH on the fleet (issue 49, item 4 bullet 3 and item 6's check mode):
playbooks/maintenance.yml and vfnum.yml as an administrator runs them from a workstation,
through real sshd and sudo, against nodes of the GPU Extensions install over SSH that this
module shares with test_fleet_sched.py (conftest's ``fleet_extensions``: one install and
uninstall for both; test_fleet_sched.py asserts the uninstall).

* maintenance on gpu-ext: a Deployment's GPU pod there is evicted and starts on another
  node with room; the driver is upgraded in gpu-ext's own root (the simulated GPUs' root:
  real depmod writes the indexes and real modprobe's own lookup names the module it would
  load; the simulator's modprobe stands in for the kernel's load and unload); gpu-ext comes
  back uncordoned with its labels (the driver version's the new one); a GPU pod on gpu-vf
  and every pod on the other fleet nodes keep their UID and restart count. Then the same
  play takes gpu-ext back to the driver it had.
* the install over SSH registers the lab node's GPUs (capacity and allocatable 8) with every
  label of SPEC §4, as the single-node install playbook did (the former
  tests/e2e/test_playbooks.py test 1: the fleet's install is the playbooks' one e2e install).
* check mode: each run is first made with ``--check --diff``; the tasks it reports changed,
  per host, are those the real run changes. vfnum.yml on gpu-vf the same way (4 VFs per GPU
  to 2 and back).

Each test leaves the node as found: driver version, VF count, labels, cordon state, and
the files of its simulated root (what a run added or changed there, e.g. real depmod's
binary indexes, is put back from a copy taken before)."""

from __future__ import annotations

import contextlib
import functools
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuk8s import sim
from tests.ansible.test_ansible_layer import changed_by_host

from .conftest import (
    BUSYBOX,
    FLEET_MARKS,
    KUBECONFIG,
    KUBECTL,
    REPO,
    apply,
    kubectl,
    kubectl_json,
    run,
    tool,
    wait_until,
)
from .test_fleet_ops import (
    EXTRA_VARS,
    FLEET_TAINT,
    node_exec,
    nodes,
    our_labels,
)
from .test_gpu_stack import SPEC4_LABELS, gpu

pytestmark = FLEET_MARKS

NODE = "gpu-ext"
VF_NODE = "gpu-vf"
SIM_ROOT = "/var/lib/gpuk8s-lab/simroot"  # inventories/fleet's gpuk8s_gpu_root, on every node
FOUND = "2.32.0.6"  # the driver gpuk8s sim create puts in every MetaX node's root
UPGRADE = "2.33.0.6"
MARK = "metax-tech.com/maintenance"
RESOURCE = "metax-tech.com/gpu"
# the simulator's modprobe loads and unloads (no real kernel is touched); real kmod's
# own lookup, on the node's simulated root, names the file it would load
MODPROBE = f"{SIM_ROOT}/usr/sbin/modprobe"
DRIVER_VARS: dict[str, Any] = {
    "node_maintenance_driver_load_command": [MODPROBE, "{module}"],
    "node_maintenance_driver_unload_command": [MODPROBE, "-r", "{module}"],
    "node_maintenance_driver_resolve_command": [
        "modprobe", "--show-depends", "-d", "{host_root}", "-S", "{kernel_release}", "{module}"],
    "node_maintenance_wait_delay": 2,
    "node_maintenance_wait_retries": 90,
}
# the vendor's VF command (the simulator's mx-smi makes and removes the VFs in the simulated
# sysfs, as the driver would; a bare sriov_numvfs write changes nothing there)
VF_VARS: dict[str, Any] = {
    "gpu_virtualization_command": [
        "{host_root}/opt/mxdriver/bin/mx-smi", "vm", "--enable-vf", "{vfnum}", "-i", "{index}"],
    "gpu_virtualization_wait_delay": 2,
    "gpu_virtualization_wait_retries": 90,
}
SNAPSHOT = "/var/tmp/gpuk8s-e2e-simroot.tar"
# run on a node: put back every file of ROOT that differs from the copy SNAPSHOT holds
# and remove what is not in it; prints what it did
RESTORE = r"""
import os, shutil, sys, tarfile
root, snap = sys.argv[1], sys.argv[2]
done = []
with tarfile.open(snap) as t:
    members = {os.path.normpath(m.name): m for m in t.getmembers()}
    for top, dirs, files in os.walk(root, topdown=False):
        for name in files + dirs:
            path = os.path.join(top, name)
            rel = os.path.relpath(path, root)
            if rel not in members:
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path)
                else:
                    os.unlink(path)
                done.append("removed " + rel)
    for rel, m in sorted(members.items()):
        path = os.path.join(root, rel)
        if m.isdir() and not os.path.isdir(path):
            os.makedirs(path)
            done.append("restored " + rel)
        elif m.issym() and not (os.path.islink(path) and os.readlink(path) == m.linkname):
            if os.path.lexists(path):
                os.unlink(path)
            os.symlink(m.linkname, path)
            done.append("restored " + rel)
        elif m.isfile():
            data = t.extractfile(m).read()
            if os.path.islink(path) or not os.path.isfile(path) or open(path, "rb").read() != data:
                with open(path, "wb") as out:
                    out.write(data)
                os.chmod(path, m.mode)
                done.append("restored " + rel)
print("\n".join(done))
"""


def fleet_play(name: str, *args: str, extra: dict[str, Any]) -> tuple[str, float]:
    """ansible-playbook -i inventories/fleet playbooks/NAME.yml over SSH: stdout, seconds."""
    start = time.monotonic()
    out = run(tool("ansible-playbook"), "-i", str(REPO / "inventories" / "fleet"),
              str(REPO / "playbooks" / f"{name}.yml"), "-e", json.dumps({**EXTRA_VARS, **extra}),
              *args, cwd=str(REPO), timeout=1200).stdout
    took = time.monotonic() - start
    print(f"\n[fleet] {name}.yml {' '.join(args)} in {took:.0f}s", file=sys.stderr)
    return out, took


def honest_run(name: str, host: str, extra: dict[str, Any]) -> dict[str, list[str]]:
    """--check --diff, then the real run, both limited to ``host``: the tasks the check
    reported changed, per host, are those the real run changed; returns them."""
    check, _ = fleet_play(name, "--limit", host, "--check", "--diff", extra=extra)
    real, _ = fleet_play(name, "--limit", host, extra=extra)
    predicted, done = changed_by_host(check), changed_by_host(real)
    assert predicted == done, f"--check said {predicted}, the real run changed {done}"
    return done


def node_state(name: str) -> dict[str, Any]:
    """What the tests must give back: cordon, our labels, the maintenance annotations."""
    node = nodes()[name]
    annotations = node["metadata"].get("annotations", {})
    return {"unschedulable": bool(node["spec"].get("unschedulable")),
            "labels": our_labels(node),
            "marks": {k: v for k, v in annotations.items() if k.startswith(MARK)}}


def vfnum_labelled(name: str, vfnum: str) -> bool:
    return our_labels(nodes()[name]).get("metax-tech.com/gpu.vfnum") == vfnum


def driver_version(name: str) -> str:
    out = node_exec(name, "cat", f"{SIM_ROOT}/opt/mxdriver/Version.txt")
    return out.strip().split(":", 1)[1]


@pytest.fixture()
def sim_root_kept(request: pytest.FixtureRequest) -> Iterator[str]:
    """The node (the fixture's parameter), with the extensions scheme installed over SSH
    (conftest's ``fleet_extensions``), its simulated root and its Node as found
    afterwards: the files put back from a copy, cordon and marks as they were."""
    request.getfixturevalue("fleet_extensions")
    name: str = request.param
    node_exec(name, "tar", "-C", SIM_ROOT, "-cf", SNAPSHOT, ".")
    before = node_state(name)
    try:
        yield name
    finally:
        done = node_exec(name, "python3", "-c", RESTORE, SIM_ROOT, SNAPSHOT)
        print(f"\n[fleet] {name}'s simulated root after the test: {done.split() and done}",
              file=sys.stderr)
        node_exec(name, "rm", "-rf", SNAPSHOT, "/var/tmp/gpuk8s-e2e-driver")
        now = node_state(name)
        if now["unschedulable"] != before["unschedulable"]:
            kubectl("patch", "node", name, "-p",
                    json.dumps({"spec": {"unschedulable": before["unschedulable"]}}))
        stale = {k: None for k in now["marks"] if k not in before["marks"]}
        if stale:
            kubectl("patch", "node", name, "-p", json.dumps({"metadata": {"annotations": stale}}))


@contextlib.contextmanager
def node_states(name: str) -> Iterator[list[dict[str, Any]]]:
    """Every state of Node ``name`` the API server reports while the block runs (kubectl's
    watch: each change, in order, none missed); the list is filled when the block ends."""
    states: list[dict[str, Any]] = []
    proc = subprocess.Popen([KUBECTL, "--kubeconfig", KUBECONFIG, "get", "node", name,
                             "--watch", "-o", "json"], stdout=subprocess.PIPE, text=True)
    out = proc.stdout
    assert out is not None
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(out.readline, "")))
    reader.start()
    try:
        # the watch has begun once it has reported the node as it is now
        wait_until(f"the watch of {name} started",
                   lambda: "".join(lines).rstrip().endswith("}"), 60, interval=0.2)
        yield states
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        reader.join(timeout=30)
    text, decoder, at = "".join(lines), json.JSONDecoder(), 0
    while text[at:].strip():
        at += len(text[at:]) - len(text[at:].lstrip())
        obj, at = decoder.raw_decode(text, at)
        states.append(obj)


def maintained(state: dict[str, Any]) -> bool:
    """The node as SPEC §9 has it during the maintenance action: cordoned, marked, none of
    its metax-tech.com/ labels."""
    return (bool(state["spec"].get("unschedulable"))
            and MARK in (state["metadata"].get("annotations") or {})
            and not [k for k in state["metadata"].get("labels", {})
                     if k.startswith("metax-tech.com/")])


def deployment(ns: str, name: str, nodes_allowed: list[str], prefer: str) -> dict[str, Any]:
    """One GPU pod of a Deployment, on one of ``nodes_allowed``, ``prefer`` first."""
    term = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                  "values": nodes_allowed}]}
    preferred = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                       "values": [prefer]}]}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "tolerations": [FLEET_TAINT],
                    "affinity": {"nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [term]},
                        "preferredDuringSchedulingIgnoredDuringExecution": [
                            {"weight": 100, "preference": preferred}]}},
                    "containers": [{
                        "name": "main",
                        "image": BUSYBOX,
                        "command": ["sleep", "3600"],
                        "resources": {"limits": {RESOURCE: "1"}},
                    }],
                },
            },
        },
    }


def running_pod(ns: str, app: str) -> dict[str, Any]:
    """The app's one Running pod (not being deleted)."""
    pods = [p for p in kubectl_json("-n", ns, "get", "pods", "-l", f"app={app}")["items"]
            if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]
    assert len(pods) == 1, [(p["metadata"]["name"], p["status"].get("phase")) for p in pods]
    return dict(pods[0])


def restarts(pod: dict[str, Any]) -> int:
    return sum(c.get("restartCount", 0) for c in pod["status"].get("containerStatuses", []))


def pods_on(names: set[str]) -> dict[str, tuple[str, int]]:
    """UID -> (node, restarts) of every pod on the nodes ``names``."""
    return {p["metadata"]["uid"]: (p["spec"]["nodeName"], restarts(p))
            for p in kubectl_json("get", "pods", "-A")["items"]
            if p["spec"].get("nodeName") in names}


def push_payload(version: str, tmp: Path) -> dict[str, Any]:
    """The vendor's driver payload of ``version`` copied to gpu-ext over SSH (ansible's copy,
    as an administrator stages one); the play's variables for it."""
    local = tmp / f"driver-{version}"
    sim.write_payload("driver", version, str(local))
    dest = f"/var/tmp/gpuk8s-e2e-driver/{version}"
    run(tool("ansible"), "-i", str(REPO / "inventories" / "fleet"), NODE, "-b", "-m",
        "ansible.builtin.copy", "-a", json.dumps({"src": f"{local}/", "dest": dest,
                                                  "mode": "preserve"}),
        cwd=str(REPO), timeout=300)
    return {**DRIVER_VARS, "node_maintenance_driver_version": version,
            "node_maintenance_driver_payload": dest,
            "node_maintenance_report_dir": str(tmp / "reports")}


def kmod_finds(version: str) -> None:
    """Real kmod's lookup on gpu-ext's simulated root names the payload's module, of
    ``version`` (real modinfo)."""
    release = node_exec(NODE, "cat", f"{SIM_ROOT}/proc/sys/kernel/osrelease").strip()
    shown = node_exec(NODE, "modprobe", "--show-depends", "-d", SIM_ROOT, "-S", release, "metax")
    module = shown.split()[1]
    assert module == f"{SIM_ROOT}/lib/modules/{release}/extra/metax.ko", shown
    assert node_exec(NODE, "modinfo", "-F", "version", module).strip() == version


def has_gpus(name: str, field: str = "allocatable") -> bool:
    return gpu(name, field) == 8


@pytest.mark.usefixtures("fleet_extensions")
def test_install_over_ssh_registers_the_lab_nodes_gpus_with_their_labels(
    lab: dict[str, str],
) -> None:
    for name in (lab["node"], NODE):
        wait_until(f"capacity 8 on {name}", functools.partial(has_gpus, name, "capacity"), 180)
        wait_until(f"allocatable 8 on {name}", functools.partial(has_gpus, name), 60)
        labels = kubectl_json("get", "node", name)["metadata"]["labels"]
        missing = [key for key in SPEC4_LABELS if f"metax-tech.com/{key}" not in labels]
        assert not missing, (name, missing)


@pytest.mark.parametrize("sim_root_kept", [NODE], indirect=True)
def test_maintenance_moves_the_gpu_pod_upgrades_the_driver_and_gives_the_node_back(
    sim_root_kept: str, namespace: str, lab: dict[str, str], tmp_path: Path
) -> None:
    ns = namespace
    others = {"cp2", VF_NODE, "gpu-op", "gpu-op2", "gpu-nv"}
    assert driver_version(NODE) == FOUND
    before = node_state(NODE)
    assert not before["unschedulable"] and not before["marks"], before
    assert before["labels"]["metax-tech.com/gpu.driver.minor"] == "32", before
    # a GPU pod elsewhere (gpu-vf) that the maintenance must leave alone, then the one to move
    apply(deployment(ns, "bystander", [VF_NODE], VF_NODE))
    bystander = wait_until("bystander Running", lambda: running_pod(ns, "bystander"), 180)
    apply(deployment(ns, "mover", [NODE, VF_NODE, lab["node"]], NODE))
    mover = wait_until("mover Running", lambda: running_pod(ns, "mover"), 180)
    assert mover["spec"]["nodeName"] == NODE, mover["spec"]["nodeName"]
    untouched = pods_on(others)

    upgrade = push_payload(UPGRADE, tmp_path)
    start = time.monotonic()
    with node_states(NODE) as states:
        changed = honest_run("maintenance", NODE, upgrade)
    # while the driver was upgraded the node was cordoned, marked and without our labels
    # (the check run before it changed nothing: the node's first state was as found)
    assert not maintained(states[0]) and any(maintained(s) for s in states), [
        (s["spec"].get("unschedulable"), sorted(s["metadata"].get("labels", {}))) for s in states]
    print(f"\n[fleet] maintenance of {NODE} to {UPGRADE} (check + real) in "
          f"{time.monotonic() - start:.0f}s", file=sys.stderr)
    for step in ("Cordon the node", "Evict the pods that use GPUs",
                 "Install or upgrade the driver", "End the maintenance mark",
                 "Uncordon the node (unless it was cordoned before)"):
        assert f"node_maintenance : {step}" in changed[NODE], changed

    # the GPU pod was evicted and its replacement runs on another node
    moved = wait_until("mover Running again", lambda: running_pod(ns, "mover"), 180)
    assert moved["metadata"]["uid"] != mover["metadata"]["uid"]
    assert moved["spec"]["nodeName"] in (VF_NODE, lab["node"]), moved["spec"]["nodeName"]
    # the new driver, in gpu-ext's own root, found by real kmod
    assert driver_version(NODE) == UPGRADE
    kmod_finds(UPGRADE)
    # the node is back: uncordoned, unmarked, its labels again (the driver's minor the new one)
    after = node_state(NODE)
    assert not after["unschedulable"] and not after["marks"], after
    expected = {**before["labels"], "metax-tech.com/gpu.driver.minor": "33"}
    assert after["labels"] == expected, (before["labels"], after["labels"])
    assert nodes()[NODE]["status"]["allocatable"].get(RESOURCE) == "8"
    # nothing else was touched
    kept = running_pod(ns, "bystander")
    assert (kept["metadata"]["uid"], restarts(kept)) == (
        bystander["metadata"]["uid"], restarts(bystander))
    now = pods_on(others)
    assert {uid: now.get(uid) for uid in untouched} == untouched

    # and back to the driver gpu-ext had, the same way (no GPU pod left on it to move)
    start = time.monotonic()
    changed = honest_run("maintenance", NODE, push_payload(FOUND, tmp_path))
    print(f"\n[fleet] maintenance of {NODE} back to {FOUND} (check + real) in "
          f"{time.monotonic() - start:.0f}s", file=sys.stderr)
    assert "node_maintenance : Install or upgrade the driver" in changed[NODE], changed
    assert driver_version(NODE) == FOUND
    kmod_finds(FOUND)
    assert node_state(NODE) == before


@pytest.mark.parametrize("sim_root_kept", [VF_NODE], indirect=True)
def test_vfnum_check_mode_predicts_the_real_run_on_the_vf_node(sim_root_kept: str) -> None:
    before = node_state(VF_NODE)
    assert before["labels"]["metax-tech.com/gpu.vfnum"] == "4", before
    done = False
    try:
        for vfnum in (2, 4):
            start = time.monotonic()
            changed = honest_run("vfnum", VF_NODE, {**VF_VARS, "gpu_virtualization_vfnum": vfnum})
            print(f"\n[fleet] vfnum.yml {VF_NODE} to {vfnum} (check + real) in "
                  f"{time.monotonic() - start:.0f}s", file=sys.stderr)
            assert "gpu_virtualization : Set the VFs on the host" in changed[VF_NODE], changed
            node = nodes()[VF_NODE]
            assert node["status"]["capacity"].get(RESOURCE) == str(8 * vfnum)
            wait_until(f"{VF_NODE} labelled gpu.vfnum={vfnum}",
                       functools.partial(vfnum_labelled, VF_NODE, str(vfnum)), 120)
        done = True
    finally:
        if not done:  # back to the node's 4 VFs per GPU whatever failed
            fleet_play("vfnum", "--limit", VF_NODE,
                       extra={**VF_VARS, "gpu_virtualization_vfnum": 4})
    assert node_state(VF_NODE) == before

