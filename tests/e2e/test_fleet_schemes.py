"""Both MetaX schemes at once on the fleet (issue 49, item 4), driven over SSH as an
administrator runs it: install.yml without gpuk8s_scheme installs the GPU Extensions scheme
on the inventory's gpu_extensions_nodes (gpu-ext, gpu-vf) and the GPU Operator scheme on
gpu_operator_nodes (gpu-op and gpu-op2, driverless: the operator's driver-manager installs
its driver into each node's simulated host tree), each release confined to its group by the
gpuk8s.io/scheme label (playbooks/vars/schemes.yml); gpu-nv (NVIDIA) and cp2 are left to
nobody. verify.yml over SSH passes on every GPU node of both groups, each node judged by
its own scheme.

Day 2 of the operator scheme, on the same install (docs/operator.md "Rolling driver
/ VF upgrades (day 2)"; deployPolicy Always, driver.upgradePolicy maxParallel 1): a GPU pod runs on
gpu-ext, then `helm upgrade` of the operator release to a second good payload (NEXT, which
images/build.sh payloads builds): the operator nodes are upgraded one at a time (every
state of both Nodes the API server reported during the roll, in order: never both cordoned,
never both without GPUs; the controller's Started/Done Events do not overlap), each ends on
NEXT (Version.txt, the loaded module, kmod's module file by modinfo), advertises its 8 GPUs
again, uncordoned, and the pod on gpu-ext is the same pod, never restarted. Then on gpu-op
(the first in name order): a PodDisruptionBudget that forbids evicting its GPU pod fails the
drain (Event naming the budget, uncordoned, nothing changed); without it a retry reaches the
bad payload (image BAD holds DRIVER): failed, cordoned, an Event naming the cause, host
unchanged; withdrawing that target validates and uncordons it. gpu-op2 is never touched
while gpu-op fails (a failure pauses the rollout).

Then uninstall.yml: no release, pod, label, annotation, wrapper or CDI spec of ours on any
node, each node's containerd config byte for byte as found, its CRI serving. This is the
tier's one install and uninstall over SSH that is asserted for itself (test_fleet_ops.py
holds the helpers and the one-scheme install the other fleet modules use).

One install is shared by the module (two releases, e2e-fleet-ext and e2e-fleet-op: names the
session fixture ``releases_set_aside`` treats as the tier's own). The component images are
those lab/up built (test_fleet_ops.IMAGES), or, with $GPUK8S_E2E_IMAGE_TAG set, the ones a
checkout built with `IMAGE_VERSION=<tag> images/build.sh components` into its build/images
(a tag of its own, pulled Always: the nodes' image caches keep other checkouts' tags)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
import yaml

from .conftest import (
    FLEET_MARKS,
    HELM,
    KUBECONFIG,
    LAB,
    REGISTRY,
    REPO,
    apply,
    kubectl,
    kubectl_json,
    run,
    tool,
    wait_until,
)
from .test_fleet_maint import deployment, node_states, restarts, running_pod
from .test_fleet_ops import (  # noqa: F401 (both_schedulers: a fixture used below)
    EXTRA_VARS,
    FLEET_NODES,
    FLEET_TAINT,
    IMAGES,
    OPERATOR_NODES,
    both_schedulers,
    containerd_config_hash,
    node_exec,
    nodes,
    our_labels,
    package_charts,
    playbook,
    restore_labels,
)

pytestmark = FLEET_MARKS

P = "metax-tech.com/"
SCHEME = "gpuk8s.io/scheme"
EXT, OP = ("e2e-fleet-ext", "metax-gpu-extensions"), ("e2e-fleet-op", "metax-operator")
DRIVER, SDK = "2.33.0.6", "2.33.0.4"
# images/build.sh payloads: a newer good driver, and a tag whose image holds DRIVER
NEXT, BAD = "2.35.0.6", "2.34.0.1"
STATE_LABEL = P + "driver.upgrade-state"
WORK = "e2e-fleet-roll"  # the upgrade tests' GPU pods
SIM = "/var/lib/gpuk8s-lab/simroot"
CDI_SPEC = "/etc/cdi/metax-tech.com-gpu.json"
WRAPPER = "/usr/local/gpuk8s/bin/gpuk8s-oci-runtime"
# the payload images are no components (push_artifacts.yml pushes those to the module's
# project): they stay where lab/up's `images/build.sh payloads` pushed them
PAYLOADS = f"{REGISTRY}/gpuk8s"
# test_fleet_ops' variables (the lab registry, helm, artifacts) less its one-scheme choice:
# the inventory's groups decide
BASE = {k: v for k, v in EXTRA_VARS.items()
        if k not in ("gpuk8s_scheme", "gpu_extensions_gpu_node_selector",
                     "gpu_extensions_min_gpu_nodes")}
VARS: dict[str, Any] = {
    **BASE,
    "gpu_extensions_release_name": EXT[0],
    "gpu_operator_release_name": OP[0],
    "gpu_operator_plain_http": True,
    "gpu_operator_driver_version": DRIVER,
    # a new payload.version reaches nodes with a driver loaded (the rolling upgrade)
    "gpu_operator_driver_deploy_policy": "Always",
    "gpu_operator_maca_images": [f"maca-c500:{SDK}-ubuntu22.04-amd64"],
    # the simulator's stand-ins for modprobe and depmod (inventories/lab's operator values)
    "gpu_operator_values": {"tolerations": [FLEET_TAINT], "maca": {"payload": {
        "registry": PAYLOADS}}, "driver": {
        "payload": {"registry": PAYLOADS},
        # the chart's maxParallel 1, maxUnavailable 25% (of two nodes: one); failures soon
        "upgradePolicy": {"drainTimeoutSeconds": 10, "upgradeTimeoutSeconds": 120},
        "extraArgs": [
        "--load-command={host_root}/usr/sbin/modprobe {module}",
        "--unload-command={host_root}/usr/sbin/modprobe -r {module}",
        "--depmod-command={host_root}/usr/sbin/depmod -a -b {host_root} {kernel_release}",
        "--vf-command={host_root}/opt/mxdriver/bin/mx-smi vm --enable-vf {vfnum} -i {index}",
    ]}},
}
UNTOUCHED = ("cp2", "gpu-nv")
TAG = os.environ.get("GPUK8S_E2E_IMAGE_TAG", "")
if TAG:
    for _scheme in ("gpu_extensions", "gpu_operator"):
        VARS[f"{_scheme}_pull_policy"] = "Always"
        VARS[f"{_scheme}_values"] = {**VARS.get(f"{_scheme}_values", {}), "imageTag": TAG}


def release_pods(release: tuple[str, str], agents: bool = False) -> dict[str, set[str]]:
    """component -> nodes its pods run on; with ``agents``, the node agents' pods only
    (those of a DaemonSet: a Deployment's pod, gpu-aware or operator-controller, is a
    cluster service that the scheduler may place on any node it tolerates)."""
    pods = kubectl_json("-n", release[1], "get", "pods", "-l",
                        "app.kubernetes.io/instance=" + release[0])["items"]
    out: dict[str, set[str]] = {}
    for p in pods:
        owners = {o.get("kind") for o in p["metadata"].get("ownerReferences", [])}
        if agents and "DaemonSet" not in owners:
            continue
        name = p["metadata"]["labels"].get("app.kubernetes.io/name", "")
        out.setdefault(name, set()).add(p["spec"].get("nodeName") or "")
    return out


def exists_on(node: str, path: str) -> bool:
    return run(str(LAB / "fleetctl"), "exec", node, "test", "-e", path, check=False,
               timeout=60).returncode == 0


def bare_again(node: str) -> None:
    """The node's simulated host tree as lab/fleetctl made it (its preset: nodriver-8 on
    gpu-op), so the driver the operator installed does not outlive the module (the
    uninstall leaves an installed driver in place, docs/operator.md "Uninstall")."""
    preset = node_exec(node, "cat", "/var/lib/gpuk8s-lab/sim-preset").strip()
    node_exec(node, tool("gpuk8s"), "sim", "create", "--preset", preset, "--root", SIM,
              "--device-nodes", "char", "--force")


@pytest.fixture(scope="module")
def before(both_schedulers: None) -> dict[str, Any]:  # noqa: F811
    assert IMAGES.is_dir(), f"{IMAGES} missing: lab/up builds the images"
    found = nodes()
    return {"containerd": {n: containerd_config_hash(n) for n in FLEET_NODES},
            "labels": {n: our_labels(found[n]) for n in FLEET_NODES},
            "annotations": {n: {k: v for k, v in (found[n]["metadata"].get("annotations")
                                                  or {}).items() if k.startswith(P)}
                            for n in UNTOUCHED},
            "files": {n: {f for f in (CDI_SPEC, WRAPPER) if exists_on(n, f)}
                      for n in FLEET_NODES},
            "op_bare": {n: not exists_on(n, f"{SIM}/opt/mxdriver") for n in OPERATOR_NODES},
            "cordoned": {n: bool(found[n]["spec"].get("unschedulable")) for n in OPERATOR_NODES}}


@pytest.fixture(scope="module")
def installed(before: dict[str, Any]) -> Iterator[dict[str, Any]]:
    package_charts()
    playbook("push_artifacts", base=VARS)
    state = {"uninstalled": False}
    try:
        playbook("install", base=VARS)
        yield state
    finally:
        try:
            if not state["uninstalled"]:
                playbook("uninstall", base=VARS)
        finally:
            restore_labels(before["labels"])
            for name in OPERATOR_NODES:
                if not before["cordoned"][name]:  # a failed upgrade test may leave it cordoned
                    kubectl("uncordon", name, check=False)
                if before["op_bare"][name]:
                    bare_again(name)


def test_1_each_scheme_serves_its_group_and_nothing_else(
    installed: dict[str, Any], before: dict[str, Any]
) -> None:
    found = nodes()
    # the extensions release: gpu-ext and gpu-vf, their GPUs advertised
    for name, gpus in (("gpu-ext", 8), ("gpu-vf", 32)):
        labels = found[name]["metadata"]["labels"]
        assert labels[SCHEME] == "extensions", name
        assert found[name]["status"]["allocatable"].get(P + "gpu") == str(gpus), name
        assert labels[P + "gpu.product"] == "C500" and labels[P + "driver.ready"] == "true"
    assert found["gpu-vf"]["metadata"]["labels"][P + "gpu.sriov"] == "on"
    # the operator release: gpu-op and gpu-op2, their driver installed by driver-manager,
    # their GPUs advertised
    for name in OPERATOR_NODES:
        op = found[name]["metadata"]["labels"]
        assert op[SCHEME] == "operator", name
        assert found[name]["status"]["allocatable"].get(P + "gpu") == "8", name
        assert op[P + "gpu.driver.mode"] == "cloud" and op[P + "runtime.ready"] == "true"
        assert driver_files(name) == DRIVER, name
    # each release's node agents on its own group only
    ext_pods, op_pods = release_pods(EXT), release_pods(OP)
    assert ext_pods["gpu-device"] == ext_pods["gpu-label"] == {"gpu-ext", "gpu-vf"}, ext_pods
    agents = {c: n for c, n in op_pods.items() if c not in ("operator-controller",)}
    assert agents and all(n == set(OPERATOR_NODES) for n in agents.values()), op_pods
    # operator-controller sees its group only
    def status() -> dict[str, str]:
        data: dict[str, str] = kubectl_json("get", "configmap", "operator-status", "-n",
                                            OP[1])["data"]
        return data if data.get("summary") == "2/2 GPU node(s) ready" else {}

    assert set(yaml.safe_load(wait_until("operator-status: 2/2", status, 60)["nodes"])) == set(
        OPERATOR_NODES)
    # the NVIDIA node and the second control plane: nothing of MetaX's added
    node_agents = {release[0]: release_pods(release, agents=True) for release in (EXT, OP)}
    for name in UNTOUCHED:
        assert SCHEME not in found[name]["metadata"]["labels"], name
        assert our_labels(found[name]) == before["labels"][name], name
        assert not any(name in n for pods in node_agents.values() for n in pods.values()), (
            name, node_agents, ext_pods, op_pods)


def test_2_verify_playbook_passes_over_ssh_on_both_schemes_nodes(
    installed: dict[str, Any]
) -> None:
    # verify.yml compares each GPU node's labels and allocatable with what the modules read
    # on the node itself over SSH, each node by its own scheme (gpu-op's driver mode is the
    # operator's cloud): a mismatch fails the run (run() raises)
    playbook("verify", base=VARS)


def driver_files(node: str) -> str:
    """The driver version of the node's host files (opt/mxdriver/Version.txt)."""
    return node_exec(node, "cat", f"{SIM}/opt/mxdriver/Version.txt").strip().split(":", 1)[1]


