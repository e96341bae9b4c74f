"""Fixtures for the end-to-end tests on the lab (lab/up).

The whole directory is skipped unless GPUK8S_E2E=1 (the one documented skip condition;
see lab/README.md). With GPUK8S_E2E=1 and no running lab, every test fails: a missing
lab is an error, not a skip. Tests for pieces other engineers have not delivered yet are
skipped by `requires_paths(...)` naming the missing files (also documented).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
LAB = REPO / "lab"
CACHE = Path(os.environ.get("GPUK8S_CACHE", "/var/cache/gpuk8s"))
KUBECONFIG = "/etc/kubernetes/admin.conf"
REGISTRY = os.environ.get("GPUK8S_REGISTRY", "127.0.0.1:5000")
FAKE_TOLERATION = {"key": "lab.gpuk8s.io/fake-node", "operator": "Exists", "effect": "NoSchedule"}


sys.path.insert(0, str(LAB))
try:
    import lablock  # lab/lablock.py: the lab's one lock
    import versions as lab_versions  # lab/versions.py
finally:
    sys.path.remove(str(LAB))

STATE = lab_versions.state_dir(os.environ)  # $GPUK8S_LAB_STATE or the lab's default
SIM_ROOT = STATE / "simroot"


def versions() -> dict[str, str]:
    """lab/versions.env for the lab's release (lab/versions.py: the one lab/up --kube brought
    it up with; a GPUK8S_KUBE_VERSION naming another is refused)."""
    resolved: dict[str, str] = lab_versions.load(lab=True)
    return resolved


VERSIONS = versions()
KUBECTL = str(CACHE / "bin" / f"kube-{VERSIONS['KUBE_VERSION']}" / "kubectl")
HELM = str(CACHE / "bin" / f"helm-{VERSIONS['HELM_VERSION']}" / "helm")
BUSYBOX = f"{REGISTRY}/gpuk8s/lab-busybox:1.0"


# the modules that share one install of the sGPU stack (``sgpu_release``): run last, in
# this order, so that the session-scoped install is made once for them and removed at the
# end of the session with nothing else between (pytest otherwise runs files in
# alphabetical order, and the operator and single-node install modules in between need
# the lab node without our release)
SGPU_MODULES = ("test_exporter_sharing.py", "test_sharing.py", "test_stable_gpu_ids.py",
                "test_netpol.py")
# the fleet modules that share one install of the GPU Extensions scheme over SSH
# (``fleet_extensions``): run one after the other, in this order; the install is removed
# as soon as the next test is not theirs (pytest_runtest_teardown)
FLEET_SHARED_MODULES = ("test_fleet_maint.py", "test_fleet_sched.py")


def _e2e_module(item: pytest.Item) -> str:
    """The file name of an e2e item's module ('' for an item of another directory)."""
    path = Path(str(item.fspath))
    return path.name if path.parent == Path(__file__).parent else ""


def _module_order(items: list[pytest.Item]) -> list[str]:
    """The modules in the order they run: pytest's, with FLEET_SHARED_MODULES next to each
    other (where the first is) and SGPU_MODULES at the end."""
    order = [str(item.fspath) for item in items]
    order = list(dict.fromkeys(order))  # each module once, in pytest's order
    names = {str(item.fspath): _e2e_module(item) for item in items}
    fleet = [m for name in FLEET_SHARED_MODULES for m in order if names[m] == name]
    if fleet:
        at = order.index(fleet[0])
        order = [m for m in order if m not in fleet]
        order[at:at] = fleet
    sgpu = [m for name in SGPU_MODULES for m in order if names[m] == name]
    return [m for m in order if m not in sgpu] + sgpu


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {module: i for i, module in enumerate(_module_order(items))}
    items.sort(key=lambda item: rank[str(item.fspath)])  # stable: each module's own order
    if os.environ.get("GPUK8S_E2E") == "1":
        return
    skip = pytest.mark.skip(
        reason="e2e tests run only with GPUK8S_E2E=1 on a machine with the lab up"
    )
    for item in items:
        if "tests/e2e/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(skip)


def requires_paths(*paths: str) -> pytest.MarkDecorator:
    """Skip while a piece another part of the project delivers is absent (documented)."""
    missing = [p for p in paths if not (REPO / p).exists()]
    return pytest.mark.skipif(bool(missing), reason=f"not delivered yet: {', '.join(missing)}")


