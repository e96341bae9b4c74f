"""Container edits: the environment and mounts a container of a shared-GPU pod gets.

=====================  =============================================================
``share_env``          per mode: sgpu ``METAX_SGPU_*``, vcuda ``CUDA_DEVICE_*_LIMIT``
                       (HAMi-core's variables), mps ``CUDA_MPS_*``
``share_mounts``       mps: the GPU's MPS pipe directory at ``MPS_CONTAINER_PIPE_DIR``
``mps_pipe_dir``,      host directories of the MPS control daemon of a GPU (the
``mps_log_dir``        contract with gpu-mps)
=====================  =============================================================

Example: an mps assignment of 30 % and 4096 MiB on the GPU ``GPU-1`` gives
``CUDA_MPS_PIPE_DIRECTORY=/run/gpuk8s/mps/pipe``, ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30``,
``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M`` and the mount
``/run/gpuk8s/mps/GPU-1/pipe -> /run/gpuk8s/mps/pipe``.
"""

from __future__ import annotations

import re
from typing import Sequence

from .annotation import Assignment
from .names import MODE_MPS, MODE_SGPU, MODE_VCUDA, SharingError

# -- MPS paths (contract with the node agent's MPS control daemon) --------------------
MPS_HOST_ROOT = "/run/gpuk8s/mps"
MPS_CONTAINER_PIPE_DIR = "/run/gpuk8s/mps/pipe"
_UUID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}\Z")


def _checked_uuid(uuid: str) -> str:
    if not isinstance(uuid, str) or not _UUID.match(uuid) or ".." in uuid:
        raise SharingError(
            f"GPU UUID: {uuid!r} must be 1-128 characters of letters, digits, '.', '_', ':', '-'"
        )
    return uuid


def mps_pipe_dir(uuid: str, root: str = MPS_HOST_ROOT) -> str:
    """Host directory of the MPS control daemon's pipes for the GPU ``uuid``."""
    return f"{root.rstrip('/')}/{_checked_uuid(uuid)}/pipe"


def mps_log_dir(uuid: str, root: str = MPS_HOST_ROOT) -> str:
    """Host directory of the MPS control daemon's logs for the GPU ``uuid``."""
    return f"{root.rstrip('/')}/{_checked_uuid(uuid)}/log"



# -- what a container gets -----------------------------------------------------------------
def share_env(assignment: Assignment, uuids: Sequence[str] = ()) -> dict[str, str]:
    """Environment for a container of the assigned pod (per mode; see docs/sharing.md,
    "What is enforced, per mode").

    * sgpu: ``METAX_SGPU_COMPUTE`` (percent) and ``METAX_SGPU_MEMORY_MIB``: assumed to be
      what MetaX's sGPU runtime reads (the vendor does not document it publicly); the
      GPUs themselves come as device nodes.
    * vcuda: ``CUDA_DEVICE_SM_LIMIT`` (percent) and ``CUDA_DEVICE_MEMORY_LIMIT_<i>``
      (``<MiB>m``) -- the variables HAMi-core's interception library reads; nothing
      enforces them unless such a library is preloaded in the container.
    * mps: ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``, ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``
      (``<i>=<MiB>M`` per visible device) and ``CUDA_MPS_PIPE_DIRECTORY`` (the pipe
      directory of the GPU's MPS control daemon, mounted at ``MPS_CONTAINER_PIPE_DIR``).
    """
    share = assignment.share
    env: dict[str, str] = {}
    if share.mode == MODE_SGPU:
        env["METAX_SGPU_COMPUTE"] = str(share.core)
        if share.memory_mib:
            env["METAX_SGPU_MEMORY_MIB"] = str(share.memory_mib)
    elif share.mode == MODE_VCUDA and not share.whole:
        env["CUDA_DEVICE_SM_LIMIT"] = str(share.core)
        if share.memory_mib:
            for i in range(len(assignment.gpus)):
                env[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] = f"{share.memory_mib}m"
    elif share.mode == MODE_MPS:
        if len(uuids) != 1:
            raise SharingError(f"mps: one GPU UUID per pod, got {len(uuids)}")
        _checked_uuid(uuids[0])
        env["CUDA_MPS_PIPE_DIRECTORY"] = MPS_CONTAINER_PIPE_DIR
        if share.core:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(share.core)
        if share.memory_mib:
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={share.memory_mib}M"
    return env


def share_mounts(assignment: Assignment, uuids: Sequence[str]) -> list[tuple[str, str]]:
    """(host path, container path) bind mounts: the MPS pipe directory in mps mode."""
    if assignment.share.mode != MODE_MPS:
        return []
    if len(uuids) != 1:
        raise SharingError(f"mps: one GPU UUID per pod, got {len(uuids)}")
    return [(mps_pipe_dir(uuids[0]), MPS_CONTAINER_PIPE_DIR)]
