"""MERGE: the statement's tree and its parser, N1QL's lookup form::

    MERGE INTO keyspace [[AS] alias]
      USING keyspace [[AS] s] [USE KEYS expr] | (SELECT ...) [AS] s | expr [AS] s
      ON [PRIMARY] KEY expr
      [WHEN MATCHED THEN UPDATE SET path = expr {, ...} [UNSET path {, ...}] [WHERE cond]]
      [WHEN MATCHED THEN DELETE [WHERE cond]]
      [WHEN NOT MATCHED THEN INSERT expr [WHERE cond]]
      [LIMIT expr] [RETURNING terms]

Each source row names a document of the target by ``ON KEY`` (evaluated on the source row);
a document that exists is updated or deleted, one that does not is inserted with the
``INSERT`` value. Names: ``ON KEY`` and ``INSERT`` read the source row (a bare name is a
field of it), the matched clauses read the target document (a bare name is its field) and
see the source alias too. The ANSI form (``ON condition``) is refused with a hint.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from shardex.core.expr import Expr

from .ast import KeyspaceRef, ResultTerm, SelectStmt

if TYPE_CHECKING:
    from .parser import SqlParser

__all__ = ["MergeDelete", "MergeInsert", "MergeStmt", "MergeUpdate", "parse_merge"]


@dataclass(frozen=True)
class MergeUpdate:
    set: tuple[tuple[Expr, Expr], ...] = ()
    unset: tuple[Expr, ...] = ()
    where: Expr | None = None


@dataclass(frozen=True)
class MergeDelete:
    where: Expr | None = None


@dataclass(frozen=True)
class MergeInsert:
    value: Expr
    where: Expr | None = None


@dataclass(frozen=True)
class MergeStmt:
    """``source`` is a keyspace (``KeyspaceRef``, maybe with USE KEYS), a SELECT whose result
    values are the rows, or an expression whose array elements are."""

    keyspace: str
    alias: str
    source: KeyspaceRef | SelectStmt | Expr
    source_alias: str
    on_key: Expr
    update: MergeUpdate | None = None
    delete: MergeDelete | None = None
    insert: MergeInsert | None = None
    limit: Expr | None = None
    returning: tuple[ResultTerm, ...] = ()


def parse_merge(p: SqlParser) -> MergeStmt:
    """``MERGE ...`` from ``p``'s position (at MERGE)."""
    p.expect_keyword("MERGE")
    p.expect_keyword("INTO")
    keyspace = p.parse_name("keyspace")
    alias = p.parse_optional_alias() or keyspace
    p.expect_keyword("USING")
    source, source_alias = _source(p)
    if source_alias == alias:
        p.error(
            p.tokens[p.pos - 1],
            f"the source and the target are both named {alias!r}",
            expected="an alias for one of them (AS ...)",
        )
    p.expect_keyword("ON")
    p.accept_keyword("PRIMARY")
    if not p.accept_keyword("KEY"):
        p.error(
            p.peek(),
            "MERGE ... ON condition (ANSI MERGE) is not supported",
            expected="KEY and the target document's key, as the source row names it (ON KEY s.id)",
        )
    on_key = p.parse_expr()
    update: MergeUpdate | None = None
    delete: MergeDelete | None = None
    insert: MergeInsert | None = None
    while p.at_keyword("WHEN"):
        tok = p.advance()
        matched = p.accept_keyword("NOT") is None
        p.expect_keyword("MATCHED")
        p.expect_keyword("THEN")
        action = p.peek()
        if matched and p.accept_keyword("UPDATE"):
            if update is not None:
                p.error(tok, "WHEN MATCHED THEN UPDATE given twice")
            update = _update(p)
        elif matched and p.accept_keyword("DELETE"):
            if delete is not None:
                p.error(tok, "WHEN MATCHED THEN DELETE given twice")
            delete = MergeDelete(_where(p))
        elif not matched and p.accept_keyword("INSERT"):
            if insert is not None:
                p.error(tok, "WHEN NOT MATCHED THEN INSERT given twice")
            insert = MergeInsert(p.parse_expr(), _where(p))
        else:
            p.error(action, expected="UPDATE or DELETE" if matched else "INSERT")
    if update is None and delete is None and insert is None:
        p.error(p.peek(), expected="WHEN MATCHED or WHEN NOT MATCHED")
    limit = p.parse_expr() if p.accept_keyword("LIMIT") else None
    return MergeStmt(
        keyspace=keyspace,
        alias=alias,
        source=source,
        source_alias=source_alias,
        on_key=on_key,
        update=update,
        delete=delete,
        insert=insert,
        limit=limit,
        returning=p.parse_returning(),
    )


def _source(p: SqlParser) -> tuple[KeyspaceRef | SelectStmt | Expr, str]:
    if p.at_op("(") and p.at_keyword("SELECT", 1):
        p.advance()
        select = p.parse_select()
        p.expect(")", "')' after the source SELECT")
        alias = p.parse_optional_alias()
        if alias is None:
            p.error(p.peek(), "a SELECT source needs an alias", expected="AS and a name")
        return select, alias
    if p.at_op("(") or p.at_op("[") or p.at_op("{"):
        expr = p.parse_expr()
        alias = p.parse_optional_alias()
        if alias is None:
            p.error(p.peek(), "an expression source needs an alias", expected="AS and a name")
        return expr, alias
    ref = p.parse_target()
    return ref, ref.as_name


def _update(p: SqlParser) -> MergeUpdate:
    sets, unsets = p.parse_set_unset()
    return MergeUpdate(sets, unsets, _where(p))


def _where(p: SqlParser) -> Expr | None:
    return p.parse_expr() if p.accept_keyword("WHERE") else None
