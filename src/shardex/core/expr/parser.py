"""Pratt (precedence-climbing) parser for SQL++ expressions.

``Parser`` is meant to be extended by the SQL statement parser: it works on a token list, the
token helpers (``peek``, ``advance``, ``accept``, ``expect``, ``accept_keyword``,
``expect_keyword``, ``at_keyword``, ``error``) are public, ``reserved`` (words that cannot be
bare identifiers) is a class attribute a subclass widens, and ``parse_primary`` /
``parse_in_rhs`` are the hooks for new prefix forms (subqueries, ANY/EVERY, ...).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NoReturn, TypeVar

from shardex.core.values import MISSING
from shardex.errors import ExpressionSyntaxError

from .ast import (
    BINARY_PRECEDENCE,
    EXPRESSION_KEYWORDS,
    PREC_AND,
    PREC_BETWEEN,
    PREC_EQ,
    PREC_IN,
    PREC_IS,
    PREC_LIKE,
    PREC_OR,
    PREC_UNARY,
    And,
    ArrayConstruct,
    Between,
    BinaryOp,
    Case,
    Expr,
    Field,
    FunctionCall,
    Identifier,
    In,
    Index,
    IsCheck,
    Like,
    Literal,
    Meta,
    Neg,
    Not,
    ObjectConstruct,
    Or,
    Param,
    Slice,
    depth,
)
from .functions import FUNCTIONS, FunctionSpec
from .lexer import Token, TokenKind, syntax_error, tokenize

T = TypeVar("T")


def like_with_backslash(pattern: str, escape: str) -> str:
    """A LIKE pattern whose escape character is ``escape`` written with backslash escapes:
    ``escape`` before a character makes it literal, a backslash is itself literal."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == escape and i + 1 < n:
            nxt = pattern[i + 1]
            out.append("\\" + nxt if nxt in "%_\\" else nxt)
            i += 2
            continue
        out.append("\\\\" if c == "\\" else c)
        i += 1
    return "".join(out)


# Operators written more than one way; the AST keeps one spelling.
_OP_ALIASES = {"==": "=", "<>": "!="}
_NONASSOC = frozenset({PREC_EQ, PREC_EQ + 1, PREC_LIKE, PREC_BETWEEN, PREC_IN, PREC_IS})
_KEYWORD_LITERALS: dict[str, object] = {
    "TRUE": True,
    "FALSE": False,
    "NULL": None,
    "MISSING": MISSING,
}


