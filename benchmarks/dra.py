#!/usr/bin/env python3
"""gpu-dra through the real kube-scheduler on many fake nodes, in one run:

1. **placement** -- one pod per fake node with a claim for k >= 2 GPUs (k cycling through
   --sizes), pinned to its node, twice: plain claims (``count: k``) and claims with
   ``matchAttribute: gpu.metax-tech.com/linkGroup``. For each allocation: did it land inside
   one link group (counted where the node had a group with k free GPUs), and is it the set
   SPEC §3's allocator (``core.allocator``) chooses on that node's free GPUs?
2. **throughput** -- P pods (sizes cycling, free placement) scheduled by a fresh kube-scheduler,
   pods/s from first to last bind: DRA claims, next to ``metax-tech.com/gpu`` extended
   resources with the scheduler alone and with gpu-aware (node cache), on the same nodes;
3. **the driver** -- gpu-dra itself (in this process, on a simulated c500-8, against the
   lab's API server): how long until its slices are readable through the API after start,
   and NodePrepareResources per claim (p50/p99 over --prepares, the kubelet's gRPC call on
   its socket; claims allocated by the scheduler, unprepared between rounds).

Fake nodes: ``lab/fake_nodes.py ensure N --dra`` (the device plugin's view and gpu-dra's:
slices in the steering order, used GPUs held by allocated claims). Needs the lab with its
DRA feature gates (lab/up) and runs under the lab's lock (``lab/lablock.py``):

    python3 lab/lablock.py .venv/bin/python benchmarks/dra.py --nodes 500 --pods 500

On 2 cores the real scheduler binds DRA claims at well under 1 pod/s on 500 nodes, so
``--placement-pods N`` places claims on the first N nodes only (the whole cluster keeps
publishing its slices, so every scheduling cycle still sees all of them).
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import scheduling
from scheduling import KUBECONFIG, REPO, cache_bin, fake_nodes, fake_nodes_cmd
from stats import percentile

from gpuk8s.core.allocator import allocate
from gpuk8s.core.dra import DRIVER, PoolOptions, device_index
from gpuk8s.core.topology import Topology, units_for_inventory

NS = "gpuk8s-bench-dra"
SCHEDULER = "gpuk8s-bench-dra"
RES = "/apis/resource.k8s.io/v1"
PREPARE_NODE = "gpuk8s-bench-dra-prepare"


# ----------------------------------------------------------------------------- objects
def claim(name: str, size: int, link: bool) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": [{"name": "gpus", "exactly": {
        "deviceClassName": DRIVER, "count": size}}]}
    if link:
        devices["constraints"] = [{"matchAttribute": f"{DRIVER}/linkGroup"}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NS}, "spec": {"devices": devices}}


def claim_pod(name: str, node: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": SCHEDULER,
        "nodeSelector": {fake_nodes.FAKE_LABEL: "true"},
        "tolerations": [{"key": fake_nodes.FAKE_LABEL, "operator": "Exists",
                         "effect": "NoSchedule"}],
        "terminationGracePeriodSeconds": 0,
        "resourceClaims": [{"name": "gpus", "resourceClaimName": name}],
        "containers": [{"name": "c", "image": "127.0.0.1:5000/gpuk8s/lab-busybox:1.0",
                        "resources": {"claims": [{"name": "gpus"}],
                                      "requests": {"cpu": "10m", "memory": "16Mi"}}}],
    }
    if node:
        spec["nodeSelector"]["kubernetes.io/hostname"] = node
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "labels": {"app": "gpuk8s-bench"}},
            "spec": spec}


def ok(status: int, body: Any, what: str, allowed: tuple[int, ...] = (200, 201)) -> Any:
    if status not in allowed:
        raise SystemExit(f"{what}: HTTP {status}: {body}")
    return body


def fresh_namespace(api: fake_nodes.Api) -> None:
    delete_namespace(api)
    ok(*api.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                   "metadata": {"name": NS}}), "namespace")
    for _ in range(60):
        if api.request("GET", f"/api/v1/namespaces/{NS}/serviceaccounts/default")[0] == 200:
            return
        time.sleep(0.5)


def delete_namespace(api: fake_nodes.Api) -> None:
    api.request("DELETE", f"/api/v1/namespaces/{NS}/pods?gracePeriodSeconds=0")
    api.request("DELETE", f"/api/v1/namespaces/{NS}")
    for _ in range(180):
        if api.request("GET", f"/api/v1/namespaces/{NS}")[0] == 404:
            return
        time.sleep(1)


def create_all(api: fake_nodes.Api, items: list[tuple[str, dict[str, Any]]]) -> None:
    def one(item: tuple[str, dict[str, Any]]) -> None:
        ok(*api.request("POST", item[0], item[1]), item[1]["metadata"]["name"])

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, items))


def device_classes(api: fake_nodes.Api) -> list[str]:
    """The chart's DeviceClasses, created where missing; the names created."""
    helm = subprocess.run(["bash", str(REPO / "lab" / "tools.sh"), "helm"], capture_output=True,
                          text=True, check=True).stdout.strip()
    out = subprocess.run([helm, "template", "r", str(REPO / "charts" / "metax-gpu-extensions"),
                          "--set", "gpuDra.enabled=true", "--show-only",
                          "templates/gpu-dra.yaml"], capture_output=True, text=True,
                         check=True).stdout
    import yaml

    created = []
    for doc in yaml.safe_load_all(out):
        if doc and doc["kind"] == "DeviceClass":
            status, _ = api.request("POST", f"{RES}/deviceclasses", doc)
            if status == 201:
                created.append(doc["metadata"]["name"])
    return created


