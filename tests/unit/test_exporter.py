"""gpu-exporter against simulator loads: every metric is checked against a value the
test set with ``gpuk8s sim load`` (or the simulator API behind it).

The kubelet's PodResources API is a real gRPC server on a unix socket (the same
handler the device-plugin tests use); PIDs map to containers through cgroup files in a
directory given as ``--proc-dir`` (the e2e test uses the real /proc of real pods).
"""

from __future__ import annotations

import http.server
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent import futures
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuk8s import sim
from gpuk8s.cli import main as cli_main
from gpuk8s.core.gpuusage import MPS, PGPU, VGPU, attribute
from gpuk8s.core.model import Gpu, NodeInventory, Sriov, SriovState
from gpuk8s.core.telemetry import (
    MIB,
    ContainerDevices,
    ContainerRef,
    GpuProcess,
    GpuSample,
    NodeTelemetry,
)
from gpuk8s.discovery import discover, telemetry
from gpuk8s.services.exporter import main as exporter_main
from gpuk8s.services.exporter.cgroups import container_of, parse_cgroup
from gpuk8s.services.exporter.metrics import METRICS, registry_for
from gpuk8s.services.exporter.nvml import NvmlReader
from gpuk8s.services.exporter.pods import PodDirectory, PodIndex
from gpuk8s.services.exporter.sampler import PROBLEM_CLASSES
from gpuk8s.services.exporter.server import ExporterHTTPServer, serve_in_thread
from gpuk8s.services.kube import TemporaryApiError
from gpuk8s.services.node.grpcapi import pod_resources_handler, podres, unix_target
from gpuk8s.services.node.podresources import PodResourcesClient

pytestmark = pytest.mark.usefixtures("fast_python3")

GIB = 1024 * MIB
UID_A = "11111111-2222-3333-4444-555555555555"
UID_B = "66666666-7777-8888-9999-000000000000"
CID = {name: (name * 64)[:64] for name in ("a", "b", "c")}


# ----------------------------------------------------------------- discovery telemetry
def test_mx_smi_telemetry_reports_the_simulated_load(tmp_path: Path) -> None:
    root = str(tmp_path / "node")
    sim.create(root, "c500-8")
    sim.set_load(root, 2, utilization=70, memory_used_mib=5000, temperature=61, power=250.5,
                 ecc_corrected=3, ecc_uncorrected=1,
                 processes=[{"pid": 4242, "memory_mib": 3000}, {"pid": 4343, "memory_mib": 1000}])
    got = telemetry(root, "metax")
    assert got.source == "mx-smi" and got.problems == () and got.driver_version == "2.32.0.6"
    assert len(got.gpus) == 8
    busy = got.gpu("0000:05:00.0")
    assert busy == GpuSample("0000:05:00.0", 0.70, 5000 * MIB, 65536 * MIB, 61.0, 250.0, 3, 1)
    idle = got.gpu("0000:03:00.0")
    assert idle is not None and idle.utilization_ratio == 0.0 and idle.memory_used_bytes == 0
    assert got.processes == (
        GpuProcess(4242, "0000:05:00.0", 3000 * MIB, None, "python3"),
        GpuProcess(4343, "0000:05:00.0", 1000 * MIB, None, "python3"),
    )


def test_mx_smi_numbering_skips_a_missing_gpu(tmp_path: Path) -> None:
    """mx-smi numbers visible GPUs only: with GPU 0 unbound, GPU#0 is the second GPU."""
    root = str(tmp_path / "node")
    sim.create(root, "c500-8")
    sim.set_load(root, 1, utilization=40, processes=[{"pid": 7, "memory_mib": 10}])
    sim.fail(root, 0, "unbind")
    got = telemetry(root, "metax")
    assert got.gpu("0000:03:00.0") is None
    assert got.processes == (GpuProcess(7, "0000:04:00.0", 10 * MIB, None, "python3"),)
    assert got.gpu("0000:04:00.0").utilization_ratio == 0.40  # type: ignore[union-attr]


def test_sim_load_rejects_impossible_loads(tmp_path: Path, capsys: Any) -> None:
    root = str(tmp_path / "node")
    sim.create(root, "c500-8")
    assert cli_main(["sim", "load", "--root", root, "--gpu", "0", "--utilization", "120"]) == 2
    assert "utilization: 120.0 is outside 0..100" in capsys.readouterr().err
    assert cli_main(["sim", "load", "--root", root, "--gpu", "0", "--process", "1:2000",
                     "--memory-used-mib", "1000"]) == 2
    assert "between the processes' 2000 MiB" in capsys.readouterr().err
    assert cli_main(["sim", "load", "--root", root, "--gpu", "0", "--process", "x"]) == 2
    assert "PID:MIB" in capsys.readouterr().err
    assert cli_main(["sim", "load", "--root", root, "--gpu", "0", "--utilization", "30",
                     "--process", "5:100:20", "--process", "6:100:15"]) == 2
    assert "exceed the GPU's 30.0 %" in capsys.readouterr().err
    assert sim.state(root).get("processes", []) == []  # nothing half-applied
    assert cli_main(["sim", "load", "--root", root, "--gpu", "0", "--utilization", "30",
                     "--process", "5:100:20"]) == 0
    assert cli_main(["sim", "load", "--root", root, "--clear"]) == 0
    assert telemetry(root, "metax").gpu("0000:03:00.0").utilization_ratio == 0.0  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def nvidia_root(tmp_path_factory: pytest.TempPathFactory) -> str:
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.fail("a C compiler is needed to build the simulated libnvidia-ml.so.1")
    root = str(tmp_path_factory.mktemp("nv") / "node")
    sim.create(root, "nvidia-8")
    return root


def test_nvml_and_nvidia_smi_report_the_same_load(nvidia_root: str) -> None:
    """NVML (pynvml over the simulated libnvidia-ml.so.1) agrees with nvidia-smi, and
    adds per-process utilisation. On a lent H100 the same comparison runs against the
    real driver."""
    root = nvidia_root
    sim.set_load(root, 1, utilization=60, memory_used_mib=4000, temperature=55, power=301,
                 ecc_corrected=2, processes=[{"pid": 4242, "memory_mib": 2048, "utilization": 35},
                                            {"pid": 4343, "memory_mib": 1024, "utilization": 20}])
    via_nvml = NvmlReader(root).read()
    via_smi = telemetry(root, "nvidia")
    assert via_nvml.problems == () and via_smi.problems == ()
    assert via_nvml.source == "nvml" and via_nvml.driver_version == "550.54.15"
    assert via_nvml.gpus == via_smi.gpus
    busy = via_nvml.gpu("0000:04:00.0")
    assert busy == GpuSample("0000:04:00.0", 0.60, 4000 * MIB, 81559 * MIB, 55.0, 301.0, 2, 0)
    assert [(p.pid, p.memory_bytes) for p in via_nvml.processes or ()] == [
        (p.pid, p.memory_bytes) for p in via_smi.processes or ()
    ] == [(4242, 2048 * MIB), (4343, 1024 * MIB)]
    assert [p.utilization_ratio for p in via_nvml.processes or ()] == [0.35, 0.20]
    assert [p.utilization_ratio for p in via_smi.processes or ()] == [None, None]
    # a load change shows at the next read (the library re-reads the simulator's state)
    sim.set_load(root, 1, utilization=10, processes=[])
    again = NvmlReader(root).read()
    assert again.gpu("0000:04:00.0").utilization_ratio == 0.10  # type: ignore[union-attr]
    assert again.processes == ()


