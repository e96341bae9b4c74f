#!/usr/bin/env python3
"""Fake GPU nodes for scheduling tests: Node objects registered through the real API
(no kubelet) with `metax-tech.com/gpu` capacity/allocatable, the labeller's labels and
the device plugin's annotations, kept Ready by renewing their node Leases.

    fake_nodes.py ensure N [--variants c500-8,c500-8:used=0+1,...] [--prefix fake-gpu] [--no-taint]
                  [--dra [--dra-no-groups]]
    fake_nodes.py heartbeat            (loop: renew every fake node's Lease; run by lab/fake-nodes)
    fake_nodes.py delete               (delete every fake node and its Lease)

A variant is a simulator preset plus the GPU indices already in use on that node
(`used=`, joined with '+'); its annotations come from the product's own code (discovery
of a simulated root, the device plugin's DeviceSet, core.scoring), so fake nodes publish
exactly what a real gpu-device would for that topology and usage.

With --dra each node also publishes what gpu-dra would (`core.dra.node_slices`: its
ResourceSlices, devices in the steering order for its used GPUs), and its used GPUs are
held by allocated ResourceClaims `used-<node>` in the namespace `gpuk8s-fake-claims` (the
scheduler's DRA allocator counts those), so a DRA claim sees the same free GPUs as a
`metax-tech.com/gpu` request does. The chart's DeviceClasses must exist (gpuDra.enabled, or
benchmarks/dra.py creates them).

Fake nodes carry the label `lab.gpuk8s.io/fake-node=true`, the label
`lab.gpuk8s.io/variant=<variant>`, and (unless --no-taint) the taint
`lab.gpuk8s.io/fake-node=true:NoSchedule`, so nothing lands on them by accident; test
pods add a toleration. Talks to the apiserver with the lab's admin client certificate
(stdlib HTTPS, keep-alive, a few threads).
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import functools
import http.client
import json
import os
import ssl
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlparse

FAKE_LABEL = "lab.gpuk8s.io/fake-node"
VARIANT_LABEL = "lab.gpuk8s.io/variant"
RESOURCE = "metax-tech.com/gpu"
LEASE_NS = "kube-node-lease"
DEFAULT_VARIANTS = "c500-8,c550-8,c500-8:used=0+4,c500-8:used=0+1+2+3"
CLAIMS_NS = "gpuk8s-fake-claims"
RESOURCE_API = "/apis/resource.k8s.io/v1"
KUBECONFIG = os.environ.get("KUBECONFIG", "/etc/kubernetes/admin.conf")


# ----------------------------------------------------------------------------- API client
class Api:
    """Minimal Kubernetes REST client: one keep-alive connection per thread. Authenticates
    with the kubeconfig's client certificate (the lab's admin.conf) or its bearer token
    (a private API server's, e.g. the integration tier's)."""

    def __init__(self, kubeconfig: str = KUBECONFIG) -> None:
        import yaml  # PyYAML: a gpuk8s dependency

        with open(kubeconfig) as f:
            cfg = yaml.safe_load(f)
        cluster = cfg["clusters"][0]["cluster"]
        user = cfg["users"][0]["user"]
        url = urlparse(cluster["server"])
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 443
        self.headers = {"Accept": "application/json"}
        if user.get("token"):
            self.headers["Authorization"] = f"Bearer {user['token']}"
            self.ctx = ssl.create_default_context()
            if cluster.get("insecure-skip-tls-verify"):
                self.ctx.check_hostname = False
                self.ctx.verify_mode = ssl.CERT_NONE
            elif cluster.get("certificate-authority-data"):
                self.ctx.load_verify_locations(
                    cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
            self._local = threading.local()
            return
        # ssl reads the CA, certificate and key from files once, here; the client key
        # must not outlive that on disk
        with tempfile.TemporaryDirectory(prefix="fake-nodes-") as where:
            paths = {}
            for key, name in (
                ("certificate-authority-data", "ca"),
                ("client-certificate-data", "crt"),
                ("client-key-data", "key"),
            ):
                path = os.path.join(where, name)
                with open(path, "wb") as f:
                    f.write(base64.b64decode(cluster.get(key) or user.get(key)))
                paths[name] = path
            self.ctx = ssl.create_default_context(cafile=paths["ca"])
            self.ctx.load_cert_chain(paths["crt"], paths["key"])
        self._local = threading.local()

    def _conn(self) -> http.client.HTTPSConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=30)
            self._local.conn = conn
        return conn

    def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        headers = dict(self.headers)
        if data is not None:
            headers["Content-Type"] = content_type
        for attempt in range(3):
            conn = self._conn()
            try:
                conn.request(method, path, body=data, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
                return resp.status, (json.loads(raw) if raw else None)
            except (http.client.HTTPException, OSError):
                conn.close()
                self._local.conn = None
                if attempt == 2:
                    raise
                time.sleep(0.2 * (attempt + 1))
        raise AssertionError("unreachable")

    def watch(self, path: str, timeout: float = 300) -> Iterator[dict[str, Any]]:
        """The events of a watch (``path`` with ``watch=1``), each a decoded
        ``{"type", "object"}``, on a connection of its own; ends when the server closes
        the stream (an ``ERROR`` event, e.g. 410 Gone, is yielded like any other)."""
        conn = http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=timeout)
        try:
            conn.request("GET", path, headers=self.headers)
            resp = conn.getresponse()
            if resp.status != 200:
                raise OSError(f"watch {path}: HTTP {resp.status}: {resp.read()[:200]!r}")
            while True:
                line = resp.readline()
                if not line:
                    return
                if line.strip():
                    yield json.loads(line)
        finally:
            conn.close()


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# --------------------------------------------------------------------- what a node publishes
def parse_variant(variant: str) -> tuple[str, set[int]]:
    """(simulator preset, GPU indices in use) of a variant."""
    preset, _, rest = variant.partition(":")
    used_gpus: set[int] = set()
    for part in filter(None, rest.split(",")):
        key, _, value = part.partition("=")
        if key == "used":
            used_gpus = {int(x) for x in value.split("+") if x}
        else:
            raise SystemExit(f"unknown variant option {key!r} in {variant!r}")
    return preset, used_gpus


@functools.cache
def preset_inventory(preset: str) -> Any:
    """The NodeInventory discovery finds on a simulated host of ``preset``."""
    from gpuk8s import sim
    from gpuk8s.discovery import discover

    with tempfile.TemporaryDirectory(prefix="fake-node-sim-") as root:
        sim.create(root, preset)
        return discover(root)


@functools.cache
def variant_view(variant: str) -> tuple[int, int, dict[str, str], dict[str, str]]:
    """(capacity, allocatable, labels, annotations) of a node of `variant`.

    The one place that decides what a fake node publishes: built with the same code the
    device plugin (DeviceSet, devicelist) and labeller (core.labels) run on a real node.
    """
    from gpuk8s.core.labels import compute_labels
    from gpuk8s.services.deviceplugin.nodestate import published_annotations
    from gpuk8s.services.node.devices import DeviceSet

    preset, used_gpus = parse_variant(variant)
    inventory = preset_inventory(preset)
    devices = DeviceSet(inventory, RESOURCE)
    used_ids = {u.id for u in devices.units if u.gpu in used_gpus}
    annotations = published_annotations(devices, used_ids)
    labels = compute_labels(inventory)
    capacity = len(devices.units)
    # Units held by (imaginary) earlier pods are not offered again.
    return capacity, capacity - len(used_ids), labels, annotations


def node_object(name: str, variant: str, taint: bool) -> dict[str, Any]:
    capacity, allocatable, gpu_labels, annotations = variant_view(variant)
    labels = {
        VARIANT_LABEL: variant.replace(":", ".").replace("=", "-").replace("+", "_")[:63],
        **gpu_labels,
    }
    return build_node(
        name,
        labels,
        annotations,
        {RESOURCE: str(capacity)},
        {RESOURCE: str(allocatable)},
        [FAKE_TAINT] if taint else [],
    )


FAKE_TAINT = {"key": FAKE_LABEL, "value": "true", "effect": "NoSchedule"}


def build_node(
    name: str,
    labels: dict[str, str],
    annotations: dict[str, str],
    capacity: dict[str, str],
    allocatable: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
    cpu: str = "64",
    memory: str = "512Gi",
    pods: str = "110",
) -> dict[str, Any]:
    """A fake Node object: ``capacity`` (and ``allocatable``, default the same) add to
    the CPU, memory and pod counts; the fake-node label is always set."""
    resources = {"cpu": cpu, "memory": memory, "pods": pods, "ephemeral-storage": "1Ti"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                FAKE_LABEL: "true",
                **labels,
            },
            "annotations": annotations,
        },
        "spec": {"taints": list(taints or [])},
        "status": {
            "capacity": {**resources, **capacity},
            "allocatable": {**resources, **(capacity if allocatable is None else allocatable)},
            "conditions": ready_conditions(),
            "addresses": [{"type": "Hostname", "address": name}],
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": "v0.0.0-fake",
                "kubeProxyVersion": "",
                "containerRuntimeVersion": "fake://0",
                "kernelVersion": "",
                "osImage": "gpuk8s fake node",
                "bootID": "",
                "machineID": "",
                "systemUUID": "",
            },
        },
    }


def dra_objects(name: str, variant: str, groups: bool = True
                ) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """(ResourceSlices, the used-GPU claim or None) of node ``name`` in DRA mode: what
    gpu-dra publishes on such a node once the used GPUs' claims are prepared."""
    from gpuk8s.core.dra import DRIVER, PoolOptions, gpu_device_name, node_slices

    preset, used = parse_variant(variant)
    inventory = preset_inventory(preset)
    slices = node_slices(name, inventory, PoolOptions(groups=groups), busy=sorted(used))
    if not used:
        return slices, None
    claim = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": f"used-{name}", "namespace": CLAIMS_NS},
        "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
            "deviceClassName": DRIVER, "count": len(used)}}]}},
    }
    allocation = {
        "devices": {"results": [{"request": "gpus", "driver": DRIVER, "pool": name,
                                 "device": gpu_device_name(inventory.gpu(i))}
                                for i in sorted(used)]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [name]}]}]},
    }
    return slices, {"claim": claim, "allocation": allocation}


