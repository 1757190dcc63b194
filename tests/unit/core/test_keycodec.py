"""Tests for the order-preserving key collation codec (``shardex.core.keycodec``).

Two oracles are used: Python's own exact comparisons for numbers and strings, and the
reference comparator ``collate`` (itself checked against ``test_keycodec_examples.py``'s
hand-written table) for everything else. Properties are checked pairwise over small drawn
lists, so one example covers many comparisons. This file holds the properties; the examples
(type and number ladders, layouts, the collate table, rejected input) are
``test_keycodec_examples.py``.
"""

from __future__ import annotations

import functools
import itertools
import math
import random
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
from shardex.errors import ShardexError

PROPS = settings(max_examples=60, deadline=None)
FEW = settings(max_examples=40, deadline=None)


# --------------------------------------------------------------------------- helpers


def sign(x: int) -> int:
    return (x > 0) - (x < 0)


def bcmp(a: bytes, b: bytes) -> int:
    return (a > b) - (a < b)


def normalise(v: Any) -> Any:
    """What decode must return for ``v``: integral numbers as int, arrays as lists, objects
    as dicts with sorted names."""
    if v is MISSING or v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, float):
        return int(v) if v.is_integer() else v
    if isinstance(v, int):
        return int(v)
    if isinstance(v, (list, tuple)):
        return [normalise(e) for e in v]
    return {k: normalise(v[k]) for k in sorted(v)}


def same(a: Any, b: Any) -> bool:
    """Equality that also checks exact types, container kinds and object name order."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return a is b if a is MISSING else a == b


def twin(v: Any, rnd: random.Random) -> Any:
    """A different representation of an equal value (int <-> float, -0.0, tuple, name order)."""
    if v is MISSING or v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        if v == 0:
            return rnd.choice([0, 0.0, -0.0])
        try:
            f = float(v)
        except OverflowError:
            return v
        return f if f == v and rnd.random() < 0.5 else v
    if isinstance(v, float):
        if v.is_integer() and rnd.random() < 0.5:
            return int(v)
        return v
    if isinstance(v, (list, tuple)):
        items = [twin(e, rnd) for e in v]
        return tuple(items) if rnd.random() < 0.3 else items
    names = list(v)
    rnd.shuffle(names)
    return {k: twin(v[k], rnd) for k in names}


def ref_key_cmp(a: Sequence[Any], b: Sequence[Any], desc: Sequence[bool]) -> int:
    """Composite order: part by part (DESC parts reversed), then a proper prefix first."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        c = collate(x, y)
        if c:
            return -c if desc[i] else c
    return sign(len(a) - len(b))


# --------------------------------------------------------------------------- strategies

EDGE_NUMBERS: list[int | float] = [
    0, -0.0, 0.0, 1, 1.0, -1, 0.5, -0.5, 0.1, 1.5,
    2**53 - 1, 2**53, 2**53 + 1, 2.0**53, 2.0**53 + 2, -(2**53) - 1, -(2.0**53),
    2**63, 2**64 + 1, 10**23, 1e23, int(1e23), 1e300, -1e300, int(1e300) + 1,
    5e-324, -5e-324, 1e-300, 2.2250738585072014e-308, 2.225073858507201e-308,
    1.7976931348623157e308, -1.7976931348623157e308, 2**1024, -(2**1024),
    2**200, -(2**200), 2.0**200, 2**200 + 1, -(2**200) - 1, 2**57 - 1, 2**57 + 1,
    2**14000, -(2**14000) + 1,
]  # fmt: skip
# Ints with an extended exponent (2**32767 and up, over 9,800 digits) stay in example tests:
# their repr exceeds Python's int-to-str limit and would break Hypothesis' failure reports.
finite_floats = st.floats(allow_nan=False, allow_infinity=False)
numbers: st.SearchStrategy[int | float] = st.one_of(
    st.integers(-20, 20),
    st.integers(),
    st.integers(-(2**300), 2**300),
    finite_floats,
    st.integers(-(2**60), 2**60).map(float),  # integral floats equal to ints
    st.integers(2**53 - 6, 2**53 + 6).flatmap(lambda i: st.sampled_from([i, float(i), -i])),
    st.tuples(finite_floats, st.booleans())
    .map(lambda t: math.nextafter(t[0], math.inf if t[1] else -math.inf))
    .filter(math.isfinite),
    st.sampled_from(EDGE_NUMBERS),
)
CHARS = st.one_of(
    st.sampled_from(
        [
            *["\x00", "\x01", "\x7f", "\x80", "\xff", "a", "b", "é", "\uffff", "\ue000"],
            *["\ud800", "\udfff"],  # lone surrogates
            *["\U0001f600", "\U0010ffff"],  # astral
        ]
    ),
    st.characters(),
)
strings = st.text(CHARS, max_size=6)
names = st.text(st.sampled_from(["a", "b", "\x00", "é", "\U0001f600"]), max_size=3)
scalars = st.one_of(st.none(), st.booleans(), numbers, strings)
json_values = st.recursive(
    scalars,
    lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(names, c, max_size=4)),
    max_leaves=8,
)
top_values = st.one_of(st.just(MISSING), json_values)
docids = st.one_of(st.sampled_from(["", "a", "a\x00", "a\x00b", "b", "doc::1"]), strings)


