"""``json.loads`` with a bound on size and nesting, for values written by others.

Node annotations are read by the extender from every node; one hostile or broken value
must not cost more than its size in work and memory, and must not reach the
interpreter's recursion limit (``json.loads`` of 100,000 nested brackets raises
``RecursionError``). The nesting depth is measured before decoding, on the text with
its strings removed (a few C-level passes), so decoding only ever sees shallow input.

Stdlib only; Python 3.8+.
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any

# a complete JSON string literal (escapes included); an unterminated one is left in
# place and makes json.loads fail afterwards
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


class BoundedJsonError(ValueError):
    """Too long, nested too deeply, or not JSON; the message says which."""


def nesting_depth(text: str) -> int:
    """The deepest bracket nesting of ``text`` outside string literals (0 for a scalar)."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    if not brackets:
        return 0
    return max(0, max(accumulate(map(_STEP.__getitem__, brackets))))


def loads_bounded(text: str, *, max_depth: int, max_chars: int) -> Any:
    """``json.loads(text)`` for text of at most ``max_chars`` characters nested at most
    ``max_depth`` deep; ``BoundedJsonError`` otherwise (never ``RecursionError``).
    ``NaN`` and ``Infinity`` are refused: they are not JSON."""
    if len(text) > max_chars:
        raise BoundedJsonError(f"{len(text)} characters, more than the limit of {max_chars}")
    depth = nesting_depth(text)
    if depth > max_depth:
        raise BoundedJsonError(f"nested {depth} deep, more than the limit of {max_depth}")
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except BoundedJsonError:
        raise
    except ValueError as err:  # JSONDecodeError, and ints beyond the digit limit
        raise BoundedJsonError(f"not JSON: {err}") from None


def _refuse_constant(name: str) -> Any:
    raise BoundedJsonError(f"{name} is not a JSON number")
