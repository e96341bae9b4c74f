"""Node labels of SPEC §4, computed from a node inventory.

The SPEC §4 labels live under ``metax-tech.com/``. When the node has no vendor GPU only
``gpu.installed=false`` is produced. Values are rendered as Kubernetes label values
(booleans as ``true``/``false``, integers in decimal).

Outside that prefix (SPEC §14), from the same inventory:

* the accelerator manual's bare ``cuda-major-version`` / ``cuda-minor-version`` beside the
  prefixed pair (``core.cuda.labels``), on nodes whose NVIDIA driver says its CUDA version;
* on NVIDIA nodes, the labels of NVIDIA's GPU Feature Discovery (GFD) with GFD's value
  formats (``gfd_labels``), so selectors written for GFD keep working: the resource and
  version labels, MIG capability, the sharing strategy and replicas of the node's sharing
  mode, MPS capability, the machine type and the GPU mode (compute or graphics, from the
  PCI class) -- and the GPU Operator's ``gpu.present``.

``owned_labels`` names the keys outside the prefix that gpu-label manages on a node (adds,
changes, removes): every GFD key it can write, and the bare CUDA keys on NVIDIA nodes only.
On other nodes the bare keys are the administrator's, set by hand as the manual's 002-07
shows, and left alone.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping

from . import cuda
from .model import Gpu, NodeInventory, SriovState
from .sharing import FULL_CORE, MODE_EXCLUSIVE, MODE_MPS, MODE_VCUDA, SHARING_MODE_LABEL

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

# NVIDIA GPU Feature Discovery's labels (k8s-device-plugin internal/lm: resource.go
# NewGPUResourceLabeler, nvml.go newVersionLabeler), the ones gpu-label writes.
GFD_LABELS: tuple[str, ...] = (
    "nvidia.com/gpu.product",
    "nvidia.com/gpu.memory",
    "nvidia.com/gpu.count",
    "nvidia.com/gpu.family",
    "nvidia.com/gpu.compute.major",
    "nvidia.com/gpu.compute.minor",
    "nvidia.com/cuda.driver.major",
    "nvidia.com/cuda.driver.minor",
    "nvidia.com/cuda.driver.rev",
    "nvidia.com/cuda.runtime.major",
    "nvidia.com/cuda.runtime.minor",
    "nvidia.com/cuda.driver-version.major",
    "nvidia.com/cuda.driver-version.minor",
    "nvidia.com/cuda.driver-version.revision",
    "nvidia.com/cuda.driver-version.full",
    "nvidia.com/cuda.runtime-version.major",
    "nvidia.com/cuda.runtime-version.minor",
    "nvidia.com/cuda.runtime-version.full",
    "nvidia.com/gpu.replicas",  # resource.go replicasLabel
    "nvidia.com/gpu.sharing-strategy",
    "nvidia.com/mps.capable",  # nvml.go newSharingLabeler
    "nvidia.com/mig.capable",  # nvml.go newMigCapabilityLabeler
    "nvidia.com/mig.strategy",  # mig-strategy.go: none, single or mixed
    "nvidia.com/gpu.machine",  # machine-type.go: the DMI product name
    "nvidia.com/gpu.present",  # the GPU Operator's, which GFD's users select on too
    "nvidia.com/gpu.mode",  # nvml.go newGPUModeLabeler: from the PCI class
)

# GFD's sharing strategy and replicas (device ids per GPU that gpu-device serves) for a
# node's sharing mode (``core.sharing``; gpu-device's REPLICAS): vcuda's quotas share a
# GPU by time slices.
GFD_SHARING: dict[str, tuple[str, int]] = {
    MODE_EXCLUSIVE: ("none", 1),
    MODE_VCUDA: ("time-slicing", FULL_CORE),
    MODE_MPS: ("mps", FULL_CORE),
}
# NVIDIA's products with Multi-Instance GPU (NVIDIA MIG User Guide, "Supported GPUs"),
# by the short product name of ``discovery.nvidia`` (``H100``).
MIG_CAPABLE_PRODUCTS = frozenset(
    {"A30", "A100", "A800", "H20", "H100", "H800", "H200", "GH200", "B200", "GB200",
     "B300", "GB300"}
)
# GFD's gpu.machine when the machine type cannot be read
MACHINE_UNKNOWN = "unknown"
# GFD's gpu.mode by PCI class code: a VGA controller (can drive a display) or a 3D
# controller (cannot); any other class, or none read, is "unknown"
GPU_MODES: dict[int, str] = {0x030000: "graphics", 0x030200: "compute"}
GPU_MODE_UNKNOWN = "unknown"

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


def gfd_family(major: int, minor: int) -> str:
    """GFD's ``gpu.family`` for a compute capability (its getArchFamily table)."""
    families = {1: "tesla", 2: "fermi", 3: "kepler", 5: "maxwell", 6: "pascal", 9: "hopper",
                10: "blackwell", 12: "blackwell", 13: "rubin"}
    if major == 7:
        return "volta" if minor < 5 else "turing"
    if major == 8:
        return "ampere" if minor < 9 else "ada-lovelace"
    return families.get(major, "undefined")


