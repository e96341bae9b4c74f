"""docs/README.md is the index the README links to: every page of docs/ is listed there,
and every link in it (page and #anchor) leads somewhere."""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"
INDEX = DOCS / "README.md"


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: its text (inline code and links as their text), lower
    case, without punctuation, blanks as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).replace("`", "")
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return {slug(m) for m in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def test_slug_is_githubs() -> None:
    assert slug("Rolling driver / VF upgrades (day 2)") == "rolling-driver--vf-upgrades-day-2"
    assert slug("### `metax-k8s-images.<V>.run`".lstrip("# ")) == "metax-k8s-imagesvrun"
    assert slug("4–5. Checks, nvidia-smi in a container") == "45-checks-nvidia-smi-in-a-container"


def test_every_page_is_in_the_index() -> None:
    listed = set(re.findall(r"^\| \[[^\]]+\]\(([^)#]+)\)", INDEX.read_text(), re.M))
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md") if p != INDEX}
    assert pages - listed == set(), f"add to docs/README.md: {sorted(pages - listed)}"
    assert listed - pages == set(), f"listed but missing: {sorted(listed - pages)}"


def test_every_link_of_the_index_leads_somewhere() -> None:
    for target in re.findall(r"\]\(([^)]+)\)", INDEX.read_text()):
        page, _, anchor = target.partition("#")
        path = DOCS / page
        assert path.exists(), target
        if anchor:
            assert anchor in anchors(path), f"{target}: no such heading in {page}"
