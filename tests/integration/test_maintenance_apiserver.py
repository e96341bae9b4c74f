"""playbooks/maintenance.yml (the node_maintenance role) against a real kube-apiserver.

The node is an API object (no kubelet): the test sets its allocatable GPUs once, as a
kubelet would, and the real labeller (``gpuk8s serve labeller``) runs beside the
playbook on a simulated host, so the labels come back only when the role really ends
the maintenance. The maintenance action is a task file that fails, or nothing.

* a failure with healthy GPUs: the rescue uncordons *and* removes the maintenance mark,
  so gpu-label writes the labels again (and gpu-device, which follows them, returns);
* a failure with a faulty GPU leaves the node cordoned and marked; after healing, the
  documented rerun gives back the node as it was before the first attempt (uncordoned).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuk8s import sim
from gpuk8s.discovery import discover
from tests import sshd
from tests.ansible.test_ansible_layer import changed_by_host, changed_tasks

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
MARK = "metax-tech.com/maintenance"
BEFORE = "metax-tech.com/maintenance-before"


@contextlib.contextmanager
def simulated_node(apiserver: Any, tmp: Path) -> Iterator[dict[str, Any]]:
    """A Node object with 8 GPUs, its simulated host under ``tmp`` and the real labeller."""
    name = f"maint-{uuid.uuid4().hex[:6]}"
    core = apiserver.core()
    core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    # what the kubelet would report with gpu-device running
    core.patch_node_status(name, {"status": {"capacity": {"metax-tech.com/gpu": "8"},
                                             "allocatable": {"metax-tech.com/gpu": "8"}}})
    root = tmp / "sim"
    sim.create(str(root), "c500-8")
    labeller = subprocess.Popen(
        [str(BIN / "gpuk8s"), "serve", "labeller", "--node-name", name, "--host-root",
         str(root), "--kubeconfig", apiserver.kubeconfig("gpu-label"), "--interval", "1",
         "--log-level", "warning"],
        env={**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"},
    )
    try:
        wait_for(lambda: labels(apiserver, name).get("metax-tech.com/gpu.installed") == "true",
                 "labels written by gpu-label")
        yield {"name": name, "root": root, "tmp": tmp}
    finally:
        labeller.terminate()
        labeller.wait(10)
        core.delete_node(name)


@pytest.fixture
def node(apiserver: Any, tmp_path: Path) -> Iterator[dict[str, Any]]:
    with simulated_node(apiserver, tmp_path) as made:
        yield made


def wait_for(predicate: Any, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def labels(apiserver: Any, name: str) -> dict[str, str]:
    return dict(apiserver.core().read_node(name).metadata.labels or {})


def state(apiserver: Any, name: str) -> tuple[bool, dict[str, str]]:
    obj = apiserver.core().read_node(name)
    return bool(obj.spec.unschedulable), dict(obj.metadata.annotations or {})


def maintenance(
    apiserver: Any, node: dict[str, Any], *extra: str, ssh: sshd.Sshd | None = None,
    more: tuple[dict[str, Any], ...] = (),
) -> subprocess.CompletedProcess[str]:
    """The playbook on the node ``gpu``: local, or with ``ssh`` as on a fleet (over that
    sshd as its non-root user, root through sudo, interpreter discovery; the API calls on
    the controller, ``localhost``). ``more`` nodes: local hosts gpu2, gpu3, ... after it."""
    tmp = node["tmp"]
    inventory = tmp / "hosts.json"
    host = {"gpuk8s_node_name": node["name"], "gpuk8s_kubeconfig": apiserver.kubeconfig("admin"),
            "gpuk8s_gpu_root": str(node["root"])}
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    if ssh is None:
        others = {f"gpu{i}": {**local, "gpuk8s_node_name": other["name"],
                              "gpuk8s_gpu_root": str(other["root"]), "gpuk8s_api_host": "gpu",
                              "gpuk8s_kubeconfig": apiserver.kubeconfig("admin")}
                  for i, other in enumerate(more, start=2)}
        inventory.write_text(json.dumps({"all": {"children": {
            "kube_control_plane": {"hosts": {"gpu": {**local, **host, "gpuk8s_api_host": "gpu"}}},
            "gpu_nodes": {"hosts": {"gpu": {}, **others}}}}}))
    else:
        remote = json.loads(ssh.inventory((), host="gpu").read_text())["all"]["hosts"]["gpu"]
        inventory.write_text(json.dumps({"all": {"children": {
            "kube_control_plane": {"hosts": {"localhost": local}},
            "gpu_nodes": {"hosts": {"gpu": {**remote, **host, "gpuk8s_api_host": "localhost"}}}}}}))
    failing = tmp / "fail.yml"
    failing.write_text("---\n- name: The driver work fails\n  ansible.builtin.fail:\n"
                       "    msg: simulated failure of the maintenance action\n")
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "PATH": f"{BIN}:{os.environ['PATH']}"}
    return subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", str(inventory),
         str(REPO / "playbooks/maintenance.yml"),
         "-e", f"node_maintenance_action_tasks={failing}",
         "-e", f"node_maintenance_report_dir={tmp / 'reports'}",
         "-e", "node_maintenance_wait_retries=60", "-e", "node_maintenance_wait_delay=1",
         *extra],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False,
    )


def test_failure_with_healthy_gpus_gives_the_node_back(
    apiserver: Any, node: dict[str, Any]
) -> None:
    name = node["name"]
    run = maintenance(apiserver, node, "-e", "node_maintenance_action=tasks")
    assert run.returncode != 0, run.stdout[-3000:]
    assert "simulated failure of the maintenance action" in run.stdout
    assert "mark metax-tech.com/maintenance was removed" in run.stdout
    cordoned, annotations = state(apiserver, name)
    assert not cordoned
    assert MARK not in annotations and BEFORE not in annotations
    # gpu-label is no longer held back: the labels (which gpu-device follows) return
    wait_for(lambda: labels(apiserver, name).get("metax-tech.com/driver.ready") == "true",
             "labels back after the rescue")
    report = json.loads((node["tmp"] / "reports" / f"{name}.json").read_text())
    assert report["gpus_healthy"] is True and report["failed_step"] == "drained"


def test_rerun_after_a_failure_restores_the_node(apiserver: Any, node: dict[str, Any]) -> None:
    name = node["name"]
    root = str(node["root"])
    sim.fail(root, 3, "fault")
    failed = maintenance(apiserver, node, "-e", "node_maintenance_action=tasks")
    assert failed.returncode != 0
    assert "The GPUs are not healthy: the node stays cordoned" in failed.stdout
    cordoned, annotations = state(apiserver, name)
    assert cordoned and MARK in annotations
    assert json.loads(annotations[BEFORE]) == {"unschedulable": False, "gpus": 8}
    assert "metax-tech.com/gpu.installed" not in labels(apiserver, name)

    sim.heal(root, 3)
    rerun = maintenance(apiserver, node, "-e", "node_maintenance_action=none")
    assert rerun.returncode == 0, rerun.stdout[-4000:]
    cordoned, annotations = state(apiserver, name)
    assert not cordoned, "the rerun must give back the node as it was before the first try"
    assert MARK not in annotations and BEFORE not in annotations
    assert labels(apiserver, name).get("metax-tech.com/gpu.installed") == "true"


def test_a_node_cordoned_before_stays_cordoned(apiserver: Any, node: dict[str, Any]) -> None:
    name = node["name"]
    apiserver.core().patch_node(name, {"spec": {"unschedulable": True}})
    run = maintenance(apiserver, node, "-e", "node_maintenance_action=none")
    assert run.returncode == 0, run.stdout[-4000:]
    cordoned, annotations = state(apiserver, name)
    assert cordoned and MARK not in annotations


def gpu_pod(name: str, node: str, *, owner: bool = False, emptydir: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if owner:  # no controller-manager here: nothing garbage-collects it for a missing owner
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs",
                                    "uid": str(uuid.uuid4()), "controller": True}]
    spec: dict[str, Any] = {
        "nodeName": node,
        "containers": [{"name": "c", "image": "busybox",
                        "resources": {"limits": {"metax-tech.com/gpu": "1"}}}],
    }
    if emptydir:
        spec["volumes"] = [{"name": "scratch", "emptyDir": {}}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def evict(apiserver: Any, node: str, tmp: Path, **args: Any) -> dict[str, Any]:
    proc = subprocess.run(
        [str(BIN / "ansible"), "localhost", "-i", "localhost,", "-c", "local",
         "-e", f"ansible_python_interpreter={sys.executable}", "-m", "gpu_pod_eviction",
         "-a", json.dumps({"node": node, "kubeconfig": apiserver.kubeconfig("admin"),
                           "grace_period": 0, "timeout": 60, **args})],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
             "ANSIBLE_STDOUT_CALLBACK": "json", "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1"},
    )
    result: dict[str, Any] = json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]
    return result


def test_eviction_refuses_bare_and_emptydir_pods_like_kubectl_drain(
    apiserver: Any, node: dict[str, Any]
) -> None:
    name, core = node["name"], apiserver.core()
    ns = f"evict-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": ns}})
    # no controller-manager here to create it; the ServiceAccount admission wants it
    core.create_namespaced_service_account(ns, {"metadata": {"name": "default"}})
    try:
        for obj in (gpu_pod("managed", name, owner=True), gpu_pod("bare", name),
                    gpu_pod("scratch", name, owner=True, emptydir=True)):
            core.create_namespaced_pod(ns, obj)
        refused = evict(apiserver, name, node["tmp"])
        assert refused.get("failed"), refused
        assert f"declare no controller: {ns}/bare" in refused["msg"]
        assert f"local storage (emptyDir): {ns}/scratch" in refused["msg"]
        names = {p.metadata.name for p in core.list_namespaced_pod(ns).items}
        assert names == {"managed", "bare", "scratch"}, "nothing may be evicted"

        done = evict(apiserver, name, node["tmp"], force=True, delete_emptydir_data=True)
        assert not done.get("failed"), done
        assert sorted(done["pods"]) == [f"{ns}/bare", f"{ns}/managed", f"{ns}/scratch"]
        assert len(done["forced"]) == 2
        assert core.list_namespaced_pod(ns).items == []
    finally:
        core.delete_namespace(ns)


def driver_run(apiserver: Any, node: dict[str, Any], policy: str, *extra: str,
               ssh: sshd.Sshd | None = None, more: tuple[dict[str, Any], ...] = ()
               ) -> subprocess.CompletedProcess[str]:
    """The maintenance playbook's driver action towards 2.33.0.6 (the simulated node runs
    2.32.0.6), with the simulator's modprobe."""
    payload = node["tmp"] / "driver-2.33.0.6"
    if not payload.exists():
        sim.write_payload("driver", "2.33.0.6", str(payload))
    modprobe = [sys.executable, "{host_root}/usr/sbin/modprobe"]
    return maintenance(
        apiserver, node, "-e", "node_maintenance_action=driver",
        "-e", json.dumps({"node_maintenance_driver_version": "2.33.0.6",
                          "node_maintenance_driver_payload": str(payload),
                          "node_maintenance_driver_deploy_policy": policy,
                          "node_maintenance_driver_load_command": [*modprobe, "{module}"],
                          "node_maintenance_driver_unload_command": [*modprobe, "-r",
                                                                     "{module}"]}),
        *extra, ssh=ssh, more=more)


