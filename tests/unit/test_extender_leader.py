"""gpu-aware replicas: leader election on a Lease (leader.py), the booking gate in
``Sharing.bind`` and the read-only ``GET /debug/ledger``.

The Lease store below keeps the API's rules that matter: a create of an existing Lease
and a write carrying a stale ``resourceVersion`` are 409 Conflicts. Clocks are explicit,
so the tests walk through time instead of sleeping."""

from __future__ import annotations

import copy
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from gpuk8s.core.sharing import Assignment
from gpuk8s.services.extender.leader import DEFAULT_LEASE, Conflict, Elector, gate
from gpuk8s.services.extender.server import ExtenderHTTPServer, serve_in_thread
from gpuk8s.services.extender.share import Ledger

from . import test_extender_share
from .test_extender_share import HALF, bind, pod, setup

annotations = test_extender_share.annotations  # the fixture: a simulated n260-2's annotations


class Leases:
    """One namespace's Leases with optimistic concurrency (resourceVersion)."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0
        self.writes = 0
        self.down = False  # the API unreachable

    def get(self) -> dict[str, Any] | None:
        if self.down:
            raise OSError("connection refused")
        return copy.deepcopy(self.lease)

    def create(self, lease: dict[str, Any]) -> None:
        if self.down:
            raise OSError("connection refused")
        if self.lease is not None:
            raise Conflict("exists")
        self._store(lease)

    def replace(self, lease: dict[str, Any]) -> None:
        if self.down:
            raise OSError("connection refused")
        if self.lease is None or lease["metadata"].get("resourceVersion") != str(self.version):
            raise Conflict("stale resourceVersion")
        self._store(lease)

    def _store(self, lease: dict[str, Any]) -> None:
        self.version += 1
        self.writes += 1
        self.lease = copy.deepcopy(lease)
        self.lease["metadata"]["resourceVersion"] = str(self.version)

    @property
    def holder(self) -> str:
        return str((self.lease or {}).get("spec", {}).get("holderIdentity", ""))


class Once(threading.Event):
    """A stop event that stops the loop after its first round."""

    def wait(self, timeout: float | None = None) -> bool:
        self.set()
        return True


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def elector(leases: Leases, clock: Clock, identity: str, **kw: Any) -> Elector:
    changes: list[bool] = kw.pop("changes", [])
    return Elector(leases, identity, "ns", DEFAULT_LEASE, clock=clock, wall=lambda: 1.7e9 + clock.t,
                   on_change=changes.append, **kw)  # fmt: skip


def test_one_leader_and_a_takeover_only_after_the_lease_expired() -> None:
    leases, clock = Leases(), Clock()
    changes: list[bool] = []
    a, b = elector(leases, clock, "a", changes=changes), elector(leases, clock, "b")
    assert a.try_once() and not b.try_once()
    assert leases.holder == "a" and changes == [True]
    # a renews every retry period: b never takes over
    for _ in range(20):
        clock.t += 2
        assert a.try_once() and not b.try_once()
    # a dies (no more renewals). Its leadership lapses at its renew deadline; b waits
    # for the lease duration measured from when it first saw the last record
    died = clock.t
    seen_by_b = clock.t
    assert not b.try_once()
    while clock.t < died + 30:
        clock.t += 0.5
        assert not (a.leading() and b.leading()), f"two leaders at {clock.t - died}"
        won = b.try_once()
        assert won == (clock.t >= seen_by_b + 15), clock.t - died
    assert leases.holder == "b" and a.leading() is False
    assert leases.lease is not None and leases.lease["spec"]["leaseTransitions"] == 1
    # a comes back (a new process of another pod): it follows
    assert not a.try_once() and b.try_once()


def test_leadership_lapses_at_the_renew_deadline_when_the_api_is_away() -> None:
    leases, clock = Leases(), Clock()
    changes: list[bool] = []
    a = elector(leases, clock, "a", changes=changes)
    assert a.try_once()
    leases.down = True
    clock.t += 9.9
    assert a.leading() and not a.leading(margin=3)  # a bind would not start now
    clock.t += 0.2
    assert not a.leading()
    with pytest.raises(OSError):
        a.try_once()
    a.run(Once())  # the loop's error path reports the lapse
    assert changes == [True, False]


def test_two_candidates_racing_for_an_expired_lease_one_wins() -> None:
    leases, clock = Leases(), Clock()
    old, a, b = (elector(leases, clock, n) for n in ("old", "a", "b"))
    assert old.try_once()
    assert not a.try_once() and not b.try_once()
    clock.t += 16
    # both read the expired record, then both write: the second write is stale
    real_get = leases.get
    snapshot = real_get()
    leases.get = lambda: copy.deepcopy(snapshot)  # type: ignore[method-assign]
    won = [a.try_once(), b.try_once()]
    leases.get = real_get  # type: ignore[method-assign]
    assert won == [True, False] and leases.holder == "a"


def test_a_released_lease_is_taken_at_the_next_try() -> None:
    leases, clock = Leases(), Clock()
    a, b = elector(leases, clock, "a"), elector(leases, clock, "b")
    assert a.try_once() and not b.try_once()
    a.release()
    assert not a.leading() and leases.holder == ""
    clock.t += 2
    assert b.try_once()


def test_a_restarted_leader_renews_its_own_lease_at_once() -> None:
    """The identity is the pod's name: the kubelet's restart of the container after a
    SIGKILL does not wait for the lease to expire (the old process is gone)."""
    leases, clock = Leases(), Clock()
    assert elector(leases, clock, "gpu-aware-abc").try_once()
    clock.t += 1
    assert elector(leases, clock, "gpu-aware-abc").try_once()


def test_timings_must_leave_the_safety_margin() -> None:
    with pytest.raises(ValueError, match="renew deadline"):
        Elector(Leases(), "a", "ns", DEFAULT_LEASE, duration=10, renew_deadline=10, retry=2)


def test_only_the_leader_books_shared_gpus(annotations: dict[str, str]) -> None:
    leases, clock = Leases(), Clock()
    ext, api, ledger = setup(annotations)
    a = elector(leases, clock, "a")
    assert ext.sharing is not None
    ext.sharing.gate = gate(a)
    error = bind(ext, api, pod("p1"), "a")
    assert "does not hold the Lease ns/gpu-aware" in error
    assert not api.pods["p1"]["metadata"].get("annotations") and len(ledger) == 0
    assert a.try_once()
    assert bind(ext, api, pod("p1"), "a") == ""
    clock.t += 8  # within 3 s of the renew deadline: no new booking starts
    assert "does not hold the Lease" in bind(ext, api, pod("p2"), "a")
    assert len(ledger) == 1


@pytest.fixture()
def served(annotations: dict[str, str]) -> Iterator[tuple[str, Ledger]]:
    ext, _, ledger = setup(annotations)
    srv = ExtenderHTTPServer(("127.0.0.1", 0), ext)
    serve_in_thread(srv)
    try:
        yield f"http://127.0.0.1:{srv.port}", ledger
    finally:
        srv.shutdown()
        srv.server_close()


def test_debug_ledger_shows_bookings_and_reservations(served: tuple[str, Ledger]) -> None:
    url, ledger = served
    ledger.set("u1", Assignment("a", (0,), HALF))
    ledger.reserve("u2", Assignment("b", (1,), HALF))
    with urllib.request.urlopen(url + "/debug/ledger", timeout=5) as resp:
        doc = json.loads(resp.read())
    assert doc["sharing"] and doc["synced"]
    assert doc["assignments"] == {
        "u1": json.loads(Assignment("a", (0,), HALF).to_json()),
        "u2": json.loads(Assignment("b", (1,), HALF).to_json()),
    }
    assert doc["reserved"] == ["u2"]
    request = urllib.request.Request(url + "/debug/ledger", data=b"{}", method="POST")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request, timeout=5)
    assert err.value.code == 405  # read-only
