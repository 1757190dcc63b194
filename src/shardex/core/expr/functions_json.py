"""JSON and token functions: ENCODE_JSON / DECODE_JSON, ENCODED_SIZE, POLY_LENGTH, TOKENS and
CONTAINS_TOKEN (with its LIKE and regular-expression forms).

Registered into the shared registry on import (see ``functions_num``). The JSON text is
N1QL's: compact, object names sorted, numbers as Go writes them (``1.0`` encodes as ``1``,
``1.5e-7`` as ``1.5e-7``), non-ASCII characters as themselves, so ENCODED_SIZE counts what
N1QL counts and a hash of a value is the same here as there.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

from shardex.core.values import MISSING

from .functions import _fn
from .functions_array import _key
from .functions_str import _regex
from .ops import RANK_ARRAY, RANK_OBJECT, like_matcher, type_rank

# Integral floats below this print as integers (as N1QL, whose numbers are float64: past
# 2**53 the digits are not exact anyway).
_EXACT_FLOAT = 2.0**53


def _float_text(x: float) -> str:
    """A float as Go's encoding/json writes it (N1QL's text): the shortest digits that read
    back as ``x``, in fixed notation unless below 1e-6 or from 1e21 on, where it is
    ``d.ddde-7`` / ``d.ddde+21`` (no leading zero in a negative exponent)."""
    if x.is_integer() and abs(x) < _EXACT_FLOAT:
        return str(int(x))
    d = Decimal(repr(x))
    if 1e-6 <= abs(x) < 1e21:
        text = format(d, "f")  # an integral float past 2**53 reads "...0.0" in repr
        return text[:-2] if text.endswith(".0") else text
    sign, digits, exp = d.as_tuple()
    mantissa = str(digits[0]) + ("." + "".join(map(str, digits[1:])) if len(digits) > 1 else "")
    e = int(exp) + len(digits) - 1
    exponent = f"-{-e}" if e < 0 else f"+{e:02d}"
    return ("-" if sign else "") + mantissa + "e" + exponent


def _write(v: Any, out: list[str]) -> None:
    t = type(v)
    if t is str:
        out.append(json.dumps(v, ensure_ascii=False))
    elif v is None:
        out.append("null")
    elif t is bool:
        out.append("true" if v else "false")
    elif t is int:
        out.append(str(v))
    elif t is float:
        out.append(_float_text(v))
    elif t is list or type_rank(v) == RANK_ARRAY:
        out.append("[")
        for i, x in enumerate(v):
            if i:
                out.append(",")
            _write(x, out)
        out.append("]")
    elif t is dict or type_rank(v) == RANK_OBJECT:
        out.append("{")
        for i, k in enumerate(sorted(v)):
            if i:
                out.append(",")
            out.append(json.dumps(k, ensure_ascii=False))
            out.append(":")
            _write(v[k], out)
        out.append("}")
    else:  # a number of another type (an int-like enum): its plain value
        _write(int(v) if isinstance(v, int) else float(v), out)


def encode_json(v: Any) -> str:
    """The value's JSON text as N1QL writes it: compact, names sorted, Go's number format,
    non-ASCII characters as themselves."""
    out: list[str] = []
    _write(v, out)
    return "".join(out)


@_fn("ENCODE_JSON", 1, -1, "JSON_ENCODE")
def _encode(v: Any) -> Any:
    return encode_json(v)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # NaN / Infinity: Python accepts them, JSON not


@_fn("DECODE_JSON", 1, -1, "JSON_DECODE")
def _decode(text: Any) -> Any:
    """The value a JSON text denotes; NULL for anything else (an empty string included)."""
    if type(text) is not str:
        return None
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return None


@_fn("ENCODED_SIZE", 1, propagate=False)
def _encoded_size(v: Any) -> Any:
    """Bytes of the value's JSON text; MISSING is 0 (the function never gives NULL)."""
    if v is MISSING:
        return 0
    return len(encode_json(v).encode("utf-8", "surrogatepass"))


