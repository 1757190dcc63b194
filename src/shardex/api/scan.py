"""Wire messages of index scans: client -> scan coordinator -> indexers.

Two hops, one stream shape. A scan is opened by a request (``IndexScan`` from a client to any
node, which becomes the scan coordinator; ``ScanSlices`` from the coordinator to each indexer
node holding slices to read). The request's reply says the scan exists and at which TS it
reads; the rows then follow as one-way ``ScanBlock`` messages on the same connection, ended
by exactly one ``ScanEnd`` (carrying the error, if any). Flow control is credit based, as for
change streams: the opener grants ``credit`` blocks and returns one ``ScanCredit`` per block
it has consumed; ``CancelScan`` stops a scan early (a satisfied limit, a client that went
away). ``scan_id`` is chosen by the opener and unique on its connection.

Rows travel as raw index entries (``key + 02 + docid``, ``shardex.core.keycodec``): the
coordinator merges on them byte-wise and the client decodes them with the index's DESC flags
(sent in ``IndexScanStarted``), so nobody on the path decodes and re-encodes.

A small scan needs no stream: a reply (``SlicesOpened``, ``IndexScanStarted``) may carry the
first entries, and ``done`` when they are all (no ``ScanBlock``/``ScanEnd`` follow). The
receiver delivers them before any block that overtook the reply; they cost no credit, and
``ScanEnd.rows`` counts only the streamed blocks' entries.

Spans from the client carry their bounds as JSON text (a JSON array of key parts, or null):
JSON keeps integers of any size exactly, which msgpack does not. The coordinator encodes them
with the index's DESC flags; spans to indexers are encoded bounds.
"""

from __future__ import annotations

from typing import Final

import msgspec

from shardex.api.errors import WireError
from shardex.errors import ErrorCode, ShardexError
from shardex.net.messages import Message

__all__ = [
    "CONSISTENCIES",
    "INCLUSIONS",
    "NO_TS",
    "STABILITIES",
    "CancelScan",
    "IndexScan",
    "IndexScanStarted",
    "ScanBlock",
    "ScanCredit",
    "ScanEnd",
    "ScanSlices",
    "SlicesOpened",
    "StabilityAt",
    "UserSpan",
    "WaitStability",
    "WireSpan",
    "WireTs",
    "packed_ts",
    "raw_ts",
    "ts_of",
]

WireTs = dict[int, tuple[int, int]]  # data partition -> (seqno, partition uuid)
NO_TS: Final = msgspec.Raw(b"\xc0")  # an encoded ``WireTs | None`` of None: msgpack nil

NOT_BOUNDED: Final = "not_bounded"
REQUEST_PLUS: Final = "request_plus"
AT_PLUS: Final = "at_plus"
CONSISTENCIES: Final = (NOT_BOUNDED, REQUEST_PLUS, AT_PLUS)

STABILITY_NONE: Final = "none"
STABILITY_SCAN: Final = "scan"
STABILITY_QUERY: Final = "query"
STABILITIES: Final = (STABILITY_NONE, STABILITY_SCAN, STABILITY_QUERY)

INCLUSIONS: Final = ("both", "low", "high", "neither")


class UserSpan(msgspec.Struct, array_like=True, frozen=True):
    """A client's span: bounds as JSON text of a list of key parts (None: open end)."""

    low: str | None = None
    high: str | None = None
    inclusion: str = "both"


class WireSpan(msgspec.Struct, array_like=True, frozen=True):
    """An encoded span (``shardex.core.spans.Span``): encoded key prefixes or None."""

    low: bytes | None = None
    high: bytes | None = None
    low_inclusive: bool = True
    high_inclusive: bool = True


# --- client -> scan coordinator ---------------------------------------------------------------


class IndexScan(Message, tag="scan.IndexScan"):
    """Scan index ``index`` of ``keyspace``. ``spans`` empty: the whole index.

    ``consistency``: not_bounded (no waiting), request_plus (the keyspace's high seqnos now),
    at_plus (``at``). ``stability``: none (the tip), scan (one stability TS for every slice),
    query (``pinned``: the TS a query context holds, or none yet: pick one as for scan).
    ``timeout``: how long the slices may wait for a stability TS (SCAN_TIMEOUT after)."""

    scan_id: int
    keyspace: str
    index: str
    spans: list[UserSpan] = msgspec.field(default_factory=list)
    consistency: str = NOT_BOUNDED
    stability: str = STABILITY_NONE
    at: WireTs | None = None
    pinned: WireTs | None = None
    limit: int | None = None
    offset: int = 0
    ordered: bool = True
    credit: int = 4
    timeout: float = 30.0


class IndexScanStarted(Message, tag="scan.IndexScanStarted"):
    """The scan runs. ``ts``: the stability TS every slice reads (None: the tips), kept
    encoded (``raw_ts`` / ``ts_of``); ``desc``: the index's DESC flags (to decode entries);
    ``partitions``: the index partitions scanned (after elimination)."""

    scan_id: int
    index_id: str
    desc: list[bool]
    # The encoded ``WireTs | None`` (msgpack nil: None), decoded only when asked for: a
    # request_plus TS names every data partition (64: ~76k instructions to decode, most of
    # the client's work on the reply), and most scans never look at it. The bytes
    # on the wire are those of the plain field.
    ts: msgspec.Raw = NO_TS
    partitions: list[int] = msgspec.field(default_factory=list)
    entries: list[bytes] = msgspec.field(default_factory=list)  # as in ``SlicesOpened``
    done: bool = False
    # The address of the node holding most of the slices scanned, when that is not this
    # node: it would read them in-process, so the client sends its next scans of this
    # index there ("" : here is as good). A hint only: any node coordinates any scan.
    prefer: str = ""


