"""The nodes each pod passed in gpu-aware's filter, for the bind verb to check.

kube-scheduler binds a pod only on a node its filter calls kept; ``bind`` refuses any
other (a 4xx, nothing booked), so a client that can reach gpu-aware cannot bind pods
where they were never placed. Per pod UID the latest filter answer is kept for
``FILTER_TTL_S`` (longer than a scheduling cycle with Permit waits); the memory is
bounded by ``MAX_PODS`` pods and ``MAX_NAMES`` node names in all (oldest dropped
first), 8 bytes a name: names are kept as their hashes (``hash()`` is salted per
process, so nobody can pick a name that collides with a kept one).
"""

from __future__ import annotations

import threading
import time
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable
from json.encoder import encode_basestring_ascii

FILTER_TTL_S = 600.0
MAX_PODS = 20_000
MAX_NAMES = 2_000_000  # 16 MB of hashes


class FilterMemory:
    """Pod UID -> the nodes its latest filter answer kept."""

    def __init__(
        self,
        ttl: float = FILTER_TTL_S,
        max_pods: int = MAX_PODS,
        max_names: int = MAX_NAMES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl = ttl
        self.max_pods = max_pods
        self.max_names = max_names
        self._clock = clock
        # uid -> (when, names are JSON-encoded, hashes of the kept names)
        self._kept: OrderedDict[str, tuple[float, bool, array[int]]] = OrderedDict()
        self._names = 0
        self._lock = threading.Lock()

    def record(self, uid: str, kept: Iterable[str], encoded: bool = False) -> None:
        """The nodes a filter answer kept for ``uid`` (``encoded``: as JSON strings,
        quotes included, as the node cache's fast path has them)."""
        if not uid:
            return  # no UID, no binding either (bind requires it)
        hashes = array("q", map(hash, kept))
        now = self._clock()
        with self._lock:
            old = self._kept.pop(uid, None)
            if old is not None:
                self._names -= len(old[2])
            self._kept[uid] = (now, encoded, hashes)
            self._names += len(hashes)
            while self._kept and (
                len(self._kept) > self.max_pods
                or self._names > self.max_names
                or next(iter(self._kept.values()))[0] < now - self.ttl
            ):
                _, (_, _, gone) = self._kept.popitem(last=False)
                self._names -= len(gone)

    def passed(self, uid: str, node: str) -> bool:
        """Whether ``node`` passed the latest filter of ``uid`` within the TTL."""
        with self._lock:
            entry = self._kept.get(uid)
        if entry is None or entry[0] < self._clock() - self.ttl:
            return False
        _, encoded, hashes = entry
        return hash(encode_basestring_ascii(node) if encoded else node) in hashes

    def __len__(self) -> int:
        return len(self._kept)
