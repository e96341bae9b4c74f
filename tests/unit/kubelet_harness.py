"""A kubelet-side test harness for the device plugin (real gRPC on unix sockets).

``FakeKubelet`` plays the kubelet's part of the device plugin protocol:

* serves ``v1beta1.Registration`` on ``<plugin dir>/kubelet.sock`` and records every
  ``RegisterRequest``; like the kubelet, it then dials the plugin's endpoint, calls
  ``GetDevicePluginOptions`` and keeps a ``ListAndWatch`` stream open, recording each
  update;
* calls ``GetPreferredAllocation`` and ``Allocate`` with the kubelet's message shapes;
* serves ``v1.PodResourcesLister`` on its own socket with the pods set by the test;
* ``restart()`` does what a kubelet restart does to the plugin directory: stop, delete
  every socket in it, come back with a new ``kubelet.sock``.

``RecordingNodePatcher`` is the fake API server side of the node annotations.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc

from gpuk8s.services.deviceplugin.grpcapi import DevicePluginStub, dp, registration_handler
from gpuk8s.services.node.grpcapi import pod_resources_handler, podres, unix_target


@dataclass
class Registration:
    version: str
    endpoint: str
    resource_name: str
    preferred_allocation: bool
    pre_start_required: bool
    endpoint_answered: bool  # the plugin served before it registered
    at: float
    generation: int  # how many times this kubelet had restarted when it was registered


@dataclass
class Watch:
    """One ListAndWatch stream opened after a registration."""

    endpoint: str
    updates: list[list[tuple[str, str, tuple[int, ...]]]] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    ended: bool = False
    error: str | None = None


class FakeKubelet:
    def __init__(self, plugin_dir: str, pod_resources_socket: str | None = None) -> None:
        self.plugin_dir = plugin_dir
        self.socket = os.path.join(plugin_dir, "kubelet.sock")
        self.pod_resources_socket = pod_resources_socket
        self.registrations: list[Registration] = []
        self.watches: list[Watch] = []
        self.pods: dict[tuple[str, str], dict[str, list[str]]] = {}  # (ns, pod) -> res -> ids
        self.reject_registrations = False
        self._cond = threading.Condition()
        self._server: grpc.Server | None = None
        self._pr_server: grpc.Server | None = None
        self._channels: list[grpc.Channel] = []
        self.restarts = 0

    # -- kubelet lifecycle ------------------------------------------------------
    def start(self) -> FakeKubelet:
        os.makedirs(self.plugin_dir, exist_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        server.add_generic_rpc_handlers((registration_handler(self._register),))
        server.add_insecure_port(unix_target(self.socket))
        server.start()
        self._server = server
        if self.pod_resources_socket and self._pr_server is None:
            pr = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
            pr.add_generic_rpc_handlers(
                (pod_resources_handler(self._list_pods, self._allocatable),)
            )
            pr.add_insecure_port(unix_target(self.pod_resources_socket))
            pr.start()
            self._pr_server = pr
        return self

    def stop(self) -> None:
        for channel in self._channels:
            channel.close()
        self._channels.clear()
        if self._server is not None:
            self._server.stop(0).wait(5)
            self._server = None
        if self._pr_server is not None:
            self._pr_server.stop(0).wait(5)
            self._pr_server = None

    def restart(self) -> None:
        """Stop, delete every socket in the plugin dir, start with a new kubelet.sock."""
        for channel in self._channels:
            channel.close()
        self._channels.clear()
        if self._server is not None:
            self._server.stop(0).wait(5)
            self._server = None
        for name in os.listdir(self.plugin_dir):
            path = os.path.join(self.plugin_dir, name)
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                os.unlink(path)
        self.restarts += 1
        self.start()

    # -- Registration service ------------------------------------------------------
    def _register(self, request: Any, context: grpc.ServicerContext) -> Any:
        if self.reject_registrations:
            context.abort(grpc.StatusCode.UNAVAILABLE, "kubelet is not ready")
        endpoint = os.path.join(self.plugin_dir, request.endpoint)
        answered = False
        try:
            with grpc.insecure_channel(unix_target(endpoint)) as channel:
                DevicePluginStub(channel).GetDevicePluginOptions(dp.Empty(), timeout=2)
                answered = True
        except grpc.RpcError:
            answered = False
        reg = Registration(
            version=request.version,
            endpoint=request.endpoint,
            resource_name=request.resource_name,
            preferred_allocation=request.options.get_preferred_allocation_available,
            pre_start_required=request.options.pre_start_required,
            endpoint_answered=answered,
            at=time.monotonic(),
            generation=self.restarts,
        )
        with self._cond:
            self.registrations.append(reg)
            self._cond.notify_all()
        if answered:
            self._open_watch(endpoint)
        return dp.Empty()

    def _open_watch(self, endpoint: str) -> None:
        watch = Watch(endpoint=endpoint)
        channel = grpc.insecure_channel(unix_target(endpoint))
        self._channels.append(channel)
        stream = DevicePluginStub(channel).ListAndWatch(dp.Empty())
        with self._cond:
            self.watches.append(watch)

        def consume() -> None:
            try:
                for response in stream:
                    devices = [
                        (d.ID, d.health, tuple(n.ID for n in d.topology.nodes))
                        for d in response.devices
                    ]
                    with self._cond:
                        watch.updates.append(devices)
                        watch.times.append(time.monotonic())
                        self._cond.notify_all()
            except grpc.RpcError as err:
                watch.error = str(err.code())  # type: ignore[attr-defined]
            finally:
                with self._cond:
                    watch.ended = True
                    self._cond.notify_all()

        threading.Thread(target=consume, daemon=True).start()

    # -- PodResources service --------------------------------------------------------
    def set_pod(self, namespace: str, name: str, resources: Mapping[str, Sequence[str]]) -> None:
        with self._cond:
            self.pods[(namespace, name)] = {k: list(v) for k, v in resources.items()}

    def remove_pod(self, namespace: str, name: str) -> None:
        with self._cond:
            self.pods.pop((namespace, name), None)

    def _list_pods(self, request: Any, context: grpc.ServicerContext) -> Any:
        response = podres.ListPodResourcesResponse()
        with self._cond:
            for (namespace, name), resources in sorted(self.pods.items()):
                pod = response.pod_resources.add(name=name, namespace=namespace)
                container = pod.containers.add(name="main")
                for resource, ids in resources.items():
                    container.devices.add(resource_name=resource, device_ids=ids)
        return response

    def _allocatable(self, request: Any, context: grpc.ServicerContext) -> Any:
        return podres.AllocatableResourcesResponse()

    # -- waiting ---------------------------------------------------------------------
    def wait(self, predicate: Callable[[], bool], timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(predicate, timeout=timeout)

    def wait_registrations(self, count: int, timeout: float = 10.0) -> list[Registration]:
        if not self.wait(lambda: len(self.registrations) >= count, timeout):
            raise AssertionError(
                f"expected {count} registrations within {timeout}s, got {len(self.registrations)}"
            )
        return list(self.registrations)

    def latest_watch(self, timeout: float = 10.0) -> Watch:
        if not self.wait(lambda: bool(self.watches) and bool(self.watches[-1].updates), timeout):
            raise AssertionError("no ListAndWatch update received")
        return self.watches[-1]

    def wait_update(
        self,
        watch: Watch,
        predicate: Callable[[list[tuple[str, str, tuple[int, ...]]]], bool],
        timeout: float,
        after: int = 0,
    ) -> tuple[int, float]:
        """Index and arrival time of the first update at index ≥ ``after`` matching."""
        found: list[tuple[int, float]] = []

        def check() -> bool:
            for i in range(after, len(watch.updates)):
                if predicate(watch.updates[i]):
                    found.append((i, watch.times[i]))
                    return True
            return False

        if not self.wait(check, timeout):
            raise AssertionError(f"no matching ListAndWatch update within {timeout}s")
        return found[0]

    # -- kubelet calls to the plugin -------------------------------------------------
    def _stub(self, endpoint: str) -> tuple[grpc.Channel, DevicePluginStub]:
        channel = grpc.insecure_channel(unix_target(os.path.join(self.plugin_dir, endpoint)))
        return channel, DevicePluginStub(channel)

    def preferred(
        self, endpoint: str, available: Sequence[str], must: Sequence[str], size: int
    ) -> list[str]:
        channel, stub = self._stub(endpoint)
        with channel:
            request = dp.PreferredAllocationRequest(
                container_requests=[
                    dp.ContainerPreferredAllocationRequest(
                        available_deviceIDs=list(available),
                        must_include_deviceIDs=list(must),
                        allocation_size=size,
                    )
                ]
            )
            response = stub.GetPreferredAllocation(request, timeout=10)
        return list(response.container_responses[0].deviceIDs)

    def allocate(self, endpoint: str, *containers: Sequence[str]) -> Any:
        channel, stub = self._stub(endpoint)
        with channel:
            request = dp.AllocateRequest(
                container_requests=[
                    dp.ContainerAllocateRequest(devices_ids=list(ids)) for ids in containers
                ]
            )
            return stub.Allocate(request, timeout=10)

    def options(self, endpoint: str) -> Any:
        channel, stub = self._stub(endpoint)
        with channel:
            return stub.GetDevicePluginOptions(dp.Empty(), timeout=5)


class RecordingNodePatcher:
    """A ``NodePatcher`` that keeps annotations in memory and records every call."""

    def __init__(self, initial: Mapping[str, str] | None = None) -> None:
        self.annotations: dict[str, dict[str, str]] = {}
        self.initial = dict(initial or {})
        self.patches: list[tuple[str, dict[str, str | None]]] = []
        self.gets = 0
        self.fail_patches = 0  # fail this many patch calls, then succeed
        self._cond = threading.Condition()

    def get_annotations(self, node: str) -> dict[str, str]:
        with self._cond:
            self.gets += 1
            self._cond.notify_all()
            return dict(self.annotations.get(node, self.initial))

    def patch_annotations(self, node: str, annotations: Mapping[str, str | None]) -> None:
        from gpuk8s.services.kube import TemporaryApiError

        with self._cond:
            if self.fail_patches > 0:
                self.fail_patches -= 1
                raise TemporaryApiError("simulated API server outage", 503)
            current = self.annotations.setdefault(node, dict(self.initial))
            for key, value in annotations.items():
                if value is None:
                    current.pop(key, None)
                else:
                    current[key] = value
            self.patches.append((node, dict(annotations)))
            self._cond.notify_all()

    def wait(self, predicate: Callable[[], bool], timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(predicate, timeout=timeout)
