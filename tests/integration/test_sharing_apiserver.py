"""GPU sharing against a real kube-apiserver: the extender's bind verb chooses node and
GPU and binds the pod with the choice in one write; many concurrent binds never over-commit
a GPU; a restarted extender rebuilds its per-GPU accounting from the pod annotations."""

from __future__ import annotations

import json
import os
import sys
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
from test_extender_apiserver import GPU_RESOURCE, _post, node_annotations, wait_for

from gpuk8s import sim
from gpuk8s.core.model import NodeInventory
from gpuk8s.core.sharing import (
    ASSIGNED_ANNOTATION,
    MPS_CORE_RESOURCE,
    MPS_MEMORY_RESOURCE,
    PHASE_ANNOTATION,
    SGPU_RESOURCE,
    SHARING_MODE_LABEL,
    VCORE_RESOURCE,
    VCUDA_CORE_RESOURCE,
    VCUDA_MEMORY_RESOURCE,
    memory_label_mib,
    parse_assignment,
)
from gpuk8s.discovery import discover
from gpuk8s.services.extender.main import ExtenderService, build_parser, build_service

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning"),
]


@pytest.fixture(scope="module")
def n260(tmp_path_factory: pytest.TempPathFactory) -> NodeInventory:
    root = str(tmp_path_factory.mktemp("sim") / "c500")
    sim.create(root, "n260-2")
    return discover(root)


class KubeletStandIn:
    """The kubelet's part for shared GPUs on a node that has no kubelet here: admit
    each pod bound to ``node`` (newest first, against the bind order) through
    the real gpu-device path -- ``SharedDevices.container_spec`` with as many replica
    ids as the pod's counted resource asks for, ``KubePendingPods`` over the API, which
    picks the pod by that number and marks it ``allocated``. ``wrong`` lists the pods
    whose Allocate served another pod's assignment (an ambiguous match)."""

    def __init__(self, apiserver: Any, node: str, inventory: NodeInventory, mode: str) -> None:
        from gpuk8s.services.deviceplugin.sharing import (
            REPLICAS,
            KubePendingPods,
            SharedDevices,
            replica_id,
        )
        from gpuk8s.services.node.devices import DeviceSet

        self.core = apiserver.core()
        self.node = node
        backend = "nvidia.com/gpu" if inventory.gpus[0].vendor == "nvidia" else GPU_RESOURCE
        devices = DeviceSet(inventory, backend)
        self.plugin = SharedDevices(
            devices, mode, node, KubePendingPods(node, self.core.api_client)
        )
        self.ids = [replica_id(u.id, n) for u in self.plugin.units for n in range(REPLICAS[mode])]
        self.admitted: dict[str, str] = {}  # pod name -> GPUK8S_DEVICE_IDS it was given
        self.wrong: list[str] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            try:
                self._admit()
            except Exception as err:  # the API going away at the end, say
                self.errors.append(f"listing pods: {err}"[:300])

    def _admit(self) -> None:
        pods = self.core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={self.node}"
        ).items
        # newest first: the protocol must hold for any admission order, and this one
        # is the opposite of the order the pods were created and bound in
        for pod in sorted(pods, key=lambda p: p.metadata.creation_timestamp, reverse=True):
            name = pod.metadata.name
            if name in self.admitted or pod.metadata.deletion_timestamp:
                continue
            limits = pod.spec.containers[0].resources.limits or {}
            count = int(limits[self.plugin.resource_name])
            try:
                spec = self.plugin.container_spec(self.ids[:count])
            except Exception as err:
                self.errors.append(f"{name}: {err}")
                continue
            self.admitted[name] = spec.envs["GPUK8S_DEVICE_IDS"]
            got = self.core.read_namespaced_pod(name, pod.metadata.namespace)
            if (got.metadata.annotations or {}).get(PHASE_ANNOTATION) != "allocated":
                self.wrong.append(name)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def _service(apiserver: Any) -> ExtenderService:
    args = build_parser().parse_args(
        [
            "--port",
            "0",
            "--address",
            "127.0.0.1",
            "--node-cache",
            "--kubeconfig",
            apiserver.kubeconfig("gpu-aware"),
            "--log-level",
            "warning",
        ]
    )
    service = build_service(args)
    service.start()
    sharing = service.extender.sharing
    assert sharing is not None and service.extender.cache is not None
    wait_for(lambda: sharing.ledger.synced and service.extender.cache.synced, 30, "sync")  # type: ignore[union-attr]
    return service


