"""Kubernetes API access shared by the services: one client builder, one error split.

``api_client(kubeconfig)`` builds a ``kubernetes.client.ApiClient`` without touching the
library's process-wide default configuration, from (first that applies):

1. an explicit kubeconfig path (the services' ``--kubeconfig`` flag);
2. the in-cluster service account (``KUBERNETES_SERVICE_HOST`` is set);
3. ``$KUBECONFIG`` (first path of the list), then ``~/.kube/config``.

``classify(err)`` turns whatever the client raised into a ``TemporaryApiError`` (retry
with backoff: timeouts, connection failures, 409/429/5xx) or a ``PermanentApiError``
(retrying the same call will not help: 400/401/403/404/422, unparsable answers).

``body(resp)`` reads the answer of a call made with ``_preload_content=False`` and gives
its connection back to the client's pool. An answer nobody reads keeps its connection, so
the next call opens a new one (a TCP and TLS handshake on both ends); every such call
goes through it, writes included.
"""

from __future__ import annotations

import os
from typing import Any

from ..core.errors import ConfigError, GpuK8sError

# statuses worth retrying: conflict (stale resourceVersion), throttled, server trouble
TEMPORARY_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


class ApiError(GpuK8sError):
    """A Kubernetes API call failed. ``status`` is the HTTP status (None: no answer)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class TemporaryApiError(ApiError):
    """Retrying later may succeed (back off with jitter)."""


class PermanentApiError(ApiError):
    """Retrying the same call will not help until someone changes something."""


def _kubeconfig_candidates() -> list[str]:
    paths: list[str] = []
    env = os.environ.get("KUBECONFIG", "")
    for item in env.split(os.pathsep):
        if item:
            paths.append(item)
    paths.append(os.path.expanduser("~/.kube/config"))
    return paths


def api_client(kubeconfig: str | None = None, *, context: str | None = None) -> Any:
    """A ready ``kubernetes.client.ApiClient``; ``ConfigError`` when none can be built."""
    from kubernetes import client, config

    configuration = client.Configuration()
    try:
        if kubeconfig:
            if not os.path.isfile(kubeconfig):
                raise ConfigError(f"--kubeconfig: {kubeconfig!r} does not exist or is not a file")
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig,
                context=context,
                client_configuration=configuration,
                persist_config=False,
            )
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration
            )
        else:
            found = next((p for p in _kubeconfig_candidates() if os.path.isfile(p)), None)
            if found is None:
                raise ConfigError(
                    "no Kubernetes API configuration: pass --kubeconfig PATH, set KUBECONFIG, "
                    "or run in a pod (in-cluster service account)"
                )
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=found,
                context=context,
                client_configuration=configuration,
                persist_config=False,
            )
    except ConfigError:
        raise
    except config.ConfigException as err:
        raise ConfigError(f"cannot load the Kubernetes API configuration: {err}") from err
    return client.ApiClient(configuration)


def _api_message(err: Any) -> str:
    """The apiserver's own message from an ApiException body, else its reason."""
    import json

    body = getattr(err, "body", None)
    if body:
        try:
            data = json.loads(body)
        except (TypeError, ValueError):
            data = None
        if isinstance(data, dict) and isinstance(data.get("message"), str):
            return str(data["message"])
    return str(getattr(err, "reason", "") or err)


def classify(err: BaseException, action: str) -> ApiError:
    """``err`` (raised by the kubernetes client during ``action``) as a typed error."""
    if isinstance(err, ApiError):
        return err
    from kubernetes.client.exceptions import ApiException

    if isinstance(err, ApiException):
        status = int(err.status) if err.status else None
        text = f"{action}: HTTP {status}: {_api_message(err)}"
        if status is None or status in TEMPORARY_STATUSES:
            return TemporaryApiError(text, status)
        return PermanentApiError(text, status)
    try:
        import urllib3.exceptions as u3

        network: tuple[type[BaseException], ...] = (u3.HTTPError, OSError, TimeoutError)
    except ImportError:  # pragma: no cover - urllib3 ships with the kubernetes client
        network = (OSError, TimeoutError)
    if isinstance(err, network):
        return TemporaryApiError(f"{action}: cannot reach the API server: {err}")
    return PermanentApiError(f"{action}: {type(err).__name__}: {err}")


def body(resp: Any) -> bytes:
    """The body of a ``_preload_content=False`` answer (urllib3's ``HTTPResponse``), read
    to its end; its connection goes back to the pool for the next call to reuse."""
    try:
        data: bytes = resp.data
    finally:
        resp.release_conn()
    return data


IN_CLUSTER_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and os.path.isfile(
        os.path.join(IN_CLUSTER_DIR, "token"))


class InClusterReader:
    """Read-only ``GET``s from inside a pod with the service account, stdlib only.

    For node agents whose memory budget the official client (about 30 MB once imported)
    would blow: the exporter's one list call. Same errors as ``classify``: temporary
    (no answer, 408/409/425/429/5xx) or permanent. The token file is re-read on every
    call (kubelet-rotated bound tokens).
    """

    def __init__(self, secrets_dir: str = IN_CLUSTER_DIR, host: str | None = None,
                 port: int | None = None) -> None:
        self.secrets_dir = secrets_dir
        host = host or os.environ.get("KUBERNETES_SERVICE_HOST", "")
        port = port or int(os.environ.get("KUBERNETES_SERVICE_PORT", "443"))
        if not host:
            raise ConfigError("not in a pod: KUBERNETES_SERVICE_HOST is not set")
        self.base = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"

    def get_json(self, path: str, timeout: float = 10.0) -> Any:
        import json
        import ssl
        import urllib.error
        import urllib.request

        try:
            with open(os.path.join(self.secrets_dir, "token"), encoding="utf-8") as handle:
                token = handle.read().strip()
            context = ssl.create_default_context(cafile=os.path.join(self.secrets_dir, "ca.crt"))
        except OSError as err:
            raise PermanentApiError(f"GET {path}: service account files unreadable: {err}") \
                from err
        request = urllib.request.Request(self.base + path, headers={
            "Authorization": f"Bearer {token}", "Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout, context=context) as resp:
                return json.load(resp)
        except urllib.error.HTTPError as err:
            text = f"GET {path}: HTTP {err.code}: {err.reason}"
            if err.code in TEMPORARY_STATUSES:
                raise TemporaryApiError(text, err.code) from err
            raise PermanentApiError(text, err.code) from err
        except (OSError, ValueError) as err:  # URLError, timeouts, a truncated body
            raise TemporaryApiError(f"GET {path}: cannot reach the API server: {err}") from err
