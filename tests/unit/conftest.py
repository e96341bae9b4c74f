"""Fixtures shared by the unit tests."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="module")
def fast_python3() -> Iterator[None]:
    """This interpreter's directory first on PATH for a whole module: the simulator's
    fake vendor tools (``#!/usr/bin/env python3``) then start with it. Use it with
    ``pytestmark = pytest.mark.usefixtures("fast_python3")``."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}")
        yield


@pytest.fixture(scope="module")
def nvidia_sim_root(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A simulated nvidia-8 node (8×H100, the simulated libnvidia-ml.so.1 and
    nvidia-cuda-mps-control), one per test module."""
    from gpuk8s import sim

    root = str(tmp_path_factory.mktemp("nvidia") / "node")
    sim.create(root, "nvidia-8")
    return root
