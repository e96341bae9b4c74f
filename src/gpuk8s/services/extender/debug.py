"""``GET /debug/ledger``: gpu-aware's GPU-sharing ledger as it stands, read-only.

What the extender holds per pod (UID -> the assignment, as the pod annotation
``gpuk8s.io/sharing.assigned`` spells it), which of them are its own reservations not yet
confirmed by the pod watch, and whether the watch has synced. A checker compares it with
the pods' annotations in the API (``benchmarks/replay.py``): a booking the API does not
have is stale, one the API has and the ledger not is missing. Nothing here changes state.
"""

from __future__ import annotations

import json

from .share import Sharing


def ledger_document(sharing: Sharing | None) -> bytes:
    """The ledger as JSON: ``{"sharing": bool, "synced": bool, "assignments": {uid:
    assignment}, "reserved": [uid, ...]}``."""
    if sharing is None:
        return b'{"sharing":false,"synced":false,"assignments":{},"reserved":[]}'
    ledger = sharing.ledger
    held = ledger.assignments()
    return json.dumps(
        {
            "sharing": True,
            "synced": ledger.synced,
            "assignments": {uid: json.loads(a.to_json()) for uid, a in sorted(held.items())},
            "reserved": sorted(ledger.reserved()),
        },
        separators=(",", ":"),
    ).encode()
