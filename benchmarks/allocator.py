"""Allocator cost per call, per request size, on the simulator presets and on partial
meshes, side by side with the search before the step-only budget (frozen in
benchmarks/allocator_before.py), both measured in this run on the same states.

Run: python benchmarks/allocator.py [--states 200] [--seed 1] [--only NAME,...]
                                    [--before-states 40] [--exact-steps 200000]

Topologies: the simulator presets through discovery (c500-8, c550-8, mixed-16,
c500-8-vf4: hierarchical, solved by the knapsack over nested groups, no budget needed)
and partial meshes (link groups overlap: the budgeted search) built like
tests/unit/topologies.py: DGX-1 hybrid cube mesh, an NVLink ring, MetaXLink groups
straddling PCIe switches, c500-8 with one extra cross link, a random mesh of 32 GPUs
(each pair linked with probability 0.2), the cube mesh with 4 VFs per GPU (32 devices),
two cube meshes with 4 VFs (64 devices) and a ring of 64 GPUs.

For every size k: ``--states`` random available sets of at least k devices, the first of
them everything free (the size of every call is k). Per call the thread's CPU time
(``time.thread_time``: what the call costs; on a busy machine the wall clock adds the
wait for a core), the steps and whether the default budget cut the search. The search
before runs on the first ``--before-states`` states of each size (its cover numbers are
outside its budget: one call can take seconds).

Quality of cut answers (now and before): each state a budget cut is solved again with
``--exact-steps`` steps; where that finishes, the cut answer is compared with the optimum
(equal, or worse first on rule 1, 2, 3 or 4), and always with the greedy floor on rules
1-2 (the floor of the search now: ``greedy_set``).
Target: CPU p99 <= 20 ms per call for up to 64 devices.

``--random-meshes``: instead, how often the default budget proves its answer optimal on
random meshes of 32 and 64 GPUs (``topologies.random_mesh``, each pair linked with
probability 0.2, mesh seeds ``--mesh-seeds``), request sizes 2-32, ``--states`` random
available sets per mesh and size: the share of calls that complete (proven optimal), the
share cut, CPU p50/p99 of the calls, and for each cut answer the optimum found with
``--exact-steps`` (where that completes): optimal anyway, or worse first on rule N and by
how much (rule 2: link groups more at the first differing level; rule 3: free devices
less in the first differing group count). ``--compare FILE`` runs another version of
core/allocator.py (``git show REV:src/gpuk8s/core/allocator.py > FILE``) on the same
states in the same run.
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import allocator_before as before  # noqa: E402
from stats import percentile  # noqa: E402

from gpuk8s import sim  # noqa: E402
from gpuk8s.core.allocator import (  # noqa: E402
    DEFAULT_STEPS,
    Budget,
    SearchResult,
    greedy_set,
    objective_key,
    search,
)
from gpuk8s.core.model import NodeInventory  # noqa: E402
from gpuk8s.core.topology import Topology, units_for_inventory  # noqa: E402
from gpuk8s.discovery import discover  # noqa: E402
from tests.unit import topologies  # noqa: E402  (the partial meshes the tests check)

PRESETS = ("c500-8", "c550-8", "mixed-16", "c500-8-vf4")
BIG_SIZES = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 31, 32, 40, 48, 56, 63, 64)
RULES = ("optimal", "rule 1", "rule 2", "rule 3", "rule 4")


def ring_64() -> NodeInventory:
    return topologies.nvlink_ring(64, per_switch=8)


MESHES: dict[str, Callable[[], NodeInventory]] = {
    "dgx1-cube-mesh": topologies.dgx1_cube_mesh,
    "nvlink-ring-8": topologies.nvlink_ring,
    "straddling-groups": topologies.straddling_groups,
    "c500-8-cross-link": topologies.c500_8_cross_link,
    "random-mesh-32": topologies.random_mesh,
    "cube-mesh-vf4": lambda: topologies.dgx1_cube_mesh(vfs=4),
    "double-cube-mesh-vf4": lambda: topologies.double_cube_mesh(vfs=4),
    "nvlink-ring-64": ring_64,
}


def cpu_ms(
    run: Callable[[Topology, list[int], int], SearchResult],
    topo: Topology,
    free: list[int],
    size: int,
) -> tuple[float, SearchResult]:
    """The call's own CPU time in ms, and its result."""
    start = time.thread_time()
    result = run(topo, free, size)
    return (time.thread_time() - start) * 1e3, result


def first_difference(got: tuple, best: tuple) -> str:
    """Which rule first tells two keys apart ("optimal" when none does)."""
    for rule, a, b in zip(RULES[1:], got, best, strict=True):
        if a != b:
            return rule
    return "optimal"


