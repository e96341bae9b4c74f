"""Liveness / readiness endpoints of the long-running node agents (one implementation).

``serve_health(port, checks)`` serves ``GET <path>`` for each path of ``checks``: the
check returns ``(ok, details)`` and the answer is 200 (ok) or 503 with the details as a
JSON object; any other path is a 404 naming the paths served; anything but GET is a 405.
A check that raises answers 503 with the error (the server itself never goes down).
The server runs in a daemon thread; ``shutdown()`` on the returned server stops it.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger("gpuk8s.health")

Check = Callable[[], tuple[bool, dict[str, Any]]]
Page = Callable[[], tuple[str, bytes]]  # () -> (content type, body), e.g. /metrics


def serve_health(
    port: int, checks: Mapping[str, Check], *, address: str = "", name: str = "health",
    pages: Mapping[str, Page] | None = None,
) -> ThreadingHTTPServer:
    """Start the endpoint on ``address:port`` (port 0 picks a free one: see
    ``server.server_address``). ``pages`` adds plain pages (a Prometheus ``/metrics``)."""
    paths = dict(checks)
    extra = dict(pages or {})

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            page = extra.get(path)
            if page is not None:
                try:
                    kind, data = page()
                except Exception as err:  # a broken page reports itself
                    self._send(500, {"Error": f"{type(err).__name__}: {err}"})
                    return
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            check = paths.get(path)
            if check is None:
                known = ", ".join([*paths, *extra])
                self._send(404, {"Error": f"no such path {path[:60]!r}; try {known}"})
                return
            try:
                ok, details = check()
            except Exception as err:  # a broken check reports itself, never kills us
                ok, details = False, {"error": f"{type(err).__name__}: {err}"}
            self._send(200 if ok else 503, {"status": "ok" if ok else "failing", **details})

        def do_POST(self) -> None:
            self._send(405, {"Error": "only GET"})

        do_PUT = do_DELETE = do_PATCH = do_POST

        def _send(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body, default=str).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer((address, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name=name, daemon=True).start()
    log.debug("health endpoint", extra={"port": server.server_address[1], "paths": list(paths)})
    return server
