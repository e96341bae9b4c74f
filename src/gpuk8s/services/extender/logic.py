"""gpu-aware's decisions, independent of HTTP: filter and prioritize.

``Extender.handle(verb, body)`` is the whole protocol surface (bytes in, status and
bytes out); the HTTP server only moves bytes. Every failure that is the caller's
fault is a 400 with ``{"Error": ...}``; anything else is a 500 with a short message
(the traceback goes to the log, never to the caller).
"""

from __future__ import annotations

import collections
import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import filterfalse
from json.encoder import encode_basestring_ascii
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ...core.schedconf import NOGPU_VERB
from .cuda import NodeCudaVersions, refusals
from .demand import PodDemands
from .filtered import FilterMemory
from .nodes import (
    BoundPods,
    NodeCache,
    NodeState,
    Promises,
    StateMemo,
    json_member,
    short_reason,
    unresolvable_reason,
)
from .packing import (
    MISSING,
    NodeRooms,
    Ranker,
    RunningPods,
    rank_map,
    rank_scores,
)
from .share import Sharing
from .weights import Weights, WeightSource
from .wire import (
    MAX_EXTENDER_PRIORITY,
    BadRequest,
    BindArgs,
    ExtenderArgs,
    error_body,
    node_raws,
    parse_args,
    parse_bind,
)

log = logging.getLogger("gpuk8s.extender")

NOT_CACHED = "gpu-aware: node not in the extender's node cache yet"
CHANGED = "gpu-aware: node changed while the request was answered"
DUPLICATE = "gpu-aware: node offered {count} times in one request; it must appear once"
_SCORE_TAIL = [f"{s}}}" for s in range(MAX_EXTENDER_PRIORITY + 1)]
MAX_ENCODED_NAMES = 100_000  # bound on the per-name encoding cache
FILTER_VERBS = frozenset({"filter", "predicates"})
PRIORITIZE_VERBS = frozenset({"prioritize", "priorities"})
# the verb of the second, prioritize-only extender entry that sees every pod
# (``core.schedconf.NOGPU_VERB``): gpu-aware ranks the pods without GPUs there
NOGPU_VERBS = frozenset({NOGPU_VERB})
BIND_VERBS = frozenset({"bind"})
_encode = json.JSONEncoder(separators=(",", ":")).encode  # compact, ensure_ascii: as json.dumps


