"""gpu-aware in the charts (issue 26): HTTPS with client certificates made by the chart,
the plain-HTTP health port, the NetworkPolicy, and the plain-HTTP option. The
certificates are checked by a real TLS stack: gpu-aware's own server loads the rendered
Secret and a client holding kube-scheduler's Secret calls it (helm upgrade behaviour,
lookup included, runs against a real API server in
tests/integration/test_package_install.py)."""

from __future__ import annotations

import base64
import http.client
import socket
import ssl
from pathlib import Path
from typing import Any

import pytest

from gpuk8s.services.extender.server import ExtenderHTTPServer, serve_in_thread
from gpuk8s.services.extender.tls import ServerTls, TlsFiles

from .test_charts import (
    EXT,
    NS,
    OP,
    OP_MIN,
    container,
    flags,
    mounts,
    objs,
    render_error,
    run_helm,
    volumes,
)
from .test_extender_hostile import extender

ON = {"deployExtenderGPUAware": True}


def secret_files(rendered: Any, name: str, directory: Path) -> dict[str, str]:
    out = {}
    for key, value in rendered.get("Secret", name)["data"].items():
        path = directory / f"{name}-{key}"
        path.write_bytes(base64.b64decode(value))
        out[key] = str(path)
    return out


@pytest.mark.parametrize("chart,values", [(EXT, ON), (OP, {**OP_MIN, **ON})],
                         ids=["extensions", "operator"])
def test_tls_by_default_with_certificates_a_real_tls_stack_accepts(
    chart: Path, values: dict[str, Any], tmp_path: Path
) -> None:
    rendered = objs(chart, values)
    dep = rendered.get("Deployment", "gpu-aware")
    c = container(dep)
    f = flags(c)
    assert f["tls-cert-file"] == "/etc/gpu-aware-tls/tls.crt"
    assert f["tls-key-file"] == "/etc/gpu-aware-tls/tls.key"
    assert f["tls-client-ca-file"] == "/etc/gpu-aware-tls/client-ca.crt"
    assert f["health-port"] == "8081"
    m = mounts(dep)["/etc/gpu-aware-tls"]
    assert m["readOnly"] is True
    secret = volumes(dep)[m["name"]]["secret"]
    assert secret["secretName"] == "gpu-aware-tls"
    # the non-root user reads its key (the lab's first run: root-owned 0440 files, and
    # gpu-aware exited at start): through the pod's fsGroup, and nobody else
    uid = c["securityContext"]["runAsUser"]
    assert uid == 65532 and dep["spec"]["template"]["spec"]["securityContext"]["fsGroup"] == uid
    assert secret["defaultMode"] & 0o040 and not secret["defaultMode"] & 0o007
    assert rendered.get("Service", "gpu-aware")["spec"]["ports"][0]["name"] == "https"
    client = rendered.get("Secret", "gpu-aware-scheduler-client")
    assert client["type"] == "kubernetes.io/tls"
    assert client["metadata"]["annotations"]["metax-tech.com/server-name"] == (
        f"gpu-aware.{NS}.svc")
    server = secret_files(rendered, "gpu-aware-tls", tmp_path)
    scheduler = secret_files(rendered, "gpu-aware-scheduler-client", tmp_path)
    tls = ServerTls(TlsFiles(server["tls.crt"], server["tls.key"], server["client-ca.crt"]))
    srv = ExtenderHTTPServer(("127.0.0.1", 0), extender(), tls=tls)
    serve_in_thread(srv)
    try:
        def healthz(cert: str, key: str) -> int:
            context = ssl.create_default_context(cafile=scheduler["ca.crt"])
            context.load_cert_chain(cert, key)
            conn = http.client.HTTPSConnection("127.0.0.1", srv.port, timeout=10)
            conn.sock = context.wrap_socket(socket.create_connection(("127.0.0.1", srv.port)),
                                            server_hostname=f"gpu-aware.{NS}.svc")
            try:
                conn.request("GET", "/healthz")
                return conn.getresponse().status
            finally:
                conn.close()

        # kube-scheduler's Secret: trusted, and it trusts gpu-aware under the service name
        assert healthz(scheduler["tls.crt"], scheduler["tls.key"]) == 200
        # gpu-aware's own certificate is no client certificate: the two CAs differ
        with pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException)):
            healthz(server["tls.crt"], server["tls.key"])
    finally:
        srv.shutdown()
        srv.server_close()


