"""Both MetaX schemes at once on the fleet (issue 49, item 4), driven over SSH as an
administrator runs it: install.yml without gpuk8s_scheme installs the GPU Extensions scheme
on the inventory's gpu_extensions_nodes (gpu-ext, gpu-vf) and the GPU Operator scheme on
gpu_operator_nodes (gpu-op, driverless: the operator's driver-manager installs its driver
into the node's simulated host tree), each release confined to its group by the
gpuk8s.io/scheme label (playbooks/vars/schemes.yml); gpu-nv (NVIDIA) and cp2 are left to
nobody. verify.yml over SSH passes on every GPU node of both groups, each node judged by
its own scheme. Then uninstall.yml: no release, pod, label, annotation, wrapper or CDI spec
of ours on any node, each node's containerd config byte for byte as found, its CRI serving.
This is the tier's one install and uninstall over SSH that is asserted for itself
(test_fleet_ops.py holds the helpers and the one-scheme install the other fleet modules use).

One install is shared by the module (two releases, e2e-fleet-ext and e2e-fleet-op: names the
session fixture ``releases_set_aside`` treats as the tier's own). The component images are
those lab/up built (test_fleet_ops.IMAGES), or, with $GPUK8S_E2E_IMAGE_TAG set, the ones a
checkout built with `IMAGE_VERSION=<tag> images/build.sh components` into its build/images
(a tag of its own, pulled Always: the nodes' image caches keep other checkouts' tags)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from .conftest import (
    FLEET_MARKS,
    HELM,
    KUBECONFIG,
    LAB,
    REGISTRY,
    kubectl_json,
    run,
    tool,
    wait_until,
)
from .test_fleet_ops import (  # noqa: F401 (both_schedulers: a fixture used below)
    EXTRA_VARS,
    FLEET_NODES,
    FLEET_TAINT,
    IMAGES,
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
    "gpu_operator_maca_images": [f"maca-c500:{SDK}-ubuntu22.04-amd64"],
    # the simulator's stand-ins for modprobe and depmod (inventories/lab's operator values)
    "gpu_operator_values": {"tolerations": [FLEET_TAINT], "maca": {"payload": {
        "registry": PAYLOADS}}, "driver": {"payload": {"registry": PAYLOADS}, "extraArgs": [
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
            "op_bare": not exists_on("gpu-op", f"{SIM}/opt/mxdriver")}


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
            if before["op_bare"]:
                bare_again("gpu-op")


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
    # the operator release: gpu-op, its driver installed by driver-manager, its GPUs advertised
    op = found["gpu-op"]["metadata"]["labels"]
    assert op[SCHEME] == "operator"
    assert found["gpu-op"]["status"]["allocatable"].get(P + "gpu") == "8"
    assert op[P + "gpu.driver.mode"] == "cloud" and op[P + "runtime.ready"] == "true"
    assert node_exec("gpu-op", "cat", f"{SIM}/opt/mxdriver/Version.txt").strip() == (
        f"Version:{DRIVER}")
    # each release's node agents on its own group only
    ext_pods, op_pods = release_pods(EXT), release_pods(OP)
    assert ext_pods["gpu-device"] == ext_pods["gpu-label"] == {"gpu-ext", "gpu-vf"}, ext_pods
    agents = {c: n for c, n in op_pods.items() if c not in ("operator-controller",)}
    assert agents and all(n == {"gpu-op"} for n in agents.values()), op_pods
    # operator-controller sees its group only
    def status() -> dict[str, str]:
        data: dict[str, str] = kubectl_json("get", "configmap", "operator-status", "-n",
                                            OP[1])["data"]
        return data if data.get("summary") == "1/1 GPU node(s) ready" else {}

    assert set(yaml.safe_load(wait_until("operator-status: 1/1", status, 60)["nodes"])) == {
        "gpu-op"}
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


def test_3_uninstall_leaves_every_node_as_found(
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
    for name in ("gpu-ext", "gpu-vf", "gpu-op"):  # the schemes' nodes: nothing of ours
        meta = found[name]["metadata"]
        assert [k for k in meta["labels"] if k.startswith(P)] == [], name
        assert [k for k in meta.get("annotations") or {} if k.startswith(P)] == [], name
    for name in UNTOUCHED:
        meta = found[name]["metadata"]
        assert our_labels(found[name]) == before["labels"][name], name
        assert {k: v for k, v in (meta.get("annotations") or {}).items()
                if k.startswith(P)} == before["annotations"][name], name
