"""The Kubernetes objects gpu-aware reads, as msgspec typed views.

Only the parts the extender needs become Python objects: a Pod's name, uid, container
resources, overhead and four annotations; a Node's name, three annotations, four labels
and allocatable CPU and memory. Everything else is skipped, not built. ``NodeItem`` is a
node as filter, prioritize and the watches keep it; ``BadRequest`` names the field of a
request that breaks the protocol (an HTTP 400).

Example::

    >>> node_item(msgspec.json.decode(b'{"metadata":{"name":"n1"}}', type=NodeView)).name
    'n1'
"""

from __future__ import annotations

import re
from typing import Any

import msgspec
from msgspec import Raw, Struct, field

from ...core.cuda import MAJOR_LABEL, MINOR_LABEL, RUNTIME_ANNOTATION
from ...core.devicelist import DEVICES_ANNOTATION
from ...core.errors import GpuK8sError
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
)

GPU_RESOURCE, NVIDIA_GPU_RESOURCE = WHOLE_GPU_RESOURCES
GPU_MEMORY_LABEL = "metax-tech.com/gpu.memory"  # memory per GPU (gpu-label, SPEC §4)
# the node annotations the extender reads (published by gpu-device)
READ_ANNOTATIONS = (DEVICES_ANNOTATION, SCORES_ANNOTATION, LOSSES_ANNOTATION)
EMPTY = Raw()
_EMPTY = EMPTY  # the short name the typed views below use


class BadRequest(GpuK8sError):
    """The request body is not what the extender protocol allows (HTTP 400)."""


# -- typed views: the only parts of a request that become Python objects ----------------
# (gc=False: plain data without reference cycles, 16 bytes less per object)

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


class ContainerView(Struct, gc=False):
    name: str  # required by the API; also keeps a list of "{}" from costing memory
    resources: _Resources | None = None
    restartPolicy: str | None = None


class _PodSpec(Struct, gc=False):
    containers: list[ContainerView] | None = None
    initContainers: list[ContainerView] | None = None
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



POD = msgspec.json.Decoder(PodView)
STRING = msgspec.json.Decoder(str)


def raw_text(raw: Raw | bytes) -> str | None:
    """The JSON string sent as ``raw``; None when absent, null or not a string."""
    if not raw or bytes(raw) == b"null":
        return None
    try:
        return STRING.decode(raw)
    except msgspec.DecodeError:
        return None


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
        return raw_text(self.labels[0]), raw_text(self.labels[1])

    def annotations(self) -> tuple[dict[str, str], str | None]:
        """(the annotations that are strings, why the others are unusable or None)."""
        out: dict[str, str] = {}
        if self.problem is not None:
            return out, self.problem
        for key, raw in zip(READ_ANNOTATIONS, self.raws, strict=True):
            if not raw or bytes(raw) == b"null":
                continue
            try:
                out[key] = STRING.decode(raw)
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



# -- errors -----------------------------------------------------------------------------
_AT = r"(?: - at `\$(?P<at>.*)`)?$"
EXPECTED = re.compile(r"Expected `(?P<want>[^`]+)`, got `(?P<got>[^`]+)`" + _AT)
_MISSING = re.compile(r"Object missing required field `(?P<key>[^`]+)`" + _AT)
UNKNOWN_FIELD = re.compile(r"Object contains unknown field `(?P<key>[^`]+)`")
_TYPE_WORDS = {
    "object": "an object",
    "array": "an array",
    "str": "a string",
    "int": "an integer",
    "float": "a number",
    "bool": "a boolean",
    "null": "null",
}
GOT_WORDS = {"str": "string", "int": "number", "float": "number", "bool": "boolean"}


def _at(root: str, path: str | None) -> str:
    path = (path or "").replace("[...]", "")
    return root + path if root else path.lstrip(".") or "request body"


def decode_error(err: Exception, root: str) -> BadRequest:
    """A msgspec/JSON error as a ``BadRequest`` naming the field in our words."""
    if isinstance(err, RecursionError):
        return BadRequest(f"{root or 'request body'}: JSON nested too deeply")
    if isinstance(err, UnicodeDecodeError):
        return BadRequest(f"request body: not UTF-8 ({err.reason} at byte {err.start})")
    text = str(err)
    match = EXPECTED.match(text)
    if match:
        kinds = [w for w in match["want"].split(" | ") if w != "null"] or ["null"]
        wants = " or ".join(_TYPE_WORDS.get(w, w) for w in kinds)
        got = GOT_WORDS.get(match["got"], match["got"])
        return BadRequest(f"{_at(root, match['at'])}: must be {wants}, got {got}")
    match = _MISSING.match(text)
    if match:
        return BadRequest(f"{_at(root, match['at'])}.{match['key']}: required")
    if isinstance(err, msgspec.ValidationError):
        return BadRequest(f"{root or 'request body'}: {text}")
    return BadRequest(f"request body: not valid JSON: {text}")


def decode(decoder: Any, data: Any, root: str) -> Any:
    try:
        return decoder.decode(data)
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError) as err:
        raise decode_error(err, root) from None
