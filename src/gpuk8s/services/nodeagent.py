"""What the operator's node agents (driver-manager, container-runtime) share: their view of
their own Node, how they report (one JSON state annotation per agent + Events), a liveness
endpoint and the loop that runs their passes.

Reporting protocol (read by operator-controller, ``kubectl describe node`` shows it):

* annotation ``metax-tech.com/<agent>.state`` on the agent's own Node: compact JSON
  ``{"state": "ready|working|pending|failed|disabled", "message": ..., ...}``, patched
  only when it changes;
* an Event (``involvedObject`` = the Node) when the state changes to ``failed`` or
  ``ready``, reason ``<Agent><State>`` (e.g. ``DriverFailed``).

The operator-controller writes desired state for a node as annotations too
(``metax-tech.com/vfnum.desired``); agents read it from their Node.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from .healthserver import Page, serve_health
from .kube import classify

log = logging.getLogger("gpuk8s.nodeagent")

PREFIX = "metax-tech.com/"
VFNUM_DESIRED = PREFIX + "vfnum.desired"  # written by operator-controller
UNINSTALL = PREFIX + "operator.uninstall"  # set on every node by the uninstall hook
STATES = ("ready", "working", "pending", "failed", "disabled")


def state_annotation(agent: str) -> str:
    return f"{PREFIX}{agent}.state"


class NodeApi(Protocol):
    """The agent's access to its Node (the API server; a dict in unit tests)."""

    def node(self) -> Mapping[str, Any]:
        """The Node object as a dict (metadata.labels/annotations, status.nodeInfo)."""
        ...

    def annotate(self, changes: Mapping[str, str | None]) -> None:
        """Merge-patch the Node's annotations (None removes)."""
        ...

    def event(self, reason: str, message: str, warning: bool) -> None:
        """Record an Event on the Node."""
        ...


class KubeNodeApi:
    """``NodeApi`` over the official client: get/patch on its own node, create events."""

    def __init__(self, api_client: Any, node: str, component: str, namespace: str) -> None:
        from kubernetes import client

        self._core = client.CoreV1Api(api_client)
        self._api_client = api_client
        self.node_name = node
        self.component = component
        self.namespace = namespace or "default"

    def node(self) -> Mapping[str, Any]:
        try:
            obj = self._core.read_node(self.node_name)
        except Exception as err:
            raise classify(err, f"get node {self.node_name}") from err
        data: Mapping[str, Any] = self._api_client.sanitize_for_serialization(obj)
        return data

    def annotate(self, changes: Mapping[str, str | None]) -> None:
        try:
            self._core.patch_node(self.node_name, {"metadata": {"annotations": dict(changes)}},
                                  _content_type="application/merge-patch+json")
        except Exception as err:
            raise classify(err, f"annotate node {self.node_name}") from err

    def event(self, reason: str, message: str, warning: bool) -> None:
        record_event(self._core, self.namespace, self.component, "Node", self.node_name,
                     self.node_name, reason, message, warning)

    def pod_status(self, pod: str) -> Mapping[str, Any]:
        try:
            obj = self._core.read_namespaced_pod(pod, self.namespace)
        except Exception as err:
            raise classify(err, f"get pod {pod}") from err
        status: Mapping[str, Any] = self._api_client.sanitize_for_serialization(obj.status)
        return status


NODE_EVENTS_NAMESPACE = "default"  # the API server puts Events of cluster-scoped objects there


def record_event(core: Any, namespace: str, component: str, kind: str, name: str,
                 node: str | None, reason: str, message: str, warning: bool,
                 object_namespace: str = "", event_name: str | None = None) -> bool:
    """Create a core/v1 Event; failures are logged, never raised (reporting is best effort).
    Returns False only when an Event named ``event_name`` exists already (a caller that
    names its Events records each once, however often it retries).

    Events about a Node (cluster-scoped) must live in ``default`` (API validation; the
    kubelet's are there too), so ``namespace`` is only used for namespaced objects."""
    from kubernetes import client

    if not object_namespace:
        namespace = NODE_EVENTS_NAMESPACE
    # the client writes a datetime as RFC 3339, which the API's metav1.Time reads
    now = datetime.now(UTC).replace(microsecond=0)
    body = client.CoreV1Event(
        metadata=client.V1ObjectMeta(name=event_name, namespace=namespace,
                                     generate_name=None if event_name else f"{name}."),
        involved_object=client.V1ObjectReference(kind=kind, name=name, api_version="v1",
                                                 namespace=object_namespace or None),
        reason=reason, message=message[:1000], type="Warning" if warning else "Normal",
        source=client.V1EventSource(component=component, host=node),
        first_timestamp=now, last_timestamp=now, count=1,
    )
    try:
        core.create_namespaced_event(namespace, body)
    except Exception as err:  # reporting must never stop the agent
        if event_name and getattr(err, "status", None) == 409:
            return False
        log.warning("cannot record event", extra={"reason": reason, "error": str(err)})
    return True


