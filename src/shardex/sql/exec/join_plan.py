"""Distributed planning of a SELECT with JOIN / NEST terms (decision 0123): the join runs
at the initiator, over inputs that are ordinary distributed SELECTs of one keyspace each.

* The FROM term's documents come from its *side statement*, ``SELECT RAW [META(a).id, a]
  FROM ks AS a [USE INDEX / USE KEYS] WHERE <the conjuncts about a alone>``: planned and
  run like any SELECT (index choice, spans, leaves on the indexer nodes, stability,
  failover), its rows streamed to the initiator as they come.
* A lookup join (ON KEYS) fetches the documents each batch of rows names (one GetMany per
  owner node per batch, ``DocumentAccess``).
* An index nested loop (``index_nl``) runs, per batch of rows, the inner side's *probe
  statement* ``... WHERE <its own conjuncts> AND key IN $keys`` with the batch's join key
  values as the parameter: the planner turns the IN into spans of the inner index.
* A hash or nested-loop join (and a RIGHT JOIN's streamed side) gathers the inner side's
  statement's rows at the initiator and builds its table there.

Conjuncts go to a side statement only where that cannot change the result: WHERE's about
the FROM alias (unless a RIGHT JOIN may leave it MISSING: then the RIGHT JOIN's ON
conjuncts about it); an inner alias's ON conjuncts (not a RIGHT JOIN's, whose inner side is
kept whole) and, for an INNER JOIN, WHERE's about it. The whole ON and WHERE are evaluated
again on the joined rows, so a pushed conjunct only narrows what is read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shardex.core.expr import (
    And,
    Expr,
    Field,
    Identifier,
    Literal,
    Meta,
    ObjectConstruct,
    format_identifier,
)
from shardex.meta.index_state import ACTIVE
from shardex.meta.state import StateContext
from shardex.sql.exec.analyze import FETCHED_META, alias_paths, reads_meta_field
from shardex.sql.exec.doc_paths import Trie, trie_of
from shardex.sql.planner.joins import JoinPlan, plan_join, reads_only, shown
from shardex.sql.planner.sargable import conjuncts
from shardex.sql.syntax.ast import META_KEY
from shardex.sql.syntax.bind import BoundSelect, map_children
from shardex.sql.syntax.explain import explain_select

__all__ = [
    "JoinSides",
    "exchange_join",
    "join_sides",
    "probe_params",
    "side_meta",
    "side_params",
]

# The parameter a probe statement reads its batch of join key values from.
PROBE_PARAM = "shardex_join_keys"
HASH = "hash"  # a join between fragments over hash exchanges (``join_exchange``)


@dataclass
class JoinSides:
    """What the initiator runs for a join statement: the side statements' texts (their
    plans for EXPLAIN) and each join's method."""

    plans: list[JoinPlan]
    from_sql: str | None  # None: FROM is an expression, evaluated at the initiator
    gathered: dict[int, str] = field(default_factory=dict)  # join -> its side statement
    probes: dict[int, str] = field(default_factory=dict)  # join -> its probe statement
    explained: dict[str, Any] = field(default_factory=dict)  # side name -> its plan
    exchange: str | None = None  # "hash": may join between fragments (``exchange_join``)
    ran: str | None = None  # once started: "hash" when it joined between fragments
    # joins whose statement reads META(alias).cas / .expiration: their documents' owners
    # give them (a lookup join's fetch asks for them, side statements carry them)
    fetched_meta: set[int] = field(default_factory=set)

    def reads(self, k: int) -> str:
        """How join ``k`` reads its inner keyspace (EXPLAIN)."""
        method = self.plans[k].method
        if method == "keys":
            return "GetMany per owner node, per batch of rows"
        if method == "index_nl":
            return f"probe statement per batch of rows (IN ${PROBE_PARAM})"
        return "side statement gathered at the initiator"


def exchange_join(plans: list[JoinPlan], from_sql: str | None) -> str | None:
    """``hash`` when the statement's join may run between fragments over hash exchanges
    (decision 0135, ``join_exchange``): one ANSI INNER, LEFT or RIGHT JOIN by hash (an
    equi-join key), before any UNNEST, over a FROM keyspace; else None, the initiator joins
    (decision 0123). Its
    sides must also read through index leaves, which their plans say when they run."""
    if from_sql is None or len(plans) != 1:
        return None
    p = plans[0]
    j = p.join
    if p.method != "hash" or j.form != "ansi" or j.nest:
        return None
    if j.position != 0:  # after an UNNEST its key may read the element: not a leaf's
        return None
    return HASH


