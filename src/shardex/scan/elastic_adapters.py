"""The shard-node (RN) side of paginated scans on a real node: ``ShardBatch`` -> a scanner.

A batch's spec (``PagedScanSpec``) says what it reads: a keyspace's documents (primary scan,
on a data node) or an index's slices (index scan, on an indexer). For each batch the node
builds an ``ElasticShardScanner`` over

* the migration manager of that keyspace (``DataScanMigrations``) or index
  (``IndexScanMigrations``), brought in step with local storage and the state first;
* the topology history of that keyspace or index from the manager state (refreshed when the
  batch's base topology is newer than the copy this node holds);
* a store for this batch (``DataShardStore`` / ``IndexShardStore``).

The scanner is the elastic-scan algorithm's RN procedure unchanged (``elastic_node``).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Final

from shardex.core.timestamp import Timestamp
from shardex.core.topology import Topology
from shardex.errors import ErrorCode, ShardexError
from shardex.scan.cluster_view import ClusterView
from shardex.scan.elastic_adapters_data import DataScanMigrations, DataShardStore
from shardex.scan.elastic_adapters_index import batch_view
from shardex.scan.elastic_node import ElasticShardScanner, ShardStore
from shardex.scan.paging_copies import check_stand_in, read_stand_in
from shardex.scan.paging_store_spec import PagedScanSpec, decode_spec, spec_ranges
from shardex.scan.paging_wire import ShardBatch, ShardBatchResult

if TYPE_CHECKING:
    from shardex.data.service import DataService
    from shardex.index.service import IndexService

__all__ = ["ARRIVAL_TIMEOUT", "ElasticScanNode", "HistoryLookup", "has_topology"]

# How long a virtual scan waits for its partition to be activated here (the hand-over's
# last steps after the source's release), and a batch for this node to see its base
# topology. Only a failed or second move waits this long; it then ends in QUERY_STATE.
ARRIVAL_TIMEOUT: Final = 30.0


def has_topology(history: list[Topology], seq_num: int) -> bool:
    return any(t.seq_num == seq_num for t in history)


class HistoryLookup:
    """A topology history from the manager state as the protocol's ``TopologyLookup``."""

    def __init__(self, history: list[Topology], what: str) -> None:
        self._by_seq = {t.seq_num: t for t in history}
        self._latest = history[-1] if history else None
        self._what = what

    @property
    def latest(self) -> Topology | None:
        return self._latest

    def get(self, seq_num: int) -> Topology:
        topo = self._by_seq.get(seq_num)
        if topo is None:
            raise ShardexError(
                f"topology {seq_num} of {self._what} is not in the topology history",
                code=ErrorCode.STALE_TOPOLOGY,
                details={
                    "seq_num": seq_num,
                    "known": sorted(self._by_seq)[-5:],
                    "hint": "retry the page; restart the scan if this persists",
                },
            )
        return topo


def _not_served(what: str, node: str, spec: PagedScanSpec) -> ShardexError:
    return ShardexError(
        f"node {node} runs no {what} service, but a paginated scan batch was sent to it",
        code=ErrorCode.STALE_TOPOLOGY,
        details={"node": node, "keyspace": spec.keyspace, "index": spec.index_id},
    )


class ElasticScanNode:
    """Serves ``ShardBatch`` for the data and index services of one node."""

    def __init__(
        self,
        *,
        name: str,
        view: ClusterView,
        data: DataService | None,
        index: IndexService | None,
    ) -> None:
        self.name = name
        self.view = view
        self.data = data
        self.index = index
        self.data_migrations: DataScanMigrations | None = None
        if data is not None:
            self.data_migrations = DataScanMigrations(
                name, lambda: data.engine, lambda: data.placement.cached
            )

    async def on_batch(self, msg: ShardBatch, conn: Any = None) -> ShardBatchResult:
        spec = decode_spec(msg.scan)
        if spec.primary:
            scanner = await self._primary(msg, spec)
        else:
            scanner = await self._index(msg, spec)
        if isinstance(scanner, ShardBatchResult):  # a stand-in batch, read already
            return scanner
        return await scanner.scan_batch(msg)

    def _scanner(self, mm: Any, lookup: HistoryLookup, store: ShardStore) -> ElasticShardScanner:
        return ElasticShardScanner(
            self.name,
            mm,
            lookup,
            lambda _spec: store,
            arrival_timeout=ARRIVAL_TIMEOUT,
            topology_timeout=ARRIVAL_TIMEOUT,
        )

    async def _primary(self, msg: ShardBatch, spec: PagedScanSpec) -> ElasticShardScanner:
        data, migrations = self.data, self.data_migrations
        if data is None or migrations is None:
            raise _not_served("data", self.name, spec)
        ks = spec.keyspace
        state = await data.placement.state()
        if not has_topology(state.data_topologies.get(ks) or [], msg.base_topo):
            state = await data.placement.refresh()
        if not has_topology(state.data_topologies.get(ks) or [], msg.base_topo):
            # A manager replica a commit behind the proxy's: ask the master.
            state = await self.view.state(fresh=True)
        migrations.manager(ks, state)  # made or synced: now its unknown targets are known
        if migrations.unresolved(ks):
            state = await data.placement.refresh()
            migrations.resolve(ks, state)
        # No await from here to the batch's end: the manager's view holds for the batch.
        mm = migrations.manager(ks, state)
        lookup = HistoryLookup(state.data_topologies.get(ks) or [], f"keyspace {ks!r}")
        base = lookup.get(msg.base_topo)
        store = DataShardStore(data.engine, ks, spec_ranges(spec), mm, base)
        return self._scanner(mm, lookup, store)

    async def _index(
        self, msg: ShardBatch, spec: PagedScanSpec
    ) -> ElasticShardScanner | ShardBatchResult:
        index = self.index
        if index is None:
            raise _not_served("index", self.name, spec)
        state = await self.view.state()
        if not has_topology(state.index_topologies.get(spec.index_id) or [], msg.base_topo):
            state = await self.view.state(fresh=True)
        history = state.index_topologies.get(spec.index_id) or []
        if not history:
            raise ShardexError(
                f"index {spec.index_id} of {spec.keyspace!r} has no topology (dropped?)",
                code=ErrorCode.INDEX_NOT_FOUND,
                details={"index": spec.index_id, "keyspace": spec.keyspace},
            )
        lookup = HistoryLookup(history, f"index {spec.index_id}")
        base = lookup.get(msg.base_topo)
        engine = index.engine
        wanted = [msg.vs_pid] if msg.vs_pid >= 0 else base.partitions_of(self.name)
        if msg.stand_in:  # another shard failed: its partitions from our copies
            wanted = check_stand_in(msg, base, self.name, spec.snapshot is not None)
        mm, store = batch_view(
            engine,
            index.scan_migrations,
            self.name,
            spec.index_id,
            spec_ranges(spec),
            None if spec.snapshot is None else Timestamp.from_wire(spec.snapshot),
            history[-1].seq_num,
            wanted,
            index.slice_moves.moved_to,
        )
        if index.inline_io:
            store.open(msg.resume, wanted)
        else:  # a slice's lock may be held by a stabilise's fsync: not on the loop
            await asyncio.to_thread(store.open, msg.resume, wanted)
        if msg.stand_in:
            return read_stand_in(store, msg, wanted)
        return self._scanner(mm, lookup, store)
