"""gpu-aware over HTTPS with client certificates, the health listener and the
per-client connection cap (issue 26, items 1 and 4): every test here failed on the code
before the fix (there was no TLS, no health listener, no per-client cap)."""

from __future__ import annotations

import http.client
import json
import logging
import shutil
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuk8s.core.errors import ConfigError
from gpuk8s.services.extender.main import build_parser, build_service
from gpuk8s.services.extender.server import ExtenderHTTPServer, serve_in_thread
from gpuk8s.services.extender.tls import ServerTls, TlsFiles

from .test_extender import node, pod
from .test_extender_hostile import GOOD, extender
from .tls_certs import SERVER_NAME, issue, issue_dated, make_ca, server_set

FILTER = json.dumps({"Pod": pod(1), "Nodes": {"items": [node("good", GOOD)]}}).encode()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return server_set(tmp_path_factory.mktemp("certs"))


def client_context(certs: dict[str, Path], who: str | None = "client") -> ssl.SSLContext:
    """What kube-scheduler's tlsConfig makes: trust the CA, present ``who``'s certificate
    (None: none), check the server name."""
    context = ssl.create_default_context(cafile=str(certs["ca"]))
    if who is not None:
        context.load_cert_chain(str(certs[who]), str(certs[f"{who}_key"]))
    return context


def https_filter(port: int, context: ssl.SSLContext) -> tuple[int, Any]:
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
    conn._tunnel_host = None
    try:
        # connect to the IP, verify the certificate's DNS name (tlsConfig.serverName)
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        conn.sock = context.wrap_socket(sock, server_hostname=SERVER_NAME)
        conn.request("POST", "/filter", body=FILTER)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


@pytest.fixture()
def tls_server(certs: dict[str, Path]) -> Iterator[ExtenderHTTPServer]:
    tls = ServerTls(TlsFiles(str(certs["server"]), str(certs["server_key"]), str(certs["ca"])))
    srv = ExtenderHTTPServer(("127.0.0.1", 0), extender(), tls=tls)
    serve_in_thread(srv)
    yield srv
    srv.shutdown()
    srv.server_close()


def test_a_client_with_a_certificate_of_the_ca_is_served(
    tls_server: ExtenderHTTPServer, certs: dict[str, Path]
) -> None:
    status, result = https_filter(tls_server.port, client_context(certs))
    assert status == 200 and [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["good"]


@pytest.mark.parametrize("who", [None, "stranger"])
def test_clients_without_a_valid_certificate_are_refused(
    tls_server: ExtenderHTTPServer, certs: dict[str, Path], who: str | None
) -> None:
    assert tls_server.tls is not None
    before = tls_server.tls.handshake_failures
    with pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException)):
        https_filter(tls_server.port, client_context(certs, who))
    deadline = time.monotonic() + 10
    while tls_server.tls.handshake_failures == before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert tls_server.tls.handshake_failures == before + 1
    # and a plain HTTP request on the TLS port is never read
    with socket.create_connection(("127.0.0.1", tls_server.port), timeout=10) as sock:
        sock.sendall(b"POST /filter HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (
            len(FILTER), FILTER))
        try:
            answer = sock.makefile("rb").read()
        except ConnectionError:
            answer = b""  # reset: what the handshake made of an HTTP request line
        assert not answer.startswith(b"HTTP/1.1 200")


def live_server(certs: dict[str, Path], tmp_path: Path
                ) -> tuple[ExtenderHTTPServer, ServerTls, dict[str, Path]]:
    """A TLS server on copies of the files (``live``: cert, key, ca) that the test
    rotates, checked on every connection."""
    live = {name: tmp_path / f"{name}.pem" for name in ("cert", "key", "ca")}
    shutil.copy(certs["server"], live["cert"])
    shutil.copy(certs["server_key"], live["key"])
    shutil.copy(certs["ca"], live["ca"])
    tls = ServerTls(TlsFiles(*(str(p) for p in live.values())), check_every=0)
    srv = ExtenderHTTPServer(("127.0.0.1", 0), extender(), tls=tls)
    serve_in_thread(srv)
    return srv, tls, live


def test_renewed_certificate_files_are_served_without_a_restart(
    certs: dict[str, Path], tmp_path: Path
) -> None:
    srv, tls, live = live_server(certs, tmp_path)

    def served_serial() -> str:
        context = client_context(certs)
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sock, \
                context.wrap_socket(sock, server_hostname=SERVER_NAME) as conn:
            return str(conn.getpeercert()["serialNumber"])  # type: ignore[index]

    try:
        first = served_serial()
        renewed = issue(tmp_path, (certs["ca"], certs["ca_key"]), "renewed", "serverAuth",
                        f"DNS:{SERVER_NAME}")
        # as the kubelet updates a Secret volume: new files in place
        shutil.copy(renewed[1], live["key"])
        live["cert"].write_bytes(b"-----BEGIN CERTIFICATE-----\nhalf")  # caught mid-write
        assert served_serial() == first and tls.reload_errors >= 1  # the old one stays
        shutil.copy(renewed[0], live["cert"])
        assert served_serial() != first and tls.reloads == 1
        assert https_filter(srv.port, client_context(certs))[0] == 200
    finally:
        srv.shutdown()
        srv.server_close()


