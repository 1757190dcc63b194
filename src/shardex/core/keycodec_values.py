"""Single-value part of the key collation codec (see :mod:`shardex.core.keycodec`).

Byte layout of one value
------------------------
A one-byte tag, then a payload. Tags lie in ``0x10..0x70`` with gaps for future types, so
neither a tag nor an inverted (DESC) tag is ever ``00``, ``01``, ``02`` or ``FF``::

    MISSING 10 | null 20 | false 30 | true 31
    number < 0  40 + magnitude, every byte inverted     0  41     number > 0  42 + magnitude
    string      50 + UTF-8 with NUL -> 00 FF + 00 01
    array       60 + element encodings + 01
    object      70 + (string encoding of name + value encoding)* in name order + 01

Numbers are exact. Every finite int or float is ``n / 2**k``, so the codec works in binary and
never rounds (a big int is never turned into a float; the exact decimal of a float can run to
~750 digits, its binary fraction is at most 52 bits). A magnitude ``2**x * 1.f``, with the
trailing zero bits of ``f`` stripped so each value has one form, is written as:

* exponent: ``x + 0x8000`` as 2 big-endian bytes when that lies in ``0001..FFFE`` (every
  float, every int below ``2**32767``); larger ints write ``FF FF``, a length byte and ``x``
  big-endian. A larger exponent always sorts higher.
* fraction: ``f`` in 7-bit groups (last one zero-padded), one group in the high 7 bits of each
  byte, low bit 1 on every byte but the last; an empty fraction is the byte ``00``. As ``f``
  ends in a 1 bit, a fraction that continues is larger than one that stops, which is what the
  continuation bit says; the final even byte makes the field self-delimiting.

Negative magnitudes are inverted, which reverses their order and stays self-delimiting.
Equal ints and floats give identical bytes. Decoding returns an ``int`` when the value is
integral (``x >= len(f)``) and a ``float`` otherwise (only floats are non-integral, so the
float is exact).

In a string every ``00`` is followed by ``FF``, so the first ``00 01`` is the terminator, and
``00 01 < 00 FF < other bytes`` puts a string before its extensions (UTF-8 byte order is code
point order). ``01`` ends arrays and objects and is below every tag, so a proper prefix sorts
first. Object names carry the string tag so an empty name is not confused with the end.
Hence no encoding is a proper prefix of another: concatenations of encodings are unambiguous.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, NoReturn

from shardex.core.values import MISSING, JsonValue
from shardex.errors import ErrorCode, ShardexError

TAG_END: Final = 0x01
TAG_DOCID: Final = 0x02  # used by keycodec for index entries
TAG_MISSING: Final = 0x10
TAG_NULL: Final = 0x20
TAG_FALSE: Final = 0x30
TAG_TRUE: Final = 0x31
TAG_NEG: Final = 0x40
TAG_ZERO: Final = 0x41
TAG_POS: Final = 0x42
TAG_STR: Final = 0x50
TAG_ARR: Final = 0x60
TAG_OBJ: Final = 0x70

INVERT: Final = bytes(255 - i for i in range(256))
"""``bytes.translate`` table flipping every bit: one C call reverses a part's byte order."""

_B_END, _B_MISSING, _B_NULL = b"\x01", b"\x10", b"\x20"
_B_FALSE, _B_TRUE = b"\x30", b"\x31"
_B_NEG, _B_ZERO, _B_POS = b"\x40", b"\x41", b"\x42"
_B_STR, _B_ARR, _B_OBJ = b"\x50", b"\x60", b"\x70"
STR_TERM: Final = b"\x00\x01"

HINT_TYPES: Final = "index keys hold JSON values: null, bool, int, float, str, list, dict"


# --------------------------------------------------------------------------- errors


def short_repr(value: object) -> str:
    try:
        r = repr(value)
    except ValueError:  # holds an int beyond sys.get_int_max_str_digits()
        r = f"<{type(value).__name__} too large to print>"
    return r if len(r) <= 200 else r[:197] + "..."


