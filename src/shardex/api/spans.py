"""Scan spans from the caller's form to encoded spans, and partition elimination.

The caller writes ``{"low": [...], "high": [...], "inclusion": "both"|"low"|"high"|
"neither"}``: a bound is a list of key-part values (a shorter list bounds only the leading
parts; ``None`` or a missing bound is an open end). Bounds compare in **index order**: entries
sort by the composite key with DESC parts reversed, so on a DESC key the ``low`` bound is the
*larger* value. That is the only reading under which a composite bound over mixed directions
is one contiguous range, and it is exactly the byte order of encoded keys
(``shardex.index.spans``).

``to_user_spans`` (client side) checks the shape and turns bounds into JSON text for the
wire; ``encode_spans`` (coordinator) turns them into encoded ``Span``s with the index's DESC
flags; ``eliminate`` picks the index partitions a scan must read.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec

from shardex.api.scan import INCLUSIONS, UserSpan, WireSpan
from shardex.core.keycodec import encode_key
from shardex.core.spans import Span
from shardex.errors import ErrorCode, ShardexError
from shardex.meta.index_definition import IndexDefinition, hash_partition

__all__ = [
    "DecodedSpan",
    "eliminate",
    "eliminate_decoded",
    "encode_decoded",
    "encode_spans",
    "from_wire_spans",
    "plain_spans",
    "to_user_spans",
    "to_wire_spans",
]

_SPAN_KEYS = frozenset({"low", "high", "inclusion"})


def _bad(message: str, **details: Any) -> ShardexError:
    return ShardexError(message, code=ErrorCode.BAD_REQUEST, details=details)


def _bound_text(span_no: int, name: str, bound: Any) -> str | None:
    if bound is None:
        return None
    if type(bound) is list:
        parts = bound  # the usual form: no copy, and no ABC isinstance (~1-2k instructions)
    elif isinstance(bound, (str, bytes)) or not isinstance(bound, Sequence):
        raise _bad(
            f"span {span_no}: {name} must be a list of key parts or None, got {bound!r:.80}",
            span=span_no,
            bound=name,
            value=repr(bound)[:200],
            hint=f'e.g. {{"{name}": [30]}} for a one-part bound',
        )
    else:
        parts = list(bound)
    # Plain parts only (inline: a call per part was most of a bound's cost): None, an int
    # or bool, or a printable ASCII string, which msgspec and ``json.dumps`` write alike
    # (json escapes other text as \uXXXX, msgspec writes UTF-8; floats differ in exponent
    # form).
    for part in parts:
        t = type(part)
        if t is str:
            if not (part.isascii() and part.isprintable()):
                break
        elif t is not int and t is not bool and part is not None:
            break
    else:
        # Byte for byte what json.dumps writes (a continuation is bound to this text), at a
        # twentieth of its cost: a client spends it on every bound of every scan.
        return _PLAIN_ENCODER.encode(parts).decode()
    try:
        return json.dumps(parts, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise _bad(
            f"span {span_no}: {name} bound {bound!r:.80} is not JSON: {exc}",
            span=span_no,
            bound=name,
            value=repr(bound)[:200],
            hint="key parts are JSON values: null, booleans, numbers, strings, lists, objects",
        ) from None


_PLAIN_ENCODER = msgspec.json.Encoder()


def to_user_spans(spans: Iterable[Mapping[str, Any]] | None) -> list[UserSpan]:
    """Check the caller's spans and put them in wire form. None or [] scans everything."""
    if spans is None:
        return []
    # ``type(...) is`` first: the usual list of dicts skips the ABC isinstance checks.
    if type(spans) is not list and isinstance(spans, Mapping):
        spans = [spans]  # one span given bare: the obvious meaning
    out: list[UserSpan] = []
    for i, span in enumerate(spans):
        if type(span) is not dict and not isinstance(span, Mapping):
            raise _bad(
                f"span {i} must be a dict with low, high and inclusion, got {span!r:.80}",
                span=i,
                value=repr(span)[:200],
            )
        if not _SPAN_KEYS.issuperset(span):
            extra = set(span) - _SPAN_KEYS
            raise _bad(
                f"span {i} has unknown field(s) {sorted(map(str, extra))}",
                span=i,
                fields=sorted(map(str, extra)),
                hint="a span has low, high and inclusion",
            )
        inclusion = span.get("inclusion", "both")
        if inclusion not in INCLUSIONS:
            raise _bad(
                f"span {i}: inclusion must be one of {', '.join(INCLUSIONS)}, got {inclusion!r}",
                span=i,
                value=repr(inclusion),
                allowed=list(INCLUSIONS),
            )
        low = _bound_text(i, "low", span.get("low"))
        out.append(UserSpan(low, _bound_text(i, "high", span.get("high")), inclusion))
    return out


def _parts(span_no: int, name: str, text: str | None, n_keys: int) -> list[Any] | None:
    if text is None:
        return None
    try:
        parts = json.loads(text)
    except ValueError as exc:
        raise _bad(f"span {span_no}: {name} is not JSON: {exc}", span=span_no) from None
    if not isinstance(parts, list):
        raise _bad(f"span {span_no}: {name} must be a JSON list", span=span_no, value=text[:200])
    if len(parts) > n_keys:
        raise _bad(
            f"span {span_no}: {name} bound has {len(parts)} parts, the index has {n_keys} key(s)",
            span=span_no,
            bound=name,
            value=text[:200],
            hint="a bound lists at most one value per index key, leading keys first",
        )
    return parts


