"""gpu-aware's node cache and bound-pod tracker fed by real watches on a real
kube-apiserver (RBAC: get/list/watch on nodes and pods), served over real HTTP."""

from __future__ import annotations

import http.client
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpuk8s import sim
from gpuk8s.core.devicelist import DEVICES_ANNOTATION
from gpuk8s.core.model import NodeInventory
from gpuk8s.discovery import discover
from gpuk8s.services.deviceplugin.nodestate import published_annotations
from gpuk8s.services.extender.main import ExtenderService, build_parser, build_service
from gpuk8s.services.extender.nodes import BoundPods, NodeCache
from gpuk8s.services.extender.watch import node_watch_loop, pod_watch_loop
from gpuk8s.services.kube import api_client
from gpuk8s.services.node.devices import DeviceSet

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning"),
]

GPU = "metax-tech.com/gpu"


@pytest.fixture(scope="module")
def c500(tmp_path_factory: pytest.TempPathFactory) -> NodeInventory:
    root = str(tmp_path_factory.mktemp("sim") / "c500")
    sim.create(root, "c500-8")
    return discover(root)


GPU_RESOURCE = "metax-tech.com/gpu"


def node_annotations(inventory: NodeInventory, allocated: list[int]) -> dict[str, str]:
    """The annotations gpu-device publishes with the units at ``allocated`` in use."""
    devices = DeviceSet(inventory, GPU_RESOURCE)
    return published_annotations(devices, {devices.units[p].id for p in allocated})


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.fixture
def names() -> Iterator[list[str]]:
    tag = uuid.uuid4().hex[:6]
    yield [f"gpu-{tag}-a", f"gpu-{tag}-b", f"gpu-{tag}-c"]


def _create_nodes(apiserver: Any, names: list[str], c500: NodeInventory) -> None:
    core = apiserver.core()
    core.create_node(
        {"metadata": {"name": names[0], "annotations": node_annotations(c500, allocated=[0, 1])}}
    )  # a whole MetaXLink group of 4 is free
    core.create_node(
        {"metadata": {"name": names[1], "annotations": node_annotations(c500, allocated=[0, 4])}}
    )  # 6 free, no whole group
    core.create_node({"metadata": {"name": names[2]}})  # no gpu-device


def _gpu_pod(name: str, node: str, gpus: int) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/none:1",
                    "resources": {"limits": {GPU: str(gpus)}},
                }
            ],
        },
    }


def test_watch_loops_follow_nodes_and_bound_pods(
    apiserver: Any, names: list[str], c500: NodeInventory
) -> None:
    _create_nodes(apiserver, names, c500)
    client = api_client(apiserver.kubeconfig("gpu-aware"))
    cache, pods = NodeCache(), BoundPods()
    stop = threading.Event()
    threads = [
        threading.Thread(target=loop, args=(stop,), daemon=True)
        for loop in (node_watch_loop(client, cache), pod_watch_loop(client, pods))
    ]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: cache.synced and pods.synced, 30, "initial lists")
        state = cache.get(names[0])
        assert state is not None and (state.free, state.allocated) == (6, 2)
        assert cache.get(names[2]) is not None and cache.get(names[2]).problem  # type: ignore[union-attr]

        # the device plugin publishes a new allocation: the cache follows the watch
        apiserver.core().patch_node(
            names[0],
            {"metadata": {"annotations": node_annotations(c500, allocated=[0, 1, 2])}},
            _content_type="application/merge-patch+json",
        )
        wait_for(
            lambda: cache.get(names[0]).allocated == 3,
            30,  # type: ignore[union-attr]
            "the annotation change",
        )
        apiserver.core().delete_node(names[2])
        wait_for(lambda: cache.get(names[2]) is None, 30, "the node deletion")

        core = apiserver.core()
        core.create_namespaced_pod("default", _gpu_pod(f"{names[1]}-p", names[1], 3))
        core.create_namespaced_pod(
            "default",
            {
                "metadata": {"name": f"{names[1]}-cpu"},
                "spec": {"nodeName": names[1], "containers": [{"name": "c", "image": "x"}]},
            },
        )
        wait_for(lambda: pods.requested(names[1]) == 3, 30, "the bound GPU pod")
        state = cache.get(names[1])
        assert state is not None and pods.promised(state) == 1  # 3 requested, 2 allocated
        pod = core.read_namespaced_pod(f"{names[1]}-p", "default")
        pod.status.phase = "Succeeded"
        core.replace_namespaced_pod_status(f"{names[1]}-p", "default", pod)
        wait_for(lambda: pods.requested(names[1]) == 0, 30, "the finished pod to be dropped")
    finally:
        stop.set()
    for thread in threads:
        thread.join(timeout=WATCH_JOIN_S)


