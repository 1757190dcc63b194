"""An in-memory cluster of shards for the elastic paging protocol: stores, moves, history.

The protocol classes (``ElasticShardScanner``, ``PageCoordinator``) run unchanged on top of
it; only storage and the migration machinery are modelled here, the way the data service's
handover orders them: the source releases the partition (``begin_move``: its local topology
now points at the target, its entries are skipped from then on but not yet deleted), the
target activates it with every entry (``finish_move``) and only then is the next topology
published into the history. ``fail_move`` is a migration that failed at the target: the
partition comes back to its source. Used by the worked-example test and the simulator.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from typing import Any

from shardex.core.topology import Topology, TopologyHistory
from shardex.errors import ErrorCode, ShardexError
from shardex.scan.elastic_migrations import MigrationManager
from shardex.scan.elastic_node import ElasticShardScanner, Entry, RowHook, ShardStore


class NodeEntries:
    """One node's storage: every entry of every partition it has held, in key order."""

    def __init__(self) -> None:
        self._keys: list[bytes] = []
        self._rows: dict[bytes, tuple[int, Any]] = {}

    def add(self, entries: Iterable[Entry]) -> None:
        for key, pid, value in entries:
            if key not in self._rows:
                bisect.insort(self._keys, key)
            self._rows[key] = (pid, value)

    def next_after(self, after: bytes | None) -> tuple[bytes, int, Any] | None:
        i = 0 if after is None else bisect.bisect_right(self._keys, after)
        if i >= len(self._keys):
            return None
        key = self._keys[i]
        pid, value = self._rows[key]
        return key, pid, value


class MemoryShardStore(ShardStore):
    """A scan's view of one node: entries in ``(low, high]`` of partitions open right now."""

    def __init__(
        self,
        entries: NodeEntries,
        migrations: MigrationManager,
        low: bytes | None = None,
        high: bytes | None = None,
    ) -> None:
        self._entries = entries
        self._mm = migrations
        self._low = low
        self._high = high

    def entries_after(
        self, after: bytes | None, partitions: frozenset[int] | None = None
    ) -> Iterator[Entry]:
        pos = after
        if self._low is not None and (pos is None or pos < self._low):
            pos = self._low  # the span's exclusive low end
        while True:
            # Re-seek per entry: partitions may arrive (entries inserted) while we iterate.
            nxt = self._entries.next_after(pos)
            if nxt is None:
                return
            key, pid, value = nxt
            if self._high is not None and key > self._high:
                return
            pos = key
            if self._mm.is_open(pid):  # a closed partition's entries are skipped, not gone
                yield key, pid, value


class ElasticMemoryCluster:
    """Shards (nodes) holding partitions, with the topology history and migration events."""

    def __init__(
        self,
        assignment: dict[int, str],
        entries: Iterable[Entry],
        extra_nodes: Iterable[str] = (),
    ) -> None:
        first = Topology(seq_num=1, assignment=dict(assignment))
        self.history = TopologyHistory([first])
        self.by_partition: dict[int, list[Entry]] = {p: [] for p in assignment}
        for key, pid, value in entries:
            self.by_partition[pid].append((key, pid, value))
        names = sorted(set(assignment.values()) | set(extra_nodes))
        self.migrations = {
            n: MigrationManager(n, first.partitions_of(n), known_topo=1) for n in names
        }
        self.storage = {n: NodeEntries() for n in names}
        for pid, node in assignment.items():
            self.storage[node].add(self.by_partition[pid])
        self.owner: dict[int, str] = dict(assignment)  # where the partition is (or comes from)
        self.inflight: dict[int, tuple[str, str]] = {}  # pid -> (source, target)
        self.scanners: dict[str, ElasticShardScanner] = {}

    def scanner(self, node: str, span_of: Any = None, **kwargs: Any) -> ElasticShardScanner:
        """The node's scanner; ``span_of(scan_spec) -> (low, high)`` reads a spec's span."""
        mm = self.migrations[node]
        storage = self.storage[node]

        def store_for(spec: bytes) -> ShardStore:
            low, high = span_of(spec) if span_of is not None else (None, None)
            return MemoryShardStore(storage, mm, low, high)

        scanner = ElasticShardScanner(node, mm, self.history, store_for, **kwargs)
        self.scanners[node] = scanner
        return scanner

    def set_hook(self, hook: RowHook | None) -> None:
        for s in self.scanners.values():
            s.on_row = hook

    # ---- migrations -------------------------------------------------------------------

    def begin_move(self, pid: int, to: str) -> None:
        if pid in self.inflight:
            raise ShardexError(f"partition {pid} is already moving", code=ErrorCode.BAD_REQUEST)
        source = self.owner[pid]
        if source == to:
            raise ShardexError(f"partition {pid} is already on {to}", code=ErrorCode.BAD_REQUEST)
        self.inflight[pid] = (source, to)
        self.migrations[source].partition_left(pid, to)

    def finish_move(self, pid: int) -> Topology:
        _, target = self.inflight.pop(pid)
        self.storage[target].add(self.by_partition[pid])
        self.migrations[target].partition_arrived(pid)
        self.owner[pid] = target
        latest = self.history.latest
        assert latest is not None
        topo = latest.with_moves({pid: target})
        self.history.append(topo)
        for mm in self.migrations.values():
            mm.topology_published(topo.seq_num)
        return topo

    def fail_move(self, pid: int) -> None:
        source, _ = self.inflight.pop(pid)
        self.migrations[source].partition_returned(pid)

    def move(self, pid: int, to: str) -> Topology:
        self.begin_move(pid, to)
        return self.finish_move(pid)

    def expected(self, low: bytes | None = None, high: bytes | None = None) -> list[Entry]:
        """Every entry in ``(low, high]`` in key order: what a complete scan must return."""
        rows = [e for es in self.by_partition.values() for e in es]
        return sorted(
            (e for e in rows if (low is None or e[0] > low) and (high is None or e[0] <= high)),
            key=lambda e: e[0],
        )
