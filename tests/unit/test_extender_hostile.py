"""gpu-aware under hostile input (issue 15): every case here failed on the code before it.

One bad node or annotation never fails a request (it is excluded with a reason), node
values are validated and clamped, the node cache skips and reports bad nodes and still
becomes ready, memory per request is a small multiple of the body, slow clients are cut
off, connections are capped, other methods get a 405 with Allow, and GPU requests follow
the Kubernetes quantity grammar.
"""

from __future__ import annotations

import http.client
import itertools
import json
import logging
import socket
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gpuk8s.core.devicelist import DEVICES_ANNOTATION
from gpuk8s.core.errors import ConfigError
from gpuk8s.core.scoring import LOSSES_ANNOTATION, SCORES_ANNOTATION, parse_table
from gpuk8s.services.extender.logic import Extender
from gpuk8s.services.extender.main import build_parser
from gpuk8s.services.extender.nodes import BoundPods, NodeCache
from gpuk8s.services.extender.packing import NO_ALLOCATABLE
from gpuk8s.services.extender.server import ExtenderHTTPServer, _DeadlineReader, serve_in_thread
from gpuk8s.services.extender.watch import list_watch, node_handlers
from gpuk8s.services.extender.weights import Weights, WeightSource, parse_weight

from .test_extender import C500, call, node, node_annotations, pod

GOOD = node_annotations(C500, allocated=[0, 1])  # group 4-7 whole: the best place for 4
SPLIT = node_annotations(C500, allocated=[0, 4])
DEEP = "[" * 100_000 + "]" * 100_000
HOSTILE_NUMBERS = ["NaN", "Infinity", "-Infinity", "1e400", "9" * 400]


def poisoned(table_value: str) -> dict[str, str]:
    """SPLIT's annotations with one hostile number in both tables."""
    out = dict(SPLIT)
    for key in (SCORES_ANNOTATION, LOSSES_ANNOTATION):
        out[key] = f'{{"1": {table_value}, "4": {table_value}}}'
    return out


def extender(cache: NodeCache | None = None) -> Extender:
    # float weights, as parse_weight gives them in production
    return Extender(WeightSource(None, Weights(1.0, 1.0)), cache=cache, pods=BoundPods())


def cached(nodes: list[tuple[str, dict[str, str]]]) -> Extender:
    """An extender whose node watch delivered ``nodes`` (cache for filter, rooms for
    prioritize, as ``watch.node_handlers`` feeds both)."""
    cache = NodeCache()
    cache.replace(nodes)
    ext = extender(cache)
    ext.rooms.replace((n, a.get(DEVICES_ANNOTATION), NO_ALLOCATABLE) for n, a in nodes)
    return ext


# -- annotation values ------------------------------------------------------------------
@pytest.mark.parametrize("number", HOSTILE_NUMBERS)
def test_hostile_numbers_in_tables_never_fail_a_request(number: str) -> None:
    nodes = [("good", GOOD), ("bad", poisoned(number))]
    full = {"Pod": pod(4), "Nodes": {"items": [node(n, a) for n, a in nodes]}}
    names = {"Pod": pod(4), "NodeNames": ["good", "bad"]}
    for ext, payload in ((extender(), full), (cached(nodes), names)):
        status, result = call(ext, "filter", payload)
        assert status == 200, result
        assert result["FailedAndUnresolvableNodes"] == {}  # the device list is fine
        status, ranking = call(ext, "prioritize", payload)
        assert status == 200, ranking
        scores = {r["Host"]: r["Score"] for r in ranking}
        assert scores["good"] == 10 and 0 <= scores["bad"] <= 10


def test_a_deeply_nested_device_list_excludes_only_that_node() -> None:
    bad = dict(GOOD, **{DEVICES_ANNOTATION: DEEP})
    nodes = [("good", GOOD), ("deep", bad)]
    full = {"Pod": pod(2), "Nodes": {"items": [node(n, a) for n, a in nodes]}}
    names = {"Pod": pod(2), "NodeNames": ["good", "deep"]}
    for ext, payload in ((extender(), full), (cached(nodes), names)):
        status, result = call(ext, "filter", payload)
        assert status == 200, result
        assert "nested 100000 deep" in result["FailedAndUnresolvableNodes"]["deep"]
        kept = result["NodeNames"] or [n["metadata"]["name"] for n in result["Nodes"]["items"]]
        assert kept == ["good"]
        status, ranking = call(ext, "prioritize", payload)
        assert status == 200 and {r["Host"]: r["Score"] for r in ranking}["deep"] == 0


