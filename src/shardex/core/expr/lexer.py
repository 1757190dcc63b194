"""Tokenizer for the SQL++ expression language.

Hand-written rather than regex-table driven so that every error carries the exact line and
column of the offending character, and so the SQL statement parser can reuse the same token
stream (keywords are not decided here: a word is an ``IDENT`` and the parser decides whether
it is a keyword in that position, which keeps SQL-only words usable as field names in index
expressions).
"""

from __future__ import annotations

import enum
import math
import sys
from dataclasses import dataclass
from typing import NoReturn

from shardex.errors import ExpressionSyntaxError

# An integer literal of more digits is past the largest double (~1.8e308) whatever its digits.
_MAX_INT_DIGITS = 309
_SHOWN_NUMBER_CHARS = 40  # an error quotes at most this much of a (possibly huge) literal


class TokenKind(enum.Enum):
    IDENT = "identifier"  # plain word: identifier or keyword, decided by the parser
    QIDENT = "quoted identifier"  # `back ticked`
    NUMBER = "number"
    STRING = "string"
    PARAM = "parameter"  # $1 or $name
    OP = "operator"  # punctuation and operators
    EOF = "end of input"


@dataclass(frozen=True, slots=True)
class Token:
    kind: TokenKind
    text: str  # the raw source text of the token
    value: object  # decoded value: str for words/strings/params/ops, int|float for numbers
    line: int  # 1-based
    column: int  # 1-based, counted in characters
    offset: int  # 0-based character offset into the source

    @property
    def upper(self) -> str:
        """Upper-cased word, for case-insensitive keyword checks (only meaningful for IDENT)."""
        return self.text.upper() if self.kind is TokenKind.IDENT else ""

    def describe(self) -> str:
        if self.kind is TokenKind.EOF:
            return "end of input"
        return repr(self.text) if len(self.text) <= 40 else repr(self.text[:37] + "...")


# Longest first so that "<=" wins over "<".
_OPERATORS = (
    "||",
    "<=",
    ">=",
    "<>",
    "!=",
    "==",
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    ",",
    ".",
    ":",
    "+",
    "-",
    "*",
    "/",
    "%",
    "=",
    "<",
    ">",
    ";",
)

_OPERATOR_SET = frozenset(_OPERATORS)

_SIMPLE_ESCAPES = {
    '"': '"',
    "'": "'",
    "`": "`",
    "\\": "\\",
    "/": "/",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
}


def _is_ident_start(ch: str) -> bool:
    return ch == "_" or ("a" <= ch <= "z") or ("A" <= ch <= "Z")


def _is_ident_char(ch: str) -> bool:
    return _is_ident_start(ch) or ("0" <= ch <= "9")


def _is_digit(ch: str) -> bool:
    return "0" <= ch <= "9"


def syntax_error(
    message: str, text: str, line: int, column: int, token: str, **extra: object
) -> ExpressionSyntaxError:
    """Build the one error shape every syntax problem uses (lexer and parser alike)."""
    details: dict[str, object] = {"line": line, "column": column, "token": token, "text": text}
    details.update(extra)
    return ExpressionSyntaxError(message, details=details)


