"""gpu-aware latency and throughput over real HTTP.

For 100, 1,000 and 5,000 nodes, in both scheduler modes:

* ``cache``   -- nodeCacheCapable: true; the request carries NodeNames, node states
                 come from the extender's (pre-parsed) node cache;
* ``nocache`` -- nodeCacheCapable: false; every request carries the full NodeList
                 (realistic Node objects, ~5 KB each) and filter echoes the kept ones.

The server runs in its own process pinned to one CPU core (``os.sched_setaffinity``),
the client on another core, over one keep-alive connection, exactly like the
scheduler. One "cycle" is what the scheduler does per pod: filter, then prioritize.
Every node is offered (the worst case; a real scheduler usually sends only the
feasible share it found, e.g. ~10 % of 5,000 nodes). Requests/s: a closed loop of
filter+prioritize pairs for ``--seconds`` on that one server core.

Node states are real: the simulator presets (c500-8, c550-8, mixed-16, c500-8-vf4)
through discovery, random allocations, tables from core.scoring; bound pods hold the
allocated devices, and 1 % of the nodes have a just-bound pod whose GPUs are promised.
Target: p99 < 20 ms for filter+prioritize at 5,000 nodes with the node cache.

``--baseline REF`` measures every row twice, back to back: first with the extender code
of git revision REF (extracted to a temporary directory and put first on the server's
PYTHONPATH), then with the working tree, so before/after come from the same run and the
same machine load. ``--in-process`` times ``Extender.handle`` itself (CPU time of the
call, no HTTP): the cost of decoding, deciding and encoding alone.

``--tls`` measures every row of the working tree twice more, back to back: over plain
HTTP and over HTTPS with client-certificate verification (TLS 1.3, the certificates
made by openssl, one keep-alive connection as kube-scheduler keeps): the cost of TLS
alone. ``--smoke`` is a seconds-long run (100 nodes, node cache, 20 pairs) that checks
the benchmark still works.

Run: python benchmarks/extender.py [--sizes 100,1000,5000] [--cycles 200] [--seconds 5]
                                   [--modes cache,nocache] [--baseline REF] [--in-process]
                                   [--tls] [--smoke]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from baseline import extract  # benchmarks/baseline.py (this directory is on sys.path)
from scheduling import versions  # lab/versions.env: the release the fake kubelets report
from stats import percentile

PRESETS = ("c500-8", "c550-8", "mixed-16", "c500-8-vf4")
GPU = "metax-tech.com/gpu"
VARIANTS_PER_PRESET = 12


# -- node pool (built in the server process and in the client, same seed) ---------------
def annotation_pool(seed: int) -> list[dict[str, str]]:
    from gpuk8s import sim
    from gpuk8s.discovery import discover
    from gpuk8s.services.deviceplugin.nodestate import published_annotations
    from gpuk8s.services.node.devices import DeviceSet

    rng = random.Random(seed)
    pool: list[dict[str, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for preset in PRESETS:
            root = str(Path(tmp) / preset)
            sim.create(root, preset)
            devices = DeviceSet(discover(root), GPU)
            ids = [u.id for u in devices.units]
            for _ in range(VARIANTS_PER_PRESET):
                taken = set(rng.sample(range(len(ids)), rng.randint(0, len(ids) // 2)))
                pool.append(published_annotations(devices, {ids[p] for p in taken}))
    return pool


def node_names(count: int) -> list[str]:
    return [f"gpu-node-{i:05d}" for i in range(count)]


def node_object(
    name: str, annotations: dict[str, str], rng: random.Random, kubelet: str
) -> dict[str, Any]:
    """A Node as the apiserver serves it (labels, status, images: ~5 KB)."""
    return {
        "metadata": {
            "name": name,
            "uid": f"{rng.getrandbits(64):016x}-uid",
            "resourceVersion": "12345",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "metax-tech.com/gpu.installed": "true",
                "metax-tech.com/gpu.product": "C500",
                "metax-tech.com/gpu.vfnum": "0",
                "topology.kubernetes.io/zone": f"zone-{rng.randint(1, 3)}",
            },
            "annotations": {
                **annotations,
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            },
        },
        "spec": {"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24"]},
        "status": {
            "capacity": {"cpu": "128", "memory": "1056499000Ki", "pods": "110", GPU: "8"},
            "allocatable": {"cpu": "127", "memory": "1000000000Ki", "pods": "110", GPU: "8"},
            "conditions": [
                {
                    "type": t,
                    "status": "False" if t != "Ready" else "True",
                    "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                    "reason": f"Kubelet{t}",
                    "message": f"kubelet reports {t}",
                }
                for t in ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")
            ],
            "addresses": [
                {"type": "InternalIP", "address": "10.0.0.1"},
                {"type": "Hostname", "address": name},
            ],
            "nodeInfo": {
                "machineID": "m" * 32,
                "systemUUID": "s" * 36,
                "bootID": "b" * 36,
                "kernelVersion": "6.1.0-25-amd64",
                "osImage": "Debian GNU/Linux 12",
                "containerRuntimeVersion": "containerd://1.7.24",
                "kubeletVersion": kubelet,
                "kubeProxyVersion": kubelet,
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
            "images": [
                {
                    "names": [
                        f"registry.example.com/team/image-{i}@sha256:{'a' * 64}",
                        f"registry.example.com/team/image-{i}:v1.{i}",
                    ],
                    "sizeBytes": 123456789 + i,
                }
                for i in range(8)
            ],
        },
    }


def bound_pods(
    names: list[str], annotations: list[dict[str, str]], seed: int
) -> list[tuple[str, str, int]]:
    """Pods holding each node's allocated devices (one pod per device), plus 1 % of
    nodes with a pod just bound and not yet allocated (promised GPUs)."""
    from gpuk8s.services.extender.nodes import parse_node_state

    rng = random.Random(seed)
    pods = []
    for name, annotation in zip(names, annotations, strict=True):
        for i in range(parse_node_state(name, annotation).allocated):
            pods.append((f"{name}-{i}", name, 1))
    for name in rng.sample(names, max(1, len(names) // 100)):
        pods.append((f"{name}-new", name, rng.choice((1, 2, 4))))
    return pods


def assign(count: int, pool: list[dict[str, str]], seed: int) -> list[dict[str, str]]:
    rng = random.Random(seed + count)
    return [pool[rng.randrange(len(pool))] for _ in range(count)]


# -- server process -------------------------------------------------------------------
def build_extender(count: int, cache_mode: bool, seed: int) -> Any:
    """The extender under test, with its node cache (cache mode) and bound pods."""
    from gpuk8s.core.devicelist import DEVICES_ANNOTATION as DEVICES
    from gpuk8s.services.extender.logic import Extender
    from gpuk8s.services.extender.nodes import BoundPods, NodeCache
    from gpuk8s.services.extender.packing import NO_ALLOCATABLE, NodeRooms, RunningPods
    from gpuk8s.services.extender.weights import Weights, WeightSource

    names = node_names(count)
    annotations = assign(count, annotation_pool(seed), seed)
    cache = None
    rooms = NodeRooms()  # prioritize's view of the nodes (the node watch feeds both)
    if cache_mode:
        cache = NodeCache()
        cache.replace(zip(names, annotations, strict=True))
        rooms.replace(
            (n, a.get(DEVICES), NO_ALLOCATABLE) for n, a in zip(names, annotations, strict=True)
        )
    pods, running = BoundPods(), RunningPods()
    held = bound_pods(names, annotations, seed)
    pods.replace(held)
    running.replace((uid, node, (gpus, 0, 0)) for uid, node, gpus in held)
    # float weights, as parse_weight gives them in production
    return Extender(
        WeightSource(None, Weights(1.0, 1.0)), cache=cache, pods=pods, rooms=rooms, running=running
    )


def serve(count: int, cache_mode: bool, seed: int, core: int, tls_dir: str | None) -> None:
    from gpuk8s.services.extender.server import ExtenderHTTPServer

    os.sched_setaffinity(0, {core})
    options: dict[str, Any] = {}
    if tls_dir:
        from gpuk8s.services.extender.tls import ServerTls, TlsFiles

        d = Path(tls_dir)
        options["tls"] = ServerTls(
            TlsFiles(str(d / "server.crt"), str(d / "server.key"), str(d / "ca.crt"))
        )
    server = ExtenderHTTPServer(
        ("127.0.0.1", 0),
        build_extender(count, cache_mode, seed),
        max_body=512 * 1024 * 1024,
        **options,
    )
    print(server.port, flush=True)
    server.serve_forever()


def make_certs(directory: Path) -> None:
    """A CA, a server certificate for 127.0.0.1 and a client certificate (openssl; RSA
    2048, the keys the chart's sprig genCA/genSignedCert make)."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    key = ("-newkey", "rsa:2048", "-nodes")
    openssl("req", "-x509", *key, "-keyout", "ca.key", "-out", "ca.crt", "-days", "1",
            "-subj", "/CN=bench-ca")
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth"),
                      ("client", "extendedKeyUsage=clientAuth")):
        (directory / f"{name}.ext").write_text(ext + "\n")
        openssl("req", *key, "-keyout", f"{name}.key", "-out", f"{name}.csr",
                "-subj", f"/CN={name}")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", f"{name}.crt", "-days", "1", "-extfile",
                f"{name}.ext")


