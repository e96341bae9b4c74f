"""The source tree of an older git revision, for benchmarks that measure it next to the
working tree in the same run (``--baseline REF``): put ``<dir>/src`` first on the
PYTHONPATH of the process that should run the old code."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def extract(ref: str) -> Path:
    """``git archive REF src`` unpacked in a new temporary directory (its path)."""
    out = Path(tempfile.mkdtemp(prefix="gpuk8s-baseline-"))
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", ref, "src"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    return out