def test_nvml_reports_a_lost_gpu_as_a_problem(nvidia_root: str) -> None:
    sim.fail(nvidia_root, 3, "fault")
    try:
        got = NvmlReader(nvidia_root).read()
        assert len(got.gpus) == 7 and "0000:06:00.0" not in {g.address for g in got.gpus}
        assert any("GPU is lost" in p for p in got.problems)
    finally:
        sim.heal(nvidia_root)


def test_nvml_reads_its_own_root_after_another_roots_library_was_loaded(
    nvidia_root: str, tmp_path: Path
) -> None:
    """Another copy of libnvidia-ml.so.1 loaded earlier in the process (discovery's, a
    test's, another root's) is not what the reader asks: by soname the loader would hand
    out that first copy. Two roots with different loads, read one after the other."""
    import ctypes

    other = str(tmp_path / "other")
    sim.create(other, "t4-2")
    ctypes.CDLL(f"{other}/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1")  # stays loaded
    first = NvmlReader(other).read()
    assert first.problems == () and len(first.gpus) == 2
    sim.set_load(nvidia_root, 2, utilization=70)
    try:
        got = NvmlReader(nvidia_root).read()
        assert got.problems == () and len(got.gpus) == 8
        assert got.gpu("0000:05:00.0").utilization_ratio == 0.70  # type: ignore[union-attr]
        assert len(NvmlReader(other).read().gpus) == 2
    finally:
        sim.set_load(nvidia_root, 2, utilization=0)


def test_nvml_without_a_library_says_so(tmp_path: Path) -> None:
    root = str(tmp_path / "node")
    sim.create(root, "nogpu")
    got = NvmlReader(root).read()
    assert got.gpus == () and "libnvidia-ml.so.1 not found" in got.problems[0]


# ----------------------------------------------------------------------- attribution
def _gpu(index: int, vfs: tuple[str, ...] = ()) -> Gpu:
    sriov = Sriov(SriovState.ON, 8, len(vfs), vfs) if vfs else Sriov()
    return Gpu(index=index, pci_address=f"0000:0{index + 3}:00.0", vendor="metax",
               vendor_id=0x9999, device_id=0x4001, product="C500", uuid=f"GPU-{index}",
               sriov=sriov)


INV = NodeInventory("metax", gpus=(_gpu(0), _gpu(1), _gpu(2, ("0000:05:00.1", "0000:05:00.2"))))
A = ContainerRef("team-a", "train", "main")
B = ContainerRef("team-b", "serve", "main")


def _usage(tele: NodeTelemetry, holdings: list[ContainerDevices],
           owners: dict[int, ContainerRef | None] | None,
           assigned: dict[tuple[str, str], tuple[int, ...]] | None = None,
           ) -> dict[tuple[str, int], Any]:
    usage = attribute(INV, tele, holdings, owners, {}, assigned=assigned)
    return {(c.container.namespace, c.gpu.index): c for c in usage.containers}


def test_an_exclusive_gpu_is_its_container_s() -> None:
    tele = NodeTelemetry("metax", "mx-smi", gpus=(GpuSample("0000:03:00.0", 0.5, 6 * GIB),),
                         processes=(GpuProcess(10, "0000:03:00.0", 4 * GIB),
                                    GpuProcess(11, "0000:03:00.0", 1 * GIB)))
    holdings = [ContainerDevices(A, "metax-tech.com/gpu", ("0000:03:00.0",))]
    got = _usage(tele, holdings, {10: A, 11: None})[("team-a", 0)]
    # its own process plus one in no known container (the GPU is its alone)
    assert (got.memory_used_bytes, got.utilization_ratio, got.kind) == (5 * GIB, 0.5, PGPU)
    assert got.utilization_exact and got.memory_exact
    # no PID ownership at all: the GPU's own figures, memory flagged approximate
    got = _usage(tele, holdings, None)[("team-a", 0)]
    assert (got.memory_used_bytes, got.utilization_ratio, got.memory_exact) == (
        6 * GIB, 0.5, False)


def test_a_shared_gpu_is_split_by_process_never_repeated() -> None:
    """Two pods on one GPU (fractional / MPS sharing): memory from each pod's own
    processes; utilisation per process where the backend has it (exact), otherwise an
    even split over the pods with a process on the GPU (estimated)."""
    # the kubelet's replica ids name GPUs 1 and 2 (it picks them at random); the pods'
    # gpuk8s.io/sharing.assigned annotations put both on GPU 0
    holdings = [ContainerDevices(A, "nvidia.com/mps-core", ("GPU-1::0",)),
                ContainerDevices(B, "nvidia.com/mps-core", ("GPU-2::1",))]
    assigned = {("team-a", "train"): (0,), ("team-b", "serve"): (0,)}
    owners: dict[int, ContainerRef | None] = {10: A, 20: B, 21: B}
    nvml = NodeTelemetry("nvidia", "nvml", gpus=(GpuSample("0000:03:00.0", 0.9, 10 * GIB),),
                         processes=(GpuProcess(10, "0000:03:00.0", 2 * GIB, 0.6),
                                    GpuProcess(20, "0000:03:00.0", 3 * GIB, 0.2),
                                    GpuProcess(21, "0000:03:00.0", 1 * GIB, 0.1)))
    got = _usage(nvml, holdings, owners, assigned)
    a, b = got[("team-a", 0)], got[("team-b", 0)]
    assert (a.memory_used_bytes, b.memory_used_bytes) == (2 * GIB, 4 * GIB)
    assert (a.utilization_ratio, b.utilization_ratio) == (0.6, pytest.approx(0.3))
    assert a.utilization_exact and b.utilization_exact and a.kind == b.kind == MPS
    smi = NodeTelemetry("nvidia", "nvidia-smi", gpus=nvml.gpus, processes=tuple(
        GpuProcess(p.pid, p.address, p.memory_bytes) for p in nvml.processes or ()))
    got = _usage(smi, holdings, owners, assigned)
    a, b = got[("team-a", 0)], got[("team-b", 0)]
    assert (a.utilization_ratio, b.utilization_ratio) == (0.45, 0.45)  # 0.9 split, not 0.9 each
    assert not a.utilization_exact and not b.utilization_exact
    # without PID ownership a shared GPU is not guessed at
    got = _usage(smi, holdings, None, assigned)
    assert got[("team-a", 0)].memory_used_bytes is None
    assert got[("team-a", 0)].utilization_ratio is None
    usage = attribute(INV, smi, holdings, owners, {}, assigned=assigned)
    assert [(g.gpu.index, g.kind, g.holders) for g in usage.gpus] == [
        (0, MPS, 2), (1, PGPU, 0), (2, VGPU, 0)]