def reject(value: object, reason: str, hint: str) -> NoReturn:
    """Raise ``BAD_REQUEST`` for a value that cannot be part of an index key."""
    r = short_repr(value)
    raise ShardexError(
        f"cannot use {r} in an index key: {reason}",
        code=ErrorCode.BAD_REQUEST,
        details={"value": r, "type": type(value).__name__, "reason": reason, "hint": hint},
    )


def reject_non_finite(value: float) -> NoReturn:
    reject(value, "NaN and infinities are not JSON values", "map them to null or a string")


def reject_unsupported(value: object) -> NoReturn:
    if value is MISSING:
        reject(value, "MISSING cannot appear inside an array or object", "use null there")
    reject(value, f"unsupported type {type(value).__name__}", HINT_TYPES)


def malformed(data: bytes, why: str) -> NoReturn:
    raise ShardexError(
        f"malformed encoded key: {why}",
        code=ErrorCode.BAD_REQUEST,
        details={"bytes": data[:64].hex(), "length": len(data), "reason": why},
    )


# --------------------------------------------------------------------------- number codec

_pack_u16 = struct.Struct(">H").pack
_M56: Final = (1 << 56) - 1
_M64: Final = (1 << 64) - 1
_CONT: Final = tuple(int.from_bytes(b"\x01" * (g - 1) + b"\x00", "big") for g in range(1, 9))
_LOW7: Final = tuple(int.from_bytes(b"\x7f" * g, "big") for g in range(1, 9))


def _spread56(m: int) -> int:
    """Move the eight 7-bit groups of ``m < 2**56`` into the low 7 bits of eight bytes.

    Three shift-and-mask steps (28 -> 32, 14 -> 16, 7 -> 8 bit lanes) instead of a loop over
    groups: constant work for every float and every int below 2**57.
    """
    m = (m & 0xFFFFFFF) | ((m & 0xFFFFFFF0000000) << 4)
    m = (m & 0x00003FFF00003FFF) | ((m & 0x0FFFC0000FFFC000) << 2)
    return (m & 0x007F007F007F007F) | ((m & 0x3F803F803F803F80) << 1)


def _compress64(s: int) -> int:
    """Inverse of :func:`_spread56` (bit 7 of every byte clear)."""
    s = (s & 0x007F007F007F007F) | ((s & 0x7F007F007F007F00) >> 1)
    s = (s & 0x00003FFF00003FFF) | ((s & 0x3FFF00003FFF0000) >> 2)
    return (s & 0xFFFFFFF) | ((s & 0x0FFFFFFF00000000) >> 4)


def groups_to_bytes(m: int, g: int) -> bytes:
    """Fraction field of the ``7 * g``-bit group string ``m``."""
    if g <= 8:
        return ((_spread56(m) << 1) | _CONT[g - 1]).to_bytes(g, "big")
    s = shift = 0
    while m:  # 8 groups per step; only ints above 2**57 get here
        s |= _spread56(m & _M56) << shift
        m >>= 56
        shift += 64
    cont = int.from_bytes(b"\x01" * (g - 1) + b"\x00", "big")
    return ((s << 1) | cont).to_bytes(g, "big")


def bytes_to_groups(data: bytes) -> int:
    """Inverse of :func:`groups_to_bytes`: the ``7 * len(data)``-bit group string."""
    g = len(data)
    if g <= 8:
        return _compress64((int.from_bytes(data, "big") >> 1) & _LOW7[g - 1])
    s = (int.from_bytes(data, "big") >> 1) & int.from_bytes(b"\x7f" * g, "big")
    m = shift = 0
    while s:
        m |= _compress64(s & _M64) << shift
        s >>= 64
        shift += 56
    return m


