"""HTTP transport for gpu-aware: stdlib ``ThreadingHTTPServer``, HTTP/1.1 keep-alive.

Routes: ``POST /<prefix>/filter`` (or ``/predicates``), ``POST /<prefix>/prioritize``,
``POST /<prefix>/bind``, ``GET /healthz``, ``GET /readyz``, ``GET /metrics``, ``GET
/debug/ledger`` (read-only, ``debug.py``; main port only); any other
method (GET of a verb included) is a 405 with an ``Allow`` header. Every error body is
``{"Error": ...}``. With ``tls`` (``tls.py``) the port speaks HTTPS and admits only
clients with a certificate of the client CA; the handshake runs in the connection's own
thread, within the request timeout. A second instance with ``health_only`` serves the
three GET paths alone (``--health-port``: the kubelet's probes, never behind the main
port's clients).

Bounds, so that no client can take the service down:

* the body must carry a Content-Length no larger than ``max_body`` (413 before reading,
  411 without one);
* bodies being read or answered together hold at most ``body_budget`` bytes (default
  twice ``max_body``); a request that does not fit gets a 503 at once, so memory stays a
  small multiple of the budget whatever the clients do;
* each request must arrive completely within ``request_timeout`` seconds of its first
  byte (a client sending one byte every few seconds is cut off: 408), and the answer
  must be taken within that time too; an idle keep-alive connection is closed after
  ``IDLE_TIMEOUT_S``;
* a new connection is *pending* until its TLS handshake (plain HTTP: its first request)
  has finished, within ``handshake_timeout`` (3 s); pending connections have a pool of
  their own, ``max_pending`` (64) in total and ``max_pending_per_client`` (16) per
  address: past the latter the new one is refused, at the total cap the oldest pending
  one gives way. They never take an established connection's place;
* new connections per address are rate-limited (``admission.AcceptRate``: 20 a second,
  bursts of 40); beyond, one is reset at once, before any thread or handshake, so a
  reconnect storm is slowed and costs an accept and a close. An address that already
  holds an established connection (kube-scheduler's, under TLS: authenticated) is
  neither rate-limited nor held to the pending cap, only to ``max_per_client``;
* at most ``max_connections`` established connections are served at once; at the cap
  a newly established one takes the place of the established connection that has
  waited longest for its next request (so idle connections cannot lock kube-scheduler
  out), and is refused only when every one is in the middle of a request;
* at most ``max_per_client`` of them come from one client address: past it that
  client's own idle connection gives way, or its new one is refused (plain HTTP: 503),
  so one client's connections never take the others' places;
* ``/healthz`` (of the main port, or of the health listener, which reports the main
  port's) answers 503 when the accept loop has not turned, or a request has been in the
  extender, for ``stuck_after`` seconds (30, or 3 request timeouts): restarting helps;
* two different ``Content-Length`` headers are a 400 (which one frames the body?).
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import logging
import re
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest

from .admission import AcceptRate
from .debug import ledger_document
from .logic import BIND_VERBS, FILTER_VERBS, PRIORITIZE_VERBS, Extender, Response
from .tls import ServerTls
from .wire import error_body

log = logging.getLogger("gpuk8s.extender")

DEFAULT_MAX_BODY = 16 * 1024 * 1024
DEFAULT_REQUEST_TIMEOUT_S = 10.0
DEFAULT_MAX_CONNECTIONS = 64
# connections from one client address at once (kube-scheduler: a few at a time)
DEFAULT_MAX_PER_CLIENT = 16
# connections whose TLS handshake (plain HTTP: first request) has not finished: a pool of
# their own, a short deadline, so they never hold an established connection's place
DEFAULT_HANDSHAKE_TIMEOUT_S = 3.0
DEFAULT_MAX_PENDING = 64
# as many as one client may hold established: kube-scheduler starting with a burst of
# binds opens that many at once before any is answered (a cap of 4 refused its 5th)
DEFAULT_MAX_PENDING_PER_CLIENT = 16
STUCK_AFTER_S = 30.0  # liveness: a request in the extender this long means a stuck server
_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends a reset, no TIME_WAIT
IDLE_TIMEOUT_S = 120.0  # longer than Go's idle keep-alive (90 s), so the client closes first
ONE_WRITE_MAX = 1024 * 1024  # bodies up to this size go out with the headers in one send
GET_PATHS = frozenset({"/healthz", "/readyz", "/metrics", "/debug/ledger"})
POST_VERBS = FILTER_VERBS | PRIORITIZE_VERBS | BIND_VERBS


class _RequestTimeout(OSError):
    """The request did not arrive within its deadline."""


class _DeadlineReader(io.RawIOBase):
    """The socket as a raw stream whose reads stop at the current request's deadline.

    Waiting for the first byte of a request uses the idle timeout; from that byte on,
    every read gets only the time left until ``started + request_timeout``, so a slow
    client cannot stretch one request by sending a little at a time."""

    def __init__(
        self,
        sock: socket.socket,
        timeout: float,
        clock: Callable[[], float],
        idle: Callable[[socket.socket, bool], bool],
    ):
        self._sock = sock
        self._timeout = timeout
        self._clock = clock
        self._idle = idle  # tells the server when the connection waits between requests
        self.deadline: float | None = None  # None: between requests

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self.deadline is None:
            # idle, evictable (``ExtenderHTTPServer._evict_idle``), only until the
            # handler takes the connection off the idle list, which it does before it
            # reads a byte: a request read is never lost to an eviction (reading first
            # left a moment where a connection whose request had been read still looked
            # idle and was closed under it)
            self._idle(self._sock, True)
            try:
                ready = _wait_input(self._sock, IDLE_TIMEOUT_S)
            finally:
                still = self._idle(self._sock, False)
            if not still:
                return 0  # evicted while idle: the server shut the connection down
            if not ready:
                raise TimeoutError("no request within the idle timeout")
            self._sock.settimeout(IDLE_TIMEOUT_S)
            count = self._sock.recv_into(buffer)
            if count:
                self.deadline = self._clock() + self._timeout
            return count
        else:
            left = self.deadline - self._clock()
            if left <= 0:
                raise _RequestTimeout("request not received within the deadline")
            self._sock.settimeout(left)
        try:
            return self._sock.recv_into(buffer)
        except TimeoutError:
            raise _RequestTimeout("request not received within the deadline") from None


class _ByteBudget:
    """Bytes of request bodies held at once. ``take`` does not wait: kube-scheduler sends
    one request at a time, so a full budget means other clients are flooding us, and a
    503 (the scheduler retries the pod) is better than queueing behind them."""

    def __init__(self, total: int) -> None:
        self.total = total
        self._free = total
        self._lock = threading.Lock()

    def take(self, amount: int) -> bool:
        amount = min(amount, self.total)
        with self._lock:
            if self._free < amount:
                return False
            self._free -= amount
            return True

    def give(self, amount: int) -> None:
        with self._lock:
            self._free += min(amount, self.total)


class ExtenderHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(
        self,
        address: tuple[str, int],
        extender: Extender,
        max_body: int = DEFAULT_MAX_BODY,
        *,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT_S,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        max_per_client: int = DEFAULT_MAX_PER_CLIENT,
        handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT_S,
        max_pending: int = DEFAULT_MAX_PENDING,
        max_pending_per_client: int = DEFAULT_MAX_PENDING_PER_CLIENT,
        accept_rate: AcceptRate | None = None,
        body_budget: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        tls: ServerTls | None = None,
        health_only: bool = False,
        serving: ExtenderHTTPServer | None = None,
    ) -> None:
        self.extender = extender
        self.max_body = max_body
        self.request_timeout = request_timeout
        self.max_connections = max_connections
        self.max_per_client = max_per_client
        self.handshake_timeout = min(handshake_timeout, request_timeout)
        self.max_pending = max_pending
        self.max_pending_per_client = max_pending_per_client
        self.budget = _ByteBudget(body_budget if body_budget is not None else 2 * max_body)
        self.clock = clock
        self.accept_rate = accept_rate if accept_rate is not None else AcceptRate(clock)
        # HTTPS with client certificates (tls.py); None: plain HTTP
        self.tls = tls
        # the health listener: GET /healthz, /readyz, /metrics only
        self.health_only = health_only
        # whose liveness /healthz reports (the health listener: the main port's)
        self.serving = serving if serving is not None else self
        # a request that has been in the extender this long means it cannot serve
        self.stuck_after = max(STUCK_AFTER_S, 3 * request_timeout)
        self._idle_lock = threading.Lock()  # guards the connection tables below
        self._pending: dict[socket.socket, tuple[float, str]] = {}  # raw -> (accepted, client)
        self._pending_clients: dict[str, int] = {}
        self._established: set[socket.socket] = set()  # as the handler sees it (TLS: SSLSocket)
        self._idle: dict[socket.socket, tuple[float, str]] = {}  # connection -> (since, client)
        self._clients: dict[str, set[socket.socket]] = {}  # client address -> established
        self._busy: dict[int, float] = {}  # thread -> since when in the extender
        self.loop_turned = clock()  # the accept loop's last turn
        self.refused_connections = 0
        self.evicted_connections = 0
        self.timed_out_requests = 0
        self.rate_limited_connections = 0
        self.dropped_handshakes = 0
        self.date_cache: tuple[int, str] = (0, "")  # (second, its Date header)
        super().__init__(address, ExtenderHandler)

    def server_bind(self) -> None:
        # Go's client keeps connections open; small replies must not wait for Nagle.
        self.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().server_bind()

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def service_actions(self) -> None:
        # serve_forever calls this on every turn (a request accepted, or poll_interval)
        self.loop_turned = self.clock()

    def stuck(self) -> str | None:
        """Why this listener cannot serve, or None: its accept loop has not turned, or a
        request has been in the extender, for ``stuck_after`` seconds (a deadlock or a
        loop that never ends: restarting is the fix). Cheap: two clock comparisons."""
        now = self.clock()
        if now - self.loop_turned > self.stuck_after:
            return f"the accept loop has not turned for {now - self.loop_turned:.0f} s"
        busy = list(self._busy.values())
        if busy and now - min(busy) > self.stuck_after:
            return f"a request has been in the extender for {now - min(busy):.0f} s"
        return None

    def connection_idle(self, sock: socket.socket, idle: bool, client: str = "") -> bool:
        """Handlers report when a connection waits for its next request (evictable);
        taking it off, False when it was no longer on the list (evicted meanwhile)."""
        with self._idle_lock:
            if idle:
                self._idle[sock] = (self.clock(), client)
                return True
            return self._idle.pop(sock, None) is not None

    def _evict_idle(self, client: str | None = None) -> bool:
        """Close the established connection that has waited longest for a request (of
        ``client``, or of anyone), so idle connections can never lock kube-scheduler
        out; False when none is idle."""
        with self._idle_lock:
            oldest = self._oldest_idle(client)
            if oldest is None:
                return False
        _shut(oldest)
        self.evicted_connections += 1
        return True

    def _oldest_idle(self, client: str | None) -> socket.socket | None:
        """(lock held) The oldest idle established connection, taken off the tables."""
        # a connection whose next request has already arrived (its handler has not read
        # it yet: a busy host) is not idle
        idle = [s for s, (_, c) in self._idle.items()
                if (client is None or c == client) and not _has_input(s)]
        if not idle:
            return None
        oldest = min(idle, key=lambda s: self._idle[s][0])
        _, owner = self._idle.pop(oldest)
        self._drop_established(oldest, owner)
        return oldest

    def _drop_established(self, conn: socket.socket, client: str) -> None:
        """(lock held)"""
        if conn in self._established:
            self._established.discard(conn)
            mine = self._clients.get(client)
            if mine is not None:
                mine.discard(conn)
                if not mine:
                    del self._clients[client]

    def _refuse(self, request: Any, message: str) -> None:
        self.refused_connections += 1
        with contextlib.suppress(OSError):
            if self.tls is None:  # a TLS client could not read a plain answer
                request.settimeout(1.0)
                body = error_body(message)
                request.sendall(
                    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                    b"Connection: close\r\nContent-Length: "
                    + str(len(body)).encode()
                    + b"\r\n\r\n"
                    + body
                )
        self.shutdown_request(request)

    def process_request(self, request: Any, client_address: Any) -> None:
        """The accept loop: admit a new connection as *pending* (its handshake, or in
        plain HTTP its first request, not finished), or close it. Pending connections
        have a pool of their own (``max_pending``, ``max_pending_per_client``), so they
        never take an established connection's place; at the total cap the oldest
        pending one gives way (a new client is not locked out by stalled handshakes)."""
        client = str(client_address[0]) if client_address else ""
        # an address that holds an established connection (under TLS: one that presented
        # kube-scheduler's certificate) is not a storm: its new connections (Go keeps up
        # to 25 idle ones a host, and opens more under bursts of binds) are neither
        # rate-limited nor held to the small pending cap, only to ``max_per_client``
        known = client in self._clients
        if not known and not self.accept_rate.allow(client):
            # a reconnect storm: one accept and one close, no thread, no handshake
            self.rate_limited_connections += 1
            with contextlib.suppress(OSError):
                request.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
            self.shutdown_request(request)
            return
        dropped = None
        with self._idle_lock:
            cap = self.max_per_client if known else self.max_pending_per_client
            if self._pending_clients.get(client, 0) >= cap:
                refused = True
            else:
                refused = False
                if len(self._pending) >= self.max_pending:
                    dropped = min(self._pending, key=lambda s: self._pending[s][0])
                    self._forget_pending(dropped)
                self._pending[request] = (self.clock(), client)
                self._pending_clients[client] = self._pending_clients.get(client, 0) + 1
        if refused:
            self._refuse(request, f"gpu-aware: more than {cap} "
                                  f"unfinished connections from {client}")
            return
        if dropped is not None:
            self.dropped_handshakes += 1
            _shut(dropped)
        try:
            super().process_request(request, client_address)
        except BaseException:
            with self._idle_lock:
                self._forget_pending(request)
            raise

    def _forget_pending(self, request: socket.socket) -> bool:
        """(lock held) Take ``request`` off the pending pool; False when it was not on it."""
        entry = self._pending.pop(request, None)
        if entry is None:
            return False
        client = entry[1]
        left = self._pending_clients.get(client, 1) - 1
        if left > 0:
            self._pending_clients[client] = left
        else:
            self._pending_clients.pop(client, None)
        return True

    def establish(self, request: socket.socket, conn: socket.socket, client: str) -> str | None:
        """Move a connection whose handshake (or first request) finished from the pending
        pool to the established one; the reason when it has no place there. An idle
        established connection (of this client past its cap, else anyone's) gives way;
        a pending connection never takes an established one's place."""
        evicted = None
        with self._idle_lock:
            if not self._forget_pending(request):
                return "dropped while pending"
            mine = self._clients.get(client, set())
            if len(mine) >= self.max_per_client:
                evicted = self._oldest_idle(client)
                if evicted is None:
                    return f"gpu-aware: more than {self.max_per_client} connections from {client}"
            elif len(self._established) >= self.max_connections:
                evicted = self._oldest_idle(None)
                if evicted is None:
                    return f"gpu-aware: more than {self.max_connections} connections at once"
            self._established.add(conn)
            self._clients.setdefault(client, set()).add(conn)
        if evicted is not None:
            _shut(evicted)
            self.evicted_connections += 1
        return None

    def _handshake(self, request: socket.socket, client: str) -> socket.socket | None:
        """The TLS handshake, in the connection's own thread and within the handshake
        timeout; None (the connection closed) when the client has no valid certificate
        or is too slow."""
        assert self.tls is not None
        request.settimeout(self.handshake_timeout)
        try:
            conn = self.tls.context().wrap_socket(
                request, server_side=True, do_handshake_on_connect=False
            )
        except (OSError, ValueError):
            return None
        try:
            conn.do_handshake()
            return conn
        except (OSError, ValueError) as err:  # ssl.SSLError, timeouts, resets
            self.tls.refused(err, client)
            with contextlib.suppress(OSError):
                conn.close()
            return None

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        conn = request
        client = str(client_address[0]) if client_address else ""
        try:
            if self.tls is not None:
                conn = self._handshake(request, client)
                if conn is None:
                    return
                refused = self.establish(request, conn, client)
                if refused is not None:
                    self.refused_connections += 1
                    return
            super().process_request_thread(conn, client_address)
        finally:
            with self._idle_lock:
                self._forget_pending(request)
                self._idle.pop(conn, None)
                self._drop_established(conn, client)
            if conn is not None and conn is not request:
                with contextlib.suppress(OSError):
                    conn.close()


MAX_HEADER_LINE = 65536  # as http.client
MAX_HEADERS = 100  # as http.client
_VERSION = re.compile(r"HTTP/(\d{1,9})\.(\d{1,9})", re.ASCII)


class _Headers(dict[str, str]):
    """Request headers by lower-cased name (the first of repeated ones): all the handler
    reads. ``email.parser``, which http.server uses, costs more per request than
    answering a filter for 1,000 cached nodes."""

    def get(self, name: str, default: Any = None) -> Any:
        return super().get(name.lower(), default)


class ExtenderHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "gpu-aware"
    sys_version = ""
    server: ExtenderHTTPServer

    def setup(self) -> None:
        super().setup()  # connection, and wfile: unbuffered, every write a sendall
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        client = str(self.client_address[0]) if self.client_address else ""
        server = self.server
        self._reader = _DeadlineReader(
            self.connection,
            server.request_timeout,
            server.clock,
            lambda sock, idle: server.connection_idle(sock, idle, client),
        )
        self.rfile.close()  # the plain reader: ours keeps the request deadline
        self.rfile = io.BufferedReader(self._reader, 64 * 1024)
        self._client = client
        # plain HTTP: pending until its first request has arrived whole, within the
        # handshake timeout (under TLS the handshake did that before the handler ran)
        self._pending = server.tls is None
        if self._pending:
            self._reader.deadline = server.clock() + server.handshake_timeout

    def handle_one_request(self) -> None:
        if not self._pending:
            self._reader.deadline = None  # a new request: idle until its first byte
        self.requestline, self.command, self.path = "", "", ""
        try:
            super().handle_one_request()
        except _RequestTimeout:
            self.server.timed_out_requests += 1
            self.close_connection = True
            self.request_version = self.protocol_version  # headers even before a request line
            with contextlib.suppress(OSError):
                self._error(408, "request not received within the request timeout", close=True)
        except OSError:  # timeouts, resets, TLS errors (ssl.SSLError)
            self.close_connection = True

    def parse_request(self) -> bool:
        """The request line and headers (http.server's rules: HTTP/1.0 or 1.1, keep-alive
        by version and ``Connection``; 431 past ``MAX_HEADERS`` or ``MAX_HEADER_LINE``),
        with the headers read into a ``_Headers`` dict instead of an email message."""
        self.command = None  # type: ignore[assignment]
        self.request_version = version = self.default_request_version
        self.close_connection = True
        line = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")
        self.requestline = line
        words = line.split()
        if not words:
            return False
        if len(words) != 3:
            self.send_error(400, f"bad request syntax ({line[:60]!r})")
            return False
        command, path, version = words
        match = _VERSION.fullmatch(version)
        if match is None:
            self.send_error(400, f"bad request version ({version[:20]!r})")
            return False
        number = (int(match[1]), int(match[2]))
        if number >= (2, 0):
            self.send_error(505, f"invalid HTTP version ({version[:20]})")
            return False
        self.request_version = version
        self.close_connection = number < (1, 1)
        self.command, self.path = command, path
        if path.startswith("//"):
            self.path = "/" + path.lstrip("/")  # not a scheme-relative URL
        headers = _Headers()
        for _ in range(MAX_HEADERS + 1):
            raw = self.rfile.readline(MAX_HEADER_LINE + 1)
            if len(raw) > MAX_HEADER_LINE:
                self.send_error(431, "Line too long")
                return False
            if raw in (b"\r\n", b"\n", b""):
                break
            name, colon, value = str(raw, "iso-8859-1").partition(":")
            if not colon or not name or name[0] in " \t" or name != name.strip():
                self.send_error(400, f"malformed header line ({raw[:60]!r})")
                return False
            key, value = name.lower(), value.strip()
            if key == "content-length" and headers.get(key, value) != value:
                # which one frames the body? (request smuggling): refuse, as RFC 9112 6.3
                self.send_error(400, "conflicting Content-Length headers")
                return False
            headers.setdefault(key, value)
        else:
            self.send_error(431, "Too many headers")
            return False
        self.headers = headers  # type: ignore[assignment]
        connection = headers.get("connection", "").lower()
        if connection == "close":
            self.close_connection = True
        elif connection == "keep-alive" and self.protocol_version >= "HTTP/1.1":
            self.close_connection = False
        if headers.get("expect", "").lower() == "100-continue":
            return self.handle_expect_100()
        return True

    def date_time_string(self, timestamp: float | None = None) -> str:
        # the Date header of every answer: formatted once per second, not per request
        now = int(time.time() if timestamp is None else timestamp)
        cached = self.server.date_cache
        if cached[0] != now:
            cached = self.server.date_cache = (now, super().date_time_string(now))
        return cached[1]

    def _send(self, response: Response, close: bool = False) -> None:
        if self._pending and not close:  # a first answer, plain HTTP: it is established
            self._pending = False
            refused = self.server.establish(self.connection, self.connection, self._client)
            if refused is not None:
                self.server.refused_connections += 1
                response, close = Response(503, error_body(refused)), True
        body = response.body
        # the answer must be taken within the request deadline too (a client that reads
        # slowly holds its connection no longer than one that writes slowly)
        self.connection.settimeout(self.server.request_timeout)
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in response.headers:
            self.send_header(name, value)
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

    def _error(
        self,
        status: int,
        message: str,
        close: bool = False,
        headers: tuple[tuple[str, str], ...] = (),
    ) -> None:
        self._send(Response(status, error_body(message), headers=headers), close=close)

    def _path(self) -> str:
        return self.path.split("?", 1)[0]

    def _verb(self) -> str:
        return self._path().rstrip("/").rsplit("/", 1)[-1]

    def do_POST(self) -> None:
        if self._path() in GET_PATHS:
            self._not_allowed()
            return
        if self.server.health_only:
            self._error(
                404,
                "this is gpu-aware's health port: GET /healthz, /readyz, /metrics; the "
                "extender verbs are served on its main port",
                close=True,
            )
            return
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
            if length < 0 or not length_text.strip().isdigit():
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
        if not self.server.budget.take(length):
            self._error(503, "gpu-aware: too many large requests at once; retry", close=True)
            return
        try:
            body = self.rfile.read(length)
            if len(body) != length:
                self.close_connection = True
                return  # the client went away mid-body
            busy, thread = self.server._busy, threading.get_ident()
            busy[thread] = self.server.clock()  # liveness: how long in the extender
            try:
                answer = self.server.extender.handle(self._verb(), body)
            finally:
                del busy[thread]
            self._send(answer)
        finally:
            self.server.budget.give(length)

    def do_GET(self) -> None:
        path = self._path()
        if path == "/healthz":
            stuck = self.server.serving.stuck()
            if stuck is None:
                self._send(Response(200, b'{"status":"ok"}'))
            else:
                self._error(503, f"gpu-aware cannot serve: {stuck}")
        elif path == "/readyz":
            cache = self.server.extender.cache
            if cache is None or cache.synced:
                self._send(Response(200, b'{"status":"ready"}'))
            else:
                self._error(503, "node cache not synced yet")
        elif path == "/metrics":
            data = generate_latest(self.server.extender.metrics.registry)
            self._send(Response(200, data, CONTENT_TYPE_LATEST))
        elif path == "/debug/ledger" and not self.server.health_only:  # read-only (debug.py)
            self._send(Response(200, ledger_document(self.server.extender.sharing)))
        elif self._verb() in POST_VERBS and not self.server.health_only:
            self._not_allowed()  # GET /filter: a wrong method, like PUT /filter
        else:
            self._error(
                404,
                f"no such path {path[:60]!r}; GET /healthz, /readyz, /metrics, /debug/ledger; "
                "POST .../filter, .../prioritize, .../bind",
            )

    def _not_allowed(self) -> None:
        allow = "GET" if self._path() in GET_PATHS else "POST"
        self._error(
            405,
            f"method {self.command[:20]} not allowed on {self._path()[:60]!r}; use {allow}",
            close=True,
            headers=(("Allow", allow),),
        )

    def __getattr__(self, name: str) -> Any:
        # every method without a do_X (HEAD, OPTIONS, PUT, DELETE, PATCH, TRACE, BREW...)
        # answers 405 with Allow, instead of http.server's 501
        if name.startswith("do_"):
            return self._not_allowed
        raise AttributeError(name)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        # Malformed request lines/headers: answer in the protocol's JSON, not HTML.
        # (an unparsable request line leaves the HTTP/0.9 default, which has no headers)
        self.request_version = self.protocol_version
        with contextlib.suppress(OSError):
            self._error(code, message or "bad request", close=True)

    def log_message(self, format: str, *args: Any) -> None:
        if log.isEnabledFor(logging.DEBUG):  # called for every request: format only if kept
            log.debug("http " + format % args)


def _shut(sock: socket.socket) -> None:
    """Shut a connection another thread serves: its blocked read returns at once (the
    plain socket's shutdown, also under TLS), and that thread closes it."""
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


def _count(server: ExtenderHTTPServer, attribute: str) -> float:
    return float(getattr(server, attribute))


def _wait_input(sock: socket.socket, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for ``sock`` to become readable (bytes, the peer's
    close or an error: the read that follows tells which); under TLS, bytes already
    decrypted count. False when the time ran out."""
    pending = getattr(sock, "pending", None)
    if pending is not None and pending() > 0:
        return True
    poller = select.poll()  # not select(): no limit on the descriptor's number
    poller.register(sock.fileno(), select.POLLIN | select.POLLPRI)
    return bool(poller.poll(max(timeout, 0.0) * 1000))


def _has_input(sock: socket.socket) -> bool:
    """Bytes wait to be read on ``sock`` (its raw socket: under TLS, a record); False for
    a connection the peer closed or that is gone."""
    try:
        poller = select.poll()  # not select(): no limit on the descriptor's number
        poller.register(sock.fileno(), select.POLLIN)
        return bool(poller.poll(0)) and bool(socket.socket.recv(sock, 1, socket.MSG_PEEK))
    except (OSError, ValueError):
        return False


def register_metrics(registry: CollectorRegistry, server: ExtenderHTTPServer) -> None:
    """The main listener's connection and TLS counters, on gpu-aware's registry."""
    for name, text, attribute in (
        ("gpu_aware_refused_connections", "Connections refused at the connection caps "
         "(--max-connections, --max-connections-per-client), since start",
         "refused_connections"),
        ("gpu_aware_evicted_connections", "Idle connections closed to admit new ones, "
         "since start", "evicted_connections"),
        ("gpu_aware_timed_out_requests", "Requests that did not arrive within "
         "--request-timeout (408), since start", "timed_out_requests"),
    ):
        Gauge(name, text, registry=registry).set_function(
            functools.partial(_count, server, attribute)
        )
    tls = server.tls
    if tls is not None:
        Gauge("gpu_aware_tls_handshake_failures", "TLS handshakes refused (no client "
              "certificate, one from another CA, or too slow), since start",
              registry=registry).set_function(lambda: float(tls.handshake_failures))
        Gauge("gpu_aware_tls_reloads", "Certificate files re-read after a change, since start",
              registry=registry).set_function(lambda: float(tls.reloads))
        Gauge("gpu_aware_tls_reload_errors", "Changed certificate files that could not be "
              "read (the previous ones stay in use)",
              registry=registry).set_function(lambda: float(tls.reload_errors))


def serve_in_thread(server: ExtenderHTTPServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, name="gpu-aware-http", daemon=True)
    thread.start()
    return thread


def response_json(response: Response) -> Any:
    return json.loads(response.body)
