"""AST of the expression language.

Every node is a frozen, slotted dataclass: immutable (safe to share between threads and to
use as dict keys, e.g. for covering-index matching), picklable (Spark ships index definitions
to executors), and compared structurally. ``to_text()`` renders canonical SQL++ text that
re-parses to an equal AST: keywords and function names upper case, strings double quoted with
JSON escapes, identifiers back-ticked whenever they are not plain words or collide with any
SQL++ reserved word, and only the parentheses precedence requires.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, ClassVar

from shardex.core.values import MISSING

# -- precedence (higher binds tighter); mirrors N1QL's grammar ----------------------------

PREC_OR = 1
PREC_AND = 2
PREC_NOT = 3
PREC_EQ = 4  # = == != <>
PREC_CMP = 5  # < <= > >=
PREC_LIKE = 6
PREC_BETWEEN = 7
PREC_IN = 8
PREC_IS = 9
PREC_CONCAT = 10
PREC_ADD = 11
PREC_MUL = 12
PREC_UNARY = 13
PREC_POSTFIX = 14
PREC_ATOM = 15

BINARY_PRECEDENCE: dict[str, int] = {
    "||": PREC_CONCAT,
    "+": PREC_ADD,
    "-": PREC_ADD,
    "*": PREC_MUL,
    "/": PREC_MUL,
    "%": PREC_MUL,
    "=": PREC_EQ,
    "!=": PREC_EQ,
    "<": PREC_CMP,
    "<=": PREC_CMP,
    ">": PREC_CMP,
    ">=": PREC_CMP,
}
COMPARISON_OPS = frozenset({"=", "!=", "<", "<=", ">", ">="})
ARITHMETIC_OPS = frozenset({"+", "-", "*", "/", "%"})


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Words the expression parser itself treats as keywords (a bare identifier cannot be one).
EXPRESSION_KEYWORDS = _words(
    """
    AND OR NOT TRUE FALSE NULL MISSING LIKE BETWEEN IN IS VALUED KNOWN CASE WHEN THEN ELSE
    END
    """
)

# N1QL/SQL++ reserved words. The expression parser accepts most of them as field names, but
# to_text() back-ticks all of them so that canonical text stored today (index definitions)
# still parses once the SQL statement parser reserves the full set.
SQL_RESERVED_WORDS = EXPRESSION_KEYWORDS | _words(
    """
    ADVISE ALL ALTER ANALYZE ANY ARRAY AS ASC AT BEGIN BINARY BOOLEAN BREAK BUCKET BUILD
    BY CALL CAST CLUSTER COLLATE COLLECTION COMMIT COMMITTED CONNECT CONTINUE CORRELATED
    COVER CREATE CURRENT DATABASE DATASET DATASTORE DECLARE DECREMENT DEFAULT DELETE
    DERIVED DESC DESCRIBE DISTINCT DO DROP EACH ELEMENT EXCEPT EXCLUDE EXECUTE EXISTS
    EXPLAIN FETCH FILTER FIRST FLATTEN FLATTEN_KEYS FLUSH FOLLOWING FOR FORCE FROM FTS
    FUNCTION GOLANG GRANT GROUP GROUPS GSI HASH HAVING IF IGNORE ILIKE INCLUDE INCREMENT
    INDEX INFER INLINE INNER INSERT INTERSECT INTO ISOLATION JAVASCRIPT JOIN KEY KEYS
    KEYSPACE LANGUAGE LAST LATERAL LEFT LET LETTING LEVEL LIMIT LSM MAP MAPPING MATCHED
    MATERIALIZED MERGE MINUS NAMESPACE NEST NL NO NTH_VALUE NULLS NUMBER OBJECT OFFSET ON
    OPTION OPTIONS ORDER OTHERS OUTER OVER PARSE PARTITION PASSWORD PATH POOL PRECEDING
    PREPARE PRIMARY PRIVATE PRIVILEGE PROBE PROCEDURE PUBLIC RANGE RAW READ REALM
    RECURSIVE REDUCE RENAME RESPECT RESTRICT RETURN RETURNING REVOKE RIGHT ROLE ROLLBACK
    ROW ROWS SATISFIES SAVEPOINT SCHEMA SCOPE SELECT SELF SEMI SEQUENCE SET SHOW SOME
    START STATISTICS STRING SYSTEM TIES TO TRAN TRANSACTION TRIGGER TRUNCATE UNBOUNDED
    UNDER UNION UNIQUE UNKNOWN UNNEST UNSET UPDATE UPSERT USE USER USING VALIDATE VALUE
    VALUES VIA VIEW WHERE WHILE WINDOW WITH WITHIN WORK XOR
    """
)

_PLAIN_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def format_identifier(name: str) -> str:
    """Render a field or alias name so that it lexes back as exactly that name."""
    if _PLAIN_IDENT.match(name) and name.upper() not in SQL_RESERVED_WORDS:
        return name
    return quote_identifier(name)


def quote_identifier(name: str) -> str:
    # The lexer decodes backslash escapes inside back-ticks too, so double backslashes.
    return "`" + name.replace("\\", "\\\\").replace("`", "``") + "`"


def format_literal(value: Any) -> str:
    if value is MISSING:
        return "MISSING"
    if value is None:
        return "NULL"
    if value is True:
        return "TRUE"
    if value is False:
        return "FALSE"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"non-finite float {value!r} has no literal syntax")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    raise TypeError(f"not a scalar literal: {value!r}")


def _wrap(child: Expr, min_prec: int) -> str:
    text = child.to_text()
    return f"({text})" if child.precedence < min_prec else text


# -- nodes ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Expr:
    """Base of all expression nodes."""

    precedence: ClassVar[int] = PREC_ATOM

    def to_text(self) -> str:  # pragma: no cover - every subclass overrides
        raise NotImplementedError

    def children(self) -> tuple[Expr, ...]:
        return ()

    def __str__(self) -> str:
        return self.to_text()


@dataclass(frozen=True, slots=True, eq=False)
class Literal(Expr):
    """A scalar constant: None (NULL), bool, int, float, str, or MISSING."""

    value: Any

    # Python says 1 == 1.0 == True; the AST must not (TRUE and 1 are different literals).
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Literal):
            return NotImplemented
        return type(self.value) is type(other.value) and self.value == other.value

    def __hash__(self) -> int:
        return hash((type(self.value).__name__, self.value))

    @property
    def precedence(self) -> int:  # type: ignore[override]
        # "-2" starts with a prefix operator, so it must be wrapped where "-x" would be.
        v = self.value
        is_negative = (
            isinstance(v, int | float)
            and not isinstance(v, bool)
            and (v < 0 or (v == 0 and math.copysign(1.0, v) < 0))
        )
        return PREC_UNARY if is_negative else PREC_ATOM

    def to_text(self) -> str:
        return format_literal(self.value)


@dataclass(frozen=True, slots=True)
class ArrayConstruct(Expr):
    items: tuple[Expr, ...]

    def children(self) -> tuple[Expr, ...]:
        return self.items

    def to_text(self) -> str:
        return "[" + ", ".join(i.to_text() for i in self.items) + "]"


@dataclass(frozen=True, slots=True)
class ObjectConstruct(Expr):
    """``{name: value, ...}``; names are expressions (N1QL allows computed names)."""

    items: tuple[tuple[Expr, Expr], ...]

    def children(self) -> tuple[Expr, ...]:
        return tuple(e for pair in self.items for e in pair)

    def to_text(self) -> str:
        return "{" + ", ".join(f"{k.to_text()}: {v.to_text()}" for k, v in self.items) + "}"


@dataclass(frozen=True, slots=True)
class Identifier(Expr):
    """A leading name. Resolved against the evaluation root: by default a field of the
    document; the SQL layer binds keyspace aliases and LET variables by rewriting or by
    supplying a root object that maps aliases to documents."""

    name: str

    def to_text(self) -> str:
        return format_identifier(self.name)


@dataclass(frozen=True, slots=True)
class Field(Expr):
    """``base.name``: MISSING unless base is an object that has the field."""

    base: Expr
    name: str
    precedence: ClassVar[int] = PREC_POSTFIX

    def children(self) -> tuple[Expr, ...]:
        return (self.base,)

    def to_text(self) -> str:
        return f"{_wrap(self.base, PREC_POSTFIX)}.{format_identifier(self.name)}"


@dataclass(frozen=True, slots=True)
class Index(Expr):
    """``base[index]``: array element (negative counts from the end) or, with a string
    index, an object field. Anything else is MISSING."""

    base: Expr
    index: Expr
    precedence: ClassVar[int] = PREC_POSTFIX

    def children(self) -> tuple[Expr, ...]:
        return (self.base, self.index)

    def to_text(self) -> str:
        return f"{_wrap(self.base, PREC_POSTFIX)}[{self.index.to_text()}]"


@dataclass(frozen=True, slots=True)
class Slice(Expr):
    """``base[start:end]`` / ``base[start:]``: the elements from ``start`` up to (not
    including) ``end``; negative positions count from the end, out of range is NULL."""

    base: Expr
    start: Expr
    end: Expr | None = None
    precedence: ClassVar[int] = PREC_POSTFIX

    def children(self) -> tuple[Expr, ...]:
        return (self.base, self.start) if self.end is None else (self.base, self.start, self.end)

    def to_text(self) -> str:
        end = "" if self.end is None else self.end.to_text()
        return f"{_wrap(self.base, PREC_POSTFIX)}[{self.start.to_text()}:{end}]"


@dataclass(frozen=True, slots=True)
class Meta(Expr):
    """``META()`` or ``META(alias)``: the document's metadata object (id, cas, ...)."""

    keyspace: str | None = None

    def to_text(self) -> str:
        return "META()" if self.keyspace is None else f"META({format_identifier(self.keyspace)})"


