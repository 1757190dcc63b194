"""The node's metrics collector read over stand-ins of its services: every family parses
as Prometheus text, and each series says what the services hold (documents of active
partitions only, items and queued versions per index, the stability TS's distance from the
high seqnos, histograms with their buckets, connections by peer kind)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from shardex.api.records import STATE_ACTIVE
from shardex.core.timestamp import Timestamp
from shardex.node.metrics import LoopLag, NodeCollector, stability_lag
from shardex.runtime.latency import Latencies
from shardex.sql.exec.statement_stats import StatementStats


@dataclass
class Info:
    doc_count: int
    state: str = STATE_ACTIVE


@dataclass
class Engine:
    """A data engine's read side: keyspace -> partition -> (info, high seqno)."""

    parts: dict[str, dict[int, tuple[Info, int]]]

    def keyspaces(self) -> list[Any]:
        return [SimpleNamespace(name=k) for k in sorted(self.parts)]

    def partitions(self, keyspace: str) -> list[int]:
        return sorted(self.parts[keyspace])

    def partition_info(self, keyspace: str, p: int) -> Info:
        return self.parts[keyspace][p][0]

    def partition_storage_bytes(self, keyspace: str, p: int) -> tuple[int, int]:
        return 1000 * (p + 1), 10 * (p + 1)

    def partition_seqnos(self, keyspace: str, ps: list[int]) -> dict[int, tuple[int, int]]:
        return {p: (self.parts[keyspace][p][1], 7) for p in ps}


@dataclass
class Slice:
    definition: Any
    items_count: int
    n_queued: int

    def queued(self) -> int:
        return self.n_queued


@dataclass
class Conn:
    principal: Any


@dataclass
class Node:
    data: Any = None
    index: Any = None
    scan: Any = field(default_factory=lambda: SimpleNamespace(latencies=Latencies()))
    sql: Any = None
    server: Any = None
    http: Any = None
    coordinator: Any = None


def _node() -> Node:
    engine = Engine(
        {
            "users": {0: (Info(10), 50), 1: (Info(5), 20), 2: (Info(99, "replica"), 80)},
            "empty": {},
        }
    )
    writes: Latencies[tuple[str, str]] = Latencies()
    writes.observe(("upsert", "none"), 0.00003)
    writes.observe(("upsert", "majority"), 0.002)
    writes.observe(("delete", "majority"), 0.004)
    reads: Latencies[str] = Latencies()
    reads.observe("get", 0.00002)
    data = SimpleNamespace(
        engine=engine,
        writes=SimpleNamespace(latencies=writes, failed={"delete": 1}),
        reads=SimpleNamespace(latencies=reads, failed={}),
        # two streams of users' partition 0 (high seqno 50) sent up to 40 and 50
        streams=SimpleNamespace(positions=lambda: [("users", 0, 40), ("users", 0, 50)]),
        expiry=SimpleNamespace(expired_by={"access": 2, "walk": 5}),
    )
    by_city = SimpleNamespace(id="ix1", keyspace="users", name="by_city")
    index = SimpleNamespace(
        host=SimpleNamespace(is_open=True),
        engine=SimpleNamespace(
            slices=lambda: [Slice(by_city, 4, 1), Slice(by_city, 6, 2)],
        ),
        delivery=SimpleNamespace(published={"ix1": Timestamp({0: (45, 7), 1: (20, 7)})}),
    )
    stats = StatementStats()
    stats.end_as(0.0, "success")
    sql = SimpleNamespace(
        sql=SimpleNamespace(stats=stats, admission=SimpleNamespace(running=2, queued=1))
    )
    node_p = SimpleNamespace(is_node=True)
    user_p = SimpleNamespace(is_node=False)
    server = SimpleNamespace(connections=[Conn(node_p), Conn(node_p), Conn(user_p)])
    node = Node(data=data, index=index, sql=sql, server=server)
    node.scan.latencies.observe("request_plus", 0.03)
    return node