WATCH_JOIN_S = 1.0  # the loops stop at the next event or watch timeout; daemon threads


def _post(service: ExtenderService, verb: str, payload: Any) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", service.port, timeout=10)
    conn.request(
        "POST",
        f"/{verb}",
        body=json.dumps(payload).encode(),
        headers={"Content-Type": "application/json"},
    )
    resp = conn.getresponse()
    data = json.loads(resp.read())
    conn.close()
    return resp.status, data


def _cached_service_args(apiserver: Any) -> Any:
    """Flags of a gpu-aware with the node cache, on a free port, as the chart runs it."""
    return build_parser().parse_args(
        ["--port", "0", "--address", "127.0.0.1", "--node-cache",
         "--kubeconfig", apiserver.kubeconfig("gpu-aware"), "--log-level", "warning"]
    )


def test_extender_service_with_node_cache(
    apiserver: Any, names: list[str], c500: NodeInventory
) -> None:
    _create_nodes(apiserver, names, c500)
    service = _extender_service(apiserver)
    try:
        cache = service.extender.cache
        assert cache is not None
        wait_for(lambda: cache.synced and cache.get(names[2]) is not None, 30, "node cache")
        pod = {
            "metadata": {"name": "train", "namespace": "default", "uid": "u1"},
            "spec": {"containers": [{"name": "m", "resources": {"limits": {GPU: "4"}}}]},
        }
        status, result = _post(service, "filter", {"Pod": pod, "NodeNames": names})
        assert status == 200 and result["NodeNames"] == names[:2]
        assert DEVICES_ANNOTATION in result["FailedAndUnresolvableNodes"][names[2]]
        status, result = _post(service, "prioritize", {"Pod": pod, "NodeNames": names})
        assert result == [
            {"Host": names[0], "Score": 10},
            {"Host": names[1], "Score": 9},
            {"Host": names[2], "Score": 0},
        ]
        # the pod holding the 2 allocated devices, then a 4-GPU pod just bound there:
        # its GPUs are promised at once, before any device list update
        core = apiserver.core()
        core.create_namespaced_pod("default", _gpu_pod(f"{names[0]}-old", names[0], 2))
        core.create_namespaced_pod("default", _gpu_pod(f"{names[0]}-new", names[0], 4))
        pods = service.extender.pods
        assert pods is not None
        wait_for(lambda: pods.requested(names[0]) == 6, 30, "the bound pods")
        status, result = _post(service, "filter", {"Pod": pod, "NodeNames": names})
        assert result["NodeNames"] == [names[1]]
        assert "4 promised" in result["FailedNodes"][names[0]]
    finally:
        service.close()