@dataclass(frozen=True, slots=True)
class Param(Expr):
    """``$1`` (name "1") or ``$name``: a query parameter supplied at evaluation time."""

    name: str

    def to_text(self) -> str:
        return "$" + self.name


@dataclass(frozen=True, slots=True)
class Neg(Expr):
    operand: Expr
    precedence: ClassVar[int] = PREC_UNARY

    def children(self) -> tuple[Expr, ...]:
        return (self.operand,)

    def to_text(self) -> str:
        inner = _wrap(self.operand, PREC_UNARY)
        # "--" starts a comment and "-2" would fold into a literal: keep them apart.
        if inner.startswith("-") or (
            isinstance(self.operand, Literal) and isinstance(self.operand.value, int | float)
        ):
            inner = f"({inner})"
        return "-" + inner


@dataclass(frozen=True, slots=True)
class Not(Expr):
    operand: Expr
    precedence: ClassVar[int] = PREC_NOT

    def children(self) -> tuple[Expr, ...]:
        return (self.operand,)

    def to_text(self) -> str:
        return "NOT " + _wrap(self.operand, PREC_EQ)


@dataclass(frozen=True, slots=True)
class BinaryOp(Expr):
    """Arithmetic (+ - * / %), concatenation (||) and comparisons (= != < <= > >=)."""

    op: str
    left: Expr
    right: Expr

    @property
    def precedence(self) -> int:  # type: ignore[override]
        return BINARY_PRECEDENCE[self.op]

    def children(self) -> tuple[Expr, ...]:
        return (self.left, self.right)

    def to_text(self) -> str:
        p = BINARY_PRECEDENCE[self.op]
        # Comparisons do not chain (a = b = c is a syntax error), so both sides need p + 1.
        left_min = p + 1 if self.op in COMPARISON_OPS else p
        return f"{_wrap(self.left, left_min)} {self.op} {_wrap(self.right, p + 1)}"


