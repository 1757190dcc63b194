"""Name binding for SELECT: turns a parsed statement into expressions that evaluate against
explicit scope rows, and checks what only makes sense with the whole statement in view.

Scopes (plain dicts, so rows stay JSON-like and cheap to ship between fragments):
- the document scope ``{alias: document, META_KEY: {"id": docid}, let vars...}``: FROM,
  LET, WHERE, GROUP BY keys and aggregate arguments;
- the group scope ``{group_key_name(i): value, aggregate_name(j): value, letting vars...}``
  of a grouped query: LETTING, HAVING, the projection and ORDER BY;
- ORDER BY additionally sees the projection's explicit aliases (``ORDER BY total`` where the
  projection has ``... AS total``), which take precedence over document fields.

A bare identifier that is not an alias, a LET/LETTING variable or a comprehension variable is
a field of the FROM alias (``firstName`` means ``customer.firstName``). In a grouped query
every reference outside aggregates must be (part of) a GROUP BY key, else it is an error.
"""

from __future__ import annotations

from collections.abc import Iterable

from shardex.core.expr import BinaryOp, Expr, Field, Identifier, Meta, walk

from .ast import (
    META_KEY,
    RESULT_NAME,
    SELF_NAME,
    Aggregate,
    ArrayComprehension,
    Binding,
    CollectionPredicate,
    JoinTerm,
    KeyspaceRef,
    OrderTerm,
    SelectStmt,
    SetOpStmt,
    SetOpSubquery,
    Subquery,
    WithSubquery,
    outer_meta_name,
)
from .binding_base import SqlSemanticError, map_children
from .bound_select import BoundSelect as BoundSelect
from .bound_select import BoundTerm as BoundTerm
from .bound_select import aggregate_name as aggregate_name
from .bound_select import group_key_name as group_key_name
from .bound_select import order_alias_name, ordered_aliases
from .bound_select import subqueries_of as subqueries_of
from .bound_setop import BoundSetOp
from .bound_with import BoundWith, BoundWithTerm
from .cte_names import cte_param, inlining, reference, subquery_scope, visible
from .join_syntax import BoundJoin, check_qualified
from .subquery import BoundSubquery
from .update_for import ForSet
from .windows import bind_windows, extract_windows, window_name


def resolve(expr: Expr, alias: str | None, bound: frozenset[str]) -> Expr:
    """Bind identifiers (see the module doc) and META() to the document scope."""

    def f(node: Expr) -> Expr:
        return _resolve_node(node, alias, bound)

    return f(expr)


def _resolve_node(node: Expr, alias: str | None, bound: frozenset[str]) -> Expr:
    if isinstance(node, Identifier):
        if node.name == SELF_NAME and alias is not None:
            return Identifier(alias)
        if node.name in bound:
            return node
        cte = reference(node.name)  # a WITH name the query does not shadow
        if cte is not None:
            return cte
        if alias is None:
            return node
        return Field(Identifier(alias), node.name)
    if isinstance(node, Meta):
        if (
            node.keyspace is not None
            and node.keyspace != alias
            and outer_meta_name(node.keyspace) in bound
        ):
            return Identifier(outer_meta_name(node.keyspace))  # an enclosing alias's META()
        if node.keyspace is not None and node.keyspace != alias:
            raise SqlSemanticError(
                f"META({node.keyspace}) names no keyspace alias of this query",
                details={"alias": node.keyspace, "hint": f"use META({alias or ''})"},
            )
        return Identifier(META_KEY)
    if isinstance(node, Subquery):
        return bind_subquery(node, bound, alias)
    if isinstance(node, ForSet):
        inner = bound | {node.var}
        return ForSet(
            resolve(node.value, alias, inner),
            node.var,
            resolve(node.source, alias, bound),
            None if node.when is None else resolve(node.when, alias, inner),
        )
    if isinstance(node, WithSubquery):
        return bind_with_subquery(node, bound, alias)
    if isinstance(node, SetOpSubquery):
        return bind_set_op_subquery(node, bound, alias)
    if isinstance(node, CollectionPredicate | ArrayComprehension):
        # Each binding's source sees the variables bound before it; the body sees them all.
        inner = bound
        new_bindings = []
        for b in node.bindings:
            new_bindings.append(Binding(b.var, resolve(b.source, alias, inner), b.within))
            inner = inner | {b.var}
        if isinstance(node, CollectionPredicate):
            return CollectionPredicate(
                node.quantifier, tuple(new_bindings), resolve(node.satisfies, alias, inner)
            )
        when = None if node.when is None else resolve(node.when, alias, inner)
        return ArrayComprehension(
            resolve(node.mapping, alias, inner), tuple(new_bindings), when, node.first
        )
    return map_children(node, lambda c: _resolve_node(c, alias, bound))