# ----------------------------------------------------------------------------- scheduler
def start_scheduler(work: Path, tag: str, gates: str) -> subprocess.Popen[bytes]:
    config = work / f"scheduler-{tag}.json"
    config.write_text(json.dumps({
        "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": KUBECONFIG, "qps": 5000, "burst": 10000},
        "leaderElection": {"leaderElect": False},
        "profiles": [{"schedulerName": SCHEDULER}]}))
    log = open(work / f"scheduler-{tag}.log", "wb")  # noqa: SIM115 (lives with the process)
    return subprocess.Popen([cache_bin("kube-scheduler"), f"--config={config}",
                             "--secure-port=0", f"--feature-gates={gates}", "--v=1"],
                            stdout=log, stderr=subprocess.STDOUT)


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


def unbound(api: fake_nodes.Api) -> int:
    status, body = api.request(
        "GET", f"/api/v1/namespaces/{NS}/pods?fieldSelector=spec.nodeName%3D")
    return len(ok(status, body, "pods")["items"])


def wait_bound(api: fake_nodes.Api, count: int, timeout: float,
               proc: subprocess.Popen[bytes]) -> tuple[int, float | None]:
    """(bound pods, pods/s from first to last bind)."""
    first = last = None
    bound = 0
    deadline = time.monotonic() + timeout
    quiet_since = time.monotonic()
    while time.monotonic() < deadline:
        now_bound = count - unbound(api)
        now = time.monotonic()
        if now_bound and first is None:
            first = now
        if now_bound > bound:
            last, bound, quiet_since = now, now_bound, now
        if bound >= count or (bound and now - quiet_since > 20):
            break  # all bound, or nothing moved for 20 s (the rest cannot fit)
        if proc.poll() is not None:
            raise SystemExit("kube-scheduler exited; see its log")
        time.sleep(0.2)
    rate = bound / max(last - first, 1e-3) if first is not None and last and bound > 1 else None
    return bound, rate


def allocations(api: fake_nodes.Api) -> dict[str, list[str]]:
    status, body = api.request("GET", f"{RES}/namespaces/{NS}/resourceclaims")
    out = {}
    for item in ok(status, body, "claims")["items"]:
        results = ((item.get("status") or {}).get("allocation") or {}).get("devices", {})
        out[item["metadata"]["name"]] = [r["device"] for r in results.get("results") or []
                                         if r.get("driver") == DRIVER]
    return out