def _shared_pod(name: str, vcore: int) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/none:1",
                    "resources": {"limits": {SGPU_RESOURCE: "1", VCORE_RESOURCE: str(vcore)}},
                }
            ]
        },
    }


def _bind(service: ExtenderService, pod: Any, node: str, status_: int = 200) -> str:
    """filter then bind, as kube-scheduler calls them: a node the filter drops is
    never bound (its reason is returned)."""
    from kubernetes.client import ApiClient

    body = {"Pod": ApiClient().sanitize_for_serialization(pod), "NodeNames": [node]}
    status, result = _post(service, "filter", body)
    assert status == 200, result
    if node not in result["NodeNames"]:
        return str({**result["FailedNodes"], **result["FailedAndUnresolvableNodes"]}[node])
    status, result = _post(
        service,
        "bind",
        {
            "PodName": pod.metadata.name,
            "PodNamespace": "default",
            "PodUID": pod.metadata.uid,
            "Node": node,
        },
    )
    assert status == status_, result
    return str(result["Error"])


def _per_gpu(core: Any, node: str, prefix: str) -> dict[int, int]:
    """Compute percent per GPU index, summed from the pods' annotations (the truth)."""
    per: dict[int, int] = {}
    for pod in core.list_namespaced_pod("default").items:
        if not pod.metadata.name.startswith(prefix):
            continue
        raw = (pod.metadata.annotations or {}).get(ASSIGNED_ANNOTATION)
        assignment = parse_assignment(raw)
        if assignment is None:
            assert not pod.spec.node_name, f"{pod.metadata.name} bound without a GPU choice"
            continue
        assert pod.spec.node_name == node == assignment.node
        for index in assignment.gpus:
            per[index] = per.get(index, 0) + assignment.share.core
    return per


