"""Client-facing SQL messages. ``SqlQuery`` (a request) runs one statement on the node that
receives it (the initiator); the reply ``SqlStarted`` says it runs (or, for DML, what it
changed) and carries the first block of rows, all of them for a small result; any further
result rows follow on the same connection as the scan streams' one-way
``ScanBlock`` messages (each entry one msgpack-encoded row, ``shardex.sql.exec.rows``) and one
``ScanEnd``, with the same block-credit flow control (``shardex.api.scan_streams``).

``ExchangeStats`` asks one node what its ``ExchangeMeter`` saw of one query's exchanges
(the benchmark of bytes in flight against the credit window).

``LeafRequest`` (node to node) runs one leaf of a statement whose result is small and
answers its rows in the reply ``LeafRows`` (``shardex.sql.exec.leaf_calls``); ``LeafCancel``
stops such a leaf whose statement no longer waits for it."""

from __future__ import annotations

from typing import Any

import msgspec

from shardex.api.query_ids import QueryId
from shardex.api.scan import NO_TS, WireTs
from shardex.net.messages import Message

__all__ = [
    "ExchangeStats",
    "ExchangeStatsReply",
    "LeafCancel",
    "LeafRequest",
    "LeafRows",
    "SqlQuery",
    "SqlStarted",
    "StreamReport",
]


class SqlQuery(Message, tag="sql.QueryRequest"):
    stream_id: int  # the opener's scan id for the result stream (unique on its connection)
    statement: str
    params: list[Any] | dict[str, Any] | None = None
    consistency: str = "request_plus"
    at: WireTs | None = None  # at_plus: the vector to cover
    timeout: float = 60.0
    credit: int = 4  # result blocks the node may send before waiting for ScanCredit
    # Bytes the statement's operators may hold on each node (decision 0106); None: the
    # node's ``sql_query_memory``, which is also the most a statement may ask for.
    memory_quota: int | None = None
    spill: bool = True  # past the quota sorts and aggregations spill to disk; False: fail
    window: int | None = None  # credit window of the query's exchanges; None: the default
    tuning: dict[str, bool] | None = None  # execution switches (``tuning.py``); None: all on
    durability: str = "persist"  # of the statement's writes (DML), as a document write's
    # Seconds each of those writes waits for its copies at a majority level, as a document
    # write's (``validation.check_durability_timeout``); None: the node's default.
    durability_timeout: float | None = None


class SqlStarted(Message, tag="sql.QueryStarted"):
    stream_id: int
    statement: str  # select | explain | insert | upsert | delete | update | merge
    mutation_count: int = 0
    index: str | None = None  # the index a SELECT reads (None: no index)
    # The stability TS every scan of the query read: the encoded ``WireTs | None`` (msgpack
    # nil: None), as ``IndexScanStarted.ts``. A request_plus TS names every data partition
    # (64 entries: most of the reply's bytes and of its decoding) and most callers never
    # look at it; the node sends its snapshot's bytes as they are (``Timestamp.packed``).
    # The bytes on the wire are those of the plain field.
    ts: msgspec.Raw = NO_TS
    details: dict[str, Any] = msgspec.field(default_factory=dict)
    # The first block of result rows, carried by the reply itself (no credit spent), and
    # ``done`` when that is every row: no ``ScanBlock``/``ScanEnd`` follow.
    rows: list[bytes] | None = None
    done: bool = False


class ExchangeStats(Message, tag="sql.ExchangeStats"):
    query_id: str  # as ``str(QueryId)``, what ``SqlStarted.details["query_id"]`` says


class StreamReport(msgspec.Struct, array_like=True, frozen=True):
    """One stream (edge, sender) as this node's meter saw it: the sender's side (sent,
    max_sender_bound, stalls) on the sender's node, the receiver's (consumed) on its own."""

    edge: int
    sender: str
    window: int
    sent: int
    consumed: int
    max_sender_bound: int  # max of sent - (credit limit - window): >= bytes in flight
    stalls: int


class ExchangeStatsReply(Message, tag="sql.ExchangeStatsReply"):
    member: str
    streams: list[StreamReport]


class LeafRequest(Message, tag="sql.LeafRequest"):
    """Initiator -> a leaf's node: run the leaf (a ``sql.leaf`` fragment's arguments, the
    same dict ``PhysicalPlan.query_plan`` makes) and answer its rows, at most ``max_bytes``
    of them encoded."""

    query_id: QueryId
    args: dict[str, Any]
    params: list[Any] | dict[str, Any] | None
    timeout: float  # seconds the leaf may run
    max_bytes: int
    # request_plus at a guessed TS: the data partitions of ``seqnos_keyspace`` this node
    # owns whose high seqnos to read on arrival and answer in ``LeafRows.high_seqnos``.
    seqnos_keyspace: str = ""
    seqnos_of: list[int] = msgspec.field(default_factory=list)


class LeafCancel(Message, tag="sql.LeafCancel"):
    """Initiator -> a leaf's node, one-way: the initiator gave up on its ``LeafRequest`` of
    ``query_id`` (its client went away, another leaf failed or outgrew its reply): stop the
    leaf's work. Sent on the request's connection, after it."""

    query_id: QueryId


class LeafRows(Message, tag="sql.LeafRows"):
    """The leaf's rows, encoded (``shardex.sql.exec.rows``); ``complete`` False: they came
    to more than ``max_bytes`` and none are sent (the initiator streams the leaf instead)."""

    rows: list[bytes]
    complete: bool
    # Of ``LeafRequest.seqnos_of``, those this node's data service serves, read when the
    # request arrived (None: not asked or not read).
    high_seqnos: WireTs | None = None
