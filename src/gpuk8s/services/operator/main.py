"""`gpuk8s serve operator-controller`: reconcile the operator scheme (see controller.py).

    gpuk8s serve operator-controller --namespace NS [--interval 5] [--health-port 8081]
        [--driver-deploy-policy Always --driver-version V] [--upgrade-max-parallel 1 ...]
    gpuk8s serve operator-controller --namespace NS --uninstall     (helm pre-delete hook)

Exit codes: 0 stopped by a signal / uninstall complete, 1 uninstall incomplete (what is
left is printed), 2 bad configuration.

Test hook: with ``$GPUK8S_TEST_KILL_AFTER`` set to step names (comma-separated:
``controller.STEPS``, ``node-patched:<state>``, ``event:<reason>``) and
``$GPUK8S_TEST_KILL_LOG`` to a file, the process kills itself with SIGKILL right after each
such step, once per step and subject (node, pod) over all its restarts, recording each kill
in the file (the crash-resume test,
tests/integration/test_operator_kill_apiserver.py). Unset in the chart.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...ansible.eviction import PodRef
from ...core.errors import ConfigError, GpuK8sError
from ...core.labels import PREFIX
from ...host.driver import check_version
from ..flags import add_health_port_argument, add_kubeconfig_argument, add_log_arguments
from ..kube import api_client, classify
from ..logging_setup import LogOptions, configure_logging
from ..nodeagent import UNINSTALL, record_event, serve_until_stopped
from . import upgrade
from .controller import CONFIG_NAME, STATUS_NAME, Controller

log = logging.getLogger("gpuk8s.operator-controller")

# Every node agent DaemonSet the chart may deploy (app.kubernetes.io/name), stopped by the
# uninstall hook so each cleans its node (container-runtime last, see KubeCluster.uninstall)
NODE_AGENTS = ("container-runtime", "driver-manager", "gpu-device", "gpu-dra", "gpu-exporter",
               "gpu-label", "gpu-mps")
# DaemonSet names where they differ from the component (app.kubernetes.io/name) name: the
# manual finds gpu-device's pods as metax-gpu-device-xxxxx
DAEMONSET_NAMES = {"gpu-device": "metax-gpu-device", "gpu-dra": "metax-gpu-dra"}
GPU_NODES = PREFIX + "gpu.installed=true"


def selected(base: str, node_selector: str) -> str:
    """The label selector of ``base`` (may be empty) ANDed with the release's node selector
    (empty: every node)."""
    return ",".join(s for s in (base, node_selector.strip()) if s)


_SELECTOR_TERM = re.compile(
    r"^(?:[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
    r"=(?:[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


def check_node_selector(node_selector: str) -> None:
    """``--node-selector``: empty, or comma-separated ``key=value`` terms (what the chart
    renders from its nodeSelector map); ConfigError naming the bad term otherwise."""
    for term in node_selector.split(",") if node_selector else ():
        if not _SELECTOR_TERM.match(term):
            raise ConfigError(f"--node-selector: {term!r} must be key=value (a label key and "
                              "value, terms joined by commas), or the whole selector empty")


class KubeCluster:
    """``controller.Cluster`` over the official client, in one namespace; it acts only on
    the nodes ``node_selector`` (a label selector, the release's nodeSelector; empty: every
    node) selects."""

    def __init__(self, api_client_: Any, namespace: str, node_selector: str = "") -> None:
        from kubernetes import client

        self.client = api_client_
        self.core = client.CoreV1Api(api_client_)
        self.apps = client.AppsV1Api(api_client_)
        self.namespace = namespace
        self.node_selector = node_selector

    def _plain(self, obj: Any) -> Any:
        return self.client.sanitize_for_serialization(obj)

    def _read(self, what: str, read: Callable[[], Any]) -> Mapping[str, Any] | None:
        """``read()`` as plain data; None when the object does not exist."""
        try:
            found: Mapping[str, Any] = self._plain(read())
            return found
        except Exception as err:
            error = classify(err, what)
            if error.status == 404:
                return None
            raise error from err

    def get_configmap(self, name: str) -> Mapping[str, Any] | None:
        return self._read(f"get configmap {name}", lambda: self.core.read_namespaced_config_map(
            name, self.namespace))

    def create_configmap(self, name: str, data: Mapping[str, str],
                         labels: Mapping[str, str]) -> None:
        from kubernetes import client

        body = client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name, labels=dict(labels)),
                                  data=dict(data))
        try:
            self.core.create_namespaced_config_map(self.namespace, body)
        except Exception as err:
            error = classify(err, f"create configmap {name}")
            if error.status != 409:  # someone created it meanwhile: theirs wins
                raise error from err

    def put_status(self, name: str, data: Mapping[str, str]) -> None:
        current = self.get_configmap(name)
        if current is None:
            self.create_configmap(name, data, {"app.kubernetes.io/managed-by":
                                               "operator-controller"})
        elif (current.get("data") or {}) != dict(data):
            try:
                self.core.patch_namespaced_config_map(name, self.namespace, {"data": dict(data)})
            except Exception as err:
                raise classify(err, f"update configmap {name}") from err

    def gpu_nodes(self) -> list[Mapping[str, Any]]:
        try:
            items = self.core.list_node(
                label_selector=selected(GPU_NODES, self.node_selector)).items
        except Exception as err:
            raise classify(err, "list nodes") from err
        return [self._plain(n) for n in items]

    def annotate_node(self, node: str, changes: Mapping[str, str | None]) -> None:
        self.patch_node(node, {"metadata": {"annotations": dict(changes)}})

    def patch_node(self, node: str, body: Mapping[str, Any]) -> None:
        try:
            self.core.patch_node(node, dict(body),
                                 _content_type="application/merge-patch+json")
        except Exception as err:
            raise classify(err, f"patch node {node}") from err

    def pods(self, selector: str) -> list[Mapping[str, Any]]:
        try:
            items = self.core.list_namespaced_pod(self.namespace, label_selector=selector).items
        except Exception as err:
            raise classify(err, "list pods") from err
        return [self._plain(p) for p in items]

    def daemonset(self, name: str) -> Mapping[str, Any] | None:
        return self._read(f"get daemonset {name}", lambda: self.apps.read_namespaced_daemon_set(
            name, self.namespace))

    def delete_pod(self, name: str) -> None:
        try:
            self.core.delete_namespaced_pod(name, self.namespace)
        except Exception as err:
            error = classify(err, f"delete pod {name}")
            if error.status != 404:
                raise error from err

    def node_pods(self, node: str, selector: str) -> list[Mapping[str, Any]]:
        """Every pod bound to ``node`` (all namespaces), optionally filtered by a label
        selector (driver.upgradePolicy.podSelector)."""
        try:
            items = self.core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={node}", label_selector=selector or None).items
        except Exception as err:
            raise classify(err, f"list pods on {node}") from err
        return [self._plain(p) for p in items]

    def evict(self, pod: PodRef) -> tuple[int, str]:
        """The Eviction API (honours PodDisruptionBudgets): HTTP status and message."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        body = client.V1Eviction(metadata=client.V1ObjectMeta(name=pod.name,
                                                              namespace=pod.namespace))
        try:
            self.core.create_namespaced_pod_eviction(pod.name, pod.namespace, body)
        except ApiException as err:
            return int(err.status or 0), _api_message(err)
        except Exception as err:
            raise classify(err, f"evict pod {pod}") from err
        return 201, ""

    def event(self, kind: str, name: str, reason: str, message: str, warning: bool,
              event_name: str | None = None) -> bool:
        return record_event(self.core, self.namespace, "operator-controller", kind, name, None,
                            reason, message, warning,
                            object_namespace=self.namespace if kind == "ConfigMap" else "",
                            event_name=event_name)

    # ------------------------------------------------------------------ uninstall
    def _delete_and_wait(self, kind: str, names: Sequence[str], deadline: float) -> list[str]:
        """Delete workloads (foreground) and wait for their pods; the pods left."""
        delete = (self.apps.delete_namespaced_deployment if kind == "deployment"
                  else self.apps.delete_namespaced_daemon_set)
        for name in names:
            try:
                delete(DAEMONSET_NAMES.get(name, name) if kind == "daemonset" else name,
                       self.namespace, propagation_policy="Foreground")
            except Exception as err:
                error = classify(err, f"delete {kind} {name}")
                if error.status != 404:
                    raise error from err
        left: list[str] = []
        while time.monotonic() < deadline:
            left = [str(p["metadata"]["name"]) for p in self.pods(
                "app.kubernetes.io/name in (" + ",".join(names) + ")")]
            if not left:
                break
            time.sleep(2)
        return left

    def uninstall(self, timeout: float, agents: Sequence[str] = NODE_AGENTS,
                  controller: bool = True) -> tuple[list[str], list[str]]:
        """(done, left): see docs/operator.md, "Uninstall". Order: the controller first (it
        would recreate what is cleaned), then every node agent but container-runtime, then
        container-runtime (it takes the runtime handler away last). ``controller=False``
        (the GPU Extensions chart's hook, ``gpuk8s serve node-cleanup``): no controller to
        stop and no ConfigMap of its to delete; ``agents`` are that chart's."""
        done: list[str] = []
        deadline = time.monotonic() + timeout
        if controller:
            left = self._delete_and_wait("deployment", ["operator-controller"], deadline)
            if left:
                return done, [f"operator-controller still running: {', '.join(left)}"]
            done.append("operator-controller stopped")
        nodes = self.gpu_nodes()
        for node in nodes:
            self.annotate_node(str(node["metadata"]["name"]), {UNINSTALL: "true"})
        done.append(f"marked {len(nodes)} GPU node(s) for uninstall")
        last = [n for n in agents if n == "container-runtime"]
        for group in filter(None, ([n for n in agents if n not in last], last)):
            left = self._delete_and_wait("daemonset", group, deadline)
            if left:
                return done, [f"pods still terminating after {timeout:.0f}s: {', '.join(left)}"]
            done.append(f"{', '.join(group)} stopped")
        done.append("node agents stopped (each cleaned up its node)")
        try:  # the release's nodes only: another release's (a scheme beside) keep theirs
            every = [self._plain(n) for n in self.core.list_node(
                label_selector=self.node_selector or None).items]
        except Exception as err:
            raise classify(err, "list nodes") from err
        cleaned = 0
        lifted: list[str] = []
        for node in every:
            meta = node.get("metadata") or {}
            name = str(meta["name"])
            labels = {k: None for k in meta.get("labels") or {} if k.startswith(PREFIX)}
            notes = {k: None for k in meta.get("annotations") or {} if k.startswith(PREFIX)}
            if not labels and not notes:
                continue
            # the upgrade's record goes with this patch: its cordon is decided now, in the
            # same patch (a failure leaves both, and a second uninstall decides again)
            lift, kept = upgrade.cordon_at_uninstall(node)
            body: dict[str, Any] = {"metadata": {"labels": labels, "annotations": notes}}
            if lift:
                body["spec"] = {"unschedulable": False}
            if kept:
                self.event("Node", name, "DriverUpgradeInterrupted",
                           f"operator uninstalled during a driver upgrade: node {kept}", True)
                done.append(f"warning: node {name} {kept}")
            self.patch_node(name, body)
            cleaned += 1
            if lift:
                lifted.append(name)
        done.append(f"{PREFIX} labels and annotations removed from {cleaned} node(s)")
        if lifted:
            done.append(f"uncordoned {len(lifted)} node(s) an unfinished driver upgrade had "
                        f"cordoned before changing anything: {', '.join(lifted)}")
        for name in (CONFIG_NAME, STATUS_NAME) if controller else ():
            try:
                self.core.delete_namespaced_config_map(name, self.namespace)
                done.append(f"configmap {name} deleted")
            except Exception as err:
                error = classify(err, f"delete configmap {name}")
                if error.status != 404:
                    raise error from err
        return done, []