def ensure_dra(api: Api, name: str, variant: str, groups: bool = True) -> None:
    slices, used = dra_objects(name, variant, groups)
    for body in slices:
        path = f"{RESOURCE_API}/resourceslices"
        status, got = api.request("POST", path, body)
        if status == 409:
            status, current = api.request("GET", f"{path}/{body['metadata']['name']}")
            body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            status, got = api.request("PUT", f"{path}/{body['metadata']['name']}", body)
        if status not in (200, 201):
            raise SystemExit(f"resourceslice {body['metadata']['name']}: HTTP {status}: {got}")
    if used is None:
        return
    path = f"{RESOURCE_API}/namespaces/{CLAIMS_NS}/resourceclaims"
    status, got = api.request("POST", path, used["claim"])
    if status not in (201, 409):
        raise SystemExit(f"claim used-{name}: HTTP {status}: {got}")
    status, current = api.request("GET", f"{path}/used-{name}")
    current["status"] = {"allocation": used["allocation"]}
    status, got = api.request("PUT", f"{path}/used-{name}/status", current)
    if status != 200:
        raise SystemExit(f"claim used-{name} status: HTTP {status}: {got}")


def lease_object(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": LEASE_NS},
        "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": now_micro()},
    }


# ----------------------------------------------------------------------------- commands
def list_fake(api: Api) -> list[str]:
    status, body = api.request("GET", f"/api/v1/nodes?labelSelector={FAKE_LABEL}%3Dtrue")
    if status != 200:
        raise SystemExit(f"listing nodes failed: HTTP {status}: {body}")
    return sorted(item["metadata"]["name"] for item in body["items"])


