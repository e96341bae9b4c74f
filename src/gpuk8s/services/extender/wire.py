"""The kube-scheduler extender wire format (k8s.io/kube-scheduler/extender/v1).

The extender structs carry no json tags, so the scheduler sends and expects the Go
field names (``Pod``, ``Nodes``, ``NodeNames``; ``FailedNodes``, ``Host``, ``Score``...).
Go's decoder matches keys case-insensitively; so do we. Objects inside (the Pod and
the NodeList) are ordinary Kubernetes JSON with lower-camel keys.

Decoding reads only what the extender needs (msgspec typed views): the pod's name,
uid, GPU, CPU and memory requests and ``gpuk8s.io/cuda-runtime`` annotation, each
node's name, three annotations, two CUDA version labels and allocatable CPU and
memory. Everything else in a Node (images, conditions, managed
fields: ~95 % of a full-list request) is skipped, not
built into Python objects, and a filter answer echoes the kept Node objects as the
very bytes of the request (``node_raws``). Memory per request is therefore a small
multiple of the body (``docs/extender.md``, "Limits"), and hostile values cost no more
than their size.

A request that does not follow the protocol raises ``BadRequest`` naming the field (an
HTTP 400). A *node* whose GPU annotations are unusable is not the request's fault: it
is excluded from filter with a reason (``NodeItem.problem``), never a 400 or a 500.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import msgspec
from msgspec import Raw, Struct, field

from ...core.cuda import MAJOR_LABEL, MINOR_LABEL, RUNTIME_ANNOTATION
from ...core.devicelist import DEVICES_ANNOTATION
from ...core.effective import APP, combine, kind_of
from ...core.errors import GpuK8sError
from ...core.quantity import QuantityError, parse_json_text, whole_count
from ...core.scoring import LOSSES_ANNOTATION, SCORES_ANNOTATION
from ...core.sharing import (
    ASSIGNED_ANNOTATION,
    BIND_TIME_ANNOTATION,
    MPS_CORE_RESOURCE,
    MPS_MEMORY_RESOURCE,
    PHASE_ANNOTATION,
    SGPU_RESOURCE,
    SHARING_MODE_LABEL,
    VCORE_RESOURCE,
    VCUDA_CORE_RESOURCE,
    VCUDA_MEMORY_RESOURCE,
    VMEMORY_RESOURCE,
    WHOLE_GPU_RESOURCES,
    ShareRequest,
    SharingError,
    pod_share,
)

GPU_RESOURCE, NVIDIA_GPU_RESOURCE = WHOLE_GPU_RESOURCES
GPU_MEMORY_LABEL = "metax-tech.com/gpu.memory"  # memory per GPU (gpu-label, SPEC §4)
MAX_EXTENDER_PRIORITY = 10
MIN_EXTENDER_PRIORITY = 0
# the node annotations the extender reads (published by gpu-device)
READ_ANNOTATIONS = (DEVICES_ANNOTATION, SCORES_ANNOTATION, LOSSES_ANNOTATION)
# Largest NodeNames / Nodes.items accepted: Kubernetes supports 5,000 nodes per cluster.
# Checked before the names are built, so a body of tiny names cannot multiply memory.
MAX_NODES = 50_000
# Bodies up to this size may spell the top-level keys in any case (Go's rule); larger
# ones must use Go's field names exactly, as kube-scheduler does (bounded fallback).
CASE_FOLD_MAX_BODY = 1024 * 1024

PodTotals = tuple[int, int, int]  # GPUs, CPU millicores, memory MiB

_ARGS_FIELDS = {"pod": "Pod", "nodes": "Nodes", "nodenames": "NodeNames"}
_EMPTY = Raw()


class BadRequest(GpuK8sError):
    """The request body is not what the extender protocol allows (HTTP 400)."""


class _Unreadable(BadRequest):
    """The body is not JSON as msgspec reads it (``go_strings`` may make it so)."""


# -- typed views: the only parts of a request that become Python objects ----------------
# (gc=False: plain data without reference cycles, 16 bytes less per object)
class _RawArgs(Struct, gc=False):
    """The fields as JSON text (the case-insensitive fallback)."""

    Pod: Raw = _EMPTY
    Nodes: Raw = _EMPTY
    NodeNames: Raw = _EMPTY


class _Quantities(Struct, gc=False):
    """``resources.limits`` / ``.requests`` / ``overhead`` / ``allocatable``: the GPU,
    CPU and memory entries, each as its JSON text."""

    gpu: Raw = field(name=GPU_RESOURCE, default=_EMPTY)
    nvidia_gpu: Raw = field(name=NVIDIA_GPU_RESOURCE, default=_EMPTY)
    cpu: Raw = _EMPTY
    memory: Raw = _EMPTY
    # GPU sharing (core.sharing): read only to build the pod's ShareRequest
    sgpu: Raw = field(name=SGPU_RESOURCE, default=_EMPTY)
    vcore: Raw = field(name=VCORE_RESOURCE, default=_EMPTY)
    vmemory: Raw = field(name=VMEMORY_RESOURCE, default=_EMPTY)
    vcuda_core: Raw = field(name=VCUDA_CORE_RESOURCE, default=_EMPTY)
    vcuda_memory: Raw = field(name=VCUDA_MEMORY_RESOURCE, default=_EMPTY)
    mps_core: Raw = field(name=MPS_CORE_RESOURCE, default=_EMPTY)
    mps_memory: Raw = field(name=MPS_MEMORY_RESOURCE, default=_EMPTY)

    def sharing(self) -> dict[str, str]:
        """The sharing resources given, and the whole-GPU ones (a pod asks for one or
        the other: ``core.sharing.pod_share``), as quantity text (JSON quotes removed)."""
        out: dict[str, str] = {}
        for name, raw in (
            (GPU_RESOURCE, self.gpu),
            (NVIDIA_GPU_RESOURCE, self.nvidia_gpu),
            (SGPU_RESOURCE, self.sgpu),
            (VCORE_RESOURCE, self.vcore),
            (VMEMORY_RESOURCE, self.vmemory),
            (VCUDA_CORE_RESOURCE, self.vcuda_core),
            (VCUDA_MEMORY_RESOURCE, self.vcuda_memory),
            (MPS_CORE_RESOURCE, self.mps_core),
            (MPS_MEMORY_RESOURCE, self.mps_memory),
        ):
            if raw and bytes(raw) != b"null":
                try:
                    value = msgspec.json.decode(bytes(raw))
                except msgspec.DecodeError:
                    value = None
                if isinstance(value, (str, int)) and not isinstance(value, bool):
                    out[name] = str(value)
                else:  # a JSON value no quantity has: the text, for the error message
                    out[name] = bytes(raw).decode("utf-8", "replace")[:60]
        return out


class _Resources(Struct, gc=False):
    limits: _Quantities | None = None
    requests: _Quantities | None = None


class _Container(Struct, gc=False):
    name: str  # required by the API; also keeps a list of "{}" from costing memory
    resources: _Resources | None = None
    restartPolicy: str | None = None


class _PodSpec(Struct, gc=False):
    containers: list[_Container] | None = None
    initContainers: list[_Container] | None = None
    nodeName: str | None = None
    overhead: _Quantities | None = None


class _PodAnnotations(Struct, gc=False):
    """The pod annotations the extender reads, each as its JSON text."""

    cuda_runtime: Raw = field(name=RUNTIME_ANNOTATION, default=_EMPTY)
    assigned: Raw = field(name=ASSIGNED_ANNOTATION, default=_EMPTY)
    phase: Raw = field(name=PHASE_ANNOTATION, default=_EMPTY)
    bind_time: Raw = field(name=BIND_TIME_ANNOTATION, default=_EMPTY)


class ObjectMeta(Struct, gc=False):
    name: str | None = None
    namespace: str | None = None
    uid: str | None = None
    resourceVersion: str | None = None
    annotations: _PodAnnotations | None = None


class _PodStatus(Struct, gc=False):
    phase: str | None = None


class PodView(Struct, gc=False):
    """A Pod as far as the extender reads it (also used by the pod watch)."""

    metadata: ObjectMeta | None = None
    spec: _PodSpec | None = None
    status: _PodStatus | None = None


class _Annotations(Struct, gc=False):
    devices: Raw = field(name=DEVICES_ANNOTATION, default=_EMPTY)
    scores: Raw = field(name=SCORES_ANNOTATION, default=_EMPTY)
    losses: Raw = field(name=LOSSES_ANNOTATION, default=_EMPTY)


class _NodeStatus(Struct, gc=False):
    allocatable: _Quantities | None = None


class _NodeLabels(Struct, gc=False):
    """The node labels the extender reads, as JSON text: GPU sharing's mode and GPU
    memory, gpu-label's CUDA version."""

    sharing_mode: Raw = field(name=SHARING_MODE_LABEL, default=_EMPTY)
    gpu_memory: Raw = field(name=GPU_MEMORY_LABEL, default=_EMPTY)
    cuda_major: Raw = field(name=MAJOR_LABEL, default=_EMPTY)
    cuda_minor: Raw = field(name=MINOR_LABEL, default=_EMPTY)


