"""Built-in functions and the registry the parser and evaluators consult.

A function is a ``FunctionSpec``: arity bounds (checked at parse time), an implementation
over already-evaluated arguments, and whether MISSING/NULL arguments short-circuit before the
implementation runs (``propagate``: any MISSING argument gives MISSING, else any NULL gives
NULL; true for almost every function, false for the ones whose purpose is to look at
MISSING/NULL such as IFMISSING or TYPE). Implementations return NULL (None) on wrong types
and never raise for bad data.

String positions and lengths follow N1QL: LENGTH, SUBSTR and POSITION count UTF-8 bytes;
the MB_ variants count characters. For ASCII text (the common case) they agree and the fast
path never encodes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from decimal import ROUND_DOWN, ROUND_HALF_EVEN, Decimal, InvalidOperation
from typing import Any

from shardex.core.values import MISSING

from .ops import (
    RANK_ARRAY,
    RANK_BOOL,
    RANK_NUMBER,
    RANK_OBJECT,
    RANK_STRING,
    collate,
    equals,
    is_number,
    type_name,
    type_rank,
)

_WHITESPACE = " \t\n\f\r"


@dataclass(frozen=True, slots=True)
class FunctionSpec:
    name: str  # canonical upper-case name
    min_args: int
    max_args: int | None  # None: variadic
    impl: Callable[..., Any]
    propagate: bool = True
    deterministic: bool = True
    # The implementation's first argument is the statement's params (NOW_*: the statement
    # time travels with them, ``functions_date.statement_time``).
    with_params: bool = False

    def arity_text(self) -> str:
        if self.max_args == self.min_args:
            n = self.min_args
            return f"{n} argument" + ("" if n == 1 else "s")
        if self.max_args is None:
            return f"at least {self.min_args} arguments"
        return f"{self.min_args} to {self.max_args} arguments"


FUNCTIONS: dict[str, FunctionSpec] = {}


def _guarded(impl: Callable[..., Any]) -> Callable[..., Any]:
    """Functions never raise on data: a result no JSON number can hold (an int too long to
    print, an overflow, a non-finite float) is NULL, whatever the function's own checks."""

    def guarded(*args: Any) -> Any:
        try:
            r = impl(*args)
        except (ValueError, ArithmeticError):
            return None
        if type(r) is float and not math.isfinite(r):
            return None
        return r

    guarded.__name__ = getattr(impl, "__name__", "guarded")
    return guarded


def register_function(spec: FunctionSpec, *aliases: str) -> FunctionSpec:
    """Add (or replace) a function; aliases resolve to the same spec and canonical name."""
    spec = replace(spec, impl=_guarded(spec.impl))
    for name in (spec.name, *aliases):
        FUNCTIONS[name.upper()] = spec
    return spec


def lookup_function(name: str) -> FunctionSpec | None:
    return FUNCTIONS.get(name.upper())


