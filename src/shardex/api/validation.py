"""Input checks run before any lock is taken or byte written.

Every check raises a ``ShardexError`` whose ``details`` name the offending value, so a caller
(or the bulk loader's per-line report) can say exactly what was wrong. Nothing here touches
storage: a rejected request cannot have changed anything.
"""

from __future__ import annotations

import re
from typing import Any, Literal

import msgspec

from shardex.api.errors import BadRequest, DocTooLarge

MAX_DOCID_BYTES = 250
DEFAULT_MAX_DOC_BYTES = 1024 * 1024
# The deepest nesting of objects and arrays a document may have (``{"a": 1}`` is 1 deep).
# Why a limit: msgspec's decoder and encoder recurse once per level and raise RecursionError
# near Python's recursion limit (~1000, less on a deep stack), and every reader (the client's
# get, the projector, the SQL evaluator) recurses as well: a deeper document could be stored
# and then not read. 128 is serde_json's default; real documents stay far below it.
MAX_DOC_DEPTH = 128

# The levels of a write's durability. ``none``: acknowledged once in the active copy's
# RocksDB (its WAL in the OS, not fsynced: survives a crash of the process, not of the
# machine). ``persist_active``: the active's WAL fsynced. The three Couchbase names add the
# replicas: ``majority`` (a majority of the partition's copies, the active counted, hold the
# write in memory), ``majority_persist_active`` (that, and the active's WAL fsynced),
# ``persist_majority`` (a majority have fsynced it). ``persist`` and ``memory`` are the older
# names of ``persist_active`` and ``none``, still accepted.
Durability = Literal[
    "none",
    "persist_active",
    "majority",
    "majority_persist_active",
    "persist_majority",
    "persist",
    "memory",
]
DURABILITY_LEVELS = (
    "none",
    "persist_active",
    "majority",
    "majority_persist_active",
    "persist_majority",
)
DURABILITY_ALIASES = {"persist": "persist_active", "memory": "none"}
DURABILITIES = DURABILITY_LEVELS + tuple(DURABILITY_ALIASES)
# Levels a majority of the copies must acknowledge, and those where each of them must fsync.
MAJORITY_LEVELS = frozenset(("majority", "majority_persist_active", "persist_majority"))
SYNCED_LEVELS = frozenset(
    ("persist_active", "majority_persist_active", "persist_majority", "persist")
)

# How long a majority write may wait for its copies when the caller names it
# (``durability_timeout=``, seconds; None: the node's own default). Bounded: a waiting write
# keeps its document pending (reads of it wait) and its waiter in the node's memory, so a
# caller may not hold them for hours by mistake. 65.535 s is also the most Couchbase's
# protocol can carry (milliseconds in 16 bits).
MAX_DURABILITY_TIMEOUT = 65.535
# Seconds a write's sender waits for its reply past the write's durability timeout, so it
# hears the node's DURABILITY_AMBIGUOUS rather than its own TIMEOUT.
DURABILITY_REPLY_SLACK = 2.0

_POSITION = re.compile(r"\(byte (\d+)\)")
# Built once: ``msgspec.json.decode(body, type=dict)`` converts the type on every call, which
# measured 3x the parse itself for a 300-byte document (20 vs 7 us), on every write, on the
# client and again on the node.
_OBJECT = msgspec.json.Decoder(dict)
_encode_json = msgspec.json.Encoder().encode
_encode_msgpack = msgspec.msgpack.Encoder().encode
# A document deeper than MAX_DOC_DEPTH has more than that many '{' / '[' bytes, so it is at
# least this long: shorter bodies (most) skip the depth check; longer ones count their
# opening brackets in one C pass (``translate``) and only a body with more than the limit is
# scanned for its real depth.
_DEEP_MIN_BYTES = 2 * (MAX_DOC_DEPTH + 1)
_NOT_OPENERS = bytes(b for b in range(256) if b not in b"[{")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)


