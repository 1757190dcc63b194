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

import dataclasses
import functools
import math
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shardex.core.expr import (
    MISSING,
    Expr,
    Literal,
    Param,
    compile_expression,
    evaluate,
    truth,
    walk,
)
from shardex.core.expr.functions_date import mentions_statement_time, with_statement_time
from shardex.errors import ErrorCode, ShardexError
from shardex.sql.ddl import BuildIndexStmt, CreateIndexStmt, DropIndexStmt
from shardex.sql.join_steps import joined_rows
from shardex.sql.operators import (
    AggSpec,
    ProjectTerm,
    SortSpec,
    UnnestSpec,
    aggregate,
    distinct,
    encode_sort_key,
    filter_rows,
    offset_limit,
    project,
    sort_pairs,
    strip_keys,
    unnest,
)
from shardex.sql.operators.join import key_bytes
from shardex.sql.operators.merge import DELETED, MergeRules, SourceRow
from shardex.sql.operators.mutate import apply_edits, compile_edits
from shardex.sql.operators.setops import combine
from shardex.sql.operators.window import window, window_specs
from shardex.sql.planner.joins import JoinPlan, plan_join
from shardex.sql.prepared import PreparedStatements
from shardex.sql.syntax import (
    DeleteStmt,
    ExplainStmt,
    InsertStmt,
    KeyspaceRef,
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
    resolve,
)
from shardex.sql.syntax.ctes import BoundWith, bind_with, values_in
from shardex.sql.syntax.explain import explain_query, explain_select, explain_with
from shardex.sql.syntax.merge import MergeStmt
from shardex.sql.syntax.params import check_params
from shardex.sql.syntax.setops import (
    RESULT_NAME,
    BoundQuery,
    BoundSetOp,
    bind_query,
    result_scope,
)
from shardex.sql.syntax.subquery import running_subqueries

Params = Sequence[Any] | Mapping[str, Any] | None


@dataclass
class QueryResult:
    rows: list[Any] = field(default_factory=list)
    mutation_count: int = 0


def _compile(expr: Expr) -> Any:
    return compile_expression(expr)


def eval_count(expr: Expr | None, params: Params, what: str) -> int | None:
    """LIMIT / OFFSET: a constant number (parameters allowed); negative counts are 0."""
    if expr is None:
        return None
    v = evaluate(expr, {}, params=params)
    if isinstance(v, bool) or not isinstance(v, int | float) or v != v:
        raise ShardexError(
            f"{what} must be a number, got {v!r}",
            code=ErrorCode.BAD_REQUEST,
            details={"clause": what, "value": repr(v), "hint": f"write {what} 10"},
        )
    if isinstance(v, float) and not v.is_integer():
        hint = f"write {what} {int(v)}" if math.isfinite(v) else f"write {what} 10"
        raise ShardexError(
            f"{what} must be an integer, got {v!r}",
            code=ErrorCode.BAD_REQUEST,
            details={"clause": what, "value": repr(v), "hint": hint},
        )
    # Past 2**63 - 1 no result is that long: the same as that many (and it fits every
    # slice and wire message a count goes through).
    return min(max(int(v), 0), sys.maxsize)


