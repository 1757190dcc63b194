"""MERGE on the initiator: the source rows (a SELECT through the statement's runner, at
request_plus, or an expression evaluated here), the target documents they name read with
their CAS, then the matched ones written under it (``dml.write_checked``: a concurrent
change is read again and decided again) and the unmatched ones inserted. Rules in
``operators/merge.py``."""

from __future__ import annotations

import contextlib
from typing import Any

from shardex.api.scan import REQUEST_PLUS
from shardex.core.expr import MISSING, evaluate
from shardex.sql.exec.dml import DELETE, SKIP, write_checked
from shardex.sql.exec.dml_statements import (
    IDS_OVER_BUDGET,
    MUTATE_PARALLEL,
    Select,
    apply_all,
    returning_rows,
    show,
)
from shardex.sql.exec.documents import DocumentAccess
from shardex.sql.exec.memory import SLOT_BYTES, Budget, value_size
from shardex.sql.exec.rows import decode_row
from shardex.sql.exec.statements import bad_request, merge_select
from shardex.sql.local_rows import eval_count, params_of
from shardex.sql.operators.merge import DELETED, MergeRules, SourceRow
from shardex.sql.syntax import KeyspaceRef
from shardex.sql.syntax.merge import MergeStmt
from shardex.sql.syntax.params import check_params

__all__ = ["merge_statement"]


async def merge_statement(
    documents: DocumentAccess,
    select: Select,
    stmt: MergeStmt,
    params: Any,
    durability: str,
    budget: Budget,
    *,
    durability_timeout: float | None = None,
) -> tuple[int, list[Any]]:
    rules = MergeRules(stmt, params)
    check_params(params_of(rules.exprs()), params)
    limit = eval_count(stmt.limit, params, "LIMIT")
    source = budget.reserve("MERGE")
    try:
        rows = await _source_rows(select, stmt, params, source, limit)
        keyed = rules.keyed(rows)
        current = await documents.get_many_cas(stmt.keyspace, list(keyed))
        inserts: dict[str, Any] = {}
        for key, row in keyed.items():
            if key in current:
                continue
            value = rules.inserted(key, row)
            if value is None:
                continue
            if not isinstance(value, dict):
                raise bad_request(
                    f"MERGE would insert document {key!r} as {show(value)}, not an object",
                    key=key,
                    hint="WHEN NOT MATCHED THEN INSERT {...}",
                )
            inserts[key] = value

        def decide(docid: str, doc: Any) -> Any:
            outcome = rules.matched(docid, doc, keyed[docid])
            if outcome is None:
                return SKIP
            return DELETE if outcome[0] == DELETED else outcome[1]

        written = await write_checked(
            documents,
            stmt.keyspace,
            [k for k in keyed if k in current],
            decide,
            parallel=MUTATE_PARALLEL,
            durability=durability,
            durability_timeout=durability_timeout,
        )
        await apply_all(
            [
                documents.upsert(
                    stmt.keyspace,
                    k,
                    v,
                    insert=True,
                    durability=durability,
                    durability_timeout=durability_timeout,
                )
                for k, v in inserts.items()
            ]
        )
    finally:
        source.release()
    merged = [*written, *inserts.items()]
    return len(merged), returning_rows(stmt.returning, stmt.alias, merged, params, budget)


async def _source_rows(
    select: Select, stmt: MergeStmt, params: Any, held: Any, limit: int | None
) -> list[SourceRow]:
    """Every source row (up to ``limit``), charged to the statement's budget: all of them
    are read before the first write, so a write never feeds back into its own source."""
    query = merge_select(stmt)
    if query is None:
        value = evaluate(stmt.source, {}, params=params)  # type: ignore[arg-type]
        items = value if isinstance(value, list) else [] if value is MISSING else [value]
        return [(v, {}) for v in items[:limit]]
    keyspace = isinstance(stmt.source, KeyspaceRef)
    rows: list[SourceRow] = []
    _, _, batches = await select(query, params, dml=True, consistency=REQUEST_PLUS)
    async with contextlib.aclosing(batches):
        async for chunk in batches:
            for cell in chunk:
                if limit is not None and len(rows) >= limit:
                    return rows
                value = decode_row(cell)
                if not held.grow(value_size(value) + SLOT_BYTES):
                    raise held.over(why=IDS_OVER_BUDGET)
                rows.append((value["v"], {"id": value["id"]}) if keyspace else (value, {}))
    return rows
