"""The replay's report (``replay.py`` prints it): ``render`` turns a ``Report`` into the
text table: the fill beside ``packing.py``'s in-process figure, churn latencies, faults
and their recovery, and the checker's lines.

Example: ``share_text((3, 4)) == "75.0 % (3/4)"``, ``failed_text({2: 1, 1: 3}) == "1:3 2:1"``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from replay_harness import (  # first: it puts lab/ on sys.path
    seconds_text,
)
from replay_scenarios import Report
from scheduling import versions
from stats import percentile


# ----------------------------------------------------------------------------- output
def share_text(counts: Sequence[int]) -> str:
    inside, total = counts
    return f"{100 * inside / total:.1f} % ({inside}/{total})" if total else "-"


def failed_text(counts: dict[Any, Any]) -> str:
    return " ".join(f"{k}:{v}" for k, v in sorted((int(k), v) for k, v in counts.items())) or "-"


def cpu_text(cpu_s: dict[str, float], pods: int) -> str:
    """process -> CPU seconds as "name ms-per-pod, ..."."""
    return ", ".join(f"{k} {1e3 * v / pods:.1f}" for k, v in cpu_s.items())


def render(report: Report) -> str:
    o = report.options
    lines = [
        f"openb replay through the real kube-scheduler {versions()['KUBE_VERSION']} and "
        f"gpu-aware (HTTP), seed {o['seed']}: {report.nodes} fake nodes, {report.gpus} GPUs "
        f"(vcuda sharing), window {o['window']}; set-up {report.setup_seconds:.0f}s, "
        f"total {report.total_seconds:.0f}s"
    ]
    f, row = report.fill, report.packing_row
    if f is not None:
        inside = share_text(f.inside)
        lines += [
            "",
            "| figure | replay (lab: API server, kube-scheduler, gpu-aware) "
            "| packing.py (in-process) |",
            "|---|---|---|",
        ]
        p_alloc = p_failed = p_inside = in_process = "-"
        if row is not None:
            p_alloc = f"{row['alloc100']:.2f} %"
            p_failed = failed_text(row["failed100"])
            p_inside = share_text(row["inside"])
            in_process = f"{report.packing_seconds:.0f} s for the seed (to arrived 130 %)"
        lines += [
            f"| allocated at arrived 100 % | {f.allocation:.2f} % | {p_alloc} |",
            f"| failed pods by GPU count | {failed_text(f.failed)} | {p_failed} |",
            f"| multi-GPU pods inside one link group | {inside} | {p_inside} |",
            f"| pods / s | {f.rate:.1f} ({f.pods} pods in {f.seconds:.0f} s) | {in_process} |",
        ]
        if f.cpu_s and f.pods:
            lines.append(f"| CPU ms per pod (this machine: 2 cores, shared) "
                         f"| {cpu_text(f.cpu_s, f.pods)} | - |")
        a = report.alone
        if a is not None and f.head[0]:
            n, seconds = f.head
            lines += [
                f"| the first {n} pods: pods / s, with gpu-aware | {n / max(seconds, 1e-9):.1f} "
                f"({n} pods in {seconds:.0f} s) | - |",
                f"| the same {a.pods} pods, kube-scheduler alone (before the fill, then "
                f"deleted) | {a.rate:.1f} ({a.placed} placed in {a.seconds:.0f} s) | - |",
                f"| CPU ms per pod, kube-scheduler alone | {cpu_text(a.cpu_s, a.pods)} | - |",
            ]
        for verb in ("filter", "prioritize", "bind"):
            lat = f.latency.get(verb, {})
            p50, p99 = lat.get("p50_ms"), lat.get("p99_ms")
            text = "-"
            if p50 is not None and p99 is not None:
                text = f"{p50:.1f} / {p99:.1f} ms ({lat['count']:.0f} calls)"
            lines.append(f"| gpu-aware {verb} p50 / p99 | {text} | - |")
        if row is not None:
            lines.append(
                f"\nreplay − in-process: {f.allocation - row['alloc100']:+.2f} points; "
                f"scheduling errors retried {f.scheduler_errors}, failed pods retried before "
                f"their deletion {f.retried_before_delete}; each pod placed or failed once: "
                f"{'yes' if report.placed_or_failed_once else 'NO'}"
            )
    c = report.churn
    if c is not None:
        p50, p99 = percentile(c.latencies_s, 0.5), percentile(c.latencies_s, 0.99)
        lines += [
            "",
            f"churn: {c.cycles} cycles (a GPU pod deleted, a pod of its shape pinned to its "
            f"node arrives) in {c.seconds:.0f}s; {c.measured} waited and were bound after the "
            f"release, {c.fit_at_once} fitted at once, {len(c.stuck)} not bound within 60 s",
            f"  release -> bind of the waiting pod: p50 {seconds_text(p50)}, "
            f"p99 {seconds_text(p99)}, "
            f"max {seconds_text(max(c.latencies_s) if c.latencies_s else None)}",
        ]
    if report.faults:
        lines += ["", "| fault (under load) | recovery | result | details |", "|---|---|---|---|"]
        for fault in report.faults:
            details = ", ".join(f"{k}={v}" for k, v in fault.details.items())
            lines.append(
                f"| {fault.name} | {seconds_text(fault.recovery_s)} | "
                f"{'ok' if fault.ok else 'FAILED'} | {details} |"
            )
    if report.checks:
        lines += ["", "consistency (gpu-aware's ledger, device plugin, API):"]
        lines += ["  " + check_.line() for check_ in report.checks]
        stale = sum(check_.stale for check_ in report.checks)
        lines.append(f"  stale bookings over all checks: {stale}")
    return "\n".join(lines)