def test_shared_holdings_go_to_the_assigned_gpus_or_nowhere() -> None:
    """Replica ids of the sharing resources say nothing of the GPU: the assignment does.
    Its ids are spread over the assigned GPUs (vcuda 50 % = 50 ids on one GPU; 2 whole
    GPUs = 200 ids, 100 on each); without an assignment they are unknown devices, and
    neither the replicas' GPU nor its kind is touched."""
    tele = NodeTelemetry("metax", "mx-smi", gpus=())
    sgpu = [ContainerDevices(A, "metax-tech.com/sgpu", ("0000:03:00.0::4",)),
            ContainerDevices(B, "metax-tech.com/sgpu", ("0000:03:00.0::9", "0000:03:00.0::2"))]
    usage = attribute(INV, tele, sgpu, None, {},
                      assigned={("team-a", "train"): (1,), ("team-b", "serve"): (1, 2)})
    assert [(c.container.namespace, c.gpu.index, c.devices, c.kind) for c in usage.containers] \
        == [("team-a", 1, 1, VGPU), ("team-b", 1, 1, VGPU), ("team-b", 2, 1, VGPU)]
    assert [(g.gpu.index, g.kind, g.holders) for g in usage.gpus] == [
        (0, PGPU, 0), (1, VGPU, 2), (2, VGPU, 1)]
    assert usage.unknown_devices == ()
    # no assignment (the pod list is not readable): not on GPU 0 either
    usage = attribute(INV, tele, sgpu, None, {}, assigned={("team-b", "serve"): (2,)})
    assert [(c.container.namespace, c.gpu.index, c.devices) for c in usage.containers] == [
        ("team-b", 2, 2)]
    assert usage.unknown_devices == ("0000:03:00.0::4",)
    assert (usage.gpus[0].gpu.index, usage.gpus[0].kind) == (0, PGPU)
    vcuda = [ContainerDevices(A, "tencent.com/vcuda-core",
                              tuple(f"0000:03:00.0::{n}" for n in range(50))),
             ContainerDevices(B, "tencent.com/vcuda-core",
                              tuple(f"0000:04:00.0::{n}" for n in range(200)))]
    usage = attribute(INV, tele, vcuda, None, {},
                      assigned={("team-a", "train"): (2,), ("team-b", "serve"): (0, 1)})
    assert [(c.container.namespace, c.gpu.index, c.devices) for c in usage.containers] == [
        ("team-a", 2, 50), ("team-b", 0, 100), ("team-b", 1, 100)]


def test_vfs_are_vgpu_and_idle_holders_get_zero() -> None:
    holdings = [ContainerDevices(A, "metax-tech.com/gpu", ("0000:05:00.1",)),
                ContainerDevices(B, "metax-tech.com/gpu", ("0000:05:00.2", "bogus-id"))]
    tele = NodeTelemetry("metax", "mx-smi", gpus=(GpuSample("0000:05:00.0", 0.4, 3 * GIB),),
                         processes=(GpuProcess(10, "0000:05:00.0", 3 * GIB),))
    usage = attribute(INV, tele, holdings, {10: A}, {})
    got = {c.container.namespace: c for c in usage.containers}
    assert got["team-a"].kind == VGPU and got["team-a"].utilization_ratio == 0.4
    assert got["team-b"].utilization_ratio == 0.0 and got["team-b"].memory_used_bytes == 0
    assert usage.unknown_devices == ("bogus-id",)
    capped = attribute(INV, tele, holdings, {10: A}, {}, max_containers=1)
    assert len(capped.containers) == 1 and capped.dropped_containers == 1


# --------------------------------------------------------------------- PID -> container
@pytest.mark.parametrize(("text", "want"), [
    ("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
     f"{UID_A.replace('-', '_')}.slice/cri-containerd-{CID['a']}.scope\n", (UID_A, CID["a"])),
    (f"4:memory:/kubepods/besteffort/pod{UID_B}/{CID['b']}\n0::/\n", (UID_B, CID["b"])),
    (f"0::/../../kubepods-besteffort-pod{UID_A.replace('-', '_')}.slice/crio-{CID['c']}.scope",
     (UID_A, CID["c"])),
    ("0::/user.slice/user-0.slice/session-1.scope\n", None),
    (f"0::/kubepods/besteffort/pod{UID_A}\n", None),  # the pod's own cgroup, no container
])
def test_parse_cgroup(text: str, want: tuple[str, str] | None) -> None:
    assert parse_cgroup(text) == want


def test_pod_directory_refreshes_for_new_containers_only_so_often() -> None:
    now = [100.0]
    calls: list[int] = []
    index: PodIndex = ({CID["a"]: A}, {UID_A: [A]})

    def lister() -> PodIndex:
        calls.append(1)
        return index

    pods = PodDirectory(lister, min_refresh=5, max_age=60, clock=lambda: now[0])
    assert pods.resolve(UID_A, CID["a"]) == A and len(calls) == 1
    assert pods.resolve(UID_B, CID["b"]) is None and len(calls) == 1  # too soon to relist
    now[0] += 6
    index = ({CID["a"]: A, CID["b"]: B}, {UID_A: [A], UID_B: [B]})
    assert pods.resolve(UID_B, CID["b"]) == B and len(calls) == 2
    assert pods.resolve(UID_B, "f" * 64) == B  # unknown container of a one-container pod


