"""CUDA driver/runtime compatibility (SPEC §11): the driver's CUDA version from NVML
(the simulated libnvidia-ml.so.1), the node labels, and the check gpu-aware applies."""

from __future__ import annotations

import json
import logging
from typing import Any

import msgspec
import pytest

from gpuk8s import sim
from gpuk8s.core.cuda import (
    MAJOR_LABEL,
    MINOR_LABEL,
    RUNTIME_ANNOTATION,
    CudaVersion,
    check,
    node_version,
    parse_version,
)
from gpuk8s.core.devicelist import DEVICES_ANNOTATION
from gpuk8s.core.errors import ConfigError
from gpuk8s.core.labels import compute_labels
from gpuk8s.discovery import discover
from gpuk8s.discovery.nvidia import cuda_driver_version
from gpuk8s.services.extender.cuda import NodeCudaVersions
from gpuk8s.services.extender.logic import Extender
from gpuk8s.services.extender.nodes import NodeCache
from gpuk8s.services.extender.watch import node_handlers
from gpuk8s.services.extender.weights import Weights, WeightSource
from gpuk8s.sim import tree

pytestmark = pytest.mark.usefixtures("fast_python3")


def set_driver_cuda(root: str, version: str | None) -> None:
    state = sim.state(root)
    state["driver"]["cuda"] = version
    tree.save_state(root, state)


def test_nvidia_nodes_are_labelled_with_the_drivers_cuda_version(nvidia_sim_root: str) -> None:
    inventory = discover(nvidia_sim_root)
    assert inventory.driver.cuda == CudaVersion(12, 4)
    labels = compute_labels(inventory)
    assert labels[MAJOR_LABEL] == "12" and labels[MINOR_LABEL] == "4"
    assert MAJOR_LABEL == "metax-tech.com/cuda-major-version"
    assert inventory.to_dict()["driver"]["cuda"] == "12.4"
    try:
        set_driver_cuda(nvidia_sim_root, "11.8")  # NVML answers from the node, read each time
        assert compute_labels(discover(nvidia_sim_root))[MINOR_LABEL] == "8"
        set_driver_cuda(nvidia_sim_root, None)  # an NVML that cannot say: no labels, a problem
        unknown = discover(nvidia_sim_root)
        assert unknown.driver.cuda is None
        assert MAJOR_LABEL not in compute_labels(unknown)
        assert any("nvmlSystemGetCudaDriverVersion failed (NVML error 3)" in p
                   for p in unknown.problems)  # _v2 fails first: no libcuda.so.1 here
    finally:
        set_driver_cuda(nvidia_sim_root, "12.4")


def test_metax_nodes_and_roots_without_nvml_have_no_cuda_labels(tmp_path_factory:
                                                                 pytest.TempPathFactory) -> None:
    root = str(tmp_path_factory.mktemp("metax") / "node")
    sim.create(root, "n260-2")
    assert not any("cuda" in k for k in compute_labels(discover(root)))
    version, why = cuda_driver_version(root)
    assert version is None and why is not None and "libnvidia-ml.so.1 not found" in why


def test_versions_parse_strictly() -> None:
    assert parse_version("12.4") == CudaVersion(12, 4)
    assert parse_version(" 11.0 ") == CudaVersion(11, 0)
    for bad in ("12", "12.4.1", "v12.4", "12.x", "", "-1.0", "12.04x"):
        with pytest.raises(ConfigError, match=r"gpuk8s.io/cuda-runtime: .* MAJOR\.MINOR"):
            parse_version(bad)
    assert node_version("12", "4") == CudaVersion(12, 4)
    assert node_version(None, "4") is None and node_version("12", "x") is None