def run(
    *args: str, check: bool = True, timeout: float = 120, **kw: Any
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(args)} -> {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        )
    return proc


def kubectl(*args: str, check: bool = True, timeout: float = 120, stdin: str | None = None) -> str:
    return run(
        KUBECTL, "--kubeconfig", KUBECONFIG, *args, check=check, timeout=timeout, input=stdin
    ).stdout


def kubectl_json(*args: str) -> Any:
    return json.loads(kubectl(*args, "-o", "json"))


def apply(obj: dict[str, Any]) -> None:
    kubectl("apply", "-f", "-", stdin=json.dumps(obj))


def wait_until(
    what: str, fn: Callable[[], Any], timeout: float = 120, interval: float = 1.0
) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = fn()
            if last:
                return last
        except (AssertionError, subprocess.SubprocessError, ValueError, KeyError) as err:
            last = err
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")


def containerd_generation() -> str:
    """The lab node's containerd: "2" (2.x, lab/up --containerd 2) or "1.6" (Debian's)."""
    cmd = (STATE / "run" / "containerd.cmd").read_bytes().split(b"\0")
    return "2" if any(b"/containerd-v2" in part for part in cmd) else "1.6"


@pytest.fixture(scope="session", autouse=True)
def lab_session_lock() -> Iterator[None]:
    """One e2e session on the lab at a time: each sets aside and gives back the installed
    releases and parks cp2's scheduler, so two at once undo each other's work. A second
    session -- or a benchmark on the lab -- waits here until the first ends (the lab's one
    lock, lab/lablock.py)."""
    if os.environ.get("GPUK8S_E2E") != "1" or not STATE.is_dir():
        yield
        return
    with lablock.hold(lablock.lock_path(), lambda line: print(f"\n[e2e] {line}", flush=True)):
        yield


@pytest.fixture(scope="session")
def lab(lab_session_lock: None) -> dict[str, str]:
    """The lab must be up; a missing lab is a failure here, never a skip."""
    assert Path(KUBECONFIG).exists(), f"{KUBECONFIG} missing: run lab/up first"
    assert Path(KUBECTL).exists(), f"{KUBECTL} missing: run lab/tools.sh kube"
    node = os.environ.get("GPUK8S_LAB_NODE") or run("hostname", "-s").stdout.strip().lower()
    return {"node": node, "kube_version": VERSIONS["KUBE_VERSION"]}


OUR_CHARTS = ("metax-gpu-extensions", "metax-operator")
SCHEDULER_MANIFEST = Path("/etc/kubernetes/manifests/kube-scheduler.yaml")
SHARING_MODE_LABEL = "gpuk8s.io/sharing-mode"
ALLOCATION_MODE_LABEL = "gpuk8s.io/allocation-mode"  # gpu-dra's nodes (tests/e2e/test_dra.py)


def _helm_list() -> list[dict[str, Any]]:
    out = run(HELM, "--kubeconfig", KUBECONFIG, "list", "-A", "--deployed", "--failed",
              "--pending", "-o", "json").stdout
    return [r for r in json.loads(out or "[]") if r["chart"].rsplit("-", 1)[0] in OUR_CHARTS]


def _ours(release: str) -> bool:
    """A release name the e2e tier gives its own installs."""
    return release == "e2e" or release.startswith("e2e-")


# where kube_scheduler_extender (the gpu_aware role's default backup: true) copies
# kube-scheduler's manifest and /etc/metax/extender.yaml before it changes them
SCHEDULER_BACKUPS = Path("/var/lib/gpuk8s/backups")


@contextlib.contextmanager
def removing_scheduler_backups(backups: Path = SCHEDULER_BACKUPS) -> Iterator[None]:
    """Around a playbook run that may change kube-scheduler's configuration: the backups it
    made (``kube-scheduler.yaml.*~``, ``extender.yaml.*~`` new in ``backups``, and the
    directory when it made it) are removed once the run succeeded, so the tests leave the
    node as they found it; a run that failed keeps them (what restores the node by hand)."""
    existed = backups.is_dir()
    before = set(os.listdir(backups)) if existed else set()
    yield
    if not backups.is_dir():
        return
    for name in set(os.listdir(backups)) - before:
        if name.startswith(("kube-scheduler.yaml.", "extender.yaml.")) and name.endswith("~"):
            (backups / name).unlink()
    if not existed:
        with contextlib.suppress(OSError):  # not empty: someone else's files stay
            backups.rmdir()


