"""Index DDL statements: CREATE [PRIMARY] INDEX, BUILD INDEX, DROP [PRIMARY] INDEX.

Grammar (keywords case-insensitive, ``;`` optional at the end)::

    CREATE INDEX name ON keyspace ( key [ASC|DESC] {, key [ASC|DESC]} )
        [WHERE expr] [PARTITION BY HASH ( expr {, expr} )] [USING GSI] [WITH {...}]
    CREATE PRIMARY INDEX [name] ON keyspace [PARTITION BY HASH (...)] [USING GSI] [WITH {...}]
    BUILD INDEX ON keyspace ( name {, name} )
    DROP INDEX keyspace.name | DROP INDEX name ON keyspace
    DROP PRIMARY INDEX [name] ON keyspace

A ``key`` is an expression or one array key, ``DISTINCT|ALL ARRAY expr FOR v IN expr [WHEN
expr] END`` (or ``DISTINCT|ALL expr``: its elements as they are; ``shardex.meta.array_key``).

``WITH`` takes a JSON object with ``num_partition`` (int), ``num_replica`` (int, 0..3: copies
of every index partition beyond the first), ``defer_build`` (bool) and ``nodes`` (list of node
names). ``WHERE`` and ``PARTITION BY`` may come in either order
(N1QL puts PARTITION BY first, the issue WHERE first; both are common in the wild).

``DDLParser`` subclasses the expression ``Parser`` so key, WHERE and partition expressions are
parsed by exactly the parser that later re-reads their canonical text (the definitions store
``expr.to_text()``), and so the SQL statement parser (``sql.syntax``) can extend this one. Every
error is ``SQL_SYNTAX`` naming line, column and token (``details``: line, column, token,
text, expected), lexer errors included. Names that are DDL keywords need back-ticks; a
keyspace or index name may contain dashes (``my-ks``) as long as there is no space around
them, since the keyspace rule allows them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NoReturn

from shardex.core.expr import (
    Expr,
    Parser,
    Token,
    TokenKind,
    evaluate,
    is_constant,
    tokenize,
)
from shardex.core.expr.ast import EXPRESSION_KEYWORDS
from shardex.errors import ErrorCode, ExpressionSyntaxError, ShardexError
from shardex.meta.array_key import parse_array_key
from shardex.meta.index_definition import MAX_INDEX_PARTITIONS, MAX_INDEX_REPLICAS

__all__ = [
    "DDL_KEYWORDS",
    "WITH_OPTIONS",
    "BuildIndexStmt",
    "CreateIndexStmt",
    "DDLParser",
    "DDLStatement",
    "DropIndexStmt",
    "SqlSyntaxError",
    "parse_ddl",
    "parse_index_key",
]

DDL_KEYWORDS = frozenset(
    {"CREATE", "DROP", "BUILD", "INDEX", "PRIMARY", "ON", "WHERE", "PARTITION", "BY", "WITH"}
    | {"USING", "ASC", "DESC"}
)
WITH_OPTIONS = ("num_partition", "num_replica", "defer_build", "nodes")


class SqlSyntaxError(ShardexError):
    default_code = ErrorCode.SQL_SYNTAX


@dataclass(frozen=True)
class CreateIndexStmt:
    """``keys`` are (canonical expression text, descending). ``name`` is None only for a
    primary index created without one (the coordinator names it ``#primary``)."""

    keyspace: str
    name: str | None
    keys: tuple[tuple[str, bool], ...] = ()
    where: str | None = None
    partition_by: tuple[str, ...] | None = None
    num_partition: int | None = None
    defer_build: bool = False
    nodes: tuple[str, ...] | None = None
    is_primary: bool = False
    num_replica: int = 0


@dataclass(frozen=True)
class BuildIndexStmt:
    keyspace: str
    names: tuple[str, ...]


@dataclass(frozen=True)
class DropIndexStmt:
    keyspace: str
    name: str | None  # None: the primary index, whatever its name
    is_primary: bool = False


DDLStatement = CreateIndexStmt | BuildIndexStmt | DropIndexStmt


class DDLParser(Parser):
    """Statement parser over the expression parser's tokens and helpers."""

    reserved = EXPRESSION_KEYWORDS | DDL_KEYWORDS

    @classmethod
    def for_text(cls, text: str) -> DDLParser:
        if not isinstance(text, str):
            raise TypeError(f"statement must be str, not {type(text).__name__}")
        try:
            tokens = tokenize(text)
        except ExpressionSyntaxError as e:  # lexer errors: same position details, DDL code
            raise SqlSyntaxError(e.message, details=e.details) from None
        return cls(tokens, text)

    def error(
        self, tok: Token, message: str | None = None, *, expected: str | None = None
    ) -> NoReturn:
        head = message or f"unexpected {tok.describe()}"
        msg = f"{head} at line {tok.line}, column {tok.column}"
        details: dict[str, Any] = {
            "line": tok.line,
            "column": tok.column,
            "token": tok.text,
            "text": self.text,
        }
        if expected:
            msg += f"; expected {expected}"
            details["expected"] = expected
        raise SqlSyntaxError(msg, details=details)

    # -- statements -------------------------------------------------------------------------

    def parse_statement(self) -> DDLStatement:
        tok = self.peek()
        stmt: DDLStatement
        if self.accept_keyword("CREATE"):
            stmt = self.parse_create()
        elif self.accept_keyword("BUILD"):
            stmt = self.parse_build()
        elif self.accept_keyword("DROP"):
            stmt = self.parse_drop()
        else:
            self.error(tok, expected="CREATE, BUILD or DROP")
        self.accept(";")
        if not self.at_end():
            self.error(self.peek(), expected="the end of the statement")
        return stmt

    def parse_create(self) -> CreateIndexStmt:
        primary = self.accept_keyword("PRIMARY") is not None
        self.expect_keyword("INDEX")
        name: str | None = None
        if not primary or not self.at_keyword("ON"):
            name = self.parse_name("index")
        self.expect_keyword("ON")
        keyspace = self.parse_name("keyspace")
        keys: list[tuple[str, bool]] = []
        if primary:
            if self.at_op("("):
                self.error(self.peek(), "a primary index takes no key list")
        else:
            keys = self.parse_keys()
        where: str | None = None
        partition_by: tuple[str, ...] | None = None
        using = False
        while True:
            tok = self.peek()
            if self.accept_keyword("WHERE"):
                if primary:
                    self.error(tok, "a primary index has no WHERE clause")
                if where is not None:
                    self.error(tok, "WHERE given twice")
                where = self.parse_expr().to_text()
            elif self.accept_keyword("PARTITION"):
                if partition_by is not None:
                    self.error(tok, "PARTITION BY given twice")
                partition_by = self.parse_partition_by()
            elif self.accept_keyword("USING"):
                if using:
                    self.error(tok, "USING given twice")
                gsi = self.peek()
                if gsi.upper != "GSI":
                    self.error(gsi, expected="GSI (the only index type)")
                self.advance()
                using = True
            else:
                break
        options: dict[str, Any] = {}
        if self.accept_keyword("WITH"):
            options = self.parse_with()
        nodes = options.get("nodes")
        return CreateIndexStmt(
            keyspace=keyspace,
            name=name,
            keys=tuple(keys),
            where=where,
            partition_by=partition_by,
            num_partition=options.get("num_partition"),
            defer_build=bool(options.get("defer_build", False)),
            nodes=tuple(nodes) if nodes is not None else None,
            is_primary=primary,
            num_replica=options.get("num_replica", 0),
        )

    def parse_build(self) -> BuildIndexStmt:
        self.expect_keyword("INDEX")
        self.expect_keyword("ON")
        keyspace = self.parse_name("keyspace")
        self.expect("(", "'(' and the index names")
        names: list[str] = []
        while True:
            tok = self.peek()
            name = self.parse_name("index")
            if name in names:
                self.error(tok, f"index {name!r} named twice")
            names.append(name)
            if not self.accept(","):
                break
        self.expect(")", "',' or ')'")
        return BuildIndexStmt(keyspace=keyspace, names=tuple(names))

    def parse_drop(self) -> DropIndexStmt:
        primary = self.accept_keyword("PRIMARY") is not None
        self.expect_keyword("INDEX")
        if primary:
            name = None if self.at_keyword("ON") else self.parse_name("index")
            self.expect_keyword("ON")
            return DropIndexStmt(keyspace=self.parse_name("keyspace"), name=name, is_primary=True)
        first = self.parse_name("keyspace or index")
        if self.accept("."):
            return DropIndexStmt(keyspace=first, name=self.parse_name("index"))
        if self.accept_keyword("ON"):
            return DropIndexStmt(keyspace=self.parse_name("keyspace"), name=first)
        self.error(self.peek(), expected="'.' and the index name, or ON and the keyspace")

    # -- parts ------------------------------------------------------------------------------

    def parse_name(self, what: str) -> str:
        """A keyspace or index name: a back-ticked identifier, or a plain one that is not a
        keyword, with ``-`` joins when nothing separates the pieces (``my-ks-2``)."""
        tok = self.peek()
        if tok.kind is TokenKind.QIDENT:
            self.advance()
            if not str(tok.value):
                self.error(tok, f"empty {what} name")
            return str(tok.value)
        if tok.kind is not TokenKind.IDENT:
            self.error(tok, expected=f"{_a(what)} {what} name")
        if tok.upper in self.reserved:
            self.error(
                tok,
                f"reserved word {tok.describe()} cannot be {_a(what)} {what} name "
                "(quote it with back-ticks)",
                expected=f"{_a(what)} {what} name",
            )
        self.advance()
        text, end = tok.text, tok.offset + len(tok.text)
        while self.at_op("-") and self.peek().offset == end:
            piece = self.peek(1)
            joinable = piece.kind is TokenKind.IDENT or (
                piece.kind is TokenKind.NUMBER and piece.text.isdigit()
            )
            if not joinable or piece.offset != end + 1:
                break
            self.advance()
            self.advance()
            text += "-" + piece.text
            end = piece.offset + len(piece.text)
        return text

    def parse_expr(self) -> Expr:
        first = self.peek()
        if self.at_end():
            self.error(first, expected="an expression")
        try:
            expr = self.parse_expression()
        except RecursionError:
            self.error(first, "expression is nested too deeply")
        self.check_depth(expr, first)
        return expr

    def parse_keys(self) -> list[tuple[str, bool]]:
        self.expect("(", "'(' and the index key expressions")
        keys: list[tuple[str, bool]] = []
        while True:
            expr = self.parse_key()
            desc = False
            if self.accept_keyword("DESC"):
                desc = True
            else:
                self.accept_keyword("ASC")
            keys.append((expr.to_text(), desc))
            if not self.accept(","):
                break
        self.expect(")", "ASC, DESC, ',' or ')'")
        return keys

    def parse_key(self) -> Expr:
        """One index key: an expression, or an array key at ``DISTINCT``/``ALL``."""
        if self.at_keyword("DISTINCT") or self.at_keyword("ALL"):
            return parse_array_key(self)
        return self.parse_expr()

    def parse_partition_by(self) -> tuple[str, ...]:
        self.expect_keyword("BY")
        tok = self.peek()
        if tok.upper != "HASH":
            self.error(tok, expected="HASH (the only partitioning scheme)")
        self.advance()
        self.expect("(", "'(' and the partition key expressions")
        exprs = self.comma_list(lambda: self.parse_expr().to_text())
        self.expect(")", "',' or ')'")
        return tuple(exprs)

    def parse_with(self) -> dict[str, Any]:
        self.expect("{", "'{' (WITH takes a JSON object)")
        options: dict[str, Any] = {}
        if self.accept("}"):
            return options
        while True:
            ktok = self.peek()
            if ktok.kind not in (TokenKind.STRING, TokenKind.IDENT, TokenKind.QIDENT):
                self.error(ktok, expected="an option name")
            self.advance()
            key = str(ktok.value)
            if key not in WITH_OPTIONS:
                self.error(ktok, f"unknown WITH option {key!r}", expected=", ".join(WITH_OPTIONS))
            if key in options:
                self.error(ktok, f"WITH option {key!r} given twice")
            self.expect(":", "':' after the option name")
            vtok = self.peek()
            expr = self.parse_expr()
            if not is_constant(expr):
                self.error(vtok, f"WITH option {key!r} must be a constant")
            options[key] = self._check_option(key, evaluate(expr, None), vtok)
            if not self.accept(","):
                break
        self.expect("}", "',' or '}'")
        return options

    def _check_option(self, key: str, value: Any, tok: Token) -> Any:
        if key == "num_partition":
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            if isinstance(value, bool) or not isinstance(value, int):
                self.error(tok, f"num_partition must be an integer, got {value!r}")
            if not 1 <= value <= MAX_INDEX_PARTITIONS:
                self.error(tok, f"num_partition must be in 1..{MAX_INDEX_PARTITIONS}, got {value}")
        elif key == "num_replica":
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            if isinstance(value, bool) or not isinstance(value, int):
                self.error(tok, f"num_replica must be an integer, got {value!r}")
            if not 0 <= value <= MAX_INDEX_REPLICAS:
                self.error(tok, f"num_replica must be in 0..{MAX_INDEX_REPLICAS}, got {value}")
        elif key == "defer_build":
            if not isinstance(value, bool):
                self.error(tok, f"defer_build must be true or false, got {value!r}")
        elif key == "nodes":
            if isinstance(value, str):
                value = [value]
            if not isinstance(value, list) or not value:
                self.error(tok, f"nodes must be a non-empty list of node names, got {value!r}")
            if not all(isinstance(n, str) and n for n in value):
                self.error(tok, f"nodes must be node names (strings), got {value!r}")
            if len(set(value)) != len(value):
                self.error(tok, f"nodes lists a node twice: {value!r}")
        return value


def _a(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"


def parse_ddl(text: str) -> DDLStatement:
    """Parse one DDL statement. Raises ``SqlSyntaxError`` (SQL_SYNTAX) naming line, column
    and token."""
    return DDLParser.for_text(text).parse_statement()


def parse_index_key(text: str) -> tuple[str, bool]:
    """One index key as the client API takes it: ``"age"``, ``"age DESC"``, ``"LOWER(n) ASC"``
    -> (canonical expression text, descending)."""
    p = DDLParser.for_text(text)
    expr = p.parse_key()
    desc = p.accept_keyword("DESC") is not None
    if not desc:
        p.accept_keyword("ASC")
    if not p.at_end():
        p.error(p.peek(), expected="ASC, DESC or the end of the key")
    return expr.to_text(), desc
