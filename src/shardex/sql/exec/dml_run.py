"""INSERT/UPSERT (VALUES or ... SELECT), DELETE, UPDATE and MERGE on the initiator: each
run within the statement's memory quota, answered with its mutation count and RETURNING rows
as one chunk."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from shardex.api.sql_exec import SqlQuery, SqlStarted
from shardex.sql.exec.compound import inserted_statement
from shardex.sql.exec.dml_statements import insert_statement, modify_statement
from shardex.sql.exec.merge_statement import merge_statement
from shardex.sql.exec.reply import once
from shardex.sql.exec.rows import encode_row
from shardex.sql.syntax import DeleteStmt, InsertStmt, UpdateStmt
from shardex.sql.syntax.merge import MergeStmt

if TYPE_CHECKING:
    from shardex.sql.exec.service import SqlService

__all__ = ["dml_statement", "values_chunk"]


def values_chunk(values: list[Any]) -> AsyncIterator[list[bytes]]:
    """Rows made on the initiator (EXPLAIN's plan, DML's RETURNING), encoded as one chunk."""
    return once([encode_row(v) for v in values])


async def dml_statement(
    svc: SqlService,
    msg: SqlQuery,
    stmt: InsertStmt | DeleteStmt | UpdateStmt | MergeStmt,
    params: Any,
) -> tuple[SqlStarted, AsyncIterator[list[bytes]]]:
    if isinstance(stmt, InsertStmt):
        checked = stmt.select is not None  # its query's rows, gathered: VALUES to write
        if checked:
            stmt = await inserted_statement(svc, msg, stmt, params, svc.quota(msg))
        with svc.memory.fragment(None, svc.quota(msg), msg.spill) as mem:
            count, rows = await insert_statement(
                svc.documents,
                svc.scan.view,
                stmt,
                params,
                msg.durability,
                mem.budget(),
                durability_timeout=msg.durability_timeout,
                checked=checked,
            )
        kind = "upsert" if stmt.upsert else "insert"
        started = SqlStarted(stream_id=msg.stream_id, statement=kind, mutation_count=count)
        return started, values_chunk(rows)
    if isinstance(stmt, DeleteStmt | UpdateStmt | MergeStmt):
        # Each chooses what it changes by a SELECT the leaves derive from the text.
        select = functools.partial(svc.start_select, msg, msg.statement)
        run = merge_statement if isinstance(stmt, MergeStmt) else modify_statement
        with svc.memory.fragment(None, svc.quota(msg), msg.spill) as mem:
            count, rows = await run(
                svc.documents,
                select,
                stmt,  # type: ignore[arg-type]
                params,
                msg.durability,
                mem.budget(),
                durability_timeout=msg.durability_timeout,
            )
        kind = type(stmt).__name__.removesuffix("Stmt").lower()
        started = SqlStarted(stream_id=msg.stream_id, statement=kind, mutation_count=count)
        return started, values_chunk(rows)
