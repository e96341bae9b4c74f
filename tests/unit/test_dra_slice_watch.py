"""gpu-dra's slice watch against a scripted API server whose event order the test sets.

The server keeps Kubernetes' watch semantics: a list answers with its resourceVersion, a
watch from a version sends every change after it (``410 Gone`` once that is compacted
away), a watch without one starts at the current state (synthetic ADDED events, nothing
before). Each watch stream ends after the events it has (as a ``timeoutSeconds`` does),
and the test deletes slices just before chosen watch calls: at the moments a watch that
does not carry its place across lists and streams loses deletes.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from gpuk8s.core.dra import DRIVER
from gpuk8s.services.dra.publisher import KubeSlices

from .test_extender_hostile import _Resp  # a raw response: data for a list, lines for a watch

NODE = "node-a"


def _slice(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name},
            "spec": {"nodeName": NODE, "driver": DRIVER, "pool": {"name": NODE}}}


class ScriptedServer:
    """``list_resource_slice`` of one node's slices; ``before_watch[n]`` runs just before
    the n-th watch call is answered; the watch calls stop after ``watches``."""

    def __init__(self, names: list[str], watches: int) -> None:
        self.version = 0
        self.items: dict[str, dict[str, Any]] = {}
        self.log: list[tuple[int, str, dict[str, Any]]] = []
        self.compacted = 0  # versions up to this one are gone from the log
        self.watch_versions: list[str | None] = []
        self.before_watch: dict[int, Any] = {}
        self.deleted = 0
        self.stop = threading.Event()
        self.watches = watches
        for name in names:
            self._change("ADDED", _slice(name))

    def _change(self, kind: str, body: dict[str, Any]) -> None:
        self.version += 1
        body = json.loads(json.dumps(body))
        body["metadata"]["resourceVersion"] = str(self.version)
        if kind == "DELETED":
            self.items.pop(body["metadata"]["name"])
        else:
            self.items[body["metadata"]["name"]] = body
        self.log.append((self.version, kind, body))

    def delete(self, name: str) -> None:
        self._change("DELETED", self.items[name])
        self.deleted += 1

    def compact(self) -> None:
        self.compacted = self.version

    def list_resource_slice(self, **kw: Any) -> _Resp:
        assert kw["field_selector"] == f"spec.nodeName={NODE},spec.driver={DRIVER}"
        if not kw.get("watch"):
            return _Resp(json.dumps({"metadata": {"resourceVersion": str(self.version)},
                                     "items": list(self.items.values())}).encode())
        calls = len(self.watch_versions)
        self.watch_versions.append(kw.get("resource_version"))
        if calls in self.before_watch:
            self.before_watch[calls](self)
        if calls + 1 >= self.watches:
            self.stop.set()  # this stream is the last one the test lets it read
        since = kw.get("resource_version")
        if not since:  # "start at most recent": the state now, nothing before
            events = [{"type": "ADDED", "object": b} for b in self.items.values()]
        elif int(since) < self.compacted:
            events = [{"type": "ERROR", "object": {"kind": "Status", "code": 410,
                                                   "message": "too old resource version"}}]
        else:
            events = [{"type": k, "object": b} for v, k, b in self.log if v > int(since)]
        return _Resp(b"", [json.dumps(e).encode() + b"\n" for e in events])


def watched(server: ScriptedServer) -> list[int]:
    """Run the real watch until the server stops it: for each ``on_lost`` call, the
    number of deletes the server had made by then."""
    slices = KubeSlices(None)
    slices._api = server  # type: ignore[attr-defined]  # the scripted server in its place
    calls: list[int] = []
    slices.watch_deleted(NODE, lambda: calls.append(server.deleted), server.stop)
    return calls


def test_a_delete_before_the_watch_starts_is_reported() -> None:
    # the kubelet wipes the slices after the publisher's list but before the watch runs
    server = ScriptedServer(["a", "b"], watches=1)
    server.before_watch[0] = lambda s: s.delete("a")
    calls = watched(server)
    assert calls and calls[-1] == 1, f"on_lost calls {calls}: the delete was not reported"


def test_a_delete_between_two_watch_streams_is_reported() -> None:
    # the server closes each stream (timeoutSeconds); the delete lands before the next
    server = ScriptedServer(["a", "b"], watches=3)
    server.before_watch[1] = lambda s: s.delete("b")
    calls = watched(server)
    assert 1 in calls, f"on_lost calls {calls}: the delete between streams was lost"
    listed_at = server.watch_versions[0]
    assert listed_at == "2", "the first watch starts at the list's version"
    assert server.watch_versions[1:] == ["2", "3"], "each next one from the last seen"


def test_a_delete_lost_to_410_gone_is_repaired_by_a_relist() -> None:
    server = ScriptedServer(["a", "b"], watches=3)

    def delete_and_compact(s: ScriptedServer) -> None:
        s.delete("a")
        s.compact()  # the watch's version is compacted away: 410 Gone

    server.before_watch[0] = delete_and_compact
    calls = watched(server)
    assert 1 in calls, f"on_lost calls {calls}: a 410 Gone lost the delete"
    assert server.watch_versions[1] == "3", "after the relist, the watch starts at its version"