def test_concurrent_binds_never_overcommit_and_restart_rebuilds(
    apiserver: Any, n260: NodeInventory, request: pytest.FixtureRequest
) -> None:
    tag = uuid.uuid4().hex[:6]
    node, other = f"share-{tag}", f"excl-{tag}"
    core = apiserver.core()
    labels = {SHARING_MODE_LABEL: "sgpu", "metax-tech.com/gpu.memory": "64GB"}
    core.create_node(
        {
            "metadata": {
                "name": node,
                "labels": labels,
                "annotations": node_annotations(n260, allocated=[]),
            }
        }
    )
    core.create_node(
        {"metadata": {"name": other, "annotations": node_annotations(n260, allocated=[])}}
    )
    # 2 GPUs x 100 % = room for 4 pods of 50 %; 16 arrive at once
    pods = [
        core.create_namespaced_pod("default", _shared_pod(f"{tag}-p{i:02d}", 50)) for i in range(16)
    ]
    kubelet = KubeletStandIn(apiserver, node, n260, "sgpu")
    request.addfinalizer(kubelet.stop)
    service = _service(apiserver)
    assert service.extender.sharing is not None
    # same-size binds on one node take turns (one waits for Allocate at a time)
    service.extender.sharing.bind_wait_s = 10.0
    try:
        # filter: the exclusive node is unresolvable for a sharing pod
        body = {
            "Pod": {
                "metadata": {"name": "x", "uid": "x"},
                "spec": {
                    "containers": [
                        {"name": "m",
                         "resources": {"limits": {SGPU_RESOURCE: "1", VCORE_RESOURCE: "50"}}}
                    ]
                },
            },
            "NodeNames": [node, other],
        }
        status, result = _post(service, "filter", body)
        assert status == 200 and result["NodeNames"] == [node], result
        assert "sharing mode is 'exclusive'" in result["FailedAndUnresolvableNodes"][other]

        with ThreadPoolExecutor(max_workers=16) as pool:
            errors = list(pool.map(lambda p: _bind(service, p, node), pods))
        bound = [e for e in errors if e == ""]
        refused = [e for e in errors if e]
        assert len(bound) == 4, errors
        assert len(refused) == 12 and all("compute left" in e for e in refused), refused
        per = _per_gpu(core, node, f"{tag}-p")
        assert per == {0: 100, 1: 100}  # full, never over 100
        bound_pod = next(p for p, e in zip(pods, errors, strict=False) if e == "")

        def phase() -> str | None:
            got = core.read_namespaced_pod(bound_pod.metadata.name, "default")
            return (got.metadata.annotations or {}).get(PHASE_ANNOTATION)

        # "allocating" as bind wrote it, until gpu-device's Allocate served the pod
        wait_for(lambda: phase() == "allocated", 30, "the pod allocated")
        # a pod of whole GPUs is bound as the default binder would
        whole = core.create_namespaced_pod(
            "default",
            {"metadata": {"name": f"{tag}-whole"},
             "spec": {"containers": [{"name": "m", "image": "registry.invalid/none:1",
                                      "resources": {"limits": {GPU_RESOURCE: "1"}}}]}},
        )
        assert _bind(service, whole, other) == ""
        got = core.read_namespaced_pod(f"{tag}-whole", "default")
        assert got.spec.node_name == other
        assert ASSIGNED_ANNOTATION not in (got.metadata.annotations or {})
        # one asking for no GPU is not gpu-aware's to bind (managedResources keep such
        # pods away from it): refused, left unbound
        plain = core.create_namespaced_pod(
            "default",
            {"metadata": {"name": f"{tag}-nogpu"},
             "spec": {"containers": [{"name": "m", "image": "registry.invalid/none:1"}]}},
        )
        assert "asks for no GPUs" in _bind(service, plain, other, 400)
        assert not core.read_namespaced_pod(f"{tag}-nogpu", "default").spec.node_name
    finally:
        service.close()

    # restart: the new extender knows nothing but what the pods carry
    service = _service(apiserver)
    try:
        sharing = service.extender.sharing
        assert sharing is not None
        sharing.bind_wait_s = 10.0
        usage = sharing.ledger.usage(node)
        assert {i: u.core for i, u in usage.items()} == {0: 100, 1: 100}
        waiting = [p for p, e in zip(pods, errors, strict=False) if e]
        assert "compute left" in _bind(service, waiting[0], node)
        # one bound pod goes away: exactly one waiting pod can take its half GPU
        gone = next(p for p, e in zip(pods, errors, strict=False) if e == "")
        core.delete_namespaced_pod(gone.metadata.name, "default", grace_period_seconds=0)
        wait_for(
            lambda: sum(u.core for u in sharing.ledger.usage(node).values()) == 150,
            30,
            "the deleted pod's share to be freed",
        )
        results = []
        lock = threading.Lock()

        def bind(p: Any) -> None:
            error = _bind(service, p, node)
            with lock:
                results.append(error)

        threads = [threading.Thread(target=bind, args=(p,)) for p in waiting[:4]]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert sorted(results).count("") == 1, results
        assert max(_per_gpu(core, node, f"{tag}-p").values()) == 100
        assert sum(_per_gpu(core, node, f"{tag}-p").values()) == 200
        # every bound pod went through gpu-device's Allocate, each with its own choice
        wait_for(lambda: len(kubelet.admitted) == 5, 30, "the five bound pods allocated")
        assert kubelet.wrong == [] and kubelet.errors == [], (kubelet.wrong, kubelet.errors)
    finally:
        service.close()
        for name in (node, other):
            core.delete_node(name)
        for pod in core.list_namespaced_pod("default").items:
            if pod.metadata.name.startswith(tag):
                core.delete_namespaced_pod(pod.metadata.name, "default", grace_period_seconds=0)


@dataclass(frozen=True)
class FamilyCase:
    """One sharing family through the real kube-scheduler: ``holders`` are bound first
    (their GPUs are taken), then ``pods`` arrive at once; ``bound`` of them fit."""

    mode: str
    preset: str
    capacity: dict[str, str]  # what gpu-device --sharing-mode advertises
    managed: dict[str, bool]  # managedResources: resource -> ignoredByScheduler
    holders: tuple[dict[str, str], ...]
    pods: tuple[dict[str, str], ...]
    bound: int
    memory_label: str = "64GB"