# ------------------------------------------------------------------ the whole exporter
class PodResourcesServer:
    """The kubelet side of PodResources v1 with several containers per pod."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.pods: list[tuple[str, str, list[tuple[str, str, list[str]]]]] = []
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        self.server.add_generic_rpc_handlers((pod_resources_handler(self._list, self._alloc),))
        self.server.add_insecure_port(unix_target(path))
        self.server.start()

    def _list(self, request: Any, context: Any) -> Any:
        response = podres.ListPodResourcesResponse()
        for namespace, name, containers in self.pods:
            pod = response.pod_resources.add(name=name, namespace=namespace)
            for cname, resource, ids in containers:
                pod.containers.add(name=cname).devices.add(resource_name=resource, device_ids=ids)
        return response

    def _alloc(self, request: Any, context: Any) -> Any:
        return podres.AllocatableResourcesResponse()


def _write_proc(proc: Path, pid: int, uid: str, cid: str) -> None:
    (proc / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "cgroup").write_text(f"0::/kubepods/besteffort/pod{uid}/{cid}\n")


@pytest.fixture
def exporter(tmp_path: Path) -> Iterator[dict[str, Any]]:
    root = str(tmp_path / "node")
    sim.create(root, "c500-8")
    podres_server = PodResourcesServer(str(tmp_path / "kubelet.sock"))
    proc = tmp_path / "proc"
    proc.mkdir()
    pods = {"index": PodIndex(
        {CID["a"]: A, CID["b"]: B, CID["c"]: ContainerRef("team-b", "serve", "sidecar")},
        {UID_A: [A], UID_B: [B, ContainerRef("team-b", "serve", "sidecar")]},
    )}
    args = exporter_main.build_parser().parse_args([
        "--host-root", root, "--proc-dir", str(proc), "--node-name", "gpu-node-1",
        "--pod-resources-socket", podres_server.path, "--port", "0", "--address", "127.0.0.1",
        "--log-dir", "",
    ])
    sampler = exporter_main.build_sampler(
        args, pods=PodDirectory(lambda: pods["index"], min_refresh=0, max_age=0))
    server = ExporterHTTPServer(("127.0.0.1", 0), registry_for(sampler, "gpu-node-1"), sampler,
                                stale_after=30.0)
    serve_in_thread(server)
    try:
        yield {"root": root, "podres": podres_server, "proc": proc, "sampler": sampler,
               "url": f"http://127.0.0.1:{server.port}", "args": args, "pods": pods}
    finally:
        server.shutdown()
        server.server_close()
        podres_server.server.stop(0)


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(metrics: dict[Any, float], name: str, **labels: str) -> float:
    found = [v for (n, lab), v in metrics.items()
             if n == name and all(dict(lab).get(k) == w for k, w in labels.items())]
    assert len(found) == 1, f"{name} {labels}: {len(found)} series"
    return found[0]


def test_metrics_per_gpu_and_per_container(exporter: dict[str, Any]) -> None:
    root, proc = exporter["root"], exporter["proc"]
    # team-a/train holds GPU 1 alone; team-b/serve's two containers share GPU 2
    exporter["podres"].pods = [
        ("team-a", "train", [("main", "metax-tech.com/gpu", ["0000:04:00.0"])]),
        ("team-b", "serve", [("main", "metax-tech.com/gpu", ["0000:05:00.0"]),
                             ("sidecar", "metax-tech.com/gpu", ["0000:05:00.0"])]),
    ]
    _write_proc(proc, 1001, UID_A, CID["a"])
    _write_proc(proc, 2001, UID_B, CID["b"])
    _write_proc(proc, 2002, UID_B, CID["c"])
    sim.set_load(root, 1, utilization=63, memory_used_mib=5200, temperature=58, power=212,
                 processes=[{"pid": 1001, "memory_mib": 5000}])
    sim.set_load(root, 2, utilization=80, memory_used_mib=9000, ecc_uncorrected=4,
                 processes=[{"pid": 2001, "memory_mib": 6000}, {"pid": 2002, "memory_mib": 2000}])
    exporter["sampler"].sample_once()
    m = scrape(exporter["url"])
    node = {"node": "gpu-node-1"}
    assert value(m, "gpuk8s_gpu_utilization_ratio", gpu="1", **node) == 0.63
    assert value(m, "gpuk8s_gpu_memory_used_bytes", gpu="1") == 5200 * MIB
    assert value(m, "gpuk8s_gpu_memory_total_bytes", gpu="1") == 64 * GIB
    assert value(m, "gpuk8s_gpu_temperature_celsius", gpu="1") == 58
    assert value(m, "gpuk8s_gpu_power_watts", gpu="1") == 212
    assert value(m, "gpuk8s_gpu_ecc_errors_total", gpu="2", type="uncorrected") == 4
    assert value(m, "gpuk8s_gpu_healthy", gpu="1") == 1
    assert value(m, "gpuk8s_gpu_containers", gpu="2") == 2
    assert value(m, "gpuk8s_gpu_info", gpu="1", pci_address="0000:04:00.0", product="C500") == 1
    assert value(m, "gpuk8s_gpu_driver_info", driver_version="2.32.0.6", source="mx-smi") == 1
    assert value(m, "gpuk8s_gpu_utilization_ratio", gpu="1", kind="pGPU") == 0.63
    a = {"namespace": "team-a", "pod": "train", "container": "main", "gpu": "1"}
    assert value(m, "gpuk8s_container_gpu_utilization_ratio", **a) == 0.63
    assert value(m, "gpuk8s_container_gpu_memory_used_bytes", **a) == 5000 * MIB
    assert value(m, "gpuk8s_container_gpu_utilization_exact", **a) == 1
    main = {"namespace": "team-b", "pod": "serve", "container": "main", "gpu": "2"}
    side = {**main, "container": "sidecar"}
    assert value(m, "gpuk8s_container_gpu_memory_used_bytes", **main) == 6000 * MIB
    assert value(m, "gpuk8s_container_gpu_memory_used_bytes", **side) == 2000 * MIB
    assert value(m, "gpuk8s_container_gpu_utilization_ratio", **main) == 0.40
    assert value(m, "gpuk8s_container_gpu_utilization_exact", **side) == 0
    # no series for GPUs nobody holds, none with a pid label anywhere
    assert not [k for k in m if k[0].startswith("gpuk8s_container") and dict(k[1])["gpu"] == "0"]
    assert not [k for k in m if "pid" in dict(k[1])]
    # the pod goes away: its series go with it (a collector, not a registry of gauges)
    exporter["podres"].pods = []
    exporter["sampler"].sample_once()
    m = scrape(exporter["url"])
    assert not [k for k in m if k[0].startswith("gpuk8s_container")]


def test_a_failing_gpu_shows_unhealthy(exporter: dict[str, Any]) -> None:
    sim.fail(exporter["root"], 5, "fault")
    exporter["sampler"].sample_once()
    m = scrape(exporter["url"])
    assert value(m, "gpuk8s_gpu_healthy", gpu="5") == 0
    assert value(m, "gpuk8s_gpu_healthy", gpu="4") == 1


SGPU = "metax-tech.com/sgpu"


def _assignment(gpus: list[int]) -> str:
    return json.dumps({"container": "main", "core": 50, "gpus": gpus, "memoryMiB": 0,
                       "mode": "sgpu", "node": "gpu-node-1", "whole": False})


def test_shared_pods_are_metered_on_their_assigned_gpu(exporter: dict[str, Any]) -> None:
    """Two sGPU pods whose kubelet replica ids both name GPU 0 (the kubelet picks them at
    random) run on GPU 5, as their gpuk8s.io/sharing.assigned annotations say: their
    series carry gpu 5, GPU 5 is vGPU with 2 holders, GPU 0 stays an idle pGPU."""
    root, proc = exporter["root"], exporter["proc"]
    exporter["podres"].pods = [
        ("team-a", "train", [("main", SGPU, ["0000:03:00.0::3"])]),
        ("team-b", "serve", [("main", SGPU, ["0000:03:00.0::11"])]),
    ]
    from gpuk8s.services.exporter.pods import index_pods

    def pod(ns: str, name: str, uid: str, cid: str) -> dict[str, Any]:
        return {"metadata": {"uid": uid, "namespace": ns, "name": name,
                             "annotations": {"gpuk8s.io/sharing.assigned": _assignment([5])}},
                "status": {"containerStatuses": [{"name": "main",
                                                  "containerID": f"containerd://{cid}"}]}}

    exporter["pods"]["index"] = index_pods([pod("team-a", "train", UID_A, CID["a"]),
                                            pod("team-b", "serve", UID_B, CID["b"])])
    _write_proc(proc, 1001, UID_A, CID["a"])
    _write_proc(proc, 2001, UID_B, CID["b"])
    sim.set_load(root, 5, utilization=70, processes=[{"pid": 1001, "memory_mib": 3000},
                                                     {"pid": 2001, "memory_mib": 1000}])
    exporter["sampler"].sample_once()
    m = scrape(exporter["url"])
    for ns, pod_name, mib in (("team-a", "train", 3000), ("team-b", "serve", 1000)):
        sel = {"namespace": ns, "pod": pod_name}
        assert value(m, "gpuk8s_container_gpu_devices", **sel) == 1
        assert value(m, "gpuk8s_container_gpu_memory_used_bytes", gpu="5", kind="vGPU",
                     **sel) == mib * MIB
    assert value(m, "gpuk8s_gpu_containers", gpu="5", kind="vGPU") == 2
    assert value(m, "gpuk8s_gpu_containers", gpu="0", kind="pGPU") == 0
    assert value(m, "gpuk8s_exporter_unknown_devices") == 0
    # pods without an assignment: their ids name no GPU, GPU 0 is untouched
    exporter["pods"]["index"] = PodIndex({}, {})
    exporter["sampler"].sample_once()
    m = scrape(exporter["url"])
    assert not [k for k in m if k[0].startswith("gpuk8s_container")]
    assert value(m, "gpuk8s_gpu_containers", gpu="0", kind="pGPU") == 0
    assert value(m, "gpuk8s_exporter_unknown_devices") == 2


def _gpu_series(m: dict[Any, float], name: str) -> dict[str, tuple[str, float]]:
    """gpu label -> (uuid, value) of one per-GPU metric."""
    out = {}
    for (n, labels), v in m.items():
        if n == name:
            lab = dict(labels)
            out[lab["gpu"]] = (lab["uuid"], v)
    return out


def _render(sampler: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client import generate_latest

    text = generate_latest(registry_for(sampler, "gpu-node-1")).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_a_gpu_that_leaves_the_bus_stays_lost_under_its_own_labels(
    exporter: dict[str, Any], capsys: Any
) -> None:
    """`sim fail --mode remove` (hot-unplug): GPU 3 stays as lost (lost 1, healthy 0, its
    uuid), through rediscovery (which renumbers the GPUs above it) and a restart of the
    exporter (the book is a file under the host root), and its neighbours keep their
    labels; `gpuk8s exporter forget 3` ends it, and only a lost GPU can be forgotten."""
    root, sampler, args = exporter["root"], exporter["sampler"], exporter["args"]
    before = _gpu_series(_render_after(sampler), "gpuk8s_gpu_healthy")
    assert sorted(before) == [str(n) for n in range(8)]
    sim.fail(root, 3, "remove")
    expected = {**{g: (u, 1.0) for g, (u, _) in before.items()}, "3": (before["3"][0], 0.0)}
    for step in ("stale inventory", "rediscovered"):
        if step == "rediscovered":
            sampler.rediscover = 0.0
        m = _render_after(sampler)
        assert _gpu_series(m, "gpuk8s_gpu_healthy") == expected, step
        assert _gpu_series(m, "gpuk8s_gpu_lost") == {
            g: (u, 1.0 if g == "3" else 0.0) for g, (u, _) in before.items()}, step
        assert value(m, "gpuk8s_gpu_info", gpu="3", pci_address="0000:06:00.0") == 1
        assert set(_gpu_series(m, "gpuk8s_gpu_utilization_ratio")) == set(before) - {"3"}
    assert len(sampler.snapshot.inventory.gpus) == 7  # discovery renumbered: 0000:83 is 3
    restarted = exporter_main.build_sampler(args, pods=PodDirectory(lambda: PodIndex({}, {})))
    m = _render_after(restarted)
    assert _gpu_series(m, "gpuk8s_gpu_healthy") == expected
    assert value(m, "gpuk8s_gpu_lost", gpu="3") == 1
    state = str(Path(root) / "var/lib/gpuk8s/exporter/gpus.json")
    assert cli_main(["exporter", "gpus", "--state-file", state, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(e["gpu"], e["uuid"], e["lostSince"] is not None) for e in listed] == [
        (int(g), u, g == "3") for g, (u, _) in sorted(before.items())]
    assert cli_main(["exporter", "forget", "--state-file", state, "4"]) == 2
    assert "which is on the bus; only lost GPUs can be forgotten" in capsys.readouterr().err
    assert cli_main(["exporter", "forget", "--state-file", state, "9"]) == 2
    assert "'9' names no GPU" in capsys.readouterr().err
    assert cli_main(["exporter", "forget", "--state-file", state, before["3"][0]]) == 0
    assert "forgot GPU 3" in capsys.readouterr().out
    m = _render_after(restarted)
    assert _gpu_series(m, "gpuk8s_gpu_healthy") == {
        g: v for g, v in expected.items() if g != "3"}
    assert not [k for k in m if dict(k[1]).get("gpu") == "3"]


def _render_after(sampler: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    sampler.sample_once()
    return _render(sampler)


def test_a_lost_gpu_that_returns_is_itself_again(exporter: dict[str, Any]) -> None:
    root, sampler = exporter["root"], exporter["sampler"]
    before = _gpu_series(_render_after(sampler), "gpuk8s_gpu_healthy")
    sim.fail(root, 6, "remove")
    sampler.rediscover = 0.0
    assert value(_render_after(sampler), "gpuk8s_gpu_lost", gpu="6") == 1
    sim.heal(root, 6)
    m = _render_after(sampler)
    assert _gpu_series(m, "gpuk8s_gpu_healthy") == before
    assert set(_gpu_series(m, "gpuk8s_gpu_lost").values()) == {(u, 0.0) for u, _ in
                                                               before.values()}
    assert value(m, "gpuk8s_gpu_utilization_ratio", gpu="6") == 0.0


def test_an_unbound_gpu_keeps_its_labels_and_counts(exporter: dict[str, Any],
                                                    capsys: Any) -> None:
    """`sim fail --mode unbind`: on the bus without a driver, the vendor tool no longer
    sees the GPU (no UUID, no load). It stays GPU 2 with its UUID, healthy 0, lost 0, and
    `gpuk8s top` counts it among the node's GPUs, as unhealthy."""
    root, sampler = exporter["root"], exporter["sampler"]
    before = _gpu_series(_render_after(sampler), "gpuk8s_gpu_healthy")
    sim.fail(root, 2, "unbind")
    sampler.rediscover = 0.0
    m = _render_after(sampler)
    assert _gpu_series(m, "gpuk8s_gpu_healthy") == {
        **before, "2": (before["2"][0], 0.0)}
    assert value(m, "gpuk8s_gpu_lost", gpu="2") == 0
    assert "2" not in _gpu_series(m, "gpuk8s_gpu_memory_total_bytes")
    assert cli_main(["top", "nodes", "--url", exporter["url"], "--json"]) == 0
    (node,) = json.loads(capsys.readouterr().out)
    assert (node["gpus"], node["unhealthy"], node["lost"]) == (8, 1, 0)


