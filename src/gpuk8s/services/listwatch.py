"""List-then-watch over a ``list_*`` function of the official client, until stopped.

Kubernetes' watch contract: list, then watch from the list's ``resourceVersion`` (every
change after the list arrives as an event, none is lost between the two), re-watch from
the last version seen when the server closes the stream (bookmarks keep that version
fresh), and list again after ``410 Gone`` or any error, since events may then have been
missed. gpu-aware's node and pod caches and gpu-dra's slice watch all run this one loop.

Objects are handed on as their JSON text (``msgspec.Raw``): each consumer decodes only
what it needs.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Iterator
from typing import Any

import msgspec

from .kube import TemporaryApiError, classify

log = logging.getLogger("gpuk8s.listwatch")

WATCH_TIMEOUT_S = 300
DECODE_ERRORS = (msgspec.DecodeError, RecursionError, UnicodeDecodeError)


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


class _Meta(msgspec.Struct):
    resourceVersion: str | None = None


class _Versioned(msgspec.Struct):
    metadata: _Meta | None = None


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
    """List-then-watch over ``list_fn`` (a ``*Api.list_*`` function), until ``stop``.

    ``on_list`` gets every item after each (re)list, ``on_event`` each ADDED, MODIFIED
    and DELETED event after it. Objects reach them as their JSON text: one object a
    consumer cannot read is its business (skip and report), never a reason to relist."""
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