def test_a_non_string_annotation_excludes_only_that_node() -> None:
    items = [node("good", GOOD), node("odd", {**GOOD, DEVICES_ANNOTATION: [1, 2]})]  # type: ignore[dict-item]
    status, result = call(extender(), "filter", {"Pod": pod(1), "Nodes": {"items": items}})
    assert status == 200
    assert "must be a string" in result["FailedAndUnresolvableNodes"]["odd"]
    assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["good"]


def test_published_tables_are_clamped_and_cannot_steer_the_ranking() -> None:
    # "huge" claims a score of 1e308 for 4 GPUs: read back it is clamped to 100, and
    # prioritize ranks from the device lists themselves (core.scoring), so a node's own
    # claims cannot push the others down: three nodes in the same state tie
    assert parse_table('{"4": 1e308, "1": -5, "2": 1e400}') == {4: 100, 1: 0}
    assert parse_table('{"4": NaN}') == {}  # not JSON: the whole table is unusable
    huge = dict(SPLIT, **{SCORES_ANNOTATION: '{"4": 1e308}', LOSSES_ANNOTATION: '{"4": 0}'})
    best = dict(SPLIT, **{SCORES_ANNOTATION: '{"4": 100}', LOSSES_ANNOTATION: '{"4": 0}'})
    worse = dict(SPLIT, **{SCORES_ANNOTATION: '{"4": 60}', LOSSES_ANNOTATION: '{"4": 0}'})
    items = [node("huge", huge), node("best", best), node("worse", worse), node("good", GOOD)]
    status, ranking = call(extender(), "prioritize", {"Pod": pod(4), "Nodes": {"items": items}})
    assert status == 200
    scores = {r["Host"]: r["Score"] for r in ranking}
    assert scores["huge"] == scores["best"] == scores["worse"] < scores["good"] == 10


# -- the request ---------------------------------------------------------------------------
def test_a_5000_digit_gpu_quantity_is_a_400_naming_the_field() -> None:
    status, result = call(extender(), "filter", {"Pod": pod("1" + "0" * 5000), "NodeNames": []})
    assert status == 400
    field = "Pod.spec.containers[0].resources.limits['metax-tech.com/gpu']"
    assert result["Error"].startswith(field)
    assert "larger than 2^63-1" in result["Error"]


@pytest.mark.parametrize(
    ("quantity", "gpus"), [("1e3", 1000), ("+4", 4), ("4.0", 4), ("0.9999999999", 1), ("2k", 2000)]
)
def test_gpu_requests_follow_the_kubernetes_quantity_grammar(quantity: str, gpus: int) -> None:
    items = [node("good", GOOD)]
    status, result = call(extender(), "filter", {"Pod": pod(quantity), "Nodes": {"items": items}})
    assert status == 200
    if gpus <= 6:
        assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["good"]
    else:
        assert f"the pod needs {gpus}" in result["FailedAndUnresolvableNodes"]["good"]


@pytest.mark.parametrize("quantity", ["４", "4 GPUs", "1.5", "500m", "-1", "1e-3"])
def test_quantities_kubernetes_refuses_or_that_are_fractional_are_400(quantity: str) -> None:
    status, result = call(extender(), "filter", {"Pod": pod(quantity), "NodeNames": []})
    assert status == 400 and "metax-tech.com/gpu" in result["Error"]


def test_duplicate_node_names_are_excluded_with_a_reason() -> None:
    busy = node_annotations(C500, allocated=list(range(8)))
    items = [node("n", busy), node("n", GOOD), node("m", GOOD)]
    payload = {"Pod": pod(2), "Nodes": {"items": items}}
    status, result = call(extender(), "filter", payload)
    assert status == 200
    assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["m"]
    assert "offered 2 times" in result["FailedAndUnresolvableNodes"]["n"]
    assert "n" not in result["FailedNodes"]
    status, ranking = call(extender(), "prioritize", payload)
    assert [(r["Host"], r["Score"]) for r in ranking] == [("n", 0), ("n", 0), ("m", 10)]
    # the same with the node cache
    ext = cached([("n", GOOD), ("m", GOOD)])
    payload = {"Pod": pod(2), "NodeNames": ["n", "m", "n"]}
    status, result = call(ext, "filter", payload)
    assert status == 200 and result["NodeNames"] == ["m"]
    assert "offered 2 times" in result["FailedAndUnresolvableNodes"]["n"]
    status, ranking = call(ext, "prioritize", payload)
    assert [r["Score"] for r in ranking] == [0, 10, 0]