class LocalEngine:
    def __init__(self) -> None:
        self.keyspaces: dict[str, dict[str, Any]] = {}
        self.indexes: dict[str, dict[str, CreateIndexStmt]] = {}
        self.prepared = PreparedStatements()

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
        if isinstance(stmt, ExplainStmt) and isinstance(stmt.statement, WithStmt):
            w = bind_with(stmt.statement)
            for one in w.selects():
                self._check_from(one)
            return QueryResult([explain_with(w)])
        if isinstance(stmt, ExplainStmt):
            query = bind_query(stmt.statement)
            selects = query.selects() if isinstance(query, BoundSetOp) else [query]
            for one in selects:
                self._check_from(one)
            if isinstance(query, BoundSelect):
                joins = [p.explain() for p in self.join_plans(query)] if query.joins else None
                return QueryResult([explain_select(query, joins)])
            return QueryResult([explain_query(query)])
        if isinstance(stmt, InsertStmt):
            if stmt.select is not None:
                return self._insert_select(stmt, params)
            return self._insert(stmt, params)
        if isinstance(stmt, DeleteStmt | UpdateStmt):
            return self._modify(stmt, params)
        if isinstance(stmt, MergeStmt):
            return self._merge(stmt, params)
        return self._ddl(stmt)

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

    # -- DML ----------------------------------------------------------------------------------

    def _insert_select(self, stmt: InsertStmt, params: Params) -> QueryResult:
        """INSERT/UPSERT ... SELECT: the query's rows, then a key and value of each."""
        assert stmt.select is not None
        if isinstance(stmt.select, WithStmt):
            w = bind_with(stmt.select)
            used, run = w.params(), lambda: self.run_query(w.body, self.with_values(w, params))
        else:
            q = bind_query(stmt.select)
            used, run = q.params(), lambda: self.run_query(q, params)
        check_params(used | _params_of([e for e in (stmt.key, stmt.value) if e]), params)
        return self._insert(inserted_values(stmt, list(run()), params), params, checked=True)

    def _insert(self, stmt: InsertStmt, params: Params, *, checked: bool = False) -> QueryResult:
        if not checked:
            check_params(_params_of([e for kv in stmt.values for e in kv]), params)
        docs = self.keyspace(stmt.keyspace)
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
        rows = self._returning(stmt.returning, stmt.keyspace, new.items(), params)
        return QueryResult(rows, len(new))

    def _modify(self, stmt: DeleteStmt | UpdateStmt, params: Params) -> QueryResult:
        target = stmt.target
        exprs = [e for e in (target.use_keys, stmt.where, stmt.limit) if e is not None]
        if isinstance(stmt, UpdateStmt):
            exprs += [e for pair in stmt.set for e in pair] + list(stmt.unset)
        check_params(_params_of(exprs), params)
        docs = self.keyspace(target.name)
        alias = target.as_name
        bound = bind_select(SelectStmt(terms=(), from_=target, where=stmt.where))
        where = None if bound.where is None else _compile(bound.where)
        limit = eval_count(stmt.limit, params, "LIMIT")
        chosen: list[tuple[str, Any]] = []
        for docid, doc in self.docs(docs, target.use_keys, params):
            if limit is not None and len(chosen) >= limit:
                break
            scope = {alias: doc, META_KEY: {"id": docid}}
            if where is None or truth(where(scope, None, params)):
                chosen.append((docid, doc))
        if isinstance(stmt, DeleteStmt):
            for docid, _ in chosen:
                del docs[docid]
            rows = self._returning(stmt.returning, alias, chosen, params)
            return QueryResult(rows, len(chosen))
        # UPDATE: compute every new document first, then apply them all.
        edits = compile_edits(stmt.set, stmt.unset, alias, lambda e: bind_expr(e, alias))
        updated: list[tuple[str, Any]] = []
        for docid, doc in chosen:
            scope = {alias: doc, META_KEY: {"id": docid}}
            updated.append((docid, apply_edits(edits, doc, scope, params)))
        docs.update(updated)
        rows = self._returning(stmt.returning, alias, updated, params)
        return QueryResult(rows, len(updated))

    def _merge(self, stmt: MergeStmt, params: Params) -> QueryResult:
        """MERGE (``operators/merge.py``): every outcome decided before anything changes."""
        rules = MergeRules(stmt, params)
        check_params(_params_of(rules.exprs()), params)
        target = self.keyspace(stmt.keyspace)
        rows = self._merge_source(stmt, params)
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
        rows_out = self._returning(stmt.returning, stmt.alias, merged, params)
        return QueryResult(rows_out, len(merged))

    def _merge_source(self, stmt: MergeStmt, params: Params) -> list[SourceRow]:
        src = stmt.source
        if isinstance(src, KeyspaceRef):
            docs = self.docs(self.keyspace(src.name), src.use_keys, params)
            return [(doc, {"id": docid}) for docid, doc in docs]
        if isinstance(src, SelectStmt):
            bound = bind_select(src)
            check_params(bound.params(), params)
            return [(v, {}) for v in self.run_select(bound, params)]
        value = evaluate(src, {}, params=params)
        items = value if isinstance(value, list) else [] if value is MISSING else [value]
        return [(v, {}) for v in items]

    def _returning(
        self, terms: Any, alias: str, docs: Iterable[tuple[str, Any]], params: Params
    ) -> list[Any]:
        if not terms:
            return []
        ref = KeyspaceRef("", alias, source=Literal(None))
        bound = bind_select(SelectStmt(terms=tuple(terms), from_=ref))
        scopes = ({alias: doc, META_KEY: {"id": docid}} for docid, doc in docs)
        return list(_finish(bound, scopes, params, None, 0))

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
            return joined_rows(b, rows, plans, sides, params, unnest_specs(b, params))
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
        rows = _with_bindings(rows, b.lets, params)
        if b.where is not None:
            where = _compile(b.where)
            rows = filter_rows(rows, lambda r: where(r, None, params))
        if b.grouped:
            rows = self._group(b, rows, params, outer or {})
        if b.windows:
            rows = window(rows, window_specs(b, params))
        limit = eval_count(b.limit, params, "LIMIT")
        offset = eval_count(b.offset, params, "OFFSET") or 0
        if limit == 0:
            return iter(())
        return _finish(b, rows, params, limit, offset)

    def with_values(self, w: BoundWith, params: Params) -> dict[str, Any]:
        """``params`` with the value of every WITH term, each evaluated once, in order."""
        values: dict[str, Any] = {}
        for t in w.terms:
            seen = values_in(params, values)
            if t.query is not None:
                values[t.param] = list(self.run_query(t.query, seen))
            else:
                assert t.expr is not None
                values[t.param] = evaluate(t.expr, {}, params=seen)
        return values_in(params, values)

    def run_query(
        self, q: BoundQuery, params: Params, outer: dict[str, Any] | None = None
    ) -> Iterator[Any]:
        """The result values of a SELECT or a set operation (a subquery's: over ``outer``)."""
        if isinstance(q, BoundSelect):
            return self.run_select(q, params, outer)
        return set_op_rows(q, params, lambda b: self.run_query(b, params, outer))

    def _group(
        self, b: BoundSelect, rows: Iterable[Any], params: Params, outer: dict[str, Any]
    ) -> Iterator[Any]:
        keys = [_row_fn(k, params) for k in b.group_keys]
        aggs = [
            AggSpec(a.name, None if a.arg is None else _row_fn(a.arg, params), a.distinct)
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
        out = _with_bindings(out, b.letting, params)
        if b.having is not None:
            having = _compile(b.having)
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

    def fetch(self, k: int, keyspace: str, ids: list[str]) -> dict[str, Any]:
        docs = self.engine.keyspace(keyspace)
        return {i: docs[i] for i in ids if i in docs}

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


def inserted_values(stmt: InsertStmt, rows: Iterable[Any], params: Params) -> InsertStmt:
    """INSERT/UPSERT ... SELECT as the VALUES statement it amounts to: each row's key and
    value (a bare name in KEY / VALUE is a field of the row, SELF the row; without VALUE the
    value is the row), evaluated now, so the writes are checked like any VALUES'."""
    key = _row_fn(resolve(stmt.key, RESULT_NAME, frozenset()), params) if stmt.key else None
    value = None if stmt.value is None else resolve(stmt.value, RESULT_NAME, frozenset())
    value_fn = None if value is None else _row_fn(value, params)
    pairs = []
    for row in rows:
        scope = result_scope(row)
        k = key(scope) if key is not None else MISSING
        v = row if value_fn is None else value_fn(scope)
        pairs.append((Literal(k), Literal(v)))
    return dataclasses.replace(stmt, values=tuple(pairs), select=None)


def set_op_rows(
    q: BoundSetOp, params: Params, run_branch: Callable[[BoundQuery], Iterable[Any]]
) -> Iterator[Any]:
    """``q``'s result values in memory, each branch's from ``run_branch`` (the reference, and
    a set operation in a subquery expression wherever that runs)."""
    limit = eval_count(q.limit, params, "LIMIT")
    offset = eval_count(q.offset, params, "OFFSET") or 0
    if limit == 0:
        return iter(())
    values = combine(q.ops, [functools.partial(run_branch, b) for b in q.branches])
    key = set_op_sort_key(q, params)
    if key is not None:
        top = None if limit is None else offset + limit
        values = strip_keys(sort_pairs(((key(v), v) for v in values), top))
    return offset_limit(values, offset, limit)


def set_op_sort_key(q: BoundSetOp, params: Params) -> Callable[[Any], bytes] | None:
    """The sort key of a result value under a set operation's ORDER BY (None: unordered)."""
    if not q.order:
        return None
    specs = [SortSpec(o.desc, o.nulls_first) for _, o in q.order]
    fns = [_compile(e) for e, _ in q.order]

    def key(value: Any) -> bytes:
        row = result_scope(value)
        return encode_sort_key([f(row, None, params) for f in fns], specs)

    return key


def bind_expr(expr: Expr, alias: str) -> Expr:
    return resolve(expr, alias, frozenset({alias, META_KEY}))


def unnest_specs(b: BoundSelect, params: Params) -> list[UnnestSpec]:
    """The UNNEST steps of ``b`` as operator specs (shared with the fragments)."""
    return [UnnestSpec(alias, _row_fn(e, params), outer) for alias, e, outer in b.unnests]


def _params_of(exprs: Iterable[Expr]) -> set[str]:
    return {n.name for e in exprs for n in walk(e) if isinstance(n, Param)}


def _row_fn(expr: Expr, params: Params) -> Any:
    f = _compile(expr)
    return lambda row: f(row, None, params)


def _with_bindings(
    rows: Iterable[dict[str, Any]], bindings: tuple[tuple[str, Expr], ...], params: Params
) -> Iterable[dict[str, Any]]:
    if not bindings:
        return rows
    fns = [(name, _compile(e)) for name, e in bindings]

    def gen() -> Iterator[dict[str, Any]]:
        for row in rows:
            row = dict(row)
            for name, f in fns:
                row[name] = f(row, None, params)
            yield row

    return gen()


def _finish(
    b: BoundSelect, rows: Iterable[Any], params: Params, limit: int | None, offset: int
) -> Iterator[Any]:
    """Projection, DISTINCT, ORDER BY, OFFSET and LIMIT."""
    terms = [ProjectTerm(_row_fn(t.expr, params), t.name, t.star) for t in b.terms]
    raw = terms[0].value if b.raw else None
    if not b.order:
        out: Iterable[Any] = project(rows, terms, raw=raw)
        if b.distinct:
            out = distinct(out)
        return offset_limit(out, offset, limit)
    specs = [SortSpec(o.desc, o.nulls_first) for _, o in b.order]
    order_fns = [_compile(e) for e, _ in b.order]
    aliases = b.order_aliases

    def sort_key(row: dict[str, Any], value: Any) -> bytes:
        if aliases:
            row = {**row, **{a: value.get(a, MISSING) for a in aliases}}
        return encode_sort_key([f(row, None, params) for f in order_fns], specs)

    pairs: Iterable[Any] = project(rows, terms, raw=raw, sort_key=sort_key)
    if b.distinct:
        pairs = distinct(pairs, value_of=lambda p: p[1])
    top = None if limit is None else offset + limit
    return offset_limit(strip_keys(sort_pairs(pairs, top)), offset, limit)
