"""``LocalEngine``'s DML: INSERT/UPSERT (VALUES and ... SELECT), DELETE, UPDATE and MERGE
over the in-memory keyspaces. Every new document is computed and checked before the first
change, so a failing statement changes nothing."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from shardex.core.expr import MISSING, Literal, evaluate, truth
from shardex.errors import ErrorCode, ShardexError
from shardex.sql.local_rows import (
    Params,
    QueryResult,
    bind_expr,
    compile_expr,
    eval_count,
    finish_rows,
    inserted_values,
    params_of,
)
from shardex.sql.operators.merge import DELETED, MergeRules, SourceRow
from shardex.sql.operators.mutate import apply_edits, compile_edits
from shardex.sql.syntax import DeleteStmt, InsertStmt, KeyspaceRef, SelectStmt, UpdateStmt
from shardex.sql.syntax.ast import WithStmt
from shardex.sql.syntax.bind import META_KEY, bind_select
from shardex.sql.syntax.ctes import bind_with
from shardex.sql.syntax.merge import MergeStmt
from shardex.sql.syntax.params import check_params
from shardex.sql.syntax.setops import bind_query

if TYPE_CHECKING:
    from shardex.sql.local import LocalEngine

__all__ = ["LocalDml"]


class LocalDml:
    """The DML half of a ``LocalEngine``, over its keyspaces and queries."""

    def __init__(self, engine: LocalEngine) -> None:
        self.engine = engine

    def insert_select(self, stmt: InsertStmt, params: Params) -> QueryResult:
        """INSERT/UPSERT ... SELECT: the query's rows, then a key and value of each."""
        assert stmt.select is not None
        if isinstance(stmt.select, WithStmt):
            w = bind_with(stmt.select)
            eng = self.engine
            used, run = w.params(), lambda: eng.run_query(w.body, eng.with_values(w, params))
        else:
            q = bind_query(stmt.select)
            used, run = q.params(), lambda: self.engine.run_query(q, params)
        check_params(used | params_of([e for e in (stmt.key, stmt.value) if e]), params)
        return self.insert(inserted_values(stmt, list(run()), params), params, checked=True)

    def insert(self, stmt: InsertStmt, params: Params, *, checked: bool = False) -> QueryResult:
        if not checked:
            check_params(params_of([e for kv in stmt.values for e in kv]), params)
        docs = self.engine.keyspace(stmt.keyspace)
        new: dict[str, Any] = {}
        for key_expr, value_expr in stmt.values:
            key = evaluate(key_expr, {}, params=params)
            value = evaluate(value_expr, {}, params=params)
            if not isinstance(key, str) or not key:
                raise ShardexError(
                    f"document key must be a non-empty string, got {key!r}",
                    code=ErrorCode.BAD_REQUEST,
                    details={
                        "key": repr(key),
                        "hint": "INSERT INTO ks (KEY, VALUE) VALUES ('id', {...})",
                    },
                )
            if value is MISSING:
                raise ShardexError(
                    f"document {key!r} has no value (MISSING)",
                    code=ErrorCode.BAD_REQUEST,
                    details={"key": key, "hint": "give a JSON value"},
                )
            if not stmt.upsert and (key in docs or key in new):
                raise ShardexError(
                    f"document {key!r} already exists in {stmt.keyspace!r}",
                    code=ErrorCode.DOC_EXISTS,
                    details={
                        "key": key,
                        "keyspace": stmt.keyspace,
                        "hint": "use UPSERT to replace",
                    },
                )
            new[key] = value
        docs.update(new)
        rows = self.returning(stmt.returning, stmt.keyspace, new.items(), params)
        return QueryResult(rows, len(new))

    def modify(self, stmt: DeleteStmt | UpdateStmt, params: Params) -> QueryResult:
        target = stmt.target
        exprs = [e for e in (target.use_keys, stmt.where, stmt.limit) if e is not None]
        if isinstance(stmt, UpdateStmt):
            exprs += [e for pair in stmt.set for e in pair] + list(stmt.unset)
        check_params(params_of(exprs), params)
        docs = self.engine.keyspace(target.name)
        alias = target.as_name
        bound = bind_select(SelectStmt(terms=(), from_=target, where=stmt.where))
        where = None if bound.where is None else compile_expr(bound.where)
        limit = eval_count(stmt.limit, params, "LIMIT")
        chosen: list[tuple[str, Any]] = []
        for docid, doc in self.engine.docs(docs, target.use_keys, params):
            if limit is not None and len(chosen) >= limit:
                break
            scope = {alias: doc, META_KEY: {"id": docid}}
            if where is None or truth(where(scope, None, params)):
                chosen.append((docid, doc))
        if isinstance(stmt, DeleteStmt):
            for docid, _ in chosen:
                del docs[docid]
            rows = self.returning(stmt.returning, alias, chosen, params)
            return QueryResult(rows, len(chosen))
        # UPDATE: compute every new document first, then apply them all.
        edits = compile_edits(stmt.set, stmt.unset, alias, lambda e: bind_expr(e, alias))
        updated: list[tuple[str, Any]] = []
        for docid, doc in chosen:
            scope = {alias: doc, META_KEY: {"id": docid}}
            updated.append((docid, apply_edits(edits, doc, scope, params)))
        docs.update(updated)
        rows = self.returning(stmt.returning, alias, updated, params)
        return QueryResult(rows, len(updated))

    def merge(self, stmt: MergeStmt, params: Params) -> QueryResult:
        """MERGE (``operators/merge.py``): every outcome decided before anything changes."""
        rules = MergeRules(stmt, params)
        check_params(params_of(rules.exprs()), params)
        target = self.engine.keyspace(stmt.keyspace)
        rows = self.merge_source(stmt, params)
        limit = eval_count(stmt.limit, params, "LIMIT")
        keyed = rules.keyed(rows if limit is None else rows[:limit])
        merged: list[tuple[str, Any]] = []
        gone: list[str] = []
        for key, row in keyed.items():
            if key in target:
                outcome = rules.matched(key, target[key], row)
                if outcome is None:
                    continue
                if outcome[0] == DELETED:
                    gone.append(key)
                merged.append((key, outcome[1]))
            else:
                value = rules.inserted(key, row)
                if value is not None:
                    merged.append((key, value))
        target.update((k, v) for k, v in merged if k not in gone)
        for key in gone:
            del target[key]
        rows_out = self.returning(stmt.returning, stmt.alias, merged, params)
        return QueryResult(rows_out, len(merged))

    def merge_source(self, stmt: MergeStmt, params: Params) -> list[SourceRow]:
        src = stmt.source
        if isinstance(src, KeyspaceRef):
            docs = self.engine.docs(self.engine.keyspace(src.name), src.use_keys, params)
            return [(doc, {"id": docid}) for docid, doc in docs]
        if isinstance(src, SelectStmt):
            bound = bind_select(src)
            check_params(bound.params(), params)
            return [(v, {}) for v in self.engine.run_select(bound, params)]
        value = evaluate(src, {}, params=params)
        items = value if isinstance(value, list) else [] if value is MISSING else [value]
        return [(v, {}) for v in items]

    def returning(
        self, terms: Any, alias: str, docs: Iterable[tuple[str, Any]], params: Params
    ) -> list[Any]:
        if not terms:
            return []
        ref = KeyspaceRef("", alias, source=Literal(None))
        bound = bind_select(SelectStmt(terms=tuple(terms), from_=ref))
        scopes = ({alias: doc, META_KEY: {"id": docid}} for docid, doc in docs)
        return list(finish_rows(bound, scopes, params, None, 0))
