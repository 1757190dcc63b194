"""Statements made of queries, on their initiator: set operations (``setops.py``) and WITH.

A WITH term that is a query runs as a query of its own (planned and gathered as any SELECT,
its text the statement's WITH clause so far plus the term's query), once, before the
statement's query; an expression term is evaluated here. Their values then travel with the
statement's parameters (``ctes.values_in``: the query reads a WITH name as a parameter), so
the query's fragments on every member read them as they read ``$name``, with nothing else
shipped, and a term already valued there is never run again. The values are charged to the
statement's memory budget here for as long as the statement runs (decision 0124).

Each SELECT of a set operation or WITH runs through ``SqlService.start_select`` with its own
text (behind the WITH clause it reads, if any): every member binds that text alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import msgspec

from shardex.api.sql_exec import SqlQuery, SqlStarted
from shardex.core.expr import Param, evaluate, walk
from shardex.sql.exec.bridge import close_all
from shardex.sql.exec.join_plan import side_params
from shardex.sql.exec.memory import Budget, value_size
from shardex.sql.exec.plan import bind_statement, plan_select
from shardex.sql.exec.reply import once
from shardex.sql.exec.rows import decode_row, encode_row
from shardex.sql.exec.setops import explain_set_op, set_op_texts, start_set_op
from shardex.sql.exec.statement_checks import check_statement
from shardex.sql.exec.statements import parsed
from shardex.sql.exec.subqueries import expression_runner
from shardex.sql.exec.subquery_inputs import Input, inputs_in
from shardex.sql.local_rows import inserted_values
from shardex.sql.syntax import ExplainStmt, SelectStmt, cte_names
from shardex.sql.syntax.ast import ExecuteStmt, InsertStmt, PrepareStmt, SetOpStmt, WithStmt
from shardex.sql.syntax.ctes import bind_with, values_in
from shardex.sql.syntax.explain import explain_with
from shardex.sql.syntax.params import check_params
from shardex.sql.syntax.setops import bind_query, bind_set_op
from shardex.sql.syntax.subquery import running_subqueries

if TYPE_CHECKING:
    from shardex.net import Principal
    from shardex.sql.exec.service import SqlService

__all__ = [
    "compound_statement",
    "explain_compound",
    "inserted_statement",
    "is_compound",
    "prepared_statement",
    "with_subquery_inputs",
]

# Starts the statement with these parameters: its plan, TS and rows (``start_select``'s).
StartWith = Callable[[Any], Awaitable[tuple[Any, Any, AsyncIterator[list[bytes]]]]]

Query = SelectStmt | SetOpStmt | WithStmt


def is_compound(stmt: object) -> bool:
    """A set operation or WITH statement (its EXPLAIN: ``explain_statement``)."""
    return isinstance(stmt, SetOpStmt | WithStmt)


async def prepared_statement(
    svc: SqlService,
    msg: SqlQuery,
    stmt: PrepareStmt | ExecuteStmt | ExplainStmt,
    principal: Principal | None,
    run: Callable[[SqlQuery], Awaitable[tuple[SqlStarted, AsyncIterator[list[bytes]]]]],
    accepted: Callable[[SqlQuery], SqlQuery],
) -> tuple[SqlStarted, AsyncIterator[list[bytes]]]:
    """PREPARE: the statement's text kept under its name on ``svc``'s node (its privileges
    checked now, and again at each EXECUTE); EXECUTE: that text ``run`` as if it had been
    sent (``accepted``: checked and stamped), the USING values its parameters; EXPLAIN
    EXECUTE: that text's EXPLAIN, run the same way."""
    if isinstance(stmt, ExplainStmt):
        assert isinstance(stmt.statement, ExecuteStmt)
        text, values = svc.prepared.execution(stmt.statement, msg.params)
        if not isinstance(parsed(text), ExplainStmt):
            text = f"EXPLAIN {text}"
        inner = msgspec.structs.replace(msg, statement=text, params=values)
        return await run(accepted(inner))
    if isinstance(stmt, ExecuteStmt):
        text, values = svc.prepared.execution(stmt, msg.params)
        inner = msgspec.structs.replace(msg, statement=text, params=values)
        return await run(accepted(inner))
    check_statement(principal, stmt.statement)
    inner = stmt.statement
    if isinstance(inner, WithStmt):  # a query that cannot bind is not kept
        bind_with(inner)
    elif isinstance(inner, SelectStmt | SetOpStmt):
        bind_query(inner)
    row = svc.prepared.prepare(stmt)
    return SqlStarted(stream_id=msg.stream_id, statement="prepare"), once([encode_row(row)])