class _NodeMeta(Struct, gc=False):
    name: str
    annotations: _Annotations | None = None
    labels: _NodeLabels | None = None
    resourceVersion: str | None = None


class NodeView(Struct, gc=False):
    """A Node as far as the extender reads it (also used by the node watch)."""

    metadata: _NodeMeta
    status: _NodeStatus | None = None


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
_POD = msgspec.json.Decoder(PodView)
_NODE_LIST = msgspec.json.Decoder(_NodeList)
_NODE_LIST_RAW = msgspec.json.Decoder(_NodeListRaw)
_NAMES = msgspec.json.Decoder(list[str])
_KEYS = msgspec.json.Decoder(dict[str, Raw])
_STRING = msgspec.json.Decoder(str)


class NodeItem(Struct, frozen=True, gc=False):
    """One node of ``Nodes.items`` (or of a watch) as the extender needs it."""

    name: str
    # the three annotations as sent (JSON text; empty when absent): the memo key, so
    # unchanged nodes are neither decoded nor parsed again
    raws: tuple[Raw, Raw, Raw]
    # status.allocatable cpu and memory as sent (JSON text; empty when absent)
    allocatable: tuple[Raw, Raw] = (_EMPTY, _EMPTY)
    # the sharing-mode and gpu.memory labels as sent (JSON text; empty when absent)
    labels: tuple[Raw, Raw] = (_EMPTY, _EMPTY)
    # the CUDA major / minor version labels as sent (JSON text; empty when absent)
    cuda: tuple[Raw, Raw] = (_EMPTY, _EMPTY)
    # why the node is unusable whatever its annotations (its name), else None
    problem: str | None = None

    def label_values(self) -> tuple[str | None, str | None]:
        """(sharing mode label, gpu.memory label); None when absent or not a string."""
        out: list[str | None] = []
        for raw in self.labels:
            try:
                value = _STRING.decode(raw) if raw and bytes(raw) != b"null" else None
            except msgspec.DecodeError:
                value = None
            out.append(value)
        return out[0], out[1]

    def annotations(self) -> tuple[dict[str, str], str | None]:
        """(the annotations that are strings, why the others are unusable or None)."""
        out: dict[str, str] = {}
        if self.problem is not None:
            return out, self.problem
        for key, raw in zip(READ_ANNOTATIONS, self.raws, strict=True):
            if not raw or bytes(raw) == b"null":
                continue
            try:
                out[key] = _STRING.decode(raw)
            except msgspec.DecodeError:
                return out, f"annotation {key} must be a string (a JSON document as text)"
        return out, None


