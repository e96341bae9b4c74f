"""gpu-aware across both control planes of the fleet (issue 49, item 4): the GPU Extensions
scheme with gpu-aware installed over SSH (test_fleet_ops.py's install, release ``e2e-fleet``),
then playbooks/gpu_aware.yml against inventories/fleet: the lab node's kube-scheduler
(kubeadm's manifest) and cp2's (kubespray's, with a ``--config`` file of its own) both get
gpu-aware's extender entry, one restart at a time. Each test asserts what the cluster and
the nodes show:

1. both schedulers' configuration files carry the entry, ``--check --diff`` predicted
   exactly the changes of the real run, and cp2's host reaches gpu-aware through the
   enforced NetworkPolicy (the install listed both control planes) while a GPU node's
   host is refused;
2. among real nodes, a 4-GPU pod goes to the node where one MetaXLink group has 4 free
   GPUs, although the default scorers prefer the other (4 free GPUs split 2 + 2);
3. failover: the lab node's kube-scheduler is stopped (its static pod manifest moved aside),
   cp2's takes the Lease and a GPU pod still schedules through gpu-aware (its filter
   counter grows), with the packing profile the lab node's has (written into kubespray's
   own file too); then the lab node's scheduler is back and leading;
4. ``gpu_aware_state=absent`` leaves both schedulers' files byte-identical to before.

The module leaves both manifests, the Lease holder and the parked/running state of cp2's
scheduler as it found them (the tier parks cp2's scheduler; it runs inside the module)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.ansible.test_ansible_layer import changed_by_host

from .conftest import (
    BUSYBOX,
    FLEET_MARKS,
    FLEET_STANDBY,
    HELM,
    KUBECONFIG,
    LAB,
    REPO,
    SCHEDULER_MANIFEST,
    SIM_ROOT,
    apply,
    kubectl,
    kubectl_json,
    run,
    scheduler_leader,
    standby_scheduler,
    standby_scheduler_up,
    tool,
    wait_until,
)
from .test_fleet_ops import (
    EXTRA_VARS,
    FLEET_NODES,
    FLEET_TAINT,
    NAMESPACE,
    RELEASE,
    assert_extensions_everywhere,
    nodes,
    our_labels,
    package_charts,
    playbook,
    restore_labels,
)

pytestmark = FLEET_MARKS

# the files gpu_aware.yml may write on each control plane (their paths inside the node)
CONTROL_PLANE_FILES = (
    "/etc/kubernetes/manifests/kube-scheduler.yaml",
    "/etc/kubernetes/kubescheduler-config.yaml",  # cp2's own --config (kubespray)
    "/etc/metax/extender.yaml",  # the module's --config where the manifest has none
)
TLS_DIR = "/etc/metax/gpu-aware"
LAB_PARKED = Path("/var/tmp/gpuk8s-e2e-lab-kube-scheduler.yaml")
GPU = "metax-tech.com/gpu"
# inventories/fleet's lab node; cp2 is FLEET_STANDBY
LAB_HOST = "lab"
# the control of test 1: a GPU node's host, outside the policy
OUTSIDER = "gpu-ext"


def gpu_aware_run(*args: str, extra: dict[str, Any] | None = None,
                  check: bool = True) -> subprocess.CompletedProcess[str]:
    """playbooks/gpu_aware.yml over SSH against the fleet, timed."""
    start = time.monotonic()
    proc = run(
        tool("ansible-playbook"),
        "-i",
        str(REPO / "inventories" / "fleet"),
        str(REPO / "playbooks" / "gpu_aware.yml"),
        "-e",
        # no backups left on the nodes (/var/lib/gpuk8s/backups): test 4 proves the restore
        json.dumps({**EXTRA_VARS, "gpu_aware_backup": False, **(extra or {})}),
        *args,
        cwd=str(REPO),
        timeout=1200,
        check=check,
    )
    print(f"\n[fleet] gpu_aware.yml {' '.join(args)} {extra or ''} in "
          f"{time.monotonic() - start:.0f}s", file=sys.stderr)
    return proc


def gpu_aware_playbook(*args: str) -> str:
    """gpu_aware_run's output (a failed run fails the test)."""
    return gpu_aware_run(*args).stdout