async def compound_statement(
    svc: SqlService,
    msg: SqlQuery,
    stmt: SetOpStmt | WithStmt,
    params: Any,
    quota: int,
) -> tuple[SqlStarted, AsyncIterator[list[bytes]]]:
    """The reply that starts ``stmt`` on ``svc``'s node and its rows. ``quota``: the
    statement's memory quota."""
    whole = bind_with(stmt) if isinstance(stmt, WithStmt) else bind_set_op(stmt)
    check_params(whole.params(), params)
    run = _Run(svc, msg, quota)
    try:
        chunks = await run.start(msg.statement, stmt, params, "", [])
    except BaseException:
        run.close()
        raise
    details = {"mode": "with" if isinstance(stmt, WithStmt) else "set_operation"}
    started = SqlStarted(
        stream_id=msg.stream_id, statement="select", details={**details, "node": svc.scan.name}
    )
    return started, run.closing(chunks)


async def inserted_statement(
    svc: SqlService, msg: SqlQuery, stmt: InsertStmt, params: Any, quota: int
) -> InsertStmt:
    """INSERT/UPSERT ... SELECT as the VALUES statement it amounts to: its query run (as
    any query, its rows gathered here and charged to the budget while held), then each
    row's key and value (``local.inserted_values``). Checks all the statement's parameters."""
    query = stmt.select
    assert query is not None
    whole = bind_with(query) if isinstance(query, WithStmt) else bind_query(query)
    keyed = [e for e in (stmt.key, stmt.value) if e is not None]
    used = {n.name for e in keyed for n in walk(e) if isinstance(n, Param)}
    check_params(set(whole.params()) | used, params)
    run = _Run(svc, msg, quota, "INSERT ... SELECT")
    try:
        chunks = await run.start(stmt.select_text, query, params, "", [])
        rows = [run.held_value(decode_row(c)) async for c in _cells(chunks)]
        return inserted_values(stmt, rows, params)
    finally:
        run.close()


async def with_subquery_inputs(
    svc: SqlService,
    msg: SqlQuery,
    sql: str,
    inputs: list[Input],
    params: Any,
    start: StartWith,
) -> tuple[Any, Any, AsyncIterator[list[bytes]]]:
    """The statement ``sql`` started by ``start`` with its subqueries' inputs read first
    (``subquery_inputs.py``), each as a query of its own at the statement's consistency
    (``msg``'s), and added to ``params``; the values are charged to the statement's budget
    here until its rows end."""
    run = _Run(svc, msg, svc.quota(msg), "subquery inputs")
    prefix, names = _with_clause(sql)
    try:
        values = await run.read_inputs(inputs, params, prefix, names)
        plan, ts, rows = await start(values_in(params, values))
    except BaseException:
        run.close()
        raise
    return plan, ts, run.closing(rows)


def _with_clause(sql: str) -> tuple[str, list[str]]:
    """The WITH clause a statement's text starts with, and the names it binds."""
    stmt = parsed(sql)
    if isinstance(stmt, ExplainStmt):
        stmt = stmt.statement
    if not isinstance(stmt, WithStmt) or not sql.endswith(stmt.body_text):
        return "", []
    return sql[: len(sql) - len(stmt.body_text)], [t.name for t in stmt.terms]