# ----------------------------------------------------------------------------- 1: placement
def placement(api: fake_nodes.Api, args: argparse.Namespace, nodes: list[tuple[str, str]],
              work: Path, link: bool) -> dict[str, Any]:
    sizes = [int(s) for s in args.sizes.split(",") if int(s) >= 2]
    fresh_namespace(api)
    want = {}
    items = []
    for i, (node, variant) in enumerate(nodes):
        name, size = f"p-{i:05d}", sizes[i % len(sizes)]
        want[name] = (node, variant, size)
        items.append((f"{RES}/namespaces/{NS}/resourceclaims", claim(name, size, link)))
        items.append((f"/api/v1/namespaces/{NS}/pods", claim_pod(name, node)))
    create_all(api, items)
    sched = start_scheduler(work, f"placement-{'link' if link else 'plain'}", args.gates)
    try:
        bound, _ = wait_bound(api, len(nodes), args.timeout, sched)
    finally:
        stop(sched)
    got = allocations(api)
    counted = in_group = group_possible = spec_equal = fits = 0
    missed: collections.Counter[str] = collections.Counter()  # a free group, no allocation
    for name, (_node, variant, size) in want.items():
        preset, used = fake_nodes.parse_variant(variant)
        inventory = fake_nodes.preset_inventory(preset)
        topology = Topology.from_inventory(inventory, units_for_inventory(inventory))
        free = [u.id for u in topology.units if u.gpu not in used]
        groups = collections.Counter(g.link_group for g in inventory.gpus
                                     if g.index not in used and g.link_group is not None)
        possible = any(n >= size for n in groups.values())
        fits += len(free) >= size
        devices = got.get(name) or []
        if not devices:
            if possible:
                missed[f"{variant} k={size}"] += 1
            continue
        counted += 1
        by_name = device_index(inventory, PoolOptions())  # names are the cards' addresses
        gpus = sorted(g for d in devices for g in by_name[d].gpus)
        spec = sorted(topology.units[topology.position[u]].gpu
                      for u in allocate(topology, free, size).devices)
        spec_equal += gpus == spec
        if possible:
            group_possible += 1
            in_group += len({inventory.gpu(g).link_group for g in gpus}) == 1
    delete_namespace(api)
    return {"bound": bound, "pods": len(nodes), "fit": fits, "allocated": counted,
            "group_possible": group_possible, "in_group": in_group, "spec_equal": spec_equal,
            "missed": dict(missed)}


