"""CUDA driver/runtime compatibility (SPEC §11): the driver's CUDA version from NVML
(the simulated libnvidia-ml.so.1), the node labels, and the check gpu-aware applies."""

from __future__ import annotations

import pytest

from gpuk8s import sim
from gpuk8s.core.cuda import (
    MAJOR_LABEL,
    MINOR_LABEL,
    CudaVersion,
    check,
    node_version,
    parse_version,
)
from gpuk8s.core.errors import ConfigError
from gpuk8s.core.labels import compute_labels
from gpuk8s.discovery import discover
from gpuk8s.discovery.nvidia import cuda_driver_version
from gpuk8s.sim import tree

pytestmark = pytest.mark.usefixtures("fast_python3")


@pytest.fixture(scope="module")
def nvidia_root(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = str(tmp_path_factory.mktemp("cuda") / "node")
    sim.create(root, "nvidia-8")
    return root


def set_driver_cuda(root: str, version: str | None) -> None:
    state = sim.state(root)
    state["driver"]["cuda"] = version
    tree.save_state(root, state)


def test_nvidia_nodes_are_labelled_with_the_drivers_cuda_version(nvidia_root: str) -> None:
    inventory = discover(nvidia_root)
    assert inventory.driver.cuda == CudaVersion(12, 4)
    labels = compute_labels(inventory)
    assert labels[MAJOR_LABEL] == "12" and labels[MINOR_LABEL] == "4"
    assert MAJOR_LABEL == "metax-tech.com/cuda-major-version"
    assert inventory.to_dict()["driver"]["cuda"] == "12.4"
    try:
        set_driver_cuda(nvidia_root, "11.8")  # NVML answers from the node, read each time
        assert compute_labels(discover(nvidia_root))[MINOR_LABEL] == "8"
        set_driver_cuda(nvidia_root, None)  # an NVML that cannot say: no labels, a problem
        unknown = discover(nvidia_root)
        assert unknown.driver.cuda is None
        assert MAJOR_LABEL not in compute_labels(unknown)
        assert any("nvmlSystemGetCudaDriverVersion_v2 failed" in p for p in unknown.problems)
    finally:
        set_driver_cuda(nvidia_root, "12.4")


def test_metax_nodes_and_roots_without_nvml_have_no_cuda_labels(tmp_path_factory:
                                                                 pytest.TempPathFactory) -> None:
    root = str(tmp_path_factory.mktemp("metax") / "node")
    sim.create(root, "n260-2")
    assert not any("cuda" in k for k in compute_labels(discover(root)))
    version, why = cuda_driver_version(root)
    assert version is None and why is not None and "libnvidia-ml.so.1 not found" in why


def test_versions_parse_strictly() -> None:
    assert parse_version("12.4") == CudaVersion(12, 4)
    assert parse_version(" 11.0 ") == CudaVersion(11, 0)
    for bad in ("12", "12.4.1", "v12.4", "12.x", "", "-1.0", "12.04x"):
        with pytest.raises(ConfigError, match=r"gpuk8s.io/cuda-runtime: .* MAJOR\.MINOR"):
            parse_version(bad)
    assert node_version("12", "4") == CudaVersion(12, 4)
    assert node_version(None, "4") is None and node_version("12", "x") is None


def test_driver_must_be_at_least_the_runtime_and_a_wide_gap_warns() -> None:
    why, warn = check(CudaVersion(12, 2), CudaVersion(12, 4))
    assert why is not None and "CUDA 12.2" in why and "runtime 12.4" in why and warn is None
    assert check(CudaVersion(12, 4), CudaVersion(12, 4)) == (None, None)
    assert check(CudaVersion(12, 4), CudaVersion(11, 8)) == (None, None)
    why, warn = check(CudaVersion(13, 0), CudaVersion(11, 8))
    assert why is None and warn is not None and "more than 1 major version" in warn
    assert check(None, CudaVersion(12, 4)) == (None, None)  # unlabelled node: not checked
