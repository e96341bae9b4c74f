"""gpu-aware's bind checks, effective requests and protocol edges (issue 26, items 1, 2
and 6): every test here failed on the code before the fix."""

from __future__ import annotations

import copy
import http.client
import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from gpuk8s.core.devicelist import DEVICES_ANNOTATION
from gpuk8s.core.scoring import LOSSES_ANNOTATION, SCORES_ANNOTATION
from gpuk8s.core.sharing import ASSIGNED_ANNOTATION, parse_assignment
from gpuk8s.services.extender.filtered import FilterMemory
from gpuk8s.services.extender.server import ExtenderHTTPServer, serve_in_thread
from gpuk8s.services.extender.wire import go_strings, parse_args

from .test_extender import C500, call, node, node_annotations, pod
from .test_extender_hostile import GOOD, SPLIT, extender
from .test_extender_share import Api, n260_annotations, over
from .test_extender_share import node as shared_node
from .test_extender_share import pod as shared_pod

SGPU, VCORE = "metax-tech.com/sgpu", "metax-tech.com/vcore"


@pytest.fixture(scope="module")
def annotations(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return n260_annotations(tmp_path_factory.mktemp("sim"))


class Missing(Exception):
    status = 404


class StrictApi(Api):
    """The stand-in API, answering 404 for a pod it does not hold (as the real one)."""

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        if name not in self.pods:
            raise Missing(f"pods {name!r} not found")
        return super().get_pod(namespace, name)


def sharing_setup(annotations: dict[str, str]) -> tuple[Any, StrictApi, Any, list[Any]]:
    items = [shared_node("a", annotations), shared_node("b", annotations),
             shared_node("x", annotations, None)]
    ext, _, ledger = over(items)
    assert ext.sharing is not None
    api = StrictApi(ledger)
    ext.sharing.api = api
    return ext, api, ledger, items


def bind_args(p: dict[str, Any], node_name: str, uid: str | None = None) -> dict[str, str]:
    meta = p["metadata"]
    return {"PodName": meta["name"], "PodNamespace": meta.get("namespace", "default"),
            "PodUID": meta["uid"] if uid is None else uid, "Node": node_name}


def kept(result: dict[str, Any]) -> list[str]:
    if result.get("Nodes") is not None:
        return [n["metadata"]["name"] for n in result["Nodes"]["items"]]
    return list(result["NodeNames"] or [])


# -- item 2: bind checks what it is asked -----------------------------------------------------
def test_bind_without_a_pod_uid_is_refused_and_blocks_nobody(annotations: dict[str, str]) -> None:
    """Before: an empty PodUID bound the pod and its reservation (uid "") made every later
    same-size sharing bind on the node wait, then fail, for up to 5 minutes."""
    ext, api, ledger, items = sharing_setup(annotations)
    first = shared_pod("first", "30")
    api.pods["first"] = first
    status, result = call(ext, "filter", {"Pod": first, "Nodes": {"items": items}})
    assert status == 200 and "a" in kept(result)
    status, result = call(ext, "bind", bind_args(first, "a", uid=""))
    assert status == 400 and "PodUID is empty" in result["Error"]
    assert ledger.usage("a") == {} and "nodeName" not in api.pods["first"]["spec"]
    assert ASSIGNED_ANNOTATION not in first["metadata"].get("annotations", {})
    # the next pod of the same size binds at once (ext.sharing.bind_wait_s is 2 s)
    ext.sharing.bind_wait_s = 0.0
    second = shared_pod("second", "30")
    api.pods["second"] = second
    status, result = call(ext, "filter", {"Pod": second, "Nodes": {"items": items}})
    status, result = call(ext, "bind", bind_args(second, "a"))
    assert (status, result["Error"]) == (200, "")
    assert api.pods["second"]["spec"]["nodeName"] == "a"


def test_bind_only_where_this_pods_filter_kept_the_node(annotations: dict[str, str]) -> None:
    ext, api, ledger, items = sharing_setup(annotations)
    p = shared_pod("p", "30")
    api.pods["p"] = p
    # no filter for this pod yet: refused, nothing read, booked or bound
    status, result = call(ext, "bind", bind_args(p, "a"))
    assert status == 400 and "did not pass gpu-aware's filter" in result["Error"]
    # the filter drops x (exclusive mode): binding there is refused too
    status, result = call(ext, "filter", {"Pod": p, "Nodes": {"items": items}})
    assert "x" in result["FailedAndUnresolvableNodes"] and kept(result) == ["a", "b"]
    status, result = call(ext, "bind", bind_args(p, "x"))
    assert status == 400 and "'x' did not pass" in result["Error"]
    # another pod's filter does not count for this one
    other = shared_pod("other", "30")
    call(ext, "filter", {"Pod": other, "Nodes": {"items": items}})
    status, result = call(ext, "bind", bind_args(p, "a", uid="uid-other"))
    assert status == 409 and "is not the pod uid-other" in result["Error"]
    assert ledger.usage("a") == {} and "nodeName" not in p["spec"]
    status, result = call(ext, "bind", bind_args(p, "a"))
    assert (status, result["Error"]) == (200, "")
    assignment = parse_assignment(api.pods["p"]["metadata"]["annotations"][ASSIGNED_ANNOTATION])
    assert assignment is not None and assignment.node == "a"
    # bound: a second binding of the same pod is a conflict, and books nothing more
    before = ledger.usage("a")
    status, result = call(ext, "bind", bind_args(api.pods["p"], "b"))
    assert status == 409 and "already bound to a" in result["Error"]
    assert ledger.usage("a") == before and ledger.usage("b") == {}


def test_bind_refuses_missing_pods_and_pods_without_gpus(annotations: dict[str, str]) -> None:
    ext, api, ledger, items = sharing_setup(annotations)
    ghost = shared_pod("ghost", "30")
    call(ext, "filter", {"Pod": ghost, "Nodes": {"items": items}})
    status, result = call(ext, "bind", bind_args(ghost, "a"))
    assert status == 404 and "no pod default/ghost" in result["Error"]
    plain = {"metadata": {"name": "cpu", "namespace": "default", "uid": "uid-cpu",
                          "resourceVersion": "1"},
             "spec": {"containers": [{"name": "main"}]}}
    api.pods["cpu"] = plain
    call(ext, "filter", {"Pod": plain, "Nodes": {"items": items}})
    status, result = call(ext, "bind", bind_args(plain, "x"))
    assert status == 400 and "asks for no GPUs" in result["Error"]
    assert "nodeName" not in plain["spec"] and ledger.usage("x") == {}


def test_whole_gpu_pods_are_bound_only_where_the_filter_kept_them() -> None:
    """Before: 'plain pods are bound to any node the caller names'."""
    ext = extender()
    bound: list[tuple[str, str]] = []

    class Plain:
        def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
            return copy.deepcopy(four)

        def bind(self, namespace: str, name: str, uid: str, node_name: str) -> None:
            bound.append((name, node_name))

    from gpuk8s.services.extender.share import Ledger, SharedNodes, Sharing

    ledger = Ledger()
    ledger.replace([])
    ext.sharing = Sharing(SharedNodes(), ledger, Plain())  # type: ignore[arg-type]
    four = pod(4)
    items = [node("whole", GOOD), node("full", node_annotations(C500, allocated=range(6)))]
    status, result = call(ext, "filter", {"Pod": four, "Nodes": {"items": items}})
    assert kept(result) == ["whole"] and "full" in result["FailedNodes"]
    args = bind_args(four, "full")
    status, result = call(ext, "bind", args)
    assert status == 400 and bound == []
    status, result = call(ext, "bind", {**args, "Node": "whole"})
    assert (status, result["Error"], bound) == (200, "", [("job", "whole")])


def test_filter_memory_is_bounded_and_forgets() -> None:
    now = [0.0]
    memory = FilterMemory(ttl=10, max_pods=2, max_names=5, clock=lambda: now[0])
    memory.record("a", ["n1", "n2"])
    memory.record("b", ['"n3"'], encoded=True)
    assert memory.passed("a", "n1") and memory.passed("b", "n3") and not memory.passed("a", "n3")
    memory.record("c", ["n4", "n5", "n6", "n7"])  # 7 names > 5: "a" goes first
    assert not memory.passed("a", "n1") and memory.passed("c", "n7") and len(memory) == 2
    now[0] = 11
    assert not memory.passed("c", "n7")  # older than the TTL
    memory.record("d", ["n8"])  # expired ones go
    memory.record("", ["n1"])  # no UID: nothing to check a binding against
    assert len(memory) == 1 and memory.passed("d", "n8")


# -- item 3: sharing asked in init and sidecar containers ------------------------------------
@pytest.mark.parametrize("restart", [None, "Always"])
def test_a_share_in_an_init_or_sidecar_container_is_placed_and_booked(
    annotations: dict[str, str], restart: str | None
) -> None:
    """Before: such a pod passed filter on every node, exclusive ones included, and was
    bound with no share recorded."""
    ext, api, ledger, items = sharing_setup(annotations)
    p = shared_pod("side", "40")
    asks = p["spec"]["containers"][0].pop("resources")
    init = {"name": "warm", "resources": asks}
    if restart:
        init["restartPolicy"] = restart
    p["spec"]["initContainers"] = [init]
    api.pods["side"] = p
    status, result = call(ext, "filter", {"Pod": p, "Nodes": {"items": items}})
    assert status == 200 and kept(result) == ["a", "b"]
    assert "sharing mode is 'exclusive'" in result["FailedAndUnresolvableNodes"]["x"]
    status, result = call(ext, "bind", bind_args(p, "a"))
    assert (status, result["Error"]) == (200, "")
    assignment = parse_assignment(api.pods["side"]["metadata"]["annotations"][ASSIGNED_ANNOTATION])
    assert assignment is not None and assignment.share.container == "warm"
    assert [u.core for u in ledger.usage("a").values()] == [40]


def test_a_share_in_two_containers_is_refused_naming_both() -> None:
    p = pod()
    asks = {"limits": {SGPU: "1", VCORE: "20"}}
    p["spec"]["containers"][0]["resources"] = asks
    p["spec"]["initContainers"] = [{"name": "warm", "restartPolicy": "Always",
                                    "resources": asks}]
    status, result = call(extender(), "filter", {"Pod": p, "NodeNames": []})
    assert status == 400
    assert "Pod.spec.initContainers[0] and Pod.spec.containers[0] ask for shared GPUs" in (
        result["Error"])


# -- item 6: protocol edges --------------------------------------------------------------------
@pytest.fixture()
def server() -> Iterator[ExtenderHTTPServer]:
    srv = ExtenderHTTPServer(("127.0.0.1", 0), extender())
    serve_in_thread(srv)
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.mark.parametrize("path", ["/filter", "/prioritize", "/x/predicates", "/bind"])
def test_get_of_a_verb_is_405_like_other_methods(server: ExtenderHTTPServer, path: str) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request("GET", path)
    resp = conn.getresponse()
    assert resp.status == 405 and resp.getheader("Allow") == "POST"
    assert "not allowed" in json.loads(resp.read())["Error"]
    conn.close()


def test_conflicting_content_lengths_are_refused(server: ExtenderHTTPServer) -> None:
    payload = json.dumps({"Pod": pod(0), "Nodes": {"items": [node("n1")]}}).encode()
    head = b"POST /filter HTTP/1.1\r\nContent-Length: %d\r\nContent-Length: 5\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(head % len(payload) + payload)
        sock.shutdown(socket.SHUT_WR)
        answer = sock.makefile("rb").read()
    assert answer.startswith(b"HTTP/1.1 400")
    assert b"conflicting Content-Length" in answer
    # the same value twice frames the body unambiguously: accepted
    same = b"POST /filter HTTP/1.1\r\nContent-Length: %d\r\nContent-Length: %d\r\n\r\n%s" % (
        len(payload), len(payload), payload)
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(same)
        sock.shutdown(socket.SHUT_WR)
        assert sock.makefile("rb").read().startswith(b"HTTP/1.1 200")


def test_a_node_name_with_a_lone_surrogate_fails_only_that_node() -> None:
    good = json.dumps(node("good", GOOD))
    bad = json.dumps(node("\ud800", GOOD))  # json.dumps writes the escape "\ud800"
    assert "\\ud800" in bad
    full = f'{{"Pod": {json.dumps(pod(1))}, "Nodes": {{"items": [{bad}, {good}]}}}}'.encode()
    status, result = call(extender(), "filter", full)
    assert status == 200 and kept(result) == ["good"]
    assert list(result["FailedAndUnresolvableNodes"]) == ["\ufffd"]
    status, ranking = call(extender(), "prioritize", full)
    assert status == 200 and {r["Host"]: r["Score"] for r in ranking} == {
        "\ufffd": 0, "good": 10}
    names = f'{{"Pod": {json.dumps(pod(1))}, "NodeNames": ["\\udc00", "good"]}}'.encode()
    args = parse_args(names)
    assert args.node_names == ["\ufffd", "good"]
    # escaped backslashes and valid pairs are left alone; invalid UTF-8 becomes U+FFFD
    assert go_strings(b'["\\\\ud800", "\\ud83d\\ude00", "\\ud800x", "\xff"]') == (
        b'["\\\\ud800", "\\ud83d\\ude00", "\\ufffdx", "\xef\xbf\xbd"]')


@pytest.mark.parametrize("key", [DEVICES_ANNOTATION, SCORES_ANNOTATION, LOSSES_ANNOTATION])
@pytest.mark.parametrize("value", [5, [1, 2], {"a": 1}, True])
def test_a_non_string_annotation_is_unusable_to_filter_and_prioritize_alike(
    key: str, value: Any
) -> None:
    """Before: a non-string score table was 'unresolvable' to filter but scored 10 in
    prioritize."""
    items = [node("good", SPLIT), node("odd", {**GOOD, key: value})]
    ext = extender()
    status, result = call(ext, "filter", {"Pod": pod(1), "Nodes": {"items": items}})
    assert "must be a string" in result["FailedAndUnresolvableNodes"]["odd"]
    status, ranking = call(ext, "prioritize", {"Pod": pod(4), "Nodes": {"items": items}})
    assert status == 200
    assert {r["Host"]: r["Score"] for r in ranking} == {"good": 10, "odd": 0}


def test_duplicate_keys_the_last_wins_everywhere() -> None:
    """Go's encoding/json (the scheduler's side) keeps the last of repeated keys, its case
    ignored; before, "Pod" twice was last-wins and "Pod" with "pod" a 400."""
    one, two = json.dumps(pod(1)), json.dumps(pod(2))
    for first, second in (("Pod", "Pod"), ("Pod", "pod"), ("pod", "POD")):
        args = parse_args(f'{{"{first}": {one}, "{second}": {two}, "NodeNames": []}}'.encode())
        assert args.gpus == 2, (first, second)
    nested = ('{"Pod": {"spec": {"containers": [{"name": "c", "resources": {"limits": '
              '{"metax-tech.com/gpu": "1", "metax-tech.com/gpu": "3"}}}]}}, "NodeNames": []}')
    assert parse_args(nested.encode()).gpus == 3
    names = b'{"Pod": {}, "NodeNames": ["a"], "nodenames": ["b"]}'
    assert parse_args(names).node_names == ["b"]


@pytest.mark.parametrize(
    ("whole", "share"),
    [("nvidia.com/gpu", {"tencent.com/vcuda-core": "30"}),
     ("metax-tech.com/gpu", {SGPU: "1", VCORE: "30"}),
     ("nvidia.com/gpu", {"nvidia.com/mps-core": "30"})],
)
def test_whole_and_shared_gpus_together_are_refused_alike(
    whole: str, share: dict[str, str]
) -> None:
    """Before: vcuda-core beside nvidia.com/gpu was accepted, sgpu beside metax-tech.com/gpu
    refused."""
    p = pod()
    p["spec"]["containers"][0]["resources"] = {"limits": {**share, whole: "1"}}
    status, result = call(extender(), "filter", {"Pod": p, "NodeNames": []})
    assert status == 400
    assert f"['{whole}']: whole GPUs" in result["Error"] and "not both" in result["Error"]
