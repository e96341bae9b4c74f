"""The annotation format: what gpu-aware writes on a pod, and the node labels it reads.

=================================  ===================================================
``gpuk8s.io/sharing.assigned``     ``Assignment.to_json`` / ``parse_assignment``:
                                   node, mode, GPU ids and indexes, the share on each
``gpuk8s.io/sharing.bind-time``    nanoseconds since the epoch of the bind
``gpuk8s.io/sharing.phase``        ``allocating`` with the assignment, ``allocated``
                                   once the device plugin's ``Allocate`` mapped it
``usage_from_assignments``         node -> GPU -> usage, rebuilt from live pods
``check_mode``                     the ``gpuk8s.io/sharing-mode`` label value
``memory_label_mib``               the ``gpu.memory`` label (``64GB``) in MiB
=================================  ===================================================

The kubelet's ``Allocate`` names only a number of ids (``allocate_ids``), not the pod,
so the device plugin serves the oldest ``allocating`` pod on its node whose mode and id
count match, and gpu-aware binds a pod only while no other pod there waits with the
same mode and count. A pod holds its share from the assignment until it finishes or is
deleted.

Example: ``{"container":"main","core":50,"gpus":[5],"ids":["GPU-3f0c..."],
"memoryMiB":0,"mode":"sgpu","node":"n1","whole":false}`` is half of the GPU with that
UUID (GPU 5 when it was assigned) of node n1 for container main.

GPUs are named by ``ids``, what the hardware keeps (``core.model.stable_gpu_id``: the
UUID, else the PCI address); ``gpus`` holds their indexes when the record was written,
for display. Discovery numbers GPUs in PCI order, so when one leaves the bus the GPUs
above it move down: readers find a GPU's index *now* with ``Assignment.current``. A
record without ``ids`` (written before they existed) is read too; its indexes are taken
as they are, so such a record read after a GPU left the bus may point at the neighbour
of the GPU it meant.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Mapping, Sequence

from ..model import indexes_now
from .capacity import GpuUsage
from .names import (
    ASSIGNED_ANNOTATION,
    DEFAULT_SHARING_MODE,
    FAMILY_BY_MODE,
    FULL_CORE,
    MAX_ASSIGNMENT_CHARS,
    MAX_ID_CHARS,
    MAX_SHARED_GPUS,
    SHARING_MODE_LABEL,
    SHARING_MODES,
    SharingError,
)
from .request import ShareRequest


@dataclass(frozen=True)
class Assignment:
    """The extender's choice for a pod: node, GPUs, and the share on each."""

    node: str
    gpus: tuple[int, ...]  # indexes when assigned, for display (``current`` for now)
    share: ShareRequest
    ids: tuple[str, ...] = ()  # stable ids, parallel to ``gpus``; () in an old record

    def to_json(self) -> str:
        data: dict[str, object] = {
            "node": self.node,
            "mode": self.share.mode,
            "gpus": list(self.gpus),
            "core": self.share.core,
            "memoryMiB": self.share.memory_mib,
            "whole": self.share.whole,
            "container": self.share.container,
        }
        if self.ids:
            data["ids"] = list(self.ids)
        return json.dumps(data, separators=(",", ":"), sort_keys=True)

    def current(self, index_by_id: Mapping[str, int] | None) -> tuple[int, ...]:
        """The assigned GPUs' indexes in the current discovery pass, from
        ``index_by_id`` (stable id -> index now: ``NodeInventory.index_by_id``, or
        ``core.model.index_by_id`` over a device list). A GPU not present now (off the
        bus) is left out. An old record without ids, or no map: the recorded indexes,
        as they are."""
        return indexes_now(self.ids, self.gpus, index_by_id)


