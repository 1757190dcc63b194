"""Hostile statements get clear errors, never INTERNAL nor a stalled node: huge number
literals, deep nesting, counts past any integer, patterns that make a backtracking engine
run for hours, and statements over the size limit. Each row runs the whole local path
(parse, bind, plan, evaluate) through ``LocalEngine``, the semantics the nodes share."""

from __future__ import annotations

import asyncio
import threading

import pytest

from shardex.api.validation import MAX_DOC_DEPTH
from shardex.errors import ErrorCode, ShardexError
from shardex.sql.exec.statement_checks import MAX_STATEMENT_BYTES, check_statement_size
from shardex.sql.exec.statements import PLAN_ON_LOOP_CHARS, parsed, prepared_off_loop
from shardex.sql.local import LocalEngine
from shardex.sql.syntax.params import check_params_depth

N = 10_000

# (name, statement, error code or None for a result, text the message or result must hold)
HOSTILE: list[tuple[str, str, ErrorCode | None, object]] = [
    ("exponent", "SELECT RAW 1e999999", ErrorCode.SQL_SYNTAX, "number 1e999999 is too large"),
    ("just past double", "SELECT RAW 1e309", ErrorCode.SQL_SYNTAX, "number 1e309 is too large"),
    ("negative", "SELECT RAW -1e309", ErrorCode.SQL_SYNTAX, "number 1e309 is too large"),
    ("in LIMIT", "SELECT RAW 1 LIMIT 1e999", ErrorCode.SQL_SYNTAX, "number 1e999 is too large"),
    ("400 digits", "SELECT RAW " + "9" * 400, ErrorCode.SQL_SYNTAX, "9999999999..."),
    ("5000 digits", "SELECT RAW " + "9" * 5000, ErrorCode.SQL_SYNTAX, "is too large"),
    ("big exact integer", "SELECT RAW 99999999999999999999999999999999", None, 10**32 - 1),
    ("largest double", "SELECT RAW 1.7976931348623157e308", None, 1.7976931348623157e308),
    ("underflow is zero", "SELECT RAW 1e-999999", None, 0.0),
    (
        "nested parentheses",
        "SELECT RAW " + "(" * N + "1" + ")" * N,
        ErrorCode.SQL_SYNTAX,
        "nested too deeply",
    ),
    ("nested NOT", "SELECT RAW " + "NOT " * N + "true", ErrorCode.SQL_SYNTAX, "nested too deeply"),
    ("nested arrays", "SELECT RAW " + "[" * N + "]" * N, ErrorCode.SQL_SYNTAX, "nested too deeply"),
    (
        "nested objects",
        "SELECT RAW " + '{"a":' * N + "1" + "}" * N,
        ErrorCode.SQL_SYNTAX,
        "nested too deeply",
    ),
    (
        "nested calls",
        "SELECT RAW " + "ABS(" * N + "1" + ")" * N,
        ErrorCode.SQL_SYNTAX,
        "nested too deeply",
    ),
    (
        "nested CASE",
        "SELECT RAW " + "CASE WHEN true THEN " * N + "1" + " END" * N,
        ErrorCode.SQL_SYNTAX,
        "nested too deeply",
    ),
    (
        "long + chain",
        "SELECT RAW " + "+".join(["1"] * N),
        ErrorCode.SQL_SYNTAX,
        "nested too deeply (depth",
    ),
    ("long path", "SELECT RAW x" + ".a" * N + " FROM k", ErrorCode.SQL_SYNTAX, "nested too deeply"),
    (
        "nested WHERE",
        "SELECT RAW x FROM k WHERE " + "(" * N + "x = 1" + ")" * N,
        ErrorCode.SQL_SYNTAX,
        "nested too deeply",
    ),
    ("long AND chain is flat", "SELECT RAW " + " AND ".join(["true"] * N), None, True),
    ("LIMIT past int64", "SELECT RAW x FROM k LIMIT 99999999999999999999999", None, 1),
    ("OFFSET past int64", "SELECT RAW x FROM k OFFSET 99999999999999999999999", None, None),
    (
        "LIMIT infinity",
        "SELECT RAW x FROM k LIMIT 1e308 * 10",
        ErrorCode.BAD_REQUEST,
        "LIMIT must be a number",
    ),
    (
        "LIMIT fraction",
        "SELECT RAW x FROM k LIMIT 2.5",
        ErrorCode.BAD_REQUEST,
        "LIMIT must be an integer",
    ),
    (
        "regexp backtracking",
        'SELECT RAW REGEXP_CONTAINS(REPEAT("a", 30) || "!", "^(a+)+$")',
        None,
        False,
    ),
    (
        "regexp backreference",
        'SELECT RAW REGEXP_CONTAINS("aa", "(a)\\\\1")',
        ErrorCode.EXPRESSION_EVAL,
        "invalid regular expression '(a)\\\\1'",
    ),
    (
        "regexp lookahead",
        'SELECT RAW REGEXP_LIKE("ab", "a(?=b)")',
        ErrorCode.EXPRESSION_EVAL,
        "invalid perl operator",
    ),
    ("LIKE many wildcards", "SELECT RAW REPEAT('a', 5000) LIKE '%a%a%a%a%a%a%b'", None, False),
]


