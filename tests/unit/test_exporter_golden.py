"""gpu-exporter's scrape of one fixed node, byte for byte against a committed file.

The node is the simulator's c500-8 with fixed loads: GPU 1 held by one container, GPU 2
shared by two containers of one pod, GPU 5 failed, the rest idle. What a real scrape
would make vary is fixed here, not filtered out: the snapshot's time and how long the
sample took (``TAKEN_AT``, ``DURATION``). The registry has no process or platform
collectors, so nothing else varies.

After a deliberate change of the exposition, regenerate the file and review its diff::

    GPUK8S_GOLDEN_UPDATE=1 python -m pytest -q tests/unit/test_exporter_golden.py

``tests/integration/test_exporter_golden_promtool.py`` checks the same file with
``promtool check metrics``.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from pathlib import Path

import pytest

from gpuk8s import sim
from gpuk8s.core.telemetry import ContainerDevices, ContainerRef
from gpuk8s.services.exporter import main as exporter_main
from gpuk8s.services.exporter.metrics import Exposition, registry_for
from gpuk8s.services.exporter.pods import PodDirectory, PodIndex

pytestmark = pytest.mark.usefixtures("fast_python3")

GOLDEN = Path(__file__).resolve().parent / "golden" / "gpu-exporter.prom"
UPDATE_ENV = "GPUK8S_GOLDEN_UPDATE"
NODE = "gpu-node-1"
TAKEN_AT = 1_767_225_600.0  # 2026-01-01T00:00:00Z
DURATION = 0.125
GPU = "metax-tech.com/gpu"

TRAIN = ContainerRef("team-a", "train", "main")
SERVE = ContainerRef("team-b", "serve", "main")
SIDECAR = ContainerRef("team-b", "serve", "sidecar")
UID_TRAIN = "11111111-2222-3333-4444-555555555555"
UID_SERVE = "66666666-7777-8888-9999-000000000000"
# pid -> (pod uid, container id, container)
PROCESSES = {
    1001: (UID_TRAIN, "a" * 64, TRAIN),
    2001: (UID_SERVE, "b" * 64, SERVE),
    2002: (UID_SERVE, "c" * 64, SIDECAR),
}


def fixed_scrape(tmp_path: Path) -> bytes:
    """The body gpu-exporter serves on /metrics for the fixed node and loads."""
    root = str(tmp_path / "node")
    sim.create(root, "c500-8")
    sim.set_load(root, 1, utilization=63, memory_used_mib=5200, temperature=58, power=212,
                 processes=[{"pid": 1001, "memory_mib": 5000}])
    sim.set_load(root, 2, utilization=80, memory_used_mib=9000, temperature=66, power=301,
                 ecc_uncorrected=4,
                 processes=[{"pid": 2001, "memory_mib": 6000}, {"pid": 2002, "memory_mib": 2000}])
    sim.fail(root, 5, "fault")
    proc = tmp_path / "proc"
    by_container, by_pod = {}, {}
    for pid, (uid, cid, ref) in PROCESSES.items():
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cgroup").write_text(f"0::/kubepods/besteffort/pod{uid}/{cid}\n")
        by_container[cid] = ref
        by_pod.setdefault(uid, []).append(ref)
    holdings = [
        ContainerDevices(TRAIN, GPU, ("0000:04:00.0",)),
        ContainerDevices(SERVE, GPU, ("0000:05:00.0",)),
        ContainerDevices(SIDECAR, GPU, ("0000:05:00.0",)),
    ]
    args = exporter_main.build_parser().parse_args([
        "--host-root", root, "--proc-dir", str(proc), "--node-name", NODE,
        "--pod-resources-socket", "", "--log-dir", "",
    ])
    sampler = exporter_main.build_sampler(args, pods=PodDirectory(
        lambda: PodIndex(by_container, by_pod), min_refresh=0, max_age=0))
    sampler.holdings_source = lambda: holdings  # the kubelet's PodResources List answer
    sampler.sample_once()
    assert sampler.snapshot is not None
    sampler.snapshot = dataclasses.replace(sampler.snapshot, taken_at=TAKEN_AT, duration=DURATION)
    return Exposition(registry_for(sampler, NODE), sampler).body()


def test_the_scrape_matches_the_golden_file(tmp_path: Path) -> None:
    body = fixed_scrape(tmp_path)
    if os.environ.get(UPDATE_ENV) == "1":
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_bytes(body)
    want = GOLDEN.read_text()
    got = body.decode()
    diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True),
                                        str(GOLDEN.name), "this scrape"))
    assert got == want, (
        f"the scrape differs from {GOLDEN} (if the change is meant, run "
        f"{UPDATE_ENV}=1 python -m pytest -q tests/unit/{Path(__file__).name} and review the "
        "diff):\n"
        f"{diff}")


def test_the_scrape_is_the_same_twice(tmp_path: Path) -> None:
    # the golden file is only worth its bytes if nothing in it depends on the run
    assert fixed_scrape(tmp_path / "one") == fixed_scrape(tmp_path / "two")


def test_the_golden_file_covers_every_gpu_and_container_family() -> None:
    from gpuk8s.services.exporter.metrics import METRICS

    text = GOLDEN.read_text()
    families = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    # the fixed node is chosen so that every family the exporter declares has a series
    assert families == {name for name, _, _, _ in METRICS}