@dataclass
class Quality:
    """Answers the budget cut, against the optimum and the greedy floor."""

    cut: int = 0
    calls: int = 0
    worst_p99: float = 0.0
    first_worse: Counter = field(default_factory=Counter)  # rule first worse, or optimal
    unsolved: int = 0  # the optimum did not fit --exact-steps
    below_floor: int = 0  # worse than the greedy floor on rules 1-2

    def judge(self, key: tuple, exact: SearchResult | None, floor: tuple) -> None:
        self.cut += 1
        self.below_floor += key[:2] > floor[:2]
        if exact is None or not exact.complete:
            self.unsolved += 1
        else:
            self.first_worse[first_difference(key, exact.key)] += 1

    def lines(self, label: str) -> list[str]:
        out = [
            f"      {label}: worst CPU p99 {self.worst_p99:.2f} ms; budget cut {self.cut}/"
            f"{self.calls} calls ({100 * self.cut / max(self.calls, 1):.1f} %)"
        ]
        if self.cut:
            found = ", ".join(f"{self.first_worse[r]} {r}" for r in RULES if self.first_worse[r])
            out.append(
                f"      {label}: cut answers against the optimum (first rule worse): "
                f"{found or '-'}; optimum beyond the exact steps: {self.unsolved}; worse "
                f"than the greedy floor on rules 1-2: {self.below_floor}"
            )
        return out


def bench(
    topo: Topology, args: argparse.Namespace, rng: random.Random, sizes: list[int]
) -> tuple[list[str], Quality, Quality]:
    n = len(topo)
    mesh = not topo.hierarchical
    lines = []
    now, was = Quality(), Quality()
    for size in sizes:
        cpu: list[float] = []
        old: list[float] = []
        cut = old_cut = 0
        for i in range(args.states):
            free = list(range(n)) if i == 0 else sorted(rng.sample(range(n), rng.randint(size, n)))
            ms, result = cpu_ms(search, topo, free, size)
            cpu.append(ms)
            before_result = None
            if mesh and i < args.before_states:
                ms, before_result = cpu_ms(before.search, topo, free, size)
                old.append(ms)
            if result.complete and (before_result is None or before_result.complete):
                continue
            exact = result if result.complete else None
            floor = greedy_set(topo, free, size)[1]
            if not result.complete:
                cut += 1
                exact = search(topo, free, size, budget=Budget(steps=args.exact_steps))
                now.judge(result.key, exact, floor)
            if before_result is not None and not before_result.complete:
                old_cut += 1
                key = objective_key(topo, before_result.chosen, free)
                was.judge(key, exact, floor)
        p99 = percentile(cpu, 0.99)
        now.worst_p99 = max(now.worst_p99, p99)
        now.calls += len(cpu)
        line = (
            f"{n:>5} {size:>3} {statistics.median(cpu):>8.2f} {p99:>8.2f} {max(cpu):>8.2f} "
            f"{100 * cut / len(cpu):>6.1f}"
        )
        if old:
            old_p99 = percentile(old, 0.99)
            was.worst_p99 = max(was.worst_p99, old_p99)
            was.calls += len(old)
            line += (
                f" | {statistics.median(old):>8.2f} {old_p99:>8.2f} {max(old):>9.2f} "
                f"{100 * old_cut / len(old):>6.1f}"
            )
        lines.append(line)
    return lines, now, was


RANDOM_SIZES = (2, 3, 4, 6, 8, 10, 12, 16, 20, 24, 28, 32)


def deviation(got: tuple, best: tuple) -> tuple[str, int]:
    """The first rule on which ``got`` is worse than ``best``, and by how much: rule 2,
    link groups more at the first level whose cover numbers differ; rule 3, free devices
    less in the first group count (largest first) that differs; rule 4, 0."""
    rule = first_difference(got, best)
    if rule == "rule 2":
        return rule, next(a - b for a, b in zip(got[1], best[1], strict=True) if a != b)
    if rule == "rule 3":
        level = next(i for i, (a, b) in enumerate(zip(got[2], best[2], strict=True)) if a != b)
        return rule, next(a - b for a, b in zip(got[2][level], best[2][level], strict=True)
                          if a != b)
    return rule, 0


