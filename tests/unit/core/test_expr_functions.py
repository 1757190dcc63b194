"""Expression evaluation: the built-in functions (string, number, type, conditional and
comparison) and the exact JSON types of their results, each checked with both engines
(``expr_eval_env.py``).

Expected values marked "conformance <file>" come from Couchbase's own SQL++ test cases in
/work/shared/conformance/couchbase-filestore/ (the standalone SELECT expressions there).
"""

from __future__ import annotations

import pytest

from shardex.errors import ErrorCode, ExpressionEvalError
from tests.unit.core.expr_eval_env import F, M, N, T, check_table, ev

# -- functions --------------------------------------------------------------------------------


STRING_FUNCTIONS: list[tuple[str, object]] = [
    # conformance case_str.json where noted
    ("LOWER('THIS Is a N1Ql QuErY')", "this is a n1ql query"),  # conformance
    ("UPPER('coffee01')", "COFFEE01"),
    ("LOWER(5)", N),
    ("LOWER(address)", N),  # conformance: LOWER(ccInfo) object is null
    ("LOWER(nope)", M),
    ("UPPER(nothing)", N),
    ("LENGTH('guy@kub.net')", 11),  # conformance
    ("LENGTH(text)", 18),  # bytes (conformance: LENGTH('日本語で日本') is 18)
    ("MB_LENGTH(text)", 6),
    ("LENGTH(tags)", N),
    ("LENGTH('')", 0),
    ("SUBSTR('Thisisasubquery', 5, 10)", "sasubquery"),  # conformance
    ("SUBSTR('Abbott', 0)", "Abbott"),  # conformance
    ("SUBSTR('Abbott', 1)", "bbott"),  # conformance
    ("SUBSTR('Abbott', 4)", "tt"),  # conformance
    ("SUBSTR('abcdef', -2)", "ef"),
    ("SUBSTR('abcdef', 2, 100)", "cdef"),
    ("SUBSTR('abcdef', 6)", N),  # past the end
    ("SUBSTR('abcdef', -7)", N),
    ("SUBSTR('abcdef', 1, -1)", N),
    ("SUBSTR('abcdef', 1.5)", N),
    ("SUBSTR('abcdef', 1.0, 2.0)", "bc"),
    ("SUBSTR(text, 3, 1)", "\ufffd"),  # byte-based (conformance byte_sub0)
    ("MB_SUBSTR(text, 3, 1)", "で"),  # conformance char_sub0
    ("SUBSTR1('abcdef', 0)", "abcdef"),  # conformance
    ("SUBSTR1('abcdef', 1)", "abcdef"),  # conformance
    ("SUBSTR1('abcdef', 2)", "bcdef"),  # conformance
    ("SUBSTR1('abcdef', -1)", "f"),  # conformance
    ("SUBSTR1('abcdef', -4, 2)", "cd"),  # conformance
    ("SUBSTR(nope, 1)", M),
    ("SUBSTR('abc', nothing)", N),
    ("CONCAT('a', 'b', 'c')", "abc"),
    ("CONCAT('a', 1)", N),
    ("CONCAT('a', nope)", M),
    ("CONCAT('a', nothing, nope)", M),
    ("TRIM('  x  ')", "x"),
    ("TRIM('\t\n x \r')", "x"),
    ("TRIM('Abagail', 'l')", "Abagai"),  # conformance
    ("TRIM('xxaxx', 'x')", "a"),
    ("LTRIM('       THIS Is a N1Ql QuErY', ' T')", "HIS Is a N1Ql QuErY"),  # conformance
    ("LTRIM('Abel', 'A')", "bel"),
    ("RTRIM('Abbie', 'e')", "Abbi"),
    ("RTRIM('  x  ')", "  x"),
    ("TRIM(5)", N),
    ("TRIM('x', 5)", N),
    ("CONTAINS('Couchbaseisdope', 'chbaseisdo')", T),  # conformance
    ("CONTAINS('abc', 'd')", F),
    ("CONTAINS('abc', 1)", N),
    ("POSITION('       THIS Is a N1Ql QuErY', 'N1Ql')", 17),  # conformance
    ("POSITION('abc', 'z')", -1),
    ("POSITION(text, 'で日本')", 9),  # bytes (conformance byte_pos0)
    ("REPLACE('SQL SQL SQL', 'S', 'N1', -1)", "N1QL N1QL N1QL"),  # conformance
    ("REPLACE('SQL SQL SQL', 'S', 'N1', 2)", "N1QL N1QL SQL"),  # conformance
    ("REPLACE('SQL SQL SQL', 'S', 'N1')", "N1QL N1QL N1QL"),  # conformance
    (
        "REPLACE('esgFSdfa3rjs84tha5gref4  [a-z]', '[a-z]', '9')",
        "esgFSdfa3rjs84tha5gref4  9",
    ),  # conformance
]