def recap(run: subprocess.CompletedProcess[str]) -> str:
    return next(line for line in run.stdout.splitlines() if line.startswith("gpu "))


@pytest.mark.parametrize("check", [False, True], ids=["apply", "check mode"])
def test_if_not_present_on_a_node_with_a_driver_leaves_the_node_alone(
    apiserver: Any, node: dict[str, Any], check: bool
) -> None:
    name = node["name"]
    run = driver_run(apiserver, node, "IfNotPresent", *(["--check"] if check else []))
    assert run.returncode == 0, run.stdout[-4000:]
    assert "changed=0" in recap(run), run.stdout[-4000:]
    assert "Nothing to do on " + name in run.stdout
    assert "IfNotPresent leaves it alone" in run.stdout
    assert "The node was neither cordoned nor drained" in run.stdout
    for step in ("Cordon the node", "Evict the pods that use GPUs", "Install or upgrade"):
        assert f"node_maintenance : {step}" not in run.stdout
    cordoned, annotations = state(apiserver, name)
    assert not cordoned and MARK not in annotations
    assert labels(apiserver, name).get("metax-tech.com/gpu.installed") == "true"
    assert discover(str(node["root"])).driver.version == "2.32.0.6"


def test_check_mode_of_an_upgrade_changes_nothing_and_waits_for_nothing(
    apiserver: Any, node: dict[str, Any]
) -> None:
    name = node["name"]
    run = driver_run(apiserver, node, "Always", "--check")
    assert run.returncode == 0, run.stdout[-4000:]
    assert "changed=0" not in recap(run)  # it would cordon, drain and upgrade
    cordoned, annotations = state(apiserver, name)
    assert not cordoned and MARK not in annotations
    assert discover(str(node["root"])).driver.version == "2.32.0.6"
    assert not (node["root"] / "var/lib/gpuk8s-sim/modprobe.log").exists()


