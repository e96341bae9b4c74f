"""The kube-scheduler extender wire format (k8s.io/kube-scheduler/extender/v1).

The extender structs carry no json tags, so the scheduler sends and expects the Go
field names (``Pod``, ``Nodes``, ``NodeNames``; ``FailedNodes``, ``Host``, ``Score``...).
Go's decoder matches keys case-insensitively; so do we. Objects inside (the Pod and
the NodeList) are ordinary Kubernetes JSON with lower-camel keys.

Everything here validates just what the extender reads and raises ``BadRequest``
naming the field, so a malformed request gets an HTTP 400 with a useful message.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from ...core.devicelist import DEVICES_ANNOTATION
from ...core.errors import GpuK8sError
from ...core.scoring import LOSSES_ANNOTATION, SCORES_ANNOTATION

GPU_RESOURCE = "metax-tech.com/gpu"
MAX_EXTENDER_PRIORITY = 10
MIN_EXTENDER_PRIORITY = 0
# the node annotations the extender reads (published by gpu-device)
READ_ANNOTATIONS = (DEVICES_ANNOTATION, SCORES_ANNOTATION, LOSSES_ANNOTATION)

# ExtenderArgs fields, by lower-cased key (Go matches case-insensitively)
_ARGS_FIELDS = {"pod": "Pod", "nodes": "Nodes", "nodenames": "NodeNames"}

_QUANTITY = re.compile(r"^\+?(\d+)(k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
_SUFFIX = {
    None: 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}


class BadRequest(GpuK8sError):
    """The request body is not what the extender protocol allows (HTTP 400)."""


@dataclass(frozen=True)
class NodeItem:
    """One node of ``Nodes.items`` as the extender needs it."""

    name: str
    annotations: dict[str, str]
    raw: dict[str, Any]  # the object as received, echoed back by filter


@dataclass(frozen=True)
class ExtenderArgs:
    pod: dict[str, Any]
    pod_uid: str
    pod_ref: str  # namespace/name, for messages
    gpus: int  # the pod's effective metax-tech.com/gpu request
    nodes: list[NodeItem] | None  # nodeCacheCapable: false
    nodes_meta: dict[str, Any]
    node_names: list[str] | None  # nodeCacheCapable: true


def decode_json(body: bytes) -> Any:
    """``json.loads`` whose every failure is a ``BadRequest``."""
    try:
        return json.loads(body.decode("utf-8"))  # JSON on the wire is UTF-8 (RFC 8259)
    except RecursionError as err:
        raise BadRequest("request body: JSON nested too deeply") from err
    except UnicodeDecodeError as err:
        raise BadRequest(f"request body: not UTF-8 ({err.reason} at byte {err.start})") from err
    except ValueError as err:
        raise BadRequest(f"request body: not valid JSON: {err}") from err


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {
        dict: "object",
        list: "array",
        str: "string",
        bool: "boolean",
        int: "number",
        float: "number",
    }.get(type(value), type(value).__name__)


def _expect_object(value: Any, field: str, nullable: bool = False) -> dict[str, Any] | None:
    if value is None and nullable:
        return None
    if not isinstance(value, dict):
        raise BadRequest(f"{field}: must be an object, got {_type_name(value)}")
    return value


def parse_quantity(value: Any, field: str) -> int:
    """A whole-number Kubernetes quantity (extended resources allow nothing else)."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise BadRequest(f"{field}: must be a whole-number quantity, got {_type_name(value)}")
    if isinstance(value, int):
        if value < 0:
            raise BadRequest(f"{field}: must not be negative, got {value}")
        return value
    match = _QUANTITY.match(value.strip())
    if not match:
        raise BadRequest(
            f'{field}: {value[:40]!r} is not a whole-number quantity (e.g. "2"); '
            f"{GPU_RESOURCE} cannot be fractional"
        )
    return int(match.group(1)) * _SUFFIX[match.group(2)]


def _container_request(container: Any, field: str, resource: str) -> int:
    obj = _expect_object(container, field)
    assert obj is not None
    resources = _expect_object(obj.get("resources"), f"{field}.resources", nullable=True)
    if not resources:
        return 0
    values = []
    for kind in ("limits", "requests"):
        block = _expect_object(resources.get(kind), f"{field}.resources.{kind}", nullable=True)
        if block and resource in block:
            values.append(
                parse_quantity(block[resource], f"{field}.resources.{kind}[{resource!r}]")
            )
    # Extended resources: requests default to limits and must equal them when both set.
    return max(values) if values else 0


def _containers(spec: dict[str, Any], key: str) -> list[Any]:
    value = spec.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise BadRequest(f"Pod.spec.{key}: must be an array, got {_type_name(value)}")
    return value


