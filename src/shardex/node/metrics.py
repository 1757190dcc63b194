"""The node's Prometheus metrics (``GET /metrics`` on its HTTP port): one ``CollectorRegistry``
per node (several nodes may share a process in tests), filled at scrape time.

Nothing here runs per operation: ``NodeCollector`` reads, when scraped, the numbers the
services already keep (the data service's partitions, the indexer's slices, the latency
histograms of ``shardex.runtime.latency`` the services observe into, the RPC server's
connections, the admission gate) and turns them into metric families. The process' RSS and
CPU seconds come from prometheus-client's ``ProcessCollector`` (``/proc``); the event loop's
lag from ``LoopLag``, a periodic timer measuring its own lateness. Metric names and labels:
docs/operations.md, "Metrics".
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Final

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from shardex.api.node import MetricsSample
from shardex.api.records import STATE_ACTIVE
from shardex.core.timestamp import Timestamp
from shardex.errors import ShardexError
from shardex.meta.rebalance_state import RUNNING as REBALANCE_RUNNING
from shardex.runtime.latency import Histogram, Latencies

if TYPE_CHECKING:
    from shardex.data.engine import DataEngine
    from shardex.node.server import Node

__all__ = ["LoopLag", "NodeCollector", "NodeMetrics", "stability_lag"]

LAG_INTERVAL: Final = 0.5  # seconds between the loop-lag timer's ticks
# Lateness of a 0.5 s timer: a healthy loop is late by well under a millisecond.
LAG_BOUNDS: Final = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class LoopLag:
    """A timer every ``interval`` seconds on the node's loop; how late each tick fires is
    the time the loop spent on something else (a long callback, a blocking call)."""

    def __init__(self, interval: float = LAG_INTERVAL) -> None:
        self.interval = interval
        self.lateness = Histogram(LAG_BOUNDS)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="loop-lag")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self.interval
            await asyncio.sleep(self.interval)
            self.lateness.observe(max(0.0, loop.time() - due))


def histogram(
    name: str, doc: str, label: str | None, rows: Iterable[tuple[str, Histogram]]
) -> HistogramMetricFamily:
    """A Prometheus histogram family of ``rows`` (label value, histogram); ``label`` None:
    one unlabelled histogram (its row's value is not used)."""
    fam = HistogramMetricFamily(name, doc, labels=[] if label is None else [label])
    for value, h in rows:
        buckets = [(_le(b), float(n)) for b, n in h.cumulative()]
        fam.add_metric([] if label is None else [value], buckets, sum_value=h.total)
    return fam


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


def counts(
    name: str, doc: str, label: str, rows: Iterable[tuple[str, float]]
) -> CounterMetricFamily:
    fam = CounterMetricFamily(name, doc, labels=[label])
    for value, n in rows:
        fam.add_metric([value], n)
    return fam


def stability_lag(highs: dict[int, tuple[int, int]], ts: Timestamp) -> int:
    """Seqnos ``ts`` is behind the (high seqno, uuid) of ``highs``, summed over partitions;
    a partition missing from ``ts`` is behind by its whole history."""
    behind = 0
    for p, (high, _uuid) in highs.items():
        entry = ts.get(p)
        behind += max(0, high - (entry.seqno if entry is not None else 0))
    return behind


class NodeCollector(Collector):
    """Every shardex metric of one node, read from its services when scraped."""

    def __init__(self, node: Node, loop_lag: LoopLag) -> None:
        self._node = node
        self._lag = loop_lag

    def charted(self) -> Iterator[Metric]:
        """The families the console's charts read (``NodeMetrics.sample``)."""
        yield from self._kv()
        yield from self._indexes()
        yield from self._scans()
        yield from self._sql()

    def collect(self) -> Iterator[Metric]:
        yield from self._kv()
        yield from self._keyspaces()
        yield from self._indexes()
        yield from self._scans()
        yield from self._sql()
        yield from self._connections()
        yield from self._rebalance()
        yield histogram(
            "shardex_event_loop_lag_seconds",
            f"How late the node's {LAG_INTERVAL:g} s event-loop timer fired",
            None,
            [("", self._lag.lateness)],
        )

    # --- data service ---------------------------------------------------------------------

    def _kv(self) -> Iterator[Metric]:
        data = self._node.data
        if data is None:
            return
        writes: Latencies[tuple[str, str]] = data.writes.latencies
        by_op = {**data.reads.latencies.merged(str), **writes.merged(lambda k: k[0])}
        failed = {**data.reads.failed, **data.writes.failed}
        ops = sorted(by_op.items())
        yield counts(
            "shardex_kv_ops",
            "KV operations answered by this node's data service, by kind",
            "op",
            [(op, float(h.count)) for op, h in ops],
        )
        yield counts(
            "shardex_kv_op_errors",
            "KV operations answered with an error, by kind",
            "op",
            sorted((op, float(n)) for op, n in failed.items()),
        )
        yield histogram(
            "shardex_kv_op_duration_seconds",
            "KV operation latency from arrival to answer, by kind",
            "op",
            ops,
        )
        yield counts(
            "shardex_expired_documents",
            "Documents this node's expiry pager deleted (expirations), by how they were found",
            "how",
            sorted((how, float(n)) for how, n in data.expiry.expired_by.items()),
        )
        yield histogram(
            "shardex_kv_write_duration_seconds",
            "Single-document write latency from arrival to answer (durable at its level), "
            "by durability level",
            "durability",
            sorted(writes.merged(lambda k: k[1]).items()),
        )

    def _engine(self) -> DataEngine | None:
        """The data engine, None on a node without a running data service."""
        data = self._node.data
        if data is None:
            return None
        try:
            return data.engine
        except ShardexError:
            return None

    def _keyspaces(self) -> Iterator[Metric]:
        engine = self._engine()
        if engine is None:
            return
        docs = GaugeMetricFamily(
            "shardex_keyspace_documents",
            "Documents in the keyspace's partitions this node holds active",
            labels=["keyspace"],
        )
        parts = GaugeMetricFamily(
            "shardex_keyspace_partitions",
            "The keyspace's partitions this node holds active",
            labels=["keyspace"],
        )
        disk = GaugeMetricFamily(
            "shardex_keyspace_disk_bytes",
            "Bytes of the live SST files of the keyspace's partitions this node holds active "
            "(documents, change log and meta, compressed; not what is still in memtables)",
            labels=["keyspace"],
        )
        memtables = GaugeMetricFamily(
            "shardex_keyspace_memtable_bytes",
            "Bytes the memtables of the keyspace's partitions this node holds active take",
            labels=["keyspace"],
        )
        for ks in engine.keyspaces():
            n_docs = n_parts = n_disk = n_mem = 0
            for p in engine.partitions(ks.name):
                with contextlib.suppress(ShardexError):  # dropped meanwhile
                    info = engine.partition_info(ks.name, p)
                    if info.state == STATE_ACTIVE:
                        n_docs += info.doc_count
                        n_parts += 1
                        on_disk, in_memory = engine.partition_storage_bytes(ks.name, p)
                        n_disk += on_disk
                        n_mem += in_memory
            docs.add_metric([ks.name], n_docs)
            parts.add_metric([ks.name], n_parts)
            disk.add_metric([ks.name], n_disk)
            memtables.add_metric([ks.name], n_mem)
        yield docs
        yield parts
        yield disk
        yield memtables
        yield from self._change_streams(engine)

    def _change_streams(self, engine: DataEngine) -> Iterator[Metric]:
        streams = self._node.data.streams if self._node.data is not None else None
        if streams is None:
            return
        n_open = GaugeMetricFamily(
            "shardex_change_streams_open",
            "Change streams (OpenStream) this node is sending",
            labels=["keyspace"],
        )
        lag = GaugeMetricFamily(
            "shardex_change_stream_lag_seqnos",
            "Seqnos between what the node's change streams sent and their partitions' high "
            "seqnos, summed",
            labels=["keyspace"],
        )
        by_ks: dict[str, list[int]] = {}
        for keyspace, partition, sent in streams.positions():
            t = by_ks.setdefault(keyspace, [0, 0])
            t[0] += 1
            with contextlib.suppress(ShardexError):  # the keyspace was dropped meanwhile
                entry = engine.partition_seqnos(keyspace, [partition]).get(partition)
                if entry is not None:  # not active here any more: its stream is ending
                    t[1] += max(0, entry[0] - sent)
        for keyspace, (n, behind) in sorted(by_ks.items()):
            n_open.add_metric([keyspace], n)
            lag.add_metric([keyspace], behind)
        yield n_open
        yield lag

    # --- indexer --------------------------------------------------------------------------

    def _indexes(self) -> Iterator[Metric]:
        index = self._node.index
        if index is None or not index.host.is_open:
            return
        items = GaugeMetricFamily(
            "shardex_index_items",
            "Entries in the index's slices on this node",
            labels=["keyspace", "index"],
        )
        pending = GaugeMetricFamily(
            "shardex_index_pending_mutations",
            "Key versions queued in the index's slices on this node, not yet stabilised",
            labels=["keyspace", "index"],
        )
        lag = GaugeMetricFamily(
            "shardex_index_stability_lag_seqnos",
            "Seqnos the index's published stability TS is behind the high seqnos of the "
            "keyspace's partitions this node holds active (absent without a data service "
            "or a published TS)",
            labels=["keyspace", "index"],
        )
        totals: dict[tuple[str, str, str], list[int]] = {}
        for sl in index.engine.slices():
            d = sl.definition
            t = totals.setdefault((d.id, d.keyspace, d.name), [0, 0])
            t[0] += sl.items_count
            t[1] += sl.queued()
        published = index.delivery.published
        for (index_id, keyspace, name), (n_items, n_queued) in sorted(totals.items()):
            items.add_metric([keyspace, name], n_items)
            pending.add_metric([keyspace, name], n_queued)
            behind = self._stability_lag(keyspace, published.get(index_id))
            if behind is not None:
                lag.add_metric([keyspace, name], behind)
        yield items
        yield pending
        yield lag

    def _stability_lag(self, keyspace: str, ts: Timestamp | None) -> int | None:
        """Sum over this node's active partitions of ``keyspace`` of (high seqno - the
        published TS's seqno); None when this node cannot tell (no data service, no TS).
        From memory: the partitions' metadata, the TS the timekeeper last published here."""
        engine = self._engine()
        if engine is None or ts is None:
            return None
        try:
            highs = engine.partition_seqnos(keyspace, engine.partitions(keyspace))
        except ShardexError:  # the keyspace is not on this node (yet, or any more)
            return None
        return stability_lag(highs, ts)

    # --- scans, SQL, connections ----------------------------------------------------------

    def _scans(self) -> Iterator[Metric]:
        yield histogram(
            "shardex_scan_open_duration_seconds",
            "Index scans coordinated here: arrival to first reply (the consistency's wait "
            "included), by consistency",
            "consistency",
            sorted(self._node.scan.latencies.items()),
        )

    def _sql(self) -> Iterator[Metric]:
        sql = self._node.sql.sql
        rows = sorted(sql.stats.latencies.items())
        yield counts(
            "shardex_sql_statements",
            "SQL statements this node initiated, by how they ended",
            "outcome",
            [(o, float(h.count)) for o, h in rows],
        )
        yield histogram(
            "shardex_sql_statement_duration_seconds",
            "SQL statement latency (admission, or arrival when answered at once, to the "
            "last row), by outcome",
            "outcome",
            rows,
        )
        gate = sql.admission
        yield GaugeMetricFamily(
            "shardex_sql_statements_running", "SQL statements running here now", gate.running
        )
        yield GaugeMetricFamily(
            "shardex_sql_statements_queued", "SQL statements waiting for admission", gate.queued
        )

    def _rebalance(self) -> Iterator[Metric]:
        """The current or last rebalance as this manager's replica of the state has it
        (manager nodes only: another node's copy of the state may be old)."""
        coordinator = self._node.coordinator
        if coordinator is None:
            return
        record = coordinator.state.rebalance
        yield GaugeMetricFamily(
            "shardex_rebalance_running",
            "1 while a rebalance or partition move runs, else 0",
            1 if record is not None and record.state == REBALANCE_RUNNING else 0,
        )
        moves = GaugeMetricFamily(
            "shardex_rebalance_moves",
            "Moves of the current or last rebalance, by what moves (data partition, index "
            "partition) and status",
            labels=["kind", "status"],
        )
        if record is not None:
            tally: dict[tuple[str, str], int] = {}
            for kind, status in [("data", m.status) for m in record.moves] + [
                ("index", m.status) for m in record.index_moves
            ]:
                tally[(kind, status)] = tally.get((kind, status), 0) + 1
            for (kind, status), n in sorted(tally.items()):
                moves.add_metric([kind, status], n)
        yield moves

    def _connections(self) -> Iterator[Metric]:
        conns = GaugeMetricFamily(
            "shardex_rpc_connections",
            "RPC connections open to this node's server, by peer kind",
            labels=["peer"],
        )
        nodes = users = 0
        for c in self._node.server.connections:
            if c.principal is not None and not c.principal.is_node:
                users += 1
            else:
                nodes += 1
        conns.add_metric(["node"], nodes)
        conns.add_metric(["user"], users)
        yield conns
        http = self._node.http
        if http is not None:
            yield GaugeMetricFamily(
                "shardex_http_connections",
                "HTTP connections open to this node",
                http.open_connections,
            )
            yield counts(
                "shardex_http_query_requests",
                "N1QL query service requests by where they were served: in the connection's "
                "receive callback (a key lookup of this node's documents) or its task",
                "served",
                http.query.served.items(),
            )
            yield counts(
                "shardex_http_requests_read",
                "HTTP requests by where they were read: whole in the connection's receive "
                "callback (parsed once) or by its stream reader (in parts, pipelined)",
                "by",
                http.read.items(),
            )


class NodeMetrics:
    """The node's registry: its ``NodeCollector`` and the process collector."""

    def __init__(self, node: Node) -> None:
        self.loop_lag = LoopLag()
        self.registry = CollectorRegistry(auto_describe=False)
        self._node = node
        self._collector = NodeCollector(node, self.loop_lag)
        self.registry.register(self._collector)
        ProcessCollector(registry=self.registry)

    def start(self) -> None:
        self.loop_lag.start()

    async def stop(self) -> None:
        await self.loop_lag.stop()

    def exposition(self) -> bytes:
        """The registry in Prometheus' text format."""
        return generate_latest(self.registry)

    def sample(self) -> MetricsSample:
        """This node's numbers for the console's charts, read from the collector's own
        families (the same values a scrape of ``/metrics`` shows at this moment)."""
        kv = sql = scan_sum = scan_count = 0.0
        freshness: dict[str, float] = {}
        for fam in self._collector.charted():
            for s in fam.samples:
                if s.name == "shardex_kv_ops_total":
                    kv += s.value
                elif s.name == "shardex_sql_statements_total":
                    sql += s.value
                elif s.name == "shardex_scan_open_duration_seconds_sum":
                    scan_sum += s.value
                elif s.name == "shardex_scan_open_duration_seconds_count":
                    scan_count += s.value
                elif s.name == "shardex_index_stability_lag_seqnos":
                    freshness[f"{s.labels['keyspace']}.{s.labels['index']}"] = s.value
        return MetricsSample(
            node=self._node.name,
            kv_ops=kv,
            sql_statements=sql,
            scan_seconds=scan_sum,
            scans=scan_count,
            freshness=freshness,
        )
