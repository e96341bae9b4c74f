"""No lockout (issue 50, item 2): stalled handshakes, half-sent requests and a reconnect
loop from several addresses never cost kube-scheduler an answer, and /healthz says when
gpu-aware can no longer serve. The attack is benchmarks/lockout.py's, at smoke size."""

from __future__ import annotations

import http.client
import json
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.lockout import Attack, _connection, scheduler
from gpuk8s.services.extender.admission import AcceptRate
from gpuk8s.services.extender.server import ExtenderHTTPServer, serve_in_thread
from gpuk8s.services.extender.tls import ServerTls, TlsFiles

from .test_extender_hostile import extender
from .tls_certs import server_set


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return server_set(tmp_path_factory.mktemp("certs"))


@pytest.fixture(params=["tls", "plain"])
def served(request: pytest.FixtureRequest, certs: dict[str, Path]
           ) -> Iterator[tuple[ExtenderHTTPServer, ssl.SSLContext | None]]:
    tls = context = None
    if request.param == "tls":
        tls = ServerTls(TlsFiles(str(certs["server"]), str(certs["server_key"]),
                                 str(certs["ca"])))
        context = ssl.create_default_context(cafile=str(certs["ca"]))
        context.load_cert_chain(str(certs["client"]), str(certs["client_key"]))
    # small pools, so that a small attack fills them
    srv = ExtenderHTTPServer(("127.0.0.1", 0), extender(), tls=tls, max_pending=8,
                             max_pending_per_client=2, max_connections=8, max_per_client=4)
    serve_in_thread(srv)
    yield srv, context
    srv.shutdown()
    srv.server_close()


def test_the_scheduler_is_served_while_slow_clients_and_a_reconnect_loop_attack(
    served: tuple[ExtenderHTTPServer, ssl.SSLContext | None]
) -> None:
    """Before: connections stuck before their handshake (or first request) held the 64
    places for 10 s each and the scheduler's idle keep-alive connection was evicted for
    them: 0 of 74 filter requests answered."""
    srv, context = served
    attack = Attack(srv.port, slow=40, addresses=5, plain=context is None).start()
    try:
        deadline = time.monotonic() + 120
        while srv.dropped_handshakes + srv.refused_connections == 0:  # the pool is full
            assert time.monotonic() < deadline, "the attack never filled the pending pool"
            time.sleep(0.05)
        latencies, failures = scheduler(srv.port, context, requests=30, new_every=10,
                                        deadline=time.monotonic() + 120)
    finally:
        attack.stop()
    assert failures == 0 and len(latencies) == 30
    assert srv.evicted_connections == 0  # no established connection gave way to them
    assert srv.rate_limited_connections > 0  # the reconnect loop was slowed


def test_an_accept_rate_bucket_per_address_with_bounded_memory() -> None:
    now = [0.0]
    rate = AcceptRate(lambda: now[0], rate=2.0, burst=3.0, tracked=2)
    assert [rate.allow("a") for _ in range(4)] == [True, True, True, False]
    assert rate.allow("b")  # another address has its own bucket
    now[0] = 1.0  # two tokens back
    assert [rate.allow("a") for _ in range(3)] == [True, True, False]
    rate.allow("c")
    assert len(rate) == 2  # "b", the least recently seen, forgotten


def test_healthz_fails_when_a_request_is_stuck_in_the_extender() -> None:
    now = [100.0]
    main = ExtenderHTTPServer(("127.0.0.1", 0), extender(), clock=lambda: now[0])
    health = ExtenderHTTPServer(("127.0.0.1", 0), extender(), health_only=True, max_body=0,
                                serving=main)
    serve_in_thread(health)

    def healthz() -> tuple[int, str]:
        conn = http.client.HTTPConnection("127.0.0.1", health.port, timeout=10)
        try:
            conn.request("GET", "/healthz")
            resp = conn.getresponse()
            return resp.status, resp.read().decode()
        finally:
            conn.close()

    try:
        assert healthz()[0] == 200
        main._busy[1] = now[0]  # a request entered the extender and never came back
        now[0] += main.stuck_after - 1
        main.service_actions()
        assert healthz()[0] == 200
        now[0] += 2
        main.service_actions()  # the accept loop still turns: the request is what is stuck
        status, body = healthz()
        assert status == 503 and "in the extender for" in json.loads(body)["Error"]
        del main._busy[1]
        main.service_actions()  # the accept loop turns
        assert healthz()[0] == 200
        now[0] += main.stuck_after + 1  # and then never again
        status, body = healthz()
        assert status == 503 and "accept loop" in json.loads(body)["Error"]
    finally:
        health.shutdown()
        health.server_close()
        main.server_close()


def test_an_address_with_an_established_connection_is_not_rate_limited(
    served: tuple[ExtenderHTTPServer, ssl.SSLContext | None]
) -> None:
    """kube-scheduler opens new connections in bursts (binds run in goroutines, Go keeps
    up to 25 idle ones a host): while it holds an established connection, its new ones
    are neither rate-limited nor refused at the small pending cap."""
    srv, context = served
    srv.accept_rate = AcceptRate(srv.clock, rate=0.001, burst=1.0)  # one new connection
    held = _connection(srv.port, context)
    try:
        held.request("GET", "/healthz")
        assert held.getresponse().read() and srv.rate_limited_connections == 0
        # every request on a new connection: without the exemption all but none refused
        latencies, failures = scheduler(srv.port, context, requests=10, new_every=1,
                                        deadline=time.monotonic() + 60)
        assert (failures, len(latencies), srv.rate_limited_connections) == (0, 10, 0)
    finally:
        held.close()
    deadline = time.monotonic() + 60
    while "127.0.0.1" in srv._clients:  # the server has seen the closes
        assert time.monotonic() < deadline
        time.sleep(0.05)
    # the address holds nothing now: its next new connection meets the empty bucket
    with pytest.raises((OSError, http.client.HTTPException)):
        late = _connection(srv.port, context)
        try:
            late.request("GET", "/healthz")
            late.getresponse().read()
        finally:
            late.close()
    assert srv.rate_limited_connections >= 1
