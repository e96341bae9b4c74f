"""GPU sharing: what gpu-aware, gpu-device, gpu-mps, gpu-dra and gpu-exporter agree on.
Stdlib only, Python 3.8+. ``from gpuk8s.core.sharing import X`` names every public X of:

==============  ===================================================================
``names``       modes, resource names, annotation keys, limits, ``SharingError``
``request``     the request grammar: a container's or pod's resources -> ``ShareRequest``
``capacity``    one GPU's capacity and usage, ``fits``, ``leftover``
``packing``     the request mix (``ShareMix``) and how much free capacity a node strands
``choice``      ``choose_shared``: which GPUs take a share
``annotation``  the pod annotation (``Assignment``) and the node labels sharing reads
``container``   the environment and mounts a container of a shared-GPU pod gets
==============  ===================================================================

Each depends only on those above it. The path of a shared pod, in one example: a
container asks ``tencent.com/vcuda-core: 50`` (``request.pod_share`` -> 50 % of one GPU),
gpu-aware's bind picks GPU 3 of the node (``choice.choose_shared``) and writes
``gpuk8s.io/sharing.assigned: {"gpus":[3],"core":50,...}`` (``annotation``), the device
plugin's ``Allocate`` of 50 ids (``request.allocate_ids``) finds that pod and gives its
container ``CUDA_DEVICE_SM_LIMIT=50`` (``container.share_env``). docs/sharing.md is
the user's side of it.
"""

from __future__ import annotations

from .annotation import (
    Assignment,
    check_mode,
    memory_label_mib,
    parse_assignment,
    usage_from_assignments,
)
from .capacity import GpuCapacity, GpuUsage, fits, free_percent, leftover
from .choice import (
    Candidates,
    Chosen,
    Fragmentation,
    choose_shared,
    shared_candidates,
    weigh_shared,
    whole_rise,
)
from .container import (
    MPS_CONTAINER_PIPE_DIR,
    MPS_HOST_ROOT,
    mps_log_dir,
    mps_pipe_dir,
    share_env,
    share_mounts,
)
from .names import (
    ASSIGNED_ANNOTATION,
    BIND_TIME_ANNOTATION,
    COUNTED_RESOURCE,
    DEFAULT_SHARING_MODE,
    DEFAULT_SLOTS,
    FAMILIES,
    FAMILY_BY_MODE,
    FULL_CORE,
    GIB_MIB,
    GPU_RESOURCES,
    MAX_ASSIGNMENT_CHARS,
    MAX_ID_CHARS,
    MAX_MEMORY_MIB,
    MAX_SHARED_GPUS,
    MODE_EXCLUSIVE,
    MODE_MPS,
    MODE_SGPU,
    MODE_VCUDA,
    MPS_CORE_RESOURCE,
    MPS_MEMORY_RESOURCE,
    PHASE_ALLOCATED,
    PHASE_ALLOCATING,
    PHASE_ANNOTATION,
    REQUEUE_ANNOTATION,
    SGPU_RESOURCE,
    SHARING_MODE_LABEL,
    SHARING_MODES,
    SHARING_RESOURCES,
    VCORE_RESOURCE,
    VCUDA_CORE_RESOURCE,
    VCUDA_MEMORY_RESOURCE,
    VCUDA_MEMORY_UNIT_MIB,
    VMEMORY_RESOURCE,
    WHOLE_GPU_RESOURCES,
    Family,
    SharingError,
)
from .packing import (
    BALANCE_MIN_FREE,
    BALANCE_SHORT,
    DEFAULT_SHARE_MIX,
    MIX_CLASSES,
    NO_ROOM,
    PRICED_SIZES,
    Filled,
    Room,
    ShareClass,
    ShareMix,
    class_homes,
    cpu_balance,
    fill_stranded,
    fill_taken,
    filled,
    gpus_per_core,
    node_fragmentation,
    poisson_tail,
    spare_cpu,
    whole_homes,
    whole_scarcity,
    wholly_free,
)
from .request import (
    MEMORY_UNIT_MIB,
    ZERO_COUNT_WHY,
    ContainerAsk,
    ShareRequest,
    allocate_ids,
    memory_mib,
    parse_share,
    pod_share,
    pod_share_json,
)

__all__ = [
    "ASSIGNED_ANNOTATION", "BALANCE_MIN_FREE", "BALANCE_SHORT", "BIND_TIME_ANNOTATION",
    "COUNTED_RESOURCE", "DEFAULT_SHARE_MIX", "DEFAULT_SHARING_MODE", "DEFAULT_SLOTS",
    "FAMILIES", "FAMILY_BY_MODE", "FULL_CORE", "GIB_MIB", "GPU_RESOURCES",
    "MAX_ASSIGNMENT_CHARS", "MAX_ID_CHARS", "MAX_MEMORY_MIB", "MAX_SHARED_GPUS", "MEMORY_UNIT_MIB",
    "MIX_CLASSES", "MODE_EXCLUSIVE", "MODE_MPS", "MODE_SGPU", "MODE_VCUDA",
    "MPS_CONTAINER_PIPE_DIR", "MPS_CORE_RESOURCE", "MPS_HOST_ROOT", "MPS_MEMORY_RESOURCE",
    "NO_ROOM", "PHASE_ALLOCATED", "PHASE_ALLOCATING", "PHASE_ANNOTATION", "PRICED_SIZES",
    "REQUEUE_ANNOTATION", "SGPU_RESOURCE", "SHARING_MODES", "SHARING_MODE_LABEL",
    "SHARING_RESOURCES", "VCORE_RESOURCE", "VCUDA_CORE_RESOURCE", "VCUDA_MEMORY_RESOURCE",
    "VCUDA_MEMORY_UNIT_MIB", "VMEMORY_RESOURCE", "WHOLE_GPU_RESOURCES", "ZERO_COUNT_WHY",
    "Assignment", "Candidates", "Chosen", "ContainerAsk", "Family", "Filled", "Fragmentation",
    "GpuCapacity", "GpuUsage", "Room", "ShareClass", "ShareMix", "ShareRequest", "SharingError",
    "allocate_ids", "check_mode", "choose_shared", "class_homes", "cpu_balance", "fill_stranded",
    "fill_taken", "filled", "fits", "free_percent", "gpus_per_core", "leftover",
    "memory_label_mib", "memory_mib", "mps_log_dir", "mps_pipe_dir", "node_fragmentation",
    "parse_assignment", "parse_share", "pod_share", "pod_share_json", "poisson_tail",
    "share_env", "share_mounts", "shared_candidates", "spare_cpu", "usage_from_assignments",
    "weigh_shared", "whole_homes", "whole_rise", "whole_scarcity", "wholly_free",
]
