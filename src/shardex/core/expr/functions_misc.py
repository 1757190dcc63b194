"""Miscellaneous utility functions: BASE64 encoding and decoding, LEN, VERSION and
DS_VERSION (UUID is in ``functions_uuid``).

Registered into the shared registry on import (see ``functions_num``). BASE64 encodes a
value's JSON text, as N1QL (``BASE64("a")`` encodes ``"a"`` with its quotes, and NULL
encodes ``null``), so BASE64_DECODE gives back the value itself.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from shardex import __version__
from shardex.core.values import MISSING

from .functions import FunctionSpec, _fn, _number_to_string, register_function
from .functions_json import encode_json
from .ops import RANK_ARRAY, RANK_BOOL, RANK_NUMBER, RANK_OBJECT, type_rank


@_fn("BASE64", 1, -1, "BASE64_ENCODE", "ENCODE_BASE64", propagate=False)
def _base64(v: Any) -> Any:
    if v is MISSING:
        return MISSING
    return base64.b64encode(encode_json(v).encode("utf-8", "surrogatepass")).decode("ascii")


@_fn("BASE64_DECODE", 1, -1, "DECODE_BASE64")
def _base64_decode(text: Any) -> Any:
    """The value whose BASE64 encoding ``text`` is; NULL for anything else."""
    if type(text) is not str:
        return None
    try:
        raw = base64.b64decode(text, validate=True)
        return json.loads(raw.decode("utf-8"), parse_constant=_not_json)
    except (binascii.Error, ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


@_fn("LEN", 1)
def _len(v: Any) -> Any:
    """Characters of a string, fields of an object, elements of an array, 1 for a boolean
    and the length of a number's text."""
    rank = type_rank(v)
    if type(v) is str or rank in (RANK_ARRAY, RANK_OBJECT):
        return len(v)
    if rank == RANK_BOOL:
        return 1
    if rank == RANK_NUMBER:
        return len(_number_to_string(v))
    return None


def _version() -> str:
    return __version__


# Not deterministic: a version differs across upgrades, so it may not define an index key.
register_function(FunctionSpec("VERSION", 0, 0, _version, deterministic=False))
register_function(FunctionSpec("DS_VERSION", 0, 0, _version, deterministic=False))
