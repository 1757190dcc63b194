"""Expression evaluation: N1QL semantics of literals, paths, constructors, arithmetic,
comparisons and the MISSING/NULL truth tables, each checked with both engines (the compiled
fast path must agree with the reference interpreter, ``expr_eval_env.py``). LIKE, BETWEEN,
IN, IS and CASE are ``test_expr_predicates.py``; functions ``test_expr_functions.py``;
random documents and expressions ``test_expr_compiled.py``.

Expected values marked "conformance <file>" come from Couchbase's own SQL++ test cases in
/work/shared/conformance/couchbase-filestore/ (the standalone SELECT expressions there).
"""

from __future__ import annotations

import math

import pytest

from shardex.core.expr import (
    MISSING,
    FunctionCall,
    Literal,
    collate,
    compile_expression,
    evaluate,
    parse_expression,
)
from shardex.errors import ErrorCode, ExpressionEvalError, ShardexError
from tests.unit.core.expr_eval_env import DOC, META, F, M, N, T, check, check_table, ev

# -- literals, paths and constructors -----------------------------------------------------------


PATHS: list[tuple[str, object]] = [
    ("name", "Ashley Casper"),
    ("address.city", "San Jose"),
    ("address.geo.lat", 37.3),
    ("address.nope", M),
    ("address.city.nope", M),  # field of a string
    ("nope.deeper.still", M),
    ("nothing.x", M),  # field of null is MISSING (N1QL)
    ("tags[0]", "red"),
    ("tags[2]", "blue"),
    ("tags[-1]", "blue"),
    ("tags[-3]", "red"),
    ("tags[3]", M),
    ("tags[-4]", M),
    ("tags[1.0]", "green"),
    ("tags[0.5]", M),
    ("tags['0']", M),
    ("tags[NULL]", M),
    ("tags[MISSING]", M),
    ("name[0]", M),  # strings are not arrays
    ("orderlines[1].productId", "tea111"),
    ("orderlines[5].productId", M),
    ("orderlines[0]['qty']", 2),
    ("address['city']", "San Jose"),
    ("`shipped-on`", "2012/01/02"),
    ("nums[1 + 1]", -3),
    ("empty[0]", M),
    ("[1, 2][1]", 2),
    ("{'a': {'b': 5}}.a.b", 5),
]


def test_paths():
    check_table(PATHS)


def test_paths_on_non_object_roots():
    for root in (None, 5, "str", [1, 2], MISSING):
        check("a", M, doc=root)
        check("a.b[0]", M, doc=root)


def test_constructors():
    check("[1, 'a', NULL]", [1, "a", None])
    check("[age, nope, nothing]", [37, None, None])  # MISSING becomes null in arrays
    check("{'a': age, 'b': nope, 'c': nothing}", {"a": 37, "c": None})  # MISSING omitted
    check("{'k' || 'ey': 1}", {"key": 1})
    check("{age: 1}", None)  # a non-string name makes the object NULL (N1QL)
    check("{nope: 1, 'x': 2}", {"x": 2})
    check("{}", {})
    check("[]", [])


def test_meta_and_params():
    check("META().id", "order::1234", meta=META)
    check("META(o).cas", 1700000000000, meta=META)
    check("META().nope", M, meta=META)
    check("$1 + $2", 3, params=[1, 2])
    check("$1 || $name", "ab", params={"1": "a", "name": "b"})
    check("$x", 5, params={"$x": 5})
    check("$1", 7, params={1: 7})
    check("$v IS MISSING", True, params={"v": MISSING})


@pytest.mark.parametrize(
    ("text", "kwargs", "fragment"),
    [
        ("$1", {}, "no value supplied for parameter $1"),
        ("$name", {"params": {"other": 1}}, "parameter $name"),
        ("$3", {"params": [1, 2]}, "parameter $3"),
        ("META().id", {}, "META() needs document metadata"),
    ],
)
def test_misuse_raises_eval_error(text, kwargs, fragment):
    expr = parse_expression(text)
    for run in (
        lambda: evaluate(expr, DOC, **kwargs),
        lambda: compile_expression(expr)(DOC, kwargs.get("meta"), kwargs.get("params")),
    ):
        with pytest.raises(ExpressionEvalError) as info:
            run()
        assert fragment in info.value.message
        assert info.value.code is ErrorCode.EXPRESSION_EVAL


def test_unknown_function_in_hand_built_ast_raises():
    expr = FunctionCall("NO_SUCH_FN", (Literal(1),))
    with pytest.raises(ExpressionEvalError, match="unknown function"):
        evaluate(expr, DOC)
    with pytest.raises(ExpressionEvalError, match="unknown function"):
        compile_expression(expr)


