"""Monitoring artifacts: generated from one definition (monitoring/generate.py), committed,
and consistent with what gpu-exporter serves."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from gpuk8s.core.gpuusage import KINDS
from gpuk8s.services.exporter.metrics import METRICS

REPO = Path(__file__).resolve().parents[2]


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpuk8s_monitoring_generate",
                                                  REPO / "monitoring" / "generate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


GEN = _generator()
EXPORTED = {name for name, *_ in METRICS}
RECORDED = {name for name, _ in GEN.RECORDING_RULES}


def test_regenerating_gives_the_committed_files() -> None:
    for path, text in GEN.outputs().items():
        assert path.read_text() == text, f"{path} is stale: run python monitoring/generate.py"
    assert GEN.main(["--check"]) == 0


def test_check_detects_a_stale_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    stale = tmp_path / "rules.yml"
    stale.write_text("groups: []\n")
    monkeypatch.setattr(GEN, "RULES_FILE", stale)
    assert GEN.main(["--check"]) == 1
    assert "out of date" in capsys.readouterr().err


def _metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\b(gpuk8s_[a-z_]+|node[a-z_]*:gpuk8s_[a-z_]+:[a-z_]+)\b", expr))


def test_rules_use_only_exported_metrics_and_label_node_and_pod_levels() -> None:
    rules = yaml.safe_load((REPO / "monitoring/prometheus/gpuk8s-rules.yml").read_text())
    group, alerts, applications = rules["groups"]
    assert [r["record"] for r in group["rules"]] == [n for n, _ in GEN.RECORDING_RULES]
    assert [r["alert"] for r in alerts["rules"]] == ["GpuLost", "GpuUnhealthy"]
    for rule in alerts["rules"]:  # per GPU identity: a pod arriving (kind) changes nothing
        assert _metric_names(rule["expr"]) <= EXPORTED, rule
        assert "by (node, gpu, uuid)" in rule["expr"] and "kind" not in rule["expr"], rule
        assert rule["labels"]["severity"] in ("critical", "warning")
    # the accelerator manual's Paddle alert (002-32), on the application's own metric
    assert applications["rules"] == GEN.APPLICATION_ALERTS
    assert [r["alert"] for r in applications["rules"]] == ["GPUAllocConflict"]
    for rule in group["rules"]:
        names = _metric_names(rule["expr"])
        assert names and names <= EXPORTED, rule
        level = rule["record"].split(":")[0]
        assert level in ("node_kind", "node_namespace_pod_kind"), level
        for label in level.split("_"):
            assert label in rule["expr"], (label, rule)


def test_dashboard_filters_ranges_and_queries() -> None:
    board = json.loads((REPO / "monitoring/grafana/gpuk8s-gpus.json").read_text())
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert {"kind", "node", "namespace", "pod"} <= set(variables)
    assert variables["kind"]["query"] == "label_values(gpuk8s_gpu_healthy, kind)"
    options = board["timepicker"]["time_options"]
    assert options[0] == "30m" and options[-1] == "7d"
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    assert exprs
    for expr in exprs:
        assert _metric_names(expr) <= EXPORTED | RECORDED, expr
        assert 'kind=~"$kind"' in expr, expr
    pod_level = [e for e in exprs if "namespace_pod" in e]
    assert pod_level and all('namespace=~"$namespace"' in e and 'pod=~"$pod"' in e
                             for e in pod_level)
    assert set(KINDS) == {"pGPU", "vGPU", "MPS"}
