"""gpu-dra's pending-claim reasons (``services.dra.pending``) on a private kube-apiserver
with the lab's DRA gates: slices of two simulated nodes published, pods waiting on claims
(no scheduler here, so nothing is allocated), and the Events the elected replica writes."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from gpuk8s import sim
from gpuk8s.core.dra import DRIVER, PoolOptions, build_slices
from gpuk8s.core.drapending import REASON_GROUPS_OFF, REASON_NO_LINK_GROUP
from gpuk8s.discovery import discover
from gpuk8s.services.dra.pending import KubePendingApi, PendingOptions, PendingReasons
from gpuk8s.services.dra.publisher import KubeSlices
from gpuk8s.services.kube import api_client
from gpuk8s.services.leader import Elector, KubeLeaseApi

pytestmark = pytest.mark.integration

GROUP, VERSION = "resource.k8s.io", "v1"


def _claim(custom: Any, ns: str, name: str, cls: str, count: int, linked: bool) -> None:
    devices: dict[str, Any] = {"requests": [{"name": "gpus", "exactly": {
        "deviceClassName": cls, "count": count}}]}
    if linked:
        devices["constraints"] = [{"matchAttribute": f"{DRIVER}/linkGroup"}]
    custom.create_namespaced_custom_object(GROUP, VERSION, ns, "resourceclaims", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "ResourceClaim",
        "metadata": {"name": name}, "spec": {"devices": devices}})


def _pod(core: Any, ns: str, name: str, claim: str) -> None:
    core.create_namespaced_pod(ns, {"metadata": {"name": name}, "spec": {
        "resourceClaims": [{"name": "gpus", "resourceClaimName": claim}],
        "containers": [{"name": "c", "image": "x", "resources": {"claims": [{"name": "gpus"}]}}]}})


def _events(core: Any, ns: str) -> dict[tuple[str, str], Any]:
    return {(e.involved_object.name, e.reason): e
            for e in core.list_namespaced_event(ns).items}


def test_a_link_group_of_nine_gets_an_event_a_group_of_four_none(
        apiserver: Any, tmp_path: Any) -> None:
    from kubernetes import client

    admin = api_client(apiserver.kubeconfig("admin"))
    core: Any = client.CoreV1Api(admin)
    custom: Any = client.CustomObjectsApi(admin)
    ns = f"pending-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": ns}})
    core.create_namespaced_service_account(ns, {"metadata": {"name": "default"}})
    root = str(tmp_path / "sim")
    sim.create(root, "c500-8")
    slices = KubeSlices(admin)
    nodes = [f"{ns}-node-{i}" for i in range(2)]
    published = [body for node in nodes
                 for body in build_slices(node, discover(root), PoolOptions(groups=False))]
    largest = max(Counter((b["spec"]["nodeName"], d["attributes"]["linkGroup"]["int"])
                          for b in published for d in b["spec"].get("devices") or []).values())
    assert largest < 9
    try:
        for body in published:
            slices.create(body)
        _claim(custom, ns, "nine", DRIVER, 9, linked=True)
        _claim(custom, ns, "fits", DRIVER, largest, linked=True)
        _claim(custom, ns, "group", f"group-4.{DRIVER}", 1, linked=False)
        for pod, claim in (("wants-nine", "nine"), ("wants-fits", "fits"),
                           ("wants-group", "group")):
            _pod(core, ns, pod, claim)

        electors = {who: Elector(KubeLeaseApi(admin, ns, "gpu-dra-pending"), who, ns,
                                 "gpu-dra-pending", duration=30, renew_deadline=20, retry=1)
                    for who in ("replica-a", "replica-b")}
        assert electors["replica-a"].try_once()
        assert not electors["replica-b"].try_once()
        clock = [0.0]

        def judge(who: str, refresh: float = 300.0) -> PendingReasons:
            import time

            return PendingReasons(KubePendingApi(admin), who,
                                  PendingOptions(after=0, refresh=refresh),
                                  leading=electors[who].leading,
                                  wall=lambda: time.time() + clock[0])

        leader, follower = judge("replica-a"), judge("replica-b")
        assert follower.tick() == []
        written = leader.tick()
        assert sorted((pod, why.reason) for _, pod, why in written) == [
            ("wants-group", REASON_GROUPS_OFF), ("wants-nine", REASON_NO_LINK_GROUP)]
        events = {k: v for k, v in _events(core, ns).items() if k[1].startswith("GpuDra")}
        assert set(events) == {("wants-nine", REASON_NO_LINK_GROUP),
                               ("wants-group", REASON_GROUPS_OFF)}
        nine = events[("wants-nine", REASON_NO_LINK_GROUP)]
        assert nine.type == "Warning" and nine.count == 1
        assert nine.message.startswith("ResourceClaim nine: request 'gpus' asks for 9 GPUs")
        assert f"the most any node has is {largest}" in nine.message
        assert nine.involved_object.kind == "Pod"

        # refreshed, not repeated: the next round writes nothing, a new leader within the
        # refresh period neither; after it the same Event counts 2
        assert leader.tick() == []
        assert judge("replica-a").tick() == []
        clock[0] = 301.0
        assert len(leader.tick()) == 2
        again = _events(core, ns)
        assert again[("wants-nine", REASON_NO_LINK_GROUP)].count == 2
        assert len([k for k in again if k[1].startswith("GpuDra")]) == 2
    finally:
        for body in slices.list(nodes[0]) + slices.list(nodes[1]):
            slices.delete(body["metadata"]["name"])
        core.delete_namespace(ns)


def test_the_chart_rbac_is_enough_and_no_more(
        apiserver: Any, helm: Any, charts: dict[str, str], tmp_path: Any) -> None:
    """gpu-dra-pending's ServiceAccount as the chart makes it: with its token the elected
    judge takes the Lease, reads pods, claims and slices cluster-wide and writes its Event;
    it may not read Secrets nor delete Events. The chart's claims policy is installed too:
    what it refuses at creation never waits."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    admin = api_client(apiserver.kubeconfig("admin"))
    core: Any = client.CoreV1Api(admin)
    custom: Any = client.CustomObjectsApi(admin)
    rel_ns, ns = "dra-pending-rbac", f"users-{uuid.uuid4().hex[:6]}"
    helm("install", "drp", charts["metax-gpu-extensions"], "-n", rel_ns, "--create-namespace",
         "--set", "gpuDra.enabled=true")
    core.create_namespace({"metadata": {"name": ns}})
    core.create_namespaced_service_account(ns, {"metadata": {"name": "default"}})
    root = str(tmp_path / "sim")
    sim.create(root, "c500-8")
    slices = KubeSlices(admin)
    node = f"{ns}-node"
    try:
        for body in build_slices(node, discover(root), PoolOptions(groups=False)):
            slices.create(body)
        # five linked GPUs: the claims policy lets it through (a link group may have 8),
        # but this cluster's largest link group has 4
        _claim(custom, ns, "five", DRIVER, 5, linked=True)
        _pod(core, ns, "wants-five", "five")
        token = core.create_namespaced_service_account_token("gpu-dra-pending", rel_ns, {
            "spec": {"audiences": ["https://kubernetes.default.svc"],
                     "expirationSeconds": 600}})
        as_sa = api_client(apiserver.token_kubeconfig("dra-pending", token.status.token))
        elector = Elector(KubeLeaseApi(as_sa, rel_ns, "gpu-dra-pending"), "replica-a",
                          rel_ns, "gpu-dra-pending", duration=30, renew_deadline=20, retry=1)
        assert elector.try_once()
        judge = PendingReasons(KubePendingApi(as_sa), "replica-a", PendingOptions(after=0),
                               leading=elector.leading)
        [(where, pod, why)] = judge.tick()
        assert (where, pod, why.reason) == (ns, "wants-five", REASON_NO_LINK_GROUP)
        [event] = [e for e in core.list_namespaced_event(ns).items
                   if e.reason == REASON_NO_LINK_GROUP]
        sa_core: Any = client.CoreV1Api(as_sa)
        attempts: list[Callable[[], Any]] = [
            lambda: sa_core.list_namespaced_secret(rel_ns),
            lambda: sa_core.delete_namespaced_event(event.metadata.name, ns)]
        for forbidden in attempts:
            with pytest.raises(ApiException) as denied:
                forbidden()
            assert denied.value.status == 403
    finally:
        for body in slices.list(node):
            slices.delete(body["metadata"]["name"])
        core.delete_namespace(ns)
        # --no-hooks: the pre-delete node-cleanup hook is a Job, and this tier runs no pods
        helm("uninstall", "drp", "-n", rel_ns, "--no-hooks", check=False)