def gfd_product(name: str) -> str:
    """GFD's ``gpu.product``: the NVML name without characters outside ``[A-Za-z0-9-_. ]``,
    blanks collapsed into '-' (``NVIDIA H100 80GB HBM3`` -> ``NVIDIA-H100-80GB-HBM3``)."""
    return "-".join(re.sub(r"[^A-Za-z0-9\-_. ]", "", name).split())


def sharing_mode_of(current: Mapping[str, str], sharing: bool = True) -> str:
    """The mode gpu-device serves a node in, for GFD's sharing labels: its
    ``gpuk8s.io/sharing-mode`` label (``current``: the node's labels) when sharing is on
    (the chart's ``gpuDevice.sharing``), else whole GPUs."""
    return current.get(SHARING_MODE_LABEL, MODE_EXCLUSIVE) if sharing else MODE_EXCLUSIVE


def gfd_machine(product_name: str | None) -> str:
    """GFD's ``gpu.machine``: the DMI product name (``/sys/class/dmi/id/product_name``),
    blanks as '-'; ``unknown`` where it cannot be read."""
    value = label_value("-".join((product_name or "").split()))
    return value or MACHINE_UNKNOWN


def gfd_gpu_mode(pci_classes: Iterable[int | None]) -> str:
    """GFD's ``gpu.mode`` of a node from its GPUs' PCI class codes in index order
    (``GPU_MODES``): the first GPU's. GFD compares the classes in that order and, at the
    first that differs, keeps the one before it: on a node of mixed modes, the first
    GPU's too."""
    first = next(iter(pci_classes), None)
    return GPU_MODES.get(first, GPU_MODE_UNKNOWN) if first is not None else GPU_MODE_UNKNOWN


def gfd_labels(
    inventory: NodeInventory,
    *,
    sharing_mode: str = MODE_EXCLUSIVE,
    machine: str = MACHINE_UNKNOWN,
) -> dict[str, str]:
    """GFD's labels for an NVIDIA node whose driver is loaded (empty otherwise): product,
    memory (MiB), count, family and compute capability of the node's GPUs (the most common
    model's), the driver version split (``550.54.15`` -> 550 / 54 / 15; ``rev`` is empty
    for a two-part version), the CUDA version the driver supports, MIG capability (any
    GPU; the strategy is ``none``: whole GPUs only), the sharing strategy and replicas of
    ``sharing_mode`` (``GFD_SHARING``; shared: ``-SHARED`` after the product, as GFD;
    ``mps.capable`` true only in MPS mode; a mode without a GFD strategy, such as MetaX's
    sgpu, gets none of the three), ``machine`` (``gfd_machine``), ``gpu.mode`` from the
    PCI class (``gfd_gpu_mode``) and ``gpu.present``."""
    if inventory.backend != "nvidia" or not inventory.has_gpus or not inventory.driver.loaded:
        return {}
    gpus = sorted(inventory.gpus, key=lambda g: g.index)
    names = [g.name or g.product for g in gpus]
    model = _most_common(names)
    first: Gpu = next(g for g in gpus if (g.name or g.product) == model)
    mig = any(g.product in MIG_CAPABLE_PRODUCTS for g in gpus)
    out: dict[str, str] = {
        "nvidia.com/gpu.count": str(len(gpus)),
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.machine": machine,
        "nvidia.com/gpu.mode": gfd_gpu_mode(g.pci_class for g in gpus),
        "nvidia.com/mig.capable": _bool(mig),
    }
    if mig:
        out["nvidia.com/mig.strategy"] = "none"
    sharing = GFD_SHARING.get(sharing_mode)
    shared = sharing is not None and sharing[1] > 1
    if sharing is not None:
        strategy, replicas = sharing
        out["nvidia.com/gpu.sharing-strategy"] = strategy
        out["nvidia.com/gpu.replicas"] = str(replicas)
        out["nvidia.com/mps.capable"] = _bool(sharing_mode == MODE_MPS)
    product = label_value(gfd_product(model) + ("-SHARED" if shared else ""))
    if product:
        out["nvidia.com/gpu.product"] = product
    if first.memory_mib:
        out["nvidia.com/gpu.memory"] = str(first.memory_mib)
    if first.compute_capability is not None and first.compute_capability[0] > 0:
        major, minor = first.compute_capability
        out["nvidia.com/gpu.family"] = gfd_family(major, minor)
        out["nvidia.com/gpu.compute.major"] = str(major)
        out["nvidia.com/gpu.compute.minor"] = str(minor)
    version = (inventory.driver.version or "").strip()
    parts = version.split(".")
    if 2 <= len(parts) <= 3 and all(label_value(p) == p for p in parts) and len(version) <= 63:
        rev = parts[2] if len(parts) == 3 else ""
        out.update({
            "nvidia.com/cuda.driver.major": parts[0],
            "nvidia.com/cuda.driver.minor": parts[1],
            "nvidia.com/cuda.driver.rev": rev,
            "nvidia.com/cuda.driver-version.major": parts[0],
            "nvidia.com/cuda.driver-version.minor": parts[1],
            "nvidia.com/cuda.driver-version.revision": rev,
            "nvidia.com/cuda.driver-version.full": version,
        })
    version_cuda = inventory.driver.cuda
    if version_cuda is not None:
        out.update({
            "nvidia.com/cuda.runtime.major": str(version_cuda.major),
            "nvidia.com/cuda.runtime.minor": str(version_cuda.minor),
            "nvidia.com/cuda.runtime-version.major": str(version_cuda.major),
            "nvidia.com/cuda.runtime-version.minor": str(version_cuda.minor),
            "nvidia.com/cuda.runtime-version.full": str(version_cuda),
        })
    return out