@st.composite
def value_pools(draw: st.DrawFn, min_size: int = 2) -> list[Any]:
    """A few values plus equal twins of some, so equal pairs are common."""
    values = draw(st.lists(top_values, min_size=min_size, max_size=5))
    rnd = draw(st.randoms(use_true_random=False))
    return values + [twin(v, rnd) for v in values[:2]]


@st.composite
def keyed_index(draw: st.DrawFn) -> tuple[list[bool], list[list[Any]]]:
    """DESC flags for an index of 1..3 parts and full-length keys drawn from a small pool."""
    n = draw(st.integers(1, 3))
    desc = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    pool = draw(value_pools(min_size=1))
    keys = draw(
        st.lists(st.lists(st.sampled_from(pool), min_size=n, max_size=n), min_size=2, max_size=7)
    )
    return desc, keys


# --------------------------------------------------------------------------- properties


@PROPS
@given(value_pools())
def test_byte_order_matches_collate(values: list[Any]) -> None:
    enc = [encode_value(v) for v in values]
    for i, a in enumerate(values):
        for j, b in enumerate(values):
            c = collate(a, b)
            assert bcmp(enc[i], enc[j]) == c, (a, b)
            assert collate(b, a) == -c


@PROPS
@given(top_values, st.randoms(use_true_random=False))
def test_equal_values_encode_identically(v: Any, rnd: random.Random) -> None:
    w = twin(v, rnd)
    assert collate(v, w) == 0
    assert encode_value(v) == encode_value(w)


@PROPS
@given(top_values)
def test_roundtrip_with_numeric_normalisation(v: Any) -> None:
    decoded = decode_value(encode_value(v))
    assert same(decoded, normalise(v)), (v, decoded)
    assert collate(decoded, v) == 0


@PROPS
@given(st.lists(numbers, min_size=2, max_size=6))
def test_numbers_against_python_exact_comparison(xs: list[int | float]) -> None:
    enc = [encode_value(x) for x in xs]
    for i, a in enumerate(xs):
        back = decode_value(enc[i])
        integral = isinstance(a, int) or a.is_integer()
        assert back == a and type(back) is (int if integral else float)
        for j, b in enumerate(xs):
            assert bcmp(enc[i], enc[j]) == sign((a > b) - (a < b)), (a, b)


@PROPS
@given(st.lists(strings, min_size=2, max_size=6))
def test_strings_against_code_point_order(xs: list[str]) -> None:
    enc = [encode_value(x) for x in xs]
    for i, a in enumerate(xs):
        assert decode_value(enc[i]) == a
        for j, b in enumerate(xs):
            assert bcmp(enc[i], enc[j]) == sign((a > b) - (a < b)), (a, b)


@PROPS
@given(value_pools())
def test_encodings_are_prefix_free_and_concatenate(values: list[Any]) -> None:
    enc = [encode_value(v) for v in values]
    for ea in enc:
        for eb in enc:
            if ea != eb:
                assert not eb.startswith(ea)
                inv_a, inv_b = (e.translate(keycodec_values.INVERT) for e in (ea, eb))
                assert not inv_b.startswith(inv_a)
    assert all(
        same(a, normalise(b)) for a, b in zip(decode_key(b"".join(enc)), values, strict=True)
    )