def parse_assignment(raw: str | None) -> Assignment | None:
    """The ``gpuk8s.io/sharing.assigned`` annotation; None when absent; ``SharingError``
    naming the key when malformed."""
    if raw is None or raw == "":
        return None
    what = f"annotation {ASSIGNED_ANNOTATION}"
    if len(raw) > MAX_ASSIGNMENT_CHARS:
        raise SharingError(f"{what}: longer than {MAX_ASSIGNMENT_CHARS} characters")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as err:
        raise SharingError(f"{what}: not JSON ({err})") from None
    if not isinstance(data, dict):
        raise SharingError(f"{what}: must be a JSON object")

    def get(key: str, kind: type, check: str = "") -> object:
        value = data.get(key)
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            raise SharingError(f"{what}: {key!r} must be {check or kind.__name__}, got {value!r}")
        return value

    node = get("node", str, "a node name")
    mode = get("mode", str)
    if mode not in FAMILY_BY_MODE:
        raise SharingError(f"{what}: 'mode' must be one of sgpu, vcuda, mps, got {mode!r}")
    gpus = get("gpus", list, "a list of GPU indexes")
    assert isinstance(gpus, list)
    if (
        not gpus
        or len(gpus) > MAX_SHARED_GPUS
        or any(isinstance(g, bool) or not isinstance(g, int) or g < 0 for g in gpus)
        or len(set(gpus)) != len(gpus)
    ):
        raise SharingError(f"{what}: 'gpus' must be 1-{MAX_SHARED_GPUS} distinct indexes >= 0")
    ids = data.get("ids", [])
    if (
        not isinstance(ids, list)
        or (ids and len(ids) != len(gpus))
        or any(not isinstance(i, str) or not 0 < len(i) <= MAX_ID_CHARS for i in ids)
        or len(set(ids)) != len(ids)
    ):
        raise SharingError(
            f"{what}: 'ids' must be {len(gpus)} distinct GPU ids (UUID or PCI address, "
            f"1-{MAX_ID_CHARS} characters) parallel to 'gpus', got {ids!r}"
        )
    core = get("core", int, "a percent 0-100")
    memory = get("memoryMiB", int, "MiB >= 0")
    whole = get("whole", bool, "true or false")
    container = data.get("container", "")
    assert isinstance(core, int) and isinstance(memory, int) and isinstance(whole, bool)
    if not 0 <= core <= FULL_CORE or memory < 0 or not isinstance(container, str):
        raise SharingError(f"{what}: 'core' must be 0-100 and 'memoryMiB' >= 0")
    assert isinstance(node, str) and isinstance(mode, str)
    share = ShareRequest(mode, len(gpus), core, memory, whole, container)
    return Assignment(node, tuple(gpus), share, tuple(ids))


def check_mode(value: str | None, what: str = SHARING_MODE_LABEL) -> str:
    """A node's sharing mode from its label value (absent: ``exclusive``)."""
    if value is None or value == "":
        return DEFAULT_SHARING_MODE
    if value not in SHARING_MODES:
        raise SharingError(f"{what}: {value!r} is not one of {', '.join(SHARING_MODES)}")
    return value


_MEMORY_LABEL = re.compile(r"([0-9]+(?:\.[0-9]+)?)(GB|GiB|G|MB|MiB|M)\Z")


def memory_label_mib(value: str | None) -> int | None:
    """MiB per GPU from the ``gpu.memory`` node label (``64GB`` = 64 GiB, as the
    labeller writes it from MiB / 1024); None when absent or unreadable."""
    if not value:
        return None
    match = _MEMORY_LABEL.match(value.strip())
    if match is None:
        return None
    amount = Fraction(match.group(1))
    unit = 1024 if match.group(2).startswith("G") else 1
    return int(amount * unit)


def usage_from_assignments(
    assignments: Sequence[Assignment],
    index_by_id: Mapping[str, Mapping[str, int]] | None = None,
) -> dict[str, dict[int, GpuUsage]]:
    """node -> GPU index now -> usage, from the assignments of live pods; each finds
    its GPUs by stable id in its node's ``index_by_id`` (node -> stable id -> index now;
    ``Assignment.current``)."""
    out: dict[str, dict[int, GpuUsage]] = {}
    for a in assignments:
        per = out.setdefault(a.node, {})
        now = index_by_id.get(a.node) if index_by_id is not None else None
        for index in a.current(now):
            per.setdefault(index, GpuUsage()).add(a.share)
    return out

