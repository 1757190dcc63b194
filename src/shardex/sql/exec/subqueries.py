"""Subquery expressions in the distributed plan (decision 0120).

A subquery whose FROM is an expression (the outer row's array, ``FROM o.lines AS l``, a
literal, a LET variable) or that has no FROM reads no document: it runs wherever its row is
evaluated, in a leaf for WHERE and the projection, at the root for LETTING, HAVING and a
grouped projection, with the same operators ``LocalEngine`` runs. A subquery over a
keyspace with USE KEYS (N1QL's form for a correlated one) reads its documents through the
fragment's ``DocumentAccess``, the reads the leaves' fetches make, from the thread the row
pipeline runs on (``blocking_fetch``). A subquery over a whole keyspace (no USE KEYS) or
with a join reads what the initiator read for it before the statement
(``subquery_inputs.py``): its value, when it is uncorrelated, else the documents of the
keyspaces it reads, over which it runs with the reference engine's operators.

Each result a subquery materialises is charged to the query's memory budget while it is
held (until the next one replaces it): a subquery over a huge array fails with
QUERY_MEMORY_LIMIT, as any operator past the budget, instead of growing unseen.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from shardex.core.expr import walk
from shardex.errors import ErrorCode, ShardexError
from shardex.sql.exec.memory import Budget, value_size
from shardex.sql.exec.subquery_inputs import gathered, without_hints
from shardex.sql.exec.subquery_keys import Fetch, use_keys_of
from shardex.sql.exec.subquery_lookup import narrowed
from shardex.sql.local import LocalEngine
from shardex.sql.local_rows import set_op_rows
from shardex.sql.syntax import (
    DeleteStmt,
    ExplainStmt,
    InsertStmt,
    ResultTerm,
    SelectStmt,
    UpdateStmt,
)
from shardex.sql.syntax.ast import SetOpSubquery, Subquery, WithSubquery
from shardex.sql.syntax.bind import BoundSelect, bind_select, subqueries_of
from shardex.sql.syntax.ctes import BoundWith, valued_terms
from shardex.sql.syntax.setops import BoundQuery, BoundSetOp
from shardex.sql.syntax.subquery import BoundSubquery, SubqueryRunner, running_subqueries

if TYPE_CHECKING:
    from shardex.sql.exec.documents import DocumentAccess

__all__ = [
    "Fetch",
    "blocking_fetch",
    "budgeted_runner",
    "expression_runner",
    "reads_documents",
    "subquery_keyspaces",
    "with_subqueries",
]

FETCH_TIMEOUT = 30.0  # seconds one subquery's document read may take

# Runs subqueries over expressions: it holds no keyspace.
_EXPRESSIONS = LocalEngine()


def _all_subqueries(b: BoundSelect) -> list[BoundSubquery]:
    """``b``'s subqueries, found once per bound statement (the statement cache hands the
    same one to every execution)."""
    cached: list[BoundSubquery] | None = b.__dict__.get("_subqueries")
    if cached is None:
        cached = subqueries_of(b)
        object.__setattr__(b, "_subqueries", cached)  # a cache, not state: frozen stays true
    return cached


def reads_documents(b: BoundSelect) -> bool:
    """Whether a subquery of ``b`` reads documents (USE KEYS): its rows pipeline must run
    off the event loop, where ``blocking_fetch`` can wait for the loop's reads."""
    return any(sub.keyspaces for sub in _all_subqueries(b))


def blocking_fetch(documents: DocumentAccess, loop: asyncio.AbstractEventLoop) -> Fetch:
    """A ``Fetch`` for a row pipeline on a worker thread: the read runs on ``loop`` and the
    thread waits for it. On the loop itself only this node's own documents can be read
    (``get_many_now``): waiting there would stop the loop that does the read."""

    def fetch(keyspace: str, docids: list[str]) -> list[tuple[str, Any]]:
        unique = list(dict.fromkeys(docids))
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            now = documents.get_many_now(keyspace, unique)
            if now is not None:
                return now
            raise ShardexError(
                "a subquery's USE KEYS documents cannot be read on the event loop",
                code=ErrorCode.QUERY_STATE,
                details={"keyspace": keyspace, "hint": "run the query with inline off"},
            )
        future = asyncio.run_coroutine_threadsafe(documents.get_many(keyspace, unique), loop)
        return future.result(FETCH_TIMEOUT)

    return fetch


def _run(
    sub: BoundQuery | BoundWith, outer: dict[str, Any], params: Any, fetch: Fetch | None
) -> list:
    if isinstance(sub, BoundSetOp):  # each branch as the subquery it is
        return list(set_op_rows(sub, params, lambda b: _run(b, outer, params, fetch)))
    if isinstance(sub, BoundWith):  # its terms valued once for this evaluation
        valued = valued_terms(sub, params, lambda t, seen: _run(t, outer, seen, fetch), outer)
        return _run(sub.body, outer, valued, fetch)
    ref = sub.from_
    keyed = ref is not None and ref.source is None and ref.use_keys is not None
    if not keyed and not sub.joins and (ref is None or ref.source is not None):
        return list(_EXPRESSIONS.run_select(sub, params, outer))
    # The documents the initiator read for it (its FROM without USE KEYS, its joins).
    engine = LocalEngine()
    for keyspace, docs in gathered(sub, params).items():
        engine.create_keyspace(keyspace, exist_ok=True)
        # Its FROM's documents, looked up by an equality with the outer row when it has one.
        engine.keyspaces[keyspace] = docs if keyed else narrowed(sub, docs, outer, params)
    if not keyed:
        return list(engine.run_select(without_hints(sub), params, outer))
    assert ref is not None and ref.use_keys is not None
    if fetch is None:
        raise ShardexError(
            f"a subquery reading {ref.name!r} with USE KEYS cannot run here (no document "
            "access: a FROM (SELECT ...), USE KEYS (SELECT ...) or RETURNING)",
            code=ErrorCode.BAD_REQUEST,
            details={"keyspace": ref.name, "hint": "move the subquery to WHERE, LET or SELECT"},
        )
    docs = fetch(ref.name, use_keys_of(ref.use_keys, outer, params))
    # The documents read, as a keyspace of their own: the engine picks them in USE KEYS
    # order (repeats kept) as it does over a whole keyspace.
    engine.create_keyspace(ref.name, exist_ok=True)
    engine.keyspaces[ref.name] = {**engine.keyspaces[ref.name], **dict(docs)}
    return list(engine.run_select(without_hints(sub), params, outer))


