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