@dataclass(frozen=True, slots=True)
class And(Expr):
    """``a AND b AND ...``: n-ary, so a long conjunction is one flat node (the planner wants
    the conjunct list, and depth stays small). ``(a AND b) AND c`` keeps its nesting."""

    operands: tuple[Expr, ...]
    precedence: ClassVar[int] = PREC_AND

    def __post_init__(self) -> None:
        if len(self.operands) < 2:
            raise ValueError("And needs at least two operands")

    def children(self) -> tuple[Expr, ...]:
        return self.operands

    def to_text(self) -> str:
        return " AND ".join(_wrap(o, PREC_AND + 1) for o in self.operands)


@dataclass(frozen=True, slots=True)
class Or(Expr):
    """``a OR b OR ...``, n-ary like And."""

    operands: tuple[Expr, ...]
    precedence: ClassVar[int] = PREC_OR

    def __post_init__(self) -> None:
        if len(self.operands) < 2:
            raise ValueError("Or needs at least two operands")

    def children(self) -> tuple[Expr, ...]:
        return self.operands

    def to_text(self) -> str:
        return " OR ".join(_wrap(o, PREC_OR + 1) for o in self.operands)


@dataclass(frozen=True, slots=True)
class Like(Expr):
    operand: Expr
    pattern: Expr
    negated: bool = False
    precedence: ClassVar[int] = PREC_LIKE

    def children(self) -> tuple[Expr, ...]:
        return (self.operand, self.pattern)

    def to_text(self) -> str:
        op = "NOT LIKE" if self.negated else "LIKE"
        return f"{_wrap(self.operand, PREC_LIKE + 1)} {op} {_wrap(self.pattern, PREC_LIKE + 1)}"


