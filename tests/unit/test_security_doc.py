"""docs/security.md's RBAC and admission matrix stays true between two runs of the real-API
test that writes it (tests/integration/test_rbac_matrix_apiserver.py, issue 50): every
permission the charts grant, rendered with the same values, has its row; the doc shows no
node agent writing another node's object; every row says what the permission is for."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from .test_charts import CHARTS, NS, REL, Objects, _permissions, _rules_by_subject, run_helm

REPO = Path(__file__).resolve().parents[2]
MATRIX_TEST = REPO / "tests" / "integration" / "test_rbac_matrix_apiserver.py"


def _matrix_test() -> ModuleType:
    spec = importlib.util.spec_from_file_location("rbac_matrix", MATRIX_TEST)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _doc_rows(matrix: ModuleType) -> dict[str, list[list[str]]]:
    """chart -> its rows (ServiceAccount, resource, verb, own, other, for)."""
    text = (REPO / "docs" / "security.md").read_text()
    assert matrix.BEGIN in text and matrix.END in text
    table = text.split(matrix.BEGIN, 1)[1].split(matrix.END, 1)[0]
    rows: dict[str, list[list[str]]] = {}
    chart = ""
    for line in table.strip().splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0].startswith("**"):
            chart = cells[0].strip("*")
            rows[chart] = []
        else:
            rows[chart].append(cells)
    return rows


def _granted(chart: str, values: list[str], resources: Any, verbs: Any) -> set[tuple[str, ...]]:
    """(ServiceAccount, resource, verb) the chart's RBAC grants, of those the matrix tries
    (helm install's objects: the test hook's are left out)."""
    proc = run_helm(["template", REL, str(CHARTS / chart), "-n", NS, *values])
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d and "helm.sh/hook" not in (
        d["metadata"].get("annotations") or {})]
    out = set()
    for sa, rules in _rules_by_subject(Objects(docs)).items():
        for _group, resource, verb, _name in _permissions(rules):
            if resource in resources and verb in verbs:
                out.add((sa, resource, verb))
    return out


@pytest.mark.parametrize("chart", ["metax-gpu-extensions", "metax-operator"])
def test_the_matrix_shows_every_permission_the_chart_grants(chart: str) -> None:
    matrix = _matrix_test()
    rows = _doc_rows(matrix)[chart]
    shown = {(r[0].split(" ")[0], r[1], r[2]) for r in rows}
    granted = _granted(chart, matrix.CHARTS[chart], matrix.RESOURCES, matrix.VERBS)
    assert granted <= shown, (
        f"{sorted(granted - shown)} granted but not in docs/security.md: run "
        "GPUK8S_WRITE_DOCS=1 pytest tests/integration/test_rbac_matrix_apiserver.py")
    for sa, resource, verb, own, other, why in rows:
        assert why, (sa, resource, verb)
        assert {own, other} <= {"yes", "policy", "-"}, (sa, resource, verb)
        if sa.endswith("(node agent)") and verb.split(" ")[0] in matrix.WRITES and (
                resource.split("/")[0] in matrix.NODE_SCOPED):
            assert other != "yes", f"{sa} may {verb} {resource} of another node"
