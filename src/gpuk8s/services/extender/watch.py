"""List+watch loops feeding the node cache and the bound-pod tracker.

A loop is any ``Callable[[threading.Event], None]`` that runs until the event is set;
``main`` starts the real ones, tests inject their own. The real loops are
``services.listwatch.list_watch`` (raw JSON, no model objects: cheap at thousands of
nodes; watched from the list's resourceVersion, relisted after ``410 Gone``). Objects
are decoded with msgspec typed views: only names, annotations and pod requests become Python
objects, so a 5,000-node list costs a fraction of its JSON size.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import msgspec

from ...core.scoring import PodShape
from ..listwatch import DECODE_ERRORS, list_watch
from .cuda import NodeCudaVersions
from .ledger import Ledger, view_assignment
from .nodes import BoundPods, NodeCache
from .packing import NodeRooms, RunningPods, item_room_fields, view_running_fields
from .sharednodes import SharedNodes
from .views import NodeItem, NodeView, PodView, node_item

log = logging.getLogger("gpuk8s.extender")

WatchLoop = Callable[[threading.Event], None]

_NODE = msgspec.json.Decoder(NodeView)
_POD = msgspec.json.Decoder(PodView)


def _node(raw: msgspec.Raw, cache: NodeCache) -> NodeItem | None:
    """The node of a list item or watch event, or None (skipped and reported)."""
    try:
        return node_item(_NODE.decode(raw))
    except DECODE_ERRORS as err:
        cache.skip_unreadable(bytes(raw)[:120].decode("utf-8", "replace"), str(err))
        return None


Handlers = tuple[Callable[[list[msgspec.Raw]], None], Callable[[str, msgspec.Raw], None]]


def node_handlers(
    cache: NodeCache,
    rooms: NodeRooms | None = None,
    shared: SharedNodes | None = None,
    cuda: NodeCudaVersions | None = None,
) -> Handlers:
    """(on_list, on_event) feeding ``cache`` and, when given, ``rooms``, ``shared`` (GPU
    sharing) and ``cuda`` (the nodes' CUDA version labels): unreadable objects are
    skipped and counted, nodes with unusable annotations are cached as such (filter
    excludes them)."""

    def on_list(items: list[msgspec.Raw]) -> None:
        nodes = [node for node in (_node(raw, cache) for raw in items) if node]
        # the views derived from the list first, the cache last: its replace marks the
        # node cache synced (readiness), and a ready gpu-aware must know every node in
        # each of them (a sharing bind asked just after a restart found its node missing)
        if rooms is not None:
            rooms.replace(map(item_room_fields, nodes))
        if shared is not None:
            shared.replace(nodes)
        if cuda is not None:
            cuda.replace(nodes)
        cache.replace(nodes)
        log.info(
            "node cache synced",
            extra={"nodes": len(cache), "unusable": cache.broken, "skipped": cache.unreadable},
        )

    def on_event(kind: str, raw: msgspec.Raw) -> None:
        node = _node(raw, cache)
        if node is None:
            return
        if kind == "DELETED":
            cache.delete(node.name)
            if rooms is not None:
                rooms.forget(node.name)
            if shared is not None:
                shared.forget(node.name)
            if cuda is not None:
                cuda.forget(node.name)
        else:
            cache.upsert_item(node)
            if rooms is not None:
                rooms.observe_item(node)
            if shared is not None:
                shared.observe(node)
            if cuda is not None:
                cuda.observe(node)

    return on_list, on_event


def node_watch_loop(
    api_client: Any,
    cache: NodeCache,
    rooms: NodeRooms | None = None,
    shared: SharedNodes | None = None,
    cuda: NodeCudaVersions | None = None,
) -> WatchLoop:
    """Nodes into the cache (filter) and, when given, into ``rooms`` (prioritize),
    ``shared`` (GPU sharing) and ``cuda`` (the CUDA check)."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    on_list, on_event = node_handlers(cache, rooms, shared, cuda)

    def run(stop: threading.Event) -> None:
        list_watch(core.list_node, on_list, on_event, stop, "nodes")

    return run


def _pod(raw: msgspec.Raw) -> tuple[str, str | None, PodShape] | None:
    try:
        return view_running_fields(_POD.decode(raw))
    except DECODE_ERRORS as err:
        log.warning("pod object skipped", extra={"error": str(err)[:300]})
        return None


def pod_handlers(pods: BoundPods, running: RunningPods | None = None) -> Handlers:
    """(on_list, on_event) feeding the GPU promise tracker ``pods`` and, when given,
    ``running`` (CPU and memory per node, the pod mix)."""

    def on_list(items: list[msgspec.Raw]) -> None:
        listed = [fields for fields in map(_pod, items) if fields is not None]
        pods.replace((uid, node, shape[0]) for uid, node, shape in listed)
        if running is not None:
            running.replace(listed)
        log.info("bound GPU pods synced", extra={"pods": len(pods)})

    def on_event(kind: str, raw: msgspec.Raw) -> None:
        fields = _pod(raw)
        if fields is None:
            return
        uid, node, shape = fields
        if kind == "DELETED":
            pods.forget(uid)
            if running is not None:
                running.forget(uid)
        else:
            pods.set(uid, node, shape[0])
            if running is not None:
                running.set(uid, node, shape)

    return on_list, on_event


def pod_watch_loop(
    api_client: Any, pods: BoundPods, running: RunningPods | None = None
) -> WatchLoop:
    """Bound pods into the GPU promise tracker and, when given, into ``running``."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    on_list, on_event = pod_handlers(pods, running)

    def run(stop: threading.Event) -> None:
        # only bound pods matter; finished ones are dropped by view_running_fields
        list_watch(
            core.list_pod_for_all_namespaces,
            on_list,
            on_event,
            stop,
            "pods",
            field_selector="spec.nodeName!=",
        )

    return run


def _assignment(raw: msgspec.Raw) -> tuple[str, Any, float | None] | None:
    try:
        return view_assignment(_POD.decode(raw))
    except DECODE_ERRORS as err:
        log.warning("pod object skipped", extra={"error": str(err)[:300]})
        return None


def ledger_handlers(ledger: Ledger) -> Handlers:
    """(on_list, on_event) feeding the GPU-sharing ledger from pod annotations."""

    def on_list(items: list[msgspec.Raw]) -> None:
        listed = [fields for fields in map(_assignment, items) if fields is not None]
        held = [(uid, a, since) for uid, a, since in listed if uid and a is not None]
        ledger.replace(
            ((uid, a) for uid, a, _ in held),
            {uid: since for uid, _, since in held if since is not None},
        )
        log.info("GPU sharing assignments synced", extra={"pods": len(ledger)})

    def on_event(kind: str, raw: msgspec.Raw) -> None:
        fields = _assignment(raw)
        if fields is None or not fields[0]:
            return
        uid, assignment, since = fields
        if kind == "DELETED":
            ledger.set(uid, None, deleted=True)
        else:
            ledger.set(uid, assignment, awaiting=since)

    return on_list, on_event


def ledger_watch_loop(api_client: Any, ledger: Ledger) -> WatchLoop:
    """Every pod's sharing assignment into ``ledger`` (bound or not: a pod holds its
    GPUs from the moment the extender wrote its assignment)."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    on_list, on_event = ledger_handlers(ledger)

    def run(stop: threading.Event) -> None:
        list_watch(core.list_pod_for_all_namespaces, on_list, on_event, stop, "sharing pods")

    return run