FAMILY_CASES = [
    # MetaX sGPU on 2 GPUs: four halves fit, the fifth waits
    FamilyCase(
        "sgpu", "n260-2", {SGPU_RESOURCE: "32"}, {SGPU_RESOURCE: False, VCORE_RESOURCE: True},
        (), ({SGPU_RESOURCE: "1", VCORE_RESOURCE: "50"},) * 5, 4,
    ),
    # vGPU quotas on 8 H100s: six whole GPUs (topology allocator), then 40 GiB shares:
    # two per GPU left by memory although compute and kube-scheduler's count allow more
    FamilyCase(
        "vcuda", "nvidia-8", {VCUDA_CORE_RESOURCE: "800"},
        {VCUDA_CORE_RESOURCE: False, VCUDA_MEMORY_RESOURCE: True},
        ({VCUDA_CORE_RESOURCE: "600"},),
        ({VCUDA_CORE_RESOURCE: "40", VCUDA_MEMORY_RESOURCE: "160"},) * 5, 4, "80GB",
    ),
    # MPS on 8 H100s: six GPUs held by mps-core 100 (exclusive), then 40 GiB clients
    FamilyCase(
        "mps", "nvidia-8", {MPS_CORE_RESOURCE: "800"},
        {MPS_CORE_RESOURCE: False, MPS_MEMORY_RESOURCE: True},
        ({MPS_CORE_RESOURCE: "100"},) * 6,
        ({MPS_CORE_RESOURCE: "30", MPS_MEMORY_RESOURCE: "40Gi"},) * 5, 4, "80GB",
    ),
]