def _text(expr: Expr, metas: Mapping[str, str]) -> str:
    """A bound expression as SQL++ text a side statement binds back to the same tree: the
    scope row's META() names become ``META(alias)``."""

    def f(node: Expr) -> Expr:
        if isinstance(node, Identifier) and node.name in metas:
            return Meta(metas[node.name])
        return map_children(node, f)

    return f(expr).to_text()


def _conjunction(terms: list[Expr]) -> Expr | None:
    if not terms:
        return None
    return terms[0] if len(terms) == 1 else And(tuple(terms))


def _pushed(expr: Expr | None, names: frozenset[str]) -> list[Expr]:
    return [c for c in conjuncts(expr) if reads_only(c, names)]


def side_statement(
    keyspace: str,
    alias: str,
    meta_name: str,
    where: list[Expr],
    *,
    use_index: tuple[str, ...] = (),
    use_keys: str | None = None,
    extra: str | None = None,
    meta: bool = False,
    value: str | None = None,
) -> str:
    """``meta``: the rows also carry ``META(alias).cas`` and ``.expiration`` (``side_meta``
    reads them), which the side's leaves then fetch from the documents' owners. ``value``:
    what a row carries of the document (``cut_document``), else all of it."""
    a = format_identifier(alias)
    fetched = f", META({a}).cas, META({a}).expiration" if meta else ""
    doc = a if value is None else value
    sql = f"SELECT RAW [META({a}).id, {doc}{fetched}] FROM {format_identifier(keyspace)} AS {a}"
    if use_index:
        sql += f" USE INDEX ({', '.join(format_identifier(n) for n in use_index)})"
    if use_keys is not None:
        sql += f" USE KEYS {use_keys}"
    terms = [_text(c, {meta_name: alias}) for c in where]
    if extra is not None:
        terms.append(extra)
    if terms:
        sql += " WHERE " + " AND ".join(f"({t})" for t in terms)
    return sql


def cut_document(b: BoundSelect, alias: str) -> str | None:
    """The object a side statement's row carries of ``alias``'s document: the fields on
    the paths the join statement reads of it (``analyze.alias_paths``, ``doc_paths``), as
    an object constructor, whose MISSING fields are left out as the document lacks them;
    None (the whole document) when the statement reads it whole."""
    paths = alias_paths(b, alias)
    # In a fixed order: the text is the side statement's, cached and shown by EXPLAIN.
    trie = None if paths is None else trie_of(sorted(paths, key=lambda p: [str(s) for s in p]))
    if trie is None:
        return None
    return _constructed(Identifier(alias), trie).to_text()


def _constructed(base: Expr, trie: Trie) -> Expr:
    items = []
    for name, below in trie.items():
        value: Expr = Field(base, name)
        items.append((Literal(name), _constructed(value, below) if below else value))
    return ObjectConstruct(tuple(items))


def join_sides(b: BoundSelect, state: StateContext) -> JoinSides:
    """The side statements and join methods of ``b`` (which has joins) over the cluster's
    indexes in ``state``."""
    plans = [plan_join(j, _usable_indexes(state, j.keyspace, j.use_index)) for j in b.joins]
    ref = b.from_
    assert ref is not None and b.alias is not None
    right = next((j for j in b.joins if j.kind == "right"), None)
    from_sql = None
    if ref.source is None:
        names = frozenset({b.alias, META_KEY})
        where = _pushed(b.where, names) if right is None else _pushed(right.on, names)
        use_keys = None
        if ref.use_keys is not None:
            use_keys = _text(ref.use_keys, {})
        from_sql = side_statement(
            ref.name,
            b.alias,
            META_KEY,
            where,
            use_index=ref.use_index,
            use_keys=use_keys,
            meta=reads_meta_field(b, *FETCHED_META),
            value=cut_document(b, b.alias),
        )
    sides = JoinSides(plans, from_sql)
    for k, (j, p) in enumerate(zip(b.joins, plans, strict=True)):
        meta = reads_meta_field(b, *FETCHED_META, meta=j.meta_name)
        if meta:
            sides.fetched_meta.add(k)
        if p.method == "keys":
            continue
        names = frozenset({j.alias, j.meta_name})
        where = [] if j.kind == "right" else _pushed(j.on, names)
        if j.kind != "left" and not j.nest:  # INNER, and RIGHT (its inner side is kept)
            where += _pushed(b.where, names)
        if p.method == "index_nl":
            key = _text(p.inner_keys[0], {j.meta_name: j.alias})
            sides.probes[k] = side_statement(
                j.keyspace,
                j.alias,
                j.meta_name,
                where,
                use_index=(p.index,) if p.index else (),
                extra=f"{key} IN ${PROBE_PARAM}",
                meta=meta,
                value=cut_document(b, j.alias),
            )
        else:  # USE INDEX names the index to probe (N1QL): a gathered side chooses its own
            sides.gathered[k] = side_statement(
                j.keyspace, j.alias, j.meta_name, where, meta=meta, value=cut_document(b, j.alias)
            )
    sides.exchange = exchange_join(plans, from_sql)
    return sides