def test_driver_must_be_at_least_the_runtime_and_a_wide_gap_warns() -> None:
    why, warn = check(CudaVersion(12, 2), CudaVersion(12, 4))
    assert why is not None and "CUDA 12.2" in why and "runtime 12.4" in why and warn is None
    assert check(CudaVersion(12, 4), CudaVersion(12, 4)) == (None, None)
    assert check(CudaVersion(12, 4), CudaVersion(11, 8)) == (None, None)
    why, warn = check(CudaVersion(13, 0), CudaVersion(11, 8))
    assert why is None and warn is not None and "more than 1 major version" in warn
    assert check(None, CudaVersion(12, 4)) == (None, None)  # unlabelled node: not checked


# -- gpu-aware: pods stating their CUDA runtime ------------------------------------------
GPU = "metax-tech.com/gpu"


def node_obj(name: str, cuda: tuple[str, str] | None) -> dict[str, Any]:
    labels = {"kubernetes.io/hostname": name}
    if cuda is not None:
        labels[MAJOR_LABEL], labels[MINOR_LABEL] = cuda
    return {"metadata": {"name": name, "labels": labels}, "spec": {}, "status": {}}


def pod_obj(runtime: Any = None, gpus: int = 0) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "train", "namespace": "ml", "uid": "u1"}
    if runtime is not None:
        meta["annotations"] = {RUNTIME_ANNOTATION: runtime, "other": "x"}
    resources = {"limits": {"nvidia.com/gpu": "1"}} if not gpus else {"limits": {GPU: str(gpus)}}
    return {"metadata": meta,
            "spec": {"containers": [{"name": "main", "resources": resources}]}}


NODES = [node_obj("old", ("12", "2")), node_obj("new", ("12", "4")),
         node_obj("newest", ("13", "0")), node_obj("unlabelled", None)]


def filter_call(ext: Extender, payload: dict[str, Any]) -> dict[str, Any]:
    response = ext.handle("filter", json.dumps(payload).encode())
    assert response.status == 200, response.body
    answer: dict[str, Any] = json.loads(response.body)
    return answer


def test_filter_drops_nodes_whose_driver_is_older_than_the_pods_runtime(
        caplog: pytest.LogCaptureFixture) -> None:
    ext = Extender(WeightSource(None, Weights(1, 1)))
    answer = filter_call(ext, {"Pod": pod_obj("12.4"), "Nodes": {"items": NODES}})
    kept = [n["metadata"]["name"] for n in answer["Nodes"]["items"]]
    assert kept == ["new", "newest", "unlabelled"]
    assert answer["Nodes"]["items"][0] == NODES[1]  # the node object as sent
    reason = answer["FailedAndUnresolvableNodes"]["old"]
    assert "CUDA 12.2" in reason and "runtime 12.4" in reason and answer["FailedNodes"] == {}
    # a runtime two majors behind the driver is allowed, with a warning in the log
    with caplog.at_level(logging.WARNING, logger="gpuk8s.extender"):
        answer = filter_call(ext, {"Pod": pod_obj("11.0"), "Nodes": {"items": NODES}})
    assert len(answer["Nodes"]["items"]) == 4
    warned = [r for r in caplog.records if r.getMessage() == "CUDA version gap"]
    assert [getattr(r, "node", None) for r in warned] == ["newest"]
    # without the annotation nothing changes (the fast path)
    plain = filter_call(ext, {"Pod": pod_obj(), "Nodes": {"items": NODES}})
    assert len(plain["Nodes"]["items"]) == 4 and plain["FailedAndUnresolvableNodes"] == {}


def test_a_gpu_pod_is_checked_after_the_gpu_filter() -> None:
    devices = json.dumps([{"id": "0000:03:00.0", "pci": "0000:03:00.0", "gpu": 0, "vf": None,
                           "product": "H100", "numa": 0, "group": None, "switch": None,
                           "healthy": True, "allocated": False}])
    nodes = [node_obj("old", ("11", "8")), node_obj("new", ("12", "4")),
             node_obj("busy", ("12", "4"))]
    for item in nodes[:2]:
        item["metadata"]["annotations"] = {DEVICES_ANNOTATION: devices}
    ext = Extender(WeightSource(None, Weights(1, 1)))
    answer = filter_call(ext, {"Pod": pod_obj("12.0", gpus=1), "Nodes": {"items": nodes}})
    assert [n["metadata"]["name"] for n in answer["Nodes"]["items"]] == ["new"]
    assert set(answer["FailedAndUnresolvableNodes"]) == {"old", "busy"}
    assert "runtime 12.0" in answer["FailedAndUnresolvableNodes"]["old"]


