"""Messages of the data service (client <-> data node, manager -> data node).

Document bodies travel as JSON text inside msgpack ``bin`` fields: the client encodes a dict
once, the data node validates and stores those very bytes, and a get returns the stored bytes
untouched. Nothing on the path re-encodes a document.

Tags carry a ``data.`` prefix because short names such as ``Upsert`` or ``Delete`` are also
what the index pipeline calls its key versions; tags must be unique across the code base.

A write's ``durability_timeout`` bounds how long a majority level waits for the copies
(``validation.check_durability_timeout``); None, and every frame of a peer that predates
the field, means the node's own default.

Change streams: ``OpenStream`` is a request (its reply, or its ROLLBACK error, says whether the
stream exists); the node then sends ``StreamBatch`` one-way messages on the same connection and
finally one ``StreamEnd``. Flow control is credit based: the opener grants ``credit`` batches
and returns one credit (``StreamCredit``) per batch it has consumed, so neither side ever buffers
more than ``credit`` batches of one stream.
"""

from __future__ import annotations

import msgspec

from shardex.api.errors import WireError
from shardex.api.records import MutationResult
from shardex.net.messages import Message

# (seqno, docid, op, cas, body or None for a deletion, flags, expiry): a change on the wire as a
# msgpack array, about half the bytes of a map with field names.
ChangeTuple = tuple[int, str, str, int, bytes | None, int, int]


# --- documents -----------------------------------------------------------------------------


class Insert(Message, tag="data.Insert"):
    keyspace: str
    docid: str
    doc: bytes  # JSON text of an object
    durability: str = "persist"
    durability_timeout: float | None = None  # seconds; None: the node's default
    # 0: none (the keyspace's max_ttl, if any); up to 30 days: seconds from the write;
    # above: absolute epoch seconds (``api/expiry.py``). As on every write below.
    expiry: int = 0


class Upsert(Message, tag="data.Upsert"):
    keyspace: str
    docid: str
    doc: bytes
    cas: int | None = None
    durability: str = "persist"
    durability_timeout: float | None = None  # seconds; None: the node's default
    expiry: int = 0


class Replace(Message, tag="data.Replace"):
    keyspace: str
    docid: str
    doc: bytes
    cas: int | None = None
    durability: str = "persist"
    durability_timeout: float | None = None  # seconds; None: the node's default
    expiry: int = 0


class Delete(Message, tag="data.Delete"):
    keyspace: str
    docid: str
    cas: int | None = None
    durability: str = "persist"
    durability_timeout: float | None = None  # seconds; None: the node's default


class Touch(Message, tag="data.Touch"):
    """Set an existing document's expiry (``expiry`` as a write's), its body unchanged: a
    new version (seqno, CAS), answered with a ``MutationReply``; DOC_NOT_FOUND when absent
    or expired."""

    keyspace: str
    docid: str
    expiry: int
    cas: int | None = None
    durability: str = "persist"
    durability_timeout: float | None = None


class GetAndTouch(Message, tag="data.GetAndTouch"):
    """A ``Touch``, then the document as it is after it: answered with a ``GetReply``."""

    keyspace: str
    docid: str
    expiry: int
    durability: str = "persist"
    durability_timeout: float | None = None


class MutationReply(Message, tag="data.MutationReply"):
    result: MutationResult


class Get(Message, tag="data.Get"):
    keyspace: str
    docid: str
    # read whatever copy the node holds, active or replica: possibly stale (``replica="any"``)
    replica: bool = False


class GetReply(Message, tag="data.GetReply"):
    body: bytes  # the stored JSON text
    cas: int
    seqno: int
    expiry: int = 0  # absolute epoch seconds, 0 for never


class OpItem(msgspec.Struct, array_like=True, frozen=True):
    """One mutation of a ``MutateMany``: kind is insert / upsert / replace / delete /
    touch (no doc); ``expiry`` as a single write's."""

    kind: str
    docid: str
    doc: bytes = b""
    cas: int | None = None
    expiry: int = 0


class MutateMany(Message, tag="data.MutateMany"):
    """A batch for one node. Items of one partition apply in order; each item succeeds or
    fails on its own (a bulk load must not stop at one bad document)."""

    keyspace: str
    ops: list[OpItem]
    durability: str = "persist"
    durability_timeout: float | None = None


class ItemError(msgspec.Struct, array_like=True, frozen=True):
    index: int
    error: WireError


class MutateManyReply(Message, tag="data.MutateManyReply"):
    results: list[MutationResult | None]  # None where ``errors`` has the item's error
    errors: list[ItemError] = msgspec.field(default_factory=list)


class GetMany(Message, tag="data.GetMany"):
    """Several documents of one keyspace from their owner in one request, read by the
    engine in one call (SQL fetches). Docids this node does not own come back as per-item
    NOT_MY_PARTITION errors; the caller re-routes just those."""

    keyspace: str
    docids: list[str]
    with_cas: bool = False  # also answer each document's CAS (DML's optimistic writes)
    with_expiry: bool = False  # also answer each document's expiry (SQL's META().expiration)


class GetManyReply(Message, tag="data.GetManyReply"):
    bodies: list[bytes | None]  # aligned with the docids; None: absent, deleted, or an error
    errors: list[ItemError] = msgspec.field(default_factory=list)
    cas: list[int] = msgspec.field(default_factory=list)  # with ``with_cas``: aligned, 0 = absent
    # with ``with_expiry``: aligned, absolute epoch seconds (0: none, or absent)
    expiries: list[int] = msgspec.field(default_factory=list)


# --- seqnos and stats ------------------------------------------------------------------------


