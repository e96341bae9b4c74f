"""lab/fake_nodes.py's API client: the kubeconfig's client key is written to disk only
while ssl loads it, and removed before the client is used."""

from __future__ import annotations

import base64
import tempfile
from pathlib import Path

import pytest
import yaml

from . import tls_certs

LAB = Path(__file__).resolve().parents[2] / "lab"


def test_the_client_key_does_not_outlive_loading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    certs = tls_certs.server_set(tmp_path / "certs")
    data = {k: base64.b64encode(certs[k].read_bytes()).decode() for k in certs}
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "clusters": [{"name": "c", "cluster": {
            "server": "https://127.0.0.1:6443", "certificate-authority-data": data["ca"]}}],
        "users": [{"name": "u", "user": {
            "client-certificate-data": data["client"], "client-key-data": data["client_key"]}}],
    }))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    monkeypatch.syspath_prepend(str(LAB))
    import fake_nodes

    api = fake_nodes.Api(str(kubeconfig))
    assert api.ctx is not None and (api.host, api.port) == ("127.0.0.1", 6443)
    assert list(scratch.iterdir()) == []  # nothing left: no key, no directory


def test_a_token_kubeconfig_sends_the_bearer_token_to_a_verified_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A private API server's kubeconfig (the integration tier's: a bearer token): every
    request and watch carries the token; the server is checked against the CA data."""
    import http.server
    import ssl
    import threading

    certs = tls_certs.server_set(tmp_path / "certs")
    seen: list[tuple[str, str | None]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            seen.append((self.path, self.headers.get("Authorization")))
            body = b'{"kind": "NodeList", "items": []}\n'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(certs["server"], certs["server_key"])
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        kubeconfig = tmp_path / "kubeconfig"
        ca = base64.b64encode(certs["ca"].read_bytes()).decode()
        kubeconfig.write_text(yaml.safe_dump({
            "clusters": [{"name": "c", "cluster": {
                "server": f"https://127.0.0.1:{server.server_address[1]}",
                "certificate-authority-data": ca}}],
            "users": [{"name": "u", "user": {"token": "s3cret"}}],
        }))
        monkeypatch.syspath_prepend(str(LAB))
        import fake_nodes

        api = fake_nodes.Api(str(kubeconfig))
        assert api.request("GET", "/api/v1/nodes") == (200, {"kind": "NodeList", "items": []})
        assert next(api.watch("/api/v1/nodes?watch=1"))["kind"] == "NodeList"
        assert seen == [("/api/v1/nodes", "Bearer s3cret"),
                        ("/api/v1/nodes?watch=1", "Bearer s3cret")]
        # a CA that did not sign the server's certificate: refused
        other = base64.b64encode(certs["stranger"].read_bytes()).decode()
        kubeconfig.write_text(kubeconfig.read_text().replace(ca, other))
        with pytest.raises(ssl.SSLError):
            fake_nodes.Api(str(kubeconfig)).request("GET", "/api/v1/nodes")
    finally:
        server.shutdown()
        server.server_close()
