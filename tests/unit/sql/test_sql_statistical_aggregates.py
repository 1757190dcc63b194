"""MEDIAN, COUNTN and the VARIANCE / STDDEV family as N1QL defines them: numbers only (other
values, NULL and MISSING are skipped), sample against population for one value, DISTINCT
forms, exact sums (no cancellation), and the values of Couchbase's conformance cases that
aggregate over UNNEST (aggregate_functions/case_median_stddev_variance.json), here over one
document per unnested order line. The distributed forms (PARTIAL on leaves, FINAL at the
root, spilling) are checked against these in test_sql_exec_fragment_rows and
test_sql_exec_spill."""

from __future__ import annotations

import math
from typing import Any

import pytest

from shardex.sql.exec.rows import decode_row, encode_row, pack_state
from shardex.sql.local import LocalEngine
from shardex.sql.operators import AggSpec
from shardex.sql.operators.aggregate import SquaresState, aggregate


def _engine(values: list[Any]) -> LocalEngine:
    e = LocalEngine()
    e.create_keyspace("t")
    e.keyspaces["t"].update({f"d{i}": {"x": v} for i, v in enumerate(values)})
    return e


def _one(values: list[Any], term: str) -> Any:
    return _engine(values).query(f"SELECT {term} AS r FROM t")[0].get("r", "MISSING")


# The order lines' quantities of the agg_func orders (the rows UNNEST makes there).
QTY = [1, 1, 2, 1, 1, 1, 1, 1]


@pytest.mark.parametrize(
    ("term", "expected"),
    [
        ("MEDIAN(x)", 1),
        ("MEDIAN(DISTINCT x)", 1.5),
        ("STDDEV(x)", 0.3535533905932738),
        ("STDDEV_SAMP(DISTINCT x)", 0.7071067811865476),
        ("STDDEV_SAMP(x)", 0.3535533905932738),
        ("STDDEV(DISTINCT x)", 0.7071067811865476),
        ("VARIANCE_SAMP(x)", 0.125),
        ("VARIANCE_POP(x)", 0.109375),
        ("VARIANCE_POP(DISTINCT x)", 0.25),
        ("VARIANCE_SAMP(DISTINCT x)", 0.5),
    ],
)
def test_the_conformance_values_over_unnested_rows(term: str, expected: float) -> None:
    assert _one(QTY, term) == expected


MIXED = [10, 10, 11, "abc", "efg", None, True, [1], {"a": 1}]


def test_non_numbers_null_and_missing_are_skipped() -> None:
    e = _engine(MIXED)
    e.keyspaces["t"]["nox"] = {"y": 1}  # x MISSING
    row = e.query(
        "SELECT COUNTN(x) AS n, COUNTN(DISTINCT x) AS dn, COUNT(x) AS c, MEDIAN(x) AS md, "
        "VARIANCE(x) AS v, VAR_POP(x) AS vp FROM t"
    )[0]
    assert row == {"n": 3, "dn": 2, "c": 8, "md": 10, "v": pytest.approx(1 / 3), "vp": 2 / 9}


@pytest.mark.parametrize(
    ("term", "expected"),
    [
        ("VARIANCE(x)", 0.0),  # one value: 0 (N1QL), not NULL
        ("STDDEV(x)", 0.0),
        ("VAR_POP(x)", 0.0),
        ("STDDEV_POP(x)", 0.0),
        ("VAR_SAMP(x)", None),  # the sample forms need two values
        ("VARIANCE_SAMP(x)", None),
        ("STDDEV_SAMP(x)", None),
        ("MEDIAN(x)", 11),
        ("COUNTN(x)", 1),
    ],
)
def test_one_number(term: str, expected: Any) -> None:
    assert _one([11, "s"], term) == expected


@pytest.mark.parametrize("term", ["MEDIAN(x)", "VARIANCE(x)", "STDDEV_POP(x)", "VAR_SAMP(x)"])
def test_no_number_is_null(term: str) -> None:
    assert _one(["a", None], term) is None
    assert _engine([]).query(f"SELECT {term} AS r FROM t") == [{"r": None}]


def test_median_of_an_even_count_is_the_mean_of_the_middle_two() -> None:
    assert _one([4, 1, 3, 2], "MEDIAN(x)") == 2.5
    assert _one([1, 3, 5, 100], "MEDIAN(x)") == 4  # an int when the mean is one
    assert _one([0.1, 0.2], "MEDIAN(x)") == (0.1 + 0.2) / 2
    assert _one([2, 1.5, -7], "MEDIAN(x)") == 1.5


def test_variance_is_exact_where_floats_cancel() -> None:
    # Sum-of-squares in floats gives garbage here (1e18 swallows the 1s); Welford's float
    # update is close but split-dependent. Exact sums give the true 1.0 every time.
    big = [1e9 + 1, 1e9 + 2, 1e9 + 3]
    assert _one(big, "VARIANCE(x)") == 1.0
    assert _one([10**17 + 1, 10**17 + 3], "VAR_POP(x)") == 1.0
    assert _one([0.1] * 10, "STDDEV(x)") == 0.0


def test_squares_states_merge_to_the_same_bits_in_any_split() -> None:
    values = [x / 7 for x in range(-50, 200, 3)] + [10**12, -3]
    spec = [AggSpec("STDDEV_SAMP", lambda r: r)]
    whole = next(aggregate(values, [], spec))[1][0]
    parts = [SquaresState(), SquaresState(), SquaresState()]
    for i, v in enumerate(values):
        parts[i % 3].add(v)
    merged = SquaresState()
    for p in reversed(parts):
        merged.merge(decode_row(encode_row(pack_state(p))))  # as a leaf ships it
    assert merged.spread("STDDEV_SAMP") == whole
    mean = sum(values) / len(values)
    sample = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    assert whole == pytest.approx(sample, rel=1e-12)
