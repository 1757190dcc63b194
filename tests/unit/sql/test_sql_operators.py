"""The local streaming operators: each on its own, two-phase aggregation against one phase,
sort collation, top-N against a full sort, and the merge of sorted inputs."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardex.core.expr import MISSING
from shardex.sql.operators import (
    AggSpec,
    ProjectTerm,
    SortSpec,
    aggregate,
    distinct,
    encode_sort_key,
    filter_rows,
    final_aggregate,
    merge_sorted,
    offset_limit,
    partial_aggregate,
    project,
    scan,
    sort_pairs,
    value_identity,
)


def test_scan_filter_offset_limit() -> None:
    rows = list(scan([{"a": i} for i in range(10)]))
    kept = list(filter_rows(rows, lambda r: r["a"] % 3 if r["a"] else None))
    assert [r["a"] for r in kept] == [1, 2, 4, 5, 7, 8]  # 0 -> NULL and multiples of 3 -> 0
    assert [r["a"] for r in offset_limit(kept, 2, 3)] == [4, 5, 7]
    assert list(offset_limit(kept, 10, 1)) == []


def test_project_omits_missing_and_merges_stars() -> None:
    terms = [
        ProjectTerm(lambda r: r.get("a", MISSING), "a"),
        ProjectTerm(lambda r: r.get("obj", MISSING), None, star=True),
        ProjectTerm(lambda r: r.get("n", MISSING), "n"),
    ]
    out = list(project([{"a": 1, "obj": {"x": 1, "y": 2}}, {"n": None, "obj": 5}], terms))
    assert out == [{"a": 1, "x": 1, "y": 2}, {"n": None}]
    raw = list(project([{"a": 1}, {}], raw=lambda r: r.get("a", MISSING)))
    assert raw == [1]  # a MISSING raw value yields no row
    keyed = list(project([{"a": 2}], raw=lambda r: r["a"], sort_key=lambda r, v: b"k"))
    assert keyed == [(b"k", 2)]


def test_distinct_uses_sql_equality() -> None:
    assert list(distinct([1, 1.0, True, "1", [1], [1.0], {"a": 1}, {"a": 1.0}, None])) == [
        1,
        True,
        "1",
        [1],
        {"a": 1},
        None,
    ]


COLLATION = [MISSING, None, False, True, -5, 0, 0.5, 2, "", "a", "b", [], [1], [1, 2], {}, {"a": 1}]


def test_sort_collation_order() -> None:
    shuffled = COLLATION[:]
    random.Random(7).shuffle(shuffled)
    pairs = [(encode_sort_key([v], [SortSpec()]), v) for v in shuffled]
    assert [v for _, v in sort_pairs(pairs)] == COLLATION
    desc = [(encode_sort_key([v], [SortSpec(desc=True)]), v) for v in shuffled]
    # DESC: values reversed, MISSING/NULL last by default (NULL before MISSING).
    assert [v for _, v in sort_pairs(desc)] == [*COLLATION[2:][::-1], None, MISSING]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (SortSpec(nulls_first=False), [1, 2, MISSING, None]),
        (SortSpec(desc=True, nulls_first=True), [None, MISSING, 2, 1]),
    ],
)
def test_nulls_first_last(spec: SortSpec, expected: list[Any]) -> None:
    pairs = [(encode_sort_key([v], [spec]), v) for v in [2, None, 1, MISSING]]
    assert [v for _, v in sort_pairs(pairs)] == expected


def test_composite_keys_compare_term_by_term() -> None:
    specs = [SortSpec(), SortSpec(desc=True)]
    rows = [("a", 1), ("a", 3), ("b", 0), ("a", 2), ("ab", 9)]
    pairs = [(encode_sort_key(list(r), specs), r) for r in rows]
    assert [v for _, v in sort_pairs(pairs)] == [("a", 3), ("a", 2), ("a", 1), ("ab", 9), ("b", 0)]


values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5),
    st.floats(-5, 5, allow_nan=False),
    st.sampled_from(["", "a", "b", "ab"]),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(values, values), max_size=40), st.integers(0, 45))
def test_top_n_equals_full_sort_then_limit(rows: list[tuple[Any, Any]], n: int) -> None:
    specs = [SortSpec(desc=True), SortSpec()]
    pairs = [(encode_sort_key(list(r), specs), i) for i, r in enumerate(rows)]
    assert sort_pairs(pairs, n) == sort_pairs(pairs)[:n]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(-20, 20), max_size=50), st.integers(1, 5))
def test_merge_sorted_equals_sort(xs: list[int], parts: int) -> None:
    pairs = [(encode_sort_key([x], [SortSpec()]), x) for x in xs]
    chunks = [sort_pairs(pairs[i::parts]) for i in range(parts)]
    assert [v for _, v in merge_sorted(*chunks)] == [v for _, v in sort_pairs(pairs)]


AGGS = [
    AggSpec("COUNT", None),
    AggSpec("COUNT", lambda r: r.get("v", MISSING)),
    AggSpec("SUM", lambda r: r.get("v", MISSING)),
    AggSpec("AVG", lambda r: r.get("v", MISSING)),
    AggSpec("MIN", lambda r: r.get("v", MISSING)),
    AggSpec("MAX", lambda r: r.get("v", MISSING)),
    AggSpec("COUNT", lambda r: r.get("v", MISSING), distinct=True),
    AggSpec("SUM", lambda r: r.get("v", MISSING), distinct=True),
    AggSpec("ARRAY_AGG", lambda r: r.get("v", MISSING), distinct=True),
]
KEYS = [lambda r: r.get("g", MISSING)]


def _rows(draw_values: list[tuple[Any, Any]]) -> list[dict[str, Any]]:
    out = []
    for g, v in draw_values:
        row: dict[str, Any] = {}
        if g is not MISSING:
            row["g"] = g
        if v is not MISSING:
            row["v"] = v
        out.append(row)
    return out


def _ident(values: tuple[Any, ...]) -> bytes:
    return b"".join(value_identity(v) for v in values)


agg_values = st.one_of(
    st.just(MISSING),
    st.none(),
    st.integers(-(10**20), 10**20),
    st.floats(-1e6, 1e6, allow_nan=False),
    st.sampled_from(["x", "y", True]),
)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([MISSING, None, 1, 1.0, "a", "b"]), agg_values), max_size=60
    ),
    st.integers(1, 6),
    st.randoms(use_true_random=False),
)
def test_partial_then_final_equals_single_phase(pairs: list, leaves: int, rnd: Any) -> None:
    rows = _rows(pairs)
    # Groups are keyed by SQL++ equality (1 and 1.0 are one group).
    single = {_ident(k): v for k, v in aggregate(rows, KEYS, AGGS)}
    # Split the rows among leaves at random, aggregate each, merge the partials shuffled.
    buckets: list[list[Any]] = [[] for _ in range(leaves)]
    for r in rows:
        buckets[rnd.randrange(leaves)].append(r)
    partials = [p for b in buckets for p in partial_aggregate(b, KEYS, AGGS)]
    rnd.shuffle(partials)
    merged = {_ident(k): v for k, v in final_aggregate(partials, AGGS)}
    assert merged.keys() == single.keys()
    for k in single:
        assert _ident(merged[k]) == _ident(single[k]), k


def test_aggregate_values() -> None:
    rows = [
        {"g": "a", "v": 1},
        {"g": "a", "v": 2.5},
        {"g": "a", "v": None},
        {"g": "a"},
        {"g": "b", "v": "s"},
        {"g": "a", "v": 1},
    ]
    out = {k[0]: v for k, v in aggregate(rows, KEYS, AGGS)}
    assert out["a"] == (5, 3, 4.5, 1.5, 1, 2.5, 2, 3.5, [1, 2.5])
    assert out["b"] == (1, 1, None, None, "s", "s", 1, None, ["s"])
    # No GROUP BY over no rows: one group, COUNT 0, others NULL.
    assert list(aggregate([], [], AGGS, global_group=True)) == [
        ((), (0, 0, None, None, None, None, 0, None, None))
    ]
    assert list(aggregate([], KEYS, AGGS)) == []  # with GROUP BY: no groups


def test_sum_is_exact_whatever_the_order() -> None:
    xs = [1e16, 1.0, -1e16, 1.0, 0.1, 0.2]
    spec = [AggSpec("SUM", lambda r: r)]
    forward = next(iter(aggregate(xs, [], spec)))[1][0]
    backward = next(iter(aggregate(xs[::-1], [], spec)))[1][0]
    # The exact sum rounded once (fsum), not the order-dependent float accumulation.
    assert forward == backward == math.fsum(xs) == 2.3


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(agg_values, st.integers(1, 5)), max_size=20))
def test_a_run_accumulates_as_its_rows_one_by_one(runs: list[tuple[Any, int]]) -> None:
    """``accumulate`` of a run (a covering scan's run of entries with one key) leaves every kind
    of state as ``n`` single steps do, ARRAY_AGG's list included."""
    from shardex.sql.operators.aggregate import _accumulate, _finalize, _init

    specs = [*AGGS, AggSpec("ARRAY_AGG", lambda r: r.get("v", MISSING))]
    for spec in specs:
        one, many = _init(spec), _init(spec)
        for v, n in runs:
            row = _rows([(MISSING, v)])[0]
            for _ in range(n):
                one = _accumulate(spec, one, row)
            many = _accumulate(spec, many, row, n)
        assert _ident((_finalize(spec, many),)) == _ident((_finalize(spec, one),)), spec
