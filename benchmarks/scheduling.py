#!/usr/bin/env python3
"""Scheduling throughput of the real kube-scheduler with the gpu-aware extender over many
fake GPU nodes, each extender mode side by side with the scheduler alone, in one run.

Needs the lab (`lab/up`, as root; run it under the lab's lock, `lab/lablock.py`). What it does:
1. registers N fake nodes (`lab/fake_nodes.py`, with this Python: Ready,
   `metax-tech.com/gpu`, the device plugin's annotations computed by the product's code)
   and keeps their Leases fresh for the run;
2. starts one extender (`gpuk8s serve extender --node-cache`, this checkout; it answers
   both scheduler modes, the mode is in each request) unless --extender-url names one,
   and waits for /readyz;
3. for each setup (`--setups`, default `none,cache,full`): creates P GPU pods (sizes
   cycling through --sizes) for a scheduler that does not run yet (`schedulerName:
   gpuk8s-bench`), so creation is not measured; starts a second, real kube-scheduler (the
   lab's binary) whose profile calls the extender (filter + prioritize, weight 500, as
   SPEC §7) with `nodeCacheCapable: true` (cache), `false` (full: the SPEC §7 setting) or
   no extender at all (none), client QPS raised so API rate limits do not cap the figure;
   polls until every pod is bound; stops the scheduler and deletes the pods;
4. prints one table: pods/s (first to last bind) per setup and its ratio to the
   scheduler alone, and where the pods went (share per fake-node variant).

    sudo python3 lab/lablock.py python3 benchmarks/scheduling.py --nodes 1000 --pods 1000

Runs with any Python that has this checkout installed (e.g. `.venv/bin/python`).
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
import versions as lab_versions  # noqa: E402  (lab/versions.py: versions.env, GPUK8S_KUBE_VERSION)
from baseline import extract  # noqa: E402  (benchmarks/baseline.py)

KUBECONFIG = os.environ.get("KUBECONFIG", "/etc/kubernetes/admin.conf")  # as lab/fake_nodes.py
NS = "gpuk8s-bench"
SCHEDULER_NAME = "gpuk8s-bench"


def versions() -> dict[str, str]:
    """lab/versions.env for the release this run uses: GPUK8S_KUBE_VERSION, else the lab's
    (lab/up --kube), else KUBE_VERSION."""
    resolved: dict[str, str] = lab_versions.load()
    return resolved


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


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process so far, from /proc (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def fake_nodes_cmd(*args: str) -> list[str]:
    return [sys.executable, str(LAB / "fake_nodes.py"), *args]


def start_extender(
    args: argparse.Namespace,
    work: Path,
    port: int,
    source: Path | None = None,
    extra: tuple[str, ...] = (),
) -> tuple[str, subprocess.Popen[bytes]]:
    """This checkout's extender, or with ``source`` the one of an extracted revision;
    ``extra``: more flags."""
    cmd = args.extender_cmd or (
        f"{sys.executable} -m gpuk8s.cli serve extender --port {{port}} "
        f"--address 127.0.0.1 --kubeconfig {KUBECONFIG} --node-cache --log-format text"
    )
    cmd = cmd.replace("{port}", str(port)) + "".join(f" {flag}" for flag in extra)
    env = dict(os.environ, PYTHONPATH=str(source / "src")) if source else None
    log = open(work / f"extender-{port}.log", "wb")  # noqa: SIM115 (lives with the process)
    proc = subprocess.Popen(cmd.split(), stdout=log, stderr=subprocess.STDOUT, env=env)
    return f"http://127.0.0.1:{port}", proc


def run_setup(
    api: fake_nodes.Api,
    args: argparse.Namespace,
    setup: str,
    extender_url: str | None,
    work: Path,
    extender_pid: int | None,
) -> dict[str, object]:
    """Create the pods, run a scheduler for ``setup`` until all are bound; figures."""
    sizes = [int(s) for s in args.sizes.split(",")]
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
    print(f"[{setup}] pods created: {args.pods} in {time.monotonic() - t0:.1f}s", flush=True)

    config = work / f"scheduler-{setup}.json"
    mode = setup.split("@")[0]
    scheduler_config(
        config,
        extender_url if mode != "none" else None,
        mode in ("cache", "cache-top", "null", "null-scores"),
    )
    sched_log = open(work / f"scheduler-{setup}.log", "wb")  # noqa: SIM115 (as above)
    t_start = time.monotonic()
    sched = subprocess.Popen(
        [cache_bin("kube-scheduler"), f"--config={config}", "--secure-port=0", "--v=1"],
        stdout=sched_log,
        stderr=subprocess.STDOUT,
    )
    first_bind = last_bind = None
    bound = 0
    extender_cpu = cpu_seconds(extender_pid) if extender_pid else 0.0
    sched_cpu = 0.0
    try:
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
            if sched.poll() is not None:
                raise SystemExit(f"kube-scheduler exited; log: {work / f'scheduler-{setup}.log'}")
            time.sleep(0.2)
        sched_cpu = cpu_seconds(sched.pid)
        if extender_pid:
            extender_cpu = cpu_seconds(extender_pid) - extender_cpu
    finally:
        sched.terminate()
        try:
            sched.wait(10)
        except subprocess.TimeoutExpired:
            sched.kill()
    placed = bound_pods(api)
    per_variant: collections.Counter[str] = collections.Counter()
    status, body = api.request("GET", f"/api/v1/nodes?labelSelector={fake_nodes.FAKE_LABEL}%3Dtrue")
    variant_of = {
        n["metadata"]["name"]: n["metadata"]["labels"].get(fake_nodes.VARIANT_LABEL, "?")
        for n in body["items"]
    }
    for node in placed.values():
        if node:
            per_variant[variant_of.get(node, "?")] += 1
    rate = None
    if first_bind is not None and last_bind is not None and bound > 1:
        rate = bound / max(last_bind - first_bind, 1e-3)
    print(f"[{setup}] bound {bound}/{args.pods}; pods/s {rate or 0:.1f}", flush=True)
    delete_namespace(api)
    return {
        "bound": bound,
        "rate": rate,
        "variants": per_variant,
        # CPU per bound pod: where the time goes (the scheduler's own work includes
        # encoding the extender requests and decoding its answers)
        "sched_ms": 1e3 * sched_cpu / max(bound, 1),
        "ext_ms": 1e3 * extender_cpu / max(bound, 1) if mode != "none" else 0.0,
    }


SETUP_NAMES = {
    "none": "no extender (baseline)",
    "cache": "gpu-aware, nodeCacheCapable: true",
    "full": "gpu-aware, nodeCacheCapable: false (SPEC §7)",
    "cache-top": "gpu-aware --prioritize-min-score 10, node cache",
    "null": "null extender, nodeCacheCapable: true",
    "null-full": "null extender, nodeCacheCapable: false",
    "null-scores": "null extender listing every host, node cache",
}
NULL_SETUPS = ("null", "null-full", "null-scores")


def setup_name(setup: str, baseline: str | None) -> str:
    mode, _, base = setup.partition("@")
    return SETUP_NAMES[mode] + (f" @{(baseline or '')[:8]}" if base else "")


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--pods", type=int, default=1000)
    ap.add_argument("--sizes", default="1,2,4,8,1,2,1,4", help="GPU request sizes, cycled")
    ap.add_argument("--variants", default=fake_nodes.DEFAULT_VARIANTS)
    ap.add_argument(
        "--setups",
        default="none,cache,full",
        help="comma list of none (scheduler alone), cache, full, measured in this order; "
        "repeat none (e.g. none,cache,full,none) to average the baseline over the run; "
        "cache@base / full@base use the extender of --baseline; cache-top this checkout's "
        "with --prioritize-min-score 10; null / null-full / null-scores use "
        "benchmarks/null_extender.py (every node passes, every score 0: what the extender "
        "protocol itself costs)",
    )
    ap.add_argument("--extender-url", help="use a running extender (skip starting one)")
    ap.add_argument("--extender-port", type=int, default=18080)
    ap.add_argument(
        "--extender-cmd",
        default=None,
        help="command to start the extender ({port} is replaced); default: this Python's "
        "`gpuk8s serve extender --port {port} --node-cache --kubeconfig admin.conf`",
    )
    ap.add_argument(
        "--baseline", metavar="REF", help="git revision whose extender the @base setups use"
    )
    ap.add_argument("--timeout", type=float, default=600, help="per setup, seconds")
    ap.add_argument("--keep-nodes", action="store_true", help="leave the fake nodes registered")
    args = ap.parse_args()
    setups = [s for s in args.setups.split(",") if s]
    unknown = set(setups) - set(SETUP_NAMES) - {"cache@base", "full@base"}
    if unknown:
        raise SystemExit(
            f"--setups: unknown {sorted(unknown)}; use none, cache, cache-top, full, null, "
            "null-full, null-scores, cache@base, full@base"
        )
    if any(s.endswith("@base") for s in setups) and not args.baseline:
        raise SystemExit("--setups: the @base setups need --baseline REF")

    api = fake_nodes.Api(KUBECONFIG)
    procs: list[subprocess.Popen[bytes]] = []
    work = Path(tempfile.mkdtemp(prefix="gpuk8s-bench-"))
    results: list[tuple[str, dict[str, object]]] = []
    try:
        t0 = time.monotonic()
        heartbeat = open(work / "heartbeat.log", "wb")  # noqa: SIM115 (lives with the process)
        procs.append(
            subprocess.Popen(
                fake_nodes_cmd("heartbeat"), stdout=heartbeat, stderr=subprocess.STDOUT
            )
        )
        subprocess.run(
            fake_nodes_cmd("ensure", str(args.nodes), "--variants", args.variants), check=True
        )
        print(f"fake nodes: {args.nodes} in {time.monotonic() - t0:.1f}s", flush=True)

        extender_url = args.extender_url
        extender_pid = None
        if {s for s in setups if not s.endswith("@base")} - {"none", "cache-top", *NULL_SETUPS}:
            if not extender_url:
                extender_url, proc = start_extender(args, work, args.extender_port)
                procs.append(proc)
                extender_pid = proc.pid
            wait_http(extender_url.rstrip("/") + "/readyz", 120)
        top_url = top_pid = None
        if "cache-top" in setups:  # this checkout, only the best-ranked nodes listed
            top_url, proc = start_extender(
                args, work, args.extender_port + 5, extra=("--prioritize-min-score", "10")
            )
            procs.append(proc)
            top_pid = proc.pid
            wait_http(top_url + "/readyz", 120)
        base_url = base_pid = None
        if any(s.endswith("@base") for s in setups):
            base_url, proc = start_extender(
                args, work, args.extender_port + 1, extract(args.baseline)
            )
            procs.append(proc)
            base_pid = proc.pid
            wait_http(base_url + "/readyz", 120)
        nulls: dict[str, tuple[str, int]] = {}  # setup -> (url, pid)
        for offset, setup in enumerate(sorted(set(setups) & set(NULL_SETUPS)), start=2):
            port = args.extender_port + offset
            log = open(work / f"extender-{port}.log", "wb")  # noqa: SIM115 (as above)
            command = [sys.executable, str(REPO / "benchmarks" / "null_extender.py")]
            command += ["--port", str(port)] + (["--scores"] if setup == "null-scores" else [])
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
            procs.append(proc)
            nulls[setup] = (f"http://127.0.0.1:{port}", proc.pid)
            wait_http(nulls[setup][0] + "/readyz", 60)
        for setup in setups:
            url, pid = (
                (base_url, base_pid) if setup.endswith("@base") else (extender_url, extender_pid)
            )
            if setup in nulls:
                url, pid = nulls[setup]
            elif setup == "cache-top":
                url, pid = top_url, top_pid
            results.append((setup, run_setup(api, args, setup, url, work, pid)))
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        delete_namespace(api)
        if not args.keep_nodes:
            subprocess.run(fake_nodes_cmd("delete"), check=False)

    # the baseline: the mean of the "none" runs (list it first and last to see the drift
    # of a shared machine's load over the run)
    base_rates = [r["rate"] for s, r in results if s == "none" and isinstance(r["rate"], float)]
    base = sum(base_rates) / len(base_rates) if base_rates else None
    print(f"\nscheduling throughput, real kube-scheduler {versions()['KUBE_VERSION']}, one run")
    print(f"  nodes: {args.nodes} fake ({args.variants}); pods: {args.pods}, sizes {args.sizes}")
    print(
        f"  {'setup':<46} {'bound':>11} {'pods/s':>8} {'vs none':>8} "
        f"{'sched CPU ms/pod':>16} {'ext CPU ms/pod':>14}  pods per node variant"
    )
    for setup, r in results:
        rate = r["rate"]
        ratio = f"{100 * rate / base:.0f} %" if isinstance(rate, float) and base else "-"
        variants = r["variants"]
        assert isinstance(variants, collections.Counter)
        print(
            f"  {setup_name(setup, args.baseline):<46} {r['bound']!s:>5}/{args.pods:<5} "
            f"{rate if isinstance(rate, float) else 0.0:>8.1f} {ratio:>8} "
            f"{r['sched_ms']:>16.1f} {r['ext_ms']:>14.1f}  "
            + ", ".join(f"{k}={v}" for k, v in sorted(variants.items()))
        )
    print(f"  logs: {work}")
    return 0 if all(r["bound"] == args.pods for _, r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
