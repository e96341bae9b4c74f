"""Who gets a connection on gpu-aware's main port: the accept rate per client address.

A client that connects and closes in a loop (or a few hundred that connect and never
finish their handshake) must not cost kube-scheduler its answers. Each address has a
token bucket of new connections (``rate`` a second, ``burst`` at once); a connection
beyond it is closed at once, before any thread, handshake or read, so a reconnect storm
costs the server one accept and one close per attempt and is served at ``rate``, not at
full speed. The buckets of at most ``tracked`` addresses are kept (the least recently
seen is forgotten first: memory is bounded whatever the number of addresses; a
forgotten address starts again with a full bucket).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

DEFAULT_ACCEPT_RATE = 20.0  # new connections a second per address (kube-scheduler: a few)
DEFAULT_ACCEPT_BURST = 40.0
TRACKED_ADDRESSES = 4096


class AcceptRate:
    """Token buckets of new connections per client address. Called from the accept
    loop alone (one thread): no lock."""

    def __init__(
        self,
        clock: Callable[[], float],
        rate: float = DEFAULT_ACCEPT_RATE,
        burst: float = DEFAULT_ACCEPT_BURST,
        tracked: int = TRACKED_ADDRESSES,
    ) -> None:
        self.rate = rate
        self.burst = burst
        self.tracked = tracked
        self._clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # (tokens, at)

    def allow(self, client: str) -> bool:
        """Take one token of ``client``'s bucket; False when it is empty."""
        now = self._clock()
        tokens, at = self._buckets.pop(client, (self.burst, now))
        tokens = min(self.burst, tokens + (now - at) * self.rate)
        allowed = tokens >= 1.0
        self._buckets[client] = (tokens - 1.0 if allowed else tokens, now)
        if len(self._buckets) > self.tracked:
            self._buckets.popitem(last=False)
        return allowed

    def __len__(self) -> int:
        return len(self._buckets)
