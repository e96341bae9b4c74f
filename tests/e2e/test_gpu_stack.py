"""The GPU stack on the lab (issue 7, tests 1-7): our images, our chart, the real kubelet.

Order matters inside this module (one install shared by the tests, torn down at the end).
The chart is installed with helm straight from the checkout (test 1 again through the
install playbook when it exists); the lab points the node agents at the simulator root.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from .conftest import (
    BUSYBOX,
    HELM,
    KUBECONFIG,
    KUBECTL,
    LAB,
    REGISTRY,
    REPO,
    SIM_ROOT,
    apply,
    kubectl,
    kubectl_json,
    pod_phase,
    requires_paths,
    run,
    wait_until,
)

pytestmark = [pytest.mark.e2e, requires_paths("charts/metax-gpu-extensions")]

NS = "metax-gpu-extensions"
RELEASE = "e2e"
RESOURCE = "metax-tech.com/gpu"
IMAGE_REGISTRY = f"{REGISTRY}/gpuk8s"
HEALTHY_INTERVAL = 5
SPEC4_LABELS = (
    "gpu.installed",
    "driver.ready",
    "gpu.driver.major",
    "gpu.driver.minor",
    "gpu.driver.patch",
    "gpu.driver.mode",
    "gpu.family",
    "gpu.memory",
    "gpu.product",
    "gpu.sriov",
    "gpu.vfnum",
)


def gpuk8s(*args: str) -> str:
    venv = run(str(LAB / "pyenv.sh")).stdout.strip()
    return run(f"{venv}/bin/gpuk8s", *args).stdout


def sim_state() -> dict:
    return json.loads(gpuk8s("sim", "show", "--root", str(SIM_ROOT), "--json"))


def helm(*args: str, timeout: float = 600) -> str:
    return run(HELM, "--kubeconfig", KUBECONFIG, *args, timeout=timeout).stdout


def gpu(node: str, field: str = "allocatable") -> int:
    value = kubectl(
        "get", "node", node, "-o", "jsonpath={.status." + field + ".metax-tech\\.com/gpu}"
    )
    return int(value or 0)


@pytest.fixture(scope="module")
def installed(lab: dict[str, str]) -> Iterator[dict[str, str]]:
    """metax-gpu-extensions from the checkout, images from the local registry."""
    helm(
        "upgrade",
        "--install",
        RELEASE,
        str(REPO / "charts" / "metax-gpu-extensions"),
        "-n",
        NS,
        "--create-namespace",
        "--wait",
        "--timeout",
        "5m",
        "--set",
        f"registry={IMAGE_REGISTRY}",
        "--set",
        f"hostPaths.root={SIM_ROOT}",
        # the node agents see only a few host paths: the simulated mx-smi's state too
        "--set",
        "hostPaths.extraReadPaths={/var/lib/gpuk8s-sim}",
        "--set",
        f"gpuDevice.healthyInterval={HEALTHY_INTERVAL}",
        "--set",
        f"gpuDevice.extraArgs={{--device-path-prefix={SIM_ROOT}}}",
        # gpu-aware too (kube-scheduler is not pointed at it here): its non-root pod and
        # the log-dir init container run on the real node, and its RBAC is in the matrix
        "--set",
        "deployExtenderGPUAware=true",
    )
    try:
        yield lab
    finally:
        run(str(LAB / "fake-nodes"), "0", check=False, timeout=300)
        helm("uninstall", RELEASE, "-n", NS, "--wait", "--timeout", "3m")
        # `helm uninstall --wait` returns once the DaemonSets are gone; their pods are
        # deleted by the garbage collector right after (background cascade): allow that.
        wait_until(
            "nothing left after helm uninstall",
            lambda: kubectl("get", "all", "-n", NS, "-o", "name", check=False).strip() == "",
            60,
        )


def test_1_chart_registers_gpus_and_labels(installed: dict[str, str]) -> None:
    node = installed["node"]
    wait_until("capacity 8", lambda: gpu(node, "capacity") == 8, 120)
    wait_until("allocatable 8", lambda: gpu(node) == 8, 60)
    labels = kubectl_json("get", "node", node)["metadata"]["labels"]
    for key in SPEC4_LABELS:
        assert f"metax-tech.com/{key}" in labels, key
    assert labels["metax-tech.com/gpu.product"] == "C500"
    assert labels["metax-tech.com/gpu.installed"] == "true"
    # Our images, from the local registry, run the DaemonSets.
    for pod in kubectl_json("-n", NS, "get", "pods")["items"]:
        assert pod["spec"]["containers"][0]["image"].startswith(IMAGE_REGISTRY + "/")
        assert pod["status"]["phase"] == "Running"


def gpu_pod(ns: str, name: str, count: int) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "nodeSelector": {"metax-tech.com/gpu.product": "C500"},
            "containers": [
                {
                    "name": "main",
                    "image": BUSYBOX,
                    "command": ["sh", "-c", "env | grep -i visible; ls /dev/dri; sleep 3600"],
                    "resources": {"limits": {RESOURCE: str(count)}},
                }
            ],
        },
    }


def cards_in(ns: str, name: str) -> set[int]:
    out = kubectl("-n", ns, "exec", name, "--", "ls", "/dev/dri")
    return {int(m) for m in re.findall(r"card(\d+)", out)}


@pytest.fixture(scope="module")
def gpu_pods(installed: dict[str, str]) -> Iterator[str]:
    ns = "e2e-gpu"
    kubectl("create", "namespace", ns, check=False)
    wait_until("default sa", lambda: kubectl("-n", ns, "get", "sa", "default", check=False), 30)
    try:
        yield ns
    finally:
        kubectl("delete", "namespace", ns, "--wait=true", "--timeout=120s", check=False)


def test_2_two_gpu_pod_gets_allocator_choice(gpu_pods: str) -> None:
    ns = gpu_pods
    card_of = {g["card"]: g["index"] for g in sim_state()["gpus"]}
    apply(gpu_pod(ns, "first", 2))
    wait_until("first Running", lambda: pod_phase(ns, "first") == "Running", 120)
    first = {card_of[c] for c in cards_in(ns, "first")}
    assert first == {0, 1}, first
    apply(gpu_pod(ns, "second", 2))
    wait_until("second Running", lambda: pod_phase(ns, "second") == "Running", 120)
    second = {card_of[c] for c in cards_in(ns, "second")}
    # SPEC §3 example 2: with 1,2 taken, a request for 2 gets 3,4 (here 0-based: {2,3}).
    assert second == {2, 3}, second
    env = kubectl("-n", ns, "exec", "second", "--", "env")
    assert "MACA_VISIBLE_DEVICES=" in env, env


def test_3_sim_fail_drops_allocatable_and_heal_restores(
    gpu_pods: str, installed: dict[str, str]
) -> None:
    node = installed["node"]
    assert gpu(node) == 8
    gpuk8s("sim", "fail", "--root", str(SIM_ROOT), "--gpu", "7")
    t0 = time.monotonic()
    try:
        wait_until("allocatable 7", lambda: gpu(node) == 7, HEALTHY_INTERVAL + 2, interval=0.2)
        assert time.monotonic() - t0 <= HEALTHY_INTERVAL + 2
        assert gpu(node, "capacity") == 8
    finally:
        gpuk8s("sim", "heal", "--root", str(SIM_ROOT), "--gpu", "7")
    wait_until("allocatable 8", lambda: gpu(node) == 8, HEALTHY_INTERVAL + 2, interval=0.2)


def test_4_kubelet_restart_keeps_pods_and_reregisters(
    gpu_pods: str, installed: dict[str, str]
) -> None:
    node, ns = installed["node"], gpu_pods
    before = kubectl_json("-n", ns, "get", "pod", "first")["status"]["containerStatuses"][0]
    run(str(LAB / "ctl"), "restart", "kubelet")
    wait_until(
        "node Ready again",
        lambda: (
            kubectl(
                "get",
                "node",
                node,
                "-o",
                'jsonpath={.status.conditions[?(@.type=="Ready")].status}',
            )
            == "True"
        ),
        120,
    )
    wait_until("capacity 8 after restart", lambda: gpu(node, "capacity") == 8, 120)
    wait_until("allocatable 8 after restart", lambda: gpu(node) == 8, 60)
    after = kubectl_json("-n", ns, "get", "pod", "first")["status"]["containerStatuses"][0]
    assert after["containerID"] == before["containerID"]
    assert after["restartCount"] == before["restartCount"]
    assert pod_phase(ns, "first") == "Running"



# -- issue 16: RBAC matrix, the own-node policy, helm test cleanup ---------------------------
ALLOWED = {  # (resource, resource name, verb) per ServiceAccount; namespace scope: ns-only
    "gpu-device": {("nodes", "", "get"), ("nodes", "", "patch")},
    "gpu-label": {("nodes", "", "get"), ("nodes", "", "patch")},
    # GPU sharing's bind verb: the chosen GPUs recorded on the pod, then the binding
    "gpu-aware": {(r, "", v) for r in ("nodes", "pods") for v in ("get", "list", "watch")}
    | {("pods", "", "patch"), ("pods/binding", "", "create")},
    "gpu-mps": {("nodes", "", "get")},  # its node's sharing-mode label
}
ALLOWED_IN_NS = {"gpu-aware": {("configmaps", "gpu-aware-plugin", "get")}
                 # its replicas' leader election (the Lease gpu-aware)
                 | {("leases.coordination.k8s.io", "", "create")}
                 | {("leases.coordination.k8s.io", "gpu-aware", v) for v in ("get", "update")}}
# what every authenticated user may do (discovery, self reviews): not the chart's doing
DEFAULT_RESOURCES = {
    "selfsubjectaccessreviews.authorization.k8s.io",
    "selfsubjectrulesreviews.authorization.k8s.io",
    "selfsubjectreviews.authentication.k8s.io",
}
VERBS = ("get", "list", "watch", "create", "update", "patch", "delete")
RESOURCES = ("nodes", "pods", "pods/eviction", "configmaps", "secrets", "daemonsets.apps",
             "clusterroles.rbac.authorization.k8s.io")


NOBODY = "gpuk8s-e2e-nobody"  # a ServiceAccount name no chart binds: the cluster's defaults


def can_i_list(sa: str, namespace: str) -> set[tuple[str, str, str]]:
    """`kubectl auth can-i --list` as the ServiceAccount: (resource, name, verb) rows."""
    out = kubectl("auth", "can-i", "--list", f"--as=system:serviceaccount:{NS}:{sa}",
                  "-n", namespace)
    rows: set[tuple[str, str, str]] = set()
    for line in out.splitlines()[1:]:
        cols = re.split(r"\s{2,}", line.strip())
        if len(cols) < 4 or not cols[0] or cols[0] in DEFAULT_RESOURCES:
            continue  # non-resource URLs (discovery) and the default self reviews
        names = cols[2].strip("[]").split() or [""]
        for verb in cols[3].strip("[]").split():
            for name in names:
                rows.add((cols[0], name, verb))
    return rows


def can_i(sa: str, verb: str, resource: str, namespace: str, name: str = "") -> bool:
    resource, _, sub = resource.partition("/")  # pods/eviction: a subresource, not a name
    args = ["auth", "can-i", verb, f"{resource}/{name}" if name else resource,
            f"--as=system:serviceaccount:{NS}:{sa}", "-n", namespace]
    if sub:
        args.append(f"--subresource={sub}")
    out = run(KUBECTL, "--kubeconfig", KUBECONFIG, *args, check=False).stdout.strip()
    assert out in ("yes", "no"), out
    return out == "yes"


def test_5_rbac_matrix_each_service_account_may_do_its_job_and_nothing_else(
    installed: dict[str, str],
) -> None:
    # what the cluster's own default bindings give every ServiceAccount (1.37 adds read of
    # clustertrustbundles through system:cluster-trust-bundle-discovery): an account of
    # ours holds exactly that plus what the chart grants it
    everyone = {ns: can_i_list(NOBODY, ns) for ns in ("default", NS)}
    assert not {row for rows in everyone.values() for row in rows
                if row[0].split(".")[0] in {"nodes", "pods", "configmaps", "secrets"}}, everyone
    for sa, allowed in ALLOWED.items():
        # everything the apiserver would let it do, exhaustively, in both scopes
        assert can_i_list(sa, "default") - everyone["default"] == allowed, sa
        assert can_i_list(sa, NS) - everyone[NS] == allowed | ALLOWED_IN_NS.get(sa, set()), sa
        # the kubectl auth can-i matrix: every verb on the resources that matter
        cells = [(verb, resource) for resource in RESOURCES for verb in VERBS]
        with ThreadPoolExecutor(max_workers=6) as pool:
            answers = list(pool.map(lambda c, sa=sa: can_i(sa, c[0], c[1], NS), cells))
        wrong = [(verb, resource, got) for (verb, resource), got in zip(cells, answers, strict=True)
                 if got != ((resource, "", verb) in allowed)]
        assert not wrong, f"{sa}: kubectl auth can-i answered unexpectedly: {wrong}"
    assert can_i("gpu-aware", "get", "configmaps", NS, "gpu-aware-plugin")
    assert not can_i("gpu-aware", "get", "configmaps", NS, "other")
    assert not can_i("gpu-aware", "update", "configmaps", NS, "gpu-aware-plugin")


def test_6_node_agents_may_patch_only_their_own_node(
    installed: dict[str, str], tmp_path: Path
) -> None:
    """The chart's ValidatingAdmissionPolicies on the lab's kube-apiserver: a token
    of the real gpu-label pod changes a label it writes on its own Node, never another
    Node, and on its own Node no label it does not own."""
    node = installed["node"]
    other = "e2e-not-this-node"
    pod = kubectl("-n", NS, "get", "pods", "-l", "app.kubernetes.io/name=gpu-label",
                  "--field-selector", f"spec.nodeName={node}",
                  "-o", "jsonpath={.items[0].metadata.name}")
    assert pod, "no gpu-label pod on the lab node"
    token = kubectl("-n", NS, "create", "token", "gpu-label", "--bound-object-kind", "Pod",
                    "--bound-object-name", pod, "--duration", "10m").strip()
    admin = yaml.safe_load(Path(KUBECONFIG).read_text())
    as_agent = tmp_path / "agent.conf"
    as_agent.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "clusters": admin["clusters"],
        "users": [{"name": "agent", "user": {"token": token}}],
        "contexts": [{"name": "agent", "context": {"cluster": admin["clusters"][0]["name"],
                                                   "user": "agent"}}],
        "current-context": "agent"}))
    apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": other}})
    try:
        label = ["label", "node", "--overwrite", "--dry-run=server", "metax-tech.com/e2e-probe=1"]
        own = run(KUBECTL, "--kubeconfig", str(as_agent), *label[:2], node, *label[2:],
                  check=False)
        assert own.returncode == 0, own.stderr
        denied = run(KUBECTL, "--kubeconfig", str(as_agent), *label[:2], other, *label[2:],
                     check=False)
        assert denied.returncode != 0
        assert "may change only the Node its pod runs on" in denied.stderr, denied.stderr
        foreign = run(KUBECTL, "--kubeconfig", str(as_agent), "label", "node", node,
                      "--overwrite", "--dry-run=server", "e2e.gpuk8s.io/probe=1", check=False)
        assert foreign.returncode != 0
        assert "may not change the Node labels e2e.gpuk8s.io/probe" in foreign.stderr, \
            foreign.stderr
        # RBAC alone would allow it: the policy is what stops it
        assert can_i("gpu-label", "patch", "nodes", NS, other)
    finally:
        kubectl("delete", "node", other, "--wait=false", check=False)


def test_7_helm_test_leaves_nothing_behind_passed_or_failed(installed: dict[str, str]) -> None:
    def leftovers() -> str:
        return (kubectl("-n", NS, "get", "pod,serviceaccount", "-o", "name", check=False)
                + kubectl("get", "clusterrole,clusterrolebinding", "-o", "name", check=False))

    passed = run(HELM, "--kubeconfig", KUBECONFIG, "test", RELEASE, "-n", NS, "--logs",
                 timeout=300, check=False)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert f"{installed['node']}: allocatable metax-tech.com/gpu=8" in passed.stdout
    assert "gpu-test" not in leftovers()
    # a node that claims GPUs but has none of the labels: the test fails...
    bad = "e2e-bad-gpu-node"
    apply({"apiVersion": "v1", "kind": "Node",
           "metadata": {"name": bad, "labels": {"metax-tech.com/gpu.installed": "true"}}})
    try:
        failed = run(HELM, "--kubeconfig", KUBECONFIG, "test", RELEASE, "-n", NS, "--logs",
                     timeout=300, check=False)
        assert failed.returncode != 0
        assert f"FAIL {bad}: labels missing" in failed.stdout + failed.stderr
        # ...and still leaves no pod, ServiceAccount or RBAC behind
        wait_until("test hooks deleted", lambda: "gpu-test" not in leftovers(), 60)
    finally:
        kubectl("delete", "node", bad, "--wait=false", check=False)


def test_8_helm_4_upgrade_replaces_a_live_weight_edit(installed: dict[str, str]) -> None:
    """issue 52 item 4 on the lab's helm 4: after ``kubectl replace`` of gpu-aware's weight
    ConfigMap, ``helm upgrade --set gpuAware.scoreWeight=5`` stops on the key the editor
    owns (nothing changes); the command NOTES.txt and docs/extender.md give
    (``--force-conflicts``) puts 5 in the ConfigMap and leaves the release deployed."""
    assert Path(HELM).parent.name.startswith("helm-v4."), HELM

    def weights() -> dict[str, str]:
        return dict(kubectl_json("get", "configmap", "gpu-aware-plugin", "-n", NS)["data"])

    live = kubectl_json("get", "configmap", "gpu-aware-plugin", "-n", NS)
    live["data"]["scoreWeight"] = "3"
    kubectl("replace", "-f", "-", stdin=json.dumps(live))
    five = (HELM, "--kubeconfig", KUBECONFIG, "upgrade", RELEASE,
            str(REPO / "charts" / "metax-gpu-extensions"), "-n", NS, "--reuse-values",
            "--set", "gpuAware.scoreWeight=5", "--wait", "--timeout", "3m")
    refused = run(*five, check=False, timeout=300)
    assert refused.returncode != 0
    assert 'conflict with "kubectl-replace"' in refused.stderr, refused.stderr
    assert weights()["scoreWeight"] == "3"
    out = run(*five, "--force-conflicts", timeout=300).stdout
    assert "gpuAware.scoreWeight: the chart's new value 5 replaced the live edit 3" in out
    assert weights() == {"scoreWeight": "5", "lossWeight": "1"}
    status = json.loads(helm("status", RELEASE, "-n", NS, "-o", "json"))["info"]["status"]
    assert status == "deployed"
