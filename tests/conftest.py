"""Suite-wide settings.

``GPUK8S_NO_SKIP=1`` (set by scripts/test for the integration and e2e tiers, after
scripts/prereqs installed everything) turns every skip into a failure: in CI a test
that could not run must not look like a test that passed.
"""

from __future__ import annotations

import os

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    strict = os.environ.get("GPUK8S_NO_SKIP") == "1"
    if strict and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped while GPUK8S_NO_SKIP=1: {reason}"