def test_an_unreadable_book_is_moved_aside_and_started_over(exporter: dict[str, Any]) -> None:
    root, sampler = exporter["root"], exporter["sampler"]
    state = Path(root) / "var/lib/gpuk8s/exporter/gpus.json"
    sampler.sample_once()
    good = json.loads(state.read_text())
    assert [e["gpu"] for e in good["gpus"]] == list(range(8))
    state.write_text('{"version": 1, "gpus": [{"gpu": -1}]}')
    snapshot = sampler.sample_once()
    assert any("gpus[0].gpu: must be an integer >= 0" in p and "moved to" in p
               for p in snapshot.problems), snapshot.problems
    assert Path(str(state) + ".corrupt").read_text().startswith('{"version": 1')
    assert json.loads(state.read_text()) == good  # rebuilt from the GPUs on the bus


def test_every_documented_metric_is_served_and_no_other(exporter: dict[str, Any]) -> None:
    exporter["podres"].pods = [("ns", "p", [("main", "metax-tech.com/gpu", ["0000:04:00.0"])])]
    exporter["sampler"].sample_once()
    served = {name for name, _ in scrape(exporter["url"])}
    documented = {name for name, _, _, _ in METRICS}
    assert served == documented
    page = (Path(__file__).resolve().parents[2] / "docs" / "exporter.md").read_text()
    for name, kind, _, labels in METRICS:
        assert f"| `{name}` | {kind} | {', '.join(labels)} |" in page, \
            f"{name} missing from the table of docs/exporter.md"


