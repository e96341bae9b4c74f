"""operator-controller as a real process after `helm upgrade`s of the metax-operator chart,
on the integration kube-apiserver: out-of-date driver-manager pods are replaced (issue 28
item 5), and the process killed with SIGKILL right after each externally visible step of
a rolling driver upgrade, then restarted, converges (item 8).

What is real: kube-apiserver, helm and the chart (its DaemonSet template and hash, the
operator-controller Deployment's arguments, which the process is started with, and its
RBAC: the process authenticates with a token of the chart's operator-controller
ServiceAccount), `gpuk8s serve operator-controller` in its own process, the Eviction API.
What the ``Harness`` plays (this tier runs no kubelet and no controller-manager):

* driver-manager's DaemonSet controller (``OnDelete``): a GPU node without a
  driver-manager pod gets one made from the DaemonSet's current template (spec, labels,
  annotations, hence its ``metax-tech.com/template-hash``); ``desiredNumberScheduled``;
* the kubelet: a pod marked for deletion goes; a new driver-manager pod is Ready one
  round later; the nodes are Ready with 8 healthy GPUs;
* driver-manager itself, from its own pod's ``--deploy-policy`` / ``--driver-version``
  (as ``drivermanager.agent`` decides): a node without a driver is installed at once; a
  loaded driver of another version with ``Always`` waits until the node's upgrade state is
  ``upgrading``, then reports the new version (or, for a node told to fail, a failed
  load); gpu-label's version labels follow.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuk8s.services.kube import api_client
from gpuk8s.services.nodeagent import state_annotation
from gpuk8s.services.operator import agentroll
from gpuk8s.services.operator import upgrade as up
from gpuk8s.services.operator.main import KILL_AFTER_ENV, KILL_LOG_ENV

pytestmark = pytest.mark.integration

OLD, NEW = "2.32.0.6", "2.33.0.6"
SDK, SDK2 = "maca-c500:2.33.0.4-ubuntu22.04-amd64", "maca-c500:2.33.0.5-ubuntu22.04-amd64"
REPORT = state_annotation("driver-manager.driver")
P = "metax-tech.com/"
OWNED = (up.REQUIRED, *up.ACTIVE, up.FAILED)  # nodes whose driver-manager the upgrade owns


def _flags(args: list[str]) -> dict[str, str]:
    return dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)


def _ready(pod: dict[str, Any]) -> bool:
    found = agentroll.agent_pod(pod)
    return found is not None and not found.unavailable


class Harness:
    """One release of the operator chart, its GPU nodes, and the node side (module doc)."""

    def __init__(self, apiserver: Any, helm: Any, chart: str, workdir: Path,
                 values: list[str]) -> None:
        from kubernetes import client

        self.apiserver, self.helm_run, self.chart, self.workdir = apiserver, helm, chart, workdir
        self.api = api_client(apiserver.kubeconfig("admin"))
        self.core = client.CoreV1Api(self.api)
        self.apps = client.AppsV1Api(self.api)
        self.tag = uuid.uuid4().hex[:6]
        self.ns, self.rel, self.jobs = f"kill-{self.tag}", f"k{self.tag}", f"jobs-{self.tag}"
        self.names: list[str] = []
        self.fail: set[str] = set()  # nodes whose driver installs fail (a bad payload)
        self.host: dict[str, str | None] = {}  # the driver loaded on each node's host
        self.log = workdir / f"controller-{self.tag}.log"
        # a RuntimeClass is cluster-wide: one name per release
        self.helm("install", "--create-namespace", "--set", f"runtime.handler=m{self.tag}",
                  "--set", "gpuExporter.enabled=false", "--set", "gpuMps.enabled=false",
                  "--set", f"maca.payload.images={{{SDK}}}", *values)
        # the GPU workloads' namespace (no controller-manager: its ServiceAccount by hand)
        self.core.create_namespace({"metadata": {"name": self.jobs}})
        self.core.create_namespaced_service_account(self.jobs, {"metadata": {"name": "default"}})
        token = self.core.create_namespaced_service_account_token(
            "operator-controller", self.ns,
            {"spec": {"audiences": ["https://kubernetes.default.svc"],
                      "expirationSeconds": 3600}}).status.token
        self.kubeconfig = apiserver.token_kubeconfig(f"oc-{self.tag}", token)
        self.max_parallel = int(_flags(self.controller_args())["upgrade-max-parallel"])
        self.replacing: set[str] = set()  # nodes whose driver-manager pod was deleted
        self.rollouts = 0  # runs so far (each its own kill log)
        self.stale_status: str | None = None  # operator-status as a run found it

    def helm(self, verb: str, *args: str) -> None:
        self.helm_run(verb, self.rel, self.chart, "-n", self.ns, *args)

    def upgrade(self, *values: str) -> None:
        """`helm upgrade --reuse-values --set ...` and the policy the controller gets."""
        self.helm("upgrade", "--reuse-values", *values)
        self.max_parallel = int(_flags(self.controller_args())["upgrade-max-parallel"])

    def close(self) -> None:
        for name in self.names:
            self.core.delete_node(name)
        self.core.delete_namespace(self.jobs)
        # --no-hooks: the pre-delete hook is a Job, and this tier runs no pods
        self.helm_run("uninstall", self.rel, "-n", self.ns, "--no-hooks", "--wait",
                      "--timeout", "120s")

    # ----------------------------------------------------------------- nodes, pods
    def add_node(self, name: str, version: str | None) -> None:
        """A GPU node whose driver-manager last reported ``version`` loaded (None: no
        driver; with deployPolicy Never, as driver-manager says then)."""
        name = self.name(name)
        labels = {P + "gpu.installed": "true", P + "runtime.ready": "true",
                  "kill-test": self.tag}
        if version:
            labels.update(self._version_labels(version))
            report = {"state": "ready", "version": version, "wanted": version}
        else:
            report = {"state": "disabled", "message": "no driver loaded: deploy_policy Never"}
        self.host[name] = version
        self.core.create_node({"metadata": {"name": name, "labels": labels, "annotations": {
            REPORT: json.dumps(report)}}})
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.core.patch_node_status(name, {"status": {
            "capacity": {P + "gpu": "8"}, "allocatable": {P + "gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "harness", "lastHeartbeatTime": now,
                            "lastTransitionTime": now}]}})
        self.names.append(name)

    def name(self, short: str) -> str:
        return f"{self.tag}-{short}"

    @staticmethod
    def _version_labels(version: str) -> dict[str, str]:
        major, minor, patch = version.split(".")[:3]
        return {P + "driver.ready": "true", P + "gpu.driver.major": major,
                P + "gpu.driver.minor": minor, P + "gpu.driver.patch": patch}

    def set_driver(self, short: str, version: str) -> None:
        """The administrator installed ``version`` on the node by hand."""
        self.host[self.name(short)] = version
        self.core.patch_node(self.name(short), {"metadata": {
            "labels": self._version_labels(version),
            "annotations": {REPORT: json.dumps({"state": "ready", "version": version,
                                                "wanted": version})}}})

    def gpu_job(self, short: str) -> str:
        """A GPU pod of a ReplicaSet on the node (drain evicts it); ``ns/name``."""
        name = f"job-{short}-{uuid.uuid4().hex[:4]}"
        self.core.create_namespaced_pod(self.jobs, {
            "metadata": {"name": name, "ownerReferences": [{
                "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "train",
                "uid": str(uuid.uuid4()), "controller": True}]},
            "spec": {"nodeName": self.name(short), "containers": [{
                "name": "main", "image": "busybox",
                "resources": {"limits": {P + "gpu": "1"}}}]}})
        return f"{self.jobs}/{name}"

    def nodes(self) -> list[dict[str, Any]]:
        items = self.core.list_node(label_selector=f"kill-test={self.tag}").items
        return [self.api.sanitize_for_serialization(n) for n in items]

    def agents(self) -> list[dict[str, Any]]:
        items = self.core.list_namespaced_pod(
            self.ns, label_selector="app.kubernetes.io/name=driver-manager").items
        return [self.api.sanitize_for_serialization(p) for p in items]

    def daemonset(self) -> dict[str, Any]:
        found: dict[str, Any] = self.api.sanitize_for_serialization(
            self.apps.read_namespaced_daemon_set("driver-manager", self.ns))
        return found

    def template_hash(self) -> str:
        return str(self.daemonset()["spec"]["template"]["metadata"]["annotations"][
            agentroll.TEMPLATE_HASH])

    def target(self) -> str | None:
        """The driver version of the current template (None: deployPolicy Never)."""
        driver = next(c for c in self.daemonset()["spec"]["template"]["spec"]["containers"]
                      if c["name"] == "driver")
        return _flags(driver["args"]).get("driver-version")

    # --------------------------------------------------------------- the node side
    def play(self) -> None:
        from kubernetes.client.rest import ApiException

        for ns in (self.ns, self.jobs):  # the kubelet: pods marked for deletion go
            for pod in self.core.list_namespaced_pod(ns).items:
                if pod.metadata.deletion_timestamp:
                    if (pod.metadata.labels or {}).get("app.kubernetes.io/name") == \
                            "driver-manager":
                        self.replacing.add(pod.spec.node_name)
                    try:
                        self.core.delete_namespaced_pod(pod.metadata.name, ns,
                                                        grace_period_seconds=0)
                    except ApiException as err:
                        if err.status != 404:
                            raise
        ds = self.daemonset()
        template = ds["spec"]["template"]
        nodes = self.nodes()
        if ds.get("status", {}).get("desiredNumberScheduled") != len(nodes):
            self.apps.patch_namespaced_daemon_set_status("driver-manager", self.ns, {
                "status": {"desiredNumberScheduled": len(nodes)}})
        by_node: dict[str, dict[str, Any]] = {}  # {}: created last round, not Ready yet
        for pod in self.agents():
            if pod["metadata"].get("deletionTimestamp"):
                continue
            node_name = pod["spec"]["nodeName"]
            if _ready(pod):
                by_node[node_name] = pod
                self.replacing.discard(node_name)
                continue
            by_node[node_name] = {}
            self.core.patch_namespaced_pod_status(pod["metadata"]["name"], self.ns, {
                "status": {"phase": "Running", "conditions": [
                    {"type": "Ready", "status": "True"}]}})
            # Ready from now on: operator-controller may see it so before this harness
            # looks again, and take the next node (two down only by this harness's lag)
            self.replacing.discard(node_name)
        for node in nodes:
            name = node["metadata"]["name"]
            if name not in by_node:  # the DaemonSet controller: a pod from the template
                self.core.create_namespaced_pod(self.ns, {
                    "metadata": {"generateName": "driver-manager-",
                                 "labels": template["metadata"]["labels"],
                                 "annotations": template["metadata"]["annotations"]},
                    "spec": {**template["spec"], "nodeName": name}})
            elif by_node[name]:
                self._driver_manager(node, by_node[name])

    def _driver_manager(self, node: dict[str, Any], pod: dict[str, Any]) -> None:
        """One pass of the pod's driver container (``DriverAgent._driver``, abridged)."""
        meta = node["metadata"]
        name = meta["name"]
        driver = next(c for c in pod["spec"]["containers"] if c["name"] == "driver")
        flags = _flags(driver["args"])
        policy, wanted = flags["deploy-policy"], flags.get("driver-version")
        loaded = self.host[name]
        state = (meta.get("labels") or {}).get(up.STATE_LABEL)
        labels: dict[str, str] = {}
        if policy == "Never":
            report: dict[str, Any] = (
                {"state": "ready", "version": loaded, "wanted": loaded} if loaded else
                {"state": "disabled", "message": "no driver loaded: deploy_policy Never"})
        elif loaded and (loaded == wanted or policy != "Always"):
            report = {"state": "ready", "version": loaded, "wanted": wanted}
        elif loaded and state != up.UPGRADING:  # the gate: a loaded driver waits
            report = {"state": "pending", "version": loaded, "wanted": wanted,
                      "message": "waits for operator-controller to drain the node"}
        elif name in self.fail:
            report = {"state": "failed", "version": loaded, "wanted": wanted,
                      "message": f"driver {wanted} did not load (Invalid module format); "
                                 f"{loaded} loaded again"}
        else:  # a first install, or the upgrade's turn
            self.host[name] = wanted
            report = {"state": "ready", "version": wanted, "wanted": wanted}
            labels = self._version_labels(str(wanted))
        old = json.loads((meta.get("annotations") or {}).get(REPORT) or "{}")
        if report != old:
            self.core.patch_node(name, {"metadata": {
                "labels": labels, "annotations": {REPORT: json.dumps(report)}}})

    # ------------------------------------------------------ operator-controller process
    def controller_args(self) -> list[str]:
        """The chart's operator-controller arguments, as its Deployment has them."""
        dep = self.apps.read_namespaced_deployment("operator-controller", self.ns)
        [c] = [c for c in dep.spec.template.spec.containers if c.name == "operator-controller"]
        return [a.replace("$(POD_NAMESPACE)", self.ns) for a in c.args]

    def start(self, kill_after: Sequence[str]) -> subprocess.Popen[bytes]:
        env = {**os.environ, "POD_NAMESPACE": self.ns,
               "PYTHONWARNINGS": "ignore:Unverified HTTPS request"}  # the test's self-signed CA
        env.pop(KILL_AFTER_ENV, None)
        if kill_after:
            env[KILL_AFTER_ENV] = ",".join(kill_after)
            env[KILL_LOG_ENV] = str(self.kill_log)
        # the chart's arguments; then this tier's: no ports, no log files, quick passes
        args = [*self.controller_args(), "--health-port=0", "--log-dir=", "--log-format=text",
                "--interval=0.3", f"--kubeconfig={self.kubeconfig}"]
        with open(self.log, "ab") as out:
            return subprocess.Popen([sys.executable, "-m", "gpuk8s.cli", *args], env=env,
                                    stdout=out, stderr=subprocess.STDOUT)

    @property
    def kill_log(self) -> Path:
        return self.workdir / f"kills-{self.tag}-{self.rollouts}"

    def kills(self) -> dict[str, set[str]]:
        """Per step, the subjects the process was killed after it for (this rollout)."""
        out: dict[str, set[str]] = {}
        if self.kill_log.exists():
            for line in self.kill_log.read_text().splitlines():
                step, subject = line.split(" ", 1)
                out.setdefault(step, set()).add(subject)
        return out

    # ----------------------------------------------------------------- invariants
    def check(self) -> None:
        """The bounds, at every observation: nodes in the upgrade <= maxParallel, cordoned
        nodes <= maxUnavailable, nodes outside the upgrade whose driver-manager pod was
        deleted and has no Ready successor yet <= maxParallel (the direct replacements)."""
        nodes = self.nodes()
        states = {n["metadata"]["name"]: n["metadata"].get("labels", {}).get(up.STATE_LABEL)
                  for n in nodes}
        active = [n for n, s in states.items() if s in up.ACTIVE]
        assert len(active) <= self.max_parallel, states
        cordoned = [n["metadata"]["name"] for n in nodes if n["spec"].get("unschedulable")]
        assert len(cordoned) <= up.unavailable_limit("50%", len(nodes)), (cordoned, states)
        deleted = self.replacing | {p["spec"]["nodeName"] for p in self.agents()
                                    if p["metadata"].get("deletionTimestamp")}
        down = [n for n, s in states.items() if s not in OWNED and n in deleted]
        assert len(down) <= self.max_parallel, (down, states)

    def converged(self) -> bool:
        """Every node at the target, out of the upgrade (label done or none), uncordoned;
        every driver-manager pod from the current template and Ready; and the controller
        saw it so (a status it wrote in this run)."""
        status = self.status()
        if status is None or status.metadata.resource_version == self.stale_status:
            return False
        rollout = yaml.safe_load(status.data["rollout"])
        if rollout.get("driverManagerPods") != {"outdated": 0, "unavailable": 0} or \
                set(rollout["states"]) - {up.DONE, "none"}:
            return False
        want, target = self.template_hash(), self.target()
        pods = [p for p in self.agents() if not p["metadata"].get("deletionTimestamp")]
        if len(pods) != len(self.names) or not all(
                _ready(p) and p["metadata"]["annotations"].get(agentroll.TEMPLATE_HASH) == want
                for p in pods):
            return False
        for node in self.nodes():
            meta = node["metadata"]
            report = json.loads(meta.get("annotations", {}).get(REPORT) or "{}")
            if meta.get("labels", {}).get(up.STATE_LABEL) not in (None, up.DONE) or \
                    node["spec"].get("unschedulable") or \
                    report.get("version") != (target or self.host[meta["name"]]) or \
                    report.get("state") != ("ready" if report.get("version") else "disabled"):
                return False
        return True

    def status(self) -> Any:
        from kubernetes.client.rest import ApiException

        try:
            return self.core.read_namespaced_config_map("operator-status", self.ns)
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    def admin(self) -> None:
        """The administrator fixes a failed node's payload and retries it."""
        for node in self.nodes():
            if node["metadata"].get("labels", {}).get(up.STATE_LABEL) == up.FAILED:
                self.fail.discard(node["metadata"]["name"])
                self.core.patch_node(node["metadata"]["name"], {"metadata": {"labels": {
                    up.STATE_LABEL: up.REQUIRED}}})

    def run(self, kill_after: Sequence[str] = (), timeout: float = 300) -> int:
        """Run operator-controller (restarted whenever it dies: each death must be the
        test hook's SIGKILL after one of ``kill_after``) and the node side until
        ``converged``; the number of restarts."""
        self.rollouts += 1
        status = self.status()
        self.stale_status = status.metadata.resource_version if status else None
        proc: subprocess.Popen[bytes] | None = None
        restarts = 0
        deadline = time.monotonic() + timeout
        try:
            while True:
                if proc is None or proc.poll() is not None:
                    if proc is not None:
                        assert proc.returncode == -signal.SIGKILL, self.log.read_text()[-3000:]
                        restarts += 1
                        self.check()
                    proc = self.start(kill_after)
                self.play()
                self.check()
                self.admin()
                if self.converged():
                    # stopped as the chart's pod would be; it may have killed itself after
                    # its last step meanwhile (SIGTERM ends the loop, not the pass)
                    proc.terminate()
                    if proc.wait(60) == -signal.SIGKILL:
                        restarts += 1
                    else:  # 0, or SIGTERM's before its handler is in place
                        assert proc.returncode in (0, -signal.SIGTERM), \
                            self.log.read_text()[-3000:]
                    return restarts
                nodes = [(n["metadata"]["name"], n["spec"].get("unschedulable"),
                          n["metadata"].get("labels", {}).get(up.STATE_LABEL))
                         for n in self.nodes()]
                assert time.monotonic() < deadline, (
                    f"no convergence after {timeout:g}s (kill after {kill_after}): {nodes}\n"
                    + self.log.read_text()[-3000:])
                time.sleep(0.1)
        finally:
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(30)


