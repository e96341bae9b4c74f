"""A background loop that runs one pass every ``interval`` seconds, sooner when nudged.

gpu-device's node annotations and gpu-dra's ResourceSlices are both kept this way: a
change (health, an allocation) asks for a pass now or in a moment, and a periodic pass
repairs whatever was missed. A pass that raises is logged and the loop goes on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("gpuk8s.node.loop")


class NudgedLoop:
    def __init__(self, one_pass: Callable[[], object], interval: float, name: str) -> None:
        self.one_pass = one_pass
        self.interval = interval
        self.name = name
        self._due = 0.0
        self._due_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def nudge(self, delay: float = 0.0) -> None:
        """Ask for a pass in ``delay`` seconds (earlier requests win)."""
        due = time.monotonic() + delay
        with self._due_lock:
            self._due = min(self._due, due)
        self._wake.set()

    def run(self, stop: threading.Event) -> None:
        with self._due_lock:
            self._due = time.monotonic()
        while not stop.is_set():
            now = time.monotonic()
            with self._due_lock:
                due = now >= self._due
                if due:
                    self._due = now + self.interval
            if due:
                try:
                    self.one_pass()
                except Exception:  # never let a bug stop the loop; log and retry
                    log.exception("pass failed", extra={"loop": self.name})
                continue
            self._wake.wait(max(0.0, self._due - now))
            self._wake.clear()

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, args=(self._stop,), name=self.name,
                                        daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()