def expression_runner(sub: BoundQuery | BoundWith, outer: dict[str, Any], params: Any) -> list[Any]:
    """Runs a subquery that reads no document, without charging a budget (a FROM (SELECT
    ...) or USE KEYS (SELECT ...) evaluated once, whole, as any such expression)."""
    return _run(sub, outer, params, None)


def budgeted_runner(budget: Budget, fetch: Fetch | None = None) -> SubqueryRunner:
    """Runs subqueries (reading USE KEYS documents with ``fetch``), each result charged to
    ``budget`` while it is held."""
    res = budget.reserve("subquery")
    held = 0

    def run(sub: BoundQuery | BoundWith, outer: dict[str, Any], params: Any) -> list[Any]:
        nonlocal held
        values = _run(sub, outer, params, fetch)
        size = value_size(values)
        res.shrink(held)
        held = 0
        if not res.grow(size):
            res.shrink(size)
            raise res.over(size, "a subquery's result is held whole")
        held = size
        return values

    return run


def with_subqueries(
    b: BoundSelect, rows: Iterable[Any], budget: Budget, fetch: Fetch | None = None
) -> Iterator[Any]:
    """``rows`` (a lazy operator chain over ``b``) pulled with ``b``'s subqueries running on
    a budgeted runner. The runner is installed around each pull, not around the chain: the
    chain may be resumed on another thread (``bridge.run_pipeline``)."""
    if not _all_subqueries(b):
        return iter(rows)
    return _pulled(iter(rows), budgeted_runner(budget, fetch))


def _pulled(it: Iterator[Any], runner: SubqueryRunner) -> Iterator[Any]:
    end = object()
    while True:
        with running_subqueries(runner):
            row = next(it, end)
        if row is end:
            return
        yield row


# Parsed statements are kept per text (``statements.parsed``): the privilege check of every
# execution asks the same object, and walking its tree was a seventh of a point query's work.
# Keyed by identity with the statement kept alive, so an id is not reused; cleared when full.
_KEYSPACES_MAX = 512
_keyspaces_memo: dict[int, tuple[object, frozenset[str]]] = {}


def subquery_keyspaces(stmt: object) -> frozenset[str]:
    """The keyspaces the subqueries of a parsed statement read (for privilege checks: a
    subquery reads documents as its statement does). Binding decides which FROM names are
    keyspaces and which the enclosing query's variables; only a statement that has a
    subquery is bound here."""
    hit = _keyspaces_memo.get(id(stmt))
    if hit is not None and hit[0] is stmt:
        return hit[1]
    found = _subquery_keyspaces(stmt)
    if len(_keyspaces_memo) >= _KEYSPACES_MAX:
        _keyspaces_memo.clear()
    _keyspaces_memo[id(stmt)] = (stmt, found)
    return found


def _subquery_keyspaces(stmt: object) -> frozenset[str]:
    select = _as_select(stmt)
    subquery = Subquery | WithSubquery | SetOpSubquery
    if select is None or not any(isinstance(n, subquery) for n in _parsed_nodes(select)):
        return frozenset()
    found: set[str] = set()
    for sub in subqueries_of(bind_select(select)):
        found |= sub.keyspaces
    return frozenset(found)


def _as_select(stmt: object) -> SelectStmt | None:
    """The SELECT whose expressions hold a statement's subqueries."""
    if isinstance(stmt, ExplainStmt):
        stmt = stmt.statement
    if isinstance(stmt, SelectStmt):
        return stmt
    if isinstance(stmt, InsertStmt):
        terms = tuple(ResultTerm(e) for kv in stmt.values for e in kv)
        return SelectStmt(terms=terms)
    if isinstance(stmt, DeleteStmt | UpdateStmt):
        exprs = [e for e in (stmt.target.use_keys, stmt.limit) if e is not None]
        if isinstance(stmt, UpdateStmt):
            exprs += [e for _, e in stmt.set]
        exprs += [t.expr for t in stmt.returning if t.expr is not None]
        terms = tuple(ResultTerm(e, f"t{i}") for i, e in enumerate(exprs))
        return SelectStmt(terms=terms, from_=stmt.target, where=stmt.where)
    return None


def _parsed_nodes(s: SelectStmt) -> Iterator[Any]:
    exprs = [t.expr for t in s.terms if t.expr is not None]
    exprs += [e for _, e in s.let] + [e for _, e in s.letting] + list(s.group_by)
    exprs += [o.expr for o in s.order_by] + [u.expr for u in s.unnests]
    exprs += [e for j in s.joins for e in (j.on_keys, j.on_key, j.on) if e is not None]
    exprs += [e for e in (s.where, s.having, s.limit, s.offset) if e is not None]
    if s.from_ is not None:
        exprs += [e for e in (s.from_.use_keys, s.from_.source) if e is not None]
    for e in exprs:
        yield from walk(e)
