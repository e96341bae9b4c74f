"""The committed golden scrape of gpu-exporter (``tests/unit/golden/gpu-exporter.prom``,
which ``tests/unit/test_exporter_golden.py`` keeps equal to a fixed scrape) passes
Prometheus' own exposition linter, ``promtool check metrics`` (Debian package
``prometheus``; ``scripts/prereqs integration`` installs it)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.unit.test_exporter_golden import GOLDEN

pytestmark = pytest.mark.integration


def test_the_golden_scrape_passes_promtool_check_metrics() -> None:
    binary = shutil.which("promtool")
    assert binary, "promtool is needed: scripts/prereqs integration (Debian package prometheus)"
    text = GOLDEN.read_text()
    assert "# TYPE gpuk8s_gpu_healthy gauge" in text  # the file is a real scrape, not empty
    proc = subprocess.run([binary, "check", "metrics"], input=text, capture_output=True,
                          text=True, timeout=60)
    # promtool prints lint problems (a counter without _total, a missing HELP) and fails
    assert proc.returncode == 0 and not proc.stdout.strip() and not proc.stderr.strip(), (
        proc.stdout + proc.stderr)


def test_promtool_would_object_to_a_broken_scrape() -> None:
    # the check above can fail: the same linter on a counter without its _total suffix
    binary = shutil.which("promtool")
    assert binary, "promtool is needed: scripts/prereqs integration (Debian package prometheus)"
    broken = "# HELP gpu_errors Errors\n# TYPE gpu_errors counter\ngpu_errors 1\n"
    proc = subprocess.run([binary, "check", "metrics"], input=broken, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode != 0 and "should have \"_total\" suffix" in proc.stdout + proc.stderr
