"""``check_durability_timeout``: a write's own durability timeout is a finite number of
seconds in (0, MAX_DURABILITY_TIMEOUT]; anything else is refused naming the value."""

from __future__ import annotations

import math

import pytest

from shardex.api.validation import MAX_DURABILITY_TIMEOUT, check_durability_timeout
from shardex.errors import ErrorCode, ShardexError


@pytest.mark.parametrize("value", [0.001, 1, 2.5, MAX_DURABILITY_TIMEOUT])
def test_seconds_in_range_are_taken_as_floats(value: float) -> None:
    got = check_durability_timeout(value)
    assert got == value and type(got) is float


def test_none_means_the_nodes_default() -> None:
    assert check_durability_timeout(None) is None


@pytest.mark.parametrize(
    "value",
    [0, 0.0, -1.0, MAX_DURABILITY_TIMEOUT + 0.001, 3600, math.inf, math.nan, True, "5", [5]],
)
def test_anything_else_is_refused_naming_the_value(value: object) -> None:
    with pytest.raises(ShardexError) as err:
        check_durability_timeout(value)
    assert err.value.code is ErrorCode.BAD_REQUEST
    assert repr(value) in err.value.message
    assert err.value.details["durability_timeout"] == repr(value)
    assert err.value.details["maximum"] == MAX_DURABILITY_TIMEOUT
    assert "hint" in err.value.details
