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

from shardex.core.expr import Expr, Token

from .ast import HASH_BUILD, HASH_PROBE, USE_NL, JoinTerm, KeyspaceRef

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
