"""Allocator latency: p50/p99 per call for every request size on the 8- and 16-GPU
presets (plus the 32-VF preset) over random partial states.

Run: python benchmarks/allocator.py [--states 400] [--root-dir DIR]
The topologies come from the simulator + discovery, exactly as the device plugin
sees them. Targets: p99 < 0.5 ms at 8 GPUs, < 2 ms at 16 GPUs.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from gpuk8s import sim
from gpuk8s.core.allocator import allocate
from gpuk8s.core.topology import Topology, units_for_inventory
from gpuk8s.discovery import discover

PRESETS = ("c500-8", "c550-8", "mixed-16", "c500-8-vf4")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def bench(
    topo: Topology, states: int, rng: random.Random
) -> dict[int, tuple[list[float], list[float]]]:
    ids = [u.id for u in topo.units]
    n = len(ids)
    for _ in range(200):  # warm-up: first calls pay for imports and caches
        size = rng.randint(1, n)
        allocate(topo, rng.sample(ids, rng.randint(size, n)), size)
    out: dict[int, tuple[list[float], list[float]]] = {}
    for size in range(1, n + 1):
        wall: list[float] = []
        cpu: list[float] = []
        for _ in range(states):
            free_count = rng.randint(size, n)
            available = rng.sample(ids, free_count)
            start, start_cpu = time.perf_counter(), time.thread_time()
            allocate(topo, available, size)
            cpu.append((time.thread_time() - start_cpu) * 1000)
            wall.append((time.perf_counter() - start) * 1000)
        out[size] = (wall, cpu)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--states", type=int, default=1000, help="random states per size")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    print(f"python {sys.version.split()[0]}, {args.states} random states per request size")
    print("wall = elapsed time; cpu = this thread's CPU time (what the call costs when other")
    print("processes compete for the cores, as on a shared CI machine)")
    print(
        f"{'preset':<12} {'units':>5} {'k':>3} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}"
        f" {'cpu p50':>8} {'cpu p99':>8}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for preset in PRESETS:
            root = Path(tmp) / preset
            sim.create(str(root), preset)
            inv = discover(str(root))
            topo = Topology.from_inventory(inv, units_for_inventory(inv))
            results = bench(topo, args.states, rng)
            worst99 = worst_cpu99 = 0.0
            for size, (wall, cpu) in results.items():
                p99 = percentile(wall, 0.99)
                cpu99 = percentile(cpu, 0.99)
                worst99 = max(worst99, p99)
                worst_cpu99 = max(worst_cpu99, cpu99)
                print(
                    f"{preset:<12} {len(topo):>5} {size:>3} "
                    f"{statistics.median(wall):>8.3f} {p99:>8.3f} {max(wall):>8.3f}"
                    f" {statistics.median(cpu):>8.3f} {cpu99:>8.3f}"
                )
            print(
                f"{preset:<12} worst p99 over all sizes: wall {worst99:.3f} ms, "
                f"cpu {worst_cpu99:.3f} ms"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
