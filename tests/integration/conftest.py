"""A real control plane for the integration tier: etcd + kube-apiserver, RBAC on.

``apiserver`` (session scope) starts etcd and the lab's kube-apiserver on free
loopback ports with static tokens and yields an ``ApiServer`` with kubeconfigs for
these users:

==============  =================  ==========================================
user            groups             RBAC granted by the fixture
==============  =================  ==========================================
``admin``       system:masters     everything
``gpu-label``   gpuk8s-test        nodes: get, patch (the labeller's ClusterRole)
``gpu-device``  gpuk8s-test        nodes: get, patch (the device plugin's)
``gpu-aware``   gpuk8s-test        nodes, pods: get, list, watch; pods: patch;
                                   pods/binding: create (the extender's)
``gpu-dra``     gpuk8s-test        resourceslices: all verbs; resourceclaims: get;
                                   nodes: get (the DRA driver's)
``nobody``      gpuk8s-test        nothing
==============  =================  ==========================================

The apiserver runs with the lab's feature gates and runtime config for its release
(``KUBE_FEATURE_GATES_v1_<minor>``, ``KUBE_RUNTIME_CONFIG_v1_<minor>`` in lab/versions.env: the
DRA parts gpu-dra uses). The release is the lab's (the one ``lab/up --kube`` brought it up
with), else versions.env's ``KUBE_VERSION``; ``GPUK8S_KUBE_VERSION=v1.35.4`` runs the tier on
another release the lab knows (``KUBE_VERSIONS``; lab/versions.py resolves it).

Binaries: kube-apiserver from ``$GPUK8S_CACHE/bin/kube-<KUBE_VERSION>/`` (built by
``lab/tools.sh kube``; any ``kube-*`` there or on PATH as a fallback, except when
``GPUK8S_KUBE_VERSION`` or the lab's record names the release: then only that one), etcd from
``$GPUK8S_CACHE/bin/etcd-<ETCD_VERSION>/`` (``lab/tools.sh etcd``), else ``etcd`` on
PATH (Debian: ``apt-get install etcd-server``). Tests using the fixture skip only when
one of these (or openssl) is missing, and the skip names what is missing.

``helm_binary`` (session scope) is the path of helm: ``$GPUK8S_HELM``, else what
``lab/tools.sh helm`` prints (it builds helm once), else ``helm`` on PATH; tests using
it skip when there is none. ``helm`` runs it as the admin of ``apiserver``; ``charts``
packages both charts (at ``CHART_VERSION``) as `make package` does.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
CHART_VERSION = "1.2.3"
CACHE_BIN = Path(os.environ.get("GPUK8S_CACHE", "/var/cache/gpuk8s")) / "bin"
USERS = {
    "admin": ("admin-token", "system:masters"),
    "gpu-label": ("label-token", "gpuk8s-test"),
    "gpu-device": ("device-token", "gpuk8s-test"),
    "gpu-aware": ("aware-token", "gpuk8s-test"),
    "gpu-dra": ("dra-token", "gpuk8s-test"),
    "nobody": ("nobody-token", "gpuk8s-test"),
}
ROLES = {
    "gpu-dra": [
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"],
         "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
    ],
    "gpu-label": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}],
    "gpu-device": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}],
    "gpu-aware": [
        {"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["get", "list", "watch"]},
        # GPU sharing: the bind verb records the GPU choice on the pod, then binds it
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]},
        {"apiGroups": [""], "resources": ["pods/binding"], "verbs": ["create"]},
    ],
}


sys.path.insert(0, str(REPO / "lab"))
try:
    import versions as versions_py  # lab/versions.py (lab_versions is a fixture below)
finally:
    sys.path.remove(str(REPO / "lab"))


def _pinned_versions() -> dict[str, str]:
    """lab/versions.env for the release this run uses (lab/versions.py: GPUK8S_KUBE_VERSION,
    else the lab's release, else KUBE_VERSION)."""
    resolved: dict[str, str] = versions_py.load()
    return resolved


def _release_chosen() -> bool:
    """GPUK8S_KUBE_VERSION or the lab's record named the release (no other may stand in)."""
    return bool(versions_py.chosen(os.environ))


def find_binary(name: str, pinned_dir: str | None) -> str | None:
    """``name`` in the pinned cache dir, else any cached version, else on PATH; only the
    pinned dir for Kubernetes programs when the release was chosen (``_release_chosen``)."""
    candidates = []
    if pinned_dir:
        candidates.append(CACHE_BIN / pinned_dir / name)
        if pinned_dir.startswith("kube-") and _release_chosen():
            path = candidates[0]
            return str(path) if path.is_file() and os.access(path, os.X_OK) else None
    prefix = pinned_dir.split("-")[0] if pinned_dir else name
    candidates += [
        Path(p) for p in sorted(glob.glob(f"{CACHE_BIN}/{prefix}-*/{name}"), reverse=True)
    ]
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    return shutil.which(name)


def find_helm() -> str | None:
    """helm from ``$GPUK8S_HELM``, else ``lab/tools.sh helm``, else PATH; None if none."""
    if os.environ.get("GPUK8S_HELM"):
        return os.environ["GPUK8S_HELM"]
    tools = REPO / "lab" / "tools.sh"
    if tools.exists():
        proc = subprocess.run(
            ["bash", str(tools), "helm"], capture_output=True, text=True, check=False
        )
        if proc.returncode == 0 and os.access(proc.stdout.strip(), os.X_OK):
            return proc.stdout.strip()
    return shutil.which("helm")


@pytest.fixture(scope="session")
def helm_binary() -> str:
    path = find_helm()
    if not path:
        pytest.skip("helm not available (lab/tools.sh helm or GPUK8S_HELM)")
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def write_kubeconfig(path: Path, port: int, token: str) -> str:
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        "clusters:\n- name: test\n  cluster:\n"
        f"    server: https://127.0.0.1:{port}\n    insecure-skip-tls-verify: true\n"
        f"users:\n- name: u\n  user:\n    token: {token}\n"
        "contexts:\n- name: c\n  context: {cluster: test, user: u}\ncurrent-context: c\n"
    )
    return str(path)


