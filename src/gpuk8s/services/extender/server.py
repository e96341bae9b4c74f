"""HTTP transport for gpu-aware: stdlib ``ThreadingHTTPServer``, HTTP/1.1 keep-alive.

Routes: ``POST /<prefix>/filter`` (or ``/predicates``), ``POST /<prefix>/prioritize``,
``GET /healthz``, ``GET /metrics``. The body must carry a Content-Length no larger
than ``max_body``; a larger one is refused with 413 before it is read (and the
connection closed), a missing one with 411. Every error body is ``{"Error": ...}``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .logic import Extender, Response
from .wire import error_body

log = logging.getLogger("gpuk8s.extender")

DEFAULT_MAX_BODY = 64 * 1024 * 1024
ONE_WRITE_MAX = 1024 * 1024  # bodies up to this size go out with the headers in one send
READ_TIMEOUT_S = 30.0


class ExtenderHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(
        self, address: tuple[str, int], extender: Extender, max_body: int = DEFAULT_MAX_BODY
    ) -> None:
        self.extender = extender
        self.max_body = max_body
        super().__init__(address, ExtenderHandler)

    def server_bind(self) -> None:
        # Go's client keeps connections open; small replies must not wait for Nagle.
        self.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().server_bind()

    @property
    def port(self) -> int:
        return int(self.server_address[1])


class ExtenderHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "gpu-aware"
    sys_version = ""
    timeout = READ_TIMEOUT_S
    server: ExtenderHTTPServer

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _send(self, response: Response, close: bool = False) -> None:
        body = response.body
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(body)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        buffer = getattr(self, "_headers_buffer", None)  # BaseHTTPRequestHandler's
        if buffer is not None and len(body) <= ONE_WRITE_MAX:
            # headers and body in one send (end_headers would write the headers alone)
            buffer.extend((b"\r\n", body))
            self.flush_headers()
        else:
            self.end_headers()
            self.wfile.write(body)

    def _error(self, status: int, message: str, close: bool = False) -> None:
        self._send(Response(status, error_body(message)), close=close)

    def _verb(self) -> str:
        path = self.path.split("?", 1)[0].rstrip("/")
        return path.rsplit("/", 1)[-1]

    def do_POST(self) -> None:
        if self.headers.get("Transfer-Encoding", "").lower() not in ("", "identity"):
            self._error(
                411,
                "send the body with a Content-Length (chunked bodies are not accepted)",
                close=True,
            )
            return
        length_text = self.headers.get("Content-Length")
        if length_text is None:
            self._error(411, "Content-Length header required", close=True)
            return
        try:
            length = int(length_text)
            if length < 0:
                raise ValueError
        except ValueError:
            self._error(400, f"Content-Length {length_text[:20]!r} is not a byte count", close=True)
            return
        limit = self.server.max_body
        if length > limit:
            self._error(
                413,
                f"request body of {length} bytes exceeds the limit of {limit} "
                "bytes (--max-body-mib); use nodeCacheCapable: true for large "
                "clusters",
                close=True,
            )
            return
        body = self.rfile.read(length)
        if len(body) != length:
            self.close_connection = True
            return  # the client went away mid-body
        self._send(self.server.extender.handle(self._verb(), body))

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/healthz":
            self._send(Response(200, b'{"status":"ok"}'))
        elif path == "/readyz":
            cache = self.server.extender.cache
            if cache is None or cache.synced:
                self._send(Response(200, b'{"status":"ready"}'))
            else:
                self._error(503, "node cache not synced yet")
        elif path == "/metrics":
            data = generate_latest(self.server.extender.metrics.registry)
            self._send(Response(200, data, CONTENT_TYPE_LATEST))
        else:
            self._error(
                404,
                f"no such path {path[:60]!r}; GET /healthz, /readyz, /metrics; "
                "POST .../filter, .../prioritize",
            )

    def _not_allowed(self) -> None:
        self._error(405, f"method {self.command} not allowed", close=True)

    do_PUT = do_DELETE = do_PATCH = _not_allowed

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        # Malformed request lines/headers: answer in the protocol's JSON, not HTML.
        # (an unparsable request line leaves the HTTP/0.9 default, which has no headers)
        self.request_version = self.protocol_version
        with contextlib.suppress(OSError):
            self._error(code, message or "bad request", close=True)

    def log_message(self, format: str, *args: Any) -> None:
        if log.isEnabledFor(logging.DEBUG):  # called for every request: format only if kept
            log.debug("http " + format % args)


def serve_in_thread(server: ExtenderHTTPServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, name="gpu-aware-http", daemon=True)
    thread.start()
    return thread


def response_json(response: Response) -> Any:
    return json.loads(response.body)
