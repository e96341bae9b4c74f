"""The manuals' commands kept in the repository, and every one of them accounted for.

docs/manual/MANUAL_COMMANDS.md is the repository's copy of ../shared/MANUAL_COMMANDS.md (a
clean clone, as CI has, has no ../shared). Where the shared file is beside the checkout the
copy must equal it; everywhere the copy must be whole: 44 blocks of the vendor manual
(001-01 .. 001-44) and 59 of the accelerator suite's (002-01 .. 002-59), in order. Every
block is run by tests/e2e/test_manual.py (or another e2e test it names), or listed in
docs/manual-conformance.md with the reason it cannot run here; every deliberate difference
the e2e test makes has its row there.
"""

from __future__ import annotations

import re

from tests.e2e import test_manual
from tests.manual import CONFORMANCE, COUNTS, REPO, SHARED, VENDORED, blocks, parse


def test_the_vendored_copy_is_the_shared_file_or_whole() -> None:
    vendored = VENDORED.read_text(encoding="utf-8")
    if SHARED.exists():
        assert vendored == SHARED.read_text(encoding="utf-8"), (
            f"{VENDORED} differs from {SHARED}: copy it again (cp {SHARED} {VENDORED})")
    found = parse(vendored)
    expected = [f"{manual}-{n:02d}" for manual, count in COUNTS.items()
                for n in range(1, count + 1)]
    assert list(found) == expected
    for b in found.values():
        # a listing, a table, or a reference to the listing it repeats
        assert b.fences or b.table or b.refers_to, b.id
        assert all(ref in found for ref in b.refers_to), b.id


def test_the_parser_reads_blocks_as_printed() -> None:
    b = blocks()
    assert b["001-03"].code == "./k8s/metax-k8s-images.0.8.0.run push DOMAIN/PROJECT\n"
    assert b["001-01"].commands() == [
        "mkdir k8s", "tar -C k8s -xvzf metax-gpu-k8s-package.0.8.0.tar.gz"]
    assert b["002-39"].commands() == ["nvidia-smi"]
    assert b["002-48"].commands() == [
        "kubectl describe service kubernetes -n default |grep Endpoints"]
    assert b["001-23"].refers_to == ["001-21"]
    assert b["001-12"].table[0] == {"option": "`registry`", "type": "string",
                                    "default / allowed values":
                                        "default `cr.metax-tech.com/cloud`; usually "
                                        "`DOMAIN/PROJECT`"}
    assert "awk '{print $3}'" in b["001-18"].notes


def conformance_rows(title: str) -> dict[str, str]:
    """Block id -> row of the table under the heading `title` in manual-conformance.md."""
    text = CONFORMANCE.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    rows: dict[str, str] = {}
    for line in text[start:end if end > 0 else len(text)].splitlines():
        for block_id in re.findall(r"^\|\s*([0-9]{3}-[0-9]{2}(?:,\s*[0-9]{3}-[0-9]{2})*)\s*\|",
                                   line):
            for one in re.split(r",\s*", block_id):
                rows[one] = line
    return rows


def test_every_block_runs_or_says_why_not() -> None:
    run_by_test = {b for ids in test_manual.RUNS.values() for b in ids}
    elsewhere = set(test_manual.ELSEWHERE)
    not_run = set(conformance_rows("Blocks not run here"))
    every = set(blocks())
    missing = sorted(every - run_by_test - elsewhere - not_run)
    assert not missing, f"neither run nor listed as not run: {missing}"
    assert not_run <= every and run_by_test <= every
    # a block listed as not run is not claimed by a test as well
    assert not (not_run & (run_by_test | elsewhere)), sorted(not_run & (run_by_test | elsewhere))


def test_tests_named_elsewhere_exist() -> None:
    for block_id, where in test_manual.ELSEWHERE.items():
        path, name = where.split("::")
        assert f"def {name}(" in (REPO / path).read_text(), (block_id, where)


def test_every_difference_the_e2e_test_makes_is_recorded() -> None:
    source = (REPO / "tests" / "e2e" / "test_manual.py").read_text()
    made = {b for call in re.findall(r"differs\(([^)]*)\)", source)
            for b in re.findall(r'"([0-9]{3}-[0-9]{2})"', call)}
    assert made, "no differs(...) calls found"
    recorded = set(conformance_rows("Deliberate differences"))
    assert made <= recorded, f"not in docs/manual-conformance.md: {sorted(made - recorded)}"