def test_evaluate_and_compile_accept_text():
    assert evaluate("age + 1", DOC) == 38
    assert compile_expression("age + 1")(DOC) == 38


# -- arithmetic ---------------------------------------------------------------------------------


ARITHMETIC: list[tuple[str, object]] = [
    ("1 + 2", 3),
    ("1 + 2.5", 3.5),
    ("1.5 + 1.5", 3.0),
    ("10 - 20", -10),
    ("6 * 7", 42),
    ("7 / 2", 3.5),  # not integer division
    ("10 / 2", 5),  # exact: stays an int (conformance case_expression: 10/2 is 5)
    ("-9 / 3", -3),
    ("1 / 3", 1 / 3),
    ("25 % 5", 0),
    ("7 % 3", 1),
    ("-7 % 3", -1),  # sign of the dividend, like N1QL/Go (Python's % gives 2)
    ("7 % -3", 1),
    ("7.5 % 2", 1.5),
    ("-7.5 % 2", -1.5),
    ("1 / 0", N),  # conformance case_expression: 1/0, -1/0, 0/0 are null
    ("-1 / 0", N),
    ("0 / 0", N),
    ("1 / 0.0", N),
    ("5 % 0", N),
    ("-age", -37),
    ("- -3", 3),
    ("-price * 2", -25.0),
    ("age + price", 49.5),
    ("2 * 3 + 4", 10),
    ("2 * (3 + 4)", 14),
    ("2 - 3 - 4", -5),
    ("12345678901234567890 * 10", 123456789012345678900),
    ("1e308 * 10", None),
    ("'a' + 1", N),  # wrong type is NULL
    ("TRUE + 1", N),  # booleans are not numbers
    ("[1] * 2", N),
    ("-'a'", N),
    ("nope + 1", M),
    ("1 - nope", M),
    ("nothing + 1", N),
    ("nope + nothing", M),  # MISSING wins over NULL
    ("nope / 0", M),
    ("-nope", M),
    ("-nothing", N),
    ("'hello' || ' ' || 'world'", "hello world"),  # conformance case_expression
    ("'a' || 1", N),
    ("'a' || nope", M),
    ("nothing || 'a'", N),
]


def test_arithmetic_and_concat():
    check_table(ARITHMETIC)


def test_big_int_overflow_to_float_is_null():
    check("$1 / 3", N, params=[10**400])
    check("$1 * 1.5", N, params=[10**400])


# -- comparisons ------------------------------------------------------------------------------


COMPARISONS: list[tuple[str, object]] = [
    ("1 = 1", True),
    ("1 = 1.0", True),
    ("1 == 2", False),
    ("1 != 2", True),
    ("1 <> 1", False),
    ("'a' < 'b'", True),
    ("'B' < 'a'", True),  # byte order, not locale
    ("'abc' < 'abd'", True),
    ("'ab' < 'abc'", True),
    ("2 <= 2", True),
    ("3 > 2.5", True),
    ("2 >= 3", False),
    ("age > 30", True),
    ("30 < age", True),
    ("price >= 12.5", True),
    ("price < 12", False),
    ("name = 'Ashley Casper'", True),
    ("'Ashley Casper' = name", True),
    ("name != 'x'", True),
    ("name > 'A'", True),
    ("'z' > name", True),
    # Different types: not equal, and ordered by collation (N1QL: comparison operators
    # follow collation order: MISSING < NULL < FALSE < TRUE < numbers < strings <
    # arrays < objects).
    ("1 = '1'", False),
    ("1 != '1'", True),
    ("TRUE = 1", False),
    ("FALSE = 0", False),
    ("99 < 'a'", True),
    ("'' > 9223372036854775807", True),
    ("TRUE < 0", True),
    ("FALSE < TRUE", True),
    ("'zzz' < []", True),
    ("[] < {}", True),
    ("[1, 2] < [1, 3]", True),
    ("[1, 2] < [1, 2, 0]", True),
    ("[2] > [1, 9]", True),
    ("[1, 'a'] < [1, 2]", False),
    ("{'a': 1} < {'a': 1, 'b': 0}", True),  # fewer fields sorts first
    ("{'a': 2} > {'a': 1}", True),
    ("{'b': 1} > {'a': 1}", True),  # at the first name one lacks, that one is higher
    # Structural equality of arrays and objects, with N1QL's null handling inside.
    ("[1, 'a', [2]] = [1, 'a', [2]]", True),
    ("[1, 2] = [1, 2.0]", True),
    ("[1, 2] = [2, 1]", False),
    ("[1] = [1, 2]", False),
    ("{'a': 1, 'b': [1]} = {'b': [1], 'a': 1}", True),
    ("{'a': 1} = {'a': 1, 'b': 2}", False),
    ("{'a': 1} = {'b': 1}", False),
    ("[1, NULL] = [1, NULL]", N),
    ("[2, NULL] = [1, NULL]", False),
    ("{'a': NULL} = {'a': NULL}", N),
    ("orderlines[0] = {'productId': 'coffee01', 'qty': 2}", True),  # conformance where
    ("tags = ['red', 'green', 'blue']", True),
    ("[NULL] < [1]", True),  # ordering collates nested nulls
    # MISSING and NULL operands.
    ("nope = 1", M),
    ("1 = nope", M),
    ("nothing = 1", N),
    ("nothing = nothing", N),
    ("nope = nothing", M),
    ("nope < 1", M),
    ("nothing < 1", N),
    ("nothing != 1", N),
    ("nope != nope", M),
    ("NULL >= NULL", N),
]