def ensure_node(api: Api, name: str, variant: str, taint: bool) -> None:
    register(api, node_object(name, variant, taint))


def register(api: Api, node: dict[str, Any]) -> None:
    """Create (or make match) one fake Node, set its status, renew its Lease."""
    name = node["metadata"]["name"]
    status, body = api.request("POST", "/api/v1/nodes", node)
    if status == 409:  # exists: make it match (labels/annotations/taints, then status)
        status, body = api.request(
            "PATCH",
            f"/api/v1/nodes/{name}",
            {"metadata": node["metadata"], "spec": node["spec"]},
            "application/merge-patch+json",
        )
    if status not in (200, 201):
        raise SystemExit(f"node {name}: HTTP {status}: {body}")
    # Status is a subresource: set it explicitly (capacity, allocatable, Ready).
    status, body = api.request(
        "PATCH",
        f"/api/v1/nodes/{name}/status",
        {"status": node["status"]},
        "application/merge-patch+json",
    )
    if status != 200:
        raise SystemExit(f"node {name} status: HTTP {status}: {body}")
    renew_lease(api, name)


def renew_lease(api: Api, name: str) -> None:
    status, _ = api.request(
        "PATCH",
        f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NS}/leases/{name}",
        {"spec": {"renewTime": now_micro(), "holderIdentity": name}},
        "application/merge-patch+json",
    )
    if status == 404:
        status, body = api.request(
            "POST", f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NS}/leases", lease_object(name)
        )
        if status not in (200, 201, 409):
            raise SystemExit(f"lease {name}: HTTP {status}: {body}")