@pytest.fixture()
def harness_factory(apiserver: Any, helm: Any, charts: dict[str, str],
                    tmp_path: Path) -> Iterator[Any]:
    made: list[Harness] = []

    def make(*values: str) -> Harness:
        made.append(Harness(apiserver, helm, charts["metax-operator"], tmp_path, list(values)))
        return made[-1]

    yield make
    for h in made:
        h.close()


def test_helm_upgrade_reaches_every_driver_manager_pod(harness_factory: Any) -> None:
    """Issue 28 item 5. deployPolicy Never; two nodes without a driver, two with the
    administrator's. A `helm upgrade` of the SDK images and the log options, then one to
    deployPolicy Always: each reaches every driver-manager pod (at most maxParallel 1
    unavailable at a time), without a drain: no node cordoned or in an upgrade state. The
    nodes without a driver get it; the others already run the version (nothing to do).
    Before the fix the OnDelete DaemonSet's old pods stayed: no convergence."""
    h = harness_factory("--set", "driver.deployPolicy=Never",
                        "--set", "driver.upgradePolicy.maxParallel=1")
    for short, version in (("bare-0", None), ("bare-1", None), ("own-0", OLD),
                           ("own-1", OLD)):
        h.add_node(short, version)
    assert h.run() == 0  # the first pods
    first = {p["metadata"]["name"] for p in h.agents()}
    h.upgrade("--set", f"maca.payload.images={{{SDK2}}}", "--set", "log.level=debug",
              "--set", "maca.log.format=text")
    assert h.run() == 0
    second = {p["metadata"]["name"] for p in h.agents()}
    assert not first & second  # every pod replaced
    h.upgrade("--set", "driver.deployPolicy=Always", "--set", f"driver.payload.version={OLD}")
    assert h.run() == 0
    assert not second & {p["metadata"]["name"] for p in h.agents()}
    for node in h.nodes():
        assert up.STATE_LABEL not in node["metadata"]["labels"], node["metadata"]
        assert json.loads(node["metadata"]["annotations"][REPORT])["version"] == OLD
    def events(reason: str) -> set[str]:
        items = h.core.list_namespaced_event("default", field_selector=f"reason={reason}").items
        return {e.involved_object.name for e in items} & set(h.names)

    assert events("DriverManagerReplaced") == set(h.names)
    assert events("DriverUpgradeStarted") == set()  # no drain


