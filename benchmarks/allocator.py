"""Allocator cost per call, per request size, on the simulator presets and on partial
meshes, with the exhaustive search as the baseline measured in the same run.

Run: python benchmarks/allocator.py [--states 200] [--seed 1] [--only NAME,...]

Topologies: the simulator presets through discovery (c500-8, c550-8, mixed-16,
c500-8-vf4: hierarchical, solved by the knapsack over nested groups) and partial meshes
(link groups overlap: branch and bound) built like tests/unit/topologies.py: DGX-1 hybrid
cube mesh, an NVLink ring, MetaXLink groups straddling PCIe switches, c500-8 with one
extra cross link, the cube mesh with 4 VFs per GPU (32 devices), two cube meshes with 4
VFs (64 devices) and a ring of 64 GPUs.

For every size k: ``--states`` random available sets of at least k devices; per call the
thread's CPU time (``time.thread_time``: what the call costs; on a busy machine the wall
clock adds the wait for a core) and whether the default budget (4,000 steps, 14 ms of
CPU) cut the search. Baseline: the exhaustive search over all k-subsets (what the code
before did on partial meshes), timed on a few states where it has at most 20,000 subsets.
Target: every call within 20 ms of CPU for up to 64 devices.
"""

from __future__ import annotations

import argparse
import itertools
import math
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpuk8s import sim  # noqa: E402
from gpuk8s.core.allocator import objective_key, search  # noqa: E402
from gpuk8s.core.model import NodeInventory  # noqa: E402
from gpuk8s.core.topology import Topology, units_for_inventory  # noqa: E402
from gpuk8s.discovery import discover  # noqa: E402
from tests.unit import topologies  # noqa: E402  (the partial meshes the tests check)

PRESETS = ("c500-8", "c550-8", "mixed-16", "c500-8-vf4")
EXHAUSTIVE_MAX_SUBSETS = 20_000
BIG_SIZES = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 40, 48, 56, 64)


def ring_64() -> NodeInventory:
    return topologies.nvlink_ring(64, per_switch=8)


MESHES: dict[str, Callable[[], NodeInventory]] = {
    "dgx1-cube-mesh": topologies.dgx1_cube_mesh,
    "nvlink-ring-8": topologies.nvlink_ring,
    "straddling-groups": topologies.straddling_groups,
    "c500-8-cross-link": topologies.c500_8_cross_link,
    "cube-mesh-vf4": lambda: topologies.dgx1_cube_mesh(vfs=4),
    "double-cube-mesh-vf4": lambda: topologies.double_cube_mesh(vfs=4),
    "nvlink-ring-64": ring_64,
}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def exhaustive(topo: Topology, free: list[int], size: int) -> list[int]:
    best = None
    for chosen in itertools.combinations(free, size):
        key = objective_key(topo, chosen, free)
        if best is None or key < best[0]:
            best = (key, list(chosen))
    assert best is not None
    return best[1]


def bench(topo: Topology, states: int, rng: random.Random, sizes: list[int]) -> list[str]:
    n = len(topo)
    for _ in range(50):  # warm-up: imports, memo of cover numbers
        size = rng.randint(1, n)
        search(topo, sorted(rng.sample(range(n), rng.randint(size, n))), size)
    lines = []
    worst_p99 = 0.0
    cuts = calls = 0
    for size in sizes:
        cpu: list[float] = []
        wall: list[float] = []
        cut = 0
        base: list[float] = []
        for i in range(states):
            free = sorted(rng.sample(range(n), rng.randint(size, n)))
            t_wall, t_cpu = time.perf_counter(), time.thread_time()
            result = search(topo, free, size)
            cpu.append((time.thread_time() - t_cpu) * 1e3)
            wall.append((time.perf_counter() - t_wall) * 1e3)
            cut += not result.complete
            if i < 5 and math.comb(len(free), size) <= EXHAUSTIVE_MAX_SUBSETS:
                t_cpu = time.thread_time()
                exhaustive(topo, free, size)
                base.append((time.thread_time() - t_cpu) * 1e3)
        worst_p99 = max(worst_p99, percentile(cpu, 0.99))
        cuts += cut
        calls += states
        lines.append(
            f"{n:>5} {size:>3} {statistics.median(cpu):>8.3f} {percentile(cpu, 0.99):>8.3f} "
            f"{max(cpu):>8.3f} {percentile(wall, 0.99):>8.3f} {100 * cut / states:>6.1f} "
            + (f"{statistics.median(base):>12.2f}" if base else f"{'-':>12}")
        )
    lines.append(
        f"      worst CPU p99 over all sizes {worst_p99:.2f} ms; budget cut "
        f"{cuts}/{calls} calls ({100 * cuts / max(calls, 1):.1f} %)"
    )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--states", type=int, default=200, help="random states per size")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--only", default="", help="comma list of topology names")
    args = parser.parse_args(argv)
    only = {name for name in args.only.split(",") if name}
    rng = random.Random(args.seed)
    print(f"python {sys.version.split()[0]}, {args.states} random states per request size")
    print("cpu = the call's own CPU time (thread_time), ms; cut = budget ran out (% of calls);")
    print(f"exhaustive = baseline, median CPU ms (all k-subsets, <= {EXHAUSTIVE_MAX_SUBSETS:,})")
    print(
        f"{'topology':<22} {'units':>5} {'k':>3} {'cpu p50':>8} {'cpu p99':>8} {'cpu max':>8}"
        f" {'wall p99':>8} {'cut %':>6} {'exhaustive':>12}"
    )
    topos: list[tuple[str, Topology]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for preset in PRESETS:
            if only and preset not in only:
                continue
            root = Path(tmp) / preset
            sim.create(str(root), preset)
            inv = discover(str(root))
            topos.append((preset, Topology.from_inventory(inv, units_for_inventory(inv))))
    for name, build in MESHES.items():
        if only and name not in only:
            continue
        inv = build()
        topos.append((name, Topology.from_inventory(inv, units_for_inventory(inv))))
    for name, topo in topos:
        n = len(topo)
        sizes = list(range(1, n + 1)) if n <= 16 else [k for k in BIG_SIZES if k <= n]
        for line in bench(topo, args.states, rng, sizes):
            print(f"{name:<22} {line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