_TS_DECODER: Final = msgspec.msgpack.Decoder(WireTs | None)


def raw_ts(ts: WireTs | None) -> msgspec.Raw:
    """``ts`` encoded for ``IndexScanStarted.ts``."""
    return NO_TS if ts is None else msgspec.Raw(msgspec.msgpack.encode(ts))


def ts_of(raw: msgspec.Raw) -> WireTs | None:
    """``IndexScanStarted.ts`` (or ``SlicesOpened.ts``) decoded (None: the tips)."""
    return _TS_DECODER.decode(raw)


def packed_ts(raw: msgspec.Raw) -> bytes | None:
    """An encoded TS field as the bytes a scan coordinator compares (None: the tips)."""
    return None if raw == NO_TS else bytes(raw)


# --- scan coordinator -> indexer ---------------------------------------------------------------


class WaitStability(Message, tag="scan.WaitStability"):
    """Phase one of a stable scan over several indexer nodes: answer, once this node holds
    a published stability TS of ``index_id`` covering ``wait_for`` (None: any), with that TS.
    SCAN_TIMEOUT after ``timeout`` seconds, naming per data partition wanted vs held."""

    index_id: str
    partitions: list[int]
    wait_for: WireTs | None = None
    timeout: float = 30.0
    # request_plus in one round: the data partitions of ``seqnos_keyspace`` this node owns
    # whose high seqnos to read on arrival and return in ``StabilityAt.high_seqnos``.
    seqnos_keyspace: str = ""
    seqnos_of: list[int] = msgspec.field(default_factory=list)


class StabilityAt(Message, tag="scan.StabilityAt"):
    node: str
    ts: WireTs
    # Of ``WaitStability.seqnos_of``, those this node's data service serves, read after the
    # request arrived (None: not read at all).
    high_seqnos: WireTs | None = None


class ScanSlices(Message, tag="scan.ScanSlices"):
    """Read ``partitions`` (local slices of ``index_id``) within ``spans`` (empty: all).

    Where to read: ``snapshot_ts`` set: the snapshot labelled with it (SNAPSHOT_TOO_OLD if
    released); else with ``stability``: the snapshot at the published stability TS, once it
    covers ``wait_for``; else the tip, once the published stability TS covers ``wait_for``
    (None: at once). ``ordered``: the node merges its slices into one stream in entry order.
    ``limit``: at most this many entries in all (the coordinator's offset + limit)."""

    scan_id: int
    index_id: str
    partitions: list[int]
    spans: list[WireSpan] = msgspec.field(default_factory=list)
    snapshot_ts: WireTs | None = None
    wait_for: WireTs | None = None
    stability: bool = False
    timeout: float = 30.0
    limit: int | None = None
    ordered: bool = True
    credit: int = 4
    block_rows: int = 1000
    # request_plus: the data partitions of ``seqnos_keyspace`` this node owns (as the
    # coordinator sees it) whose high seqnos to read on arrival and return in
    # ``SlicesOpened.high_seqnos``: the scan's high-seqno request to this node, without a
    # round trip of its own.
    seqnos_keyspace: str = ""
    seqnos_of: list[int] = msgspec.field(default_factory=list)


class SlicesOpened(Message, tag="scan.SlicesOpened"):
    """The slices are open. ``entries``: the stream's first entries, read at once when that
    was cheap (they precede every ``ScanBlock``); ``done``: they are all of them, no stream
    follows (a small scan is one request and one reply)."""

    scan_id: int
    node: str
    # The snapshot read: an encoded ``WireTs | None`` (msgpack nil: the tips), the bytes
    # of the plain field. The indexer sends its snapshot's cached ``Timestamp.packed()``
    # and the coordinator compares the slices' TSs as bytes and passes them on into
    # ``IndexScanStarted.ts``, decoding only when they differ.
    ts: msgspec.Raw = NO_TS
    entries: list[bytes] = msgspec.field(default_factory=list)
    done: bool = False
    # Of ``ScanSlices.seqnos_of``, the (high seqno, uuid) of those this node's data service
    # serves, read after the request arrived; a partition it does not serve is left out
    # (None: not read at all) and the coordinator asks its owner itself.
    high_seqnos: WireTs | None = None


# --- both hops: the stream --------------------------------------------------------------------


class ScanBlock(Message, tag="scan.ScanBlock"):
    scan_id: int
    entries: list[bytes]


class ScanEnd(Message, tag="scan.ScanEnd"):
    scan_id: int
    error: WireError | None = None
    rows: int = 0  # entries sent in all (a check for the receiver)

    def check(self, received: int) -> None:
        """The receiver's end of a stream (both client scan paths): the sender's error, or
        a count that differs from the entries received, raises."""
        if self.error is not None:
            e = self.error
            raise ShardexError.from_wire(e.code, e.message, e.details)
        if self.rows != received:
            raise ShardexError(
                f"scan {self.scan_id} ended after {received} of {self.rows} rows",
                code=ErrorCode.PROTOCOL_ERROR,
                details={"received": received, "sent": self.rows},
            )


class ScanCredit(Message, tag="scan.ScanCredit"):
    scan_id: int
    blocks: int = 1


class CancelScan(Message, tag="scan.CancelScan"):
    scan_id: int
