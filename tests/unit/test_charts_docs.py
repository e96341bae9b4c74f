"""docs/charts.md documents every chart option: its generated tables are up to date and
list every key of both values.yaml files (the generator is package/values_table.py), and
no other page carries a second, stale copy of them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
GENERATOR = REPO / "package" / "values_table.py"
DOC = REPO / "docs" / "charts.md"


def _keys(values: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        # resources is a Kubernetes object: documented as one option
        if isinstance(value, dict) and value and key != "resources":
            out += _keys(value, path + ".")
        else:
            out.append(path)
    return out


def test_doc_tables_are_up_to_date() -> None:
    proc = subprocess.run(
        [sys.executable, str(GENERATOR), "--check"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr + "\nrun: python package/values_table.py"


def test_check_mode_detects_a_stale_doc(tmp_path: Path) -> None:
    stale = tmp_path / "charts.md"
    stale.write_text(DOC.read_text().replace("| `gpuDevice.healthyInterval` |", "| `x` |"))
    proc = subprocess.run(
        [sys.executable, str(GENERATOR), "--check", "--doc", str(stale)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 1 and "out of date" in proc.stderr


def test_every_option_is_in_the_doc() -> None:
    doc = DOC.read_text()
    for chart in ("metax-gpu-extensions", "metax-operator"):
        section = doc.split(f"<!-- BEGIN values: {chart} -->")[1].split("<!-- END values:")[0]
        values = yaml.safe_load((REPO / "charts" / chart / "values.yaml").read_text())
        for key in _keys(values):
            if key.endswith(".log"):  # a component's log: one row per log key
                for sub in ("dir", "level", "format", "rotationTime", "maxAge"):
                    assert f"| `{key}.{sub}` |" in section, f"{chart}: {key}.{sub}"
            else:
                assert f"| `{key}` |" in section, f"{chart}: {key} not documented"


def test_the_tables_live_only_in_the_charts_page() -> None:
    pages = [REPO / "README.md", REPO / "lab" / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    holders = [page.relative_to(REPO).as_posix() for page in pages
               if "<!-- BEGIN values:" in page.read_text()]
    assert holders == ["docs/charts.md"], holders
