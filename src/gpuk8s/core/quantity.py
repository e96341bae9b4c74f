"""Kubernetes resource quantities (``resource.Quantity``), parsed exactly as the API does.

The grammar (k8s.io/apimachinery ``pkg/api/resource``, ``ParseQuantity``)::

    <quantity>        ::= <signedNumber><suffix>
    <signedNumber>    ::= <number> | <sign><number>      <sign> ::= "+" | "-"
    <number>          ::= <digits> | <digits>.<digits> | <digits>. | .<digits>
    <suffix>          ::= <binarySI> | <decimalExponent> | <decimalSI>
    <binarySI>        ::= Ki | Mi | Gi | Ti | Pi | Ei
    <decimalSI>       ::= n | u | m | "" | k | M | G | T | P | E
    <decimalExponent> ::= "e" <signedNumber> | "E" <signedNumber>   (an integer)

with the parser's real behaviour where it is looser than that grammar, because the
API server accepts exactly what the parser accepts: the number may be empty (``"+"``,
``"."``, ``"k"``, ``"e3"`` all read as 0, except where the slow path below needs a
digit), digits are ASCII only (``"４"`` is refused), a JSON value is trimmed of
Unicode white space first, the exponent is read as int64 and then truncated to int32
(as Go's ``int32()`` conversion does), and a JSON ``null`` is the zero quantity.
Values are exact (``fractions.Fraction``), rounded away from zero to a multiple of
10^-9 as the API does; binary-suffixed values are capped at 2^63-1 as the API does.

One deliberate difference: a value whose magnitude exceeds 2^63-1 with a decimal
suffix (the API keeps it as an unbounded decimal and ``Value()`` then overflows) is
refused here with ``QuantityError``, so no absurd number enters any arithmetic and no
work grows with the exponent. Nothing else is refused that the API accepts.

Stdlib only; Python 3.8+ (shipped to hosts by Ansible; the GPU-sharing resources use
it for ``vcore``/``vmemory``).
"""

from __future__ import annotations

import decimal
import re
from fractions import Fraction

from .errors import GpuK8sError

MAX_INT64 = (1 << 63) - 1
_NANO_DECIMAL = decimal.Decimal("1e-9")

# parseQuantityString's shape: sign, digits, optional "." digits, then suffix letters
# from "eEinumkKMGTP", an optional sign and digits (all ASCII: Go compares bytes).
_SHAPE = re.compile(
    r"([+-]?)([0-9]*)(?:(\.)([0-9]*))?([eEinumkKMGTP]*[+-]?[0-9]*)\Z", re.ASCII
)
_DECIMAL_SI = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_SI = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_PLAIN_COUNT = re.compile(r"[0-9]{1,18}\Z", re.ASCII)  # < 2^63: the value is int(text)
_INT64_TEXT = re.compile(r"[+-]?[0-9]+\Z", re.ASCII)  # strconv.ParseInt(s, 10, 64) syntax
# Go's unicode.IsSpace (strings.TrimSpace), which is narrower than Python's str.isspace
_GO_SPACE = "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"  # noqa: E501


class QuantityError(GpuK8sError):
    """Not a Kubernetes quantity, or not one the caller can use (names the value)."""


def _show(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:40] + "...")


def _exponent(text: str) -> int | None:
    """strconv.ParseInt(text, 10, 64) truncated to int32 as Go's ``int32()`` does; None
    when ParseInt fails."""
    if not _INT64_TEXT.match(text):
        return None
    digits = text.lstrip("+-").lstrip("0")
    if len(digits) > 19:
        return None
    value = int(digits or "0") * (-1 if text[0] == "-" else 1)
    if not -(1 << 63) <= value <= MAX_INT64:
        return None
    return (value + (1 << 31)) % (1 << 32) - (1 << 31)


def _suffix(suffix: str, text: str) -> tuple[int, bool]:
    """(power, binary) of a suffix, as quantitySuffixer.interpret: the value is
    multiplied by 2^power when binary, else by 10^power."""
    if suffix in _DECIMAL_SI:
        return _DECIMAL_SI[suffix], False
    if suffix in _BINARY_SI:
        return _BINARY_SI[suffix], True
    if len(suffix) > 1 and suffix[0] in "eE":
        exponent = _exponent(suffix[1:])
        if exponent is not None:
            return exponent, False
    raise QuantityError(
        f"{_show(text)} has an unknown suffix {_show(suffix)} (use one of "
        "n u m k M G T P E, Ki Mi Gi Ti Pi Ei, or an exponent such as e3)"
    )