def decode_user_span(span: UserSpan, span_no: int, n_keys: int) -> tuple[Any, Any]:
    """The (low parts, high parts) of a wire span (None: open), checked against the index."""
    if span.inclusion not in INCLUSIONS:
        raise _bad(
            f"span {span_no}: inclusion must be one of {', '.join(INCLUSIONS)}",
            span=span_no,
            value=repr(span.inclusion),
        )
    return (
        _parts(span_no, "low", span.low, n_keys),
        _parts(span_no, "high", span.high, n_keys),
    )


def encode_spans(spans: Sequence[UserSpan], defn: IndexDefinition) -> list[Span] | None:
    """Encoded spans for ``defn`` (None: the whole index). Empty bounds are open ends."""
    if not spans:
        return None
    return encode_decoded(decode_user_spans(spans, defn), defn)


def decode_user_spans(spans: Sequence[UserSpan], defn: IndexDefinition) -> list[DecodedSpan]:
    """Every wire span decoded and checked against ``defn`` (``decode_user_span``): what
    ``encode_decoded`` and ``eliminate_decoded`` take, so a scan decodes its spans once."""
    n_keys = len(defn.keys)
    return [(*decode_user_span(span, i, n_keys), span.inclusion) for i, span in enumerate(spans)]


# A span with its bounds' key parts decoded (None: open) and its inclusion.
DecodedSpan = tuple[list[Any] | None, list[Any] | None, str]


def encode_decoded(spans: Sequence[DecodedSpan], defn: IndexDefinition) -> list[Span] | None:
    """``encode_spans`` of spans decoded already (``decode_user_span``, ``plain_spans``)."""
    if not spans:
        return None
    desc = defn.desc
    return [
        Span(
            low=encode_key(low, desc) if low else None,
            high=encode_key(high, desc) if high else None,
            low_inclusive=inclusion in ("both", "low"),
            high_inclusive=inclusion in ("both", "high"),
        )
        for low, high, inclusion in spans
    ]


def plain_spans(spans: Sequence[Mapping[str, Any]], n_keys: int) -> list[DecodedSpan] | None:
    """Spans in the caller's form (the SQL planner's, checked already) decoded as
    ``decode_user_span(to_user_spans(spans))`` would give them, without the JSON text in
    between, when that text could change nothing: every bound a list of at most ``n_keys``
    parts, each None, a bool, an int or a string (JSON carries those exactly), and a known
    inclusion. None otherwise: take the checked way (floats, nested values, an error)."""
    out: list[DecodedSpan] = []
    for span in spans:
        low, high = span.get("low"), span.get("high")
        inclusion = span.get("inclusion", "both")
        if inclusion not in INCLUSIONS:
            return None
        for bound in (low, high):
            if bound is None:
                continue
            if type(bound) is not list or len(bound) > n_keys:
                return None
            for part in bound:
                t = type(part)
                if t is not str and t is not int and t is not bool and part is not None:
                    return None
        out.append(
            (None if low is None else list(low), None if high is None else list(high), inclusion)
        )
    return out


def to_wire_spans(spans: Sequence[Span] | None) -> list[WireSpan]:
    return [WireSpan(s.low, s.high, s.low_inclusive, s.high_inclusive) for s in spans or ()]


def from_wire_spans(spans: Sequence[WireSpan]) -> list[Span] | None:
    if not spans:
        return None
    return [Span(s.low, s.high, s.low_inclusive, s.high_inclusive) for s in spans]


def _partition_positions(defn: IndexDefinition) -> list[int] | None:
    """Key position of each PARTITION BY expression, or None if one is not a key part."""
    if defn.partition_by is None:
        return None
    keys = [k.expr for k in defn.keys]
    positions = []
    for expr in defn.partition_by:
        if expr not in keys:
            return None
        positions.append(keys.index(expr))
    return positions


def eliminate(spans: Sequence[UserSpan], defn: IndexDefinition) -> list[int]:
    """The index partitions a scan of ``spans`` must read (ascending).

    An index ``PARTITION BY HASH(e1, ...)`` whose partition expressions are all key parts
    places an entry by the values of those parts. A span whose low and high bounds agree on
    every leading part up to the last of those positions fixes them (every entry in the span
    has exactly those values: self-delimiting encodings make the prefix shared), so only the
    slice ``hash(values)`` (the router's and projector's hash, ``hash_partition``) can hold
    its entries. Every span must fix them for the scan to skip a slice."""
    return eliminate_decoded(decode_user_spans(spans, defn), defn)


def eliminate_decoded(spans: Sequence[DecodedSpan], defn: IndexDefinition) -> list[int]:
    """``eliminate`` of spans decoded already (``decode_user_span``, ``plain_spans``)."""
    every = list(range(defn.num_partition))
    positions = _partition_positions(defn)
    if positions is None or not spans or defn.num_partition == 1:
        return every
    need = max(positions) + 1
    chosen: set[int] = set()
    for low, high, _ in spans:
        if low is None or high is None or len(low) < need or len(high) < need:
            return every
        if encode_key(low[:need]) != encode_key(high[:need]):
            return every
        values = [low[p] for p in positions]
        chosen.add(hash_partition(encode_key(values), defn.num_partition))
    return sorted(chosen)
