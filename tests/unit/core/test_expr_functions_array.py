"""Array functions and array slices, with both engines (``expr_eval_env.py``): the edge cases
Couchbase's conformance cases do not cover (MISSING / NULL arguments, wrong types, negative
and fractional positions, collation of mixed types) and the size limit of the functions that
build arrays from a number."""

from __future__ import annotations

import pytest

from shardex.core.expr import parse_expression
from shardex.core.expr.functions_array import MAX_GENERATED_ELEMENTS
from shardex.errors import ErrorCode, ExpressionEvalError
from tests.unit.core.expr_eval_env import F, M, N, T, check_table, ev

ARRAY_FUNCTIONS: list[tuple[str, object]] = [
    ("ARRAY_APPEND(tags, 'x', 'y')", ["red", "green", "blue", "x", "y"]),
    ("ARRAY_APPEND(name, 1)", N),
    ("ARRAY_APPEND(nope, 1)", M),
    ("ARRAY_APPEND(tags, nope)", M),
    ("ARRAY_APPEND(nothing, 1)", N),
    ("ARRAY_PREPEND(0, 1, [2])", [0, 1, 2]),
    ("ARRAY_PREPEND(0, 'x')", N),
    ("ARRAY_PUT([1, 2], 2.0, 3, 3)", [1, 2, 3]),  # 2.0 is already there (1 == 1.0)
    ("ARRAY_INSERT([1, 2, 3], -1, 9)", [1, 2, 9, 3]),
    ("ARRAY_INSERT([1, 2, 3], 3, 8, 9)", [1, 2, 3, 8, 9]),
    ("ARRAY_INSERT([1, 2, 3], 4, 9)", N),
    ("ARRAY_INSERT([1, 2, 3], '1', 9)", N),
    ("ARRAY_CONCAT([1], [2], [])", [1, 2]),
    ("ARRAY_CONCAT([1], 'x')", N),
    ("ARRAY_REMOVE([1, 2, 1.0, [1]], 1)", [2, [1]]),
    ("ARRAY_REPLACE([1, 2, 1, 1], 1, 0, 2)", [0, 2, 0, 1]),
    ("ARRAY_REPLACE([1, 2, 1], 1, 0)", [0, 2, 0]),
    ("ARRAY_REPLACE([1, 2, 1], 1, 0, 0.5)", N),
    # Looking for a value uses "=": NULL, and anything holding NULL, equals nothing.
    ("ARRAY_REMOVE([1, [1, NULL], NULL], [1, NULL])", [1, [1, N], N]),
    ("ARRAY_CONTAINS([[1, NULL]], [1, NULL])", F),
    ("ARRAY_POSITION([[1, NULL]], [1, NULL])", -1),
    ("ARRAY_PUT([[NULL]], [NULL])", [[N], [N]]),
    ("ARRAY_EXCEPT([1, [NULL]], [[NULL]])", [1, [N]]),
    ("ARRAY_REPLACE([1, 2, NULL, 4], NULL, 99)", N),
    ("ARRAY_REPLACE_EQUIVALENT([1, 2, NULL, 4], NULL, 99)", [1, 2, 99, 4]),
    ("ARRAY_REPLACE_EQUIVALENT([[NULL], [NULL]], [NULL], 0, 1)", [0, [N]]),
    ("ARRAY_REPLACE_EQUIVALENT(nope, NULL, 0)", M),
    ("ARRAY_REPLACE_EQUIVALENT('x', NULL, 0)", N),
    ("ARRAY_REVERSE([])", []),
    ("ARRAY_REVERSE({'a': 1})", N),
    # Collation: NULL < FALSE < TRUE < numbers < strings < arrays < objects.
    (
        "ARRAY_SORT([{'a': 1}, [1], 'b', 2, 1.5, TRUE, FALSE, NULL])",
        [N, F, T, 1.5, 2, "b", [1], {"a": 1}],
    ),
    ("ARRAY_SORT('x')", N),
    ("ARRAY_DISTINCT([1, 1.0, 'a', 'a', [1], [1.0], NULL, NULL])", [1, "a", [1], N]),
    ("ARRAY_FLATTEN([1, [2, [3]]], 1.5)", N),
    ("ARRAY_FLATTEN([], -1)", []),
    ("ARRAY_MOVE([1, 2, 3], 2, 0)", [3, 1, 2]),
    ("ARRAY_MOVE([1, 2, 3], 0, 3)", N),
    ("ARRAY_SWAP([1, 2, 3], 0, 3)", N),
    ("ARRAY_REPEAT(NULL, 2)", N),  # NULL propagates, as in every non-conditional function
    ("ARRAY_REPEAT('a', 2.0)", ["a", "a"]),
    ("ARRAY_REPEAT('a', 2.5)", N),
    ("ARRAY_REPEAT('a', '2')", N),
    ("ARRAY_RANGE(0, 1, 0.25)", [0, 0.25, 0.5, 0.75]),
    ("ARRAY_RANGE(5, 0, -2)", [5, 3, 1]),
    ("ARRAY_RANGE(0, 5, -1)", []),
    ("ARRAY_RANGE(0, 5, 0)", N),
    ("ARRAY_RANGE('0', 5)", N),
    ("ARRAY_LENGTH('abc')", N),
    ("ARRAY_COUNT([1, NULL, 'a', NULL])", 2),
    ("ARRAY_CONTAINS([1, [2]], [2.0])", T),
    ("ARRAY_CONTAINS([1], NULL)", N),
    ("ARRAY_CONTAINS('abc', 'a')", N),
    ("ARRAY_CONTAINS_ALL([1], 'x')", N),
    ("ARRAY_POSITION([1, 2, 2], 2)", 1),
    ("ARRAY_POSITION([1, 2], 3)", -1),
    ("ARRAY_POS([1, 2], 2)", 1),
    ("ARRAY_BINARY_SEARCH(nope, 1)", M),
    ("ARRAY_BINARY_SEARCH(nothing, 1)", N),
    ("ARRAY_BINARY_SEARCH('abc', 1)", N),
    ("ARRAY_BINARY_SEARCH([1, 2.5, 3], 2.5)", 1),
    ("ARRAY_IFNULL([NULL, NULL])", N),
    ("ARRAY_IFNULL([])", N),
    ("ARRAY_MAX([1, 'a', NULL, [0]])", [0]),
    ("ARRAY_MIN([NULL, 3, FALSE, 'a'])", F),
    ("ARRAY_MIN([NULL])", N),
    ("ARRAY_MAX([])", N),
    ("ARRAY_SUM([1, 2.5, 'x', NULL])", 3.5),
    ("ARRAY_SUM([])", 0),
    ("ARRAY_SUM(['x'])", 0),
    ("ARRAY_AVG([1, 2, 'x'])", 1.5),
    ("ARRAY_AVG([0, 1, 1, 2, 3, 5])", 2),  # exact: an integer, as AVG
    ("ARRAY_AVG([1.5, 2.5])", 2.0),
    ("ARRAY_AVG(['x'])", N),
    ("ARRAY_STAR([{'a': 1, 'b': 2}, {'a': 3}, 7])", {"a": [1, 3, N], "b": [2, N, N]}),
    ("ARRAY_STAR(orderlines).productId", ["coffee01", "tea111"]),
    ("ARRAY_STAR('x')", N),
    ("ARRAY_UNION([1, 2], [2.0, 3], [3, 4])", [1, 2, 3, 4]),
    ("ARRAY_INTERSECT([1, 2, 2, 3], [2, 3, 4], [3, 2])", [2, 3]),
    ("ARRAY_INTERSECT([1], 'x')", N),
    ("ARRAY_EXCEPT([1, 2, 2, 3], [3])", [1, 2, 2]),
    ("ARRAY_SYMDIFF([1, 2], [2, 3], [3, 4])", [1, 4]),
    ("ARRAY_SYMDIFF1([1, 2], [2, 3])", [1, 3]),
    ("ARRAY_SYMDIFFN([1, 2], [2, 3], [3, 2])", [1, 2]),  # 2 is in three arrays, 3 in two
    ("ARRAY_SYMDIFFN([1], NULL)", N),
]