def test_check_mode_predicts_the_tasks_the_upgrade_changes(
    apiserver: Any, node: dict[str, Any]
) -> None:
    """--check, then the real upgrade: the same tasks report changed (the cordon, the
    uncordon and the end of the mark included, which a check cannot do for real)."""
    check = driver_run(apiserver, node, "Always", "--check")
    assert check.returncode == 0, check.stdout[-4000:]
    real = driver_run(apiserver, node, "Always")
    assert real.returncode == 0, real.stdout[-4000:]
    predicted, done = changed_tasks(check.stdout), changed_tasks(real.stdout)
    assert sorted(predicted) == sorted(done), (predicted, done)
    for step in ("Cordon the node", "Uncordon the node (unless it was cordoned before)",
                 "End the maintenance mark", "Install or upgrade the driver"):
        assert f"node_maintenance : {step}" in done, done
    cordoned, annotations = state(apiserver, node["name"])
    assert not cordoned and MARK not in annotations
    assert discover(str(node["root"])).driver.version == "2.33.0.6"


def test_the_resolve_command_given_is_kmods_lookup_of_the_upgrade(
    apiserver: Any, node: dict[str, Any]
) -> None:
    """node_maintenance_driver_resolve_command reaches gpu_driver: the lookup is asked
    there (a wrapper that logs, then runs Debian's real modprobe on the root), and an
    upgrade that real kmod confirms is done."""
    log = node["tmp"] / "resolve.log"
    wrapper = node["tmp"] / "resolve"
    wrapper.write_text(f'#!/bin/sh\necho "$@" >> {log}\n'
                       'PATH="$PATH:/usr/sbin:/sbin" exec modprobe "$@"\n')
    wrapper.chmod(0o755)
    resolve = [str(wrapper), "--show-depends", "-d", "{host_root}", "-S", "{kernel_release}",
               "{module}"]
    run = driver_run(apiserver, node, "Always", "-e",
                     json.dumps({"node_maintenance_driver_resolve_command": resolve}))
    assert run.returncode == 0, run.stdout[-4000:]
    asked = log.read_text().splitlines() if log.exists() else []
    assert asked and all(line.split()[-1] == "metax" and str(node["root"]) in line
                         for line in asked), asked
    assert discover(str(node["root"])).driver.version == "2.33.0.6"


