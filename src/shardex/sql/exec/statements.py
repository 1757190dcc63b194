"""Parsed and bound statements kept by their text (``plan_cache``): a query's text is parsed
on the initiator and bound again by every fragment on every member (fragments carry the
text, not the tree), and parsing plus binding costs milliseconds in Python. Statements and
bound SELECTs are immutable, so one copy serves every query and thread. A statement that
fails to parse or bind is not kept (the error is raised each time).

Parsing and binding cost grows with the text (about a second per 100 KiB of IN list or OR
chain): ``prepared_off_loop`` runs them on the loop for a short statement and in a worker
thread for a long one, on the initiator and on every member its fragments run on.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any, Final, TypeVar

from shardex.errors import ErrorCode, ShardexError
from shardex.sql.syntax import (
    DeleteStmt,
    ExplainStmt,
    SelectStmt,
    UpdateStmt,
    parse_statement,
)
from shardex.sql.syntax.ast import WithStmt
from shardex.sql.syntax.bind import BoundSelect, bind_select
from shardex.sql.syntax.ctes import bind_with
from shardex.sql.syntax.dml_selects import dml_select, merge_select
from shardex.sql.syntax.merge import MergeStmt
from shardex.sql.syntax.parser import Statement

__all__ = [
    "CACHE_SIZE",
    "PLAN_ON_LOOP_CHARS",
    "bad_request",
    "bound_statement",
    "dml_select",
    "merge_select",
    "parsed",
    "prepared_off_loop",
]

CACHE_SIZE: Final = 512
# Statements up to this many characters are parsed, bound and planned on the loop (a few
# milliseconds at most: no thread hand-off on the common path), longer ones in a worker thread.
PLAN_ON_LOOP_CHARS: Final = 4096

_T = TypeVar("_T")


def bad_request(message: str, **details: Any) -> ShardexError:
    return ShardexError(message, code=ErrorCode.BAD_REQUEST, details=details)


async def prepared_off_loop(sql: str, fn: Callable[[], _T]) -> _T:
    """``fn()`` (parse, bind or plan ``sql``): on the loop for a short statement, in a worker
    thread for a long one (``PLAN_ON_LOOP_CHARS``)."""
    if len(sql) <= PLAN_ON_LOOP_CHARS:
        return fn()
    return await asyncio.to_thread(fn)


@functools.lru_cache(maxsize=CACHE_SIZE)
def _parsed(sql: str) -> Statement:
    return parse_statement(sql)


def parsed(sql: str, *, cached: bool = True) -> Statement:
    """``parse_statement(sql)``, from the cache when ``cached``."""
    return _parsed(sql) if cached else parse_statement(sql)


def _bind(stmt: Statement, dml: bool) -> BoundSelect:
    if isinstance(stmt, ExplainStmt):
        stmt = stmt.statement
    if isinstance(stmt, WithStmt):  # a SELECT sent with its WITH clause (``compound.py``)
        body = bind_with(stmt).body
        assert isinstance(body, BoundSelect), "a set operation's branches run one by one"
        return body
    if dml and isinstance(stmt, MergeStmt):
        source = merge_select(stmt)
        assert source is not None, "an expression source is evaluated on the initiator"
        stmt = source
    elif dml:
        assert isinstance(stmt, DeleteStmt | UpdateStmt)
        stmt = dml_select(stmt)
    assert isinstance(stmt, SelectStmt)
    return bind_select(stmt)


@functools.lru_cache(maxsize=CACHE_SIZE)
def _bound(sql: str, dml: bool) -> BoundSelect:
    return _bind(_parsed(sql), dml)


def bound_statement(sql: str, dml: bool, *, cached: bool = True) -> BoundSelect:
    """The bound SELECT of ``sql`` (the one a DML statement derives when ``dml``)."""
    return _bound(sql, dml) if cached else _bind(parse_statement(sql), dml)
