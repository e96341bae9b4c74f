#!/usr/bin/env python3
"""Scheduling throughput of the real kube-scheduler with the gpu-aware extender over many
fake GPU nodes (issue 7, item 8; target >= 200 pods/s over 1,000 nodes).

Needs the lab (`lab/up`, as root). What it does:
1. registers N fake nodes (`lab/fake-nodes N`: Ready, `metax-tech.com/gpu`, the device
   plugin's annotations computed by the product's code);
2. starts the extender (`gpuk8s serve extender --port P --kubeconfig admin.conf`, unless
   --extender-url names a running one) and waits for /healthz;
3. creates P GPU pods (request sizes cycling through --sizes) for a scheduler that does not
   run yet (`schedulerName: gpuk8s-bench`), so creation is not measured;
4. starts a second, real kube-scheduler (the lab's binary) with a KubeSchedulerConfiguration
   whose profile `gpuk8s-bench` calls the extender (filter + prioritize, weight 500, as SPEC
   §7), client QPS raised so API rate limits do not cap the figure;
5. polls until every pod is bound and prints: pods/s (first bind to last bind), pods/s from
   scheduler start, and the share of pods on each fake-node variant.

    sudo python3 benchmarks/scheduling.py --nodes 1000 --pods 1000
    sudo python3 benchmarks/scheduling.py --no-extender      # baseline: default plugins only

Runs with the lab venv's python (`$(lab/pyenv.sh)/bin/python`) or any python with PyYAML.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAB = REPO / "lab"
sys.path.insert(0, str(LAB))
import fake_nodes  # noqa: E402  (lab/fake_nodes.py: the API client and node variants)

KUBECONFIG = "/etc/kubernetes/admin.conf"
NS = "gpuk8s-bench"
SCHEDULER_NAME = "gpuk8s-bench"


def versions() -> dict[str, str]:
    out = {}
    for line in (LAB / "versions.env").read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            out[key] = value
    return out


def cache_bin(name: str) -> str:
    cache = Path(os.environ.get("GPUK8S_CACHE", "/var/cache/gpuk8s"))
    return str(cache / "bin" / f"kube-{versions()['KUBE_VERSION']}" / name)


def scheduler_config(path: Path, extender_url: str | None, node_cache: bool) -> None:
    cfg: dict[str, object] = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": KUBECONFIG, "qps": 5000, "burst": 10000},
        "leaderElection": {"leaderElect": False},
        "profiles": [{"schedulerName": SCHEDULER_NAME}],
    }
    if extender_url:
        cfg["extenders"] = [
            {
                "urlPrefix": extender_url,
                "enableHTTPS": False,
                "filterVerb": "filter",
                "prioritizeVerb": "prioritize",
                "nodeCacheCapable": node_cache,
                "ignorable": False,
                "weight": 500,
                "managedResources": [{"name": "metax-tech.com/gpu", "ignoredByScheduler": False}],
            }
        ]
    path.write_text(json.dumps(cfg, indent=2))


def pod(name: str, size: int) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {"app": "gpuk8s-bench"}},
        "spec": {
            "schedulerName": SCHEDULER_NAME,
            "nodeSelector": {fake_nodes.FAKE_LABEL: "true"},
            "tolerations": [
                {"key": fake_nodes.FAKE_LABEL, "operator": "Exists", "effect": "NoSchedule"}
            ],
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "c",
                    "image": "127.0.0.1:5000/gpuk8s/lab-busybox:1.0",
                    "resources": {
                        "limits": {"metax-tech.com/gpu": str(size)},
                        "requests": {"cpu": "10m", "memory": "16Mi"},
                    },
                }
            ],
        },
    }


def wait_http(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{url} did not answer within {timeout}s")


def bound_pods(api: fake_nodes.Api) -> dict[str, str]:
    status, body = api.request(
        "GET", f"/api/v1/namespaces/{NS}/pods?labelSelector=app%3Dgpuk8s-bench"
    )
    if status != 200:
        raise SystemExit(f"listing pods: HTTP {status}")
    return {p["metadata"]["name"]: p["spec"].get("nodeName", "") for p in body["items"]}


def unbound_count(api: fake_nodes.Api) -> int:
    """Pods still waiting for a node (a shrinking list: cheap to poll while measuring)."""
    status, body = api.request(
        "GET",
        f"/api/v1/namespaces/{NS}/pods?labelSelector=app%3Dgpuk8s-bench&fieldSelector=spec.nodeName%3D",
    )
    if status != 200:
        raise SystemExit(f"listing pods: HTTP {status}")
    return len(body["items"])


def delete_namespace(api: fake_nodes.Api) -> None:
    api.request(
        "DELETE",
        f"/api/v1/namespaces/{NS}/pods?labelSelector=app%3Dgpuk8s-bench&gracePeriodSeconds=0",
    )
    api.request("DELETE", f"/api/v1/namespaces/{NS}")
    for _ in range(120):
        if api.request("GET", f"/api/v1/namespaces/{NS}")[0] == 404:
            return
        time.sleep(1)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--pods", type=int, default=1000)
    ap.add_argument("--sizes", default="1,2,4,8,1,2,1,4", help="GPU request sizes, cycled")
    ap.add_argument("--variants", default=fake_nodes.DEFAULT_VARIANTS)
    ap.add_argument("--extender-url", help="use a running extender (skip starting one)")
    ap.add_argument("--extender-port", type=int, default=18080)
    ap.add_argument(
        "--extender-cmd",
        default=None,
        help="command to start the extender ({port} is replaced); default: the lab venv's "
        "`gpuk8s serve extender --port {port} --kubeconfig admin.conf`",
    )
    ap.add_argument(
        "--node-cache", action="store_true", help="nodeCacheCapable: true (extender --node-cache)"
    )
    ap.add_argument(
        "--no-extender", action="store_true", help="baseline: no extender in the profile"
    )
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--keep-nodes", action="store_true", help="leave the fake nodes registered")
    args = ap.parse_args()

    api = fake_nodes.Api(KUBECONFIG)
    sizes = [int(s) for s in args.sizes.split(",")]
    procs: list[subprocess.Popen[bytes]] = []
    work = Path(tempfile.mkdtemp(prefix="gpuk8s-bench-"))
    try:
        t0 = time.monotonic()
        subprocess.run(
            [str(LAB / "fake-nodes"), str(args.nodes), "--variants", args.variants], check=True
        )
        print(f"fake nodes: {args.nodes} in {time.monotonic() - t0:.1f}s", flush=True)

        extender_url = None
        if not args.no_extender:
            extender_url = args.extender_url
            if not extender_url:
                venv = subprocess.run(
                    [str(LAB / "pyenv.sh")], check=True, capture_output=True, text=True
                ).stdout.strip()
                cmd = args.extender_cmd or (
                    f"{venv}/bin/gpuk8s serve extender --port {{port}} "
                    f"--address 127.0.0.1 --kubeconfig {KUBECONFIG}"
                    + (" --node-cache" if args.node_cache else "")
                )
                cmd = cmd.replace("{port}", str(args.extender_port))
                log = open(work / "extender.log", "wb")  # noqa: SIM115 (lives as long as the process)
                procs.append(subprocess.Popen(cmd.split(), stdout=log, stderr=subprocess.STDOUT))
                extender_url = f"http://127.0.0.1:{args.extender_port}"
            wait_http(extender_url.rstrip("/") + "/healthz", 60)

        delete_namespace(api)
        status, body = api.request(
            "POST",
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
        )
        if status not in (201, 409):
            raise SystemExit(f"namespace: HTTP {status}: {body}")
        for _ in range(60):  # pods need the default ServiceAccount
            if api.request("GET", f"/api/v1/namespaces/{NS}/serviceaccounts/default")[0] == 200:
                break
            time.sleep(0.5)
        t0 = time.monotonic()
        names = [f"bench-{i:05d}" for i in range(args.pods)]

        def create(i: int) -> None:
            status, body = api.request(
                "POST", f"/api/v1/namespaces/{NS}/pods", pod(names[i], sizes[i % len(sizes)])
            )
            if status != 201:
                raise SystemExit(f"pod {names[i]}: HTTP {status}: {body}")

        with ThreadPoolExecutor(16) as pool:
            list(pool.map(create, range(args.pods)))
        print(
            f"pods created: {args.pods} in {time.monotonic() - t0:.1f}s (not measured)", flush=True
        )

        config = work / "scheduler.json"
        scheduler_config(config, extender_url, args.node_cache)
        sched_log = open(work / "scheduler.log", "wb")  # noqa: SIM115 (as above)
        t_start = time.monotonic()
        procs.append(
            subprocess.Popen(
                [cache_bin("kube-scheduler"), f"--config={config}", "--secure-port=0", "--v=1"],
                stdout=sched_log,
                stderr=subprocess.STDOUT,
            )
        )
        first_bind = last_bind = None
        bound = 0
        deadline = t_start + args.timeout
        while time.monotonic() < deadline:
            now_bound = args.pods - unbound_count(api)
            now = time.monotonic()
            if now_bound and first_bind is None:
                first_bind = now
            if now_bound > bound:
                last_bind = now
                bound = now_bound
            if bound >= args.pods:
                break
            if procs[-1].poll() is not None:
                raise SystemExit(f"kube-scheduler exited; log: {work / 'scheduler.log'}")
            time.sleep(0.2)
        placed = bound_pods(api)
        per_variant: collections.Counter[str] = collections.Counter()
        status, body = api.request(
            "GET", f"/api/v1/nodes?labelSelector={fake_nodes.FAKE_LABEL}%3Dtrue"
        )
        variant_of = {
            n["metadata"]["name"]: n["metadata"]["labels"].get(fake_nodes.VARIANT_LABEL, "?")
            for n in body["items"]
        }
        for node in placed.values():
            if node:
                per_variant[variant_of.get(node, "?")] += 1
        mode = (
            "no extender"
            if args.no_extender
            else f"extender {extender_url} nodeCacheCapable={args.node_cache}"
        )
        print(f"\nscheduling throughput, real kube-scheduler {versions()['KUBE_VERSION']}, {mode}")
        print(
            f"  nodes: {args.nodes} fake ({args.variants}); pods: {args.pods}, sizes {args.sizes}"
        )
        print(f"  bound: {bound}/{args.pods}")
        if first_bind is not None and last_bind is not None and bound > 1:
            span = max(last_bind - first_bind, 1e-3)
            print(f"  throughput (first to last bind): {bound / span:.1f} pods/s over {span:.2f}s")
            print(
                f"  throughput (from scheduler start): {bound / (last_bind - t_start):.1f} pods/s"
            )
        print(
            "  pods per node variant: "
            + ", ".join(f"{k}={v}" for k, v in sorted(per_variant.items()))
        )
        print(f"  logs: {work}")
        return 0 if bound == args.pods else 1
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        delete_namespace(api)
        if not args.keep_nodes:
            subprocess.run([str(LAB / "fake-nodes"), "0"], check=False)


if __name__ == "__main__":
    sys.exit(main())
