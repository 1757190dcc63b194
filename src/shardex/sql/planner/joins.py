"""How each JOIN / NEST term runs (one rule for ``LocalEngine`` and the distributed plan).

* ON KEYS (lookup join): ``keys``, a nested loop fetching the documents each row names.
* An ON condition with an equi-join conjunct ``inner_expr = outer_expr`` (one side reads
  only the inner alias, the other none of it; an index join ``ON KEY b.f FOR a`` is
  ``b.f = META(a).id``):
  - ``index_nl``, a nested loop probing an index of the inner keyspace whose leading key is
    ``inner_expr`` (in document terms), or reading the inner documents by key when
    ``inner_expr`` is ``META(b).id``: the default when possible (``USE NL`` without an
    index: ``nl``);
  - else ``hash``: a table built on the inner side (``USE HASH(BUILD)``, the default) or
    on the left rows (``USE HASH(PROBE)``, the inner keyspace probing).
* No equi-join conjunct: ``nl``, every inner document tried per row (a hash hint then
  cannot be followed: ``note`` says so in EXPLAIN).
* RIGHT JOIN: the inner documents stream and the left rows are the table (``hash`` on the
  equi key, or ``nl``).

Whatever the method, the whole ON condition is checked on each candidate pair.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shardex.core.expr import BinaryOp, Expr, Field, Identifier, Meta, parse_expression, walk
from shardex.sql.syntax.ast import HASH_BUILD, HASH_PROBE, META_KEY, USE_NL
from shardex.sql.syntax.bind import map_children
from shardex.sql.syntax.join_syntax import BoundJoin

from .sargable import conjuncts

__all__ = ["JoinPlan", "equi_keys", "plan_join", "reads_only", "to_inner_document"]


@dataclass(frozen=True)
class JoinPlan:
    join: BoundJoin
    method: str  # keys | index_nl | hash | nl
    outer_keys: tuple[Expr, ...] = ()  # the equi-join key over the left row ...
    inner_keys: tuple[Expr, ...] = ()  # ... and over the inner document (the probed first)
    index: str | None = None  # index_nl: the inner index probed (None: by document key)
    build: str = "inner"  # hash: the side the table holds (inner | outer)
    note: str | None = None  # a hint not followed, and why

    def explain(self) -> dict[str, Any]:
        j = self.join
        out: dict[str, Any] = {
            "operator": j.word,
            "keyspace": j.keyspace,
            "as": j.alias,
            "form": j.form,
            "method": self.method,
        }
        if j.on_keys is not None:
            out["on_keys"] = shown(j.on_keys)
        if j.on is not None:
            out["on"] = shown(j.on)
        if self.inner_keys:
            out["join_keys"] = [
                [shown(o), shown(i)] for o, i in zip(self.outer_keys, self.inner_keys, strict=True)
            ]
        if self.method == "index_nl":
            out["index"] = self.index if self.index is not None else "(document keys)"
        if self.method == "hash":
            out["build"] = self.build
        if self.note:
            out["note"] = self.note
        return out


def shown(expr: Expr) -> str:
    """A bound expression as text, its scope row's META() names written as META(alias)."""

    def f(node: Expr) -> Expr:
        if isinstance(node, Identifier) and node.name.startswith(META_KEY):
            alias = node.name[len(META_KEY) + 1 :]
            return Meta(alias or None)
        return map_children(node, f)

    return f(expr).to_text()


def _names(expr: Expr) -> set[str]:
    return {n.name for n in walk(expr) if isinstance(n, Identifier)}


def reads_only(expr: Expr, names: frozenset[str]) -> bool:
    """``expr`` reads at least one of ``names`` and no other scope name (literals and
    parameters aside); a subquery never qualifies (what it reads is not seen here)."""
    found = _names(expr)
    return bool(found & names) and found <= names


def equi_keys(on: Expr | None, alias: str, meta_name: str) -> list[tuple[Expr, Expr]]:
    """``(outer_expr, inner_expr)`` of each ``=`` conjunct of ``on`` that compares an
    expression of the inner alias alone with one that reads none of it."""
    inner = frozenset({alias, meta_name})
    out: list[tuple[Expr, Expr]] = []
    for c in conjuncts(on):
        if not isinstance(c, BinaryOp) or c.op != "=":
            continue
        for a, b in ((c.left, c.right), (c.right, c.left)):
            if reads_only(a, inner) and _names(b) and not (_names(b) & inner):
                out.append((b, a))
                break
    return out


def to_inner_document(expr: Expr, alias: str, meta_name: str) -> Expr | None:
    """``expr`` over the inner document alone (``b.f`` -> ``f``, ``META(b)`` -> META()),
    the form of an index key; None when it reads the whole document."""
    whole = False

    def f(node: Expr) -> Expr:
        nonlocal whole
        if isinstance(node, Field) and node.base == Identifier(alias):
            return Identifier(node.name)
        if isinstance(node, Identifier):
            if node.name == meta_name:
                return Meta(None)
            if node.name == alias:
                whole = True
            return node
        return map_children(node, f)

    out = f(expr)
    return None if whole else out


_DOCID = parse_expression("META().id")


@functools.lru_cache(maxsize=1024)
def _key_expr(text: str) -> Expr:
    return parse_expression(text)


def plan_join(j: BoundJoin, indexes: Sequence[tuple[str, str]] = ()) -> JoinPlan:
    """The method of ``j``. ``indexes``: (name, leading key text) of the inner keyspace's
    usable indexes (built, and the one USE INDEX names if it names one)."""
    if j.form == "keys":
        return JoinPlan(j, "keys")
    pairs = equi_keys(j.on, j.alias, j.meta_name)
    if j.kind == "right":
        if not pairs:
            return JoinPlan(j, "nl")
        outer, inner = zip(*pairs, strict=True)
        return JoinPlan(j, "hash", tuple(outer), tuple(inner), build="outer")
    hinted_hash = j.hint in (HASH_BUILD, HASH_PROBE)
    if not pairs:
        note = "no equi-join condition: a hash join cannot be used" if hinted_hash else None
        return JoinPlan(j, "nl", note=note)
    if not hinted_hash:
        for n, (_, inner_e) in enumerate(pairs):
            doc = to_inner_document(inner_e, j.alias, j.meta_name)
            if doc is None:
                continue
            if doc == _DOCID:  # the inner documents' own ids: read by key, no index
                first = [pairs[n], *pairs[:n], *pairs[n + 1 :]]
                outer, inner = zip(*first, strict=True)
                return JoinPlan(j, "index_nl", tuple(outer), tuple(inner))
            for name, key_text in indexes:
                try:
                    if _key_expr(key_text) != doc:
                        continue
                except Exception:  # an index key this parser cannot read is no candidate
                    continue
                first = [pairs[n], *pairs[:n], *pairs[n + 1 :]]
                outer, inner = zip(*first, strict=True)
                return JoinPlan(j, "index_nl", tuple(outer), tuple(inner), index=name)
    outer, inner = zip(*pairs, strict=True)
    if j.hint == USE_NL:
        note = "USE NL: no index of the inner keyspace on its join key, every row tries each"
        return JoinPlan(j, "nl", tuple(outer), tuple(inner), note=note)
    build = "outer" if j.hint == HASH_PROBE else "inner"
    return JoinPlan(j, "hash", tuple(outer), tuple(inner), build=build)