def has_aggregate(expr: Expr) -> bool:
    return any(isinstance(n, Aggregate) for n in walk(expr))


# -- SELECT -----------------------------------------------------------------------------------


def implied_name(expr: Expr) -> str | None:
    """The result name a term gets without AS: the last field of a path, else None (SELF
    names no field: it is numbered like any other expression)."""
    if isinstance(expr, Identifier | Field) and expr.name != SELF_NAME:
        return expr.name
    return None


def bind_subquery(node: Subquery, outer: frozenset[str], alias: str | None) -> BoundSubquery:
    """``node`` bound with the enclosing query's names ``outer`` (and its FROM ``alias``,
    whose META() it may read) visible."""
    if alias is not None:
        outer = outer | {alias, outer_meta_name(alias)}
    inner = bind_select(node.select, outer=outer - {META_KEY})
    own = set(inner.aliases) | {n for n, _ in inner.lets}
    refs: set[str] = set()
    keyspaces: set[str] = set()
    scans: set[str] = set()
    if inner.from_ is not None and inner.from_.source is None:
        keyspaces.add(inner.from_.name)
        if inner.from_.use_keys is None:
            scans.add(inner.from_.name)
    for j in inner.joins:  # read whole, as a keyspace FROM is (``exec/subquery_inputs``)
        keyspaces.add(j.keyspace)
        scans.add(j.keyspace)
    for e in inner.expressions():
        for n in walk(e):
            if isinstance(n, Identifier) and n.name in outer and n.name not in own:
                refs.add(n.name)
            elif isinstance(n, BoundSubquery):
                refs |= n.refs & outer - own
                keyspaces |= n.keyspaces
                scans |= n.scans
    standalone = not inlining()
    return BoundSubquery(
        inner, node.text, frozenset(refs), frozenset(keyspaces), frozenset(scans), alias, standalone
    )


def bind_with_subquery(node: WithSubquery, outer: frozenset[str], alias: str | None) -> Expr:
    """``(WITH ... SELECT ...)`` as an expression: a ``BoundSubquery`` whose statement is the
    ``BoundWith`` of its terms (each bound with those before it visible, read as parameters
    as a statement's WITH names are) and its query. Each evaluation values every term once,
    then runs the query (``subquery.py``'s runners); what the whole reads is what its parts
    read."""
    terms: list[BoundWithTerm] = []
    refs: set[str] = set()
    keyspaces: set[str] = set()
    scans: set[str] = set()
    names: list[str] = []

    def reads(parts: Iterable[Expr]) -> None:
        nonlocal refs, keyspaces, scans
        for e in parts:
            for n in walk(e):
                if isinstance(n, Identifier) and n.name in outer:
                    refs.add(n.name)
                elif isinstance(n, BoundSubquery):
                    refs |= n.refs
                    keyspaces |= n.keyspaces
                    scans |= n.scans

    with subquery_scope():
        for t in node.stmt.terms:
            with visible(names):
                if t.query is not None:
                    sub = _bind_query_subquery(t.query, t.inner, outer, alias)
                    reads([sub])
                    terms.append(BoundWithTerm(t.name, cte_param(t.name), None, sub.bound, t.query))
                else:
                    assert t.expr is not None
                    expr = resolve(t.expr, None, outer)
                    reads([expr])
                    terms.append(BoundWithTerm(t.name, cte_param(t.name), expr, None, None))
            names.append(t.name)
        with visible(names):
            body = _bind_query_subquery(node.stmt.body, node.stmt.body_text, outer, alias)
    reads([body])
    bound = BoundWith(node.stmt, tuple(terms), body.bound)
    return BoundSubquery(
        bound,
        node.text,
        frozenset(refs),
        frozenset(keyspaces),
        frozenset(scans),
        alias,
        not inlining(),
    )


