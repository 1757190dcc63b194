"""Paginated index scans on an indexer: its slices as a ``ShardStore``, and the migration
managers the index rebalance will drive.

Shard = indexer node, partition = index partition (one slice), key = the raw index entry
(``key + 02 + docid``), so a resume key is exactly the last entry returned.

Which snapshot: the spec's ``snapshot`` (the stability TS the first page pinned in the
continuation, see ``paging_store_proxy``) on every slice of every page, or the tips when it
is None (not_bounded without stability). A snapshot the slice has released answers
SNAPSHOT_TOO_OLD: the scan must be restarted (its later pages would read another state).

Pinned scans do not follow moves (``pinned_manager``): a snapshot never changes, so the
slice that holds the leased snapshot - the base topology's owner, where the first page
leased it - serves every page of its partition, also after the partition moved away (the
source keeps a handed-over slice while a lease holds it, ``slice_copy``). The new owner
could not serve it: its copy starts at the move's T1, after the pinned TS. A slice dropped
meanwhile (its lease expired) answers SNAPSHOT_TOO_OLD naming the move.

Tip scans follow moves. ``IndexScanMigrations`` is the hook the index rebalance calls, on
the event loop, at the same points as the data hand-over: ``partition_incoming``
before the target starts receiving a slice (a copy in progress is held but not open),
``partition_left`` when the source stops serving it (its entries are then skipped there, and
later pages read them on ``to``), ``partition_arrived`` when the target's copy is complete
and serving, ``partition_returned`` when a move fails after ``partition_left``, and
``topology_published`` for every index topology the node sees. An index's manager is made
at its first paginated scan on the node, from the slices held then (minus those incoming);
from then on only these hooks change it.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from shardex.core.spans import Range, clip_ranges, ranges_as_spans
from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.scan.elastic_migrations import MigrationManager
from shardex.scan.elastic_node import Entry, ShardStore

__all__ = [
    "IndexScanMigrations",
    "IndexShardStore",
    "batch_view",
    "pinned_manager",
    "snapshot_gone",
]

MovedTo = Callable[[str, int], "str | None"]  # (index id, partition) -> new owner, if moved


def pinned_manager(node: str, partitions: Iterable[int], latest_seq: int) -> MigrationManager:
    """The migration view of one batch of a pinned scan: ``partitions`` (the base
    topology's partitions of this node, or the virtual scan's) open, none ever leaving."""
    return MigrationManager(node, partitions, known_topo=latest_seq)


def batch_view(
    engine: Any,
    migrations: IndexScanMigrations,
    node: str,
    index_id: str,
    ranges: list[Range],
    snapshot: Timestamp | None,
    latest_seq: int,
    wanted: Iterable[int],
    moved_to: MovedTo | None = None,
) -> tuple[MigrationManager, IndexShardStore]:
    """The migration view and the store of one batch on indexer ``node``: tips follow the
    index's moves (its ``MigrationManager``), a pinned ``snapshot`` reads ``wanted`` here
    whatever moved (``pinned_manager``)."""
    if snapshot is None:
        held = [s.partition for s in engine.slices(index_id)]
        mm = migrations.manager(index_id, held, latest_seq)
    else:
        mm = pinned_manager(node, wanted, latest_seq)
    store = IndexShardStore(engine, index_id, ranges, snapshot, mm, node=node, moved_to=moved_to)
    return mm, store


def snapshot_gone(
    index_id: str, partition: int, node: str, moved_to: str | None, snapshot: Timestamp
) -> ShardexError:
    """SNAPSHOT_TOO_OLD for a pinned scan whose slice is gone from ``node`` (after a move,
    its lease expired and the slice was dropped)."""
    where = ""
    if moved_to:
        where = f" (the partition moved to {moved_to} and its slice here was dropped)"
    return ShardexError(
        f"slice {index_id}/{partition} on {node} no longer has the scan's snapshot at "
        f"{snapshot!r}{where}",
        code=ErrorCode.SNAPSHOT_TOO_OLD,
        details={
            "index": index_id,
            "partition": partition,
            "node": node,
            "moved_to": moved_to,
            "hint": "restart the scan (continuation=None)",
        },
    )


class IndexScanMigrations:
    """One ``MigrationManager`` per index on an indexer node. Call every method on the
    node's event loop."""

    def __init__(self, node: str) -> None:
        self.node = node
        self._managers: dict[str, MigrationManager] = {}
        self._incoming: dict[str, set[int]] = {}
        self._unseeded: set[str] = set()  # made by a hook before any scan: no slices yet

    def _get(self, index_id: str) -> MigrationManager:
        mm = self._managers.get(index_id)
        if mm is None:
            mm = self._managers[index_id] = MigrationManager(self.node)
            self._unseeded.add(index_id)
        return mm

    def manager(self, index_id: str, held: Iterable[int], latest_seq: int) -> MigrationManager:
        """The index's manager (made from the slices ``held`` here at its first use) in step
        with the newest index topology the node has seen."""
        mm = self._managers.get(index_id)
        incoming = self._incoming.get(index_id, set())
        if mm is None:
            mm = MigrationManager(self.node, [p for p in held if p not in incoming])
            self._managers[index_id] = mm
        elif index_id in self._unseeded:  # hooks came first: add the slices they left alone
            left = mm.departed()
            for p in held:
                if p not in left and p not in incoming and not mm.is_open(p):
                    mm.partition_arrived(p)
        self._unseeded.discard(index_id)
        mm.topology_published(latest_seq)
        return mm

    def forget(self, index_id: str) -> None:
        """The index was dropped here."""
        self._managers.pop(index_id, None)
        self._incoming.pop(index_id, None)
        self._unseeded.discard(index_id)

    # --- the index rebalance's hooks ------------------------------------------------------

    def partition_incoming(self, index_id: str, partition: int) -> None:
        """This node starts receiving ``partition``'s slice: not open until it arrives."""
        self._incoming.setdefault(index_id, set()).add(partition)

    def partition_left(self, index_id: str, partition: int, to: str) -> None:
        self._get(index_id).partition_left(partition, to)

    def partition_arrived(self, index_id: str, partition: int) -> None:
        self._incoming.get(index_id, set()).discard(partition)
        self._get(index_id).partition_arrived(partition)

    def partition_returned(self, index_id: str, partition: int) -> None:
        self._get(index_id).partition_returned(partition)

    def topology_published(self, index_id: str, seq_num: int) -> None:
        self._get(index_id).topology_published(seq_num)