def node_item(view: NodeView) -> NodeItem:
    ann = view.metadata.annotations
    raws = (ann.devices, ann.scores, ann.losses) if ann is not None else (_EMPTY,) * 3
    status = view.status
    alloc = status.allocatable if status is not None else None
    labels = view.metadata.labels
    label_raws = (labels.sharing_mode, labels.gpu_memory) if labels else (_EMPTY, _EMPTY)
    cuda = (labels.cuda_major, labels.cuda_minor) if labels else (_EMPTY, _EMPTY)
    if alloc is None:
        return NodeItem(view.metadata.name, raws, labels=label_raws, cuda=cuda)
    return NodeItem(view.metadata.name, raws, (alloc.cpu, alloc.memory), label_raws, cuda)


@dataclass(frozen=True)
class ExtenderArgs:
    pod_uid: str
    pod_ref: str  # namespace/name, for messages
    gpus: int  # the pod's effective metax-tech.com/gpu request
    nodes: list[NodeItem] | None  # nodeCacheCapable: false
    node_names: list[str] | None  # nodeCacheCapable: true
    # where filter finds the Nodes as sent, to echo kept items: the whole body, or the
    # Nodes value itself (after the case-insensitive fallback)
    body: bytes = b""
    nodes_raw: Raw = dataclasses.field(default_factory=Raw)
    cpu_milli: int = 0  # the pod's effective CPU request (millicores, rounded up)
    memory_mib: int = 0  # the pod's effective memory request (MiB, rounded up)
    # the pod's gpuk8s.io/cuda-runtime annotation as sent (JSON text), None when absent
    cuda_runtime: bytes | None = None
    share: ShareRequest | None = None  # the pod asks for shared GPUs (core.sharing)
    pod_name: str = ""
    pod_namespace: str = ""


