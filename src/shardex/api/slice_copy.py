"""Messages of an index-partition move (``shardex.index.slice_copy``).

Master -> target T: ``PrepareIncomingSlice`` (allocate the catching-up slice),
``CopySliceIn`` (wait for a dual-routed stabilise round, pull the source's slice, bulk-load
it), ``AbortIncomingSlice`` (drop it). Target -> source S: ``ReadSliceCopy`` (chunks of one
consistent snapshot of S's back index). Master -> S and T: ``IndexPartitionSwitched`` once
the new index topology is committed (S stops opening scans on the slice and drops it after
a grace period; T's paginated scans learn it arrived).
"""

from __future__ import annotations

from shardex.api.delivery import WireTs
from shardex.meta.index_definition import IndexDefinition
from shardex.net.messages import Message

__all__ = [
    "AbortIncomingSlice",
    "CopySliceIn",
    "IncomingSliceReady",
    "IndexPartitionSwitched",
    "PrepareIncomingSlice",
    "ReadSliceCopy",
    "SliceCopied",
    "SliceCopyChunk",
    "SliceMoveDone",
]


class PrepareIncomingSlice(Message, tag="index.PrepareIncomingSlice"):
    migration_id: str
    definition: IndexDefinition
    partition: int


class IncomingSliceReady(Message, tag="index.IncomingSliceReady"):
    node: str
    incarnation: str


class CopySliceIn(Message, tag="index.CopySliceIn"):
    """Copy slice ``partition`` of ``index_id`` from ``source`` once a stabilise round that
    was routed to this node too has been seen (``routed_timeout`` seconds at most)."""

    migration_id: str
    index_id: str
    partition: int
    source: str
    source_address: str
    incarnation: str  # the incarnation that prepared the slice (a restart lost its queue)
    routed_timeout: float = 60.0


class SliceCopied(Message, tag="index.SliceCopied"):
    node: str
    ts: WireTs  # T1: the source's applied TS the copy is at (now the target's applied TS)
    items: int
    bytes: int
    seconds: float


class ReadSliceCopy(Message, tag="index.ReadSliceCopy"):
    """A chunk of the source slice's back index from one snapshot (``copy_id``), after key
    ``after``. The first request opens the snapshot; it must cover ``not_before``."""

    copy_id: str
    index_id: str
    partition: int
    not_before: WireTs
    after: bytes | None = None
    max_bytes: int = 2 * 1024 * 1024


class SliceCopyChunk(Message, tag="index.SliceCopyChunk"):
    ts: WireTs
    rows: list[tuple[bytes, bytes]]  # (docid, back row): ``records.encode_back``
    done: bool


class AbortIncomingSlice(Message, tag="index.AbortIncomingSlice"):
    migration_id: str
    index_id: str
    partition: int


class IndexPartitionSwitched(Message, tag="index.IndexPartitionSwitched"):
    """Index topology ``topology_seq`` moved ``partition`` from ``source`` to ``target``."""

    migration_id: str
    index_id: str
    partition: int
    source: str
    target: str
    topology_seq: int
    grace: float = 10.0  # the source drops its slice this long after


class SliceMoveDone(Message, tag="index.SliceMoveDone"):
    node: str
    dropped: bool = False