def _bind_query_subquery(
    query: SelectStmt | SetOpStmt, text: str, outer: frozenset[str], alias: str | None
) -> BoundSubquery:
    if isinstance(query, SetOpStmt):
        return bind_set_op_subquery(SetOpSubquery(query, text), outer, alias)
    return bind_subquery(Subquery(query, text), outer, alias)


def bind_set_op_subquery(
    node: SetOpSubquery, outer: frozenset[str], alias: str | None
) -> BoundSubquery:
    """``(SELECT ... UNION SELECT ...)`` as an expression: a ``BoundSubquery`` whose statement
    is the ``BoundSetOp`` of its branches, each bound as a subquery of its own (what the
    whole reads is what they read)."""
    stmt = node.stmt
    subs = [
        _bind_query_subquery(b, t, outer, alias)
        for b, t in zip(stmt.branches, stmt.texts, strict=True)
    ]
    bound = BoundSetOp(
        stmt, tuple(s.bound for s in subs), stmt.ops, set_op_order(stmt), stmt.limit, stmt.offset
    )
    return BoundSubquery(
        bound,
        node.text,
        frozenset().union(*(s.refs for s in subs)),
        frozenset().union(*(s.keyspaces for s in subs)),
        frozenset().union(*(s.scans for s in subs)),
        alias,
        all(s.standalone for s in subs) and not inlining(),
    )


def set_op_order(stmt: SetOpStmt) -> tuple[tuple[Expr, OrderTerm], ...]:
    """A set operation's ORDER BY, bound over its result value (``RESULT_NAME``): a bare
    name is a field of it, SELF the value."""
    order = []
    for term in stmt.order_by:
        for n in walk(term.expr):
            if isinstance(n, Aggregate):
                raise SqlSemanticError(
                    f"aggregate {n.to_text()} is not allowed in the ORDER BY of a set "
                    "operation (it orders the result values)",
                    details={"aggregate": n.to_text(), "hint": "aggregate inside a branch"},
                )
        order.append((resolve(term.expr, RESULT_NAME, frozenset()), term))
    return tuple(order)


def _bind_from(ref: KeyspaceRef | None, outer: frozenset[str]) -> KeyspaceRef | None:
    """``FROM name`` where ``name`` is an enclosing query's variable is an expression term
    over that variable (N1QL: a subquery's FROM over its outer row), unless USE KEYS or USE
    INDEX say it is a keyspace (``FROM users USE KEYS ...`` inside ``FROM users``)."""
    if ref is not None and ref.source is None and ref.name not in outer:
        cte = reference(ref.name)  # FROM a WITH name: over its elements
        if cte is not None and ref.use_keys is None and not ref.use_index:
            return KeyspaceRef("", ref.as_name, source=cte)
    if ref is None or ref.source is not None or ref.name not in outer:
        return ref
    if ref.use_keys is not None or ref.use_index:
        return ref
    return KeyspaceRef("", ref.as_name, source=Identifier(ref.name))


