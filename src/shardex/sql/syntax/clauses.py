"""The clause parsers every SQL++ statement shares (result terms, aliases, FROM and DML
targets, LET bindings, ORDER BY, RETURNING, SET/UNSET paths and ``SET ... FOR``), and the
statement keywords. ``SqlParser`` (``parser.py``) builds its statements from them."""

from __future__ import annotations

from shardex.core.expr import Expr, Field, Identifier, Index, Literal, TokenKind
from shardex.core.expr.ast import EXPRESSION_KEYWORDS
from shardex.sql.ddl import DDL_KEYWORDS, DDLParser

from .ast import SELF_NAME, KeyspaceRef, OrderTerm, ResultTerm
from .parse_windows import at_window_clause
from .update_for import ForSet

__all__ = ["CLAUSE_WORDS", "SQL_KEYWORDS", "ClauseParser", "implied_alias"]

SQL_KEYWORDS = frozenset(
    {
        "SELECT",
        "FROM",
        "WHERE",
        "GROUP",
        "HAVING",
        "ORDER",
        "LIMIT",
        "OFFSET",
        "AS",
        "LET",
        "LETTING",
        "RAW",
        "VALUE",
        "ELEMENT",
        "DISTINCT",
        "ALL",
        "INSERT",
        "UPSERT",
        "DELETE",
        "UPDATE",
        "SET",
        "UNSET",
        "INTO",
        "VALUES",
        "KEY",
        "KEYS",
        "USE",
        "SATISFIES",
        "ANY",
        "SOME",
        "EVERY",
        "ARRAY",
        "FIRST",
        "FOR",
        "WITHIN",
        "EXPLAIN",
        "NULLS",
        "RETURNING",
        "UNION",
        "INTERSECT",
        "EXCEPT",
        "JOIN",
        "NEST",
        "UNNEST",
    }
)

# Words that end a projection term / FROM clause when no AS precedes an alias.
CLAUSE_WORDS = SQL_KEYWORDS | DDL_KEYWORDS | EXPRESSION_KEYWORDS


