"""INSERT, UPSERT, DELETE and UPDATE statements on the initiator: keys and values checked
before any write, the writes at the documents' owners (DELETE/UPDATE under CAS,
``dml.write_checked``), and the RETURNING rows."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final

from shardex.api.scan import REQUEST_PLUS
from shardex.core.expr import MISSING, Literal, evaluate
from shardex.core.expr.ops import truth
from shardex.errors import ErrorCode, ShardexError
from shardex.sql.exec.dml import DELETE, SKIP, write_checked
from shardex.sql.exec.documents import DocumentAccess
from shardex.sql.exec.fragment_rows import finish
from shardex.sql.exec.memory import SLOT_BYTES, Budget, value_size
from shardex.sql.exec.rows import decode_row
from shardex.sql.exec.statements import bad_request, dml_select
from shardex.sql.exec.subqueries import expression_runner
from shardex.sql.local_rows import bind_expr, params_of
from shardex.sql.operators.mutate import apply_edits, compile_edits
from shardex.sql.syntax import DeleteStmt, InsertStmt, KeyspaceRef, SelectStmt, UpdateStmt
from shardex.sql.syntax.bind import META_KEY, bind_select
from shardex.sql.syntax.params import check_params
from shardex.sql.syntax.subquery import running_subqueries

__all__ = [
    "MUTATE_PARALLEL",
    "apply_all",
    "insert_statement",
    "modify_statement",
    "returning_rows",
]

MUTATE_PARALLEL: Final = 32
IDS_OVER_BUDGET: Final = (
    "it lists the documents it changes before writing any: narrow the WHERE clause or add a "
    "LIMIT and run it again for the rest"
)

# The initiator's SELECT runner, bound to the statement: (select, params, dml=, consistency=)
# -> (plan, started, batches of encoded rows).
Select = Callable[..., Awaitable[tuple[Any, Any, AsyncIterator[list[bytes]]]]]


def show(value: Any) -> str:
    return "MISSING" if value is MISSING else repr(value)[:80]


async def insert_statement(
    documents: DocumentAccess,
    view: Any,
    stmt: InsertStmt,
    params: Any,
    durability: str,
    budget: Budget,
    *,
    durability_timeout: float | None = None,
    checked: bool = False,
) -> tuple[int, list[Any]]:
    """INSERT/UPSERT by key: every (key, value) evaluated and checked before anything is
    written, then the writes ``MUTATE_PARALLEL`` at a time; the mutation count and the
    RETURNING rows. ``checked``: the caller checked ``params`` (INSERT ... SELECT's)."""
    if not checked:
        check_params(params_of([e for kv in stmt.values for e in kv]), params)
    state = await view.state()
    if stmt.keyspace not in state.keyspaces:
        raise ShardexError(
            f"keyspace {stmt.keyspace!r} not found",
            code=ErrorCode.KEYSPACE_NOT_FOUND,
            details={"keyspace": stmt.keyspace},
        )
    new: dict[str, Any] = {}
    for key_expr, value_expr in stmt.values:
        key = evaluate(key_expr, {}, params=params)
        value = evaluate(value_expr, {}, params=params)
        if not isinstance(key, str) or not key:
            raise bad_request(
                f"document key must be a non-empty string, got {key!r}",
                key=repr(key),
                hint="INSERT INTO ks (KEY, VALUE) VALUES ('id', {...})",
            )
        if not isinstance(value, dict):
            raise bad_request(
                f"document {key!r} must be an object, got {show(value)}",
                key=key,
                hint="VALUES ('id', {\"field\": ...})",
            )
        if not stmt.upsert and key in new:
            raise ShardexError(
                f"document {key!r} is inserted twice by this statement",
                code=ErrorCode.DOC_EXISTS,
                details={"key": key, "hint": "use UPSERT to replace"},
            )
        new[key] = value
    await apply_all(
        [
            documents.upsert(
                stmt.keyspace,
                k,
                v,
                insert=not stmt.upsert,
                durability=durability,
                durability_timeout=durability_timeout,
            )
            for k, v in new.items()
        ]
    )
    rows = returning_rows(stmt.returning, stmt.keyspace, list(new.items()), params, budget)
    return len(new), rows


async def modify_statement(
    documents: DocumentAccess,
    select: Select,
    stmt: DeleteStmt | UpdateStmt,
    params: Any,
    durability: str,
    budget: Budget,
    *,
    durability_timeout: float | None = None,
) -> tuple[int, list[Any]]:
    """DELETE/UPDATE: the derived SELECT (run by ``select``, at request_plus) chooses the
    documents, then each is written at its owner under its CAS (``write_checked``)."""
    target = stmt.target
    alias = target.as_name
    exprs: list[Any] = [target.use_keys, stmt.where, stmt.limit]
    if isinstance(stmt, UpdateStmt):
        exprs += [e for pair in stmt.set for e in pair] + list(stmt.unset)
    check_params(params_of(exprs), params)
    # Compiled first: a bad SET path fails before anything is read or changed.
    edits = compile_edits(
        getattr(stmt, "set", ()), getattr(stmt, "unset", ()), alias, lambda e: bind_expr(e, alias)
    )
    ks = target.name
    where = None if stmt.where is None else bind_expr(stmt.where, alias)

    def decide(docid: str, doc: Any) -> Any:
        """The write for this version of the document: the WHERE is evaluated again on
        it (it may have changed since the SELECT read it), with the inputs its subqueries
        read for the SELECT (``subquery_inputs``)."""
        scope = {alias: doc, META_KEY: {"id": docid}}
        if where is not None:
            with running_subqueries(expression_runner):
                if not truth(evaluate(where, scope, params=with_inputs)):
                    return SKIP
        if isinstance(stmt, DeleteStmt):
            return DELETE
        return apply_edits(edits, doc, scope, params)

    plan, _, batches = await select(dml_select(stmt), params, dml=True, consistency=REQUEST_PLUS)
    with_inputs = params if plan.params is None else plan.params
    chosen: list[str] = []
    # Every id is listed before the first write (a write must not bring its document back
    # into the scan that chose it): the list is charged to the statement's budget.
    listed = budget.reserve(type(stmt).__name__.removesuffix("Stmt").upper())
    try:
        async with contextlib.aclosing(batches):
            async for chunk in batches:
                ids = [decode_row(cell)["id"] for cell in chunk]
                if not listed.grow(sum(value_size(d) + SLOT_BYTES for d in ids)):
                    raise listed.over(why=IDS_OVER_BUDGET)
                chosen += ids
        written = await write_checked(
            documents,
            ks,
            chosen,
            decide,
            parallel=MUTATE_PARALLEL,
            durability=durability,
            durability_timeout=durability_timeout,
        )
    finally:
        listed.release()
    return len(written), returning_rows(stmt.returning, alias, written, params, budget)


async def apply_all(ops: list[Any]) -> None:
    """Run the mutations, ``MUTATE_PARALLEL`` at a time; the first error is raised (the
    ones applied before it stay applied: statements are not transactions)."""
    sem = asyncio.Semaphore(MUTATE_PARALLEL)

    async def one(op: Any) -> None:
        async with sem:
            await op

    tasks = [asyncio.ensure_future(one(op)) for op in ops]
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()


def returning_rows(
    terms: Any, alias: str, docs: list[tuple[str, Any]], params: Any, budget: Budget
) -> list[Any]:
    if not terms:
        return []
    ref = KeyspaceRef("", alias, source=Literal(None))
    b = bind_select(SelectStmt(terms=tuple(terms), from_=ref))
    scopes = [{alias: doc, META_KEY: {"id": docid}} for docid, doc in docs]
    return list(finish(b, scopes, params, None, 0, budget))
