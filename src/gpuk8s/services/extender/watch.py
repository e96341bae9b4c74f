"""List+watch loops feeding the node cache and the bound-pod tracker.

A loop is any ``Callable[[threading.Event], None]`` that runs until the event is set;
``main`` starts the real ones, tests inject their own. The real loop lists (raw JSON,
no model objects: cheap at thousands of nodes), then watches from the list's
resourceVersion with bookmarks, re-watches when the server closes the stream, and
relists after ``410 Gone`` or any error (with jittered backoff).
"""

from __future__ import annotations

import json
import logging
import random
import threading
from collections.abc import Callable, Iterator
from typing import Any

from ..kube import TemporaryApiError, classify
from .nodes import BoundPods, NodeCache
from .packing import NodeRooms, RunningPods, node_room_fields, running_fields
from .wire import READ_ANNOTATIONS, BadRequest, pod_request

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


def _events(resp: Any) -> Iterator[dict[str, Any]]:
    from kubernetes.watch.watch import iter_resp_lines

    _checked(resp)
    try:
        for line in iter_resp_lines(resp):  # type: ignore[no-untyped-call]
            if line and not line.isspace():
                yield json.loads(line)
    finally:
        resp.close()
        resp.release_conn()


def list_watch(
    list_fn: Callable[..., Any],
    on_list: Callable[[list[dict[str, Any]]], None],
    on_event: Callable[[str, dict[str, Any]], None],
    stop: threading.Event,
    what: str,
    rng: random.Random | None = None,
    **selectors: Any,
) -> None:
    """Generic list-then-watch over a ``CoreV1Api.list_*`` function, until ``stop``."""
    rng = rng or random.Random()
    failures = 0
    while not stop.is_set():
        try:
            resp = _checked(list_fn(_preload_content=False, **selectors))
            data = json.loads(resp.data)
            version = data["metadata"]["resourceVersion"]
            on_list(data.get("items") or [])
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
                    kind = event.get("type")
                    obj = event.get("object") or {}
                    if kind == "ERROR":
                        if obj.get("code") == 410:
                            raise Gone(obj.get("message", "resource version too old"))
                        raise TemporaryApiError(f"watch {what}: {obj.get('message', obj)}")
                    new_version = (obj.get("metadata") or {}).get("resourceVersion")
                    if new_version:
                        version = new_version
                    if kind in ("ADDED", "MODIFIED", "DELETED"):
                        on_event(kind, obj)
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


def _node_fields(obj: dict[str, Any]) -> tuple[str, dict[str, str]]:
    meta = obj.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    ours = {k: annotations[k] for k in READ_ANNOTATIONS if isinstance(annotations.get(k), str)}
    return str(meta.get("name", "")), ours


def node_watch_loop(
    api_client: Any, cache: NodeCache, rooms: NodeRooms | None = None
) -> WatchLoop:
    """Nodes into the cache (filter) and, when given, into ``rooms`` (prioritize)."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)

    def on_list(items: list[dict[str, Any]]) -> None:
        cache.replace(_node_fields(item) for item in items)
        if rooms is not None:
            rooms.replace(node_room_fields(item) for item in items)
        log.info("node cache synced", extra={"nodes": len(cache)})

    def on_event(kind: str, obj: dict[str, Any]) -> None:
        name, annotations = _node_fields(obj)
        if kind == "DELETED":
            cache.delete(name)
        else:
            cache.upsert(name, annotations)
        if rooms is not None:
            if kind == "DELETED":
                rooms.forget(name)
            else:
                rooms.observe(*node_room_fields(obj))

    def run(stop: threading.Event) -> None:
        list_watch(core.list_node, on_list, on_event, stop, "nodes")

    return run


def pod_fields(obj: dict[str, Any]) -> tuple[str, str | None, int]:
    """(uid, node or None, GPUs) of a pod object; finished pods hold nothing."""
    meta = obj.get("metadata") or {}
    uid = str(meta.get("uid", ""))
    spec = obj.get("spec") or {}
    phase = (obj.get("status") or {}).get("phase")
    node = spec.get("nodeName") or None
    if phase in ("Succeeded", "Failed") or node is None:
        return uid, None, 0
    try:
        gpus = pod_request(obj)
    except BadRequest:
        gpus = 0  # the apiserver validated it; unreadable here means not ours to count
    return uid, node, gpus


def pod_watch_loop(
    api_client: Any, pods: BoundPods, running: RunningPods | None = None
) -> WatchLoop:
    """Bound pods into the GPU promise tracker and, when given, into ``running`` (CPU
    and memory per node, the pod mix)."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)

    def on_list(items: list[dict[str, Any]]) -> None:
        pods.replace(pod_fields(item) for item in items)
        if running is not None:
            running.replace(running_fields(item) for item in items)
        log.info("bound GPU pods synced", extra={"pods": len(pods)})

    def on_event(kind: str, obj: dict[str, Any]) -> None:
        uid, node, gpus = pod_fields(obj)
        if kind == "DELETED":
            pods.forget(uid)
        else:
            pods.set(uid, node, gpus)
        if running is not None:
            if kind == "DELETED":
                running.forget(uid)
            else:
                running.set(*running_fields(obj))

    def run(stop: threading.Event) -> None:
        # only bound pods matter; finished ones are dropped by pod_fields
        list_watch(
            core.list_pod_for_all_namespaces,
            on_list,
            on_event,
            stop,
            "pods",
            field_selector="spec.nodeName!=",
        )

    return run