def test_string_functions():
    check_table(STRING_FUNCTIONS)


NUMBER_FUNCTIONS: list[tuple[str, object]] = [
    # conformance case_func_num.json
    ("ABS(-4.599)", 4.599),
    ("ABS(0.0)", 0.0),
    ("ABS(-3)", 3),
    ("ABS('x')", N),
    ("CEIL(1.4)", 2),
    ("CEIL(-1.4)", -1),
    ("FLOOR(1.7)", 1),
    ("FLOOR(-1.2)", -2),
    ("CEIL(3)", 3),
    ("ROUND(12 + 0.5)", 12),  # half to even
    ("ROUND(1.2343534)", 1),
    ("ROUND(1.8343534)", 2),
    ("ROUND(1.8343534, 0)", 2),
    ("ROUND(1.8343534, 3)", 1.834),
    ("ROUND(8.8343534, -1)", 10),
    ("ROUND(1.8343534, -1)", 0),
    ("ROUND(1.5)", 2),
    ("ROUND(2.5)", 2),
    ("ROUND(2.5, 0)", 2),
    ("ROUND(-2.5)", -2),
    ("ROUND(2.675, 2)", 2.68),  # rounds the decimal as written
    ("ROUND(25, -1)", 20),
    ("ROUND(7)", 7),
    ("ROUND(1.5, 0.5)", N),
    ("ROUND('x')", N),
    ("TRUNC(-2.2544, 2)", -2.25),
    ("TRUNC(0.2544, 3)", 0.254),
    ("TRUNC(2.9)", 2),
    ("TRUNC(-2.9)", -2),
    ("SIGN(-1034.992445)", -1),
    ("SIGN(0.0000111)", 1),
    ("SIGN(0.0)", 0),
    ("POWER(12, 2)", 144),
    ("POWER(2, -1)", 0.5),
    ("POWER(-8, 0.5)", N),
    ("POWER(0, -1)", N),
    ("SQRT(0)", 0),
    ("SQRT(16)", 4),
    ("SQRT(2.25)", 1.5),
    ("SQRT(-1)", N),
]


def test_number_functions():
    check_table(NUMBER_FUNCTIONS)