class Lexer:
    """Turns source text into a list of tokens ending with one EOF token."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.line = 1
        self.col = 1

    # -- position bookkeeping -------------------------------------------------------------

    def _advance(self, n: int = 1) -> None:
        # Count newlines in the whole run at once: long string literals (documents in
        # INSERT statements) would otherwise cost a Python-level step per character.
        end = self.pos + n
        nl = self.text.count("\n", self.pos, end)
        if nl:
            self.line += nl
            self.col = end - self.text.rfind("\n", self.pos, end)
        else:
            self.col += n
        self.pos = end

    def _fail(self, message: str, line: int, col: int, token: str) -> NoReturn:
        raise syntax_error(f"{message} at line {line}, column {col}", self.text, line, col, token)

    # -- main loop ------------------------------------------------------------------------

    def tokenize(self) -> list[Token]:
        tokens: list[Token] = []
        text = self.text
        n = len(text)
        while True:
            self._skip_space_and_comments()
            if self.pos >= n:
                tokens.append(Token(TokenKind.EOF, "", None, self.line, self.col, self.pos))
                return tokens
            ch = text[self.pos]
            if _is_ident_start(ch):
                tokens.append(self._word())
            elif _is_digit(ch):
                tokens.append(self._number())
            elif ch in ("'", '"'):
                tokens.append(self._string(ch))
            elif ch == "`":
                tokens.append(self._quoted_ident())
            elif ch == "$":
                tokens.append(self._param())
            else:
                tokens.append(self._operator())

    def _skip_space_and_comments(self) -> None:
        text = self.text
        n = len(text)
        while self.pos < n:
            ch = text[self.pos]
            if ch in " \t\r\n\f\v":
                self._advance()
            elif text.startswith("--", self.pos):
                while self.pos < n and text[self.pos] != "\n":
                    self._advance()
            elif text.startswith("/*", self.pos):
                line, col = self.line, self.col
                end = text.find("*/", self.pos + 2)
                if end < 0:
                    self._fail("unterminated comment starting", line, col, "/*")
                self._advance(end + 2 - self.pos)
            else:
                return

    def _word(self) -> Token:
        start, line, col = self.pos, self.line, self.col
        while self.pos < len(self.text) and _is_ident_char(self.text[self.pos]):
            self._advance()
        word = self.text[start : self.pos]
        return Token(TokenKind.IDENT, word, word, line, col, start)

    def _number(self) -> Token:
        # JSON-style numbers: digits, optional fraction (digits required after the dot),
        # optional exponent. A leading sign is a unary operator handled by the parser.
        text, n = self.text, len(self.text)
        start, line, col = self.pos, self.line, self.col
        i = start
        while i < n and _is_digit(text[i]):
            i += 1
        is_float = False
        if i + 1 < n and text[i] == "." and _is_digit(text[i + 1]):
            is_float = True
            i += 1
            while i < n and _is_digit(text[i]):
                i += 1
        if i < n and text[i] in "eE":
            j = i + 1
            if j < n and text[j] in "+-":
                j += 1
            if j < n and _is_digit(text[j]):
                is_float = True
                i = j
                while i < n and _is_digit(text[i]):
                    i += 1
        # A number glued to letters, digits or another ".digit" is a typo, not two tokens.
        if i < n and (
            _is_ident_char(text[i])
            or text[i] == "$"
            or (text[i] == "." and i + 1 < n and _is_digit(text[i + 1]))
        ):
            j = i
            while j < n and (_is_ident_char(text[j]) or text[j] in ".$"):
                j += 1
            self._fail(f"malformed number {text[start:j]!r}", line, col, text[start:j])
        raw = text[start:i]
        value = self._number_value(raw, is_float, line, col)
        self._advance(i - start)
        return Token(TokenKind.NUMBER, raw, value, line, col, start)

    def _number_value(self, raw: str, is_float: bool, line: int, col: int) -> int | float:
        """A number literal's value; one beyond the largest double is an error, not infinity
        (JSON has no infinity: it would come back as null) nor a crash (``int()`` refuses
        more than 4300 digits). Integers within that range stay exact; tiny ones round to 0."""
        if not is_float and len(raw.lstrip("0")) <= _MAX_INT_DIGITS:
            value: int | float = int(raw)
            if value <= sys.float_info.max:
                return value
        elif is_float:
            value = float(raw)
            if math.isfinite(value):
                return value
        shown = raw if len(raw) <= _SHOWN_NUMBER_CHARS else f"{raw[:_SHOWN_NUMBER_CHARS]}..."
        raise syntax_error(
            f"number {shown} is too large (the largest is about 1.8e308) at line {line}, "
            f"column {col}",
            self.text,
            line,
            col,
            shown,
            hint="write a smaller number, or the value as a string",
        )

    def _string(self, quote: str) -> Token:
        start, line, col = self.pos, self.line, self.col
        value = self._quoted_body(quote, "string literal", line, col)
        return Token(TokenKind.STRING, self.text[start : self.pos], value, line, col, start)

    def _quoted_ident(self) -> Token:
        start, line, col = self.pos, self.line, self.col
        value = self._quoted_body("`", "quoted identifier", line, col)
        if value == "":
            self._fail("empty quoted identifier", line, col, "``")
        return Token(TokenKind.QIDENT, self.text[start : self.pos], value, line, col, start)

    def _quoted_body(self, quote: str, what: str, line: int, col: int) -> str:
        """Decode a quoted run starting at the opening quote; leaves pos after the closer.

        Both SQL-style doubling ('it''s') and JSON backslash escapes are accepted. An unknown
        backslash escape keeps the backslash (so LIKE's \\% and regex classes like \\d survive
        in patterns written the way users write them).
        """
        text, n = self.text, len(self.text)
        start = self.pos
        self._advance()
        parts: list[str] = []
        while True:
            if self.pos >= n:
                snippet = text[start : start + 20]
                self._fail(f"unterminated {what} starting", line, col, snippet)
            ch = text[self.pos]
            if ch == quote:
                if self.pos + 1 < n and text[self.pos + 1] == quote:
                    parts.append(quote)
                    self._advance(2)
                    continue
                self._advance()
                return "".join(parts)
            if ch == "\\":
                parts.append(self._escape(line, col, what))
                continue
            # Copy a run of ordinary characters at once: strings can be long.
            j = self.pos
            while j < n and text[j] != quote and text[j] != "\\":
                j += 1
            parts.append(text[self.pos : j])
            self._advance(j - self.pos)

    def _escape(self, line: int, col: int, what: str) -> str:
        text, n = self.text, len(self.text)
        esc_line, esc_col = self.line, self.col
        if self.pos + 1 >= n:
            self._advance()
            self._fail(f"unterminated {what} starting", line, col, text[self.pos - 1 :])
        nxt = text[self.pos + 1]
        if nxt in _SIMPLE_ESCAPES:
            self._advance(2)
            return _SIMPLE_ESCAPES[nxt]
        if nxt == "u":
            code = self._hex4(self.pos + 2, esc_line, esc_col)
            self._advance(6)
            # Combine a UTF-16 surrogate pair written as two \u escapes (JSON style).
            if 0xD800 <= code <= 0xDBFF and text.startswith("\\u", self.pos):
                low = self._hex4(self.pos + 2, self.line, self.col)
                if 0xDC00 <= low <= 0xDFFF:
                    self._advance(6)
                    return chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00))
            return chr(code)
        self._advance(2)
        return "\\" + nxt

    def _hex4(self, at: int, line: int, col: int) -> int:
        digits = self.text[at : at + 4]
        if len(digits) != 4 or any(c not in "0123456789abcdefABCDEF" for c in digits):
            self._fail("invalid \\u escape", line, col, self.text[at - 2 : at + 4])
        return int(digits, 16)

    def _param(self) -> Token:
        start, line, col = self.pos, self.line, self.col
        text, n = self.text, len(self.text)
        i = start + 1
        if i < n and _is_digit(text[i]):
            while i < n and _is_digit(text[i]):
                i += 1
        elif i < n and _is_ident_start(text[i]):
            while i < n and _is_ident_char(text[i]):
                i += 1
        else:
            self._fail(
                "malformed parameter: '$' must be followed by a name or number", line, col, "$"
            )
        self._advance(i - start)
        raw = text[start:i]
        return Token(TokenKind.PARAM, raw, raw[1:], line, col, start)

    def _operator(self) -> Token:
        start, line, col = self.pos, self.line, self.col
        # Two-character operators first (longest match), by set lookup: this runs for every
        # punctuation token, and INSERT statements carry hundreds of thousands of them.
        op = self.text[start : start + 2]
        if op not in _OPERATOR_SET:
            op = self.text[start]
        if op in _OPERATOR_SET:
            self.pos += len(op)  # operators never contain a newline
            self.col += len(op)
            return Token(TokenKind.OP, op, op, line, col, start)
        ch = self.text[start]
        self._fail(f"unexpected character {ch!r}", line, col, ch)


def tokenize(text: str) -> list[Token]:
    """Tokenize ``text``; raises ExpressionSyntaxError with line/column on bad input."""
    return Lexer(text).tokenize()