def _fn(
    name: str,
    min_args: int,
    max_args: int | None = -1,  # type: ignore[assignment]
    *aliases: str,
    propagate: bool = True,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def deco(impl: Callable[..., Any]) -> Callable[..., Any]:
        hi = min_args if max_args == -1 else max_args
        register_function(FunctionSpec(name, min_args, hi, impl, propagate), *aliases)
        return impl

    return deco


def _int_arg(v: Any) -> int | None:
    """An integral number as int, else None (N1QL: non-integral positions give NULL)."""
    if type(v) is int:
        return v
    if is_number(v) and math.isfinite(v) and float(v).is_integer():
        return int(v)
    return None


def _normalize_number(x: float | int) -> float | int:
    """Integral float results of rounding functions come back as ints (ROUND(2.4) is 2)."""
    if type(x) is float and x.is_integer() and abs(x) < 2**63:
        return int(x)
    return x


# -- string functions ------------------------------------------------------------------------


@_fn("LOWER", 1)
def _lower(s: Any) -> Any:
    return s.lower() if type(s) is str else None


@_fn("UPPER", 1)
def _upper(s: Any) -> Any:
    return s.upper() if type(s) is str else None


@_fn("LENGTH", 1)
def _length(s: Any) -> Any:
    if type(s) is not str:
        return None
    return len(s) if s.isascii() else len(s.encode("utf-8", "surrogatepass"))


@_fn("MB_LENGTH", 1)
def _mb_length(s: Any) -> Any:
    return len(s) if type(s) is str else None


def _substr(s: Any, start: Any, length: Any, *, chars: bool, base: int) -> Any:
    if type(s) is not str:
        return None
    pos = _int_arg(start)
    n_len = None if length is MISSING else _int_arg(length)
    if pos is None or (length is not MISSING and (n_len is None or n_len < 0)):
        return None
    use_chars = chars or s.isascii()
    data: Any = s if use_chars else s.encode("utf-8", "surrogatepass")
    size = len(data)
    if pos < 0:
        pos += size
    elif pos > 0 and base == 1:
        pos -= 1
    if pos < 0 or pos >= size:
        return None
    piece = data[pos:] if n_len is None else data[pos : pos + n_len]
    return piece if use_chars else piece.decode("utf-8", "replace")


@_fn("SUBSTR", 2, 3, "SUBSTR0")
def _substr0(s: Any, start: Any, length: Any = MISSING) -> Any:
    return _substr(s, start, length, chars=False, base=0)


@_fn("SUBSTR1", 2, 3)
def _substr1(s: Any, start: Any, length: Any = MISSING) -> Any:
    return _substr(s, start, length, chars=False, base=1)


@_fn("MB_SUBSTR", 2, 3, "MB_SUBSTR0")
def _mb_substr(s: Any, start: Any, length: Any = MISSING) -> Any:
    return _substr(s, start, length, chars=True, base=0)


@_fn("CONCAT", 2, None)
def _concat(*args: Any) -> Any:
    if all(type(a) is str for a in args):
        return "".join(args)
    return None


def _trim_chars(chars: Any) -> str | None:
    if chars is MISSING:
        return _WHITESPACE
    return chars if type(chars) is str else None


@_fn("TRIM", 1, 2)
def _trim(s: Any, chars: Any = MISSING) -> Any:
    cs = _trim_chars(chars)
    return s.strip(cs) if type(s) is str and cs is not None else None


@_fn("LTRIM", 1, 2)
def _ltrim(s: Any, chars: Any = MISSING) -> Any:
    cs = _trim_chars(chars)
    return s.lstrip(cs) if type(s) is str and cs is not None else None


@_fn("RTRIM", 1, 2)
def _rtrim(s: Any, chars: Any = MISSING) -> Any:
    cs = _trim_chars(chars)
    return s.rstrip(cs) if type(s) is str and cs is not None else None


@_fn("CONTAINS", 2)
def _contains(s: Any, sub: Any) -> Any:
    return sub in s if type(s) is str and type(sub) is str else None


@_fn("POSITION", 2, -1, "POSITION0")
def _position(s: Any, sub: Any) -> Any:
    if type(s) is not str or type(sub) is not str:
        return None
    i = s.find(sub)
    if i <= 0 or s.isascii():
        return i
    return len(s[:i].encode("utf-8", "surrogatepass"))  # N1QL reports a byte offset


@_fn("REPLACE", 3, 4)
def _replace(s: Any, old: Any, new: Any, n: Any = MISSING) -> Any:
    if not (type(s) is str and type(old) is str and type(new) is str):
        return None
    if n is MISSING:
        return s.replace(old, new)
    count = _int_arg(n)
    if count is None:
        return None
    return s.replace(old, new, count if count >= 0 else -1)


# -- number functions ------------------------------------------------------------------------


@_fn("ABS", 1)
def _abs(x: Any) -> Any:
    return abs(x) if is_number(x) else None


@_fn("CEIL", 1)
def _ceil(x: Any) -> Any:
    if not is_number(x):
        return None
    return math.ceil(x) if math.isfinite(x) else x


@_fn("FLOOR", 1)
def _floor(x: Any) -> Any:
    if not is_number(x):
        return None
    return math.floor(x) if math.isfinite(x) else x


def _round_to(x: Any, digits: Any, mode: str) -> Any:
    if not is_number(x):
        return None
    d = _int_arg(digits) if digits is not MISSING else 0
    if d is None:
        return None
    if not math.isfinite(x) or (type(x) is int and d >= 0):
        return x
    try:
        # Decimal of repr(x) rounds the number as written (2.675 -> 2.68), not its binary
        # approximation (Python's round(2.675, 2) gives 2.67).
        q = Decimal(repr(x) if type(x) is float else x).quantize(Decimal(1).scaleb(-d), mode)
    except InvalidOperation:  # precision overflow for absurd digit counts
        return x
    if d <= 0:
        return int(q) if type(x) is int or abs(q) >= 2**63 else _normalize_number(float(q))
    return _normalize_number(float(q))


@_fn("ROUND", 1, 2)
def _round(x: Any, digits: Any = MISSING) -> Any:
    """Half to even, as N1QL's default (ROUND(2.5) is 2, conformance case_func_num)."""
    return _round_to(x, digits, ROUND_HALF_EVEN)


@_fn("TRUNC", 1, 2)
def _trunc(x: Any, digits: Any = MISSING) -> Any:
    return _round_to(x, digits, ROUND_DOWN)


@_fn("SIGN", 1)
def _sign(x: Any) -> Any:
    if not is_number(x):
        return None
    return 1 if x > 0 else (-1 if x < 0 else 0)


@_fn("POWER", 2)
def _power(x: Any, y: Any) -> Any:
    if not (is_number(x) and is_number(y)):
        return None
    try:
        if (
            isinstance(x, int)
            and isinstance(y, int)
            and y > 0
            and y * max(1, abs(x).bit_length()) > _EXACT_POWER_BITS
        ):
            # An exact integer power this large would take minutes and gigabytes
            # (POWER(1e9, 1e9) from one document stalls the pipeline): compute it as a float,
            # which overflows (NULL) like every other non-finite result.
            r = float(x) ** float(y)
        else:
            r = x**y
    except (OverflowError, ZeroDivisionError):
        return None
    return None if isinstance(r, complex) else r


_EXACT_POWER_BITS = 1 << 20  # exact up to a million-bit result (milliseconds)


@_fn("SQRT", 1)
def _sqrt(x: Any) -> Any:
    if not is_number(x) or x < 0:
        return None
    r = math.sqrt(x)
    return _normalize_number(r) if type(x) is int else r


# -- type conversion and checks --------------------------------------------------------------


def _number_to_string(x: float | int) -> str:
    if type(x) is int:
        return str(x)
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    if x.is_integer() and abs(x) < 2**63:
        return str(int(x))
    # Shortest round-trip digits, never in exponent form (as N1QL's FormatFloat(x, 'f', -1)).
    return format(Decimal(repr(x)), "f")


@_fn("TO_STRING", 1, -1, "TOSTRING", "TOSTR")
def _to_string(v: Any) -> Any:
    t = type(v)
    if t is str:
        return v
    if t is bool:
        return "true" if v else "false"
    if is_number(v):
        return _number_to_string(v)
    return None


def _parse_number(text: str) -> int | float | None:
    # Plain decimal notation only, no surrounding spaces (as N1QL's strconv parsing); Python's
    # int()/float() would also accept "1_0", " 1", "inf" and "nan".
    body = text[1:] if text[:1] in ("+", "-") else text
    if not body or body[0] not in ".0123456789" or any(c not in "0123456789.eE+-" for c in body):
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        f = float(text)
    except ValueError:
        return None
    return f if math.isfinite(f) else None


@_fn("TO_NUMBER", 1, -1, "TONUMBER", "TONUM")
def _to_number(v: Any) -> Any:
    t = type(v)
    if t is bool:
        return 1 if v else 0
    if is_number(v):
        return v
    if t is str:
        return _parse_number(v)
    return None


@_fn("TO_BOOLEAN", 1, -1, "TOBOOLEAN", "TOBOOL")
def _to_boolean(v: Any) -> Any:
    if type(v) is bool:
        return v
    if is_number(v):
        return v == v and v != 0
    return len(v) > 0 if type_rank(v) >= RANK_STRING else None


@_fn("TYPE", 1, -1, "TYPENAME", propagate=False)
def _type(v: Any) -> Any:
    return type_name(v)


def _type_check(rank: int) -> Callable[[Any], Any]:
    return lambda v: type_rank(v) == rank


_TYPE_CHECKS = (
    ("IS_BOOLEAN", RANK_BOOL, ("ISBOOLEAN", "ISBOOL", "IS_BOOL")),
    ("IS_NUMBER", RANK_NUMBER, ("ISNUMBER", "ISNUM", "IS_NUM")),
    ("IS_STRING", RANK_STRING, ("ISSTRING", "ISSTR", "IS_STR")),
    ("IS_ARRAY", RANK_ARRAY, ("ISARRAY",)),
    ("IS_OBJECT", RANK_OBJECT, ("ISOBJECT", "ISOBJ", "IS_OBJ")),
)
for _name, _rank, _aliases in _TYPE_CHECKS:
    register_function(FunctionSpec(_name, 1, 1, _type_check(_rank)), *_aliases)
register_function(
    FunctionSpec("IS_ATOM", 1, 1, lambda v: RANK_BOOL <= type_rank(v) <= RANK_STRING), "ISATOM"
)


# -- conditionals for unknowns -----------------------------------------------------------------


@_fn("IFMISSING", 2, None, propagate=False)
def _ifmissing(*args: Any) -> Any:
    for a in args:
        if a is not MISSING:
            return a
    return None


@_fn("IFNULL", 2, None, propagate=False)
def _ifnull(*args: Any) -> Any:
    for a in args:
        if a is not None:
            return a  # may be MISSING, as in N1QL (conformance case_func_cond_unkn)
    return None


@_fn("IFMISSINGORNULL", 2, None, "COALESCE", propagate=False)
def _ifmissingornull(*args: Any) -> Any:
    for a in args:
        if a is not MISSING and a is not None:
            return a
    return None


@_fn("NVL", 2, propagate=False)
def _nvl(a: Any, b: Any) -> Any:
    return a if a is not MISSING and a is not None else b


@_fn("NULLIF", 2, propagate=False)
def _nullif(a: Any, b: Any) -> Any:
    eq = equals(a, b)
    if eq is MISSING or eq is None:
        return eq
    return None if eq else a


@_fn("MISSINGIF", 2, propagate=False)
def _missingif(a: Any, b: Any) -> Any:
    eq = equals(a, b)
    if eq is MISSING or eq is None:
        return eq
    return MISSING if eq else a


@_fn("GREATEST", 2, None, propagate=False)
def _greatest(*args: Any) -> Any:
    best: Any = None
    for a in args:
        if a is MISSING or a is None:
            continue
        if best is None or collate(a, best) > 0:
            best = a
    return best


@_fn("LEAST", 2, None, propagate=False)
def _least(*args: Any) -> Any:
    best: Any = None
    for a in args:
        if a is MISSING or a is None:
            continue
        if best is None or collate(a, best) < 0:
            best = a
    return best


def call_function(spec: FunctionSpec, args: list[Any] | tuple[Any, ...], params: Any = None) -> Any:
    """Apply ``spec`` with N1QL MISSING/NULL propagation (the interpreter's path)."""
    if spec.propagate:
        saw_null = False
        for a in args:
            if a is MISSING:
                return MISSING
            if a is None:
                saw_null = True
        if saw_null:
            return None
    return spec.impl(params, *args) if spec.with_params else spec.impl(*args)