def owned_labels(inventory: NodeInventory) -> tuple[str, ...]:
    """Keys outside ``PREFIX`` that gpu-label manages on this node (module doc)."""
    if inventory.backend == "nvidia":
        return (*cuda.BARE_LABELS, *GFD_LABELS)
    return GFD_LABELS


def compute_labels(
    inventory: NodeInventory,
    *,
    readiness: Mapping[str, bool] | None = None,
    prefix: str = PREFIX,
    sharing_mode: str = MODE_EXCLUSIVE,
    machine: str = MACHINE_UNKNOWN,
) -> dict[str, str]:
    """Labels for a node: SPEC §4's under ``prefix``, then those of ``owned_labels``.

    ``readiness`` carries the operator scheme's component states, e.g.
    ``{"maca.ready": True, "runtime.ready": False}``; only those two keys are
    accepted. ``sharing_mode`` and ``machine``: for GFD's labels (``gfd_labels``).
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
    outside: dict[str, str] = {}
    version = inventory.driver.cuda if inventory.driver.loaded else None
    if version is not None:  # NVIDIA: the CUDA version the driver supports (SPEC §11, §14)
        for key, value in cuda.labels(version).items():
            if key.startswith(cuda.LABEL_PREFIX):
                labels[key[len(cuda.LABEL_PREFIX):]] = value
            else:
                outside[key] = value
    outside.update(gfd_labels(inventory, sharing_mode=sharing_mode, machine=machine))
    for key, ready in (readiness or {}).items():
        if key not in READINESS_KEYS:
            raise ValueError(
                f"readiness key {key!r} is not one of {', '.join(READINESS_KEYS)}"
            )
        labels[key] = _bool(ready)
    ours = {f"{prefix}{k}": v for k, v in sorted(labels.items())}
    return {**ours, **dict(sorted(outside.items()))}


def is_managed(key: str, owned: Iterable[str] = (), prefix: str = PREFIX) -> bool:
    """Whether gpu-label manages ``key``: under ``prefix`` (but not a ``FOREIGN_LABELS``
    key) or one of ``owned`` (``owned_labels`` of the node)."""
    if key in FOREIGN_LABELS:
        return False
    return key.startswith(prefix) or key in set(owned)


def label_diff(
    current: Mapping[str, str],
    wanted: Mapping[str, str],
    prefix: str = PREFIX,
    owned: Iterable[str] = (),
) -> dict[str, str | None]:
    """The patch that turns ``current`` into ``wanted`` for the labels gpu-label manages:
    those under ``prefix`` and the keys ``owned`` (``owned_labels`` of the node).

    Keys mapped to None are to be removed; other labels, and ``FOREIGN_LABELS`` (owned by
    operator-controller), are never touched.
    """
    owned = frozenset(owned)
    patch: dict[str, str | None] = {}
    for key, value in wanted.items():
        if not is_managed(key, owned, prefix):
            raise ValueError(f"label {key!r} is outside the managed prefix {prefix!r} and not "
                             "one of the labels gpu-label owns on this node")
        if current.get(key) != value:
            patch[key] = value
    for key in current:
        if is_managed(key, owned, prefix) and key not in wanted:
            patch[key] = None
    return patch
