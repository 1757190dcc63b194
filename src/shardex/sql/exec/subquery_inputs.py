"""Subqueries over whole keyspaces, and with joins, in the distributed plan (decision 0139).

A subquery over a keyspace without USE KEYS, or with a JOIN / NEST, reads documents no
fragment can name by key. The initiator reads them first, each as a query of its own
(planned and run as any SELECT: index, spans, leaves, the statement's scan consistency,
failover), and the values travel in the statement's parameters, as WITH values do
(decision 0124), to every fragment on every member:

* an **uncorrelated** subquery (it reads no enclosing name, and its text stands on its own:
  ``BoundSubquery.valued_once``) is run once, its text as the query; its value goes under
  ``subquery.subquery_param(text)``, where evaluating it reads it back;
* a **correlated** one keeps running where its row is evaluated, with N1QL's semantics
  (``LocalEngine``'s operators), over the documents its keyspaces hold: each keyspace it
  reads at its own level (a FROM without USE KEYS, every joined keyspace) is gathered once
  by its *side statement* ``SELECT RAW [META(x).id, x] FROM ks AS x WHERE <x's own
  conjuncts>`` (``join_plan.side_statement``: the conjuncts that read ``x`` alone, which
  only narrow what is read), under ``gather_param(text)``. Subqueries nested in it are
  inputs of their own, by the same rule.

A WITH expression term's subqueries are read the same way before it is evaluated
(``compound._Run.read_inputs``). A fragment that finds an input missing (a path that did
not read the inputs first) fails with a clear BAD_REQUEST rather than reading nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from shardex.core.expr import Expr, Param, walk
from shardex.errors import ErrorCode, ShardexError
from shardex.sql.exec.join_plan import side_statement
from shardex.sql.planner.joins import reads_only
from shardex.sql.planner.sargable import conjuncts
from shardex.sql.syntax.ast import META_KEY
from shardex.sql.syntax.bind import BoundSelect, subqueries_of
from shardex.sql.syntax.bound_with import BoundWith
from shardex.sql.syntax.setops import BoundQuery, BoundSetOp
from shardex.sql.syntax.subquery import BoundSubquery, subquery_param

__all__ = [
    "Input",
    "gather_param",
    "gathered",
    "inputs_in",
    "inputs_of",
    "missing_input",
    "selects_of",
    "side_statements",
    "without_hints",
]

_GATHER_PREFIX = "\x00gather."


def gather_param(text: str) -> str:
    """The parameter a side statement's ``[id, document]`` pairs travel under."""
    return _GATHER_PREFIX + text


@dataclass(frozen=True)
class Input:
    """A query the initiator runs before the statement: ``text``'s values go under
    ``param``. ``gathers``: a side statement (its parameters named, ``side_params``),
    else an uncorrelated subquery's own text (read behind the statement's WITH clause)."""

    param: str
    text: str
    gathers: bool


def inputs_of(b: BoundSelect) -> list[Input]:
    """What ``b``'s subqueries need read first, once per bound statement (the statement
    cache hands the same object to every execution)."""
    cached: list[Input] | None = b.__dict__.get("_subquery_inputs")
    if cached is None:
        found: dict[str, Input] = {}
        _collect(subqueries_of(b), found)
        cached = list(found.values())
        object.__setattr__(b, "_subquery_inputs", cached)  # a cache, not state
    return cached


def inputs_in(exprs: list[Expr]) -> list[Input]:
    """What the subqueries of ``exprs`` (a WITH expression term's) need read first."""
    found: dict[str, Input] = {}
    _collect([n for e in exprs for n in walk(e) if isinstance(n, BoundSubquery)], found)
    return list(found.values())


def _collect(subs: list[BoundSubquery], found: dict[str, Input]) -> None:
    for sub in subs:
        if not sub.scans:
            continue  # reads nothing, or only USE KEYS documents (fetched where it runs)
        if sub.valued_once:
            param = subquery_param(sub.text)
            found.setdefault(param, Input(param, sub.text, gathers=False))
            continue
        for select in selects_of(sub.bound):
            for _, text in side_statements(select):
                param = gather_param(text)
                found.setdefault(param, Input(param, text, gathers=True))
            _collect(subqueries_of(select), found)
        if isinstance(sub.bound, BoundWith):
            exprs = [t.expr for t in sub.bound.terms if t.expr is not None]
            _collect([n for e in exprs for n in walk(e) if isinstance(n, BoundSubquery)], found)


def selects_of(q: BoundQuery | BoundWith) -> Iterator[BoundSelect]:
    """The SELECTs of a query: itself, a set operation's branches, a WITH's terms and its
    query."""
    if isinstance(q, BoundWith):
        for t in q.terms:
            if t.query is not None:
                yield from selects_of(t.query)
        yield from selects_of(q.body)
    elif isinstance(q, BoundSetOp):
        for branch in q.branches:
            yield from selects_of(branch)
    else:
        yield q