@pytest.fixture(scope="module")
def engine() -> LocalEngine:
    e = LocalEngine()
    e.create_keyspace("k")
    e.execute('INSERT INTO k (KEY, VALUE) VALUES ("a", {"x": 1})')
    return e


@pytest.mark.parametrize(
    ("sql", "code", "expected"), [row[1:] for row in HOSTILE], ids=[row[0] for row in HOSTILE]
)
def test_hostile_statement(
    engine: LocalEngine, sql: str, code: ErrorCode | None, expected: object
) -> None:
    if code is None:
        rows = engine.query(sql)
        assert rows == ([] if expected is None else [expected])
        return
    with pytest.raises(ShardexError) as info:
        engine.query(sql)
    assert info.value.code is code, info.value
    assert isinstance(expected, str) and expected in info.value.message, info.value.message


def test_a_huge_literal_is_quoted_short() -> None:
    with pytest.raises(ShardexError) as info:
        LocalEngine().query("SELECT RAW " + "7" * 100_000)
    e = info.value
    assert len(e.message) < 200 and e.details["token"].startswith("7777") and "hint" in e.details
    assert (e.details["line"], e.details["column"]) == (1, 12)


def test_statement_size_limit_names_size_and_limit() -> None:
    check_statement_size("SELECT 1", MAX_STATEMENT_BYTES)
    check_statement_size("x" * MAX_STATEMENT_BYTES, MAX_STATEMENT_BYTES)  # at the limit: fine
    with pytest.raises(ShardexError) as info:
        check_statement_size("x" * (MAX_STATEMENT_BYTES + 1), MAX_STATEMENT_BYTES)
    e = info.value
    assert e.code is ErrorCode.BAD_REQUEST
    assert f"{MAX_STATEMENT_BYTES + 1} bytes, over the limit of {MAX_STATEMENT_BYTES}" in e.message
    assert (
        e.details["size"] == MAX_STATEMENT_BYTES + 1 and e.details["limit"] == MAX_STATEMENT_BYTES
    )
    # The limit counts UTF-8 bytes: 400 three-byte characters are 1200 bytes.
    with pytest.raises(ShardexError) as info:
        check_statement_size("語" * 400, 1000)
    assert info.value.details["size"] == 1200
    check_statement_size("語" * 333, 1000)


def test_a_long_statement_is_prepared_off_the_loop_thread() -> None:
    async def where(sql: str) -> bool:
        loop_thread = threading.get_ident()
        return await prepared_off_loop(sql, lambda: threading.get_ident() == loop_thread)

    assert asyncio.run(where("SELECT 1")) is True
    assert asyncio.run(where("SELECT " + " " * PLAN_ON_LOOP_CHARS + "1")) is False


def test_a_long_statement_prepared_off_the_loop_raises_the_same_error() -> None:
    sql = "SELECT RAW 1e999 " + " " * PLAN_ON_LOOP_CHARS
    with pytest.raises(ShardexError) as info:
        asyncio.run(prepared_off_loop(sql, lambda: parsed(sql, cached=False)))
    assert info.value.code is ErrorCode.SQL_SYNTAX and "1e999" in info.value.message


def _nested(levels: int) -> list[object]:
    value: list[object] = []
    for _ in range(levels - 1):
        value = [value]
    return value


def test_a_parameter_nested_deeper_than_a_document_is_bad_request() -> None:
    # Deep enough values crash comparison with RecursionError (an INTERNAL error)...
    with pytest.raises(RecursionError):
        LocalEngine().query("SELECT RAW $1 = $1", [_nested(900)])
    # ... so the node refuses them up front, at the documents' depth limit.
    check_params_depth([_nested(MAX_DOC_DEPTH), 1, "x"])
    check_params_depth({"a": _nested(MAX_DOC_DEPTH)})
    check_params_depth(None)
    for params, name in (([1, _nested(MAX_DOC_DEPTH + 1)], "2"), ({"deep": _nested(900)}, "deep")):
        with pytest.raises(ShardexError) as info:
            check_params_depth(params)
        e = info.value
        assert e.code is ErrorCode.BAD_REQUEST and e.details["parameter"] == name
        assert f"parameter ${name} is nested more than {MAX_DOC_DEPTH} levels" in e.message