@pytest.mark.parametrize("case", FAMILY_CASES, ids=[c.mode for c in FAMILY_CASES])
def test_real_kube_scheduler_binds_each_family_through_the_extender(
    apiserver: Any,
    tmp_path: Any,
    case: FamilyCase,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    """kube-scheduler (the lab's build) with filter, prioritize and bind, per sharing
    family: the holders are bound, then of the pods that arrive at once exactly
    ``case.bound`` are bound and the rest stay pending with gpu-aware's reason; every
    binding carries the GPU choice, no GPU is over 100 % compute or over its memory,
    whole GPUs are shared with nobody; gpu-device's Allocate (driven by a kubelet
    stand-in) serves each pod its own GPUs although holders and shares arrive at once
    with equal numbers of device ids."""
    from test_extender_apiserver import Scheduler, scheduler_config

    monkeypatch.setenv("PATH", f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}")
    root = str(tmp_path / "node")
    sim.create(root, case.preset)  # the NVIDIA stand-in tools run with this python
    inventory = discover(root)
    tag = uuid.uuid4().hex[:6]
    node = f"{case.mode}-{tag}"
    core = apiserver.core()
    core.create_node(
        {
            "metadata": {
                "name": node,
                "labels": {SHARING_MODE_LABEL: case.mode, "gpuk8s.test/pool": tag,
                           "metax-tech.com/gpu.memory": case.memory_label},
                "annotations": node_annotations(inventory, allocated=[]),
            }
        }
    )
    resources = {"cpu": "64", "memory": "256Gi", "pods": "110", **case.capacity}
    ready = [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "t"}]
    core.patch_node_status(
        node,
        {"status": {"capacity": resources, "allocatable": resources, "conditions": ready}},
        _content_type="application/merge-patch+json",
    )
    kubelet = KubeletStandIn(apiserver, node, inventory, case.mode)
    request.addfinalizer(kubelet.stop)
    service = _service(apiserver)
    scheduler = None

    def create(name: str, limits: dict[str, str]) -> None:
        body = _shared_pod(name, 0)
        body["spec"]["containers"][0]["resources"]["limits"] = dict(limits)
        body["spec"]["nodeSelector"] = {"gpuk8s.test/pool": tag}
        # no controller-manager/kubelet here: the admission's not-ready taint stays
        body["spec"]["tolerations"] = [
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoSchedule"}
        ]
        core.create_namespaced_pod("default", body)

    def bound(names: list[str]) -> list[Any]:
        pods = [core.read_namespaced_pod(n, "default") for n in names]
        return [p for p in pods if p.spec.node_name]

    try:
        scheduler = Scheduler(
            apiserver, tmp_path, scheduler_config(service.port, case.managed, bind_verb="bind")
        )
        cache = service.extender.cache
        assert cache is not None
        wait_for(lambda: cache.get(node) is not None, 30, "the node cache")
        holders = [f"{tag}-h{i}" for i in range(len(case.holders))]
        for name, limits in zip(holders, case.holders, strict=True):
            create(name, limits)
        wait_for(lambda: len(bound(holders)) == len(holders), 60, "the holders bound")
        names = [f"{tag}-s{i}" for i in range(len(case.pods))]
        for name, limits in zip(names, case.pods, strict=True):
            create(name, limits)
        wait_for(lambda: len(bound(names)) == case.bound, 60, f"{case.bound} pods bound")

        assignments = {}
        for pod in bound(holders + names):
            got = parse_assignment((pod.metadata.annotations or {}).get(ASSIGNED_ANNOTATION))
            assert got is not None, f"{pod.metadata.name} bound without a GPU choice"
            assert got.node == node and got.share.mode == case.mode
            assignments[pod.metadata.name] = got
        per_core: dict[int, int] = {}
        per_memory: dict[int, int] = {}
        holders_of: dict[int, list[str]] = {}
        for name, got in assignments.items():
            for index in got.gpus:
                per_core[index] = per_core.get(index, 0) + got.share.core
                per_memory[index] = per_memory.get(index, 0) + got.share.memory_mib
                holders_of.setdefault(index, []).append(name)
        assert max(per_core.values()) == 100, per_core  # full, never over
        gpu_mib = memory_label_mib(case.memory_label)
        assert gpu_mib is not None and max(per_memory.values()) <= gpu_mib, per_memory
        for name, got in assignments.items():
            if got.share.exclusive:
                assert all(holders_of[i] == [name] for i in got.gpus), holders_of
        if case.holders:  # the shares went to the GPUs the holders left
            held = {i for n in holders for i in assignments[n].gpus}
            assert len(held) == 6
            assert not held & {i for n in names if n in assignments for i in assignments[n].gpus}
        waiting = [n for n in names if n not in assignments]
        assert len(waiting) == len(case.pods) - case.bound

        def told(name: str) -> bool:
            conditions = core.read_namespaced_pod(name, "default").status.conditions or []
            return any(c.type == "PodScheduled" and c.status == "False"
                       and "gpu-aware" in (c.message or "") for c in conditions)

        wait_for(lambda: all(told(n) for n in waiting), 30, "gpu-aware's reason on the pod")
        # gpu-device's Allocate served each bound pod its own GPUs
        wait_for(lambda: len(kubelet.admitted) == len(assignments), 30, "every pod allocated")
        assert kubelet.wrong == [] and kubelet.errors == [], (kubelet.wrong, kubelet.errors)
        unit_of = {u.gpu: u.id for u in kubelet.plugin.units}
        for name, got in assignments.items():
            given = set(kubelet.admitted[name].split(","))
            assert given == {unit_of[i] for i in got.gpus}, (name, given, got.gpus)
    finally:
        if scheduler is not None:
            scheduler.stop()
        service.close()
        core.delete_node(node)
        for pod in core.list_namespaced_pod("default").items:
            if pod.metadata.name.startswith(tag):
                core.delete_namespaced_pod(pod.metadata.name, "default", grace_period_seconds=0)