def test_poisoned_nodes_do_not_stop_the_node_cache(
    apiserver: Any, names: list[str], c500: NodeInventory
) -> None:
    """Issue 15: a node whose annotations hold NaN tables, a 100,000-deep device list or a
    400-digit score used to make the first list fail for ever (/readyz 503, every filter
    "not synced"). Now the cache syncs, /readyz is ready, the bad node is excluded with a
    reason and reported (metric, log)."""
    good, poisoned, deep = names
    core = apiserver.core()
    core.create_node(
        {"metadata": {"name": good, "annotations": node_annotations(c500, allocated=[0, 1])}}
    )
    tables = dict(node_annotations(c500, allocated=[0, 4]))
    tables["metax-tech.com/gpu.topology.scores"] = '{"1": NaN, "4": ' + "9" * 400 + "}"
    tables["metax-tech.com/gpu.topology.losses"] = '{"1": Infinity, "4": 1e400}'
    core.create_node({"metadata": {"name": poisoned, "annotations": tables}})
    nested = dict(node_annotations(c500, allocated=[]))
    nested[DEVICES_ANNOTATION] = "[" * 100_000 + "]" * 100_000
    core.create_node({"metadata": {"name": deep, "annotations": nested}})
    service = _extender_service(apiserver)
    try:
        cache = service.extender.cache
        assert cache is not None
        wait_for(lambda: cache.synced and cache.get(deep) is not None, 30, "node cache")
        conn = http.client.HTTPConnection("127.0.0.1", service.port, timeout=10)
        conn.request("GET", "/readyz")
        assert conn.getresponse().status == 200
        conn.close()
        pod = {
            "metadata": {"name": "train", "namespace": "default", "uid": "u2"},
            "spec": {"containers": [{"name": "m", "resources": {"limits": {GPU: "4"}}}]},
        }
        status, result = _post(service, "filter", {"Pod": pod, "NodeNames": names})
        assert status == 200 and result["NodeNames"] == [good, poisoned]
        assert "nested 100000 deep" in result["FailedAndUnresolvableNodes"][deep]
        status, ranking = _post(service, "prioritize", {"Pod": pod, "NodeNames": names})
        assert status == 200 and ranking[0] == {"Host": good, "Score": 10}
        conn = http.client.HTTPConnection("127.0.0.1", service.port, timeout=10)
        conn.request("GET", "/metrics")
        metrics = conn.getresponse().read().decode()
        conn.close()
        assert "gpu_aware_unusable_nodes 1.0" in metrics
    finally:
        service.close()


def _gpu_node(
    apiserver: Any, name: str, label: str, annotations: dict[str, str], cpu: str, memory: str
) -> None:
    core = apiserver.core()
    core.create_node(
        {
            "metadata": {
                "name": name,
                "labels": {"gpuk8s.test/pool": label},
                "annotations": annotations,
            }
        }
    )
    resources = {"cpu": cpu, "memory": memory, "pods": "110", GPU: "8"}
    core.patch_node_status(
        name,
        {
            "status": {
                "capacity": resources,
                "allocatable": resources,
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "test node",
                    }
                ],
            }
        },
        _content_type="application/merge-patch+json",
    )


def scheduler_config(
    port: int, managed: dict[str, bool], bind_verb: str | None = None
) -> dict[str, Any]:
    """A KubeSchedulerConfiguration with this extender (node cache, weight 500);
    ``managed``: resource -> ignoredByScheduler."""
    extender: dict[str, Any] = {
        "urlPrefix": f"http://127.0.0.1:{port}",
        "filterVerb": "filter",
        "prioritizeVerb": "prioritize",
        "weight": 500,
        "enableHTTPS": False,
        "nodeCacheCapable": True,
        "ignorable": False,
        "httpTimeout": "10s",
        "managedResources": [
            {"name": name, "ignoredByScheduler": ignored} for name, ignored in managed.items()
        ],
    }
    if bind_verb:
        extender["bindVerb"] = bind_verb
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "extenders": [extender],
    }


class Scheduler:
    """The lab's kube-scheduler build against the test apiserver, with ``config``
    (a KubeSchedulerConfiguration; clientConnection and leader election are set here)."""

    def __init__(self, apiserver: Any, tmp_path: Any, config: dict[str, Any]) -> None:
        import subprocess

        binary = apiserver.binary("kube-scheduler")
        if binary is None:
            pytest.skip("needs kube-scheduler (lab/tools.sh kube)")
        config = {
            **config,
            "clientConnection": {"kubeconfig": apiserver.kubeconfig("admin")},
            "leaderElection": {"leaderElect": False},
        }
        path = tmp_path / "scheduler.yaml"
        path.write_text(json.dumps(config))
        self.log_path = tmp_path / "scheduler.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [binary, f"--config={path}", "--secure-port=0", "-v=2"],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def place(self, core: Any, name: str, pool: str, gpus: int = 4) -> str:
        """Create a pod for the nodes of ``pool``; the node it gets bound to."""
        core.create_namespaced_pod(
            "default",
            {
                "metadata": {"name": name},
                "spec": {
                    "nodeSelector": {"gpuk8s.test/pool": pool},
                    # no controller-manager/kubelet here: the admission's not-ready
                    # taint stays on the test nodes
                    "tolerations": [
                        {
                            "key": "node.kubernetes.io/not-ready",
                            "operator": "Exists",
                            "effect": "NoSchedule",
                        }
                    ],
                    "containers": [
                        {
                            "name": "m",
                            "image": "registry.invalid/x:1",
                            "resources": {
                                "limits": {GPU: str(gpus), "cpu": "32", "memory": "128Gi"}
                            },
                        }
                    ],
                },
            },
        )
        bound: list[str] = []

        def is_bound() -> bool:
            assert self.process.poll() is None, self.log_path.read_text()[-3000:]
            node = core.read_namespaced_pod(name, "default").spec.node_name
            if node:
                bound.append(node)
            return bool(node)

        wait_for(is_bound, 90, f"{name} to be scheduled")
        return bound[0]

    def stop(self) -> None:
        import os
        import subprocess

        self.process.terminate()
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self._log.close()
        if os.environ.get("GPUK8S_KEEP_LOGS"):
            print(self.log_path.read_text()[-5000:])


