"""Scan spans: the caller's form, validation, encoding in index order, partition elimination."""

from __future__ import annotations

import random

import pytest

from shardex.api.spans import (
    decode_user_span,
    decode_user_spans,
    eliminate,
    eliminate_decoded,
    encode_decoded,
    encode_spans,
    plain_spans,
    to_user_spans,
)
from shardex.core.keycodec import decode_entry, encode_entry
from shardex.core.spans import in_ranges, spans_to_ranges
from shardex.errors import ErrorCode, ShardexError
from shardex.meta.index_definition import index_partition_of, make_definition

AGE_NAME = make_definition(id="i1", name="by_age", keyspace="ks", keys=["age", "name"])
AGE_DESC = make_definition(id="i2", name="by_age_d", keyspace="ks", keys=[("age", True), "name"])
BY_CITY = make_definition(
    id="i3",
    name="by_city",
    keyspace="ks",
    keys=["city", "age"],
    partition_by=["city"],
    num_partition=8,
)
BY_ID = make_definition(
    id="i4",
    name="by_id",
    keyspace="ks",
    keys=["META().id"],
    partition_by=["META().id"],
    num_partition=5,
)


def selected(defn, spans, rows):  # type: ignore[no-untyped-def]
    """The rows (key parts, docid) a scan of ``spans`` returns, by the spans' byte ranges."""
    ranges = spans_to_ranges(encode_spans(to_user_spans(spans), defn))
    entries = sorted(encode_entry(k, d, defn.desc) for k, d in rows)
    return [decode_entry(e, defn.desc) for e in entries if in_ranges(e, ranges)]


def test_inclusion_and_prefix_bounds_select_by_leading_parts() -> None:
    rows = [([a, n], f"d{a}{n}") for a in range(5) for n in ("x", "y")]
    ages = lambda spans: [k[0] for k, _ in selected(AGE_NAME, spans, rows)]  # noqa: E731
    assert ages([{"low": [1], "high": [3], "inclusion": "both"}]) == [1, 1, 2, 2, 3, 3]
    assert ages([{"low": [1], "high": [3], "inclusion": "low"}]) == [1, 1, 2, 2]
    assert ages([{"low": [1], "high": [3], "inclusion": "high"}]) == [2, 2, 3, 3]
    assert ages([{"low": [1], "high": [3], "inclusion": "neither"}]) == [2, 2]
    assert ages([{"low": None, "high": [1]}]) == [0, 0, 1, 1]
    assert ages([{"low": [4]}]) == [4, 4]
    assert ages(None) == [k[0] for k, _ in sorted(rows)]
    # A full-length bound bounds the second part too.
    got = selected(AGE_NAME, [{"low": [2, "y"], "high": [3, "x"]}], rows)
    assert [k for k, _ in got] == [[2, "y"], [3, "x"]]
    # Overlapping spans never return a row twice.
    assert ages([{"low": [1], "high": [2]}, {"low": [2], "high": [3]}]) == [1, 1, 2, 2, 3, 3]


def test_desc_bounds_are_in_index_order() -> None:
    rows = [([a, "n"], f"d{a}") for a in range(6)]
    got = selected(AGE_DESC, [{"low": [4], "high": [1]}], rows)
    assert [k[0] for k, _ in got] == [4, 3, 2, 1]  # descending, low = the larger age
    assert selected(AGE_DESC, [{"low": [1], "high": [4]}], rows) == []  # an empty range


def test_numbers_collate_exactly_in_bounds() -> None:
    rows = [([v, "n"], f"d{i}") for i, v in enumerate([1, 1.5, 2, 2**70, 10**30])]
    got = selected(AGE_NAME, [{"low": [1.0], "high": [2**70], "inclusion": "both"}], rows)
    assert [k[0] for k, _ in got] == [1, 1.5, 2, 2**70]


@pytest.mark.parametrize(
    ("spans", "fragment"),
    [
        ([{"low": [1], "inclusion": "all"}], "inclusion must be one of"),
        ([{"low": 5}], "must be a list of key parts"),
        ([{"low": "abc"}], "must be a list of key parts"),
        ([{"lo": [1]}], "unknown field"),
        ([[1, 2]], "must be a dict"),
        ([{"low": [float("nan")]}], "is not JSON"),
        ([{"low": [object()]}], "is not JSON"),
    ],
)
def test_bad_spans_are_refused_with_the_failing_value(spans, fragment) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ShardexError) as info:
        to_user_spans(spans)
    assert info.value.code is ErrorCode.BAD_REQUEST
    assert fragment in info.value.message
    assert "span" in info.value.details