def bind_select(stmt: SelectStmt, *, outer: frozenset[str] = frozenset()) -> BoundSelect:
    """Bind ``stmt``; ``outer``: names of enclosing queries it may read (a subquery's)."""
    stmt, calls = extract_windows(stmt)
    window_names = frozenset(window_name(i) for i in range(len(calls)))
    ref = _bind_from(stmt.from_, outer)
    alias = ref.as_name if ref is not None else None
    if ref is not None and ref.source is not None:
        ref = KeyspaceRef("", alias, source=resolve(ref.source, None, outer | {META_KEY}))
    if ref is not None and ref.use_keys is not None:
        ref = KeyspaceRef(
            ref.name,
            ref.alias,
            use_index=ref.use_index,
            use_keys=resolve(ref.use_keys, None, outer | {META_KEY}),
        )
    doc_bound = outer | frozenset({alias, META_KEY} if alias else {META_KEY})
    unnests, joins, doc_bound = _bind_from_terms(stmt, ref, alias, doc_bound)
    if stmt.joins:
        check_qualified(stmt, doc_bound)

    lets: list[tuple[str, Expr]] = []
    for name, e in stmt.let:
        _no_aggregate(e, "LET")
        lets.append((name, resolve(e, alias, doc_bound)))
        doc_bound = doc_bound | {name}
    where = None
    if stmt.where is not None:
        _no_aggregate(stmt.where, "WHERE")
        where = resolve(stmt.where, alias, doc_bound)

    # Projection names.
    names: list[str | None] = []
    counter = 0
    for term in stmt.terms:
        if term.star:
            names.append(None)
            continue
        assert term.expr is not None
        name = term.alias or implied_name(term.expr)
        if name is None:
            counter += 1
            name = f"${counter}"
        names.append(name)
    seen: set[str] = set()
    for name in names:
        if name is None or stmt.raw:
            continue
        if name in seen:
            raise SqlSemanticError(
                f"duplicate result name {name!r} in the projection",
                details={"name": name, "hint": "give one of the terms another name with AS"},
            )
        seen.add(name)
    explicit = {t.alias for t in stmt.terms if t.alias is not None and not stmt.raw}

    uses_aggregates = any(
        has_aggregate(e)
        for e in [t.expr for t in stmt.terms if t.expr is not None]
        + [o.expr for o in stmt.order_by]
        + ([stmt.having] if stmt.having is not None else [])
        + [e for _, e in stmt.letting]
        + [e for c in calls for e in c.children()]
    )
    grouped = bool(stmt.group_by) or uses_aggregates

    # ORDER BY reads projection aliases by names of their own (``order_alias_name``).
    order_exprs = [_order_aliased(o.expr, frozenset(explicit)) for o in stmt.order_by]
    order_bound = frozenset(order_alias_name(a) for a in explicit)
    grouping: _Grouping | None = None
    terms: list[BoundTerm] = []
    if grouped:
        grouping = _Grouping(stmt, alias, doc_bound, outer)
        for term, name in zip(stmt.terms, names, strict=True):
            if term.expr is None:
                raise SqlSemanticError(
                    "SELECT * cannot be used with GROUP BY or aggregates",
                    details={"hint": "list the group keys and aggregates"},
                )
            projected = grouping.bind(term.expr, "the projection", extra=window_names)
            terms.append(BoundTerm(name, projected, term.star))
        order = tuple(
            (grouping.bind(e, "ORDER BY", extra=order_bound | window_names), o)
            for e, o in zip(order_exprs, stmt.order_by, strict=True)
        )
        g = grouping
        windows = bind_windows(calls, lambda e: g.bind(e, "a window function"))
    else:
        for term, name in zip(stmt.terms, names, strict=True):
            if term.expr is None:
                # The FROM clause's names in the order written.
                for name in (alias, *ordered_aliases(unnests, joins)):
                    if name is not None:
                        terms.append(BoundTerm(name, Identifier(name)))
                continue
            projected = resolve(term.expr, alias, doc_bound | window_names)
            terms.append(BoundTerm(name, projected, term.star))
        order = tuple(
            (resolve(e, alias, doc_bound | order_bound | window_names), o)
            for e, o in zip(order_exprs, stmt.order_by, strict=True)
        )
        windows = bind_windows(calls, lambda e: resolve(e, alias, doc_bound))
    return BoundSelect(
        stmt=stmt,
        from_=ref,
        alias=alias,
        lets=tuple(lets),
        where=where,
        grouped=grouping is not None,
        group_keys=grouping.keys if grouping else (),
        aggregates=tuple(grouping.aggregates) if grouping else (),
        letting=grouping.letting if grouping else (),
        having=grouping.having if grouping else None,
        terms=tuple(terms),
        raw=stmt.raw,
        distinct=stmt.distinct,
        order=order,
        order_aliases=_aliases_used(order, order_bound),
        limit=stmt.limit,
        offset=stmt.offset,
        unnests=tuple(unnests),
        outer=outer,
        joins=tuple(joins),
        windows=windows,
    )


