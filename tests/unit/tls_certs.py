"""Test certificates made by the real openssl (scripts/prereqs installs it): a CA, a
server certificate for gpu-aware and client certificates, as the chart issues them."""

from __future__ import annotations

import subprocess
from pathlib import Path

SERVER_NAME = "gpu-aware.metax-gpu-extensions.svc"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(directory: Path, name: str) -> tuple[Path, Path]:
    """(certificate, key) of a new self-signed CA."""
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2",
             "-subj", f"/CN={name}", cwd=directory)
    return cert, key


def issue(directory: Path, ca: tuple[Path, Path], name: str, usage: str,
          sans: str = "") -> tuple[Path, Path]:
    """(certificate, key) signed by ``ca``; ``usage`` serverAuth or clientAuth."""
    cert, key, csr = (directory / f"{name}.{ext}" for ext in ("crt", "key", "csr"))
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name}", cwd=directory)
    ext = directory / f"{name}.ext"
    lines = [f"extendedKeyUsage={usage}"] + ([f"subjectAltName={sans}"] if sans else [])
    ext.write_text("\n".join(lines) + "\n")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]),
             "-CAcreateserial", "-out", str(cert), "-days", "2", "-extfile", str(ext),
             cwd=directory)
    return cert, key


def server_set(directory: Path) -> dict[str, Path]:
    """A CA, gpu-aware's server certificate (DNS SERVER_NAME, IP 127.0.0.1), a client
    certificate from that CA and one from another CA."""
    ca = make_ca(directory, "ca")
    other = make_ca(directory, "other-ca")
    server = issue(directory, ca, "server", "serverAuth", f"DNS:{SERVER_NAME},IP:127.0.0.1")
    client = issue(directory, ca, "client", "clientAuth")
    stranger = issue(directory, other, "stranger", "clientAuth")
    return {"ca": ca[0], "ca_key": ca[1], "server": server[0], "server_key": server[1],
            "client": client[0], "client_key": client[1], "stranger": stranger[0],
            "stranger_key": stranger[1]}


def issue_dated(directory: Path, ca: tuple[Path, Path], name: str, start: str,
                end: str) -> tuple[Path, Path]:
    """A clientAuth certificate of ``ca`` valid from ``start`` to ``end`` (openssl's
    YYYYMMDDHHMMSSZ; ``openssl ca``: x509 -req of OpenSSL 3.0 cannot set the start)."""
    cert, key, csr = (directory / f"{name}.{ext}" for ext in ("crt", "key", "csr"))
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name}", cwd=directory)
    config = directory / f"{name}.cnf"
    config.write_text(f"[ca]\ndefault_ca = d\n[d]\ndatabase = {name}.db\nnew_certs_dir = .\n"
                      f"serial = {name}.srl\ndefault_md = sha256\npolicy = p\nunique_subject = no\n"
                      "[p]\ncommonName = supplied\n[x]\nextendedKeyUsage = clientAuth\n"
                      )
    (directory / f"{name}.db").write_text("")
    (directory / f"{name}.srl").write_text("01\n")
    _openssl("ca", "-batch", "-config", str(config), "-cert", str(ca[0]), "-keyfile",
             str(ca[1]), "-in", str(csr), "-out", str(cert), "-startdate", start, "-enddate",
             end, "-extensions", "x", "-notext", cwd=directory)
    return cert, key
