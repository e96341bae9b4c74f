"""Node labels of SPEC §4, computed from a node inventory.

Every label lives under ``metax-tech.com/``. When the node has no vendor GPU only
``gpu.installed=false`` is produced. Values are rendered as Kubernetes label values
(booleans as ``true``/``false``, integers in decimal).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping

from .model import NodeInventory, SriovState

PREFIX = "metax-tech.com/"

# Every label this module can produce (without the prefix); a labeller removes any
# other label under the prefix that it owns.
LABEL_NAMES: tuple[str, ...] = (
    "gpu.installed",
    "driver.ready",
    "gpu.driver.major",
    "gpu.driver.minor",
    "gpu.driver.patch",
    "gpu.driver.mode",
    "gpu.family",
    "gpu.memory",
    "gpu.product",
    "gpu.sriov",
    "gpu.vfnum",
    "maca.ready",
    "runtime.ready",
    "cuda-major-version",
    "cuda-minor-version",
)

# Operator-scheme readiness labels, published from marker files the node agents write
# (gpuk8s.host.readiness); the one definition of their names.
READINESS_KEYS: tuple[str, ...] = ("maca.ready", "runtime.ready")
# Labels under the prefix that another component owns: gpu-label never adds, changes or
# removes them (operator-controller's rolling upgrade state, SPEC/issue 11).
UPGRADE_STATE_LABEL = PREFIX + "driver.upgrade-state"
# Its values, in the order operator-controller walks a node through an upgrade
# (driver-manager reads it too: it upgrades only at UPGRADE_UPGRADING).
UPGRADE_REQUIRED = "upgrade-required"
UPGRADE_CORDONED = "cordoned"
UPGRADE_EVICTED = "pods-evicted"
UPGRADE_UPGRADING = "upgrading"
UPGRADE_VALIDATING = "validating"
UPGRADE_DONE = "done"
UPGRADE_FAILED = "failed"
UPGRADE_STATES = (UPGRADE_REQUIRED, UPGRADE_CORDONED, UPGRADE_EVICTED, UPGRADE_UPGRADING,
                  UPGRADE_VALIDATING, UPGRADE_DONE, UPGRADE_FAILED)
FOREIGN_LABELS: tuple[str, ...] = (UPGRADE_STATE_LABEL,)

_VALUE_OK = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def label_value(raw: str) -> str:
    """Make ``raw`` a valid label value (≤ 63 chars, alphanumeric ends)."""
    cleaned = re.sub(r"[^-A-Za-z0-9_.]", "-", raw.strip())[:63]
    cleaned = cleaned.strip("-_.")
    return cleaned if _VALUE_OK.match(cleaned) else ""


def _bool(value: bool) -> str:
    return "true" if value else "false"


def _most_common(values: list[str]) -> str:
    """The value most GPUs share (ties: the lowest-indexed GPU's value)."""
    counts = Counter(values)
    best = max(counts.values())
    return next(v for v in values if counts[v] == best)


def compute_labels(
    inventory: NodeInventory,
    *,
    readiness: Mapping[str, bool] | None = None,
    prefix: str = PREFIX,
) -> dict[str, str]:
    """Labels for a node.

    ``readiness`` carries the operator scheme's component states, e.g.
    ``{"maca.ready": True, "runtime.ready": False}``; only those two keys are
    accepted.
    """
    if not inventory.has_gpus:
        return {f"{prefix}gpu.installed": "false"}
    gpus = sorted(inventory.gpus, key=lambda g: g.index)
    labels: dict[str, str] = {
        "gpu.installed": "true",
        "driver.ready": _bool(inventory.driver.loaded and all(g.driver_bound for g in gpus)),
        "gpu.driver.mode": str(inventory.driver.mode),
    }
    parts = inventory.driver.version_parts if inventory.driver.loaded else None
    if parts is not None:
        labels["gpu.driver.major"], labels["gpu.driver.minor"], labels["gpu.driver.patch"] = (
            str(p) for p in parts
        )
    family = label_value(_most_common([g.family for g in gpus]))
    if family:
        labels["gpu.family"] = family
    memories = [g.memory_label for g in gpus if g.memory_label]
    if memories:
        labels["gpu.memory"] = _most_common(memories)
    product = label_value(_most_common([g.product for g in gpus]))
    if product:
        labels["gpu.product"] = product
    if any(g.sriov.num_vfs > 0 for g in gpus):
        state = SriovState.ON
    elif any(g.sriov.state is not SriovState.FORBIDDEN for g in gpus):
        state = SriovState.OFF
    else:
        state = SriovState.FORBIDDEN
    labels["gpu.sriov"] = str(state)
    labels["gpu.vfnum"] = str(max(g.sriov.num_vfs for g in gpus))
    cuda = inventory.driver.cuda if inventory.driver.loaded else None
    if cuda is not None:  # NVIDIA: the CUDA version the driver supports (SPEC §11)
        labels["cuda-major-version"] = str(cuda.major)
        labels["cuda-minor-version"] = str(cuda.minor)
    for key, ready in (readiness or {}).items():
        if key not in READINESS_KEYS:
            raise ValueError(
                f"readiness key {key!r} is not one of {', '.join(READINESS_KEYS)}"
            )
        labels[key] = _bool(ready)
    return {f"{prefix}{k}": v for k, v in sorted(labels.items())}


def label_diff(
    current: Mapping[str, str], wanted: Mapping[str, str], prefix: str = PREFIX
) -> dict[str, str | None]:
    """The patch that turns ``current`` into ``wanted`` for labels under ``prefix``.

    Keys mapped to None are to be removed; labels outside the prefix, and
    ``FOREIGN_LABELS`` (owned by operator-controller), are never touched.
    """
    patch: dict[str, str | None] = {}
    for key, value in wanted.items():
        if not key.startswith(prefix):
            raise ValueError(f"label {key!r} is outside the managed prefix {prefix!r}")
        if current.get(key) != value:
            patch[key] = value
    for key in current:
        if key.startswith(prefix) and key not in wanted and key not in FOREIGN_LABELS:
            patch[key] = None
    return patch
