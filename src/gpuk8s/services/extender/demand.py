"""The pod's demand, computed once per request: what every check and ``bind`` reads.

``pod_demand`` turns a Pod (``views.PodView``) into a ``Demand``: its effective GPU, CPU
and memory requests (the scheduler's rule, ``core.effective``: containers, init
containers, sidecars, overhead), its GPU-sharing request (``core.sharing.pod_share``)
and its ``gpuk8s.io/cuda-runtime`` annotation as sent. Filter, prioritize and bind all
take it from here; none re-reads the pod. ``PodDemands`` keeps each pod's demand by its UID
and resourceVersion, beside the parts of the pod it was computed from, so that a pod's
filter and prioritize (two requests) parse its requests once.

Example: a pod with one container limiting ``metax-tech.com/gpu: 2`` and requesting
``cpu: 500m`` has ``Demand(gpus=2, cpu_milli=500, memory_mib=0, share=None,
cuda_runtime=None)``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from msgspec import Raw

from ...core.effective import APP, combine, kind_of
from ...core.quantity import QuantityError, parse_json_text, whole_count
from ...core.sharing import ShareRequest, SharingError, pod_share
from .views import GPU_RESOURCE, POD, BadRequest, ContainerView, PodView, decode

PodTotals = tuple[int, int, int]  # GPUs, CPU millicores, memory MiB


@dataclass(frozen=True)
class Demand:
    """What one pod asks of a node (``pod_demand``)."""

    gpus: int = 0  # the effective metax-tech.com/gpu (or nvidia.com/gpu) request
    cpu_milli: int = 0  # the effective CPU request (millicores, rounded up)
    memory_mib: int = 0  # the effective memory request (MiB, rounded up)
    share: ShareRequest | None = None  # shared GPUs asked (core.sharing), else None
    # the gpuk8s.io/cuda-runtime annotation as sent (JSON text), None when absent
    cuda_runtime: bytes | None = None

    @property
    def need(self) -> tuple[int, int]:
        """(CPU millicores, memory MiB): what the pod asks besides its GPUs."""
        return (self.cpu_milli, self.memory_mib)


def pod_demand(pod: PodView, root: str = "Pod", lenient: bool = False) -> Demand:
    """The pod's ``Demand``; an unreadable GPU or sharing request is a ``BadRequest``
    naming the field (an unreadable GPU count counts as none when ``lenient``)."""
    gpus, cpu, memory = pod_totals(pod, root, lenient)
    meta = pod.metadata
    annotations = meta.annotations if meta is not None else None
    runtime = annotations.cuda_runtime if annotations is not None else None
    cuda = bytes(runtime) if runtime and bytes(runtime) != b"null" else None
    return Demand(gpus, cpu, memory, view_share(pod, root), cuda)


MAX_DEMANDS = 1024  # pods whose demand ``PodDemands`` keeps (then it starts over)

# What ``pod_demand`` reads of a pod: its containers, init containers, overhead and
# ``gpuk8s.io/cuda-runtime`` annotation, as the typed views sent (compared with ``==``).
DemandParts = tuple[object, object, object, object]


def demand_parts(pod: PodView) -> DemandParts:
    """The parts of the pod that ``pod_demand`` reads: equal parts give an equal demand."""
    spec = pod.spec
    meta = pod.metadata
    annotations = meta.annotations if meta is not None else None
    runtime = annotations.cuda_runtime if annotations is not None else None
    if spec is None:
        return (None, None, None, runtime)
    return (spec.containers, spec.initContainers, spec.overhead, runtime)


class PodDemands:
    """``pod_demand`` kept per pod version: the API server gives every change of a pod a
    new resourceVersion, so (UID, resourceVersion) names one content of the pod, and
    kube-scheduler sends the same pod to filter and then prioritize. The kept demand is
    served only to a pod whose read parts (``demand_parts``) equal those it was computed
    from: a caller that sends other requests under a real pod's version gets its own
    parse, and the pod's next request parses again and replaces the entry. A pod without
    UID or resourceVersion is parsed every time; the demand of a pod that fails to parse
    is not kept. Bounded: after ``bound`` pods it starts over (0: nothing kept)."""

    def __init__(self, bound: int = MAX_DEMANDS) -> None:
        self._bound = bound
        self._known: dict[tuple[str, str], tuple[DemandParts, Demand]] = {}

    def __call__(self, pod: PodView) -> Demand:
        meta = pod.metadata
        if meta is None or not meta.uid or not meta.resourceVersion:
            return pod_demand(pod)
        key = (meta.uid, meta.resourceVersion)
        parts = demand_parts(pod)
        known = self._known.get(key)
        if known is not None and known[0] == parts:
            return known[1]
        demand = pod_demand(pod)
        if known is None and len(self._known) >= self._bound:
            self._known.clear()
        if self._bound > 0:
            self._known[key] = (parts, demand)
        return demand


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


def _container_amounts(container: ContainerView, where: str, lenient: bool) -> PodTotals:
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
    return decode(POD, json.dumps(pod).encode(), "Pod")  # type: ignore[no-any-return]


def pod_request(pod: Mapping[str, Any]) -> int:
    """``view_request`` of a Pod given as a decoded JSON object (tests, tools)."""
    return view_request(decode_pod(pod))
