"""The shipped rules and the dashboard's queries, judged by Prometheus' own rule engine
(Debian's ``promtool test rules``; ``scripts/prereqs integration`` installs it with the
``prometheus`` package) over fixed input series.

Where the input is what gpu-exporter serves, it is not written by hand: a real exporter
(sampler and collector, on a simulated c500-8 node) is sampled before and after
``gpuk8s sim fail``, and each scrape becomes one minute of the input series, a series
missing from a scrape being a missing sample (as a Prometheus scraping the exporter
would store it). So the alert test fails if the exporter stops serving a lost GPU, or if
its neighbours' labels move, as well as if the rules are wrong.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuk8s import sim
from gpuk8s.services.exporter import main as exporter_main
from gpuk8s.services.exporter.metrics import registry_for
from tests.unit.test_monitoring import GEN

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "monitoring" / "prometheus" / "gpuk8s-rules.yml"
DASHBOARD = REPO / "monitoring" / "grafana" / "gpuk8s-gpus.json"
NODE = "gpu-node-1"

Scrape = dict[tuple[str, tuple[tuple[str, str], ...]], float]




def promtool(tmp_path: Path, tests: list[dict[str, Any]]) -> str:
    binary = shutil.which("promtool")
    assert binary, "promtool is needed: scripts/prereqs integration (Debian package prometheus)"
    path = tmp_path / "tests.yml"
    path.write_text(yaml.safe_dump({"rule_files": [str(RULES)], "evaluation_interval": "1m",
                                    "tests": tests}, sort_keys=False, width=1000))
    proc = subprocess.run([binary, "test", "rules", str(path)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    return proc.stdout


def series_name(name: str, labels: dict[str, str]) -> str:
    inner = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def close_to(expr: str, want: float) -> str:
    """An expression that is 1 where ``expr`` is ``want`` (promtool compares floats exactly)."""
    return f"abs(({expr}) - {want}) < bool 1e-9"


def panel_expr(title: str, kind: str = ".*", node: str = ".*") -> str:
    board = json.loads(DASHBOARD.read_text())
    (panel,) = [p for p in board["panels"] if p.get("title") == title]
    (target,) = panel["targets"]
    return str(target["expr"]).replace("$kind", kind).replace("$node", node)


# ------------------------------------------------------------- the per-node mean (dashboard)
def test_node_utilisation_panel_is_the_mean_over_gpus_not_over_kinds(tmp_path: Path) -> None:
    """The issue's example: 6 pGPUs at 0.2 x5 and 0.047 (mean 0.1745), 2 vGPUs at 0.5 and
    0.501 (mean 0.5005): the node's mean is 2.048 / 8 = 0.256; the mean of the kinds'
    means, which the panel used to show, 0.3375."""
    utils = [(0.2, "pGPU")] * 5 + [(0.047, "pGPU"), (0.5, "vGPU"), (0.501, "vGPU")]
    series = []
    for gpu, (util, kind) in enumerate(utils):
        labels = {"node": NODE, "gpu": str(gpu), "uuid": f"GPU-{gpu}", "kind": kind}
        series.append({"series": series_name("gpuk8s_gpu_utilization_ratio", labels),
                       "values": f"{util}x10"})
        series.append({"series": series_name("gpuk8s_gpu_healthy", labels), "values": "1x10"})
        series.append({"series": series_name("gpuk8s_gpu_lost", labels), "values": "0x10"})
    node = f'{{node="{NODE}"}}'
    per_kind_means = "avg by (node) (node_kind:gpuk8s_gpu_utilization_ratio:avg)"
    checks = [
        (panel_expr("GPU utilisation per node"), 0.256),
        (panel_expr("GPU utilisation per node", kind="pGPU|vGPU"), 0.256),
        (panel_expr("GPU utilisation per node", kind="vGPU"), 0.5005),
        (per_kind_means, 0.3375),  # what the old panel showed: the example tells them apart
    ]
    promtool(tmp_path, [{
        "interval": "1m",
        "input_series": series,
        "promql_expr_test": [
            *({"expr": close_to(expr, want), "eval_time": "5m",
               "exp_samples": [{"labels": node, "value": 1}]} for expr, want in checks),
            {"expr": "node_kind:gpuk8s_gpus:count", "eval_time": "5m", "exp_samples": [
                {"labels": f'node_kind:gpuk8s_gpus:count{{node="{NODE}", kind="pGPU"}}',
                 "value": 6},
                {"labels": f'node_kind:gpuk8s_gpus:count{{node="{NODE}", kind="vGPU"}}',
                 "value": 2}]},
        ],
    }])


# ------------------------------------------------- the exporter's own series, scrape by scrape
class Exporter:
    """A gpu-exporter on a simulated c500-8 node, scraped through its collector."""

    def __init__(self, tmp_path: Path) -> None:
        self.root = str(tmp_path / "node")
        sim.create(self.root, "c500-8")
        self.args = exporter_main.build_parser().parse_args([
            "--host-root", self.root, "--node-name", NODE, "--pod-resources-socket", "",
            "--log-dir", ""])
        self.start()

    def start(self) -> None:
        """(Re)start: a new sampler, as a restarted pod would build it (same state file)."""
        self.sampler = exporter_main.build_sampler(self.args)

    def scrape(self, rediscover: bool = False) -> Scrape:
        if rediscover:
            self.sampler.rediscover = 0.0
        self.sampler.sample_once()
        self.sampler.rediscover = 60.0
        text = generate_latest(registry_for(self.sampler, NODE)).decode()
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples
                if s.name.startswith("gpuk8s_gpu_")}


def input_series(timeline: Sequence[tuple[int, Scrape]]) -> list[dict[str, str]]:
    """promtool input: ``timeline`` is (minutes, scrape) in order; a series missing from
    a scrape has no sample in those minutes."""
    keys = sorted({key for _, scrape in timeline for key in scrape})
    out = []
    for name, labels in keys:
        runs: list[list[Any]] = []  # [token, minutes]
        for minutes, scrape in timeline:
            value = scrape.get((name, labels))
            token = "_" if value is None else repr(float(value))
            if runs and runs[-1][0] == token:
                runs[-1][1] += minutes
            else:
                runs.append([token, minutes])
        # "axn" is n+1 samples of a; "_xn" is n missing ones
        values = " ".join((f"_x{n}" if token == "_" else f"{token}x{n - 1}") if n > 1 else token
                          for token, n in runs)
        out.append({"series": series_name(name, dict(labels)), "values": values})
    return out


def expanded(rule: dict[str, Any], labels: dict[str, str]) -> dict[str, str]:
    """The rule's annotations with ``{{ $labels.x }}`` filled in, as Prometheus does."""
    return {key: re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], text)
            for key, text in rule["annotations"].items()}


