"""gRPC helpers shared by the kubelet plugins, and the kubelet's PodResources wire.

Services are wired with gRPC's generic handlers from the generated message classes
(``protos``), so no generated ``*_pb2_grpc`` module (and no grpcio version pin) is
involved. PodResources path: ``/v1.PodResourcesLister/<M>`` (REFERENCE §B). The test
harness (the fake kubelet) uses the same handlers and stubs from the other side.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import grpc

from . import protos

_, podres = protos.load()

POD_RESOURCES_SERVICE = "v1.PodResourcesLister"

Handler = Callable[[Any, grpc.ServicerContext], Any]


def unary(fn: Handler, request: Any, response: Any) -> grpc.RpcMethodHandler:
    return grpc.unary_unary_rpc_method_handler(
        fn, request_deserializer=request.FromString, response_serializer=response.SerializeToString
    )


def pod_resources_handler(list_fn: Handler, allocatable_fn: Handler) -> grpc.GenericRpcHandler:
    """The kubelet side of PodResources (used by the test harness)."""
    return grpc.method_handlers_generic_handler(
        POD_RESOURCES_SERVICE,
        {
            "List": unary(
                list_fn, podres.ListPodResourcesRequest, podres.ListPodResourcesResponse
            ),
            "GetAllocatableResources": unary(
                allocatable_fn,
                podres.AllocatableResourcesRequest,
                podres.AllocatableResourcesResponse,
            ),
        },
    )


class PodResourcesStub:
    def __init__(self, channel: grpc.Channel) -> None:
        self.List = channel.unary_unary(
            f"/{POD_RESOURCES_SERVICE}/List",
            request_serializer=podres.ListPodResourcesRequest.SerializeToString,
            response_deserializer=podres.ListPodResourcesResponse.FromString,
        )


def unix_target(path: str) -> str:
    return f"unix://{path}"


FileId = tuple[int, int, int]  # (st_dev, st_ino, st_ctime_ns)


def file_id(path: str) -> FileId | None:
    """Identity of a socket file: a kubelet (or a cleaner) that removes and recreates it
    changes it."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)
