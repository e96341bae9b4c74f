"""CUDA driver/runtime compatibility (SPEC §11, §13): the one implementation.

A node's NVIDIA driver supports CUDA up to some version (NVML
``nvmlSystemGetCudaDriverVersion``, published by gpu-label as the node labels
``metax-tech.com/cuda-major-version`` / ``cuda-minor-version`` and, for the accelerator
manual's nodeAffinity examples, under the bare keys ``cuda-major-version`` /
``cuda-minor-version`` with the same values: ``labels``). A pod states the CUDA
runtime it was built against with the annotation ``gpuk8s.io/cuda-runtime: "12.4"``.
The driver must be at least the runtime (an older driver fails with
``CUDA_ERROR_UNKNOWN (999)``); the manual recommends a major-version gap of at most 1
(a larger gap is allowed, with a warning).

Stdlib only, Python 3.8+ (shipped to hosts with discovery).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import ConfigError

LABEL_PREFIX = "metax-tech.com/"
BARE_MAJOR_LABEL = "cuda-major-version"  # the accelerator manual's keys (002-07, 002-08)
BARE_MINOR_LABEL = "cuda-minor-version"
MAJOR_LABEL = LABEL_PREFIX + BARE_MAJOR_LABEL
MINOR_LABEL = LABEL_PREFIX + BARE_MINOR_LABEL
BARE_LABELS = (BARE_MAJOR_LABEL, BARE_MINOR_LABEL)
RUNTIME_ANNOTATION = "gpuk8s.io/cuda-runtime"
RECOMMENDED_MAJOR_GAP = 1

_VERSION = re.compile(r"^(0|[1-9][0-9]{0,3})\.(0|[1-9][0-9]?)$")
_PART = re.compile(r"^(0|[1-9][0-9]{0,3})$")


@dataclass(frozen=True, order=True)
class CudaVersion:
    major: int
    minor: int

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"


def parse_version(text: str, what: str = RUNTIME_ANNOTATION) -> CudaVersion:
    """``"12.4"`` -> CudaVersion(12, 4); anything else is a ``ConfigError`` naming ``what``."""
    match = _VERSION.match(str(text).strip())
    if match is None:
        raise ConfigError(
            f"{what}: {str(text)[:40]!r} is not a CUDA version; write MAJOR.MINOR, e.g. \"12.4\""
        )
    return CudaVersion(int(match.group(1)), int(match.group(2)))


def node_version(major: str | None, minor: str | None) -> CudaVersion | None:
    """The node's driver CUDA version from its two label values; None when either is
    absent or not a number (a node gpu-label has not labelled: not checked)."""
    if major is None or minor is None:
        return None
    if not _PART.match(major) or not _PART.match(minor):
        return None
    return CudaVersion(int(major), int(minor))


def check(driver: CudaVersion | None, runtime: CudaVersion) -> tuple[str | None, str | None]:
    """(why the node cannot run the runtime, a warning) for a node's driver CUDA version.

    A node without the labels (``driver`` None) is not refused: the check only applies
    where gpu-label published the version."""
    if driver is None:
        return None, None
    if driver < runtime:
        return (
            f"the node's NVIDIA driver supports CUDA {driver}, older than the pod's CUDA "
            f"runtime {runtime} ({RUNTIME_ANNOTATION}); the driver must be >= the runtime",
            None,
        )
    if driver.major - runtime.major > RECOMMENDED_MAJOR_GAP:
        return None, (
            f"the node's NVIDIA driver supports CUDA {driver}, more than "
            f"{RECOMMENDED_MAJOR_GAP} major version ahead of the pod's CUDA runtime {runtime} "
            "(recommended gap: at most 1)"
        )
    return None, None


def labels(version: CudaVersion) -> dict[str, str]:
    """The node labels that publish ``version``: the prefixed pair and the manual's bare
    pair, same values."""
    major, minor = str(version.major), str(version.minor)
    return {MAJOR_LABEL: major, MINOR_LABEL: minor,
            BARE_MAJOR_LABEL: major, BARE_MINOR_LABEL: minor}