def alert(name: str, labels: dict[str, str]) -> dict[str, Any]:
    (rule,) = [r for r in GEN.ALERT_RULES if r["alert"] == name]
    return {"exp_labels": {**labels, **rule["labels"]},
            "exp_annotations": expanded(rule, labels)}


def _uuid(scrape: Scrape, gpu: str) -> str:
    (uuid,) = {dict(k[1])["uuid"] for k in scrape
               if k[0] == "gpuk8s_gpu_healthy" and dict(k[1])["gpu"] == gpu}
    return uuid


def test_the_alert_on_a_lost_gpu_does_not_clear_by_itself(tmp_path: Path) -> None:
    """GPU 3 leaves the bus at minute 10 (`sim fail --mode remove`); the exporter
    rediscovers (GPUs above it renumbered by discovery) and is restarted at minute 60.
    GpuLost fires from minute 11 and still fires a day later, GpuUnhealthy never fires
    (lost is said once), and the neighbours' series go on under their labels."""
    exporter = Exporter(tmp_path)
    healthy = exporter.scrape()
    sim.fail(exporter.root, 3, "remove")
    stale = exporter.scrape()
    gone = exporter.scrape(rediscover=True)
    exporter.start()
    restarted = exporter.scrape()
    lost = {"node": NODE, "gpu": "3", "uuid": _uuid(healthy, "3")}
    neighbour = ("gpuk8s_gpu_utilization_ratio",
                 (("gpu", "7"), ("kind", "pGPU"), ("node", NODE), ("uuid", _uuid(healthy, "7"))))
    assert neighbour in healthy and neighbour in restarted
    timeline = [(10, healthy), (1, stale), (49, gone), (24 * 60, restarted)]
    promtool(tmp_path, [{
        "interval": "1m",
        "input_series": input_series(timeline),
        "alert_rule_test": [
            {"eval_time": "9m", "alertname": "GpuLost", "exp_alerts": []},
            *({"eval_time": when, "alertname": "GpuLost", "exp_alerts": [alert("GpuLost", lost)]}
              for when in ("12m", "59m", "61m", "6h", "24h")),
            *({"eval_time": when, "alertname": "GpuUnhealthy", "exp_alerts": []}
              for when in ("30m", "24h")),
        ],
        "promql_expr_test": [
            {"expr": "node_kind:gpuk8s_gpus:count", "eval_time": "24h", "exp_samples": [
                {"labels": f'node_kind:gpuk8s_gpus:count{{node="{NODE}", kind="pGPU"}}',
                 "value": 8}]},
            {"expr": "node_kind:gpuk8s_gpus_lost:sum", "eval_time": "24h", "exp_samples": [
                {"labels": f'node_kind:gpuk8s_gpus_lost:sum{{node="{NODE}", kind="pGPU"}}',
                 "value": 1}]},
            {"expr": 'count(gpuk8s_gpu_utilization_ratio{gpu="7"})', "eval_time": "24h",
             "exp_samples": [{"labels": "{}", "value": 1}]},
        ],
    }])