@dataclass
class ApiServer:
    port: int
    workdir: Path
    kubeconfigs: dict[str, str]

    def binary(self, name: str) -> str | None:
        """Another Kubernetes program of the same build (kube-scheduler, kubectl...)."""
        versions = _pinned_versions()
        pinned = f"kube-{versions['KUBE_VERSION']}" if "KUBE_VERSION" in versions else None
        return find_binary(name, pinned)

    def kubeconfig(self, user: str) -> str:
        return self.kubeconfigs[user]

    def token_kubeconfig(self, name: str, token: str) -> str:
        """A kubeconfig file that authenticates with ``token`` (e.g. a ServiceAccount
        token from the TokenRequest API)."""
        return write_kubeconfig(self.workdir / f"{name}.kubeconfig", self.port, token)

    def core(self, user: str = "admin") -> Any:
        from kubernetes import client

        from gpuk8s.services.kube import api_client

        return client.CoreV1Api(api_client(self.kubeconfigs[user]))


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.fixture(scope="module")
def cdi_check() -> str:
    """The reference CDI library's checker (gpuk8s-cdi-check: validate, inject), built by
    lab/tools.sh cdi."""
    out = subprocess.run([str(REPO / "lab" / "tools.sh"), "cdi"], capture_output=True,
                         text=True, timeout=900, check=True)
    return out.stdout.strip()


@pytest.fixture(scope="session")
def lab_versions() -> dict[str, str]:
    """lab/versions.env: pinned versions and the lab's feature gates."""
    return _pinned_versions()


@pytest.fixture(scope="session")
def wait_until() -> Any:
    """``wait_until(predicate, timeout, what)``: poll until true, else fail naming ``what``."""
    return _wait