def check_docid(docid: object) -> str:
    if not isinstance(docid, str):
        raise BadRequest(
            f"docid must be a string, got {type(docid).__name__}",
            details={"docid": repr(docid)[:100]},
        )
    if not docid:
        raise BadRequest("docid must not be empty", details={"docid": ""})
    try:
        n = len(docid.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise BadRequest(
            f"docid is not valid Unicode text: {exc.reason}",
            details={"docid": repr(docid)[:100], "position": exc.start},
        ) from None
    if n > MAX_DOCID_BYTES:
        raise BadRequest(
            f"docid is {n} UTF-8 bytes, the limit is {MAX_DOCID_BYTES}",
            details={"docid": docid[:60] + "...", "size": n, "limit": MAX_DOCID_BYTES},
        )
    return docid


def encode_document(doc: object, max_bytes: int, docid: str = "") -> bytes:
    """The JSON bytes to store for ``doc``: a dict (encoded), or JSON text / bytes that must
    parse as an object (kept as given, so a client that already holds JSON pays no re-encode).

    The size is checked before parsing text so an oversized body is never parsed."""
    # The common case first (the node's every write: JSON the caller already holds, kept
    # without a copy); any failure takes the general path below for its error.
    if type(doc) is bytes and len(doc) <= max_bytes:
        try:
            _OBJECT.decode(doc)
        except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
            pass
        else:
            if len(doc) >= _DEEP_MIN_BYTES:
                _check_depth(doc, docid)
            return doc
    if isinstance(doc, dict):
        try:
            body = _encode_json(doc)
        except (TypeError, ValueError, OverflowError) as exc:
            raise BadRequest(
                f"document is not JSON-serialisable: {exc}", details={"docid": docid}
            ) from None
        except RecursionError:
            raise _too_deep(docid, _object_depth(doc)) from None
        _check_size(body, max_bytes, docid)
        if len(body) >= _DEEP_MIN_BYTES:
            _check_depth(body, docid)
        # msgspec writes NaN and +-Infinity as null (JSON has neither): a body with no null
        # has none. One with a null is encoded again as MessagePack (C, cheaper than a walk
        # in Python), where such a float is 0xcb then an exponent of all ones; only a hit
        # (or a value MessagePack cannot take) is walked, for the error and its path.
        if b"null" in body:
            try:
                packed = _encode_msgpack(doc)
            except (TypeError, ValueError, OverflowError):
                packed = b"\xcb\x7f"
            if b"\xcb\x7f" in packed or b"\xcb\xff" in packed:
                _check_finite(doc, docid)
        return body
    if isinstance(doc, str):
        try:
            body = doc.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise BadRequest(
                f"document text is not valid Unicode: {exc.reason}",
                details={"docid": docid, "position": exc.start},
            ) from None
    elif type(doc) is bytes:  # the common case: JSON the caller already holds, no copy
        body = doc
    elif isinstance(doc, bytes | bytearray | memoryview):
        body = bytes(doc)
    else:
        raise BadRequest(
            f"document must be a JSON object (dict) or JSON text, got {type(doc).__name__}",
            details={"docid": docid, "type": type(doc).__name__},
        )
    _check_size(body, max_bytes, docid)
    try:
        _OBJECT.decode(body)
    except RecursionError:
        raise _too_deep(docid, json_depth(body)) from None
    except msgspec.ValidationError as exc:
        if str(exc).startswith("Number out of range"):  # 1e999: a float that is Infinity
            raise BadRequest(
                f"document {docid!r} has a number out of range: {exc}",
                details={"docid": docid, "hint": "JSON numbers must be finite doubles"},
            ) from None
        raise BadRequest(
            f"document must be a JSON object: {exc}", details={"docid": docid}
        ) from None
    except msgspec.DecodeError as exc:
        m = _POSITION.search(str(exc))
        position = int(m.group(1)) if m else None
        details: dict[str, Any] = {"docid": docid, "position": position}
        if position is not None and body[position : position + 1] in (b"N", b"I"):
            details["hint"] = "NaN and Infinity are not JSON: store null or a string"
        raise BadRequest(f"document is not valid JSON: {exc}", details=details) from None
    except UnicodeDecodeError as exc:  # msgspec's own error for a string that is not UTF-8
        raise BadRequest(
            f"document is not valid UTF-8: {exc.reason}",
            details={"docid": docid, "position": exc.start},
        ) from None
    if len(body) >= _DEEP_MIN_BYTES:
        _check_depth(body, docid)
    return body


def _check_depth(body: bytes, docid: str) -> None:
    """DOC_TOO_DEEP-style BAD_REQUEST if ``body`` (valid JSON) nests past MAX_DOC_DEPTH."""
    if len(body.translate(None, _NOT_OPENERS)) > MAX_DOC_DEPTH:
        depth = json_depth(body)
        if depth > MAX_DOC_DEPTH:
            raise _too_deep(docid, depth)


def json_depth(body: bytes) -> int:
    """The deepest nesting of objects and arrays in JSON text; brackets inside strings do
    not count. Only run on the rare body with more opening brackets than the limit."""
    depth = deepest = 0
    for c in _STRING.sub(b"", body).translate(None, _NOT_BRACKETS):
        if c == 0x5B or c == 0x7B:  # [ {
            depth += 1
            if depth > deepest:
                deepest = depth
        else:
            depth -= 1
    return deepest


def _object_depth(doc: object, cap: int = 100_000) -> int:
    """The nesting depth of a Python value (dicts, lists, tuples, sets), without recursion;
    stops at ``cap`` (a cycle would otherwise never end)."""
    deepest = 0
    stack: list[tuple[object, int]] = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children: Any = value.values()
        elif isinstance(value, list | tuple | set | frozenset):
            children = value
        else:
            continue
        deepest = max(deepest, depth)
        if depth >= cap:
            break
        stack.extend((c, depth + 1) for c in children)
    return deepest


def _too_deep(docid: str, depth: int) -> BadRequest:
    return BadRequest(
        f"document {docid!r} is nested {depth} levels deep, the limit is {MAX_DOC_DEPTH}",
        details={
            "docid": docid,
            "depth": depth,
            "limit": MAX_DOC_DEPTH,
            "hint": "flatten the document (objects and arrays count as levels)",
        },
    )


def _check_finite(doc: dict[Any, Any], docid: str) -> None:
    """BAD_REQUEST naming the path of the first NaN or +-Infinity in ``doc``, if any. The
    walk builds no paths: only a document found guilty is walked again for one."""
    stack: list[Any] = [doc]
    pop, push = stack.pop, stack.extend
    while stack:
        value = pop()
        if isinstance(value, dict):
            push(value.values())
        elif isinstance(value, float):
            if value - value != 0.0:  # NaN and +-Infinity only (inf - inf is NaN)
                path = _nonfinite_path(doc, "$")
                raise BadRequest(
                    f"document {docid!r} has {value!r} at {path}: JSON has no NaN or Infinity",
                    details={
                        "docid": docid,
                        "path": path,
                        "hint": "store null, a string, or leave the field out",
                    },
                )
        elif isinstance(value, _SEQUENCES):
            push(value)


_SEQUENCES = (list, tuple, set, frozenset)  # a tuple: isinstance of a union is slower


def _nonfinite_path(value: Any, path: str) -> str | None:
    """Where the first non-finite float in ``value`` is (the encoder went through it, so
    the recursion is bounded)."""
    if isinstance(value, float):
        return path if value - value != 0.0 else None
    if isinstance(value, dict):
        items: Any = ((f"{path}.{k}", v) for k, v in value.items())
    elif isinstance(value, list | tuple):
        items = ((f"{path}[{i}]", v) for i, v in enumerate(value))
    elif isinstance(value, set | frozenset):
        items = ((f"{path}[]", v) for v in value)
    else:
        return None
    for p, v in items:
        found = _nonfinite_path(v, p)
        if found is not None:
            return found
    return None


def _check_size(body: bytes, max_bytes: int, docid: str) -> None:
    if len(body) > max_bytes:
        raise DocTooLarge(
            f"document is {len(body)} bytes encoded, the limit is {max_bytes}",
            details={"docid": docid, "size": len(body), "limit": max_bytes},
        )


def check_cas(cas: object) -> int | None:
    if cas is None:
        return None
    if isinstance(cas, bool) or not isinstance(cas, int) or cas <= 0:
        raise BadRequest(
            f"cas must be a positive integer or None, got {cas!r}", details={"cas": repr(cas)}
        )
    return cas


def check_durability(durability: object) -> bool:
    """True when the active's WAL must be fsynced before the acknowledgement."""
    if durability not in DURABILITIES:
        raise BadRequest(
            f"durability must be one of {DURABILITY_LEVELS}, got {durability!r}",
            details={
                "durability": repr(durability),
                "hint": "persist and memory are also accepted, as persist_active and none",
            },
        )
    return durability in SYNCED_LEVELS


def durability_level(durability: object) -> str:
    """The canonical name of a durability level (aliases resolved); BAD_REQUEST if unknown."""
    check_durability(durability)
    assert isinstance(durability, str)
    return DURABILITY_ALIASES.get(durability, durability)


def write_reply_timeout(durability_timeout: float | None, request_timeout: float) -> float:
    """Seconds a write's sender waits for its reply: ``request_timeout``, or the write's
    ``durability_timeout`` plus ``DURABILITY_REPLY_SLACK`` when that is longer."""
    if durability_timeout is None:
        return request_timeout
    return max(request_timeout, durability_timeout + DURABILITY_REPLY_SLACK)


def check_durability_timeout(timeout: object) -> float | None:
    """A write's ``durability_timeout`` (seconds; None: the node's default) as a float;
    BAD_REQUEST unless a finite number in (0, MAX_DURABILITY_TIMEOUT]."""
    if timeout is None:
        return None
    ok = isinstance(timeout, int | float) and not isinstance(timeout, bool)
    if ok and 0 < timeout <= MAX_DURABILITY_TIMEOUT:  # False for NaN as well
        return float(timeout)
    raise BadRequest(
        f"durability_timeout must be a number of seconds in (0, {MAX_DURABILITY_TIMEOUT:g}], "
        f"got {timeout!r}",
        details={
            "durability_timeout": repr(timeout),
            "maximum": MAX_DURABILITY_TIMEOUT,
            "hint": "pass seconds as a float (e.g. 2.5), or None for the node's default; it "
            "applies to the majority levels only",
        },
    )


def majority_of(copies: int) -> int:
    """How many of a partition's ``copies`` (active + replicas) make a majority."""
    return copies // 2 + 1


def check_seqno(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadRequest(
            f"{name} must be a non-negative integer, got {value!r}", details={name: repr(value)}
        )
    return value