def test_the_alert_ends_when_the_gpu_returns_or_is_forgotten(tmp_path: Path) -> None:
    """The two ways a GpuLost alert ends: the GPU comes back (`sim heal`), or an
    administrator runs `gpuk8s exporter forget` (its series end)."""
    exporter = Exporter(tmp_path)
    healthy = exporter.scrape()
    uuid = _uuid(healthy, "5")
    sim.fail(exporter.root, 5, "remove")
    gone = exporter.scrape(rediscover=True)
    sim.heal(exporter.root, 5)
    back = exporter.scrape(rediscover=True)
    sim.fail(exporter.root, 5, "remove")
    gone_again = exporter.scrape(rediscover=True)
    from gpuk8s.cli import main as cli_main

    state = str(Path(exporter.root) / "var/lib/gpuk8s/exporter/gpus.json")
    assert cli_main(["exporter", "forget", "--state-file", state, "5"]) == 0
    forgotten = exporter.scrape()
    lost = {"node": NODE, "gpu": "5", "uuid": uuid}
    timeline = [(5, healthy), (120, gone), (60, back), (120, gone_again), (120, forgotten)]
    promtool(tmp_path, [{
        "interval": "1m",
        "input_series": input_series(timeline),
        "alert_rule_test": [
            {"eval_time": "2h", "alertname": "GpuLost", "exp_alerts": [alert("GpuLost", lost)]},
            {"eval_time": "2h10m", "alertname": "GpuLost", "exp_alerts": []},
            {"eval_time": "5h", "alertname": "GpuLost", "exp_alerts": [alert("GpuLost", lost)]},
            {"eval_time": "5h10m", "alertname": "GpuLost", "exp_alerts": []},
            {"eval_time": "7h", "alertname": "GpuLost", "exp_alerts": []},
        ],
    }])


def test_an_unbound_gpu_is_counted_and_alerted_as_unhealthy(tmp_path: Path) -> None:
    """`sim fail --mode unbind`: the GPU has no load and no memory figures any more; it is
    still one of the node's 8 GPUs, one unhealthy, and GpuUnhealthy fires for it after
    5 minutes (not GpuLost: it is on the bus)."""
    exporter = Exporter(tmp_path)
    healthy = exporter.scrape()
    sim.fail(exporter.root, 2, "unbind")
    unbound = exporter.scrape(rediscover=True)
    assert not [k for k in unbound if k[0] == "gpuk8s_gpu_memory_total_bytes"
                and dict(k[1])["gpu"] == "2"]
    gpu2 = {"node": NODE, "gpu": "2", "uuid": _uuid(healthy, "2")}
    kind = f'{{node="{NODE}", kind="pGPU"}}'
    promtool(tmp_path, [{
        "interval": "1m",
        "input_series": input_series([(5, healthy), (60, unbound)]),
        "alert_rule_test": [
            {"eval_time": "8m", "alertname": "GpuUnhealthy", "exp_alerts": []},
            {"eval_time": "20m", "alertname": "GpuUnhealthy",
             "exp_alerts": [alert("GpuUnhealthy", gpu2)]},
            {"eval_time": "20m", "alertname": "GpuLost", "exp_alerts": []},
        ],
        "promql_expr_test": [
            {"expr": "node_kind:gpuk8s_gpus:count", "eval_time": "20m",
             "exp_samples": [{"labels": f"node_kind:gpuk8s_gpus:count{kind}", "value": 8}]},
            {"expr": "node_kind:gpuk8s_gpus_unhealthy:sum", "eval_time": "20m",
             "exp_samples": [{"labels": f"node_kind:gpuk8s_gpus_unhealthy:sum{kind}",
                              "value": 1}]},
        ],
    }])


def test_the_manuals_paddle_alert_fires_while_allocations_fail(tmp_path: Path) -> None:
    """GPUAllocConflict (the accelerator manual's 002-32, on the training job's own counter
    paddle_gpu_malloc_failed_total): silent while the counter stands still, firing while
    it grows (from minute 10 to 20), silent again five minutes after it stops."""
    (rule,) = GEN.APPLICATION_ALERTS
    job = {"job": "paddle-train", "pod": "train-0"}
    series = series_name("paddle_gpu_malloc_failed_total", job)
    promtool(tmp_path, [{
        "interval": "1m",
        "input_series": [{"series": series, "values": "0x10 1+1x10 11x20"}],
        "alert_rule_test": [
            {"eval_time": "9m", "alertname": "GPUAllocConflict", "exp_alerts": []},
            {"eval_time": "15m", "alertname": "GPUAllocConflict", "exp_alerts": [
                {"exp_labels": {**job, **rule["labels"]},
                 "exp_annotations": rule["annotations"]}]},
            {"eval_time": "30m", "alertname": "GPUAllocConflict", "exp_alerts": []},
        ],
    }])