def test_an_upgrade_over_ssh_with_sudo_is_predicted_per_host_and_found_by_real_kmod(
    apiserver: Any, node: dict[str, Any]
) -> None:
    """As on a fleet: the node over a private sshd as a non-root user, root through real
    sudo; --check --diff, then the real upgrade: the tasks changed, per host, are the same
    (the node's, and the API calls it delegates to the controller). Real depmod wrote the
    indexes, and real kmod's lookup on the node's root names the new module."""
    why = sshd.missing()
    if why:
        pytest.skip(why)
    os.chmod(node["tmp"], 0o755)
    resolve = {"node_maintenance_driver_resolve_command": [
        "modprobe", "--show-depends", "-d", "{host_root}", "-S", "{kernel_release}", "{module}"]}
    with sshd.private_sshd() as server:
        check = driver_run(apiserver, node, "Always", "--check", "--diff", "-e",
                           json.dumps(resolve), ssh=server)
        assert check.returncode == 0, check.stdout[-4000:]
        real = driver_run(apiserver, node, "Always", "-e", json.dumps(resolve), ssh=server)
        assert real.returncode == 0, real.stdout[-4000:]
    predicted, done = changed_by_host(check.stdout), changed_by_host(real.stdout)
    assert predicted == done, (predicted, done)
    assert list(done) == ["gpu"] and "node_maintenance : Cordon the node" in done["gpu"], done
    cordoned, annotations = state(apiserver, node["name"])
    assert not cordoned and MARK not in annotations
    root = str(node["root"])
    release = (node["root"] / "proc/sys/kernel/osrelease").read_text().strip()
    shown = subprocess.run(["/usr/sbin/modprobe", "--show-depends", "-d", root, "-S", release,
                            "metax"], capture_output=True, text=True, check=True).stdout
    module = shown.split()[1]
    assert module == f"{root}/lib/modules/{release}/extra/metax.ko", shown
    assert subprocess.run(["/usr/sbin/modinfo", "-F", "version", module], capture_output=True,
                          text=True, check=True).stdout.strip() == "2.33.0.6"