def _api_message(err: Any) -> str:
    try:
        return str(json.loads(err.body).get("message") or err.reason)
    except (TypeError, ValueError, AttributeError):
        return str(err.reason)


KILL_AFTER_ENV = "GPUK8S_TEST_KILL_AFTER"
KILL_LOG_ENV = "GPUK8S_TEST_KILL_LOG"


def kill_after(steps: str | None, kill_log: str | None) -> Callable[[str, str], None]:
    """``Controller.after_step`` for the test hook: SIGKILL this process right after each
    step named in ``steps`` (comma-separated; None: never), once per subject: each kill is
    first appended to the file ``kill_log`` as ``<step> <subject>``, and a (step, subject)
    found there is not killed again (a restarted controller that repeats the step must get
    past it)."""
    names = {s.strip() for s in (steps or "").split(",") if s.strip()}

    def after_step(step: str, subject: str) -> None:
        if step not in names or not kill_log:
            return
        line = f"{step} {subject}"
        try:
            with open(kill_log, encoding="utf-8") as handle:
                if line in handle.read().splitlines():
                    return
        except FileNotFoundError:
            pass
        with open(kill_log, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        sys.stderr.write(f"gpuk8s-test: SIGKILL after {line}\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    return after_step


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpuk8s serve operator-controller",
        description="operator-controller: owns ConfigMap driver-config (VF counts per node), "
        "reports the operator scheme's state per node, cleans up on uninstall",
    )
    p.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE", ""),
                   help="the release namespace (default $POD_NAMESPACE)")
    p.add_argument("--vfnum-configmap", default=CONFIG_NAME,
                   help="name of the VF config ConfigMap (fixed: driver-config, SPEC §6)")
    p.add_argument("--driver-deploy-policy", default="IfNotPresent",
                   choices=("IfNotPresent", "Always", "Never"),
                   help="the chart's driver.deployPolicy (reported in the status)")
    p.add_argument("--driver-version", default="",
                   help="the wanted driver version (driver.payload.version): with "
                   "--driver-deploy-policy Always, nodes running another version are upgraded "
                   "one by one (rolling upgrade)")
    p.add_argument("--upgrade-max-parallel", type=int, default=1,
                   help="driver.upgradePolicy.maxParallel: nodes upgraded at the same time")
    p.add_argument("--upgrade-max-unavailable", default="25%",
                   help="driver.upgradePolicy.maxUnavailable: GPU nodes that may be "
                   "unavailable (cordoned or NotReady) at once, a count or a percentage")
    p.add_argument("--upgrade-drain-timeout", type=float, default=300.0,
                   help="driver.upgradePolicy.drainTimeoutSeconds")
    p.add_argument("--upgrade-timeout", type=float, default=600.0,
                   help="driver.upgradePolicy.upgradeTimeoutSeconds (install + validation)")
    p.add_argument("--upgrade-force", action="store_true",
                   help="driver.upgradePolicy.force: also evict GPU pods no controller "
                   "recreates")
    p.add_argument("--upgrade-delete-emptydir-data", action="store_true",
                   help="driver.upgradePolicy.deleteEmptyDirData: also evict GPU pods with "
                   "emptyDir volumes")
    p.add_argument("--upgrade-pod-selector", default="",
                   help="driver.upgradePolicy.podSelector: evict only the GPU pods with these "
                   "labels (a label selector; empty: every GPU pod)")
    p.add_argument("--node-selector", default="",
                   help="label selector of the nodes this release serves (the chart's "
                   "nodeSelector): the controller and its uninstall act on those only "
                   "(default: every node)")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between passes")
    add_health_port_argument(p, serves="GET /healthz, /livez, /metrics")
    add_kubeconfig_argument(p, used_for="the cluster the operator runs")
    p.add_argument("--once", action="store_true", help="one pass, print the status, exit")
    p.add_argument("--uninstall", action="store_true",
                   help="helm pre-delete hook: stop the node agents, clean the nodes, exit")
    p.add_argument("--uninstall-timeout", type=float, default=240.0)
    add_log_arguments(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        configure_logging(LogOptions.from_args(args), component="operator-controller")
        if not args.namespace:
            raise ConfigError("--namespace: required (or set POD_NAMESPACE)")
        if args.vfnum_configmap != CONFIG_NAME:
            raise ConfigError(f"--vfnum-configmap: must be {CONFIG_NAME} (SPEC §6)")
        if not args.interval > 0:
            raise ConfigError(f"--interval: {args.interval} must be positive")
        policy = upgrade.Policy(
            max_parallel=args.upgrade_max_parallel,
            max_unavailable=args.upgrade_max_unavailable,
            drain_timeout=args.upgrade_drain_timeout, upgrade_timeout=args.upgrade_timeout,
            force=args.upgrade_force, delete_emptydir_data=args.upgrade_delete_emptydir_data,
            pod_selector=args.upgrade_pod_selector)
        policy.check()
        check_version("--driver-version", args.driver_version or None)
        target = upgrade.Target(version=args.driver_version or None
                                if args.driver_deploy_policy == "Always" else None)
        check_node_selector(args.node_selector)
        cluster = KubeCluster(api_client(args.kubeconfig), args.namespace, args.node_selector)
    except GpuK8sError as err:
        print(f"gpuk8s serve operator-controller: error: {err}", file=sys.stderr)
        return 2
    if args.uninstall:
        done, left = cluster.uninstall(args.uninstall_timeout)
        for line in done:
            print(line)
        for line in left:
            print(f"left: {line}", file=sys.stderr)
        return 1 if left else 0
    controller = Controller(cluster, {"app.kubernetes.io/managed-by": "operator-controller",
                                      "app.kubernetes.io/part-of": "metax-operator"},
                            target=target, policy=policy,
                            after_step=kill_after(os.environ.get(KILL_AFTER_ENV) or None,
                                                  os.environ.get(KILL_LOG_ENV) or None))
    if args.once:
        status = controller.one_pass()
        print(status["summary"])
        return 0
    log.info("starting", extra={"namespace": args.namespace, "policy": args.driver_deploy_policy})

    serve_until_stopped(controller.one_pass, args.interval, args.health_port, "operator-controller",
                        max(120.0, 10 * args.interval),
                        pages={"/metrics": controller.metrics.render})
    log.info("stopped")
    return 0
