"""The parser's query forms beyond one SELECT: set operations (``parse_query``), WITH,
PREPARE / EXECUTE and INSERT ... SELECT, as functions of the ``SqlParser`` they extend
(``parser.py`` calls them; they call its clause parsers back)."""

from __future__ import annotations

import dataclasses
import uuid
from typing import TYPE_CHECKING

from shardex.core.expr import Expr, TokenKind

from .ast import (
    SET_OPERATORS,
    ExecuteStmt,
    InsertStmt,
    OrderTerm,
    PrepareStmt,
    SelectStmt,
    SetOpStmt,
    WithStmt,
    WithSubquery,
    WithTerm,
)

if TYPE_CHECKING:
    from .parser import SqlParser

__all__ = [
    "at_query_in_parens",
    "at_with_subquery",
    "parse_execute",
    "parse_insert_select",
    "parse_prepare",
    "parse_query",
    "parse_query_tail",
    "parse_with",
    "parse_with_subquery",
    "source_between",
]


def parse_insert_select(p: SqlParser, keyspace: str, upsert: bool) -> InsertStmt:
    """``... (KEY key_expr [, VALUE value_expr]) query [RETURNING ...]``."""
    key = p.parse_expr()
    value = p.parse_expr() if p.accept(",") and p.expect_keyword("VALUE") else None
    p.expect(")", "')' after the KEY and VALUE expressions")
    start = p.peek()
    if start.upper == "WITH" and start.kind is TokenKind.IDENT:
        select: SelectStmt | SetOpStmt | WithStmt = parse_with(p)
    elif p.at_keyword("SELECT") or at_query_in_parens(p):
        select = parse_query(p)
    else:
        p.error(start, expected="the SELECT whose results are inserted")
    text = source_between(p, start.offset, p.peek().offset)  # up to any RETURNING
    returning = p.parse_returning()
    return InsertStmt(
        keyspace,
        (),
        upsert=upsert,
        returning=returning,
        select=select,
        key=key,
        value=value,
        select_text=text,
    )


def parse_query(p: SqlParser) -> SelectStmt | SetOpStmt:
    """A SELECT or a set operation of SELECTs (``SetOpStmt``), with its trailing ORDER
    BY / LIMIT / OFFSET."""
    branches: list[SelectStmt | SetOpStmt] = []
    texts: list[str] = []
    ops: list[tuple[str, bool]] = []
    while True:
        start = p.peek()
        if at_query_in_parens(p):
            p.advance()
            branch: SelectStmt | SetOpStmt = parse_query(p)
            end = p.expect(")", "')' after the parenthesised query")
            texts.append(source_between(p, start.offset + 1, end.offset))
        else:
            branch = p.parse_select(tail=False)
            texts.append(source_between(p, start.offset, p.peek().offset))
        branches.append(branch)
        op = p.peek()
        if op.kind is not TokenKind.IDENT or op.upper not in SET_OPERATORS:
            break
        p.advance()
        ops.append((op.upper, p.accept_keyword("ALL") is not None))
        if not (p.at_keyword("SELECT") or at_query_in_parens(p)):
            p.error(p.peek(), expected=f"SELECT or a parenthesised query after {op.upper}")
    order_by, limit, offset = parse_query_tail(p)
    after = p.peek()
    if (order_by or limit or offset) and after.upper in SET_OPERATORS:
        p.error(
            after,
            f"ORDER BY, LIMIT and OFFSET end a set operation: {after.upper} cannot follow them",
            expected="parentheses around a branch that has them: "
            f"(SELECT ... ORDER BY ... LIMIT n) {after.upper} SELECT ...",
        )
    if len(branches) == 1 and isinstance(branches[0], SelectStmt):
        one = branches[0]
        if not (order_by or limit or offset):
            return one
        if not (one.order_by or one.limit or one.offset):  # SELECT ... ORDER BY ...
            return dataclasses.replace(one, order_by=order_by, limit=limit, offset=offset)
    if len(branches) == 1 and not (order_by or limit or offset):
        return branches[0]  # (query): the parentheses change nothing
    return SetOpStmt(tuple(branches), tuple(ops), tuple(texts), order_by, limit, offset)


def at_query_in_parens(p: SqlParser) -> bool:
    """At ``(SELECT`` (or ``((SELECT``, ...): a parenthesised query as a statement or a
    set operation's branch."""
    i = 0
    while p.at_op("(", i):
        i += 1
    return i > 0 and p.at_keyword("SELECT", i)


_QUERY_GOES_ON = frozenset({"UNION", "INTERSECT", "EXCEPT", "ORDER", "LIMIT", "OFFSET"})