def test_an_upgrade_of_two_nodes_takes_one_at_a_time(
    apiserver: Any, node: dict[str, Any]
) -> None:
    """serial 1, read from the nodes themselves (polled while the play runs): the second
    node is cordoned only after the first was given back, in inventory order."""
    with simulated_node(apiserver, node["tmp"] / "second") as second:
        seen: list[tuple[float, str, bool]] = []
        stop = threading.Event()

        def watch() -> None:
            core = apiserver.core()
            while not stop.is_set():
                for name in (node["name"], second["name"]):
                    cordoned = bool(core.read_node(name).spec.unschedulable)
                    seen.append((time.monotonic(), name, cordoned))
                time.sleep(0.1)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            run = driver_run(apiserver, node, "Always", more=(second,))
        finally:
            stop.set()
            watcher.join(10)
        assert run.returncode == 0, run.stdout[-4000:]
        for made in (node, second):
            assert discover(str(made["root"])).driver.version == "2.33.0.6"
            cordoned, annotations = state(apiserver, made["name"])
            assert not cordoned and MARK not in annotations
    spans = {}
    for name in (node["name"], second["name"]):
        times = [t for t, n, cordoned in seen if n == name and cordoned]
        assert times, f"{name} never seen cordoned"
        spans[name] = (min(times), max(times))
    assert spans[node["name"]][1] < spans[second["name"]][0], spans


class Killed(BaseException):
    """kill -9 between the load and the commit: nothing of the installer's runs after it."""


