"""gpu-aware over real HTTP: routes, limits, keep-alive, the service assembly, and a
hypothesis fuzz of the handlers (random shapes, wrong types, huge bodies)."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuk8s.core.devicelist import DEVICES_ANNOTATION
from gpuk8s.services.extender.admission import AcceptRate
from gpuk8s.services.extender.logic import Extender
from gpuk8s.services.extender.main import build_parser, build_service
from gpuk8s.services.extender.nodes import BoundPods, NodeCache
from gpuk8s.services.extender.packing import NO_ALLOCATABLE
from gpuk8s.services.extender.server import ExtenderHTTPServer, serve_in_thread
from gpuk8s.services.extender.weights import Weights, WeightSource

from .test_extender import C500, node, node_annotations, pod


@pytest.fixture(scope="module")
def server() -> Iterator[ExtenderHTTPServer]:
    ext = Extender(WeightSource(None, Weights(1, 1)))
    # a connection per fuzzed example, hundreds a second: no accept-rate limit here
    # (test_extender_lockout.py tests it)
    srv = ExtenderHTTPServer(("127.0.0.1", 0), ext, max_body=256 * 1024,
                             accept_rate=AcceptRate(time.monotonic, rate=1e9, burst=1e9))
    serve_in_thread(srv)
    yield srv
    srv.shutdown()
    srv.server_close()


def request(srv: ExtenderHTTPServer, method: str, path: str, payload: Any = None,
            headers: dict[str, str] | None = None,
            conn: http.client.HTTPConnection | None = None) -> tuple[int, Any, dict[str, str]]:
    own = conn is None
    conn = conn or http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    data = payload if isinstance(payload, bytes | None) else json.dumps(payload).encode()
    conn.request(method, path, body=data, headers=headers or {})
    resp = conn.getresponse()
    raw = resp.read()
    hdrs = {k.lower(): v for k, v in resp.getheaders()}
    if own:
        conn.close()
    ctype = hdrs.get("content-type", "")
    return resp.status, (json.loads(raw) if "json" in ctype else raw.decode()), hdrs


def alive(srv: ExtenderHTTPServer) -> bool:
    return request(srv, "GET", "/healthz")[0] == 200


def test_filter_and_prioritize_over_keep_alive(server: ExtenderHTTPServer) -> None:
    items = {"items": [node("whole", node_annotations(C500, allocated=[0, 1])),
                       node("split", node_annotations(C500, allocated=[0, 4]))]}
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    status, result, hdrs = request(server, "POST", "/filter",
                                   {"Pod": pod(4), "Nodes": items}, conn=conn)
    assert status == 200 and hdrs["content-type"] == "application/json"
    assert {n["metadata"]["name"] for n in result["Nodes"]["items"]} == {"whole", "split"}
    # same connection, a URL prefix, the second manual's verb name
    status, result, _ = request(server, "POST", "/gpu-aware/predicates/",
                                {"Pod": pod(4), "Nodes": items}, conn=conn)
    assert status == 200 and result["FailedNodes"] == {}
    status, result, _ = request(server, "POST", "/prioritize",
                                {"Pod": pod(4), "Nodes": items}, conn=conn)
    assert status == 200 and result == [{"Host": "whole", "Score": 10},
                                        {"Host": "split", "Score": 9}]
    conn.close()


def test_metrics_count_requests(server: ExtenderHTTPServer) -> None:
    request(server, "POST", "/filter", b"{nope")
    status, text, hdrs = request(server, "GET", "/metrics")
    assert status == 200 and hdrs["content-type"].startswith("text/plain")
    assert 'gpu_aware_requests_total{code="400",verb="filter"}' in text
    assert "gpu_aware_request_seconds_bucket" in text
    assert "gpu_aware_score_weight 1.0" in text


@pytest.mark.parametrize(("method", "path", "payload", "headers", "code", "needle"), [
    ("POST", "/filter", b"{", None, 400, "not valid JSON"),
    ("POST", "/filter", b"[]", None, 400, "must be a JSON object"),
    ("POST", "/preempt", b"{}", None, 404, "unknown verb"),
    ("POST", "/bind", b"{}", None, 400, "ExtenderBindingArgs"),
    ("GET", "/nope", None, None, 404, "no such path"),
    ("PUT", "/filter", b"{}", None, 405, "not allowed"),
    ("POST", "/filter", b"{}", {"Content-Length": "x"}, 400, "not a byte count"),
])
def test_bad_requests_get_json_errors(server: ExtenderHTTPServer, method: str, path: str,
                                      payload: bytes | None, headers: dict[str, str] | None,
                                      code: int, needle: str) -> None:
    status, result, _ = request(server, method, path, payload, headers)
    assert status == code and needle in result["Error"]
    assert alive(server)


def test_huge_body_is_refused_before_reading(server: ExtenderHTTPServer) -> None:
    # announce 1 GiB, send nothing: the answer must come at once, without the body
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1073741824\r\n\r\n")
        answer = sock.makefile("rb").read()
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413")
    assert b"Connection: close" in head
    assert "exceeds the limit of 262144 bytes" in json.loads(payload)["Error"]
    # a real oversized body, sent in full
    status, result, _ = request(server, "POST", "/filter", b" " * (300 * 1024))
    assert status == 413 and "exceeds" in result["Error"]
    assert alive(server)


def test_chunked_and_missing_length_are_refused(server: ExtenderHTTPServer) -> None:
    for head in (b"Transfer-Encoding: chunked\r\n", b""):
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\n" + head + b"\r\n0\r\n\r\n")
            answer = sock.makefile("rb").read()
        assert answer.startswith(b"HTTP/1.1 411"), answer[:80]
        assert b'"Error"' in answer
    assert alive(server)


def test_garbage_request_line_gets_a_json_error(server: ExtenderHTTPServer) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"\x16\x03\x01 not http at all\r\n\r\n")
        answer = sock.makefile("rb").read()
    assert answer.startswith(b"HTTP/1.1 400") or answer.startswith(b"HTTP/1.0 400")
    assert b'"Error"' in answer
    assert alive(server)


# -- fuzz ---------------------------------------------------------------------------------
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner,
                                                                max_size=5),
    max_leaves=30,
)
KEYS = st.sampled_from(["Pod", "Nodes", "NodeNames", "pod", "nodes", "nodenames", "Extra"])
RESOURCES = st.fixed_dictionaries({}, optional={
    "limits": st.dictionaries(st.sampled_from(["metax-tech.com/gpu", "cpu"]),
                              JSON | st.sampled_from(["1", "2", "4", "8k", "1.5", "-1"]),
                              max_size=2),
    "requests": JSON,
})
PODS = st.fixed_dictionaries({}, optional={
    "metadata": st.fixed_dictionaries({}, optional={"uid": JSON, "name": JSON,
                                                    "namespace": JSON}) | JSON,
    "spec": st.fixed_dictionaries({}, optional={
        "containers": st.lists(st.fixed_dictionaries({}, optional={
            "resources": RESOURCES | JSON}) | JSON, max_size=3) | JSON,
        "initContainers": st.lists(st.fixed_dictionaries({}, optional={
            "resources": RESOURCES, "restartPolicy": st.sampled_from(["Always", "Never"])}),
            max_size=2) | JSON,
    }) | JSON,
}) | JSON
NODE_ITEMS = st.lists(
    st.fixed_dictionaries({"metadata": st.fixed_dictionaries(
        {"name": st.text(min_size=1, max_size=8) | JSON},
        optional={"annotations": st.dictionaries(
            st.sampled_from(["metax-tech.com/gpu.devices", "metax-tech.com/gpu.topology.scores",
                             "metax-tech.com/gpu.topology.losses", "x"]),
            JSON | st.sampled_from(['[{"id":"a"}]', '{"1":100,"2":60}', "[]", "{"]), max_size=4)
            | JSON})}) | JSON,
    max_size=4,
)
ARGS = st.dictionaries(KEYS, PODS | st.fixed_dictionaries({}, optional={"items": NODE_ITEMS,
                       "metadata": JSON}) | st.lists(st.text(max_size=6) | JSON, max_size=4)
                       | JSON, max_size=4)


def _check(status: int, payload: Any) -> None:
    assert status in (200, 400), (status, payload)
    if status == 400:
        assert isinstance(payload, dict) and isinstance(payload["Error"], str) and payload["Error"]


FUZZ_NODE = node_annotations(C500, allocated=[1])


def _fuzz_extender() -> Extender:
    cache = NodeCache()
    cache.replace([("n1", FUZZ_NODE), ("n2", {"x": "y"})])
    return Extender(WeightSource(None), cache=cache, pods=BoundPods())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(args=ARGS, verb=st.sampled_from(["filter", "prioritize"]))
def test_fuzz_handlers_answer_200_or_400(args: dict[str, Any], verb: str) -> None:
    ext = _fuzz_extender()
    response = ext.handle(verb, json.dumps(args).encode())
    _check(response.status, json.loads(response.body))


@settings(max_examples=200, deadline=None)
@given(raw=st.binary(max_size=200), verb=st.sampled_from(["filter", "prioritize"]))
def test_fuzz_raw_bytes(raw: bytes, verb: str) -> None:
    response = _fuzz_extender().handle(verb, raw)
    _check(response.status, json.loads(response.body))


@settings(max_examples=60, deadline=None, suppress_health_check=[
    HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(args=ARGS | JSON, verb=st.sampled_from(["filter", "prioritize"]),
       pad=st.integers(min_value=0, max_value=400 * 1024))
def test_fuzz_over_http_server_stays_alive(server: ExtenderHTTPServer, args: Any, verb: str,
                                           pad: int) -> None:
    data = json.dumps(args).encode() + b" " * pad  # trailing whitespace is valid JSON
    status, payload, _ = request(server, "POST", f"/{verb}", data)
    if len(data) > server.max_body:
        assert status == 413 and "exceeds" in payload["Error"]
    else:
        _check(status, payload)
    assert alive(server)


# -- service assembly (main's building blocks) ----------------------------------------------
def test_service_with_injected_watch_loops(tmp_path: Path) -> None:
    (tmp_path / "scoreWeight").write_text("1")
    (tmp_path / "lossWeight").write_text("1")
    args = build_parser().parse_args(["--port", "0", "--address", "127.0.0.1", "--node-cache",
                                      "--config-dir", str(tmp_path)])
    fed = threading.Event()
    pods_fed = threading.Event()

    def node_watch(stop: threading.Event) -> None:
        cache = service.extender.cache
        assert cache is not None
        nodes = [("n1", node_annotations(C500, allocated=[0, 1])),
                 ("n2", node_annotations(C500, allocated=[0, 4]))]
        cache.replace(nodes)
        service.extender.rooms.replace(
            (name, found.get(DEVICES_ANNOTATION), NO_ALLOCATABLE) for name, found in nodes
        )
        fed.set()
        stop.wait()

    def pod_watch(stop: threading.Event) -> None:
        pods = service.extender.pods
        assert pods is not None
        # "a" holds the 2 allocated devices; "p" is bound but not yet allocated: 6 - 4 free
        pods.replace([("a", "n1", 2), ("p", "n1", 4)])
        running = service.extender.running
        assert running is not None
        running.replace([("a", "n1", (2, 0, 0)), ("p", "n1", (4, 0, 0))])
        pods_fed.set()
        stop.wait()

    def ledger_watch(stop: threading.Event) -> None:  # no pod holds a share
        sharing = service.extender.sharing
        assert sharing is not None
        sharing.ledger.replace([])
        stop.wait()

    # every watch injected: no API server (nor kubeconfig) is needed
    service = build_service(args, node_watch=node_watch, pod_watch=pod_watch,
                            ledger_watch=ledger_watch)
    service.start()
    try:
        assert fed.wait(10) and pods_fed.wait(10)
        srv = service.server
        status, result, _ = request(srv, "GET", "/readyz")
        assert status == 200
        status, result, _ = request(srv, "POST", "/filter",
                                    {"Pod": pod(4), "NodeNames": ["n1", "n2"]})
        assert status == 200 and result["NodeNames"] == ["n2"]
        assert "4 promised" in result["FailedNodes"]["n1"]
        status, result, _ = request(srv, "POST", "/prioritize",
                                    {"Pod": pod(4), "NodeNames": ["n1", "n2"]})
        assert result == [{"Host": "n1", "Score": 10}, {"Host": "n2", "Score": 9}]
    finally:
        service.close()
    assert service.stopping.is_set()


def test_service_refuses_bad_flags(tmp_path: Path) -> None:
    from gpuk8s.core.errors import ConfigError

    for argv, needle in ((["--port", "70000"], "--port"), (["--max-body-mib", "0"],
                         "--max-body-mib"), (["--score-weight", "x"], "--score-weight"),
                         (["--config-dir", str(tmp_path / "none")], "--config-dir"),
                         (["--prioritize-min-score", "11"], "--prioritize-min-score"),
                         (["--prioritize-min-score", "-1"], "--prioritize-min-score")):
        args = build_parser().parse_args([*argv, "--no-pod-watch"])
        with pytest.raises(ConfigError, match=needle.replace("-", "\\-")):
            build_service(args)


def test_main_exits_2_with_a_message_on_bad_flags(capsys: pytest.CaptureFixture[str]) -> None:
    import logging

    from gpuk8s.services.extender.main import main

    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    try:
        assert main(["--port", "-1", "--no-pod-watch"]) == 2
    finally:  # main() installs a handler on pytest's captured stderr: put logging back
        root.handlers[:], root.level = saved[0], saved[1]
    assert "--port" in capsys.readouterr().err


def _raw_exchange(srv: ExtenderHTTPServer, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        return sock.makefile("rb").read()


@pytest.mark.parametrize(("head", "status"), [
    (b"POST /filter HTTP/2.0\r\n", b"505"),
    (b"POST /filter HTTP/1.x\r\n", b"400"),
    (b"POST /filter HTTP/\xb2.1\r\n", b"400"),
    (b"POST /filter\r\n", b"400"),  # HTTP/0.9 is not spoken here
    (b"POST /filter HTTP/1.1\r\n no-name: x\r\n", b"400"),
    (b"POST /filter HTTP/1.1\r\nno colon\r\n", b"400"),
    (b"POST /filter HTTP/1.1\r\nX: " + b"a" * 70_000 + b"\r\n", b"431"),
    (b"POST /filter HTTP/1.1\r\n" + b"X: y\r\n" * 101, b"431"),
])
def test_malformed_request_heads_get_json_errors(
    server: ExtenderHTTPServer, head: bytes, status: bytes
) -> None:
    answer = _raw_exchange(server, head + b"\r\n")
    assert answer.startswith(b"HTTP/1.1 " + status), answer[:80]
    assert "Error" in json.loads(answer.partition(b"\r\n\r\n")[2])
    assert alive(server)


def test_header_names_are_case_insensitive_and_connection_is_honoured(
    server: ExtenderHTTPServer,
) -> None:
    payload = json.dumps({"Pod": pod(0), "Nodes": {"items": [node("n1")]}}).encode()
    two = (
        b"POST /filter HTTP/1.1\r\nhOST: x\r\ncontent-LENGTH: %d\r\n\r\n%s"
        % (len(payload), payload)
    ) * 2
    answer = _raw_exchange(server, two)
    assert answer.count(b"HTTP/1.1 200 OK") == 2  # keep-alive: both answered
    close = (
        b"POST /filter HTTP/1.1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
        % (len(payload), payload)
    ) * 2
    assert _raw_exchange(server, close).count(b"HTTP/1.1 200 OK") == 1
    # HTTP/1.0 closes unless it asks for keep-alive
    old = b"POST /filter HTTP/1.0\r\nContent-Length: %d\r\n\r\n%s" % (len(payload), payload)
    assert _raw_exchange(server, old * 2).count(b" 200 OK") == 1
    kept = old.replace(b"HTTP/1.0\r\n", b"HTTP/1.0\r\nConnection: keep-alive\r\n")
    assert _raw_exchange(server, kept * 2).count(b" 200 OK") == 2  # as http.server
    # a repeated header: the first counts (as email.message.Message.get), except two
    # different Content-Lengths (test_extender_edges: refused)
    dup = b"POST /filter HTTP/1.1\r\nhost: a\r\nContent-Length: %d\r\nHost: b\r\n\r\n%s" % (
        len(payload), payload)
    assert _raw_exchange(server, dup).startswith(b"HTTP/1.1 200")
