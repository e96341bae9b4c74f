"""The kubelet's PodResources API, client side (gpu-device and gpu-exporter read it)."""

from __future__ import annotations

from collections.abc import Collection

import grpc

from ...core.telemetry import ContainerDevices, ContainerRef
from .grpcapi import PodResourcesStub, podres, unix_target
from .nodeclient import NodeStateError

DEFAULT_POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"


class PodResourcesClient:
    """The kubelet's PodResources ``List``: which container holds which devices.

    The one client of that API: gpu-device reads the allocated ids of its resource
    (``allocated``), gpu-exporter every container's devices (``assignments``).
    A new channel per call: the socket is recreated whenever the kubelet restarts.
    """

    def __init__(self, socket_path: str = DEFAULT_POD_RESOURCES_SOCKET, timeout: float = 5.0):
        self.socket_path = socket_path
        self.timeout = timeout

    def allocated(self, resource_name: str) -> set[str]:
        ids: set[str] = set()
        for held in self.assignments({resource_name}):
            ids.update(held.device_ids)
        return ids

    def assignments(self, resources: Collection[str] | None = None) -> list[ContainerDevices]:
        """Devices held by each container (of the given resources, or all)."""
        try:
            with grpc.insecure_channel(unix_target(self.socket_path)) as channel:
                response = PodResourcesStub(channel).List(
                    podres.ListPodResourcesRequest(), timeout=self.timeout
                )
        except grpc.RpcError as err:
            raise NodeStateError(
                f"PodResources List on {self.socket_path} failed: {err.code()}"
            ) from err
        found: list[ContainerDevices] = []
        for pod in response.pod_resources:
            for container in pod.containers:
                ref = ContainerRef(pod.namespace, pod.name, container.name)
                for devices in container.devices:
                    if resources is None or devices.resource_name in resources:
                        found.append(ContainerDevices(ref, devices.resource_name,
                                                      tuple(devices.device_ids)))
        return found
