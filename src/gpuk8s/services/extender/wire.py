"""The kube-scheduler extender wire format (k8s.io/kube-scheduler/extender/v1).

The extender structs carry no json tags, so the scheduler sends and expects the Go
field names (``Pod``, ``Nodes``, ``NodeNames``; ``FailedNodes``, ``Host``, ``Score``...).
Go's decoder matches keys case-insensitively; so do we. Objects inside (the Pod and
the NodeList) are ordinary Kubernetes JSON with lower-camel keys, read through the
typed views of ``views`` (everything else in a Node -- images, conditions, managed
fields: ~95 % of a full-list request -- is skipped, not built into Python objects).

``parse_args`` decodes a filter or prioritize body once: the pod (its ``Demand``
computed once, ``demand.pod_demand``), the candidates (``Nodes`` or ``NodeNames``) and
where the Nodes sit in the body, so that a filter answer echoes the kept Node objects
as the very bytes of the request (``node_raws``). ``parse_bind`` decodes a bind body.
Memory per request is a small multiple of the body (``docs/extender.md``, "Limits"),
and hostile values cost no more than their size.

A request that does not follow the protocol raises ``BadRequest`` naming the field (an
HTTP 400). A *node* whose GPU annotations are unusable is not the request's fault: it
is excluded from filter with a reason (``NodeItem.problem``), never a 400 or a 500.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from dataclasses import dataclass

import msgspec
from msgspec import Raw, Struct

from ...core.sharing import ShareRequest
from .demand import (
    Demand,
    PodTotals,
    cpu_milli,
    decode_pod,
    memory_mib,
    pod_demand,
    pod_request,
    pod_totals,
)
from .views import (
    EXPECTED,
    GOT_WORDS,
    POD,
    READ_ANNOTATIONS,
    UNKNOWN_FIELD,
    BadRequest,
    NodeItem,
    NodeView,
    ObjectMeta,
    PodView,
    decode,
    decode_error,
    node_item,
)

# what tests and tools import from here (the wire format's neighbours, re-exported)
__all__ = [
    "MAX_EXTENDER_PRIORITY",
    "READ_ANNOTATIONS",
    "BadRequest",
    "BindArgs",
    "Demand",
    "ExtenderArgs",
    "NodeItem",
    "NodeView",
    "PodTotals",
    "PodView",
    "cpu_milli",
    "decode_pod",
    "error_body",
    "go_strings",
    "memory_mib",
    "node_item",
    "node_raws",
    "parse_args",
    "parse_bind",
    "pod_request",
    "pod_totals",
]

MAX_EXTENDER_PRIORITY = 10
MIN_EXTENDER_PRIORITY = 0
# Largest NodeNames / Nodes.items accepted: Kubernetes supports 5,000 nodes per cluster.
# Checked before the names are built, so a body of tiny names cannot multiply memory.
MAX_NODES = 50_000
# Bodies up to this size may spell the top-level keys in any case (Go's rule); larger
# ones must use Go's field names exactly, as kube-scheduler does (bounded fallback).
CASE_FOLD_MAX_BODY = 1024 * 1024

_ARGS_FIELDS = {"pod": "Pod", "nodes": "Nodes", "nodenames": "NodeNames"}
_EMPTY = Raw()


class _Unreadable(BadRequest):
    """The body is not JSON as msgspec reads it (``go_strings`` may make it so)."""


# -- the request's own structs (the objects inside are ``views``) ------------------------
# (gc=False: plain data without reference cycles, 16 bytes less per object)
class _RawArgs(Struct, gc=False):
    """The fields as JSON text (the case-insensitive fallback)."""

    Pod: Raw = _EMPTY
    Nodes: Raw = _EMPTY
    NodeNames: Raw = _EMPTY


class _NodeList(Struct, gc=False):
    metadata: Raw = _EMPTY
    items: list[NodeView] | None = None


class _NodeListRaw(Struct, gc=False):
    metadata: Raw = _EMPTY
    items: list[Raw] | None = None


class _Args(Struct, forbid_unknown_fields=True, gc=False):
    """ExtenderArgs as kube-scheduler spells it, decoded in one pass."""

    Pod: PodView | None = None
    Nodes: _NodeList | None = None
    NodeNames: Raw = _EMPTY  # counted before the names are built


class _EchoArgs(Struct, gc=False):
    """Second pass for a filter answer: each node's JSON text, to echo kept ones."""

    Nodes: _NodeListRaw | None = None


_ARGS = msgspec.json.Decoder(_Args)
_ECHO_ARGS = msgspec.json.Decoder(_EchoArgs)
_NODE_LIST = msgspec.json.Decoder(_NodeList)
_NODE_LIST_RAW = msgspec.json.Decoder(_NodeListRaw)
_NAMES = msgspec.json.Decoder(list[str])
_KEYS = msgspec.json.Decoder(dict[str, Raw])