def _query_in_parens_is_term(p: SqlParser) -> bool:
    """At ``(SELECT ...)`` that is a WITH term's whole query (or a set operation's first
    branch), not the start of an expression such as ``(SELECT ...)[0]`` or ``(SELECT ...) +
    1``: what follows its closing parenthesis decides, read ahead over the tokens."""
    if not at_query_in_parens(p):
        return False
    depth, i = 0, 0
    while True:
        tok = p.peek(i)
        if tok.kind is TokenKind.EOF:
            return True  # unbalanced: the query's parser reports where
        if tok.kind is TokenKind.OP and tok.text == "(":
            depth += 1
        elif tok.kind is TokenKind.OP and tok.text == ")":
            depth -= 1
            if depth == 0:
                after = p.peek(i + 1)
                return (after.kind is TokenKind.OP and after.text == ")") or (
                    after.upper in _QUERY_GOES_ON
                )
        i += 1


def parse_query_tail(p: SqlParser) -> tuple[tuple[OrderTerm, ...], Expr | None, Expr | None]:
    """``[ORDER BY ...] [LIMIT expr] [OFFSET expr]`` (LIMIT and OFFSET in either order,
    each at most once)."""
    order_by = p.parse_order_by() if p.at_keyword("ORDER") else ()
    limit = offset = None
    for _ in range(2):
        if limit is None and p.accept_keyword("LIMIT"):
            limit = p.parse_expr()
        elif offset is None and p.accept_keyword("OFFSET"):
            offset = p.parse_expr()
    return order_by, limit, offset


def source_between(p: SqlParser, start: int, end: int) -> str:
    return p.text[start:end].strip() if p.text else ""


def parse_prepare(p: SqlParser) -> PrepareStmt:
    """``PREPARE [FORCE] [name (FROM | AS)] statement``."""
    p.advance()
    force = False
    if p.at_keyword("FORCE") and p.peek(1).kind is not TokenKind.OP:
        p.advance()
        force = True
    name = ""
    if p.peek(1).upper in ("FROM", "AS"):
        name = parse_prepared_name(p)
        p.advance()
    start = p.peek()
    if start.upper in ("PREPARE", "EXECUTE", "CREATE", "BUILD", "DROP"):
        p.error(start, f"{start.upper} cannot be prepared", expected="a query or DML")
    inner = p.parse_dml_or_query()
    text = source_between(p, start.offset, p.peek().offset)
    return PrepareStmt(name or f"p{uuid.uuid4().hex}", inner, text, force)


def parse_execute(p: SqlParser) -> ExecuteStmt:
    """``EXECUTE name [USING expr]``."""
    p.advance()
    name = parse_prepared_name(p)
    using = p.parse_expr() if p.accept_keyword("USING") else None
    return ExecuteStmt(name, using)


def parse_prepared_name(p: SqlParser) -> str:
    tok = p.peek()
    if tok.kind is TokenKind.STRING and isinstance(tok.value, str) and tok.value:
        p.advance()
        return tok.value
    if tok.kind not in (TokenKind.IDENT, TokenKind.QIDENT):
        p.error(tok, expected="the name of a prepared statement")
    return p.parse_alias()


def parse_with(p: SqlParser) -> WithStmt:
    """``WITH name AS (query | expr) {, ...} query``."""
    p.advance()  # WITH (not reserved: it stays usable as a name elsewhere)
    if p.peek().upper == "RECURSIVE":
        p.error(p.peek(), "WITH RECURSIVE is not supported", expected="a name")
    terms: list[WithTerm] = []
    while True:
        start = p.peek()
        name = p.parse_alias()
        if any(t.name == name for t in terms):
            p.error(start, f"WITH names {name!r} twice", expected="another name")
        p.expect_keyword("AS")
        opened = p.expect("(", f"'(' and the query or expression {name} stands for")
        if p.at_keyword("SELECT") or _query_in_parens_is_term(p):
            query: SelectStmt | SetOpStmt | None = parse_query(p)
            expr = None
        else:
            query, expr = None, p.parse_expr()
        end = p.expect(")", f"')' after the definition of {name}")
        text = source_between(p, start.offset, end.offset + 1)
        inner = source_between(p, opened.offset + 1, end.offset)
        terms.append(WithTerm(name, text, expr, query, inner))
        if not p.accept(","):
            break
    start = p.peek()
    if not (p.at_keyword("SELECT") or at_query_in_parens(p)):
        p.error(start, expected="',' and another WITH term, or the SELECT that uses them")
    body = parse_query(p)
    body_text = source_between(p, start.offset, p.peek().offset)
    return WithStmt(tuple(terms), body, body_text)


def at_with_subquery(p: SqlParser) -> bool:
    """At ``(WITH name AS``: a WITH statement in parentheses, as an expression."""
    return (
        p.at_op("(")
        and p.peek(1).upper == "WITH"
        and p.peek(2).kind in (TokenKind.IDENT, TokenKind.QIDENT)
        and p.peek(3).upper == "AS"
    )


def parse_with_subquery(p: SqlParser) -> Expr:
    start = p.advance()
    stmt = parse_with(p)
    end = p.expect(")", "')' after the subquery")
    return WithSubquery(stmt, source_between(p, start.offset + 1, end.offset))