# ----------------------------------------------------------------------------- 2: throughput
def dra_throughput(api: fake_nodes.Api, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    sizes = [int(s) for s in args.sizes.split(",")]
    fresh_namespace(api)
    items = []
    for i in range(args.pods):
        name = f"t-{i:05d}"
        items.append((f"{RES}/namespaces/{NS}/resourceclaims",
                      claim(name, sizes[i % len(sizes)], False)))
        items.append((f"/api/v1/namespaces/{NS}/pods", claim_pod(name, None)))
    create_all(api, items)
    load = [os.getloadavg()[0]]  # the rate moves with the machine's load: say it
    sched = start_scheduler(work, "throughput", args.gates)
    try:
        bound, rate = wait_bound(api, args.pods, args.timeout, sched)
    finally:
        stop(sched)
    load.append(os.getloadavg()[0])
    delete_namespace(api)
    return {"bound": bound, "rate": rate, "load": load}


def extended_throughput(api: fake_nodes.Api, args: argparse.Namespace, work: Path,
                        procs: list[subprocess.Popen[bytes]]) -> dict[str, dict[str, Any]]:
    """scheduling.py's setups on the same fake nodes: the scheduler alone and gpu-aware."""
    out = {}
    bench = argparse.Namespace(pods=args.pods, sizes=args.sizes, timeout=args.timeout,
                               extender_cmd=None)
    url, proc = scheduling.start_extender(bench, work, args.extender_port)
    procs.append(proc)
    scheduling.wait_http(url + "/readyz", 120)
    for setup in ("none", "cache"):
        result = scheduling.run_setup(api, bench, setup, url if setup != "none" else None,
                                      work, proc.pid if setup != "none" else None)
        out[setup] = result
    return out


# ----------------------------------------------------------------------------- 3: the driver
def driver_figures(api: fake_nodes.Api, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    import grpc

    from gpuk8s import sim
    from gpuk8s.discovery import discover
    from gpuk8s.services.dra.driver import KubeClaims
    from gpuk8s.services.dra.grpcapi import DRA_V1, DraPluginStub, drav1
    from gpuk8s.services.dra.main import DraApp, DraConfig
    from gpuk8s.services.dra.publisher import KubeSlices
    from gpuk8s.services.kube import api_client
    from gpuk8s.services.node.grpcapi import unix_target

    root = work / "sim"
    sim.create(str(root), "c500-8")
    inventory = discover(str(root))
    fake_nodes.ensure_node(api, PREPARE_NODE, "c500-8", True)
    base = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))
    config = DraConfig(host_root=str(root), node_name=PREPARE_NODE,
                       plugin_dir=str(base / "p"), registry_dir=str(base / "r"),
                       cdi_dir=str(base / "cdi"), healthy_interval=0.0)
    client = api_client(KUBECONFIG)
    app = DraApp(config, inventory, claims=KubeClaims(client), slices=KubeSlices(client))
    started = time.monotonic()
    app.start()
    publish_s = None
    while time.monotonic() - started < 30:
        status, body = api.request(
            "GET", f"{RES}/resourceslices?fieldSelector=spec.nodeName%3D{PREPARE_NODE}")
        if status == 200 and sum(len(s["spec"].get("devices") or []) for s in body["items"]) \
                == 14:
            publish_s = time.monotonic() - started
            break
        time.sleep(0.01)
    fresh_namespace(api)
    names = [f"prep-{i}" for i in range(8)]
    create_all(api, [(f"{RES}/namespaces/{NS}/resourceclaims", claim(n, 1, False))
                     for n in names] + [(f"/api/v1/namespaces/{NS}/pods",
                                         claim_pod(n, PREPARE_NODE)) for n in names])
    sched = start_scheduler(work, "prepare", args.gates)
    try:
        wait_bound(api, len(names), args.timeout, sched)
    finally:
        stop(sched)
    uids = {}
    for name in names:
        status, body = api.request("GET", f"{RES}/namespaces/{NS}/resourceclaims/{name}")
        uids[name] = ok(status, body, name)["metadata"]["uid"]
    times: list[float] = []
    errors = 0
    with grpc.insecure_channel(unix_target(config.plugin_dir + "/dra.sock")) as channel:
        stub = DraPluginStub(channel, DRA_V1)
        rounds = max(1, args.prepares // len(names))
        for _ in range(rounds):
            for name in names:
                request = drav1.NodePrepareResourcesRequest(claims=[
                    drav1.Claim(namespace=NS, uid=uids[name], name=name)])
                t0 = time.perf_counter()
                response = stub.NodePrepareResources(request, timeout=10)
                times.append(time.perf_counter() - t0)
                errors += bool(response.claims[uids[name]].error)
            stub.NodeUnprepareResources(drav1.NodeUnprepareResourcesRequest(claims=[
                drav1.Claim(namespace=NS, uid=uids[n], name=n) for n in names]), timeout=10)
    app.stop()
    delete_namespace(api)
    fake_nodes.delete_node(api, PREPARE_NODE)
    p50, p99 = percentile(times, 0.5), percentile(times, 0.99)
    if p50 is None or p99 is None:
        raise RuntimeError("no NodePrepareResources call was timed (--prepares 0?)")
    return {"publish_s": publish_s, "prepares": len(times), "errors": errors,
            "p50_ms": 1e3 * p50, "p99_ms": 1e3 * p99}


# ----------------------------------------------------------------------------- main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=500)
    ap.add_argument("--pods", type=int, default=500, help="throughput run")
    ap.add_argument("--placement-pods", type=int, default=0,
                    help="placement runs: one claim on each of the first N fake nodes (all of "
                         "the cluster's --nodes stay registered and publish slices); 0: every "
                         "node")
    ap.add_argument("--sizes", default="1,2,4,8,1,2,1,4", help="GPU request sizes, cycled "
                    "(the placement run uses those >= 2)")
    ap.add_argument("--variants", default="c500-8,c550-8,c500-8:used=0+4,c500-8:used=0+1,"
                    "c500-8:used=1,c500-8:used=0+1+2+3,c500-8:used=2+5,mixed-16:used=0+8")
    ap.add_argument("--prepares", type=int, default=400)
    ap.add_argument("--extender-port", type=int, default=18090)
    ap.add_argument("--timeout", type=float, default=600, help="per run, seconds")
    ap.add_argument("--keep-nodes", action="store_true")
    ap.add_argument("--no-groups", action="store_true",
                    help="fake nodes publish only their GPUs, no link-group devices (what "
                         "partitionable devices cost the scheduler's allocator)")
    args = ap.parse_args()
    args.placement_pods = args.placement_pods or args.nodes
    if not 0 < args.placement_pods <= args.nodes:
        raise SystemExit(f"--placement-pods: 1..{args.nodes} (--nodes), or 0 for all")
    args.gates = scheduling.versions()["KUBE_FEATURE_GATES"]
    api = fake_nodes.Api(KUBECONFIG)
    work = Path(tempfile.mkdtemp(prefix="gpuk8s-bench-dra-"))
    procs: list[subprocess.Popen[bytes]] = []
    created: list[str] = []
    results: dict[str, Any] = {}
    variants = [v for v in args.variants.split(",") if v]
    try:
        created = device_classes(api)
        heartbeat = open(work / "heartbeat.log", "wb")  # noqa: SIM115 (lives with the process)
        procs.append(subprocess.Popen(fake_nodes_cmd("heartbeat"), stdout=heartbeat,
                                      stderr=subprocess.STDOUT))
        t0 = time.monotonic()
        subprocess.run(fake_nodes_cmd("ensure", str(args.nodes), "--variants", args.variants,
                                      "--dra", *(["--dra-no-groups"] if args.no_groups
                                                 else [])), check=True)
        print(f"fake nodes: {args.nodes} with slices in {time.monotonic() - t0:.1f}s",
              flush=True)
        nodes = [(f"fake-gpu-{i:04d}", variants[i % len(variants)])
                 for i in range(args.placement_pods)]
        results["plain"] = placement(api, args, nodes, work, link=False)
        results["link"] = placement(api, args, nodes, work, link=True)
        results["dra"] = dra_throughput(api, args, work)
        results.update(extended_throughput(api, args, work, procs))
        results["driver"] = driver_figures(api, args, work)
    finally:
        for proc in reversed(procs):
            stop(proc)
        delete_namespace(api)
        if not args.keep_nodes:
            subprocess.run(fake_nodes_cmd("delete"), check=False)
        for name in created:
            api.request("DELETE", f"{RES}/deviceclasses/{name}")
    report(args, results, work)
    return 0


def pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f} % ({part}/{whole})" if whole else "-"