def read_file(node: str, path: str) -> bytes | None:
    """A file as the node sees it (None: absent); the lab node's own root is the host's."""
    if node == LAB_HOST:
        p = Path(path)
        return p.read_bytes() if p.exists() else None
    proc = run(str(LAB / "fleetctl"), "exec", node, "sh", "-c",
               f'if [ -e {path} ]; then cat {path}; else exit 3; fi', check=False, timeout=60)
    if proc.returncode == 3:
        return None
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.encode()


def control_plane_files() -> dict[str, dict[str, str | None]]:
    """sha256 of each file gpu_aware.yml may write, per control plane (None: absent)."""
    out: dict[str, dict[str, str | None]] = {}
    for node in (LAB_HOST, FLEET_STANDBY):
        out[node] = {}
        for path in (*CONTROL_PLANE_FILES, TLS_DIR + "/client.crt"):
            data = read_file(node, path)
            out[node][path] = hashlib.sha256(data).hexdigest() if data is not None else None
    return out


def scheduler_config(node: str) -> dict[str, Any]:
    """The KubeSchedulerConfiguration the node's kube-scheduler manifest names (--config)."""
    manifest = yaml.safe_load(read_file(node, CONTROL_PLANE_FILES[0]) or b"")
    command = manifest["spec"]["containers"][0]["command"]
    config = [c.split("=", 1)[1] for c in command if c.startswith("--config=")]
    assert config, f"{node}: no --config in its kube-scheduler manifest: {command}"
    text = read_file(node, config[0])
    assert text is not None, f"{node}: {config[0]} missing"
    loaded: dict[str, Any] = yaml.safe_load(text)
    return loaded


def scheduler_pod(node: str) -> dict[str, Any]:
    """The node's kube-scheduler mirror pod."""
    pod: dict[str, Any] = kubectl_json("-n", "kube-system", "get", "pod",
                                       f"kube-scheduler-{node}")
    return pod


def gpu_aware_entry(node: str) -> dict[str, Any]:
    """gpu-aware's filter entry in the node's scheduler configuration."""
    entries = [e for e in scheduler_config(node).get("extenders") or []
               if e.get("filterVerb") == "filter"]
    assert len(entries) == 1, f"{node}: extenders {entries}"
    entry: dict[str, Any] = entries[0]
    return entry


def gpu_aware_pods() -> list[dict[str, Any]]:
    pods = kubectl_json("-n", NAMESPACE, "get", "pods", "-l",
                        "app.kubernetes.io/name=gpu-aware")["items"]
    return [p for p in pods if p["status"].get("phase") == "Running"]


def filter_requests() -> float:
    """gpu_aware_requests_total{verb="filter"} summed over the gpu-aware pods (read inside
    each pod: its health port admits no one else)."""
    script = ("import urllib.request;print(urllib.request.urlopen("
              "'http://127.0.0.1:8081/metrics',timeout=10).read().decode())")
    total = 0.0
    for pod in gpu_aware_pods():
        text = kubectl("-n", NAMESPACE, "exec", pod["metadata"]["name"], "-c", "gpu-aware",
                       "--", "python3", "-c", script)
        for line in text.splitlines():
            if line.startswith("gpu_aware_requests_total{") and 'verb="filter"' in line:
                total += float(line.rsplit(" ", 1)[1])
    return total


def connects(node: str, address: str, port: int) -> bool:
    """A TCP connection from the node's host network namespace (where kube-scheduler runs)."""
    script = (f"import socket;socket.create_connection(('{address}',{port}),timeout=5).close()")
    return run(str(LAB / "fleetctl"), "exec", node, "python3", "-c", script, check=False,
               timeout=60).returncode == 0


def curl_filter(url: str, server_name: str, *tls: str) -> subprocess.CompletedProcess[str]:
    """A filter call with curl (its exit status, its HTTP status on stdout): the name the
    certificate holds resolved to the cluster IP in ``url``, as kube-scheduler's
    serverName makes Go verify it."""
    address = url.split("//", 1)[1].split("/", 1)[0]
    host, port = address.rsplit(":", 1)
    return run("curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "10",
               "--resolve", f"{server_name}:{port}:{host}", *tls, "-X", "POST",
               "-H", "Content-Type: application/json", "--data", '{"Pod": {}, "NodeNames": []}',
               f"https://{server_name}:{port}/filter", check=False)


