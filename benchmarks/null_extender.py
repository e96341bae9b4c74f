#!/usr/bin/env python3
"""A null scheduler extender, for `benchmarks/scheduling.py` (setups null, null-full,
null-scores).

Every node passes the filter and every node scores 0, so kube-scheduler's choice is its
own. It runs on the product's HTTP server (`services/extender/server.py`: same threads,
header parsing, limits), so a run shows what the extender protocol itself costs: the
scheduler encoding the requests and decoding the answers, one HTTP round trip per verb,
and an extender process that only reads the names (node cache mode) or echoes the
request's own Node objects (full-list mode), next to gpu-aware doing its real work.

    python benchmarks/null_extender.py --port 18082
"""

from __future__ import annotations

import argparse
import sys

import msgspec

from gpuk8s.services.extender.logic import Response
from gpuk8s.services.extender.server import ExtenderHTTPServer


class _NodeList(msgspec.Struct):
    items: list[msgspec.Raw] = []


class _Args(msgspec.Struct):
    NodeNames: list[str] | None = None
    Nodes: _NodeList | None = None


_TAIL = b',"FailedNodes":{},"FailedAndUnresolvableNodes":{},"Error":""}'


class NullExtender:
    """Answers filter with every node it was given and prioritize with no scores."""

    cache = None  # no node cache: /readyz is ready at once

    def __init__(self, scores: bool = False) -> None:
        self.scores = scores
        self._decode = msgspec.json.Decoder(_Args).decode
        self._encode = msgspec.json.encode

    def handle(self, verb: str, body: bytes) -> Response:
        if verb == "prioritize" and not self.scores:
            return Response(200, b"[]")  # a host left out scores 0
        if verb not in ("filter", "predicates", "prioritize"):
            return Response(404, b'{"error":"null extender: filter or prioritize"}')
        try:
            args = self._decode(body)
        except msgspec.DecodeError as err:
            return Response(400, self._encode({"error": str(err)}))
        if args.Nodes is not None:  # nodeCacheCapable: false: echo the Node objects
            head = b'{"Nodes":{"metadata":{},"items":[' + b",".join(
                bytes(item) for item in args.Nodes.items
            )
            return Response(200, head + b']},"NodeNames":null' + _TAIL)
        if verb == "prioritize":  # --scores: every named host listed, with score 1
            hosts = [{"Host": n, "Score": 1} for n in args.NodeNames or []]
            return Response(200, self._encode(hosts))
        names = self._encode(args.NodeNames or [])
        return Response(200, b'{"Nodes":null,"NodeNames":' + names + _TAIL)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--address", default="127.0.0.1")
    ap.add_argument(
        "--scores",
        action="store_true",
        help="prioritize lists every host with score 1 (as long an answer as gpu-aware's) "
        "instead of an empty list",
    )
    args = ap.parse_args()
    server = ExtenderHTTPServer((args.address, args.port), NullExtender(args.scores))  # type: ignore[arg-type]
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
