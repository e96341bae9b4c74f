"""A pod's effective requests: what the scheduler reserves for it and the kubelet admits.

Kubernetes' rule (``k8s.io/component-helpers/resource.PodRequests``; sidecar
containers, KEP-753, are on by default since 1.29):

* the app containers run together: their requests add up;
* a *sidecar* is an init container with ``restartPolicy: Always``: it starts in order
  with the init containers and keeps running beside the app containers, so its request
  adds to the app containers' sum and to every init container that starts after it;
* every other init container runs alone, beside the sidecars started before it;
* the pod needs the largest of these moments, plus ``spec.overhead`` (the RuntimeClass
  overhead, CPU and memory).

A container's request for a resource is its ``requests`` entry, else its ``limits``
entry (the API server defaults requests to limits; an extended resource must have both
equal).

``combine`` is the rule itself, on any vectors of numbers; ``pod_requests`` applies it
to a Pod in its JSON form. gpu-aware (``services/extender/wire.py``: filter, prioritize,
bind), gpu-device (the share it serves) and the exporter (which containers hold GPUs)
all count a pod's requests through this module. Stdlib only, Python 3.8+.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Collection, Iterable, Mapping, Sequence, TypeVar

from .quantity import QuantityError, parse_json_quantity

APP = "app"
INIT = "init"
SIDECAR = "sidecar"

N = TypeVar("N", int, Fraction)


def combine(containers: Iterable[tuple[str, Sequence[N]]], width: int) -> list[N]:
    """The pod's requests from its containers' ``(kind, amounts)``: ``kind`` is ``APP``,
    ``INIT`` or ``SIDECAR``, ``amounts`` one number per resource (``width`` of them).
    Init containers and sidecars come in their order in ``spec.initContainers``; the
    app containers' order does not matter. Overhead is the caller's to add."""
    running: list[N] = [0] * width  # type: ignore[list-item]
    sidecars: list[N] = [0] * width  # type: ignore[list-item]
    peak: list[N] = [0] * width  # type: ignore[list-item]
    for kind, amounts in containers:
        if kind == APP:
            running = [a + b for a, b in zip(running, amounts)]
        elif kind == SIDECAR:
            sidecars = [a + b for a, b in zip(sidecars, amounts)]
            peak = [max(a, b) for a, b in zip(peak, sidecars)]
        else:
            peak = [max(a, b + c) for a, b, c in zip(peak, sidecars, amounts)]
    return [max(r + s, p) for r, s, p in zip(running, sidecars, peak)]


def kind_of(container: Mapping[str, Any], init: bool) -> str:
    """``APP``, ``INIT`` or ``SIDECAR`` of a container of ``spec.containers`` (``init``
    False) or ``spec.initContainers``."""
    if not init:
        return APP
    return SIDECAR if container.get("restartPolicy") == "Always" else INIT


def containers_of(pod: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any], str]]:
    """``(kind, container, path)`` of every container of a Pod in JSON form: the init
    containers in order, then the app containers (``path``: ``spec.initContainers[0]``,
    for messages). Malformed entries are left out."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return []
    out: list[tuple[str, Mapping[str, Any], str]] = []
    for key, init in (("initContainers", True), ("containers", False)):
        items = spec.get(key)
        if not isinstance(items, list):
            continue
        for i, container in enumerate(items):
            if isinstance(container, Mapping):
                out.append((kind_of(container, init), container, f"spec.{key}[{i}]"))
    return out


def _block(container: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    resources = container.get("resources")
    block = resources.get(key) if isinstance(resources, Mapping) else None
    return block if isinstance(block, Mapping) else {}


def container_asks(container: Mapping[str, Any]) -> dict[str, Any]:
    """The container's request per resource as written (JSON values): ``requests``,
    else ``limits``."""
    asks = dict(_block(container, "limits"))
    asks.update(_block(container, "requests"))
    return asks


@dataclass(frozen=True)
class ContainerRequests:
    name: str
    kind: str  # APP, INIT, SIDECAR
    amounts: dict[str, Fraction]  # resource -> request (> 0 only)


@dataclass(frozen=True)
class PodRequests:
    total: dict[str, Fraction]  # resource -> effective request (> 0 only), overhead included
    containers: list[ContainerRequests] = field(default_factory=list)

    def holders(self, resources: Collection[str]) -> list[str]:
        """Names of the containers requesting any of ``resources``."""
        return [c.name for c in self.containers if any(r in c.amounts for r in resources)]


def _amount(value: object) -> Fraction:
    """A quantity as the API stored it; unreadable or negative counts as nothing (the
    API server validated what it stored)."""
    try:
        amount = parse_json_quantity(value)
    except QuantityError:
        return Fraction(0)
    return amount if amount > 0 else Fraction(0)


def pod_requests(pod: Mapping[str, Any], resources: Collection[str] | None = None) -> PodRequests:
    """The effective requests of a Pod in JSON form (``resources``: only these; None:
    every resource any container names)."""
    found = containers_of(pod)
    asks = [(kind, c, container_asks(c)) for kind, c, _ in found]
    names = sorted(
        set(resources) if resources is not None else {r for _, _, a in asks for r in a}
    )
    per = []
    for kind, container, asked in asks:
        amounts = [_amount(asked[r]) if r in asked else Fraction(0) for r in names]
        per.append((kind, container, amounts))
    total = combine(((kind, amounts) for kind, _, amounts in per), len(names))
    spec = pod.get("spec")
    overhead = spec.get("overhead") if isinstance(spec, Mapping) else None
    if isinstance(overhead, Mapping):
        total = [t + _amount(overhead[r]) if r in overhead else t for t, r in zip(total, names)]
    containers = [
        ContainerRequests(
            str(container.get("name", "")),
            kind,
            {r: a for r, a in zip(names, amounts) if a > 0},
        )
        for kind, container, amounts in per
    ]
    return PodRequests({r: t for r, t in zip(names, total) if t > 0}, containers)
