"""``encode_document`` refuses poison documents as BAD_REQUEST naming the docid: nested past
MAX_DOC_DEPTH (as text, as bytes, as a dict; at every depth, also past msgspec's own
recursion limit), and NaN / Infinity (as a float in a dict, which msgspec would write as null,
and as JSON tokens); at the limit, and brackets inside strings, are accepted."""

from __future__ import annotations

import math

import pytest

from shardex.api.validation import MAX_DOC_DEPTH, encode_document, json_depth
from shardex.errors import ErrorCode, ShardexError

MAX = 1 << 20


def nested_text(depth: int, opener: str = '{"a":') -> bytes:
    closer = "}" if opener.startswith("{") else "]"
    return (opener * depth + "1" + closer * depth).encode()


def nested_dict(depth: int) -> dict:
    doc: object = 1
    for _ in range(depth):
        doc = {"a": doc}
    assert isinstance(doc, dict)
    return doc


def refused(doc: object) -> ShardexError:
    with pytest.raises(ShardexError) as info:
        encode_document(doc, MAX, "d7")
    assert info.value.code == ErrorCode.BAD_REQUEST
    assert info.value.details["docid"] == "d7"
    return info.value


@pytest.mark.parametrize("depth", [MAX_DOC_DEPTH + 1, 500, 1_000, 10_000])
def test_too_deep_text_bytes_and_dict_are_bad_requests(depth: int) -> None:
    for doc in (nested_text(depth), nested_text(depth).decode(), nested_dict(depth)):
        err = refused(doc)
        assert err.details["depth"] == depth
        assert err.details["limit"] == MAX_DOC_DEPTH
        assert f"{depth} levels deep" in str(err)
    arrays = b'{"a":' + nested_text(depth - 1, "[") + b"}"
    assert refused(arrays).details["depth"] == depth


def test_at_the_limit_and_brackets_in_strings_are_accepted() -> None:
    assert encode_document(nested_text(MAX_DOC_DEPTH), MAX, "d") == nested_text(MAX_DOC_DEPTH)
    assert encode_document(nested_dict(MAX_DOC_DEPTH), MAX, "d")
    flat = b'{"s": "' + b"[{" * 400 + b'", "t": "\\"[[["}'
    assert encode_document(flat, MAX, "d") is flat
    assert json_depth(flat) == 1


@pytest.mark.parametrize(
    ("doc", "path"),
    [
        ({"a": math.nan}, "$.a"),
        ({"a": 1, "b": {"c": [0.5, None, -math.inf]}}, "$.b.c[2]"),
        ({"x": None, "y": (math.inf,)}, "$.y[0]"),
    ],
)
def test_nan_and_infinity_in_a_dict_are_refused_not_stored_as_null(doc, path) -> None:
    err = refused(doc)
    assert err.details["path"] == path
    assert "NaN or Infinity" in str(err)


def test_a_real_null_is_kept() -> None:
    assert encode_document({"a": None, "b": [1.5, None]}, MAX, "d") == b'{"a":null,"b":[1.5,null]}'


@pytest.mark.parametrize("text", [b'{"a": NaN}', b'{"a": Infinity}', b'{"a": [-Infinity]}'])
def test_nan_and_infinity_tokens_are_refused_with_a_hint(text: bytes) -> None:
    for doc in (text, text.decode()):
        err = refused(doc)
        assert "NaN and Infinity" in err.details["hint"]


def test_a_number_out_of_range_is_refused() -> None:
    err = refused(b'{"a": 1e999}')
    assert "out of range" in str(err)


def test_other_odd_values() -> None:
    # Lone surrogates do not encode; a tuple key is not JSON. Kept as msgspec encodes them
    # (valid JSON): int keys (as strings), a set (an array), an int past 64 bits.
    refused({"a": "\ud800"})
    refused({(1, 2): 1})
    assert encode_document({1: "x"}, MAX, "d") == b'{"1":"x"}'
    assert encode_document({"a": {1}}, MAX, "d") == b'{"a":[1]}'
    assert encode_document({"a": 2**70}, MAX, "d") == b'{"a":1180591620717411303424}'