def _usable_indexes(
    state: StateContext, keyspace: str, use_index: tuple[str, ...]
) -> list[tuple[str, str]]:
    """(name, leading key) of the keyspace's built secondary indexes a probe can use: not
    partial (its WHERE would have to be among the probe's), the one USE INDEX names if any."""
    out = []
    for r in state.indexes.values():
        d = r.definition
        if d.keyspace != keyspace or r.state != ACTIVE or d.is_primary or not d.keys:
            continue
        if d.where is not None or (use_index and d.name not in use_index):
            continue
        out.append((d.name, d.keys[0].expr))
    return sorted(out)


def side_meta(row: list[Any]) -> dict[str, Any]:
    """The META() of a side statement's row ``[docid, document, (cas, expiration)]``: the
    fetched fields when the statement asked for them (``side_statement(meta=True)``)."""
    if len(row) > 2:
        return {"id": row[0], "cas": row[2], "expiration": row[3]}
    return {"id": row[0]}


def side_params(params: Any) -> Any:
    """The statement's parameters for its side statements, which use some of them: named
    (positional values under "1", "2", ..., which ``$1`` reads as it reads a list), since
    a list must match the statement's positional parameters exactly."""
    if params is None or isinstance(params, Mapping):
        return params
    return {str(i): v for i, v in enumerate(params, 1)}


def probe_params(params: Any, values: list[Any]) -> Any:
    """A probe statement's parameters: the side statements' and its batch of key values
    under ``PROBE_PARAM``."""
    return {**(side_params(params) or {}), PROBE_PARAM: values}


def plan_sides(plan: Any, state: StateContext, no_keyspace: Callable[[str], Exception]) -> None:
    """Fill a join statement's ``PhysicalPlan`` (``plan``): its ``join`` (``join_sides``),
    after checking that every keyspace exists."""
    b = plan.bound
    ref = b.from_
    from_keyspace = ref.name if ref is not None and ref.source is None else None
    for name in [from_keyspace, *(j.keyspace for j in b.joins)]:
        if name is not None and name not in state.keyspaces:
            raise no_keyspace(name)
    plan.join, plan.keyspace = join_sides(b, state), from_keyspace


def explain_join(plan: Any, sides: JoinSides) -> dict[str, Any]:
    """EXPLAIN of a join statement: the operators (each join with its method), then
    ``distributed``: the join at the initiator and its inputs, each side statement with
    its own distributed plan."""
    b = plan.bound
    out = explain_select(b, [p.explain() for p in sides.plans])

    probes = set(sides.probes.values())
    planned: dict[str, Any] = {}

    def side(word: str, alias: str | None, sql: str) -> dict[str, Any]:
        found: dict[str, Any] = {"side": word, "as": alias, "statement": sql}
        if plan.side_planner is not None:  # a probe's key values are known per batch only
            planned[sql] = plan.side_planner(sql, sql not in probes)
            found["plan"] = planned[sql].explain()["distributed"]
        return found

    inputs: list[dict[str, Any]] = []
    if sides.from_sql is not None:
        inputs.append(side("FROM", b.alias, sides.from_sql))
    else:
        inputs.append({"side": "FROM", "as": b.alias, "evaluated": "initiator"})
    for k, p in enumerate(sides.plans):
        j = p.join
        entry: dict[str, Any] = {"side": j.word, "as": j.alias, "method": p.method}
        entry["reads"] = sides.reads(k)
        sql = sides.gathered.get(k) or sides.probes.get(k)
        if sql is not None:
            entry.update(side(j.word, j.alias, sql))
        inputs.append(entry)
    steps = ["Nest" if p.join.nest else "Join" for p in sides.plans]
    if b.unnests:
        steps.append("Unnest")
    steps += ["Aggregate", "Project"] if b.grouped else ["Filter", "Project"]
    where: dict[str, Any] = {"on": "initiator", "does": steps}
    leaves = [p for p in planned.values() if p.source == "index" and p.leaves]
    if sides.exchange is not None and plan.tuning["join_exchange"] and len(leaves) == 2:
        p = sides.plans[0]
        where = {
            "on": "join fragments, one on each node with a leaf of either side",
            "exchange": sides.exchange,
            "partition_by": [shown(e) for e in p.outer_keys + p.inner_keys],
            "does": steps,
            "root": "merges the join fragments' rows",
        }
        for entry in inputs:
            entry["reads"] = "leaves hash-partition the side's rows to the join fragments"
    out["distributed"] = {"mode": "join", "source": "join", "join": where, "inputs": inputs}
    return out
