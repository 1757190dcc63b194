"""Hash functions: HASHBYTES (N1QL's, with its algorithm options) and MD5 / SHA1 / SHA256 /
SHA512 as shorthands, each returning the digest as lower-case hex.

Registered into the shared registry on import (see ``functions_num``). What is hashed: a
string's UTF-8 bytes, any other value's JSON text (as ENCODE_JSON writes it), so equal values
hash equally wherever they are evaluated.

HASHBYTES' algorithms are N1QL's list: crc32 (IEEE, Castagnoli, Koopman or any 32-bit
polynomial in Go's reversed-bit notation), md4, md5, sha224, sha256, sha384, sha512,
sha512/224 and sha512/256. MD4 is computed here (RFC 1320): OpenSSL 3 no longer offers it
to hashlib. An unknown algorithm or a malformed option is NULL, as in N1QL.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from shardex.core.values import MISSING

from .functions import _fn
from .functions_json import encode_json
from .ops import RANK_OBJECT, is_number, type_rank


def _input_bytes(v: Any) -> bytes:
    text = v if type(v) is str else encode_json(v)
    return text.encode("utf-8", "surrogatepass")


# -- CRC-32 with any polynomial --------------------------------------------------------------

_MASK32 = 0xFFFFFFFF
_CRC32_IEEE = 0xEDB88320  # reversed-bit forms, as Go's hash/crc32 names them
_CRC32_POLYNOMIALS = {"ieee": _CRC32_IEEE, "castagnoli": 0x82F63B78, "koopman": 0xEB31D82E}


@lru_cache(maxsize=16)
def _crc32_table(poly: int) -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ poly if crc & 1 else crc >> 1
        table.append(crc)
    return tuple(table)


def _crc32(data: bytes, poly: int) -> bytes:
    if poly == _CRC32_IEEE:
        crc = zlib.crc32(data)  # the C implementation for the common polynomial
    else:
        table, crc = _crc32_table(poly), _MASK32
        for b in data:
            crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
        crc ^= _MASK32
    return crc.to_bytes(4, "big")


def _polynomial(v: Any) -> int | None:
    """The ``polynomial`` option: a name, a number, or a number's text ("0x..." allowed)."""
    if v is MISSING:
        return _CRC32_IEEE
    if type(v) is str:
        named = _CRC32_POLYNOMIALS.get(v.lower())
        if named is not None:
            return named
        try:
            v = int(v, 0)
        except ValueError:
            return None
    if not is_number(v) or v != int(v) or not 0 < v <= _MASK32:
        return None
    return int(v)


# -- MD4 (RFC 1320) ---------------------------------------------------------------------------


def _rotl(x: int, n: int) -> int:
    x &= _MASK32
    return ((x << n) | (x >> (32 - n))) & _MASK32


_MD4_ROUNDS: tuple[
    tuple[Callable[[int, int, int], int], int, tuple[int, ...], tuple[int, ...]], ...
] = (
    (lambda x, y, z: (x & y) | (~x & z), 0, tuple(range(16)), (3, 7, 11, 19)),
    (
        lambda x, y, z: (x & y) | (x & z) | (y & z),
        0x5A827999,
        (0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15),
        (3, 5, 9, 13),
    ),
    (
        lambda x, y, z: x ^ y ^ z,
        0x6ED9EBA1,
        (0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15),
        (3, 9, 11, 15),
    ),
)


def md4(data: bytes) -> bytes:
    n = len(data)
    data += b"\x80" + b"\x00" * ((55 - n) % 64) + struct.pack("<Q", (n * 8) & (2**64 - 1))
    state = [0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476]
    for off in range(0, len(data), 64):
        x = struct.unpack("<16I", data[off : off + 64])
        a, b, c, d = state
        for f, k, order, shifts in _MD4_ROUNDS:
            for i, j in enumerate(order):
                # Each step updates one register, cycling a, d, c, b.
                s = shifts[i % 4]
                if i % 4 == 0:
                    a = _rotl(a + f(b, c, d) + x[j] + k, s)
                elif i % 4 == 1:
                    d = _rotl(d + f(a, b, c) + x[j] + k, s)
                elif i % 4 == 2:
                    c = _rotl(c + f(d, a, b) + x[j] + k, s)
                else:
                    b = _rotl(b + f(c, d, a) + x[j] + k, s)
        state = [(v + w) & _MASK32 for v, w in zip(state, (a, b, c, d), strict=True)]
    return struct.pack("<4I", *state)


# -- the functions ----------------------------------------------------------------------------

_HASHLIB_NAMES = {
    "md5": "md5",
    "sha224": "sha224",
    "sha256": "sha256",
    "sha384": "sha384",
    "sha512": "sha512",
    "sha512/224": "sha512_224",
    "sha512/256": "sha512_256",
}


def _digest(algorithm: str, data: bytes, options: dict[str, Any]) -> bytes | None:
    if algorithm == "crc32":
        poly = _polynomial(options.get("polynomial", MISSING))
        return None if poly is None else _crc32(data, poly)
    if algorithm == "md4":
        return md4(data)
    name = _HASHLIB_NAMES.get(algorithm)
    return None if name is None else hashlib.new(name, data).digest()


@_fn("HASHBYTES", 1, 2)
def _hashbytes(v: Any, options: Any = MISSING) -> Any:
    """HASHBYTES(value [, algorithm | {"algorithm": ..., "polynomial": ...}]); sha256 by
    default (also for an options object without an algorithm)."""
    if options is MISSING:
        opts: dict[str, Any] = {}
    elif type(options) is str:
        opts = {"algorithm": options}
    elif type(options) is dict or type_rank(options) == RANK_OBJECT:
        opts = dict(options)
    else:
        return None
    algorithm = opts.get("algorithm", "sha256")
    if type(algorithm) is not str:
        return None
    digest = _digest(algorithm.lower(), _input_bytes(v), opts)
    return None if digest is None else digest.hex()


def _shorthand(name: str) -> Callable[[Any], Any]:
    def impl(v: Any) -> Any:
        return hashlib.new(name, _input_bytes(v)).hexdigest()

    return impl


for _name in ("MD5", "SHA1", "SHA256", "SHA512"):
    _fn(_name, 1)(_shorthand(_name.lower()))
