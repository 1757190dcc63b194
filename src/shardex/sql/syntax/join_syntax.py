"""The JOIN and NEST terms of a FROM clause, as N1QL writes them::

    [INNER | LEFT [OUTER] | RIGHT [OUTER]] JOIN | NEST keyspace [[AS] alias]
        [USE INDEX (name) | USE HASH(BUILD | PROBE) | USE NL] ...
        ON KEYS expr                  lookup join: the inner documents named by key
      | ON KEY alias.path FOR outer   index join: inner documents whose path holds the
                                      outer alias's document id
      | ON cond                       ANSI join

N1QL's restrictions, checked here with the token at fault: a RIGHT join is ANSI, no NEST,
and only the first term after FROM (its left side is then the FROM term alone); the hints
USE HASH / USE NL belong to ANSI joins; the inner keyspace takes no USE KEYS (ON KEYS says
which documents).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from shardex.core.expr import Expr, Identifier, Token, walk
from shardex.errors import ErrorCode, ShardexError

from .ast import (
    HASH_BUILD,
    HASH_PROBE,
    SELF_NAME,
    USE_NL,
    ArrayComprehension,
    CollectionPredicate,
    JoinTerm,
    KeyspaceRef,
    SelectStmt,
)

if TYPE_CHECKING:
    from .parser import SqlParser


def parse_join_term(p: SqlParser, kind: str, start: Token, position: int, first: bool) -> JoinTerm:
    """One JOIN / NEST term, the parser at its JOIN or NEST keyword (its INNER / LEFT /
    RIGHT prefix, ``kind``, read already from ``start``)."""
    nest = p.advance().upper == "NEST"
    if kind == "right" and nest:
        p.error(start, "NEST has no RIGHT form", expected="NEST or LEFT NEST")
    if kind == "right" and not first:
        p.error(
            start,
            "RIGHT JOIN may only be the first term after FROM (put its keyspace in FROM "
            "and write a LEFT JOIN)",
            expected="JOIN or LEFT JOIN",
        )
    name = p.parse_name("keyspace")
    alias = p.parse_optional_alias()
    use_index: tuple[str, ...] = ()
    hint: str | None = None
    hint_tok = None
    while p.accept_keyword("USE"):
        tok = p.peek()
        if p.accept_keyword("INDEX"):
            p.expect("(", "'(' and index names")
            use_index = tuple(p.comma_list(lambda: p.parse_name("index")))
            if p.accept_keyword("USING"):
                p.expect_keyword("GSI")
            p.expect(")", "',' or ')'")
        elif tok.upper == "HASH" and p.at_op("(", 1):
            p.advance()
            p.advance()
            side = p.peek()
            if side.upper not in ("BUILD", "PROBE"):
                p.error(side, expected="BUILD or PROBE in USE HASH(...)")
            p.advance()
            p.expect(")", "')' after USE HASH(BUILD|PROBE")
            hint, hint_tok = (HASH_BUILD if side.upper == "BUILD" else HASH_PROBE), tok
        elif tok.upper == "NL":
            p.advance()
            hint, hint_tok = USE_NL, tok
        elif tok.upper == "KEYS":
            p.error(
                tok,
                f"the {p_word(kind, nest)} keyspace {name!r} takes no USE KEYS (ON KEYS expr "
                "says which of its documents to join)",
                expected="ON KEYS",
            )
        else:
            p.error(tok, expected="INDEX, HASH(BUILD|PROBE) or NL after USE")
    target = KeyspaceRef(name, alias, use_index=use_index)
    word = p_word(kind, nest)
    if not p.accept_keyword("ON"):
        p.error(
            p.peek(),
            f"{word} {name} needs an ON clause ({word} {name} AS x ON x.field = ...)",
            expected="ON KEYS, ON KEY ... FOR or ON condition",
        )
    if p.accept_keyword("KEYS"):
        _no_hint(p, hint_tok, "a lookup join (ON KEYS)")
        _not_right(p, kind, start, "ON KEYS")
        return JoinTerm(kind, nest, target, on_keys=p.parse_expr(), position=position)
    if p.accept_keyword("KEY"):
        _no_hint(p, hint_tok, "an index join (ON KEY ... FOR)")
        _not_right(p, kind, start, "ON KEY ... FOR")
        key = p.parse_expr()
        p.expect_keyword("FOR")
        outer = p.parse_alias()
        return JoinTerm(kind, nest, target, on_key=key, for_alias=outer, position=position)
    cond = p.parse_expr()
    return JoinTerm(kind, nest, target, on=cond, hint=hint, position=position)


def p_word(kind: str, nest: bool) -> str:
    prefix = "" if kind == "inner" else f"{kind.upper()} "
    return prefix + ("NEST" if nest else "JOIN")


def _no_hint(p: SqlParser, hint_tok: Token | None, what: str) -> None:
    if hint_tok is not None:
        p.error(
            hint_tok,
            f"USE HASH and USE NL apply to ANSI joins (ON condition), not to {what}",
            expected="ON condition",
        )


def _not_right(p: SqlParser, kind: str, start: Token, what: str) -> None:
    if kind == "right":
        p.error(
            start,
            f"RIGHT JOIN needs an ON condition, not {what} (swap the keyspaces and write a "
            "LEFT JOIN)",
            expected="ON condition",
        )


@dataclass(frozen=True)
class BoundJoin:
    """A JOIN / NEST term bound over the document scope. ``on_keys`` (a lookup join) reads
    the row so far; ``on`` (an ANSI join, or an index join's ``path = META(outer).id``)
    reads the row so far and the inner alias ``alias``, whose META() is the scope row's
    ``meta_name``. ``form``: ``keys``, ``index`` (ON KEY ... FOR) or ``ansi``."""

    kind: str
    nest: bool
    keyspace: str
    alias: str
    meta_name: str
    form: str
    on_keys: Expr | None = None
    on: Expr | None = None
    hint: str | None = None
    use_index: tuple[str, ...] = ()
    position: int = 0

    @property
    def word(self) -> str:
        return p_word(self.kind, self.nest)

    def expressions(self) -> list[Expr]:
        return [e for e in (self.on_keys, self.on) if e is not None]


def check_qualified(stmt: SelectStmt, bound: frozenset[str]) -> None:
    """With a JOIN or NEST a bare field name could be any keyspace's: as N1QL does, it is
    an error (BAD_REQUEST naming it) unless it names something the statement binds
    (``bound``: the FROM clause's aliases and an enclosing query's names; LET and LETTING
    variables, projection aliases and comprehension variables are added here). Subqueries
    bind their own names."""
    exprs = [t.expr for t in stmt.terms if t.expr is not None]
    exprs += [e for _, e in stmt.let] + [e for _, e in stmt.letting] + list(stmt.group_by)
    exprs += [o.expr for o in stmt.order_by] + [u.expr for u in stmt.unnests]
    exprs += [e for e in (stmt.where, stmt.having) if e is not None]
    exprs += [e for j in stmt.joins for e in (j.on_keys, j.on_key, j.on) if e is not None]
    names = set(bound) | {n for n, _ in stmt.let} | {n for n, _ in stmt.letting}
    names |= {t.alias for t in stmt.terms if t.alias is not None} | {SELF_NAME}
    nodes = [n for e in exprs for n in walk(e)]
    for n in nodes:
        if isinstance(n, CollectionPredicate | ArrayComprehension):
            names |= {b.var for b in n.bindings}
    aliases = [a for a in bound if not a.startswith("\x00")]
    for n in nodes:
        if isinstance(n, Identifier) and n.name not in names:
            qualified = ", ".join(f"{a}.{n.name}" for a in sorted(aliases)[:3])
            raise ShardexError(
                f"ambiguous reference to field {n.name!r}: with JOIN or NEST, name its "
                f"keyspace alias ({qualified})",
                code=ErrorCode.BAD_REQUEST,
                details={"field": n.name, "hint": f"write {qualified.split(', ')[0]}"},
            )