def test_healthz_and_bad_requests(exporter: dict[str, Any]) -> None:
    url = exporter["url"]
    with urllib.request.urlopen(url + "/healthz", timeout=5) as resp:
        assert resp.status == 200 and json.loads(resp.read())["status"] == "starting"
    exporter["sampler"].sample_once()
    with urllib.request.urlopen(url + "/healthz", timeout=5) as resp:
        assert json.loads(resp.read())["status"] == "ok"
    for method, path, status in (("GET", "/nope", 404), ("POST", "/metrics", 405)):
        req = urllib.request.Request(url + path, method=method, data=b"x" if method == "POST"
                                     else None)
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=5)
        assert err.value.code == status
    with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=5) as s:
        s.sendall(b"\x16\x03\x01garbage\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 400")
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        assert resp.status == 200  # still serving


def test_healthz_fails_when_sampling_stalls(exporter: dict[str, Any]) -> None:
    snapshot = exporter["sampler"].sample_once()
    from dataclasses import replace

    exporter["sampler"].snapshot = replace(snapshot, taken_at=snapshot.taken_at - 120)
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(exporter["url"] + "/healthz", timeout=5)
    assert err.value.code == 503


def test_pod_resources_client_lists_every_container(tmp_path: Path) -> None:
    server = PodResourcesServer(str(tmp_path / "k.sock"))
    try:
        server.pods = [("ns", "p", [("a", "metax-tech.com/gpu", ["x", "y"]),
                                    ("b", "other.com/thing", ["z"])])]
        client = PodResourcesClient(server.path)
        assert client.assignments() == [
            ContainerDevices(ContainerRef("ns", "p", "a"), "metax-tech.com/gpu", ("x", "y")),
            ContainerDevices(ContainerRef("ns", "p", "b"), "other.com/thing", ("z",)),
        ]
        assert client.allocated("metax-tech.com/gpu") == {"x", "y"}
    finally:
        server.server.stop(0)


@pytest.mark.parametrize(("argv", "message"), [
    (["--interval", "0"], "--interval: 0.0 must be a positive"),
    (["--port", "70000"], "--port: 70000 is not in 0..65535"),
    (["--resource-kind", "foo=pGPU"], "--resource-kind: 'foo=pGPU' must be RESOURCE=KIND"),
    (["--resource-kind", "a.io/b=GPU"], "KIND one of pGPU, vGPU, MPS"),
    (["--host-root", "/does/not/exist"], "--host-root: '/does/not/exist' is not a directory"),
])
def test_bad_flags_exit_2_before_doing_anything(argv: list[str], message: str,
                                                capsys: Any) -> None:
    assert exporter_main.main([*argv, "--log-dir", ""]) == 2
    assert message in capsys.readouterr().err


def test_container_of_reads_the_host_proc(tmp_path: Path) -> None:
    _write_proc(tmp_path, 77, UID_A, CID["a"])
    assert container_of(str(tmp_path), 77) == (UID_A, CID["a"])
    assert container_of(str(tmp_path), 78) is None
    assert container_of("/proc", os.getpid()) is None  # this test is not in a pod


def test_inventory_is_rediscovered_when_a_gpu_appears(tmp_path: Path) -> None:
    root = str(tmp_path / "node")
    sim.create(root, "c500-8")
    sim.fail(root, 7, "remove")
    calls: list[int] = []

    def inventory() -> NodeInventory:
        calls.append(1)
        return discover(root)

    from gpuk8s.services.exporter.sampler import Sampler

    sampler = Sampler(inventory=inventory, telemetry=lambda: telemetry(root, "metax"),
                      health=lambda inv: {}, holdings=None, pods=None, proc_dir=None,
                      rediscover=3600)
    assert len(sampler.sample_once().usage.gpus) == 7
    sampler.sample_once()
    assert len(calls) == 1
    sim.heal(root, 7)
    assert len(sampler.sample_once().usage.gpus) == 8 and len(calls) == 2