def _tagged(entries: Iterator[bytes], partition: int) -> Iterator[Entry]:
    for e in entries:
        yield e, partition, None


class IndexShardStore(ShardStore):
    """One batch's view of an indexer's slices of one index (ranges and snapshot applied).

    ``open`` creates the slice iterators ahead of the batch (in a thread: a slice's lock may
    be held by a stabilise's fsync); ``entries_after`` uses them when asked for the same
    resume key and opens fresh ones otherwise (a batch repeated after a migration)."""

    def __init__(
        self,
        engine: Any,
        index_id: str,
        ranges: list[Range],
        snapshot: Timestamp | None,
        migrations: MigrationManager,
        *,
        node: str = "",
        moved_to: MovedTo | None = None,
    ) -> None:
        self._engine = engine
        self._index_id = index_id
        self._ranges = ranges
        self._snapshot = snapshot
        self._mm = migrations
        self._node = node
        self._moved_to = moved_to
        self._opened: tuple[bytes | None, dict[int, Iterator[bytes]]] | None = None

    def _iterate(self, partition: int, ranges: list[Range]) -> Iterator[bytes]:
        try:
            sl = self._engine.slice(self._index_id, partition)  # INDEX_NOT_FOUND if not here
        except ShardexError as exc:
            moved = None if self._moved_to is None else self._moved_to(self._index_id, partition)
            if exc.code is ErrorCode.INDEX_NOT_FOUND and self._snapshot is not None and moved:
                raise snapshot_gone(
                    self._index_id, partition, self._node, moved, self._snapshot
                ) from None
            raise
        it: Iterator[bytes] = sl.scan(
            ranges_as_spans(ranges), snapshot_ts=self._snapshot, raw=True
        )  # INDEX_IN_ROLLBACK, SNAPSHOT_TOO_OLD, ... raised here
        return it

    def open(self, after: bytes | None, partitions: Iterable[int]) -> None:
        ranges = clip_ranges(self._ranges, after)
        its = {p: self._iterate(p, ranges) for p in sorted(set(partitions)) if self._mm.is_open(p)}
        self._opened = (after, its)

    def entries_after(
        self, after: bytes | None, partitions: frozenset[int] | None = None
    ) -> Iterator[Entry]:
        ranges = clip_ranges(self._ranges, after)
        opened: dict[int, Iterator[bytes]] = {}
        if self._opened is not None and self._opened[0] == after:
            opened = self._opened[1]
        self._opened = None
        wanted = sorted(partitions if partitions is not None else opened)
        streams = []
        for p in wanted:
            if self._mm.is_open(p):
                it = opened.get(p)
                streams.append(_tagged(it if it is not None else self._iterate(p, ranges), p))
        merged = heapq.merge(*streams, key=lambda row: row[0])
        return (row for row in merged if self._mm.is_open(row[1]))
