"""GPU monitoring on the lab (issue 17): gpu-exporter from the chart, a real Prometheus
(Debian's ``prometheus``, run here as a plain process with a temporary config and data
directory) scraping it with the shipped recording rules, and PromQL answers that equal
the load the simulator was given for real GPU pods in two namespaces.

The pods are real (busybox, scheduled by kube-scheduler, GPUs allocated by gpu-device
through the kubelet); only the GPUs are simulated. Each pod's GPU process is its own
container's main process: its host PID goes into the simulated GPU's process list, and
the exporter maps it back to the pod through the real /proc/<pid>/cgroup.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import (
    BUSYBOX,
    HELM,
    KUBECONFIG,
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
CHART = str(REPO / "charts" / "metax-gpu-extensions")
MIB = 1024 * 1024
EXPORTER_INTERVAL = 2


def helm(*args: str, timeout: float = 600) -> str:
    return run(HELM, "--kubeconfig", KUBECONFIG, *args, timeout=timeout).stdout


def gpuk8s(*args: str) -> str:
    venv = run(str(LAB / "pyenv.sh")).stdout.strip()
    return run(f"{venv}/bin/gpuk8s", *args).stdout


@pytest.fixture(scope="module")
def exporter(lab: dict[str, str]) -> Iterator[dict[str, str]]:
    """gpu-exporter running from the checkout's chart. A release already in the lab
    (lab/install's) is upgraded to enable it and rolled back afterwards; otherwise a
    release of our own is installed and removed."""
    # deployed only: the session may have set lab/install's release aside (history kept)
    releases = json.loads(helm("list", "--deployed", "-n", NS, "-o", "json"))
    ours = [r for r in releases if r["chart"].startswith("metax-gpu-extensions-")]
    on = ["--set", "gpuExporter.enabled=true", "--set", f"gpuExporter.interval={EXPORTER_INTERVAL}"]
    if ours:
        release, revision = ours[0]["name"], ours[0]["revision"]
        helm("upgrade", release, CHART, "-n", NS, "--reset-then-reuse-values", *on, "--wait",
             "--timeout", "5m")
    else:
        release, revision = "e2e-monitoring", ""
        helm("upgrade", "--install", release, CHART, "-n", NS, "--create-namespace", "--wait",
             "--timeout", "5m", "--set", f"registry={REGISTRY}/gpuk8s",
             "--set", f"hostPaths.root={SIM_ROOT}",
             "--set", f"gpuDevice.extraArgs={{--device-path-prefix={SIM_ROOT}}}", *on)
    try:
        pod = wait_until("gpu-exporter ready", lambda: _ready_exporter(lab["node"]), 180)
        yield {**lab, "exporter_ip": pod["status"]["podIP"]}
    finally:
        gpuk8s("sim", "load", "--root", str(SIM_ROOT), "--clear")
        if revision:
            helm("rollback", release, str(revision), "-n", NS, "--wait", "--timeout", "3m")
        else:
            helm("uninstall", release, "-n", NS, "--wait", "--timeout", "3m")


def _ready_exporter(node: str) -> dict[str, Any] | None:
    pods = kubectl_json("-n", NS, "get", "pods", "-l", "app.kubernetes.io/name=gpu-exporter")
    for pod in pods["items"]:
        ready = [c["ready"] for c in pod["status"].get("containerStatuses", [])]
        if pod["spec"].get("nodeName") == node and ready and all(ready):
            return dict(pod)
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def prometheus(exporter: dict[str, str]) -> Iterator[str]:
    binary = shutil.which("prometheus")
    assert binary, "Debian's prometheus is needed (scripts/prereqs integration installs it)"
    work = Path(tempfile.mkdtemp(prefix="gpuk8s-prom-"))
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(REPO / "monitoring" / "prometheus" / "gpuk8s-rules.yml")],
        "scrape_configs": [{
            "job_name": "gpu-exporter",
            "honor_labels": True,
            "static_configs": [{"targets": [f"{exporter['exporter_ip']}:9400"]}],
        }],
    }
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = _free_port()
    log = (work / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [binary, f"--config.file={work / 'prometheus.yml'}",
         f"--storage.tsdb.path={work / 'data'}", "--storage.tsdb.retention.time=7d",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    try:
        def ready() -> bool:
            assert proc.poll() is None, (work / "prometheus.log").read_text()[-2000:]
            try:
                with urllib.request.urlopen(url + "/-/ready", timeout=2) as resp:
                    return resp.status == 200
            except OSError:  # not listening yet
                return False

        wait_until("prometheus ready", ready, 60, interval=0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
        shutil.rmtree(work, ignore_errors=True)


def promql(url: str, query: str) -> list[dict[str, Any]]:
    q = urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(f"{url}/api/v1/query?{q}", timeout=10) as resp:
        data = json.load(resp)
    assert data["status"] == "success", data
    return list(data["data"]["result"])


def scalar(url: str, query: str) -> float | None:
    result = promql(url, query)
    return float(result[0]["value"][1]) if len(result) == 1 else None


def gpu_pod(ns: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "nodeSelector": {"metax-tech.com/gpu.product": "C500"},
            "containers": [{"name": "main", "image": BUSYBOX, "command": ["sleep", "3600"],
                            "resources": {"limits": {"metax-tech.com/gpu": "1"}}}],
        },
    }


def host_pid(ns: str, name: str) -> int:
    """Host PID of the pod's main container process, found through its cgroup."""
    status = kubectl_json("-n", ns, "get", "pod", name)["status"]["containerStatuses"][0]
    cid = status["containerID"].split("://", 1)[1]
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cgroup = Path(f"/proc/{entry}/cgroup").read_text()
            comm = Path(f"/proc/{entry}/comm").read_text().strip()
        except OSError:
            continue
        if cid in cgroup and comm == "sleep":
            return int(entry)
    raise AssertionError(f"no host process of container {cid}")


def gpu_index(ns: str, name: str) -> int:
    card_of = {g["card"]: g["index"] for g in json.loads(
        gpuk8s("sim", "show", "--root", str(SIM_ROOT), "--json"))["gpus"]}
    out = kubectl("-n", ns, "exec", name, "--", "ls", "/dev/dri")
    (card,) = {int(m) for m in re.findall(r"card(\d+)", out)}
    return int(card_of[card])


@pytest.fixture(scope="module")
def loaded_pods(exporter: dict[str, str]) -> Iterator[dict[str, Any]]:
    """Two GPU pods in two namespaces, each given a known load on its GPU."""
    loads = {"e2e-mon-train": ("train", 63, 5200, 5000), "e2e-mon-serve": ("serve", 27, 3100, 3000)}
    for ns in loads:
        kubectl("create", "namespace", ns, check=False)
        wait_until("default sa", lambda ns=ns: kubectl("-n", ns, "get", "sa", "default",
                                                        check=False), 30)
    try:
        pods: dict[str, Any] = {}
        for ns, (name, *_load) in loads.items():
            apply(gpu_pod(ns, name))
        for ns, (name, util, used, proc_mib) in loads.items():
            wait_until(f"{ns}/{name} Running", lambda ns=ns, name=name: pod_phase(ns, name)
                       == "Running", 180)
            index, pid = gpu_index(ns, name), host_pid(ns, name)
            gpuk8s("sim", "load", "--root", str(SIM_ROOT), "--gpu", str(index),
                   "--utilization", str(util), "--memory-used-mib", str(used),
                   "--process", f"{pid}:{proc_mib}")
            pods[ns] = {"pod": name, "gpu": index, "util": util / 100, "used": used * MIB,
                        "process": proc_mib * MIB}
        assert pods["e2e-mon-train"]["gpu"] != pods["e2e-mon-serve"]["gpu"]
        yield pods
    finally:
        gpuk8s("sim", "load", "--root", str(SIM_ROOT), "--clear")
        for ns in loads:
            kubectl("delete", "namespace", ns, "--wait=true", "--timeout=120s", check=False)


def test_promql_node_and_pod_values_equal_the_simulated_load(
    prometheus: str, loaded_pods: dict[str, Any], exporter: dict[str, str]
) -> None:
    node = exporter["node"]
    train, serve = loaded_pods["e2e-mon-train"], loaded_pods["e2e-mon-serve"]

    def equals(query: str, want: float) -> bool:
        got = scalar(prometheus, query)
        return got is not None and abs(got - want) < 1e-9

    def all_equal(expected: dict[str, float]) -> bool:
        # one sample reads mx-smi's memory, dmon and process tables one after the
        # other, so a sample taken while the load changed can hold old and new values:
        # wait until every value of a group is the new one
        return all(equals(query, want) for query, want in expected.items())

    # GPU level, straight from the exporter
    for pod in (train, serve):
        sel = f'{{node="{node}", gpu="{pod["gpu"]}"}}'
        wait_until(f"GPU {pod['gpu']} utilisation and memory", lambda sel=sel, pod=pod: all_equal({
            f"gpuk8s_gpu_utilization_ratio{sel}": pod["util"],
            f"gpuk8s_gpu_memory_used_bytes{sel}": pod["used"],
        }), 90)
    # node level (recording rules): mean utilisation over the 8 GPUs, summed memory
    node_sel = f'{{node="{node}", kind="pGPU"}}'
    wait_until("node utilisation and memory", lambda: all_equal({
        f"node_kind:gpuk8s_gpu_utilization_ratio:avg{node_sel}":
            (train["util"] + serve["util"]) / 8,
        f"node_kind:gpuk8s_gpu_memory_used_bytes:sum{node_sel}": train["used"] + serve["used"],
        f"node_kind:gpuk8s_gpu_memory_total_bytes:sum{node_sel}": 8 * 64 * 1024 * MIB,
        f"node_kind:gpuk8s_gpus:count{node_sel}": 8,
    }), 60)
    # pod level, per namespace and pod: each pod's own GPU and its own process's memory
    for ns, pod in loaded_pods.items():
        sel = f'{{namespace="{ns}", pod="{pod["pod"]}", kind="pGPU"}}'
        wait_until(f"{ns} utilisation and memory", lambda sel=sel, pod=pod: all_equal({
            f"node_namespace_pod_kind:gpuk8s_container_gpu_utilization_ratio:avg{sel}":
                pod["util"],
            f"node_namespace_pod_kind:gpuk8s_container_gpu_memory_used_bytes:sum{sel}":
                pod["process"],
            f"node_namespace_pod_kind:gpuk8s_container_gpu_devices:sum{sel}": 1,
        }), 60)
    # filters: another namespace or kind gives nothing
    assert promql(prometheus, 'node_namespace_pod_kind:gpuk8s_container_gpu_utilization_ratio'
                              ':avg{namespace="e2e-mon-train", pod="serve"}') == []
    assert promql(prometheus, 'node_kind:gpuk8s_gpu_utilization_ratio:avg{kind="MPS"}') == []


def test_gpuk8s_top_reads_the_same_numbers(
    prometheus: str, loaded_pods: dict[str, Any]
) -> None:
    def rows() -> list[dict[str, Any]]:
        out = json.loads(gpuk8s("top", "pods", "--prometheus", prometheus, "--json"))
        return [r for r in out if r["namespace"].startswith("e2e-mon-")]

    def loaded() -> list[dict[str, Any]]:
        # as above: wait until one sample holds the whole new load
        found = rows()
        by_ns = {r["namespace"]: r for r in found}
        return found if len(found) == 2 and all(
            ns in by_ns and by_ns[ns]["pod"] == pod["pod"]
            and by_ns[ns]["utilization_ratio"] == pytest.approx(pod["util"])
            and by_ns[ns]["memory_used_bytes"] == pod["process"]
            for ns, pod in loaded_pods.items()) else []

    found = wait_until("top rows with the simulated load", loaded, 60)
    by_ns = {r["namespace"]: r for r in found}
    # through the API server's pod proxy, no Prometheus: the same rows
    env_rows = json.loads(run(str(Path(run(str(LAB / "pyenv.sh")).stdout.strip()) / "bin/gpuk8s"),
                              "top", "pods", "--kubeconfig", KUBECONFIG, "--json").stdout)
    by_ns_api = {r["namespace"]: r for r in env_rows if r["namespace"].startswith("e2e-mon-")}
    assert {ns: (r["utilization_ratio"], r["memory_used_bytes"]) for ns, r in by_ns_api.items()} \
        == {ns: (r["utilization_ratio"], r["memory_used_bytes"]) for ns, r in by_ns.items()}