def test_service_flags_tls_and_health_port(certs: dict[str, Path]) -> None:
    tls_args = ["--tls-cert-file", str(certs["server"]), "--tls-key-file",
                str(certs["server_key"]), "--tls-client-ca-file", str(certs["ca"])]
    base = ["--port", "0", "--address", "127.0.0.1", "--no-pod-watch"]
    with pytest.raises(ConfigError, match="go together"):
        build_service(build_parser().parse_args([*base, *tls_args[:4]]))
    with pytest.raises(ConfigError, match="cannot load"):
        build_service(build_parser().parse_args([*base, *tls_args[:5], str(certs["server"])[:-1]]))
    with pytest.raises(ConfigError, match="--max-connections-per-client"):
        build_service(build_parser().parse_args([*base, "--max-connections-per-client", "0"]))
    service = build_service(build_parser().parse_args([*base, *tls_args, "--health-port", "0"]))
    service.start()
    try:
        assert service.health is not None
        # the kubelet's probes: plain HTTP on the health port, no client certificate
        conn = http.client.HTTPConnection("127.0.0.1", service.health.port, timeout=10)
        conn.request("GET", "/healthz")
        resp = conn.getresponse()
        assert resp.status == 200 and resp.read()
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        assert "gpu_aware_tls_handshake_failures 0.0" in text
        assert "gpu_aware_refused_connections 0.0" in text
        conn.request("POST", "/filter", body=FILTER)  # the verbs are not served there
        resp = conn.getresponse()
        assert resp.status == 404 and "health port" in json.loads(resp.read())["Error"]
        conn.close()
        status, _ = https_filter(service.port, client_context(certs))
        assert status == 200  # served over TLS
    finally:
        service.close()


@pytest.mark.parametrize(("start", "end", "reason"), [
    ("20200101000000Z", "20200102000000Z", "client certificate expired"),
    ("20990101000000Z", "20990102000000Z", "client certificate not yet valid"),
])
def test_expired_and_not_yet_valid_client_certificates_are_refused_saying_which(
    tls_server: ExtenderHTTPServer, certs: dict[str, Path], tmp_path: Path,
    caplog: pytest.LogCaptureFixture, start: str, end: str, reason: str,
) -> None:
    cert, key = issue_dated(tmp_path, (certs["ca"], certs["ca_key"]), "dated", start, end)
    context = ssl.create_default_context(cafile=str(certs["ca"]))
    context.load_cert_chain(str(cert), str(key))
    with caplog.at_level(logging.WARNING, logger="gpuk8s.extender"), \
            pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException)):
        https_filter(tls_server.port, context)
    _wait_for(lambda: any(reason in r.getMessage() for r in caplog.records))
    assert https_filter(tls_server.port, client_context(certs))[0] == 200


def test_a_client_that_refuses_the_serving_certificate_name_is_logged(
    tls_server: ExtenderHTTPServer, certs: dict[str, Path], caplog: pytest.LogCaptureFixture,
) -> None:
    """Wrong SAN, the client's side: tlsConfig.serverName not in gpu-aware's certificate.
    Only the client can see it; gpu-aware logs the client's alert and says what to check."""
    context = client_context(certs)
    with caplog.at_level(logging.WARNING, logger="gpuk8s.extender"), \
            socket.create_connection(("127.0.0.1", tls_server.port), timeout=10) as sock, \
            pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
        context.wrap_socket(sock, server_hostname="elsewhere.example")
    _wait_for(lambda: any("refused gpu-aware's certificate" in r.getMessage()
                          and "tlsConfig.serverName" in r.getMessage()
                          for r in caplog.records))


def test_a_rotated_client_ca_is_picked_up_without_a_restart(
    certs: dict[str, Path], tmp_path: Path
) -> None:
    srv, tls, live = live_server(certs, tmp_path)
    try:
        new_ca = make_ca(tmp_path / "new", "new-ca")
        new_client = issue(tmp_path / "new", new_ca, "new-client", "clientAuth")
        context = ssl.create_default_context(cafile=str(certs["ca"]))
        context.load_cert_chain(str(new_client[0]), str(new_client[1]))
        with pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException)):
            https_filter(srv.port, context)  # not yet trusted
        # the rotation: both CAs in the bundle while clients move over
        live["ca"].write_bytes(certs["ca"].read_bytes() + new_ca[0].read_bytes())
        assert https_filter(srv.port, context)[0] == 200
        assert https_filter(srv.port, client_context(certs))[0] == 200
        assert tls.reloads == 1
    finally:
        srv.shutdown()
        srv.server_close()


def _wait_for(predicate: Any) -> None:
    deadline = time.monotonic() + 30  # the server's thread logs when it gets there
    while not predicate():
        assert time.monotonic() < deadline, "never happened"
        time.sleep(0.02)