class _Run:
    """One compound statement's queries, started here, and the memory its WITH values hold."""

    def __init__(self, svc: SqlService, msg: SqlQuery, quota: int, holds: str = "WITH") -> None:
        self.svc, self.msg = svc, msg
        self._stack = contextlib.ExitStack()
        memory = self._stack.enter_context(svc.memory.fragment(None, quota, msg.spill))
        self.budget: Budget = memory.budget()
        self.held = self.budget.reserve(holds)

    def close(self) -> None:
        self._stack.close()

    async def closing(self, chunks: AsyncIterator[list[bytes]]) -> AsyncIterator[list[bytes]]:
        try:
            async for chunk in chunks:
                yield chunk
        finally:
            await close_all([chunks])
            self.close()

    async def start(
        self, text: str, stmt: Query, params: Any, prefix: str, names: list[str]
    ) -> AsyncIterator[list[bytes]]:
        """``stmt``'s rows (``text`` as written, behind the WITH clause ``prefix`` whose
        ``names`` it reads; their values are in ``params``)."""
        if isinstance(stmt, SelectStmt):
            _, _, chunks = await self.svc.start_select(
                self.msg, prefix + text, stmt, params, params_checked=True
            )
            return chunks
        if isinstance(stmt, SetOpStmt):

            async def branch(branch_text: str, select: SelectStmt) -> AsyncIterator[list[bytes]]:
                return await self.start(branch_text, select, params, prefix, names)

            with cte_names.visible(names):
                return await start_set_op(
                    stmt, params, branch, self.svc.memory, self.budget.quota, self.msg.spill
                )
        values: dict[str, Any] = {}
        for i, term in enumerate(stmt.terms):
            param, seen = cte_names.cte_param(term.name), values_in(params, values)
            if term.query is not None:
                before = [*names, *(t.name for t in stmt.terms[:i])]
                rows = await self.start(
                    term.inner, term.query, seen, prefix + stmt.header(i), before
                )
                values[param] = self.held_value([decode_row(c) async for c in _cells(rows)])
            else:
                expr = bind_with(stmt).terms[i].expr
                assert expr is not None
                inputs = inputs_in([expr])
                if inputs:  # its subqueries over keyspaces, read first as the query's are
                    before = [*names, *(t.name for t in stmt.terms[:i])]
                    read = await self.read_inputs(inputs, seen, prefix + stmt.header(i), before)
                    seen = values_in(seen, read)
                with running_subqueries(expression_runner):
                    values[param] = self.held_value(evaluate(expr, {}, params=seen))
        body_names = [*names, *(t.name for t in stmt.terms)]
        return await self.start(
            stmt.body_text, stmt.body, values_in(params, values), prefix + stmt.header(), body_names
        )

    async def read_inputs(
        self, inputs: list[Input], params: Any, prefix: str, names: list[str]
    ) -> dict[str, Any]:
        """The values of subquery inputs (``subquery_inputs.py``), each read as a query of
        its own and held: a side statement with the parameters named, a subquery's text
        behind the WITH clause ``prefix`` (whose ``names`` it may read)."""
        values: dict[str, Any] = {}
        for one in inputs:
            stmt = parsed(one.text)
            assert isinstance(stmt, SelectStmt | SetOpStmt | WithStmt), "an input is a query"
            if one.gathers:
                chunks = await self.start(one.text, stmt, side_params(params), "", [])
            else:
                chunks = await self.start(one.text, stmt, params, prefix, names)
            values[one.param] = self.held_value([decode_row(c) async for c in _cells(chunks)])
        return values

    def held_value(self, value: Any) -> Any:
        """``value`` charged to the statement's budget for as long as it runs."""
        if not self.held.grow(value_size(value)):
            raise self.held.over(why="the values are held while the statement runs")
        return value


async def _cells(chunks: AsyncIterator[list[bytes]]) -> AsyncIterator[bytes]:
    try:
        async for chunk in chunks:
            for cell in chunk:
                yield cell
    finally:
        await close_all([chunks])


async def explain_compound(
    svc: SqlService, msg: SqlQuery, stmt: SetOpStmt | WithStmt, params: Any, members: dict
) -> dict[str, Any]:
    """EXPLAIN: each SELECT's distributed plan (a WITH's values are not known yet: spans that
    need them are left out, as for parameters without values)."""
    state = await svc.scan.view.state()
    known = params if isinstance(stmt, SetOpStmt) else None

    def planned(text: str) -> dict[str, Any]:
        b = bind_statement(text, False)
        resolve = known is not None
        return plan_select(
            b, known, state=state, members=members, resolve_params=resolve, tuning=msg.tuning
        ).explain()

    if isinstance(stmt, SetOpStmt):
        return explain_set_op(stmt, [planned(t) for t in set_op_texts(stmt)])
    out = explain_with(bind_with(stmt))
    body = stmt.body
    if isinstance(body, SelectStmt):
        out["distributed"] = planned(stmt.header() + stmt.body_text)["distributed"]
    out["distributed_with"] = {
        "on": "initiator",
        "does": "each term once, before the query; its value travels with the parameters",
        "terms": [t.name for t in stmt.terms],
    }
    return out
