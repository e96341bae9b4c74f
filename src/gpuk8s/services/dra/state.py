"""gpu-dra's checkpoint: the claims it prepared, where a restarted plugin finds them.

One JSON file in the plugin's data directory (``/var/lib/kubelet/plugins/<driver>/``, a
host path that outlives the pod), rewritten atomically (temp file + rename) after every
change, before the kubelet is answered: a plugin that dies half-way either has the claim
recorded with its CDI spec written, or not at all (and the kubelet asks again).

Versions, and reading across one release (an upgrade, or a rollback, of gpu-dra must not
forget the claims prepared on the node)::

    {"format": 1, "version": 3, "claims": {"<claim uid>": {"namespace": ..., "name": ...,
     "devices": [...], "gpus": [...], "ids": [...], "cdiSpec": ...}}}

* ``gpus`` are the GPUs' indexes when the claim was prepared; ``ids`` (version 3) their
  stable ids (UUID, else PCI address: ``core.model.stable_gpu_id``), which a plugin
  restarted after a GPU left the bus (discovery renumbers the GPUs above it) maps to
  the indexes of its own discovery. A claim without ``ids`` (versions 1 and 2) is read
  by its indexes as written.
* ``devices[].device`` is the device name the claim was allocated under: built from the
  card's PCI address (``core.dra.gpu_device_name``), or, for a claim prepared by a release
  before those names, from indexes (``gpu-3``: ``core.dra.legacy_device_gpus``), which
  the driver maps to cards through the claim's ``ids``.

* ``version`` is the release of this file's layout that wrote it (``VERSION``; absent:
  1, the first release). ``format`` is the oldest version that can read the file.
* Within one ``format`` changes are additive only: a release may add keys to the file or
  to a claim, never rename, drop or reinterpret one. A reader ignores keys it does not
  know and writes a claim's unknown keys back unchanged, so a rollback followed by an
  upgrade loses nothing.
* Version N reads the formats it knows (``READS``). A change that cannot be additive
  introduces a new ``format`` in two releases: N+1 learns to read it and still writes the
  old one, N+2 writes it. So version N reads version N-1's files (backwards) and version
  N+1's (forwards), whatever either changed: two versions one release apart always read
  each other's files. Version 1 reads exactly ``format`` 1 and ignores the keys it does
  not know, so it reads this version's files too.
* A file in a format this version does not know (two releases ahead), or that cannot be
  read at all, is moved aside (``checkpoint.json.corrupt``), never deleted, and the
  plugin starts with no prepared claims: ``NodePrepareResources`` prepares them again and
  ``NodeUnprepareResources`` of an unknown claim still removes its CDI spec.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...core.model import indexes_now
from ...host.files import write_json
from .grpcapi import PreparedDevice

log = logging.getLogger("gpuk8s.dra.state")

VERSION = 3  # the layout this release writes (2: ``version`` and unknown keys kept; 3: ids)
FORMAT = 1  # the layout this release writes: the oldest version that reads it
READS = (1,)  # the formats this release reads
FILE_NAME = "checkpoint.json"
_CLAIM_KEYS = ("namespace", "name", "devices", "gpus", "ids", "cdiSpec")


@dataclass(frozen=True)
class PreparedClaim:
    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...]
    gpus: tuple[int, ...]  # GPU indices the claim holds when prepared (display)
    cdi_spec: str  # the claim's CDI spec file
    unknown: Mapping[str, Any] = field(default_factory=dict)  # a newer version's keys
    ids: tuple[str, ...] = ()  # the GPUs' stable ids (steering, health); () before v3

    def to_json(self) -> dict[str, Any]:
        out = {**self.unknown,
               "namespace": self.namespace, "name": self.name,
               "devices": [d.to_json() for d in self.devices],
               "gpus": list(self.gpus), "cdiSpec": self.cdi_spec}
        if self.ids:
            out["ids"] = list(self.ids)
        return out

    def current(self, index_by_id: Mapping[str, int]) -> tuple[int, ...]:
        """The claim's GPUs at their indexes now (``NodeInventory.index_by_id``)."""
        return indexes_now(self.ids, self.gpus, index_by_id)

    def indexes_of(self, recorded: Sequence[int],
                   index_by_id: Mapping[str, int]) -> tuple[int, ...]:
        """Some of the claim's GPUs, named by their ``recorded`` indexes (``gpus``), at
        their indexes now: by the stable ids recorded beside them (version 3), else as
        recorded."""
        if len(self.ids) != len(self.gpus):
            return tuple(recorded)
        ids = dict(zip(self.gpus, self.ids, strict=True))
        return indexes_now(tuple(ids[g] for g in recorded if g in ids), recorded, index_by_id)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PreparedClaim:
        return cls(str(data["namespace"]), str(data["name"]),
                   tuple(PreparedDevice.from_json(d) for d in data["devices"]),
                   tuple(int(g) for g in data["gpus"]), str(data["cdiSpec"]),
                   {k: v for k, v in data.items() if k not in _CLAIM_KEYS},
                   tuple(str(i) for i in data.get("ids") or ()))


class Checkpoint:
    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, FILE_NAME)
        self._lock = threading.Lock()
        self._claims: dict[str, PreparedClaim] = self._load()

    def _load(self) -> dict[str, PreparedClaim]:
        try:
            with open(self.path, encoding="utf-8") as handle:
                raw = json.load(handle)
            form = raw.get("format")
            if isinstance(form, bool) or form not in READS:
                raise ValueError(f"format {form!r} (written by version "
                                 f"{raw.get('version', 1)!r}): version {VERSION} reads "
                                 f"format {', '.join(str(f) for f in READS)}")
            return {uid: PreparedClaim.from_json(c) for uid, c in raw["claims"].items()}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            aside = self.path + ".corrupt"
            try:
                os.replace(self.path, aside)
            except OSError:
                aside = "(could not be moved)"
            log.error("checkpoint unreadable: starting without prepared claims",
                      extra={"path": self.path, "moved_to": aside, "error": str(err)})
            return {}

    def _save(self, claims: dict[str, PreparedClaim]) -> None:
        write_json(self.path, {"format": FORMAT, "version": VERSION,
                               "claims": {uid: c.to_json() for uid, c in claims.items()}},
                   mode=0o600)

    def get(self, uid: str) -> PreparedClaim | None:
        with self._lock:
            return self._claims.get(uid)

    def put(self, uid: str, claim: PreparedClaim) -> None:
        with self._lock:
            claims = dict(self._claims)
            claims[uid] = claim
            self._save(claims)  # raises before the in-memory state changes
            self._claims = claims

    def remove(self, uid: str) -> PreparedClaim | None:
        with self._lock:
            if uid not in self._claims:
                return None
            claims = dict(self._claims)
            gone = claims.pop(uid)
            self._save(claims)
            self._claims = claims
            return gone

    def claims(self) -> dict[str, PreparedClaim]:
        with self._lock:
            return dict(self._claims)