def _extender_service(apiserver: Any) -> ExtenderService:
    service = build_service(_cached_service_args(apiserver))
    service.start()
    return service


def test_real_kube_scheduler_places_a_4_gpu_pod_inside_one_link_group(
    apiserver: Any, c500: NodeInventory, tmp_path: Any
) -> None:
    """kube-scheduler (the lab's build) + this extender (node cache, weight 500): a 4-GPU
    pod lands on the node that still has a whole MetaXLink group of 4; the next one is
    kept off that node because its GPUs are promised to the first (not yet allocated)."""
    tag = uuid.uuid4().hex[:6]
    whole, split = f"whole-{tag}", f"split-{tag}"
    # the scheduler's own scoring prefers "split" (4x the CPU and memory left: the
    # LeastAllocated and balance scores); only the extender's topology priority can
    # move the pod to "whole"
    _gpu_node(apiserver, split, tag, node_annotations(c500, allocated=[0, 4]), "256", "1Ti")
    _gpu_node(apiserver, whole, tag, node_annotations(c500, allocated=[0, 1]), "64", "256Gi")
    # the pods that hold the devices marked allocated above
    core = apiserver.core()
    for node_name in (whole, split):
        core.create_namespaced_pod("default", _gpu_pod(f"{node_name}-holder", node_name, 2))

    service = _extender_service(apiserver)
    scheduler = None
    try:
        scheduler = Scheduler(
            apiserver, tmp_path, scheduler_config(service.port, {GPU: False})
        )
        cache = service.extender.cache
        assert cache is not None
        wait_for(
            lambda: cache.get(whole) is not None and cache.get(split) is not None,
            30,
            "the extender's node cache",
        )
        assert scheduler.place(core, f"train-{tag}-1", tag) == whole
        # whole: 6 free devices, 4 promised to train-1 (bound, not allocated yet)
        assert scheduler.place(core, f"train-{tag}-2", tag) == split
    finally:
        if scheduler is not None:
            scheduler.stop()
        service.close()


