"""Array index keys: ``DISTINCT ARRAY v.x FOR v IN arr [WHEN cond] END`` (or ``ALL ARRAY``).

An array key gives a document one index entry per element of an array instead of one entry
in all: the key part takes each value of ``mapping`` over the elements of ``source`` in turn
(the other key parts are the same in every entry). ``DISTINCT arr`` is short for
``DISTINCT ARRAY v FOR v IN arr END``. The rules (also in
``docs/decisions/0127-array-indexes.md``):

* Elements: ``source`` evaluated on the document; a value that is not an array has no
  elements. ``WHEN`` keeps the elements it is true for; a ``mapping`` that is MISSING for an
  element adds nothing (N1QL's ARRAY comprehension drops MISSING).
* No elements: the document is not in the index when the array key is the leading key (the
  leading-key rule); otherwise it gets one entry whose array part is MISSING, so a scan on
  the keys before it still finds the document.
* ``DISTINCT`` and ``ALL`` are stored alike: an entry is ``key parts + docid``, so two equal
  elements of one document make one entry either way. Queries over an array index always
  re-check their predicate on the document and take each document once.
* One array key per index (as N1QL), with a single ``FOR`` variable.

The key travels as its canonical text (``to_text``) in ``IndexKey.expr`` like any key: the
DDL, the client API, the coordinator's state and the pipeline need nothing new. It is an
``Expr`` so the planner can hold it among an index's key expressions; nothing evaluates it
through the expression interpreter (:func:`compile_elements` is its evaluator).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from shardex.core.expr import (
    Expr,
    Identifier,
    Parser,
    TokenKind,
    compile_expression,
    format_identifier,
    tokenize,
    truth,
    walk,
)
from shardex.core.values import MISSING

__all__ = [
    "ArrayIndexKey",
    "ElementsFn",
    "array_key_of",
    "compile_elements",
    "is_array_key_text",
    "parse_array_key",
]

ElementsFn = Callable[[Any, Any], list[Any]]
_STARTS = ("DISTINCT", "ALL")


@dataclass(frozen=True, slots=True)
class ArrayIndexKey(Expr):
    """``DISTINCT|ALL ARRAY mapping FOR var IN source [WHEN when] END``."""

    distinct: bool
    mapping: Expr
    var: str
    source: Expr
    when: Expr | None = None
    precedence: ClassVar[int] = 100

    def children(self) -> tuple[Expr, ...]:
        parts = [self.mapping, self.source]
        if self.when is not None:
            parts.append(self.when)
        return tuple(parts)

    def to_text(self) -> str:
        word = "DISTINCT" if self.distinct else "ALL"
        when = "" if self.when is None else f" WHEN {self.when.to_text()}"
        return (
            f"{word} ARRAY {self.mapping.to_text()} FOR {format_identifier(self.var)} IN "
            f"{self.source.to_text()}{when} END"
        )


def is_array_key_text(text: str) -> bool:
    """Whether a key's text is an array key (cheap: canonical texts start with the word)."""
    head = text.lstrip()[:9].upper()
    return head.startswith("DISTINCT ") or head.startswith("ALL ")


def parse_array_key(p: Parser) -> ArrayIndexKey:
    """An array key from ``p``'s position (at ``DISTINCT`` or ``ALL``): the DDL parser and
    :func:`array_key_of` share this. Errors are the parser's (line, column, token)."""
    word = p.advance()
    if word.upper not in _STARTS:
        p.error(word, expected="DISTINCT or ALL")
    distinct = word.upper == "DISTINCT"
    if not p.accept_keyword("ARRAY"):
        # ``DISTINCT arr``: every element of ``arr`` as it is.
        source = p.parse_expression()
        return ArrayIndexKey(distinct, Identifier("v"), "v", source)
    mapping = p.parse_expression()
    p.expect_keyword("FOR")
    tok = p.peek()
    if tok.kind is TokenKind.QIDENT:
        var = str(tok.value)
    elif tok.kind is TokenKind.IDENT and tok.upper not in p.reserved:
        var = tok.text
    else:
        p.error(tok, expected="the variable name after FOR")
    p.advance()
    p.expect_keyword("IN")
    source = p.parse_expression()
    if p.at_op(","):
        p.error(p.peek(), "an array index key binds one variable (one FOR ... IN)")
    when = p.parse_expression() if p.accept_keyword("WHEN") else None
    p.expect_keyword("END")
    return ArrayIndexKey(distinct, mapping, var, source, when)


def array_key_of(text: str) -> ArrayIndexKey | None:
    """The array key a key text describes, or None for a plain key expression."""
    if not is_array_key_text(text):
        return None
    p = Parser(tokenize(text), text)
    key = parse_array_key(p)
    if not p.at_end():
        p.error(p.peek(), expected="the end of the array key")
    return key


def _only_var(key: ArrayIndexKey) -> bool:
    """Whether ``mapping`` and ``when`` read nothing but the variable (the usual case): each
    element is then evaluated on a one-entry scope instead of a copy of the document."""
    names = {
        n.name
        for e in (key.mapping, key.when)
        if e is not None
        for n in walk(e)
        if isinstance(n, Identifier)
    }
    return names <= {key.var}


def compile_elements(key: ArrayIndexKey) -> ElementsFn:
    """``f(doc, meta) -> [value, ...]``: the array part of each of the document's entries,
    in element order (repeats kept; the entries dedupe them)."""
    source = compile_expression(key.source)
    mapping = compile_expression(key.mapping)
    when = compile_expression(key.when) if key.when is not None else None
    var = key.var
    small = _only_var(key)

    def elements(doc: Any, meta: Any = None) -> list[Any]:
        items = source(doc, meta)
        if not isinstance(items, list):
            return []
        base = doc if isinstance(doc, dict) and not small else {}
        out = []
        for item in items:
            scope = {var: item} if small else {**base, var: item}
            if when is not None and not truth(when(scope, meta)):
                continue
            v = mapping(scope, meta)
            if v is not MISSING:
                out.append(v)
        return out

    return elements
