"""String functions beyond the core set: regular expressions, padding, splitting,
repetition, title case and the 1-based / character-counting variants.

Registered into the shared registry on import (see ``functions_num``). Regular expressions
run on RE2 (``google-re2``), the engine and syntax N1QL uses (Go's regexp is RE2): matching
is linear in the text, so no pattern can backtrack for seconds holding the GIL and stall the
node's event loop (heartbeats included). RE2 has no backreferences or lookaround; a pattern
that does not compile is an EXPRESSION_EVAL error naming it, as in N1QL, since a bad pattern
is the query's mistake and a silent NULL would hide it.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from shardex.core.values import MISSING
from shardex.errors import ExpressionEvalError

from .functions import _fn, _int_arg

_MAX_RESULT_CHARS = 20_000_000  # REPEAT/LPAD beyond this are NULL rather than exhaust memory

_SHOWN_PATTERN_CHARS = 200  # an error quotes at most this much of a (possibly huge) pattern
_RE2_HINT = (
    "patterns use RE2 syntax (as N1QL): no backreferences (\\1) or lookaround ((?=, (?!, "
    "(?<=, (?<!); see https://github.com/google/re2/wiki/Syntax"
)


@lru_cache(maxsize=1)
def _re2() -> tuple[Any, Any]:
    """The ``re2`` module and its options, imported on first use: the import costs ~0.1 s
    and most processes (the CLI, clients) never match a regular expression."""
    import re2

    options = re2.Options()
    options.log_errors = False  # a bad pattern is reported to the caller, not to stderr
    return re2, options


@lru_cache(maxsize=512)
def _regex(pattern: str) -> Any:
    """The compiled RE2 program for ``pattern`` (cached: patterns are usually literals)."""
    re2, options = _re2()
    try:
        return re2.compile(pattern, options)
    except re2.error as e:
        raw = e.args[0] if e.args else str(e)  # RE2's message, as bytes
        reason = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    except UnicodeEncodeError:  # a lone surrogate: not text RE2 can take
        reason = "the pattern is not valid Unicode text"
    shown = pattern[:_SHOWN_PATTERN_CHARS] + ("..." if len(pattern) > _SHOWN_PATTERN_CHARS else "")
    raise ExpressionEvalError(
        f"invalid regular expression {shown!r}: {reason}",
        details={"pattern": shown, "reason": reason, "hint": _RE2_HINT},
    )


def _rx(s: Any, pattern: Any) -> Any:
    if type(s) is not str or type(pattern) is not str:
        return None
    return _regex(pattern)


def _text_ok(s: str) -> bool:
    """RE2 matches UTF-8: a string holding a lone surrogate cannot be matched (gives NULL)."""
    if s.isascii():
        return True
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@_fn("REGEXP_CONTAINS", 2, -1, "REGEX_CONTAINS")
def _regexp_contains(s: Any, pattern: Any) -> Any:
    rx = _rx(s, pattern)
    return None if rx is None or not _text_ok(s) else rx.search(s) is not None


@_fn("REGEXP_LIKE", 2, -1, "REGEX_LIKE")
def _regexp_like(s: Any, pattern: Any) -> Any:
    rx = _rx(s, pattern)
    return None if rx is None or not _text_ok(s) else rx.fullmatch(s) is not None


def _regexp_position(s: Any, pattern: Any, base: int) -> Any:
    rx = _rx(s, pattern)
    if rx is None or not _text_ok(s):
        return None
    m = rx.search(s)
    return -1 if m is None else m.start() + base


@_fn("REGEXP_POSITION", 2, -1, "REGEXP_POSITION0", "REGEX_POSITION", "REGEX_POSITION0")
def _regexp_position0(s: Any, pattern: Any) -> Any:
    return _regexp_position(s, pattern, 0)


@_fn("REGEXP_POSITION1", 2, -1, "REGEX_POSITION1")
def _regexp_position1(s: Any, pattern: Any) -> Any:
    return _regexp_position(s, pattern, 1)


@_fn("REGEXP_REPLACE", 3, 4, "REGEX_REPLACE")
def _regexp_replace(s: Any, pattern: Any, repl: Any, n: Any = MISSING) -> Any:
    rx = _rx(s, pattern)
    if rx is None or type(repl) is not str or not (_text_ok(s) and _text_ok(repl)):
        return None
    count = 0
    if n is not MISSING:
        c = _int_arg(n)
        if c is None:
            return None
        count = max(c, 0) if c >= 0 else 0
    # The replacement is literal text (no back-references), as in N1QL.
    return rx.sub(lambda _m: repl, s, count=count)


@_fn("REPEAT", 2)
def _repeat(s: Any, n: Any) -> Any:
    count = _int_arg(n)
    if type(s) is not str or count is None or count < 0:
        return None
    if len(s) * count > _MAX_RESULT_CHARS:
        return None
    return s * count


@_fn("SPLIT", 1, 2)
def _split(s: Any, sep: Any = MISSING) -> Any:
    if type(s) is not str:
        return None
    if sep is MISSING:
        return s.split()
    if type(sep) is not str:
        return None
    if sep == "":
        return list(s)
    return s.split(sep)


@_fn("INITCAP", 1, -1, "TITLE")
def _initcap(s: Any) -> Any:
    if type(s) is not str:
        return None
    # Upper-case the first letter of every run of letters, lower-case the rest.
    return re.sub(r"[^\W\d_]+", lambda m: m.group(0)[0].upper() + m.group(0)[1:], s.lower())


def _position(s: Any, sub: Any, base: int, chars: bool) -> Any:
    if type(s) is not str or type(sub) is not str:
        return None
    i = s.find(sub)
    if i < 0:
        return -1
    if not chars and not s.isascii():
        i = len(s[:i].encode("utf-8", "surrogatepass"))
    return i + base


@_fn("POSITION1", 2, -1, "POS1")
def _position1(s: Any, sub: Any) -> Any:
    return _position(s, sub, 1, chars=False)


@_fn("POS0", 2)
def _pos0(s: Any, sub: Any) -> Any:
    return _position(s, sub, 0, chars=False)


@_fn("MB_POSITION", 2, -1, "MB_POSITION0", "MB_POS0", "MB_POS")
def _mb_position0(s: Any, sub: Any) -> Any:
    return _position(s, sub, 0, chars=True)


@_fn("MB_POSITION1", 2, -1, "MB_POS1")
def _mb_position1(s: Any, sub: Any) -> Any:
    return _position(s, sub, 1, chars=True)


@_fn("MB_SUBSTR1", 2, 3)
def _mb_substr1(s: Any, start: Any, length: Any = MISSING) -> Any:
    from .functions import _substr

    return _substr(s, start, length, chars=True, base=1)


def _flatten_strings(args: tuple[Any, ...]) -> list[str] | None:
    out: list[str] = []
    for a in args:
        if type(a) is str:
            out.append(a)
        elif type(a) is list and all(type(x) is str for x in a):
            out.extend(a)
        else:
            return None
    return out


@_fn("CONCAT2", 2, None)
def _concat2(sep: Any, *args: Any) -> Any:
    """CONCAT2(separator, s | [s, ...], ...): join strings and string arrays."""
    parts = _flatten_strings(args)
    if type(sep) is not str or parts is None:
        return None
    return sep.join(parts)


def _pad(s: Any, n: Any, pad: Any, left: bool, chars: bool) -> Any:
    size = _int_arg(n)
    pad = " " if pad is MISSING else pad
    if type(s) is not str or type(pad) is not str or size is None or size < 0:
        return None
    if size > _MAX_RESULT_CHARS:
        return None
    if chars or (s.isascii() and pad.isascii()):
        if len(s) >= size:
            return s[:size]
        if not pad:
            return s
        fill = (pad * (size // len(pad) + 1))[: size - len(s)]
        return fill + s if left else s + fill
    # Byte semantics (N1QL's LPAD/RPAD): cut and fill by UTF-8 bytes, then decode with
    # replacement characters for any split sequence.
    data, pad_b = s.encode("utf-8", "surrogatepass"), pad.encode("utf-8", "surrogatepass")
    if len(data) >= size:
        out = data[:size]
    elif not pad_b:
        out = data
    else:
        fill = (pad_b * (size // len(pad_b) + 1))[: size - len(data)]
        out = fill + data if left else data + fill
    return out.decode("utf-8", "replace")


@_fn("LPAD", 2, 3)
def _lpad(s: Any, n: Any, pad: Any = MISSING) -> Any:
    return _pad(s, n, pad, left=True, chars=False)


@_fn("RPAD", 2, 3)
def _rpad(s: Any, n: Any, pad: Any = MISSING) -> Any:
    return _pad(s, n, pad, left=False, chars=False)


@_fn("MB_LPAD", 2, 3)
def _mb_lpad(s: Any, n: Any, pad: Any = MISSING) -> Any:
    return _pad(s, n, pad, left=True, chars=True)


@_fn("MB_RPAD", 2, 3)
def _mb_rpad(s: Any, n: Any, pad: Any = MISSING) -> Any:
    return _pad(s, n, pad, left=False, chars=True)


@_fn("REVERSE", 1)
def _reverse(s: Any) -> Any:
    return s[::-1] if type(s) is str else None