def test_real_kube_scheduler_asks_gpu_aware_about_pods_without_gpus(
    apiserver: Any, n260: NodeInventory, tmp_path: Any
) -> None:
    """The configuration the Ansible module writes with ``rank_pods_without_gpus``
    (``schedconf.new_config``, two entries, profile ``packing``) on the real
    kube-scheduler: the second entry is accepted, asked about the pod without GPUs
    (``prioritize-nogpu``), and moves it off the node where its CPU would strand the
    free GPUs -- the node kube-scheduler's own scorers prefer, and pick without it."""
    from test_extender_apiserver import Scheduler

    from gpuk8s.core import schedconf

    tag = uuid.uuid4().hex[:6]
    core = apiserver.core()
    ready = [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "t"}]
    resources = {"cpu": "64", "memory": "256Gi", "pods": "110", VCUDA_CORE_RESOURCE: "200"}
    busy, roomy, sink = (f"{n}-{tag}" for n in ("busy", "roomy", "sink"))
    for name, pool in ((busy, f"{tag}-x"), (roomy, f"{tag}-x"), (sink, f"{tag}-s")):
        core.create_node({"metadata": {
            "name": name,
            "labels": {SHARING_MODE_LABEL: "vcuda", "gpuk8s.test/pool": pool,
                       "metax-tech.com/gpu.memory": "64GB"},
            "annotations": node_annotations(n260, allocated=[])}})
        core.patch_node_status(
            name,
            {"status": {"capacity": resources, "allocatable": resources, "conditions": ready}},
            _content_type="application/merge-patch+json",
        )
    toleration = [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                   "effect": "NoSchedule"}]

    def pod(name: str, pool: str, requests: dict[str, str], node: str | None = None) -> None:
        spec: dict[str, Any] = {
            "tolerations": toleration,
            "containers": [{"name": "m", "image": "registry.invalid/x:1",
                            "resources": {"requests": requests, "limits": requests}}],
        }
        if node:
            spec["nodeName"] = node
        else:
            spec["nodeSelector"] = {"gpuk8s.test/pool": pool}
        core.create_namespaced_pod("default", {"metadata": {"name": name}, "spec": spec})

    def node_of(name: str) -> str | None:
        return core.read_namespaced_pod(name, "default").spec.node_name  # type: ignore[no-any-return]

    # what already runs: CPU and memory taken, no GPU. kube-scheduler's balance score
    # prefers busy for a 6-core pod: there its CPU and memory fractions end up equal
    # (58/64, 232Gi/256Gi), on roomy apart (7/64, 9Gi/256Gi): the score of 1.35 (balance
    # after) and of 1.37 (balance gained: busy's improves, roomy's worsens) agree ...
    pod(f"{tag}-held-busy", "", {"cpu": "52", "memory": "224Gi"}, busy)
    pod(f"{tag}-held-roomy", "", {"cpu": "1", "memory": "1Gi"}, roomy)
    service = _service(apiserver)
    calls: list[str] = []
    handle = service.extender.handle

    def recording(verb: str, body: bytes) -> Any:
        if verb == schedconf.NOGPU_VERB:
            calls.append(json.loads(body)["Pod"]["metadata"]["name"])
        return handle(verb, body)

    service.extender.handle = recording  # type: ignore[method-assign]
    managed = (schedconf.ManagedResource(VCUDA_CORE_RESOURCE),
               schedconf.ManagedResource(VCUDA_MEMORY_RESOURCE, True))
    scheduler = None
    try:
        for rank in (False, True):
            spec = schedconf.ExtenderSpec(
                f"http://127.0.0.1:{service.port}", node_cache_capable=True,
                http_timeout="10s", bind_verb="bind", managed_resources=managed,
                rank_nogpu=rank,
            )
            config = schedconf.new_config(spec, schedconf.api_version_for("v1.35.4"))
            assert len(config["extenders"]) == (2 if rank else 1)
            (tmp_path / str(rank)).mkdir()
            scheduler = Scheduler(apiserver, tmp_path / str(rank), config)
            cache = service.extender.cache
            assert cache is not None
            wait_for(lambda cache=cache: all(cache.get(n) is not None
                                             for n in (busy, roomy, sink)),
                     30, "the node cache")
            if not rank:
                # ... the shares that arrive (on the sink node) ask 8 cores each (sizes
                # that differ: no bind waits for another one's Allocate, no kubelet here)
                for i in range(4):
                    pod(f"{tag}-share{i}", f"{tag}-s",
                        {VCUDA_CORE_RESOURCE: str(25 + i), "cpu": "8"})
                wait_for(lambda: all(node_of(f"{tag}-share{i}") == sink for i in range(4)), 60,
                         "the shares bound")
            name = f"{tag}-cpu-{int(rank)}"
            pod(name, f"{tag}-x", {"cpu": "6", "memory": "8Gi"})
            wait_for(lambda: node_of(name) is not None, 60, f"{name} to be scheduled")  # noqa: B023
            # ... where 6 cores would be left for GPUs whose shares ask 8: gpu-aware
            # sends the pod to roomy once kube-scheduler asks it
            assert node_of(name) == (roomy if rank else busy), (rank, calls)
            assert (name in calls) == rank
            core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
            wait_for(lambda: name not in {p.metadata.name for p in  # noqa: B023
                                          core.list_namespaced_pod("default").items}, 30, "gone")
            scheduler.stop()
            scheduler = None
    finally:
        if scheduler is not None:
            scheduler.stop()
        service.close()
        for name in (busy, roomy, sink):
            core.delete_node(name)
        for item in core.list_namespaced_pod("default").items:
            if item.metadata.name.startswith(tag):
                core.delete_namespaced_pod(item.metadata.name, "default",
                                           grace_period_seconds=0)