def side_statements(b: BoundSelect) -> list[tuple[str, str]]:
    """``(keyspace, side statement)`` for each keyspace ``b`` reads at its own level without
    keys: its FROM without USE KEYS, and every joined keyspace. A keyspace read twice is
    read whole (the reference engine has one set of documents per keyspace). Once per
    bound statement: a fragment asks at every evaluation."""
    cached: list[tuple[str, str]] | None = b.__dict__.get("_side_statements")
    if cached is None:
        cached = _side_statements(b)
        object.__setattr__(b, "_side_statements", cached)
    return cached


def _side_statements(b: BoundSelect) -> list[tuple[str, str]]:
    reads: list[tuple[str, str, str, list[Expr], tuple[str, ...]]] = []
    ref = b.from_
    right = any(j.kind == "right" for j in b.joins)
    if ref is not None and ref.source is None and ref.use_keys is None:
        assert b.alias is not None
        # A RIGHT JOIN may keep rows without the FROM alias: WHERE cannot narrow it then.
        where = [] if right else conjuncts(b.where)
        reads.append((ref.name, b.alias, META_KEY, where, ref.use_index))
    for j in b.joins:
        # ON only decides whether a document matches (INNER, LEFT, NEST): a document it
        # refuses matches nothing. A RIGHT JOIN keeps every inner document.
        on = [] if j.kind == "right" else conjuncts(j.on)
        reads.append((j.keyspace, j.alias, j.meta_name, on, ()))
    twice = Counter(r[0] for r in reads)
    out = []
    for keyspace, alias, meta_name, terms, use_index in reads:
        if twice[keyspace] > 1:
            out.append((keyspace, side_statement(keyspace, alias, meta_name, [])))
            continue
        names = frozenset({alias, meta_name})
        pushed = [c for c in terms if reads_only(c, names) and _as_text(c)]
        text = side_statement(keyspace, alias, meta_name, pushed, use_index=use_index)
        out.append((keyspace, text))
    return out


def _as_text(expr: Expr) -> bool:
    """Whether ``expr`` reads back from its text alone: no internal parameter (a WITH
    value's, a subquery's) whose name no statement text can spell."""
    return not any(isinstance(n, Param) and n.name.startswith("\x00") for n in walk(expr))


def gathered(b: BoundSelect, params: Any) -> dict[str, dict[str, Any]]:
    """The documents of each keyspace ``b`` reads without keys, from ``params`` (the
    initiator's side statements' pairs); a missing one is a clear error."""
    out: dict[str, dict[str, Any]] = {}
    for keyspace, text in side_statements(b):
        pairs = params.get(gather_param(text)) if isinstance(params, dict) else None
        if pairs is None:
            raise missing_input(keyspace, text)
        docs = _by_id(pairs)
        out[keyspace] = {**out[keyspace], **docs} if keyspace in out else docs
    return out


# The pairs a fragment's parameters hold are one list object for all its evaluations: each
# is made a dict once. Keyed by identity with the list kept alive; cleared when full.
_BY_ID_MAX = 64
_by_id_memo: dict[int, tuple[list[Any], dict[str, Any]]] = {}


def _by_id(pairs: list[Any]) -> dict[str, Any]:
    hit = _by_id_memo.get(id(pairs))
    if hit is not None and hit[0] is pairs:
        return hit[1]
    docs = {docid: doc for docid, doc in pairs}
    if len(_by_id_memo) >= _BY_ID_MAX:
        _by_id_memo.clear()
    _by_id_memo[id(pairs)] = (pairs, docs)
    return docs


def missing_input(keyspace: str, text: str) -> ShardexError:
    return ShardexError(
        f"a subquery reading the keyspace {keyspace!r} without USE KEYS cannot run here: "
        "its documents were not read before the statement",
        code=ErrorCode.BAD_REQUEST,
        details={
            "keyspace": keyspace,
            "subquery": text,
            "hint": "run it in a statement sent to a node (its inputs are read there "
            "first), or pass its result as a parameter",
        },
    )


def without_hints(b: BoundSelect) -> BoundSelect:
    """``b`` without USE INDEX hints, for the reference engine over gathered documents
    (which has no index to name: methods differ in cost, never in rows)."""
    cached: BoundSelect | None = b.__dict__.get("_without_hints")
    if cached is not None:
        return cached
    out = b
    if b.from_ is not None and b.from_.use_index:
        out = replace(out, from_=replace(b.from_, use_index=()))
    if any(j.use_index for j in b.joins):
        out = replace(out, joins=tuple(replace(j, use_index=()) for j in b.joins))
    object.__setattr__(b, "_without_hints", out)
    return out
