"""core.effective: a pod's effective requests by Kubernetes' rules (init containers: the
largest; sidecars: added to the app containers and to later init containers; overhead),
one function for gpu-aware, gpu-device and the exporter (issue 26, item 3)."""

from __future__ import annotations

import json
from fractions import Fraction
from typing import Any

import pytest

from gpuk8s.core.effective import APP, INIT, SIDECAR, combine, pod_requests
from gpuk8s.core.sharing import GPU_RESOURCES
from gpuk8s.core.telemetry import ContainerRef
from gpuk8s.services.exporter.pods import index_pods
from gpuk8s.services.extender.wire import decode_pod, pod_totals

GPU = "metax-tech.com/gpu"


def container(name: str, cpu: str | None = None, gpu: str | None = None,
              sidecar: bool = False, kind: str = "requests") -> dict[str, Any]:
    asks = {k: v for k, v in (("cpu", cpu), (GPU, gpu)) if v is not None}
    out: dict[str, Any] = {"name": name, "resources": {kind: asks}}
    if sidecar:
        out["restartPolicy"] = "Always"
    return out


# the examples of the Kubernetes documentation (sidecar containers, "Resource sharing
# within containers"), and mixed cases: (init containers, app containers, overhead, cpu)
CASES = [
    ([], [container("a", "1"), container("b", "2")], None, "3"),
    ([container("i1", "5"), container("i2", "1")], [container("a", "2")], None, "5"),
    ([container("s", "1", sidecar=True), container("i", "3")], [container("a", "2")], None,
     "4"),  # the init container runs beside the sidecar started before it: 1 + 3
    ([container("i", "3"), container("s", "1", sidecar=True)], [container("a", "2")], None,
     "3"),  # the sidecar starts after it: max(3, 1 + 2)
    ([container("s1", "1", sidecar=True), container("s2", "2", sidecar=True)],
     [container("a", "500m")], None, "3500m"),
    ([container("i", "1")], [container("a", "1", kind="limits")], {"cpu": "250m"}, "1250m"),
]


@pytest.mark.parametrize(("init", "app", "overhead", "cpu"), CASES)
def test_effective_cpu_follows_kubernetes(
    init: list[Any], app: list[Any], overhead: dict[str, str] | None, cpu: str
) -> None:
    pod: dict[str, Any] = {"spec": {"initContainers": init, "containers": app}}
    if overhead:
        pod["spec"]["overhead"] = overhead
    want = Fraction(cpu.rstrip("m")) / (1000 if cpu.endswith("m") else 1)
    assert pod_requests(pod).total["cpu"] == want
    # gpu-aware's typed decoding counts the same (one rule: core.effective.combine)
    assert pod_totals(decode_pod(pod))[1] == want * 1000


def test_gpus_of_init_and_sidecar_containers_count() -> None:
    """metax-tech.com/gpu asked by a sidecar adds to the app containers'."""
    pod = {"spec": {"initContainers": [container("s", gpu="1", sidecar=True),
                                       container("i", gpu="4")],
                    "containers": [container("a", gpu="2", kind="limits")]}}
    assert pod_requests(pod, [GPU]).total == {GPU: 5}  # max(1 + 4, 1 + 2)
    assert pod_totals(decode_pod(pod))[0] == 5
    assert combine([(SIDECAR, (1,)), (INIT, (4,)), (APP, (2,))], 1) == [5]


def test_holders_are_the_containers_asking_for_gpus() -> None:
    pod = {"spec": {"initContainers": [container("side", "1", sidecar=True)],
                    "containers": [container("main", gpu="1"), container("log", "1")]}}
    assert pod_requests(pod, GPU_RESOURCES).holders(GPU_RESOURCES) == ["main"]


def test_exporter_gives_a_pods_process_to_its_gpu_container() -> None:
    """A process the exporter knows only by its pod (its container not listed yet) goes
    to the container asking for GPUs; before, a pod with a sidecar or a finished init
    container had two candidates and the process was nobody's."""
    pod = json.loads(json.dumps({
        "metadata": {"uid": "u1", "namespace": "ns", "name": "train"},
        "spec": {"initContainers": [container("fetch", "1")],
                 "containers": [container("main", gpu="2"), container("log", "100m")]},
        "status": {"initContainerStatuses": [{"name": "fetch"}],
                   "containerStatuses": [{"name": "main"}, {"name": "log"}]},
    }))
    by_uid = index_pods([pod]).by_uid
    assert by_uid == {"u1": [ContainerRef("ns", "train", "main")]}
    pod["spec"]["containers"][0]["resources"] = {}  # no container asks for GPUs: all
    by_uid = index_pods([pod]).by_uid
    assert len(by_uid["u1"]) == 3