def assert_only_the_scheduler_is_admitted(extender: dict[str, Any], tmp_path: Path) -> None:
    tls = extender["tlsConfig"]
    url, name, ca = extender["urlPrefix"], tls["serverName"], tls["caFile"]
    # kube-scheduler's own files: admitted
    mine = curl_filter(url, name, "--cacert", ca, "--cert", tls["certFile"], "--key",
                       tls["keyFile"])
    assert (mine.returncode, mine.stdout) == (0, "200"), (mine.stdout, mine.stderr)
    # no client certificate: refused in the handshake, nothing answered
    bare = curl_filter(url, name, "--cacert", ca)
    assert bare.returncode != 0 and bare.stdout in ("", "000"), (bare.stdout, bare.stderr)
    # a certificate of another CA: refused the same way
    other = tmp_path / "other"
    other.mkdir()
    run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        "-subj", "/CN=kube-scheduler", "-keyout", str(other / "key.pem"),
        "-out", str(other / "cert.pem"))
    stranger = curl_filter(url, name, "--cacert", ca, "--cert", str(other / "cert.pem"),
                           "--key", str(other / "key.pem"))
    assert stranger.returncode != 0 and stranger.stdout in ("", "000"), (
        stranger.stdout, stranger.stderr)
    # plain HTTP on the TLS port gets no answer either
    plain = run("curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "10",
                url.replace("https://", "http://") + "/filter", check=False)
    assert plain.stdout != "200", plain.stdout


FILTER_FROM_CP2 = r"""
import json, socket, ssl, sys
url, server_name, ca, cert, key = sys.argv[1:6]
host, port = url.split("://", 1)[1].rsplit(":", 1)
ctx = ssl.create_default_context(cafile=ca)
ctx.load_cert_chain(cert, key)
body = json.dumps({"Pod": {"metadata": {"name": "probe", "namespace": "default", "uid": "p"},
    "spec": {"containers": [{"name": "c", "resources": {"limits": {"metax-tech.com/gpu": "1"}}}]}},
    "NodeNames": ["gpu-ext"]}).encode()
with socket.create_connection((host, int(port)), timeout=10) as raw:
    with ctx.wrap_socket(raw, server_hostname=server_name) as tls:
        tls.sendall(b"POST /filter HTTP/1.1\r\nHost: " + server_name.encode()
                    + b"\r\nContent-Type: application/json\r\nConnection: close\r\n"
                    + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        data = b""
        while chunk := tls.recv(65536):
            data += chunk
head, _, answer = data.partition(b"\r\n\r\n")
print(head.split(b"\r\n", 1)[0].decode())  # the status line, then the body
print(answer.decode(errors="replace"))
"""


def gpu_pod(ns: str, name: str, gpus: int, *, affinity: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "tolerations": [FLEET_TAINT],
            "affinity": affinity,
            "containers": [{"name": "c", "image": BUSYBOX, "command": ["sleep", "3600"],
                            "resources": {"limits": {GPU: str(gpus)}}}],
        },
    }


def only_on(*names: str) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": list(names)}]}]}}}


def allocatable(node: str) -> int:
    return int(nodes()[node]["status"]["allocatable"].get(GPU, "0"))


def sim(node: str, *args: str) -> None:
    """gpuk8s sim on a node's own simulated GPUs (the lab node's: the lab's simroot)."""
    command = [sys.executable, "-m", "gpuk8s.cli", "sim", *args]
    env = ["env", f"PYTHONPATH={REPO / 'src'}"]
    if node == LAB_HOST:
        run(*env, *command, "--root", str(SIM_ROOT))
    else:
        run(str(LAB / "fleetctl"), "exec", node, *env, *command, "--root", str(SIM_ROOT),
            timeout=60)


def lab_scheduler_leads(lab_node: str) -> None:
    """The lab node's kube-scheduler holds the Lease again (the single-node tier assumes
    it): cp2's parked until it does (standby_scheduler waits for that), then running."""
    if scheduler_leader() != lab_node:
        standby_scheduler(False, lab_node)
        standby_scheduler(True, lab_node)