def _bind_from_terms(
    stmt: SelectStmt, ref: KeyspaceRef | None, alias: str | None, doc_bound: frozenset[str]
) -> tuple[list[tuple[str, Expr, bool]], list[BoundJoin], frozenset[str]]:
    """The UNNEST and JOIN / NEST terms bound in the order written, each seeing the names
    bound before it; returns them and the names bound after the last."""
    unnests: list[tuple[str, Expr, bool]] = []
    joins: list[BoundJoin] = []
    from_aliases = [] if alias is None else [alias]
    for i in range(len(stmt.unnests) + 1):
        for j in (j for j in stmt.joins if j.position == i):
            bound = _bind_join(j, ref, alias, doc_bound, from_aliases)
            joins.append(bound)
            from_aliases.append(j.alias)
            doc_bound = doc_bound | {j.alias, bound.meta_name}
        if i == len(stmt.unnests):
            break
        u = stmt.unnests[i]
        if u.alias in doc_bound:
            raise SqlSemanticError(
                f"UNNEST alias {u.alias!r} is already bound",
                details={"alias": u.alias, "hint": "give the UNNEST another alias with AS"},
            )
        _no_aggregate(u.expr, "UNNEST")
        unnests.append((u.alias, resolve(u.expr, alias, doc_bound), u.outer))
        doc_bound = doc_bound | {u.alias}
    return unnests, joins, doc_bound


def _bind_join(
    j: JoinTerm,
    ref: KeyspaceRef | None,
    alias: str | None,
    doc_bound: frozenset[str],
    from_aliases: list[str],
) -> BoundJoin:
    a = j.alias
    if a in doc_bound:
        raise SqlSemanticError(
            f"{j.word} alias {a!r} is already bound",
            details={"alias": a, "hint": f"give {j.target.name} another alias with AS"},
        )
    if j.kind == "right" and (ref is None or ref.source is not None):
        raise SqlSemanticError(
            "RIGHT JOIN needs a keyspace in FROM, not an expression",
            details={"hint": "put the expression on the right of a LEFT JOIN"},
        )
    meta = outer_meta_name(a)
    inner = doc_bound | {a, meta}
    common = {
        "kind": j.kind,
        "nest": j.nest,
        "keyspace": j.target.name,
        "alias": a,
        "meta_name": meta,
        "hint": j.hint,
        "use_index": j.target.use_index,
        "position": j.position,
    }
    for e in (j.on_keys, j.on_key, j.on):
        if e is not None:
            _no_aggregate(e, j.word)
    if j.on_keys is not None:
        return BoundJoin(form="keys", on_keys=resolve(j.on_keys, alias, doc_bound), **common)
    if j.on_key is not None:
        if j.for_alias not in from_aliases:
            raise SqlSemanticError(
                f"ON KEY ... FOR {j.for_alias}: {j.for_alias!r} is no keyspace alias before "
                f"{j.word} {j.target.name}",
                details={"alias": j.for_alias, "known": list(from_aliases)},
            )
        key = resolve(j.on_key, alias, inner)
        if not any(isinstance(n, Identifier) and n.name == a for n in walk(key)):
            raise SqlSemanticError(
                f"ON KEY {j.on_key.to_text()} must read the {j.word} keyspace's alias {a!r}",
                details={"expression": j.on_key.to_text(), "hint": f"ON KEY {a}.field FOR ..."},
            )
        outer_meta = META_KEY if j.for_alias == alias else outer_meta_name(str(j.for_alias))
        on = BinaryOp("=", key, Field(Identifier(outer_meta), "id"))
        return BoundJoin(form="index", on=on, **common)
    assert j.on is not None
    return BoundJoin(form="ansi", on=resolve(j.on, alias, inner), **common)


