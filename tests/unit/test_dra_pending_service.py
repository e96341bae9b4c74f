"""services.dra.pending without an API server: which claims a pod waits on, one Event per
pod, claim and reason (refreshed, never repeated), only the leader writes, the flags'
errors, liveness."""

from __future__ import annotations

from typing import Any

import pytest

from gpuk8s.core.dra import DRIVER
from gpuk8s.core.drapending import REASON_GROUPS_OFF
from gpuk8s.core.errors import ConfigError
from gpuk8s.services.dra.pending import (
    PendingOptions,
    PendingReasons,
    event_name,
    pod_claim_names,
)

T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z
CREATED = "2027-01-15T08:00:00Z"


class FakeApi:
    def __init__(self) -> None:
        self.pods: list[dict[str, Any]] = []
        self.claim_list: list[dict[str, Any]] = []
        self.events: dict[tuple[str, str], dict[str, Any]] = {}
        self.writes = 0

    def pending_pods(self) -> list[dict[str, Any]]:
        return self.pods

    def claims(self) -> list[dict[str, Any]]:
        return self.claim_list

    def slices(self) -> list[dict[str, Any]]:
        return []  # no node publishes anything: a group class is unmet

    def get_event(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.events.get((namespace, name))

    def create_event(self, namespace: str, body: dict[str, Any]) -> None:
        self.writes += 1
        self.events[(namespace, body["metadata"]["name"])] = body

    def patch_event(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        self.writes += 1
        self.events[(namespace, name)].update(patch)


def pod(name: str, claim: str, allocated: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    p = {"metadata": {"name": name, "namespace": "ns", "uid": f"u-{name}",
                      "creationTimestamp": CREATED},
         "spec": {"resourceClaims": [{"name": "gpus", "resourceClaimName": claim}]}}
    c: dict[str, Any] = {"metadata": {"name": claim, "namespace": "ns", "uid": f"c-{claim}"},
                         "spec": {"devices": {"requests": [{"name": "g", "exactly": {
                             "deviceClassName": f"group-4.{DRIVER}", "count": 1}}]}}}
    if allocated:
        c["status"] = {"allocation": {"devices": {"results": []}}}
    return p, c


def judge(api: FakeApi, clock: list[float], leading: list[bool] | None = None,
          after: float = 30) -> PendingReasons:
    flag = leading if leading is not None else [True]
    return PendingReasons(api, "me", PendingOptions(after=after, refresh=300, interval=15),
                          leading=lambda: flag[0], wall=lambda: clock[0])


def test_the_claims_a_pod_waits_on() -> None:
    p = {"spec": {"resourceClaims": [{"name": "a", "resourceClaimName": "direct"},
                                     {"name": "b", "resourceClaimTemplateName": "t"}]},
         "status": {"resourceClaimStatuses": [{"name": "b", "resourceClaimName": "made-b"}],
                    "extendedResourceClaimStatus": {"resourceClaimName": "ext"}}}
    assert pod_claim_names(p) == ["direct", "made-b", "ext"]
    assert pod_claim_names({}) == []


def test_one_event_per_claim_and_reason_refreshed_not_repeated() -> None:
    api, clock = FakeApi(), [T0 + 10]
    for p, c in (pod("waits", "group"), pod("done", "done", allocated=True)):
        api.pods.append(p)
        api.claim_list.append(c)
    j = judge(api, clock)
    assert j.tick() == []  # waited 10 s of the 30
    clock[0] = T0 + 31
    [(ns, name, why)] = j.tick()
    assert (ns, name, why.reason) == ("ns", "waits", REASON_GROUPS_OFF)
    key = ("ns", event_name("waits", "c-group", REASON_GROUPS_OFF))
    event = api.events[key]
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "ns",
                                       "name": "waits", "uid": "u-waits"}
    assert event["type"] == "Warning" and event["count"] == 1
    assert event["message"].startswith("ResourceClaim group: request 'g' asks for class")
    for later in (T0 + 60, T0 + 300):
        clock[0] = later
        assert j.tick() == [] and api.writes == 1
    # another replica taking over within the refresh period finds the Event and waits
    assert judge(api, clock).tick() == [] and api.writes == 1
    clock[0] = T0 + 332
    assert len(j.tick()) == 1
    assert api.events[key]["count"] == 2 and api.events[key]["lastTimestamp"] == \
        "2027-01-15T08:05:32Z"
    assert len(api.events) == 1


def test_only_the_leader_writes() -> None:
    api, clock, leading = FakeApi(), [T0 + 60], [False]
    p, c = pod("waits", "group")
    api.pods.append(p)
    api.claim_list.append(c)
    j = judge(api, clock, leading)
    assert j.tick() == [] and api.writes == 0
    leading[0] = True
    assert len(j.tick()) == 1


def test_liveness_follows_the_rounds() -> None:
    api, clock = FakeApi(), [T0]
    j = judge(api, clock)
    assert j.liveness()[0]
    clock[0] = T0 + 61
    assert not j.liveness()[0]  # no round since the start
    j.tick()
    assert j.liveness()[0]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"after": -1}, "after: -1 must be >= 0 seconds"),
    ({"refresh": -5}, "refresh: -5 must be >= 0 seconds"),
    ({"interval": 0}, "interval: 0 must be > 0 seconds"),
])
def test_bad_options_name_the_field(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        PendingOptions(**kwargs)
