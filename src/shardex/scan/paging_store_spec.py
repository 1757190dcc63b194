"""What a paginated scan is on real nodes: the client's request, the spec every node reads,
and the context a continuation pins.

Three layers, three structs:

* ``PageScan`` (client -> any node, the proxy) names the scan as the user wrote it: keyspace,
  index (or ``#primary``), spans, consistency, page size and the continuation;
* ``PagedScanSpec`` is the opaque ``scan`` of every ``ShardBatch`` (proxy -> shard node):
  the keyspace, the index id ("" for a primary scan), encoded spans and the snapshot to read;
* ``PageContext`` rides inside the continuation (``Continuation.context``, covered by its
  HMAC): what the first page fixed for all later ones, the index id and the stability TS.

Primary scans (``index="#primary"``): shard = data node, partition = data partition, key =
the docid's UTF-8 bytes (RocksDB's document order). A primary span bounds the docid with a
one-part list (``{"low": ["doc10"], "high": ["doc20"]}``); its bounds are exact docids, so
they are turned into exact ``[lo, hi)`` byte ranges here (inclusive low, exclusive high).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Final

import msgspec

from shardex.api.scan import NOT_BOUNDED, UserSpan, WireSpan, WireTs
from shardex.api.spans import from_wire_spans
from shardex.core.spans import Range, spans_to_ranges
from shardex.errors import ErrorCode, ShardexError
from shardex.net.messages import Message

__all__ = [
    "PRIMARY",
    "PageContext",
    "PageScan",
    "PageScanReply",
    "PagedScanSpec",
    "primary_spans",
    "spec_ranges",
]

PRIMARY: Final = "#primary"
_AFTER: Final = b"\x00"  # after + 00 is the smallest byte string greater than after


class PageScan(Message, tag="scan.PageScan"):
    """One page of a paginated, elasticity-safe scan (``client.scan_page``).

    ``stability``: None picks "scan" for request_plus / at_plus (the first page pins one
    stability TS and every page reads it) and "none" for not_bounded (every page reads the
    tips). ``timeout``: how long the first page may wait for the index to catch up."""

    keyspace: str
    index: str
    page_size: int
    spans: list[UserSpan] = msgspec.field(default_factory=list)
    consistency: str = NOT_BOUNDED
    stability: str | None = None
    at: WireTs | None = None
    continuation: str | None = None
    ordered: bool = False
    timeout: float = 30.0


class PageScanReply(Message, tag="scan.PageScanReply"):
    """``entries``: raw index entries (``key + 02 + docid``, decode with ``desc``) or, for a
    primary scan, UTF-8 docids. ``continuation``: None when the scan is complete. ``ts``: the
    stability TS every page of this scan reads (None: the tips)."""

    entries: list[bytes]
    continuation: str | None
    primary: bool
    desc: list[bool] = msgspec.field(default_factory=list)
    ts: WireTs | None = None


class PagedScanSpec(msgspec.Struct, array_like=True, frozen=True):
    """The ``scan`` bytes of a ``ShardBatch``: everything a shard node needs to read."""

    keyspace: str
    index_id: str  # "" for a primary scan
    spans: list[WireSpan] = msgspec.field(default_factory=list)
    snapshot: WireTs | None = None  # index scans: the stability TS to read (None: the tips)

    @property
    def primary(self) -> bool:
        return not self.index_id


class PageContext(msgspec.Struct, array_like=True, frozen=True):
    """Pinned by the first page in ``Continuation.context``."""

    index_id: str = ""
    snapshot: WireTs | None = None
    lease: str = ""  # the snapshot lease of a pinned scan ("": none; ``paging_leases``)


_spec_encoder = msgspec.msgpack.Encoder()
_spec_decoder = msgspec.msgpack.Decoder(PagedScanSpec)
_context_decoder = msgspec.msgpack.Decoder(PageContext)


def encode_spec(spec: PagedScanSpec) -> bytes:
    return _spec_encoder.encode(spec)


def decode_spec(raw: bytes) -> PagedScanSpec:
    try:
        return _spec_decoder.decode(raw)
    except msgspec.DecodeError as exc:
        raise ShardexError(
            f"undecodable paginated scan spec: {exc}",
            code=ErrorCode.BAD_REQUEST,
            details={"hint": "ShardBatch.scan must come from a page coordinator"},
        ) from None


def encode_context(ctx: PageContext) -> bytes:
    return _spec_encoder.encode(ctx)


def decode_context(raw: bytes) -> PageContext:
    return PageContext() if not raw else _context_decoder.decode(raw)


def request_identity(msg: PageScan, stability: str) -> bytes:
    """The bytes a continuation is bound to: the scan as the user wrote it (not ``at``,
    which only matters for the first page, nor the page size, which may vary per page)."""
    spans = [(s.low, s.high, s.inclusion) for s in msg.spans]
    return _spec_encoder.encode(
        ["page-scan", msg.keyspace, msg.index, spans, msg.consistency, stability]
    )


def _bad(message: str, **details: Any) -> ShardexError:
    return ShardexError(message, code=ErrorCode.BAD_REQUEST, details=details)


def _docid_bound(span_no: int, name: str, text: str | None) -> bytes | None:
    if text is None:
        return None
    try:
        parts = json.loads(text)
    except ValueError as exc:
        raise _bad(f"span {span_no}: {name} is not JSON: {exc}", span=span_no) from None
    if not isinstance(parts, list) or len(parts) > 1:
        raise _bad(
            f"span {span_no}: a primary scan's {name} bound is a list of one docid, got {text}",
            span=span_no,
            bound=name,
            value=text[:200],
            hint='e.g. {"low": ["doc10"], "high": ["doc20"]}',
        )
    if not parts:
        return None
    docid = parts[0]
    if not isinstance(docid, str):
        raise _bad(
            f"span {span_no}: a docid bound must be a string, got {docid!r:.80}",
            span=span_no,
            bound=name,
            value=repr(docid)[:200],
            hint="document ids are strings",
        )
    return docid.encode("utf-8")


def primary_spans(spans: Sequence[UserSpan]) -> list[WireSpan]:
    """Docid spans as exact ``[lo, hi)`` wire spans (inclusive low, exclusive high)."""
    out: list[WireSpan] = []
    for i, span in enumerate(spans):
        low = _docid_bound(i, "low", span.low)
        high = _docid_bound(i, "high", span.high)
        if low is not None and span.inclusion not in ("both", "low"):
            low += _AFTER
        if high is not None and span.inclusion in ("both", "high"):
            high += _AFTER
        out.append(WireSpan(low=low, high=high, low_inclusive=True, high_inclusive=False))
    return out


def spec_ranges(spec: PagedScanSpec) -> list[Range]:
    """The spec's spans as sorted, disjoint ``[lower, upper)`` byte ranges."""
    return spans_to_ranges(from_wire_spans(spec.spans))