# ------------------------------------------------------------------------ gpuk8s top
def test_top_shows_nodes_and_pods_from_the_exporter(exporter: dict[str, Any],
                                                    capsys: Any) -> None:
    root, proc = exporter["root"], exporter["proc"]
    exporter["podres"].pods = [
        ("team-a", "train", [("main", "metax-tech.com/gpu", ["0000:04:00.0", "0000:05:00.0"])]),
    ]
    _write_proc(proc, 1001, UID_A, CID["a"])
    sim.set_load(root, 1, utilization=40, processes=[{"pid": 1001, "memory_mib": 2048}])
    sim.set_load(root, 2, utilization=60, memory_used_mib=1024)
    exporter["sampler"].sample_once()
    url = exporter["url"]
    assert cli_main(["top", "pods", "--url", url, "--json"]) == 0
    (pod,) = json.loads(capsys.readouterr().out)
    # two GPUs at 40 % and 60 %: the pod's mean; memory: its process on GPU 1, and GPU 2
    # (held alone, no process listed) counts nothing of its own
    assert pod == {"namespace": "team-a", "pod": "train", "node": "gpu-node-1", "kind": "pGPU",
                   "gpus": 2, "utilization_ratio": 0.5, "memory_used_bytes": 2048 * MIB}
    assert cli_main(["top", "nodes", "--url", url, "--json"]) == 0
    (node,) = json.loads(capsys.readouterr().out)
    assert node == {"node": "gpu-node-1", "gpus": 8, "unhealthy": 0, "lost": 0,
                    "utilization_ratio": 0.125,
                    "memory_used_bytes": 3072 * MIB, "memory_total_bytes": 8 * 64 * GIB}
    assert cli_main(["top", "nodes", "--url", url]) == 0
    out = capsys.readouterr().out
    assert "gpu-node-1" in out and "3.0/512.0" in out
    assert cli_main(["top", "pods", "--url", url, "--kind", "MPS", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert cli_main(["top", "--url", url, "--kind", "GPU"]) == 2
    assert "--kind: 'GPU' is not one of pGPU, vGPU, MPS" in capsys.readouterr().err
    assert cli_main(["top", "--url", "127.0.0.1:1"]) == 2
    assert "must start with http://" in capsys.readouterr().err


@pytest.fixture
def second_exporter(tmp_path: Path) -> Iterator[Any]:
    """Start exporters on more simulated 8-GPU nodes: ``start(node_name)`` -> URL."""
    servers: list[ExporterHTTPServer] = []

    def start(node_name: str) -> str:
        root = str(tmp_path / f"node{len(servers)}")
        sim.create(root, "c500-8")
        args = exporter_main.build_parser().parse_args([
            "--host-root", root, "--node-name", node_name, "--pod-resources-socket", "",
            "--log-dir", ""])
        # no pods on these nodes: no API server (nor kubeconfig) is asked
        sampler = exporter_main.build_sampler(args, pods=PodDirectory(lambda: PodIndex({}, {})))
        sampler.sample_once()
        server = ExporterHTTPServer(("127.0.0.1", 0), registry_for(sampler, node_name),
                                    sampler, stale_after=30.0)
        serve_in_thread(server)
        servers.append(server)
        return f"http://127.0.0.1:{server.port}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_top_with_several_exporters_shows_every_gpu(exporter: dict[str, Any],
                                                    second_exporter: Any, capsys: Any) -> None:
    """Rows are keyed by source, node and GPU: two exporters without --node-name (node
    label "") are two nodes named by host:port, and even two exporters claiming the same
    node name keep their own rows; 32 GPUs in, 32 GPUs out."""
    exporter["sampler"].sample_once()
    urls = [exporter["url"], second_exporter(""), second_exporter(""), second_exporter("")]
    assert cli_main(["top", "nodes", "--json", *(a for u in urls for a in ("--url", u))]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert sorted(r["node"] for r in rows) == sorted(
        ["gpu-node-1", *(u.removeprefix("http://") for u in urls[1:])])
    assert [r["gpus"] for r in rows] == [8, 8, 8, 8]
    twins = [second_exporter("twin"), second_exporter("twin")]
    assert cli_main(["top", "nodes", "--json", "--url", twins[0], "--url", twins[1]]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["node"], r["gpus"]) for r in rows] == [("twin", 8), ("twin", 8)]


class _NotAnExporter(http.server.BaseHTTPRequestHandler):
    pages: ClassVar[dict[str, tuple[int, str]]] = {
        "/html/metrics": (200, "<html><body>Grafana</body></html>"),
        "/node/metrics": (200, "# TYPE node_load1 gauge\nnode_load1 0.5\n"),
        "/empty/metrics": (200, "")}

    def do_GET(self) -> None:
        status, body = self.pages.get(self.path, (404, "not found"))
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.parametrize(("path", "message"), [
    ("/html", "is not a Prometheus exposition"),
    ("/node", "serves no gpuk8s_* metric: not a gpu-exporter"),
    ("/empty", "serves no gpuk8s_* metric: not a gpu-exporter"),
    ("/missing", "HTTP Error 404"),
])
def test_top_at_something_that_is_not_an_exporter_fails_naming_it(
    path: str, message: str, exporter: dict[str, Any], capsys: Any
) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotAnExporter)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}{path}"
        exporter["sampler"].sample_once()
        for view in ("nodes", "pods"):  # a good exporter beside it does not hide it
            assert cli_main(["top", view, "--url", exporter["url"], "--url", url]) == 2
            err = capsys.readouterr().err
            assert f"{url}/metrics" in err and message in err, err
    finally:
        server.shutdown()
        server.server_close()


def test_scrapes_between_samples_are_served_from_one_rendering(exporter: dict[str, Any]) -> None:
    sampler = exporter["sampler"]
    sampler.sample_once()
    first = scrape(exporter["url"])
    for _ in range(3):
        assert scrape(exporter["url"]) == first
    sim.set_load(exporter["root"], 0, utilization=12)
    sampler.sample_once()
    assert value(scrape(exporter["url"]), "gpuk8s_gpu_utilization_ratio", gpu="0") == 0.12


def test_pods_are_indexed_from_their_json() -> None:
    from gpuk8s.services.exporter.pods import index_pods

    pod = {"metadata": {"uid": UID_A.upper(), "namespace": "team-a", "name": "train"},
           "status": {"containerStatuses": [{"name": "main", "containerID":
                                             f"containerd://{CID['a']}"},
                                            {"name": "waiting"}]}}
    shared = {"metadata": {"uid": UID_B, "namespace": "team-b", "name": "serve", "annotations": {
        "gpuk8s.io/sharing.assigned": '{"container":"main","core":50,"gpus":[5],'
                                      '"memoryMiB":0,"mode":"sgpu","node":"n","whole":false}'}}}
    broken = {"metadata": {"uid": "x", "namespace": "team-c", "name": "bad",
                           "annotations": {"gpuk8s.io/sharing.assigned": "{not json"}}}
    index = index_pods([pod, {"metadata": {}}, shared, broken])
    assert index.by_id == {CID["a"]: A}
    assert index.by_uid == {UID_A: [A, ContainerRef("team-a", "train", "waiting")], UID_B: [],
                            "x": []}
    assert {k: a.gpus for k, a in index.assigned.items()} == {("team-b", "serve"): (5,)}
    assert list(index.unreadable) == [("team-c", "bad")]
    assert "sharing.assigned" in index.unreadable[("team-c", "bad")]
    assert index.listed == {("team-a", "train"), ("team-b", "serve"), ("team-c", "bad")}


def test_sim_refresh_brings_new_tools_into_an_old_root(tmp_path: Path) -> None:
    root = str(tmp_path / "node")
    sim.create(root, "c500-8")
    sim.set_load(root, 0, utilization=55)
    tool = Path(root) / "opt/mxdriver/bin/mx-smi"
    tool.write_text("#!/bin/sh\necho old tool >&2; exit 2\n")
    assert telemetry(root, "metax").gpus == ()
    assert cli_main(["sim", "refresh", "--root", root]) == 0
    assert telemetry(root, "metax").gpu("0000:03:00.0").utilization_ratio == 0.55  # type: ignore[union-attr]