def parse_quantity(text: str) -> Fraction:
    """The exact value of a quantity string (``ParseQuantity`` semantics, see module doc).

    Raises ``QuantityError`` naming the value for anything the API server refuses, and
    for decimal magnitudes above 2^63-1. Work is linear in the length of ``text``."""
    if not isinstance(text, str):
        raise QuantityError(f"a quantity must be a string, got {type(text).__name__}")
    if text == "":
        raise QuantityError("an empty string is not a quantity")
    match = _SHAPE.match(text)
    if match is None:
        raise QuantityError(
            f"{_show(text)} is not a quantity (a number such as 2, 1.5, 500m, 1e3 or 4Ki; "
            "ASCII digits only)"
        )
    sign, int_part, dot, frac_part, suffix = match.groups()
    frac_part = frac_part or ""
    if not int_part.strip("0") and not dot and not suffix:
        return Fraction(0)  # "+", "-0", "000": the parser returns 0 before any suffix
    power, binary = _suffix(suffix, text)
    # The API's fast path (exact int64 arithmetic) needs no digit; its slow path parses
    # the number with inf.Dec, which needs one. The slow path is taken for binary
    # suffixes with fractional digits or too many digits, and for decimal suffixes with
    # too many digits or a scale below 10^-9.
    num_len = len(int_part.lstrip("0")) or 1
    if binary:
        slow = bool(frac_part) or 15 - num_len - (power * 3) // 10 - 1 < 0
    else:
        slow = 18 - (num_len + len(frac_part)) < 0 or power - len(frac_part) < -9
    if slow and not (int_part or frac_part):
        raise QuantityError(f"{_show(text)} is not a quantity: no digits")
    context = decimal.Context(
        prec=len(text) + 40,  # exact: every operation below fits
        Emax=decimal.MAX_EMAX,
        Emin=decimal.MIN_EMIN,
        traps=[decimal.InvalidOperation, decimal.Overflow],
    )
    number = decimal.Decimal((int_part or "0") + ("." + frac_part if frac_part else ""))
    if binary:
        magnitude = context.multiply(number, decimal.Decimal(1 << power))
    else:
        magnitude = number.scaleb(power, context)
    if not magnitude:
        return Fraction(0)
    if magnitude.adjusted() >= 19:  # >= 10^19 > 2^63-1
        if not binary:
            raise QuantityError(
                f"{_show(text)} is larger than 2^63-1, the largest quantity Kubernetes holds"
            )
        magnitude = decimal.Decimal(MAX_INT64)
    elif magnitude.adjusted() < -9:
        magnitude = _NANO_DECIMAL  # a non-zero amount below 1n rounds up to 1n
    else:
        magnitude = magnitude.quantize(_NANO_DECIMAL, decimal.ROUND_UP, context)
    if magnitude > MAX_INT64:
        if not binary:
            raise QuantityError(
                f"{_show(text)} is larger than 2^63-1, the largest quantity Kubernetes holds"
            )
        magnitude = decimal.Decimal(MAX_INT64)
    value = Fraction(magnitude)
    return -value if sign == "-" else value


def parse_json_quantity(value: object) -> Fraction:
    """A quantity decoded from JSON: a string (trimmed of white space as
    ``Quantity.UnmarshalJSON`` does), a number, or None (JSON null: zero)."""
    if value is None:
        return Fraction(0)
    if isinstance(value, bool):
        raise QuantityError(f"a quantity must be a string or a number, got {value!r}")
    if isinstance(value, int):
        if abs(value) > MAX_INT64:
            raise QuantityError("a number larger than 2^63-1 is not a quantity Kubernetes holds")
        text = str(value)
    elif isinstance(value, float):
        text = repr(value)  # the shortest text that reads back as the same number
        if text in ("nan", "inf", "-inf"):
            raise QuantityError(f"{text} is not a quantity")
    elif isinstance(value, str):
        text = value.strip(_GO_SPACE)
    else:
        raise QuantityError(
            f"a quantity must be a string or a number, got {type(value).__name__}"
        )
    return parse_quantity(text)


def parse_json_text(raw: str) -> Fraction:
    """A quantity from the JSON text of its value, exactly as ``Quantity.UnmarshalJSON``
    reads it: ``null`` is zero, surrounding quotes are removed *without* unescaping
    (so an escaped character makes it invalid, as in the API), white space trimmed."""
    if raw == "null":
        return Fraction(0)
    if len(raw) >= 2 and raw[0] == '"' and raw[-1] == '"':
        raw = raw[1:-1]
    return parse_quantity(raw.strip(_GO_SPACE))


def whole_count(value: object, what: str, *, json_text: bool = False) -> int:
    """A quantity that must be a whole number >= 0 (extended resources such as
    ``metax-tech.com/gpu``): ``value`` as decoded from JSON, or with ``json_text`` the
    JSON text of the value. ``QuantityError`` names ``what`` and says why not."""
    if isinstance(value, str):  # the common case, "2": no Decimal arithmetic needed
        plain = value[1:-1] if json_text and value[:1] == '"' == value[-1:] else value
        if _PLAIN_COUNT.match(plain):
            return int(plain)
    try:
        if json_text:
            if not isinstance(value, str):
                raise QuantityError(f"JSON text must be a string, got {type(value).__name__}")
            amount = parse_json_text(value)
        else:
            amount = parse_json_quantity(value)
    except QuantityError as err:
        raise QuantityError(f"{what}: {err}") from None
    # the JSON text is shown as written (quotes included), a decoded value as Python does
    if json_text and isinstance(value, str):
        shown = value if len(value) <= 40 else value[:40] + "..."
    else:
        shown = _describe(value)
    if amount < 0:
        raise QuantityError(f"{what}: must not be negative, got {shown}")
    if amount.denominator != 1:
        raise QuantityError(
            f"{what}: {shown} is {_decimal(amount)}, not a whole number "
            "(extended resources cannot be fractional)"
        )
    return int(amount)


def _describe(value: object) -> str:
    return _show(value) if isinstance(value, str) else repr(value)


def _decimal(amount: Fraction) -> str:
    whole, rest = divmod(abs(amount.numerator) * 10**9 // amount.denominator, 10**9)
    return f"{whole}.{rest:09d}".rstrip("0")
