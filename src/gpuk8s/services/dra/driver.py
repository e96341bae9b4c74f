"""NodePrepareResources / NodeUnprepareResources: from an allocated claim to CDI devices.

For each claim the kubelet names (namespace, name, UID) the driver

1. answers from the checkpoint when the claim is prepared already (idempotent: the kubelet
   asks again after its own or the plugin's restart, and for every pod sharing a claim);
2. reads the ResourceClaim from the API server (its UID must match) and takes the results
   of its allocation for this driver and this node's pool;
3. finds each allocated device by its name (built from the card's PCI address,
   ``core.dra``) and refuses one that is not in the pool now (its card is off the bus, or
   the name is one of the index-built names of releases before), unhealthy now, or already
   prepared for another claim (a GPU, VF or group member another claim holds, unless both
   are sGPU shares of it; a claim prepared by an earlier release, whose device names are
   index-built, holds the cards its stable ids name; the kubelet retries, the pod waits);
4. writes the claim's CDI spec (``core.cdi.build_claim_spec``: each allocated device's
   device nodes; once per container the control devices, the optional SDK mounts and the
   claim's environment -- visible devices, ``GPUK8S_DEVICE_IDS``, sGPU limits), checked by
   ``core.cdi.parse_spec`` and written atomically into the CDI directory;
5. records the claim in the checkpoint, then answers with one CDI device id per device.

Unprepare removes the CDI spec and the checkpoint entry; an unknown claim is not an error.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from typing import Any, Protocol

from ...core.cdi import build_claim_spec, parse_spec, qualified
from ...core.dra import (
    DRIVER,
    DraDevice,
    PoolOptions,
    device_index,
    legacy_device_gpus,
    missing_device_reason,
)
from ...core.errors import GpuK8sError
from ...core.quantity import QuantityError, parse_quantity
from ...core.sharing import MODE_SGPU, Assignment, ShareRequest, SharingError, share_env
from ...core.topology import Unit
from ...host.files import HostFileError, remove, write_json
from ..node.devices import DeviceSet
from .grpcapi import ClaimRef, PreparedDevice, PrepareResult
from .state import Checkpoint, PreparedClaim

log = logging.getLogger("gpuk8s.dra.driver")

CDI_KIND = DRIVER + "/claim"
DEFAULT_CDI_DIR = "/var/run/cdi"


class PrepareError(GpuK8sError):
    """A claim cannot be prepared (the kubelet shows the message and retries)."""


class ClaimSource(Protocol):
    """Reads a ResourceClaim (raw JSON object); raises ``GpuK8sError``."""

    def get(self, namespace: str, name: str) -> Mapping[str, Any]: ...


class KubeClaims:
    """``ClaimSource`` over the official client (``resource.k8s.io/v1``)."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes import client

        self._api = client.ResourceV1Api(api_client)

    def get(self, namespace: str, name: str) -> Mapping[str, Any]:
        import json

        from .. import kube

        try:
            resp: Any = self._api.read_namespaced_resource_claim(name, namespace,
                                                                 _preload_content=False)
        except Exception as err:
            raise kube.classify(err, f"get resourceclaim {namespace}/{name}") from err
        data: Mapping[str, Any] = json.loads(kube.body(resp))
        return data


class PrepareMetrics(Protocol):
    def observe_prepare(self, seconds: float, ok: bool) -> None: ...

    def set_prepared(self, claims: int) -> None: ...


def spec_path(cdi_dir: str, uid: str) -> str:
    return os.path.join(cdi_dir, f"{DRIVER}-claim_{uid}.json")


def _base_request(request: str) -> str:
    return request.split("/", 1)[0]


