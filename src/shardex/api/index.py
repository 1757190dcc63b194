"""Messages between the DDL coordinator and the index service of an indexer node.

DDL flow steps 8-11: the coordinator sends ``AllocateSlices`` to every indexer in a new index's
topology; the indexer creates the slices (column families and local metadata, durable) and
answers ``SlicesAllocated``. ``DropSlices`` removes every local slice of an index.
``ListSlices`` says what a node holds (tests, diagnostics, the cluster test's resync check,
the pipeline's progress: applied TS, entries, queue, load sessions).
All three are idempotent: a retried request changes nothing more.
"""

from __future__ import annotations

import msgspec

from shardex.meta.index_definition import IndexDefinition
from shardex.net.messages import Message

__all__ = [
    "AllocateSlices",
    "DropSlices",
    "ListSlices",
    "SliceInfo",
    "SliceList",
    "SlicesAllocated",
    "SlicesDropped",
]


class AllocateSlices(Message, tag="index.AllocateSlices"):
    """Create the slices ``partitions`` of ``definition`` here (already existing ones with
    the same definition are kept)."""

    definition: IndexDefinition
    partitions: list[int]


class SlicesAllocated(Message, tag="index.SlicesAllocated"):
    node: str
    index_id: str
    partitions: list[int]  # every partition of the index this node now holds
    created: list[int] = msgspec.field(default_factory=list)  # those created by this request


class DropSlices(Message, tag="index.DropSlices"):
    index_id: str


class SlicesDropped(Message, tag="index.SlicesDropped"):
    node: str
    index_id: str
    dropped: int  # slices removed by this request (0 on a retry)


class ListSlices(Message, tag="index.ListSlices"):
    index_id: str | None = None  # only this index's slices (None: all)


class SliceInfo(msgspec.Struct, frozen=True, kw_only=True):
    index_id: str
    name: str
    keyspace: str
    partition: int
    state: str  # the slice's local state (created, loading, active, needs_rebuild)
    applied: dict[int, tuple[int, int]] = msgspec.field(default_factory=dict)  # wire TS
    # The stability TS last published to this node for the index (None: none since start).
    stability: dict[int, tuple[int, int]] | None = None
    items_count: int = 0
    queued: int = 0  # key versions in the mutation queue
    load_rows: int = 0  # rows held by a load session in progress (one per docid)
    load_docs: int = 0  # documents its chunks reported


class SliceList(Message, tag="index.SliceList"):
    node: str
    slices: list[SliceInfo]
