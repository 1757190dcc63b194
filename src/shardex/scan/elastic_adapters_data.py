"""Primary paginated scans on a data node: its documents as a ``ShardStore``, and the
migration manager fed by the data service's hand-overs.

Shard = data node, partition = data partition, key = the docid's UTF-8 bytes.

``DataScanMigrations`` keeps one ``MigrationManager`` per keyspace. The engine announces every
hand-over step (``HandoverOps.add_handover_listener``) from the I/O thread that made it; the
announcement is moved onto the event loop (``call_soon_threadsafe``) and recorded there:
"left" (the source released the partition, the point of no return) -> ``partition_left``;
"arrived" (the target activated it) -> ``partition_arrived``. ``partition_returned`` is never
needed here: a data migration aborts only *before* the release, when the partition never
stopped being served by its source. ``topology_published`` follows the manager state the node
sees. A manager made after some events (the first scan of a keyspace on this node) starts
from the engine: active partitions are open, released ones have left.

Why it is exact although the engine changes state in a thread and the manager on the loop:

* a batch runs on the loop from its detection step to its last row without awaiting, so it
  sees one view of the manager throughout;
* a partition the manager still calls open may already be released in the engine (its event
  is queued): its documents are then final (frozen, and the target holds all of them), so
  reading them here and continuing at the target from the resume key returns each once;
* its column family is dropped only after the topology that moves it is published, which
  comes after the release reply, which comes after the queued event: by then every new batch
  skips the partition.

The release names no target; it is read from the state's in-flight move record (committed
before the copy starts) or the latest topology, refreshed from a manager when the local copy
does not have it yet (``resolve``).
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from shardex.api.errors import KeyspaceNotFound
from shardex.api.records import STATE_ACTIVE, STATE_RELEASED
from shardex.core.spans import Range, clip_ranges
from shardex.core.topology import Topology
from shardex.meta.rebalance_state import in_flight
from shardex.meta.state import StateContext
from shardex.scan.elastic_migrations import MigrationManager
from shardex.scan.elastic_node import Entry, ShardStore

if TYPE_CHECKING:
    from shardex.data.engine import DataEngine

__all__ = ["DataScanMigrations", "DataShardStore"]


def release_target(state: StateContext | None, keyspace: str, partition: int, me: str) -> str:
    """Where a partition released by ``me`` went, per ``state`` ("" when it does not say)."""
    if state is None:
        return ""
    move = in_flight(state.rebalance).get((keyspace, partition))
    if move is not None and move.source == me:
        return move.target
    history = state.data_topologies.get(keyspace) or []
    owner = history[-1].assignment.get(partition, "") if history else ""
    return "" if owner == me else owner


class DataScanMigrations:
    """The data node's migration managers for primary scans, one per keyspace."""

    def __init__(
        self,
        node: str,
        engine: Callable[[], DataEngine],
        cached_state: Callable[[], StateContext | None],
    ) -> None:
        self.node = node
        self._engine = engine
        self._cached_state = cached_state
        self._managers: dict[str, tuple[str, MigrationManager]] = {}  # ks -> (uuid, manager)
        self._listening: object | None = None  # the engine we listen to
        self._loop: asyncio.AbstractEventLoop | None = None

    def _listen(self) -> DataEngine:
        engine = self._engine()
        if self._listening is not engine:
            self._loop = asyncio.get_running_loop()
            engine.add_handover_listener(self._from_thread)
            self._listening = engine
        return engine

    def _from_thread(self, event: str, keyspace: str, partition: int) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._record, event, keyspace, partition)

    def _record(self, event: str, keyspace: str, partition: int) -> None:
        entry = self._managers.get(keyspace)
        if entry is None:
            return  # no scan has used the keyspace here: its manager starts from the engine
        mm = entry[1]
        if event == "left":
            target = release_target(self._cached_state(), keyspace, partition, mm.node)
            mm.partition_left(partition, target)
        elif event == "arrived":
            mm.partition_arrived(partition)

    def manager(self, keyspace: str, state: StateContext) -> MigrationManager:
        """The keyspace's manager, in step with the engine and ``state`` (call on the loop,
        right before a batch)."""
        engine = self._listen()
        try:
            uuid = engine.keyspace(keyspace).uuid
            local = engine.local_partitions(keyspace)
        except KeyspaceNotFound:
            uuid, local = "", []
        entry = self._managers.get(keyspace)
        if entry is None or entry[0] != uuid:
            mm = MigrationManager(self.node)
            for info in local:
                if info.state == STATE_RELEASED:
                    mm.partition_left(
                        info.partition, release_target(state, keyspace, info.partition, self.node)
                    )
            self._managers[keyspace] = (uuid, mm)
        else:
            mm = entry[1]
        left = mm.departed()
        for info in local:
            # Opened fresh (a new keyspace) or activated before this manager existed; an
            # activation whose event is still queued is complete already, so open it now.
            p = info.partition
            if info.state == STATE_ACTIVE and not mm.is_open(p) and p not in left:
                mm.partition_arrived(p)
        history = state.data_topologies.get(keyspace) or []
        if history:
            mm.topology_published(history[-1].seq_num)
        return mm

    def unresolved(self, keyspace: str) -> list[int]:
        """Departed partitions whose target is not known yet."""
        entry = self._managers.get(keyspace)
        if entry is None:
            return []
        return sorted(p for p, to in entry[1].departed().items() if not to)

    def resolve(self, keyspace: str, state: StateContext) -> None:
        """Fill in targets from a (fresher) state."""
        entry = self._managers.get(keyspace)
        if entry is None:
            return
        for p, to in entry[1].departed().items():
            if not to:
                entry[1].redirect(p, release_target(state, keyspace, p, self.node))


class DataShardStore(ShardStore):
    """One batch's view of a data node's documents for a primary scan (ranges applied)."""

    def __init__(
        self,
        engine: DataEngine,
        keyspace: str,
        ranges: list[Range],
        migrations: MigrationManager,
        base: Topology,
    ) -> None:
        self._engine = engine
        self._keyspace = keyspace
        self._ranges = ranges
        self._mm = migrations
        self._base = base

    def _docids(self, partition: int, ranges: list[Range]) -> Iterator[tuple[bytes, int, str]]:
        for lo, hi in ranges:
            for docid in self._engine.iter_docids(self._keyspace, partition, lo or b"", hi):
                yield docid.encode("utf-8"), partition, docid

    def entries_after(
        self, after: bytes | None, partitions: frozenset[int] | None = None
    ) -> Iterator[Entry]:
        ranges = clip_ranges(self._ranges, after)
        if not ranges:
            return iter(())
        if partitions is None:
            partitions = frozenset(self._base.partitions_of(self._mm.node))
        # Only partitions open when the batch starts are read (their column families exist
        # until a drop the loop has not processed yet; see the module docstring).
        streams = [self._docids(p, ranges) for p in sorted(partitions) if self._mm.is_open(p)]
        merged = heapq.merge(*streams)  # docids are unique across partitions
        return (row for row in merged if self._mm.is_open(row[1]))
