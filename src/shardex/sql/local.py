"""``LocalEngine``: runs SQL++ statements over in-memory keyspaces in one process.

It is the single-process reference for the distributed SQL path: the planner's fragments
are built from the same operators (``shardex.sql.operators``) over the same bound statement
(``shardex.sql.syntax.bind``), so a distributed result can be checked against this one. The
conformance runner uses it until queries run on the cluster.

    >>> eng = LocalEngine()
    >>> eng.create_keyspace("users")
    >>> eng.execute('INSERT INTO users (KEY, VALUE) VALUES ("u1", {"name": "Ann", "age": 41})')
    QueryResult(rows=[], mutation_count=1)
    >>> eng.query("SELECT name FROM users WHERE age > $1", [40])
    [{'name': 'Ann'}]

Keyspaces are ``dict[docid, document]``; documents are JSON values (dicts). Statements
that fail raise ``ShardexError`` before changing anything (DML evaluates every new document
first, then applies them).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from shardex.core.expr import (
    MISSING,
    Expr,
    compile_expression,
    evaluate,
)
from shardex.core.expr.functions_date import mentions_statement_time, with_statement_time
from shardex.errors import ErrorCode, ShardexError
from shardex.sql.ddl import BuildIndexStmt, CreateIndexStmt, DropIndexStmt
from shardex.sql.join_steps import joined_rows
from shardex.sql.local_dml import LocalDml
from shardex.sql.local_rows import (
    Params,
    QueryResult,
    compile_expr,
    eval_count,
    finish_rows,
    row_fn,
    set_op_rows,
    unnest_specs,
    with_bindings,
)
from shardex.sql.operators import (
    AggSpec,
    aggregate,
    filter_rows,
    unnest,
)
from shardex.sql.operators.join import key_bytes
from shardex.sql.operators.window import window, window_specs
from shardex.sql.planner.joins import JoinPlan, plan_join
from shardex.sql.prepared import PreparedStatements
from shardex.sql.syntax import (
    DeleteStmt,
    ExplainStmt,
    InsertStmt,
    SelectStmt,
    Statement,
    UpdateStmt,
    parse_statement,
)
from shardex.sql.syntax.ast import ExecuteStmt, PrepareStmt, SetOpStmt, WithStmt
from shardex.sql.syntax.bind import (
    META_KEY,
    BoundSelect,
    aggregate_name,
    bind_select,
    group_key_name,
)
from shardex.sql.syntax.ctes import BoundWith, bind_with, valued_terms
from shardex.sql.syntax.dml_selects import dml_select, merge_select
from shardex.sql.syntax.explain import explain_query, explain_select, explain_with
from shardex.sql.syntax.explain_dml import explain_dml
from shardex.sql.syntax.merge import MergeStmt
from shardex.sql.syntax.params import check_params
from shardex.sql.syntax.setops import (
    BoundQuery,
    BoundSetOp,
    bind_query,
)
from shardex.sql.syntax.subquery import running_subqueries


class LocalEngine:
    def __init__(self) -> None:
        self.keyspaces: dict[str, dict[str, Any]] = {}
        self.indexes: dict[str, dict[str, CreateIndexStmt]] = {}
        self.prepared = PreparedStatements()
        self.dml = LocalDml(self)

    # -- keyspaces ----------------------------------------------------------------------------

    def create_keyspace(self, name: str, *, exist_ok: bool = False) -> None:
        if name in self.keyspaces:
            if exist_ok:
                return
            raise ShardexError(
                f"keyspace {name!r} already exists",
                code=ErrorCode.KEYSPACE_EXISTS,
                details={"keyspace": name},
            )
        self.keyspaces[name] = {}
        self.indexes[name] = {}

    def keyspace(self, name: str) -> dict[str, Any]:
        ks = self.keyspaces.get(name)
        if ks is None:
            raise ShardexError(
                f"keyspace {name!r} not found",
                code=ErrorCode.KEYSPACE_NOT_FOUND,
                details={
                    "keyspace": name,
                    "known": sorted(self.keyspaces),
                    "hint": "create it first (or check the spelling)",
                },
            )
        return ks

    # -- statements ---------------------------------------------------------------------------

    def query(self, sql: str | Statement, params: Params = None) -> list[Any]:
        return self.execute(sql, params).rows

    def execute(self, sql: str | Statement, params: Params = None) -> QueryResult:
        with running_subqueries(self.run_subquery):
            return self._execute(sql, params)

    def run_subquery(self, b: BoundQuery, outer: dict[str, Any], params: Params) -> list[Any]:
        """A subquery's result values for one outer row (``subquery.SubqueryRunner``)."""
        return list(self.run_query(b, params, outer))

    def _execute(self, sql: str | Statement, params: Params) -> QueryResult:
        stmt = parse_statement(sql) if isinstance(sql, str) else sql
        if not isinstance(sql, str) or mentions_statement_time(sql):
            params = with_statement_time(params)  # NOW_*: one time for the statement
        if isinstance(stmt, SelectStmt):
            bound = bind_select(stmt)
            check_params(bound.params(), params)
            return QueryResult(list(self.run_select(bound, params)))
        if isinstance(stmt, PrepareStmt):
            if isinstance(stmt.statement, WithStmt):  # a query that cannot bind is not kept
                bind_with(stmt.statement)
            elif isinstance(stmt.statement, SelectStmt | SetOpStmt):
                bind_query(stmt.statement)
            return QueryResult([self.prepared.prepare(stmt)])
        if isinstance(stmt, ExecuteStmt):
            text, values = self.prepared.execution(stmt, params)
            return self._execute(text, values)
        if isinstance(stmt, SetOpStmt):
            query = bind_query(stmt)
            check_params(query.params(), params)
            return QueryResult(list(self.run_query(query, params)))
        if isinstance(stmt, WithStmt):
            w = bind_with(stmt)
            check_params(w.params(), params)
            return QueryResult(list(self.run_query(w.body, self.with_values(w, params))))
        if isinstance(stmt, ExplainStmt):
            if isinstance(stmt.statement, ExecuteStmt):  # the prepared statement's plan
                text, values = self.prepared.execution(stmt.statement, params)
                explained = isinstance(parse_statement(text), ExplainStmt)
                return self._execute(text if explained else f"EXPLAIN {text}", values)
            return QueryResult([self.explain(stmt.statement)])
        if isinstance(stmt, InsertStmt):
            if stmt.select is not None:
                return self.dml.insert_select(stmt, params)
            return self.dml.insert(stmt, params)
        if isinstance(stmt, DeleteStmt | UpdateStmt):
            return self.dml.modify(stmt, params)
        if isinstance(stmt, MergeStmt):
            return self.dml.merge(stmt, params)
        return self._ddl(stmt)

    def explain(self, stmt: object) -> dict[str, Any]:
        """EXPLAIN of a query or DML statement (``syntax/explain_dml.py``): nothing runs."""
        if isinstance(stmt, WithStmt):
            w = bind_with(stmt)
            for one in w.selects():
                self._check_from(one)
            return explain_with(w)
        if isinstance(stmt, SelectStmt | SetOpStmt):
            query = bind_query(stmt)
            selects = query.selects() if isinstance(query, BoundSetOp) else [query]
            for one in selects:
                self._check_from(one)
            if isinstance(query, BoundSelect):
                joins = [p.explain() for p in self.join_plans(query)] if query.joins else None
                return explain_select(query, joins)
            return explain_query(query)
        assert isinstance(stmt, InsertStmt | DeleteStmt | UpdateStmt | MergeStmt), stmt
        if isinstance(stmt, InsertStmt):
            self.keyspace(stmt.keyspace)
            source = stmt.select
        elif isinstance(stmt, MergeStmt):
            self.keyspace(stmt.keyspace)
            source = merge_select(stmt)
        else:
            source = dml_select(stmt)
        return explain_dml(stmt, None if source is None else self.explain(source), cas=False)

    def _ddl(self, stmt: Any) -> QueryResult:
        indexes = self.indexes.setdefault(stmt.keyspace, {})
        self.keyspace(stmt.keyspace)
        if isinstance(stmt, CreateIndexStmt):
            name = stmt.name or "#primary"
            if name in indexes:
                raise ShardexError(
                    f"index {name!r} already exists on {stmt.keyspace!r}",
                    code=ErrorCode.INDEX_EXISTS,
                    details={"index": name, "keyspace": stmt.keyspace},
                )
            indexes[name] = stmt
        elif isinstance(stmt, DropIndexStmt):
            name = stmt.name or "#primary"
            if stmt.is_primary and stmt.name is None:
                name = next((n for n, s in indexes.items() if s.is_primary), name)
            if indexes.pop(name, None) is None:
                raise self._no_index(stmt.keyspace, name)
        elif isinstance(stmt, BuildIndexStmt):
            for name in stmt.names:
                if name not in indexes:
                    raise self._no_index(stmt.keyspace, name)
        return QueryResult()

    def _no_index(self, keyspace: str, name: str) -> ShardexError:
        return ShardexError(
            f"index {name!r} not found on keyspace {keyspace!r}",
            code=ErrorCode.INDEX_NOT_FOUND,
            details={
                "index": name,
                "keyspace": keyspace,
                "known": sorted(self.indexes.get(keyspace, {})),
            },
        )

    def _check_from(self, b: BoundSelect) -> None:
        for j in b.joins:
            self.keyspace(j.keyspace)
            for name in j.use_index:
                if name not in self.indexes.get(j.keyspace, {}):
                    raise self._no_index(j.keyspace, name)
        ref = b.from_
        if ref is None or ref.source is not None:
            return
        self.keyspace(ref.name)
        for name in ref.use_index:
            if name not in self.indexes.get(ref.name, {}):
                raise self._no_index(ref.name, name)

    def join_plans(self, b: BoundSelect) -> list[JoinPlan]:
        """How each JOIN / NEST of ``b`` runs here (``planner.joins``): an index of the
        inner keyspace is one this engine was told of (``CREATE INDEX``)."""
        plans = []
        for j in b.joins:
            defs = self.indexes.get(j.keyspace, {})
            usable = [
                (name, d.keys[0][0])
                for name, d in defs.items()
                if d.keys and not d.is_primary and (not j.use_index or name in j.use_index)
            ]
            plans.append(plan_join(j, usable))
        return plans

    # -- SELECT ---------------------------------------------------------------------------------

    def scope_rows(
        self, b: BoundSelect, params: Params, outer: dict[str, Any] | None = None
    ) -> Iterator[dict[str, Any]]:
        """The document-scope rows of FROM and its UNNESTs (before LET and WHERE); a
        subquery's rows start from its ``outer`` row (the enclosing query's names)."""
        rows = self._from_rows(b, params, outer or {})
        if b.joins:
            self._check_from(b)
            plans = self.join_plans(b)
            sides = _LocalSides(self, plans)
            specs = unnest_specs(b, params)
            return joined_rows(b, rows, plans, sides, params, specs, outer=outer or None)
        if not b.unnests:
            return rows
        return unnest(rows, unnest_specs(b, params))

    def _from_rows(
        self, b: BoundSelect, params: Params, outer: dict[str, Any]
    ) -> Iterator[dict[str, Any]]:
        ref = b.from_
        if ref is None:
            yield dict(outer)
            return
        alias = b.alias
        if ref.source is not None:
            value = evaluate(ref.source, outer, params=params)
            # N1QL: an array gives a row per element, MISSING none, anything else (NULL
            # too) one row.
            items = value if isinstance(value, list) else [] if value is MISSING else [value]
            for item in items:
                yield {**outer, alias: item, META_KEY: {}}
            return
        docs = self.keyspace(ref.name)
        self._check_from(b)
        for docid, doc in self.docs(docs, ref.use_keys, params, outer):
            yield {**outer, alias: doc, META_KEY: {"id": docid}}

    @staticmethod
    def docs(
        docs: dict[str, Any],
        use_keys: Expr | None,
        params: Params,
        outer: dict[str, Any] | None = None,
    ) -> Iterable[tuple[str, Any]]:
        if use_keys is None:
            return list(docs.items())  # a snapshot: DML may change the keyspace while we run
        keys = evaluate(use_keys, outer or {}, params=params)
        if isinstance(keys, str):
            keys = [keys]
        if not isinstance(keys, list):
            return []
        return [(k, docs[k]) for k in keys if isinstance(k, str) and k in docs]

    def run_select(
        self, b: BoundSelect, params: Params, outer: dict[str, Any] | None = None
    ) -> Iterator[Any]:
        rows: Iterable[Any] = self.scope_rows(b, params, outer)
        rows = with_bindings(rows, b.lets, params)
        if b.where is not None:
            where = compile_expr(b.where)
            rows = filter_rows(rows, lambda r: where(r, None, params))
        if b.grouped:
            rows = self._group(b, rows, params, outer or {})
        if b.windows:
            rows = window(rows, window_specs(b, params))
        limit = eval_count(b.limit, params, "LIMIT")
        offset = eval_count(b.offset, params, "OFFSET") or 0
        if limit == 0:
            return iter(())
        return finish_rows(b, rows, params, limit, offset)

    def with_values(self, w: BoundWith, params: Params) -> dict[str, Any]:
        """``params`` with the value of every WITH term, each evaluated once, in order."""
        return valued_terms(w, params, lambda q, seen: list(self.run_query(q, seen)))

    def run_query(
        self, q: BoundQuery | BoundWith, params: Params, outer: dict[str, Any] | None = None
    ) -> Iterator[Any]:
        """The result values of a SELECT, a set operation or (a subquery's) WITH, over
        ``outer`` for a subquery: a WITH's terms valued once, then its query."""
        if isinstance(q, BoundSelect):
            return self.run_select(q, params, outer)
        if isinstance(q, BoundWith):
            valued = valued_terms(
                q, params, lambda t, seen: list(self.run_query(t, seen, outer)), outer
            )
            return self.run_query(q.body, valued, outer)
        return set_op_rows(q, params, lambda b: self.run_query(b, params, outer))

    def _group(
        self, b: BoundSelect, rows: Iterable[Any], params: Params, outer: dict[str, Any]
    ) -> Iterator[Any]:
        keys = [row_fn(k, params) for k in b.group_keys]
        aggs = [
            AggSpec(a.name, None if a.arg is None else row_fn(a.arg, params), a.distinct)
            for a in b.aggregates
        ]
        groups = aggregate(rows, keys, aggs, global_group=not b.group_keys)
        out: Iterable[Any] = (
            {
                **outer,  # a subquery's groups still see the enclosing row
                **{group_key_name(i): v for i, v in enumerate(kv)},
                **{aggregate_name(j): v for j, v in enumerate(av)},
            }
            for kv, av in groups
        )
        out = with_bindings(out, b.letting, params)
        if b.having is not None:
            having = compile_expr(b.having)
            out = filter_rows(out, lambda r: having(r, None, params))
        return iter(out)


