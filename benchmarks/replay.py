#!/usr/bin/env python3
"""The openb trace through the lab's real kube-scheduler and gpu-aware: fill, churn, faults.

``benchmarks/packing.py`` places the trace's pods by calling the product's code in one
process. This replays the same pods through the parts a user runs: the API server, a
real kube-scheduler (the lab's binary, of the lab's release), gpu-aware over HTTP (this checkout's
``gpuk8s serve extender``, its filter / prioritize / bind verbs) and the watches, on fake
nodes (``lab/fake_nodes.py``: Node objects kept Ready, publishing the product's own
annotations). Needs the lab (``lab/up``), as root, under the lab's lock (``--lab-lock``:
``lab/lablock.py``, the file the e2e tier holds too).

Nodes: one per line of the node list, named as the trace names it; 8-GPU nodes are the
simulator's ``c500-8`` (two MetaXLink groups of four), 2-GPU nodes ``n260-2`` (a PCIe
pair), 4- and 1-GPU nodes the shapes ``packing.py`` uses (SPEC has no such preset: four
linked GPUs, one GPU); the trace's CPU and memory; every node in the ``vcuda`` sharing
mode (label ``gpuk8s.io/sharing-mode``, allocatable ``tencent.com/vcuda-core`` = 100 per
GPU, as gpu-device advertises it), GPU-dense nodes (fewer than
``--taint-cores-per-gpu`` cores per GPU) tainted ``metax-tech.com/gpu=present:
PreferNoSchedule`` as ``docs/extender.md`` recommends and ``packing.py`` models.

Pods: the trace shuffled and resampled with the seed exactly as ``packing.workload``
does; a fractional pod asks ``tencent.com/vcuda-core`` = its milli-GPUs / 10, a whole-GPU
pod 100 per GPU, a GPU-less pod only CPU and memory. The fake nodes have no kubelet: the
harness plays its part for the GPU pods -- once a pod is bound it hands the device
plugin's own ``Allocate`` code (``deviceplugin.sharing.SharedDevices``, one per node) the
number of device ids the kubelet would, which marks the pod ``allocated`` through the API.

Phases (``--phases``):

``fill``
    FGD's protocol: pods are created in arrival order, at most ``--window`` waiting for a
    decision at a time (1: each pod is placed or fails before the next one arrives); a
    pod the scheduler finds unschedulable at its first attempt (PodScheduled=False,
    reason Unschedulable) counts as failed and is deleted; pods never leave; the fill
    stops when the arrived GPU requests reach 100 % of capacity. Printed side by side with
    ``packing.py``'s in-process figure for the same trace and seed: allocation, failed
    pods by GPU count, multi-GPU pods inside one link group, pods/s, and gpu-aware's
    filter / prioritize / bind p50 / p99 (interpolated in its /metrics histogram).
``churn``
    ``--churn`` cycles, ``--churn-parallel`` at a time on distinct nodes: a placed GPU pod
    P is picked at random; a pod Q of P's shape pinned to P's node arrives; if Q waits
    (Unschedulable), P is deleted and the time from P's deletion (the DELETED event) to
    Q's bind is measured ("release to bind"; HAMi's users wait minutes for this). Q stays.
``faults``
    each under background load (arrivals and deletions), with its recovery time: gpu-aware
    SIGKILLed and restarted (GPU pods wait, GPU-less pods keep scheduling; time until it
    serves again and until the first GPU pod is bound); the lab's kubelet restarted (the
    fake nodes have none: the real node's, until it is Ready with its GPUs allocatable
    again, while the replay goes on); a fake node deleted with pods on it (until the pod
    GC removed them and gpu-aware's ledger dropped them); a pod deleted between its bind
    and Allocate (until a pod of the same size is bound on that node).

After each phase a checker compares gpu-aware's ledger (``GET /debug/ledger``), the
device plugin's view (what Allocate handed out, per pod) and the API (the pods'
``gpuk8s.io/sharing.assigned`` annotations): stale and missing bookings, and GPUs booked
beyond 100 %.

    .venv/bin/python benchmarks/replay.py --lab-lock       (default trace; takes the lab's
        lock itself after the in-process figure)
    python3 lab/lablock.py .venv/bin/python benchmarks/replay.py   (under the lock throughout)

Everything it created (nodes, namespace, processes) is removed at the end.

The code: ``replay_harness.py`` (the fake nodes, pods, watch, fake kubelet, gpu-aware
processes, checker), ``replay_scenarios.py`` (the phases: ``Replay``), ``replay_report.py``
(the printed report); this file is the command line, and names what its callers use.
"""


from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from replay_harness import (  # first: it puts lab/ on sys.path
    FAULTS,
    GPU_TAINT,
    LEADER_FAULTS,
    LOCK,
    NS,
    PHASES,
    ROLE_DEFAULTS,
    RUN_LABEL,
    SCHEDULER_NAME,
    Cluster,
    FakeKubelet,
    lab_lock,
    latency_figures,
    node_object,
    over_booked,
    packing,
    pod_object,
    scheduler_config,
    shapes,
)
from replay_report import render
from replay_scenarios import Options, Replay, Report, in_process_figure