class HighSeqnos(Message, tag="data.HighSeqnos"):
    """Answered by any data node: it gathers every partition's (seqno, uuid) from the owners.
    With ``partitions`` set the node answers for those of its own partitions only (the
    gathering node's fan-out request)."""

    keyspace: str
    partitions: list[int] | None = None


class HighSeqnosReply(Message, tag="data.HighSeqnosReply"):
    entries: dict[int, tuple[int, int]]  # partition -> (high seqno, uuid)


class CheckHistory(Message, tag="data.CheckHistory"):
    """Asked of a partition's owner: is each point (partition, seqno, uuid) in that
    partition's current history (the failover log's rule, as a stream open checks it)?
    Answered from memory. An at_plus read checks its mutation tokens so: a token of a branch
    a failover lost fails clearly, and one of an older branch still in the history is read
    as the same point on the current branch."""

    keyspace: str
    points: list[tuple[int, int, int]]  # (partition, seqno, uuid)


class HistoryPoint(msgspec.Struct, array_like=True, frozen=True):
    partition: int
    rollback: int | None  # None: in the history; else the seqno it must roll back to
    uuid: int  # the partition's current branch
    high: int


class HistoryChecked(Message, tag="data.HistoryChecked"):
    points: list[HistoryPoint]


class PartitionStat(msgspec.Struct, array_like=True, frozen=True):
    partition: int
    node: str
    doc_count: int
    high_seqno: int
    uuid: int
    state: str


class KeyspaceStats(Message, tag="data.KeyspaceStats"):
    """Per-partition document counts and owners, gathered like ``HighSeqnos``."""

    keyspace: str
    partitions: list[int] | None = None


class KeyspaceStatsReply(Message, tag="data.KeyspaceStatsReply"):
    partitions: list[PartitionStat]


# --- placement (manager -> data node) ------------------------------------------------------------


class OpenPartitions(Message, tag="data.OpenPartitions"):
    """Create the keyspace locally (if needed) and open these partitions, empty. Idempotent:
    the manager retries it, and a node reconciling from the state does the same."""

    keyspace: str
    uuid: str
    created_cas: int
    num_partitions: int
    partitions: list[int]
    # partitions this node holds a replica copy of (empty like the actives: a new keyspace)
    replicas: list[int] = msgspec.field(default_factory=list)
    max_ttl: int = 0  # the keyspace's (``KeyspaceMeta.max_ttl``)


class DropKeyspaceData(Message, tag="data.DropKeyspaceData"):
    """Drop every local partition of the keyspace (if it is the incarnation ``uuid``)."""

    keyspace: str
    uuid: str


# --- change streams ---------------------------------------------------------------------------


class OpenStream(Message, tag="data.OpenStream"):
    stream_id: int  # chosen by the opener, unique on its connection
    keyspace: str
    partition: int
    from_seqno: int = 0
    uuid: int = 0
    end_seqno: int | None = None
    follow: bool = False
    credit: int = 4  # batches the node may send before waiting for StreamCredit
    max_items: int = 1000  # per batch


class StreamOpened(Message, tag="data.StreamOpened"):
    stream_id: int
    uuid: int
    high_seqno: int


class StreamBatch(Message, tag="data.StreamBatch"):
    """A run of changes; ``marker`` (if any) precedes ``changes`` (a new snapshot run)."""

    stream_id: int
    marker: tuple[int, int, int, bool] | None = None  # (start, end, uuid, backfill)
    changes: list[ChangeTuple] = msgspec.field(default_factory=list)


class StreamEnd(Message, tag="data.StreamEnd"):
    """The last message of a stream: complete (``error`` None) or failed."""

    stream_id: int
    error: WireError | None = None


class StreamCredit(Message, tag="data.StreamCredit"):
    stream_id: int
    batches: int = 1


class CancelStream(Message, tag="data.CancelStream"):
    stream_id: int


# --- multi-range change reads -------------------------------------------------------------------


class RangeSpec(msgspec.Struct, array_like=True, frozen=True):
    """One partition's changes (``from_seqno``, ``end_seqno``] on branch ``uuid`` (the
    consumer's position, checked against the failover log as ``OpenStream`` checks it)."""

    partition: int
    from_seqno: int
    uuid: int
    end_seqno: int


class RangeChanges(msgspec.Struct, array_like=True, frozen=True):
    """The answer for one ``RangeSpec``: ``changes`` cover (from_seqno, ``reached``] in seqno
    order, dense; the range is complete when ``reached`` is its ``end_seqno``, otherwise the
    reply's caps cut it and the reader asks again from ``reached``. ``uuid`` is the branch
    the changes are on (the request's when nothing was read). With ``error`` (this range
    only: NOT_MY_PARTITION, ROLLBACK with its details, ...) or ``use_stream`` (a backfill,
    which only a stream serves) nothing was read."""

    partition: int
    uuid: int
    reached: int
    changes: list[ChangeTuple] = msgspec.field(default_factory=list)
    error: WireError | None = None
    use_stream: bool = False


class ReadRanges(Message, tag="data.ReadRanges"):
    """Many partitions' change ranges from their owner in one request and one reply, read
    in one trip to the node's I/O pool (instead of one ``OpenStream`` per partition). The
    reply holds at most ``max_items`` changes and about ``max_bytes`` of bodies in all;
    ranges past the caps come back partial or untouched. Not ``data.ReadChanges``: that
    tag is the migration catch-up's."""

    keyspace: str
    ranges: list[RangeSpec]
    max_items: int = 20_000
    max_bytes: int = 8 * 1024 * 1024


class ReadRangesReply(Message, tag="data.ReadRangesReply"):
    results: list[RangeChanges]  # aligned with the request's ranges
