"""scoreWeight / lossWeight from the gpu-aware ConfigMap, reloaded without a restart.

The ConfigMap is mounted as a directory: one file per key (``scoreWeight``,
``lossWeight``). The kubelet updates such a mount by swapping a symlink, so the files'
(mtime, inode, size) change; ``WeightSource.current()`` looks at most once per
``poll_s`` seconds and re-reads only when that signature moved. A bad edit is logged
and the previous weights stay in force; a bad file at start is a ``ConfigError``.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ...core.errors import ConfigError

log = logging.getLogger("gpuk8s.extender")

KEYS = ("scoreWeight", "lossWeight")
# Only the ratio of the two weights matters; 1000 allows any useful ratio (1:1000) while
# keeping scoreWeight·score (score <= 100) far from float overflow and precision loss.
MAX_WEIGHT = 1000.0


@dataclass(frozen=True)
class Weights:
    score: float = 1.0
    loss: float = 1.0

    def __post_init__(self) -> None:
        for key, value in (("scoreWeight", self.score), ("lossWeight", self.loss)):
            if not math.isfinite(value) or not 0 <= value <= MAX_WEIGHT:
                raise ConfigError(f"{key}: {value!r} must be a number from 0 to {MAX_WEIGHT:g}")
        if self.score == 0 and self.loss == 0:
            raise ConfigError("scoreWeight, lossWeight: at least one must be > 0")


def parse_weight(text: str, key: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise ConfigError(
            f"{key}: {text.strip()[:40]!r} is not a number; write a number >= 0 such as 1 or 0.5"
        ) from None
    if not math.isfinite(value) or not 0 <= value <= MAX_WEIGHT:
        raise ConfigError(
            f"{key}: {text.strip()[:40]!r} must be a number from 0 to {MAX_WEIGHT:g} "
            "(only the ratio of scoreWeight to lossWeight matters)"
        )
    return value


Signature = tuple[tuple[int, int, int] | None, ...]


class WeightSource:
    """Current weights: defaults overridden by the files present in ``config_dir``."""

    def __init__(
        self,
        config_dir: str | None,
        defaults: Weights | None = None,
        poll_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config_dir = config_dir
        self.defaults = defaults or Weights()
        self.poll_s = poll_s
        self._clock = clock
        self._lock = threading.Lock()
        self._signature: Signature = ()
        self._checked = -math.inf
        self.reloads = 0
        self.errors = 0
        self.last_error: str | None = None
        self._weights = self.defaults
        if config_dir is not None:
            if not os.path.isdir(config_dir):
                raise ConfigError(f"--config-dir: {config_dir!r} is not a directory")
            self._signature = self._stat()
            self._weights = self._load()  # errors at start are fatal (ConfigError)
            self._checked = clock()

    def _stat(self) -> Signature:
        assert self.config_dir is not None
        out: list[tuple[int, int, int] | None] = []
        for key in KEYS:
            try:
                st = os.stat(os.path.join(self.config_dir, key))
            except OSError:
                out.append(None)
                continue
            out.append((st.st_mtime_ns, st.st_ino, st.st_size))
        return tuple(out)

    def _load(self) -> Weights:
        assert self.config_dir is not None
        values = {"scoreWeight": self.defaults.score, "lossWeight": self.defaults.loss}
        for key in KEYS:
            path = os.path.join(self.config_dir, key)
            try:
                with open(path, encoding="utf-8") as handle:
                    text = handle.read(4096)
            except FileNotFoundError:
                continue
            except OSError as err:
                raise ConfigError(f"{key}: cannot read {path}: {err}") from err
            values[key] = parse_weight(text, key)
        return Weights(score=values["scoreWeight"], loss=values["lossWeight"])

    def current(self) -> Weights:
        if self.config_dir is None:
            return self._weights
        now = self._clock()
        if now - self._checked < self.poll_s:
            return self._weights
        with self._lock:
            if now - self._checked < self.poll_s:
                return self._weights
            self._checked = now
            signature = self._stat()
            if signature != self._signature:
                self._signature = signature
                try:
                    weights = self._load()
                except ConfigError as err:
                    self.errors += 1
                    self.last_error = str(err)
                    log.error(
                        "gpu-aware config rejected, keeping previous weights",
                        extra={
                            "error": str(err),
                            "score_weight": self._weights.score,
                            "loss_weight": self._weights.loss,
                        },
                    )
                else:
                    self.reloads += 1
                    self.last_error = None
                    if weights != self._weights:
                        log.info(
                            "weights reloaded",
                            extra={"score_weight": weights.score, "loss_weight": weights.loss},
                        )
                    self._weights = weights
            return self._weights
