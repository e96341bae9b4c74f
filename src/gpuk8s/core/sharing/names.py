"""The vocabulary of GPU sharing: modes, resource names, annotation keys, limits.

=====================  =============================================================
``SHARING_MODES``      the node label ``gpuk8s.io/sharing-mode``: exclusive (default),
                       sgpu, vcuda, mps -- one mode per node, hence per GPU
``FAMILIES``           per mode its resources: counted (``COUNTED_RESOURCE``: what the
                       device plugin serves), compute percent, memory
``*_ANNOTATION``       the pod annotations of the protocol (``annotation``)
``SharingError``       a request, annotation or label that is not valid (names the field)
=====================  =============================================================

Example: ``FAMILY_BY_MODE["mps"].core == "nvidia.com/mps-core"`` and
``COUNTED_RESOURCE["sgpu"] == "metax-tech.com/sgpu"``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError

SHARING_MODE_LABEL = "gpuk8s.io/sharing-mode"
MODE_EXCLUSIVE = "exclusive"
MODE_SGPU = "sgpu"
MODE_VCUDA = "vcuda"
MODE_MPS = "mps"
SHARING_MODES = (MODE_EXCLUSIVE, MODE_SGPU, MODE_VCUDA, MODE_MPS)
DEFAULT_SHARING_MODE = MODE_EXCLUSIVE

SGPU_RESOURCE = "metax-tech.com/sgpu"
VCORE_RESOURCE = "metax-tech.com/vcore"
VMEMORY_RESOURCE = "metax-tech.com/vmemory"
VCUDA_CORE_RESOURCE = "tencent.com/vcuda-core"
VCUDA_MEMORY_RESOURCE = "tencent.com/vcuda-memory"
MPS_CORE_RESOURCE = "nvidia.com/mps-core"
MPS_MEMORY_RESOURCE = "nvidia.com/mps-memory"

# whole-GPU resources: a pod asks for these or for a sharing family, never both
WHOLE_GPU_RESOURCES = ("metax-tech.com/gpu", "nvidia.com/gpu")

ASSIGNED_ANNOTATION = "gpuk8s.io/sharing.assigned"
BIND_TIME_ANNOTATION = "gpuk8s.io/sharing.bind-time"
PHASE_ANNOTATION = "gpuk8s.io/sharing.phase"
# set by gpu-aware on a pod it turned away once a share is freed: kube-scheduler retries it
REQUEUE_ANNOTATION = "gpuk8s.io/sharing.requeue"
PHASE_ALLOCATING = "allocating"
PHASE_ALLOCATED = "allocated"

FULL_CORE = 100
VCUDA_MEMORY_UNIT_MIB = 256
GIB_MIB = 1024
# GPU memory per GPU above this (1 PiB) is refused as a mistake (``memory_mib``)
MAX_MEMORY_MIB = 1 << 30
MAX_SHARED_GPUS = 64
# shares one GPU may hold at once (device ids advertised per GPU for the count resources)
DEFAULT_SLOTS = 16
MAX_ASSIGNMENT_CHARS = 8192  # 64 GPUs with ids of MAX_ID_CHARS fit
MAX_ID_CHARS = 64  # a GPU's stable id in an assignment: a UUID (40) or a PCI address


@dataclass(frozen=True)
class Family:
    """One sharing mode's resources."""

    mode: str
    core: str  # compute percent resource
    memory: str  # memory resource
    count: str | None = None  # shared-GPU count resource (sGPU only)


FAMILIES: tuple[Family, ...] = (
    Family(MODE_SGPU, VCORE_RESOURCE, VMEMORY_RESOURCE, SGPU_RESOURCE),
    Family(MODE_VCUDA, VCUDA_CORE_RESOURCE, VCUDA_MEMORY_RESOURCE),
    Family(MODE_MPS, MPS_CORE_RESOURCE, MPS_MEMORY_RESOURCE),
)
FAMILY_BY_MODE: dict[str, Family] = {f.mode: f for f in FAMILIES}
SHARING_RESOURCES: tuple[str, ...] = tuple(
    name for f in FAMILIES for name in ((f.count,) if f.count else ()) + (f.core, f.memory)
)
# every resource that gives a container GPUs or a share of one
GPU_RESOURCES: tuple[str, ...] = WHOLE_GPU_RESOURCES + SHARING_RESOURCES
# the resources the device plugin advertises as device ids per GPU (kubelet Allocate)
COUNTED_RESOURCE = {
    MODE_SGPU: SGPU_RESOURCE,
    MODE_VCUDA: VCUDA_CORE_RESOURCE,
    MODE_MPS: MPS_CORE_RESOURCE,
}


class SharingError(ConfigError):
    """A sharing request or annotation that is not valid (names the field)."""

