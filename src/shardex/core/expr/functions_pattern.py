"""Pattern helpers and masking: REGEXP_MATCHES, REGEXP_SPLIT, the literal prefix / suffix /
range stop of a LIKE or regular-expression pattern (LIKE_PREFIX, LIKE_SUFFIX, LIKE_STOP,
REGEXP_PREFIX, REGEXP_SUFFIX, REGEXP_STOP) and MASK.

Registered into the shared registry on import (see ``functions_num``). Regular expressions
run on RE2 as the other REGEXP_ functions (``functions_str``). A pattern's literal prefix is
what every matching string starts with; its stop is the least string above every string that
starts with it (the prefix with its last character incremented), or, for a pattern that is
all literal, the least string above the literal itself (it with a NUL appended): together
they bound an index range scan.
"""

from __future__ import annotations

from typing import Any

from shardex.core.values import MISSING

from .functions import _fn, _int_arg
from .functions_str import _regex
from .ops import RANK_OBJECT, type_rank

# -- regular expressions ----------------------------------------------------------------------


def _matches(rx: Any, s: str) -> list[tuple[int, int]]:
    """Match spans left to right, as Go's FindAll: an empty match right after a previous
    match is skipped."""
    spans: list[tuple[int, int]] = []
    for m in rx.finditer(s):
        if m.start() == m.end() and spans and spans[-1][1] == m.start():
            continue
        spans.append((m.start(), m.end()))
    return spans


@_fn("REGEXP_MATCHES", 2)
def _regexp_matches(s: Any, pattern: Any) -> Any:
    if type(s) is not str or type(pattern) is not str:
        return None
    return [s[a:b] for a, b in _matches(_regex(pattern), s)]


@_fn("REGEXP_SPLIT", 2)
def _regexp_split(s: Any, pattern: Any) -> Any:
    """The pieces between matches (Go's Split: a zero-length match at the start does not
    make an empty first piece)."""
    if type(s) is not str or type(pattern) is not str:
        return None
    out, beg, end = [], 0, 0
    for a, b in _matches(_regex(pattern), s):
        end = a
        if b != 0:
            out.append(s[beg:end])
        beg = b
    if end != len(s):
        out.append(s[beg:])
    return out


_REGEX_META = set("\\.+*?()|[]{}^$")


def _regex_literal_prefix(pattern: str) -> tuple[str, bool]:
    """(literal prefix, whether the whole pattern is that literal)."""
    if "|" in pattern or pattern.startswith("(?"):
        return "", False  # an alternation or flags: no prefix every match shares
    out: list[str] = []
    i, n = (1 if pattern.startswith("^") else 0), len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\" and i + 1 < n and pattern[i + 1] in _REGEX_META:
            lit, width = pattern[i + 1], 2
        elif c in _REGEX_META:
            if c in "*?{" and out:
                out.pop()  # the character before may occur zero times
            return "".join(out), False
        else:
            lit, width = c, 1
        out.append(lit)
        i += width
    return "".join(out), True


def _regex_literal_suffix(pattern: str) -> str:
    if "|" in pattern or pattern.startswith("(?"):
        return ""
    body = (
        pattern[:-1]
        if pattern.endswith("$") and not _escaped(pattern, len(pattern) - 1)
        else pattern
    )
    out: list[str] = []
    i = len(body) - 1
    while i >= 0:
        c = body[i]
        if _escaped(body, i):
            out.append(c)
            i -= 2
        elif c in _REGEX_META:
            break
        else:
            out.append(c)
            i -= 1
    return "".join(reversed(out))


def _escaped(s: str, i: int) -> bool:
    """Whether ``s[i]`` is preceded by an odd run of backslashes."""
    n = 0
    while i - n - 1 >= 0 and s[i - n - 1] == "\\":
        n += 1
    return n % 2 == 1


# -- LIKE patterns ------------------------------------------------------------------------------


def _like_escape(escape: Any) -> str | None:
    if escape is MISSING:
        return "\\"
    return escape if type(escape) is str and len(escape) == 1 else None


def _like_parts(pattern: str, escape: str) -> list[str | None]:
    """The pattern as literal characters and wildcards (None)."""
    parts: list[str | None] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == escape and i + 1 < n:
            parts.append(pattern[i + 1])
            i += 2
            continue
        parts.append(None if c in "%_" else c)
        i += 1
    return parts


