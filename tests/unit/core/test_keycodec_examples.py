"""Example tests for the key collation codec (``shardex.core.keycodec``): the type and
number ladders, byte layouts, the hand-written ``collate`` table the property tests rely on
(``test_keycodec.py``), DESC and entry examples, and the errors for bad input.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from decimal import Decimal
from typing import Any

import pytest

from shardex.core import keycodec_values
from shardex.core.keycodec import (
    collate,
    collation_key,
    decode_entry,
    decode_key,
    decode_value,
    encode_entry,
    encode_key,
    encode_value,
    key_prefix_bounds,
    successor,
)
from shardex.core.values import MISSING
from shardex.errors import ErrorCode, ShardexError
from tests.unit.core.test_keycodec import bcmp, same

# --------------------------------------------------------------------------- examples


def test_type_order() -> None:
    ladder = [MISSING, None, False, True, -1e300, -1, 0, 5e-324, 2**200, "", "\x00", "a"]
    ladder += [[], [None], [1], [1, None], ["a"], [[]], {}, {"": None}]
    ladder += [{"a": 9}, {"a": 9, "b": 0}, {"a": 10}, {"b": 0}]
    enc = [encode_value(v) for v in ladder]
    for a, b, ea, eb in zip(ladder, ladder[1:], enc, enc[1:], strict=False):
        assert ea < eb, (a, b)
        assert collate(a, b) == -1, (a, b)


# Ascending groups; values inside a group are equal.
NUMBER_LADDER: list[list[int | float]] = [
    [-(2**70000) - 1],
    [-(2**70000)],
    [-3 * 2**32767],
    [-(2**32767)],
    [-(2**32766)],
    [-(2**1024)],
    [-1.7976931348623157e308],
    [-1e300, -int(1e300)],
    [-(2**200) - 1],
    [-(2**200), -(2.0**200)],
    [-(2**200) + 1],
    [-(2**53) - 1],
    [-(2**53), -(2.0**53)],
    [-1.5],
    [-1, -1.0],
    [-0.5],
    [-5e-324],
    [0, 0.0, -0.0],
    [5e-324],
    [2.225073858507201e-308],  # largest subnormal
    [2.2250738585072014e-308],  # smallest normal
    [0.1],
    [0.5],
    [1, 1.0],
    [1.5],
    [2**53 - 1, float(2**53 - 1)],
    [2**53, 2.0**53],
    [2**53 + 1],
    [2**53 + 2, 2.0**53 + 2],
    [2**57 - 1],
    [2**57 + 1],
    [1e23, int(1e23)],
    [10**23],
    [2**200, 2.0**200],
    [2**200 + 1],
    [math.nextafter(2.0**200, math.inf)],
    [1e300, int(1e300)],
    [int(1e300) + 1],
    [1.7976931348623157e308],
    [2**1024],
    [2**32766],  # largest 2-byte exponent
    [2**32767],  # first extended exponent
    [2**32768],
    [3 * 2**32767],
    [2**70000],
    [2**70000 + 1],
]


def test_number_ladder() -> None:
    flat = [x for group in NUMBER_LADDER for x in group]
    for i, group in enumerate(NUMBER_LADDER):
        encs = {encode_value(x) for x in group}
        assert len(encs) == 1, group  # equal values, identical bytes
        for x in group:
            assert all(collate(x, y) == 0 for y in group)
        if i:
            prev = NUMBER_LADDER[i - 1][0]
            assert prev < group[0]  # the table itself is right (Python compares exactly)
            assert encode_value(prev) < encode_value(group[0])
            assert collate(prev, group[0]) == -1
    assert sorted(flat, key=collation_key) == sorted(flat)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1.0, 1),
        (-0.0, 0),
        (2.0**53, 2**53),
        (1e300, int(1e300)),
        (-(2.0**200), -(2**200)),
        (0.5, 0.5),
        (-1.5, -1.5),
        (5e-324, 5e-324),
        (0.1, 0.1),
        (2**200 + 1, 2**200 + 1),
        (2**70000 + 1, 2**70000 + 1),
        ([1.0, {"b": 2.0, "a": -0.0}], [1, {"a": 0, "b": 2}]),
        ((1, "x"), [1, "x"]),
    ],
    ids=keycodec_values.short_repr,
)
def test_decode_normalises_numbers(value: Any, expected: Any) -> None:
    assert same(decode_value(encode_value(value)), expected)


def test_layout_examples() -> None:
    assert encode_value(MISSING) == b"\x10"
    assert encode_value(None) == b"\x20"
    assert encode_value(0) == encode_value(-0.0) == b"\x41"
    assert encode_value(1) == b"\x42\x80\x00\x00"  # 2**0 * 1.0: exponent 0x8000, empty fraction
    assert encode_value(-1) == b"\x40\x7f\xff\xff"  # the same magnitude, inverted
    assert encode_value(1.5) == b"\x42\x80\x00\x80"  # fraction bit 1, last group
    assert encode_value("a\x00") == b"\x50a\x00\xff\x00\x01"
    assert encode_value([]) == b"\x60\x01"
    assert encode_value({"a": None}) == b"\x70\x50a\x00\x01\x20\x01"


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        (MISSING, MISSING, 0),
        (MISSING, None, -1),
        (None, False, -1),
        (False, True, -1),
        (True, -(2**200), -1),
        (True, 1, -1),  # bool is not a number
        (0, False, 1),
        (10**30, "", -1),
        ("", [], -1),
        ([], {}, -1),
        ([1], {}, -1),
        (1, 1.0, 0),
        (0, -0.0, 0),
        (2**53 + 1, 2.0**53, 1),
        (2**53, 2.0**53, 0),
        (10**23, 1e23, 1),
        (int(1e23), 1e23, 0),
        (-(2**200), -1e300, 1),
        (5e-324, 0, 1),
        (-5e-324, 0, -1),
        ("a", "b", -1),
        ("a", "a\x00", -1),
        ("a\x00", "a\x01", -1),
        ("\uffff", "\U0001f600", -1),
        ("\ud800", "\ue000", -1),
        ("B", "a", -1),
        ([1], [1, None], -1),
        ([1, 2], [1.0, 2.0], 0),
        ([2], [1, 5], 1),
        ([None], [False], -1),
        ([[1]], [[1], 0], -1),
        ({}, {"a": 1}, -1),
        ({"a": 1}, {"a": 1.0}, 0),
        ({"a": 9}, {"a": 9, "b": 0}, -1),
        ({"a": 9, "b": 0}, {"a": 10}, -1),
        ({"a": 10}, {"b": 0}, -1),
        ({"b": 1, "a": 2}, {"a": 2, "b": 1}, 0),
        ({"b": 1}, {"a": 2, "c": 0}, 1),
        ({"": 5}, {"a": 0}, -1),
        ((1, 2), [1, 2], 0),
    ],
)
def test_collate_table(a: Any, b: Any, expected: int) -> None:
    assert collate(a, b) == expected
    assert collate(b, a) == -expected
    assert bcmp(encode_value(a), encode_value(b)) == expected


class _Weird:
    def __repr__(self) -> str:
        return "<Weird thing>"


@pytest.mark.parametrize(
    ("value", "named"),
    [
        (math.nan, "nan"),
        (math.inf, "inf"),
        (-math.inf, "-inf"),
        ([1, math.nan], "nan"),
        ({"a": -math.inf}, "-inf"),
        (b"bytes", "b'bytes'"),
        ({1, 2}, "{1, 2}"),
        (Decimal("1.5"), "Decimal('1.5')"),
        (1 + 2j, "(1+2j)"),
        (_Weird(), "<Weird thing>"),
        ({1: "a"}, "1"),
        ([MISSING], "MISSING"),
        ({"a": MISSING}, "MISSING"),
    ],
)
def test_rejects_non_json_values(value: Any, named: str) -> None:
    for call in (
        lambda: encode_value(value),
        lambda: encode_key([1, value]),
        lambda: encode_entry([value], "d"),
        lambda: collate(value, 0),
        lambda: collate([0], value),
    ):
        with pytest.raises(ShardexError) as info:
            call()
        err = info.value
        assert err.code is ErrorCode.BAD_REQUEST
        assert named in err.message and named in err.details["value"]
        assert err.details["hint"]


def test_rejects_non_string_docid_and_short_desc() -> None:
    with pytest.raises(ShardexError) as info:
        encode_entry([1], 42)  # type: ignore[arg-type]
    assert info.value.code is ErrorCode.BAD_REQUEST and "42" in info.value.message
    with pytest.raises(ShardexError) as info:
        encode_key([1, 2], [True])
    assert info.value.code is ErrorCode.BAD_REQUEST


def test_accepts_json_type_subclasses() -> None:
    class S(str):
        pass

    class I(int):  # noqa: E742
        pass

    assert encode_value(S("ab")) == encode_value("ab")
    assert encode_value(I(7)) == encode_value(7)
    assert encode_value(OrderedDict([("b", 1), ("a", 2)])) == encode_value({"a": 2, "b": 1})
    assert encode_value((1, (2,))) == encode_value([1, [2]])


def test_desc_examples() -> None:
    d = [False, True]
    assert encode_key(["a", 2], d) < encode_key(["a", 1], d) < encode_key(["b", 9], d)
    assert encode_key(["a", MISSING], d) > encode_key(["a", None], d)
    assert encode_key(["a", [1, 2]], d) < encode_key(["a", [1]], d)
    assert encode_key(["a", "x\x00"], d) < encode_key(["a", "x"], d)
    # A shorter key that is a prefix sorts first, whatever the direction.
    for flags in ([True, True], [True, False], [False, True]):
        assert encode_key(["a"], flags) < encode_key(["a", MISSING], flags)
        assert encode_key(["a"], flags) < encode_key(["a", {}], flags)
    assert decode_key(encode_key(["a", [1.0, "x"]], d), d) == ["a", [1, "x"]]


def test_entry_examples() -> None:
    d = [True]
    e1, e2, e3 = (encode_entry([5], docid, d) for docid in ("", "a", "a\x00"))
    assert e1 < e2 < e3 < encode_entry([4], "", d)
    assert decode_entry(e3, d) == ([5], "a\x00")
    assert decode_entry(encode_entry([], "x")) == ([], "x")
    low, high = key_prefix_bounds([5], d)
    assert low <= e1 < e2 < e3 < high
    assert not low <= encode_entry([5.5], "", d) < high
    assert key_prefix_bounds([]) == (b"", b"\xff")


def test_successor_examples() -> None:
    assert successor(b"a") == b"b"
    assert successor(b"a\xff\xff") == b"b"
    assert successor(b"\x00") == b"\x01"
    for bad in (b"", b"\xff", b"\xff\xff"):
        with pytest.raises(ShardexError) as info:
            successor(bad)
        assert info.value.code is ErrorCode.BAD_REQUEST


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x00",
        b"\xff",
        b"\x42\x80",  # truncated number
        b"\x42\x80\x00\x01",  # unterminated fraction
        b"\x50abc",  # unterminated string
        b"\x50\xff\x00\x01",  # invalid UTF-8
        b"\x60\x42\x80\x00\x00",  # unterminated array
        b"\x70\x20\x20\x01",  # object name not a string
        b"\x20\x20",  # trailing bytes
    ],
)
def test_malformed_bytes_raise_bad_request(data: bytes) -> None:
    with pytest.raises(ShardexError) as info:
        decode_value(data)
    assert info.value.code is ErrorCode.BAD_REQUEST


def test_key_and_entry_decoding_errors() -> None:
    entry = encode_entry([1, "a"], "doc")
    with pytest.raises(ShardexError):
        decode_key(entry)  # a docid marker is not a key part
    with pytest.raises(ShardexError):
        decode_key(encode_key([1, 2]), [False])  # more parts than flags
    with pytest.raises(ShardexError):
        decode_entry(encode_key([1, 2]))  # no docid
    with pytest.raises(ShardexError):
        decode_entry(entry + b"x")
    assert decode_entry(entry) == ([1, "a"], "doc")


def test_error_message_survives_unprintable_values() -> None:
    with pytest.raises(ShardexError) as info:
        encode_value({1: 10**5000})  # repr of a 5001-digit int raises ValueError
    assert "too large to print" in info.value.message
    assert "object name 1 is not a string" in info.value.message


@pytest.mark.parametrize("desc", [False, True])
def test_small_ints_in_keys_decode_like_any_number(desc: bool) -> None:
    """Key parts that are small ints decode through a table (``_dec_pos``/``_dec_neg``):
    every one of them, the ints just past the table, and a part following each, come back
    as the magnitude decoder gives them."""
    for i in [*range(-1100, 4200), -(2**40), 2**40 + 1]:
        key = encode_key([i, "x", i], [desc, False, desc])
        assert decode_key(key, [desc, False, desc]) == [i, "x", i]
        value = encode_value(i)
        assert decode_value(value) == i
        if i:  # the table's answer is the magnitude decoder's, end included
            body = value + b"\x50"
            got = keycodec_values.DECODERS[value[0]](body, 0)
            assert got == (i, len(value))
            if i > 0:
                assert keycodec_values.decode_magnitude(body, 1) == (i, len(value))