@FEW
@given(value_pools())
def test_sorted_by_collation_key_agrees_with_collate(values: list[Any]) -> None:
    by_key = sorted(values, key=collation_key)
    by_cmp = sorted(values, key=functools.cmp_to_key(collate))
    assert [collation_key(v) for v in by_key] == [collation_key(v) for v in by_cmp]
    for a, b in itertools.pairwise(by_cmp):
        assert collate(a, b) <= 0


@PROPS
@given(keyed_index(), st.data())
def test_composite_keys_with_desc_parts(
    index: tuple[list[bool], list[list[Any]]], data: st.DataObject
) -> None:
    desc, keys = index
    # Also shorter keys (prefixes), as used for range bounds.
    keys = keys + [k[: data.draw(st.integers(0, len(k)))] for k in keys[:3]]
    enc = [encode_key(k, desc) for k in keys]
    for i, a in enumerate(keys):
        assert same(decode_key(enc[i], desc), normalise(a))
        for j, b in enumerate(keys):
            assert bcmp(enc[i], enc[j]) == ref_key_cmp(a, b, desc), (a, b, desc)


@PROPS
@given(keyed_index(), st.lists(docids, min_size=1, max_size=4), st.data())
def test_entries_sort_by_key_then_docid(
    index: tuple[list[bool], list[list[Any]]], ids: list[str], data: st.DataObject
) -> None:
    desc, keys = index
    picks = data.draw(st.lists(st.sampled_from(ids), min_size=len(keys), max_size=len(keys)))
    entries = list(zip(keys, picks, strict=True))
    enc = [encode_entry(k, d, desc) for k, d in entries]
    for i, (ka, da) in enumerate(entries):
        key, docid = decode_entry(enc[i], desc)
        assert same(key, normalise(ka)) and docid == da
        for j, (kb, db) in enumerate(entries):
            expected = ref_key_cmp(ka, kb, desc) or sign((da > db) - (da < db))
            assert bcmp(enc[i], enc[j]) == expected, (entries[i], entries[j])


@PROPS
@given(keyed_index(), st.lists(docids, min_size=1, max_size=3), st.data())
def test_prefix_bounds_contain_exactly_matching_entries(
    index: tuple[list[bool], list[list[Any]]], ids: list[str], data: st.DataObject
) -> None:
    desc, keys = index
    k = data.draw(st.integers(0, len(desc)))
    rnd = data.draw(st.randoms(use_true_random=False))
    prefix = [twin(v, rnd) for v in data.draw(st.sampled_from(keys))[:k]]
    low, high = key_prefix_bounds(prefix, desc)
    assert low < high
    for key in keys:
        for docid in ids:
            e = encode_entry(key, docid, desc)
            matches = all(collate(key[i], prefix[i]) == 0 for i in range(k))
            assert (low <= e < high) == matches, (key, prefix, desc)


@PROPS
@given(st.binary(min_size=1, max_size=6), st.binary(max_size=4))
def test_successor_bounds_every_extension(prefix: bytes, suffix: bytes) -> None:
    if not prefix.rstrip(b"\xff"):
        with pytest.raises(ShardexError):
            successor(prefix)
        return
    s = successor(prefix)
    assert prefix <= prefix + suffix < s
    # Minimal: s is the prefix cut before its trailing FF bytes with the last byte plus one, so
    # nothing lies strictly between the extensions of prefix and s.
    assert s[:-1] == prefix.rstrip(b"\xff")[:-1] and len(s) <= len(prefix)


@FEW
@given(
    st.integers(1, 30).flatmap(lambda g: st.tuples(st.just(g), st.integers(0, 2 ** (7 * g) - 1)))
)
def test_fraction_groups_match_naive_loop(gm: tuple[int, int]) -> None:
    g, m = gm
    naive = bytes(
        (((m >> (7 * (g - 1 - i))) & 0x7F) << 1) | (1 if i < g - 1 else 0) for i in range(g)
    )
    assert keycodec_values.groups_to_bytes(m, g) == naive
    assert keycodec_values.bytes_to_groups(naive) == m