@dataclass(frozen=True)
class ExtenderArgs:
    """A filter or prioritize request, decoded once (``parse_args``)."""

    pod_uid: str
    pod_ref: str  # namespace/name, for messages
    nodes: list[NodeItem] | None  # nodeCacheCapable: false
    node_names: list[str] | None  # nodeCacheCapable: true
    demand: Demand = dataclasses.field(default_factory=Demand)  # demand.pod_demand
    # where filter finds the Nodes as sent, to echo kept items: the whole body, or the
    # Nodes value itself (after the case-insensitive fallback)
    body: bytes = b""
    nodes_raw: Raw = dataclasses.field(default_factory=Raw)
    pod_name: str = ""
    pod_namespace: str = ""

    @property
    def gpus(self) -> int:
        return self.demand.gpus

    @property
    def cpu_milli(self) -> int:
        return self.demand.cpu_milli

    @property
    def memory_mib(self) -> int:
        return self.demand.memory_mib

    @property
    def share(self) -> ShareRequest | None:
        return self.demand.share

    @property
    def cuda_runtime(self) -> bytes | None:
        return self.demand.cuda_runtime

    def names(self) -> list[str]:
        """The candidates' names in request order (a fresh list)."""
        if self.nodes is not None:
            return [n.name for n in self.nodes]
        return list(self.node_names or ())


# -- the request --------------------------------------------------------------------------
def _fold_case(body: bytes, unknown: str) -> _RawArgs:
    """Top-level keys matched case-insensitively (Go's rule), for bodies up to
    ``CASE_FOLD_MAX_BODY`` (a dict of every key would otherwise cost memory per key)."""
    if len(body) > CASE_FOLD_MAX_BODY:
        raise BadRequest(
            f"request body: unknown field {unknown[:60]!r}; ExtenderArgs has Pod, Nodes, "
            f"NodeNames (spelled exactly so in bodies over {CASE_FOLD_MAX_BODY >> 10} KiB)"
        )
    found: dict[str, Raw] = {}
    for key, value in decode(_KEYS, body, "").items():
        canonical = _ARGS_FIELDS.get(key.lower())
        if canonical is None:
            raise BadRequest(
                f"request body: unknown field {key[:60]!r}; ExtenderArgs has Pod, Nodes, NodeNames"
            )
        found[canonical] = value  # a key given twice: the last wins, as in Go
    return _RawArgs(**found)


def _is_null(raw: Raw) -> bool:
    return not raw or (len(raw) == 4 and bytes(raw) == b"null")


def _top(body: bytes) -> tuple[_Args, Raw]:
    """The request decoded in one pass; (fields, the Nodes JSON text when it had to be
    found by the case-insensitive fallback, else empty)."""
    try:
        args: _Args = _ARGS.decode(body)
        return args, _EMPTY
    except msgspec.ValidationError as err:
        unknown = UNKNOWN_FIELD.match(str(err))
        if unknown is None:
            expected = EXPECTED.match(str(err))
            if expected is not None and not expected["at"]:
                kind = GOT_WORDS.get(expected["got"], expected["got"])
                raise BadRequest(
                    f"request body: must be a JSON object (ExtenderArgs), got {kind}"
                ) from None
            raise decode_error(err, "") from None
    except (msgspec.DecodeError, UnicodeDecodeError) as err:
        raise _Unreadable(str(decode_error(err, ""))) from None
    except RecursionError as err:
        raise decode_error(err, "") from None
    raw = _fold_case(body, unknown["key"])
    return (
        _Args(
            Pod=None if _is_null(raw.Pod) else decode(POD, raw.Pod, "Pod"),
            Nodes=None if _is_null(raw.Nodes) else decode(_NODE_LIST, raw.Nodes, "Nodes"),
            NodeNames=raw.NodeNames,
        ),
        raw.Nodes,
    )


def _count_bound(raw: Raw, field_name: str) -> None:
    """Refuse more than MAX_NODES elements before building them (commas bound it)."""
    if bytes(raw).count(b",") >= MAX_NODES:
        raise BadRequest(f"{field_name}: more than {MAX_NODES} nodes in one request")


# what Go's decoder reads as U+FFFD in a JSON string: a UTF-16 surrogate escape that is
# not half of a pair (escaped backslashes and pairs are matched to be passed over)
_ESCAPES = re.compile(
    rb"\\\\|\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}"
    rb"|\\u[dD][89a-fA-F][0-9a-fA-F]{2}"
)
_LONE_ESCAPE = 6  # len(rb"\ud800")
_REPLACED = "\ufffd"
UNREADABLE_NAME = (
    "node name with a lone UTF-16 surrogate or invalid UTF-8 (read as U+FFFD, as Go "
    "reads it): not a Kubernetes node name"
)