def _like_prefix_of(pattern: str, escape: str) -> tuple[str, bool]:
    parts = _like_parts(pattern, escape)
    out = []
    for p in parts:
        if p is None:
            return "".join(out), False
        out.append(p)
    return "".join(out), True


@_fn("LIKE_PREFIX", 1, 2)
def _like_prefix(pattern: Any, escape: Any = MISSING) -> Any:
    esc = _like_escape(escape)
    if type(pattern) is not str or esc is None:
        return None
    return _like_prefix_of(pattern, esc)[0]


@_fn("LIKE_SUFFIX", 1, 2)
def _like_suffix(pattern: Any, escape: Any = MISSING) -> Any:
    esc = _like_escape(escape)
    if type(pattern) is not str or esc is None:
        return None
    out = []
    for p in reversed(_like_parts(pattern, esc)):
        if p is None:
            break
        out.append(p)
    return "".join(reversed(out))


def _stop(prefix: str, complete: bool) -> Any:
    if complete:
        return prefix + "\x00"
    chars = list(prefix)
    while chars:
        code = ord(chars[-1]) + 1
        if code <= 0x10FFFF:
            chars[-1] = chr(code)
            return "".join(chars)
        chars.pop()
    return None  # no prefix (or only the largest character): no upper bound


@_fn("LIKE_STOP", 1, 2)
def _like_stop(pattern: Any, escape: Any = MISSING) -> Any:
    esc = _like_escape(escape)
    if type(pattern) is not str or esc is None:
        return None
    return _stop(*_like_prefix_of(pattern, esc))


@_fn("REGEXP_PREFIX", 1)
def _regexp_prefix(pattern: Any) -> Any:
    return _regex_literal_prefix(pattern)[0] if type(pattern) is str else None


@_fn("REGEXP_SUFFIX", 1)
def _regexp_suffix(pattern: Any) -> Any:
    return _regex_literal_suffix(pattern) if type(pattern) is str else None


@_fn("REGEXP_STOP", 1)
def _regexp_stop(pattern: Any) -> Any:
    return _stop(*_regex_literal_prefix(pattern)) if type(pattern) is str else None


# -- MASK -----------------------------------------------------------------------------------


def _overlay(s: str, start: int, mask: str, hole: str, inject: str, source: bool) -> str:
    """``mask`` laid over ``s`` from ``start``: a mask character replaces one input
    character, a hole keeps it, an inject character is added without consuming input. With
    ``source`` the output keeps the input's length (the mask is cut where the input ends and
    the input goes on after it); without, the output ends with the mask."""
    rest, out, i = s[start:], [], 0
    for m in mask:
        if m in inject:
            out.append(m)
            continue
        if i >= len(rest) and source:
            break
        if m in hole:
            if i < len(rest):
                out.append(rest[i])
        else:
            out.append(m)
        i += 1
    return s[:start] + "".join(out) + (rest[i:] if source else "")


def _mask_option(opts: dict[str, Any], name: str, default: str) -> str | None:
    v = opts.get(name, default)
    return v if type(v) is str else None


@_fn("MASK", 1, 2)
def _mask(s: Any, options: Any = MISSING) -> Any:
    """MASK(s [, {mask, hole, inject, length, anchor}]), as N1QL: the mask starts at the
    anchor ("start", "end", a number of characters from the start or, negative, from the
    end, or the first match of a regular expression) and runs towards the end, or towards
    the start for "end" and negative anchors; an anchor outside the string leaves it as it
    is."""
    if options is MISSING:
        opts: dict[str, Any] = {}
    elif type(options) is dict or type_rank(options) == RANK_OBJECT:
        opts = dict(options)
    else:
        return None
    mask = _mask_option(opts, "mask", "********")
    hole = _mask_option(opts, "hole", " ")
    inject = _mask_option(opts, "inject", "")
    if type(s) is not str or mask is None or hole is None or inject is None:
        return None
    source = opts.get("length") == "source"
    anchor = opts.get("anchor", "start")
    backwards, start = False, 0
    if anchor == "end":
        backwards = True
    elif type(anchor) is str and anchor != "start":
        m = _regex(anchor).search(s)
        if m is None:
            return s
        start = m.start()
    elif type(anchor) is not str:
        n = _int_arg(anchor)
        if n is None:
            return None
        backwards, start = n < 0, abs(n)
        if start > len(s):
            return s
    if backwards:
        return _overlay(s[::-1], start, mask[::-1], hole, inject, source)[::-1]
    return _overlay(s, start, mask, hole, inject, source)
