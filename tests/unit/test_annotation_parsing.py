"""Hostile node annotation values: the readers of core.devicelist and core.scoring stay
bounded and never raise anything but their documented error (issue 15)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuk8s.core.boundedjson import BoundedJsonError, loads_bounded, nesting_depth
from gpuk8s.core.devicelist import parse_device_list
from gpuk8s.core.errors import InventoryError
from gpuk8s.core.scoring import parse_table

DEEP = "[" * 100_000 + "]" * 100_000


def test_nesting_depth_ignores_brackets_in_strings() -> None:
    assert nesting_depth('{"a": "[[[[", "b": [1, {"c": "]]"}]}') == 3
    assert nesting_depth('"\\"[["') == 0
    assert nesting_depth("5") == 0
    assert nesting_depth(DEEP) == 100_000


def test_loads_bounded_refuses_depth_length_and_constants() -> None:
    with pytest.raises(BoundedJsonError, match="nested 100000 deep"):
        loads_bounded(DEEP, max_depth=8, max_chars=10**6)
    with pytest.raises(BoundedJsonError, match="more than the limit of 10"):
        loads_bounded("[" + "1," * 10 + "1]", max_depth=8, max_chars=10)
    for constant in ("NaN", "Infinity", "-Infinity", "[1, NaN]"):
        with pytest.raises(BoundedJsonError, match="not a JSON number"):
            loads_bounded(constant, max_depth=8, max_chars=100)
    assert loads_bounded('{"a": [1, 2]}', max_depth=2, max_chars=100) == {"a": [1, 2]}


def test_deeply_nested_device_list_is_an_inventory_error() -> None:
    # json.loads raised RecursionError here, which escaped every caller
    with pytest.raises(InventoryError, match="nested 100000 deep"):
        parse_device_list(DEEP)
    with pytest.raises(InventoryError, match="nested"):
        parse_device_list('[{"id": "a", "extra": ' + "[" * 5000 + "]" * 5000 + "}]")


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ('{"1": NaN, "2": 100}', {}),  # not JSON at all: the whole table is unusable
        ('{"1": Infinity}', {}),
        ('{"1": 1e400, "2": 60}', {2: 60}),  # overflows to inf: that entry is skipped
        ('{"1": ' + "9" * 400 + ', "2": 60}', {1: 100, 2: 60}),  # clamped
        ('{"1": ' + "9" * 5000 + "}", {}),  # beyond Python's int digit limit
        ('{"1": 1e308, "2": -5, "3": 150.5, "4": 59.9}', {1: 100, 2: 0, 3: 100, 4: 59}),
        ('{"0": 1, "-1": 1, "' + "9" * 400 + '": 1, "\uff18": 1, " 8": 1, "8": 1}', {8: 1}),
        (DEEP, {}),
        ("{" * 3 + "}" * 3, {}),
    ],
)
def test_tables_are_validated_and_clamped(raw: str, expected: dict[int, int]) -> None:
    assert parse_table(raw) == expected


@settings(max_examples=300)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
        lambda inner: st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=4), inner, max_size=4),
        max_leaves=20,
    )
)
def test_any_json_value_gives_a_clamped_table(value: object) -> None:
    raw = json.dumps(value)  # NaN and Infinity included (json.dumps writes them)
    table = parse_table(raw)
    assert all(1 <= k <= 4096 and 0 <= v <= 100 for k, v in table.items())
