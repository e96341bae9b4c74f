"""core.quantity: Kubernetes resource.Quantity grammar and values.

The table was produced by k8s.io/apimachinery v0.35.4 ``resource.ParseQuantity`` (a
small Go program reading these strings; "ERR" where it returns an error), so the
expectations are the API server's, not ours. The property tests check the parts of the
grammar a table cannot enumerate.
"""

from __future__ import annotations

import string
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuk8s.core.quantity import (
    MAX_INT64,
    QuantityError,
    parse_json_quantity,
    parse_json_text,
    parse_quantity,
    whole_count,
)

GO_PARSE_QUANTITY = [
    ("", "ERR"), ("0", "0"), ("+", "0"), ("-", "0"), (".", "0"), ("+.", "0"), ("e3", "0"),
    ("E", "0"), ("e", "ERR"), ("Ki", "0"), ("Pi", "ERR"), ("Ei", "ERR"), (".Ei", "ERR"),
    ("0Ei", "0"), (".e-10", "ERR"), ("0e-10", "0"), ("e-10", "ERR"), ("e-9", "0"),
    ("1e", "ERR"), ("1E", "1000000000000000000"), ("1e+", "ERR"), ("1e+3", "1000"),
    ("1E-3", "0.001"), ("1e3", "1000"), ("1e03", "1000"), ("+4", "4"), ("-4", "-4"),
    ("４", "ERR"), ("٤", "ERR"), ("1k", "1000"), ("2k", "2000"), ("500m", "0.5"),
    ("1.5", "1.5"), ("1.", "1"), (".5", "0.5"), ("1.5Ki", "1536"), ("1.Ki", "1024"),
    (".5Ki", "512"), ("1Ki", "1024"), ("1Mi3", "ERR"), ("1k3", "ERR"), ("1ee", "ERR"),
    ("1EE3", "ERR"), ("1KiB", "ERR"), ("1 ", "ERR"), (" 1", "ERR"), ("1n", "0.000000001"),
    ("12.5n", "0.000000013"), ("1.0000000001", "1.000000001"), ("0.9999999999", "1"),
    ("-1e-10", "-0.000000001"), ("1e4294967296", "1"), ("1e9223372036854775807", "0.1"),
    ("1e9223372036854775808", "ERR"), ("1e000000000000000000000000003", "1000"),
    ("8Ei", "9223372036854775807"), ("10Ei", "9223372036854775807"),
    ("9223372036854775807", "9223372036854775807"), ("4.0", "4"), ("0.000", "0"),
    ("00007", "7"),
]


@pytest.mark.parametrize(("text", "expected"), GO_PARSE_QUANTITY)
def test_parse_quantity_agrees_with_the_api_server(text: str, expected: str) -> None:
    if expected == "ERR":
        with pytest.raises(QuantityError):
            parse_quantity(text)
    else:
        assert parse_quantity(text) == Fraction(Decimal(expected))


@pytest.mark.parametrize("text", ["9223372036854775808", "9.3e18", "1" + "0" * 5000, "1e19"])
def test_decimal_values_beyond_int64_are_refused_not_computed(text: str) -> None:
    # the API keeps these as unbounded decimals; we refuse them (module doc)
    with pytest.raises(QuantityError, match="larger than 2\\^63-1"):
        parse_quantity(text)


def test_long_inputs_cost_linear_work() -> None:
    # 5,000-digit numbers and huge exponents never build the number digit by digit
    assert parse_quantity("0." + "0" * 5000 + "1") == Fraction(1, 10**9)
    assert parse_quantity("1." + "0" * 5000 + "1Ki") == Fraction(1024_000_000_001, 10**9)
    assert parse_quantity("1e-999999999") == Fraction(1, 10**9)  # Go takes minutes here
    assert parse_quantity("7" + "0" * 4000 + "e-4000") == 7


@settings(max_examples=300)
@given(st.integers(min_value=0, max_value=MAX_INT64))
def test_plain_integers_read_back(n: int) -> None:
    assert parse_quantity(str(n)) == n
    assert parse_quantity(f"+{n}") == n
    assert whole_count(str(n), "x") == n


@settings(max_examples=300)
@given(
    st.integers(min_value=0, max_value=10**6),
    st.sampled_from([("k", 10**3), ("M", 10**6), ("Ki", 1024), ("Mi", 1 << 20), ("e2", 100)]),
)
def test_suffixes_multiply(n: int, suffix: tuple[str, int]) -> None:
    assert parse_quantity(f"{n}{suffix[0]}") == n * suffix[1]


@settings(max_examples=300)
@given(st.text(max_size=12))
def test_any_text_is_a_value_or_a_quantity_error(text: str) -> None:
    try:
        value = parse_quantity(text)
    except QuantityError as err:
        assert str(err)
    else:
        assert isinstance(value, Fraction) and abs(value) <= MAX_INT64
        assert (value * 10**9).denominator == 1  # a multiple of 1n, as the API rounds
        assert set(text) <= set(string.digits + "+-.eEinumkKMGTP")


@settings(max_examples=200)
@given(
    st.text(alphabet=st.characters(whitelist_categories=["Nd"]), min_size=1, max_size=4)
)
def test_only_ascii_digits_are_digits(digits: str) -> None:
    if not set(digits) <= set(string.digits):
        with pytest.raises(QuantityError):
            parse_quantity(digits)


def test_json_forms() -> None:
    assert parse_json_quantity(None) == 0  # null is the zero quantity
    assert parse_json_quantity(" 2 ") == 2  # UnmarshalJSON trims white space
    assert parse_json_quantity("\u30002\u3000") == 2  # Go's unicode.IsSpace
    with pytest.raises(QuantityError):
        parse_json_quantity("\x1c2")  # Python's isspace, not Go's
    assert parse_json_quantity(4) == 4 and parse_json_quantity(1e3) == 1000
    for bad in (True, [1], {"a": 1}, float("nan"), float("inf"), 10**30):
        with pytest.raises(QuantityError):
            parse_json_quantity(bad)
    # the raw JSON text, read as the API does: quotes removed, escapes not decoded
    assert parse_json_text('"4"') == 4 and parse_json_text("1e3") == 1000
    assert parse_json_text("null") == 0
    with pytest.raises(QuantityError):
        parse_json_text('"\\u0034"')


@pytest.mark.parametrize(
    ("value", "json_text", "expected"),
    [("1e3", False, 1000), ("+4", False, 4), ("2k", False, 2000), ('"8"', True, 8),
     ("0.9999999999", False, 1), ("4.0", False, 4)],
)
def test_whole_counts(value: str, json_text: bool, expected: int) -> None:
    assert whole_count(value, "gpus", json_text=json_text) == expected


@pytest.mark.parametrize(
    ("value", "needle"),
    [("1.5", "1.5, not a whole number"), ("500m", "0.5, not a whole number"),
     ("-1", "must not be negative"), ("４", "ASCII digits only"),
     ("1" + "0" * 5000, "larger than 2^63-1"), ("2 GPUs", "not a quantity")],
)
def test_whole_count_errors_name_the_field(value: str, needle: str) -> None:
    with pytest.raises(QuantityError) as err:
        whole_count(value, "limits['metax-tech.com/gpu']")
    assert str(err.value).startswith("limits['metax-tech.com/gpu']: ")
    assert needle in str(err.value)
