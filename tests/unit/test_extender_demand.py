"""``demand.PodDemands``: a pod's demand kept per version, served only for the content it
was computed from."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpuk8s.services.extender import demand
from gpuk8s.services.extender.views import PodView


def _pod(gpus: str = "1", cpu: str = "500m") -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "uid": "uid-p", "resourceVersion": "7"},
        "spec": {"containers": [{"name": "c", "resources": {
            "limits": {"metax-tech.com/gpu": gpus}, "requests": {"cpu": cpu}}}]},
    }


@pytest.fixture
def parsed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The GPU count of every pod ``pod_demand`` parses."""
    seen: list[int] = []
    real = demand.pod_demand

    def counted(view: PodView, *rest: Any) -> demand.Demand:
        got = real(view, *rest)
        seen.append(got.gpus)
        return got

    monkeypatch.setattr(demand, "pod_demand", counted)
    return seen


def _changes() -> list[tuple[str, dict[str, Any]]]:
    """The real pod changed in each part ``pod_demand`` reads, version and UID kept."""
    out = []
    gpus = _pod(gpus="8")
    out.append(("a container's GPUs", gpus))
    cpu = _pod(cpu="4")
    out.append(("a container's CPU", cpu))
    init = _pod()
    init["spec"]["initContainers"] = [{"name": "i", "resources": {"requests": {"cpu": "9"}}}]
    out.append(("an init container", init))
    overhead = _pod()
    overhead["spec"]["overhead"] = {"memory": "1Gi"}
    out.append(("the overhead", overhead))
    runtime = _pod()
    runtime["metadata"]["annotations"] = {"gpuk8s.io/cuda-runtime": '{"major":12,"minor":4}'}
    out.append(("the CUDA runtime annotation", runtime))
    shared = _pod()
    del shared["spec"]["containers"][0]["resources"]["limits"]["metax-tech.com/gpu"]
    shared["spec"]["containers"][0]["resources"]["limits"]["metax-tech.com/sgpu"] = "2"
    out.append(("a share", shared))
    return out


@pytest.mark.parametrize("what,fake", _changes(), ids=[w for w, _ in _changes()])
def test_a_fake_content_under_a_real_version_is_never_served(
    parsed: list[int], what: str, fake: dict[str, Any]
) -> None:
    """A caller sends other requests under the real pod's UID and resourceVersion first:
    the real pod still gets its own demand (parsed again), and so does the fake."""
    demands = demand.PodDemands()
    real = demand.decode_pod(_pod())
    want = demand.pod_demand(real)
    parsed.clear()
    poison = demand.decode_pod(fake)
    fake_demand = demands(poison)
    assert fake_demand != want, what  # the change is one pod_demand sees
    assert demands(real) == want, what
    assert demands(real) == want  # kept again: the second request is not parsed
    assert demands(poison) == fake_demand
    assert len(parsed) == 3, (what, parsed)  # fake, real, fake: never the other's


def test_the_same_content_is_parsed_once_per_version(parsed: list[int]) -> None:
    """Filter then prioritize of one version (two decodes of the same body): one parse;
    a new version, or a pod without resourceVersion, parses again; ``bound`` 0 keeps
    nothing."""
    demands = demand.PodDemands()
    body = _pod()
    first, second = demand.decode_pod(body), demand.decode_pod(copy.deepcopy(body))
    assert demands(first) == demands(second) == demand.Demand(1, 500, 0, None, None)
    assert parsed == [1]
    body["metadata"]["resourceVersion"] = "8"
    demands(demand.decode_pod(body))
    assert parsed == [1, 1]
    del body["metadata"]["resourceVersion"]
    demands(demand.decode_pod(body))
    demands(demand.decode_pod(body))
    assert parsed == [1, 1, 1, 1]
    none = demand.PodDemands(bound=0)
    none(first)
    none(first)
    assert len(parsed) == 6


def test_the_kept_demands_start_over_at_the_bound(parsed: list[int]) -> None:
    """``bound`` pods kept, then it starts over; a replaced entry does not count twice."""
    demands = demand.PodDemands(bound=2)
    pods = []
    for uid in ("a", "b"):
        body = _pod()
        body["metadata"]["uid"] = uid
        pods.append(demand.decode_pod(body))
    for view in pods:
        demands(view)
    fake = _pod(gpus="3")
    fake["metadata"]["uid"] = "b"
    demands(demand.decode_pod(fake))  # replaces b's entry: a stays
    demands(pods[0])
    assert parsed == [1, 1, 3]
    third = _pod()
    third["metadata"]["uid"] = "c"
    demands(demand.decode_pod(third))  # the third pod: starts over
    demands(pods[0])
    assert parsed == [1, 1, 3, 1, 1]