class _LocalSides:
    """The inner keyspaces of a statement's joins, in memory. An index probe reads a
    table of the keyspace on the probed key, made once per statement and join: what an
    index on that key holds (a document whose key is MISSING or NULL has no entry)."""

    def __init__(self, engine: LocalEngine, plans: list[JoinPlan]) -> None:
        self.engine = engine
        self.plans = plans
        self.tables: dict[int, dict[bytes, list[tuple[str, Any]]]] = {}

    def fetch(self, k: int, keyspace: str, ids: list[str]) -> dict[str, tuple[Any, Any]]:
        docs = self.engine.keyspace(keyspace)
        return {i: (docs[i], {"id": i}) for i in ids if i in docs}

    def scan(self, k: int) -> list[tuple[str, Any]]:
        return list(self.engine.keyspace(self.plans[k].join.keyspace).items())

    def held(self, rows: Iterable[dict[str, Any]]) -> Iterable[dict[str, Any]]:
        return rows  # no memory account here

    def probe(self, k: int, values: list[Any]) -> list[tuple[str, Any]]:
        table = self.tables.get(k)
        if table is None:
            plan = self.plans[k]
            j = plan.join
            key = compile_expression(plan.inner_keys[0])
            table = {}
            for docid, doc in self.scan(k):
                kb = key_bytes([key({j.alias: doc, j.meta_name: {"id": docid}}, None, None)])
                if kb is not None:
                    table.setdefault(kb, []).append((docid, doc))
            self.tables[k] = table
        out: list[tuple[str, Any]] = []
        for v in values:
            kb = key_bytes([v])
            out += table.get(kb, []) if kb is not None else []
        return out