@dataclass(frozen=True, slots=True)
class Between(Expr):
    operand: Expr
    low: Expr
    high: Expr
    negated: bool = False
    precedence: ClassVar[int] = PREC_BETWEEN

    def children(self) -> tuple[Expr, ...]:
        return (self.operand, self.low, self.high)

    def to_text(self) -> str:
        op = "NOT BETWEEN" if self.negated else "BETWEEN"
        m = PREC_BETWEEN + 1
        return f"{_wrap(self.operand, m)} {op} {_wrap(self.low, m)} AND {_wrap(self.high, m)}"


@dataclass(frozen=True, slots=True)
class In(Expr):
    """``operand IN collection``. ``x IN (a, b)`` parses to an ArrayConstruct collection."""

    operand: Expr
    collection: Expr
    negated: bool = False
    precedence: ClassVar[int] = PREC_IN

    def children(self) -> tuple[Expr, ...]:
        return (self.operand, self.collection)

    def to_text(self) -> str:
        op = "NOT IN" if self.negated else "IN"
        return f"{_wrap(self.operand, PREC_IN + 1)} {op} {_wrap(self.collection, PREC_IN + 1)}"


IS_KINDS = ("NULL", "MISSING", "VALUED")


@dataclass(frozen=True, slots=True)
class IsCheck(Expr):
    """``operand IS [NOT] NULL | MISSING | VALUED`` (KNOWN parses as VALUED)."""

    operand: Expr
    kind: str
    negated: bool = False
    precedence: ClassVar[int] = PREC_IS

    def children(self) -> tuple[Expr, ...]:
        return (self.operand,)

    def to_text(self) -> str:
        neg = "NOT " if self.negated else ""
        return f"{_wrap(self.operand, PREC_IS + 1)} IS {neg}{self.kind}"


@dataclass(frozen=True, slots=True)
class Case(Expr):
    """Searched (subject None) or simple CASE. No ELSE means NULL."""

    subject: Expr | None
    whens: tuple[tuple[Expr, Expr], ...]
    default: Expr | None = None

    def children(self) -> tuple[Expr, ...]:
        out: list[Expr] = [] if self.subject is None else [self.subject]
        for cond, result in self.whens:
            out += (cond, result)
        if self.default is not None:
            out.append(self.default)
        return tuple(out)

    def to_text(self) -> str:
        parts = ["CASE"]
        if self.subject is not None:
            parts.append(self.subject.to_text())
        for cond, result in self.whens:
            parts.append(f"WHEN {cond.to_text()} THEN {result.to_text()}")
        if self.default is not None:
            parts.append(f"ELSE {self.default.to_text()}")
        parts.append("END")
        return " ".join(parts)


@dataclass(frozen=True, slots=True)
class FunctionCall(Expr):
    """A call of a registered function; ``name`` is the canonical upper-case name."""

    name: str
    args: tuple[Expr, ...]

    def children(self) -> tuple[Expr, ...]:
        return self.args

    def to_text(self) -> str:
        plain = _PLAIN_IDENT.match(self.name) and self.name.upper() not in EXPRESSION_KEYWORDS
        name = self.name if plain else quote_identifier(self.name)
        return f"{name}(" + ", ".join(a.to_text() for a in self.args) + ")"


def walk(expr: Expr):  # type: ignore[no-untyped-def]
    """Yield ``expr`` and all its descendants, parents first."""
    stack = [expr]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(node.children()))


def depth(expr: Expr) -> int:
    """Height of the tree (a leaf is 1), computed without recursion."""
    best = 0
    stack = [(expr, 1)]
    while stack:
        node, d = stack.pop()
        best = max(best, d)
        stack.extend((child, d + 1) for child in node.children())
    return best