def test_weights_are_bounded_and_the_field_is_named(tmp_path: Path) -> None:
    for text in ("1e308", "1001", "inf", "nan", "-1"):
        with pytest.raises(ConfigError, match=r"scoreWeight: .* must be a number from 0 to 1000"):
            parse_weight(text, "scoreWeight")
    with pytest.raises(ConfigError, match="lossWeight"):
        Weights(1, 1e308)
    (tmp_path / "scoreWeight").write_text("1e308")
    with pytest.raises(ConfigError, match="scoreWeight"):
        WeightSource(str(tmp_path))
    # a live edit to 1e308 is refused; the previous weights stay in force
    (tmp_path / "scoreWeight").write_text("2")
    clock = itertools.count(step=10.0)
    source = WeightSource(str(tmp_path), poll_s=1.0, clock=lambda: next(clock))
    (tmp_path / "scoreWeight").write_text("1e308 ")
    assert source.current().score == 2 and source.errors == 1
    assert "scoreWeight" in (source.last_error or "")


# -- the node cache -----------------------------------------------------------------------
class _Resp:
    """What the kubernetes client returns with _preload_content=False."""

    def __init__(self, data: bytes, lines: list[bytes] | None = None) -> None:
        self.status = 200
        self.data = data
        self._lines = lines or []

    def stream(self, amt: Any = None, decode_content: bool = False) -> Iterator[bytes]:
        yield from self._lines

    def close(self) -> None:
        pass

    def release_conn(self) -> None:
        pass


def test_node_cache_skips_and_reports_bad_nodes_and_becomes_ready(
    caplog: pytest.LogCaptureFixture,
) -> None:
    objects = [
        node("good", GOOD),
        node("nan", poisoned("NaN")),
        node("deep", dict(GOOD, **{DEVICES_ANNOTATION: DEEP})),
        node("odd", {**GOOD, DEVICES_ANNOTATION: {"x": 1}}),  # type: ignore[dict-item]
        {"metadata": {"labels": {}}},  # no name: cannot even be named
        {"metadata": {"name": 5}},
    ]
    listed = json.dumps({"metadata": {"resourceVersion": "7"}, "items": objects}).encode()
    event = {"type": "MODIFIED", "object": node("late", dict(GOOD, **{DEVICES_ANNOTATION: "["}))}
    stop = threading.Event()
    cache = NodeCache()
    on_list, on_event = node_handlers(cache)
    calls = itertools.count()

    def list_node(**kwargs: Any) -> _Resp:
        if next(calls) > 1 or not kwargs.get("watch"):
            if kwargs.get("watch"):
                stop.set()
            return _Resp(listed)
        return _Resp(b"", [json.dumps(event).encode() + b"\n"])

    with caplog.at_level(logging.WARNING, logger="gpuk8s.extender"):
        list_watch(list_node, on_list, on_event, stop, "nodes")
    assert cache.synced and len(cache) == 5
    assert cache.broken == 3 and cache.unreadable == 2  # deep, odd, late; two nameless
    ext = extender(cache)
    status, result = call(ext, "filter", {"Pod": pod(1), "NodeNames": ["good", "nan", "deep",
                                                                      "odd", "late"]})
    assert status == 200 and result["NodeNames"] == ["good", "nan"]
    assert set(result["FailedAndUnresolvableNodes"]) == {"deep", "odd", "late"}
    text = ext.metrics.registry
    from prometheus_client import generate_latest

    metrics = generate_latest(text).decode()
    assert "gpu_aware_unusable_nodes 3.0" in metrics
    assert "gpu_aware_skipped_node_objects 2.0" in metrics
    logged = " ".join(f"{r.getMessage()} {getattr(r, 'node', '')}" for r in caplog.records)
    assert "node excluded: unusable GPU annotations" in logged and "deep" in logged
    assert "node object skipped" in logged


