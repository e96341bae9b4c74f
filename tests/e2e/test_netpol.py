"""gpu-aware's NetworkPolicy enforced on the lab's real node (issue 50, item 3).

The lab's bridge CNI enforces no policy; lab/up runs sigs.k8s.io/kube-network-policies
(nftables + nfqueue) as a host daemon of the node (lab/netpol.sh), as its DaemonSet would
on a real node. The chart is installed as the lab installs it (the policy's defaults: the
control-plane Node found by lookup) with gpu-aware as kube-scheduler's extender (the
session's one sGPU stack, conftest's ``sgpu_release``, shared with test_sharing.py; the
module's pods in its own namespace). Then:

- a pod on the GPU node cannot open a connection to gpu-aware's extender port (each pod
  IP and the Service's ClusterIP) nor to its health port (``healthFrom`` is empty);
- kube-scheduler, a host-network process of the node, is still served: a GPU pod is
  placed through gpu-aware's filter (its counter of answered filter requests grows);
- the kubelet's probes still pass (the pods stay Ready, no restart);
- the control: with ``gpuAware.networkPolicy.enabled=false`` (a helm upgrade of the same
  release) the same pod connects to the same port, so the refusal above was the policy's;
  the module's end gives the release its policy back.

Needs the lab's enforcer running (``lab/netpol.sh start``, which lab/up runs): its absence
is a failure, not a skip.
"""

from __future__ import annotations

import contextlib
import json
import urllib.request
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest

from .conftest import (
    BUSYBOX,
    KUBECONFIG,
    KUBECTL,
    REPO,
    SGPU_RELEASE,
    apply,
    kubectl,
    kubectl_json,
    run,
    sgpu_work,
    shared_gpu_pod,
    wait_until,
)
from .test_gpu_stack import helm
from .test_manual import gpu_aware_metric
from .test_sharing import NS

pytestmark = [pytest.mark.e2e]

WORK = "e2e-netpol"
NETPOL_METRICS = "http://127.0.0.1:9080/metrics"  # lab/netpol.sh NETPOL_METRICS
EXTENDER_PORT = 8080
HEALTH_PORT = 8081
PROBER = "prober"
SELECTOR = "app.kubernetes.io/name=gpu-aware"


def enforcer_running() -> bool:
    """The enforcer's metrics answer with its own (registered once its caches synced)."""
    try:
        with urllib.request.urlopen(NETPOL_METRICS, timeout=5) as resp:
            return b"kube_network_policies_" in resp.read()
    except OSError:
        return False


@pytest.fixture(scope="module")
def stack(sgpu_release: dict[str, str]) -> Iterator[dict[str, str]]:
    assert enforcer_running(), (
        f"no NetworkPolicy enforcer on the lab node ({NETPOL_METRICS} does not answer): "
        "run lab/netpol.sh start (lab/up runs it)")
    with sgpu_work(sgpu_release, WORK) as lab, policy_given_back():
        apply({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": PROBER, "namespace": WORK},
               "spec": {"terminationGracePeriodSeconds": 0, "nodeName": lab["node"],
                        "containers": [{"name": "main", "image": BUSYBOX,
                                        "command": ["sleep", "3600"]}]}})
        wait_until("prober Running", lambda: kubectl(
            "-n", WORK, "get", "pod", PROBER, "-o", "jsonpath={.status.phase}") == "Running",
            60, interval=0.5)
        yield lab


@contextlib.contextmanager
def policy_given_back() -> Iterator[None]:
    """The release's NetworkPolicy setting as found, once the module is done (test 5
    turns it off)."""
    found = json.loads(helm("get", "values", SGPU_RELEASE, "-n", NS, "--all", "-o", "json"))
    enabled = bool(found["gpuAware"]["networkPolicy"]["enabled"])
    try:
        yield
    finally:
        now = json.loads(helm("get", "values", SGPU_RELEASE, "-n", NS, "--all", "-o", "json"))
        if bool(now["gpuAware"]["networkPolicy"]["enabled"]) != enabled:
            helm("upgrade", SGPU_RELEASE, str(REPO / "charts" / "metax-gpu-extensions"),
                 "-n", NS, "--reuse-values", "--set",
                 f"gpuAware.networkPolicy.enabled={str(enabled).lower()}", "--wait",
                 "--timeout", "5m")