def inproc(count: int, cache_mode: bool, seed: int, core: int, cycles: int) -> None:
    """Time ``Extender.handle`` in this process (thread CPU time) and print one JSON line."""
    os.sched_setaffinity(0, {core})
    ext = build_extender(count, cache_mode, seed)
    reqs = bodies(count, cache_mode, annotation_pool(seed), seed)
    for body in reqs:  # warm-up: memo and indexes
        ext.handle("filter", body)
        ext.handle("prioritize", body)
    f_ms: list[float] = []
    p_ms: list[float] = []
    for i in range(cycles):
        body = reqs[i % len(reqs)]
        t0 = time.thread_time()
        filtered = ext.handle("filter", body)
        t1 = time.thread_time()
        ranked = ext.handle("prioritize", body)
        t2 = time.thread_time()
        if filtered.status != 200 or ranked.status != 200:
            raise RuntimeError(f"in-process call failed: {filtered.body[:200]!r}")
        f_ms.append((t1 - t0) * 1e3)
        p_ms.append((t2 - t1) * 1e3)
    print(
        json.dumps(
            {
                "filter_p50": percentile(f_ms, 0.5),
                "filter_p99": percentile(f_ms, 0.99),
                "prio_p50": percentile(p_ms, 0.5),
                "prio_p99": percentile(p_ms, 0.99),
                "body_kib": len(reqs[0]) / 1024,
            }
        ),
        flush=True,
    )