# Every externally visible step of a rolling driver upgrade (controller.STEPS and the
# states of upgrade.py), in the order a node meets them, then the direct replacement of
# an out-of-date driver-manager pod and the status write.
UPGRADE_STEPS = (
    f"node-patched:{up.REQUIRED}", "event:DriverUpgradeRequired",
    f"node-patched:{up.CORDONED}", "event:DriverUpgradeStarted",
    "pod-evicted", f"node-patched:{up.EVICTED}",
    "agent-pod-deleted", f"node-patched:{up.UPGRADING}",
    f"node-patched:{up.FAILED}", "event:DriverUpgradeFailed",
    f"node-patched:{up.VALIDATING}",
    f"node-patched:{up.DONE}", "event:DriverUpgradeDone",
    "event:DriverManagerReplaced", "agent-pod-rolled",  # announced, then deleted
    "status-written",
)


def test_operator_controller_killed_after_every_step_converges(harness_factory: Any) -> None:
    """Issue 28 item 8. Four GPU nodes, maxParallel 2, maxUnavailable 50%. Two rollouts
    (driver version changed by `helm upgrade`, there and back); in each, the process is
    SIGKILLed right after every step of UPGRADE_STEPS, once per node (pod), and restarted
    with the chart's arguments. In each rollout one node already runs the new version (its
    driver-manager pod is only replaced: no drain), one node's install fails once (the
    administrator retries it), GPU pods are to be evicted from the others. Each rollout
    converges: every node at the target, none cordoned or left in an upgrade state, every
    driver-manager pod from the current template; the bounds hold at every observation and
    after every kill."""
    h = harness_factory("--set", "driver.deployPolicy=Always",
                        "--set", f"driver.payload.version={OLD}",
                        "--set", "driver.upgradePolicy.maxParallel=2",
                        "--set", "driver.upgradePolicy.maxUnavailable=50%")
    shorts = ["a", "b", "c", "d"]
    for short in shorts[:3]:
        h.add_node(short, OLD)
    h.add_node("d", None)  # no driver: installed at once, no drain
    # the first start: it creates driver-config, killed right after
    assert h.run(["configmap-created"]) == 1
    assert h.kills() == {"configmap-created": {"driver-config"}}
    for version, ahead, failing in ((NEW, "a", "b"), (OLD, "c", "d")):
        upgraded = {h.name(s) for s in shorts if s != ahead}
        events_before = {e.metadata.name for e in h.core.list_namespaced_event("default").items}
        h.set_driver(ahead, version)  # the administrator upgraded this one by hand
        h.fail.add(h.name(failing))
        jobs = {h.gpu_job(s) for s in shorts if s not in (ahead, failing)}
        h.upgrade("--set", f"driver.payload.version={version}")
        restarts = h.run(UPGRADE_STEPS)
        special = {
            "pod-evicted": jobs, "status-written": {"operator-status"},
            f"node-patched:{up.FAILED}": {h.name(failing)},
            "event:DriverUpgradeFailed": {h.name(failing)},
            "agent-pod-rolled": {h.name(ahead)},
            "event:DriverManagerReplaced": {h.name(ahead)},
        }
        kills = h.kills()
        assert kills == {step: special.get(step, upgraded) for step in UPGRADE_STEPS}
        assert restarts == sum(len(s) for s in kills.values())
        assert not h.fail  # the failing install did happen
        assert h.target() == version
        # every Event once, none lost to a kill (the failing node was started twice)
        recorded: dict[tuple[str, str], int] = {}
        for e in h.core.list_namespaced_event("default").items:
            if e.metadata.name not in events_before and e.involved_object.name in h.names:
                key = (e.involved_object.name, e.reason)
                recorded[key] = recorded.get(key, 0) + 1
        wanted = {(n, r): 1 for n in upgraded for r in (
            "DriverUpgradeRequired", "DriverUpgradeStarted", "DriverUpgradeDone")}
        wanted.update({(h.name(failing), "DriverUpgradeStarted"): 2,
                       (h.name(failing), "DriverUpgradeFailed"): 1,
                       (h.name(ahead), "DriverManagerReplaced"): 1})
        assert recorded == wanted