@dataclass
class Report:
    """What an agent says about itself on its Node (see the module doc)."""

    state: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        body = {"state": self.state, "message": self.message, **self.details}
        return json.dumps(body, sort_keys=True, separators=(",", ":"))


class Reporter:
    """Publishes ``Report``s: the annotation when it changed, an Event on a transition to
    ``ready``/``failed`` (or a new failure message). Without an API (``api=None``) it only
    logs."""

    def __init__(self, api: NodeApi | None, agent: str, event_prefix: str) -> None:
        self.api = api
        self.agent = agent
        self.event_prefix = event_prefix
        self._last: Report | None = None

    def publish(self, report: Report) -> None:
        last, self._last = self._last, report
        changed = last is None or (last.state, last.message) != (report.state, report.message)
        level = logging.WARNING if report.state == "failed" else logging.INFO
        if changed:
            log.log(level, report.message, extra={"agent": self.agent, "state": report.state})
        if self.api is None:
            return
        current = None
        try:
            node = self.api.node()
            current = ((node.get("metadata") or {}).get("annotations") or {}).get(
                state_annotation(self.agent))
            if current != report.to_json():
                self.api.annotate({state_annotation(self.agent): report.to_json()})
        except Exception as err:
            self._last = last  # publish again next pass
            log.warning("cannot publish state", extra={"error": str(err)})
            return
        if changed and report.state in ("failed", "ready"):
            reason = self.event_prefix + report.state.capitalize()
            self.api.event(reason, report.message, report.state == "failed")

    def clear(self) -> None:
        if self.api is not None:
            self.api.annotate({state_annotation(self.agent): None})


class Liveness:
    """Last time the agent's loop finished a pass; /healthz fails when it is stale."""

    def __init__(self, stale_after: float) -> None:
        self.stale_after = stale_after
        self.lock = threading.Lock()
        self.last = time.monotonic()
        self.passes = 0
        self.last_error: str | None = None

    def beat(self, error: str | None = None) -> None:
        with self.lock:
            self.last = time.monotonic()
            self.passes += 1
            self.last_error = error

    def status(self) -> tuple[bool, dict[str, Any]]:
        with self.lock:
            age = time.monotonic() - self.last
            body = {"passes": self.passes, "lastError": self.last_error, "age": round(age, 1)}
        return age <= self.stale_after, body


def serve_until_stopped(one_pass: Callable[[], object], interval: float, health_port: int,
                        name: str, stale_after: float,
                        pages: Mapping[str, Page] | None = None) -> None:
    """Run ``one_pass`` every ``interval`` seconds until SIGTERM/SIGINT, with the liveness
    endpoint on ``health_port`` (0: none) failing once no pass finished for ``stale_after``
    (and ``pages``, e.g. ``/metrics``, on the same port)."""
    liveness = Liveness(stale_after)
    if health_port:
        serve_health(health_port, {"/healthz": liveness.status, "/livez": liveness.status},
                     name=f"{name}-health", pages=pages)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    run_passes(one_pass, interval, stop, liveness)


def run_passes(one_pass: Callable[[], object], interval: float, stop: threading.Event,
               liveness: Liveness) -> None:
    """Call ``one_pass`` every ``interval`` seconds until ``stop``; an exception is logged
    and counted, the loop goes on (the next pass retries)."""
    while not stop.is_set():
        error = None
        try:
            one_pass()
        except Exception as err:
            error = f"{type(err).__name__}: {err}"
            log.error("pass failed", extra={"error": error})
        liveness.beat(error)
        stop.wait(interval)


def uninstalling(api: NodeApi | None) -> bool:
    """Whether the uninstall hook marked this node (a stopping agent then cleans up)."""
    if api is None:
        return False
    try:
        annotations = (api.node().get("metadata") or {}).get("annotations") or {}
    except Exception as err:
        log.warning("cannot read the node", extra={"error": str(err)})
        return False
    return UNINSTALL in annotations