def test_plain_http_is_an_explicit_option() -> None:
    rendered = objs(EXT, {**ON, "gpuAware": {"tls": {"enabled": False}}})
    assert not [d for d in rendered.docs if d["kind"] == "Secret"]
    c = container(rendered.get("Deployment", "gpu-aware"))
    assert not [a for a in c["args"] if a.startswith("--tls-")]
    assert rendered.get("Service", "gpu-aware")["spec"]["ports"][0]["name"] == "http"
    assert c["readinessProbe"]["httpGet"]["port"] == "health"


@pytest.mark.parametrize("chart,values", [(EXT, ON), (OP, {**OP_MIN, **ON})],
                         ids=["extensions", "operator"])
def test_network_policy_fails_closed(chart: Path, values: dict[str, Any]) -> None:
    """helm template has no cluster to look kube-scheduler's hosts up in (issue 50: it
    rendered no policy then, and the TLS Secrets all the same): the render stops, naming
    the value to set, unless the policy is turned off on purpose."""
    unknown = {**values, "gpuAware": {"networkPolicy": {"controlPlaneCIDRs": []}}}
    err = render_error(chart, unknown)
    assert "gpuAware.networkPolicy.controlPlaneCIDRs" in err
    assert "gpuAware.networkPolicy.enabled=false" in err
    off = objs(chart, {**values, "gpuAware": {"networkPolicy": {
        "enabled": False, "controlPlaneCIDRs": []}}})
    assert not off.of("NetworkPolicy")
    assert off.get("Deployment", "gpu-aware")
    # said on purpose, and said again after the install
    proc = run_helm(["install", "r", str(chart), "-n", NS, "--dry-run=client"],
                    {**values, "gpuAware": {"networkPolicy": {"enabled": False}}})
    assert proc.returncode == 0, proc.stderr
    assert "WARNING: no NetworkPolicy for gpu-aware" in proc.stdout.split("NOTES:", 1)[1]
    # every render that deploys gpu-aware with the policy on has it
    assert len(objs(chart, values).of("NetworkPolicy")) == 1


def test_network_policy_admits_only_the_scheduler_hosts() -> None:
    rendered = objs(EXT, {**ON, "gpuAware": {"networkPolicy": {
        "controlPlaneCIDRs": ["192.0.2.10/32", "198.51.100.7/32"]}}})
    [policy] = rendered.of("NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == "gpu-aware"
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    # the extender port from those hosts only; the health port from the release's own helm
    # test pod only (the kubelet's probes come from the pod's own node, which NetworkPolicy
    # always admits)
    release = policy["metadata"]["labels"]["app.kubernetes.io/instance"]
    test_pod = {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "gpu-test",
                                                "app.kubernetes.io/instance": release}}}
    extender_port, health_port = policy["spec"]["ingress"]
    assert health_port == {"ports": [{"port": 8081, "protocol": "TCP"}], "from": [test_pod]}
    assert extender_port["ports"] == [{"port": 8080, "protocol": "TCP"}]
    assert extender_port["from"] == [{"ipBlock": {"cidr": "192.0.2.10/32"}},
                                     {"ipBlock": {"cidr": "198.51.100.7/32"}}]
    # Prometheus (/metrics on the health port) where it is said to be
    peer = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    scraped = objs(EXT, {**ON, "gpuAware": {"networkPolicy": {"healthFrom": [peer]}}})
    _extender, health = scraped.get("NetworkPolicy", "gpu-aware")["spec"]["ingress"]
    assert health == {"ports": [{"port": 8081, "protocol": "TCP"}], "from": [test_pod, peer]}


@pytest.mark.parametrize(
    ("values", "needle"),
    [({"tls": {"renewBeforeDays": 400}}, "renewBeforeDays (400) must be less than"),
     ({"healthPort": 8080}, "healthPort"),
     ({"networkPolicy": {"controlPlaneCIDRs": ["10.0.0.1"]}}, "controlPlaneCIDRs"),
     ({"networkPolicy": {"healthFrom": [{}]}}, "healthFrom"),
     ({"networkPolicy": {"healthFrom": [{"namespaces": "all"}]}}, "healthFrom"),
     ({"tls": {"enabled": "yes"}}, "enabled")],
)
def test_bad_tls_and_policy_values_are_refused(values: dict[str, Any], needle: str) -> None:
    assert needle in render_error(EXT, {**ON, "gpuAware": values})
