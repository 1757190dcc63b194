"""Messages between the page coordinator (the elastic-scan algorithm's proxy) and a shard's
node (its RN).

One request asks a node for one batch of one (base or virtual) shard, carrying the
continuation state the algorithm's ``sendRequestToRN(shard, CK)`` sends; the answer is the rows
and the updated state. The same structs are used in-process (unit tests, one node) and on
the wire (they are ``Message`` subclasses, so they register with the frame codec).
"""

from __future__ import annotations

from typing import Any

import msgspec

from shardex.net.messages import Message
from shardex.scan.continuation import VirtualScan


class PageRow(msgspec.Struct, array_like=True, frozen=True):
    """One index entry (or document for a primary scan) returned by a page.

    ``key`` is the entry's encoded, collation-ordered key (unique within the scan: index key
    plus docid, or the docid for a primary scan); ``partition`` is the partition the entry's
    document lives in; ``value`` is what the caller asked for (docid, covering keys, ...).
    """

    key: bytes
    partition: int
    value: Any = None


class ShardBatch(Message, tag="scan.ShardBatch"):
    """Proxy -> node: scan ``shard`` (this node) as a base or virtual shard."""

    scan: bytes  # the scan spec (opaque here: the node's store factory reads it)
    base_topo: int
    shard: str  # the node the proxy believes it is talking to (checked)
    shard_idx: int  # position in the query's SHARDS (diagnostics and checkers)
    vs_pid: int  # -1: scan the base shard; else the virtual shard of this partition
    resume: bytes | None
    vsm: list[VirtualScan]
    limit: int
    # Non-empty: ``shard`` failed, and this node reads these of its partitions from its own
    # copies instead (a pinned scan only, ``paging_copies``).
    stand_in: list[int] = msgspec.field(default_factory=list)


class ShardBatchResult(Message, tag="scan.ShardBatchResult"):
    rows: list[PageRow]
    resume: bytes | None  # the last row returned; None when exhausted
    vsm: list[VirtualScan]  # the request's map plus partitions found to have left
    exhausted: bool  # False: the batch stopped at its limit (or must be retried)
    repeats: int = 0  # times the node repeated the batch locally (a partition moved)