def encode_magnitude(n: int, k: int) -> bytes:
    """Exponent and fraction fields of ``n / 2**k`` (``n > 0``; ``k`` may be negative)."""
    tz = (n & -n).bit_length() - 1  # strip trailing zero bits: one canonical form per value
    if tz:
        n >>= tz
        k -= tz
    flen = n.bit_length() - 1  # fraction bits after the leading one
    x = flen - k  # 2**x <= value < 2**(x + 1)
    u = x + 0x8000
    if u < 0xFFFF:  # every float has x >= -1074, so u > 0 here
        head = _pack_u16(u)
    else:
        nb = (x.bit_length() + 7) // 8
        head = b"\xff\xff" + bytes((nb,)) + x.to_bytes(nb, "big")
    if flen == 0:
        return head + b"\x00"
    g = (flen + 6) // 7
    return head + groups_to_bytes((n ^ (1 << flen)) << (7 * g - flen), g)


def _byte_class(values: range) -> bytes:
    return b"[" + b"".join(re.escape(bytes((b,))) for b in values) + b"]"


# The end of a fraction field is found by a C-level regex (continuation bytes, then one final
# byte) rather than a Python loop over bytes. Negative magnitudes are inverted: there the
# continuation bytes are the even ones.
_FRACTION: Final = re.compile(_byte_class(range(1, 256, 2)) + b"*" + _byte_class(range(0, 256, 2)))
_FRACTION_INV: Final = re.compile(
    _byte_class(range(0, 256, 2)) + b"*" + _byte_class(range(1, 256, 2))
)


def decode_magnitude(buf: bytes, pos: int) -> tuple[int | float, int]:
    """Decode the (non-inverted) magnitude at ``pos``: ``(value, end)``."""
    u = (buf[pos] << 8) | buf[pos + 1]
    if u == 0xFFFF:
        nb = buf[pos + 2]
        x = int.from_bytes(buf[pos + 3 : pos + 3 + nb], "big")
        pos += 3 + nb
    else:
        x = u - 0x8000
        pos += 2
    m = _FRACTION.match(buf, pos)
    if m is None:
        raise ValueError("unterminated number")
    end = m.end()
    groups = bytes_to_groups(buf[pos:end])
    if groups:
        tz = (groups & -groups).bit_length() - 1
        flen = 7 * (end - pos) - tz
        mant = (1 << flen) | (groups >> tz)
    else:
        mant, flen = 1, 0
    e = x - flen
    if e >= 0:
        return mant << e, end
    if flen > 52:
        raise ValueError("non-integral number with more precision than a float")
    return math.ldexp(mant, e), end


def _inverted_magnitude_end(buf: bytes, pos: int) -> int:
    if buf[pos] == 0 and buf[pos + 1] == 0:  # inverted FF FF: extended exponent
        pos += 3 + (buf[pos + 2] ^ 0xFF)
    else:
        pos += 2
    m = _FRACTION_INV.match(buf, pos)
    if m is None:
        raise ValueError("unterminated number")
    return m.end()


# --------------------------------------------------------------------------- encoding
# Exact-type dispatch through a dict: one lookup per value, and bool (a subclass of int) gets
# its own entry. Subclasses and rejections go through the slow isinstance path.


def _encode_int_uncached(v: int) -> bytes:
    if v > 0:
        return _B_POS + encode_magnitude(v, 0)
    if v < 0:
        return _B_NEG + encode_magnitude(-v, 0).translate(INVERT)
    return _B_ZERO


# Small integers (counts, years, codes) dominate real keys: precomputed. Integral floats hit
# the same table, since 3.0 == 3 and hash(3.0) == hash(3) (and -0.0 == 0).
_SMALL: Final = {i: _encode_int_uncached(i) for i in range(-1024, 4096)}
_SMALL_DECODED: Final = {b: i for i, b in _SMALL.items()}


def _encode_int(v: int) -> bytes:
    b = _SMALL.get(v)
    return b if b is not None else _encode_int_uncached(v)


_frexp = math.frexp
_isfinite = math.isfinite


