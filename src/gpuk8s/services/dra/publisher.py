"""ResourceSlices of this node's pool, kept in line with discovery, health and use.

The wanted slices come from ``core.dra.node_slices`` (what ``gpuk8s dra slices`` prints):
the devices, unhealthy ones tainted (or left out), in ``core.dra.steering_order`` for the
GPUs prepared claims hold now. A
sync lists this driver's slices of this node, creates, updates (``resourceVersion``
checked by the API server) and deletes until they match. The pool generation goes up
whenever anything but the device order changes (the scheduler then ignores the older
slices); a reorder alone keeps it.

A watch on the node's slices brings back deleted ones at once (a kubelet that starts
deletes every slice of its node until the drivers register again), and a full sync every
``interval`` repairs anything else. The watch is Kubernetes' list-then-watch
(``services.listwatch``): it watches from its list's resourceVersion and from the last
version seen when the server closes a stream, so no delete falls between two streams, and
it asks for a sync after every (re)list, so a delete before the watch began, or lost to a
``410 Gone``, is repaired too.

After each write the driver reads back what the API server kept: a server without
``DRAPartitionableDevices`` drops ``sharedCounters``/``consumesCounters`` (a group device
would then overlap its members: the driver publishes again without group devices), one
without ``DRADeviceTaints`` drops taints (unhealthy devices are then left out instead).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, Protocol

from ...core.dra import DRIVER, PoolOptions, node_slices
from ...core.errors import GpuK8sError
from ...core.model import NodeInventory
from ...core.topology import Topology, units_for_inventory
from ..node.loop import NudgedLoop

log = logging.getLogger("gpuk8s.dra.publisher")


class SliceApi(Protocol):
    """This driver's ResourceSlices of one node (raw JSON objects)."""

    def list(self, node: str) -> list[dict[str, Any]]: ...

    def create(self, body: dict[str, Any]) -> dict[str, Any]: ...

    def update(self, body: dict[str, Any]) -> dict[str, Any]: ...

    def delete(self, name: str) -> None: ...


class SliceWatch(Protocol):
    """Optional: calls ``on_lost`` whenever one of the node's slices of this driver may
    have gone (the kubelet wipes them when it starts), until ``stop`` is set: on each
    delete, and whenever deletes may have been missed (as the watch begins, after it
    lost its place)."""

    def watch_deleted(self, node: str, on_lost: Callable[[], None],
                      stop: threading.Event) -> None: ...


