"""Order-preserving key collation codec for secondary indexes.

Index keys live in RocksDB, which orders keys by plain byte comparison. This module maps JSON
values (plus SQL++ ``MISSING``), composite keys and index entries to bytes whose byte order is
the collation order, and back. :func:`collate` is the pure-Python reference comparator with
the same order (SQL ``ORDER BY`` and the tests use it). The single-value byte layout lives in
:mod:`shardex.core.keycodec_values`.

Collation order
---------------
``MISSING < null < false < true < numbers < strings < arrays < objects``.

* Numbers compare by exact mathematical value across ``int`` and ``float`` (no rounding:
  ``2**53 + 1 > 2.0**53``, ``10**23 > 1e23``, ``2**200`` and ``-(2**200)`` are exact);
  ``-0.0 == 0.0 == 0``. NaN and infinities are not JSON and are rejected.
* Strings compare by Unicode code point (lone surrogates included).
* Arrays compare element by element; a proper prefix sorts first.
* Objects compare as the list of their ``(name, value)`` pairs sorted by name, pair by pair
  (name first, then value); a proper prefix sorts first. So
  ``{} < {"a": 9} < {"a": 9, "b": 0} < {"a": 10} < {"b": 0}``.
* ``MISSING`` is allowed only as a top-level value / key part, never inside an array or
  object. Tuples are accepted as arrays and any ``Mapping`` with ``str`` names as an object.

Values that compare equal encode to identical bytes, so decoding normalises numbers:
**decode returns an ``int`` when the value is integral and a ``float`` otherwise** (``1.0``,
``-0.0`` and ``1e300`` decode as ``1``, ``0`` and the exact integer ``int(1e300)``; ``0.5``
stays ``0.5``). Arrays decode as ``list``; objects as ``dict`` with names in sorted order.

Byte layout (summary)
---------------------
Value = tag byte + payload: ``MISSING 10, null 20, false 30, true 31, negative 40 + inverted
magnitude, zero 41, positive 42 + magnitude, string 50 + UTF-8 (NUL -> 00 FF) + 00 01,
array 60 + elements + 01, object 70 + (name string + value)* + 01``. A magnitude is a binary
exponent (2 bytes, biased) and the fraction bits in 7-bit groups with a continuation bit.
Every value encoding is self-delimiting: none is a proper prefix of another.

Composite keys and DESC
-----------------------
A composite key is the concatenation of its part encodings. A DESC part has all its bytes
inverted (``b ^ 0xFF``). Inversion maps a prefix-free set onto a prefix-free set and reverses
the order of any two members (they first differ at some byte, which inversion flips), so keys
still compare part by part with DESC parts reversed, and a key that is a prefix of another
(fewer parts) still sorts first.

Index entries
-------------
``entry = key + 02 + docid`` with the docid as an escaped UTF-8 string body ending ``00 01``.
``02`` is below every tag and every inverted tag (``8F..EF``), so entries sort by
``(key, docid)``, and the decoder finds the docid without knowing the number of key parts.
:func:`key_prefix_bounds` gives the ``[low, high)`` byte range holding exactly the entries
whose leading key parts equal given values: ``low`` is the encoded prefix (self-delimiting
parts make "starts with low" equivalent to "leading parts collate equal"), ``high`` its
:func:`successor`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from operator import itemgetter
from typing import Any, Final

from shardex.core.keycodec_values import (
    DECODE_ERRORS,
    DECODERS,
    HINT_TYPES,
    INVERT,
    TAG_DOCID,
    dec_str,
    decode_value,
    encode_value,
    malformed,
    reject,
    reject_non_finite,
    reject_unsupported,
    short_repr,
    str_body,
)
from shardex.core.values import MISSING, JsonValue
from shardex.errors import ErrorCode, ShardexError

__all__ = [
    "collate",
    "collation_key",
    "decode_entry",
    "decode_entry_key",
    "decode_key",
    "decode_value",
    "encode_entry",
    "encode_key",
    "encode_value",
    "key_prefix_bounds",
    "successor",
]

_B_DOCID: Final = bytes((TAG_DOCID,))

collation_key: Final[Callable[[JsonValue], bytes]] = encode_value
"""``sorted(values, key=collation_key)`` sorts in collation order (it is :func:`encode_value`)."""


# --------------------------------------------------------------------------- composite keys


def _check_desc(n: int, desc: Sequence[bool]) -> None:
    if len(desc) < n:
        raise ShardexError(
            f"{n} key parts but only {len(desc)} DESC flags",
            code=ErrorCode.BAD_REQUEST,
            details={"parts": n, "flags": len(desc), "hint": "pass one flag per key part"},
        )


def encode_key(values: Sequence[JsonValue], desc: Sequence[bool] | None = None) -> bytes:
    """Composite key: the concatenated part encodings, DESC parts byte-inverted.

    ``desc`` holds one flag per part; ``None`` means all ascending. Extra trailing flags are
    ignored, so an index's full flag list also serves for a prefix of its key.
    """
    if desc is None:
        return b"".join([encode_value(v) for v in values])
    _check_desc(len(values), desc)
    return b"".join(
        [
            encode_value(v).translate(INVERT) if d else encode_value(v)
            for v, d in zip(values, desc, strict=False)
        ]
    )


def _decode_parts(
    data: bytes, desc: Sequence[bool] | None, entry: bool
) -> tuple[list[JsonValue], int]:
    """Decode key parts up to the end of ``data`` or, for an entry, up to the docid marker."""
    # One inverted copy of the whole buffer serves every DESC part: offsets are the same, so a
    # DESC part decodes in place without first finding where it ends.
    inv = data.translate(INVERT) if desc is not None and any(desc) else data
    parts: list[JsonValue] = []
    pos = 0
    n = len(data)
    try:
        while pos < n:
            if data[pos] == TAG_DOCID:
                if entry:
                    break
                malformed(data, "document id marker in a key (use decode_entry)")
            i = len(parts)
            if desc is not None and i >= len(desc):
                malformed(data, f"more key parts than the {len(desc)} DESC flags")
            buf = inv if desc is not None and desc[i] else data
            value, pos = DECODERS[buf[pos]](buf, pos)
            parts.append(value)
    except DECODE_ERRORS as exc:
        malformed(data, str(exc) or type(exc).__name__)
    return parts, pos


def decode_key(data: bytes, desc: Sequence[bool] | None = None) -> list[JsonValue]:
    """Inverse of :func:`encode_key`; ``desc`` must flag at least every part present."""
    return _decode_parts(bytes(data), desc, entry=False)[0]


# --------------------------------------------------------------------------- index entries


def encode_entry(
    values: Sequence[JsonValue], docid: str, desc: Sequence[bool] | None = None
) -> bytes:
    """Index entry ``encode_key(values, desc) + 02 + docid``: sorts by ``(key, docid)``."""
    if not isinstance(docid, str):
        reject(docid, "a document id must be a string", "pass the docid as str")
    return encode_key(values, desc) + _B_DOCID + str_body(docid)


def decode_entry(data: bytes, desc: Sequence[bool] | None = None) -> tuple[list[JsonValue], str]:
    """Inverse of :func:`encode_entry`: ``(key parts, docid)``."""
    data = bytes(data)
    parts, pos = _decode_parts(data, desc, entry=True)
    if pos >= len(data):
        malformed(data, "no document id")
    try:
        docid, end = dec_str(data, pos + 1)
    except DECODE_ERRORS as exc:
        malformed(data, f"bad document id: {exc}")
    if end != len(data):
        malformed(data, f"{len(data) - end} trailing bytes")
    return parts, docid


def decode_entry_key(
    data: bytes, desc: Sequence[bool] | None = None
) -> tuple[list[JsonValue], int]:
    """The key parts of an entry and the offset of its docid marker: ``data[:offset]`` is
    the key's encoding, so an entry that starts with those bytes followed by the marker has
    the same key parts (readers of sorted entries decode each distinct key once)."""
    data = bytes(data)
    parts, pos = _decode_parts(data, desc, entry=True)
    if pos >= len(data):
        malformed(data, "no document id")
    return parts, pos


def successor(prefix: bytes) -> bytes:
    """The smallest byte string greater than every string that starts with ``prefix``.

    Drops trailing ``FF`` bytes and increments the last remaining byte. A prefix made only of
    ``FF`` bytes (or empty) has none: ``ShardexError(BAD_REQUEST)``.
    """
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        raise ShardexError(
            f"byte string {prefix.hex() or '(empty)'} has no successor",
            code=ErrorCode.BAD_REQUEST,
            details={"prefix": prefix.hex(), "hint": "use an open upper bound"},
        )
    return stripped[:-1] + bytes((stripped[-1] + 1,))


def key_prefix_bounds(
    values: Sequence[JsonValue], desc: Sequence[bool] | None = None
) -> tuple[bytes, bytes]:
    """``[low, high)`` covering exactly the entries whose leading key parts equal ``values``.

    ``desc`` are the index's flags (at least ``len(values)`` of them). With no values the
    range is everything: no key or entry starts with ``FF``.
    """
    low = encode_key(values, desc)
    return (low, successor(low)) if low else (b"", b"\xff")


# --------------------------------------------------------------------------- reference order
# Type classes in collation order.
_R_MISSING, _R_NULL, _R_FALSE, _R_TRUE, _R_NUM, _R_STR, _R_ARR, _R_OBJ = range(8)
_RANKS: Final[dict[type, int]] = {
    type(None): _R_NULL,
    int: _R_NUM,
    str: _R_STR,
    list: _R_ARR,
    tuple: _R_ARR,
}


def _rank(v: Any, nested: bool) -> int:
    """Type class of ``v``; rejects exactly what the encoder rejects."""
    r = _RANKS.get(type(v))
    if r is not None:
        return r
    if isinstance(v, bool):
        return _R_TRUE if v else _R_FALSE
    if isinstance(v, float):
        if not math.isfinite(v):
            reject_non_finite(v)
        return _R_NUM
    if isinstance(v, int):
        return _R_NUM
    if isinstance(v, str):
        return _R_STR
    if isinstance(v, (list, tuple)):
        return _R_ARR
    if isinstance(v, Mapping):
        for name in v:
            if not isinstance(name, str):
                reject(v, f"object name {short_repr(name)} is not a string", HINT_TYPES)
        return _R_OBJ
    if v is MISSING and not nested:
        return _R_MISSING
    reject_unsupported(v)


def _sign(a: Any, b: Any) -> int:
    return (a > b) - (a < b)


def _cmp(a: Any, b: Any, nested: bool) -> int:
    ra = _rank(a, nested)
    rb = _rank(b, nested)
    if ra != rb:
        return -1 if ra < rb else 1
    if ra in (_R_NUM, _R_STR):
        # Python compares int with float exactly (no rounding) and str by code point.
        return _sign(a, b)
    if ra == _R_ARR:
        for x, y in zip(a, b, strict=False):
            c = _cmp(x, y, True)
            if c:
                return c
        return _sign(len(a), len(b))
    if ra == _R_OBJ:
        pa = sorted(a.items(), key=itemgetter(0))
        pb = sorted(b.items(), key=itemgetter(0))
        for (na, va), (nb, vb) in zip(pa, pb, strict=False):
            if na != nb:
                return -1 if na < nb else 1
            c = _cmp(va, vb, True)
            if c:
                return c
        return _sign(len(pa), len(pb))
    return 0  # MISSING, null, false, true: one value per class


def _validate(v: Any, nested: bool) -> None:
    r = _rank(v, nested)
    if r == _R_ARR:
        for e in v:
            _validate(e, True)
    elif r == _R_OBJ:
        for e in v.values():
            _validate(e, True)


def compare_values(a: JsonValue, b: JsonValue) -> int:
    """``collate`` without validating both values in full first: for values already known to
    be JSON (document fields, expression results), where the comparison is a hot path (SQL
    filters and sorts). An invalid value met on the way still raises."""
    return _cmp(a, b, False)


def collate(a: JsonValue, b: JsonValue) -> int:
    """Reference comparator: -1, 0 or 1 as ``a`` sorts before, equal to or after ``b``.

    Written from the collation rules, not from the bytes; same order and same domain as the
    encoder: both values are checked in full first, so NaN, infinities and non-JSON values
    raise the same ``ShardexError`` even where the order is decided before reaching them.
    To sort many values, ``sorted(values, key=collation_key)`` is faster.
    """
    _validate(a, False)
    _validate(b, False)
    return _cmp(a, b, False)