# -- errors -----------------------------------------------------------------------------
_AT = r"(?: - at `\$(?P<at>.*)`)?$"
_EXPECTED = re.compile(r"Expected `(?P<want>[^`]+)`, got `(?P<got>[^`]+)`" + _AT)
_MISSING = re.compile(r"Object missing required field `(?P<key>[^`]+)`" + _AT)
_UNKNOWN = re.compile(r"Object contains unknown field `(?P<key>[^`]+)`")
_TYPE_WORDS = {
    "object": "an object",
    "array": "an array",
    "str": "a string",
    "int": "an integer",
    "float": "a number",
    "bool": "a boolean",
    "null": "null",
}
_GOT_WORDS = {"str": "string", "int": "number", "float": "number", "bool": "boolean"}


def _at(root: str, path: str | None) -> str:
    path = (path or "").replace("[...]", "")
    return root + path if root else path.lstrip(".") or "request body"


def _decode_error(err: Exception, root: str) -> BadRequest:
    """A msgspec/JSON error as a ``BadRequest`` naming the field in our words."""
    if isinstance(err, RecursionError):
        return BadRequest(f"{root or 'request body'}: JSON nested too deeply")
    if isinstance(err, UnicodeDecodeError):
        return BadRequest(f"request body: not UTF-8 ({err.reason} at byte {err.start})")
    text = str(err)
    match = _EXPECTED.match(text)
    if match:
        kinds = [w for w in match["want"].split(" | ") if w != "null"] or ["null"]
        wants = " or ".join(_TYPE_WORDS.get(w, w) for w in kinds)
        got = _GOT_WORDS.get(match["got"], match["got"])
        return BadRequest(f"{_at(root, match['at'])}: must be {wants}, got {got}")
    match = _MISSING.match(text)
    if match:
        return BadRequest(f"{_at(root, match['at'])}.{match['key']}: required")
    if isinstance(err, msgspec.ValidationError):
        return BadRequest(f"{root or 'request body'}: {text}")
    return BadRequest(f"request body: not valid JSON: {text}")


def _decode(decoder: Any, data: Any, root: str) -> Any:
    try:
        return decoder.decode(data)
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError) as err:
        raise _decode_error(err, root) from None