def report(args: argparse.Namespace, results: dict[str, Any], work: Path) -> None:
    print(f"\ngpu-dra, real kube-scheduler {scheduling.versions()['KUBE_VERSION']}, one run; "
          f"{args.nodes} fake nodes ({args.variants})"
          f"{', GPUs only (no group devices)' if args.no_groups else ''}")
    print(f"placement of one k >= 2 claim on each of {args.placement_pods} of the "
          f"{args.nodes} nodes (sizes "
          f"{','.join(s for s in args.sizes.split(',') if int(s) >= 2)}):")
    print(f"  {'claim':<34} {'allocated':>16} {'in one link group':>24} "
          f"{'= SPEC §3 choice':>22}")
    for key, label in (("plain", "count: k"), ("link", "count: k + matchAttribute linkGroup")):
        r = results.get(key)
        if r:
            print(f"  {label:<34} {pct(r['allocated'], r['pods']):>16} "
                  f"{pct(r['in_group'], r['group_possible']):>24} "
                  f"{pct(r['spec_equal'], r['allocated']):>22}")
            if r.get("missed"):
                print(f"    not allocated although a link group had k free GPUs: "
                      f"{', '.join(f'{k} x{n}' for k, n in sorted(r['missed'].items()))}")
    print(f"scheduling throughput, {args.pods} pods, sizes {args.sizes}, free placement:")
    base = (results.get("none") or {}).get("rate")
    for key, label in (("none", "metax-tech.com/gpu, scheduler alone"),
                       ("cache", "metax-tech.com/gpu + gpu-aware (node cache)"),
                       ("dra", "DRA claims (gpu.metax-tech.com)")):
        r = results.get(key)
        if r:
            rate = r.get("rate") or 0.0
            ratio = f"{100 * rate / base:.0f} %" if base else "-"
            print(f"  {label:<46} bound {r['bound']:>5}/{args.pods:<5} {rate:>8.1f} pods/s "
                  f"{ratio:>6} of the scheduler alone")
    if (results.get("dra") or {}).get("load"):
        before, after = results["dra"]["load"]
        print(f"  (DRA run on {os.cpu_count()} CPUs, 1-minute load average {before:.1f} before, "
              f"{after:.1f} after: compare absolute rates only at like load)")
    d = results.get("driver")
    if d:
        publish = f"{d['publish_s']:.2f} s" if d["publish_s"] is not None else "not within 30 s"
        print(f"gpu-dra: slices readable {publish} after start (target <= 2 s); "
              f"NodePrepareResources p50 {d['p50_ms']:.1f} ms, p99 {d['p99_ms']:.1f} ms over "
              f"{d['prepares']} prepares, {d['errors']} errors (target p99 <= 100 ms)")
    print(f"  logs: {work}")


if __name__ == "__main__":
    sys.exit(main())