def driver_everywhere(node: str) -> tuple[str, str, str]:
    """(Version.txt, the loaded module's version, real modinfo's version of the module file
    driver-manager installed into the node's simulated root)."""
    release = node_exec(node, "cat", f"{SIM}/proc/sys/kernel/osrelease").strip()
    module = f"{SIM}/lib/modules/{release}/extra/metax.ko"
    return (driver_files(node), node_exec(node, "cat", f"{SIM}/sys/module/metax/version").strip(),
            node_exec(node, "modinfo", "-F", "version", module).strip())


def upgrade_state(node: str) -> str | None:
    return nodes()[node]["metadata"]["labels"].get(STATE_LABEL)


def upgrade_record(node: str) -> dict[str, Any]:
    notes = nodes()[node]["metadata"].get("annotations") or {}
    return dict(json.loads(notes.get(P + "driver.upgrade") or "{}"))


def cordoned(node: str) -> bool:
    return bool(nodes()[node]["spec"].get("unschedulable"))


def gpus(node: str) -> int:
    return int(nodes()[node]["status"].get("allocatable", {}).get(P + "gpu", "0"))


def stamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def node_events(node: str, reason: str, since: float = 0.0) -> list[tuple[float, str]]:
    """(time, message) of the Events of ``reason`` on Node ``node`` since ``since``, oldest
    first (operator-controller's, in the default namespace)."""
    items = kubectl_json("get", "events", "-n", "default", "--field-selector",
                         f"involvedObject.name={node},reason={reason}")["items"]
    found = [(stamp(e.get("lastTimestamp") or e.get("eventTime")
                    or e["metadata"]["creationTimestamp"]), e["message"]) for e in items]
    return sorted(f for f in found if f[0] >= since)