def helm_for_ansible() -> str:
    """kubernetes.core.helm (6.2, in the `ansible` package) calls `helm list --all`, which
    helm 4 removed: give the playbooks helm 3 unless GPUK8S_HELM already names one."""
    if os.environ.get("GPUK8S_HELM"):
        return os.environ["GPUK8S_HELM"]
    return run(str(LAB / "tools.sh"), "helm3", timeout=900).stdout.strip()


def playbook(name: str, *extra: str) -> str:
    """ansible-playbook NAME against inventories/lab (the lab node, connection local); the
    kube-scheduler backups a successful run made (gpu_aware.yml, uninstall.yml) are
    removed again."""
    with removing_scheduler_backups():
        return run(tool("ansible-playbook"), "-i", str(REPO / "inventories" / "lab"),
                   str(REPO / "playbooks" / name), *extra, timeout=900, cwd=str(REPO),
                   env={**os.environ, "GPUK8S_HELM": helm_for_ansible()}).stdout


def _gpu_aware_playbook(state: str, namespace: str) -> None:
    """playbooks/gpu_aware.yml for the release in ``namespace``: over HTTPS when its chart
    made kube-scheduler's certificate (gpuAware.tls), else plain HTTP (a release of a
    chart from before issue 26, given back as it was)."""
    tls = kubectl("-n", namespace, "get", "secret", "gpu-aware-scheduler-client", "-o", "name",
                  check=False).strip() != ""
    playbook("gpu_aware.yml", "-e", f"gpu_aware_state={state}",
             "-e", f"gpu_aware_namespace={namespace}", "-e", f"gpu_aware_tls={str(tls).lower()}")


# the fleet's test modules: e2e, and the one documented skip besides GPUK8S_E2E (lab/up
# --no-fleet, GPUK8S_LAB_FLEET=0)
FLEET_MARKS = [
    pytest.mark.e2e,
    pytest.mark.skipif(not (STATE / "fleet").is_dir(), reason="no fleet: lab/up --no-fleet"),
]
FLEET_STANDBY = "cp2"  # the fleet's second control plane (lab/fleetctl, lab/README.md "Fleet")
STANDBY_MANIFEST = "/etc/kubernetes/manifests/kube-scheduler.yaml"
# parked outside /etc/kubernetes (test_fleet_lab.py lists that directory)
STANDBY_PARKED = "/var/tmp/gpuk8s-e2e-parked-kube-scheduler.yaml"


def fleet_up() -> bool:
    """The fleet's second control plane runs (lab/up starts the fleet unless --no-fleet)."""
    if not (STATE / "fleet" / FLEET_STANDBY).is_dir():
        return False
    return subprocess.run([str(LAB / "fleetctl"), "exec", FLEET_STANDBY, "true"],
                          capture_output=True, check=False).returncode == 0


def scheduler_leader() -> str:
    """The node whose kube-scheduler holds the lease (holderIdentity is NODE_UUID)."""
    holder = kubectl("-n", "kube-system", "get", "lease", "kube-scheduler", "-o",
                     "jsonpath={.spec.holderIdentity}", check=False).strip()
    return holder.rsplit("_", 1)[0] if "_" in holder else holder


def standby_scheduler(run_it: bool, lab_node: str) -> None:
    """Run or park the fleet's second kube-scheduler (its static pod manifest moved aside).

    The single-node tier configures gpu-aware on the lab node's scheduler only
    (inventories/lab); a restart of that scheduler hands the lease to cp2's, which knows
    nothing of gpu-aware. So the single-node tests run with cp2's scheduler parked and the
    lab node's leading; the fleet's own tests (test_fleet_ops.py) run both, configured
    through inventories/fleet."""
    src, dst = (STANDBY_PARKED, STANDBY_MANIFEST) if run_it else (STANDBY_MANIFEST, STANDBY_PARKED)
    subprocess.run([str(LAB / "fleetctl"), "exec", FLEET_STANDBY, "sh", "-c",
                    f"if [ -e {src} ]; then mv {src} {dst}; fi"], check=True, timeout=60)
    mirror = f"kube-scheduler-{FLEET_STANDBY}"

    def settled() -> bool:
        present = kubectl("-n", "kube-system", "get", "pod", mirror, "-o", "name",
                          check=False).strip() != ""
        assert present == run_it, f"{mirror} present={present}, want {run_it}"
        if not run_it:
            assert scheduler_leader() == lab_node, f"lease held by {scheduler_leader()!r}"
        return True

    wait_until(f"{FLEET_STANDBY}'s kube-scheduler {'running' if run_it else 'parked'}",
               settled, 180)


