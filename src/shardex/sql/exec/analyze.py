"""What the physical planner asks of a bound SELECT: the WHERE clause and ORDER BY in
document terms (the form ``planner.choose`` and the index key expressions use), the document
paths the query reads (for covering), and a direct key lookup (USE KEYS, META().id = ...).

Bound expressions read the scope row: ``Field(Identifier(alias), "age")`` is the document's
``age``, ``Identifier(META_KEY)`` is META(), other identifiers are LET variables (inlined
here, so a LET never looks like a document field) or comprehension variables.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from shardex.core.expr import (
    And,
    BinaryOp,
    Expr,
    Field,
    Identifier,
    In,
    Meta,
    Param,
    referenced_paths,
    walk,
)
from shardex.core.expr.analysis import Path
from shardex.sql.planner.choose import OrderKey
from shardex.sql.planner.sargable import conjuncts, reads_document
from shardex.sql.syntax.ast import Binding, CollectionPredicate
from shardex.sql.syntax.bind import META_KEY, BoundSelect, map_children

__all__ = [
    "FETCHED_META",
    "KeyLookup",
    "doc_order",
    "doc_where",
    "key_lookup",
    "key_route",
    "ranking_paths",
    "read_paths",
    "reads_fetched_meta",
    "reads_meta",
    "reads_meta_field",
    "to_document_terms",
]

# META() fields only a document's fetch brings (its owner's CAS and expiry): a query that
# reads one fetches every document with them, never covered and never late-materialised.
FETCHED_META: Final = ("cas", "expiration")

_WHOLE_DOC = Identifier("\x00document")  # never an index key: marks "reads everything"


def inline_lets(expr: Expr, lets: tuple[tuple[str, Expr], ...]) -> Expr:
    """``expr`` with LET variables replaced by their (already inlined) definitions."""
    if not lets:
        return expr
    defs: dict[str, Expr] = {}
    for name, e in lets:
        defs[name] = _substitute(e, defs)
    return _substitute(expr, defs)


def _substitute(expr: Expr, defs: dict[str, Expr]) -> Expr:
    def f(node: Expr) -> Expr:
        if isinstance(node, Identifier) and node.name in defs:
            return defs[node.name]
        return map_children(node, f)

    return f(expr)


def to_document_terms(expr: Expr, alias: str | None) -> Expr:
    """A bound expression rewritten over the bare document: ``alias.a.b`` -> ``a.b``,
    META() -> ``META()``; the whole document (``alias`` alone) -> a marker no key equals."""

    def f(node: Expr) -> Expr:
        if (
            isinstance(node, Field)
            and isinstance(node.base, Identifier)
            and node.base.name == alias
        ):
            return Identifier(node.name)
        if isinstance(node, Identifier):
            if node.name == META_KEY:
                return Meta(None)
            if node.name == alias:
                return _WHOLE_DOC
            return node
        return map_children(node, f)

    return f(expr)


def doc_where(b: BoundSelect) -> Expr | None:
    """WHERE over the bare document, for index choice and spans. With UNNEST, a conjunct
    that reads no UNNEST alias is kept; one about the elements of one inner UNNEST of a
    document array (``UNNEST o.lines AS line ... line.sku = 'x'``) becomes what it implies
    of the document, ``ANY line IN lines SATISFIES line.sku = 'x' END`` (every row of an
    inner UNNEST is an element of that array), which an array index can serve; the others
    are about elements, not documents (``line.count > 2`` is no document field ``line``),
    and are left out."""
    if b.where is None:
        return None
    where = inline_lets(b.where, b.lets)
    if b.unnests:
        elements = {a for a, _, _ in b.unnests}
        kept = []
        for t in conjuncts(where):
            read = {n.name for n in walk(t) if isinstance(n, Identifier)} & elements
            if not read:
                kept.append(t)
            elif (implied := _implied_any(t, read, b, elements)) is not None:
                kept.append(implied)
        if not kept:
            return None
        where = kept[0] if len(kept) == 1 else And(tuple(kept))
    return to_document_terms(where, b.alias)


def _implied_any(term: Expr, read: set[str], b: BoundSelect, elements: set[str]) -> Expr | None:
    """``ANY u IN source SATISFIES term END`` when ``term`` reads one inner UNNEST alias
    ``u`` whose source is a document array (it reads no other UNNEST alias), else None."""
    if len(read) != 1:
        return None
    (name,) = read
    for alias, source, outer in b.unnests:
        if alias != name:
            continue
        if outer or any(isinstance(n, Identifier) and n.name in elements for n in walk(source)):
            return None
        return CollectionPredicate("ANY", (Binding(alias, source),), term)
    return None


def doc_order(b: BoundSelect) -> list[OrderKey]:
    """ORDER BY in document terms, for "does the index order satisfy it" (grouped queries
    and projection aliases never do: the caller passes [] then; nor does UNNEST's order of
    elements within a document)."""
    if b.unnests:
        return []
    out = []
    for e, o in b.order:
        out.append(
            OrderKey(to_document_terms(inline_lets(e, b.lets), b.alias), o.desc, o.nulls_first)
        )
    return out


def _doc_exprs(b: BoundSelect) -> list[Expr]:
    """Every expression evaluated over the document scope."""
    exprs: list[Expr] = [e for _, e in b.lets]
    exprs += [e for j in b.joins for e in j.expressions()]  # ON: over the joined scope row
    if b.where is not None:
        exprs.append(b.where)
    if b.grouped:
        exprs += list(b.group_keys)
        exprs += [a.arg for a in b.aggregates if a.arg is not None]
    else:
        exprs += [t.expr for t in b.terms]
        exprs += [e for e, _ in b.order]
        exprs += [e for w in b.windows for e in w.expressions()]  # over the document scope
    return exprs


def read_paths(b: BoundSelect) -> set[Path] | None:
    """The document paths the query reads; None when it needs whole documents (as with
    UNNEST: an element alias's paths are no document's), or ``META().cas`` /
    ``META().expiration``, which only the fetched document brings (no index covers them)."""
    if b.unnests or reads_fetched_meta(b):
        return None
    let_names = {n for n, _ in b.lets}
    out: set[Path] = set()
    for e in _doc_exprs(b):
        d = to_document_terms(e, b.alias)
        if any(n == _WHOLE_DOC for n in walk(d)):
            return None
        for p in referenced_paths(d):
            if p and p[0] in let_names:
                continue  # a LET variable, read through its definition (also listed)
            out.add(p)
    return out


def alias_paths(b: BoundSelect, alias: str) -> set[Path] | None:
    """The paths of ``alias``'s document (the FROM's or a joined one) the statement reads
    over its scope rows; None when one reads the document whole (the alias alone, a
    subquery reading it, a dynamic field), or with UNNEST (an element alias's paths are
    no document's)."""
    if b.unnests:
        return None
    out: set[Path] = set()
    for e in _doc_exprs(b):
        # Paths start at a scope name: the alias's are its document's (a subquery that
        # reads the alias reports it alone: the whole document).
        for p in referenced_paths(e):
            if p and p[0] == alias:
                if len(p) == 1:
                    return None
                out.add(p[1:])
    return out


def ranking_paths(b: BoundSelect) -> set[Path] | None:
    """The document paths that decide which rows a non-grouped SELECT returns and in what
    order (LET, WHERE, ORDER BY): what an index must cover for its leaves to rank rows
    without the documents (late materialization). None when they read a whole document or
    ``META()`` beyond ``id`` (a leaf knows only an entry's docid), or with UNNEST (a
    document is several rows)."""
    if b.unnests:
        return None
    exprs: list[Expr] = [e for _, e in b.lets] + [e for e, _ in b.order]
    if b.where is not None:
        exprs.append(b.where)
    let_names = {n for n, _ in b.lets}
    out: set[Path] = set()
    for e in exprs:
        meta_ids = sum(1 for n in walk(e) if _is_meta_id(n))
        if sum(1 for n in walk(e) if isinstance(n, Identifier) and n.name == META_KEY) > meta_ids:
            return None
        d = to_document_terms(e, b.alias)
        if any(n == _WHOLE_DOC for n in walk(d)):
            return None
        out.update(p for p in referenced_paths(d) if not (p and p[0] in let_names))
    return out


def reads_fetched_meta(b: BoundSelect) -> bool:
    """Whether the query reads a ``META()`` field that only a document's fetch brings
    (``FETCHED_META``: its CAS and expiry, from its owner; no index entry holds them).
    Kept on the bound statement (one serves every execution of its text: a point query
    asks on each)."""
    found: bool | None = b.__dict__.get("_reads_fetched_meta")
    if found is None:
        found = reads_meta_field(b, *FETCHED_META)
        object.__setattr__(b, "_reads_fetched_meta", found)  # a cache: frozen stays true
    return found


def reads_meta_field(b: BoundSelect, *names: str, meta: str = META_KEY) -> bool:
    """Whether the query reads ``META().<name>`` for any of ``names``; ``meta``: the scope
    row's name of the META() asked about (a joined alias's is its ``meta_name``)."""
    return any(
        isinstance(n, Field)
        and n.name in names
        and isinstance(n.base, Identifier)
        and n.base.name == meta
        for e in _doc_exprs(b)
        for n in walk(e)
    )


def reads_meta(b: BoundSelect) -> bool:
    """Whether the query reads ``META()`` of the documents (a covering leaf then needs
    each entry's docid)."""
    return any(
        isinstance(n, Identifier) and n.name == META_KEY for e in _doc_exprs(b) for n in walk(e)
    )


@dataclass(frozen=True)
class KeyLookup:
    """Documents named directly: ``USE KEYS expr`` or ``META().id = expr`` / ``IN expr``."""

    keys: Expr
    source: str  # "use_keys" | "meta_id"


def key_route(b: BoundSelect, lookup: KeyLookup | None) -> tuple[str, str] | None:
    """(keyspace, parameter name) when ``b`` (whose ``key_lookup`` is ``lookup``) reads the
    documents of one key given as a parameter, ``WHERE META().id = $1`` or ``USE KEYS $k``:
    the key's owner answers it in-process, so that is where a client should send it."""
    ref = b.from_
    if ref is None or ref.source is not None or ref.use_index or lookup is None:
        return None
    keys = lookup.keys
    return (ref.name, keys.name) if isinstance(keys, Param) else None


def _is_meta_id(e: Expr) -> bool:
    return (
        isinstance(e, Field)
        and e.name == "id"
        and isinstance(e.base, Identifier)
        and e.base.name == META_KEY
    )


def key_lookup(b: BoundSelect) -> KeyLookup | None:
    ref = b.from_
    if ref is None or ref.source is not None or b.joins:  # a join runs as its own plan
        return None
    if ref.use_keys is not None:
        return KeyLookup(ref.use_keys, "use_keys")
    if b.where is None:
        return None
    for term in conjuncts(inline_lets(b.where, b.lets)):
        if isinstance(term, BinaryOp) and term.op == "=":
            for key, other in ((term.left, term.right), (term.right, term.left)):
                if _is_meta_id(key) and not reads_document(other):
                    return KeyLookup(other, "meta_id")
        if (
            isinstance(term, In)
            and not term.negated
            and _is_meta_id(term.operand)
            and not reads_document(term.collection)
        ):
            return KeyLookup(term.collection, "meta_id")
    return None