def test_array_functions() -> None:
    check_table(ARRAY_FUNCTIONS)


SLICES: list[tuple[str, object]] = [
    ("tags[1:3]", ["green", "blue"]),
    ("tags[1:]", ["green", "blue"]),
    ("tags[-2:]", ["green", "blue"]),
    ("tags[0:-1]", ["red", "green"]),
    ("tags[1:1]", []),
    ("tags[3:]", []),
    ("tags[0:4]", N),  # past the end
    ("tags[2:1]", N),  # start after end
    ("tags[-4:]", N),
    ("tags[0.5:]", N),
    ("tags['a':]", N),
    ("name[0:1]", N),
    ("nope[0:1]", M),
    ("tags[nope:]", M),
    ("tags[0:nope]", M),
    ("orderlines[0:1][0].qty", 2),
]


def test_array_slices() -> None:
    check_table(SLICES)


@pytest.mark.parametrize(
    "text", ["tags[1:3]", "tags[-2:]", "(tags || [])[0:1]", "a.b[x + 1:LENGTH(y)]"]
)
def test_slice_text_round_trips(text: str) -> None:
    expr = parse_expression(text)
    assert parse_expression(expr.to_text()) == expr


@pytest.mark.parametrize(
    "text",
    [
        f"ARRAY_REPEAT('x', {MAX_GENERATED_ELEMENTS + 1})",
        "ARRAY_REPEAT([1, 2], 1e12)",
        # Copies of one big value: nothing is copied, but every reader walks each copy.
        "ARRAY_REPEAT(ARRAY_REPEAT(0, 1000), 1000)",
        f"ARRAY_RANGE(0, {MAX_GENERATED_ELEMENTS + 1})",
        "ARRAY_RANGE(0, 1, 1e-9)",
        "ARRAY_RANGE(-1e308, 1e308, 1e-308)",
    ],
)
def test_generated_arrays_past_the_limit_are_refused(text: str) -> None:
    with pytest.raises(ExpressionEvalError) as info:
        ev(text)
    assert info.value.code is ErrorCode.EXPRESSION_EVAL
    assert str(MAX_GENERATED_ELEMENTS) in info.value.message
    assert info.value.details["function"] in text


def test_generated_arrays_at_the_limit_are_built() -> None:
    assert len(ev(f"ARRAY_REPEAT(1, {MAX_GENERATED_ELEMENTS})")) == MAX_GENERATED_ELEMENTS  # type: ignore[arg-type]
    assert len(ev("ARRAY_REPEAT(ARRAY_REPEAT(0, 999), 1000)")) == 1000  # type: ignore[arg-type]
    assert ev(f"ARRAY_RANGE(0, {MAX_GENERATED_ELEMENTS})")[-1] == MAX_GENERATED_ELEMENTS - 1  # type: ignore[index]
