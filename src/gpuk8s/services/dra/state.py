"""gpu-dra's checkpoint: the claims it prepared, where a restarted plugin finds them.

One JSON file in the plugin's data directory (``/var/lib/kubelet/plugins/<driver>/``, a
host path that outlives the pod), rewritten atomically (temp file + rename) after every
change, before the kubelet is answered: a plugin that dies half-way either has the claim
recorded with its CDI spec written, or not at all (and the kubelet asks again).

A file that cannot be read is moved aside (``checkpoint.json.corrupt``), never deleted,
and the plugin starts with no prepared claims: ``NodePrepareResources`` prepares them
again and ``NodeUnprepareResources`` of an unknown claim still removes its CDI spec.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any

from ...host.files import write_json
from .grpcapi import PreparedDevice

log = logging.getLogger("gpuk8s.dra.state")

FORMAT = 1
FILE_NAME = "checkpoint.json"


@dataclass(frozen=True)
class PreparedClaim:
    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...]
    gpus: tuple[int, ...]  # GPU indices the claim holds (steering, health)
    cdi_spec: str  # the claim's CDI spec file

    def to_json(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "name": self.name,
                "devices": [d.to_json() for d in self.devices],
                "gpus": list(self.gpus), "cdiSpec": self.cdi_spec}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PreparedClaim:
        return cls(str(data["namespace"]), str(data["name"]),
                   tuple(PreparedDevice.from_json(d) for d in data["devices"]),
                   tuple(int(g) for g in data["gpus"]), str(data["cdiSpec"]))


class Checkpoint:
    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, FILE_NAME)
        self._lock = threading.Lock()
        self._claims: dict[str, PreparedClaim] = self._load()

    def _load(self) -> dict[str, PreparedClaim]:
        try:
            with open(self.path, encoding="utf-8") as handle:
                raw = json.load(handle)
            if raw.get("format") != FORMAT:
                raise ValueError(f"format {raw.get('format')!r}, expected {FORMAT}")
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
        write_json(self.path, {"format": FORMAT,
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
