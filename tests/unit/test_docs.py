"""The README and the docs: the README is a landing page that starts with its two
commands, every relative link of the README, lab/README.md and docs/ points at a file
that exists (and, with an #anchor, at a heading of it), every test and benchmark file
they name exists, and the README's simulator commands run as printed."""

from __future__ import annotations

import json
import re
import shlex
import socket
import subprocess
import sys
import time
import unicodedata
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
PAGES = [README, REPO / "lab" / "README.md", *sorted((REPO / "docs").rglob("*.md"))]

# Pages the README links to that another branch is adding. A missing one is allowed only
# while it is listed here; once it exists it is checked like any page, and
# test_pending_pages_are_really_pending asks for its name to be taken off this list.
PENDING: set[str] = set()

_FENCE = re.compile(r"^(```|~~~)")
_LINK = re.compile(r"\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
_REPO_FILE = re.compile(r"\b((?:tests|benchmarks)/[\w./-]+\.py)(?:::(\w+))?")


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    out, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the text without markup, lower case, punctuation
    dropped (letters, digits, '_', '-' and spaces kept), spaces turned into '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = text.replace("`", "").strip().lower()
    kept = "".join(
        ch for ch in text
        if ch in " -_" or unicodedata.category(ch)[0] in ("L", "N")
    )
    return kept.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in prose_lines(page.read_text()):
        match = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def links(page: Path) -> list[str]:
    found = []
    for line in prose_lines(page.read_text()):
        found += _LINK.findall(_CODE_SPAN.sub("", line))
    return found


def test_slug_follows_github() -> None:
    cases = {
        "GPU sharing — what is enforced, per mode": "gpu-sharing--what-is-enforced-per-mode",
        "Host paths: `--device-path-prefix`": "host-paths---device-path-prefix",
        "`gpuk8s top`, over one or several exporters": "gpuk8s-top-over-one-or-several-exporters",
        "Rolling driver / VF upgrades (day 2)": "rolling-driver--vf-upgrades-day-2",
        "[A link](x.md) in a heading": "a-link-in-a-heading",
    }
    for heading, anchor in cases.items():
        assert slug(heading) == anchor, heading


def test_the_readme_starts_with_its_two_commands() -> None:
    lines = README.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("```"))
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("```"))
    assert lines[start] == "```sh"
    commands = [line.split("#")[0].strip() for line in lines[start + 1:end]]
    assert commands == ["lab/up && lab/install", "scripts/test"]
    assert (REPO / ".ci" / "run").read_text().count("scripts/test") >= 1


def test_the_readme_is_a_landing_page() -> None:
    assert len(README.read_text().splitlines()) <= 300


def test_every_relative_link_points_at_a_file_and_a_heading() -> None:
    problems = []
    for page in PAGES:
        for target in links(page):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            path_part, _, anchor = target.partition("#")
            dest = (page.parent / path_part).resolve() if path_part else page
            where = f"{page.relative_to(REPO)}: ({target})"
            try:
                rel = dest.relative_to(REPO).as_posix()
            except ValueError:
                problems.append(f"{where} leaves the repository")
                continue
            if not dest.exists():
                if rel not in PENDING:
                    problems.append(f"{where} names a missing file")
                continue
            if anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
                problems.append(f"{where} names a missing heading")
    assert not problems, "\n".join(problems)


def test_a_broken_link_and_a_broken_anchor_are_found(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[a](missing.md) [b](#nowhere) [c](#title) `[d](x.md)`\n"
                    "```\n[e](y.md)\n```\n")
    assert links(page) == ["missing.md", "#nowhere", "#title"]
    assert anchors(page) == {"title"}


def test_pending_pages_are_really_pending() -> None:
    landed = sorted(p for p in PENDING if (REPO / p).exists())
    assert not landed, f"{landed} exist now: take them off PENDING in {Path(__file__).name}"


def test_every_test_and_benchmark_named_exists() -> None:
    problems = []
    for page in PAGES:
        text = page.read_text()
        for path, name in _REPO_FILE.findall(text):
            file = REPO / path
            if not file.exists():
                problems.append(f"{page.relative_to(REPO)}: {path} does not exist")
            elif name and not re.search(rf"\bdef {name}\b", file.read_text()):
                problems.append(f"{page.relative_to(REPO)}: {path} has no {name}")
    assert not problems, "\n".join(problems)


def _try_it_block() -> list[str]:
    text = README.read_text()
    section = text.split("## Try it without a cluster", 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip()]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_the_readme_simulator_commands_run_as_printed(tmp_path: Path) -> None:
    lines = _try_it_block()
    assert lines[0].startswith("python3 -m venv .venv")  # the set-up this test runs in
    root, port = str(tmp_path / "node"), str(_free_port())
    gpuk8s = [sys.executable, "-m", "gpuk8s.cli"]
    outputs: dict[str, str] = {}
    exporter = None
    try:
        for line in lines[1:]:
            command = line.split("  #")[0].strip()
            background = command.endswith("&")
            argv = shlex.split(command.rstrip("&").strip())
            assert argv[0] == ".venv/bin/gpuk8s", line
            argv = gpuk8s + [a.replace("/tmp/node", root) for a in argv[1:]]
            argv = [a.replace("9400", port) for a in argv]
            if background:
                exporter = subprocess.Popen(argv, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL)
                deadline = time.monotonic() + 30
                while True:
                    try:
                        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                                    timeout=5) as answer:
                            metrics = answer.read().decode()
                        if "gpuk8s_gpu_utilization_ratio" in metrics:
                            break
                    except OSError:
                        pass
                    assert time.monotonic() < deadline, "the exporter never answered"
                    time.sleep(0.2)
                outputs["metrics"] = metrics
                continue
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
            assert proc.returncode == 0, f"{line}\n{proc.stdout}\n{proc.stderr}"
            outputs[" ".join(argv[3:5])] = proc.stdout  # e.g. "allocate --root"
    finally:
        if exporter is not None:
            exporter.terminate()
            exporter.wait(timeout=30)
    # what the comments promise: SPEC §3's example, 8 GPUs seen, the simulated load and
    # the faulted GPU 3 (not healed in the README) in the exporter and in top
    assert json.loads(outputs["allocate --root"])["devices"] == ["0000:05:00.0", "0000:06:00.0"]
    assert "GPUs: 8" in outputs["detect --root"]
    assert "MX" in outputs["topo --root"] and "SYS" in outputs["topo --root"]
    assert "metax-tech.com/gpu.installed=true" in outputs["labels --root"]
    assert re.search(r'gpuk8s_gpu_utilization_ratio\{[^}]*gpu="2"[^}]*\} 0\.7\b',
                     outputs["metrics"])
    assert re.search(r'gpuk8s_gpu_healthy\{[^}]*gpu="3"[^}]*\} 0\b', outputs["metrics"])
    assert re.search(r"\s8\s+1\s+0\s", outputs["top --url"]), outputs["top --url"]


# besides the pages: the comments that become docs (the chart option tables, role defaults)
COMMENTED = [*sorted(REPO.glob("charts/*/values.yaml")),
             *sorted(REPO.glob("roles/*/defaults/main.yml"))]


@pytest.mark.parametrize("page", [p.relative_to(REPO).as_posix() for p in PAGES + COMMENTED])
def test_no_page_points_readers_at_readme_sections_that_moved(page: str) -> None:
    text = (REPO / page).read_text()
    moved = re.findall(r"README(?:'s|,)?\s+(?:section\s+)?\"[^\"]+\"", text)
    assert not moved, f"{page}: {moved}: those sections moved to docs/"
