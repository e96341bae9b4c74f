"""gRPC glue of gpu-dra: the kubelet's DRA plugin API (v1 and v1beta1), the DRA health
stream (v1 and v1alpha1) and plugin registration, wired with generic handlers from the
messages generated from the vendored kubelet protos (``node.protos``).

Services and paths (k8s.io/kubelet v0.35.4):

* ``/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources`` (and ``Unprepare``),
  the same under ``...dra.v1beta1.DRAPlugin``: one servicer answers both, the messages
  differ only in v1's ``share_id``;
* ``/v1.DRAResourceHealth/NodeWatchResources`` (server stream; the kubelet 1.37 picks it)
  and the same under ``v1alpha1`` (the only one the kubelet 1.31-1.36 calls; 1.37 keeps it
  until 1.40): k8s.io/kubelet's dra-health ``v1/api.proto`` is ``v1alpha1/api.proto`` in
  another proto package, so one servicer and the vendored v1alpha1 messages serve both;
* ``/pluginregistration.Registration/GetInfo`` and ``NotifyRegistrationStatus`` on the
  registration socket the kubelet's plugin watcher finds in ``plugins_registry``.

Registration advertises the services as ``supported_versions`` in the kubelet's
"<package>.<service>" short form (``v1.DRAPlugin``, ``v1beta1.DRAPlugin``,
``v1.DRAResourceHealth``, ``v1alpha1.DRAResourceHealth``); the kubelet picks the newest
of each it knows (1.35 ignores the names it does not know and calls v1alpha1).
The test harness (a kubelet stand-in) uses the stubs below from the other side.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc

from ..node import protos
from ..node.grpcapi import Handler, unary

drav1, drav1beta1, drahealth, reg = protos.load_modules(
    "dra_v1", "dra_v1beta1", "drahealth_v1alpha1", "pluginregistration_v1"
)

DRA_V1 = "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
DRA_V1BETA1 = "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin"
HEALTH_V1 = "v1.DRAResourceHealth"
HEALTH_V1ALPHA1 = "v1alpha1.DRAResourceHealth"
HEALTH_SERVICES = (HEALTH_V1, HEALTH_V1ALPHA1)  # newest first
REGISTRATION_SERVICE = "pluginregistration.Registration"
PLUGIN_TYPE = "DRAPlugin"
# what registration advertises, newest first (the kubelet's DRAPluginService and
# DRAResourceHealthService constants)
SUPPORTED_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin", *HEALTH_SERVICES)
DRA_MODULES = {DRA_V1: drav1, DRA_V1BETA1: drav1beta1}
HEALTHY = drahealth.HEALTHY
UNHEALTHY = drahealth.UNHEALTHY


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    uid: str
    name: str


@dataclass(frozen=True)
class PreparedDevice:
    """One allocated device of a prepared claim, as the kubelet is told."""

    requests: tuple[str, ...]
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
    share_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"requests": list(self.requests), "pool": self.pool,
                               "device": self.device, "cdiDeviceIds": list(self.cdi_ids)}
        if self.share_id:
            out["shareId"] = self.share_id
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PreparedDevice:
        return cls(tuple(data["requests"]), str(data["pool"]), str(data["device"]),
                   tuple(data["cdiDeviceIds"]), data.get("shareId"))


@dataclass
class PrepareResult:
    devices: list[PreparedDevice] = field(default_factory=list)
    error: str = ""


class ClaimPreparer(Protocol):
    """What the servicer drives (``dra.driver.Driver``)."""

    def prepare(self, claims: list[ClaimRef]) -> dict[str, PrepareResult]: ...

    def unprepare(self, claims: list[ClaimRef]) -> dict[str, str]: ...


def _claims(request: Any) -> list[ClaimRef]:
    return [ClaimRef(c.namespace, c.uid, c.name) for c in request.claims]


class DraServicer:
    """``DRAPlugin`` (both versions) over a ``ClaimPreparer``: translation only."""

    def __init__(self, preparer: ClaimPreparer) -> None:
        self.preparer = preparer

    def prepare(self, module: Any, request: Any, context: grpc.ServicerContext) -> Any:
        results = self.preparer.prepare(_claims(request))
        response = module.NodePrepareResourcesResponse()
        for uid, result in results.items():
            entry = response.claims[uid]
            entry.error = result.error
            for dev in result.devices:
                device = module.Device(request_names=list(dev.requests), pool_name=dev.pool,
                                       device_name=dev.device, cdi_device_ids=list(dev.cdi_ids))
                if dev.share_id and "share_id" in module.Device.DESCRIPTOR.fields_by_name:
                    device.share_id = dev.share_id
                entry.devices.append(device)
        return response

    def unprepare(self, module: Any, request: Any, context: grpc.ServicerContext) -> Any:
        results = self.preparer.unprepare(_claims(request))
        response = module.NodeUnprepareResourcesResponse()
        for uid, error in results.items():
            response.claims[uid].error = error
        return response


def dra_handlers(servicer: DraServicer) -> list[grpc.GenericRpcHandler]:
    handlers = []
    for service, module in DRA_MODULES.items():
        def bind(fn: Callable[[Any, Any, grpc.ServicerContext], Any], m: Any = module) -> Handler:
            return lambda request, context: fn(m, request, context)

        handlers.append(grpc.method_handlers_generic_handler(service, {
            "NodePrepareResources": unary(bind(servicer.prepare),
                                          module.NodePrepareResourcesRequest,
                                          module.NodePrepareResourcesResponse),
            "NodeUnprepareResources": unary(bind(servicer.unprepare),
                                            module.NodeUnprepareResourcesRequest,
                                            module.NodeUnprepareResourcesResponse),
        }))
    return handlers


HealthStream = Callable[[Any, grpc.ServicerContext], Iterator[Any]]


def health_handlers(stream: HealthStream) -> list[grpc.GenericRpcHandler]:
    """``stream`` as NodeWatchResources of every DRAResourceHealth version."""
    return [grpc.method_handlers_generic_handler(service, {
        "NodeWatchResources": grpc.unary_stream_rpc_method_handler(
            stream,
            request_deserializer=drahealth.NodeWatchResourcesRequest.FromString,
            response_serializer=drahealth.NodeWatchResourcesResponse.SerializeToString,
        ),
    }) for service in HEALTH_SERVICES]


def registration_handler(get_info: Handler, notify: Handler) -> grpc.GenericRpcHandler:
    return grpc.method_handlers_generic_handler(REGISTRATION_SERVICE, {
        "GetInfo": unary(get_info, reg.InfoRequest, reg.PluginInfo),
        "NotifyRegistrationStatus": unary(notify, reg.RegistrationStatus,
                                          reg.RegistrationStatusResponse),
    })


# -- client side (the kubelet's view; our self-check and the test harness) ------------------
class DraPluginStub:
    def __init__(self, channel: grpc.Channel, service: str = DRA_V1) -> None:
        module = DRA_MODULES[service]
        self.module = module
        self.NodePrepareResources = channel.unary_unary(
            f"/{service}/NodePrepareResources",
            request_serializer=module.NodePrepareResourcesRequest.SerializeToString,
            response_deserializer=module.NodePrepareResourcesResponse.FromString,
        )
        self.NodeUnprepareResources = channel.unary_unary(
            f"/{service}/NodeUnprepareResources",
            request_serializer=module.NodeUnprepareResourcesRequest.SerializeToString,
            response_deserializer=module.NodeUnprepareResourcesResponse.FromString,
        )


class HealthStub:
    def __init__(self, channel: grpc.Channel, service: str = HEALTH_V1) -> None:
        self.NodeWatchResources = channel.unary_stream(
            f"/{service}/NodeWatchResources",
            request_serializer=drahealth.NodeWatchResourcesRequest.SerializeToString,
            response_deserializer=drahealth.NodeWatchResourcesResponse.FromString,
        )


class RegistrationStub:
    def __init__(self, channel: grpc.Channel) -> None:
        self.GetInfo = channel.unary_unary(
            f"/{REGISTRATION_SERVICE}/GetInfo",
            request_serializer=reg.InfoRequest.SerializeToString,
            response_deserializer=reg.PluginInfo.FromString,
        )
        self.NotifyRegistrationStatus = channel.unary_unary(
            f"/{REGISTRATION_SERVICE}/NotifyRegistrationStatus",
            request_serializer=reg.RegistrationStatus.SerializeToString,
            response_deserializer=reg.RegistrationStatusResponse.FromString,
        )
