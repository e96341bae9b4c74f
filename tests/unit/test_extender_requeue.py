"""gpu-aware nudges the pods it turned away once a share is freed (requeue.py).

Found on the lab (tests/e2e/test_sharing.py test 5): kube-scheduler retried a waiting
shared pod on the deletion of a sharer before gpu-aware's pod watch had released its
share; rejected again, the pod waited for the scheduler's 5-minute flush."""

from __future__ import annotations

import json
import threading
from typing import Any

import msgspec
import pytest

from gpuk8s import sim
from gpuk8s.core.sharing import (
    MODE_SGPU,
    REQUEUE_ANNOTATION,
    SHARING_MODE_LABEL,
    Assignment,
    ShareRequest,
)
from gpuk8s.discovery import discover
from gpuk8s.services.deviceplugin.nodestate import published_annotations
from gpuk8s.services.extender.logic import Extender
from gpuk8s.services.extender.requeue import Requeue
from gpuk8s.services.extender.share import Ledger, SharedNodes, Sharing
from gpuk8s.services.extender.weights import Weights, WeightSource
from gpuk8s.services.extender.wire import NodeView, node_item
from gpuk8s.services.node.devices import DeviceSet


class Touches:
    """Records ``touch`` calls; pods named in ``gone`` answer 404, ``broken`` 500."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, str]]] = []
        self.gone: set[str] = set()
        self.broken: set[str] = set()

    def touch(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        if name in self.gone or name in self.broken:
            err = RuntimeError(f"pod {name}")
            err.status = 404 if name in self.gone else 500  # type: ignore[attr-defined]
            raise err
        self.calls.append((namespace, name, annotations))


def test_turned_away_pods_are_nudged_once_after_a_release() -> None:
    api = Touches()
    rq = Requeue(api, clock=lambda: 0.0)
    rq.turned_away("u1", "ns", "p1", rq.generation)
    rq.turned_away("u2", "ns", "p2", rq.generation)
    assert rq.nudge() == 2  # an explicit nudge takes everything waiting
    assert api.calls == [
        ("ns", "p1", {REQUEUE_ANNOTATION: "1970-01-01T00:00:00Z"}),
        ("ns", "p2", {REQUEUE_ANNOTATION: "1970-01-01T00:00:00Z"}),
    ]
    assert rq.waiting() == [] and rq.nudge() == 0  # once: a pod turned away again is re-noted


def test_release_wakes_the_loop_and_bound_pods_are_forgotten() -> None:
    api = Touches()
    rq = Requeue(api)
    stopping = threading.Event()
    rq.turned_away("u1", "ns", "p1", rq.generation)
    rq.turned_away("u2", "ns", "p2", rq.generation)
    rq.forget("u2")  # bound meanwhile
    loop = threading.Thread(target=rq.run, args=(stopping,), daemon=True)
    loop.start()
    try:
        rq.freed()
        for _ in range(200):
            if api.calls:
                break
            threading.Event().wait(0.01)
    finally:
        stopping.set()
        loop.join(5)
    assert [c[1] for c in api.calls] == ["p1"]
    assert not loop.is_alive()


def test_no_release_no_nudge_and_a_stale_read_nudges_at_once() -> None:
    rq = Requeue(Touches())
    since = rq.generation
    rq.turned_away("u1", "ns", "p1", since)
    assert not rq._freed.is_set()  # nothing freed: nothing to retry
    rq.freed()  # a release while a second filter call was deciding
    rq.turned_away("u2", "ns", "p2", since)
    assert rq._freed.is_set()


def test_bounded_and_api_errors_counted() -> None:
    api = Touches()
    api.gone.add("p0")
    api.broken.add("p1")
    rq = Requeue(api, max_waiting=3)
    for i in range(5):
        rq.turned_away(f"u{i}", "ns", f"p{i}", rq.generation)
    assert rq.waiting() == ["u2", "u3", "u4"]  # oldest forgotten first
    rq.turned_away("u0", "ns", "p0", rq.generation)
    rq.turned_away("u1", "ns", "p1", rq.generation)
    assert rq.nudge() == 1
    assert rq.failures == 1  # 500 counted, 404 (pod gone) is not a failure
    assert rq.nudged == 1


@pytest.fixture(scope="module")
def annotations(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = str(tmp_path_factory.mktemp("sim") / "one")
    sim.create(root, "n260-2")
    return published_annotations(DeviceSet(discover(root), "metax-tech.com/gpu"), set())


def _pod(name: str, vcore: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "work", "uid": f"uid-{name}"},
        "spec": {"containers": [{"name": "c", "resources": {
            "limits": {"metax-tech.com/sgpu": "1", "metax-tech.com/vcore": vcore}}}]},
    }


def test_filter_rejection_then_ledger_release_nudges_the_pod(
    annotations: dict[str, str]
) -> None:
    """The extender path: a full node turns the pod away; the pod watch then sees a sharer
    deleted; the waiting pod gets the requeue annotation (old code: nothing touched it)."""
    api = Touches()
    rq = Requeue(api)
    shared, ledger = SharedNodes(), Ledger(on_free=rq.freed)
    ledger.replace([])
    obj = {"metadata": {"name": "a", "annotations": annotations,
                        "labels": {SHARING_MODE_LABEL: "sgpu",
                                   "metax-tech.com/gpu.memory": "64GB"}}}
    shared.replace([node_item(msgspec.json.decode(json.dumps(obj), type=NodeView))])
    sharing = Sharing(shared, ledger, None, requeue=rq)
    ext = Extender(WeightSource(None, Weights(1, 1)), sharing=sharing)
    whole = ShareRequest(MODE_SGPU, 1, 100, 0)
    for gpu in (0, 1):  # both GPUs of the node fully held
        ledger.set(f"holder-{gpu}", Assignment("a", (gpu,), whole))
    body = json.dumps({"Pod": _pod("waiting", "50"), "Nodes": {"items": [obj]}}).encode()
    answer = json.loads(ext.handle("filter", body).body)
    assert not (answer.get("Nodes") or {}).get("items") and "a" in answer["FailedNodes"], answer
    assert rq.waiting() == ["uid-waiting"]
    assert not rq._freed.is_set()  # nothing released yet: no reason to nudge
    ledger.set("holder-0", None, deleted=True)  # the pod watch saw a sharer go
    assert rq._freed.is_set()
    assert rq.nudge() == 1
    assert api.calls[0][:2] == ("work", "waiting")