def waiting(node: str) -> bool:
    """Not taken by the rollout: done, or waiting for its turn (work is due); uncordoned."""
    return upgrade_state(node) in ("done", "upgrade-required") and not cordoned(node)


def set_operator(**values: str) -> None:
    """`helm upgrade --reuse-values --set K=V...` of the operator release, no --wait: its
    driver-manager pods are replaced by the rollout (docs/operator.md)."""
    run(HELM, "--kubeconfig", KUBECONFIG, "upgrade", OP[0], str(REPO / "charts" / OP[1]),
        "-n", OP[1], "--reuse-values",
        *(a for k, v in values.items() for a in ("--set", f"{k}={v}")), timeout=300)


def now_on_server() -> float:
    """The API server's clock, to the second (what Event times are written in)."""
    return datetime.now().timestamp() - 1


@pytest.fixture(scope="module")
def keeper(installed: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """A GPU pod on gpu-ext (the extensions release) that must outlive every operator test,
    and the namespace of the upgrade tests' pods (deleted after, and by test 6)."""
    kubectl("create", "namespace", WORK, check=False)
    try:
        apply(deployment(WORK, "keep", ["gpu-ext"], "gpu-ext"))
        pod = wait_until("the GPU pod on gpu-ext Running", lambda: running_pod(WORK, "keep"), 180)
        yield {"uid": pod["metadata"]["uid"]}
    finally:
        kubectl("delete", "namespace", WORK, "--wait=true", "--timeout=180s", check=False)


def kept(keeper: dict[str, Any]) -> None:
    pod = running_pod(WORK, "keep")
    assert (pod["metadata"]["uid"], pod["spec"]["nodeName"], restarts(pod)) == (
        keeper["uid"], "gpu-ext", 0)


def test_3_a_rolling_upgrade_takes_the_operator_nodes_one_at_a_time(
    keeper: dict[str, Any]
) -> None:
    for name in OPERATOR_NODES:
        assert driver_everywhere(name) == (DRIVER,) * 3 and gpus(name) == 8, name
    since = now_on_server()
    with node_states("gpu-op") as first, node_states("gpu-op2") as second:
        set_operator(**{"driver.payload.version": NEXT})

        def rolled() -> bool:
            found = nodes()
            return all(found[n]["metadata"]["labels"].get(STATE_LABEL) == "done"
                       and not found[n]["spec"].get("unschedulable")
                       and found[n]["status"]["allocatable"].get(P + "gpu") == "8"
                       for n in OPERATOR_NODES) and all(
                           driver_files(n) == NEXT for n in OPERATOR_NODES)

        wait_until("both operator nodes on NEXT, uncordoned, 8 GPUs", rolled, 600, interval=2)
    # Every state the API server reported, both Nodes in its order (resourceVersion: etcd's
    # one revision counter), replayed: never both cordoned, never both without GPUs.
    history = sorted([s for s in first + second],
                     key=lambda s: int(s["metadata"]["resourceVersion"]))
    now: dict[str, dict[str, Any]] = {}
    down: dict[str, list[int]] = {n: [] for n in OPERATOR_NODES}
    for step, state in enumerate(history):
        name = state["metadata"]["name"]
        now[name] = {"cordoned": bool(state["spec"].get("unschedulable")),
                     "gpus": int(state["status"].get("allocatable", {}).get(P + "gpu", "0"))}
        if now[name]["cordoned"] or not now[name]["gpus"]:
            down[name].append(step)
        assert not (len(now) == 2 and all(v["cordoned"] for v in now.values())), (step, now)
        assert not (len(now) == 2 and not any(v["gpus"] for v in now.values())), (step, now)
    # each node was taken down (cordoned: the drain) and back, one after the other
    assert all(down.values()), down
    spans = sorted((min(d), max(d)) for d in down.values())
    assert spans[0][1] < spans[1][0], (spans, down)
    # operator-controller's own account: one node started, done, then the other
    started = {n: node_events(n, "DriverUpgradeStarted", since) for n in OPERATOR_NODES}
    done = {n: node_events(n, "DriverUpgradeDone", since) for n in OPERATOR_NODES}
    assert all(len(started[n]) == 1 and len(done[n]) == 1 for n in OPERATOR_NODES), (
        started, done)
    order = sorted(OPERATOR_NODES, key=lambda n: started[n][0][0])
    assert done[order[0]][0][0] <= started[order[1]][0][0], (started, done)
    for name in OPERATOR_NODES:
        assert driver_everywhere(name) == (NEXT,) * 3, name
        assert nodes()[name]["metadata"]["labels"][P + "gpu.driver.minor"] == "35", name
    # and its metrics (the health port, through the API server's pod proxy)
    pod = kubectl_json("get", "pods", "-n", OP[1], "-l", "app.kubernetes.io/instance="
                       f"{OP[0]},app.kubernetes.io/name=operator-controller")["items"][0]
    metrics = kubectl("get", "--raw", f"/api/v1/namespaces/{OP[1]}/pods/"
                      f"{pod['metadata']['name']}:8094/proxy/metrics")
    assert 'operator_driver_upgrade_duration_seconds_count{result="done"} 2.0' in metrics
    kept(keeper)


def test_4_a_pdb_that_blocks_the_drain_fails_it_and_changes_nothing(
    keeper: dict[str, Any]
) -> None:
    # a GPU pod on gpu-op, the first node the rollout takes (name order), that no eviction
    # may take away
    apply(deployment(WORK, "train", ["gpu-op"], "gpu-op"))
    uid = wait_until("the GPU pod on gpu-op Running",
                     lambda: running_pod(WORK, "train"), 180)["metadata"]["uid"]
    apply({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
           "metadata": {"name": "train", "namespace": WORK},
           "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "train"}}}})
    wait_until("the PodDisruptionBudget observed", lambda: kubectl_json(
        "get", "pdb", "train", "-n", WORK).get("status", {}).get("expectedPods") == 1, 60)
    since = now_on_server()
    set_operator(**{"driver.payload.version": BAD})
    wait_until("gpu-op's drain failed", lambda: upgrade_state("gpu-op") == "failed", 240,
               interval=1)
    message = upgrade_record("gpu-op")["message"]
    assert "drain timed out" in message and "PodDisruptionBudget" in message, message
    events = node_events("gpu-op", "DriverUpgradeDrainFailed", since)
    assert events and "nothing was changed on the host" in events[-1][1], events
    assert not cordoned("gpu-op")  # healthy: not left cordoned
    assert driver_everywhere("gpu-op") == (NEXT,) * 3
    assert running_pod(WORK, "train")["metadata"]["uid"] == uid  # never touched
    # the failure paused the rollout: gpu-op2 was not started
    assert waiting("gpu-op2")
    assert not node_events("gpu-op2", "DriverUpgradeStarted", since)
    assert driver_files("gpu-op2") == NEXT
    kubectl("delete", "pdb", "train", "-n", WORK)
    kept(keeper)


def test_5_a_bad_payload_fails_cordoned_with_an_event(keeper: dict[str, Any]) -> None:
    # this drain must succeed: test 4's GPU pod on gpu-op is evicted now, and on a loaded
    # machine its termination outlasts the 10 s that make test 4's blocked drain fail soon
    # (a clean room's drain failed "GPU pods did not terminate" after 10 s, and the payload
    # was never tried)
    set_operator(**{"driver.upgradePolicy.drainTimeoutSeconds": "120"})
    since = now_on_server()
    kubectl("label", "node", "gpu-op", f"{STATE_LABEL}=upgrade-required", "--overwrite")
    wait_until("gpu-op's upgrade failed in driver-manager", lambda: (
        upgrade_state("gpu-op") == "failed"
        and "driver-manager" in upgrade_record("gpu-op").get("message", "")), 300, interval=1)
    message = upgrade_record("gpu-op")["message"]
    # the image tagged BAD holds DRIVER
    assert f"holds driver {DRIVER}" in message and "stays cordoned" in message, message
    assert cordoned("gpu-op")
    events = node_events("gpu-op", "DriverUpgradeFailed", since)
    assert any(f"holds driver {DRIVER}" in m for _, m in events), events
    assert driver_everywhere("gpu-op") == (NEXT,) * 3  # nothing changed on the host
    assert waiting("gpu-op2")
    assert not node_events("gpu-op2", "DriverUpgradeStarted", since)
    kept(keeper)


def test_6_withdrawing_the_bad_target_validates_and_uncordons(keeper: dict[str, Any]) -> None:
    set_operator(**{"driver.payload.version": NEXT})
    wait_until("gpu-op done again", lambda: upgrade_state("gpu-op") == "done", 300, interval=1)
    assert not cordoned("gpu-op")
    for name in OPERATOR_NODES:
        wait_until(f"{name}: 8 GPUs", lambda n=name: gpus(n) == 8, 120)
        assert driver_everywhere(name) == (NEXT,) * 3 and not cordoned(name), name
    back = wait_until("the GPU pod on gpu-op Running again",
                      lambda: running_pod(WORK, "train"), 180)
    assert back["spec"]["nodeName"] == "gpu-op"
    kept(keeper)
    kubectl("delete", "namespace", WORK, "--wait=true", "--timeout=180s")


def test_7_uninstall_leaves_every_node_as_found(
    installed: dict[str, Any], before: dict[str, Any]
) -> None:
    playbook("uninstall", base=VARS)
    installed["uninstalled"] = True
    for release, namespace in (EXT, OP):
        # every state helm 3 and 4 list (helm 4 has no --all)
        out = run(HELM, "--kubeconfig", KUBECONFIG, "list", "-n", namespace, "-q",
                  *(f"--{s}" for s in ("deployed", "failed", "pending", "superseded",
                                       "uninstalling", "uninstalled"))).stdout
        assert release not in out.split(), release
        assert release_pods((release, namespace)) == {}, release
    found = nodes()
    for name in FLEET_NODES:
        meta = found[name]["metadata"]
        assert SCHEME not in meta["labels"], name
        assert containerd_config_hash(name) == before["containerd"][name], name
        assert "Server:" in node_exec(name, "ctr", "version"), name  # its CRI serves
        assert {f for f in (CDI_SPEC, WRAPPER) if exists_on(name, f)} == before["files"][name]
    for name in ("gpu-ext", "gpu-vf", *OPERATOR_NODES):  # the schemes' nodes: nothing of ours
        meta = found[name]["metadata"]
        assert [k for k in meta["labels"] if k.startswith(P)] == [], name
        assert [k for k in meta.get("annotations") or {} if k.startswith(P)] == [], name
    for name in UNTOUCHED:
        meta = found[name]["metadata"]
        assert our_labels(found[name]) == before["labels"][name], name
        assert {k: v for k, v in (meta.get("annotations") or {}).items()
                if k.startswith(P)} == before["annotations"][name], name