class KubeSlices:
    """``SliceApi`` over the official client (``resource.k8s.io/v1``)."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes import client

        self._api = client.ResourceV1Api(api_client)

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        from .. import kube

        try:
            resp = fn(*args, _preload_content=False, **kwargs)
        except Exception as err:
            raise kube.classify(err, what) from err
        data = kube.body(resp)
        return json.loads(data) if data else {}

    def list(self, node: str) -> list[dict[str, Any]]:
        found = self._call("list resourceslices", self._api.list_resource_slice,
                           field_selector=f"spec.nodeName={node},spec.driver={DRIVER}")
        items: list[dict[str, Any]] = found.get("items") or []
        return items

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = self._call(f"create resourceslice {body['metadata']['name']}",
                                         self._api.create_resource_slice, body)
        return out

    def update(self, body: dict[str, Any]) -> dict[str, Any]:
        name = body["metadata"]["name"]
        out: dict[str, Any] = self._call(f"update resourceslice {name}",
                                         self._api.replace_resource_slice, name, body)
        return out

    def delete(self, name: str) -> None:
        self._call(f"delete resourceslice {name}", self._api.delete_resource_slice, name)

    def watch_deleted(self, node: str, on_lost: Callable[[], None],
                      stop: threading.Event) -> None:
        from ..listwatch import list_watch

        def listed(items: list[Any]) -> None:  # deletes before this list were not seen
            on_lost()

        def event(kind: str, raw: Any) -> None:
            if kind == "DELETED":
                on_lost()

        list_watch(self._api.list_resource_slice, listed, event, stop,
                   f"resourceslices of {node}",
                   field_selector=f"spec.nodeName={node},spec.driver={DRIVER}")


class PublishMetrics(Protocol):
    def published(self, ok: bool) -> None: ...


def _canonical(spec: Mapping[str, Any], with_order: bool) -> str:
    """A slice spec as compared: without the pool generation, devices sorted by name
    unless ``with_order``."""
    body = dict(spec)
    body["pool"] = {k: v for k, v in (spec.get("pool") or {}).items() if k != "generation"}
    devices = [dict(d) for d in body.get("devices") or []]
    for device in devices:  # the API server stamps taints with the time it saw them
        if device.get("taints"):
            device["taints"] = [{k: v for k, v in t.items() if k != "timeAdded"}
                                for t in device["taints"]]
    if not with_order:
        devices.sort(key=lambda d: str(d.get("name")))
    if devices:
        body["devices"] = devices
    return json.dumps(body, sort_keys=True)


class SlicePublisher:
    def __init__(
        self,
        node: str,
        inventory: NodeInventory,
        options: PoolOptions,
        api: SliceApi,
        *,
        unhealthy: Callable[[], Mapping[int, str]] = dict,
        busy: Callable[[], set[int]] = set,
        metrics: PublishMetrics | None = None,
        interval: float = 60.0,
        node_uid: str = "",
    ) -> None:
        self.node = node
        self.inventory = inventory
        self.options = options
        self.api = api
        self.unhealthy = unhealthy
        self.busy = busy
        self.metrics = metrics
        self.interval = interval
        self.node_uid = node_uid  # the slices belong to the Node: deleting it deletes them
        self.topology = Topology.from_inventory(inventory, units_for_inventory(inventory))
        self.generation = 0
        self.published_at: float | None = None  # monotonic time of the first full publish
        self.syncs = 0
        self.problems: list[str] = []  # features the API server did not keep
        self._lock = threading.Lock()
        self._loop = NudgedLoop(self.sync_once, interval, "slices")
        self._watch_stop = threading.Event()

    def wanted(self, generation: int) -> list[dict[str, Any]]:
        return node_slices(self.node, self.inventory, self.options, generation=generation,
                           unhealthy=self.unhealthy(), busy=sorted(self.busy()),
                           topology=self.topology, node_uid=self.node_uid)

    def sync_once(self) -> bool:
        """Make the API server's slices match; True when something was written."""
        with self._lock:
            try:
                wrote = self._sync()
            except GpuK8sError as err:
                log.warning("publishing ResourceSlices failed; retrying",
                            extra={"error": str(err)})
                if self.metrics is not None:
                    self.metrics.published(False)
                self.nudge(min(5.0, self.interval))
                return False
            if self.metrics is not None and wrote:
                self.metrics.published(True)
            self.syncs += 1
            return wrote

    def _sync(self) -> bool:
        current = {s["metadata"]["name"]: s for s in self.api.list(self.node)}
        generation = max([self.generation] + [
            int(((s.get("spec") or {}).get("pool") or {}).get("generation", 0))
            for s in current.values()])
        want = self.wanted(max(generation, 1))
        content_same = set(current) == {w["metadata"]["name"] for w in want} and all(
            _canonical(current[w["metadata"]["name"]]["spec"], False)
            == _canonical(w["spec"], False) for w in want)
        if not content_same or generation == 0:
            generation += 1
            want = self.wanted(generation)
        self.generation = generation
        wrote = False
        kept: list[dict[str, Any]] = []
        for body in want:  # counters slice first: devices reference it
            name = body["metadata"]["name"]
            have = current.get(name)
            if have is not None and _canonical(have["spec"], True) == _canonical(body["spec"],
                                                                                 True) \
                    and have["spec"]["pool"].get("generation") == generation:
                kept.append(have)
                continue
            if have is None:
                kept.append(self.api.create(body))
            else:
                body = dict(body)
                body["metadata"] = dict(body["metadata"],
                                        resourceVersion=have["metadata"]["resourceVersion"])
                kept.append(self.api.update(body))
            wrote = True
        for name in set(current) - {w["metadata"]["name"] for w in want}:
            self.api.delete(name)
            wrote = True
        if wrote:
            log.info("ResourceSlices published", extra={
                "node": self.node, "generation": generation,
                "devices": sum(len(s["spec"].get("devices") or []) for s in want)})
        if self.published_at is None:
            self.published_at = time.monotonic()
        if wrote and self._degrade(want, kept):
            return self._sync()
        return wrote

    def _degrade(self, want: list[dict[str, Any]], kept: list[dict[str, Any]]) -> bool:
        """Fall back where the API server dropped a gated field; True to publish again."""
        def devices(slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return [d for s in slices for d in (s.get("spec") or {}).get("devices") or []]

        sent, got = devices(want), devices(kept)
        again = False
        if self.options.groups and any("consumesCounters" in d for d in sent) and not any(
                "consumesCounters" in d for d in got):
            self.problem("the API server dropped consumesCounters (feature gate "
                         "DRAPartitionableDevices off): publishing without group devices")
            self.options = replace(self.options, groups=False)
            again = True
        if self.options.unhealthy == "taint" and any("taints" in d for d in sent) and not any(
                "taints" in d for d in got):
            self.problem("the API server dropped device taints (feature gate DRADeviceTaints "
                         "off): leaving unhealthy devices out of the slice instead")
            self.options = replace(self.options, unhealthy="remove")
            again = True
        if any(d.get("allowMultipleAllocations") for d in sent) and not any(
                d.get("allowMultipleAllocations") for d in got):
            self.problem("the API server dropped allowMultipleAllocations (feature gate "
                         "DRAConsumableCapacity off): sGPU devices are handed out whole")
        return again

    def problem(self, text: str) -> None:
        """Log ``text`` once and list it in ``problems`` (/readyz)."""
        if text not in self.problems:
            self.problems.append(text)
            log.warning(text)

    # -- loop ---------------------------------------------------------------------------
    def nudge(self, delay: float = 0.0) -> None:
        self._loop.nudge(delay)

    def start(self) -> None:
        self._loop.start()
        watch = getattr(self.api, "watch_deleted", None)
        if watch is not None:  # a kubelet that starts wipes the node's slices: put them back
            threading.Thread(target=watch, args=(self.node, self._deleted, self._watch_stop),
                             name="slices-watch", daemon=True).start()

    def _deleted(self) -> None:
        log.info("a ResourceSlice of this node was deleted (or may have been): syncing")
        self.nudge(0.2)

    def stop(self, timeout: float = 5.0) -> None:
        self._watch_stop.set()
        self._loop.stop(timeout)

    def alive(self) -> bool:
        return self._loop.alive()

    def withdraw(self) -> None:
        """Delete this node's slices (the plugin is uninstalled from the node)."""
        for body in self.api.list(self.node):
            self.api.delete(body["metadata"]["name"])