def _mib(value: object, what: str) -> int:
    try:
        amount = parse_quantity(str(value))
    except QuantityError as err:
        raise PrepareError(f"{what}: {err}") from None
    return int(-(-amount // Fraction(2**20)))


def _share_of(results: Sequence[Mapping[str, Any]], gpus: tuple[int, ...],
              node: str) -> Assignment | None:
    """The sGPU share of a claim's shared results (consumedCapacity), one for all."""
    shares = set()
    for result in results:
        if not result.get("shareID"):
            continue
        consumed = result.get("consumedCapacity") or {}
        try:
            core = parse_quantity(str(consumed.get("vcore", "100")))
        except QuantityError as err:
            raise PrepareError(f"consumedCapacity.vcore: {err}") from None
        memory = _mib(consumed["vmemory"], "consumedCapacity.vmemory") \
            if "vmemory" in consumed else 0
        if core.denominator != 1:
            raise PrepareError(f"consumedCapacity.vcore: {core} is not a whole percent")
        shares.add((int(core), memory))
    if not shares:
        return None
    if len(shares) > 1:
        raise PrepareError("the shared devices of one claim must consume the same vcore and "
                           f"vmemory, got {sorted(shares)}")
    percent, memory = shares.pop()
    return Assignment(node, gpus, ShareRequest(MODE_SGPU, len(gpus), percent, memory))


class Driver:
    """Prepares and unprepares claims for the devices of one node's pool."""

    def __init__(
        self,
        devices: DeviceSet,
        pool: PoolOptions,
        node: str,
        claims: ClaimSource,
        checkpoint: Checkpoint,
        cdi_dir: str = DEFAULT_CDI_DIR,
        *,
        metrics: PrepareMetrics | None = None,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.devices = devices
        self.pool = pool
        self.node = node
        self.claims = claims
        self.checkpoint = checkpoint
        self.cdi_dir = cdi_dir
        self.metrics = metrics
        self.on_change = on_change
        self.index: dict[str, DraDevice] = device_index(devices.inventory, pool)
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        if metrics is not None:
            metrics.set_prepared(len(checkpoint.claims()))

    def _lock(self, uid: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(uid, threading.Lock())

    # -- the kubelet's calls ------------------------------------------------------------
    def prepare(self, refs: list[ClaimRef]) -> dict[str, PrepareResult]:
        out: dict[str, PrepareResult] = {}
        for ref in refs:
            started = time.monotonic()
            try:
                with self._lock(ref.uid):
                    out[ref.uid] = PrepareResult(devices=self._prepare(ref))
                ok = True
            except GpuK8sError as err:
                log.warning("NodePrepareResources failed",
                            extra={"claim": f"{ref.namespace}/{ref.name}", "error": str(err)})
                out[ref.uid] = PrepareResult(error=str(err))
                ok = False
            if self.metrics is not None:
                self.metrics.observe_prepare(time.monotonic() - started, ok)
        return out

    def unprepare(self, refs: list[ClaimRef]) -> dict[str, str]:
        out: dict[str, str] = {}
        changed = False
        for ref in refs:
            try:
                with self._lock(ref.uid):
                    gone = self.checkpoint.remove(ref.uid)
                    remove(gone.cdi_spec if gone else spec_path(self.cdi_dir, ref.uid))
                out[ref.uid] = ""
                changed = changed or gone is not None
                log.info("claim unprepared", extra={"claim": f"{ref.namespace}/{ref.name}",
                                                    "known": gone is not None})
            except (GpuK8sError, OSError) as err:
                out[ref.uid] = f"unprepare {ref.namespace}/{ref.name}: {err}"
        if changed:
            self._changed()
        return out

    def _changed(self) -> None:
        if self.metrics is not None:
            self.metrics.set_prepared(len(self.checkpoint.claims()))
        if self.on_change is not None:
            self.on_change()

    # -- one claim -----------------------------------------------------------------------
    def _prepare(self, ref: ClaimRef) -> list[PreparedDevice]:
        known = self.checkpoint.get(ref.uid)
        if known is not None:
            return list(known.devices)
        claim = self.claims.get(ref.namespace, ref.name)
        uid = (claim.get("metadata") or {}).get("uid")
        if uid != ref.uid:
            raise PrepareError(f"resourceclaim {ref.namespace}/{ref.name} has UID {uid}, "
                               f"the kubelet asked for {ref.uid} (deleted and recreated?)")
        allocation = (claim.get("status") or {}).get("allocation")
        if not allocation:
            raise PrepareError(f"resourceclaim {ref.namespace}/{ref.name} is not allocated")
        results = [r for r in (allocation.get("devices") or {}).get("results") or []
                   if r.get("driver") == DRIVER and r.get("pool") == self.node]
        if not results:
            raise PrepareError(f"resourceclaim {ref.namespace}/{ref.name} has no device of "
                               f"driver {DRIVER} in pool {self.node}")
        chosen: list[tuple[Mapping[str, Any], DraDevice]] = []
        for result in results:
            name = str(result.get("device"))
            device = self.index.get(name)
            if device is None:
                raise PrepareError(f"device {name!r} of pool {self.node} cannot be prepared: "
                                   f"{missing_device_reason(name)}")
            self._check_health(device)
            chosen.append((result, device))
        self._check_not_held(ref, [d for _, d in chosen])
        units = self.devices.in_host_order([u for _, d in chosen for u in d.units])
        gpus = tuple(sorted({u.gpu for u in units}))
        env = self.devices.device_env(units)
        try:
            share = _share_of([r for r, _ in chosen], gpus, self.node)
            if share is not None:
                env.update(share_env(share))
        except SharingError as err:
            raise PrepareError(str(err)) from None
        names = [(f"{ref.uid}-{i}-{d.name}", d.units) for i, (_, d) in enumerate(chosen)]
        path = self._write_spec(ref, names, env)
        prepared = tuple(
            PreparedDevice(
                requests=tuple(dict.fromkeys([str(r.get("request", "")),
                                              _base_request(str(r.get("request", "")))])),
                pool=self.node, device=d.name, cdi_ids=(qualified(CDI_KIND, name),),
                share_id=r.get("shareID"),
            )
            for (r, d), (name, _) in zip(chosen, names, strict=True)
        )
        try:
            ids = tuple(self.devices.inventory.gpu(g).stable_id for g in gpus)
            self.checkpoint.put(ref.uid, PreparedClaim(ref.namespace, ref.name, prepared, gpus,
                                                       path, ids=ids))
        except GpuK8sError:
            remove(path)
            raise
        log.info("claim prepared", extra={"claim": f"{ref.namespace}/{ref.name}",
                                          "devices": [d.device for d in prepared]})
        self._changed()
        return list(prepared)

    def _check_health(self, device: DraDevice) -> None:
        for unit in device.units:
            reason = self.devices.reason(unit.id)
            if reason is not None:
                raise PrepareError(f"device {device.name} is unhealthy: {reason}")

    def _check_not_held(self, ref: ClaimRef, devices: Sequence[DraDevice]) -> None:
        """Refuse a device whose GPU, VF or group member another prepared claim holds
        (sGPU shares of one GPU may be held by many claims)."""
        wanted = {u.id: d for d in devices if not d.shared for u in d.units}
        now = self.devices.inventory.index_by_id()
        for uid, other in self.checkpoint.claims().items():
            if uid == ref.uid:
                continue
            for prepared in other.devices:
                held, shared = self._held_units(other, prepared, now)
                if shared:
                    continue
                clash = next((wanted[u] for u in held if u in wanted), None)
                if clash is not None:
                    raise PrepareError(
                        f"device {clash.name} of claim {ref.namespace}/{ref.name} (UID "
                        f"{ref.uid}) is already prepared for claim {other.namespace}/"
                        f"{other.name} (UID {uid}, device {prepared.device}) on this node; "
                        "it is prepared once that claim is unprepared")

    def _held_units(self, claim: PreparedClaim, prepared: PreparedDevice,
                    now: Mapping[str, int]) -> tuple[set[str], bool]:
        """(unit ids, sGPU share?) of a device a prepared claim holds: the pool's device of
        that name; for an index-built name of an earlier release (``gpu-3``), the units of
        the GPUs the claim names by stable id, at their indexes now. A device of neither
        kind (its card left the bus) holds nothing here."""
        device = self.index.get(prepared.device)
        if device is not None:
            return {u.id for u in device.units}, device.shared
        legacy = legacy_device_gpus(prepared.device)
        if legacy is None:
            return set(), False
        recorded, vf = legacy
        gpus = set(claim.indexes_of(recorded, now))
        return ({u.id for u in self.devices.units
                 if u.gpu in gpus and (vf is None or u.vf == vf)},
                prepared.share_id is not None)

    def _write_spec(self, ref: ClaimRef, names: list[tuple[str, tuple[Unit, ...]]],
                    env: dict[str, str]) -> str:
        opts = self.devices.options
        spec = build_claim_spec(
            self.devices.inventory, CDI_KIND, names, env, opts.device_path_prefix,
            self.devices.sdk_source(),
            annotations={f"{DRIVER}/claim": f"{ref.namespace}/{ref.name}"},
        )
        parse_spec(spec, f"CDI spec of claim {ref.namespace}/{ref.name}")
        path = spec_path(self.cdi_dir, ref.uid)
        try:
            write_json(path, spec)
        except HostFileError as err:
            raise PrepareError(str(err)) from err
        return path

    def busy_gpus(self) -> set[int]:
        """GPUs held by prepared claims, at their indexes in this plugin's discovery
        (a claim prepared before a GPU left the bus names its GPUs by stable id)."""
        now = self.devices.inventory.index_by_id()
        return {g for claim in self.checkpoint.claims().values() for g in claim.current(now)}
