"""The device-list node annotation: what the device plugin publishes per device.

Written by the device plugin (``gpu-device``) on its own Node, read by the scheduler
extender (``gpu-aware``). Key: ``metax-tech.com/gpu.devices`` (the same key on MetaX
and NVIDIA nodes). Value: a JSON array, one object per allocatable device (a whole
GPU, or one VF), in the node's topology order, with exactly these keys:

==============  =============  ==================================================
key             JSON type      meaning
==============  =============  ==================================================
``id``          string         device ID as the kubelet knows it (PCI address of
                               the GPU or of the VF), ≤ 63 characters
``pci``         string         PCI address of the physical GPU
``gpu``         integer ≥ 0    index of the physical GPU on the node
``vf``          integer|null   VF number on that GPU; null for a whole GPU
``product``     string         e.g. ``C500``
``numa``        integer|null   NUMA node; null when unknown
``group``       integer|null   MetaXLink (NVLink) group; null when not linked
``switch``      string|null    PCI address of the upstream PCIe switch port
``healthy``     boolean        false while the device is Unhealthy
``allocated``   boolean        true while a container holds it (kubelet
                               PodResources API)
``uuid``        string|null    UUID of the physical GPU; null when the vendor tool
                               reports none. Optional: lists written before it
                               existed lack it (read as null)
==============  =============  ==================================================

``id`` (the kubelet's device id, a PCI address) and ``uuid``/``pci`` name a GPU for
good; ``gpu`` is its index in the current discovery pass, which moves when a GPU with a
lower PCI address leaves the bus (display only; ``DeviceEntry.stable_id``).

Stdlib only, no I/O: safe for the extender, the plugin and Ansible modules alike.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .boundedjson import BoundedJsonError, loads_bounded
from .errors import InventoryError
from .model import stable_gpu_id

DEVICES_ANNOTATION = "metax-tech.com/gpu.devices"
MAX_ID_LENGTH = 63
# Kubernetes allows 256 KiB for all annotations of an object together; 64 devices take
# about 13 KB. Nesting: the array, its objects, and room for future structured keys.
MAX_DEVICE_LIST_CHARS = 256 * 1024
MAX_DEVICE_LIST_DEPTH = 8


@dataclass(frozen=True)
class DeviceEntry:
    id: str
    pci: str
    gpu: int
    vf: int | None
    product: str
    numa: int | None
    group: int | None
    switch: str | None
    healthy: bool
    allocated: bool
    uuid: str | None = None

    @property
    def stable_id(self) -> str:
        """The physical GPU's name in records that outlive a discovery pass."""
        return stable_gpu_id(self.uuid, self.pci)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "pci": self.pci,
            "gpu": self.gpu,
            "vf": self.vf,
            "product": self.product,
            "numa": self.numa,
            "group": self.group,
            "switch": self.switch,
            "healthy": self.healthy,
            "allocated": self.allocated,
            "uuid": self.uuid,
        }

    @property
    def free(self) -> bool:
        """Healthy and not allocated: what a new pod could get."""
        return self.healthy and not self.allocated


FIELDS: tuple[str, ...] = tuple(DeviceEntry.__dataclass_fields__)
OPTIONAL_FIELDS = ("uuid",)  # added later: a list without them still reads
REQUIRED_FIELDS = tuple(k for k in FIELDS if k not in OPTIONAL_FIELDS)


def format_device_list(entries: Iterable[DeviceEntry]) -> str:
    """The annotation value: compact JSON, entries in the given order."""
    return json.dumps([e.to_dict() for e in entries], separators=(",", ":"))


def _bad(index: int, key: str, want: str, value: object) -> InventoryError:
    return InventoryError(
        f"{DEVICES_ANNOTATION}: entry {index}: {key!r} must be {want}, got {value!r}"
    )


def _int(index: int, key: str, value: object, nullable: bool) -> int | None:
    if value is None and nullable:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _bad(index, key, "a non-negative integer" + (" or null" if nullable else ""), value)
    return value


def _str(index: int, key: str, value: object, nullable: bool) -> str | None:
    if value is None and nullable:
        return None
    if not isinstance(value, str) or not value:
        raise _bad(index, key, "a non-empty string" + (" or null" if nullable else ""), value)
    return value


def _bool(index: int, key: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise _bad(index, key, "true or false", value)
    return value


def _entry(index: int, raw: object) -> DeviceEntry:
    if not isinstance(raw, Mapping):
        raise InventoryError(f"{DEVICES_ANNOTATION}: entry {index} is not an object")
    missing = [k for k in REQUIRED_FIELDS if k not in raw]
    if missing:
        raise InventoryError(
            f"{DEVICES_ANNOTATION}: entry {index} lacks {', '.join(missing)} "
            f"(keys are {', '.join(FIELDS)})"
        )
    uid = _str(index, "id", raw["id"], False)
    assert uid is not None
    if len(uid) > MAX_ID_LENGTH:
        raise _bad(index, "id", f"at most {MAX_ID_LENGTH} characters", uid)
    pci = _str(index, "pci", raw["pci"], False)
    product = raw["product"]
    if not isinstance(product, str):
        raise _bad(index, "product", "a string", product)
    gpu = _int(index, "gpu", raw["gpu"], False)
    assert pci is not None and gpu is not None
    return DeviceEntry(
        id=uid,
        pci=pci,
        gpu=gpu,
        vf=_int(index, "vf", raw["vf"], True),
        product=product,
        numa=_int(index, "numa", raw["numa"], True),
        group=_int(index, "group", raw["group"], True),
        switch=_str(index, "switch", raw["switch"], True),
        healthy=_bool(index, "healthy", raw["healthy"]),
        allocated=_bool(index, "allocated", raw["allocated"]),
        uuid=_str(index, "uuid", raw.get("uuid"), True),
    )


def parse_device_list(raw: str | None) -> list[DeviceEntry]:
    """Entries of an annotation value; ``None`` or ``""`` (not published) gives [].

    Raises ``InventoryError`` naming the entry and key for anything malformed
    (unknown extra keys are ignored, so the format can grow), and for values longer
    than ``MAX_DEVICE_LIST_CHARS`` or nested deeper than ``MAX_DEVICE_LIST_DEPTH``
    (bounded work, never ``RecursionError``).
    """
    if raw is None or raw == "":
        return []
    try:
        data = loads_bounded(
            raw, max_depth=MAX_DEVICE_LIST_DEPTH, max_chars=MAX_DEVICE_LIST_CHARS
        )
    except BoundedJsonError as err:
        raise InventoryError(f"{DEVICES_ANNOTATION}: {err}") from None
    if not isinstance(data, list):
        raise InventoryError(f"{DEVICES_ANNOTATION}: must be a JSON array of objects")
    entries = [_entry(i, item) for i, item in enumerate(data)]
    seen: set[str] = set()
    for entry in entries:
        if entry.id in seen:
            raise InventoryError(f"{DEVICES_ANNOTATION}: duplicate device id {entry.id!r}")
        seen.add(entry.id)
    return entries