@pytest.fixture(scope="session", autouse=True)
def standby_scheduler_parked(lab_session_lock: None, lab: dict[str, str]) -> Iterator[bool]:
    """cp2's kube-scheduler parked for the tier, running again afterwards (see
    standby_scheduler); yields whether the fleet is up."""
    if os.environ.get("GPUK8S_E2E") != "1" or not fleet_up():
        yield False
        return
    standby_scheduler(False, lab["node"])
    try:
        yield True
    finally:
        standby_scheduler(True, lab["node"])


@contextlib.contextmanager
def standby_scheduler_up(lab_node: str, parked: bool) -> Iterator[None]:
    """cp2's kube-scheduler running inside the block when the tier parked it (``parked``,
    see standby_scheduler), parked again after it."""
    if parked:
        standby_scheduler(True, lab_node)
    try:
        yield
    finally:
        if parked:
            standby_scheduler(False, lab_node)


@pytest.fixture()
def standby_scheduler_running(
    lab: dict[str, str], standby_scheduler_parked: bool
) -> Iterator[None]:
    """cp2's kube-scheduler running for one test (the lab node's still leading)."""
    with standby_scheduler_up(lab["node"], standby_scheduler_parked):
        yield


FLEET_INSTALL = pytest.StashKey[contextlib.ExitStack]()


@pytest.fixture(scope="session")
def fleet_extensions(
    request: pytest.FixtureRequest, lab: dict[str, str], standby_scheduler_parked: bool
) -> Iterator[dict[str, Any]]:
    """The GPU Extensions scheme installed over SSH on the fleet, ONE install for the
    modules of FLEET_SHARED_MODULES (test_fleet_sched.py's ``extensions_installed``); it is
    removed after the last test of theirs (pytest_runtest_teardown), or at the end of the
    session when that comes first."""
    from .test_fleet_sched import extensions_installed

    stack = contextlib.ExitStack()
    request.config.stash[FLEET_INSTALL] = stack
    try:
        yield stack.enter_context(extensions_installed(lab["node"], standby_scheduler_parked))
    finally:
        stack.close()  # a no-op when pytest_runtest_teardown closed it


@pytest.hookimpl(trylast=True)  # after the test's own fixtures are torn down
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """The fleet's shared install is removed once the next test is not one of its modules'."""
    stack = item.config.stash.get(FLEET_INSTALL, None)
    if stack is None or (nextitem is not None
                         and _e2e_module(nextitem) in FLEET_SHARED_MODULES):
        return
    del item.config.stash[FLEET_INSTALL]
    stack.close()


