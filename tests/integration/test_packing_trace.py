"""benchmarks/packing.py --quick on the real openb trace: gpu-aware against BestFit.

Needs the trace (``../shared/data/openb`` next to the checkout, or ``$OPENB_DIR``); it is
not part of the repository (the Alibaba cluster-trace terms).
"""

from __future__ import annotations

import pytest

from tests.unit.test_packing_benchmark import load_benchmark, rows_by_policy

pytestmark = pytest.mark.integration


def test_quick_replay_of_the_openb_trace() -> None:
    bench = load_benchmark()
    if not (bench.DATA / "openb_pod_list_default.csv").is_file():
        pytest.skip(f"the openb trace is not at {bench.DATA} (set OPENB_DIR)")
    rows = rows_by_policy(bench.run([42, 43], ("gpu-aware", "bestfit"), every=8))
    aware, best = rows["gpu-aware"], rows["bestfit"]
    for mark in ("100", "130"):
        assert aware[f"failed{mark}"].get(8, 0) <= best[f"failed{mark}"].get(8, 0), mark
        assert aware[f"alloc{mark}"] > best[f"alloc{mark}"], mark
    inside, placed = aware["inside"]
    assert placed > 0 and inside / placed >= 0.99
