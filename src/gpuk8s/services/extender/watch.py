"""List+watch loops feeding the node cache and the bound-pod tracker.

A loop is any ``Callable[[threading.Event], None]`` that runs until the event is set;
``main`` starts the real ones, tests inject their own. The real loop lists (raw JSON,
no model objects: cheap at thousands of nodes), then watches from the list's
resourceVersion with bookmarks, re-watches when the server closes the stream, and
relists after ``410 Gone`` or any error (with jittered backoff). Objects are decoded
with msgspec typed views: only names, annotations and pod requests become Python
objects, so a 5,000-node list costs a fraction of its JSON size.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Iterator
from typing import Any

import msgspec

from ...core.scoring import PodShape
from ..kube import TemporaryApiError, classify
from .cuda import NodeCudaVersions
from .ledger import Ledger, view_assignment
from .nodes import BoundPods, NodeCache
from .packing import NodeRooms, RunningPods, item_room_fields, view_running_fields
from .sharednodes import SharedNodes
from .views import NodeItem, NodeView, ObjectMeta, PodView, node_item

log = logging.getLogger("gpuk8s.extender")

WatchLoop = Callable[[threading.Event], None]
WATCH_TIMEOUT_S = 300


class Gone(Exception):
    """The watch's resourceVersion is too old: relist."""


def _checked(resp: Any) -> Any:
    """Raise the client's ApiException for a non-2xx raw (not preloaded) response."""
    status = getattr(resp, "status", None)
    if isinstance(status, int) and not 200 <= status <= 299:
        from kubernetes.client.exceptions import ApiException

        try:
            body = resp.data.decode("utf-8", errors="replace")
        finally:
            resp.release_conn()
        raise ApiException(status=status, reason=getattr(resp, "reason", ""), body=body)
    return resp


class _ListMeta(msgspec.Struct):
    resourceVersion: str = ""


class _List(msgspec.Struct):
    """A list response: its version and the items, each kept as its JSON text."""

    metadata: _ListMeta = msgspec.field(default_factory=_ListMeta)
    items: list[msgspec.Raw] | None = None


class _Versioned(msgspec.Struct):
    metadata: ObjectMeta | None = None


class _Event(msgspec.Struct):
    type: str = ""
    object: msgspec.Raw = msgspec.Raw()


class _Status(msgspec.Struct):
    code: int | None = None
    message: str | None = None


_LIST = msgspec.json.Decoder(_List)
_VERSIONED = msgspec.json.Decoder(_Versioned)
_EVENT = msgspec.json.Decoder(_Event)
_STATUS = msgspec.json.Decoder(_Status)
_NODE = msgspec.json.Decoder(NodeView)
_POD = msgspec.json.Decoder(PodView)
DECODE_ERRORS = (msgspec.DecodeError, RecursionError, UnicodeDecodeError)


def _events(resp: Any) -> Iterator[_Event]:
    from kubernetes.watch.watch import iter_resp_lines

    _checked(resp)
    try:
        for line in iter_resp_lines(resp):  # type: ignore[no-untyped-call]
            if line and not line.isspace():
                yield _EVENT.decode(line)
    finally:
        resp.close()
        resp.release_conn()


def list_watch(
    list_fn: Callable[..., Any],
    on_list: Callable[[list[msgspec.Raw]], None],
    on_event: Callable[[str, msgspec.Raw], None],
    stop: threading.Event,
    what: str,
    rng: random.Random | None = None,
    **selectors: Any,
) -> None:
    """Generic list-then-watch over a ``CoreV1Api.list_*`` function, until ``stop``.

    Objects reach ``on_list``/``on_event`` as their JSON text: the consumer decodes
    only what it needs, and one object it cannot read is its business (skip and
    report), never a reason to relist."""
    rng = rng or random.Random()
    failures = 0
    while not stop.is_set():
        try:
            resp = _checked(list_fn(_preload_content=False, **selectors))
            listed = _LIST.decode(resp.data)
            version = listed.metadata.resourceVersion
            on_list(listed.items or [])
            failures = 0
            while not stop.is_set():
                resp = list_fn(
                    watch=True,
                    resource_version=version,
                    allow_watch_bookmarks=True,
                    timeout_seconds=WATCH_TIMEOUT_S,
                    _preload_content=False,
                    **selectors,
                )
                for event in _events(resp):
                    kind = event.type
                    if kind == "ERROR":
                        status = _STATUS.decode(event.object) if event.object else _Status()
                        if status.code == 410:
                            raise Gone(status.message or "resource version too old")
                        raise TemporaryApiError(
                            f"watch {what}: {status.message or bytes(event.object)[:200]!r}"
                        )
                    try:
                        meta = _VERSIONED.decode(event.object).metadata
                    except DECODE_ERRORS:
                        meta = None
                    if meta is not None and meta.resourceVersion:
                        version = meta.resourceVersion
                    if kind in ("ADDED", "MODIFIED", "DELETED"):
                        on_event(kind, event.object)
                    if stop.is_set():
                        break
        except Gone as err:
            log.info("watch expired, relisting", extra={"what": what, "reason": str(err)})
            continue
        except Exception as err:
            failures += 1
            error = classify(err, f"list/watch {what}")
            delay = min(30.0, 0.5 * 2 ** min(failures, 6))
            delay = delay / 2 + rng.uniform(0, delay / 2)
            log.warning(
                "list/watch failed, retrying",
                extra={"what": what, "error": str(error), "retry_in_s": round(delay, 2)},
            )
            stop.wait(delay)


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