@pytest.fixture(scope="session", autouse=True)
def releases_set_aside(standby_scheduler_parked: bool) -> Iterator[list[dict[str, Any]]]:
    """The README's first command (lab/install) leaves the toolkit installed; the e2e tier
    installs and removes its own releases, as on a fresh CI lab. So an installed release
    of our charts is set aside first (`helm uninstall --keep-history`, the scheduler
    extender disabled if it was on) and given back at the end exactly as it was (`helm
    rollback` to its revision: same chart, same values; the extender enabled again with
    the new Service IP): an administrator finds the lab as lab/install left it.

    A release that carries a name the e2e tier gives its own installs (``e2e``, ``e2e-*``)
    is the leftover of an interrupted run (the machine restarted in the middle of the
    tier), possibly adopted since by lab/install, whose playbook upgrades the release of
    the chart it finds in the namespace. Its history cannot be kept (the test of that name
    installs and removes the release again, history and all: CI saw `helm rollback` fail
    with "release: not found"), so it is removed outright and given back by a fresh
    `helm install` of the same name, chart (from this checkout) and user-supplied values.
    The ``e2e-*`` namespaces and the sharing-mode and allocation-mode labels such a run
    leaves go too."""
    if os.environ.get("GPUK8S_E2E") != "1" or not Path(KUBECONFIG).exists():
        yield []
        return
    found = _helm_list()
    extender = SCHEDULER_MANIFEST.exists() and (
        "metax-tech.com/scheduler-extender" in SCHEDULER_MANIFEST.read_text()
        or "--config=/etc/metax/extender.yaml" in SCHEDULER_MANIFEST.read_text()
    )
    if found:
        names = ", ".join(f"{r['namespace']}/{r['name']} (revision {r['revision']})"
                          for r in found)
        print(f"\n[e2e] setting aside {names}; given back after the tests", file=sys.stderr)
    if extender and found:
        _gpu_aware_playbook("absent", found[0]["namespace"])
    values: dict[str, str] = {}
    for r in found:
        keep = ["--keep-history"]
        if _ours(r["name"]):
            values[r["name"]] = run(HELM, "--kubeconfig", KUBECONFIG, "get", "values", r["name"],
                                    "-n", r["namespace"], "-o", "json").stdout
            keep = []
        run(HELM, "--kubeconfig", KUBECONFIG, "uninstall", r["name"], "-n", r["namespace"],
            *keep, "--wait", "--timeout", "5m", timeout=400)
    stale = [ns.split("/", 1)[1] for ns in kubectl("get", "namespaces", "-o", "name").split()
             if ns.split("/", 1)[1].startswith("e2e-")]
    if stale:
        print(f"\n[e2e] deleting namespaces {', '.join(stale)}, left by an interrupted e2e run",
              file=sys.stderr)
        kubectl("delete", "namespace", *stale, "--wait=true", "--timeout=120s", timeout=180)
    if values or stale:
        kubectl("label", "node", "--all", f"{SHARING_MODE_LABEL}-", f"{ALLOCATION_MODE_LABEL}-")
    try:
        yield found
    finally:
        for r in found:
            if r["name"] in values:
                chart = REPO / "charts" / r["chart"].rsplit("-", 1)[0]
                run(HELM, "--kubeconfig", KUBECONFIG, "install", r["name"], str(chart),
                    "-n", r["namespace"], "-f", "-", "--wait", "--timeout", "5m",
                    input=values[r["name"]], timeout=400)
            else:
                run(HELM, "--kubeconfig", KUBECONFIG, "rollback", r["name"], str(r["revision"]),
                    "-n", r["namespace"], "--wait", "--timeout", "5m", timeout=400)
        if extender and found:
            _gpu_aware_playbook("present", found[0]["namespace"])


@pytest.fixture()
def namespace(lab: dict[str, str]) -> Iterator[str]:
    ns = f"e2e-{uuid.uuid4().hex[:8]}"
    kubectl("create", "namespace", ns)
    # The namespace controller needs the default ServiceAccount before pods can be created.
    wait_until(
        "default serviceaccount", lambda: kubectl("-n", ns, "get", "sa", "default", check=False), 30
    )
    try:
        yield ns
    finally:
        kubectl("delete", "namespace", ns, "--wait=false", check=False)


def pod_phase(ns: str, name: str) -> str:
    return kubectl("-n", ns, "get", "pod", name, "-o", "jsonpath={.status.phase}", check=False)


SGPU = "metax-tech.com/sgpu"  # gpu-device's shared resources in sgpu mode (core.sharing)
VCORE = "metax-tech.com/vcore"


def shared_gpu_pod(name: str, namespace: str, vcore: int, *, node: str = "",
                   annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A busybox pod asking for a share of one GPU: one sGPU with ``vcore`` percent of its
    cores. Placed by the scheduler, or bound to ``node`` with ``annotations`` (what
    gpu-aware's bind would have written) when they are given."""
    pod: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "main", "image": BUSYBOX, "command": ["sleep", "3600"],
                            "resources": {"limits": {SGPU: "1", VCORE: str(vcore)}}}],
        },
    }
    if node:
        pod["spec"]["nodeName"] = node
    if annotations:
        pod["metadata"]["annotations"] = dict(annotations)
    return pod


def allocatable(node: str, resource: str) -> int:
    """The node's allocatable ``resource`` (0 when it has none)."""
    key = resource.replace(".", "\\.")
    return int(kubectl("get", "node", node, "-o", f"jsonpath={{.status.allocatable.{key}}}")
               or 0)


