"""Every module's DOCUMENTATION / RETURN agrees with its argument_spec and its results."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
import yaml

LIBRARY = Path(__file__).resolve().parents[2] / "library"
MODULES = sorted(p.stem for p in LIBRARY.glob("*.py"))


def module_strings(name: str) -> dict[str, str]:
    tree = ast.parse((LIBRARY / f"{name}.py").read_text())
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    out[target.id] = node.value.value
    return out


def argument_spec(name: str) -> dict[str, Any]:
    """The argument_spec the module builds (evaluated from its source, no import)."""
    source = (LIBRARY / f"{name}.py").read_text()
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "AnsibleModule":
            for keyword in node.keywords:
                if keyword.arg == "argument_spec":
                    return _spec_value(keyword.value, tree)
    raise AssertionError(f"{name}: no AnsibleModule(argument_spec=...)")


def _spec_value(node: ast.expr, tree: ast.Module) -> dict[str, Any]:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.args \
            and not node.keywords:  # argument_spec=argument_spec()
        for fn in tree.body:
            if isinstance(fn, ast.FunctionDef) and fn.name == node.func.id:
                ret = next(n for n in ast.walk(fn) if isinstance(n, ast.Return))
                assert ret.value is not None
                return _spec_value(ret.value, tree)
    return _literal(node)


def _literal(node: ast.expr) -> Any:
    if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "dict":
        return {k.arg: _literal(k.value) for k in node.keywords}
    if isinstance(node, ast.List):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Starred):
        return None
    try:
        return ast.literal_eval(node)
    except ValueError:
        return "<expr>"


def compare(doc: dict[str, Any], spec: dict[str, Any], where: str) -> None:
    assert set(doc) == set(spec), f"{where}: documented {sorted(doc)} vs spec {sorted(spec)}"
    for key, entry in spec.items():
        documented = doc[key]
        assert documented.get("description"), f"{where}.{key}: no description"
        assert documented.get("type", "str") == entry.get("type", "str"), f"{where}.{key}: type"
        if "default" in entry and entry["default"] != "<expr>":
            assert documented.get("default") == entry["default"], f"{where}.{key}: default"
        choices = entry.get("choices")
        if isinstance(choices, list) and None not in choices:  # None: built from a constant
            assert documented.get("choices") == entry["choices"], f"{where}.{key}: choices"
        assert bool(documented.get("required")) == bool(entry.get("required")), f"{where}.{key}"
        if "options" in entry:
            compare(documented.get("suboptions", {}), entry["options"], f"{where}.{key}")


@pytest.mark.parametrize("name", MODULES)
def test_documentation_matches_argument_spec(name: str) -> None:
    strings = module_strings(name)
    doc = yaml.safe_load(strings["DOCUMENTATION"])
    assert doc["module"] == name
    assert {"check_mode", "diff_mode", "platform"} <= set(doc["attributes"])
    compare(doc.get("options", {}), argument_spec(name), name)
    assert yaml.safe_load(strings["EXAMPLES"])
    assert yaml.safe_load(strings["RETURN"]), f"{name}: RETURN must document the result keys"
