"""The liveness endpoint every long-running service serves: ``GET /healthz`` (and
``/livez``) answers JSON, 200 while ``check`` says the process is making progress, else
its status (503). Unknown paths get 404; nothing a client sends can stop the server."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Check = Callable[[], "tuple[int, dict[str, Any]]"]


def serve_health(port: int, check: Check, name: str) -> ThreadingHTTPServer:
    """Serve ``/healthz`` on ``port`` in a daemon thread; returns the server."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path not in ("/healthz", "/livez"):
                self._send(404, {"Error": f"no such path {self.path[:100]!r}; try /healthz"})
                return
            code, body = check()
            self._send(code, body)

        def _send(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("", port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name=f"{name}-health", daemon=True).start()
    return server