def test_real_kube_scheduler_with_the_packing_profile_offers_every_feasible_node(
    apiserver: Any, c500: NodeInventory, tmp_path: Any
) -> None:
    """The configuration the Ansible module writes (``schedconf.new_config``, profile
    ``packing``) on the real kube-scheduler: with 150 feasible nodes the extender ranks
    all of them (kube-scheduler's default profile offers only 100 at this size: the
    node the extender would pick could be missing), and the 4-GPU pod gets the one node
    with a whole MetaXLink group of four."""
    from concurrent.futures import ThreadPoolExecutor

    from gpuk8s.core import schedconf

    tag = uuid.uuid4().hex[:6]
    names = [f"pack-{tag}-{i:03d}" for i in range(150)]
    whole = names[137]
    split = node_annotations(c500, allocated=[0, 4])
    with ThreadPoolExecutor(8) as pool:
        list(
            pool.map(
                lambda n: _gpu_node(
                    apiserver,
                    n,
                    tag,
                    node_annotations(c500, allocated=[0, 1]) if n == whole else split,
                    "64",
                    "256Gi",
                ),
                names,
            )
        )
    service = _extender_service(apiserver)
    offered: list[int] = []
    handle = service.extender.handle

    def recording(verb: str, body: bytes) -> Any:
        if verb == "prioritize":
            offered.append(len(json.loads(body)["NodeNames"]))
        return handle(verb, body)

    service.extender.handle = recording  # type: ignore[method-assign]
    scheduler = None
    try:
        spec = schedconf.ExtenderSpec(
            f"http://127.0.0.1:{service.port}",
            node_cache_capable=True,
            http_timeout="10s",
            managed_resources=(schedconf.ManagedResource(GPU),),
        )
        config = schedconf.new_config(spec, schedconf.api_version_for("v1.35.4"))
        assert config["percentageOfNodesToScore"] == 100
        scheduler = Scheduler(apiserver, tmp_path, config)
        cache = service.extender.cache
        assert cache is not None
        wait_for(lambda: all(cache.get(n) is not None for n in names), 60, "node cache")
        assert scheduler.place(apiserver.core(), f"pack-{tag}", tag) == whole
        assert offered and offered[-1] == len(names)
    finally:
        if scheduler is not None:
            scheduler.stop()
        service.close()


def test_real_kube_scheduler_calls_and_binds_over_tls_with_its_client_certificate(
    apiserver: Any, c500: NodeInventory, tmp_path: Any
) -> None:
    """Issue 26: kube-scheduler's own TLS client (Go, enableHTTPS + tlsConfig with a
    client certificate, the CA of the extender's certificate and serverName) calls
    filter, prioritize and bind; gpu-aware admits it, binds the pod to the node its
    filter kept, and refuses a client without a certificate."""
    import ssl
    import urllib.request

    from tests.unit.tls_certs import SERVER_NAME, server_set

    certs = server_set(tmp_path / "certs")
    tag = uuid.uuid4().hex[:6]
    whole, split = f"whole-{tag}", f"split-{tag}"
    _gpu_node(apiserver, split, tag, node_annotations(c500, allocated=[0, 4]), "256", "1Ti")
    _gpu_node(apiserver, whole, tag, node_annotations(c500, allocated=[0, 1]), "64", "256Gi")
    core = apiserver.core()
    for node_name in (whole, split):
        core.create_namespaced_pod("default", _gpu_pod(f"{node_name}-holder", node_name, 2))
    args = build_parser().parse_args([
        "--port", "0", "--address", "127.0.0.1", "--node-cache", "--kubeconfig",
        apiserver.kubeconfig("admin"), "--log-level", "warning", "--health-port", "0",
        "--tls-cert-file", str(certs["server"]), "--tls-key-file", str(certs["server_key"]),
        "--tls-client-ca-file", str(certs["ca"])])
    service = build_service(args)
    service.start()
    scheduler = None
    try:
        config = scheduler_config(service.port, {GPU: False}, bind_verb="bind")
        config["extenders"][0].update({
            "urlPrefix": f"https://127.0.0.1:{service.port}",
            "enableHTTPS": True,
            "tlsConfig": {"insecure": False, "serverName": SERVER_NAME,
                          "caFile": str(certs["ca"]), "certFile": str(certs["client"]),
                          "keyFile": str(certs["client_key"])}})
        scheduler = Scheduler(apiserver, tmp_path, config)
        cache = service.extender.cache
        assert cache is not None
        wait_for(lambda: cache.get(whole) is not None and cache.get(split) is not None, 30,
                 "the extender's node cache")
        assert scheduler.place(core, f"train-{tag}", tag) == whole
        text = service.extender.metrics.registry
        from prometheus_client import generate_latest

        metrics = generate_latest(text).decode()
        assert 'gpu_aware_requests_total{code="200",verb="bind"} 1.0' in metrics, metrics
        # anyone else: refused in the handshake
        context = ssl.create_default_context(cafile=str(certs["ca"]))
        context.check_hostname = False
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            urllib.request.urlopen(f"https://127.0.0.1:{service.port}/healthz",
                                   context=context, timeout=10).read()
    finally:
        if scheduler is not None:
            scheduler.stop()
        service.close()