@_fn("POLY_LENGTH", 1)
def _poly_length(v: Any) -> Any:
    """Characters of a string, elements of an array, fields of an object; else NULL."""
    if type(v) is str or type_rank(v) in (RANK_ARRAY, RANK_OBJECT):
        return len(v)
    return None


# -- tokens ----------------------------------------------------------------------------------

_TRAILING_PUNCTUATION = ".,;:!?\"'()[]{}<>"


def _words(s: str) -> Iterator[str]:
    """Runs of letters and digits (any script)."""
    start = -1
    for i, c in enumerate(s):
        if c.isalnum():
            if start < 0:
                start = i
        elif start >= 0:
            yield s[start:i]
            start = -1
    if start >= 0:
        yield s[start:]


class _TokenOptions:
    __slots__ = ("case", "names", "specials", "split", "trim")

    def __init__(self, opts: dict[str, Any]) -> None:
        def flag(name: str, default: bool) -> bool:
            v = opts.get(name, default)
            return v if type(v) is bool else default

        self.names = flag("names", True)
        self.specials = flag("specials", False)
        self.split = flag("split", True)
        self.trim = flag("trim", True)
        case = opts.get("case")
        self.case: Callable[[str], str] | None = (
            str.lower if case == "lower" else str.upper if case == "upper" else None
        )


def _string_tokens(s: str, o: _TokenOptions) -> Iterator[str]:
    if o.case is not None:
        s = o.case(s)
    if not o.split:
        yield s.strip() if o.trim else s
        return
    yield from _words(s)
    if o.specials:  # also whole chunks such as e-mail addresses and URLs
        for chunk in s.split():
            chunk = chunk.strip(_TRAILING_PUNCTUATION)
            if chunk:
                yield chunk


def _tokens(v: Any, o: _TokenOptions) -> Iterator[Any]:
    if type(v) is str:
        yield from _string_tokens(v, o)
    elif type(v) is list or type_rank(v) == RANK_ARRAY:
        for x in v:
            yield from _tokens(x, o)
    elif type(v) is dict or type_rank(v) == RANK_OBJECT:
        for k, x in v.items():
            if o.names:
                yield from _string_tokens(k, o)
            yield from _tokens(x, o)
    else:
        yield v  # NULL, booleans and numbers are tokens of their own


def _token_options(options: Any) -> _TokenOptions | None:
    if options is MISSING:
        return _TokenOptions({})
    if type(options) is dict or type_rank(options) == RANK_OBJECT:
        return _TokenOptions(options)
    return None


@_fn("TOKENS", 1, 2, propagate=False)
def _tokens_fn(v: Any, options: Any = MISSING) -> Any:
    """The distinct tokens of any value (order unspecified): the words of its strings and,
    unless ``names`` is false, of its field names, and its other scalars (NULL included)."""
    if v is MISSING:
        return MISSING
    o = _token_options(options)
    if o is None:
        return None
    seen: dict[bytes, Any] = {}
    for t in _tokens(v, o):
        seen.setdefault(_key(t), t)  # SQL++ identity: 1 and 1.0 are one token, TRUE is not 1
    return list(seen.values())


def _contains_token(test: Callable[[str], Callable[[Any], bool]]) -> Callable[..., Any]:
    def impl(v: Any, token: Any, options: Any = MISSING) -> Any:
        o = _token_options(options)
        if type(token) is not str or o is None:
            return None
        matches = test(token)
        return any(matches(t) for t in _tokens(v, o))

    return impl


def _equal_to(token: str) -> Callable[[Any], bool]:
    return lambda t: t == token


def _like(pattern: str) -> Callable[[Any], bool]:
    match = like_matcher(pattern)
    return lambda t: type(t) is str and match(t)


def _search(pattern: str) -> Callable[[Any], bool]:
    rx = _regex(pattern)
    return lambda t: type(t) is str and rx.fullmatch(t) is not None


_fn("CONTAINS_TOKEN", 2, 3, "HAS_TOKEN")(_contains_token(_equal_to))
_fn("CONTAINS_TOKEN_LIKE", 2, 3)(_contains_token(_like))
_fn("CONTAINS_TOKEN_REGEXP", 2, 3)(_contains_token(_search))