class ExtenderMetrics:
    """Prometheus metrics on a private registry (served at /metrics)."""

    def __init__(
        self,
        cache: NodeCache | None,
        pods: BoundPods | None,
        weights: WeightSource,
        sharing: Sharing | None = None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "gpu_aware_requests",
            "Extender requests by verb and HTTP status",
            ["verb", "code"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "gpu_aware_request_seconds",
            "Time to answer a request (after the body is read)",
            ["verb"],
            registry=self.registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
        )
        self.rejected = Counter(
            "gpu_aware_filtered_nodes",
            "Nodes removed by filter, by kind of rejection",
            ["kind"],
            registry=self.registry,
        )
        cached = Gauge("gpu_aware_cached_nodes", "Nodes in the node cache", registry=self.registry)
        cached.set_function(lambda: float(len(cache)) if cache is not None else 0.0)
        unusable = Gauge(
            "gpu_aware_unusable_nodes",
            "Cached nodes whose GPU annotations are unusable (filter excludes them)",
            registry=self.registry,
        )
        unusable.set_function(lambda: float(cache.broken) if cache is not None else 0.0)
        unreadable = Gauge(
            "gpu_aware_skipped_node_objects",
            "Node objects the node watch could not read and skipped, since start",
            registry=self.registry,
        )
        unreadable.set_function(lambda: float(cache.unreadable) if cache is not None else 0.0)
        tracked = Gauge(
            "gpu_aware_bound_gpu_pods",
            "Bound, unfinished GPU pods being tracked",
            registry=self.registry,
        )
        tracked.set_function(lambda: float(len(pods)) if pods is not None else 0.0)
        reloads = Gauge(
            "gpu_aware_config_reloads", "Weight reloads from the ConfigMap", registry=self.registry
        )
        reloads.set_function(lambda: float(weights.reloads))
        errors = Gauge(
            "gpu_aware_config_errors", "Rejected ConfigMap edits", registry=self.registry
        )
        errors.set_function(lambda: float(weights.errors))
        score = Gauge("gpu_aware_score_weight", "Current scoreWeight", registry=self.registry)
        score.set_function(lambda: weights.current().score)
        loss = Gauge("gpu_aware_loss_weight", "Current lossWeight", registry=self.registry)
        loss.set_function(lambda: weights.current().loss)
        shared = Gauge(
            "gpu_aware_shared_gpu_pods",
            "Pods holding shared GPUs (assignments in the sharing ledger)",
            registry=self.registry,
        )
        shared.set_function(lambda: float(len(sharing.ledger)) if sharing is not None else 0.0)
        binds = Gauge(
            "gpu_aware_shared_binds",
            "Shared-GPU pods bound by the bind verb since start",
            registry=self.registry,
        )
        binds.set_function(lambda: float(sharing.binds) if sharing is not None else 0.0)
        waits = Gauge(
            "gpu_aware_shared_bind_waits",
            "Shared-GPU bindings refused after waiting for another pod of the same node, "
            "mode and number of device ids to be allocated (kube-scheduler retries them)",
            registry=self.registry,
        )
        waits.set_function(lambda: float(sharing.bind_waits) if sharing is not None else 0.0)


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()


def _encoded(cache: dict[str, Any], names: list[str], make: Callable[[str], Any]) -> list[Any]:
    """``[cache[n] for n in names]`` at C speed, filling misses with ``make(n)``."""
    try:
        return list(map(cache.__getitem__, names))
    except KeyError:
        if len(cache) > MAX_ENCODED_NAMES:
            cache.clear()  # bounded: node names come and go
        for name in names:
            if name not in cache:
                cache[name] = make(name)
        return list(map(cache.__getitem__, names))


def _host_head(name: str) -> str:
    return ',{"Host":' + encode_basestring_ascii(name) + ',"Score":'


def _priority_list(heads: list[str], tails: list[str]) -> bytes:
    """``[{"Host":..,"Score":s},...]`` from the per-name heads (``_host_head``, each
    with its leading comma) and the per-name ``s}`` tails: one join, no per-entry
    concatenation."""
    if not heads:
        return b"[]"
    parts = [""] * (2 * len(heads))
    parts[0::2] = heads
    parts[1::2] = tails
    parts[0] = parts[0][1:]  # no comma before the first entry
    return ("[" + "".join(parts) + "]").encode()


def _priority_answer(heads: list[str], raw: list[float], min_score: int = 0) -> bytes:
    """The HostPriorityList for the names of ``heads`` (``_host_head``) and their raw
    priorities, scored by ``packing.rank_map``; nodes scoring below ``min_score`` are
    left out (the scheduler counts a node it is not given as 0)."""
    ranks = rank_map(raw)
    tail = {value: _SCORE_TAIL[score] for value, score in ranks.items()}
    if min_score > 0:
        low = {value for value, score in ranks.items() if score < min_score}
        if low:
            kept = [
                (head, value) for head, value in zip(heads, raw, strict=True) if value not in low
            ]
            heads = [head for head, _ in kept]
            raw = [value for _, value in kept]
    return _priority_list(heads, list(map(tail.__getitem__, raw)))


def _members(members: list[str]) -> dict[str, str]:
    """Pre-encoded ``"name":"reason"`` members back to a dict."""
    result: dict[str, str] = json.loads("{" + ",".join(members) + "}")
    return result


class Extender:
    """Filter and prioritize over either full nodes (request) or the node cache."""

    def __init__(
        self,
        weights: WeightSource,
        cache: NodeCache | None = None,
        pods: BoundPods | None = None,
        clock: Callable[[], float] = time.perf_counter,
        rooms: NodeRooms | None = None,
        running: RunningPods | None = None,
        cuda: NodeCudaVersions | None = None,
        sharing: Sharing | None = None,
        min_score: int = 0,
    ) -> None:
        self.weights = weights
        # prioritize leaves out the nodes scoring below this (--prioritize-min-score)
        self.min_score = min_score
        self.cuda = cuda if cuda is not None else NodeCudaVersions()  # labels (node watch)
        # GPU sharing (core.sharing): None when off (no pod watch, no API access)
        self.sharing = sharing
        self.cache = cache
        self.pods = pods
        # prioritize: the nodes' rooms (node watch with the cache, else the request's
        # Node objects) and the running pods (pod watch; None: CPU, memory and the mix
        # beyond the prior are unknown)
        self.rooms = rooms if rooms is not None else NodeRooms()
        self.running = running
        self.ranker = Ranker(self.rooms, running)
        self.memo = StateMemo()
        self.promises = Promises(cache, pods) if cache is not None and pods is not None else None
        self._host_heads: dict[str, str] = {}  # name -> '{"Host":"name","Score":'
        self.metrics = ExtenderMetrics(cache, pods, weights, sharing)
        self._clock = clock
        # the nodes each pod passed in filter: bind checks its node is one of them
        self.filtered = FilterMemory()
        # each pod version's demand, parsed once for its filter and prioritize
        self.demands = PodDemands()

    # -- candidates -------------------------------------------------------------
    def _synced_cache(self) -> NodeCache:
        """The node cache, for a request that gives NodeNames; BadRequest without one,
        _NotReady before its first sync."""
        cache = self.cache
        if cache is None:
            raise BadRequest(
                "NodeNames given (nodeCacheCapable: true) but this extender runs without "
                "--node-cache; start it with --node-cache or set nodeCacheCapable: false"
            )
        if not cache.synced:
            raise _NotReady("node cache not synced with the API server yet")
        return cache

    def _candidates(self, args: ExtenderArgs) -> tuple[list[str], Iterable[NodeState | None]]:
        """Names and states (None: not in the cache) of the candidates, request order."""
        if args.nodes is not None:
            return [n.name for n in args.nodes], list(map(self.memo.get_item, args.nodes))
        assert args.node_names is not None
        names = args.node_names
        return names, map(self._synced_cache().snapshot().get, names)  # lazy, C-level

    def _sharing_names(self, args: ExtenderArgs) -> tuple[Sharing, list[str]]:
        """The sharing decider and the candidates (full nodes are observed first)."""
        if self.sharing is None:
            raise _NotReady(
                "GPU sharing is off in this extender (it needs the pod watch and API "
                "access; start it without --no-pod-watch)"
            )
        if not self.sharing.ledger.synced:
            raise _NotReady("GPU sharing accounting not synced with the API server yet")
        if args.nodes is not None:
            for item in args.nodes:
                self.sharing.nodes.observe(item)
        else:
            self._synced_cache()
        return self.sharing, args.names()

    # -- filter: the checks, as passes over one verdict set ----------------------
    def _promise_check(
        self, name: str, state: NodeState, need: int, requested: dict[str, int]
    ) -> str | None:
        """The FailedNodes reason when promised GPUs leave too few free, else None."""
        promised = requested.get(name, 0) - state.allocated
        if promised > 0 and state.free - promised < need:
            return short_reason(state, need, promised)
        return None

    def _capacity(
        self, names: list[str], states: Iterable[NodeState | None], need: int
    ) -> Verdicts:
        """Duplicates, then capacity and promised GPUs, one loop over (name, state)."""
        verdicts = Verdicts([])
        failed, unresolvable, keep = verdicts.failed, verdicts.unresolvable, verdicts.keep
        requested = self.pods.per_node() if self.pods is not None else {}
        repeated = _repeated(names)
        for name, state in zip(names, states, strict=True):
            if repeated and name in repeated:
                unresolvable[name] = DUPLICATE.format(count=repeated[name])
                continue
            if state is None:
                failed[name] = NOT_CACHED
                continue
            reason = unresolvable_reason(state, need)
            if reason is not None:
                unresolvable[name] = reason
            elif state.free < need:
                failed[name] = short_reason(state, need)
            elif (why := self._promise_check(name, state, need, requested)) is not None:
                failed[name] = why
            else:
                keep.append(name)
        return verdicts

    def _filter_states(
        self, args: ExtenderArgs, need: int
    ) -> tuple[list[str], dict[str, str], dict[str, str]]:
        """``_capacity`` over the request's candidates, as a tuple."""
        return self._capacity(*self._candidates(args), need).parts()

    def _filter_cached(
        self, names: list[str], need: int
    ) -> tuple[list[str], dict[str, str], dict[str, str]]:
        """``_cached_parts`` with the rejections as dicts; ``_capacity`` over the cache
        when a node event moved a node while it read."""
        parts = self._cached_parts(names, need)
        if parts is None:
            assert self.cache is not None
            return self._capacity(names, map(self.cache.snapshot().get, names), need).parts()
        keep, failed, unresolvable = parts
        kept: list[str] = json.loads("[" + ",".join(keep) + "]")
        return kept, _members(failed), _members(unresolvable)

    def _whole(self, args: ExtenderArgs) -> Verdicts:
        """The verdicts for a pod asking for whole GPUs (or none: every node kept)."""
        need = args.gpus
        if need == 0:
            return Verdicts(args.names())
        if args.nodes is None and self.cache is not None and self.cache.synced:
            return Verdicts(*self._filter_cached(args.node_names or [], need))
        return Verdicts(*self._filter_states(args, need))

    def _shared(self, args: ExtenderArgs) -> Verdicts:
        """The verdicts for a pod asking for shared GPUs (``Sharing.filter_parts``)."""
        demand = args.demand
        assert demand.share is not None
        sharing, names = self._sharing_names(args)
        since = sharing.requeue.generation
        verdicts = Verdicts(*sharing.filter_parts(demand.share, names, args.pod_uid,
                                                  demand.need))
        if not verdicts.keep and args.pod_uid:  # retried once a share is freed (requeue.py)
            sharing.requeue.turned_away(args.pod_uid, args.pod_namespace, args.pod_name, since)
        repeated = _repeated(names)
        verdicts.refuse(
            {name: DUPLICATE.format(count=count) for name, count in repeated.items()},
            unresolvable=True,
        )
        return verdicts

    def _verdicts(self, args: ExtenderArgs) -> Verdicts:
        """Every check, in order: duplicates, capacity and promised GPUs (or sharing),
        then the pod's CUDA runtime."""
        demand = args.demand
        verdicts = self._shared(args) if demand.share is not None else self._whole(args)
        if demand.cuda_runtime is not None:  # the pod states its CUDA runtime (cuda.py)
            verdicts.refuse(
                refusals(demand, verdicts.keep, self.cuda, args.nodes, args.pod_ref),
                unresolvable=True,
            )
        return verdicts

    def _fast_parts(self, args: ExtenderArgs) -> tuple[list[str], list[str], list[str]] | None:
        """The node cache's pre-encoded answer parts when they decide the whole answer
        (NodeNames, cache synced, no sharing, no CUDA runtime), else None."""
        demand = args.demand
        cache = self.cache
        if (args.nodes is not None or cache is None or not cache.synced
                or demand.share is not None or demand.cuda_runtime is not None):
            return None
        names = args.node_names or []
        if demand.gpus == 0:
            return list(map(encode_basestring_ascii, names)), [], []
        return self._cached_parts(names, demand.gpus)

    def _cached_parts(
        self, names: list[str], need: int
    ) -> tuple[list[str], list[str], list[str]] | None:
        """(kept names, FailedNodes members, FailedAndUnresolvableNodes members), all
        pre-encoded JSON (``"name"`` and ``"name":"reason"``); None when a node event
        moved a node while we read (the caller does it slowly).

        Dict-lookup passes over the names against the cache's NeedIndex (C-level), which
        holds every node's answer for this request size already encoded; Python-level
        work runs only for offered nodes outside "fits" when some are not in the
        index, and for nodes with promised GPUs."""
        assert self.cache is not None
        offered = set(names)
        if len(offered) != len(names):
            return None  # a name offered twice: the plain path explains it
        index = self.cache.need_index(need)
        fits = index.fits_json
        keep = list(filter(None, map(fits.get, names)))
        failed: list[str] = []
        unresolvable: list[str] = []
        if len(keep) != len(names):
            # usually few: the scheduler already dropped nodes short of GPUs by count
            rest = list(filterfalse(fits.__contains__, names))
            if len(rest) + len(keep) != len(names):
                return None  # a node moved in or out of "fits" between the passes
            unresolvable = list(filter(None, map(index.unresolvable_json.get, rest)))
            failed = list(filter(None, map(index.short_json.get, rest)))
            if len(unresolvable) + len(failed) != len(rest):
                # not cached, or moved between sets while we read them: one by one
                states = self.cache.snapshot()
                unresolvable, failed = [], []
                for name in rest:
                    if (member := index.unresolvable_json.get(name)) is not None:
                        unresolvable.append(member)
                    elif (member := index.short_json.get(name)) is not None:
                        failed.append(member)
                    elif name not in states:
                        failed.append(json_member(name, NOT_CACHED))
                    else:
                        return None
        if self.promises is not None and self.pods is not None:
            promised = self.promises.current()
            if promised:
                # the smaller side drives the pass (promises are usually few)
                if len(promised) < len(keep):
                    pending = [n for n in list(promised) if n in offered and n in fits]
                else:
                    pending = [n for n in names if n in promised and n in fits]
                if pending:
                    states = self.cache.snapshot()
                    requested = self.pods.per_node()
                    dropped: dict[str, str] = {}
                    for name in pending:
                        state = states.get(name)
                        if state is None:  # deleted meanwhile
                            return None
                        why = self._promise_check(name, state, need, requested)
                        if why is not None:
                            dropped[name] = why
                    if dropped:
                        failed += [json_member(name, why) for name, why in dropped.items()]
                        gone = {encode_basestring_ascii(name) for name in dropped}
                        keep = list(filterfalse(gone.__contains__, keep))
        return keep, failed, unresolvable

    # -- filter: the one encoder ---------------------------------------------------
    def filter_json(self, args: ExtenderArgs) -> bytes:
        """The filter answer, encoded: from the node cache's pre-encoded parts when they
        decide it, else from the checks' verdicts (``_verdicts``). The rejections are
        counted and the kept nodes recorded for the pod (``FilterMemory``: bind checks
        them) here, once."""
        parts = self._fast_parts(args)
        if parts is not None:
            keep, failed, unresolvable = parts
            encoded = True
        else:
            verdicts = self._verdicts(args)
            keep, failed, unresolvable = verdicts.keep, *verdicts.members()
            encoded = False
        if failed:
            self.metrics.rejected.labels("failed").inc(len(failed))
        if unresolvable:
            self.metrics.rejected.labels("unresolvable").inc(len(unresolvable))
        self.filtered.record(args.pod_uid, keep, encoded=encoded)
        return _filter_answer(args, keep, failed, unresolvable, encoded)

    def filter(self, args: ExtenderArgs) -> dict[str, Any]:
        """The filter answer as a dict (tools and tests; nothing counted or recorded)."""
        parts = self._fast_parts(args)
        if parts is not None:
            body = _filter_answer(args, *parts, encoded=True)
        else:
            verdicts = self._verdicts(args)
            body = _filter_answer(args, verdicts.keep, *verdicts.members())
        result: dict[str, Any] = json.loads(body)
        return result

    @staticmethod
    def _filter_result(
        args: ExtenderArgs, keep: list[str], failed: dict[str, str], unresolvable: dict[str, str]
    ) -> dict[str, Any]:
        """The answer for these verdicts as a dict (``_filter_answer``, decoded)."""
        result: dict[str, Any] = json.loads(
            _filter_answer(args, keep, *Verdicts(keep, failed, unresolvable).members())
        )
        return result

    # -- prioritize -----------------------------------------------------------
    def _raw(
        self, args: ExtenderArgs, nogpu: bool = False
    ) -> tuple[list[str], list[float] | None]:
        """(names, raw priorities, MISSING where no data) in request order; raw is None
        when every node scores 0. ``nogpu``: the ``NOGPU_VERB`` entry, which ranks only
        the pods asking for no GPUs (``Sharing.raw_nogpu``)."""
        demand = args.demand
        if nogpu:
            if demand.gpus or demand.share is not None or self.sharing is None:
                return args.names(), None
            sharing, names = self._sharing_names(args)
            return names, _missing(sharing.raw_nogpu(names, demand.need, args.pod_uid))
        if demand.share is not None:
            sharing, names = self._sharing_names(args)
            return names, _missing(
                sharing.raw(demand.share, names, args.pod_uid, demand.need)
            )
        names = args.names()
        if demand.gpus == 0:
            return names, None
        if args.nodes is not None:
            rooms = self.rooms
            for item in args.nodes:  # nodeCacheCapable: false -- the request has them
                rooms.observe_item(item)
        else:
            self._synced_cache()
        weights: Weights = self.weights.current()
        shape = (demand.gpus, demand.cpu_milli, demand.memory_mib)
        raw = self.ranker.raw((weights.score, weights.loss), shape, names)
        repeated = _repeated(names)
        if repeated:  # offered twice: filter excluded it, score 0
            raw = [MISSING if n in repeated else r for n, r in zip(names, raw, strict=True)]
        return names, raw

    def priorities(self, args: ExtenderArgs) -> tuple[list[str], list[int]]:
        """(names, scores 0..10) in request order."""
        names, raw = self._raw(args)
        return names, [0] * len(names) if raw is None else rank_scores(raw)

    def prioritize(self, args: ExtenderArgs, nogpu: bool = False) -> bytes:
        """The HostPriorityList, encoded by hand from cached pieces (no json.dumps)."""
        names, raw = self._raw(args, nogpu)
        if raw is None:  # every node scores 0: kube-scheduler counts a node not listed as
            return b"[]"  # 0, and decodes no list of every node (the second entry, GPU pods)
        # (a dict of whole '{"Host":..,"Score":s}' strings per name and score was
        # slower: the per-request memory touched matters more than the concatenation)
        heads = _encoded(self._host_heads, names, _host_head)
        return _priority_answer(heads, raw, self.min_score)

    # -- bind -----------------------------------------------------------------------
    def bind(self, args: BindArgs) -> tuple[int, str]:
        """(HTTP status, ExtenderBindingResult Error): a node this pod's latest filter
        (within ``FILTER_TTL_S``) did not keep is a 400 and nothing else happens; the
        rest is ``Sharing.bind``."""
        uid, node = args.PodUID, args.Node
        if not self.filtered.passed(uid, node):
            return 400, (
                f"gpu-aware: node {node[:100]!r} did not pass gpu-aware's filter for pod "
                f"{args.PodNamespace[:100]}/{args.PodName[:100]} (UID {uid[:60]}) in the last "
                f"{self.filtered.ttl:g} s: nothing bound"
            )
        if self.sharing is None:
            return 200, "gpu-aware: bind needs the pod watch and API access (GPU sharing off)"
        return self.sharing.bind(args.PodNamespace, args.PodName, uid, node)

    # -- protocol -------------------------------------------------------------
    def handle(self, verb: str, body: bytes) -> Response:
        """Answer one extender call; never raises."""
        started = self._clock()
        kind = (
            "filter"
            if verb in FILTER_VERBS
            else "prioritize"
            if verb in PRIORITIZE_VERBS or verb in NOGPU_VERBS
            else "bind"
            if verb in BIND_VERBS
            else "unknown"
        )
        try:
            if kind == "unknown":
                response = Response(
                    404,
                    error_body(
                        f"unknown verb {verb[:40]!r}; use filter (or predicates), prioritize, "
                        f"{NOGPU_VERB} or bind"
                    ),
                )
            elif kind == "bind":
                status, error = self.bind(parse_bind(body))
                response = Response(status, json.dumps({"Error": error}).encode())
            else:
                args = parse_args(body, self.demands)
                try:
                    data = (
                        self.filter_json(args)
                        if kind == "filter"
                        else self.prioritize(args, nogpu=verb in NOGPU_VERBS)
                    )
                    response = Response(200, data)
                except _NotReady as err:
                    if kind == "filter":
                        # the scheduler reports Error as this pod's scheduling failure, retries
                        response = Response(
                            200, _filter_answer(args, [], [], [], error=f"gpu-aware: {err}")
                        )
                    else:
                        response = Response(503, error_body(f"gpu-aware: {err}"))
        except BadRequest as err:
            response = Response(400, error_body(str(err)))
        except Exception as err:  # a bug: answer cleanly, keep the trace in our log
            log.exception("internal error answering %s", verb)
            response = Response(500, error_body(f"gpu-aware internal error: {type(err).__name__}"))
        self.metrics.requests.labels(kind, str(response.status)).inc()
        self.metrics.latency.labels(kind).observe(self._clock() - started)
        return response


@dataclass
class Verdicts:
    """One filter's verdict per candidate: kept (request order) or refused, with the
    reason, as ``FailedNodes`` (preemption may help) or ``FailedAndUnresolvableNodes``.
    Each check is a pass that refuses some of ``keep``."""

    keep: list[str]
    failed: dict[str, str] = field(default_factory=dict)
    unresolvable: dict[str, str] = field(default_factory=dict)

    def refuse(self, reasons: dict[str, str], unresolvable: bool) -> None:
        """Take the nodes of ``reasons`` out of ``keep``, with their reasons."""
        if reasons:
            (self.unresolvable if unresolvable else self.failed).update(reasons)
            self.keep = [name for name in self.keep if name not in reasons]

    def parts(self) -> tuple[list[str], dict[str, str], dict[str, str]]:
        return self.keep, self.failed, self.unresolvable

    def members(self) -> tuple[list[str], list[str]]:
        """The rejections as pre-encoded ``"name":"reason"`` members."""
        return (
            [json_member(name, why) for name, why in self.failed.items()],
            [json_member(name, why) for name, why in self.unresolvable.items()],
        )


def _filter_answer(
    args: ExtenderArgs,
    keep: list[str],
    failed: list[str],
    unresolvable: list[str],
    encoded: bool = False,
    error: str = "",
) -> bytes:
    """The one ExtenderFilterResult encoder. ``keep``: the kept names (JSON-encoded,
    quotes included, when ``encoded``); ``failed`` / ``unresolvable``: pre-encoded
    ``"name":"reason"`` members. With full nodes in the request (nodeCacheCapable:
    false) the kept Node objects go back as the request's own bytes, never
    re-encoded; ``error`` answers no nodes at all."""
    # one join over the parts: the echoed items are copied once (megabytes at 1,000 nodes)
    if error:
        nodes: tuple[bytes, ...] = (b'{"Nodes":null,"NodeNames":null',)
    elif args.nodes is not None:
        assert not encoded
        meta, raws = node_raws(args)
        kept = set(keep)
        items = [raw for node, raw in zip(args.nodes, raws, strict=True) if node.name in kept]
        nodes = (b'{"Nodes":{"metadata":', meta, b',"items":[', b",".join(items),
                 b']},"NodeNames":null')
    else:
        names = keep if encoded else list(map(encode_basestring_ascii, keep))
        nodes = (('{"Nodes":null,"NodeNames":[' + ",".join(names) + "]").encode(),)
    return b"".join(
        (
            *nodes,
            b',"FailedNodes":{',
            ",".join(failed).encode(),
            b'},"FailedAndUnresolvableNodes":{',
            ",".join(unresolvable).encode(),
            b'},"Error":',
            encode_basestring_ascii(error).encode(),
            b"}",
        )
    )


def _missing(values: list[float | None]) -> list[float]:
    """Raw priorities with None (no data) as ``MISSING``."""
    return [MISSING if v is None else v for v in values]


def _repeated(names: list[str]) -> dict[str, int]:
    """Names offered more than once -> how often (empty, at C speed, in the normal case)."""
    if len(set(names)) == len(names):
        return {}
    counts = collections.Counter(names)
    return {name: n for name, n in counts.items() if n > 1}


class _NotReady(Exception):
    """The extender cannot answer yet (node cache still syncing)."""
