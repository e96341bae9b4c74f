"""The roles are not copies of each other: one implementation of each thing.

Task files of two different roles that share a long run of lines (after the role's own
variable prefix is set aside: ``gpu_extensions_x`` and ``gpu_operator_x`` read the same)
are the same logic written twice; the scheme roles (gpu_extensions, gpu_operator) share
``gpu_chart`` instead.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

ROLES = Path(__file__).resolve().parents[2] / "roles"
LONGEST_SHARED_RUN = 8  # lines; a single kubernetes.core call with its options is ~6


def normalized(role: str, path: Path) -> list[str]:
    out = []
    for line in path.read_text().splitlines():
        line = line.split(" #", 1)[0].rstrip()
        if not line.strip() or line.lstrip().startswith("#") or line == "---":
            continue
        out.append(re.sub(rf"\b{role}_", "ROLE_", line))
    return out


def longest_common_run(a: list[str], b: list[str]) -> int:
    best = 0
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0] * (len(b) + 1)
        for j, y in enumerate(b, 1):
            if x == y:
                current[j] = previous[j - 1] + 1
                best = max(best, current[j])
        previous = current
    return best


def task_files() -> list[tuple[str, Path]]:
    return [(role.name, f) for role in sorted(ROLES.iterdir()) if role.is_dir()
            for f in sorted((role / "tasks").glob("*.yml"))]


@pytest.mark.parametrize(
    ("first", "second"),
    [(a, b) for a, b in itertools.combinations(task_files(), 2) if a[0] != b[0]],
    ids=lambda pair: f"{pair[0]}/{pair[1].name}",
)
def test_no_role_repeats_another(first: tuple[str, Path], second: tuple[str, Path]) -> None:
    run = longest_common_run(normalized(*first), normalized(*second))
    assert run < LONGEST_SHARED_RUN, (
        f"{first[1].relative_to(ROLES)} and {second[1].relative_to(ROLES)} share {run} lines: "
        "move the logic into one role both use"
    )


def test_scheme_roles_use_the_shared_chart_role() -> None:
    for role in ("gpu_extensions", "gpu_operator"):
        text = (ROLES / role / "tasks" / "main.yml").read_text()
        assert "name: gpu_chart" in text, role
        assert "kubernetes.core.helm" not in text, role
