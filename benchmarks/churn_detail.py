"""Where a churn run's GPUs go: a diagnostic beside ``packing.py --churn``.

One policy, one seed, the churn protocol of ``packing.py`` (the same pods, lifetimes
and gap); from ``--steady`` (arrived 400 % of the capacity by default, where departures
balance the arrivals) on it reads, every ``--every-pods`` arrivals, what stays placed by
class and lifetime, and where the free GPU capacity lies: on partly used GPUs (by how
much of the GPU is free) or on whole free GPUs (by the node's free cores per whole free
GPU); and for every GPU pod that fits nowhere, why: no node has the GPUs it asks
(``no-gpu-room``: a share finds no GPU with its part free, a whole-GPU pod no node with
that many whole free GPUs), or the nodes that have them lack CPU, memory, or both.

``--variant`` (repeatable): ``arrivals`` weighs the request mix by the arrivals alone
(gpu-aware before it followed departures, ``ArrivalMix.follow`` never called);
``nowaste`` drops the waste against the mix's LP packing from the share ranking
(``share.WASTE_RANK`` 0: FGD's rise first); ``nobalance`` drops the CPU balance of
GPU pods (``share.CPU_BALANCE`` 0). They change module state of this process only.

Usage: python benchmarks/churn_detail.py POLICY SEED [--every N] [--lifetimes
trace|exp] [--variant arrivals|nowaste|nobalance ...] [--steady PERCENT] [--every-pods K]; prints
one JSON object (percentages of the GPU capacity, averaged over the readings; counts
per run).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import packing
from paper_policies import typical_pods

from gpuk8s.services.extender import share

LIFE_BUCKETS = ((3600.0, "<1h"), (86400.0, "1h-1d"), (float("inf"), ">1d"))
VARIANTS = ("arrivals", "nowaste", "nobalance")


def life_bucket(seconds: float) -> str:
    return next(name for bound, name in LIFE_BUCKETS if seconds < bound)


def gpu_view(runner: packing.Runs) -> list[tuple[int, int, list[int]]]:
    """Per node: free CPU millicores, free memory MiB, free milli-GPUs per GPU."""
    if isinstance(runner, packing.PaperReplay):
        return [(n.cpu, n.memory, list(n.gpus)) for n in runner.scheduler.nodes]
    assert isinstance(runner, packing.Replay) and runner.sharing
    used: dict[tuple[str, int], int] = {}
    for held in runner.ledger.assignments().values():
        for gpu in held.gpus:
            used[(held.node, gpu)] = used.get((held.node, gpu), 0) + held.share.core * 10
    return [
        (n.cpu, n.memory, [packing.MILLI - used.get((n.spec.name, g), 0)
                           for g in range(n.spec.gpus)])
        for n in runner.nodes
    ]


def why_failed(view: list[tuple[int, int, list[int]]], pod: packing.PodSpec) -> str:
    """Why a GPU pod fits nowhere (see the module's docstring)."""
    fed: list[tuple[bool, bool]] = []
    for cpu, memory, gpus in view:
        if pod.milli < packing.MILLI:
            room = any(g >= pod.milli for g in gpus)
        else:
            room = sum(1 for g in gpus if g == packing.MILLI) >= pod.gpus
        if room:
            fed.append((cpu >= pod.cpu, memory >= pod.memory))
    if not fed:
        return "no-gpu-room"
    if any(c and m for c, m in fed):
        return "fits"  # the policy's own filter refused it (no such case seen)
    if any(m for _, m in fed):
        return "cpu"
    if any(c for c, _ in fed):
        return "memory"
    return "cpu+memory"


def key(token: Any) -> Any:
    """A placed pod's key: gpu-aware's uid, or the identity of a paper policy's token."""
    return token if isinstance(token, str) else id(token)


def free_kind(milli: int) -> str:
    quarter = min(3, milli * 4 // packing.MILLI)
    return f"partly used GPU, {25 * quarter}-{25 * quarter + 25} % free"


def whole_kind(cpu: int, whole: int) -> str:
    cores = cpu / whole / 1000
    return ("whole GPU, < 4 cores free per whole free GPU" if cores < 4 else
            "whole GPU, 4-8 cores" if cores < 8 else "whole GPU, >= 8 cores")


def detail(policy: str, seed: int, every: int = 8, lifetimes: str = "trace",
           variants: tuple[str, ...] = (), steady: float = 400.0, every_pods: int = 50,
           data: Path = packing.DATA) -> dict[str, Any]:
    for variant in variants:
        if variant not in VARIANTS:
            raise ValueError(f"variant {variant!r}: allowed are {', '.join(VARIANTS)}")
    if "nowaste" in variants:
        share.WASTE_RANK = 0.0
    if "nobalance" in variants:
        share.CPU_BALANCE = 0.0
    if "arrivals" in variants:
        share.ArrivalMix.follow = lambda self, holding: None  # type: ignore[method-assign]
    specs, pods = packing.load(data)
    specs = packing.cluster(specs, every, 1.0, 1)
    capacity = sum(s.gpus for s in specs) * packing.MILLI
    order, lives, gap = packing.churn_workload(
        pods, capacity // packing.MILLI, seed, packing.Churn(lifetimes=lifetimes))
    runner: packing.Runs = (
        packing.PaperReplay(policy, specs, typical_pods(pods), seed)
        if policy in packing.PAPER_POLICIES
        else packing.Replay(policy, specs, packing._shapes(), seed, 0.0, True)
    )
    standing: dict[str, float] = {}
    free: dict[str, float] = {}
    failed: dict[str, dict[str, int]] = {}
    failed_life: dict[str, int] = {}
    held: dict[Any, tuple[packing.PodSpec, float]] = {}
    state = {"next": 0, "arrived": 0, "readings": 0}
    decide, release = runner.decide, runner.release

    def read() -> None:
        state["readings"] += 1
        for pod, life in held.values():
            for name in (packing.pod_class(pod),
                         f"{packing.pod_class(pod)} {life_bucket(life)}"):
                standing[name] = standing.get(name, 0) + pod.requested
        for cpu, _, gpus in gpu_view(runner):
            whole = sum(1 for g in gpus if g == packing.MILLI)
            for g in gpus:
                if 0 < g < packing.MILLI:
                    free[free_kind(g)] = free.get(free_kind(g), 0) + g
            if whole:
                kind = whole_kind(cpu, whole)
                free[kind] = free.get(kind, 0) + whole * packing.MILLI

    def watched_decide(pod: packing.PodSpec) -> Any:
        i = state["next"]
        state["next"] += 1
        token = decide(pod)
        state["arrived"] += pod.requested
        if state["arrived"] < steady / 100 * capacity:
            if token is not None:
                held[key(token)] = (pod, lives[i])
            return token
        klass = packing.pod_class(pod)
        if token is None and pod.gpus:
            why = why_failed(gpu_view(runner), pod)
            failed.setdefault(klass, {})[why] = failed.get(klass, {}).get(why, 0) + 1
            bucket = f"{klass} {life_bucket(lives[i])}"
            failed_life[bucket] = failed_life.get(bucket, 0) + 1
        if token is not None:
            held[key(token)] = (pod, lives[i])
        if i % every_pods == 0:
            read()
        return token

    def watched_release(token: Any) -> None:
        held.pop(key(token), None)
        release(token)

    runner.decide = watched_decide  # type: ignore[method-assign]
    runner.release = watched_release  # type: ignore[method-assign]
    result = runner.run_churn(order, lives, gap)
    readings = max(1, state["readings"])

    def pct(values: dict[str, float]) -> dict[str, float]:
        return {k: round(100 * v / readings / capacity, 2) for k, v in sorted(values.items())}

    return {
        "policy": policy, "seed": seed, "variants": list(variants) or "none (the code as it is)",
        "time-weighted alloc after 100 %": round(result.churn_mean or 0.0, 2),
        "readings": state["readings"],
        "placed, % of GPUs, by class and lifetime": pct(standing),
        "free, % of GPUs, by where": pct(free),
        "GPU pods failed after the steady mark, by class and why": failed,
        "GPU pods failed after the steady mark, by class and lifetime": failed_life,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("policy", choices=(packing.SHARING, *packing.PAPER_POLICIES))
    parser.add_argument("seed", type=int)
    parser.add_argument("--every", type=int, default=8)
    parser.add_argument("--lifetimes", choices=packing.LIFETIMES, default="trace")
    parser.add_argument("--variant", choices=VARIANTS, action="append", default=[])
    parser.add_argument("--steady", type=float, default=400.0)
    parser.add_argument("--every-pods", type=int, default=50)
    parser.add_argument("--data", type=Path, default=packing.DATA)
    args = parser.parse_args(argv)
    print(json.dumps(detail(args.policy, args.seed, args.every, args.lifetimes,
                            tuple(args.variant),
                            args.steady, args.every_pods, args.data), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