def load_allocator(path: str) -> Any:
    """Another version of core/allocator.py (``git show REV:src/gpuk8s/core/allocator.py >
    FILE``) as a module of this package, to run it on the same states in this run."""
    spec = importlib.util.spec_from_file_location("gpuk8s.core._allocator_compared", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@dataclass
class Exactness:
    """Calls of one search on the random meshes of one size."""

    cpu: list[float] = field(default_factory=list)
    complete: int = 0
    found: Counter = field(default_factory=Counter)  # cut answers: optimal or rule worse
    worst: dict[str, int] = field(default_factory=dict)  # per rule: the largest deviation
    unsolved: int = 0  # cut, and the optimum beyond --exact-steps

    def lines(self, label: str, exact_steps: int) -> list[str]:
        calls = len(self.cpu)
        cut = calls - self.complete
        worse = ", ".join(
            f"{self.found[r]} worse first on {r} (at most {self.worst[r]} "
            f"{'link group(s) more' if r == 'rule 2' else 'device(s) less'})"
            if r != "rule 4" else f"{self.found[r]} worse on rule 4 (positions)"
            for r in RULES[1:] if self.found[r])
        return [
            f"{label}: {calls} calls; proven optimal (complete) {self.complete} "
            f"({100 * self.complete / calls:.1f} %), cut {cut} ({100 * cut / calls:.1f} %); "
            f"CPU p50 {statistics.median(self.cpu):.2f} ms, p99 "
            f"{percentile(self.cpu, 0.99):.2f} ms, max {max(self.cpu):.2f} ms",
            f"{label}: of the {cut} cut answers: {self.found['optimal']} optimal anyway; "
            f"{worse or 'none worse'}; optimum beyond {exact_steps:,} steps: {self.unsolved}",
        ]


def random_meshes(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    seeds = [int(s) for s in args.mesh_seeds.split(",") if s]
    searches: dict[str, Callable[..., SearchResult]] = {"now": search}
    if args.compare:
        searches["compared"] = load_allocator(args.compare).search
    print(f"python {sys.version.split()[0]}; random meshes (pairs linked with p 0.2), mesh "
          f"seeds {seeds}, sizes {RANDOM_SIZES}, {args.states} states per mesh and size "
          f"(state seed {args.seed}); default budget {DEFAULT_STEPS:,} steps, optimum of cut "
          f"calls with {args.exact_steps:,}" + (f"; compared: {args.compare}" if args.compare
                                                else ""))
    for n in (32, 64):
        seen = {name: Exactness() for name in searches}
        for mesh_seed in seeds:
            inv = topologies.random_mesh(n, seed=mesh_seed)
            topo = Topology.from_inventory(inv, units_for_inventory(inv))
            for size in RANDOM_SIZES:
                for _ in range(args.states):
                    free = sorted(rng.sample(range(n), rng.randint(size, n)))
                    exact: SearchResult | None = None
                    for name, run in searches.items():
                        ms, result = cpu_ms(run, topo, free, size)
                        got = seen[name]
                        got.cpu.append(ms)
                        if result.complete:
                            got.complete += 1
                            continue
                        if exact is None:
                            exact = search(topo, free, size, budget=Budget(args.exact_steps))
                        if not exact.complete:
                            got.unsolved += 1
                            continue
                        rule, by = deviation(tuple(result.key), exact.key)
                        got.found[rule] += 1
                        got.worst[rule] = max(got.worst.get(rule, 0), by)
        for name, got in seen.items():
            for line in got.lines(f"{n} GPUs, {name}", args.exact_steps):
                print(line, flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--states", type=int, default=200, help="random states per size")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--only", default="", help="comma list of topology names")
    parser.add_argument("--before-states", type=int, default=40,
                        help="states per size also run through the search before")
    parser.add_argument("--exact-steps", type=int, default=200_000,
                        help="budget to find the optimum of a cut call")
    parser.add_argument("--random-meshes", action="store_true",
                        help="the random 32- and 64-GPU meshes only: share proven optimal")
    parser.add_argument("--mesh-seeds", default="1,2,3,4",
                        help="with --random-meshes: the meshes' seeds (comma list)")
    parser.add_argument("--compare", default="",
                        help="with --random-meshes: another core/allocator.py file, run on "
                        "the same states")
    args = parser.parse_args(argv)
    if args.random_meshes:
        return random_meshes(args)
    only = {name for name in args.only.split(",") if name}
    rng = random.Random(args.seed)
    print(f"python {sys.version.split()[0]}, {args.states} states per request size "
          f"(the first: everything free), default budget {DEFAULT_STEPS:,} steps")
    print("cpu = the call's own CPU time (thread_time), ms; cut = budget ran out (% of calls);")
    print(f"before = the search before (benchmarks/allocator_before.py: 4,000 steps or 14 ms "
          f"of CPU, covers outside the budget) on the first {args.before_states} states")
    print(
        f"{'topology':<22} {'units':>5} {'k':>3} {'cpu p50':>8} {'cpu p99':>8} {'cpu max':>8}"
        f" {'cut %':>6} | {'bef p50':>8} {'bef p99':>8} {'bef max':>9} {'cut %':>6}"
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
        lines, now, was = bench(topo, args, rng, sizes)
        for line in lines + now.lines("now") + (was.lines("before") if was.calls else []):
            print(f"{name:<22} {line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