class Parser:
    """Parses one expression from a token list (see ``parse_expression`` for the one-shot)."""

    reserved: frozenset[str] = EXPRESSION_KEYWORDS
    max_depth: int = 128

    def __init__(
        self,
        tokens: list[Token],
        text: str = "",
        functions: Mapping[str, FunctionSpec] | None = None,
    ) -> None:
        if not tokens or tokens[-1].kind is not TokenKind.EOF:
            raise ValueError("token list must end with an EOF token")
        self.tokens = tokens
        self.pos = 0
        self.text = text
        self.functions = FUNCTIONS if functions is None else functions

    @classmethod
    def from_text(cls, text: str, **kwargs: object) -> Parser:
        return cls(tokenize(text), text, **kwargs)  # type: ignore[arg-type]

    # -- token helpers ----------------------------------------------------------------------

    def peek(self, ahead: int = 0) -> Token:
        tokens = self.tokens
        i = self.pos + ahead
        return tokens[i] if i < len(tokens) else tokens[-1]

    def advance(self) -> Token:
        tok = self.tokens[self.pos]
        if tok.kind is not TokenKind.EOF:
            self.pos += 1
        return tok

    def at_op(self, op: str, ahead: int = 0) -> bool:
        tok = self.peek(ahead)
        return tok.kind is TokenKind.OP and tok.text == op

    def accept(self, op: str) -> Token | None:
        if self.at_op(op):
            return self.advance()
        return None

    def expect(self, op: str, what: str | None = None) -> Token:
        if self.at_op(op):
            return self.advance()
        self.error(self.peek(), expected=what or repr(op))

    def comma_list(self, item: Callable[[], T]) -> list[T]:
        """``item`` parsed once, then again after each comma (``a, b, c``)."""
        items = [item()]
        while self.accept(","):
            items.append(item())
        return items

    def expression_list(self, close: str) -> list[Expr]:
        """Expressions separated by commas up to the closing ``close`` (taken), maybe none:
        array items, call arguments."""
        if self.accept(close):
            return []
        items = self.comma_list(self.parse_expression)
        self.expect(close, f"',' or '{close}'")
        return items

    def at_keyword(self, word: str, ahead: int = 0) -> bool:
        """True if the token is the (case-insensitive) word ``word``; back-ticked identifiers
        are never keywords."""
        return self.peek(ahead).upper == word.upper()

    def accept_keyword(self, word: str) -> Token | None:
        if self.at_keyword(word):
            return self.advance()
        return None

    def expect_keyword(self, word: str) -> Token:
        if self.at_keyword(word):
            return self.advance()
        self.error(self.peek(), expected=word.upper())

    def at_end(self) -> bool:
        return self.peek().kind is TokenKind.EOF

    def error(
        self, tok: Token, message: str | None = None, *, expected: str | None = None
    ) -> NoReturn:
        """Raise ExpressionSyntaxError pointing at ``tok``."""
        head = message or f"unexpected {tok.describe()}"
        msg = f"{head} at line {tok.line}, column {tok.column}"
        extra: dict[str, object] = {}
        if expected:
            msg += f"; expected {expected}"
            extra["expected"] = expected
        raise syntax_error(msg, self.text, tok.line, tok.column, tok.text, **extra)

    # -- entry points -----------------------------------------------------------------------

    def parse_complete(self) -> Expr:
        """One expression spanning all tokens (trailing garbage is an error)."""
        if self.at_end():
            self.error(self.peek(), "empty expression")
        first = self.peek()
        try:
            expr = self.parse_expression()
        except RecursionError:
            self.error(self.peek(), "expression is nested too deeply")
        if not self.at_end():
            self.error(self.peek(), expected="an operator or the end of the expression")
        self.check_depth(expr, first)
        return expr

    def check_depth(self, expr: Expr, at: Token) -> None:
        """Reject trees deeper than ``max_depth``: evaluation, compilation, to_text and
        pickling all recurse per level. Long AND/OR chains are flat and do not count."""
        d = depth(expr)
        if d > self.max_depth:
            self.error(at, f"expression is nested too deeply (depth {d}, limit {self.max_depth})")

    def parse_expression(self, min_prec: int = PREC_OR) -> Expr:
        left = self.parse_prefix()
        last_nonassoc = 0
        # Operands of an AND/OR chain built by this loop; a parenthesized (a AND b) that
        # arrives as ``left`` stays a nested node, so to_text round-trips exactly.
        chain: list[Expr] | None = None
        while True:
            tok = self.peek()
            prec, negated = self._infix_precedence(tok)
            if prec < min_prec:
                return left
            if prec in _NONASSOC and prec == last_nonassoc:
                self.error(
                    tok,
                    f"{tok.describe()} cannot follow another operator of the same "
                    "kind without parentheses",
                )
            if prec in (PREC_AND, PREC_OR):
                node_type = And if prec == PREC_AND else Or
                self.advance()
                right = self.parse_expression(prec + 1)
                if chain is not None and type(left) is node_type:
                    chain.append(right)
                else:
                    chain = [left, right]
                left = node_type(tuple(chain))
            else:
                chain = None
                left = self.parse_infix(left, prec, negated)
            last_nonassoc = prec if prec in _NONASSOC else 0

    # -- prefix forms -------------------------------------------------------------------------

    def parse_prefix(self) -> Expr:
        tok = self.peek()
        if tok.kind is TokenKind.OP and tok.text == "-":
            self.advance()
            nxt = self.peek()
            # "-2" is the literal -2 (so canonical text of negative constants round-trips),
            # unless a postfix operator follows: "-2.x" is -(2.x).
            if nxt.kind is TokenKind.NUMBER and not (self.at_op(".", 1) or self.at_op("[", 1)):
                self.advance()
                return Literal(-nxt.value)  # type: ignore[operator]
            return Neg(self.parse_expression(PREC_UNARY))
        if tok.upper == "NOT":
            self.advance()
            return Not(self.parse_expression(PREC_EQ))
        return self.parse_postfix(self.parse_primary())

    def parse_primary(self) -> Expr:
        tok = self.peek()
        kind = tok.kind
        if kind is TokenKind.NUMBER or kind is TokenKind.STRING:
            self.advance()
            return Literal(tok.value)
        if kind is TokenKind.PARAM:
            self.advance()
            return Param(str(tok.value))
        if kind is TokenKind.QIDENT:
            self.advance()
            if self.at_op("("):
                return self.parse_call(tok, str(tok.value))
            return Identifier(str(tok.value))
        if kind is TokenKind.IDENT:
            word = tok.upper
            if word in _KEYWORD_LITERALS:
                self.advance()
                return Literal(_KEYWORD_LITERALS[word])
            if word == "CASE":
                return self.parse_case()
            if word in EXPRESSION_KEYWORDS:
                self.error(tok, expected="an expression")
            if self.at_op("(", 1):
                self.advance()
                if word == "META":
                    return self.parse_meta()
                return self.parse_call(tok, tok.text)
            if word in self.reserved:
                self.error(
                    tok,
                    f"reserved word {tok.describe()} cannot be used as an identifier "
                    "(quote it with back-ticks)",
                )
            self.advance()
            return Identifier(tok.text)
        if kind is TokenKind.OP:
            if tok.text == "(":
                self.advance()
                inner = self.parse_expression()
                self.expect(")")
                return inner
            if tok.text == "[":
                return self.parse_array()
            if tok.text == "{":
                return self.parse_object()
        self.error(tok, expected="an expression")

    def postfix_ends(self) -> bool:
        """Whether the postfix chain stops here although a '.' or '[' follows (the SQL parser
        leaves ``expr.*`` to its projection terms)."""
        return False

    def parse_postfix(self, base: Expr) -> Expr:
        while True:
            if self.postfix_ends():
                return base
            if self.at_op("."):
                self.advance()
                tok = self.peek()
                # After a dot any word is a field name, keywords included (a.`end` == a.end).
                if tok.kind is TokenKind.IDENT or tok.kind is TokenKind.QIDENT:
                    self.advance()
                    base = Field(base, str(tok.value))
                else:
                    self.error(tok, expected="a field name after '.'")
            elif self.at_op("["):
                self.advance()
                if self.at_op("*") and self.at_op("]", 1):  # a[*] is ARRAY_STAR(a)
                    self.advance()
                    self.advance()
                    base = FunctionCall("ARRAY_STAR", (base,))
                    continue
                index = self.parse_expression()
                if self.accept(":"):  # a slice: base[start:end] or base[start:]
                    end = None if self.at_op("]") else self.parse_expression()
                    self.expect("]")
                    base = Slice(base, index, end)
                    continue
                self.expect("]")
                base = Index(base, index)
            else:
                return base

    def parse_array(self) -> Expr:
        self.expect("[")
        return ArrayConstruct(tuple(self.expression_list("]")))

    def parse_object(self) -> Expr:
        self.expect("{")
        pairs: list[tuple[Expr, Expr]] = []
        seen: set[str] = set()
        if not self.accept("}"):
            while True:
                key_tok = self.peek()
                key = self.parse_expression()
                value: Expr | None = None
                if not self.at_op(":") and isinstance(key, Identifier | Field):
                    # N1QL's implicit name: ``{o.id, total}`` is ``{"id": o.id, "total":
                    # total}``, the last step of the path names the field.
                    key, value = Literal(key.name), key
                if isinstance(key, Literal) and isinstance(key.value, str):
                    if key.value in seen:
                        self.error(key_tok, f"duplicate object key {key.value!r}")
                    seen.add(key.value)
                if value is None:
                    self.expect(":", "':' after an object key")
                    value = self.parse_expression()
                pairs.append((key, value))
                if not self.accept(","):
                    break
            self.expect("}", "',' or '}'")
        return ObjectConstruct(tuple(pairs))

    def parse_like_escape(self, pattern: Expr) -> Expr:
        """``LIKE pattern ESCAPE 'c'``: the pattern rewritten to the backslash escapes LIKE
        reads (so index range planning and both evaluators see one form)."""
        self.advance()
        tok = self.advance()
        escape = str(tok.value)
        if len(escape) != 1:
            self.error(tok, f"ESCAPE takes one character, not {tok.describe()}")
        if escape == "\\":
            return pattern
        if not (isinstance(pattern, Literal) and type(pattern.value) is str):
            self.error(
                tok,
                "ESCAPE with a character other than a backslash needs a constant pattern",
                expected="a string literal pattern, or the default escape \\",
            )
        return Literal(like_with_backslash(pattern.value, escape))

    def parse_meta(self) -> Expr:
        self.expect("(")
        keyspace: str | None = None
        tok = self.peek()
        if tok.kind is TokenKind.IDENT or tok.kind is TokenKind.QIDENT:
            self.advance()
            keyspace = str(tok.value)
        self.expect(")", "')' (META takes at most a keyspace alias)")
        return Meta(keyspace)

    def parse_call(self, name_tok: Token, name: str) -> Expr:
        spec = self.functions.get(name.upper())
        if spec is None:
            self.error(name_tok, f"unknown function {name!r}")
        self.expect("(")
        args = self.expression_list(")")
        n = len(args)
        if n < spec.min_args or (spec.max_args is not None and n > spec.max_args):
            self.error(
                name_tok,
                f"function {spec.name} takes {spec.arity_text()}, got {n}",
            )
        return FunctionCall(spec.name, tuple(args))

    def parse_case(self) -> Expr:
        self.expect_keyword("CASE")
        subject = None if self.at_keyword("WHEN") else self.parse_expression()
        whens: list[tuple[Expr, Expr]] = []
        while self.accept_keyword("WHEN"):
            cond = self.parse_expression()
            self.expect_keyword("THEN")
            whens.append((cond, self.parse_expression()))
        if not whens:
            self.error(self.peek(), expected="WHEN")
        default = self.parse_expression() if self.accept_keyword("ELSE") else None
        if not self.at_keyword("END"):
            self.error(self.peek(), expected="WHEN, ELSE or END")
        self.advance()
        return Case(subject, tuple(whens), default)

    # -- infix forms --------------------------------------------------------------------------

    def _infix_precedence(self, tok: Token) -> tuple[int, bool]:
        """Binding power of ``tok`` as an infix/postfix operator (0 if it is none)."""
        if tok.kind is TokenKind.OP:
            op = _OP_ALIASES.get(tok.text, tok.text)
            return BINARY_PRECEDENCE.get(op, 0), False
        word = tok.upper
        if word == "AND":
            return PREC_AND, False
        if word == "OR":
            return PREC_OR, False
        if word == "LIKE":
            return PREC_LIKE, False
        if word == "BETWEEN":
            return PREC_BETWEEN, False
        if word == "IN":
            return PREC_IN, False
        if word == "IS":
            return PREC_IS, False
        if word == "NOT":
            nxt = self.peek(1).upper
            if nxt == "LIKE":
                return PREC_LIKE, True
            if nxt == "BETWEEN":
                return PREC_BETWEEN, True
            if nxt == "IN":
                return PREC_IN, True
        return 0, False

    def parse_infix(self, left: Expr, prec: int, negated: bool) -> Expr:
        tok = self.advance()
        if negated:
            tok = self.advance()  # NOT was consumed; tok is LIKE/BETWEEN/IN
        if tok.kind is TokenKind.OP:
            op = _OP_ALIASES.get(tok.text, tok.text)
            # Comparisons are non-associative; arithmetic and || are left-associative.
            return BinaryOp(op, left, self.parse_expression(prec + 1))
        word = tok.upper
        if word == "LIKE":
            pattern = self.parse_expression(PREC_LIKE + 1)
            if self.at_keyword("ESCAPE") and self.peek(1).kind is TokenKind.STRING:
                pattern = self.parse_like_escape(pattern)
            return Like(left, pattern, negated)
        if word == "BETWEEN":
            low = self.parse_expression(PREC_BETWEEN + 1)
            self.expect_keyword("AND")
            high = self.parse_expression(PREC_BETWEEN + 1)
            return Between(left, low, high, negated)
        if word == "IN":
            return In(left, self.parse_in_rhs(), negated)
        if word == "IS":
            is_not = self.accept_keyword("NOT") is not None
            kind_tok = self.peek()
            kind = kind_tok.upper
            if kind == "KNOWN":
                kind = "VALUED"
            if kind not in ("NULL", "MISSING", "VALUED"):
                self.error(kind_tok, expected="NULL, MISSING, VALUED or KNOWN after IS")
            self.advance()
            return IsCheck(left, kind, is_not)
        self.error(tok)  # pragma: no cover - _infix_precedence only admits the words above

    def parse_in_rhs(self) -> Expr:
        """Right side of IN.

        ``IN (a, b, ...)`` is a list, the same as ``IN [a, b, ...]``. A single parenthesized
        element is a list too when it is a constant scalar (``IN ('x')``), since IN over a
        non-array is always NULL; otherwise ``(expr)`` is an ordinary parenthesized
        expression whose value must be an array, as in N1QL (``IN (SELECT ...)``, ``IN
        ($ids)``).
        """
        if self.at_op("("):
            start = self.pos
            self.advance()
            items = self.comma_list(self.parse_expression)
            self.expect(")", "',' or ')'")
            nxt_prec, _ = self._infix_precedence(self.peek())
            continues = nxt_prec > PREC_IN or self.at_op(".") or self.at_op("[")
            if len(items) > 1:
                if continues:
                    self.error(self.peek(), expected="the end of the IN list")
                return ArrayConstruct(tuple(items))
            if isinstance(items[0], Literal) and not continues:
                return ArrayConstruct(tuple(items))
            self.pos = start  # an ordinary parenthesized expression: parse it as one
        return self.parse_expression(PREC_IN + 1)


def parse_expression(text: str, *, functions: Mapping[str, FunctionSpec] | None = None) -> Expr:
    """Parse SQL++ expression text into an AST.

    Raises ExpressionSyntaxError whose message names line, column and offending token, and
    whose ``details`` carry ``line``, ``column``, ``token`` and ``text``.
    """
    if not isinstance(text, str):
        raise TypeError(f"expression text must be str, not {type(text).__name__}")
    return Parser(tokenize(text), text, functions).parse_complete()


__all__ = ["ExpressionSyntaxError", "Parser", "parse_expression"]
