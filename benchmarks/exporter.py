"""gpu-exporter benchmark: /metrics scrape latency and resident memory with 8 and 64
devices, side by side with a baseline measured in the same run.

Each configuration runs the exporter in a process of its own (the same code as
`gpuk8s serve exporter`: discovery, the simulator's mx-smi, a real PodResources gRPC
server, cgroup files for the GPU processes) with every device held by its own pod and
a load on every GPU, so all per-GPU and per-container series are present:

* 8 devices:  c500-8, 8 pods each holding one GPU;
* 64 devices: c500-8 with 8 SR-IOV VFs per GPU, 64 pods each holding one VF (8 pods
  share each GPU; the exporter splits each GPU's load over them).

Baseline: a bare Python process serving an empty prometheus-client registry over
HTTP (the floor of any Python exporter), scraped the same way.

The pod list (container ID -> pod) is given to the exporter process directly instead of
coming from an API server, as in the unit tests; in a pod the exporter fetches it with
the stdlib (kube.InClusterReader), so the official kubernetes client is not loaded
there either. Everything else is the product path.
Targets: scrape p99 < 50 ms, RSS < 60 MB.

    python benchmarks/exporter.py [--scrapes 300] [--interval 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent import futures
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "src"))

from deviceplugin import rss_mb  # noqa: E402  # (benchmarks/ is this script's directory)
from stats import percentile  # noqa: E402

SCRAPE_TARGET_MS = 50.0
RSS_TARGET_MB = 60.0


# ------------------------------------------------------------------ child processes
def serve_exporter(spec_path: str) -> None:
    """Child: the exporter over the prepared node; prints its port, serves forever."""
    from gpuk8s.core.telemetry import ContainerRef
    from gpuk8s.services.exporter import main as exporter_main
    from gpuk8s.services.exporter.metrics import registry_for
    from gpuk8s.services.exporter.pods import PodDirectory
    from gpuk8s.services.exporter.server import ExporterHTTPServer, serve_in_thread

    with open(spec_path, encoding="utf-8") as handle:
        spec = json.load(handle)
    by_id = {cid: ContainerRef(*ref) for cid, ref in spec["containers"].items()}
    by_uid = {uid: [ContainerRef(*ref)] for uid, ref in spec["pods"].items()}
    args = exporter_main.build_parser().parse_args([
        "--host-root", spec["root"], "--proc-dir", spec["proc"], "--node-name", "bench-node",
        "--pod-resources-socket", spec["socket"], "--interval", str(spec["interval"]),
        "--log-dir", "", "--log-level", "error"])
    sampler = exporter_main.build_sampler(args, pods=PodDirectory(lambda: (by_id, by_uid)))
    sampler.sample_once()
    server = ExporterHTTPServer(("127.0.0.1", 0), registry_for(sampler, "bench-node"), sampler,
                                stale_after=60.0)
    sampler.start()
    serve_in_thread(server)
    print(server.port, flush=True)
    while True:
        time.sleep(3600)


def serve_baseline() -> None:
    """Child: an empty prometheus-client registry on its own HTTP server."""
    from prometheus_client import CollectorRegistry, start_http_server

    server, _thread = start_http_server(0, addr="127.0.0.1", registry=CollectorRegistry())
    print(server.server_address[1], flush=True)
    while True:
        time.sleep(3600)


# ------------------------------------------------------------------ the parent side
def prepare(work: str, vfnum: int, interval: float) -> tuple[str, Any]:
    """A simulated node whose every device is held by a pod with a GPU process."""
    from concurrent import futures as fut

    import grpc

    from gpuk8s import sim
    from gpuk8s.services.node.grpcapi import pod_resources_handler, podres, unix_target

    root = os.path.join(work, "node")
    sim.create(root, "c500-8", vfnum=vfnum)
    state = sim.state(root)
    proc = os.path.join(work, "proc")
    devices = []  # (gpu index, device id)
    for gpu in state["gpus"]:
        ids = [vf["bdf"] for vf in gpu["vfs"]] or [gpu["bdf"]]
        devices += [(gpu["index"], d) for d in ids]
    pods, containers, uids, processes = [], {}, {}, {}
    for n, (gpu, device) in enumerate(devices):
        uid = f"00000000-0000-0000-0000-{n:012d}"
        cid = f"{n:064x}"
        pid = 100000 + n
        os.makedirs(os.path.join(proc, str(pid)))
        with open(os.path.join(proc, str(pid), "cgroup"), "w", encoding="utf-8") as handle:
            handle.write(f"0::/kubepods/besteffort/pod{uid}/{cid}\n")
        ref = [f"team-{n % 7}", f"job-{n}", "main"]
        pods.append((ref[0], ref[1], device))
        containers[cid] = ref
        uids[uid] = ref
        processes.setdefault(gpu, []).append({"pid": pid, "memory_mib": 1024,
                                              "utilization": 80 / max(1, vfnum)})
    for gpu, procs in processes.items():
        sim.set_load(root, gpu, utilization=90, processes=procs, temperature=60, power=300)

    def list_pods(request: Any, context: Any) -> Any:
        response = podres.ListPodResourcesResponse()
        for ns, name, device in pods:
            pod = response.pod_resources.add(name=name, namespace=ns)
            pod.containers.add(name="main").devices.add(resource_name="metax-tech.com/gpu",
                                                        device_ids=[device])
        return response

    socket_path = os.path.join(work, "kubelet.sock")
    server = grpc.server(fut.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((pod_resources_handler(
        list_pods, lambda r, c: podres.AllocatableResourcesResponse()),))
    server.add_insecure_port(unix_target(socket_path))
    server.start()
    spec = {"root": root, "proc": proc, "socket": socket_path, "interval": interval,
            "containers": containers, "pods": uids}
    path = os.path.join(work, "spec.json")
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(spec, handle)
    return path, server


def start(argv: list[str]) -> tuple[subprocess.Popen[str], int]:
    env = {**os.environ, "PYTHONPATH": os.path.join(REPO, "src")}
    env["PATH"] = f"{os.path.dirname(sys.executable)}:{env['PATH']}"  # the fake mx-smi's python3
    child = subprocess.Popen([sys.executable, __file__, *argv], stdout=subprocess.PIPE,
                             text=True, env=env)
    assert child.stdout is not None
    line = child.stdout.readline()
    if not line:
        raise SystemExit(f"child {argv} died (rc {child.wait()})")
    return child, int(line)


def scrape_times(port: int, count: int) -> tuple[list[float], int, int]:
    url = f"http://127.0.0.1:{port}/metrics"
    times = []
    size = series = 0
    for _ in range(count):
        t0 = time.perf_counter()
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = resp.read()
        times.append((time.perf_counter() - t0) * 1000)
        size = len(body)
        series = sum(1 for line in body.decode().splitlines() if line and line[0] != "#")
    return times, size, series


def measure(argv: list[str], scrapes: int) -> dict[str, Any]:
    child, port = start(argv)
    try:
        scrape_times(port, 5)  # warm
        times, size, series = scrape_times(port, scrapes)
        with futures.ThreadPoolExecutor(4) as pool:  # four scrapers at once
            parallel = [t for ts in pool.map(lambda _: scrape_times(port, scrapes // 4)[0],
                                             range(4)) for t in ts]
        rss, peak = rss_mb(child.pid)
    finally:
        child.terminate()
        child.wait(timeout=10)
    return {"p50": statistics.median(times), "p99": percentile(times, 0.99), "max": max(times),
            "p99_parallel": percentile(parallel, 0.99), "rss": rss, "peak": peak, "bytes": size,
            "series": series}


def main() -> int:
    if sys.argv[1:2] == ["--serve-exporter"]:
        serve_exporter(sys.argv[2])
        return 0
    if sys.argv[1:2] == ["--serve-baseline"]:
        serve_baseline()
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scrapes", type=int, default=300)
    parser.add_argument("--interval", type=float, default=10.0,
                        help="the exporter's sampling interval during the run (default 10)")
    args = parser.parse_args()
    rows = [("baseline: empty registry", measure(["--serve-baseline"], args.scrapes))]
    for label, vfnum in (("8 devices (8 GPUs)", 0), ("64 devices (8 GPUs x 8 VFs)", 8)):
        with tempfile.TemporaryDirectory(prefix="gpuk8s-bench-") as work:
            spec, server = prepare(work, vfnum, args.interval)
            try:
                rows.append((label, measure(["--serve-exporter", spec], args.scrapes)))
            finally:
                server.stop(0)
    print(f"{'configuration':<30} {'series':>6} {'bytes':>7} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'max ms':>7} {'p99 4x':>7} {'RSS MB':>7} {'peak MB':>8}")
    for label, r in rows:
        print(f"{label:<30} {r['series']:>6} {r['bytes']:>7} {r['p50']:>7.2f} {r['p99']:>7.2f} "
              f"{r['max']:>7.2f} {r['p99_parallel']:>7.2f} {r['rss']:>7.1f} {r['peak']:>8.1f}")
    worst = rows[1:]
    ok = all(r["p99"] < SCRAPE_TARGET_MS and r["peak"] < RSS_TARGET_MB for _, r in worst)
    print(f"targets: scrape p99 < {SCRAPE_TARGET_MS:g} ms, RSS < {RSS_TARGET_MB:g} MB: "
          f"{'met' if ok else 'NOT met'} (p99 4x: four scrapers at once; load average "
          f"{os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