def test_cache_relist_with_hostile_tables_still_syncs() -> None:
    cache = NodeCache()
    cache.replace([("good", GOOD)] + [(f"bad{i}", poisoned(v)) for i, v in
                                      enumerate(HOSTILE_NUMBERS)])
    assert cache.synced and len(cache) == 1 + len(HOSTILE_NUMBERS)


# -- memory ---------------------------------------------------------------------------------
def _peak(ext: Extender, body: bytes) -> tuple[int, float]:
    tracemalloc.start()
    try:
        response = ext.handle("filter", body)
        return response.status, tracemalloc.get_traced_memory()[1] / len(body)
    finally:
        tracemalloc.stop()


def test_memory_per_request_is_a_small_multiple_of_the_body() -> None:
    pod_json = json.dumps(pod(1)).encode()
    size = 4 * 1024 * 1024
    empties = b'{"Pod":' + pod_json + b',"Nodes":{"items":[' + b",".join(
        [b"{}"] * (size // 3)) + b"]}}"
    status, ratio = _peak(extender(), empties)
    assert status == 400 and ratio < 2, ratio  # was 25x: a dict per "{}"
    tiny = b'{"metadata":{"name":"n"}}'
    tiny_nodes = b'{"Pod":' + pod_json + b',"Nodes":{"items":[' + b",".join(
        [tiny] * (size // len(tiny))) + b"]}}"
    status, ratio = _peak(extender(), tiny_nodes)
    assert status == 400 and ratio < 7, ratio  # more than MAX_NODES; was 21x and a 200
    names = b'{"Pod":' + pod_json + b',"NodeNames":[' + b",".join([b'"a"'] * (size // 4)) + b"]}"
    status, ratio = _peak(extender(NodeCache()), names)
    assert status == 400 and ratio < 2, ratio


def test_default_body_limit_is_16_mib() -> None:
    args = build_parser().parse_args([])
    assert args.max_body_mib == 16 and args.request_timeout == 10 and args.max_connections == 64


# -- HTTP: deadlines, connection cap, methods ----------------------------------------------
@pytest.fixture
def fast_clock_server() -> Iterator[ExtenderHTTPServer]:
    """A server whose clock advances one second per reading: a request must arrive in
    about three reads, whatever the wall clock says (deterministic slow-loris)."""
    ticks = itertools.count(step=1.0)
    srv = ExtenderHTTPServer(("127.0.0.1", 0), extender(), request_timeout=3.0,
                             clock=lambda: float(next(ticks)))
    serve_in_thread(srv)
    yield srv
    srv.shutdown()
    srv.server_close()


def test_a_slow_client_is_cut_off_with_408(fast_clock_server: ExtenderHTTPServer) -> None:
    request = b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\r\n"
    with socket.create_connection(("127.0.0.1", fast_clock_server.port), timeout=10) as sock:
        sent = 0
        answer = b""
        for byte in request:  # one byte at a time, each its own read on the server
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                break
            sent += 1
            time.sleep(0.02)
            sock.setblocking(False)
            try:
                answer = sock.recv(4096)
            except BlockingIOError:
                pass
            finally:
                sock.setblocking(True)
            if answer:
                break
        if not answer:
            answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:80]
    assert sent < len(request)  # cut off before the request was complete
    assert fast_clock_server.timed_out_requests == 1


def _get_healthz(srv: ExtenderHTTPServer) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    try:
        conn.request("GET", "/healthz")
        return conn.getresponse().status
    finally:
        conn.close()


def _wait(predicate: Any, what: str) -> None:
    for _ in range(3000):  # polling: the server's threads get there when they get there
        if predicate():
            return
        time.sleep(0.02)
    pytest.fail(f"never: {what}")


def _established(srv: ExtenderHTTPServer) -> socket.socket:
    """A plain connection that has had one answer (established, now idle)."""
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    sock.sendall(b"GET /healthz HTTP/1.1\r\n\r\n")
    assert sock.recv(4096).startswith(b"HTTP/1.1 200")
    return sock


def test_connections_are_capped_and_idle_ones_give_way() -> None:
    srv = ExtenderHTTPServer(("127.0.0.1", 0), extender(), max_connections=2)
    serve_in_thread(srv)
    held: list[socket.socket] = []
    try:
        # two established connections in the middle of a request hold both places: a
        # third gets 503 on its first request
        for _ in range(2):
            sock = _established(srv)
            sock.sendall(b"POST /filter HTTP/1.1\r\nContent-Len")
            held.append(sock)
        _wait(lambda: not srv._idle and len(srv._established) == 2, "both places busy")
        with socket.create_connection(("127.0.0.1", srv.port), timeout=60) as third:
            third.sendall(b"GET /healthz HTTP/1.1\r\n\r\n")
            answer = third.makefile("rb").read()
        assert answer.startswith(b"HTTP/1.1 503") and b"more than 2 connections" in answer
        assert srv.refused_connections == 1
        for sock in held:
            sock.close()
        held.clear()
        # two idle keep-alive connections (waiting for a request) give way to a new one:
        # idle connections can never lock the scheduler out
        _wait(lambda: not srv._established, "both places free")
        held.extend(_established(srv) for _ in range(2))
        _wait(lambda: len(srv._idle) == 2, "two idle connections")
        # the one idle the longest by the server's clock (its handler threads may have
        # reported idle in either order on a busy host)
        with srv._idle_lock:
            order = sorted(srv._idle.items(), key=lambda item: item[1][0])
            oldest, newest = (s.getpeername() for s, _ in order)
        by_name = {sock.getsockname(): sock for sock in held}
        assert _get_healthz(srv) == 200
        assert srv.evicted_connections == 1 and srv.refused_connections == 1
        assert by_name[oldest].recv(1) == b""  # closed
        with srv._idle_lock:
            still = [s.getpeername() for s in srv._idle]
        assert newest in still and oldest not in still  # the other one is still served
    finally:
        for sock in held:
            sock.close()
        srv.shutdown()
        srv.server_close()


def test_a_connection_whose_request_arrived_is_not_evicted_as_idle() -> None:
    """On a busy host a handler may not have read the request that arrived on its
    connection yet: that connection is not idle, so a new one of the same client is
    refused rather than served in its place; an idle one (nothing sent) or one the peer
    closed gives way."""
    srv = ExtenderHTTPServer(("127.0.0.1", 0), extender(), max_connections=4)
    pairs = [socket.socketpair() for _ in range(3)]
    try:
        (busy, busy_peer), (idle, _idle_peer), (gone, gone_peer) = pairs
        busy_peer.sendall(b"POST /filter HTTP/1.1\r\n")
        gone_peer.close()
        for sock in (busy, idle, gone):
            srv.connection_idle(sock, True, "c")
        srv.clock = lambda: 0.0
        srv._idle[busy] = (0.0, "c")  # the oldest: chosen first if it were idle
        srv._idle[idle], srv._idle[gone] = (1.0, "c"), (2.0, "c")
        assert srv._evict_idle("c") and idle not in srv._idle  # not the one with a request
        assert srv._evict_idle("c") and gone not in srv._idle
        assert not srv._evict_idle("c") and busy in srv._idle
        assert srv.evicted_connections == 2
    finally:
        for pair in pairs:
            for sock in pair:
                sock.close()
        srv.server_close()


def test_a_request_read_is_never_evicted_with_its_connection() -> None:
    """The handler takes its connection off the idle list before it reads a byte: an
    eviction at the worst moment -- the request has arrived, the handler is about to
    say it is no longer idle -- finds bytes waiting and leaves the connection alone.
    (The handler used to read first and then leave the list: the connection of a
    request already read looked idle and was shut under it.) Evicted while idle, the
    read returns end of stream."""
    srv = ExtenderHTTPServer(("127.0.0.1", 0), extender(), max_connections=4)
    sock, peer = socket.socketpair()
    evicted_at: list[bool] = []

    def idle(s: socket.socket, now_idle: bool) -> bool:
        if not now_idle:  # the worst moment for a new connection to need a slot
            evicted_at.append(srv._evict_idle("c"))
        return srv.connection_idle(s, now_idle, "c")

    try:
        reader = _DeadlineReader(sock, 5.0, time.monotonic, idle)
        peer.sendall(b"POST /filter HTTP/1.1\r\n")
        buffer = bytearray(64)
        assert reader.readinto(buffer) == len(b"POST /filter HTTP/1.1\r\n")
        assert evicted_at == [False] and srv.evicted_connections == 0
        assert sock not in srv._idle

        # nothing sent: the connection is idle and gives way; the handler sees the end
        def idle_then_evicted(s: socket.socket, now_idle: bool) -> bool:
            taken = srv.connection_idle(s, now_idle, "c")
            if now_idle:
                assert srv._evict_idle("c")
            return taken

        reader = _DeadlineReader(sock, 5.0, time.monotonic, idle_then_evicted)
        assert reader.readinto(buffer) == 0
        assert srv.evicted_connections == 1
    finally:
        sock.close()
        peer.close()
        srv.server_close()


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [("HEAD", "/filter", "POST"), ("OPTIONS", "/filter", "POST"), ("TRACE", "/prioritize", "POST"),
     ("PUT", "/filter", "POST"), ("DELETE", "/x/filter", "POST"), ("BREW", "/filter", "POST"),
     ("POST", "/healthz", "GET"), ("HEAD", "/healthz", "GET"), ("PATCH", "/metrics", "GET")],
)
def test_other_methods_get_405_with_allow(method: str, path: str, allow: str) -> None:
    srv = ExtenderHTTPServer(("127.0.0.1", 0), extender())
    serve_in_thread(srv)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
        conn.request(method, path, body=b"{}" if method != "HEAD" else None)
        resp = conn.getresponse()
        body = resp.read()
        assert resp.status == 405
        assert resp.getheader("Allow") == allow
        if method != "HEAD":
            assert "not allowed" in json.loads(body)["Error"]
        conn.close()
    finally:
        srv.shutdown()
        srv.server_close()


def test_bodies_in_flight_are_bounded_and_a_stalled_one_is_released() -> None:
    # the stalled request holds the budget until its deadline: long enough for the polls
    # below to see it on a busy machine, short enough for a quick test
    srv = ExtenderHTTPServer(("127.0.0.1", 0), extender(), max_body=1000, body_budget=1000,
                             request_timeout=8.0)
    serve_in_thread(srv)
    try:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as stalled:
            stalled.sendall(b"POST /filter HTTP/1.1\r\nContent-Length: 1000\r\n\r\n{")
            # it now holds the whole budget, waiting for a body that never comes: the next
            # request with a body gets a 503 at once, bodiless requests are served. Probe
            # once the server has read its headers and taken the budget (probing in a loop
            # instead raced the server's thread on a loaded machine: 400s until it gave up)
            _wait(lambda: srv.budget._free == 0, "the stalled request holds the budget")
            status, result = call_http(srv, {"Pod": pod(1), "NodeNames": []})
            assert status == 503 and "too many large requests" in result["Error"]
            conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
            conn.request("GET", "/healthz")
            assert conn.getresponse().status == 200
            conn.close()
            # the stalled one is cut off by its deadline and gives its share back
            assert stalled.makefile("rb").read().startswith(b"HTTP/1.1 408")
        status, result = call_http(srv, {"Pod": pod(1), "NodeNames": []})
        assert status == 400  # served again (no node cache here: a 400, but an answer)
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_large_filter_answer_arrives_whole() -> None:
    # several MiB of kept Node objects: more than one socket send can take at once
    srv = ExtenderHTTPServer(("127.0.0.1", 0), extender())
    serve_in_thread(srv)
    try:
        pad = "x" * 4000
        items = [node(f"n{i}", GOOD, status={"pad": pad}) for i in range(1500)]
        body = json.dumps({"Pod": pod(1), "Nodes": {"items": items}}).encode()
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
        conn.request("POST", "/filter", body=body)
        resp = conn.getresponse()
        result = json.loads(resp.read())
        conn.close()
        assert resp.status == 200 and len(result["Nodes"]["items"]) == 1500
        assert result["Nodes"]["items"][-1] == items[-1]  # the same object, byte for byte
    finally:
        srv.shutdown()
        srv.server_close()


def call_http(srv: ExtenderHTTPServer, payload: Any) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    try:
        conn.request("POST", "/filter", body=json.dumps(payload))
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def test_watch_objects_decode_only_what_is_needed() -> None:
    # the typed view skips everything but names and our annotations: a node whose status
    # is huge and deeply nested still decodes (skipping is bounded, building is not done)
    from gpuk8s.services.extender.wire import NodeView

    obj = node("n", GOOD, status={"images": [{"names": ["x" * 100]}] * 1000})
    view = msgspec.json.decode(json.dumps(obj).encode(), type=NodeView)
    assert view.metadata.name == "n" and view.metadata.annotations is not None