# -- the pod ------------------------------------------------------------------------------
def quantity_of(raw: Raw | bytes) -> Fraction | None:
    """A quantity from its JSON text (``resource.Quantity`` grammar, ``core.quantity``);
    None when absent, negative or not a quantity (the apiserver validated what it
    stored: an unreadable value counts as nothing rather than failing a request)."""
    if not raw:
        return None
    try:
        amount = parse_json_text(bytes(raw).decode("utf-8"))
    except (QuantityError, UnicodeDecodeError):
        return None
    return amount if amount >= 0 else None


def cpu_milli(raw: Raw | bytes) -> int:
    """CPU millicores (rounded up) of a quantity given as JSON text; 0 when unreadable."""
    amount = quantity_of(raw)
    return math.ceil(amount * 1000) if amount is not None else 0


def memory_mib(raw: Raw | bytes) -> int:
    """Memory MiB (rounded up) of a quantity given as JSON text; 0 when unreadable."""
    amount = quantity_of(raw)
    return math.ceil(amount / 2**20) if amount is not None else 0


def _container_amounts(container: _Container, where: str, lenient: bool) -> PodTotals:
    """(GPUs, CPU millicores, memory MiB) one container asks for."""
    resources = container.resources
    if resources is None:
        return (0, 0, 0)
    values = []
    for kind, block in (("limits", resources.limits), ("requests", resources.requests)):
        if block is not None and block.gpu:
            what = f"{where}.resources.{kind}[{GPU_RESOURCE!r}]"
            try:
                values.append(whole_count(bytes(block.gpu).decode("utf-8"), what, json_text=True))
            except (QuantityError, UnicodeDecodeError) as err:
                if lenient:
                    continue  # the apiserver validated it: unreadable here counts as none
                raise BadRequest(str(err) if isinstance(err, QuantityError) else what) from None
    # Extended resources: requests default to limits and must equal them when both set.
    gpus = max(values) if values else 0
    requests = resources.requests
    if requests is None:
        return (gpus, 0, 0)
    return (gpus, cpu_milli(requests.cpu), memory_mib(requests.memory))


def pod_totals(pod: PodView, root: str = "Pod", lenient: bool = False) -> PodTotals:
    """(GPUs, CPU millicores, memory MiB) the scheduler reserves for the pod: the
    effective requests of its containers, init containers and sidecars
    (``core.effective.combine``), plus its ``overhead`` (CPU and memory). An unreadable
    GPU request is a ``BadRequest`` unless ``lenient`` (then it counts as none).
    """
    spec = pod.spec
    if spec is None:
        return (0, 0, 0)
    amounts = [
        (kind_of({"restartPolicy": c.restartPolicy}, True),
         _container_amounts(c, f"{root}.spec.initContainers[{i}]", lenient))
        for i, c in enumerate(spec.initContainers or ())
    ]
    amounts += [
        (APP, _container_amounts(c, f"{root}.spec.containers[{i}]", lenient))
        for i, c in enumerate(spec.containers or ())
    ]
    total = combine(amounts, 3)
    overhead = spec.overhead
    if overhead is not None:
        total[1] += cpu_milli(overhead.cpu)
        total[2] += memory_mib(overhead.memory)
    return (total[0], total[1], total[2])


def view_request(pod: PodView, root: str = "Pod") -> int:
    """The pod's effective ``metax-tech.com/gpu`` request (the scheduler's rule, see
    ``pod_totals``); an unreadable request is a ``BadRequest`` naming the field."""
    return pod_totals(pod, root)[0]


def view_share(pod: PodView, root: str = "Pod") -> ShareRequest | None:
    """The pod's GPU-sharing request (``core.sharing.pod_share``: app, init and sidecar
    containers); ``BadRequest`` naming the field when it is invalid."""
    spec = pod.spec
    if spec is None:
        return None
    containers = []
    for key, items in (("initContainers", spec.initContainers), ("containers", spec.containers)):
        for i, container in enumerate(items or ()):
            res = container.resources
            limits = res.limits.sharing() if res is not None and res.limits is not None else {}
            requests = (
                res.requests.sharing() if res is not None and res.requests is not None else {}
            )
            containers.append((container.name, limits, requests, f"{root}.spec.{key}[{i}]"))
    try:
        return pod_share(containers)
    except SharingError as err:
        raise BadRequest(str(err)) from None