def delete_node(api: Api, name: str) -> None:
    api.request("DELETE", f"{RESOURCE_API}/resourceslices?fieldSelector=spec.nodeName%3D{name}")
    api.request("DELETE", f"/api/v1/nodes/{name}")
    api.request("DELETE", f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NS}/leases/{name}")


def cmd_ensure(args: argparse.Namespace) -> int:
    api = Api()
    variants = [v for v in args.variants.split(",") if v]
    names = [f"{args.prefix}-{i:04d}" for i in range(args.count)]
    for v in set(variants):
        variant_view(v)  # build once, before the threads
    if args.dra:
        api.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                   "metadata": {"name": CLAIMS_NS}})
    t0 = time.monotonic()

    def ensure(i: int) -> None:
        ensure_node(api, names[i], variants[i % len(variants)], not args.no_taint)
        if args.dra:
            ensure_dra(api, names[i], variants[i % len(variants)], not args.dra_no_groups)

    with ThreadPoolExecutor(args.threads) as pool:
        list(pool.map(ensure, range(len(names))))
        extra = [n for n in list_fake(api) if n not in set(names)]
        list(pool.map(lambda n: delete_node(api, n), extra))
    print(
        f"{len(names)} fake nodes ready ({len(extra)} removed) in {time.monotonic() - t0:.1f}s; "
        f"variants: {', '.join(variants)}"
    )
    return 0


def ready_conditions() -> list[dict[str, str]]:
    stamp = now()
    return [
        {
            "type": t,
            "status": s,
            "reason": r,
            "message": "fake node (gpuk8s lab)",
            "lastHeartbeatTime": stamp,
            "lastTransitionTime": stamp,
        }
        for t, s, r in (
            ("Ready", "True", "KubeletReady"),
            ("MemoryPressure", "False", "KubeletHasSufficientMemory"),
            ("DiskPressure", "False", "KubeletHasNoDiskPressure"),
            ("PIDPressure", "False", "KubeletHasSufficientPID"),
        )
    ]


def revive(api: Api, name: str) -> None:
    """Post Ready again, as a kubelet would after the node controller marked it Unknown."""
    api.request(
        "PATCH",
        f"/api/v1/nodes/{name}/status",
        {"status": {"conditions": ready_conditions()}},
        "application/strategic-merge-patch+json",
    )


def cmd_heartbeat(args: argparse.Namespace) -> int:
    api = Api()
    with ThreadPoolExecutor(args.threads) as pool:
        while True:
            t0 = time.monotonic()
            try:
                status, body = api.request(
                    "GET", f"/api/v1/nodes?labelSelector={FAKE_LABEL}%3Dtrue"
                )
                items = body["items"] if status == 200 else []
                names = [item["metadata"]["name"] for item in items]
                list(pool.map(lambda n: renew_lease(api, n), names))
                stale = [
                    item["metadata"]["name"]
                    for item in items
                    if {c["type"]: c["status"] for c in item["status"].get("conditions", [])}.get(
                        "Ready"
                    )
                    != "True"
                ]
                list(pool.map(lambda n: revive(api, n), stale))
            except Exception as err:  # keep beating; the next round retries
                print(f"heartbeat: {err}", file=sys.stderr, flush=True)
            time.sleep(max(1.0, args.interval - (time.monotonic() - t0)))


def cmd_delete(args: argparse.Namespace) -> int:
    api = Api()
    names = list_fake(api)
    with ThreadPoolExecutor(args.threads) as pool:
        list(pool.map(lambda n: delete_node(api, n), names))
    api.request("DELETE", f"/api/v1/namespaces/{CLAIMS_NS}")
    print(f"deleted {len(names)} fake nodes")
    return 0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("ensure")
    p.add_argument("count", type=int)
    p.add_argument("--variants", default=DEFAULT_VARIANTS)
    p.add_argument("--prefix", default="fake-gpu")
    p.add_argument("--no-taint", action="store_true")
    p.add_argument("--dra", action="store_true",
                   help="also publish gpu-dra's ResourceSlices and the used GPUs' claims")
    p.add_argument("--dra-no-groups", action="store_true",
                   help="with --dra: slices without the link-group devices (gpu-dra's "
                        "--group-devices off), only the GPUs")
    p.add_argument("--threads", type=int, default=8)
    p = sub.add_parser("heartbeat")
    p.add_argument("--interval", type=float, default=10.0)
    p.add_argument("--threads", type=int, default=8)
    p = sub.add_parser("delete")
    p.add_argument("--threads", type=int, default=8)
    args = ap.parse_args(argv)
    return {"ensure": cmd_ensure, "heartbeat": cmd_heartbeat, "delete": cmd_delete}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