TYPE_FUNCTIONS: list[tuple[str, object]] = [
    # conformance case_type_conv.json, case_type_check.json
    ("TO_STRING(1200)", "1200"),
    ("TOSTRING(TONUMBER('1236'))", "1236"),
    ("TO_STRING(1.5)", "1.5"),
    ("TO_STRING(2.0)", "2"),
    ("TO_STRING(1e21)", "1000000000000000000000"),
    ("TO_STRING(1e-7)", "0.0000001"),
    ("TO_STRING(TRUE)", "true"),
    ("TO_STRING('s')", "s"),
    ("TO_STRING([1])", N),
    ("TO_STRING(nope)", M),
    ("TO_STRING(nothing)", N),
    ("TO_NUMBER('1234')", 1234),
    ("TO_NUMBER('-12.5')", -12.5),
    ("TO_NUMBER('1e3')", 1000.0),
    ("TO_NUMBER('+7')", 7),
    ("TO_NUMBER('.5')", 0.5),
    ("TO_NUMBER('a12')", N),
    ("TO_NUMBER(' 12')", N),
    ("TO_NUMBER('1_000')", N),
    ("TO_NUMBER('inf')", N),
    ("TO_NUMBER('nan')", N),
    ("TO_NUMBER('')", N),
    ("TO_NUMBER(TRUE)", 1),
    ("TO_NUMBER(FALSE)", 0),
    ("TO_NUMBER(7.5)", 7.5),
    ("TO_NUMBER([1])", N),
    ("TO_NUMBER(nope)", M),
    ("TO_BOOLEAN(orderlines[1])", T),
    ("TO_BOOLEAN(0)", F),
    ("TO_BOOLEAN('')", F),
    ("TO_BOOLEAN([])", F),
    ("TO_BOOLEAN('false')", T),
    ("IS_BOOLEAN(FALSE)", T),
    ("IS_BOOLEAN(1)", F),
    ("IS_NUMBER(0)", T),
    ("IS_NUM([1, 2])", F),
    ("IS_STRING('')", T),
    ("IS_ARRAY(orderlines)", T),
    ("IS_ARRAY(NULL)", N),
    ("IS_ARRAY(MISSING)", M),
    ("IS_OBJECT(address)", T),
    ("IS_ATOM(name)", T),
    ("IS_ATOM(tags)", F),
    ("TYPE(1)", "number"),
    ("TYPE('yes')", "string"),
    ("TYPE(TRUE)", "boolean"),
    ("TYPE([1, 2])", "array"),
    ("TYPE({})", "object"),
    ("TYPE(MISSING)", "missing"),
    ("TYPE(NULL)", "null"),
]


def test_type_functions():
    check_table(TYPE_FUNCTIONS)


CONDITIONAL_FUNCTIONS: list[tuple[str, object]] = [
    # conformance case_func_cond_unkn.json
    ("IFMISSING(nope, 'MISSING')", "MISSING"),
    ("IFMISSING(nothing, 'MISSING')", N),
    ("IFMISSING(`shipped-on`, 'MISSING')", "2012/01/02"),
    ("IFMISSING(nope, nope)", N),
    ("IFNULL(nothing, 'NULL')", "NULL"),
    ("IFNULL(nope, 'NULL')", M),  # the first non-NULL value may be MISSING
    ("IFNULL(nothing, nothing)", N),
    ("IFMISSINGORNULL(nope, 'NOT THERE')", "NOT THERE"),
    ("IFMISSINGORNULL(nothing, nope, 3)", 3),
    ("IFMISSINGORNULL(nothing, nope)", N),
    ("COALESCE(NULL, nope, 'x')", "x"),
    ("NVL(nope, 'not applicable')", "not applicable"),
    ("NVL(name, 'n/a')", "Ashley Casper"),
    ("NULLIF(2, 2)", N),
    ("NULLIF(1, 2)", 1),
    ("NULLIF(NULL, 'n1ql')", N),
    ("NULLIF(MISSING, 'n1ql')", M),
    ("NULLIF(12, 'n1ql')", 12),
    ("MISSINGIF(2, 2)", M),
    ("MISSINGIF(NULL, 'n1ql')", N),
    ("MISSINGIF(MISSING, 'n1ql')", M),
    ("MISSINGIF(12, 'n1ql')", 12),
    # GREATEST/LEAST skip NULL/MISSING and collate across types (conformance comp)
    ("GREATEST(2, 3)", 3),
    ("GREATEST(4, 3)", 4),
    ("LEAST(0, 3)", 0),
    ("GREATEST('customer322', 'customer3')", "customer322"),
    ("LEAST('customer226', 'customer3')", "customer226"),
    ("LEAST('Yes', 99)", 99),
    ("GREATEST('Yes', 99)", "Yes"),
    ("GREATEST(1, nothing, nope, 5)", 5),
    ("LEAST(nothing, nope)", N),
    ("GREATEST(1, 2.5)", 2.5),
]


