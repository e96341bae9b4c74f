"""docs/README.md is the index the README links to: every page of docs/ is listed there, with
one line each. (tests/unit/test_docs.py checks that its links and #anchors resolve.)"""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"
INDEX = DOCS / "README.md"


def test_every_page_is_in_the_index() -> None:
    listed = re.findall(r"^\| \[[^\]]+\]\(([^)#]+)\) \| \S", INDEX.read_text(), re.M)
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md") if p != INDEX}
    assert pages - set(listed) == set(), f"add to docs/README.md: {sorted(pages - set(listed))}"
    assert set(listed) - pages == set(), f"listed but missing: {sorted(set(listed) - pages)}"
    assert len(listed) == len(set(listed)), "a page listed twice"
