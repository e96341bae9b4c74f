"""benchmarks/null_extender.py: the do-nothing extender the scheduling benchmark compares
gpu-aware with must answer what kube-scheduler accepts (every node passes, no score)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "null_extender.py"


def load() -> ModuleType:
    name = "gpuk8s_null_extender_benchmark"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, BENCH)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # msgspec resolves the annotations through it
        spec.loader.exec_module(module)
    return sys.modules[name]


POD = {"metadata": {"name": "p", "namespace": "default", "uid": "u"}}


def test_node_cache_filter_passes_every_name_and_prioritize_scores_none() -> None:
    ext = load().NullExtender()
    body = json.dumps({"Pod": POD, "NodeNames": ["a", "b"]}).encode()
    filtered = ext.handle("filter", body)
    assert filtered.status == 200
    assert json.loads(filtered.body) == {
        "Nodes": None, "NodeNames": ["a", "b"], "FailedNodes": {},
        "FailedAndUnresolvableNodes": {}, "Error": ""}
    assert json.loads(ext.handle("prioritize", body).body) == []
    scored = load().NullExtender(scores=True).handle("prioritize", body)
    assert json.loads(scored.body) == [{"Host": "a", "Score": 1}, {"Host": "b", "Score": 1}]


def test_full_list_filter_echoes_the_node_objects_as_sent() -> None:
    ext = load().NullExtender()
    nodes = [{"metadata": {"name": "a", "labels": {"x": "1"}}}, {"metadata": {"name": "b"}}]
    body = json.dumps({"Pod": POD, "Nodes": {"items": nodes}}).encode()
    answer = json.loads(ext.handle("filter", body).body)
    assert answer["Nodes"]["items"] == nodes and answer["NodeNames"] is None
    assert ext.handle("filter", b"{not json").status == 400
    assert ext.handle("preempt", body).status == 404