def test_conditional_and_comparison_functions():
    check_table(CONDITIONAL_FUNCTIONS)


def test_function_results_are_exact_types():
    assert type(ev("ROUND(2.4)")) is int
    assert type(ev("ROUND(2.45, 1)")) is float
    assert type(ev("CEIL(1.2)")) is int
    assert type(ev("1 + 2")) is int
    assert type(ev("6 / 3")) is int
    assert type(ev("6.0 / 3")) is float


# REGEXP_* run on RE2 (N1QL's syntax and semantics; linear-time matching).
REGEXP_FUNCTIONS: list[tuple[str, object]] = [
    # conformance case_str.json
    ('REGEXP_CONTAINS("Thisisabigsubquery", "query")', T),
    ('REGEXP_LIKE("Thisisabigsubquery", "query%")', F),
    ('REGEXP_LIKE("query", "query.*")', T),
    ('REGEXP_POSITION("Thisisabigsubquery", "query")', 13),
    ("REGEXP_POSITION1('tablet', 'ab?')", 2),
    (
        'REGEXP_REPLACE("Thisisaqueryisasubqandisnotisnull", "is", "IS", 4)',
        "ThISISaqueryISasubqandISnotisnull",
    ),
    # positions count characters, not UTF-8 bytes
    ('REGEXP_POSITION("日本語で日本", "で")', 3),
    ('REGEXP_REPLACE("héllo", "[é]", "e")', "hello"),
    ('REGEXP_REPLACE("abc", "x*", "-")', "-a-b-c-"),
    ('REGEXP_REPLACE("abc", "b", "$1\\\\1")', "a$1\\1c"),  # replacement is literal text
    # RE2 semantics (as N1QL's Go regexp): \d is ASCII, $ is the end of the text
    ('REGEXP_CONTAINS("٣", "\\\\d")', F),
    ('REGEXP_CONTAINS("a\\n", "a$")', F),
    ('REGEXP_CONTAINS("ab", "(?P<x>a)b")', T),
    ('REGEXP_LIKE("AB", "(?i)ab")', T),
    # a pathological pattern for a backtracking engine: RE2 answers at once
    ('REGEXP_CONTAINS(REPEAT("a", 30) || "!", "^(a+)+$")', F),
    ('REGEXP_LIKE(REPEAT("a", 5000), "(a|aa)*b")', F),
    ('REGEXP_CONTAINS(REPEAT("a", 30), "^(a+)+$")', T),
    # not text: NULL, as for every function
    ('REGEXP_CONTAINS(1, "a")', N),
    ('REGEXP_CONTAINS("a", 1)', N),
    ('REGEXP_REPLACE("a", "a", 1)', N),
    ('REGEXP_CONTAINS("\\ud800a", "a")', N),  # a lone surrogate: not matchable text
    ('REGEXP_CONTAINS(missing_field, "a")', M),
]


def test_regexp_functions():
    check_table(REGEXP_FUNCTIONS)


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        ("(a)\\\\1", "invalid escape sequence"),  # backreference
        ("a(?=b)", "invalid perl operator"),  # lookahead
        ("(?<!a)b", "invalid perl operator"),  # lookbehind
        ("(", "missing )"),
        ("a{1001}", "invalid repetition size"),
    ],
)
def test_regexp_pattern_re2_cannot_compile_is_a_clear_error(pattern, reason):
    for fn in ("REGEXP_CONTAINS", "REGEXP_LIKE", "REGEXP_POSITION", "REGEXP_REPLACE"):
        extra = ', "x"' if fn == "REGEXP_REPLACE" else ""
        with pytest.raises(ExpressionEvalError) as err:
            ev(f'{fn}("abc", "{pattern}"{extra})')
        e = err.value
        assert e.code is ErrorCode.EXPRESSION_EVAL
        assert reason in e.message and e.details["reason"].startswith(reason)
        assert e.details["pattern"] == pattern.replace("\\\\", "\\")
        assert "RE2 syntax" in e.details["hint"]
