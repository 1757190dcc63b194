"""The parser's window functions: ``fn(args) [FROM FIRST|LAST] [RESPECT|IGNORE NULLS] OVER
([PARTITION BY ...] [ORDER BY ...] [ROWS | RANGE | GROUPS frame [EXCLUDE ...]])``, as
functions of the ``SqlParser`` they extend (``parse_call`` calls them)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from shardex.core.expr import Expr, Token, TokenKind

from .ast import FRAMELESS, WINDOW_FUNCTIONS, Aggregate, Frame, FrameBound, WindowCall

if TYPE_CHECKING:
    from .parser import SqlParser

__all__ = [
    "at_window_clause",
    "parse_over_aggregate",
    "parse_window_clause",
    "parse_window_function",
]

_FRAME_UNITS = ("ROWS", "RANGE", "GROUPS")


def parse_window_function(p: SqlParser, name_tok: Token, upper: str) -> Expr:
    """``fn(args) [FROM FIRST|LAST] [RESPECT|IGNORE NULLS] OVER (...)``."""
    least, most = WINDOW_FUNCTIONS[upper]
    p.expect("(")
    args = p.expression_list(")")
    if not least <= len(args) <= most:
        takes = f"{least}" if least == most else f"{least} to {most}"
        p.error(name_tok, f"window function {upper} takes {takes} arguments, got {len(args)}")
    from_last = False
    if upper == "NTH_VALUE" and p.at_keyword("FROM") and p.peek(1).upper in ("FIRST", "LAST"):
        p.advance()
        from_last = p.advance().upper == "LAST"
    ignore_nulls = parse_null_treatment(p, upper)
    if not p.at_keyword("OVER"):
        p.error(p.peek(), f"window function {upper} needs OVER (...)", expected="OVER")
    return parse_over(
        p, WindowCall(upper, tuple(args), ignore_nulls=ignore_nulls, from_last=from_last)
    )


def parse_null_treatment(p: SqlParser, upper: str) -> bool:
    if p.peek().upper in ("RESPECT", "IGNORE") and p.at_keyword("NULLS", 1):
        tok = p.advance()
        p.advance()
        if upper not in ("LAG", "LEAD", "FIRST_VALUE", "LAST_VALUE", "NTH_VALUE"):
            p.error(tok, f"{upper} takes no {tok.upper} NULLS")
        return tok.upper == "IGNORE"
    return False


def parse_over_aggregate(p: SqlParser, agg: Aggregate) -> Expr:
    """An aggregate, or with OVER after it an aggregate over a window."""
    if not p.at_keyword("OVER"):
        return agg
    args = () if agg.arg is None else (agg.arg,)
    return parse_over(p, WindowCall(agg.name, args, distinct=agg.distinct, star=agg.arg is None))


def parse_over(p: SqlParser, call: WindowCall) -> WindowCall:
    """``OVER name`` or ``OVER ([name] [PARTITION BY ...] [ORDER BY ...] [frame])``."""
    p.expect_keyword("OVER")
    if not p.at_op("("):
        return dataclasses.replace(call, ref=_window_name(p))
    return parse_window(p, call)


def parse_window(p: SqlParser, call: WindowCall) -> WindowCall:
    """``([name] [PARTITION BY ...] [ORDER BY ...] [frame])`` into ``call``."""
    p.expect("(", "'(' and the window")
    ref = None
    if p.peek().upper not in ("PARTITION", "ORDER", *_FRAME_UNITS) and not p.at_op(")"):
        ref = _window_name(p)
    partition: tuple[Expr, ...] = ()
    if p.accept_keyword("PARTITION"):
        p.expect_keyword("BY")
        partition = tuple(p.parse_expr_list())
    order = p.parse_order_by() if p.at_keyword("ORDER") else ()
    frame = None
    if p.peek().upper in _FRAME_UNITS:
        frame = parse_frame(p, bool(order) or ref is not None)  # a named one may order it
        if call.name in FRAMELESS:
            p.error(p.tokens[p.pos - 1], f"{call.name} takes no window frame")
    p.expect(")", "')' after the window")
    return dataclasses.replace(call, partition=partition, order=order, frame=frame, ref=ref)


def at_window_clause(p: SqlParser) -> bool:
    """At ``WINDOW name AS (`` (WINDOW is not reserved: it stays usable as a name)."""
    return p.at_keyword("WINDOW") and p.at_keyword("AS", 2) and p.at_op("(", 3)


def parse_window_clause(p: SqlParser) -> tuple[tuple[str, WindowCall], ...]:
    """``WINDOW name AS (window) {, name AS (window)}``: each a ``WindowCall`` without a
    function (``name`` empty), holding the window."""
    p.advance()
    out: list[tuple[str, WindowCall]] = []
    while True:
        tok = p.peek()
        name = _window_name(p)
        if any(n == name for n, _ in out):
            p.error(tok, f"WINDOW names {name!r} twice", expected="another name")
        p.expect_keyword("AS")
        out.append((name, parse_window(p, WindowCall("", ()))))
        if not p.accept(","):
            return tuple(out)


def _window_name(p: SqlParser) -> str:
    tok = p.peek()
    if tok.kind not in (TokenKind.IDENT, TokenKind.QIDENT):
        p.error(tok, expected="'(' and the window, or a window's name")
    return p.parse_alias()


def parse_frame(p: SqlParser, ordered: bool) -> Frame:
    unit_tok = p.advance()
    unit = unit_tok.upper
    if unit in ("RANGE", "GROUPS") and not ordered:
        p.error(unit_tok, f"a {unit} frame needs ORDER BY in the window")
    if p.accept_keyword("BETWEEN"):
        start = parse_frame_bound(p)
        p.expect_keyword("AND")
        end = parse_frame_bound(p)
    else:
        start, end = parse_frame_bound(p), FrameBound("CURRENT ROW")
    order = ["UNBOUNDED PRECEDING", "PRECEDING", "CURRENT ROW", "FOLLOWING"]
    order.append("UNBOUNDED FOLLOWING")
    if (
        start.kind == "UNBOUNDED FOLLOWING"
        or end.kind == "UNBOUNDED PRECEDING"
        or order.index(start.kind) > order.index(end.kind)
    ):
        p.error(
            unit_tok,
            f"window frame from {start.to_text()} to {end.to_text()} is empty",
            expected="a start that comes before the end",
        )
    exclude = None
    if p.accept_keyword("EXCLUDE"):
        tok = p.peek()
        if tok.upper == "CURRENT" and p.at_keyword("ROW", 1):
            p.advance()
            p.advance()
            exclude = "CURRENT ROW"
        elif tok.upper in ("GROUP", "TIES"):
            p.advance()
            exclude = tok.upper
        elif tok.upper == "NO" and p.at_keyword("OTHERS", 1):
            p.advance()
            p.advance()
        else:
            p.error(tok, expected="CURRENT ROW, GROUP, TIES or NO OTHERS after EXCLUDE")
    return Frame(unit, start, end, exclude)


def parse_frame_bound(p: SqlParser) -> FrameBound:
    tok = p.peek()
    if tok.upper == "UNBOUNDED":
        p.advance()
        side = p.peek()
        if side.upper not in ("PRECEDING", "FOLLOWING"):
            p.error(side, expected="PRECEDING or FOLLOWING after UNBOUNDED")
        p.advance()
        return FrameBound(f"UNBOUNDED {side.upper}")
    if tok.upper == "CURRENT" and p.at_keyword("ROW", 1):
        p.advance()
        p.advance()
        return FrameBound("CURRENT ROW")
    offset = p.parse_expression()
    side = p.peek()
    if side.upper not in ("PRECEDING", "FOLLOWING"):
        p.error(side, expected="PRECEDING or FOLLOWING after the frame offset")
    p.advance()
    return FrameBound(side.upper, offset)