# what the tests (tests/unit/test_replay_benchmark.py, tests/e2e/test_replay_smoke.py) use
__all__ = [
    "GPU_TAINT", "NS", "ROLE_DEFAULTS", "RUN_LABEL", "SCHEDULER_NAME", "Cluster", "FakeKubelet",
    "Options", "Replay", "Report", "latency_figures", "main", "node_object", "over_booked",
    "packing", "pod_object", "render", "scheduler_config", "shapes",
]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--data", default=str(packing.DATA), help="directory of the openb CSV files")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--every", type=int, default=1, help="keep every Nth node (sub-cluster)")
    ap.add_argument(
        "--window",
        type=int,
        default=1,
        help="pods waiting for a decision at a time during the fill (1: FGD's "
        "one pod after the other)",
    )
    ap.add_argument("--phases", default=",".join(PHASES), help="comma list of fill, churn, faults")
    ap.add_argument("--churn", type=int, default=1000, help="churn cycles")
    ap.add_argument("--churn-parallel", type=int, default=16)
    ap.add_argument(
        "--faults",
        default=None,
        help=f"comma list of {', '.join(FAULTS + LEADER_FAULTS)} (default: "
        f"{', '.join(FAULTS)}; with --replicas 2 also {', '.join(LEADER_FAULTS)})",
    )
    ap.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="gpu-aware replicas (2: they elect a leader on a Lease; kube-scheduler reaches "
        "the leader through a local stand-in of the chart's Service)",
    )
    ap.add_argument("--taint-cores-per-gpu", type=float, default=packing.TAINT_CORES_PER_GPU)
    ap.add_argument("--max-pods", type=int, default=None, help="stop the fill after this many")
    ap.add_argument(
        "--alone",
        type=int,
        default=0,
        metavar="N",
        help="before the fill, its first N pods through kube-scheduler alone (the same "
        "profile without gpu-aware, same nodes, same window), then deleted: pods/s and "
        "CPU per pod without the extender, beside the fill's first N",
    )
    ap.add_argument("--extender-port", type=int, default=18090)
    ap.add_argument(
        "--no-in-process",
        action="store_true",
        help="skip packing.py's figure (saves about 2 minutes)",
    )
    ap.add_argument(
        "--lab-lock",
        nargs="?",
        const=str(LOCK),
        default=None,
        metavar="PATH",
        help=f"take the lab's lock (default {LOCK}, the e2e tier's) for the lab part only",
    )
    ap.add_argument("--json", default=None, help="also write the report as JSON here")
    ap.add_argument("--keep", action="store_true", help="leave nodes and pods (debugging)")
    args = ap.parse_args(argv)
    phases = tuple(p for p in args.phases.split(",") if p)
    if args.replicas not in (1, 2):
        raise SystemExit(f"--replicas: {args.replicas} must be 1 or 2")
    allowed_faults = FAULTS + (LEADER_FAULTS if args.replicas > 1 else ())
    default = ",".join(allowed_faults)
    faults = tuple(f for f in (args.faults if args.faults is not None else default).split(",") if f)
    for value, allowed, flag in (
        (phases, PHASES, "--phases"),
        (faults, allowed_faults, "--faults"),
    ):
        unknown = sorted(set(value) - set(allowed))
        if unknown:
            raise SystemExit(f"{flag}: unknown {unknown}; use {', '.join(allowed)}")
    if args.window < 1:
        raise SystemExit(f"--window: {args.window} must be 1 or more")
    if args.alone < 0:
        raise SystemExit(f"--alone: {args.alone} must be 0 or more")
    options = Options(
        data=Path(args.data),
        seed=args.seed,
        every=args.every,
        window=args.window,
        phases=phases,
        churn=args.churn,
        churn_parallel=args.churn_parallel,
        faults=faults,
        taint_cores_per_gpu=args.taint_cores_per_gpu,
        extender_port=args.extender_port,
        replicas=args.replicas,
        max_pods=args.max_pods,
        alone=args.alone,
        keep=args.keep,
    )
    row, seconds = (None, 0.0)
    if "fill" in phases and not args.no_in_process and args.max_pods is None:
        print("packing.py in-process figure ...", flush=True)
        row, seconds = in_process_figure(options)
    work = Path(tempfile.mkdtemp(prefix="gpuk8s-replay-"))
    with lab_lock(args.lab_lock):
        report = Replay(options, work).run()
    report.packing_row, report.packing_seconds = row, seconds
    print()
    print(render(report))
    if args.json:
        Path(args.json).write_text(json.dumps(asdict(report), indent=1, default=str))
    failed = any(not c.ok for c in report.checks) or any(not f.ok for f in report.faults)
    return 1 if failed or not report.placed_or_failed_once else 0


if __name__ == "__main__":
    sys.exit(main())
