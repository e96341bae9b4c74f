"""GPU sharing in the device plugin: replica device ids, and Allocate by pod annotation.

On a node in a sharing mode (``--sharing-mode``: the node's ``gpuk8s.io/sharing-mode``
label), the plugin serves the mode's counted resource (``core.sharing.COUNTED_RESOURCE``:
``metax-tech.com/sgpu``, ``tencent.com/vcuda-core`` or ``nvidia.com/mps-core``) instead
of whole GPUs. Each GPU is advertised as ``REPLICAS[mode]`` device ids
``<GPU id>::<n>`` (16 share slots for sGPU; 100 for the percent resources, so that
``vcuda-core: 50`` is 50 ids), healthy while the GPU is.

The kubelet picks replica ids at random: they say nothing about which GPU the pod
gets. The GPU was chosen by gpu-aware's ``bind`` verb and written on the pod
(``core.sharing`` annotations). ``Allocate`` therefore lists the live pods bound to
this node whose ``gpuk8s.io/sharing.phase`` is ``allocating`` in this mode -- and whose
assignment is the share the pod itself asks for (``core.sharing.pod_share_json``: app,
init or sidecar container), so a hand-written annotation gets no more -- takes the
oldest by bind time whose request matches the number of ids (``allocate_ids``; the
extender binds one such pod per node and number of ids at a time, so there is one
candidate, the pod the kubelet is admitting), builds its container edits
(``core.cdi.shared_edits``: the assigned GPUs' device nodes, the mode's environment,
the MPS pipe directory) and marks the pod ``allocated``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Protocol

from ...core.allocator import Allocation
from ...core.cdi import VISIBLE_ENV, SdkSource, shared_edits, visible_value
from ...core.errors import AllocationError, ConfigError
from ...core.model import LinkKind
from ...core.sharing import (
    ASSIGNED_ANNOTATION,
    BIND_TIME_ANNOTATION,
    COUNTED_RESOURCE,
    DEFAULT_SLOTS,
    FULL_CORE,
    MODE_MPS,
    MODE_SGPU,
    MODE_VCUDA,
    PHASE_ALLOCATED,
    PHASE_ALLOCATING,
    PHASE_ANNOTATION,
    Assignment,
    SharingError,
    allocate_ids,
    parse_assignment,
    pod_share_json,
)
from ...core.topology import Unit
from .. import kube
from ..node.devices import ContainerSpec, DeviceSet, DeviceView, UnknownDeviceError

log = logging.getLogger("gpuk8s.deviceplugin")

REPLICAS = {MODE_SGPU: DEFAULT_SLOTS, MODE_VCUDA: FULL_CORE, MODE_MPS: FULL_CORE}
SEPARATOR = "::"


def replica_id(unit_id: str, n: int) -> str:
    return f"{unit_id}{SEPARATOR}{n}"


class PendingPods(Protocol):
    """The pods bound to this node (raw JSON objects) and the phase update."""

    def pods(self) -> list[dict[str, Any]]: ...

    def mark_allocated(self, namespace: str, name: str) -> None: ...


class KubePendingPods:
    """``PendingPods`` over the API (pods: list with a field selector, patch)."""

    def __init__(self, node: str, api_client: Any) -> None:
        from kubernetes import client

        self.node = node
        self._core = client.CoreV1Api(api_client)

    def pods(self) -> list[dict[str, Any]]:
        resp: Any = self._core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={self.node}", _preload_content=False
        )
        items: list[dict[str, Any]] = json.loads(kube.body(resp)).get("items") or []
        return items

    def mark_allocated(self, namespace: str, name: str) -> None:
        kube.body(
            self._core.patch_namespaced_pod(
                name,
                namespace,
                {"metadata": {"annotations": {PHASE_ANNOTATION: PHASE_ALLOCATED}}},
                _content_type="application/merge-patch+json",
                _preload_content=False,
            )
        )


def pending_assignments(
    pods: Sequence[dict[str, Any]], node: str, mode: str
) -> list[tuple[str, str, Assignment]]:
    """(namespace, name, assignment) of the pods waiting for Allocate in ``mode`` on
    ``node``, oldest bind time first; unreadable annotations are skipped (logged), and
    so are finished pods (one the kubelet refused at admission stays ``allocating``
    and holds nothing: its assignment must not be handed to the next pod)."""
    found = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        ann = meta.get("annotations") or {}
        if ann.get(PHASE_ANNOTATION) != PHASE_ALLOCATING:
            continue
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        try:
            assignment = parse_assignment(ann.get(ASSIGNED_ANNOTATION))
        except SharingError as err:
            log.warning(
                "pod assignment unreadable", extra={"pod": meta.get("name"), "error": str(err)}
            )
            continue
        if assignment is None or assignment.node != node or assignment.share.mode != mode:
            continue
        why = _not_asked(pod, assignment)
        if why is not None:
            log.warning("pod assignment skipped", extra={"pod": meta.get("name"), "error": why})
            continue
        try:
            when = int(ann.get(BIND_TIME_ANNOTATION, "0"))
        except ValueError:
            when = 0
        found.append((when, str(meta.get("namespace", "")), str(meta.get("name", "")), assignment))
    found.sort(key=lambda item: (item[0], item[1], item[2]))
    return [(ns, name, a) for _, ns, name, a in found]


def _not_asked(pod: dict[str, Any], assignment: Assignment) -> str | None:
    """Why ``assignment`` is not the share the pod itself asks for (its effective
    request, init and sidecar containers included: ``core.sharing.pod_share_json``), or
    None. gpu-device serves a pod no more than its own request, whoever wrote the
    annotation."""
    try:
        asked = pod_share_json(pod)
    except SharingError as err:
        return f"the pod's request is not valid: {err}"
    held = assignment.share
    if asked is None or replace(asked, container="") != replace(held, container=""):
        return (
            f"annotation {ASSIGNED_ANNOTATION} holds {held.gpus} GPU(s) x {held.core} percent, "
            f"{held.memory_mib} MiB; the pod asks for "
            + ("no shared GPU" if asked is None else
               f"{asked.gpus} x {asked.core} percent, {asked.memory_mib} MiB")
        )
    return None


class SharedDevices:
    """A ``DeviceSet``'s whole GPUs as replica ids of the mode's counted resource; the
    gRPC servicer uses it exactly like a ``DeviceSet``."""

    def __init__(self, devices: DeviceSet, mode: str, node: str, pods: PendingPods) -> None:
        if mode not in REPLICAS:
            raise ConfigError(f"sharing-mode: {mode!r} is not one of sgpu, vcuda, mps")
        if not node:
            raise ConfigError("sharing-mode: needs --node-name (Allocate reads the pods)")
        self.devices = devices
        self.mode = mode
        self.node = node
        self.pods = pods
        self.resource_name = COUNTED_RESOURCE[mode]
        self.units = tuple(u for u in devices.units if u.vf is None)
        if not self.units:
            raise ConfigError("sharing-mode: no whole GPUs on this node (VFs cannot be shared)")
        self._by_replica = {
            replica_id(u.id, n): u for u in self.units for n in range(REPLICAS[mode])
        }

    @property
    def version(self) -> int:
        return self.devices.version

    def snapshot(self) -> tuple[int, list[DeviceView]]:
        version, views = self.devices.snapshot()
        by_id = {v.id: v for v in views}
        out = [
            DeviceView(replica_id(u.id, n), by_id[u.id].healthy, by_id[u.id].numa)
            for u in self.units
            for n in range(REPLICAS[self.mode])
        ]
        return version, out

    def wait_for_change(self, version: int, timeout: float) -> int:
        return self.devices.wait_for_change(version, timeout)

    def wake(self) -> None:
        self.devices.wake()

    def _unit(self, device_id: str) -> Unit:
        unit = self._by_replica.get(device_id)
        if unit is None:
            raise UnknownDeviceError(f"unknown device id {device_id!r} for {self.resource_name}")
        return unit

    def preferred(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> Allocation:
        """Any ids will do (the GPU is chosen by the pod's assignment): the must-include
        ones, then the available ones in order."""
        for device_id in [*available, *must_include]:
            self._unit(device_id)
        chosen = list(dict.fromkeys([*must_include, *available]))[:size]
        if len(chosen) < size:
            raise AllocationError(f"request for {size} devices, only {len(chosen)} available")
        return Allocation(tuple(chosen), "shared GPU: ids are interchangeable", LinkKind.SELF)

    def container_spec(self, device_ids: Sequence[str]) -> ContainerSpec:
        """The container of the pending pod whose request matches ``device_ids``."""
        if not device_ids:
            raise AllocationError("empty device list in an allocate request")
        for device_id in device_ids:
            self._unit(device_id)
        try:
            pods = self.pods.pods()
        except Exception as err:
            raise AllocationError(f"cannot list the pods of node {self.node}: {err}") from err
        count = len(set(device_ids))
        pending = pending_assignments(pods, self.node, self.mode)
        match = next(((ns, n, a) for ns, n, a in pending if allocate_ids(a.share) == count), None)
        if match is None:
            raise AllocationError(
                f"no pod on {self.node} waits for {count} {self.resource_name} with a GPU "
                f"assignment (annotation {ASSIGNED_ANNOTATION}, written by gpu-aware's bind "
                f"verb; {len(pending)} pending)"
            )
        namespace, name, assignment = match
        spec = self._spec(assignment)
        try:
            self.pods.mark_allocated(namespace, name)
        except Exception as err:
            raise AllocationError(f"cannot mark {namespace}/{name} allocated: {err}") from err
        log.info(
            "Allocate: shared GPUs",
            extra={"pod": f"{namespace}/{name}", "gpus": list(assignment.gpus), "mode": self.mode},
        )
        return spec

    def _spec(self, assignment: Assignment) -> ContainerSpec:
        inventory = self.devices.inventory
        opts = self.devices.options
        # the assigned GPUs by stable id, at their indexes in this discovery pass
        assignment = replace(assignment, gpus=assignment.current(inventory.index_by_id()))
        units = sorted(
            (u for u in self.units if u.gpu in assignment.gpus),
            key=lambda u: self.devices.topology.position[u.id],
        )
        if len(units) != len(assignment.gpus) or len(units) != assignment.share.gpus:
            named = list(assignment.ids or assignment.gpus)
            raise AllocationError(
                f"assigned GPUs {named} are not all whole GPUs of this node"
            )
        sdk = None
        if opts.mount_sdk and opts.sdk_paths:
            sdk = SdkSource(paths=tuple(opts.sdk_paths))
        try:
            edits = shared_edits(inventory, assignment, opts.device_path_prefix, sdk)
        except ConfigError as err:
            raise AllocationError(str(err)) from err
        spec = ContainerSpec()
        env = VISIBLE_ENV.get(self.devices.backend)
        value = visible_value(
            inventory, units, opts.visible_devices, self.devices.topology.position
        )
        if env and value is not None:
            spec.envs[env] = value
        spec.envs["GPUK8S_DEVICE_IDS"] = ",".join(u.id for u in units)
        spec.add_edits(edits)
        return spec