SGPU_NS = "metax-gpu-extensions"  # the sGPU stack's release namespace
SGPU_RELEASE = "e2e-sgpu"
SHARING_MODE = "sgpu"
SGPU_GPUS = 8  # the lab node's simulated GPUs (c500-8)
SGPU_SLOTS = 16  # replica ids per GPU in sgpu mode (core.sharing.DEFAULT_SLOTS)
SGPU_VALUES = (
    f"registry={REGISTRY}/gpuk8s",
    f"hostPaths.root={SIM_ROOT}",
    "hostPaths.extraReadPaths={/var/lib/gpuk8s-sim}",
    f"gpuDevice.extraArgs={{--device-path-prefix={SIM_ROOT}}}",
    "gpuDevice.sharing=true",
    "deployExtenderGPUAware=true",
    "gpuExporter.enabled=true",
    "gpuExporter.interval=2",
)


@pytest.fixture(scope="session")
def sgpu_release(lab: dict[str, str]) -> Iterator[dict[str, str]]:
    """The sGPU stack on the lab node, ONE install for the modules of SGPU_MODULES (run
    last, see pytest_collection_modifyitems): the node labelled
    ``gpuk8s.io/sharing-mode=sgpu`` *before* gpu-device starts (it reads the mode once, at
    start), the chart with gpu-device sharing, gpu-aware as kube-scheduler's extender
    (playbooks/gpu_aware.yml, the ``bind`` verb) and gpu-exporter (a 2 s interval); all
    undone at the end of the session, pass or fail (``releases_set_aside`` then gives
    lab/install's release back). Each module takes its own namespace (``sgpu_work``) and
    leaves the release as it found it."""
    node = lab["node"]
    kubectl("label", "node", node, f"{SHARING_MODE_LABEL}={SHARING_MODE}", "--overwrite")
    try:
        run(HELM, "--kubeconfig", KUBECONFIG, "upgrade", "--install", SGPU_RELEASE,
            str(REPO / "charts" / "metax-gpu-extensions"), "-n", SGPU_NS, "--create-namespace",
            "--wait", "--timeout", "5m", *(a for v in SGPU_VALUES for a in ("--set", v)),
            timeout=600)
        playbook("gpu_aware.yml", "-e", f"gpu_aware_namespace={SGPU_NS}")
        yield {**lab, "release": SGPU_RELEASE}
    finally:
        playbook("gpu_aware.yml", "-e", "gpu_aware_state=absent", "-e",
                 f"gpu_aware_namespace={SGPU_NS}")
        run(HELM, "--kubeconfig", KUBECONFIG, "uninstall", SGPU_RELEASE, "-n", SGPU_NS,
            "--wait", "--timeout", "3m", check=False, timeout=300)
        kubectl("label", "node", node, f"{SHARING_MODE_LABEL}-", check=False)
        wait_until("nothing left after helm uninstall", lambda: kubectl(
            "get", "all", "-n", SGPU_NS, "-o", "name", check=False).strip() == "", 60)


SCHEDULER_READY = "https://127.0.0.1:10259/readyz"


@contextlib.contextmanager
def sgpu_work(release: dict[str, str], work: str) -> Iterator[dict[str, str]]:
    """One module's share of ``sgpu_release``: kube-scheduler ready with the extender, every
    GPU's sGPU replicas allocatable (nothing an earlier module placed is left), and the
    module's own namespace ``work``, deleted (with its pods) on the way out."""
    node = release["node"]
    wait_until("kube-scheduler ready with the extender", lambda: run(
        "curl", "-fsSk", SCHEDULER_READY, check=False).returncode == 0, 180)
    wait_until(f"{SGPU} allocatable {SGPU_GPUS * SGPU_SLOTS}",
               lambda: allocatable(node, SGPU) == SGPU_GPUS * SGPU_SLOTS, 120, interval=0.5)
    kubectl("create", "namespace", work)
    try:
        wait_until("default sa", lambda: kubectl("-n", work, "get", "sa", "default",
                                                 check=False), 30, interval=0.5)
        yield release
    finally:
        kubectl("delete", "namespace", work, "--wait=true", "--timeout=120s", check=False,
                timeout=180)


def tool(name: str) -> str:
    """A console script of this Python environment (the venv running pytest), else PATH."""
    local = Path(sys.executable).parent / name
    found = str(local) if local.exists() else shutil.which(name)
    assert found, f"{name} not found next to {sys.executable} nor on PATH (pip install -e '.[dev]')"
    return found