@pytest.fixture(scope="session")
def apiserver() -> Iterator[ApiServer]:
    versions = _pinned_versions()
    kube_dir = f"kube-{versions['KUBE_VERSION']}" if "KUBE_VERSION" in versions else None
    etcd_dir = f"etcd-{versions['ETCD_VERSION']}" if "ETCD_VERSION" in versions else None
    apiserver_bin = find_binary("kube-apiserver", kube_dir)
    etcd_bin = find_binary("etcd", etcd_dir)
    missing = [
        what
        for what, found in (
            (
                f"kube-apiserver (build it with lab/tools.sh kube; looked in {CACHE_BIN} and PATH)",
                apiserver_bin,
            ),
            (
                f"etcd (lab/tools.sh etcd, or apt-get install etcd-server; looked in {CACHE_BIN} "
                "and PATH)",
                etcd_bin,
            ),
            ("openssl", shutil.which("openssl")),
        )
        if not found
    ]
    if missing:
        pytest.skip("integration tier needs " + "; ".join(missing))
    assert apiserver_bin is not None and etcd_bin is not None

    work = Path(tempfile.mkdtemp(prefix="gpuk8s-apiserver-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        with open(work / "etcd.log", "wb") as log:
            procs.append(
                subprocess.Popen(
                    [
                        etcd_bin,
                        "--data-dir",
                        str(work / "etcd"),
                        "--listen-client-urls",
                        f"http://127.0.0.1:{etcd_port}",
                        "--advertise-client-urls",
                        f"http://127.0.0.1:{etcd_port}",
                        "--listen-peer-urls",
                        f"http://127.0.0.1:{peer_port}",
                        "--initial-advertise-peer-urls",
                        f"http://127.0.0.1:{peer_port}",
                        "--initial-cluster",
                        f"default=http://127.0.0.1:{peer_port}",
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        subprocess.run(
            ["openssl", "genrsa", "-out", str(work / "sa.key"), "2048"],
            check=True,
            capture_output=True,
        )
        subprocess.run(
            [
                "openssl",
                "rsa",
                "-in",
                str(work / "sa.key"),
                "-pubout",
                "-out",
                str(work / "sa.pub"),
            ],
            check=True,
            capture_output=True,
        )
        (work / "tokens.csv").write_text(
            "".join(
                f'{token},{user},uid-{user},"{group}"\n' for user, (token, group) in USERS.items()
            )
        )
        with open(work / "apiserver.log", "wb") as log:
            procs.append(
                subprocess.Popen(
                    [
                        apiserver_bin,
                        f"--etcd-servers=http://127.0.0.1:{etcd_port}",
                        "--bind-address=127.0.0.1",
                        f"--secure-port={api_port}",
                        f"--cert-dir={work / 'certs'}",
                        f"--token-auth-file={work / 'tokens.csv'}",
                        "--authorization-mode=RBAC",
                        "--allow-privileged=true",  # SPEC §1: both schemes need privileged pods
                        f"--service-account-key-file={work / 'sa.pub'}",
                        f"--service-account-signing-key-file={work / 'sa.key'}",
                        "--service-account-issuer=https://kubernetes.default.svc",
                        "--service-cluster-ip-range=10.96.0.0/16",
                        "--enable-priority-and-fairness=false",
                        # the lab's DRA gates (lab/versions.env), so gpu-dra's slices and
                        # DeviceClasses are judged as the lab's apiserver judges them
                        *[f"--feature-gates={g}" for g in [versions.get("KUBE_FEATURE_GATES")]
                          if g],
                        *[f"--runtime-config={r}" for r in [versions.get("KUBE_RUNTIME_CONFIG")]
                          if r],
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        kubeconfigs = {
            user: write_kubeconfig(work / f"{user}.kubeconfig", api_port, token)
            for user, (token, _) in USERS.items()
        }
        server = ApiServer(api_port, work, kubeconfigs)
        core = server.core()

        def ready() -> bool:
            for proc in procs:
                if proc.poll() is not None:
                    raise AssertionError(
                        f"{proc.args[0]} exited with {proc.returncode}:\n"
                        + (work / "etcd.log").read_text(errors="replace")[-2000:]
                        + (work / "apiserver.log").read_text(errors="replace")[-3000:]
                    )
            try:
                core.list_namespace()
                core.read_namespace("default")
                return True
            except Exception:
                return False

        _wait(ready, 180, "kube-apiserver to answer")
        from kubernetes import client

        from gpuk8s.services.kube import api_client

        admin = api_client(kubeconfigs["admin"])
        if _release_chosen():  # the release asked for, not a fallback
            served = client.VersionApi(admin).get_code().git_version
            assert served == versions["KUBE_VERSION"], (served, apiserver_bin)
        rbac = client.RbacAuthorizationV1Api(admin)
        for name, rules in ROLES.items():
            rbac.create_cluster_role({"metadata": {"name": name}, "rules": rules})
            rbac.create_cluster_role_binding(
                {
                    "metadata": {"name": name},
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "ClusterRole",
                        "name": name,
                    },
                    "subjects": [
                        {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": name}
                    ],
                }
            )
        # no controller-manager here: the ServiceAccount admission needs "default" to exist
        core.create_namespaced_service_account("default", {"metadata": {"name": "default"}})
        yield server
    finally:
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="session")
def helm(apiserver: Any, helm_binary: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """helm as the cluster admin, with its own config and cache dirs."""
    home = tmp_path_factory.mktemp("helm")
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
        "KUBECONFIG": apiserver.kubeconfig("admin"),
    }

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [helm_binary, *args], capture_output=True, text=True, check=False, env=env, timeout=300
        )
        if "privileged: Forbidden: disallowed by cluster policy" in proc.stderr:
            # Both schemes need privileged pods (SPEC §1): a cluster without them is not
            # one these charts support, so this is the fixture's setup, not a chart bug.
            if args[0] == "install":  # leave the shared API server as we found it
                ns = args[args.index("-n") + 1]
                subprocess.run(
                    [helm_binary, "uninstall", args[1], "-n", ns],
                    env=env,
                    capture_output=True,
                    check=False,
                    timeout=120,
                )
            pytest.skip(
                "the apiserver fixture runs kube-apiserver without --allow-privileged=true, "
                "which SPEC §1 requires (tests/integration/conftest.py)"
            )
        if check:
            assert proc.returncode == 0, f"helm {args}\n{proc.stdout}\n{proc.stderr}"
        return proc

    return run


@pytest.fixture(scope="session")
def charts(helm: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Both charts packaged the way `make package` does (helm package), at version
    CHART_VERSION: chart name -> .tgz path."""
    out = tmp_path_factory.mktemp("charts")
    paths = {}
    for chart in ("metax-gpu-extensions", "metax-operator"):
        helm(
            "package",
            str(REPO / "charts" / chart),
            "--version",
            CHART_VERSION,
            "--app-version",
            CHART_VERSION,
            "-d",
            str(out),
        )
        paths[chart] = str(out / f"{chart}-{CHART_VERSION}.tgz")
    return paths
