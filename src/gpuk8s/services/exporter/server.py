"""HTTP for gpu-exporter: ``GET /metrics`` (Prometheus text format) and ``GET /healthz``.

``/healthz`` answers 200 while the sampler is alive: a snapshot not older than
``stale_after`` seconds (three sampling intervals by default), or the first sample still
within its grace period; 503 otherwise, so the kubelet restarts a wedged exporter.
Anything else is 404 (405 for other methods); request lines and headers are bounded by
the stdlib server, bodies are never read.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry

from .metrics import Exposition
from .sampler import Sampler

log = logging.getLogger("gpuk8s.exporter.http")


class ExporterHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], registry: CollectorRegistry, sampler: Sampler,
                 stale_after: float) -> None:
        self.exposition = Exposition(registry, sampler)
        self.sampler = sampler
        self.stale_after = stale_after
        self.started = time.time()
        super().__init__(address, ExporterHandler)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def healthy(self) -> tuple[bool, str]:
        snapshot = self.sampler.snapshot
        now = time.time()
        if snapshot is None:
            if now - self.started <= self.stale_after:
                return True, "starting"
            return False, f"no sample in {self.stale_after:g} s"
        age = now - snapshot.taken_at
        if age > self.stale_after:
            return False, f"last sample {age:.0f} s old (limit {self.stale_after:g} s)"
        return True, "ok"


class ExporterHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "gpu-exporter"
    sys_version = ""
    timeout = 30.0
    server: ExporterHTTPServer

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, data: dict[str, str]) -> None:
        self._send(status, json.dumps(data).encode(), "application/json")

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._send(200, self.server.exposition.body(), CONTENT_TYPE_LATEST)
        elif path == "/healthz":
            ok, why = self.server.healthy()
            self._json(200 if ok else 503, {"status": why})
        else:
            self._json(404, {"error": f"no such path {path[:60]!r}; GET /metrics or /healthz"})

    do_HEAD = do_GET

    def _not_allowed(self) -> None:
        self.close_connection = True
        self._json(405, {"error": f"method {self.command} not allowed"})

    do_POST = do_PUT = do_DELETE = do_PATCH = _not_allowed

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        self.request_version = self.protocol_version
        self.close_connection = True
        with contextlib.suppress(OSError):
            self._json(code, {"error": message or "bad request"})

    def log_message(self, format: str, *args: Any) -> None:
        if log.isEnabledFor(logging.DEBUG):
            log.debug("http " + format % args)


def serve_in_thread(server: ExporterHTTPServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                              name="gpu-exporter-http", daemon=True)
    thread.start()
    return thread