def test_nvml_lists_mps_clients(nvidia_root: str) -> None:
    """Under MPS, NVML lists the client processes (the pods') in the MPS list and in the
    compute list, and books their SM time to the MPS server's pid (as driver 580.159.04
    does on an H100): a client's own utilisation is unknown (None), never 0."""
    sim.set_load(nvidia_root, 2, utilization=50, processes=[
        {"pid": 900, "memory_mib": 100, "utilization": 5},                      # MPS server
        {"pid": 901, "memory_mib": 300, "utilization": 30, "mps": True},
        {"pid": 902, "memory_mib": 200, "utilization": 15, "mps": True}])
    try:
        got = NvmlReader(nvidia_root).read()
        on_gpu = [(p.pid, p.memory_bytes, p.utilization_ratio) for p in got.processes or ()
                  if p.address == "0000:05:00.0"]
        assert on_gpu == [(900, 100 * MIB, 0.5), (901, 300 * MIB, None), (902, 200 * MIB, None)]
        # two pods holding the GPU through MPS: each gets an estimate, not the 0 % NVML
        # gives their pids
        inventory = discover(nvidia_root)
        holdings = [ContainerDevices(A, "nvidia.com/mps-core", ("GPU-1::0",)),
                    ContainerDevices(B, "nvidia.com/mps-core", ("GPU-2::1",))]
        assigned = {("team-a", "train"): (2,), ("team-b", "serve"): (2,)}
        owners: dict[int, ContainerRef | None] = {901: A, 902: B, 900: None}
        usage = {u.container.namespace: u for u in attribute(
            inventory, got, holdings, owners, {}, assigned=assigned).containers
            if u.gpu.index == 2}
        a, b = usage["team-a"], usage["team-b"]
        assert (a.utilization_ratio, b.utilization_ratio) == (0.25, 0.25)
        assert not a.utilization_exact and not b.utilization_exact
        assert (a.memory_used_bytes, b.memory_used_bytes) == (300 * MIB, 200 * MIB)
    finally:
        sim.set_load(nvidia_root, 2, utilization=0, processes=[])


def _problems(m: dict[Any, float]) -> dict[str, float]:
    return {dict(labels)["class"]: v for (n, labels), v in m.items()
            if n == "gpuk8s_exporter_sample_problems"}


def test_bad_assignments_are_counted_once_and_relisted_on_the_period(
    exporter: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """Three pods hold sGPU ids: one's assignment is unreadable, one has none, one names
    GPU 9 of an 8-GPU node. Each is one problem of its class in every sample while it
    lasts, logged once; the pods are relisted on the normal period (max_age), not at
    every sample; a pod the last list did not have is listed at once."""
    sampler = exporter["sampler"]
    exporter["podres"].pods = [
        ("team-a", "train", [("main", SGPU, ["0000:03:00.0::3"])]),
        ("team-b", "serve", [("main", SGPU, ["0000:03:00.0::4"])]),
        ("team-c", "odd", [("main", SGPU, ["0000:03:00.0::5"])]),
    ]

    def pod(ns: str, name: str, uid: str, annotation: str | None) -> dict[str, Any]:
        notes = {} if annotation is None else {"gpuk8s.io/sharing.assigned": annotation}
        return {"metadata": {"uid": uid, "namespace": ns, "name": name, "annotations": notes}}

    from gpuk8s.services.exporter.pods import index_pods

    listed = [pod("team-a", "train", UID_A, "{not json"), pod("team-b", "serve", UID_B, None),
              pod("team-c", "odd", "u-c", _assignment([9]))]
    now = [1000.0]
    lists: list[float] = []

    def lister() -> PodIndex:
        lists.append(now[0])
        return index_pods(listed)

    sampler.pods = PodDirectory(lister, min_refresh=5, max_age=60, clock=lambda: now[0])
    caplog.set_level(logging.WARNING, logger="gpuk8s.exporter")
    for _ in range(5):  # a sample every 10 s
        sampler.report(sampler.sample_once())
        now[0] += 10
    assert lists == [1000.0]  # not relisted for the pods it already knows are wrong
    problems = _problems(_render(sampler))
    assert problems == {**dict.fromkeys(PROBLEM_CLASSES, 0.0), "assignment-unreadable": 1.0,
                        "assignment-missing": 1.0, "assignment-unknown-gpu": 1.0}
    warned = [r.problem for r in caplog.records if r.getMessage() == "sample problem"]
    assert len(warned) == 3 and len(set(warned)) == 3, warned
    assert any("team-c/odd: assigned GPU 9, which this node lacks" in w for w in warned)
    assert any("team-b/serve holds shared-GPU ids but has no" in w for w in warned)
    now[0] += 20  # 60 s after the first list: the normal period relists
    sampler.sample_once()
    assert lists == [1000.0, 1070.0]
    # a pod bound since the last list is listed at once (min_refresh permitting)
    exporter["podres"].pods.append(("team-d", "new", [("main", SGPU, ["0000:03:00.0::6"])]))
    listed.append(pod("team-d", "new", "u-d", _assignment([2])))
    now[0] += 5
    sampler.sample_once()
    assert lists == [1000.0, 1070.0, 1075.0]
    assert value(_render(sampler), "gpuk8s_container_gpu_devices", pod="new", gpu="2") == 1
    # fixed annotations: the problems go away at the next periodic list
    listed[:3] = [pod("team-a", "train", UID_A, _assignment([1])),
                  pod("team-b", "serve", UID_B, _assignment([1])),
                  pod("team-c", "odd", "u-c", _assignment([1]))]
    now[0] += 60
    sampler.sample_once()
    assert set(_problems(_render(sampler)).values()) == {0.0}


def test_pod_list_and_discovery_problems_are_counted(
    exporter: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    sampler = exporter["sampler"]
    exporter["podres"].pods = [("team-a", "train", [("main", SGPU, ["0000:03:00.0::3"])])]

    def failing() -> PodIndex:
        raise TemporaryApiError("list pods on gpu-node-1: connection refused")

    sampler.pods = PodDirectory(failing, min_refresh=0, max_age=0)
    first = sampler.inventory_source()
    # a discovery after the first one reports a problem: it is counted like the others
    sampler.inventory_source = lambda: replace(first, problems=("mx-smi: no answer",))
    sampler.rediscover = 0.0
    snapshot = sampler.sample_once()
    problems = _problems(_render(sampler))
    assert (problems["pod-list"], problems["discovery"]) == (1.0, 1.0)
    assert "cannot list the node's pods" in " ".join(snapshot.problems)
    assert "mx-smi: no answer" in snapshot.problems
    assert problems["assignment-missing"] == 0  # not listed: the list failed, not the pod


def test_no_credentials_is_a_counted_pod_list_problem_not_a_start_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpuk8s.services.exporter.pods import kubernetes_lister

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    pods = PodDirectory(kubernetes_lister("gpu-node-1"))
    assert pods.resolve(UID_A, CID["a"]) is None
    assert pods.error is not None and "kubeconfig" in pods.error


def test_the_in_cluster_path_never_imports_the_kubernetes_client(tmp_path: Path) -> None:
    """In a pod the pod list is a stdlib GET: the official client (about 40 MiB more RSS:
    docs/exporter.md) is not imported, even when the list fails."""
    root = str(tmp_path / "node")
    sim.create(root, "c500-8")
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "token").write_text("t")
    code = f"""
import sys
from gpuk8s.services import kube
kube.IN_CLUSTER_DIR = {str(secrets)!r}
from gpuk8s.services.exporter import main
args = main.build_parser().parse_args(["--host-root", {root!r}, "--node-name", "n",
                                       "--pod-resources-socket", "", "--log-dir", ""])
sampler = main.build_sampler(args)
sampler.sample_once()
assert sampler.pods.resolve("u", "c") is None and "cannot list" in sampler.pods.error
print("kubernetes" in sys.modules)
"""
    env = {**os.environ, "KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "1",
           "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
