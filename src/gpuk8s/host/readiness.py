"""Readiness markers of the operator scheme: ``<root>/run/metax/<key>`` (``true``/``false``).

The node agent that makes a thing ready writes its marker (driver-manager ``maca.ready``,
container-runtime ``runtime.ready``); gpu-label turns the markers into the node labels of
the same name (``core.labels.READINESS_KEYS``), which gate the next components. An absent
marker means "this scheme does not report it" and no label is published.
"""

from __future__ import annotations

import os

from ..core.errors import ConfigError
from ..core.labels import READINESS_KEYS
from ..discovery.tools import host_path
from .files import atomic_write, remove

STATUS_DIR = "/run/metax"


def marker_path(root: str, key: str, status_dir: str = STATUS_DIR) -> str:
    if key not in READINESS_KEYS:
        raise ConfigError(f"readiness key {key!r}: choose one of {', '.join(READINESS_KEYS)}")
    return os.path.join(host_path(root, status_dir), key)


def read_readiness(root: str, status_dir: str = STATUS_DIR) -> dict[str, bool]:
    """``{"maca.ready": True, ...}`` for every marker present under the root.

    A marker whose first word is ``true`` (any case) means ready; anything else (``false``,
    empty, unreadable) means not ready, so a half-written or broken marker never claims
    readiness.
    """
    states: dict[str, bool] = {}
    for key in READINESS_KEYS:
        path = marker_path(root, key, status_dir)
        if not os.path.lexists(path):
            continue
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                words = handle.read(256).split()
        except OSError:
            words = []
        states[key] = bool(words) and words[0].lower() == "true"
    return states


def write_readiness(root: str, key: str, ready: bool, status_dir: str = STATUS_DIR) -> bool:
    """Set a marker; True when its value changed."""
    path = marker_path(root, key, status_dir)
    if read_readiness(root, status_dir).get(key) is ready and os.path.exists(path):
        return False
    atomic_write(path, "true\n" if ready else "false\n")
    return True


def clear_readiness(root: str, key: str, status_dir: str = STATUS_DIR) -> bool:
    """Remove a marker (uninstall); True when one was there."""
    return remove(marker_path(root, key, status_dir))
