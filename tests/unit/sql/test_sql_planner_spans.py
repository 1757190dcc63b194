"""The planner's spans: every row the WHERE clause accepts lies in a span (always), and for
plain comparisons on constants nothing else does (exactness), checked against the
evaluator on random keys, predicates and ASC/DESC flags."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardex.core.expr import evaluate, parse_expression
from shardex.core.keycodec import encode_key
from shardex.core.spans import Span, in_ranges, spans_to_ranges
from shardex.sql.planner.key_ranges import key_spans, spans_for
from shardex.sql.planner.sargable import constrain_keys

KEYS = [parse_expression("a"), parse_expression("b")]
VALUES = [None, False, True, -2, 0, 1, 1.5, 3, "", "a", "ab", "abc", "b", [], [1], {}]


def _encoded_ranges(spans: list[dict], desc: list[bool]) -> list:
    def enc(bound: list | None) -> bytes | None:
        return None if bound is None else encode_key(bound, desc)

    out = []
    for s in spans:
        inc = s["inclusion"]
        out.append(
            Span(enc(s["low"]), enc(s["high"]), inc in ("both", "low"), inc in ("both", "high"))
        )
    return spans_to_ranges(out)


def _selected(where: str, desc: list[bool], params: object = None) -> tuple[set, set]:
    """(rows the WHERE accepts, rows inside the spans) over every (a, b) in VALUES^2."""
    expr = parse_expression(where)
    spans = spans_for(expr, KEYS, desc, params)
    ranges = _encoded_ranges(spans, desc)
    accepted, in_spans = set(), set()
    for i, a in enumerate(VALUES):
        for j, b in enumerate(VALUES):
            if evaluate(expr, {"a": a, "b": b}, params=params) is True:
                accepted.add((i, j))
            if in_ranges(encode_key([a, b], desc) + b"\x02", ranges):
                in_spans.add((i, j))
    return accepted, in_spans


_scalar = st.sampled_from(
    ["NULL", "FALSE", "TRUE", "-2", "0", "1", "1.5", "3", '""', '"a"', '"ab"', '"b"', "[]"]
)
_op = st.sampled_from(["=", "<", "<=", ">", ">="])
_key = st.sampled_from(["a", "b"])


@st.composite
def _atom(draw: st.DrawFn) -> str:
    k = draw(_key)
    kind = draw(st.sampled_from(["cmp", "flip", "between", "in", "isnull", "like", "or", "other"]))
    if kind == "cmp":
        return f"{k} {draw(_op)} {draw(_scalar)}"
    if kind == "flip":
        return f"{draw(_scalar)} {draw(_op)} {k}"
    if kind == "between":
        return f"{k} BETWEEN {draw(_scalar)} AND {draw(_scalar)}"
    if kind == "in":
        items = draw(st.lists(_scalar, max_size=4))
        return f"{k} IN [{', '.join(items)}]"
    if kind == "isnull":
        return f"{k} IS {draw(st.sampled_from(['', 'NOT ']))}NULL"
    if kind == "like":
        return f'{k} LIKE "{draw(st.sampled_from(["", "a", "ab", "b"]))}%"'
    if kind == "or":
        return f"({k} {draw(_op)} {draw(_scalar)} OR {k} {draw(_op)} {draw(_scalar)})"
    return f"{k} + 1 > {draw(_scalar)}"  # not sargable: left to the filter


@settings(max_examples=300, deadline=None)
@given(st.lists(_atom(), min_size=1, max_size=3), st.lists(st.booleans(), min_size=2, max_size=2))
def test_spans_cover_every_accepted_row(atoms: list[str], desc: list[bool]) -> None:
    accepted, in_spans = _selected(" AND ".join(atoms), desc)
    assert accepted <= in_spans, (atoms, desc, accepted - in_spans)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(_op, _scalar.filter(lambda s: s != "NULL")), min_size=1, max_size=3),
    st.booleans(),
)
def test_plain_comparisons_are_exact(terms: list[tuple[str, str]], desc: bool) -> None:
    where = " AND ".join(f"a {op} {v}" for op, v in terms)
    accepted, in_spans = _selected(where, [desc, False])
    assert accepted == in_spans, where


def test_equality_prefix_then_range() -> None:
    where = parse_expression('a = "x" AND b > 3 AND b <= 9')
    assert spans_for(where, KEYS, [False, False]) == [
        {"low": ["x", 3], "high": ["x", 9], "inclusion": "high"}
    ]
    # DESC second part: the interval is reversed in index order.
    assert spans_for(where, KEYS, [False, True]) == [
        {"low": ["x", 9], "high": ["x", 3], "inclusion": "low"}
    ]


def test_in_list_fans_out_and_contradiction_is_empty() -> None:
    spans = spans_for(parse_expression("a IN [2, 1, 2] AND b = 5"), KEYS, [False, False])
    assert spans == [
        {"low": [1, 5], "high": [1, 5], "inclusion": "both"},
        {"low": [2, 5], "high": [2, 5], "inclusion": "both"},
    ]
    assert spans_for(parse_expression("a = 1 AND a = 2"), KEYS, [False, False]) == []


def test_parameters_are_resolved_at_execution() -> None:
    per_key = constrain_keys(parse_expression("a >= $lo AND a < $2"), KEYS)
    assert key_spans(per_key, [False, False], {"lo": 10, "2": 20}) == [
        {"low": [10], "high": [20], "inclusion": "low"}
    ]
    # A missing field of a parameter object makes the comparison never TRUE.
    per_key = constrain_keys(parse_expression("a = $p.nothing"), KEYS)
    assert key_spans(per_key, [False, False], {"p": {}}) == []


def test_one_sided_comparison_skips_null_keys() -> None:
    assert spans_for(parse_expression("a < 5"), KEYS, [False, False]) == [
        {"low": [None], "high": [5], "inclusion": "neither"}
    ]


def test_no_sargable_predicate_is_a_full_scan() -> None:
    full = [{"low": None, "high": None, "inclusion": "both"}]
    assert spans_for(parse_expression("b = 1"), KEYS, [False, False]) == full
    assert spans_for(None, KEYS, [False, False]) == full


@pytest.mark.parametrize("where", ["a != 1", "NOT (a = 1)", "a + 0 = 1", "a = b"])
def test_non_sargable_forms_leave_the_key_unbounded(where: str) -> None:
    assert constrain_keys(parse_expression(where), KEYS)[0] == []
