"""gpu-aware over HTTPS with client-certificate verification (mutual TLS).

kube-scheduler calls the extender with ``enableHTTPS: true`` and a ``tlsConfig``
(``certFile``/``keyFile``: its client certificate, ``caFile``: the CA that signed
gpu-aware's certificate, ``serverName``: the name in that certificate). gpu-aware
serves TLS 1.2 or newer with its own certificate and key, and requires every client
to present a certificate signed by the client CA (``ssl.CERT_REQUIRED``); a client
without one, or with one from another CA, fails the handshake and is never read.

Rotation: the files are re-read when they change (checked at most every
``CHECK_EVERY_S`` seconds, on the next connection), without a restart: a Secret
mounted as a volume is updated by the kubelet in place (an atomic swap of its
``..data`` link), so a renewed certificate is served within a minute or two of the
Secret's update. Connections already open keep the certificate they started with. A
file that cannot be read (half-written, say) keeps the previous context in use and is
logged; at start an unreadable file is a ``ConfigError``.

A refused handshake is logged with why (``refusal``): the client's certificate expired,
not yet valid, from another CA, none at all, or the client refused gpu-aware's own
certificate (its name -- the SAN that ``tlsConfig.serverName`` must match -- or its CA:
only the client can check those). gpu-aware checks no name in the client's certificate:
the client CA is the chart's own, issued for kube-scheduler alone, so its signature is
the identity. At most one line per reason every ``LOG_EVERY_S`` seconds (with the count
since), so a flood of bad handshakes cannot flood the log.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ...core.errors import ConfigError

log = logging.getLogger("gpuk8s.extender")

CHECK_EVERY_S = 10.0
LOG_EVERY_S = 60.0

# OpenSSL's X509_V_ERR_* codes the server sees for the client's certificate
_VERIFY_REASONS = {
    9: "client certificate not yet valid",
    10: "client certificate expired",
    2: "client certificate from another CA",
    18: "client certificate from another CA (self-signed)",
    19: "client certificate from another CA (self-signed chain)",
    20: "client certificate from another CA",
    21: "client certificate from another CA",
}


def refusal(err: BaseException) -> str:
    """Why a handshake failed, in words a person can act on (the log line's reason)."""
    code = getattr(err, "verify_code", None)
    if isinstance(code, int) and code in _VERIFY_REASONS:
        return _VERIFY_REASONS[code]
    if isinstance(err, ssl.SSLCertVerificationError):
        return f"client certificate refused ({err.verify_message})"
    reason = str(getattr(err, "reason", "") or "")
    if reason == "PEER_DID_NOT_RETURN_A_CERTIFICATE":
        return "no client certificate"
    if reason.endswith("ALERT_BAD_CERTIFICATE") or reason.endswith("ALERT_UNKNOWN_CA") \
            or reason.endswith("ALERT_CERTIFICATE_EXPIRED") \
            or reason.endswith("ALERT_CERTIFICATE_UNKNOWN"):
        return (f"the client refused gpu-aware's certificate ({reason.lower()}): its SAN must "
                "name tlsConfig.serverName and its CA be tlsConfig.caFile")
    unfinished = (ssl.SSLZeroReturnError, ssl.SSLEOFError)
    if isinstance(err, unfinished) or not isinstance(err, ssl.SSLError):  # timeout, reset
        return "handshake not finished (timeout or connection closed)"
    return f"handshake failed ({reason.lower() or type(err).__name__})"


@dataclass(frozen=True)
class TlsFiles:
    cert: str  # server certificate (chain), PEM
    key: str  # its private key, PEM
    client_ca: str  # CA bundle that signs the clients' certificates, PEM


def _stamp(path: str) -> tuple[int, int, int]:
    st = os.stat(path)
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class ServerTls:
    """The server's ``SSLContext``, rebuilt when the files change."""

    def __init__(
        self,
        files: TlsFiles,
        check_every: float = CHECK_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.files = files
        self.check_every = check_every
        self._clock = clock
        self._lock = threading.Lock()
        self.reloads = 0
        self.reload_errors = 0
        self.handshake_failures = 0
        self._logged: dict[str, tuple[float, int]] = {}  # reason -> (last logged, since)
        try:
            self._stamps = self._read_stamps()
            self._context = self._load()
        except (OSError, ssl.SSLError) as err:
            raise ConfigError(
                f"--tls-cert-file/--tls-key-file/--tls-client-ca-file: cannot load "
                f"{files.cert}, {files.key}, {files.client_ca}: {err}"
            ) from err
        self._checked = clock()

    def _read_stamps(self) -> tuple[tuple[int, int, int], ...]:
        return tuple(_stamp(p) for p in (self.files.cert, self.files.key, self.files.client_ca))

    def _load(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.files.cert, self.files.key)
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cafile=self.files.client_ca)
        return context

    def context(self) -> ssl.SSLContext:
        """The current context (the files re-read when they changed)."""
        now = self._clock()
        if now - self._checked < self.check_every:
            return self._context
        with self._lock:
            if now - self._checked < self.check_every:
                return self._context
            self._checked = now
            try:
                stamps = self._read_stamps()
                if stamps != self._stamps:
                    self._context = self._load()
                    self._stamps = stamps
                    self.reloads += 1
                    log.info("TLS certificate files reloaded", extra={"cert": self.files.cert})
            except (OSError, ssl.SSLError) as err:
                self.reload_errors += 1
                log.warning(
                    "TLS certificate files unreadable; serving the previous ones",
                    extra={"error": str(err)[:300]},
                )
            return self._context

    def refused(self, err: BaseException, client: str) -> str:
        """Count a refused handshake and log why (rate-limited per reason); the reason."""
        reason = refusal(err)
        self.handshake_failures += 1
        now = self._clock()
        with self._lock:
            last, since = self._logged.get(reason, (float("-inf"), 0))
            if now - last < LOG_EVERY_S:
                self._logged[reason] = (last, since + 1)
                return reason
            self._logged[reason] = (now, 0)
        log.warning("TLS handshake refused: %s", reason,
                    extra={"client": client, "error": str(err)[:200], "more_since_last": since})
        return reason