class ClauseParser(DDLParser):
    """Clauses over the DDL and expression parsers' tokens and helpers."""

    reserved = EXPRESSION_KEYWORDS | DDL_KEYWORDS | SQL_KEYWORDS

    def parse_for_set(self, path: Expr, value: Expr) -> ForSet:
        """The rest of ``SET path = value FOR v IN array [WHEN cond] END``."""
        tok = self.peek()
        var = self.parse_alias()
        if self.at_keyword("WITHIN"):
            self.error(self.peek(), f"SET ... FOR {var} WITHIN is not supported", expected="IN")
        self.expect_keyword("IN")
        source = self.parse_expr()
        when = self.parse_expr() if self.accept_keyword("WHEN") else None
        self.expect_keyword("END")
        root = path
        while isinstance(root, Field | Index):
            root = root.base
        if not (isinstance(root, Identifier) and root.name == var):
            self.error(
                tok,
                f"the path {path.to_text()} of SET ... FOR {var} must start with {var}",
                expected=f"{var}.field = value FOR {var} IN ...",
            )
        return ForSet(value, var, source, when)

    def parse_set_unset(self) -> tuple[tuple[tuple[Expr, Expr], ...], tuple[Expr, ...]]:
        """``[SET path = expr {, ...}] [UNSET path {, ...}]``, at least one of them (UPDATE
        and MERGE's WHEN MATCHED THEN UPDATE)."""
        sets: list[tuple[Expr, Expr]] = []
        unsets: list[Expr] = []

        def assignment() -> tuple[Expr, Expr]:
            path = self.parse_path()
            self.expect("=", "'=' and the new value")
            value = self.parse_expr()
            if self.accept_keyword("FOR"):
                value = self.parse_for_set(path, value)
            return path, value

        if self.accept_keyword("SET"):
            sets = self.comma_list(assignment)
        if self.accept_keyword("UNSET"):
            unsets = self.comma_list(self.parse_path)
        if not sets and not unsets:
            self.error(self.peek(), expected="SET or UNSET")
        return tuple(sets), tuple(unsets)

    def parse_terms(self) -> tuple[ResultTerm, ...]:
        return tuple(self.comma_list(self.parse_term))

    def parse_term(self) -> ResultTerm:
        if self.accept("*"):
            return ResultTerm(None, star=True)
        expr = self.parse_expr()
        if self.at_op(".") and self.at_op("*", 1):
            self.advance()
            self.advance()
            return ResultTerm(expr, star=True)
        return ResultTerm(expr, self.parse_optional_alias())

    def parse_optional_alias(self) -> str | None:
        if self.accept_keyword("AS"):
            return self.parse_alias()
        tok = self.peek()
        if self.at_unnest_prefix() or at_window_clause(self):
            return None
        if tok.kind is TokenKind.QIDENT or (
            tok.kind is TokenKind.IDENT and tok.upper not in CLAUSE_WORDS
        ):
            return self.parse_alias()
        return None

    def at_unnest_prefix(self) -> bool:
        """At ``LEFT [OUTER]``, ``RIGHT [OUTER]`` or ``INNER`` before UNNEST, JOIN or NEST
        (LEFT, RIGHT and INNER are not reserved: they stay usable as names elsewhere)."""
        if self.peek().kind is not TokenKind.IDENT:
            return False
        word, nxt = self.peek().upper, self.peek(1).upper
        terms = ("UNNEST", "JOIN", "NEST")
        return (word in ("LEFT", "RIGHT") and nxt in ("OUTER", *terms)) or (
            word == "INNER" and nxt in terms
        )

    def parse_alias(self) -> str:
        tok = self.peek()
        if tok.kind is TokenKind.QIDENT:
            self.advance()
            return str(tok.value)
        if tok.kind is TokenKind.IDENT and tok.upper not in self.reserved:
            self.advance()
            return tok.text
        if tok.kind is TokenKind.IDENT:
            self.error(
                tok,
                f"reserved word {tok.describe()} cannot be an alias (quote it with back-ticks)",
                expected="an alias",
            )
        self.error(tok, expected="an alias")

    def parse_from(self) -> KeyspaceRef:
        # An expression term: a literal or parenthesised value, or a path into a variable
        # (``FROM o.lines`` in a subquery over its outer row's ``o``).
        path_start = self.peek().kind in (TokenKind.IDENT, TokenKind.QIDENT) and (
            self.at_op(".", 1) or self.at_op("[", 1)
        )
        if self.at_op("(") or self.at_op("[") or self.at_op("{") or path_start:
            source = self.parse_expr()
            alias = self.parse_optional_alias() or implied_alias(source)
            if alias is None:
                self.error(self.peek(), "an expression in FROM needs an alias", expected="AS")
            return KeyspaceRef("", alias, source=source)
        return self.parse_target()

    def parse_target(self) -> KeyspaceRef:
        name = self.parse_name("keyspace")
        alias = self.parse_optional_alias()
        use_index: tuple[str, ...] = ()
        use_keys: Expr | None = None
        while self.accept_keyword("USE"):
            if self.accept_keyword("INDEX"):
                self.expect("(", "'(' and index names")
                names = self.comma_list(lambda: self.parse_name("index"))
                if self.accept_keyword("USING"):
                    self.expect_keyword("GSI")
                self.expect(")", "',' or ')'")
                use_index = tuple(names)
            elif self.accept_keyword("KEYS"):
                use_keys = self.parse_expr()
            else:
                self.error(self.peek(), expected="INDEX or KEYS after USE")
        return KeyspaceRef(name, alias, use_index=use_index, use_keys=use_keys)

    def parse_bindings(self) -> tuple[tuple[str, Expr], ...]:
        out: list[tuple[str, Expr]] = []
        while True:
            name = self.parse_alias()
            if any(n == name for n, _ in out):
                self.error(self.tokens[self.pos - 1], f"variable {name!r} bound twice")
            self.expect("=", "'=' and the value")
            out.append((name, self.parse_expr()))
            if not self.accept(","):
                return tuple(out)

    def parse_expr_list(self) -> list[Expr]:
        return self.comma_list(self.parse_expr)

    def parse_order_by(self) -> tuple[OrderTerm, ...]:
        self.expect_keyword("ORDER")
        self.expect_keyword("BY")
        terms: list[OrderTerm] = []
        while True:
            expr = self.parse_expr()
            desc = False
            if self.accept_keyword("DESC"):
                desc = True
            else:
                self.accept_keyword("ASC")
            nulls_first: bool | None = None
            if self.accept_keyword("NULLS"):
                tok = self.peek()
                if tok.upper not in ("FIRST", "LAST"):
                    self.error(tok, expected="FIRST or LAST after NULLS")
                self.advance()
                nulls_first = tok.upper == "FIRST"
            terms.append(OrderTerm(expr, desc, nulls_first))
            if not self.accept(","):
                return tuple(terms)

    def parse_returning(self) -> tuple[ResultTerm, ...]:
        if not self.accept_keyword("RETURNING"):
            return ()
        if self.peek().upper in ("RAW", "VALUE", "ELEMENT"):
            self.error(self.peek(), "RETURNING RAW is not supported", expected="result terms")
        return self.parse_terms()

    def parse_path(self) -> Expr:
        """A document path for SET/UNSET: ``a``, ``a.b``, ``a[0].c`` (constant indexes)."""
        tok = self.peek()
        expr = self.parse_postfix(self.parse_primary())
        node = expr
        while isinstance(node, Field | Index):
            if isinstance(node, Index) and not isinstance(node.index, Literal):
                self.error(tok, "a SET/UNSET path may only use constant array positions")
            node = node.base
        if not isinstance(node, Identifier):
            self.error(tok, f"{expr.to_text()} is not a document path", expected="a field path")
        if node.name == SELF_NAME:
            self.error(
                tok,
                "SELF is the whole document, not a field: SET/UNSET need a field path "
                "(a field named self is written `self`)",
                expected="a field path",
            )
        return expr


def implied_alias(expr: Expr) -> str | None:
    """The alias a FROM or UNNEST term gets without AS: its path's last field name."""
    if isinstance(expr, Field):
        return expr.name
    if isinstance(expr, Identifier) and expr.name != SELF_NAME:
        return expr.name
    return None