# -- client ---------------------------------------------------------------------------
def bodies(
    count: int, cache_mode: bool, pool: list[dict[str, str]], seed: int, variants: int = 4
) -> list[bytes]:
    rng = random.Random(seed)
    names = node_names(count)
    if cache_mode:
        nodes_field: dict[str, Any] = {"NodeNames": names}
    else:
        kubelet = versions()["KUBE_VERSION"]
        items = [
            node_object(n, a, rng, kubelet)
            for n, a in zip(names, assign(count, pool, seed), strict=True)
        ]
        nodes_field = {"Nodes": {"metadata": {}, "items": items}}
    out = []
    for i in range(variants):
        pod = {
            "metadata": {"name": f"job-{i}", "namespace": "ml", "uid": f"uid-{i}"},
            "spec": {
                "containers": [
                    {
                        "name": "main",
                        "image": "x",
                        "resources": {"limits": {GPU: str((1, 2, 4, 8)[i % 4]), "cpu": "4"}},
                    }
                ]
            },
        }
        out.append(json.dumps({"Pod": pod, **nodes_field}).encode())
    return out


def post(conn: http.client.HTTPConnection, verb: str, body: bytes) -> bytes:
    conn.request("POST", f"/{verb}", body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    if resp.status != 200:
        raise RuntimeError(f"{verb}: HTTP {resp.status}: {data[:200]!r}")
    return data


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc (what it really used of its core)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def connect(port: int, tls_dir: str | None) -> http.client.HTTPConnection:
    """One keep-alive connection, as kube-scheduler's; over TLS with the client
    certificate when ``tls_dir`` is given."""
    if not tls_dir:
        return http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    import ssl

    d = Path(tls_dir)
    context = ssl.create_default_context(cafile=str(d / "ca.crt"))
    context.load_cert_chain(str(d / "client.crt"), str(d / "client.key"))
    return http.client.HTTPSConnection("127.0.0.1", port, timeout=120, context=context)


def measure(
    port: int, pid: int, reqs: list[bytes], cycles: int, seconds: float,
    tls_dir: str | None = None,
) -> dict[str, float]:
    conn = connect(port, tls_dir)
    for body in reqs[:2]:  # warm-up (memo fill in nocache mode, connection setup)
        post(conn, "filter", body)
        post(conn, "prioritize", body)
    f_ms: list[float] = []
    p_ms: list[float] = []
    both: list[float] = []
    for i in range(cycles):
        body = reqs[i % len(reqs)]
        t0 = time.perf_counter()
        result = post(conn, "filter", body)
        t1 = time.perf_counter()
        post(conn, "prioritize", body)
        t2 = time.perf_counter()
        f_ms.append((t1 - t0) * 1e3)
        p_ms.append((t2 - t1) * 1e3)
        both.append((t2 - t0) * 1e3)
        if i == 0:
            json.loads(result)  # the answer is valid JSON
    done = 0
    cpu_start = cpu_seconds(pid)
    deadline = time.perf_counter() + seconds
    start = time.perf_counter()
    while time.perf_counter() < deadline:
        body = reqs[done % len(reqs)]
        post(conn, "filter", body)
        post(conn, "prioritize", body)
        done += 1
    elapsed = time.perf_counter() - start
    cpu = cpu_seconds(pid) - cpu_start
    conn.close()
    return {
        "filter_p50": percentile(f_ms, 0.5),
        "filter_p99": percentile(f_ms, 0.99),
        "prio_p50": percentile(p_ms, 0.5),
        "prio_p99": percentile(p_ms, 0.99),
        "both_p50": percentile(both, 0.5),
        "both_p99": percentile(both, 0.99),
        "pairs_per_s": done / elapsed,
        "body_kib": len(reqs[0]) / 1024,
        "cpu_ms_per_pair": cpu * 1e3 / max(done, 1),
    }


def _row(
    count: int, mode: str, code: str, args: argparse.Namespace, server_core: int,
    pool: list[dict[str, str]], env: dict[str, str], tls_dir: str | None = None,
) -> str:
    cycles = args.cycles if mode == "cache" else max(10, args.cycles * 100 // count)
    command = [sys.executable, __file__, "--seed", str(args.seed), "--serve", str(count), mode,
               str(server_core)]
    if tls_dir:
        command += ["--tls-dir", tls_dir]
    if args.in_process:
        out = subprocess.run(
            [*command, "--inproc", str(cycles)], env=env, check=True, capture_output=True,
            text=True,
        ).stdout
        r = json.loads(out.strip().splitlines()[-1])
        return (
            f"{count:>6} {mode:<8} {code:<10} {r['body_kib']:>9.0f} "
            f"{r['filter_p50']:>8.2f} / {r['filter_p99']:>7.2f} "
            f"{r['prio_p50']:>8.2f} / {r['prio_p99']:>7.2f}"
        )
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        reqs = bodies(count, mode == "cache", pool, args.seed)
        r = measure(port, proc.pid, reqs, cycles, args.seconds, tls_dir)
    finally:
        proc.terminate()
        proc.wait(10)
    return (
        f"{count:>6} {mode:<8} {code:<10} {r['body_kib']:>9.0f} "
        f"{r['filter_p50']:>8.2f} / {r['filter_p99']:>7.2f} "
        f"{r['prio_p50']:>8.2f} / {r['prio_p99']:>7.2f} "
        f"{r['both_p50']:>6.2f} / {r['both_p99']:>7.2f} {r['pairs_per_s']:>8.1f} "
        f"{r['cpu_ms_per_pair']:>19.2f} {1e3 / max(r['cpu_ms_per_pair'], 1e-9):>16.1f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="100,1000,5000")
    parser.add_argument("--modes", default="cache,nocache")
    parser.add_argument("--cycles", type=int, default=200, help="filter+prioritize pairs timed")
    parser.add_argument("--seconds", type=float, default=5.0, help="throughput run length")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--baseline", metavar="REF", help="also measure git revision REF")
    parser.add_argument(
        "--in-process", action="store_true", help="time Extender.handle (CPU), no HTTP"
    )
    parser.add_argument(
        "--serve", nargs=3, metavar=("NODES", "MODE", "CORE"), help=argparse.SUPPRESS
    )
    parser.add_argument("--inproc", type=int, metavar="CYCLES", help=argparse.SUPPRESS)
    parser.add_argument(
        "--tls", action="store_true", help="also time every row over HTTPS with client certs"
    )
    parser.add_argument("--smoke", action="store_true", help="a seconds-long check run")
    parser.add_argument("--tls-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        count, mode, core = int(args.serve[0]), args.serve[1] == "cache", int(args.serve[2])
        if args.inproc:
            inproc(count, mode, args.seed, core, args.inproc)
        else:
            serve(count, mode, args.seed, core, args.tls_dir)
        return 0
    if args.smoke:
        args.sizes, args.modes, args.cycles, args.seconds = "100", "cache", 20, 0.5
    if args.tls and args.in_process:
        parser.error("--tls times HTTP: not with --in-process")

    cores = sorted(os.sched_getaffinity(0))
    server_core, client_core = cores[0], cores[-1]
    os.sched_setaffinity(0, {client_core})
    pool = annotation_pool(args.seed)
    codes: list[tuple[str, dict[str, str]]] = []
    if args.baseline:
        base = extract(args.baseline)
        env = dict(os.environ, PYTHONPATH=str(base / "src"))
        codes.append((args.baseline[:10], env))
    codes.append(("worktree", dict(os.environ)))
    print(
        f"python {sys.version.split()[0]}; server pinned to CPU {server_core}, client to "
        f"CPU {client_core}; {args.cycles} timed filter+prioritize pairs per row; "
        f"every node offered; {len(pool)} distinct real node states; nocache rows time "
        f"fewer pairs (scaled by 100/nodes, at least 10); "
        + ("in-process: CPU time of Extender.handle, no HTTP" if args.in_process else "HTTP"),
        flush=True,
    )
    head = (
        f"{'nodes':>6} {'mode':<8} {'code':<10} {'body KiB':>9} {'filter p50/p99 ms':>18} "
        f"{'prioritize p50/p99':>19}"
    )
    if not args.in_process:
        head += (
            f" {'f+p p50/p99 ms':>16} {'pairs/s':>8} {'server CPU ms/pair':>19} "
            f"{'=> pairs/s/core':>16}"
        )
    print(head)
    print("-" * len(head), flush=True)
    with tempfile.TemporaryDirectory() as certs:
        if args.tls:
            make_certs(Path(certs))
        for count in (int(s) for s in args.sizes.split(",")):
            for mode in args.modes.split(","):
                for code, env in codes:
                    print(_row(count, mode, code, args, server_core, pool, env), flush=True)
                if args.tls:  # the same code over TLS, right after its plain row
                    row = _row(count, mode, "tls", args, server_core, pool, dict(os.environ),
                               certs)
                    print(row, flush=True)
    return 0


if __name__ == "__main__":
    threading.current_thread().name = "bench"
    sys.exit(main())