@contextlib.contextmanager
def extensions_installed(lab_node: str, parked: bool) -> Iterator[dict[str, Any]]:
    """The GPU Extensions scheme with gpu-aware installed over SSH, ONE install for
    test_fleet_maint.py and this module (conftest's ``fleet_extensions``): both schedulers
    running (the install lists both control planes in gpu-aware's NetworkPolicy),
    push_artifacts.yml and install.yml, then what the install must show
    (``assert_extensions_everywhere``). Afterwards: uninstall.yml, which must leave none of
    the release's objects (the claim of the former tests/e2e/test_playbooks.py), our
    labels on the fleet nodes and cp2's scheduler as found. Yields the control planes'
    files and our labels as found."""
    assert scheduler_leader() == lab_node, "the lab node's kube-scheduler must lead"
    with standby_scheduler_up(lab_node, parked):
        files = control_plane_files()
        labels = {n: our_labels(node) for n, node in nodes().items() if n in FLEET_NODES}
        package_charts()
        playbook("push_artifacts")
        try:
            playbook("install", extra={"gpu_extensions_deploy_gpu_aware": True})
            assert_extensions_everywhere(lab_node)
            yield {"files": files, "labels": labels}
        finally:
            try:  # no kube-scheduler backups left on the control planes either
                playbook("uninstall", extra={"gpu_aware_backup": False})
            finally:
                restore_labels(labels)
    left = kubectl("get", "daemonset,deployment,service,configmap", "-n", NAMESPACE, "-o",
                   "name", "-l", "app.kubernetes.io/managed-by=Helm", check=False).strip()
    assert left == "", f"uninstall left: {left}"