def _encode_float(v: float) -> bytes:
    b = _SMALL.get(v)
    if b is not None:
        return b
    if not _isfinite(v):
        reject_non_finite(v)
    # frexp is exact: v = m * 2**e with 0.5 <= |m| < 1, so m * 2**53 is an integer (also for
    # subnormals) and the float never goes through decimal or as_integer_ratio.
    m, e = _frexp(v)
    if m > 0.0:
        return _B_POS + encode_magnitude(int(m * 9007199254740992.0), 53 - e)
    return _B_NEG + encode_magnitude(int(-m * 9007199254740992.0), 53 - e).translate(INVERT)


def str_body(s: str) -> bytes:
    """Escaped UTF-8 plus terminator (the string encoding without its tag)."""
    # surrogatepass keeps lone surrogates in code-point order; bytes.replace escapes in C.
    return s.encode("utf-8", "surrogatepass").replace(b"\x00", b"\x00\xff") + STR_TERM


def _encode_str(s: str) -> bytes:
    return _B_STR + s.encode("utf-8", "surrogatepass").replace(b"\x00", b"\x00\xff") + STR_TERM


def _encode_array(v: Sequence[Any]) -> bytes:
    parts = [_B_ARR]
    append = parts.append
    for e in v:
        enc = _NESTED.get(type(e))
        append(enc(e) if enc is not None else _encode_other(e, nested=True))
    append(_B_END)
    return b"".join(parts)


def _encode_object(v: Mapping[Any, Any]) -> bytes:
    for name in v:
        if not isinstance(name, str):
            reject(v, f"object name {short_repr(name)} is not a string", HINT_TYPES)
    parts = [_B_OBJ]
    append = parts.append
    for name in sorted(v):  # str order is code-point order
        e = v[name]
        append(_encode_str(name))
        enc = _NESTED.get(type(e))
        append(enc(e) if enc is not None else _encode_other(e, nested=True))
    append(_B_END)
    return b"".join(parts)


def _encode_other(v: object, nested: bool) -> bytes:
    """Slow path: subclasses of the JSON types; rejection of everything else."""
    if isinstance(v, bool):
        return _B_TRUE if v else _B_FALSE
    if isinstance(v, int):
        return _encode_int(int(v))
    if isinstance(v, float):
        return _encode_float(float(v))
    if isinstance(v, str):
        return _encode_str(str(v))
    if isinstance(v, (list, tuple)):
        return _encode_array(v)
    if isinstance(v, Mapping):
        return _encode_object(v)
    if v is MISSING and not nested:
        return _B_MISSING
    reject_unsupported(v)


_NESTED: Final[dict[type, Callable[[Any], bytes]]] = {
    type(None): lambda v: _B_NULL,
    bool: lambda v: _B_TRUE if v else _B_FALSE,
    int: _encode_int,
    float: _encode_float,
    str: _encode_str,
    list: _encode_array,
    tuple: _encode_array,
    dict: _encode_object,
}
_TOP: Final[dict[type, Callable[[Any], bytes]]] = {**_NESTED, type(MISSING): lambda v: _B_MISSING}


def encode_value(v: JsonValue) -> bytes:
    """Self-delimiting, order-preserving bytes of one JSON value or a top-level ``MISSING``.

    Raises ``ShardexError(BAD_REQUEST)`` for NaN, infinities, non-JSON types, non-string
    object names and ``MISSING`` inside an array or object.
    """
    enc = _TOP.get(type(v))
    return enc(v) if enc is not None else _encode_other(v, nested=False)


# --------------------------------------------------------------------------- decoding
# decode_at(buf, pos) -> (value, end), through a 256-slot table indexed by the tag byte.

Decoder = Callable[[bytes, int], tuple[Any, int]]


def _dec_const(value: Any) -> Decoder:
    return lambda buf, pos: (value, pos + 1)