def test_an_upgrade_killed_before_its_commit_is_rolled_back_then_done(
    apiserver: Any, node: dict[str, Any]
) -> None:
    """What an operator uninstall during a driver upgrade can leave on a host:
    driver-manager gone with 2.33.0.6 loaded and nothing committed (the journal says what
    to undo). The playbook towards that very version does not take the node for done:
    its plan reports the install left behind, the run rolls it back (2.32.0.6 loads
    again), upgrades as usual and gives the node back."""
    from gpuk8s.discovery.tools import default_runner
    from gpuk8s.host import driver as drv

    name, root = node["name"], node["root"]
    payload = node["tmp"] / "driver-2.33.0.6"
    sim.write_payload("driver", "2.33.0.6", str(payload))
    modprobe = (sys.executable, "{host_root}/usr/sbin/modprobe")
    request = drv.InstallRequest(policy="Always", version="2.33.0.6", payload=str(payload),
                                 load_command=(*modprobe, "{module}"),
                                 unload_command=(*modprobe, "-r", "{module}"))

    def killed_at_commit(step: str) -> None:
        if step == "commit":
            raise Killed

    with pytest.raises(Killed):
        drv.converge(str(root), request, default_runner, killed_at_commit)
    assert discover(str(root)).driver.version == "2.33.0.6"
    assert drv.interrupted(str(root)) is not None

    run = driver_run(apiserver, node, "Always")
    assert run.returncode == 0, run.stdout[-4000:]
    assert "Nothing to do on " not in run.stdout
    said = run.stdout + run.stderr  # the module's warning: Ansible prints it on stderr
    assert "rolled back an interrupted driver install" in said, said[-4000:]
    assert drv.interrupted(str(root)) is None
    assert discover(str(root)).driver.version == "2.33.0.6"
    log = (root / "var/lib/gpuk8s-sim/modprobe.log").read_text().splitlines()
    assert log == ["unload metax", "load metax 2.33.0.6",  # the killed upgrade
                   "unload metax", "load metax 2.32.0.6",  # rolled back
                   "unload metax", "load metax 2.33.0.6"], log  # the playbook's upgrade
    cordoned, annotations = state(apiserver, name)
    assert not cordoned and MARK not in annotations
    wait_for(lambda: labels(apiserver, name).get("metax-tech.com/gpu.installed") == "true",
             "labels written again by gpu-label")


def test_vfnum_recreates_exactly_the_nodes_gpu_device_pods(apiserver: Any, tmp_path: Path) -> None:
    """playbooks/vfnum.yml (gpu_virtualization) finds the node's gpu-device pods with
    node_maintenance's lookup (tasks/device_pods.yml, the one both roles use) and deletes
    those alone: not another node's gpu-device pod, not another pod on the node."""
    core = apiserver.core()
    node, other = f"vf-{uuid.uuid4().hex[:6]}", f"vf-{uuid.uuid4().hex[:6]}"
    device = {"app.kubernetes.io/name": "gpu-device"}
    pods = {"here": (node, device), "there": (other, device), "app": (node, {})}
    names = {key: f"{key}-{node}" for key in pods}
    for key, (on, labels_) in pods.items():
        pod = gpu_pod(names[key], on)
        pod["metadata"]["labels"] = labels_
        core.create_namespaced_pod("default", pod)
    root = tmp_path / "sim"
    sim.create(str(root), "c500-8")
    inventory = tmp_path / "hosts.json"
    inventory.write_text(json.dumps({"all": {"children": {"gpu_nodes": {"hosts": {"gpu": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable,
        "gpuk8s_node_name": node, "gpuk8s_api_host": "gpu",
        "gpuk8s_kubeconfig": apiserver.kubeconfig("admin")}}}}}}))
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "PATH": f"{BIN}:{os.environ['PATH']}"}
    try:
        run = subprocess.run(
            [str(BIN / "ansible-playbook"), "-i", str(inventory),
             str(REPO / "playbooks/vfnum.yml"), "-e", "gpu_virtualization_vfnum=4",
             "-e", f"gpu_virtualization_host_root={root}", "-e", "gpu_virtualization_wait=false",
             "-e", "gpu_virtualization_restart_device_plugin=true"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
        assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
        deleted = {}
        for key, name in names.items():
            # a pod bound to a node is only marked for deletion: no kubelet here confirms it
            pod = core.read_namespaced_pod(name, "default")
            deleted[key] = pod.metadata.deletion_timestamp is not None
        assert deleted == {"here": True, "there": False, "app": False}
    finally:
        for name in names.values():
            core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
