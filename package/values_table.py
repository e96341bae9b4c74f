#!/usr/bin/env python3
"""Generate the option tables of docs/charts.md from the charts' values.yaml (defaults and
the comment above each key) and values.schema.json (types, allowed values, patterns).

    package/values_table.py            rewrite the tables in docs/charts.md
    package/values_table.py --check    exit 1 when docs/charts.md is out of date

The tables sit between `<!-- BEGIN values: CHART -->` and `<!-- END values: CHART -->`;
everything else in the document is hand-written and left alone.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "charts.md"
CHARTS = ("metax-gpu-extensions", "metax-operator")
LOG_KEYS = ("dir", "level", "format", "rotationTime", "maxAge")
_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z][A-Za-z0-9_-]*):(?P<rest>.*)$")


def key_comments(values_text: str) -> dict[str, str]:
    """dotted key -> the comment block right above it (without '#', '-- ')."""
    out: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    block: list[str] = []
    for line in values_text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            block.append(stripped.lstrip("#").strip())
            continue
        match = _KEY.match(line)
        if not match:
            block = []
            continue
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([k for _, k in stack] + [match["key"]])
        text = " ".join(block).strip()
        if text.startswith("-- "):
            text = text[3:]
        out[path] = text
        stack.append((indent, match["key"]))
        block = []
    return out


def resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        target = schema["$defs"][node["$ref"].split("/")[-1]]
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def describe_type(schema: dict[str, Any], node: dict[str, Any]) -> tuple[str, str]:
    """(type, allowed values) of a schema node, for the table."""
    node = resolve(schema, node)
    if "anyOf" in node:
        parts = [describe_type(schema, n) for n in node["anyOf"]]
        types = " or ".join(dict.fromkeys(t for t, _ in parts))
        allowed = "; ".join(a for _, a in parts if a)
        return types, allowed
    kind = node.get("type", "object")
    if isinstance(kind, list):
        kind = " or ".join(kind)
    allowed = ""
    if "enum" in node:
        allowed = ", ".join(f"`{v}`" for v in node["enum"])
    elif "pattern" in node:
        allowed = f"pattern `{node['pattern']}`"
    elif "minimum" in node:
        allowed = f">= {node['minimum']}"
    if kind == "array" and "items" in node:
        item_type, item_allowed = describe_type(schema, node["items"])
        kind = f"list of {item_type}"
        allowed = item_allowed
    return kind, allowed


def fmt_default(value: Any) -> str:
    if isinstance(value, str):
        return f'`"{value}"`' if value == "" else f"`{value}`"
    if isinstance(value, list) and len(value) > 2 and all(isinstance(v, dict) for v in value):
        return f"{len(value)} entries (values.yaml)"  # a table of objects: too long for a cell
    return f"`{json.dumps(value, ensure_ascii=False)}`"


def rows(chart_dir: Path) -> list[tuple[str, str, str, str, str]]:
    text = (chart_dir / "values.yaml").read_text()
    values = yaml.safe_load(text)
    schema = json.loads((chart_dir / "values.schema.json").read_text())
    comments = key_comments(text)
    out: list[tuple[str, str, str, str, str]] = []

    def walk(vals: dict[str, Any], node: dict[str, Any], prefix: str) -> None:
        for key, value in vals.items():
            path = f"{prefix}{key}"
            child = resolve(schema, node["properties"][key])
            if key == "log" and prefix:  # a component's log: one row per key, global default
                for log_key in LOG_KEYS:
                    typ, allowed = describe_type(schema, child["properties"][log_key])
                    default = value.get(log_key)
                    out.append(
                        (
                            f"{path}.{log_key}",
                            typ,
                            fmt_default(default)
                            if default is not None
                            else f"global `log.{log_key}`",
                            allowed,
                            comments.get(path, ""),
                        )
                    )
                continue
            # resources is a Kubernetes object: documented as one option
            if isinstance(value, dict) and value and "properties" in child and key != "resources":
                walk(value, child, path + ".")
                continue
            typ, allowed = describe_type(schema, child)
            out.append((path, typ, fmt_default(value), allowed, comments.get(path, "")))

    walk(values, schema, "")
    return out


def table(chart: str) -> str:
    lines = [
        "| option | type | default | allowed | description |",
        "|---|---|---|---|---|",
    ]
    for path, typ, default, allowed, text in rows(REPO / "charts" / chart):
        cell, allowed_cell = text.replace("|", r"\|"), allowed.replace("|", r"\|")
        lines.append(f"| `{path}` | {typ} | {default} | {allowed_cell} | {cell} |")
    return "\n".join(lines)


def render(doc: str) -> str:
    for chart in CHARTS:
        begin, end = f"<!-- BEGIN values: {chart} -->", f"<!-- END values: {chart} -->"
        if begin not in doc or end not in doc:
            raise SystemExit(f"{DOC}: markers for {chart} are missing ({begin} ... {end})")
        head, rest = doc.split(begin, 1)
        _old, tail = rest.split(end, 1)
        doc = f"{head}{begin}\n{table(chart)}\n{end}{tail}"
    return doc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if docs/charts.md is stale")
    parser.add_argument("--doc", type=Path, default=DOC)
    args = parser.parse_args(argv)
    current = args.doc.read_text()
    wanted = render(current)
    if args.check:
        if current != wanted:
            print(f"{args.doc} is out of date: run package/values_table.py", file=sys.stderr)
            return 1
        return 0
    if current != wanted:
        args.doc.write_text(wanted)
        print(f"updated {args.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