def _order_aliased(expr: Expr, aliases: frozenset[str]) -> Expr:
    """``expr`` with each bare name of a projection alias renamed to its ORDER BY name."""

    def f(node: Expr) -> Expr:
        if isinstance(node, Identifier) and node.name in aliases:
            return Identifier(order_alias_name(node.name))
        return map_children(node, f)

    return f(expr) if aliases else expr


def _aliases_used(order: tuple[tuple[Expr, OrderTerm], ...], names: frozenset[str]) -> tuple:
    """The projection aliases ORDER BY reads (``names``: their ORDER BY names)."""
    prefix = len(order_alias_name(""))
    used = {
        n.name[prefix:]
        for e, _ in order
        for n in walk(e)
        if isinstance(n, Identifier) and n.name in names
    }
    return tuple(sorted(used))


def _no_aggregate(expr: Expr, clause: str) -> None:
    for n in walk(expr):
        if isinstance(n, Aggregate):
            raise SqlSemanticError(
                f"aggregate {n.to_text()} is not allowed in {clause}",
                details={"aggregate": n.to_text(), "hint": "use HAVING to filter groups"},
            )


class _Grouping:
    """Rewrites grouped-query expressions to read the group scope."""

    def __init__(
        self,
        stmt: SelectStmt,
        alias: str | None,
        doc_bound: frozenset[str],
        outer: frozenset[str],
    ) -> None:
        self.alias = alias
        self.doc_bound = doc_bound
        self.outer = outer  # an enclosing query's names: constant within a group
        keys = []
        for e in stmt.group_by:
            _no_aggregate(e, "GROUP BY")
            keys.append(resolve(e, alias, doc_bound))
        self.keys = tuple(keys)
        self.aggregates: list[Aggregate] = []
        self.group_bound: frozenset[str] = frozenset()
        letting = []
        for name, e in stmt.letting:
            letting.append((name, self.bind(e, "LETTING")))
            self.group_bound = self.group_bound | {name}
        self.letting = tuple(letting)
        self.having = None if stmt.having is None else self.bind(stmt.having, "HAVING")

    def bind(self, expr: Expr, clause: str, extra: frozenset[str] = frozenset()) -> Expr:
        # Names bound in the group scope (LETTING vars, ORDER BY's projection aliases) stay.
        keep = self.group_bound | extra | self.outer
        resolved = resolve(expr, self.alias, self.doc_bound | keep)
        out = self._substitute(resolved)
        for n in walk(out):
            if isinstance(n, CollectionPredicate | ArrayComprehension):
                keep = keep | {b.var for b in n.bindings}
        for n in walk(out):
            if isinstance(n, Identifier) and n.name not in keep and not n.name.startswith("\x00"):
                raise SqlSemanticError(
                    f"{expr.to_text()} in {clause} is neither a GROUP BY key nor an aggregate",
                    details={"expression": expr.to_text(), "hint": "group by it or aggregate it"},
                )
            if isinstance(n, BoundSubquery) and n.refs - keep:
                raise SqlSemanticError(
                    f"{expr.to_text()} in {clause} is a subquery correlated on "
                    f"{', '.join(sorted(n.refs - keep))}: it must depend only on group keys "
                    "or aggregates",
                    details={"expression": expr.to_text(), "hint": "move it to LET or WHERE"},
                )
            if isinstance(n, Identifier) and n.name == META_KEY:
                raise SqlSemanticError(
                    f"META() in {clause} of a grouped query is not a GROUP BY key",
                    details={"expression": expr.to_text(), "hint": "group by META().id"},
                )
        return out

    def _substitute(self, node: Expr) -> Expr:
        for i, k in enumerate(self.keys):
            if node == k:
                return Identifier(group_key_name(i))
        if isinstance(node, Aggregate):
            if node.arg is not None and has_aggregate(node.arg):
                raise SqlSemanticError(
                    f"aggregates cannot be nested: {node.to_text()}",
                    details={"expression": node.to_text()},
                )
            if node not in self.aggregates:
                self.aggregates.append(node)
            return Identifier(aggregate_name(self.aggregates.index(node)))
        return map_children(node, self._substitute)