def test_a_bound_with_more_parts_than_keys_is_refused() -> None:
    with pytest.raises(ShardexError) as info:
        encode_spans(to_user_spans([{"low": [1, "a", 3]}]), AGE_NAME)
    assert info.value.code is ErrorCode.BAD_REQUEST
    assert "3 parts" in info.value.message


@pytest.mark.parametrize("seed", range(5))
def test_elimination_picks_the_slice_the_router_uses(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(50):
        city = rng.choice(["paris", "rome", 7, 7.0, None, [1, "a"]])
        doc = {"city": city, "age": rng.randrange(99)}
        want = index_partition_of(BY_CITY, doc, "d1")
        spans = [{"low": [city, 10], "high": [city, 20]}]
        assert eliminate(to_user_spans(spans), BY_CITY) == [want]
        docid = f"doc{rng.randrange(10**6)}"
        want_id = index_partition_of(BY_ID, {}, docid)
        assert eliminate(to_user_spans([{"low": [docid], "high": [docid]}]), BY_ID) == [want_id]


def test_elimination_needs_every_span_to_fix_the_partition_key() -> None:
    every = list(range(8))
    fixed = {"low": ["rome"], "high": ["rome"]}
    assert eliminate(to_user_spans([{"low": ["paris"], "high": ["rome"]}]), BY_CITY) == every
    assert eliminate(to_user_spans([fixed, {"low": ["a"]}]), BY_CITY) == every
    assert eliminate(to_user_spans([]), BY_CITY) == every
    two = eliminate(to_user_spans([fixed, {"low": ["oslo", 1], "high": ["oslo", 9]}]), BY_CITY)
    assert 1 <= len(two) <= 2
    # Not partitioned by a key part: no elimination possible.
    other = make_definition(
        id="i5", name="o", keyspace="ks", keys=["age"], partition_by=["city"], num_partition=4
    )
    assert eliminate(to_user_spans([{"low": [1], "high": [1]}]), other) == [0, 1, 2, 3]


PLAIN_PARTS = [None, True, False, 0, -7, 2**70, "", "ann", 'é\u2028"\\x', "\ud800"]


def _checked(spans, defn):  # type: ignore[no-untyped-def]
    """The spans decoded the checked way (through the JSON text of the wire form), span by
    span; ``decode_user_spans`` (a scan's one decode) gives the same."""
    n = len(defn.keys)
    one_by_one = [
        (*decode_user_span(s, i, n), s.inclusion) for i, s in enumerate(to_user_spans(spans))
    ]
    assert decode_user_spans(to_user_spans(spans), defn) == one_by_one
    return one_by_one


@pytest.mark.parametrize("seed", range(20))
def test_plain_spans_decode_as_the_checked_form_does(seed: int) -> None:
    """Without the JSON text, spans of plain parts decode, encode and eliminate exactly as
    through it (the planner's spans take this way): the same parts, the same types."""
    rng = random.Random(seed)
    for defn in (AGE_NAME, AGE_DESC, BY_CITY, BY_ID):
        n = len(defn.keys)
        spans = []
        for _ in range(rng.randint(1, 4)):
            low = [rng.choice(PLAIN_PARTS) for _ in range(rng.randint(0, n))]
            high = rng.choice([low, [rng.choice(PLAIN_PARTS) for _ in range(rng.randint(0, n))]])
            spans.append(
                {
                    "low": rng.choice([low, None]),
                    "high": rng.choice([high, None]),
                    "inclusion": rng.choice(["both", "low", "high", "neither"]),
                }
            )
        plain = plain_spans(spans, n)
        checked = _checked(spans, defn)
        assert plain == checked
        assert [tuple(map(type, b or [])) for p in plain for b in p[:2]] == [
            tuple(map(type, b or [])) for c in checked for b in c[:2]
        ]
        assert encode_decoded(plain, defn) == encode_spans(to_user_spans(spans), defn)
        assert eliminate_decoded(plain, defn) == eliminate(to_user_spans(spans), defn)


@pytest.mark.parametrize("bound", [[1.5], [float("nan")], [[1]], [{"a": 1}], (1,), ["a", "b", "c"]])
def test_spans_with_other_parts_take_the_checked_way(bound) -> None:  # type: ignore[no-untyped-def]
    """A float (JSON may write it another way, NaN is refused), a nested value, a tuple or
    more parts than keys: ``plain_spans`` declines, so the checked form decides."""
    assert plain_spans([{"low": bound, "high": None, "inclusion": "both"}], 2) is None