def decode_pod(pod: Mapping[str, Any]) -> PodView:
    """A Pod given as a decoded JSON object (tests, tools, the packing benchmark)."""
    if not isinstance(pod, Mapping):
        raise BadRequest(f"Pod: must be an object, got {type(pod).__name__}")
    return _decode(_POD, json.dumps(pod).encode(), "Pod")  # type: ignore[no-any-return]


def pod_request(pod: Mapping[str, Any]) -> int:
    """``view_request`` of a Pod given as a decoded JSON object (tests, tools)."""
    return view_request(decode_pod(pod))


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
    for key, value in _decode(_KEYS, body, "").items():
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
        unknown = _UNKNOWN.match(str(err))
        if unknown is None:
            expected = _EXPECTED.match(str(err))
            if expected is not None and not expected["at"]:
                kind = _GOT_WORDS.get(expected["got"], expected["got"])
                raise BadRequest(
                    f"request body: must be a JSON object (ExtenderArgs), got {kind}"
                ) from None
            raise _decode_error(err, "") from None
    except (msgspec.DecodeError, UnicodeDecodeError) as err:
        raise _Unreadable(str(_decode_error(err, ""))) from None
    except RecursionError as err:
        raise _decode_error(err, "") from None
    raw = _fold_case(body, unknown["key"])
    return (
        _Args(
            Pod=None if _is_null(raw.Pod) else _decode(_POD, raw.Pod, "Pod"),
            Nodes=None if _is_null(raw.Nodes) else _decode(_NODE_LIST, raw.Nodes, "Nodes"),
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


def parse_args(body: bytes) -> ExtenderArgs:
    """Decode and check an ``ExtenderArgs`` body (filter and prioritize share it).

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
    gpus, cpu_milli, memory_mib = pod_totals(pod)

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
        node_names = _decode(_NAMES, fields.NodeNames, "NodeNames")
    if nodes is None and node_names is None:
        raise BadRequest(
            "request body: needs Nodes (nodeCacheCapable: false) or NodeNames "
            "(nodeCacheCapable: true)"
        )
    namespace = meta.namespace or "default"
    annotations = meta.annotations
    cuda_runtime = annotations.cuda_runtime if annotations is not None else _EMPTY
    share = view_share(pod)
    return ExtenderArgs(
        pod_uid=meta.uid or "",
        pod_ref=f"{namespace}/{meta.name or ''}",
        gpus=gpus,
        nodes=nodes,
        node_names=node_names,
        body=body if nodes is not None and not nodes_raw else b"",
        nodes_raw=nodes_raw if nodes is not None else _EMPTY,
        cpu_milli=cpu_milli,
        memory_mib=memory_mib,
        cuda_runtime=None if _is_null(cuda_runtime) else bytes(cuda_runtime),
        share=share,
        pod_name=meta.name or "",
        pod_namespace=namespace,
    )


def node_raws(args: ExtenderArgs) -> tuple[bytes, list[Raw]]:
    """(``Nodes.metadata`` as sent or ``{}``, each ``Nodes.items`` element as sent), for
    echoing kept nodes without re-encoding them (one more pass over the request, which
    builds one small object per node: the count was bounded by ``parse_args``)."""
    if args.nodes_raw:
        node_list: _NodeListRaw | None = _decode(_NODE_LIST_RAW, args.nodes_raw, "Nodes")
    elif args.body:
        node_list = _decode(_ECHO_ARGS, args.body, "").Nodes
    else:
        node_list = None
    if node_list is None:
        return b"{}", []
    meta = node_list.metadata
    return (b"{}" if _is_null(meta) else bytes(meta)), node_list.items or []


def error_body(message: str) -> bytes:
    return json.dumps({"Error": message}).encode()
