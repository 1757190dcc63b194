"""DB-API parameters to SQL++ parameters.

``shardex.dbapi`` declares ``paramstyle = "qmark"``: each ``?`` outside string literals,
quoted identifiers and comments becomes the next positional SQL++ parameter (``$1``,
``$2``, ...). SQL++'s own placeholders pass through unchanged: ``$1`` (the "numeric" style,
with a sequence of values) and ``$name`` (with a mapping). ``:1`` is not accepted because
``{"a":1}`` is an object constructor in SQL++. Mixing ``?`` with ``$1`` in one statement is
refused: which value goes where would be a guess.

The rewrite makes each ``?`` one or more characters longer, so a syntax error *after* a
rewritten ``?`` reports a column in the rewritten text (``details["text"]`` holds it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from shardex.core.expr.lexer import Lexer, Token, TokenKind
from shardex.dbapi.errors import ProgrammingError, from_shardex
from shardex.errors import ShardexError

__all__ = ["qmarks_to_dollars", "to_sqlpp"]

Params = Sequence[Any] | Mapping[str, Any] | None


class _QmarkLexer(Lexer):
    """The SQL++ lexer, plus ``?`` as a token (it skips strings and comments for us)."""

    def _operator(self) -> Token:
        if self.text[self.pos] == "?":
            tok = Token(TokenKind.OP, "?", "?", self.line, self.col, self.pos)
            self.pos += 1
            self.col += 1
            return tok
        return super()._operator()


def _tokens(operation: str) -> list[Token]:
    try:
        return _QmarkLexer(operation).tokenize()
    except ShardexError as e:
        raise from_shardex(e) from e


def to_sqlpp(operation: str, parameters: Params) -> tuple[str, list[Any] | dict[str, Any] | None]:
    """The SQL++ statement and parameters for a DB-API ``execute(operation, parameters)``."""
    sql, marks = qmarks_to_dollars(operation)
    values = _plain(parameters)
    if marks and (not isinstance(values, list) or len(values) != marks):
        given = "none" if values is None else f"{len(values)}"
        kind = "a mapping" if isinstance(values, dict) else given
        raise ProgrammingError(
            f"the statement has {marks} ? placeholder(s), {kind} supplied",
            details={"expected": marks, "hint": "pass a sequence with one value per ?, in order"},
        )
    return sql, values


def qmarks_to_dollars(operation: str) -> tuple[str, int]:
    """``operation`` with its ``?`` placeholders as ``$1``, ``$2``, ...; and their count."""
    if not isinstance(operation, str):
        raise ProgrammingError(
            f"the operation must be a str, got {type(operation).__name__}",
            details={"value": repr(operation)[:200]},
        )
    if "?" not in operation:  # fast path: nothing to rewrite
        return operation, 0
    tokens = _tokens(operation)
    marks = [t for t in tokens if t.kind is TokenKind.OP and t.text == "?"]
    if not marks:
        return operation, 0
    numbered = [t for t in tokens if t.kind is TokenKind.PARAM]
    if numbered:
        raise ProgrammingError(
            f"the statement mixes ? with {numbered[0].text} at line {numbered[0].line}, "
            f"column {numbered[0].column}",
            details={"hint": "use only ? (qmark) or only $1, $2 / $name placeholders"},
        )
    out = operation
    for k in range(len(marks), 0, -1):  # from the end: earlier offsets stay valid
        at = marks[k - 1].offset
        out = f"{out[:at]}${k}{out[at + 1 :]}"
    return out, len(marks)


def _plain(parameters: Params) -> list[Any] | dict[str, Any] | None:
    if parameters is None:
        return None
    if isinstance(parameters, Mapping):
        return {str(k).lstrip("$"): v for k, v in parameters.items()}
    if isinstance(parameters, str | bytes) or not isinstance(parameters, Sequence):
        raise ProgrammingError(
            f"parameters must be a sequence or a mapping, not {type(parameters).__name__}",
            details={"value": repr(parameters)[:200], "hint": "execute(sql, [value, ...])"},
        )
    return list(parameters)