def go_strings(body: bytes) -> bytes:
    """``body`` with what Go's ``encoding/json`` replaces by U+FFFD replaced so: lone
    surrogate escapes and invalid UTF-8 (kube-scheduler and the API server are Go; a
    node name such as ``"\\ud800"`` then names no node, and only that node fails)."""
    fixed = _ESCAPES.sub(
        lambda m: b"\\ufffd" if len(m[0]) == _LONE_ESCAPE else m[0], body
    )
    return fixed.decode("utf-8", "replace").encode("utf-8")


def parse_args(
    body: bytes, demand_of: Callable[[PodView], Demand] = pod_demand
) -> ExtenderArgs:
    """Decode and check an ``ExtenderArgs`` body (filter and prioritize share it); the
    pod's demand from ``demand_of`` (``demand.PodDemands``: once per pod version).

    Duplicate keys: the last wins, at every level (Go's ``encoding/json``, which the
    scheduler's side of the protocol uses). Strings are read as Go reads them
    (``go_strings``: only a body that does not decode as it is pays for that)."""
    try:
        fields, nodes_raw = _top(body)
    except _Unreadable:
        fixed = go_strings(body)
        if fixed == body:
            raise
        body = fixed
        fields, nodes_raw = _top(body)
        repaired = True
    else:
        repaired = False
    pod = fields.Pod
    if pod is None:
        raise BadRequest("Pod: required (an object)")
    meta = pod.metadata or ObjectMeta()
    demand = demand_of(pod)

    nodes: list[NodeItem] | None = None
    if fields.Nodes is not None:
        node_list = fields.Nodes
        if node_list.metadata and bytes(node_list.metadata)[:1] not in (b"{", b"n"):
            raise BadRequest("Nodes.metadata: must be an object")
        views = node_list.items or []
        if len(views) > MAX_NODES:  # before anything per node is built
            raise BadRequest(f"Nodes.items: more than {MAX_NODES} nodes in one request")
        nodes = [node_item(view) for view in views]
        if repaired:
            nodes = [
                msgspec.structs.replace(n, problem=UNREADABLE_NAME) if _REPLACED in n.name else n
                for n in nodes
            ]

    node_names: list[str] | None = None
    if not _is_null(fields.NodeNames):
        _count_bound(fields.NodeNames, "NodeNames")
        node_names = decode(_NAMES, fields.NodeNames, "NodeNames")
    if nodes is None and node_names is None:
        raise BadRequest(
            "request body: needs Nodes (nodeCacheCapable: false) or NodeNames "
            "(nodeCacheCapable: true)"
        )
    namespace = meta.namespace or "default"
    return ExtenderArgs(
        pod_uid=meta.uid or "",
        pod_ref=f"{namespace}/{meta.name or ''}",
        nodes=nodes,
        node_names=node_names,
        demand=demand,
        body=body if nodes is not None and not nodes_raw else b"",
        nodes_raw=nodes_raw if nodes is not None else _EMPTY,
        pod_name=meta.name or "",
        pod_namespace=namespace,
    )


def node_raws(args: ExtenderArgs) -> tuple[bytes, list[Raw]]:
    """(``Nodes.metadata`` as sent or ``{}``, each ``Nodes.items`` element as sent), for
    echoing kept nodes without re-encoding them (one more pass over the request, which
    builds one small object per node: the count was bounded by ``parse_args``)."""
    if args.nodes_raw:
        node_list: _NodeListRaw | None = decode(_NODE_LIST_RAW, args.nodes_raw, "Nodes")
    elif args.body:
        node_list = decode(_ECHO_ARGS, args.body, "").Nodes
    else:
        node_list = None
    if node_list is None:
        return b"{}", []
    meta = node_list.metadata
    return (b"{}" if _is_null(meta) else bytes(meta)), node_list.items or []


def error_body(message: str) -> bytes:
    return json.dumps({"Error": message}).encode()


class BindArgs(msgspec.Struct, forbid_unknown_fields=True):
    """ExtenderBindingArgs as kube-scheduler spells it."""

    PodName: str
    PodNamespace: str
    PodUID: str
    Node: str


_BIND_ARGS = msgspec.json.Decoder(BindArgs)


def parse_bind(body: bytes) -> BindArgs:
    """ExtenderBindingArgs; ``BadRequest`` when malformed or without a pod UID (the UID
    is what ties the binding to the pod kube-scheduler placed)."""
    try:
        args = _BIND_ARGS.decode(body)
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError) as err:
        raise BadRequest(
            f"bind: body must be ExtenderBindingArgs {{PodName, PodNamespace, PodUID, Node}}: "
            f"{str(err)[:200]}"
        ) from None
    for key in ("PodName", "PodNamespace", "PodUID", "Node"):
        if not getattr(args, key):
            raise BadRequest(f"bind: {key} is empty; ExtenderBindingArgs names the pod (and "
                             "its UID) and the node")
    return args
