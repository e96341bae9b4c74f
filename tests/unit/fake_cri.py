"""A stand-in for containerd's CRI ``RuntimeService/Status`` on a unix socket, for
container-runtime's unit tests: it answers with ``info["config"]`` = the JSON of
``config`` (what the test says containerd serves). The integration tests
(tests/integration/test_runtime_containerd.py) use the real containerd 1.6 and 2.x.

Run as a program (``fake_cri.py SOCKET CONFIG_FILE``: the JSON it serves, read once at
start) it is a process of its own, as containerd is: the socket's peer, which
container-runtime signals, and which lab/supervise restarts.
"""

from __future__ import annotations

import json
import os
from concurrent import futures
from typing import Any

import grpc


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def status_response(info: dict[str, str]) -> bytes:
    """``runtime.v1.StatusResponse{status: {}, info: info}`` on the wire."""
    out = _field(1, b"")
    for key, value in info.items():
        out += _field(2, _field(1, key.encode()) + _field(2, value.encode()))
    return out


def cri_config(runtimes: dict[str, str], default: str = "runc",
               **extra: Any) -> dict[str, Any]:
    """A CRI config as containerd 1.6 reports it: runtime name -> BinaryName."""
    return {"containerd": {
        "defaultRuntimeName": default,
        "runtimes": {name: {"runtimeType": "io.containerd.runc.v2",
                            "options": {"BinaryName": binary} if binary else None}
                     for name, binary in runtimes.items()},
    }, **extra}


class FakeCri:
    def __init__(self, socket_path: str, config: dict[str, Any] | None = None) -> None:
        self.config = config if config is not None else cri_config({"runc": ""})
        self.calls = 0
        os.makedirs(os.path.dirname(socket_path), exist_ok=True)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        handler = grpc.method_handlers_generic_handler("runtime.v1.RuntimeService", {
            "Status": grpc.unary_unary_rpc_method_handler(
                self._status, request_deserializer=None, response_serializer=None),
        })
        self.server.add_generic_rpc_handlers((handler,))
        self.server.add_insecure_port(f"unix://{socket_path}")
        self.server.start()

    def _status(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        self.calls += 1
        return status_response({"config": json.dumps(self.config)})

    def stop(self) -> None:
        self.server.stop(None)


if __name__ == "__main__":  # a fake containerd of its own: fake_cri.py SOCKET CONFIG_FILE
    import signal
    import sys

    with open(sys.argv[2], encoding="utf-8") as handle:  # read at start, as containerd does
        fake = FakeCri(sys.argv[1], json.load(handle))
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    fake.stop()
