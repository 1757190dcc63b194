"""EXPLAIN on the initiator, of every statement but EXECUTE (whose prepared text is explained
as if sent: ``compound.prepared_statement``): a SELECT's physical plan (``plan_explain``), a
set operation's or WITH's (``compound.explain_compound``), and a DML statement's: the plan
of the query it runs (INSERT ... SELECT's query, the SELECT a DELETE / UPDATE derives,
``statements.dml_select``, MERGE's source, ``statements.merge_select``) and then its write
steps (``syntax/explain_dml.py``; DELETE, UPDATE and MERGE under CAS). Everything here
plans; nothing runs a fragment, reads a document or writes one."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from shardex.api.sql_exec import SqlQuery, SqlStarted
from shardex.sql.exec.compound import explain_compound
from shardex.sql.exec.dml_run import values_chunk
from shardex.sql.exec.plan import PhysicalPlan, bind_statement, no_keyspace, plan_select
from shardex.sql.exec.started import index_name
from shardex.sql.exec.statements import merge_select, prepared_off_loop
from shardex.sql.exec.tuning import check_tuning
from shardex.sql.syntax import DeleteStmt, ExplainStmt, InsertStmt, SelectStmt, UpdateStmt
from shardex.sql.syntax.ast import SetOpStmt, WithStmt
from shardex.sql.syntax.explain_dml import explain_dml
from shardex.sql.syntax.merge import MergeStmt

if TYPE_CHECKING:
    from shardex.sql.exec.service import SqlService

__all__ = ["explain_statement"]


async def explain_statement(
    svc: SqlService, msg: SqlQuery, stmt: ExplainStmt, params: Any, members: dict[str, str]
) -> tuple[SqlStarted, AsyncIterator[list[bytes]]]:
    """The reply to ``EXPLAIN statement`` (``msg.statement``) and its one row, the plan.
    ``members``: the live ones."""
    inner = stmt.statement
    planner = _Planner(svc, msg, params, members)
    index: str | None = None
    if isinstance(inner, SelectStmt):
        plan = await planner.plan(msg.statement, dml=False)
        explained, index = plan.explain(), index_name(plan)
    elif isinstance(inner, SetOpStmt | WithStmt):
        explained = await explain_compound(svc, msg, inner, params, members)
    else:
        assert isinstance(inner, InsertStmt | DeleteStmt | UpdateStmt | MergeStmt), inner
        explained = await _explain_dml(planner, inner)
    started = SqlStarted(stream_id=msg.stream_id, statement="explain", index=index)
    return started, values_chunk([explained])


async def _explain_dml(
    planner: _Planner, stmt: InsertStmt | DeleteStmt | UpdateStmt | MergeStmt
) -> dict[str, Any]:
    query: dict[str, Any] | None = None
    if isinstance(stmt, InsertStmt):
        await planner.keyspace(stmt.keyspace)
        source = stmt.select
        if isinstance(source, SelectStmt):
            query = (await planner.plan(f"EXPLAIN {stmt.select_text}", dml=False)).explain()
        elif source is not None:
            svc, msg, members = planner.svc, planner.msg, planner.members
            query = await explain_compound(svc, msg, source, planner.params, members)
    elif isinstance(stmt, MergeStmt):
        await planner.keyspace(stmt.keyspace)
        if merge_select(stmt) is not None:
            query = (await planner.plan(planner.msg.statement, dml=True)).explain()
    else:  # the SELECT it derives, planned from the statement's text as when it runs
        query = (await planner.plan(planner.msg.statement, dml=True)).explain()
    return explain_dml(stmt, query, cas=True)


class _Planner:
    """Plans the SELECT of a text (the one a DML statement derives when ``dml``) as
    ``SqlService.start_select`` would, parameters resolved when the request gives them."""

    def __init__(self, svc: SqlService, msg: SqlQuery, params: Any, members: dict) -> None:
        self.svc, self.msg, self.params, self.members = svc, msg, params, members

    async def keyspace(self, name: str) -> None:
        """KEYSPACE_NOT_FOUND unless ``name`` exists (a write's target)."""
        state = await self.svc.scan.view.state()
        if name not in state.keyspaces:
            raise no_keyspace(name)

    async def plan(self, sql: str, *, dml: bool) -> PhysicalPlan:
        state = await self.svc.scan.view.state()
        tuning = check_tuning(self.msg.tuning)
        params = self.params

        def planned() -> PhysicalPlan:
            b = bind_statement(sql, dml, cached=tuning["plan_cache"])
            return plan_select(
                b,
                params,
                state=state,
                members=self.members,
                resolve_params=params is not None,
                tuning=tuning,
            )

        return await prepared_off_loop(sql, planned)
