"""The nodes each pod passed in gpu-aware's filter, for the bind verb to check.

kube-scheduler binds a pod only on a node its filter calls kept; ``bind`` refuses any
other (a 4xx, nothing booked), so a client that can reach gpu-aware cannot bind pods
where they were never placed. Per pod UID the latest filter answer is kept for
``FILTER_TTL_S`` (longer than a scheduling cycle with Permit waits); the memory is
bounded by ``MAX_PODS`` pods and ``MAX_NAMES`` node names in all (oldest dropped
first). The list of kept names the answer was built from is kept as it is -- no copy,
no hashing: recording costs a filter nothing, whatever the node count -- and ``bind``
looks its node up in it once (a C-level scan of at most a few thousand names).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from json.encoder import encode_basestring_ascii

FILTER_TTL_S = 600.0
MAX_PODS = 20_000
MAX_NAMES = 500_000  # 4 MB of references (the names themselves are mostly the index's)


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
        # uid -> (when, names are JSON-encoded, the kept names)
        self._kept: OrderedDict[str, tuple[float, bool, Sequence[str]]] = OrderedDict()
        self._names = 0
        self._lock = threading.Lock()

    def record(self, uid: str, kept: Sequence[str], encoded: bool = False) -> None:
        """The nodes a filter answer kept for ``uid`` (``encoded``: as JSON strings,
        quotes included, as the node cache's fast path has them); ``kept`` is kept as
        it is: the caller does not change it afterwards."""
        if not uid:
            return  # no UID, no binding either (bind requires it)
        now = self._clock()
        with self._lock:
            old = self._kept.pop(uid, None)
            if old is not None:
                self._names -= len(old[2])
            self._kept[uid] = (now, encoded, kept)
            self._names += len(kept)
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
        _, encoded, names = entry
        return (encode_basestring_ascii(node) if encoded else node) in names

    def __len__(self) -> int:
        return len(self._kept)
