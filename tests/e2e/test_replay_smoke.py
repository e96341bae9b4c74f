"""The openb replay (benchmarks/replay.py) in small: a few dozen fake nodes, a few hundred
pods through the lab's real kube-scheduler and this checkout's gpu-aware, churn, and one
gpu-aware SIGKILL under load. Asserts behaviour only (the full replay, with its timings,
is a benchmark: docs/benchmarks.md):

* every pod of the fill is placed or fails once (FGD's protocol), and some of each kind
  are placed (the trace has whole, fractional and multi-GPU pods);
* after every phase gpu-aware's ledger, the device plugin's view (its Allocate code, run
  for the fake nodes) and the pods' annotations in the API agree: no stale booking, none
  missing, no GPU booked beyond 100 %;
* kube-scheduler alone (``--alone``): the fill's first pods placed without gpu-aware
  (deleted before the fill, which the checks after it would otherwise see);
* churn: every pod that waited for a release was bound after it;
* gpu-aware killed: GPU pods waited while it was down, pods without GPUs were scheduled
  meanwhile, and after the restart it served again and the GPU pods were bound.
"""

from __future__ import annotations

import random
import sys
import tempfile
from pathlib import Path

import pytest

from .conftest import REPO

pytestmark = pytest.mark.e2e

sys.path.insert(0, str(REPO / "benchmarks"))
import replay  # noqa: E402  (benchmarks/replay.py)


def synthetic_trace(out: Path, seed: int = 42) -> Path:
    """A small trace in the openb format (node list and pod list, the columns packing.load
    reads), drawn with ``seed``: 31 nodes of every GPU count the openb cluster has (155
    GPUs) and 400 pods -- without GPUs, fractional, whole, 2, 4 and 8 GPUs -- so that the
    smoke test needs no copy of the Alibaba trace (not in this repository) and runs the same
    everywhere."""
    rng = random.Random(seed)
    shapes = [(8, 96000)] * 15 + [(2, 104000)] * 13 + [(4, 96000)] * 2 + [(1, 32000)]
    nodes = [replay.packing.NodeSpec(f"smoke-node-{i:04d}", cpu, 786432, gpus)
             for i, (gpus, cpu) in enumerate(shapes)]
    kinds = [(0, 0)] * 13 + [(1, m) for m in (100, 200, 250, 300, 460, 500, 700)] * 9 + \
        [(1, 1000)] * 18 + [(2, 1000)] * 5 + [(4, 1000)] * 2 + [(8, 1000)]
    pods: list[replay.packing.PodSpec] = []
    for i in range(400):
        gpus, milli = rng.choice(kinds)
        cpu = rng.choice((2000, 4000, 6000, 8000, 12000)) * max(gpus, 1)
        pods.append(replay.packing.PodSpec(f"smoke-pod-{i:04d}", cpu,
                                           rng.choice((4096, 8192, 16384)), gpus, milli))
    return replay.packing.save(out, nodes, pods)


@pytest.fixture(scope="module")
def report(lab: dict[str, str]) -> replay.Report:
    work = Path(tempfile.mkdtemp(prefix="gpuk8s-replay-smoke-"))
    options = replay.Options(
        data=synthetic_trace(work / "trace"),
        every=1,  # 31 nodes of every shape the openb cluster has, 155 GPUs
        window=4,
        churn=40,
        churn_parallel=8,
        faults=("extender-kill",),
        extender_port=18095,
        alone=40,
    )
    (work / "run").mkdir()
    result = replay.Replay(options, work / "run").run()
    print(replay.render(result))
    return result


def test_fill_places_or_fails_each_pod_once(report: replay.Report) -> None:
    fill = report.fill
    assert fill is not None
    assert report.placed_or_failed_once
    assert fill.pods >= 150, fill.pods
    assert fill.placed + sum(fill.failed.values()) == fill.pods
    assert fill.placed > fill.pods // 2
    assert fill.arrived_milli >= fill.capacity_milli  # the fill went to arrived 100 %
    assert 0 < fill.allocated_milli <= fill.capacity_milli


def test_scheduler_alone_places_the_fills_first_pods_and_leaves_none(
    report: replay.Report,
) -> None:
    alone, fill = report.alone, report.fill
    assert alone is not None and fill is not None
    assert alone.pods == 40 and 0 < alone.placed <= 40 and alone.seconds > 0
    assert fill.head[0] == 40 and 0 < fill.head[1] <= fill.seconds
    assert alone.cpu_s["kube-scheduler"] > 0


def test_ledger_device_plugin_and_api_agree_after_every_phase(report: replay.Report) -> None:
    phases = [c.phase for c in report.checks]
    assert phases == ["after fill", "after churn", "after extender-kill"], phases
    for check in report.checks:
        assert check.ok, check.line()
        assert check.api_bookings > 0 and check.ledger_bookings >= check.api_bookings


def test_churn_binds_every_waiting_pod_after_its_release(report: replay.Report) -> None:
    churn = report.churn
    assert churn is not None
    assert churn.cycles == 40
    assert not churn.stuck, churn.stuck
    assert churn.measured + churn.fit_at_once == churn.cycles
    assert churn.measured > 0  # the packed nodes made some arrivals wait


def test_gpu_aware_killed_gpu_pods_wait_others_do_not_and_it_recovers(
    report: replay.Report,
) -> None:
    [fault] = report.faults
    details = fault.details
    assert details["gpu_pods_bound_while_down"] == 0, details
    assert details["cpu_pods_bound_while_down"] == 5, details
    assert details["gpu_pods_bound_after_restart"] == 5, details
    assert fault.recovery_s is not None and fault.ok, details