def gpu_aware_pods() -> list[dict[str, Any]]:
    return list(kubectl_json("-n", NS, "get", "pods", "-l", SELECTOR)["items"])


def targets() -> list[tuple[str, int]]:
    """gpu-aware's addresses a pod can aim at: each pod IP on both ports, the ClusterIP."""
    ips = [p["status"]["podIP"] for p in gpu_aware_pods()]
    assert ips, "no gpu-aware pod"
    cluster_ip = kubectl("-n", NS, "get", "svc", "gpu-aware", "-o", "jsonpath={.spec.clusterIP}")
    return ([(ip, EXTENDER_PORT) for ip in ips] + [(cluster_ip, EXTENDER_PORT)]
            + [(ip, HEALTH_PORT) for ip in ips])


def connects(ip: str, port: int) -> bool:
    """Whether the prober pod opens a TCP connection to ip:port within 3 s (busybox nc:
    -e runs `true` once connected, so the exit status is the connect's)."""
    proc = run(KUBECTL, "--kubeconfig", KUBECONFIG, "-n", WORK, "exec", PROBER, "--",
               "nc", "-w", "3", ip, str(port), "-e", "true", check=False, timeout=30)
    return proc.returncode == 0


def refused(ip: str, port: int) -> bool:
    return not connects(ip, port)


def test_1_policy_is_rendered_with_the_control_plane_node(stack: dict[str, str]) -> None:
    policy = kubectl_json("-n", NS, "get", "networkpolicy", "gpu-aware")
    node_ip = next(a["address"] for a in kubectl_json("get", "node", stack["node"])
                   ["status"]["addresses"] if a["type"] == "InternalIP")
    sources = [peer["ipBlock"]["cidr"] for rule in policy["spec"]["ingress"]
               for peer in rule["from"] if "ipBlock" in peer]  # (+ the helm test pod's rule)
    assert f"{node_ip}/32" in sources, sources


def test_2_a_pod_on_the_gpu_node_is_refused(stack: dict[str, str]) -> None:
    for ip, port in targets():
        # the enforcer learns the pods' IPs from the API server: a moment after they start
        wait_until(f"the prober refused at {ip}:{port}", partial(refused, ip, port), 60)
        assert not connects(ip, port), f"the prober reached {ip}:{port}"


def test_3_kube_scheduler_is_still_served(stack: dict[str, str]) -> None:
    # the playbook configured the lab node's kube-scheduler: it must be the one scheduling
    leader = kubectl("-n", "kube-system", "get", "lease", "kube-scheduler", "-o",
                     "jsonpath={.spec.holderIdentity}")
    assert leader.startswith(stack["node"] + "_"), (
        f"kube-scheduler's leader is {leader}, not the lab node's (which has the extender)")
    ips = [p["status"]["podIP"] for p in gpu_aware_pods()]
    before = sum(gpu_aware_metric(ip, "gpu_aware_requests_total", verb="filter", code="200")
                 for ip in ips)
    apply(shared_gpu_pod("placed", WORK, 50))
    wait_until("the GPU pod Running", lambda: kubectl(
        "-n", WORK, "get", "pod", "placed", "-o", "jsonpath={.status.phase}") == "Running", 120)
    after = sum(gpu_aware_metric(ip, "gpu_aware_requests_total", verb="filter", code="200")
                for ip in ips)
    assert after > before, "kube-scheduler placed the pod without gpu-aware's filter"


def test_4_the_probes_still_pass(stack: dict[str, str]) -> None:
    for pod in gpu_aware_pods():
        ready = {c["type"]: c["status"] for c in pod["status"]["conditions"]}["Ready"]
        restarts = sum(c["restartCount"] for c in pod["status"]["containerStatuses"])
        assert (ready, restarts) == ("True", 0), pod["metadata"]["name"]


def test_5_without_the_policy_the_same_pod_connects(stack: dict[str, str]) -> None:
    helm("upgrade", SGPU_RELEASE, str(REPO / "charts" / "metax-gpu-extensions"), "-n", NS,
         "--reuse-values", "--set", "gpuAware.networkPolicy.enabled=false", "--wait",
         "--timeout", "5m")
    assert kubectl("-n", NS, "get", "networkpolicy", "-o", "name") == ""
    for ip, port in targets():
        wait_until(f"the prober connects to {ip}:{port}", partial(connects, ip, port), 60)
