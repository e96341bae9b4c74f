"""core.drapending: why a pending claim of gpu-dra's classes can never be allocated, judged
against slices that ``core.dra.build_slices`` makes from simulated nodes."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from gpuk8s import sim
from gpuk8s.core.dra import DRIVER, PoolOptions, build_slices
from gpuk8s.core.drapending import (
    REASON_GROUPS_OFF,
    REASON_NO_LINK_GROUP,
    REASON_SHARE_TOO_LARGE,
    REASON_TOO_MANY,
    unmet,
)
from gpuk8s.discovery import discover

pytestmark = pytest.mark.usefixtures("fast_python3")


@pytest.fixture(scope="module")
def slices(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    out = {}
    for preset in ("c500-8", "c500-8-vf4"):
        root = str(tmp_path_factory.mktemp("sim") / preset)
        sim.create(root, preset)
        inv = discover(root)
        for key, options in ((preset, PoolOptions(groups=False)),
                             (preset + "+groups", PoolOptions(groups=True)),
                             (preset + "+sgpu", PoolOptions(sharing="sgpu"))):
            if "vf4" in key and key != preset:
                continue
            out[key] = build_slices(f"node-{key}", inv, options)
    return out


def link_groups(bodies: list[dict[str, Any]]) -> Counter[int]:
    return Counter(d["attributes"]["linkGroup"]["int"] for b in bodies
                   for d in b["spec"].get("devices") or []
                   if d["attributes"]["type"]["string"] == "gpu" and "linkGroup" in d["attributes"])


def claim(*requests: dict[str, Any], match: str | None = None) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": list(requests)}
    if match:
        devices["constraints"] = [{"matchAttribute": f"{DRIVER}/{match}"}]
    return {"spec": {"devices": devices}}


def exactly(name: str, cls: str, count: int = 1, **capacity: str) -> dict[str, Any]:
    body: dict[str, Any] = {"deviceClassName": cls, "count": count}
    if capacity:
        body["capacity"] = {"requests": capacity}
    return {"name": name, "exactly": body}


def test_a_link_group_larger_than_any_node_has(slices: dict[str, Any]) -> None:
    nodes = slices["c500-8"] + slices["c500-8+groups"]
    largest = max(link_groups(slices["c500-8"]).values())
    ok = claim(exactly("gpus", DRIVER, largest), match="linkGroup")
    assert unmet(ok, nodes) == []
    too_big = claim(exactly("gpus", DRIVER, largest + 1), match="linkGroup")
    [why] = unmet(too_big, nodes)
    assert why.reason == REASON_NO_LINK_GROUP and why.request == "gpus"
    assert f"{largest + 1} GPUs" in why.message and f"is {largest} " in why.message
    # without the constraint the node's GPUs count
    assert unmet(claim(exactly("gpus", DRIVER, largest + 1)), nodes) == []
    [why] = unmet(claim(exactly("gpus", DRIVER, 9)), nodes)
    assert why.reason == REASON_TOO_MANY and "the most any node publishes is 8" in why.message


def test_vfs_never_count_as_gpus(slices: dict[str, Any]) -> None:
    vf_nodes = slices["c500-8-vf4"]
    [why] = unmet(claim(exactly("gpus", DRIVER, 1)), vf_nodes)
    assert why.reason == REASON_TOO_MANY and "is 0" in why.message
    assert unmet(claim(exactly("vfs", "vf." + DRIVER, 32)), vf_nodes) == []
    [why] = unmet(claim(exactly("vfs", "vf." + DRIVER, 33)), vf_nodes)
    assert why.reason == REASON_TOO_MANY and "33 VFs" in why.message
    # four VFs of one GPU exist, five do not
    assert unmet(claim(exactly("vfs", "vf." + DRIVER, 4), match="parentIndex"), vf_nodes) == []
    [why] = unmet(claim(exactly("vfs", "vf." + DRIVER, 5), match="parentIndex"), vf_nodes)
    assert why.reason == REASON_TOO_MANY and f"{DRIVER}/parentIndex" in why.message


def test_group_classes_without_group_devices(slices: dict[str, Any]) -> None:
    group4 = claim(exactly("g", f"group-4.{DRIVER}"))
    [why] = unmet(group4, slices["c500-8"])
    assert why.reason == REASON_GROUPS_OFF and "published: none" in why.message
    assert unmet(group4, slices["c500-8"] + slices["c500-8+groups"]) == []
    sizes = {d["attributes"]["groupSize"]["int"] for b in slices["c500-8+groups"]
             for d in b["spec"].get("devices") or [] if "groupSize" in d["attributes"]}
    absent = next(n for n in (2, 4, 8) if n not in sizes) if len(sizes) < 3 else None
    if absent is not None:
        [why] = unmet(claim(exactly("g", f"group-{absent}.{DRIVER}")), slices["c500-8+groups"])
        assert why.reason == REASON_GROUPS_OFF
        assert ", ".join(str(s) for s in sorted(sizes)) + " GPUs" in why.message


def test_shares_larger_than_a_gpu(slices: dict[str, Any]) -> None:
    nodes = slices["c500-8+sgpu"] + slices["c500-8"]
    sgpu = "sgpu." + DRIVER
    assert unmet(claim(exactly("s", sgpu, vcore="100", vmemory="64Gi")), nodes) == []
    [why] = unmet(claim(exactly("s", sgpu, vcore="101", vmemory="8Gi")), nodes)
    assert why.reason == REASON_SHARE_TOO_LARGE and "vcore 101" in why.message
    [why] = unmet(claim(exactly("s", sgpu, vcore="10", vmemory="65Gi")), nodes)
    assert why.reason == REASON_SHARE_TOO_LARGE and "vmemory 65Gi" in why.message
    assert "65536Mi" in why.message


def test_first_available_is_unmet_only_when_every_alternative_is(
        slices: dict[str, Any]) -> None:
    nodes = slices["c500-8"]
    alternatives = [{"name": "many", "deviceClassName": DRIVER, "count": 9},
                    {"name": "few", "deviceClassName": DRIVER, "count": 2}]
    request = {"name": "gpus", "firstAvailable": alternatives}
    assert unmet(claim(request), nodes) == []
    alternatives[1]["count"] = 10
    [why] = unmet(claim(request), nodes)
    assert why.request == "gpus" and why.message.startswith("every alternative is unmet")


def test_other_drivers_and_classes_are_not_judged(slices: dict[str, Any]) -> None:
    assert unmet(claim(exactly("x", "gpu.example.com", 100)), slices["c500-8"]) == []
    foreign = [dict(b, spec=dict(b["spec"], driver="other.example.com"))
               for b in slices["c500-8"]]
    [why] = unmet(claim(exactly("gpus", DRIVER, 1)), foreign)
    assert why.reason == REASON_TOO_MANY