def pod_request(pod: dict[str, Any], resource: str = GPU_RESOURCE) -> int:
    """The pod's effective request of ``resource`` (the scheduler's rule).

    Regular containers and sidecars (init containers with ``restartPolicy: Always``)
    run together and add up; every other init container runs alone, next to the
    sidecars started before it. The pod needs the largest of these moments.
    """
    spec = _expect_object(pod.get("spec"), "Pod.spec", nullable=True) or {}
    running = sum(
        _container_request(c, f"Pod.spec.containers[{i}]", resource)
        for i, c in enumerate(_containers(spec, "containers"))
    )
    sidecars = 0
    peak_init = 0
    for i, container in enumerate(_containers(spec, "initContainers")):
        field = f"Pod.spec.initContainers[{i}]"
        amount = _container_request(container, field, resource)
        if isinstance(container, dict) and container.get("restartPolicy") == "Always":
            sidecars += amount
            peak_init = max(peak_init, sidecars)
        else:
            peak_init = max(peak_init, sidecars + amount)
    return max(running + sidecars, peak_init)


def _node_item(raw: Any, index: int) -> NodeItem:
    field = f"Nodes.items[{index}]"
    obj = _expect_object(raw, field)
    assert obj is not None
    meta = _expect_object(obj.get("metadata"), f"{field}.metadata")
    assert meta is not None
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise BadRequest(
            f"{field}.metadata.name: must be a non-empty string, got {_type_name(name)}"
        )
    annotations = (
        _expect_object(meta.get("annotations"), f"{field}.metadata.annotations", nullable=True)
        or {}
    )
    for key in READ_ANNOTATIONS:
        value = annotations.get(key)
        if value is not None and not isinstance(value, str):
            raise BadRequest(
                f"{field}.metadata.annotations[{key!r}]: must be a string, got {_type_name(value)}"
            )
    return NodeItem(name=name, annotations=annotations, raw=obj)


def parse_args(body: bytes) -> ExtenderArgs:
    """Decode and check an ``ExtenderArgs`` body (filter and prioritize share it)."""
    data = decode_json(body)
    if not isinstance(data, dict):
        raise BadRequest(
            f"request body: must be a JSON object (ExtenderArgs), got {_type_name(data)}"
        )
    fields: dict[str, Any] = {}
    for key, value in data.items():
        canonical = _ARGS_FIELDS.get(key.lower())
        if canonical is None:
            raise BadRequest(
                f"request body: unknown field {key[:60]!r}; ExtenderArgs has Pod, Nodes, NodeNames"
            )
        if canonical in fields:
            raise BadRequest(f"request body: field {canonical} given twice")
        fields[canonical] = value
    pod = _expect_object(fields.get("Pod"), "Pod")
    assert pod is not None
    meta = _expect_object(pod.get("metadata"), "Pod.metadata", nullable=True) or {}
    uid = meta.get("uid") or ""
    namespace = meta.get("namespace") or "default"
    name = meta.get("name") or ""
    for key, value in (("uid", uid), ("namespace", namespace), ("name", name)):
        if not isinstance(value, str):
            raise BadRequest(f"Pod.metadata.{key}: must be a string, got {_type_name(value)}")
    gpus = pod_request(pod)

    nodes: list[NodeItem] | None = None
    nodes_meta: dict[str, Any] = {}
    node_list = _expect_object(fields.get("Nodes"), "Nodes", nullable=True)
    if node_list is not None:
        items = node_list.get("items")
        if items is None:
            items = []
        if not isinstance(items, list):
            raise BadRequest(f"Nodes.items: must be an array, got {_type_name(items)}")
        nodes = [_node_item(raw, i) for i, raw in enumerate(items)]
        nodes_meta = (
            _expect_object(node_list.get("metadata"), "Nodes.metadata", nullable=True) or {}
        )

    node_names: list[str] | None = None
    raw_names = fields.get("NodeNames")
    if raw_names is not None:
        if not isinstance(raw_names, list):
            raise BadRequest(f"NodeNames: must be an array of strings, got {_type_name(raw_names)}")
        if set(map(type, raw_names)) - {str}:  # one C-level pass; find the culprit after
            i, item = next((i, x) for i, x in enumerate(raw_names) if not isinstance(x, str))
            raise BadRequest(f"NodeNames[{i}]: must be a string, got {_type_name(item)}")
        node_names = raw_names
    if nodes is None and node_names is None:
        raise BadRequest(
            "request body: needs Nodes (nodeCacheCapable: false) or NodeNames "
            "(nodeCacheCapable: true)"
        )
    return ExtenderArgs(
        pod=pod,
        pod_uid=uid,
        pod_ref=f"{namespace}/{name}",
        gpus=gpus,
        nodes=nodes,
        nodes_meta=nodes_meta,
        node_names=node_names,
    )


def error_body(message: str) -> bytes:
    return json.dumps({"Error": message}).encode()