def test_comparisons():
    check_table(COMPARISONS)


def test_non_json_numbers_are_refused_not_misordered():
    """NaN and infinities are not JSON: documents cannot hold them and arithmetic turns an
    overflow into NULL, so only a caller's parameter can bring one; comparing it is a clear
    BAD_REQUEST naming the value rather than a silently wrong answer."""
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(ShardexError) as err:
            ev("$1 < 0", params=[bad])
        assert err.value.code is ErrorCode.BAD_REQUEST
        assert repr(bad) in err.value.message
    check("1e308 * 10 < 0", None)  # overflow is NULL, and NULL < 0 is NULL


def test_collate_total_order():
    ordered = [
        MISSING, None, False, True, -(2**70), -1, 0, 0.5, 1, "", "A", "a", "ab",
        [], [None], [1], [1, 2], [2], {}, {"a": 1}, {"a": 1, "b": 1}, {"a": 2}, {"b": 0},
    ]  # fmt: skip
    for i, x in enumerate(ordered):
        for j, y in enumerate(ordered):
            expected = (i > j) - (i < j)
            assert collate(x, y) == expected, (x, y)


# -- three-valued logic ----------------------------------------------------------------------

VALUES = {"TRUE": T, "FALSE": F, "NULL": N, "MISSING": M}

# N1QL: AND -> FALSE wins, then MISSING, then NULL, then TRUE.
AND_TABLE = {
    ("TRUE", "TRUE"): T, ("TRUE", "FALSE"): F, ("TRUE", "NULL"): N, ("TRUE", "MISSING"): M,
    ("FALSE", "FALSE"): F, ("FALSE", "NULL"): F, ("FALSE", "MISSING"): F,
    ("NULL", "NULL"): N, ("NULL", "MISSING"): M,
    ("MISSING", "MISSING"): M,
}  # fmt: skip
# N1QL: OR -> TRUE wins, then NULL, then MISSING, then FALSE.
OR_TABLE = {
    ("TRUE", "TRUE"): T, ("TRUE", "FALSE"): T, ("TRUE", "NULL"): T, ("TRUE", "MISSING"): T,
    ("FALSE", "FALSE"): F, ("FALSE", "NULL"): N, ("FALSE", "MISSING"): M,
    ("NULL", "NULL"): N, ("NULL", "MISSING"): N,
    ("MISSING", "MISSING"): M,
}  # fmt: skip


@pytest.mark.parametrize(("x", "y"), sorted(AND_TABLE))
def test_and_or_truth_tables(x, y):
    for left, right in ((x, y), (y, x)):  # both operators are commutative
        check(f"{left} AND {right}", AND_TABLE[(x, y)])
        check(f"{left} OR {right}", OR_TABLE[(x, y)])


TRUTHINESS: list[tuple[str, object]] = [
    ("NOT TRUE", F),
    ("NOT FALSE", T),
    ("NOT NULL", N),
    ("NOT MISSING", M),
    ("NOT nope", M),
    ("NOT 0", T),  # non-booleans by N1QL truth value
    ("NOT 'x'", F),
    ("NOT ''", T),
    ("NOT []", T),
    ("NOT {'a': 1}", F),
    ("1 AND 'x'", T),
    ("0 OR ''", F),
    ("[] OR nope", M),
    ("age > 30 AND name LIKE 'A%'", T),
    ("age > 40 OR nope = 1", M),
    ("age > 40 AND nope = 1", F),
]


def test_not_and_truthiness():
    check_table(TRUTHINESS)