def test_the_binding_sets_node_and_choice_in_one_write_or_nothing(apiserver: Any) -> None:
    """bind's one write (``KubePodApi.bind`` with annotations), the real API server as the
    oracle, as gpu-aware's own user: the Binding's annotations land on the pod with its
    node in one resourceVersion; a Binding for another UID (the pod replaced meanwhile)
    and one for a bound pod are refused (409) and leave the pod exactly as it was."""
    from kubernetes.client.exceptions import ApiException

    from gpuk8s.services.extender.podapi import KubePodApi
    from gpuk8s.services.kube import api_client

    tag = uuid.uuid4().hex[:6]
    core = apiserver.core()
    pods = KubePodApi(api_client(apiserver.kubeconfig("gpu-aware")))
    choice = {ASSIGNED_ANNOTATION: f'{{"node": "n-{tag}"}}', PHASE_ANNOTATION: "allocating"}

    created = core.create_namespaced_pod("default", _shared_pod(f"{tag}-one", 50))
    before = int(created.metadata.resource_version)
    pods.bind("default", f"{tag}-one", created.metadata.uid, f"n-{tag}", choice)
    got = core.read_namespaced_pod(f"{tag}-one", "default")
    assert got.spec.node_name == f"n-{tag}"
    assert {k: got.metadata.annotations[k] for k in choice} == choice
    # one write: a watch from the created version sees one change, carrying both
    from kubernetes import watch

    seen = [(e["type"], e["object"].spec.node_name,
             (e["object"].metadata.annotations or {}).get(ASSIGNED_ANNOTATION))
            for e in watch.Watch().stream(
                core.list_namespaced_pod, "default", field_selector=f"metadata.name={tag}-one",
                resource_version=str(before), timeout_seconds=2)]
    assert seen == [("MODIFIED", f"n-{tag}", choice[ASSIGNED_ANNOTATION])], seen

    # the same pod again (already bound): refused, unchanged
    with pytest.raises(ApiException) as bound:
        pods.bind("default", f"{tag}-one", created.metadata.uid, "elsewhere",
                  {ASSIGNED_ANNOTATION: "other"})
    assert bound.value.status == 409
    again = core.read_namespaced_pod(f"{tag}-one", "default")
    assert again.spec.node_name == f"n-{tag}"
    assert again.metadata.annotations[ASSIGNED_ANNOTATION] == choice[ASSIGNED_ANNOTATION]
    assert again.metadata.resource_version == got.metadata.resource_version

    # a Binding naming another UID (the pod of that name was replaced): refused, unchanged
    other = core.create_namespaced_pod("default", _shared_pod(f"{tag}-two", 50))
    with pytest.raises(ApiException) as replaced:
        pods.bind("default", f"{tag}-two", "0e0e0e0e-0000-4000-8000-000000000000", f"n-{tag}",
                  choice)
    assert replaced.value.status == 409
    left = core.read_namespaced_pod(f"{tag}-two", "default")
    assert not left.spec.node_name
    assert ASSIGNED_ANNOTATION not in (left.metadata.annotations or {})
    assert left.metadata.resource_version == other.metadata.resource_version