# A nonzero integer of ``_SMALL`` encodes in 4 or 5 bytes (tag, 2 exponent bytes, 1-2
# fraction bytes). Encodings are prefix-free, so when the 4 (or 5) bytes at ``pos`` are a
# whole small int's encoding, that is the value there: two dict lookups instead of the
# magnitude decoder (ages, counts, years: most numbers in real keys).
_small_int = _SMALL_DECODED.get
SMALL_INTS: Final = _SMALL_DECODED
"""Encoding -> value of every small int (``-1024..4095``; nonzero ones are 4-5 bytes): for
decoders of their own (``shardex.client.rows``). Read only."""


def _small_at(buf: bytes, pos: int) -> tuple[Any, int] | None:
    """The small int encoded at ``pos`` (4 or 5 bytes; encodings are prefix-free) and its end."""
    small = _small_int(buf[pos : pos + 4])
    if small is not None:
        return small, pos + 4
    small = _small_int(buf[pos : pos + 5])
    if small is not None:
        return small, pos + 5
    return None


def _dec_pos(buf: bytes, pos: int) -> tuple[Any, int]:
    return _small_at(buf, pos) or decode_magnitude(buf, pos + 1)


def _dec_neg(buf: bytes, pos: int) -> tuple[Any, int]:
    small = _small_at(buf, pos)
    if small is not None:
        return small
    end = _inverted_magnitude_end(buf, pos + 1)
    value, _ = decode_magnitude(buf[pos + 1 : end].translate(INVERT), 0)
    return -value, end


def dec_str(buf: bytes, pos: int) -> tuple[Any, int]:
    """Decode a string body starting at ``pos`` (just after the tag, if any)."""
    end = buf.index(STR_TERM, pos)  # escaped NULs are 00 FF: the first 00 01 ends the body
    body = buf[pos:end]
    if b"\x00" in body:
        body = body.replace(b"\x00\xff", b"\x00")
    return body.decode("utf-8", "surrogatepass"), end + 2


def _dec_tagged_str(buf: bytes, pos: int) -> tuple[Any, int]:
    return dec_str(buf, pos + 1)


def _dec_arr(buf: bytes, pos: int) -> tuple[Any, int]:
    out: list[Any] = []
    pos += 1
    while buf[pos] != TAG_END:
        v, pos = DECODERS[buf[pos]](buf, pos)
        out.append(v)
    return out, pos + 1


def _dec_obj(buf: bytes, pos: int) -> tuple[Any, int]:
    out: dict[str, Any] = {}
    pos += 1
    while buf[pos] != TAG_END:
        if buf[pos] != TAG_STR:
            raise ValueError("object name is not a string")
        name, pos = dec_str(buf, pos + 1)
        out[name], pos = DECODERS[buf[pos]](buf, pos)
    return out, pos + 1


def _dec_bad(buf: bytes, pos: int) -> tuple[Any, int]:
    raise ValueError(f"unknown tag 0x{buf[pos]:02x} at offset {pos}")


DECODERS: Final[list[Decoder]] = [_dec_bad] * 256
DECODERS[TAG_MISSING] = _dec_const(MISSING)
DECODERS[TAG_NULL] = _dec_const(None)
DECODERS[TAG_FALSE] = _dec_const(False)
DECODERS[TAG_TRUE] = _dec_const(True)
DECODERS[TAG_NEG] = _dec_neg
DECODERS[TAG_ZERO] = _dec_const(0)
DECODERS[TAG_POS] = _dec_pos
DECODERS[TAG_STR] = _dec_tagged_str
DECODERS[TAG_ARR] = _dec_arr
DECODERS[TAG_OBJ] = _dec_obj

DECODE_ERRORS: Final = (IndexError, ValueError)  # UnicodeDecodeError is a ValueError


def decode_value(data: bytes) -> JsonValue:
    """Inverse of :func:`encode_value`; numbers come back as ``int`` when integral."""
    data = bytes(data)
    small = _SMALL_DECODED.get(data)
    if small is not None:
        return small
    try:
        value, end = DECODERS[data[0]](data, 0)
    except DECODE_ERRORS as exc:
        malformed(data, str(exc) or type(exc).__name__)
    if end != len(data):
        malformed(data, f"{len(data) - end} trailing bytes")
    return value