def test_with_the_node_cache_the_labels_come_from_the_watch() -> None:
    cache = NodeCache()
    versions = NodeCudaVersions()
    on_list, on_event = node_handlers(cache, cuda=versions)
    on_list([msgspec.Raw(json.dumps(n).encode()) for n in NODES])
    ext = Extender(WeightSource(None, Weights(1, 1)), cache=cache, cuda=versions)
    payload = {"Pod": pod_obj("12.4"), "NodeNames": [n["metadata"]["name"] for n in NODES]}
    answer = filter_call(ext, payload)
    assert answer["NodeNames"] == ["new", "newest", "unlabelled"]
    assert "old" in answer["FailedAndUnresolvableNodes"]
    # the driver of "old" was upgraded: gpu-label relabels, the watch sees it
    on_event("MODIFIED", msgspec.Raw(json.dumps(node_obj("old", ("12", "6"))).encode()))
    on_event("MODIFIED", msgspec.Raw(json.dumps(node_obj("new", ("12", "3"))).encode()))
    answer = filter_call(ext, payload)
    assert answer["NodeNames"] == ["old", "newest", "unlabelled"]
    on_event("DELETED", msgspec.Raw(json.dumps(node_obj("new", ("12", "3"))).encode()))
    assert versions.get("new") is None


@pytest.mark.parametrize("runtime", ["12", "twelve", 12.4, ["12.4"]])
def test_a_malformed_annotation_refuses_every_node_naming_it(runtime: Any) -> None:
    ext = Extender(WeightSource(None, Weights(1, 1)))
    answer = filter_call(ext, {"Pod": pod_obj(runtime), "Nodes": {"items": NODES}})
    assert answer["Nodes"]["items"] == []
    reasons = set(answer["FailedAndUnresolvableNodes"].values())
    assert len(reasons) == 1 and RUNTIME_ANNOTATION in reasons.pop()


def odd_nodes_body(pod: dict[str, Any], items: list[dict[str, Any]]) -> tuple[bytes, list[bytes]]:
    """A filter body whose Node objects are spelled as no encoder here would spell them
    (indented, non-ASCII kept, fields gpu-aware skips); (the body, each item's bytes)."""
    raws = []
    for item in items:
        odd = {"kind": "Node", **item, "spec": {"taints": [{"key": "zoné", "effect": "x"}]}}
        raws.append(json.dumps(odd, indent=1, ensure_ascii=False).encode())
    body = (b'{"Pod": ' + json.dumps(pod).encode() + b',\n "Nodes": {"metadata": {"x": 1},'
            b' "items": [' + b" ,\n".join(raws) + b"]}}")
    return body, raws


def echoed(answer: bytes, kept: list[bytes]) -> bool:
    """Whether ``answer`` carries exactly ``kept`` as its Node items, byte for byte."""
    return answer.startswith(b'{"Nodes":{"metadata":{"x": 1},"items":[' + b",".join(kept)
                             + b"]}")


def test_kept_nodes_are_echoed_byte_for_byte_on_the_cuda_path() -> None:
    ext = Extender(WeightSource(None, Weights(1, 1)))
    body, raws = odd_nodes_body(pod_obj("12.4"), NODES)
    assert all(json.dumps(json.loads(r), separators=(",", ":")).encode() != r for r in raws)
    response = ext.handle("filter", body)
    assert response.status == 200
    assert echoed(response.body, raws[1:]), response.body[:300]  # "old" refused
    assert "CUDA 12.2" in json.loads(response.body)["FailedAndUnresolvableNodes"]["old"]