def _scrape(node: Node) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(node, LoopLag()))  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def test_the_collector_reads_every_service() -> None:
    got = _scrape(_node())
    assert got[("shardex_kv_ops_total", (("op", "upsert"),))] == 2
    assert got[("shardex_kv_ops_total", (("op", "get"),))] == 1
    assert got[("shardex_kv_op_errors_total", (("op", "delete"),))] == 1
    assert got[("shardex_expired_documents_total", (("how", "access"),))] == 2
    assert got[("shardex_expired_documents_total", (("how", "walk"),))] == 5
    # the 30 us upsert is in the 50 us bucket, the 2 ms one only further up
    assert got[("shardex_kv_op_duration_seconds_bucket", (("le", "5e-05"), ("op", "upsert")))] == 1
    assert got[("shardex_kv_op_duration_seconds_bucket", (("le", "+Inf"), ("op", "upsert")))] == 2
    assert got[("shardex_kv_write_duration_seconds_count", (("durability", "majority"),))] == 2
    assert got[("shardex_kv_write_duration_seconds_count", (("durability", "none"),))] == 1
    # documents of active partitions only (partition 2 is a replica here)
    assert got[("shardex_keyspace_documents", (("keyspace", "users"),))] == 15
    assert got[("shardex_keyspace_partitions", (("keyspace", "users"),))] == 2
    assert got[("shardex_keyspace_disk_bytes", (("keyspace", "users"),))] == 1000 + 2000
    assert got[("shardex_keyspace_memtable_bytes", (("keyspace", "users"),))] == 10 + 20
    assert got[("shardex_keyspace_documents", (("keyspace", "empty"),))] == 0
    assert got[("shardex_change_streams_open", (("keyspace", "users"),))] == 2
    assert got[("shardex_change_stream_lag_seqnos", (("keyspace", "users"),))] == 10
    ix = (("index", "by_city"), ("keyspace", "users"))
    assert got[("shardex_index_items", ix)] == 10
    assert got[("shardex_index_pending_mutations", ix)] == 3
    # high seqnos 50, 20, 80 against the TS's 45, 20 and nothing for partition 2
    assert got[("shardex_index_stability_lag_seqnos", ix)] == 5 + 0 + 80
    assert (
        got[("shardex_scan_open_duration_seconds_count", (("consistency", "request_plus"),))] == 1
    )
    assert got[("shardex_sql_statements_total", (("outcome", "success"),))] == 1
    assert got[("shardex_sql_statements_running", ())] == 2
    assert got[("shardex_sql_statements_queued", ())] == 1
    assert got[("shardex_rpc_connections", (("peer", "node"),))] == 2
    assert got[("shardex_rpc_connections", (("peer", "user"),))] == 1
    assert ("shardex_event_loop_lag_seconds_count", ()) in got
    # not a manager node: no rebalance series
    assert not any(name.startswith("shardex_rebalance_") for name, _ in got)


def test_a_manager_reports_its_state_s_rebalance_moves() -> None:
    node = _node()
    moves = [SimpleNamespace(status=s) for s in ("done", "done", "moving", "planned")]
    record = SimpleNamespace(
        state="running", moves=moves, index_moves=[SimpleNamespace(status="done")]
    )
    node.coordinator = SimpleNamespace(state=SimpleNamespace(rebalance=record))
    got = _scrape(node)
    assert got[("shardex_rebalance_running", ())] == 1
    assert got[("shardex_rebalance_moves", (("kind", "data"), ("status", "done")))] == 2
    assert got[("shardex_rebalance_moves", (("kind", "data"), ("status", "moving")))] == 1
    assert got[("shardex_rebalance_moves", (("kind", "data"), ("status", "planned")))] == 1
    assert got[("shardex_rebalance_moves", (("kind", "index"), ("status", "done")))] == 1
    node.coordinator = SimpleNamespace(state=SimpleNamespace(rebalance=None))
    got = _scrape(node)
    assert got[("shardex_rebalance_running", ())] == 0
    assert not any(name == "shardex_rebalance_moves" for name, _ in got)


def test_a_node_without_data_or_index_service_has_no_such_series() -> None:
    node = _node()
    node.data = None
    node.index = None
    got = _scrape(node)
    names = {name for name, _ in got}
    assert not any(
        n.startswith(("shardex_kv_", "shardex_keyspace_", "shardex_index_")) for n in names
    )
    assert ("shardex_sql_statements_total", (("outcome", "success"),)) in got


def test_stability_lag_sums_each_partitions_distance() -> None:
    ts = Timestamp({0: (10, 1), 1: (30, 1)})
    assert stability_lag({0: (12, 1), 1: (30, 1), 3: (4, 1)}, ts) == 2 + 0 + 4
    assert stability_lag({0: (5, 1)}, ts) == 0  # a TS ahead (another branch's) is not behind


async def test_loop_lag_sees_a_blocked_loop() -> None:
    lag = LoopLag(interval=0.05)
    lag.start()
    try:
        await asyncio.sleep(0)  # the timer is armed
        time.sleep(0.3)  # the loop blocked: the tick due in 0.05 s fires >= 0.25 s late
        deadline = time.monotonic() + 30
        while lag.lateness.count < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
    finally:
        await lag.stop()
    assert lag.lateness.count >= 2
    assert lag.lateness.total >= 0.25  # the blocked tick's lateness, at least
