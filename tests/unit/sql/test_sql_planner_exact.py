"""``planner.exact.where_decided``: when it says the spans decide the WHERE clause, the
entries inside the spans are exactly the rows the clause accepts, checked with the real
evaluator and key codec over every pair of key values (MISSING, NULL, booleans, numbers,
strings, arrays, objects), ASC and DESC parts, constants and parameters."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardex.core.expr import MISSING, evaluate, parse_expression
from shardex.core.keycodec import encode_key
from shardex.core.spans import Span, in_ranges, spans_to_ranges
from shardex.sql.planner.exact import where_decided
from shardex.sql.planner.key_ranges import key_spans
from shardex.sql.planner.sargable import constrain_keys

KEYS = [parse_expression("a"), parse_expression("b")]
VALUES: list[Any] = [MISSING, None, False, True, -2, 0, 1, 1.0, 1.5, 3, "", "a", "ab", "b"]
VALUES += [[], [1], [None], {}, {"x": 1}]


def _decided(where: str, params: Any = None) -> bool:
    expr = parse_expression(where)
    return where_decided(expr, KEYS, constrain_keys(expr, KEYS), params)


def _rows(where: str, desc: list[bool], params: Any) -> tuple[set, set]:
    """(pairs of VALUES the WHERE accepts, pairs whose index entry is inside the spans)."""
    expr = parse_expression(where)
    spans = key_spans(constrain_keys(expr, KEYS), desc, params)

    def enc(bound: list | None) -> bytes | None:
        return None if bound is None else encode_key(bound, desc)

    inclusive = {"both": (True, True), "low": (True, False), "high": (False, True)}
    ranges = spans_to_ranges(
        [
            Span(enc(s["low"]), enc(s["high"]), *inclusive.get(s["inclusion"], (False, False)))
            for s in spans
        ]
    )
    accepted, inside = set(), set()
    for i, a in enumerate(VALUES):
        for j, b in enumerate(VALUES):
            row = {k: v for k, v in (("a", a), ("b", b)) if v is not MISSING}
            if evaluate(expr, row, params=params) is True:
                accepted.add((i, j))
            if in_ranges(encode_key([a, b], desc) + b"\x02", ranges):
                inside.add((i, j))
    return accepted, inside


_bound = st.sampled_from(
    [
        *("NULL", "MISSING", "FALSE", "TRUE", "-2", "0", "1", "1.0", "1.5", "3"),
        *('""', '"a"', '"b"', "[]", "[1]", "{}", "$1", "$2"),
    ]
)
_param = st.sampled_from([None, False, 1, 2.5, "a", "ab", [], [None], {"x": 1}])
_op = st.sampled_from(["=", "<", "<=", ">", ">="])


@st.composite
def _term(draw: st.DrawFn) -> str:
    k = draw(st.sampled_from(["a", "b"]))
    kind = draw(st.sampled_from(["cmp", "flip", "between", "in", "is", "like", "or", "other"]))
    if kind == "cmp":
        return f"{k} {draw(_op)} {draw(_bound)}"
    if kind == "flip":
        return f"{draw(_bound)} {draw(_op)} {k}"
    if kind == "between":
        return f"{k} BETWEEN {draw(_bound)} AND {draw(_bound)}"
    if kind == "in":
        return f"{k} IN [{draw(_bound)}, {draw(_bound)}]"
    if kind == "is":
        return f"{k} IS {draw(st.sampled_from(['NULL', 'NOT NULL', 'NOT MISSING', 'VALUED']))}"
    if kind == "like":
        return f'{k} LIKE "{draw(st.sampled_from(["", "a", "b"]))}%"'
    if kind == "or":
        return f"({k} {draw(_op)} {draw(_bound)} OR {k} {draw(_op)} {draw(_bound)})"
    return f"{k} + 1 > {draw(_bound)}"


@settings(max_examples=600, deadline=None)
@given(
    st.lists(_term(), min_size=1, max_size=3),
    st.lists(st.booleans(), min_size=2, max_size=2),
    st.lists(_param, min_size=2, max_size=2),
)
def test_decided_spans_select_exactly_the_accepted_rows(
    terms: list[str], desc: list[bool], params: list[Any]
) -> None:
    where = " AND ".join(terms)
    if not _decided(where, params):
        return  # the filter runs: spans need only be a superset (test_sql_planner_spans)
    accepted, inside = _rows(where, desc, params)
    assert accepted == inside, (where, desc, params)


@pytest.mark.parametrize(
    ("where", "params"),
    [
        ('a = "x" AND b BETWEEN 1 AND 9', None),
        ("a = $1 AND b >= $2", ["x", 3]),
        ("a = $1 AND b BETWEEN $2 AND $3", ["x", 3, 4.5]),
        ("a > 3 AND a <= 8", None),
        ("5 > a", None),
        ("a = TRUE AND b < 0", None),
        ("a = 1 AND b = 2", None),
    ],
)
def test_comparisons_with_scalars_on_bound_key_parts_are_decided(where: str, params: Any) -> None:
    assert _decided(where, params)
    for desc in ([False, False], [True, False], [False, True]):
        accepted, inside = _rows(where, desc, params)
        assert accepted == inside, (where, desc)


@pytest.mark.parametrize(
    ("where", "params", "why"),
    [
        ("a = $1 AND b > 1", [None], "NULL bound: the spans hold the NULL keys"),
        ("a = $1", [[1, None]], "an array bound: = is NULL where collation says equal"),
        ("a = $1", [{"x": 1}], "an object bound"),
        ("a > 1 AND b = 2", None, "b after a range on a: the spans do not bound it"),
        ("b = 2", None, "b without a on a: not a leading part"),
        ("a IN [1, 2]", None, "IN stays a filter"),
        ("(a = 1 OR a = 3)", None, "OR stays a filter"),
        ('a LIKE "x%"', None, "LIKE prefix is a superset"),
        ("a IS NOT NULL", None, "IS checks stay filters"),
        ("a + 1 > 2", None, "not sargable"),
        ("a = 1 AND a + 1 > 2", None, "one term the spans do not see"),
    ],
)
def test_anything_else_keeps_the_filter(where: str, params: Any, why: str) -> None:
    assert not _decided(where, params), why
