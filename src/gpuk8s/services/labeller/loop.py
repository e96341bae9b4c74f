"""The labeller's control loop: periodic and on-demand passes, backoff on API errors."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import select
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ...core.errors import GpuK8sError
from ..kube import PermanentApiError, TemporaryApiError
from .reconcile import ReconcileResult

log = logging.getLogger("gpuk8s.labeller")


@dataclass
class Backoff:
    """Exponential backoff with "equal jitter": the n-th delay is uniform in
    [d/2, d] with d = min(cap, base·2^n), so retries spread out but never hit 0."""

    base: float = 1.0
    cap: float = 60.0
    rng: random.Random = field(default_factory=random.Random)
    attempt: int = 0

    def next_delay(self) -> float:
        ceiling = float(min(self.cap, self.base * 2.0 ** min(self.attempt, 30)))
        self.attempt += 1
        return ceiling / 2 + self.rng.uniform(0, ceiling / 2)

    def reset(self) -> None:
        self.attempt = 0


@dataclass
class LoopStatus:
    """What /healthz reports: the loop is alive if it finished a pass attempt recently."""

    last_attempt: float = field(default_factory=time.monotonic)
    last_success: float | None = None
    last_error: str | None = None
    passes: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, error: str | None) -> None:
        with self.lock:
            now = time.monotonic()
            self.last_attempt = now
            self.passes += 1
            self.last_error = error
            if error is None:
                self.last_success = now


class LabellerLoop:
    """Runs ``one_pass`` every ``interval`` seconds, at once after ``wake()`` (SIGHUP),
    sooner (with backoff) after a temporary API error, until ``stop()``.

    ``wake`` and ``stop`` only write a byte to a pipe the loop sleeps on: no lock is
    taken, so they are safe to call from a signal handler interrupting the loop itself.
    """

    def __init__(
        self,
        one_pass: Callable[[], ReconcileResult],
        interval: float,
        backoff: Backoff | None = None,
        status: LoopStatus | None = None,
    ) -> None:
        self.one_pass = one_pass
        self.interval = interval
        self.backoff = backoff or Backoff(cap=max(1.0, min(60.0, interval)))
        self.status = status or LoopStatus()
        self._stopped = False
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)

    def _poke(self) -> None:
        fd = self._write_fd
        if fd < 0:
            return  # closed
        # a full pipe means a wake-up is pending anyway
        with contextlib.suppress(BlockingIOError):
            os.write(fd, b"!")

    def wake(self) -> None:
        self._poke()

    def stop(self) -> None:
        self._stopped = True
        self._poke()

    @property
    def wakeup_fd(self) -> int:
        """For ``signal.set_wakeup_fd``: a signal received by any thread wakes the loop
        (Python runs handlers in the main thread only once it stops sleeping)."""
        return self._write_fd

    @property
    def stopped(self) -> bool:
        return self._stopped

    def _sleep(self, delay: float) -> None:
        """Wait ``delay`` seconds or until poked; swallow pending pokes."""
        readable, _, _ = select.select([self._read_fd], [], [], delay)
        if readable:
            os.read(self._read_fd, 4096)

    def close(self) -> None:
        """Release the wake-up pipe (after ``run`` returned and handlers are gone)."""
        fds, self._read_fd, self._write_fd = (self._read_fd, self._write_fd), -1, -1
        for fd in fds:
            if fd >= 0:
                os.close(fd)

    def step(self) -> float:
        """One pass; returns how long to wait before the next."""
        try:
            result = self.one_pass()
        except TemporaryApiError as err:
            delay = self.backoff.next_delay()
            log.warning(
                "temporary API error, retrying",
                extra={"error": str(err), "retry_in_s": round(delay, 2)},
            )
            self.status.record(str(err))
            return delay
        except (PermanentApiError, GpuK8sError) as err:
            # Retrying fast will not help; try again at the normal pace (RBAC may get fixed).
            self.backoff.reset()
            log.error("label pass failed", extra={"error": str(err), "retry_in_s": self.interval})
            self.status.record(str(err))
            return self.interval
        self.backoff.reset()
        self.status.record(None)
        if result.changed:
            log.info("labels updated", extra={"node": result.node, "changes": result.changes})
        else:
            log.debug("labels up to date", extra={"node": result.node})
        for problem in result.problems:
            log.warning("discovery problem", extra={"problem": problem})
        return self.interval

    def run(self) -> None:
        """Loop until ``stop()``."""
        while not self._stopped:
            delay = self.step()
            if not self._stopped:
                self._sleep(delay)
