"""gRPC glue for the kubelet APIs: servicer, handlers and client stubs.

Services are wired with gRPC's generic handlers from the generated message classes
(``protos``), so no generated ``*_pb2_grpc`` module (and no grpcio version pin) is
involved. Paths: ``/v1beta1.Registration/Register``, ``/v1beta1.DevicePlugin/<M>``
(REFERENCE §B; PodResources is in ``node.grpcapi``). The test harness (the fake kubelet)
uses the same handlers and stubs from the other side.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import grpc

from ...core.errors import AllocationError
from ..node import protos
from ..node.devices import HEALTHY, UNHEALTHY, DeviceSet, DeviceView, UnknownDeviceError
from ..node.grpcapi import Handler, unary
from .metrics import PluginMetrics
from .sharing import SharedDevices

dp, _ = protos.load()

API_VERSION = "v1beta1"
DEVICE_PLUGIN_SERVICE = "v1beta1.DevicePlugin"
REGISTRATION_SERVICE = "v1beta1.Registration"

log = logging.getLogger("gpuk8s.deviceplugin")


def device_plugin_handler(servicer: DevicePluginServicer) -> grpc.GenericRpcHandler:
    return grpc.method_handlers_generic_handler(
        DEVICE_PLUGIN_SERVICE,
        {
            "GetDevicePluginOptions": unary(
                servicer.GetDevicePluginOptions, dp.Empty, dp.DevicePluginOptions
            ),
            "ListAndWatch": grpc.unary_stream_rpc_method_handler(
                servicer.ListAndWatch,
                request_deserializer=dp.Empty.FromString,
                response_serializer=dp.ListAndWatchResponse.SerializeToString,
            ),
            "GetPreferredAllocation": unary(
                servicer.GetPreferredAllocation,
                dp.PreferredAllocationRequest,
                dp.PreferredAllocationResponse,
            ),
            "Allocate": unary(servicer.Allocate, dp.AllocateRequest, dp.AllocateResponse),
            "PreStartContainer": unary(
                servicer.PreStartContainer,
                dp.PreStartContainerRequest,
                dp.PreStartContainerResponse,
            ),
        },
    )


def registration_handler(register: Handler) -> grpc.GenericRpcHandler:
    """The kubelet side of registration (used by the test harness)."""
    return grpc.method_handlers_generic_handler(
        REGISTRATION_SERVICE, {"Register": unary(register, dp.RegisterRequest, dp.Empty)}
    )


class DevicePluginStub:
    """Client of ``v1beta1.DevicePlugin`` (the kubelet's view; also our self-check)."""

    def __init__(self, channel: grpc.Channel) -> None:
        base = f"/{DEVICE_PLUGIN_SERVICE}/"
        self.GetDevicePluginOptions = channel.unary_unary(
            base + "GetDevicePluginOptions",
            request_serializer=dp.Empty.SerializeToString,
            response_deserializer=dp.DevicePluginOptions.FromString,
        )
        self.ListAndWatch = channel.unary_stream(
            base + "ListAndWatch",
            request_serializer=dp.Empty.SerializeToString,
            response_deserializer=dp.ListAndWatchResponse.FromString,
        )
        self.GetPreferredAllocation = channel.unary_unary(
            base + "GetPreferredAllocation",
            request_serializer=dp.PreferredAllocationRequest.SerializeToString,
            response_deserializer=dp.PreferredAllocationResponse.FromString,
        )
        self.Allocate = channel.unary_unary(
            base + "Allocate",
            request_serializer=dp.AllocateRequest.SerializeToString,
            response_deserializer=dp.AllocateResponse.FromString,
        )
        self.PreStartContainer = channel.unary_unary(
            base + "PreStartContainer",
            request_serializer=dp.PreStartContainerRequest.SerializeToString,
            response_deserializer=dp.PreStartContainerResponse.FromString,
        )


class RegistrationStub:
    def __init__(self, channel: grpc.Channel) -> None:
        self.Register = channel.unary_unary(
            f"/{REGISTRATION_SERVICE}/Register",
            request_serializer=dp.RegisterRequest.SerializeToString,
            response_deserializer=dp.Empty.FromString,
        )


def list_response(views: Sequence[DeviceView]) -> Any:
    devices = []
    for view in views:
        device = dp.Device(ID=view.id, health=HEALTHY if view.healthy else UNHEALTHY)
        if view.numa is not None and view.numa >= 0:
            device.topology.nodes.append(dp.NUMANode(ID=view.numa))
        devices.append(device)
    return dp.ListAndWatchResponse(devices=devices)


class DevicePluginServicer:
    """``v1beta1.DevicePlugin`` over a ``DeviceSet``: translation and errors only."""

    def __init__(
        self,
        devices: DeviceSet | SharedDevices,
        metrics: PluginMetrics,
        stopping: threading.Event,
        on_allocate: Callable[[list[str]], None] | None = None,
        poll_s: float = 1.0,
    ) -> None:
        self.devices = devices
        self.metrics = metrics
        self.stopping = stopping
        self.on_allocate = on_allocate
        self.poll_s = poll_s

    def GetDevicePluginOptions(self, request: Any, context: grpc.ServicerContext) -> Any:
        return dp.DevicePluginOptions(
            pre_start_required=False, get_preferred_allocation_available=True
        )

    def ListAndWatch(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        version, views = self.devices.snapshot()
        log.info("ListAndWatch opened", extra={"devices": len(views)})
        self.metrics.list_and_watch_sent.inc()
        yield list_response(views)
        while context.is_active() and not self.stopping.is_set():
            new = self.devices.wait_for_change(version, self.poll_s)
            if new == version:
                continue
            version, views = self.devices.snapshot()
            unhealthy = [v.id for v in views if not v.healthy]
            log.info("ListAndWatch update", extra={"unhealthy": unhealthy, "version": version})
            self.metrics.list_and_watch_sent.inc()
            yield list_response(views)

    def GetPreferredAllocation(self, request: Any, context: grpc.ServicerContext) -> Any:
        response = dp.PreferredAllocationResponse()
        for creq in request.container_requests:
            try:
                preferred = self.devices.preferred(
                    list(creq.available_deviceIDs),
                    list(creq.must_include_deviceIDs),
                    int(creq.allocation_size),
                )
                chosen = list(preferred.devices)
                if not preferred.complete:
                    self.metrics.preferred_search_cut.inc()
                    log.info(
                        "preferred allocation: search budget ran out, best set found so far",
                        extra={"devices": chosen},
                    )
            except AllocationError as err:
                log.warning("GetPreferredAllocation rejected", extra={"error": str(err)})
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
            response.container_responses.append(
                dp.ContainerPreferredAllocationResponse(deviceIDs=chosen)
            )
        return response

    def Allocate(self, request: Any, context: grpc.ServicerContext) -> Any:
        response = dp.AllocateResponse()
        granted: list[str] = []
        for creq in request.container_requests:
            ids = list(creq.devices_ids)
            try:
                spec = self.devices.container_spec(ids)
            except UnknownDeviceError as err:
                log.warning("Allocate rejected", extra={"error": str(err), "devices": ids})
                self.metrics.allocate_errors.inc()
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
            except AllocationError as err:
                log.warning("Allocate rejected", extra={"error": str(err), "devices": ids})
                self.metrics.allocate_errors.inc()
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
            car = dp.ContainerAllocateResponse()
            car.envs.update(spec.envs)
            car.annotations.update(spec.annotations)
            for ctr, host, read_only in spec.mounts:
                car.mounts.append(dp.Mount(container_path=ctr, host_path=host, read_only=read_only))
            for ctr, host, perms in spec.devices:
                car.devices.append(
                    dp.DeviceSpec(container_path=ctr, host_path=host, permissions=perms)
                )
            for name in spec.cdi_devices:
                car.cdi_devices.append(dp.CDIDevice(name=name))
            response.container_responses.append(car)
            granted.extend(ids)
        self.metrics.allocations.inc(len(request.container_requests))
        log.info("Allocate", extra={"devices": granted})
        if self.on_allocate is not None:
            self.on_allocate(granted)
        return response

    def PreStartContainer(self, request: Any, context: grpc.ServicerContext) -> Any:
        return dp.PreStartContainerResponse()
