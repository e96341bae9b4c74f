"""One reconcile pass: host root -> wanted labels -> patch of the node's labels.

Split so each piece is testable on its own: ``wanted_labels`` reads the host (readiness
markers through ``host.readiness``); ``NodeLabelStore`` is the only thing that talks to the
API server; ``reconcile`` compares and writes once (compute, then act).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ...core.labels import compute_labels, gfd_machine, is_managed, label_diff, sharing_mode_of
from ...core.model import NodeInventory
from ...core.sharing import MODE_EXCLUSIVE, SHARING_MODE_LABEL
from ...discovery import nvidia
from ...host.readiness import STATUS_DIR, read_readiness
from ..kube import PermanentApiError, classify

# Operator-scheme readiness markers (gpuk8s.host.readiness: one reader, one writer).
DEFAULT_STATUS_DIR = STATUS_DIR
# Set by the node_maintenance role (SPEC §9) while a node is being worked on: the
# labeller must not put back the labels the role removed until the role clears it.
MAINTENANCE_ANNOTATION = "metax-tech.com/maintenance"

Discover = Callable[[str], NodeInventory]
# The labels a node should carry, given its current labels (its sharing mode label)
Wanted = Callable[[Mapping[str, str]], Mapping[str, str]]


def host_fingerprint(host_root: str, status_dir: str = DEFAULT_STATUS_DIR) -> tuple[object, ...]:
    """Cheap signature of what the labels depend on and what changes under the operator
    scheme (readiness markers, the driver module, the PCI functions: VFs, hot-unplug), so
    a change can trigger a pass at once instead of at the next interval."""
    def listing(path: str) -> tuple[str, ...]:
        try:
            return tuple(sorted(os.listdir(os.path.join(host_root, path))))
        except OSError:
            return ()

    def text(path: str) -> str | None:
        try:
            with open(os.path.join(host_root, path), encoding="utf-8", errors="replace") as f:
                return f.read(256)
        except OSError:
            return None

    return (
        tuple(sorted(read_readiness(host_root, status_dir).items())),
        text("sys/module/metax/version"),
        text("sys/module/nvidia/version"),
        text("var/lib/gpuk8s/driver-owner.json"),
        listing("sys/bus/pci/devices"),
        text("opt/maca/Version.txt"),
    )


def wanted_labels(
    host_root: str,
    discover: Discover,
    status_dir: str = DEFAULT_STATUS_DIR,
    sharing_mode: str = MODE_EXCLUSIVE,
) -> tuple[dict[str, str], NodeInventory]:
    """The labels this node should carry, and the inventory they came from
    (``sharing_mode``: the mode gpu-device serves the node in, for GFD's labels)."""
    wanted, inventory = node_labels(host_root, discover, status_dir)
    return wanted({SHARING_MODE_LABEL: sharing_mode}, True), inventory


def node_labels(
    host_root: str,
    discover: Discover,
    status_dir: str = DEFAULT_STATUS_DIR,
) -> tuple[Callable[[Mapping[str, str], bool], dict[str, str]], NodeInventory]:
    """Discover the host once; the labels then depend only on the node's current labels
    (its ``gpuk8s.io/sharing-mode``, read when ``sharing`` is on: the chart's
    ``gpuDevice.sharing``; off, gpu-device serves whole GPUs whatever the label says)."""
    inventory = discover(host_root)
    readiness = read_readiness(host_root, status_dir) if inventory.has_gpus else {}
    machine = gfd_machine(nvidia.machine_type(host_root))

    def wanted(current: Mapping[str, str], sharing: bool) -> dict[str, str]:
        return compute_labels(inventory, readiness=readiness, machine=machine,
                              sharing_mode=sharing_mode_of(current, sharing))

    return wanted, inventory


class NodeLabelStore(Protocol):
    """Where the node's labels live (the API server; a dict in unit tests)."""

    def read(self, node: str) -> tuple[dict[str, str], str | None]:
        """(labels, resourceVersion) of the node."""
        ...

    def annotations(self, node: str) -> Mapping[str, str]:
        """The node's annotations as of the last ``read``."""
        ...

    def patch(
        self, node: str, changes: Mapping[str, str | None], resource_version: str | None
    ) -> None:
        """Apply ``changes`` (None: remove) only if the node is still at ``resource_version``."""
        ...


class KubeNodeLabelStore:
    """``NodeLabelStore`` over the official client; needs RBAC get + patch on nodes."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes import client

        self._core = client.CoreV1Api(api_client)
        self._annotations: dict[str, dict[str, str]] = {}

    def read(self, node: str) -> tuple[dict[str, str], str | None]:
        try:
            obj = self._core.read_node(node)
        except Exception as err:
            raised = classify(err, f"get node {node}")
            if raised.status == 404:
                raise PermanentApiError(
                    f"node {node!r} does not exist; check --node-name / NODE_NAME "
                    "(it must be the Kubernetes node name, usually spec.nodeName)",
                    404,
                ) from err
            raise raised from err
        meta = obj.metadata
        if meta is None:
            raise PermanentApiError(f"get node {node}: the answer has no metadata")
        self._annotations[node] = dict(meta.annotations or {})
        return dict(meta.labels or {}), meta.resource_version

    def annotations(self, node: str) -> Mapping[str, str]:
        return self._annotations.get(node, {})

    def patch(
        self, node: str, changes: Mapping[str, str | None], resource_version: str | None
    ) -> None:
        metadata: dict[str, Any] = {"labels": dict(changes)}
        if resource_version:
            # Precondition: a concurrent writer makes this a 409, i.e. re-read and retry.
            metadata["resourceVersion"] = resource_version
        try:
            self._core.patch_node(
                node,
                {"metadata": metadata},
                _content_type="application/merge-patch+json",
            )
        except Exception as err:
            raise classify(err, f"patch labels of node {node}") from err


@dataclass(frozen=True)
class ReconcileResult:
    node: str
    changes: dict[str, str | None]  # what was (or, in dry-run, would be) written
    current: dict[str, str]  # our labels before the pass
    wanted: dict[str, str]
    applied: bool
    problems: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.changes)


def reconcile(
    store: NodeLabelStore,
    node: str,
    wanted: Mapping[str, str] | Wanted,
    *,
    dry_run: bool = False,
    problems: tuple[str, ...] = (),
    owned: tuple[str, ...] = (),
) -> ReconcileResult:
    """Bring the node's ``metax-tech.com/`` labels and the ``owned`` keys outside that
    prefix (``core.labels.owned_labels``) to ``wanted`` (or to what ``wanted`` makes of the
    node's current labels); other labels untouched."""
    labels, version = store.read(node)
    if callable(wanted):
        wanted = wanted(labels)
    changes = label_diff(labels, wanted, owned=owned)
    ours = {k: v for k, v in labels.items() if is_managed(k, owned)}
    applied = False
    since = store.annotations(node).get(MAINTENANCE_ANNOTATION)
    if since is not None:
        problems = (
            *problems,
            f"node is in maintenance since {since} ({MAINTENANCE_ANNOTATION}): labels left alone",
        )
        dry_run = True
    if changes and not dry_run:
        store.patch(node, changes, version)
        applied = True
    return ReconcileResult(
        node=node,
        changes=dict(changes),
        current=ours,
        wanted=dict(wanted),
        applied=applied,
        problems=problems,
    )


def format_diff(result: ReconcileResult) -> str:
    """Human-readable diff: ``+ key=value``, ``~ key: old -> new``, ``- key``."""
    lines = [
        f"node {result.node}: "
        + (f"{len(result.changes)} label change(s)" if result.changes else "labels up to date")
    ]
    for key in sorted(result.changes):
        new = result.changes[key]
        old = result.current.get(key)
        if new is None:
            lines.append(f"- {key} (was {old})")
        elif old is None:
            lines.append(f"+ {key}={new}")
        else:
            lines.append(f"~ {key}: {old} -> {new}")
    for problem in result.problems:
        lines.append(f"! discovery: {problem}")
    return "\n".join(lines)
