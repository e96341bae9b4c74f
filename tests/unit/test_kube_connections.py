"""The services' API writes reuse the client's connection (``kube.body``).

A call made with ``_preload_content=False`` whose answer nobody reads keeps its
connection out of the pool; the next call then opens a new one, which costs a TCP and a
TLS handshake on both ends. Here the real kubernetes client and urllib3 talk to a local
HTTP server that counts the connections it accepts.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from gpuk8s.services import kube
from gpuk8s.services.deviceplugin.sharing import KubePendingPods
from gpuk8s.services.extender.leader import KubeLeaseApi, KubePodLabeler
from gpuk8s.services.extender.share import KubePodApi

POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns"}}


class _Counting(ThreadingHTTPServer):
    daemon_threads = True
    connections = 0


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the API server
    disable_nagle_algorithm = True  # as Go's servers: the head and body go out at once

    def setup(self) -> None:
        super().setup()
        server: Any = self.server
        server.connections += 1

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        if "/leases" in self.path:
            doc: dict[str, Any] = {"kind": "Lease", "metadata": {"name": "l"}}
        elif self.path.split("?")[0].endswith("/pods"):
            doc = {"kind": "PodList", "items": [POD]}
        else:
            doc = POD
        body = json.dumps(doc).encode()
        self.send_response(201 if self.command == "POST" else 200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PATCH = do_PUT = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def api() -> Iterator[tuple[_Counting, Any]]:
    from kubernetes import client

    server = _Counting(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{server.server_address[1]}"
    api_client = client.ApiClient(configuration)
    yield server, api_client
    api_client.close()
    server.shutdown()
    server.server_close()


def test_body_reads_the_answer_and_gives_the_connection_back() -> None:
    class Resp:
        data = b"{}"
        released = 0

        def release_conn(self) -> None:
            self.released += 1

    resp = Resp()
    assert kube.body(resp) == b"{}"
    assert resp.released == 1


def test_extender_bind_path_uses_one_connection(api: tuple[_Counting, Any]) -> None:
    server, client = api
    pods = KubePodApi(client)
    for _ in range(10):
        assert pods.get_pod("ns", "p")["metadata"]["name"] == "p"
        pods.touch("ns", "p", {"a": "b"})
        pods.bind("ns", "p", "uid", "node-1", {"a": "b"})
    assert server.connections == 1


def test_leader_election_and_device_plugin_writes_use_one_connection(
    api: tuple[_Counting, Any],
) -> None:
    server, client = api
    leases = KubeLeaseApi(client, "ns", "l")
    labeler = KubePodLabeler(client, "ns", "p")
    sharing = KubePendingPods("node-1", client)
    for _ in range(10):
        assert leases.get() is not None
        leases.create({"metadata": {"name": "l"}})
        leases.replace({"metadata": {"name": "l"}})
        labeler.label(True)
        assert sharing.pods()[0]["metadata"]["name"] == "p"
        sharing.mark_allocated("ns", "p")
    assert server.connections == 1