@pytest.fixture(scope="module")
def fleet_sched(lab: dict[str, str], fleet_extensions: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """On the fleet's shared install (``fleet_extensions``, both schedulers running):
    gpu_aware.yml run with --check --diff, then for real. Afterwards gpu_aware.yml absent
    (unless test 4 did it)."""
    state: dict[str, Any] = {"files": fleet_extensions["files"], "absent": False}
    try:
        state["check"] = changed_by_host(gpu_aware_playbook("--check", "--diff"))
        state["cp2_pod"] = scheduler_pod(FLEET_STANDBY)["metadata"]
        state["real"] = changed_by_host(gpu_aware_playbook())
        # either scheduler may lead after the restarts, one at a time
        lab_scheduler_leads(lab["node"])
        yield state
    finally:
        if not state["absent"]:
            gpu_aware_playbook("-e", "gpu_aware_state=absent")


def test_1_gpu_aware_on_both_control_planes_and_cp2_admitted(
    fleet_sched: dict[str, Any], lab: dict[str, str], tmp_path: Path
) -> None:
    # --check --diff predicted exactly what the real run changed, on both hosts
    assert fleet_sched["real"] == fleet_sched["check"]
    assert set(fleet_sched["real"]) == {LAB_HOST, FLEET_STANDBY}
    service_ip = kubectl("-n", NAMESPACE, "get", "service", "gpu-aware", "-o",
                         "jsonpath={.spec.clusterIP}").strip()
    entries = {node: gpu_aware_entry(node) for node in (LAB_HOST, FLEET_STANDBY)}
    for node, entry in entries.items():
        assert entry["urlPrefix"] == f"https://{service_ip}:8080", (node, entry)
        assert entry["enableHTTPS"] is True and entry["tlsConfig"]["certFile"], (node, entry)
    # cp2's manifest still names kubespray's own file; the lab node's got the module's
    cp2_manifest = read_file(FLEET_STANDBY, CONTROL_PLANE_FILES[0]) or b""
    assert b"--config=/etc/kubernetes/kubescheduler-config.yaml" in cp2_manifest
    assert b"--config=/etc/metax/extender.yaml" in (read_file(LAB_HOST, CONTROL_PLANE_FILES[0])
                                                     or b"")
    # both schedulers serve the new configuration (mirror pods Ready), the lab node leads
    for node in (lab["node"], FLEET_STANDBY):
        pod = scheduler_pod(node)
        ready = [c["status"] for c in pod["status"].get("conditions", []) if c["type"] == "Ready"]
        assert ready == ["True"], (node, pod["status"])
    # on cp2 only its own --config file changed, not what the manifest runs: the annotation
    # holding that file's hash changed the manifest, so the kubelet restarted kube-scheduler
    cp2_config = read_file(FLEET_STANDBY, CONTROL_PLANE_FILES[1]) or b""
    annotations = scheduler_pod(FLEET_STANDBY)["metadata"]["annotations"]
    marker = json.loads(annotations["metax-tech.com/scheduler-extender"])
    assert marker["configHash"] == "sha256:" + hashlib.sha256(cp2_config).hexdigest()
    assert (annotations["kubernetes.io/config.hash"]
            != fleet_sched["cp2_pod"]["annotations"]["kubernetes.io/config.hash"])
    # gpu-aware admits kube-scheduler's client certificate (the lab node's files) only
    assert_only_the_scheduler_is_admitted(entries[LAB_HOST], tmp_path)
    # the install listed both control planes' addresses in the policy
    policy = kubectl_json("-n", NAMESPACE, "get", "networkpolicy", "gpu-aware")
    sources = {peer["ipBlock"]["cidr"] for rule in policy["spec"]["ingress"]
               for peer in rule.get("from", []) if "ipBlock" in peer}
    addresses = {n: next(a["address"] for a in node["status"]["addresses"]
                         if a["type"] == "InternalIP") for n, node in nodes().items()}
    assert {f"{addresses[lab['node']]}/32", f"{addresses[FLEET_STANDBY]}/32"} <= sources
    values = json.loads(run(HELM, "--kubeconfig", KUBECONFIG, "get", "values", RELEASE,
                            "-n", NAMESPACE, "-o", "json").stdout)
    assert sorted(values["gpuAware"]["networkPolicy"]["controlPlaneCIDRs"]) == sorted(
        [f"{addresses[lab['node']]}/32", f"{addresses[FLEET_STANDBY]}/32"])
    # through the enforced policy: cp2's host reaches the gpu-aware pod on the lab node (where
    # the lab's kube-network-policies enforces), a GPU node's host does not
    on_lab = [p["status"]["podIP"] for p in gpu_aware_pods()
              if p["spec"]["nodeName"] == lab["node"]]
    assert on_lab, "no gpu-aware pod on the lab node"
    assert connects(FLEET_STANDBY, on_lab[0], 8080)
    assert not connects(OUTSIDER, on_lab[0], 8080)
    # and cp2's kube-scheduler's own entry (its URL, TLS files and server name) is served
    entry = entries[FLEET_STANDBY]
    tls = entry["tlsConfig"]
    answer = run(str(LAB / "fleetctl"), "exec", FLEET_STANDBY, "python3", "-c",
                 FILTER_FROM_CP2, entry["urlPrefix"], tls["serverName"], tls["caFile"],
                 tls["certFile"], tls["keyFile"], timeout=60).stdout
    status, body = answer.split("\n", 1)
    assert status.startswith("HTTP/1.1 200"), answer
    result = json.loads(body)
    assert "gpu-ext" in (result.get("NodeNames") or []) + list(result.get("FailedNodes") or {})


def test_2_four_gpu_pod_goes_to_the_node_with_a_free_link_group(
    fleet_sched: dict[str, Any], lab: dict[str, str], namespace: str
) -> None:
    """c500-8 (the lab node and gpu-ext): MetaXLink groups {0-3} and {4-7}. gpu-ext keeps
    group {0-3} free (4-7 failed); the lab node keeps 2 + 2 ({2,3} and {6,7}: 0, 1, 4, 5
    failed). Both have 4 allocatable GPUs; the pod prefers the lab node (node affinity,
    weight 100), so the default scorers alone would put it there. gpu-vf (VFs) is left out
    of the pod's nodes: its 32 VFs are another shape."""
    lab_node = lab["node"]
    failed = {"gpu-ext": (4, 5, 6, 7), LAB_HOST: (0, 1, 4, 5)}
    try:
        for node, gpus in failed.items():
            for gpu in gpus:
                sim(node, "fail", "--gpu", str(gpu))
        wait_until("4 allocatable GPUs on gpu-ext and the lab node",
                   lambda: allocatable("gpu-ext") == 4 and allocatable(lab_node) == 4, 120)
        affinity = only_on(lab_node, "gpu-ext")
        affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] = [
            {"weight": 100, "preference": {"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [lab_node]}]}}]
        apply(gpu_pod(namespace, "four", 4, affinity=affinity))
        node = wait_until("the 4-GPU pod scheduled", lambda: kubectl(
            "-n", namespace, "get", "pod", "four", "-o", "jsonpath={.spec.nodeName}").strip(), 120)
        assert node == "gpu-ext", node
        wait_until("the 4-GPU pod Running", lambda: kubectl(
            "-n", namespace, "get", "pod", "four", "-o", "jsonpath={.status.phase}") == "Running",
            180)
    finally:
        kubectl("-n", namespace, "delete", "pod", "four", "--wait=true", "--timeout=120s",
                check=False, timeout=180)
        for node in failed:
            sim(node, "heal", "--all")
    wait_until("8 allocatable GPUs again",
               lambda: allocatable("gpu-ext") == 8 and allocatable(lab_node) == 8, 120)


def test_3_failover_to_cp2_schedules_through_gpu_aware(
    fleet_sched: dict[str, Any], lab: dict[str, str], namespace: str
) -> None:
    lab_node = lab["node"]
    assert scheduler_leader() == lab_node
    manifest = SCHEDULER_MANIFEST.read_bytes()
    packing = {k: v for k, v in scheduler_config(LAB_HOST).items()
               if k in ("percentageOfNodesToScore", "profiles")}
    assert packing["profiles"][0]["pluginConfig"][0]["args"]["scoringStrategy"][
        "type"] == "MostAllocated", packing
    before = filter_requests()
    t0 = time.monotonic()
    SCHEDULER_MANIFEST.rename(LAB_PARKED)  # the kubelet stops the lab node's scheduler
    try:
        wait_until("cp2's kube-scheduler holds the Lease",
                   lambda: scheduler_leader() == FLEET_STANDBY, 120, interval=0.5)
        took_over = time.monotonic() - t0
        wait_until("the lab node's scheduler pod gone", lambda: kubectl(
            "-n", "kube-system", "get", "pod", f"kube-scheduler-{lab_node}", "-o", "name",
            check=False).strip() == "", 60)
        apply(gpu_pod(namespace, "after-failover", 1, affinity=only_on("gpu-ext")))
        wait_until("the GPU pod Running", lambda: kubectl(
            "-n", namespace, "get", "pod", "after-failover", "-o",
            "jsonpath={.status.phase}") == "Running", 180)
        scheduled = time.monotonic() - t0
        # only cp2's scheduler runs: gpu-aware's filter answered it for this pod
        assert filter_requests() > before
        # and it scores as the lab node's did: the packing profile (MostAllocated on GPUs,
        # every feasible node scored) is in kubespray's own file too
        cp2 = scheduler_config(FLEET_STANDBY)
        assert {k: cp2.get(k) for k in packing} == packing, cp2
        print(f"\n[fleet] failover: cp2 leads {took_over:.1f}s after the lab node's scheduler "
              f"stopped; GPU pod Running at {scheduled:.1f}s", file=sys.stderr)
    finally:
        if LAB_PARKED.exists():
            LAB_PARKED.rename(SCHEDULER_MANIFEST)
    assert SCHEDULER_MANIFEST.read_bytes() == manifest
    wait_until("the lab node's kube-scheduler back", lambda: kubectl(
        "-n", "kube-system", "get", "pod", f"kube-scheduler-{lab_node}", "-o",
        'jsonpath={.status.conditions[?(@.type=="Ready")].status}') == "True", 180)
    # the lab node's scheduler leads again: cp2's parked (standby_scheduler waits for the
    # Lease to come back), then running again as the module found it
    t1 = time.monotonic()
    lab_scheduler_leads(lab_node)
    print(f"\n[fleet] the lab node's scheduler leads again after {time.monotonic() - t1:.1f}s",
          file=sys.stderr)
    assert scheduler_leader() == lab_node


def test_4_absent_leaves_both_control_planes_as_found(fleet_sched: dict[str, Any]) -> None:
    # a kubernetes_version the lab node's real scheduler image contradicts is refused there
    # (the first host of the serial play), and nothing is written on either control plane
    configured = control_plane_files()
    refused = gpu_aware_run(extra={"gpu_aware_kubernetes_version": "1.23"}, check=False)
    assert refused.returncode != 0
    assert "selects kubescheduler.config.k8s.io/v1beta3" in refused.stdout, refused.stdout
    assert control_plane_files() == configured
    gpu_aware_playbook("-e", "gpu_aware_state=absent")
    fleet_sched["absent"] = True
    assert control_plane_files() == fleet_sched["files"]
    assert not any(e.get("filterVerb") == "filter"
                   for e in scheduler_config(FLEET_STANDBY).get("extenders") or [])
