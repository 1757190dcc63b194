"""EXPLAIN for the local engine: the operator pipeline a bound SELECT runs as, with each
operator's expressions as canonical text. The distributed planner's EXPLAIN (index choice,
spans, fragments, exchanges) extends this shape."""

from __future__ import annotations

from typing import Any

from .bind import BoundSelect, subqueries_of
from .ctes import BoundWith
from .setops import BoundQuery


def _text(e: Any) -> str:
    return e.to_text().replace("\x00", "#")


def _join_op(j: Any, planned: dict[str, Any] | None) -> dict[str, Any]:
    if planned is not None:
        return {k: _text_value(v) for k, v in planned.items()}
    op: dict[str, Any] = {"operator": j.word, "keyspace": j.keyspace, "as": j.alias}
    op["form"] = j.form
    for name in ("on_keys", "on"):
        e = getattr(j, name)
        if e is not None:
            op[name] = _text(e)
    return op


def _text_value(v: Any) -> Any:
    if isinstance(v, str):
        return v.replace("\x00", "#")
    if isinstance(v, list):
        return [_text_value(x) for x in v]
    return v


def explain_select(b: BoundSelect, joins: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """``joins``: each JOIN / NEST term's plan (its method), as the runner planned it."""
    ops: list[dict[str, Any]] = []
    ref = b.from_
    if ref is None:
        ops.append({"operator": "DummyScan"})
    elif ref.source is not None:
        ops.append({"operator": "ExpressionScan", "expr": _text(ref.source), "as": b.alias})
    else:
        scan: dict[str, Any] = {"operator": "KeyspaceScan", "keyspace": ref.name, "as": b.alias}
        if ref.use_index:
            scan["use_index"] = list(ref.use_index)
        if ref.use_keys is not None:
            scan["use_keys"] = _text(ref.use_keys)
        ops.append(scan)
    for i in range(len(b.unnests) + 1):
        for k, j in enumerate(b.joins):
            if j.position == i:
                ops.append(_join_op(j, None if joins is None else joins[k]))
        if i < len(b.unnests):
            alias, e, outer = b.unnests[i]
            ops.append({"operator": "Unnest", "expr": _text(e), "as": alias, "outer": outer})
    if b.lets:
        ops.append({"operator": "Let", "bindings": {n: _text(e) for n, e in b.lets}})
    if b.where is not None:
        ops.append({"operator": "Filter", "condition": _text(b.where)})
    if b.grouped:
        ops.append(
            {
                "operator": "Aggregate",
                "phases": ["PARTIAL", "FINAL"],
                "group_keys": [_text(k) for k in b.group_keys],
                "aggregates": [_text(a) for a in b.aggregates],
            }
        )
        if b.letting:
            ops.append({"operator": "Letting", "bindings": {n: _text(e) for n, e in b.letting}})
        if b.having is not None:
            ops.append({"operator": "Filter", "condition": _text(b.having)})
    if b.windows:  # after grouping, before the projection
        ops.append({"operator": "Window", "functions": [_text(w.call) for w in b.windows]})
    proj: dict[str, Any] = {"operator": "Project", "raw": b.raw}
    proj["terms"] = [
        {"name": t.name, "expr": _text(t.expr), **({"star": True} if t.star else {})}
        for t in b.terms
    ]
    ops.append(proj)
    if b.distinct:
        ops.append({"operator": "Distinct"})
    if b.order:
        ops.append(
            {
                "operator": "Order" if b.limit is None else "TopN",
                "terms": [
                    {"expr": _text(e), "desc": o.desc, "nulls_first": o.effective_nulls_first}
                    for e, o in b.order
                ],
            }
        )
    if b.offset is not None:
        ops.append({"operator": "Offset", "expr": _text(b.offset)})
    if b.limit is not None:
        ops.append({"operator": "Limit", "expr": _text(b.limit)})
    out: dict[str, Any] = {"plan": ops, "statement": "SELECT"}
    subs = subqueries_of(b)
    if subs:
        # Each subquery expression's own plan; correlated ones run once per outer row.
        out["subqueries"] = [
            {
                "subquery": s.text,
                "correlated": sorted(s.refs),
                "keyspaces": sorted(s.keyspaces),
                **explain_query(s.bound),
            }
            for s in subs
        ]
    return out


def explain_query(q: BoundQuery | BoundWith) -> dict[str, Any]:
    """EXPLAIN of a SELECT or a set operation (its branches' plans, then what combines
    them: the operators left to right, ORDER BY, OFFSET and LIMIT over the whole), or of a
    subquery's WITH."""
    if isinstance(q, BoundSelect):
        return explain_select(q)
    if isinstance(q, BoundWith):
        return explain_with(q)
    ops: list[dict[str, Any]] = [
        # N1QL's operator names: Union, UnionAll, Intersect, IntersectAll, Except, ExceptAll.
        {"operator": op.title() + ("All" if all_ else ""), "branch": i + 1}
        for i, (op, all_) in enumerate(q.ops)
    ]
    if q.order:
        ops.append(
            {
                "operator": "Order" if q.limit is None else "TopN",
                "terms": [
                    {"expr": _text(e), "desc": o.desc, "nulls_first": o.effective_nulls_first}
                    for e, o in q.order
                ],
            }
        )
    if q.offset is not None:
        ops.append({"operator": "Offset", "expr": _text(q.offset)})
    if q.limit is not None:
        ops.append({"operator": "Limit", "expr": _text(q.limit)})
    return {
        "statement": "SELECT",
        "branches": [explain_query(b) for b in q.branches],
        "plan": ops,
    }


def explain_with(w: BoundWith) -> dict[str, Any]:
    """EXPLAIN of a WITH statement: its query's plan and each term's (evaluated once, first)."""
    out = explain_query(w.body)
    out["with"] = [
        {
            "name": t.name,
            **(explain_query(t.query) if t.query is not None else {"expr": _text(t.expr)}),
        }
        for t in w.terms
    ]
    return out
