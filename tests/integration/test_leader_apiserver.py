"""gpu-aware's leader election (leader.py) against a real kube-apiserver: the Lease as the
API server stores it (MicroTime stamps, resourceVersion checks), the pod label that the
chart's Service selects, and a takeover only after the lease expired."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest

from gpuk8s.services.extender.leader import (
    LEADER_LABEL,
    Conflict,
    Elector,
    KubeLeaseApi,
    KubePodLabeler,
)
from gpuk8s.services.kube import api_client

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning"),
]

NS = "default"


def pod(core: Any, name: str) -> None:
    core.create_namespaced_pod(NS, {
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    })  # fmt: skip


def labels(core: Any, name: str) -> dict[str, str]:
    return dict(core.read_namespaced_pod(name, NS).metadata.labels or {})


def test_election_on_a_real_lease(apiserver: Any) -> None:
    client = api_client(apiserver.kubeconfig("admin"))
    core = apiserver.core()
    lease = f"gpu-aware-{uuid.uuid4().hex[:6]}"
    for name in ("replica-a", "replica-b"):
        pod(core, f"{lease}-{name}")
    electors = {
        name: Elector(
            KubeLeaseApi(client, NS, lease),
            name,
            NS,
            lease,
            duration=3,
            renew_deadline=2,
            retry=0.5,
            on_change=KubePodLabeler(client, NS, f"{lease}-{name}").label,
        )
        for name in ("replica-a", "replica-b")
    }
    a, b = electors["replica-a"], electors["replica-b"]
    assert a.try_once() and not b.try_once()
    stored = KubeLeaseApi(client, NS, lease).get()
    assert stored is not None and stored["spec"]["holderIdentity"] == "replica-a"
    assert stored["spec"]["renewTime"].endswith("Z")  # a MicroTime the API accepted
    assert labels(core, f"{lease}-replica-a").get(LEADER_LABEL) == "true"
    assert LEADER_LABEL not in labels(core, f"{lease}-replica-b")
    assert a.try_once()  # a renewal moves the version on: what was read is stale now
    with pytest.raises(Conflict):
        KubeLeaseApi(client, NS, lease).replace(stored)
    # a stops renewing: b waits the lease duration from when it saw the last record
    t0 = time.monotonic()
    assert not b.try_once()
    while not b.try_once():
        assert not (a.leading() and b.leading())
        assert time.monotonic() - t0 < 10, "no takeover"
        time.sleep(0.1)
    assert time.monotonic() - t0 >= 3
    assert KubeLeaseApi(client, NS, lease).get()["spec"]["leaseTransitions"] == 1  # type: ignore[index]
    assert labels(core, f"{lease}-replica-b").get(LEADER_LABEL) == "true"
    # a sees it lost (its next try), drops its label; b stops and gives the Lease up
    assert not a.try_once()
    assert LEADER_LABEL not in labels(core, f"{lease}-replica-a")
    stop = threading.Event()
    stop.set()
    b.run(stop)  # the loop's end releases
    assert LEADER_LABEL not in labels(core, f"{lease}-replica-b")
    assert a.try_once()  # at once: the released Lease names nobody
